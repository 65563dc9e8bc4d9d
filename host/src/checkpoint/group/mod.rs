//! The checkpoint of a pipeline group (DESIGN.md, "Scale beyond one
//! machine: pipeline groups"): ownership and write-ahead of each partition
//! in the sink database, so that any member on any machine can take a
//! partition over.
//!
//! ```text
//! sluice_groups         group_name → fingerprint (topics, contract), the
//!                       plugins new members start with
//! sluice_group_plugins  digest → component bytes (content-addressed)
//! sluice_partitions     (group, topic, partition) → owner epoch, owner,
//!                       member id, claimed at, and the planned range of
//!                       the batch in flight (write-ahead; NULL when none)
//! sluice_group_members  (group, member) → the plugins it runs, the last
//!                       swap it acted on and why it could not install
//!                       it, when it was last seen (status only: Kafka's
//!                       coordinator decides membership)
//! sluice_group_swaps    (group, swap id) → the plugins asked for, when,
//!                       by whom (`host group swap`; an audit trail)
//! sluice_group_resets   one row per `host group reset`: when, by whom,
//!                       `--to`, each partition's move (an audit trail)
//! ```
//!
//! What was applied stays in the sink's `sluice_progress` rows (query id =
//! group name), written in the same transaction as the records.
//!
//! Rules:
//! - **Claim**: one transaction raises the partition's owner epoch by one
//!   and records the owner; it returns the planned range left by the
//!   previous owner, which the claimer must re-run with the same bounds.
//! - **Fencing**: the owner epoch is the token. Planning, finishing and
//!   every part's sink transaction require `owner_epoch = mine` (equality:
//!   a newer claim by anyone fences the older owner), checked on the row
//!   locked inside the writing transaction ([`fence`]).
//! - The store uses a connection of its own: claims come from the
//!   consumer's rebalance while a part's transaction may be open on the
//!   sink's connection.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::{Epoch, Fingerprint, PluginRef};
use crate::capability::sql::{self, Backend, DbError, Dialect, SqlValue};

/// Why a group operation failed.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The database failed.
    #[error("group {group}: sink database error while {during}: {error}")]
    Db {
        /// The group.
        group: String,
        /// What the store was doing.
        during: &'static str,
        /// The database's error.
        error: DbError,
    },
    /// Another member claimed the partition since we did.
    #[error(
        "fenced on {topic}/{partition}: owner epoch {now} is now held by {holder} (ours was {ours}); this member drops the partition"
    )]
    Fenced {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Our epoch.
        ours: Epoch,
        /// The epoch in the row.
        now: Epoch,
        /// Who holds it.
        holder: String,
    },
    /// The group exists with other topics or another contract.
    #[error(
        "group {group} runs another pipeline than this member:\n{diff}\nrun the member with the group's topics and a host of the same contract, or pick another --group name"
    )]
    Mismatch {
        /// The group.
        group: String,
        /// What differs.
        diff: String,
    },
    /// The group's plugins changed while a swap was prepared from them.
    #[error(
        "group {group}: its plugins changed while this swap was prepared (another host group swap, or a member that joined with its own --plugin); they are now {now}: run the swap again"
    )]
    SwapRace {
        /// The group.
        group: String,
        /// The plugins now (JSON).
        now: String,
    },
    /// A stored row cannot be read.
    #[error(
        "group {group}: unreadable row in {table}: {why}; was it changed by hand? `host group reset` rewrites a partition's row"
    )]
    BadRow {
        /// The group.
        group: String,
        /// The table.
        table: String,
        /// What is wrong.
        why: String,
    },
}

impl GroupError {
    /// Whether another member holds the partition now ([`GroupError::Fenced`]).
    pub fn is_fenced(&self) -> bool {
        matches!(self, GroupError::Fenced { .. })
    }
}

/// A planned range (the write-ahead of one partition's share of a batch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Planned {
    /// The batch id of the member that planned it.
    pub batch: u64,
    /// First offset.
    pub start: i64,
    /// End offset (exclusive).
    pub end: i64,
    /// The plugins it runs with.
    pub plugins: Vec<PluginRef>,
}

/// What a claim returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// Our owner epoch for the partition (the fencing token).
    pub epoch: Epoch,
    /// Who held it before (empty for a partition never claimed).
    pub previous_owner: String,
    /// A range planned and not finished: re-run it with these bounds.
    pub planned: Option<Planned>,
}

/// One partition's row, for status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionRow {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Owner epoch.
    pub owner_epoch: Epoch,
    /// Owner (pid, host).
    pub owner: String,
    /// Kafka member id of the owner.
    pub member_id: String,
    /// When it was claimed, ms since the Unix epoch.
    pub claimed_at_ms: i64,
    /// The range in flight.
    pub planned: Option<Planned>,
    /// Why the stored range in flight cannot be read (the row was changed
    /// by hand); `planned` is then `None`. A member refuses to claim the
    /// partition until the row is mended (`host group reset`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planned_unreadable: Option<String>,
}

/// The group tables' names, schema-qualified.
#[derive(Debug, Clone)]
pub struct GroupTables {
    groups: String,
    plugins: String,
    partitions: String,
    members: String,
    swaps: String,
    resets: String,
}

impl GroupTables {
    /// The names in `schema` (quoted as an identifier).
    pub fn in_schema(schema: &str) -> Self {
        let s = format!("\"{}\"", schema.replace('"', "\"\""));
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

    fn create(&self, b: &mut dyn Backend) -> Result<(), DbError> {
        let blob = b.blob_type();
        sql::create_tables(
            b,
            &format!(
                "CREATE TABLE IF NOT EXISTS {} (\
               group_name TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, \
               plugins TEXT NOT NULL DEFAULT '[]', \
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
        )
    }
}

/// Run `f` in one transaction of `b`: one that only reads (`write`
/// false) takes no lock up front; one that writes takes SQLite's write
/// lock at once (so it never fails half-way on a busy database).
fn in_tx<T>(
    b: &mut dyn Backend,
    group: &str,
    write: bool,
    f: &mut dyn FnMut(&mut dyn Backend) -> Result<T, GroupError>,
) -> Result<T, GroupError> {
    let db = |during| {
        move |error| GroupError::Db {
            group: group.to_string(),
            during,
            error,
        }
    };
    b.batch(match (b.dialect(), write) {
        (Dialect::Sqlite, true) => "BEGIN IMMEDIATE",
        (Dialect::Sqlite, false) => "BEGIN",
        (Dialect::Postgres, _) => "BEGIN ISOLATION LEVEL READ COMMITTED",
    })
    .map_err(db("beginning a transaction"))?;
    match f(b) {
        Ok(v) => {
            b.batch("COMMIT").map_err(db("committing"))?;
            Ok(v)
        }
        Err(e) => {
            if let Err(r) = b.batch("ROLLBACK") {
                tracing::warn!("rollback failed: {r}");
            }
            Err(e)
        }
    }
}

/// `FOR UPDATE` where the database has it (SQLite locks the whole
/// database for the writing transaction instead).
fn for_update(b: &dyn Backend) -> &'static str {
    match b.dialect() {
        Dialect::Sqlite => "",
        Dialect::Postgres => " FOR UPDATE",
    }
}

/// The parameters `$1 … $3` that name a partition's row in
/// `sluice_partitions`.
fn row_key(group: &str, topic: &str, partition: i32) -> Vec<SqlValue> {
    vec![
        SqlValue::Text(group.to_string()),
        SqlValue::Text(topic.to_string()),
        SqlValue::Integer(partition.into()),
    ]
}

/// Inside a part's sink transaction (on the sink's connection): lock
/// `topic/partition`'s row and require `owner_epoch = epoch`.
///
/// # Errors
/// [`GroupError::Fenced`] when another member claimed it since;
/// [`GroupError::Db`].
pub fn fence(
    b: &mut dyn Backend,
    tables: &GroupTables,
    group: &str,
    topic: &str,
    partition: i32,
    epoch: Epoch,
) -> Result<(), GroupError> {
    let db = |error| GroupError::Db {
        group: group.to_string(),
        during: "checking the owner epoch",
        error,
    };
    let rows = b
        .query(
            &format!(
                "SELECT owner_epoch, owner FROM {} WHERE group_name = $1 AND topic = $2 AND \"partition\" = $3{}",
                tables.partitions,
                for_update(b)
            ),
            &row_key(group, topic, partition),
        )
        .map_err(db)?;
    match rows.rows.first().map(Vec::as_slice) {
        Some([SqlValue::Integer(now), _]) if *now as u64 == epoch.get() => Ok(()),
        Some([SqlValue::Integer(now), SqlValue::Text(holder)]) => Err(GroupError::Fenced {
            topic: topic.to_string(),
            partition,
            ours: epoch,
            now: Epoch::new(*now as u64),
            holder: holder.clone(),
        }),
        _ => Err(GroupError::Fenced {
            topic: topic.to_string(),
            partition,
            ours: epoch,
            now: Epoch::default(),
            holder: "nobody (the row is gone)".into(),
        }),
    }
}

/// [`GroupStore::claim`] inside a transaction open on `b` (the caller's):
/// raise the partition's owner epoch, record `(owner, member_id)`, and
/// return the planned range the previous owner left. The new epoch is
/// above `floor` too: the epoch the partition's progress row was written
/// with, so that a partition row deleted by hand (or lost) does not start
/// the epochs again below it (that row would refuse every write).
///
/// # Errors
/// [`GroupError::Db`]; [`GroupError::BadRow`].
pub fn claim_on(
    b: &mut dyn Backend,
    tables: &GroupTables,
    group: &str,
    (topic, partition): (&str, i32),
    (owner, member_id): (&str, &str),
    floor: Epoch,
) -> Result<Claim, GroupError> {
    let db = |error| GroupError::Db {
        group: group.to_string(),
        during: "claiming a partition",
        error,
    };
    let bad_row = |why: String| GroupError::BadRow {
        group: group.to_string(),
        table: tables.partitions.clone(),
        why,
    };
    let key = row_key(group, topic, partition);
    let before = b
        .query(
            &format!(
                "SELECT owner_epoch, owner, planned FROM {} WHERE group_name = $1 AND topic = $2 AND \"partition\" = $3{}",
                tables.partitions,
                for_update(b)
            ),
            &key,
        )
        .map_err(db)?;
    let (epoch, previous_owner, planned) = match before.rows.first().map(Vec::as_slice) {
        None => (floor.next(), String::new(), None),
        Some([SqlValue::Integer(e), SqlValue::Text(o), planned]) => (
            Epoch::new(*e as u64).max(floor).next(),
            o.clone(),
            match planned {
                SqlValue::Text(p) => {
                    Some(serde_json::from_str::<Planned>(p).map_err(|e| bad_row(e.to_string()))?)
                }
                _ => None,
            },
        ),
        Some(other) => return Err(bad_row(format!("unexpected row {other:?}"))),
    };
    let mut params = key;
    params.extend([
        SqlValue::Integer(epoch.get() as i64),
        SqlValue::Text(owner.to_string()),
        SqlValue::Text(member_id.to_string()),
        SqlValue::Integer(crate::util::now_ms()),
    ]);
    b.execute(
        &format!(
            "INSERT INTO {} (group_name, topic, \"partition\", owner_epoch, owner, member_id, claimed_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (group_name, topic, \"partition\") DO UPDATE SET \
               owner_epoch = excluded.owner_epoch, owner = excluded.owner, \
               member_id = excluded.member_id, claimed_at_ms = excluded.claimed_at_ms",
            tables.partitions
        ),
        &params,
    )
    .map_err(db)?;
    Ok(Claim {
        epoch,
        previous_owner,
        planned,
    })
}

/// Clear the planned range of `topic/partition`, inside the caller's
/// transaction on `b` (a `host group reset` abandons the batch in flight:
/// what it applied is in the progress row).
///
/// # Errors
/// [`GroupError::Db`].
pub fn abandon_planned(
    b: &mut dyn Backend,
    tables: &GroupTables,
    group: &str,
    (topic, partition): (&str, i32),
) -> Result<(), GroupError> {
    b.execute(
        &format!(
            "UPDATE {} SET planned = NULL WHERE group_name = $1 AND topic = $2 AND \"partition\" = $3",
            tables.partitions
        ),
        &row_key(group, topic, partition),
    )
    .map(drop)
    .map_err(|error| GroupError::Db {
        group: group.to_string(),
        during: "abandoning a planned range",
        error,
    })
}

/// Record a `host group reset` in `sluice_group_resets` (the audit
/// trail), inside the caller's transaction on `b`: who, when, `--to`, and
/// `moves` (JSON: each partition's position before and after).
///
/// # Errors
/// [`GroupError::Db`].
pub fn record_reset(
    b: &mut dyn Backend,
    tables: &GroupTables,
    group: &str,
    by: &str,
    target: &str,
    moves: &str,
) -> Result<(), GroupError> {
    b.execute(
        &format!(
            "INSERT INTO {} (group_name, reset_at_ms, requested_by, target, moves) VALUES ($1, $2, $3, $4, $5)",
            tables.resets
        ),
        &[
            SqlValue::Text(group.to_string()),
            SqlValue::Integer(crate::util::now_ms()),
            SqlValue::Text(by.to_string()),
            SqlValue::Text(target.to_string()),
            SqlValue::Text(moves.to_string()),
        ],
    )
    .map(drop)
    .map_err(|error| GroupError::Db {
        group: group.to_string(),
        during: "recording the reset",
        error,
    })
}

/// The owner a `host group reset` records in the partitions it moves; a
/// member fenced by it claims the partition again (it is still assigned
/// to it).
pub const RESET_OWNER: &str = "host group reset";

/// A group's checkpoint, on a connection of its own.
pub struct GroupStore {
    group: String,
    tables: GroupTables,
    db: Mutex<Box<dyn Backend>>,
    /// How to connect again: `--sink-db` and the password file.
    origin: (String, Option<std::path::PathBuf>),
    /// How long a lost connection or contention is retried
    /// ([`GroupStore::retry_for`]).
    retry_for: std::time::Duration,
}

impl GroupStore {
    /// Open the store of `group` in the database at `url` (password as
    /// [`sql::connect_with`]), creating the tables in `schema` if missing.
    ///
    /// # Errors
    /// [`GroupError::Db`].
    pub fn open(
        url: &str,
        password_file: Option<&Path>,
        schema: &str,
        group: &str,
    ) -> Result<Self, GroupError> {
        let store = Self::connect(url, password_file, schema, group)?;
        store
            .tables
            .create(store.db().as_mut())
            .map_err(store.err("creating the group tables"))?;
        Ok(store)
    }

    /// The store on a new connection, without touching the tables.
    fn connect(
        url: &str,
        password_file: Option<&Path>,
        schema: &str,
        group: &str,
    ) -> Result<Self, GroupError> {
        let b = Self::backend(url, password_file).map_err(|error| GroupError::Db {
            group: group.to_string(),
            during: "connecting",
            error,
        })?;
        Ok(GroupStore {
            group: group.to_string(),
            tables: GroupTables::in_schema(schema),
            db: Mutex::new(b),
            origin: (url.to_string(), password_file.map(Path::to_path_buf)),
            retry_for: crate::sink::DEFAULT_RECONNECT_FOR,
        })
    }

    /// A connection for the store. On PostgreSQL a lock wait ends after
    /// 10 s (55P03, retried by [`GroupStore::tx`]) and a statement after
    /// 60 s, so a claim made from the consumer's rebalance callback never
    /// blocks it for longer than one attempt.
    fn backend(url: &str, password_file: Option<&Path>) -> Result<Box<dyn Backend>, DbError> {
        let mut b = sql::connect_with(url, password_file)?;
        if b.dialect() == Dialect::Postgres {
            b.batch("SET lock_timeout = 10000; SET statement_timeout = 60000")?;
        }
        Ok(b)
    }

    /// Retry a lost connection (reconnecting) or contention (a lock
    /// another session holds, a deadlock) for up to `d` before an
    /// operation fails (`--sink-retry-for`; default 5 minutes).
    pub fn retry_for(mut self, d: std::time::Duration) -> Self {
        self.retry_for = d;
        self
    }

    /// Run `f` in one transaction on the store's connection; a lost
    /// connection is replaced and contention waited out, and `f` run
    /// again, for up to [`GroupStore::retry_for`].
    fn tx<T>(
        &self,
        f: impl FnMut(&mut dyn Backend) -> Result<T, GroupError>,
    ) -> Result<T, GroupError> {
        self.retrying(true, f)
    }

    /// [`GroupStore::tx`] for a transaction that only reads.
    fn read<T>(
        &self,
        f: impl FnMut(&mut dyn Backend) -> Result<T, GroupError>,
    ) -> Result<T, GroupError> {
        self.retrying(false, f)
    }

    fn retrying<T>(
        &self,
        write: bool,
        mut f: impl FnMut(&mut dyn Backend) -> Result<T, GroupError>,
    ) -> Result<T, GroupError> {
        let until = std::time::Instant::now() + self.retry_for;
        let mut pause = std::time::Duration::from_millis(100);
        loop {
            // The connection is locked per attempt, not across the pauses:
            // a claim from the rebalance callback waits for one attempt of
            // another thread at most.
            let r = in_tx(self.db().as_mut(), &self.group, write, &mut f);
            let error = match &r {
                Err(GroupError::Db { error, .. })
                    if (error.is_connection_lost() || error.is_contention())
                        && std::time::Instant::now() < until =>
                {
                    error.clone()
                }
                _ => return r,
            };
            tracing::warn!(
                group = self.group,
                "group checkpoint: {error}; trying again in {} ms",
                pause.as_millis()
            );
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_secs(5));
            if error.is_connection_lost() {
                match Self::backend(&self.origin.0, self.origin.1.as_deref()) {
                    Ok(new) => *self.db() = new,
                    Err(e) => tracing::warn!(
                        group = self.group,
                        "group checkpoint: reconnecting failed: {e}"
                    ),
                }
            }
        }
    }

    /// Open the store of `group` for reading only: nothing is created.
    /// `None` when the database holds no group tables.
    ///
    /// # Errors
    /// [`GroupError::Db`].
    pub fn open_existing(
        url: &str,
        password_file: Option<&Path>,
        schema: &str,
        group: &str,
    ) -> Result<Option<Self>, GroupError> {
        let store = Self::connect(url, password_file, schema, group)?;
        let probe = store.db().query(
            &format!("SELECT 1 FROM {} WHERE 1 = 0", store.tables.partitions),
            &[],
        );
        match probe {
            Ok(_) => Ok(Some(store)),
            Err(e) if e.is_missing_table() => Ok(None),
            Err(error) => Err(store.err("reading the group tables")(error)),
        }
    }

    /// The group's fingerprint and current plugins (`None`: no such group).
    ///
    /// # Errors
    /// [`GroupError::Db`]; [`GroupError::BadRow`].
    pub fn info(&self) -> Result<Option<(Fingerprint, Vec<PluginRef>)>, GroupError> {
        let rows = self.read(|b| {
            b.query(
                &format!(
                    "SELECT fingerprint, plugins FROM {} WHERE group_name = $1",
                    self.tables.groups
                ),
                &[SqlValue::Text(self.group.clone())],
            )
            .map_err(self.err("reading the group"))
        })?;
        let Some([SqlValue::Text(fp), SqlValue::Text(plugins)]) =
            rows.rows.first().map(Vec::as_slice)
        else {
            return Ok(None);
        };
        let fp = serde_json::from_str(fp)
            .map_err(|e| self.bad_row(&self.tables.groups, e.to_string()))?;
        let plugins = serde_json::from_str(plugins)
            .map_err(|e| self.bad_row(&self.tables.groups, e.to_string()))?;
        Ok(Some((fp, plugins)))
    }

    /// The table names (for [`fence`] on the sink's connection).
    pub fn tables(&self) -> &GroupTables {
        &self.tables
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Box<dyn Backend>> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn err(&self, during: &'static str) -> impl FnOnce(DbError) -> GroupError + '_ {
        move |error| GroupError::Db {
            group: self.group.clone(),
            during,
            error,
        }
    }

    fn bad_row(&self, table: &str, why: impl Into<String>) -> GroupError {
        GroupError::BadRow {
            group: self.group.clone(),
            table: table.to_string(),
            why: why.into(),
        }
    }

    /// Join: create the group's row with `fingerprint` and `plugins`, or
    /// check an existing one's fingerprint. Returns the plugins the group
    /// runs now (a new member starts with them).
    ///
    /// # Errors
    /// [`GroupError::Mismatch`] with the difference; [`GroupError::Db`].
    pub fn join(
        &self,
        fingerprint: &Fingerprint,
        plugins: &[PluginRef],
    ) -> Result<Vec<PluginRef>, GroupError> {
        let fp = serde_json::to_string(fingerprint).unwrap_or_default();
        let mine = serde_json::to_string(plugins).unwrap_or_default();
        self.tx(|b| {
            let now = crate::util::now_ms();
            b.execute(
                &format!(
                    "INSERT INTO {} (group_name, fingerprint, plugins, created_at_ms, updated_at_ms) \
                     VALUES ($1, $2, $3, $4, $4) ON CONFLICT (group_name) DO NOTHING",
                    self.tables.groups
                ),
                &[
                    SqlValue::Text(self.group.clone()),
                    SqlValue::Text(fp.clone()),
                    SqlValue::Text(mine.clone()),
                    SqlValue::Integer(now),
                ],
            )
            .map_err(self.err("joining"))?;
            let rows = b
                .query(
                    &format!(
                        "SELECT fingerprint, plugins FROM {} WHERE group_name = $1",
                        self.tables.groups
                    ),
                    &[SqlValue::Text(self.group.clone())],
                )
                .map_err(self.err("joining"))?;
            let Some([SqlValue::Text(stored_fp), SqlValue::Text(stored_plugins)]) =
                rows.rows.first().map(Vec::as_slice)
            else {
                return Err(self.bad_row(&self.tables.groups, "no group row after insert"));
            };
            let stored: Fingerprint = serde_json::from_str(stored_fp)
                .map_err(|e| self.bad_row(&self.tables.groups, e.to_string()))?;
            if let Some(diff) = stored.diff(fingerprint) {
                return Err(GroupError::Mismatch {
                    group: self.group.clone(),
                    diff: diff
                        .replace("checkpoint topics", "group topics")
                        .replace("pipeline topics:  ", "this member's topics:"),
                });
            }
            serde_json::from_str(stored_plugins)
                .map_err(|e| self.bad_row(&self.tables.groups, e.to_string()))
        })
    }

    /// Make `plugins` the ones the group runs (a group swap; members
    /// install them at their next batch boundary).
    ///
    /// # Errors
    /// [`GroupError::Db`].
    pub fn set_plugins(&self, plugins: &[PluginRef]) -> Result<(), GroupError> {
        self.tx(|b| {
            b.execute(
                &format!(
                    "UPDATE {} SET plugins = $2, updated_at_ms = $3 WHERE group_name = $1",
                    self.tables.groups
                ),
                &[
                    SqlValue::Text(self.group.clone()),
                    SqlValue::Text(serde_json::to_string(plugins).unwrap_or_default()),
                    SqlValue::Integer(crate::util::now_ms()),
                ],
            )
            .map(drop)
            .map_err(self.err("storing the group's plugins"))
        })
    }

    /// Store a component by its sha256 (hex); returns the digest.
    ///
    /// # Errors
    /// [`GroupError::Db`].
    pub fn store_plugin(&self, bytes: &[u8]) -> Result<String, GroupError> {
        let digest = crate::plugin::digest(bytes);
        self.tx(|b| {
            b.execute(
            &format!(
                "INSERT INTO {} (digest, bytes, stored_at_ms) VALUES ($1, $2, $3) ON CONFLICT (digest) DO NOTHING",
                self.tables.plugins
            ),
            &[
                SqlValue::Text(digest.clone()),
                SqlValue::Blob(bytes.to_vec()),
                SqlValue::Integer(crate::util::now_ms()),
            ],
        )
        .map_err(self.err("storing a plugin"))
        })?;
        Ok(digest)
    }

    /// The component stored under `digest`, checked against it.
    ///
    /// # Errors
    /// [`GroupError::BadRow`] when missing or not matching its digest;
    /// [`GroupError::Db`].
    pub fn load_plugin(&self, digest: &str) -> Result<Vec<u8>, GroupError> {
        let rows = self.read(|b| {
            b.query(
                &format!(
                    "SELECT bytes FROM {} WHERE digest = $1",
                    self.tables.plugins
                ),
                &[SqlValue::Text(digest.to_string())],
            )
            .map_err(self.err("loading a plugin"))
        })?;
        match rows
            .rows
            .into_iter()
            .next()
            .and_then(|r| r.into_iter().next())
        {
            Some(SqlValue::Blob(bytes)) if crate::plugin::digest(&bytes) == digest => Ok(bytes),
            Some(_) => Err(self.bad_row(
                &self.tables.plugins,
                format!("the bytes stored as {digest} do not have that digest"),
            )),
            None => Err(self.bad_row(&self.tables.plugins, format!("no plugin {digest}"))),
        }
    }

    /// Claim `topic/partition` like [`GroupStore::claim`], and read the
    /// partition's progress in the same transaction, after its row is
    /// locked: `progress` reads, on the store's own connection, what was
    /// applied and the epoch it was written with, which becomes the
    /// claim's floor. Nobody can apply a part of the partition between
    /// that read and the claim (a part locks the same row first), and the
    /// read never runs inside a transaction the sink has open.
    ///
    /// # Errors
    /// [`GroupError::Db`]; [`GroupError::BadRow`]; what `progress` returns.
    pub fn claim_reading<T>(
        &self,
        topic: &str,
        partition: i32,
        (owner, member_id): (&str, &str),
        progress: impl Fn(&mut dyn Backend) -> Result<(T, Epoch), GroupError>,
    ) -> Result<(Claim, T), GroupError> {
        self.tx(|b| {
            b.query(
                &format!(
                    "SELECT owner_epoch FROM {} WHERE group_name = $1 AND topic = $2 AND \"partition\" = $3{}",
                    self.tables.partitions,
                    for_update(b)
                ),
                &row_key(&self.group, topic, partition),
            )
            .map_err(self.err("locking a partition's row"))?;
            let (read, floor) = progress(b)?;
            let claim = claim_on(
                b,
                &self.tables,
                &self.group,
                (topic, partition),
                (owner, member_id),
                floor,
            )?;
            Ok((claim, read))
        })
    }

    /// Claim `topic/partition` for `owner` (pid, host) as Kafka member
    /// `member_id`: raise its owner epoch by one (the first claim gets 1).
    ///
    /// # Errors
    /// [`GroupError::Db`]; [`GroupError::BadRow`].
    pub fn claim(
        &self,
        topic: &str,
        partition: i32,
        (owner, member_id): (&str, &str),
        floor: Epoch,
    ) -> Result<Claim, GroupError> {
        self.tx(|b| {
            claim_on(
                b,
                &self.tables,
                &self.group,
                (topic, partition),
                (owner, member_id),
                floor,
            )
        })
    }

    /// Write ahead: record each part's planned range, in one transaction,
    /// each under its owner epoch. Nothing is recorded if any is fenced.
    ///
    /// # Errors
    /// [`GroupError::Fenced`] naming the first partition another member
    /// holds now; [`GroupError::Db`].
    pub fn plan(&self, parts: &[(String, i32, Epoch, Planned)]) -> Result<(), GroupError> {
        self.tx(|b| {
            for (topic, partition, epoch, planned) in parts {
                fence(b, &self.tables, &self.group, topic, *partition, *epoch)?;
                self.set_planned(b, topic, *partition, Some(planned))?;
            }
            Ok(())
        })
    }

    /// The batch of these parts was applied: clear their planned ranges
    /// (only those still ours and still planned for `batch`), in one
    /// transaction. A partition another member holds now is left as it
    /// is and returned ([`GroupError::Fenced`], one per partition); the
    /// others are finished all the same.
    ///
    /// # Errors
    /// [`GroupError::Db`]; nothing is finished then.
    pub fn finish(
        &self,
        batch: u64,
        parts: &[(String, i32, Epoch)],
    ) -> Result<Vec<GroupError>, GroupError> {
        self.tx(|b| {
            let mut fenced = Vec::new();
            for (topic, partition, epoch) in parts {
                match fence(b, &self.tables, &self.group, topic, *partition, *epoch) {
                    Err(e @ GroupError::Fenced { .. }) => {
                        fenced.push(e);
                        continue;
                    }
                    r => r?,
                }
                let planned = self.planned(b, topic, *partition)?;
                if planned.is_some_and(|p| p.batch == batch) {
                    self.set_planned(b, topic, *partition, None)?;
                }
            }
            Ok(fenced)
        })
    }

    fn planned(
        &self,
        b: &mut dyn Backend,
        topic: &str,
        partition: i32,
    ) -> Result<Option<Planned>, GroupError> {
        let rows = b
            .query(
                &format!(
                    "SELECT planned FROM {} WHERE group_name = $1 AND topic = $2 AND \"partition\" = $3",
                    self.tables.partitions
                ),
                &row_key(&self.group, topic, partition),
            )
            .map_err(self.err("reading a planned range"))?;
        match rows.rows.first().and_then(|r| r.first()) {
            Some(SqlValue::Text(p)) => serde_json::from_str(p)
                .map(Some)
                .map_err(|e| self.bad_row(&self.tables.partitions, e.to_string())),
            _ => Ok(None),
        }
    }

    fn set_planned(
        &self,
        b: &mut dyn Backend,
        topic: &str,
        partition: i32,
        planned: Option<&Planned>,
    ) -> Result<(), GroupError> {
        let mut params = row_key(&self.group, topic, partition);
        params.push(match planned {
            Some(p) => SqlValue::Text(serde_json::to_string(p).unwrap_or_default()),
            None => SqlValue::Null,
        });
        b.execute(
            &format!(
                "UPDATE {} SET planned = $4 WHERE group_name = $1 AND topic = $2 AND \"partition\" = $3",
                self.tables.partitions
            ),
            &params,
        )
        .map(drop)
        .map_err(self.err("writing a planned range"))
    }

    /// Every partition row of the group, by topic and partition.
    ///
    /// # Errors
    /// [`GroupError::Db`]; [`GroupError::BadRow`].
    pub fn partitions(&self) -> Result<Vec<PartitionRow>, GroupError> {
        let rows = self.read(|b| b
            .query(
                &format!(
                    "SELECT topic, \"partition\", owner_epoch, owner, member_id, claimed_at_ms, planned FROM {} \
                     WHERE group_name = $1 ORDER BY topic, \"partition\"",
                    self.tables.partitions
                ),
                &[SqlValue::Text(self.group.clone())],
            )
            .map_err(self.err("reading the group's partitions")))?;
        let mut out = Vec::new();
        for row in rows.rows {
            let [
                SqlValue::Text(topic),
                SqlValue::Integer(partition),
                SqlValue::Integer(epoch),
                SqlValue::Text(owner),
                SqlValue::Text(member_id),
                SqlValue::Integer(claimed_at_ms),
                planned,
            ] = row.as_slice()
            else {
                return Err(
                    self.bad_row(&self.tables.partitions, format!("unexpected row {row:?}"))
                );
            };
            // An unreadable range in flight is shown, not fatal: status
            // must still show the rest of the group.
            let (planned, planned_unreadable) = match planned {
                SqlValue::Text(p) => match serde_json::from_str(p) {
                    Ok(p) => (Some(p), None),
                    Err(e) => (None, Some(format!("{e} in {p:?}"))),
                },
                _ => (None, None),
            };
            out.push(PartitionRow {
                topic: topic.clone(),
                partition: *partition as i32,
                owner_epoch: Epoch::new(*epoch as u64),
                owner: owner.clone(),
                member_id: member_id.clone(),
                claimed_at_ms: *claimed_at_ms,
                planned,
                planned_unreadable,
            });
        }
        Ok(out)
    }

    /// Partitions per owner (status).
    ///
    /// # Errors
    /// As [`GroupStore::partitions`].
    pub fn owners(&self) -> Result<BTreeMap<String, Vec<(String, i32)>>, GroupError> {
        let mut by: BTreeMap<String, Vec<(String, i32)>> = BTreeMap::new();
        for p in self.partitions()? {
            by.entry(p.owner).or_default().push((p.topic, p.partition));
        }
        Ok(by)
    }
}

mod members;
pub use members::{GONE_AFTER_MS, MemberRow, Swap};

#[cfg(test)]
mod tests;
