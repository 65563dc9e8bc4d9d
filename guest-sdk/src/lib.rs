//! Write Sluice plugins in plain Rust.
//!
//! A plugin is a WebAssembly component that exports a map stage, a sink
//! stage or both (the contract is `wit/plugin.wit`, package
//! `sluice:plugin@0.2.4`). With this SDK an author implements [`Mapper`]
//! and/or [`Sink`] on an ordinary type and adds one [`export!`] line; the
//! SDK generates the bindings, decodes the packed batches, and turns
//! [`Error`]s into the contract's `stage-error`. [`Config::parse`] reads
//! `--config` into a settings struct, [`json`] reads and writes borrowed
//! serde structs keeping values' exact text, [`sql::identifier`] checks a
//! table name, and [`Sink::init`] prepares the destination once per
//! instance.
//!
//! ```
//! // `keep`: keeps the JSON events of one table and re-emits their `data`.
//!
//! use serde::{Deserialize, Serialize};
//! use sluice_guest::json::{self, RawValue};
//! use sluice_guest::{Config, Emit, Error, Mapper, Record};
//!
//! /// `--config table=NAME` (default `orders`).
//! #[derive(Deserialize)]
//! struct Settings {
//!     #[serde(default = "default_table")]
//!     table: String,
//! }
//!
//! fn default_table() -> String {
//!     "orders".into()
//! }
//!
//! /// The input fields we read (serde ignores the rest).
//! #[derive(Deserialize)]
//! struct Event<'a> {
//!     table: String,
//!     #[serde(borrow)]
//!     data: &'a RawValue,
//! }
//!
//! /// The output value: `data` is written back byte for byte.
//! #[derive(Serialize)]
//! struct Row<'a> {
//!     table: &'a str,
//!     data: &'a RawValue,
//! }
//!
//! /// The map stage.
//! pub struct Keep {
//!     settings: Settings,
//!     out: Vec<u8>,
//! }
//!
//! impl Mapper for Keep {
//!     fn new(config: &Config) -> Result<Self, Error> {
//!         Ok(Keep { settings: config.parse()?, out: Vec::new() })
//!     }
//!
//!     fn map(&mut self, record: &Record<'_>, out: &mut Emit<'_>) -> Result<(), Error> {
//!         let value = record.value.ok_or_else(|| Error::bad_record("tombstone"))?;
//!         let event: Event<'_> = json::from_slice(value)?; // not JSON: a bad record
//!         if event.table != self.settings.table {
//!             return Ok(()); // no output: counted as filtered
//!         }
//!         self.out.clear();
//!         json::write(&mut self.out, &Row { table: &event.table, data: event.data });
//!         out.emit(record.key, Some(&self.out));
//!         Ok(())
//!     }
//! }
//!
//! // In the plugin crate (built for wasm32-wasip2):
//! // sluice_guest::export!(map: Keep);
//!
//! // The same logic runs natively in unit tests:
//! let m = sluice_guest::testing::map_values::<Keep>(
//!     &Config::default(),
//!     &[br#"{"table":"orders","data":{"price":999999999999.999998}}"#, br#"{"table":"users","data":{}}"#],
//! ).unwrap();
//! assert_eq!(m.outputs.len(), 1);
//! assert_eq!(
//!     m.outputs[0].value.as_deref(),
//!     Some(&br#"{"table":"orders","data":{"price":999999999999.999998}}"#[..])
//! );
//! ```
//!
//! Layout: [`wire`] is the packed batch encoding (shared with the host),
//! [`json`] reads JSON without number round-trips, [`log`] and [`Config`]
//! reach the host imports, [`sql`] is the host's SQL capability for sinks,
//! [`kafka`] produces records to Kafka topics from a sink, [`testing`]
//! runs stages natively.

pub mod json;
pub mod kafka;
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
pub const CONTRACT_VERSION: &str = "0.2.4";

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

    /// The pairs as a typed settings struct: each field is read from the
    /// key of its name (lower case), numbers and booleans are parsed from
    /// the text, `Option` fields may be absent, `Vec` fields are
    /// comma-separated, and `#[serde(default = …)]` gives defaults. Keys
    /// the struct does not name are ignored (map and sink stages share the
    /// pipeline's `--config`). Uses the `envy` crate's deserializer.
    ///
    /// ```
    /// #[derive(serde::Deserialize)]
    /// struct Settings {
    ///     #[serde(default = "default_table")]
    ///     table: String,
    ///     batch_rows: Option<u32>,
    /// }
    /// fn default_table() -> String {
    ///     "company".into()
    /// }
    /// let s: Settings = sluice_guest::Config::from_pairs([("batch_rows", "500")]).parse().unwrap();
    /// assert_eq!((s.table.as_str(), s.batch_rows), ("company", Some(500)));
    /// ```
    ///
    /// # Errors
    /// [`Error::Fatal`] naming the key that is missing or does not parse,
    /// so the stage's `new` can return it as it is.
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        envy::from_iter(self.pairs.clone())
            .map_err(|e| Error::fatal(format!("configuration (--config key=value): {e}")))
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

impl From<serde_json::Error> for Error {
    /// A record that is not JSON (`not JSON: …`) or whose JSON does not
    /// fit the expected shape (`unexpected JSON: …`) is a bad record.
    fn from(e: serde_json::Error) -> Self {
        if e.is_data() {
            Error::BadRecord(format!("unexpected JSON: {e}"))
        } else {
            Error::BadRecord(format!("not JSON: {e}"))
        }
    }
}

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
    /// Build the stage from its configuration. An error here stops the
    /// batch (a [`Error::Retryable`] one is tried again) and names the
    /// plugin.
    fn new(config: &Config) -> Result<Self, Error>;

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
/// idempotency key. docs/plugins.md's example, compiled here:
///
/// ```
/// use sluice_guest::sql::{self, Value};
/// use sluice_guest::{Config, Error, Sink, SinkRecord};
///
/// pub struct Seen { insert: String, create: String }
///
/// impl Sink for Seen {
///     fn new(_config: &Config) -> Result<Self, Error> {
///         let table = sql::identifier("table", "seen")?;
///         Ok(Seen {
///             create: format!("CREATE TABLE IF NOT EXISTS {table} (k TEXT PRIMARY KEY)"),
///             insert: format!("INSERT INTO {table} (k) VALUES ($1) ON CONFLICT (k) DO NOTHING"),
///         })
///     }
///     fn init(&mut self) -> Result<(), Error> {
///         sql::execute(&self.create, &[])?;
///         Ok(())
///     }
///     fn write(&mut self, r: &SinkRecord<'_>) -> Result<(), Error> {
///         sql::execute(&self.insert, &[Value::from(r.idempotency_key)])?;
///         Ok(())
///     }
/// }
/// // In the plugin crate: sluice_guest::export!(sink: Seen);
/// ```
pub trait Sink: Sized + 'static {
    /// Build the stage from its configuration (as [`Mapper::new`]).
    fn new(config: &Config) -> Result<Self, Error>;

    /// Prepare the destination, once per instance, before its first
    /// `open` and inside that range's transaction: create tables
    /// (`CREATE TABLE IF NOT EXISTS …`), prepare lookups. The host starts
    /// a fresh instance after any failed range, so a rolled-back `init`
    /// runs again. The default does nothing.
    fn init(&mut self) -> Result<(), Error> {
        Ok(())
    }

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

    /// Apply a chunk of records in offset order: what one host `write`
    /// call carries. The default calls [`Sink::write`] for each record.
    /// Override it to apply the chunk in few statements
    /// ([`sql::execute_batch`]). On error return the index in `records`
    /// of the record the error concerns, so that an [`Error::BadRecord`]
    /// rejects the right source record.
    ///
    /// # Errors
    /// `(index, error)`, as [`Sink::write`]'s error for that record.
    fn write_chunk(&mut self, records: &[SinkRecord<'_>]) -> Result<(), (usize, Error)> {
        for (i, r) in records.iter().enumerate() {
            self.write(r).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Finish the range (or part). The default does nothing.
    fn close(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

/// Glue used by the code [`export!`] generates. Not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::host::{HostApi, LogLevel, set_host};
    pub use crate::run::{Initialised, Slot, map_packed, sink_close, sink_open, sink_write_packed};
    #[cfg(feature = "bindings")]
    pub use wit_bindgen;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Settings {
        rows: u32,
        #[serde(default)]
        strict: bool,
    }

    #[test]
    fn config_parse_names_the_key_that_is_missing_or_malformed() {
        let s: Settings = Config::from_pairs([("rows", "5"), ("strict", "true"), ("other", "x")])
            .parse()
            .unwrap();
        assert_eq!((s.rows, s.strict), (5, true));
        let missing = Config::default().parse::<Settings>().unwrap_err();
        assert!(
            matches!(&missing, Error::Fatal(m) if m.contains("rows")),
            "{missing}"
        );
        let bad = Config::from_pairs([("rows", "many")])
            .parse::<Settings>()
            .unwrap_err();
        assert!(
            matches!(&bad, Error::Fatal(m) if m.contains("many")),
            "{bad}"
        );
    }

    #[test]
    fn sql_identifiers_are_plain_names_only() {
        assert_eq!(sql::identifier("t", "companies_2").unwrap(), "companies_2");
        for bad in ["", "2x", "a-b", "a b", "t; DROP TABLE x", &"x".repeat(64)] {
            assert!(sql::identifier("t", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn json_errors_are_bad_records() {
        let syntax = json::from_slice::<Vec<u8>>(b"[1,").unwrap_err();
        assert!(matches!(Error::from(syntax), Error::BadRecord(m) if m.starts_with("not JSON")));
        let data = json::from_slice::<Vec<u8>>(b"{}").unwrap_err();
        assert!(
            matches!(Error::from(data), Error::BadRecord(m) if m.starts_with("unexpected JSON"))
        );
    }
}
