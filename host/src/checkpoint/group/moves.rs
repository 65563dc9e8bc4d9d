//! A pipeline moving between its two stores (DESIGN.md, "One engine, two
//! stores"): a checkpoint directory adopted as a pipeline group (`host
//! group adopt`), and a group disbanded into a checkpoint directory
//! (`host group disband`). The group's row records both ends:
//! `adopted_from` (the directory's query id, whose progress rows the group
//! took over) and `moved_to` (set while the pipeline runs from a
//! directory: no member may join or claim then). These run inside the
//! caller's transaction, which also renames the sink's progress rows
//! (`sink::moves`), so a move is all or nothing.

use super::fence::hand_over_on;
use super::{GroupError, GroupTables, Planned};
use crate::capability::sql::{Backend, SqlValue};
use crate::checkpoint::{Epoch, Fingerprint, PluginRef, TopicIdentity};
use std::collections::BTreeMap;

/// The owner recorded on the partitions a `host group adopt` hands over.
pub const ADOPT_OWNER: &str = "host group adopt";

/// The owner recorded on the partitions of a disbanded group.
pub const DISBAND_OWNER: &str = "host group disband";

/// What a group takes over from a checkpoint directory.
#[derive(Debug, Clone)]
pub struct Adopted<'a> {
    /// The directory's query id (its progress rows' key until now).
    pub query_id: &'a str,
    /// The pipeline's topics and contract.
    pub fingerprint: &'a Fingerprint,
    /// The plugins its last batch ran (stored in `sluice_group_plugins`
    /// by the caller).
    pub plugins: &'a [PluginRef],
    /// The topic identities its positions belong to.
    pub topics: &'a BTreeMap<String, TopicIdentity>,
    /// The directory's fencing epoch: the group's owner epochs start above
    /// it (its progress rows were written with it).
    pub epoch: Epoch,
    /// Ranges planned and not committed (the directory's uncommitted
    /// batch): the member that claims each partition runs it again with
    /// the same bounds.
    pub reruns: &'a BTreeMap<(String, i32), Planned>,
}

/// Make group `group` the home of the pipeline `a` describes, inside the
/// caller's transaction on `b`: its row (a new one, or one whose pipeline
/// had moved away), and the ranges to run again. Returns false when the
/// group took over this very directory already (a repeated adopt).
///
/// # Errors
/// [`GroupError::Exists`] for a group that runs a pipeline of its own;
/// [`GroupError::Db`].
pub fn adopt_on(
    b: &mut dyn Backend,
    tables: &GroupTables,
    group: &str,
    a: &Adopted<'_>,
) -> Result<bool, GroupError> {
    let db = |during| {
        move |error| GroupError::Db {
            group: group.to_string(),
            during,
            error,
        }
    };
    let now = crate::util::now_ms();
    let row = b
        .query(
            &format!(
                "SELECT adopted_from, moved_to FROM {} WHERE group_name = $1",
                tables.groups
            ),
            &[SqlValue::Text(group.to_string())],
        )
        .map_err(db("reading the group's row"))?;
    let text = |v: &SqlValue| match v {
        SqlValue::Text(t) => Some(t.clone()),
        _ => None,
    };
    let params = [
        SqlValue::Text(group.to_string()),
        SqlValue::Text(serde_json::to_string(a.fingerprint).unwrap_or_default()),
        SqlValue::Text(serde_json::to_string(a.plugins).unwrap_or_default()),
        SqlValue::Text(serde_json::to_string(a.topics).unwrap_or_else(|_| "{}".into())),
        SqlValue::Text(a.query_id.to_string()),
        SqlValue::Integer(now),
    ];
    match row.rows.first().map(Vec::as_slice) {
        None => {
            b.execute(
                &format!(
                    "INSERT INTO {} (group_name, fingerprint, plugins, topics, adopted_from, created_at_ms, updated_at_ms) \
                     VALUES ($1, $2, $3, $4, $5, $6, $6)",
                    tables.groups
                ),
                &params,
            )
            .map_err(db("creating the group"))?;
        }
        Some([from, to]) => match (text(from), text(to)) {
            (Some(from), None) if from == a.query_id => return Ok(false),
            (_, None) => {
                return Err(GroupError::Exists {
                    group: group.to_string(),
                });
            }
            (_, Some(_)) => {
                b.execute(
                    &format!(
                        "UPDATE {} SET fingerprint = $2, plugins = $3, topics = $4, adopted_from = $5, \
                         moved_to = NULL, updated_at_ms = $6 WHERE group_name = $1",
                        tables.groups
                    ),
                    &params,
                )
                .map_err(db("taking the group over"))?;
            }
        },
        Some(other) => {
            return Err(GroupError::BadRow {
                group: group.to_string(),
                table: tables.groups.clone(),
                why: format!("unexpected row {other:?}"),
            });
        }
    }
    for ((topic, partition), planned) in a.reruns {
        hand_over_on(
            b,
            tables,
            group,
            (topic, *partition),
            (ADOPT_OWNER, a.epoch),
            planned,
        )?;
    }
    Ok(true)
}

/// Hand group `group`'s pipeline to the checkpoint directory `to`, inside
/// the caller's transaction on `b`: the row records where it went, and
/// every partition is fenced (its owner epoch goes up, its range in
/// flight is dropped: the directory runs it again), so a member still
/// running writes nothing more. Returns the highest owner epoch now.
///
/// # Errors
/// [`GroupError::Db`].
pub fn disband_on(
    b: &mut dyn Backend,
    tables: &GroupTables,
    group: &str,
    to: &str,
) -> Result<Epoch, GroupError> {
    let db = |during| {
        move |error| GroupError::Db {
            group: group.to_string(),
            during,
            error,
        }
    };
    b.execute(
        &format!(
            "UPDATE {} SET moved_to = $2, updated_at_ms = $3 WHERE group_name = $1",
            tables.groups
        ),
        &[
            SqlValue::Text(group.to_string()),
            SqlValue::Text(to.to_string()),
            SqlValue::Integer(crate::util::now_ms()),
        ],
    )
    .map_err(db("recording where the group's pipeline went"))?;
    b.execute(
        &format!(
            "UPDATE {} SET owner = $2, member_id = '', owner_epoch = owner_epoch + 1, planned = NULL, \
             claimed_at_ms = $3 WHERE group_name = $1",
            tables.partitions
        ),
        &[
            SqlValue::Text(group.to_string()),
            SqlValue::Text(DISBAND_OWNER.to_string()),
            SqlValue::Integer(crate::util::now_ms()),
        ],
    )
    .map_err(db("fencing the group's partitions"))?;
    let rows = b
        .query(
            &format!(
                "SELECT max(owner_epoch) FROM {} WHERE group_name = $1",
                tables.partitions
            ),
            &[SqlValue::Text(group.to_string())],
        )
        .map_err(db("reading the group's owner epochs"))?;
    Ok(match rows.rows.first().map(Vec::as_slice) {
        Some([SqlValue::Integer(e)]) => Epoch::new(*e as u64),
        _ => Epoch::default(),
    })
}

impl super::GroupStore {
    /// Where the group's pipeline moved (`host group disband`), if it
    /// did: members are refused then.
    ///
    /// # Errors
    /// [`GroupError::Db`].
    pub fn moved_to(&self) -> Result<Option<String>, GroupError> {
        self.read(|b| super::fence::moved_to(b, &self.tables, &self.group))
    }

    /// The query id of the checkpoint directory the group adopted (`host
    /// group adopt`), if it did.
    ///
    /// # Errors
    /// [`GroupError::Db`].
    pub fn adopted_from(&self) -> Result<Option<String>, GroupError> {
        let rows = self.read(|b| {
            b.query(
                &format!(
                    "SELECT adopted_from FROM {} WHERE group_name = $1",
                    self.tables.groups
                ),
                &[SqlValue::Text(self.group.clone())],
            )
            .map_err(self.err("reading where the group came from"))
        })?;
        Ok(match rows.rows.first().map(Vec::as_slice) {
            Some([SqlValue::Text(q)]) => Some(q.clone()),
            _ => None,
        })
    }
}
