//! The group tables' names (schema-qualified) and their creation.

use crate::capability::sql::{self, Backend, DbError};

/// The group tables' names, schema-qualified.
#[derive(Debug, Clone)]
pub struct GroupTables {
    pub(super) groups: String,
    pub(super) plugins: String,
    pub(super) partitions: String,
    pub(super) members: String,
    pub(super) swaps: String,
    pub(super) resets: String,
}

impl GroupTables {
    /// The names in `schema` (quoted as an identifier).
    pub fn in_schema(schema: &str) -> Self {
        let s = sluice_guest::sql::quoted(schema);
        GroupTables {
            groups: format!("{s}.sluice_groups"),
            plugins: format!("{s}.sluice_group_plugins"),
            partitions: format!("{s}.sluice_partitions"),
            members: format!("{s}.sluice_group_members"),
            swaps: format!("{s}.sluice_group_swaps"),
            resets: format!("{s}.sluice_group_resets"),
        }
    }

    /// All of them, for the plugin role's check.
    pub fn all(&self) -> [&str; 6] {
        [
            &self.groups,
            &self.plugins,
            &self.partitions,
            &self.members,
            &self.swaps,
            &self.resets,
        ]
    }

    pub(super) fn create(&self, b: &mut dyn Backend) -> Result<(), DbError> {
        let blob = b.blob_type();
        sql::create_tables(
            b,
            &format!(
                "CREATE TABLE IF NOT EXISTS {} (\
               group_name TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, \
               plugins TEXT NOT NULL DEFAULT '[]', topics TEXT NOT NULL DEFAULT '{{}}', \
               created_at_ms BIGINT NOT NULL, updated_at_ms BIGINT NOT NULL);\
             CREATE TABLE IF NOT EXISTS {} (\
               digest TEXT PRIMARY KEY, bytes {blob} NOT NULL, stored_at_ms BIGINT NOT NULL);\
             CREATE TABLE IF NOT EXISTS {} (\
               group_name TEXT NOT NULL, topic TEXT NOT NULL, \"partition\" INTEGER NOT NULL, \
               owner_epoch BIGINT NOT NULL, owner TEXT NOT NULL, member_id TEXT NOT NULL DEFAULT '', \
               claimed_at_ms BIGINT NOT NULL, planned TEXT, \
               PRIMARY KEY (group_name, topic, \"partition\"));\
             CREATE TABLE IF NOT EXISTS {} (\
               group_name TEXT NOT NULL, member TEXT NOT NULL, plugins TEXT NOT NULL, \
               swap_id BIGINT NOT NULL DEFAULT 0, swap_error TEXT, \
               started_at_ms BIGINT NOT NULL, seen_at_ms BIGINT NOT NULL, \
               PRIMARY KEY (group_name, member));\
             CREATE TABLE IF NOT EXISTS {} (\
               group_name TEXT NOT NULL, swap_id BIGINT NOT NULL, plugins TEXT NOT NULL, \
               requested_at_ms BIGINT NOT NULL, requested_by TEXT NOT NULL, \
               PRIMARY KEY (group_name, swap_id));\
             CREATE TABLE IF NOT EXISTS {} (\
               group_name TEXT NOT NULL, reset_at_ms BIGINT NOT NULL, requested_by TEXT NOT NULL, \
               target TEXT NOT NULL, moves TEXT NOT NULL);",
                self.groups, self.plugins, self.partitions, self.members, self.swaps, self.resets
            ),
        )?;
        // Columns a group made by an older host lacks: the topic
        // identities, where its pipeline came from and went
        // (`host group adopt`, `host group disband`).
        for (column, ddl) in [
            ("topics", "topics TEXT NOT NULL DEFAULT '{}'"),
            ("adopted_from", "adopted_from TEXT"),
            ("moved_to", "moved_to TEXT"),
        ] {
            sql::add_column(b, &self.groups, column, ddl)?;
        }
        // And a member's own view, recorded by its heartbeat.
        sql::add_column(b, &self.members, "live", "live TEXT")
    }
}
