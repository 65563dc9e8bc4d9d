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

pub mod applied;
pub mod sql;

use sluice_guest::wire::{self, SinkRecord};

use crate::plugin::{Instance, OpenAnswer, PartitionRange, PluginError};
use applied::AppliedSet;
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
                   updated_at_ms BIGINT NOT NULL, holes TEXT NOT NULL DEFAULT '[]', \
                   PRIMARY KEY (query_id, topic, \"partition\"));\
                 CREATE TABLE IF NOT EXISTS sluice_dead_letters (\
                   query_id TEXT NOT NULL, topic TEXT NOT NULL, \"partition\" INTEGER NOT NULL, \
                   \"offset\" BIGINT NOT NULL, timestamp_ms BIGINT NOT NULL, \
                   record_key {blob}, record_value {blob}, headers_json TEXT NOT NULL, \
                   error TEXT NOT NULL, plugin_digest TEXT NOT NULL, stage INTEGER NOT NULL, \
                   batch_id BIGINT NOT NULL, epoch BIGINT NOT NULL, \
                   PRIMARY KEY (query_id, topic, \"partition\", \"offset\"));"
            ))?;
            // Tables made before holes were recorded (0.2.0) get the column;
            // their rows have no holes.
            if b.query("SELECT holes FROM sluice_progress WHERE 1 = 0", &[])
                .is_err()
            {
                b.batch("ALTER TABLE sluice_progress ADD COLUMN holes TEXT NOT NULL DEFAULT '[]'")?;
            }
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
                    "SELECT end_offset, epoch, batch_id, holes FROM sluice_progress WHERE query_id = $1 AND topic = $2 AND \"partition\" = $3",
                    &[
                        SqlValue::Text(r.batch.query_id.clone()),
                        SqlValue::Text(r.topic.clone()),
                        SqlValue::Integer(r.partition.into()),
                    ],
                )
                .map_err(sql_err("reading sluice_progress"))?;
            let bad_row = |message: String| SinkError::Sql {
                during: "reading sluice_progress",
                site: site(r),
                error: DbError {
                    message,
                    code: "sluice".into(),
                },
            };
            // What the row shows applied, and the row's `end_offset` and
            // `holes` text as read (the update below is conditional on
            // them being unchanged).
            let (mut applied, row_read) = match stored.rows.first() {
                None => (AppliedSet::empty(), None),
                Some(row) => {
                    let (end, epoch, batch_id, holes) =
                        match (row.first(), row.get(1), row.get(2), row.get(3)) {
                            (
                                Some(SqlValue::Integer(e)),
                                Some(SqlValue::Integer(p)),
                                Some(SqlValue::Integer(b)),
                                Some(SqlValue::Text(h)),
                            ) => (*e, *p as u64, *b, h.clone()),
                            _ => return Err(bad_row(format!("unexpected row {row:?}"))),
                        };
                    if epoch > r.batch.epoch {
                        return Err(SinkError::Fenced {
                            site: site(r),
                            stored: epoch,
                            ours: r.batch.epoch,
                        });
                    }
                    let applied = AppliedSet::from_row(end, &holes).map_err(bad_row)?;
                    (applied, Some((end, holes, batch_id)))
                }
            };
            // Write only the offsets the row does not show applied: usually
            // the whole range; after a crash, the rest of a range an earlier
            // run of this batch applied in part; after a reset back, a hole
            // a reset forward left.
            let part = r.start_offset..r.end_offset;
            let missing = applied.missing(&part);
            let Some(written_range) = missing
                .first()
                .zip(missing.last())
                .map(|(a, b)| a.start..b.end)
            else {
                return Ok(None);
            };
            // Dead letters of the range, stored now or by that earlier run.
            let dead_letters = batch.dead_letters.len() as u64;
            let (rest, kept_records, kept_dead_letters);
            let batch = if missing == [part.clone()] {
                batch
            } else {
                let wanted = |o: i64| {
                    let i = missing.partition_point(|m| m.end <= o);
                    missing.get(i).is_some_and(|m| m.start <= o)
                };
                kept_records = batch
                    .records
                    .iter()
                    .filter(|x| wanted(x.record.offset))
                    .cloned()
                    .collect::<Vec<_>>();
                kept_dead_letters = batch
                    .dead_letters
                    .iter()
                    .filter(|d| wanted(d.offset))
                    .cloned()
                    .collect::<Vec<_>>();
                let pieces: Vec<String> = missing
                    .iter()
                    .map(|m| format!("[{}, {})", m.start, m.end))
                    .collect();
                tracing::info!(
                    topic = %r.topic,
                    partition = r.partition,
                    "offsets [{}, {}): sluice_progress (last written by batch {}) shows the rest applied; writing only {}",
                    r.start_offset,
                    r.end_offset,
                    row_read.as_ref().map_or(-1, |(_, _, b)| *b),
                    pieces.join(", ")
                );
                rest = PartitionBatch {
                    range: PartitionRange {
                        start_offset: written_range.start,
                        end_offset: written_range.end,
                        ..r.clone()
                    },
                    records: &kept_records,
                    dead_letters: &kept_dead_letters,
                };
                &rest
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
            for piece in missing {
                applied
                    .record(piece)
                    .map_err(|e| bad_row(format!("cannot record the range applied: {e}")))?;
            }
            let new_end = applied.end().unwrap_or(r.end_offset);
            let (read_end, holes_read) = row_read.map_or((-1, String::new()), |(e, h, _)| (e, h));
            // Conditional on the row being what was read above (none: no row
            // at all), and never over a newer epoch.
            let changed = b
                .execute(
                    "INSERT INTO sluice_progress (query_id, topic, \"partition\", end_offset, batch_id, epoch, updated_at_ms, holes) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                     ON CONFLICT (query_id, topic, \"partition\") DO UPDATE SET \
                       end_offset = excluded.end_offset, batch_id = excluded.batch_id, \
                       epoch = excluded.epoch, updated_at_ms = excluded.updated_at_ms, \
                       holes = excluded.holes \
                     WHERE sluice_progress.epoch <= excluded.epoch \
                       AND sluice_progress.end_offset = $9 AND sluice_progress.holes = $10",
                    &[
                        SqlValue::Text(r.batch.query_id.clone()),
                        SqlValue::Text(r.topic.clone()),
                        SqlValue::Integer(r.partition.into()),
                        SqlValue::Integer(new_end),
                        SqlValue::Integer(r.batch.batch_id as i64),
                        SqlValue::Integer(r.batch.epoch as i64),
                        SqlValue::Integer(crate::checkpoint::now_ms()),
                        SqlValue::Text(applied.holes_text()),
                        // -1 matches no row: a row that appeared since the read
                        // fails the update.
                        SqlValue::Integer(read_end),
                        SqlValue::Text(holes_read),
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
