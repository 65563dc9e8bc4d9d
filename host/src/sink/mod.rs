//! Sinks: apply one partition's share of a batch through a sink plugin,
//! with the capabilities the host grants it.
//!
//! With the SQL capability ([`SqlGrant`]) each range is one
//! database transaction: read `sluice_progress`; if the range is already
//! applied, skip it without calling the plugin; otherwise run the plugin's
//! `open`/`write`/`close`, insert dead letters, upsert the progress row —
//! fenced: only while the stored epoch is not newer than ours — and commit.
//! Any error or trap rolls that range back. So even a non-idempotent
//! sink (`UPDATE counters SET n = n + 1`) ends exactly right after any
//! crash and replay.
//!
//! The "range" applied at once may be a consecutive part of a batch's
//! share of a partition: the engine applies it in parts (`[s, m)`, then
//! `[m, e)`), each its own transaction, so the sink keeps up with the
//! fetch.
//!
//! The progress row records the applied offsets as an end offset and the
//! holes below it ([`applied::AppliedSet`]), and a range writes only the
//! offsets the row does not show applied. So a re-run of a batch writes
//! only what its earlier run left (part bounds may differ between runs), a
//! reset back skips what was applied, and a range a reset forward jumped
//! over is applied when a reset back reaches it.
//!
//! Without it, the plugin's `open`/`write`/`close` run as they are: the
//! delivery is at-least-once and the plugin must use the idempotency keys.
//!
//! Files: this one holds the driver and the plugin calls; `transaction`
//! applies a part in one database transaction, `tables` reads and writes
//! the host's tables, `applied` is the applied-offsets set of a progress
//! row, `reset` moves rows for `host checkpoint reset` and `host group
//! reset`, `moves` hands them over between a checkpoint and a group.

pub mod applied;
mod error;
mod moves;
pub mod reset;
mod sends;
mod tables;
mod transaction;

use sluice_guest::wire::{self, OwnedHeaders, SinkRecord};

use crate::capability::sql::{DbError, SqlGrant};
use crate::plugin::{Instance, OpenAnswer, PartitionContext, PluginError, StageFailure};
pub use error::SinkError;
use sends::Sends;
pub use sends::{Deliver, DeliverFn, Outgoing};
use tables::HostTables;
pub use tables::OtherPipeline;

pub use crate::capability::sql::DEFAULT_RECONNECT_FOR;

/// Records per `sink.write` call.
const CHUNK_RECORDS: usize = 2000;
/// Bytes per `sink.write` call (soft limit).
const CHUNK_BYTES: usize = 4 << 20;

/// A bad record to keep in `sluice_dead_letters`: original bytes, where it
/// came from, and why it was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// Source offset.
    pub offset: i64,
    /// Kafka timestamp, ms.
    pub timestamp_ms: i64,
    /// Original key bytes.
    pub key: Option<Vec<u8>>,
    /// Original value bytes.
    pub value: Option<Vec<u8>>,
    /// Original headers.
    pub headers: OwnedHeaders,
    /// The stage's message.
    pub error: String,
    /// Digest of the plugin that rejected it.
    pub plugin_digest: String,
    /// Position of that stage in the pipeline.
    pub stage: usize,
}

/// One partition's share of a batch, or a consecutive part of it, ready
/// for the sink.
#[derive(Debug)]
pub struct PartitionBatch<'a> {
    /// The partition's owner epoch (the fencing token this part is
    /// written under: the progress row's epoch, and a group's
    /// `owner_epoch`).
    pub epoch: crate::checkpoint::Epoch,
    /// The part to apply now and the batch context (the whole planned range
    /// when it is applied at once).
    pub range: PartitionContext,
    /// Mapped records in offset order, with their idempotency keys when a
    /// sink plugin reads them (the host makes none for a built-in table
    /// sink or `--no-sink`: the key is then `""`).
    pub records: &'a [SinkRecord<'a>],
    /// Bad records to dead-letter (policy `dlq`).
    pub dead_letters: &'a [DeadLetter],
    /// Where the records the sink sends (`kafka.send`) go; `None` when
    /// the pipeline names no output topic.
    pub deliver: Option<Deliver<'a>>,
}

impl<'a> PartitionBatch<'a> {
    /// The part of this batch in `offsets`: its records and dead letters
    /// there, with the context's bounds set to them.
    pub fn slice(&self, offsets: &std::ops::Range<i64>) -> PartitionBatch<'a> {
        let records = self.records;
        let (lo, hi) = (
            records.partition_point(|x| x.record.offset < offsets.start),
            records.partition_point(|x| x.record.offset < offsets.end),
        );
        let dead = self.dead_letters;
        let (dlo, dhi) = (
            dead.partition_point(|d| d.offset < offsets.start),
            dead.partition_point(|d| d.offset < offsets.end),
        );
        PartitionBatch {
            epoch: self.epoch,
            range: PartitionContext {
                start_offset: offsets.start,
                end_offset: offsets.end,
                ..self.range.clone()
            },
            records: &records[lo..hi],
            dead_letters: &dead[dlo..dhi],
            deliver: self.deliver,
        }
    }
}

/// What happened to a partition range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Written now (perhaps only the offsets the progress row did not show
    /// applied).
    Written {
        /// Records handed to the plugin.
        records: u64,
        /// Dead letters stored.
        dead_lettered: u64,
        /// Offsets of the range not written: applied before.
        applied_before: AppliedBefore,
    },
    /// Already applied by an earlier run; nothing was done.
    AlreadyApplied {
        /// The offsets of the range, all applied before.
        applied_before: AppliedBefore,
    },
}

/// Offsets of a range that were not written because the progress row
/// showed them applied before (by an earlier run of the batch, or another
/// batch). Never called "skipped": that word is for bad records under
/// `--on-error skip`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AppliedBefore {
    /// How many offsets (records, control records and compaction gaps
    /// alike) of the range.
    pub offsets: u64,
    /// The progress row was last written by another batch than this one
    /// (a reset back or a restored checkpoint), not by an earlier run of
    /// the same batch (a crash and re-run), so the user may not expect it.
    pub by_other_batch: bool,
}

/// Runs partition ranges through a sink, with or without the SQL
/// capability.
pub struct SinkDriver {
    sql: Option<SqlGrant>,
    /// Further connections to the same database (`--sink-connections`
    /// beyond the first): connection `n` (1-based here) applies the parts
    /// the engine routes to it ([`SinkDriver::apply`]).
    more: Vec<SqlGrant>,
    /// How long to keep reconnecting after the connection is lost.
    reconnect_for: std::time::Duration,
    /// The host's tables, schema-qualified (see [`HostTables`]).
    tables: HostTables,
    /// Who writes the progress rows (pid, host, checkpoint), stored in
    /// them so another pipeline's host can name it.
    owner: String,
    /// For a pipeline group's member: the group's tables and name; every
    /// part's transaction then locks the partition's row and requires the
    /// part's epoch to be its owner epoch ([`crate::checkpoint::group::fence`]).
    group: Option<(crate::checkpoint::group::GroupTables, String)>,
}

/// `topic/partition [start, end)`.
pub(super) fn site(r: &PartitionContext) -> String {
    format!(
        "{}/{} [{}, {})",
        r.topic, r.partition, r.start_offset, r.end_offset
    )
}

impl SinkDriver {
    /// A driver; with `sql`, creates `sluice_progress` and
    /// `sluice_dead_letters` in the grant's schema if they are missing,
    /// adds the `holes` column to a `sluice_progress` made by host 0.2.0,
    /// and checks the grant's plugin role ([`SqlGrant::check_plugin_role`]).
    ///
    /// # Errors
    /// The database's error.
    pub fn new(sql: Option<SqlGrant>) -> Result<Self, DbError> {
        let tables = match &sql {
            Some(g) => {
                let schema = g.host_schema();
                let tables = HostTables::create(g.lock().backend(), &schema)?;
                if let Some(role) = g.plugin_role() {
                    g.check_plugin_role(&role, &[&tables.progress, &tables.dead_letters])?;
                }
                tables
            }
            None => HostTables::default(),
        };
        Ok(SinkDriver {
            sql,
            more: Vec::new(),
            tables,
            reconnect_for: DEFAULT_RECONNECT_FOR,
            owner: String::new(),
            group: None,
        })
    }

    /// Fence every part by the owner epoch of pipeline group `group`
    /// (tables `tables`): the part's context carries the partition's epoch.
    pub fn in_group(
        mut self,
        tables: crate::checkpoint::group::GroupTables,
        group: impl Into<String>,
    ) -> Self {
        self.group = Some((tables, group.into()));
        self
    }

    /// The SQL capability this driver writes through (`None`: no sink
    /// database); with several connections, the first (the one the host's
    /// own reads use).
    pub fn grant(&self) -> Option<&SqlGrant> {
        self.sql.as_ref()
    }

    /// Apply parts on `more` connections besides the first
    /// (`--sink-connections`): each a session of its own on the same
    /// database, set up as the first (statement limit, host schema,
    /// plugin role). Connection `n` is [`SinkDriver::apply`]'s `lane` `n`.
    pub fn with_connections(mut self, more: Vec<SqlGrant>) -> Self {
        self.more = more;
        self
    }

    /// The connections parts are applied on: 1 without a sink database.
    pub fn connections(&self) -> usize {
        1 + self.more.len()
    }

    /// The SQL capability of connection `lane` (0: [`SinkDriver::grant`];
    /// `None` without a sink database or past [`SinkDriver::connections`]).
    pub fn grant_of(&self, lane: usize) -> Option<&SqlGrant> {
        match lane {
            0 => self.sql.as_ref(),
            n => self.more.get(n - 1),
        }
    }

    /// Every connection's SQL capability, the first first (empty without
    /// a sink database): one sink instance is made for each.
    pub fn grants(&self) -> Vec<SqlGrant> {
        self.sql.iter().chain(&self.more).cloned().collect()
    }

    /// Record `owner` (who runs the pipeline: pid, host, checkpoint) in
    /// the progress rows this driver writes.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Progress rows of pipelines other than `query_id` on `topics`: a
    /// second pipeline on the same sink and topics would apply every
    /// record again.
    ///
    /// # Errors
    /// [`SinkError::Sql`].
    pub fn other_pipelines(
        &self,
        query_id: &str,
        topics: &[String],
    ) -> Result<Vec<OtherPipeline>, SinkError> {
        let Some(g) = &self.sql else {
            return Ok(Vec::new());
        };
        self.tables
            .other_pipelines(g.lock().backend(), query_id, topics)
            .map_err(|error| SinkError::Sql {
                during: "reading sluice_progress for other pipelines",
                site: format!("topics {}", topics.join(", ")),
                error,
            })
    }

    /// The end offset applied and when the row was last written (ms since
    /// the Unix epoch), for `query_id` on `topic/partition`.
    ///
    /// # Errors
    /// [`SinkError::Sql`].
    pub fn applied(
        &self,
        query_id: &str,
        topic: &str,
        partition: i32,
    ) -> Result<Option<(i64, i64)>, SinkError> {
        use crate::capability::sql::SqlValue;
        let row = self.progress_columns("end_offset, updated_at_ms", query_id, topic, partition)?;
        Ok(match row.as_deref() {
            Some([SqlValue::Integer(end), SqlValue::Integer(at)]) => Some((*end, *at)),
            _ => None,
        })
    }

    /// The end offset `query_id`'s progress row on `topic/partition` shows
    /// applied, and the epoch it was last written with (`None`: no row),
    /// read on `b` (a pipeline group's claim reads it on the group
    /// store's connection, inside the claim's transaction: it reads on
    /// from that end, and takes an epoch above that one).
    ///
    /// # Errors
    /// [`DbError`].
    pub fn applied_end_and_epoch_on(
        &self,
        b: &mut dyn crate::capability::sql::Backend,
        query_id: &str,
        topic: &str,
        partition: i32,
    ) -> Result<Option<(i64, crate::checkpoint::Epoch)>, DbError> {
        use crate::capability::sql::SqlValue;
        let rows = b.query(
            &self.progress_select("end_offset, epoch"),
            &progress_key(query_id, topic, partition),
        )?;
        Ok(match rows.rows.first().map(Vec::as_slice) {
            Some([SqlValue::Integer(end), SqlValue::Integer(e)]) => {
                Some((*end, crate::checkpoint::Epoch::new(*e as u64)))
            }
            _ => None,
        })
    }

    fn progress_select(&self, columns: &str) -> String {
        format!(
            "SELECT {columns} FROM {} WHERE query_id = $1 AND topic = $2 AND \"partition\" = $3",
            self.tables.progress
        )
    }

    /// `columns` of `query_id`'s progress row on `topic/partition` (`None`:
    /// no row, or no SQL capability).
    fn progress_columns(
        &self,
        columns: &str,
        query_id: &str,
        topic: &str,
        partition: i32,
    ) -> Result<Option<Vec<crate::capability::sql::SqlValue>>, SinkError> {
        let Some(g) = &self.sql else {
            return Ok(None);
        };
        let rows = g
            .lock()
            .backend()
            .query(
                &self.progress_select(columns),
                &progress_key(query_id, topic, partition),
            )
            .map_err(|error| SinkError::Sql {
                during: "reading sluice_progress",
                site: format!("{topic}/{partition}"),
                error,
            })?;
        Ok(rows.rows.into_iter().next())
    }

    /// The statement that deletes the progress rows of `query_id`.
    pub fn delete_rows_sql(&self, query_id: &str) -> String {
        format!(
            "DELETE FROM {} WHERE query_id = '{}'",
            self.tables.progress,
            query_id.replace('\'', "''")
        )
    }

    /// Keep reconnecting for up to `d` after the connection is lost
    /// (default [`DEFAULT_RECONNECT_FOR`]).
    pub fn reconnect_for(mut self, d: std::time::Duration) -> Self {
        self.reconnect_for = d;
        self
    }

    /// Open a new connection after `lost`, with backoff (0.2 s doubling
    /// to 5 s), until `until`.
    ///
    /// # Errors
    /// [`SinkError::Sql`] naming the last connection error once the time is
    /// up.
    fn reconnect(
        &self,
        g: &SqlGrant,
        lost: &SinkError,
        until: std::time::Instant,
    ) -> Result<(), SinkError> {
        let mut delay = std::time::Duration::from_millis(200);
        let mut attempt = 1u32;
        tracing::warn!(
            "sink database connection lost ({lost}); reconnecting for up to {} s",
            self.reconnect_for.as_secs()
        );
        loop {
            std::thread::sleep(delay);
            match g.reconnect() {
                Ok(()) => {
                    tracing::info!(
                        attempt,
                        "sink database reconnected; the part is applied again from its progress row"
                    );
                    return Ok(());
                }
                Err(error)
                    if (error.is_connection_lost() || error.is_server_full())
                        && std::time::Instant::now() < until =>
                {
                    tracing::warn!(attempt, "sink database still unreachable: {error}");
                }
                Err(error) => {
                    return Err(SinkError::Sql {
                        during: "reconnecting (the sink database stayed unreachable; see --sink-retry-for)",
                        site: "the sink database".into(),
                        error,
                    });
                }
            }
            attempt += 1;
            delay = (delay * 2).min(std::time::Duration::from_secs(5));
        }
    }

    /// The first connection's SQL grant (as [`SinkDriver::grant`]).
    pub fn sql(&self) -> Option<&SqlGrant> {
        self.sql.as_ref()
    }

    /// Apply one partition range on connection `lane` (0 to
    /// [`SinkDriver::connections`] − 1) through `instance` (a sink plugin
    /// granted that connection), or only its dead letters and progress
    /// when there is no sink plugin. Ranges of one partition must all go
    /// to one connection, in order: different connections commit in no
    /// set order.
    ///
    /// # Errors
    /// [`SinkError`]; with the SQL capability nothing of the range is
    /// applied when an error is returned.
    pub fn apply(
        &self,
        lane: usize,
        instance: Option<&mut Instance>,
        batch: &PartitionBatch<'_>,
    ) -> Result<Applied, SinkError> {
        if lane > 0 && self.grant_of(lane).is_none() {
            return Err(SinkError::Sql {
                during: "choosing the sink connection",
                site: site(&batch.range),
                error: DbError {
                    message: format!(
                        "connection {lane} does not exist (the driver has {})",
                        self.connections()
                    ),
                    code: "sluice".into(),
                },
            });
        }
        match self.grant_of(lane) {
            Some(g) => {
                // A part lost with the connection is applied again on a new
                // one, from its progress row (so nothing twice), by a fresh
                // plugin instance; for up to the reconnect time in all.
                // A part that met contention (a lock another session
                // holds, a deadlock) is applied again after a pause, for
                // as long: a frozen group member's locks are released
                // when PostgreSQL ends its idle session
                // ([`SqlGrant::limit_statements`]).
                let until = std::time::Instant::now() + self.reconnect_for;
                let mut instance = instance;
                let mut pause = std::time::Duration::from_millis(100);
                loop {
                    match self.apply_transactional(g, instance.as_deref_mut(), batch) {
                        Err(e) if e.is_connection_lost() => {
                            if std::time::Instant::now() >= until {
                                return Err(e);
                            }
                            self.reconnect(g, &e, until)?;
                        }
                        Err(e) if e.is_contention() && std::time::Instant::now() < until => {
                            tracing::warn!(
                                "{e}; applying the part again in {} ms (for up to {} s in all, see --sink-retry-for)",
                                pause.as_millis(),
                                self.reconnect_for.as_secs()
                            );
                            std::thread::sleep(pause);
                            pause = (pause * 2).min(std::time::Duration::from_secs(5));
                        }
                        r => return r,
                    }
                    if let Some(i) = instance.as_deref_mut() {
                        i.discard();
                    }
                }
            }
            None => {
                if !batch.dead_letters.is_empty() {
                    return Err(SinkError::NoDeadLetterStore);
                }
                match instance {
                    Some(i) => {
                        let applied = run_plugin(i, batch)?;
                        Sends::take(i, &batch.range)?.deliver(batch)?;
                        Ok(applied)
                    }
                    None => Ok(Applied::Written {
                        records: batch.records.len() as u64,
                        dead_lettered: 0,
                        applied_before: AppliedBefore::default(),
                    }),
                }
            }
        }
    }
}

/// The parameters `$1 … $3` that name a progress row.
fn progress_key(
    query_id: &str,
    topic: &str,
    partition: i32,
) -> [crate::capability::sql::SqlValue; 3] {
    use crate::capability::sql::SqlValue;
    [
        SqlValue::Text(query_id.to_string()),
        SqlValue::Text(topic.to_string()),
        SqlValue::Integer(partition.into()),
    ]
}

/// `open`, `write` in chunks, `close`.
pub(super) fn run_plugin(
    instance: &mut Instance,
    batch: &PartitionBatch<'_>,
) -> Result<Applied, SinkError> {
    let r = &batch.range;
    if instance.sink_open(r)? == OpenAnswer::AlreadyApplied {
        return Ok(Applied::AlreadyApplied {
            applied_before: AppliedBefore {
                offsets: (r.end_offset - r.start_offset).max(0) as u64,
                by_other_batch: false,
            },
        });
    }
    let mut start = 0;
    while start < batch.records.len() {
        let mut enc = wire::Encoder::with_capacity(64 * 1024);
        let mut end = start;
        while end < batch.records.len() && end - start < CHUNK_RECORDS && enc.len() < CHUNK_BYTES {
            let rec = &batch.records[end];
            enc.push_sink_record(rec.idempotency_key, &rec.record);
            end += 1;
        }
        let chunk = &batch.records[start..end];
        let site = || match (chunk.first(), chunk.last()) {
            (Some(a), Some(b)) => format!(
                "{}/{} offsets {}..={} ({} records)",
                r.topic,
                r.partition,
                a.record.offset,
                b.record.offset,
                chunk.len()
            ),
            _ => site(r),
        };
        if let Err(error) = instance.sink_write(enc.finish(), site) {
            // A bad record names its index in this call's chunk.
            if let PluginError::Stage {
                failure: StageFailure::BadRecord { index, message },
                ..
            } = &error
                && let Some(rec) = chunk.get(*index as usize)
            {
                let (offset, message) = (rec.record.offset, message.clone());
                return Err(SinkError::Rejected {
                    offset,
                    message,
                    error: Box::new(error),
                });
            }
            return Err(error.into());
        }
        crate::util::failpoint("sink:after-write");
        start = end;
    }
    instance.sink_close(|| site(r))?;
    Ok(Applied::Written {
        records: batch.records.len() as u64,
        dead_lettered: 0,
        applied_before: AppliedBefore::default(),
    })
}

#[cfg(test)]
mod tests;
