//! The error policy (DESIGN.md, "Error policy"), decided here for every
//! site that meets a bad record or lost data:
//! - [`on_bad_record`]: a record a map stage or the sink stage rejected
//!   gets `--on-error`: `fail` stops the batch (it is not committed),
//!   `skip` counts it and goes on, `dlq` counts it and returns its dead
//!   letter, which the sink writes in the same transaction as the part.
//! - [`on_data_loss`]: offsets deleted (by retention) before they were
//!   read get `--on-data-loss`: `fail` stops, `skip` returns the gap,
//!   which the commit entry and the progress event record.
//! - [`with_retries`]: a retryable failure (a stage's `retryable` error, a
//!   trap, a transient database error) is tried again, `--attempts` times
//!   in all, 200 ms, 800 ms, … apart.

use std::time::Duration;

use crate::checkpoint::{Counts, DataLossGap};
use crate::sink::DeadLetter;
use crate::source::SourceRecord;

use super::{DataLossPolicy, EngineError, ErrorPolicy};

/// A record a stage rejected, and where.
pub(super) struct Rejection<'a> {
    pub(super) topic: &'a str,
    pub(super) partition: i32,
    /// The source record (its offset, and the bytes a dead letter keeps).
    pub(super) record: &'a SourceRecord,
    pub(super) batch: u64,
    /// The rejecting plugin's file, for messages.
    pub(super) plugin: &'a str,
    /// The rejecting plugin's SHA-256, hex.
    pub(super) digest: &'a str,
    /// Position of the rejecting stage (0-based; the sink comes after the
    /// map stages).
    pub(super) stage: usize,
    /// The stage's message.
    pub(super) message: String,
    /// Rejected by the sink stage (for the log line).
    pub(super) by_sink: bool,
}

/// Apply `policy` to one rejected record, counting it in `counts`
/// (`bad_records`, and `skipped` under `skip`; dead letters are counted
/// when the sink writes them). Returns its dead letter under `dlq`.
///
/// # Errors
/// [`EngineError::BadRecord`] under `fail`, naming the record, the plugin
/// and what to do.
pub(super) fn on_bad_record(
    policy: ErrorPolicy,
    r: Rejection<'_>,
    counts: &mut Counts,
) -> Result<Option<DeadLetter>, EngineError> {
    counts.bad_records += 1;
    let offset = r.record.offset;
    let what = if r.by_sink {
        "a record the sink rejected"
    } else {
        "bad record"
    };
    match policy {
        ErrorPolicy::Fail => Err(EngineError::BadRecord {
            topic: r.topic.to_string(),
            partition: r.partition,
            offset,
            plugin: r.plugin.to_string(),
            digest: r.digest.to_string(),
            message: r.message,
            batch: r.batch,
        }),
        ErrorPolicy::Skip => {
            counts.skipped += 1;
            tracing::warn!(topic = %r.topic, partition = r.partition, offset, plugin = %r.digest, "skipping {what}: {}", r.message);
            Ok(None)
        }
        ErrorPolicy::Dlq => {
            tracing::warn!(topic = %r.topic, partition = r.partition, offset, plugin = %r.digest, "dead-lettering {what}: {}", r.message);
            Ok(Some(DeadLetter {
                topic: r.topic.to_string(),
                partition: r.partition,
                offset,
                timestamp_ms: r.record.timestamp,
                key: r.record.key.clone(),
                value: r.record.value.clone(),
                headers: r.record.headers.clone(),
                error: r.message,
                plugin_digest: r.digest.to_string(),
                stage: r.stage,
            }))
        }
    }
}

/// Apply `policy` to offsets `[from, to)` of `topic`/`partition`, deleted
/// before they were read; `when` says where this was found, for the log
/// (`planning` or `re-run batch`). Returns the gap to record under `skip`.
///
/// # Errors
/// [`EngineError::DataLoss`] under `fail`.
pub(super) fn on_data_loss(
    policy: DataLossPolicy,
    topic: &str,
    partition: i32,
    (from, to): (i64, i64),
    when: &str,
) -> Result<DataLossGap, EngineError> {
    match policy {
        DataLossPolicy::Fail => Err(EngineError::DataLoss {
            topic: topic.to_string(),
            partition,
            from,
            to,
        }),
        DataLossPolicy::Skip => {
            tracing::warn!(
                topic,
                partition,
                "data loss ({when}): offsets [{from}, {to}) were deleted before they were read; skipping them (--on-data-loss skip)"
            );
            Ok(DataLossGap {
                topic: topic.to_string(),
                partition,
                from,
                to,
            })
        }
    }
}

/// Run `f`, again while it fails with an error `retryable` accepts, at
/// most `attempts` times in all; `what` names it in the log.
pub(super) fn with_retries<T, E: std::fmt::Display>(
    attempts: u32,
    what: &str,
    retryable: impl Fn(&E) -> bool,
    mut f: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let mut delay = Duration::from_millis(200);
    let mut attempt = 1;
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if attempt < attempts && retryable(&e) => {
                tracing::warn!(
                    "{what} failed (attempt {attempt} of {attempts}), retrying in {} ms: {e}",
                    delay.as_millis()
                );
                std::thread::sleep(delay);
                delay *= 4;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}
