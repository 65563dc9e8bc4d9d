//! The Sluice host: an exactly-once Kafka stream processor whose map and
//! sink stages are sandboxed WebAssembly components.
//!
//! Layout (one module per concern, see `DESIGN.md` at the project root):
//! - [`plugin`]: wasmtime engine, sandbox limits, component loading, the
//!   map chain.
//! - [`checkpoint`]: write-ahead offset log, commit log, metadata, lock and
//!   fencing epoch.
//! - [`sink`]: the sink driver and the capabilities granted to sink plugins
//!   (SQL: SQLite and PostgreSQL, one transaction per part of a
//!   partition's range).
//! - [`source`]: the Kafka reader (discovery, watermarks, exact ranges).
//! - [`engine`]: the micro-batch loop.
//! - [`control`]: the owner's control socket (status, handover, swap).
//! - [`demo`]: `host demo` (embedded broker and SQLite).
//! - [`metrics`]: the Prometheus endpoint.
//! - [`cli`]: command-line parsing and the subcommands; `main` owns exit
//!   codes.
//! - [`wire`]: the packed batch encoding (re-exported from the guest SDK,
//!   so both sides share one implementation).

pub mod capability;
pub mod checkpoint;
pub mod cli;
pub mod control;
pub mod demo;
pub mod engine;
pub mod metrics;
pub mod plugin;
pub mod sink;
pub mod source;
pub mod status_line;
pub mod util;

pub use sluice_guest::wire;
