//! The host's `kafka` capability for sink stages (`wit/plugin.wit`,
//! interface `kafka`, contract 0.2.4): produce records to the topics the
//! pipeline names with `--output-topic`.
//!
//! ```
//! use sluice_guest::kafka::OutputRecord;
//! use sluice_guest::SinkRecord;
//!
//! /// Route a change to the topic of its table, keyed as it came.
//! fn route(r: &SinkRecord<'_>, table: &str) -> OutputRecord {
//!     OutputRecord::new(format!("cdc.{table}"), r.idempotency_key)
//!         .key(r.record.key)
//!         .value(r.record.value)
//! }
//! // In `Sink::write`: sluice_guest::kafka::send(vec![route(r, "orders")])?;
//! ```
//!
//! The host keeps what a range sent until the range's `close` succeeds,
//! then produces it in the order sent: exactly once in the batch's Kafka
//! transaction (no `--sink-db`), or at-least-once, acknowledged before the
//! range is recorded applied, each record carrying its idempotency key in
//! the header `sluice-idempotency-key`. A range written again drops what
//! its failed attempt sent.

pub(crate) mod record;

pub use record::OutputRecord;

use crate::host::host;

/// Queue `records` for production when the range closes. Call it from
/// [`crate::Sink::open`], `write` or `close`.
///
/// # Errors
/// The host's reason when it refuses the call: no `--output-topic`, a topic
/// the pipeline does not name, a partition the topic lacks, or more than
/// 64 MiB in one range. The range then fails even if the error is ignored.
pub fn send(records: Vec<OutputRecord>) -> Result<(), crate::Error> {
    host().kafka_send(records).map_err(crate::Error::fatal)
}
