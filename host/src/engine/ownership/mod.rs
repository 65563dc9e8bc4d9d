//! Who holds a partition (DESIGN.md, "Ownership: who holds a
//! partition"): a seam of its own beside the checkpoint. The one batch
//! loop asks its [`Ownership`] at fixed points — the batch boundary, when
//! there is nothing to read, when idle, when a batch fails, when a
//! partition is fenced, when the run ends — and never asks which kind of
//! owner it has:
//! - a **sole owner** (`sole`) of a checkpoint directory holds every
//!   partition under the directory's epoch: the planner claims each one
//!   it discovers; the control socket brings swaps and takeovers, served
//!   at the boundary; an uncommitted batch is re-run before anything
//!   else; between batches it sleeps.
//! - a **group member** (`member`) holds what Kafka's group coordinator
//!   assigns it, each partition under its own owner epoch: claims on
//!   assign, drains on revoke, answers the coordinator whenever it waits
//!   (idle or while a batch is applied), and installs the group's swaps
//!   at the boundary.
//!
//! The [`gate::PartitionGate`] is what the batch's threads see of either:
//! which partitions may still be written (a sole owner's never drops one).
//!
//! Opening the store is the owner's too: [`opener`] is the one place that
//! tells the two apart (`--group`), and what it opened starts its owner
//! ([`StartOwner`]) once the rest of the pipeline is assembled.
//!
//! Files: this one is the trait, what an owner may reach ([`LoopState`])
//! and the opening; `gate` the partition gate; `sole` a checkpoint
//! directory's owner (`sole::open` opens the directory); `member` a
//! pipeline group's member (`member::join` opens the group's tables).

pub(super) mod gate;
pub(super) mod member;
pub(super) mod sole;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::capability::sql::SqlGrant;
use crate::checkpoint::{Checkpoint, Fenced, OffsetsEntry};
use crate::control::{Handover, LiveStatus};
use crate::metrics::Metrics;
use crate::output::{KafkaOutput, TransactionScope};
use crate::plugin::Runtime;
use crate::sink::SinkDriver;
use crate::source::KafkaSource;

use super::open::Acquire;
use super::plan::{Discovery, Holdings, Planner};
use super::progress::Progress;
use super::stages::Stages;
use super::{EngineError, PipelineConfig};
use gate::PartitionGate;

/// What opening the store gave: the store, the plugins to run, the sink,
/// and how its owner starts.
pub(super) struct Opened {
    pub(super) cp: Arc<dyn Checkpoint>,
    pub(super) stages: Stages,
    pub(super) driver: Arc<SinkDriver>,
    /// What one output transaction covers under exactly once (a batch of
    /// a checkpoint directory, a part of an input partition in a group).
    pub(super) scope: TransactionScope,
    pub(super) start: Box<dyn StartOwner>,
}

/// How the pipeline's store is opened: by a group member with `--group`,
/// else by the sole owner of the checkpoint directory. [`opener`] is the
/// one place that tells the two apart.
pub(super) trait Open {
    /// Refuse what this owner cannot honour in `cfg`, before anything is
    /// contacted.
    ///
    /// # Errors
    /// [`EngineError::Config`] saying what and why.
    fn refuse_unfit(&self, cfg: &PipelineConfig) -> Result<(), EngineError>;

    /// Open the store (acquired as `acquire` says, for a directory).
    ///
    /// # Errors
    /// The opening's: see `sole::open` and `member::join`.
    fn open(
        self: Box<Self>,
        cfg: &PipelineConfig,
        runtime: &Arc<Runtime>,
        acquire: Acquire,
        holdings: &Arc<Holdings>,
    ) -> Result<Opened, EngineError>;
}

/// The opener of `cfg`'s store (see [`Open`]).
pub(super) fn opener(cfg: &PipelineConfig) -> Box<dyn Open> {
    match &cfg.group {
        Some(group) => Box::new(member::Join(group.clone())),
        None => Box::new(sole::OpenDir),
    }
}

/// What an owner's start may use: the pipeline assembled so far.
pub(super) struct Starting<'a> {
    pub(super) cfg: &'a PipelineConfig,
    pub(super) cp: &'a Arc<dyn Checkpoint>,
    pub(super) stages: &'a Stages,
    pub(super) runtime: &'a Arc<Runtime>,
    pub(super) status: &'a Arc<Mutex<LiveStatus>>,
    pub(super) output: Option<&'a Arc<KafkaOutput>>,
}

/// A started owner with its Kafka reader and metrics.
pub(super) struct Started {
    pub(super) owner: Box<dyn Ownership>,
    pub(super) source: KafkaSource,
    pub(super) metrics: Metrics,
}

/// How the owner of an opened store starts: its reader (assigned
/// partitions for a sole owner, a consumer group's member otherwise),
/// its metrics, and its own parts (the control socket; the group's
/// swaps).
pub(super) trait StartOwner {
    /// Start.
    ///
    /// # Errors
    /// [`EngineError::Source`] for the reader, [`EngineError::Config`] for
    /// the control socket, the group's store for its swaps.
    fn start(self: Box<Self>, s: Starting<'_>) -> Result<Started, EngineError>;
}

/// What the loop does after the batch boundary.
pub(super) enum Next {
    /// Plan the next batch.
    Plan,
    /// Stop: the last batch is committed and a stop was asked for.
    Stop,
    /// Give the checkpoint to the process that asked for it (`--takeover`):
    /// the control socket is unlinked and the note written; the run ends
    /// and [`Ownership::leave`] releases the checkpoint.
    HandOver(Handover),
}

/// What an owner may reach at the loop's fixed points: the pipeline's
/// parts other than the owner itself.
pub(super) struct LoopState<'a> {
    pub(super) cfg: &'a PipelineConfig,
    pub(super) cp: &'a Arc<dyn Checkpoint>,
    pub(super) holdings: &'a Holdings,
    pub(super) planner: &'a mut Planner,
    pub(super) source: &'a mut KafkaSource,
    pub(super) stages: &'a mut Stages,
    pub(super) grants: &'a [SqlGrant],
    pub(super) metrics: &'a Metrics,
    pub(super) status: &'a Mutex<LiveStatus>,
    /// When this run last committed, ms since the Unix epoch.
    pub(super) last_commit_ms: Option<i64>,
}

/// Who holds which partitions and how that changes (see the module doc).
pub(super) trait Ownership: Discovery {
    /// At the batch boundary (after a commit, before the next plan): act
    /// on what changed since the last one (control requests, swaps,
    /// assignment changes) and on `stop`.
    ///
    /// # Errors
    /// [`EngineError::Claim`] for a group member's claim that failed in
    /// the rebalance callback.
    fn at_boundary(&mut self, at: &mut LoopState<'_>, stop: bool) -> Result<Next, EngineError>;

    /// The plan found nothing to read.
    ///
    /// # Errors
    /// A group member that the coordinator never let join.
    fn nothing_to_read(
        &mut self,
        source: &mut KafkaSource,
        cfg: &PipelineConfig,
    ) -> Result<(), EngineError>;

    /// Whether what this process holds is settled (with `--until-caught-up`
    /// the run ends once it also read up to its targets).
    ///
    /// # Errors
    /// As [`Ownership::nothing_to_read`].
    fn settled(&self, source: &KafkaSource, cfg: &PipelineConfig) -> Result<bool, EngineError>;

    /// Wait up to `d` for the next batch, waking early on `stop` or on a
    /// request; a group member answers the coordinator meanwhile.
    fn idle(&mut self, source: &mut KafkaSource, stop: &AtomicBool, d: Duration);

    /// The partition gate the batch's threads consult.
    fn gate(&self) -> &PartitionGate;

    /// Whether the plan knows what this process holds: a sole owner
    /// always; a group member once its first assignment came (a member
    /// that held nothing then begins with nothing).
    fn knows_holdings(&self, source: &KafkaSource) -> bool;

    /// After the first plan of this run, before its write-ahead: with
    /// `--takeover`, tell the old owner and return the gap (ms from its
    /// last commit).
    fn took_over(&mut self, cp: &dyn Checkpoint) -> Option<i64>;

    /// A write of `f`'s partition was refused: another owner holds it.
    /// Returns whether the partition was dropped (or claimed again) and
    /// the loop plans again; false when this owner cannot lose a
    /// partition that way.
    fn fenced(&self, f: &Fenced) -> bool;

    /// The batch of `entry` failed with `e`. `Ok` when the failure was a
    /// rebalance taking a partition being read (the loop plans again),
    /// else `e` back.
    ///
    /// # Errors
    /// `e`, or a claim that failed meanwhile.
    fn batch_failed(
        &self,
        at: &mut LoopState<'_>,
        entry: &OffsetsEntry,
        e: EngineError,
    ) -> Result<(), EngineError>;

    /// The progress event of a committed batch, as this owner reports it.
    fn label(&self, event: Progress) -> Progress;

    /// The run ends (`ok`: without an error; `handover`: to a
    /// `--takeover`): leave the group, or release the checkpoint.
    fn leave(
        self: Box<Self>,
        ok: bool,
        handover: Option<Handover>,
        cp: Arc<dyn Checkpoint>,
        source: &mut KafkaSource,
        holdings: &Holdings,
    );
}
