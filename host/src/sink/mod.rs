//! Sinks: apply one partition's share of a batch through a sink plugin,
//! with the capabilities the host grants it.
//!
//! With the SQL capability ([`sql::SqlGrant`]) each range is one
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
//! fetch. A re-run of that batch finds the progress row of its own batch
//! id and writes only the records from that row's end on (part bounds may
//! differ between runs); a row of another batch ending inside the planned
//! range is a mismatch ([`SinkError::Overlap`]).
//!
//! Without it, the plugin's `open`/`write`/`close` run as they are: the
//! delivery is at-least-once and the plugin must use the idempotency keys.

pub mod sql;

use sluice_guest::wire::{self, SinkRecord};

use crate::plugin::{Instance, OpenAnswer, PartitionRange, PluginError};
use sql::{DbError, SqlGrant, SqlValue};

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
    pub headers: Vec<(String, Option<Vec<u8>>)>,
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
    /// The part to apply now and the batch context (the whole planned range
    /// when it is applied at once).
    pub range: PartitionRange,
    /// The batch's whole planned range of this partition, `[start, end)`
    /// offsets: a progress row of another batch ending inside it is a
    /// mismatch ([`SinkError::Overlap`]) whichever part meets it.
    pub planned: std::ops::Range<i64>,
    /// Mapped records with their idempotency keys, in offset order.
    pub records: &'a [SinkRecord<'a>],
    /// Bad records to dead-letter (policy `dlq`).
    pub dead_letters: &'a [DeadLetter],
}

/// What happened to a partition range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Written now.
    Written {
        /// Records handed to the plugin.
        records: u64,
        /// Dead letters stored.
        dead_lettered: u64,
    },
    /// Already applied by an earlier run; nothing was done.
    AlreadyApplied,
}

/// Errors of the sink driver.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The plugin trapped or returned an error; the range (part) was
    /// rolled back, earlier parts stay applied.
    #[error("{0}; this range was rolled back (earlier parts of the batch stay applied)")]
    Plugin(#[from] PluginError),
    /// A database error; the range (part) was rolled back, earlier parts
    /// stay applied.
    #[error(
        "sink database error during {during} on {site}: {error}; this range was rolled back (earlier parts of the batch stay applied)"
    )]
    Sql {
        /// What the host or plugin was doing.
        during: &'static str,
        /// `topic/partition [start, end)`.
        site: String,
        /// The database's error (message and code).
        error: DbError,
    },
    /// A newer epoch already wrote this partition: we are a zombie.
    #[error(
        "sink fenced on {site}: sluice_progress holds epoch {stored} but this process runs epoch {ours}; another process owns the pipeline now"
    )]
    Fenced {
        /// `topic/partition [start, end)`.
        site: String,
        /// Epoch in the progress row.
        stored: u64,
        /// Ours.
        ours: u64,
    },
    /// The stored progress of another batch ends inside our range: the
    /// checkpoint and the database disagree (e.g. the checkpoint was reset
    /// or replaced).
    #[error(
        "sink progress mismatch on {site}: sluice_progress says offsets up to {stored_end} are applied, which falls inside this range; the checkpoint and the database disagree (was the checkpoint reset or replaced?). Delete the progress row for this query id only if you know the database does not hold this range's effects"
    )]
    Overlap {
        /// `topic/partition [start, end)`.
        site: String,
        /// Stored end offset.
        stored_end: i64,
    },
    /// Dead letters without a database to put them in.
    #[error("the dlq error policy needs a sink database (--sink-db) to store dead letters")]
    NoDeadLetterStore,
}

/// Runs partition ranges through a sink, with or without the SQL
/// capability.
pub struct SinkDriver {
    sql: Option<SqlGrant>,
}

fn site(r: &PartitionRange) -> String {
    site_of(&r.topic, r.partition, &(r.start_offset..r.end_offset))
}

/// `topic/partition [start, end)`.
fn site_of(topic: &str, partition: i32, range: &std::ops::Range<i64>) -> String {
    format!("{topic}/{partition} [{}, {})", range.start, range.end)
}

impl SinkDriver {
    /// A driver; with `sql`, creates `sluice_progress` and
    /// `sluice_dead_letters` if they are missing.
    ///
    /// # Errors
    /// The database's error.
    pub fn new(sql: Option<SqlGrant>) -> Result<Self, DbError> {
        if let Some(g) = &sql {
            let mut s = g.lock();
            let b = s.backend();
            let blob = b.blob_type();
            b.batch(&format!(
                "CREATE TABLE IF NOT EXISTS sluice_progress (\
                   query_id TEXT NOT NULL, topic TEXT NOT NULL, \"partition\" INTEGER NOT NULL, \
                   end_offset BIGINT NOT NULL, batch_id BIGINT NOT NULL, epoch BIGINT NOT NULL, \
                   updated_at_ms BIGINT NOT NULL, \
                   PRIMARY KEY (query_id, topic, \"partition\"));\
                 CREATE TABLE IF NOT EXISTS sluice_dead_letters (\
                   query_id TEXT NOT NULL, topic TEXT NOT NULL, \"partition\" INTEGER NOT NULL, \
                   \"offset\" BIGINT NOT NULL, timestamp_ms BIGINT NOT NULL, \
                   record_key {blob}, record_value {blob}, headers_json TEXT NOT NULL, \
                   error TEXT NOT NULL, plugin_digest TEXT NOT NULL, stage INTEGER NOT NULL, \
                   batch_id BIGINT NOT NULL, epoch BIGINT NOT NULL, \
                   PRIMARY KEY (query_id, topic, \"partition\", \"offset\"));"
            ))?;
        }
        Ok(SinkDriver { sql })
    }

    /// The SQL grant, for sink instances.
    pub fn sql(&self) -> Option<&SqlGrant> {
        self.sql.as_ref()
    }

    /// Apply one partition range through `instance` (a sink plugin), or
    /// only its dead letters and progress when there is no sink plugin.
    ///
    /// # Errors
    /// [`SinkError`]; with the SQL capability nothing of the range is
    /// applied when an error is returned.
    pub fn apply(
        &self,
        instance: Option<&mut Instance>,
        batch: &PartitionBatch<'_>,
    ) -> Result<Applied, SinkError> {
        match &self.sql {
            Some(g) => self.apply_transactional(g, instance, batch),
            None => {
                if !batch.dead_letters.is_empty() {
                    return Err(SinkError::NoDeadLetterStore);
                }
                match instance {
                    Some(i) => run_plugin(i, batch),
                    None => Ok(Applied::Written {
                        records: batch.records.len() as u64,
                        dead_lettered: 0,
                    }),
                }
            }
        }
    }

    fn apply_transactional(
        &self,
        g: &SqlGrant,
        instance: Option<&mut Instance>,
        batch: &PartitionBatch<'_>,
    ) -> Result<Applied, SinkError> {
        let r = &batch.range;
        let sql_err = |during: &'static str| {
            move |error: DbError| SinkError::Sql {
                during,
                site: site(r),
                error,
            }
        };
        g.lock().begin().map_err(sql_err("begin"))?;
        let result = (|| {
            let stored = g
                .lock()
                .backend()
                .query(
                    "SELECT end_offset, epoch, batch_id FROM sluice_progress WHERE query_id = $1 AND topic = $2 AND \"partition\" = $3",
                    &[
                        SqlValue::Text(r.batch.query_id.clone()),
                        SqlValue::Text(r.topic.clone()),
                        SqlValue::Integer(r.partition.into()),
                    ],
                )
                .map_err(sql_err("reading sluice_progress"))?;
            // Where this run starts writing: the range's start, or, when an
            // earlier run of the same batch already applied a first part of
            // the range (the engine sinks a range in consecutive parts, each
            // its own transaction), the end of that part.
            let mut from = r.start_offset;
            if let Some(row) = stored.rows.first() {
                let (end, epoch, batch_id) = match (row.first(), row.get(1), row.get(2)) {
                    (
                        Some(SqlValue::Integer(e)),
                        Some(SqlValue::Integer(p)),
                        Some(SqlValue::Integer(b)),
                    ) => (*e, *p as u64, *b),
                    _ => {
                        return Err(SinkError::Sql {
                            during: "reading sluice_progress",
                            site: site(r),
                            error: DbError {
                                message: format!("unexpected row {row:?}"),
                                code: "sluice".into(),
                            },
                        });
                    }
                };
                if epoch > r.batch.epoch {
                    return Err(SinkError::Fenced {
                        site: site(r),
                        stored: epoch,
                        ours: r.batch.epoch,
                    });
                }
                if batch_id == r.batch.batch_id as i64 {
                    // An earlier part of this batch, from this run or an
                    // earlier one, applied the range up to `end`.
                    if end >= r.end_offset {
                        return Ok(None);
                    }
                    from = from.max(end);
                } else if end >= batch.planned.end {
                    // Another batch already applied the whole range.
                    return Ok(None);
                } else if end > batch.planned.start {
                    // Judged on the whole planned range, not on this part,
                    // so the verdict does not depend on where parts end.
                    return Err(SinkError::Overlap {
                        site: site_of(&r.topic, r.partition, &batch.planned),
                        stored_end: end,
                    });
                }
            }
            // Dead letters of the range, stored now or by that earlier run.
            let dead_letters = batch.dead_letters.len() as u64;
            let rest;
            let batch = if from > r.start_offset {
                // Records and dead letters are in offset order.
                let records =
                    &batch.records[batch.records.partition_point(|x| x.record.offset < from)..];
                let dead_letters =
                    &batch.dead_letters[batch.dead_letters.partition_point(|d| d.offset < from)..];
                tracing::info!(topic = %r.topic, partition = r.partition, "offsets [{}, {from}) of [{}, {}) were applied by an earlier run of batch {}; writing the rest", r.start_offset, r.start_offset, r.end_offset, r.batch.batch_id);
                rest = PartitionBatch {
                    range: PartitionRange {
                        start_offset: from,
                        ..r.clone()
                    },
                    planned: batch.planned.clone(),
                    records,
                    dead_letters,
                };
                &rest
            } else {
                batch
            };
            let written = match instance {
                Some(i) => {
                    let out = run_plugin(i, batch);
                    if let Some(e) = g.lock().end_plugin_window() {
                        return Err(SinkError::Sql {
                            during: "the plugin's SQL",
                            site: site(r),
                            error: e,
                        });
                    }
                    out?
                }
                None => {
                    g.lock().end_plugin_window();
                    Applied::Written {
                        records: batch.records.len() as u64,
                        dead_lettered: 0,
                    }
                }
            };
            let mut s = g.lock();
            let b = s.backend();
            for d in batch.dead_letters {
                let headers: Vec<serde_json::Value> = d
                    .headers
                    .iter()
                    .map(|(k, v)| {
                        serde_json::json!({
                            "key": k,
                            "value_b64": v.as_ref().map(|v| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, v)),
                        })
                    })
                    .collect();
                b.execute(
                    "INSERT INTO sluice_dead_letters (query_id, topic, \"partition\", \"offset\", timestamp_ms, record_key, record_value, headers_json, error, plugin_digest, stage, batch_id, epoch) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
                     ON CONFLICT (query_id, topic, \"partition\", \"offset\") DO UPDATE SET \
                       timestamp_ms = excluded.timestamp_ms, record_key = excluded.record_key, \
                       record_value = excluded.record_value, headers_json = excluded.headers_json, \
                       error = excluded.error, plugin_digest = excluded.plugin_digest, \
                       stage = excluded.stage, batch_id = excluded.batch_id, epoch = excluded.epoch",
                    &[
                        SqlValue::Text(r.batch.query_id.clone()),
                        SqlValue::Text(d.topic.clone()),
                        SqlValue::Integer(d.partition.into()),
                        SqlValue::Integer(d.offset),
                        SqlValue::Integer(d.timestamp_ms),
                        d.key.clone().map_or(SqlValue::Null, SqlValue::Blob),
                        d.value.clone().map_or(SqlValue::Null, SqlValue::Blob),
                        SqlValue::Text(serde_json::Value::Array(headers).to_string()),
                        SqlValue::Text(d.error.clone()),
                        SqlValue::Text(d.plugin_digest.clone()),
                        SqlValue::Integer(d.stage as i64),
                        SqlValue::Integer(r.batch.batch_id as i64),
                        SqlValue::Integer(r.batch.epoch as i64),
                    ],
                )
                .map_err(sql_err("inserting dead letters"))?;
            }
            let changed = b
                .execute(
                    "INSERT INTO sluice_progress (query_id, topic, \"partition\", end_offset, batch_id, epoch, updated_at_ms) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7) \
                     ON CONFLICT (query_id, topic, \"partition\") DO UPDATE SET \
                       end_offset = excluded.end_offset, batch_id = excluded.batch_id, \
                       epoch = excluded.epoch, updated_at_ms = excluded.updated_at_ms \
                     WHERE sluice_progress.epoch <= excluded.epoch AND sluice_progress.end_offset <= $8",
                    &[
                        SqlValue::Text(r.batch.query_id.clone()),
                        SqlValue::Text(r.topic.clone()),
                        SqlValue::Integer(r.partition.into()),
                        SqlValue::Integer(r.end_offset),
                        SqlValue::Integer(r.batch.batch_id as i64),
                        SqlValue::Integer(r.batch.epoch as i64),
                        SqlValue::Integer(crate::checkpoint::now_ms()),
                        SqlValue::Integer(from),
                    ],
                )
                .map_err(sql_err("updating sluice_progress"))?;
            if changed == 0 {
                // Someone else wrote this partition's progress since we read
                // it: a newer epoch, or a concurrent writer of the same range.
                return Err(SinkError::Fenced {
                    site: site(r),
                    stored: r.batch.epoch + 1,
                    ours: r.batch.epoch,
                });
            }
            crate::checkpoint::failpoint("sink:before-db-commit");
            Ok(Some(match written {
                Applied::Written { records, .. } => Applied::Written {
                    records,
                    dead_lettered: dead_letters,
                },
                a => a,
            }))
        })();
        // Ok(None): the progress row shows the range applied; nothing to do.
        let mut s = g.lock();
        match result {
            Ok(None) => {
                s.rollback();
                Ok(Applied::AlreadyApplied)
            }
            Ok(Some(a)) => {
                s.commit().map_err(sql_err("commit"))?;
                Ok(a)
            }
            Err(e) => {
                s.rollback();
                Err(e)
            }
        }
    }
}

/// `open`, `write` in chunks, `close`.
fn run_plugin(instance: &mut Instance, batch: &PartitionBatch<'_>) -> Result<Applied, SinkError> {
    let r = &batch.range;
    if instance.sink_open(r)? == OpenAnswer::AlreadyApplied {
        return Ok(Applied::AlreadyApplied);
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
        instance.sink_write(enc.finish(), site)?;
        crate::checkpoint::failpoint("sink:after-write");
        start = end;
    }
    instance.sink_close(|| site(r))?;
    Ok(Applied::Written {
        records: batch.records.len() as u64,
        dead_lettered: 0,
    })
}
