//! [`GroupStore`]: a group's checkpoint on a connection of its own
//! (join, plugins, claim, write-ahead and finish of planned ranges,
//! partitions for status).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use super::fence::{claim_on, fence, for_update, in_tx, row_key, set_planned_on};
use super::{Claim, GroupError, GroupTables, PartitionRow, Planned};
use crate::capability::sql::{self, Backend, DbError, Dialect, SqlValue};
use crate::checkpoint::{Epoch, Fingerprint, PluginRef, TopicIdentity};

/// A group's checkpoint, on a connection of its own.
pub struct GroupStore {
    pub(super) group: String,
    pub(super) tables: GroupTables,
    pub(super) db: Mutex<Box<dyn Backend>>,
    /// How to connect again: `--sink-db` and the password file.
    pub(super) origin: (String, Option<std::path::PathBuf>),
    /// How long a lost connection or contention is retried
    /// ([`GroupStore::retry_for`]).
    pub(super) retry_for: std::time::Duration,
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
    pub(super) fn connect(
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
            retry_for: sql::DEFAULT_RECONNECT_FOR,
        })
    }

    /// A connection for the store. On PostgreSQL a lock wait ends after
    /// 10 s (55P03, retried by [`GroupStore::tx`]) and a statement after
    /// 60 s, so a claim made from the consumer's rebalance callback never
    /// blocks it for longer than one attempt.
    pub(super) fn backend(
        url: &str,
        password_file: Option<&Path>,
    ) -> Result<Box<dyn Backend>, DbError> {
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
    pub(super) fn tx<T>(
        &self,
        f: impl FnMut(&mut dyn Backend) -> Result<T, GroupError>,
    ) -> Result<T, GroupError> {
        self.retrying(true, f)
    }

    /// [`GroupStore::tx`] for a transaction that only reads.
    pub(super) fn read<T>(
        &self,
        f: impl FnMut(&mut dyn Backend) -> Result<T, GroupError>,
    ) -> Result<T, GroupError> {
        self.retrying(false, f)
    }

    pub(super) fn retrying<T>(
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

    /// The group's name.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The table names (for [`fence`] on the sink's connection).
    pub fn tables(&self) -> &GroupTables {
        &self.tables
    }

    pub(super) fn db(&self) -> std::sync::MutexGuard<'_, Box<dyn Backend>> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn err(&self, during: &'static str) -> impl FnOnce(DbError) -> GroupError + '_ {
        move |error| GroupError::Db {
            group: self.group.clone(),
            during,
            error,
        }
    }

    pub(super) fn bad_row(&self, table: &str, why: impl Into<String>) -> GroupError {
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
            if let Some(to) = super::fence::moved_to(b, &self.tables, &self.group)? {
                return Err(GroupError::Moved {
                    group: self.group.clone(),
                    to,
                });
            }
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

    /// The identity of each of the group's topics its positions belong
    /// to (empty for a group made before they were recorded, or after a
    /// reset of every topic).
    ///
    /// # Errors
    /// [`GroupError::Db`]; [`GroupError::BadRow`].
    pub fn topics(&self) -> Result<BTreeMap<String, TopicIdentity>, GroupError> {
        let rows = self.read(|b| {
            b.query(
                &format!(
                    "SELECT topics FROM {} WHERE group_name = $1",
                    self.tables.groups
                ),
                &[SqlValue::Text(self.group.clone())],
            )
            .map_err(self.err("reading the group's topics"))
        })?;
        match rows.rows.first().map(Vec::as_slice) {
            Some([SqlValue::Text(t)]) => serde_json::from_str(t)
                .map_err(|e| self.bad_row(&self.tables.groups, format!("topics: {e}"))),
            _ => Ok(BTreeMap::new()),
        }
    }

    /// Record the identities of the group's topics (at a write-ahead that
    /// saw them change); `None` forgets `topic`'s (a reset: the next plan
    /// records the topic there is then).
    ///
    /// # Errors
    /// [`GroupError::Db`]; [`GroupError::BadRow`].
    pub fn set_topics(
        &self,
        topics: &BTreeMap<String, Option<TopicIdentity>>,
    ) -> Result<(), GroupError> {
        let mut now = self.topics()?;
        for (t, i) in topics {
            match i {
                Some(i) => now.insert(t.clone(), i.clone()),
                None => now.remove(t),
            };
        }
        let text = serde_json::to_string(&now).unwrap_or_else(|_| "{}".into());
        self.tx(|b| {
            b.execute(
                &format!(
                    "UPDATE {} SET topics = $2 WHERE group_name = $1",
                    self.tables.groups
                ),
                &[
                    SqlValue::Text(self.group.clone()),
                    SqlValue::Text(text.clone()),
                ],
            )
            .map(drop)
            .map_err(self.err("recording the group's topics"))
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

    pub(super) fn planned(
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

    pub(super) fn set_planned(
        &self,
        b: &mut dyn Backend,
        topic: &str,
        partition: i32,
        planned: Option<&Planned>,
    ) -> Result<(), GroupError> {
        set_planned_on(b, &self.tables, &self.group, (topic, partition), planned)
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
