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

pub mod applied;
pub mod reset;

use sluice_guest::wire::{self, OwnedHeaders, SinkRecord};

use crate::capability::sql::{self, DbError, SqlGrant, SqlValue};
use crate::plugin::{Instance, OpenAnswer, PartitionContext, PluginError, StageFailure};
use applied::AppliedSet;

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
    /// The part to apply now and the batch context (the whole planned range
    /// when it is applied at once).
    pub range: PartitionContext,
    /// Mapped records with their idempotency keys, in offset order.
    pub records: &'a [SinkRecord<'a>],
    /// Bad records to dead-letter (policy `dlq`).
    pub dead_letters: &'a [DeadLetter],
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
        /// Offsets of the range not written: already applied.
        skipped: Skipped,
    },
    /// Already applied by an earlier run; nothing was done.
    AlreadyApplied {
        /// The offsets that were skipped.
        skipped: Skipped,
    },
}

/// Offsets of a range that were not written because they were already
/// applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Skipped {
    /// How many offsets (records, control records and compaction gaps
    /// alike) of the range.
    pub offsets: u64,
    /// The progress row was last written by another batch than this one
    /// (a reset back or a restored checkpoint), not by an earlier run of
    /// the same batch (a crash and re-run), so the user may not expect it.
    pub by_other_batch: bool,
}

/// Errors of the sink driver.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The plugin trapped or returned an error; the range (part) was
    /// rolled back, earlier parts stay applied.
    #[error("{0}; this range was rolled back (earlier parts of the batch stay applied)")]
    Plugin(#[from] PluginError),
    /// The sink plugin rejected one record: a `bad-record` error from
    /// `sink.write`. With the SQL capability the range (part) was rolled
    /// back; the engine applies the error policy to the record and writes
    /// the part again without it.
    #[error("{error} (the record at offset {offset})")]
    Rejected {
        /// Source offset of the rejected record.
        offset: i64,
        /// The sink's message.
        message: String,
        /// The plugin's error, naming plugin, digest and call.
        error: Box<PluginError>,
    },
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
    /// The progress row changed between this range's read and its update:
    /// another process wrote the same query id's progress.
    #[error(
        "sluice_progress for {site} changed while this range was applied (now: {now}); is another process writing this query id's progress? This range was rolled back"
    )]
    ProgressChanged {
        /// `topic/partition [start, end)`.
        site: String,
        /// What the row holds now.
        now: String,
    },
    /// Dead letters without a database to put them in.
    #[error("the dlq error policy needs a sink database (--sink-db) to store dead letters")]
    NoDeadLetterStore,
}

impl SinkError {
    /// Worth another attempt at the same part: a retryable plugin failure
    /// or trap, or a transient database error ([`DbError::is_transient`]);
    /// the part was rolled back either way.
    pub fn is_retryable(&self) -> bool {
        match self {
            SinkError::Plugin(p) => p.is_retryable(),
            SinkError::Sql { error, .. } => error.is_transient(),
            _ => false,
        }
    }
}

/// A `sluice_progress` row as read, for the conditional update and for
/// messages.
struct StoredRow {
    end: i64,
    /// The `holes` text exactly as stored (compared as text on update).
    holes: String,
    batch_id: i64,
}

/// Runs partition ranges through a sink, with or without the SQL
/// capability.
pub struct SinkDriver {
    sql: Option<SqlGrant>,
    /// The host's tables, schema-qualified (see [`HostTables`]).
    tables: HostTables,
}

/// The host's table names, qualified with their schema (`main` on SQLite,
/// the connection's `current_schema()` on PostgreSQL). Both databases look
/// up an unqualified name in the session's temporary schema first, where a
/// plugin may create (or rename) a table of the same name; qualified names
/// never resolve there.
#[derive(Debug, Clone, Default)]
struct HostTables {
    progress: String,
    dead_letters: String,
}

/// `topic/partition [start, end)`.
fn site(r: &PartitionContext) -> String {
    format!(
        "{}/{} [{}, {})",
        r.topic, r.partition, r.start_offset, r.end_offset
    )
}

impl SinkDriver {
    /// A driver; with `sql`, creates `sluice_progress` and
    /// `sluice_dead_letters` if they are missing, and adds the `holes`
    /// column to a `sluice_progress` made by host 0.2.0.
    ///
    /// # Errors
    /// The database's error.
    pub fn new(sql: Option<SqlGrant>) -> Result<Self, DbError> {
        let mut tables = HostTables::default();
        if let Some(g) = &sql {
            let mut s = g.lock();
            let b = s.backend();
            let schema = match b.dialect() {
                sql::Dialect::Sqlite => "main".to_string(),
                sql::Dialect::Postgres => match b
                    .query("SELECT current_schema()", &[])?
                    .rows
                    .first()
                    .and_then(|r| r.first())
                {
                    Some(SqlValue::Text(schema)) => format!("\"{}\"", schema.replace('"', "\"\"")),
                    _ => {
                        return Err(DbError {
                            message: "the connection has no current schema to create the host's tables in (check search_path)".into(),
                            code: "sluice".into(),
                        });
                    }
                },
            };
            tables = HostTables {
                progress: format!("{schema}.sluice_progress"),
                dead_letters: format!("{schema}.sluice_dead_letters"),
            };
            let blob = b.blob_type();
            let HostTables {
                progress,
                dead_letters,
            } = &tables;
            b.batch(&format!(
                "CREATE TABLE IF NOT EXISTS {progress} (\
                   query_id TEXT NOT NULL, topic TEXT NOT NULL, \"partition\" INTEGER NOT NULL, \
                   end_offset BIGINT NOT NULL, batch_id BIGINT NOT NULL, epoch BIGINT NOT NULL, \
                   updated_at_ms BIGINT NOT NULL, holes TEXT NOT NULL DEFAULT '[]', \
                   PRIMARY KEY (query_id, topic, \"partition\"));\
                 CREATE TABLE IF NOT EXISTS {dead_letters} (\
                   query_id TEXT NOT NULL, topic TEXT NOT NULL, \"partition\" INTEGER NOT NULL, \
                   \"offset\" BIGINT NOT NULL, timestamp_ms BIGINT NOT NULL, \
                   record_key {blob}, record_value {blob}, headers_json TEXT NOT NULL, \
                   error TEXT NOT NULL, plugin_digest TEXT NOT NULL, stage INTEGER NOT NULL, \
                   batch_id BIGINT NOT NULL, epoch BIGINT NOT NULL, \
                   PRIMARY KEY (query_id, topic, \"partition\", \"offset\"));"
            ))?;
            // Tables made before holes were recorded (0.2.0) get the column;
            // their rows have no holes.
            match b.query(&format!("SELECT holes FROM {progress} WHERE 1 = 0"), &[]) {
                Ok(_) => {}
                Err(e) if e.code == "42703" || e.message.contains("no such column") => {
                    b.batch(&format!(
                        "ALTER TABLE {progress} ADD COLUMN holes TEXT NOT NULL DEFAULT '[]'"
                    ))?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(SinkDriver { sql, tables })
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
                        skipped: Skipped::default(),
                    }),
                }
            }
        }
    }

    /// The progress row of `r`'s partition: what it shows applied, and the
    /// row as read (`None` without a row). A row of a newer epoch is
    /// [`SinkError::Fenced`].
    fn read_progress(
        &self,
        b: &mut dyn sql::Backend,
        r: &PartitionContext,
    ) -> Result<(AppliedSet, Option<StoredRow>), SinkError> {
        let bad_row = |message: String| SinkError::Sql {
            during: "reading sluice_progress",
            site: site(r),
            error: DbError {
                message,
                code: "sluice".into(),
            },
        };
        let stored = b
            .query(
                &format!(
                    "SELECT end_offset, epoch, batch_id, holes FROM {} WHERE query_id = $1 AND topic = $2 AND \"partition\" = $3",
                    self.tables.progress
                ),
                &[
                    SqlValue::Text(r.batch.query_id.clone()),
                    SqlValue::Text(r.topic.clone()),
                    SqlValue::Integer(r.partition.into()),
                ],
            )
            .map_err(|error| SinkError::Sql {
                during: "reading sluice_progress",
                site: site(r),
                error,
            })?;
        let Some(row) = stored.rows.first() else {
            return Ok((AppliedSet::empty(), None));
        };
        let (end, epoch, batch_id, holes) = match (row.first(), row.get(1), row.get(2), row.get(3))
        {
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
        let applied = AppliedSet::from_row(end, &holes).map_err(|e| {
            bad_row(format!(
                "{e}; the row for query id {} was changed by hand? Fix or delete it",
                r.batch.query_id
            ))
        })?;
        Ok((
            applied,
            Some(StoredRow {
                end,
                holes,
                batch_id,
            }),
        ))
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
            // What the row shows applied, and the row as read (the update
            // below is conditional on it being unchanged).
            let (mut applied, row_read) = self.read_progress(g.lock().backend(), r)?;
            // Write only the offsets the row does not show applied: usually
            // the whole range; after a crash, the rest of a range an earlier
            // run of this batch applied in part; after a reset back, a hole
            // a reset forward left, and not what was applied around it.
            let missing = applied.missing(&(r.start_offset..r.end_offset));
            let skipped_by_other_batch = row_read
                .as_ref()
                .is_some_and(|row| row.batch_id != r.batch.batch_id as i64);
            let offsets = applied.applied_in(&(r.start_offset..r.end_offset));
            let skipped = Skipped {
                offsets,
                by_other_batch: skipped_by_other_batch && offsets > 0,
            };
            if missing.is_empty() {
                return Ok(Err(skipped));
            }
            let whole = missing.len() == 1
                && missing[0].start == r.start_offset
                && missing[0].end == r.end_offset;
            if !whole {
                let pieces: Vec<String> = missing
                    .iter()
                    .map(|m| format!("[{}, {})", m.start, m.end))
                    .collect();
                let by = row_read.as_ref().map_or(-1, |row| row.batch_id);
                if skipped_by_other_batch {
                    tracing::debug!(topic = %r.topic, partition = r.partition, "some offsets of [{}, {}) are already applied in the sink (sluice_progress, last written by batch {by}: a reset back or a restored checkpoint); writing only the missing ones: {}", r.start_offset, r.end_offset, pieces.join(", "));
                } else {
                    tracing::info!(topic = %r.topic, partition = r.partition, "some offsets of [{}, {}) were applied by an earlier run of batch {by}; writing only the missing ones: {}", r.start_offset, r.end_offset, pieces.join(", "));
                }
            }
            // Each missing piece is its own open/write/close of the plugin,
            // with its own range, inside this one transaction.
            let slice_of = |piece: &std::ops::Range<i64>| {
                let lo = batch
                    .records
                    .partition_point(|x| x.record.offset < piece.start);
                let hi = batch
                    .records
                    .partition_point(|x| x.record.offset < piece.end);
                let dlo = batch
                    .dead_letters
                    .partition_point(|d| d.offset < piece.start);
                let dhi = batch.dead_letters.partition_point(|d| d.offset < piece.end);
                PartitionBatch {
                    range: PartitionContext {
                        start_offset: piece.start,
                        end_offset: piece.end,
                        ..r.clone()
                    },
                    records: &batch.records[lo..hi],
                    dead_letters: &batch.dead_letters[dlo..dhi],
                }
            };
            let pieces: Vec<PartitionBatch<'_>> = missing.iter().map(slice_of).collect();
            let mut written_records = 0u64;
            let mut plugin_said_applied = 0usize;
            match instance {
                Some(i) => {
                    let mut out = Ok(());
                    for piece in &pieces {
                        match run_plugin(i, piece) {
                            Ok(Applied::Written { records, .. }) => written_records += records,
                            Ok(Applied::AlreadyApplied { .. }) => plugin_said_applied += 1,
                            Err(e) => {
                                out = Err(e);
                                break;
                            }
                        }
                    }
                    let window = g.lock().end_plugin_window();
                    // A rejection wins over an SQL error the sink met on the
                    // way (say, the constraint violation it rejects the
                    // record for): the whole part is rolled back and written
                    // again without the record, so any other error recurs.
                    if let Err(e @ SinkError::Rejected { .. }) = out {
                        return Err(e);
                    }
                    if let Some(e) = window {
                        return Err(SinkError::Sql {
                            during: "the plugin's SQL",
                            site: site(r),
                            error: e,
                        });
                    }
                    out?;
                }
                None => {
                    g.lock().end_plugin_window();
                    written_records = pieces.iter().map(|p| p.records.len() as u64).sum();
                }
            }
            let mut s = g.lock();
            let b = s.backend();
            for d in pieces.iter().flat_map(|p| p.dead_letters) {
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
                    &format!(
                        "INSERT INTO {} (query_id, topic, \"partition\", \"offset\", timestamp_ms, record_key, record_value, headers_json, error, plugin_digest, stage, batch_id, epoch) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
                         ON CONFLICT (query_id, topic, \"partition\", \"offset\") DO UPDATE SET \
                           timestamp_ms = excluded.timestamp_ms, record_key = excluded.record_key, \
                           record_value = excluded.record_value, headers_json = excluded.headers_json, \
                           error = excluded.error, plugin_digest = excluded.plugin_digest, \
                           stage = excluded.stage, batch_id = excluded.batch_id, epoch = excluded.epoch",
                        self.tables.dead_letters
                    ),
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
            let holes_before = applied.holes().len();
            for piece in &missing {
                applied.record(piece.clone()).map_err(|e| SinkError::Sql {
                    during: "updating sluice_progress",
                    site: site(r),
                    error: DbError {
                        message: format!("cannot record the range applied: {e}"),
                        code: "sluice".into(),
                    },
                })?;
            }
            if applied.holes().len() > holes_before
                && let (Some(new), Some(row)) = (applied.holes().last(), &row_read)
                && new.start == row.end
            {
                tracing::warn!(topic = %r.topic, partition = r.partition, "offsets [{}, {}) were never applied to the sink and this range starts past them (a reset forward, retention, or a sink database older than the checkpoint); recorded as a hole in sluice_progress, applied if a reset back reaches them", new.start, new.end);
            }
            let new_end = applied.end().unwrap_or(r.end_offset);
            let (read_end, holes_read) =
                row_read.map_or((-1, String::new()), |row| (row.end, row.holes));
            // Conditional on the row being what was read above (none: no row
            // at all), and never over a newer epoch.
            let changed = b
                .execute(
                    &format!(
                        "INSERT INTO {} AS p (query_id, topic, \"partition\", end_offset, batch_id, epoch, updated_at_ms, holes) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                         ON CONFLICT (query_id, topic, \"partition\") DO UPDATE SET \
                           end_offset = excluded.end_offset, batch_id = excluded.batch_id, \
                           epoch = excluded.epoch, updated_at_ms = excluded.updated_at_ms, \
                           holes = excluded.holes \
                         WHERE p.epoch <= excluded.epoch AND p.end_offset = $9 AND p.holes = $10",
                        self.tables.progress
                    ),
                    &[
                        SqlValue::Text(r.batch.query_id.clone()),
                        SqlValue::Text(r.topic.clone()),
                        SqlValue::Integer(r.partition.into()),
                        SqlValue::Integer(new_end),
                        SqlValue::Integer(r.batch.batch_id as i64),
                        SqlValue::Integer(r.batch.epoch as i64),
                        SqlValue::Integer(crate::util::now_ms()),
                        SqlValue::Text(applied.holes_text()),
                        // -1 matches no row: a row that appeared since the read
                        // fails the update.
                        SqlValue::Integer(read_end),
                        SqlValue::Text(holes_read),
                    ],
                )
                .map_err(sql_err("updating sluice_progress"))?;
            drop(s);
            if changed == 0 {
                // The row changed since it was read: a newer epoch (fenced),
                // or another writer of the same query id.
                let (_, now) = self.read_progress(g.lock().backend(), r)?;
                return Err(SinkError::ProgressChanged {
                    site: site(r),
                    now: now.map_or_else(
                        || "no row".to_string(),
                        |row| {
                            format!(
                                "end_offset {}, holes {}, batch {}",
                                row.end, row.holes, row.batch_id
                            )
                        },
                    ),
                });
            }
            crate::util::failpoint("sink:before-db-commit");
            Ok(Ok(if plugin_said_applied == pieces.len() {
                Applied::AlreadyApplied {
                    skipped: Skipped {
                        offsets: (r.end_offset - r.start_offset).max(0) as u64,
                        ..skipped
                    },
                }
            } else {
                Applied::Written {
                    records: written_records,
                    // Dead letters of the whole range, stored now or by an
                    // earlier run.
                    dead_lettered: batch.dead_letters.len() as u64,
                    skipped,
                }
            }))
        })();
        // Ok(Err(_)): the progress row shows the range applied; nothing to
        // do.
        let mut s = g.lock();
        match result {
            Ok(Err(skipped)) => {
                s.rollback();
                Ok(Applied::AlreadyApplied { skipped })
            }
            Ok(Ok(a)) => {
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
        return Ok(Applied::AlreadyApplied {
            skipped: Skipped {
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
        skipped: Skipped::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::CallContext;

    /// SQLite always; PostgreSQL too when the test suite's server is up
    /// (`SLUICE_TEST_PG_URL`, set by scripts/test.sh), in a new database.
    fn databases(dir: &std::path::Path) -> Vec<String> {
        let mut urls = vec![format!("sqlite:{}", dir.join("sink.db").display())];
        if let Ok(admin) = std::env::var("SLUICE_TEST_PG_URL") {
            let name = format!("sluice_unit_{}", std::process::id());
            let mut b = sql::connect(&admin).unwrap();
            b.batch(&format!("DROP DATABASE IF EXISTS {name}")).unwrap();
            b.batch(&format!("CREATE DATABASE {name}")).unwrap();
            let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap();
            urls.push(format!("{base}/{name}"));
        }
        urls
    }

    fn part(batch: u64, start: i64, end: i64) -> PartitionContext {
        PartitionContext {
            batch: CallContext {
                query_id: "q1".into(),
                batch_id: batch,
                epoch: 1,
            },
            topic: "t".into(),
            partition: 0,
            start_offset: start,
            end_offset: end,
        }
    }

    /// Both databases look up an unqualified table name in the session's
    /// temporary schema first. Should plugin SQL ever get a TEMP
    /// sluice_progress onto the connection (here the test puts it there,
    /// claiming [0, 1000) applied), the host still reads and writes its
    /// own, schema-qualified table.
    #[test]
    fn a_temporary_table_named_like_a_host_table_does_not_fool_the_host() {
        let dir = tempfile::tempdir().unwrap();
        for url in databases(dir.path()) {
            let grant = SqlGrant::connect(&url).unwrap();
            let driver = SinkDriver::new(Some(grant.clone())).unwrap();
            let apply = |batch, start, end| {
                driver.apply(
                    None,
                    &PartitionBatch {
                        range: part(batch, start, end),
                        records: &[],
                        dead_letters: &[],
                    },
                )
            };
            apply(1, 0, 10).unwrap();
            grant
                .lock()
                .backend()
                .batch(
                    "CREATE TEMP TABLE sluice_progress (query_id TEXT, topic TEXT, \"partition\" INTEGER, \
                       end_offset BIGINT, batch_id BIGINT, epoch BIGINT, updated_at_ms BIGINT, holes TEXT, \
                       PRIMARY KEY (query_id, topic, \"partition\")); \
                     INSERT INTO sluice_progress VALUES ('q1', 't', 0, 1000, 1, 1, 0, '[]');",
                )
                .unwrap();
            assert_eq!(
                apply(2, 10, 20).unwrap(),
                Applied::Written {
                    records: 0,
                    dead_lettered: 0,
                    skipped: Skipped::default(),
                },
                "{url}"
            );
            let mut s = grant.lock();
            let b = s.backend();
            b.batch("DROP TABLE sluice_progress").unwrap();
            let rows = b
                .query("SELECT end_offset FROM sluice_progress", &[])
                .unwrap();
            assert_eq!(rows.rows, vec![vec![SqlValue::Integer(20)]], "{url}");
            // On PostgreSQL plugin SQL is checked by its text, so names
            // spelled with Unicode escapes are refused.
            if b.dialect() == sql::Dialect::Postgres {
                drop(s);
                grant.lock().begin().unwrap();
                let e = grant
                    .plugin_execute(
                        "CREATE TEMP TABLE U&\"sluice\\005fprogress\" (p INTEGER)",
                        &[],
                    )
                    .unwrap_err();
                assert!(e.message.contains("Unicode-escaped identifiers"), "{e}");
                grant.lock().rollback();
            }
        }
    }
}
