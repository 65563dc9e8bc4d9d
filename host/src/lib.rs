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
//! - [`output`]: the Kafka output stage ([`output::KafkaOutput`]: its
//!   guarantee, its transaction mode, the verbs the engine calls).
//! - [`metrics`]: the Prometheus endpoint.
//! - [`control`]: the owner's control socket (status, handover, swap).
//! - [`status_line`]: the one-line progress display.
//! - [`engine`]: the one micro-batch loop, for a single host and a group
//!   member: startup, plan, batch (fetch, map, sink thread), error policy,
//!   commit, progress; and, behind the ownership seam, who holds which
//!   partitions (a sole owner of a checkpoint directory, a group member).
//! - [`demo`]: `host demo` (embedded broker and SQLite).
//! - [`cli`]: command-line parsing and the subcommands; `main` owns exit
//!   codes.
//!
//! Names (one concept, one name):
//! - **pipeline id**: a pipeline's identity, the key its progress rows and
//!   transactional ids are made from: a checkpoint directory's UUID, or a
//!   pipeline group's name. Spark calls it a query id, and `query_id` is
//!   its field name wherever it is part of a format (the WIT call context,
//!   the progress event, the `sluice_progress` table), so it stays so in
//!   the code.
//! - **batch** (one id N, one write-ahead entry and one commit entry),
//!   **range** (one partition's `[start, end)` in a batch), **piece** (at
//!   most 2,000 records of a range, read and mapped together) and **part**
//!   (a piece's records applied by the sink in one transaction with its
//!   progress row; under exactly once in a group, also one Kafka
//!   transaction). "Part" means nothing else.
//! - **owner**: who holds a partition: the **sole owner** of a checkpoint
//!   directory, or a **group member**. **epoch**: a directory's fencing
//!   epoch; **owner epoch**: a partition's fencing token (a directory's
//!   epoch for all of them, a group's per partition row).
//! - **pipeline group** (`--group NAME`): the members that run one
//!   pipeline, with its checkpoint in the sink database. **consumer
//!   group**: Kafka's — the one a pipeline group's members join (named as
//!   the pipeline group), or a single host's informational commits
//!   (`sluice-<pipeline id>`, or `--commit-offsets-to`). **positions
//!   group**: under exactly once to a topic, the consumer group
//!   `sluice-<pipeline id>` on the output cluster whose offsets the output
//!   transactions commit (KIP-447).

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
