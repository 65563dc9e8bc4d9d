//! Why a run stopped with an error: [`EngineError`], one variant per
//! cause, each naming what, where and what to do.

use crate::capability::sql::DbError;
use crate::checkpoint::CheckpointError;
use crate::plugin::PluginError;
use crate::sink::SinkError;
use crate::source::SourceError;

/// For a printed command holding `***`: say what to do about it.
fn secrets_hint(cmd: &str) -> &'static str {
    if cmd.contains("***") {
        " (with the secrets where *** stands)"
    } else {
        ""
    }
}

/// Why the job stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The checkpoint refused (owned, corrupt, fenced, fingerprint).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Kafka failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A plugin could not be loaded (nothing was processed).
    #[error(transparent)]
    PluginLoad(PluginError),
    /// A plugin failed (after retries). (Not a `source`: the message
    /// already contains it, and an error chain would print it twice.)
    #[error("{0}; batch not committed, it is re-run on the next start")]
    Plugin(PluginError),
    /// Under `--on-error fail`: a map call trapped on a record (the first
    /// that traps alone, found by running the call again in halves).
    #[error(
        "{trap}; batch not committed, it is re-run on the next start. Reproduce it with `host test` and the pipeline's plugins on that record alone (one line of `--format records`); {aside}, and fix the plugin"
    )]
    TrappedOnRecord {
        /// The trap, naming the record's offset.
        trap: Box<crate::plugin::Trapped>,
        /// How to set such records aside: `--on-error dlq` with a sink
        /// database, else `--on-error skip`.
        aside: &'static str,
    },
    /// The Kafka output failed: the producer could not be made, its topic
    /// is missing, or an output was not acknowledged.
    #[error(transparent)]
    Output(#[from] crate::output::OutputError),
    /// The sink failed (after retries).
    #[error("{0}; batch not committed, it is re-run on the next start")]
    Sink(SinkError),
    /// The sink database is unreachable or refused the schema.
    #[error("sink database {url}: {error}")]
    SinkDb {
        /// The `--sink-db` URL, password redacted.
        url: String,
        /// The database's error.
        error: DbError,
    },
    /// The sink database holds another pipeline's progress on our topics.
    #[error(
        "sink database {url} already holds the progress of another pipeline (another checkpoint) on these topics: {others}. If both write the same tables, each record is applied twice. {moving}To go on with that pipeline, run with its checkpoint; to start over on purpose, delete its rows first ({delete}); if both pipelines should apply every record (say, into different tables), pass --allow-shared-sink to each of them"
    )]
    SharedSink {
        /// How to move that pipeline to this store (`host group adopt` or
        /// `host group disband`), when it is ours in another store; empty
        /// otherwise.
        moving: String,
        /// The `--sink-db` URL, password redacted.
        url: String,
        /// The other pipelines: query id, topic, partitions, last update
        /// and owner.
        others: String,
        /// The SQL that deletes their rows.
        delete: String,
    },
    /// A pipeline group's checkpoint failed (the sink database, or the
    /// group runs another pipeline).
    #[error(transparent)]
    Group(#[from] crate::checkpoint::group::GroupError),
    /// A partition Kafka assigned could not be claimed in the group's
    /// checkpoint (the database failed after retries, or its row is
    /// unreadable): the member stops without reading it.
    #[error("could not claim {topic}/{partition} in the group's checkpoint: {why}")]
    Claim {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// The group store's error.
        why: String,
    },
    /// A bad record under `--on-error fail`.
    #[error(
        "bad record at {topic}/{partition} offset {offset}, rejected by plugin {plugin} (sha256:{digest}): {message}; batch {batch} not committed (--on-error fail). Fix the plugin or the data, or restart with --on-error dlq (dead-letter it into the --sink-db database) or --on-error skip"
    )]
    BadRecord {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// Plugin file.
        plugin: String,
        /// Plugin digest.
        digest: String,
        /// The stage's message.
        message: String,
        /// Batch id.
        batch: u64,
    },
    /// Planned offsets were deleted by retention (`--on-data-loss fail`).
    #[error(
        "data loss on {topic}/{partition}: offsets [{from}, {to}) were deleted from the log (retention) before Sluice read them. Restart with --on-data-loss skip to continue at offset {to} (the gap is recorded in the commit entry)"
    )]
    DataLoss {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// First missing offset.
        from: i64,
        /// Log start offset now.
        to: i64,
    },
    /// The checkpoint is ahead of the log.
    #[error(
        "{topic}/{partition}: the checkpoint's position {position} is beyond the partition's high watermark {high}: the topic was deleted and recreated, or truncated. Nothing was read. Sluice will not guess where to resume: reset the checkpoint (and the sink's progress rows) with `{reset}`{}, then start the pipeline again", secrets_hint(.reset)
    )]
    BeyondEnd {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Stored position.
        position: i64,
        /// High watermark now.
        high: i64,
        /// The command that resets checkpoint and sink progress.
        reset: String,
    },
    /// A topic is not the one the checkpoint's offsets belong to.
    #[error(
        "topic `{topic}` was deleted and created again since this checkpoint last read it: {why} (checkpoint: {was}; broker now: {now}). The checkpoint's offsets belong to the old topic, so nothing was read. To process the new topic from its start, reset the checkpoint (and the sink's progress rows) with `{reset}`{}, then start the pipeline again", secrets_hint(.reset)
    )]
    TopicRecreated {
        /// Topic.
        topic: String,
        /// What differs.
        why: String,
        /// The identity on record.
        was: String,
        /// The identity the broker reports.
        now: String,
        /// The command that resets checkpoint and sink progress.
        reset: String,
    },
    /// Inconsistent configuration.
    #[error("{0}")]
    Config(String),
    /// A group member brought other plugins than the group runs, without
    /// `--upgrade` (DESIGN.md, "Plugin authority").
    #[error(
        "group {group} runs [{current}]{by}, and this member was started with [{given}]. Start it without --plugin to run the group's plugins; to make these the group's plugins, either swap every running member at a batch boundary (`host group swap --sink-db URL --group {group} --plugin FILE`) or start this member with --upgrade (a rolling upgrade: members that start later take them, running members keep theirs until they stop)"
    )]
    PluginAuthority {
        /// The group.
        group: String,
        /// The group's current plugins (stage and digest prefix).
        current: String,
        /// What set them, when known (` (set by host group swap N …)`).
        by: String,
        /// The plugins this member was started with.
        given: String,
    },
    /// `--takeover` gave up; the checkpoint was not touched.
    #[error("takeover: {0}")]
    Takeover(String),
    /// A broken invariant inside the host (a bug): the batch is not
    /// committed.
    #[error(
        "internal error: {0}; batch not committed, it is re-run on the next start (please report this)"
    )]
    Internal(String),
    /// The sink thread stopped before the map side handed over every part.
    /// It stops only on a failed part, and that error is what `run`
    /// reports; this one only tells the map side to stop.
    #[error(
        "the sink stopped after a failed part; batch not committed, it is re-run on the next start"
    )]
    SinkStopped,
}

impl From<PluginError> for EngineError {
    fn from(e: PluginError) -> Self {
        EngineError::Plugin(e)
    }
}

impl From<SinkError> for EngineError {
    fn from(e: SinkError) -> Self {
        EngineError::Sink(e)
    }
}

impl EngineError {
    /// True when another process owns the checkpoint.
    pub fn is_owned(&self) -> bool {
        matches!(self, EngineError::Checkpoint(e) if e.is_owned())
    }
}
