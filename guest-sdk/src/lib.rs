//! Write Sluice plugins in plain Rust.
//!
//! A plugin is a WebAssembly component that exports a map stage, a sink
//! stage or both (the contract is `wit/plugin.wit`, package
//! `sluice:plugin@0.2.0`). With this SDK an author implements [`Mapper`]
//! and/or [`Sink`] on an ordinary type and adds one [`export!`] line; the
//! SDK generates the bindings, decodes the packed batches, and turns
//! [`Error`]s into the contract's `stage-error`.
//!
//! ```
//! use sluice_guest::{Config, Emit, Error, Mapper, Record};
//!
//! /// Upper-cases every value.
//! pub struct Shout;
//!
//! impl Mapper for Shout {
//!     fn new(_config: &Config) -> Result<Self, String> {
//!         Ok(Shout)
//!     }
//!     fn map(&mut self, record: &Record<'_>, out: &mut Emit<'_>) -> Result<(), Error> {
//!         let value = record.value.ok_or_else(|| Error::bad_record("tombstone"))?;
//!         out.emit(record.key, Some(&value.to_ascii_uppercase()));
//!         Ok(())
//!     }
//! }
//!
//! // In the plugin crate (built for wasm32-wasip2):
//! // sluice_guest::export!(map: Shout);
//!
//! // The same logic runs natively in unit tests:
//! let outputs = sluice_guest::testing::map_values::<Shout>(&Config::default(), &[b"hi"]).unwrap();
//! assert_eq!(outputs.outputs[0].value.as_deref(), Some(&b"HI"[..]));
//! ```
//!
//! Layout: [`wire`] is the packed batch encoding (shared with the host),
//! [`json`] reads JSON without number round-trips, [`log`] and [`Config`]
//! reach the host imports, [`sql`] is the host's SQL capability for sinks,
//! [`testing`] runs stages natively.

pub mod json;
pub mod log;
pub mod sql;
pub mod testing;
pub mod wire;

mod host;
mod run;

use std::collections::BTreeMap;
use std::fmt;

pub use run::{MapOutcome, StageError};
pub use wire::{Header, Record, SinkRecord, TimestampType};

#[cfg(feature = "bindings")]
pub use sluice_guest_macro::export;

/// The contract version this SDK implements (`sluice:plugin@<this>`).
pub const CONTRACT_VERSION: &str = "0.2.0";

/// The pipeline's `--config k=v` pairs, as the plugin sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    pairs: BTreeMap<String, String>,
}

impl Config {
    /// Build a config from pairs (for native tests).
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Config {
            pairs: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    /// The value of `key`, if configured.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.get(key).map(String::as_str)
    }

    /// The value of `key`, or `default`.
    pub fn get_or<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.get(key).unwrap_or(default)
    }

    /// Every pair, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// Why a stage could not process a record (or the batch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// This record is bad (malformed, unsupported); it goes to the
    /// pipeline's error policy and the rest of the batch goes on.
    BadRecord(String),
    /// A transient failure; the host retries the whole call.
    Retryable(String),
    /// The stage cannot go on; the batch stops before committing.
    Fatal(String),
}

impl Error {
    /// A [`Error::BadRecord`] with this message.
    pub fn bad_record(msg: impl fmt::Display) -> Self {
        Error::BadRecord(msg.to_string())
    }

    /// A [`Error::Retryable`] with this message.
    pub fn retryable(msg: impl fmt::Display) -> Self {
        Error::Retryable(msg.to_string())
    }

    /// A [`Error::Fatal`] with this message.
    pub fn fatal(msg: impl fmt::Display) -> Self {
        Error::Fatal(msg.to_string())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadRecord(m) => write!(f, "bad record: {m}"),
            Error::Retryable(m) => write!(f, "retryable: {m}"),
            Error::Fatal(m) => write!(f, "fatal: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// Collects the outputs of one input record.
///
/// Outputs keep their order; the first gets the input's idempotency key
/// `{topic}/{partition}/{offset}`, the n-th further one `…#{n}`.
pub struct Emit<'e> {
    enc: &'e mut wire::Encoder,
    index: u32,
    emitted: u32,
}

impl Emit<'_> {
    /// Emit one output with no headers. `None` key = null key, `None`
    /// value = tombstone.
    pub fn emit(&mut self, key: Option<&[u8]>, value: Option<&[u8]>) {
        self.emit_with_headers(key, value, &[]);
    }

    /// Emit one output with headers.
    pub fn emit_with_headers(
        &mut self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header<'_>],
    ) {
        self.enc.push_output(self.index, key, value, headers);
        self.emitted += 1;
    }

    /// Emit the input record unchanged (key, value and headers).
    pub fn forward(&mut self, record: &Record<'_>) {
        self.emit_with_headers(record.key, record.value, &record.headers);
    }

    /// How many outputs this input has produced so far.
    pub fn emitted(&self) -> u32 {
        self.emitted
    }
}

/// A map stage. One value of the type lives in each plugin instance; the
/// host may replace the instance at any time (after a trap or a swap), so
/// state kept in it must be a cache, never a source of truth.
pub trait Mapper: Sized + 'static {
    /// Build the stage from its configuration. An error here is fatal for
    /// the batch and names the plugin.
    fn new(config: &Config) -> Result<Self, String>;

    /// Map one record into zero or more outputs. Returning
    /// [`Error::BadRecord`] drops whatever this record emitted so far.
    fn map(&mut self, record: &Record<'_>, out: &mut Emit<'_>) -> Result<(), Error>;
}

/// Facts about the partition range a sink is about to write: a batch's
/// share of one partition, or a consecutive part of it (the host sinks a
/// range in parts as it reads it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionContext {
    /// The checkpoint's query id (UUID).
    pub query_id: String,
    /// Batch id N.
    pub batch_id: u64,
    /// Fencing epoch of the running host; reject writes from older epochs
    /// if the sink stores it.
    pub epoch: u64,
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// First offset of the range (inclusive).
    pub start_offset: i64,
    /// End of the range (exclusive).
    pub end_offset: i64,
}

/// A sink's answer to [`Sink::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenAnswer {
    /// Write the range.
    Proceed,
    /// Every offset of the range is already applied; skip it.
    AlreadyApplied,
}

/// A sink stage: applies records to an external system, once per
/// idempotency key.
pub trait Sink: Sized + 'static {
    /// Build the stage from its configuration.
    fn new(config: &Config) -> Result<Self, String>;

    /// Begin one partition's range of a batch, or a consecutive part of it
    /// (one batch may open a partition several times; part bounds are not
    /// stable across runs). Answer [`OpenAnswer::AlreadyApplied`] only when
    /// every offset of `[start_offset, end_offset)` is applied. The default
    /// proceeds.
    fn open(&mut self, ctx: &PartitionContext) -> Result<OpenAnswer, Error> {
        let _ = ctx;
        Ok(OpenAnswer::Proceed)
    }

    /// Apply one record. Use `record.idempotency_key` to make the effect
    /// happen once even when the range is written again after a crash.
    /// [`Error::BadRecord`] rejects this record (also after an SQL error it
    /// met): the host applies the pipeline's error policy to its source
    /// record (`fail` stops; `dlq` dead-letters it; `skip` counts it) and
    /// writes the range again without it, from `open` on, on a fresh
    /// instance. With the `sql` capability the failed attempt is rolled
    /// back; without it the records before this one are written again.
    fn write(&mut self, record: &SinkRecord<'_>) -> Result<(), Error>;

    /// Finish the range (or part). The default does nothing.
    fn close(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

/// Glue used by the code [`export!`] generates. Not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::host::{HostApi, LogLevel, set_host};
    pub use crate::run::{Slot, map_packed, sink_close, sink_open, sink_write_packed};
    #[cfg(feature = "bindings")]
    pub use wit_bindgen;
}
