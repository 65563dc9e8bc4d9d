//! What a pipeline group's member adds to the one batch loop (DESIGN.md,
//! "Scale beyond one machine: pipeline groups"): the answers to the group
//! coordinator, and the group's swaps.
//!
//! Kafka's coordinator assigns the partitions; each is claimed in the
//! sink database when it is assigned ([`Member::assigned`], through the
//! checkpoint seam: the owner epoch goes up, the previous owner is
//! fenced) and held in the loop's [`Holdings`] from then on. A revoke
//! drains the part in flight, then releases the partitions (`revoke`). A
//! partition the database fences (another member claimed it) is dropped;
//! one taken by `host group reset`, or whose row is gone, is claimed
//! again.
//!
//! Files: this one holds [`Member`] (the answers to the coordinator) and
//! [`GroupMember`] (the member as the loop's [`Ownership`]); `join` opens
//! the group's store and settles its plugins, `output` what a claim does
//! under exactly once to a topic, `swap` the group's swaps at the batch
//! boundary. What a batch does when a rebalance takes some of its
//! partitions is the partition gate's (`super::gate`).

mod join;
mod output;
pub(in crate::engine) mod swap;

pub(in crate::engine) use join::Join;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, Ordering};

use crate::checkpoint::group::RESET_OWNER;
use crate::checkpoint::{Checkpoint, CheckpointError, Claimed, Fenced, OffsetsEntry, Start};
use crate::control::Handover;
use crate::metrics::Metrics;
use crate::output::KafkaOutput;
use crate::source::{
    AssignmentChanges, KafkaSource, Membership, START_EARLIEST, START_LATEST, TopicPartition,
};

use super::gate::{DRAIN_WAIT, PartitionGate};
use super::{LoopState, Next, Ownership, StartOwner, Started, Starting};
use crate::engine::plan::Discovery;
use crate::engine::plan::Holdings;
use crate::engine::progress::Progress;
use crate::engine::{EngineError, PipelineConfig, StartingOffsets};
use swap::GroupSwaps;

/// The member's answers to the coordinator.
pub(in crate::engine) struct Member {
    cp: Arc<dyn Checkpoint>,
    holdings: Arc<Holdings>,
    /// Where a partition with no position is read from until the planner
    /// says (the consumer's own read position only).
    starting: StartingOffsets,
    /// The Kafka member id the coordinator gave this member (recorded
    /// with each claim).
    member_id: Mutex<String>,
    /// The partitions a rebalance takes during a batch, and the part in
    /// flight a revoke waits for.
    gate: PartitionGate,
    /// When the assignment last changed and when the member started.
    joined_at: Mutex<Instant>,
    started_at: Instant,
    /// The producer of the outputs (`--output-topic`), set before the
    /// member joins; under exactly once each claim takes the partition's
    /// transactional id ([`output::claim_output`]).
    output: OnceLock<Arc<KafkaOutput>>,
}

impl Member {
    pub(in crate::engine) fn new(
        cp: Arc<dyn Checkpoint>,
        holdings: Arc<Holdings>,
        starting: StartingOffsets,
    ) -> Self {
        Member {
            starting: if cp.is_new() {
                starting
            } else {
                StartingOffsets::Earliest
            },
            cp,
            holdings,
            member_id: Mutex::new(String::new()),
            gate: PartitionGate::shared(),
            joined_at: Mutex::new(Instant::now()),
            started_at: Instant::now(),
            output: OnceLock::new(),
        }
    }

    /// Give the member the pipeline's output producer (before it joins).
    pub(in crate::engine) fn set_output(&self, out: Arc<KafkaOutput>) {
        let _ = self.output.set(out);
    }

    /// `tp` is no longer this member's: release it, and its output
    /// producer under exactly once.
    fn release(&self, tp: &TopicPartition) {
        self.holdings.release(tp);
        if let Some(out) = self.output.get() {
            out.release_partition(tp);
        }
    }

    /// Claim `tp` and hold it; log where it continues.
    fn claim(&self, tp: &TopicPartition) -> Result<i64, String> {
        let member_id = self
            .member_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let c = self.cp.claim(tp, &member_id).map_err(|e| e.to_string())?;
        if let Some(out) = self.output.get() {
            output::claim_output(self.cp.as_ref(), out, tp, &c)?;
        }
        let (from, at) = match &c.start {
            Start::At(n) => (format!("offset {n}"), *n),
            Start::Rerun(p) => (
                format!("its planned range [{}, {}), again", p.start, p.end),
                p.start,
            ),
            // The planner chooses where it starts (and says so).
            Start::New => (
                "where the next plan starts it (no position yet)".to_string(),
                match self.starting {
                    StartingOffsets::Earliest => START_EARLIEST,
                    StartingOffsets::Latest => START_LATEST,
                },
            ),
        };
        tracing::info!(
            topic = tp.0,
            partition = tp.1,
            epoch = c.epoch.get(),
            rerun = matches!(c.start, Start::Rerun(_)),
            "claimed; reading from {from}"
        );
        self.holdings.hold(tp.clone(), c);
        Ok(at)
    }

    /// Another member holds `f`'s partition now: drop it (logged) and
    /// answer true. When it was `host group reset` that took it (the
    /// partition is still assigned to this member), or its row is gone,
    /// claim it again: the claim reads the position the reset left.
    fn drop_fenced(&self, f: &Fenced) -> bool {
        let (topic, partition) = (&f.partition.0, f.partition.1);
        let gone = f.now.get() == 0;
        if gone || f.holder.starts_with(RESET_OWNER) {
            tracing::warn!(
                topic,
                partition,
                "{}: claiming the partition again",
                if gone {
                    "its row in sluice_partitions is gone".to_string()
                } else {
                    format!("the group was reset ({})", f.holder)
                }
            );
            match self.claim(&f.partition) {
                Ok(_) => return true,
                Err(why) => tracing::warn!(
                    topic,
                    partition,
                    "could not claim it again, dropping it: {why}"
                ),
            }
        } else {
            tracing::warn!(topic, partition, "{f}");
        }
        self.release(&f.partition);
        true
    }

    /// Fail when no assignment came within the join wait: the
    /// coordinator did not let the member join.
    ///
    /// # Errors
    /// [`EngineError::Source`], saying what to check.
    pub(in crate::engine) fn check_joined(
        &self,
        source: &KafkaSource,
        cfg: &PipelineConfig,
    ) -> Result<(), EngineError> {
        if !source.context().rebalanced() && self.started_at.elapsed() > join_wait(cfg) {
            return Err(EngineError::Source(crate::source::SourceError::Client(
                format!(
                    "no assignment from the consumer group {} after {} s: the group coordinator did not let this member join (check the brokers, the group name and the broker's log)",
                    cfg.group.as_deref().unwrap_or_default(),
                    self.started_at.elapsed().as_secs()
                ),
            )));
        }
        Ok(())
    }

    /// Whether the coordinator has let this member settle: it joined, and
    /// the assignment has been quiet for 3 s (a rebalance may still hand
    /// over partitions with work left). A member given nothing (more
    /// members than partitions) settles after 15 s.
    ///
    /// # Errors
    /// As [`Member::check_joined`].
    pub(in crate::engine) fn settled(
        &self,
        source: &KafkaSource,
        cfg: &PipelineConfig,
    ) -> Result<bool, EngineError> {
        self.check_joined(source, cfg)?;
        let quiet = self
            .joined_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
            > Duration::from_secs(3);
        let held = !self.holdings.snapshot().is_empty();
        Ok(source.context().rebalanced()
            && quiet
            && (held || self.started_at.elapsed() > Duration::from_secs(15)))
    }

    /// Take the assignment changes since the last call
    /// ([`KafkaSource::sync_group`]) and forget the metrics of the
    /// partitions revoked. Returns them.
    ///
    /// # Errors
    /// [`EngineError::Claim`] for a claim that failed: Kafka counts the
    /// partition as this member's, but nobody would read it, so the member
    /// stops.
    pub(in crate::engine) fn sync(
        &self,
        source: &mut KafkaSource,
        metrics: &Metrics,
    ) -> Result<AssignmentChanges, EngineError> {
        let changes = source.sync_group();
        if let Some((tp, why)) = changes.failed.first() {
            return Err(EngineError::Claim {
                topic: tp.0.clone(),
                partition: tp.1,
                why: why.clone(),
            });
        }
        for tp in &changes.revoked {
            metrics.forget_partition(tp);
        }
        if !changes.assigned.is_empty() || !changes.revoked.is_empty() {
            self.changed();
        }
        Ok(changes)
    }

    /// The assignment changed now (the quiet time of [`Member::settled`]
    /// starts again).
    fn changed(&self) {
        *self.joined_at.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }
}

impl Membership for Member {
    fn assigned(
        &self,
        partitions: &[TopicPartition],
        member_id: &str,
    ) -> Vec<(TopicPartition, Result<i64, String>)> {
        *self.member_id.lock().unwrap_or_else(|p| p.into_inner()) = member_id.to_string();
        self.changed();
        partitions
            .iter()
            .map(|tp| (tp.clone(), self.claim(tp)))
            .collect()
    }

    fn revoked(&self, partitions: &[TopicPartition], lost: bool) {
        // Drain, then release: no part of them starts from now on, and the
        // one in flight ends before the revoke is acknowledged.
        self.gate.revoke(partitions, lost, DRAIN_WAIT);
        self.changed();
        for tp in partitions {
            self.release(tp);
            tracing::info!(topic = %tp.0, partition = tp.1, lost, "revoked");
        }
    }
}

/// How a member starts (see [`StartOwner`]), from what `join` opened.
pub(in crate::engine) struct MemberStart {
    pub(in crate::engine) member: Arc<Member>,
    /// The group's store, for the swaps.
    pub(in crate::engine) store: Arc<crate::checkpoint::group::GroupStore>,
    /// The last swap asked before the member read the group's plugins.
    pub(in crate::engine) swaps_before: u64,
    /// Who it is (pid, host).
    pub(in crate::engine) owner: String,
}

impl StartOwner for MemberStart {
    /// Join the consumer group named as the pipeline group (its offsets
    /// are committed there too, for lag dashboards: the database stays
    /// the checkpoint), and watch the group's swaps.
    fn start(self: Box<Self>, s: Starting<'_>) -> Result<Started, EngineError> {
        let cfg = s.cfg;
        let MemberStart {
            member,
            store,
            swaps_before,
            owner,
        } = *self;
        if let Some(out) = s.output {
            // Claims come from the consumer's rebalances from here on.
            member.set_output(out.clone());
        }
        let name = s.cp.query_id().to_string();
        let source = KafkaSource::member(
            &cfg.brokers,
            &cfg.kafka,
            &name,
            &cfg.topics,
            member.clone(),
            true,
            cfg.kafka_timeout,
        )?;
        tracing::info!(group = name, "joined the pipeline group");
        let swaps = GroupSwaps::start(
            store,
            s.runtime.clone(),
            owner.clone(),
            s.stages,
            swaps_before,
            s.status.clone(),
        )?;
        let metrics = Metrics::in_group(&name, &owner);
        Ok(Started {
            owner: Box::new(GroupMember {
                name,
                owner,
                member,
                swaps,
            }),
            source,
            metrics,
        })
    }
}

/// A pipeline group's member as the loop's owner.
pub(in crate::engine) struct GroupMember {
    /// The group's name.
    name: String,
    /// This member (pid, host), for progress and metrics.
    owner: String,
    member: Arc<Member>,
    swaps: GroupSwaps,
}

impl Discovery for GroupMember {
    fn claim_discovered(
        &self,
        _cp: &dyn Checkpoint,
        _tp: &TopicPartition,
    ) -> Option<Result<Claimed, CheckpointError>> {
        // Partitions are claimed as the coordinator assigns them.
        None
    }

    fn plans_topic(&self, holds_any: bool) -> bool {
        holds_any
    }

    fn new_to_pipeline(&self, _topic_known: bool) -> bool {
        false
    }
}

impl Ownership for GroupMember {
    fn fenced(&self, f: &Fenced) -> bool {
        self.member.drop_fenced(f)
    }

    fn batch_failed(
        &self,
        at: &mut LoopState<'_>,
        entry: &OffsetsEntry,
        e: EngineError,
    ) -> Result<(), EngineError> {
        // A claim that failed during the batch stops the member (as at
        // the boundary).
        let changes = self
            .member
            .sync(at.source, at.metrics)
            .inspect_err(|_| tracing::error!("batch {} failed: {e}", entry.batch_id))?;
        // A rebalance drains and releases the revoked partitions without
        // failing the batch; only a read of a partition taken while it
        // was being read may still end it. Its planned range is run by
        // whoever holds it now.
        let took = changes.revoked.iter().any(|tp| {
            entry
                .ranges
                .iter()
                .any(|r| r.topic == tp.0 && r.partition == tp.1)
        });
        for tp in &changes.revoked {
            at.planner.forget(tp);
        }
        if took && matches!(e, EngineError::Source(_)) {
            tracing::info!(
                "a rebalance took a partition of batch {}: {e}",
                entry.batch_id
            );
            return Ok(());
        }
        Err(e)
    }

    fn label(&self, event: Progress) -> Progress {
        event.in_group(&self.name, &self.owner)
    }

    fn leave(
        self: Box<Self>,
        ok: bool,
        _handover: Option<Handover>,
        _cp: Arc<dyn Checkpoint>,
        source: &mut KafkaSource,
        holdings: &Holdings,
    ) {
        if ok {
            commit_before_leaving(source, holdings);
        }
        self.swaps.leave();
    }

    /// Take the assignment changes since the last boundary (the planner
    /// forgets what was revoked), start the next batch's gate afresh, and
    /// install a group swap that compiled.
    fn at_boundary(&mut self, at: &mut LoopState<'_>, stop: bool) -> Result<Next, EngineError> {
        if stop {
            tracing::info!("stop requested: the last batch is committed, leaving the group");
            return Ok(Next::Stop);
        }
        // Revokes answered between batches are out of the holdings already;
        // the ones during the last batch were acted on.
        at.source.serve(Duration::from_millis(10));
        let changes = self.member.sync(at.source, at.metrics)?;
        for tp in &changes.revoked {
            at.planner.forget(tp);
        }
        self.member.gate.take();
        let next = at.cp.next_batch_id();
        if self.swaps.at_boundary(at.cfg, at.stages, at.grants, next) {
            at.metrics.swap();
        }
        Ok(Next::Plan)
    }

    fn nothing_to_read(
        &mut self,
        source: &mut KafkaSource,
        cfg: &PipelineConfig,
    ) -> Result<(), EngineError> {
        // The consumer keeps answering the group (no pause).
        self.member.check_joined(source, cfg)
    }

    fn settled(&self, source: &KafkaSource, cfg: &PipelineConfig) -> Result<bool, EngineError> {
        self.member.settled(source, cfg)
    }

    fn idle(&mut self, source: &mut KafkaSource, stop: &AtomicBool, d: Duration) {
        let until = Instant::now() + d;
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= until {
                return;
            }
            source.serve((until - now).min(Duration::from_millis(50)));
        }
    }

    fn gate(&self) -> &PartitionGate {
        &self.member.gate
    }

    fn knows_holdings(&self, source: &KafkaSource) -> bool {
        source.context().rebalanced()
    }

    fn took_over(&mut self, _cp: &dyn Checkpoint) -> Option<i64> {
        None
    }
}

/// How long a member waits for its first assignment: a join can wait out
/// a rebalance that waits out a departed member's session timeout
/// (librdkafka's mock cluster does so even after a LeaveGroup), twice in
/// a row.
fn join_wait(cfg: &PipelineConfig) -> Duration {
    let session = cfg
        .kafka
        .get("session.timeout.ms")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(45_000);
    cfg.kafka_timeout
        .max(Duration::from_secs(60))
        .max(Duration::from_millis(2 * session) + Duration::from_secs(10))
}

/// How long a member that leaves tries to commit its applied ends to the
/// Kafka group (informational offsets; the database is the checkpoint).
const LEAVING_COMMIT_FOR: Duration = Duration::from_secs(15);

/// Commit the positions of the partitions held to the Kafka group and
/// wait for the answer, before the member leaves. A coordinator in the
/// middle of a rebalance refuses commits (`RebalanceInProgress`,
/// `IllegalGeneration`: another member just left or joined), so the
/// member serves the group and tries again, for up to
/// [`LEAVING_COMMIT_FOR`]; after that it leaves without (logged).
pub(in crate::engine) fn commit_before_leaving(source: &mut KafkaSource, holdings: &Holdings) {
    let until = Instant::now() + LEAVING_COMMIT_FOR;
    loop {
        let ends: BTreeMap<TopicPartition, i64> = holdings
            .snapshot()
            .into_iter()
            .filter_map(|(tp, c)| match c.start {
                Start::At(n) => Some((tp, n)),
                _ => None,
            })
            .collect();
        match source.commit_group_sync(&ends) {
            Ok(()) => return,
            Err(e) if Instant::now() < until => {
                tracing::debug!(
                    "committing the applied ends to the Kafka group: {e}; trying again"
                );
                let pause = Instant::now() + Duration::from_millis(250);
                while Instant::now() < pause {
                    source.serve(Duration::from_millis(50));
                }
            }
            Err(e) => {
                tracing::info!(
                    "the applied ends were not committed to the Kafka group ({e}); they are informational only, the sink database holds the checkpoint"
                );
                return;
            }
        }
    }
}
