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
//!   (SQLite and PostgreSQL sessions, the statement guard) and
//!   [`capability::kafka`] (the topics a sink may send to, what a part
//!   sent).
//! - [`plugin`]: wasmtime engine, sandbox limits, component loading, the
//!   WIT host imports, the map chain.
//! - [`checkpoint`]: the [`checkpoint::Checkpoint`] seam (claim with an
//!   owner epoch per partition, write-ahead, commit, plugin store) and its
//!   two stores: a directory ([`checkpoint::DirStore`]: offset log, commit
//!   log, lock, fencing [`checkpoint::Epoch`]) and a pipeline group's
//!   tables in the sink database ([`checkpoint::group::DbStore`]), and a
//!   pipeline's moves between them.
//! - [`sink`]: the sink driver (one transaction per part of a partition's
//!   range, with its progress row), the resets' row moves and the rows a
//!   pipeline takes along between its stores.
//! - [`output`]: output to Kafka (the producer of a pipeline's outputs,
//!   its guarantee).
//! - [`metrics`]: the Prometheus endpoint.
//! - [`control`]: the owner's control socket (status, handover, swap).
//! - [`status_line`]: the one-line progress display.
//! - [`engine`]: the one micro-batch loop, for a single host and a group
//!   member: startup, batch boundary, plan, batch (fetch, map, sink
//!   thread), error policy, commit, progress; what a group member adds
//!   (claims on assign, revokes, group swaps).
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
pub mod output;
pub mod plugin;
pub mod sink;
pub mod source;
pub mod status_line;
pub mod util;

pub use sluice_guest::wire;
