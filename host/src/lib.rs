//! The Sluice host: an exactly-once Kafka stream processor whose map and
//! sink stages are sandboxed WebAssembly components.
//!
//! Layout (one module per concern, see `DESIGN.md` at the project root),
//! lowest first; a module imports only modules listed before it:
//! - [`util`]: wall clock, host name, test failpoints.
//! - [`wire`]: the packed batch encoding (re-exported from the guest SDK,
//!   so both sides share one implementation).
//! - [`source`]: the Kafka reader (discovery, watermarks, exact ranges) and
//!   the offset range ([`source::PartitionRange`]).
//! - [`capability`]: what the host grants plugins: [`capability::sql`]
//!   (SQLite and PostgreSQL sessions, the statement guard).
//! - [`plugin`]: wasmtime engine, sandbox limits, component loading, the
//!   WIT host imports, the map chain.
//! - [`checkpoint`]: the [`checkpoint::Checkpoint`] seam and its directory
//!   implementation: write-ahead offset log, commit log, lock, fencing
//!   [`checkpoint::Epoch`], plugin store.
//! - [`sink`]: the sink driver (one transaction per part of a partition's
//!   range, with its progress row) and `checkpoint reset`'s row moves.
//! - [`metrics`]: the Prometheus endpoint.
//! - [`control`]: the owner's control socket (status, handover, swap).
//! - [`status_line`]: the one-line progress display.
//! - [`engine`]: the micro-batch loop: startup, batch boundary, plan,
//!   batch (fetch, map, sink thread), error policy, commit, progress.
//! - [`demo`]: `host demo` (embedded broker and SQLite).
//! - [`cli`]: command-line parsing and the subcommands; `main` owns exit
//!   codes.

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
