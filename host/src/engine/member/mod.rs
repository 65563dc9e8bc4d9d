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
//! Files: this one holds [`Member`]; `join` opens the group's store and
//! settles its plugins, `output` what a claim does under exactly once to
//! a topic, `revoke` what a batch does when a
//! rebalance takes some of its partitions, `swap` the group's swaps at the
//! batch boundary.

mod join;
mod output;
pub(super) mod revoke;
pub(super) mod swap;

pub(super) use join::join;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::checkpoint::group::{GroupError, RESET_OWNER};
use crate::checkpoint::{Checkpoint, Start};
use crate::metrics::Metrics;
use crate::output::KafkaOutput;
use crate::source::{
    AssignmentChanges, KafkaSource, Membership, START_EARLIEST, START_LATEST, TopicPartition,
};

use super::plan::Holdings;
use super::{EngineError, PipelineConfig, StartingOffsets};
use revoke::{DRAIN_WAIT, Revocations};

/// The member's answers to the coordinator.
pub(super) struct Member {
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
    pub(super) revocations: Arc<Revocations>,
    /// When the assignment last changed and when the member started.
    joined_at: Mutex<Instant>,
    started_at: Instant,
    /// The producer of the outputs (`--output-topic`), set before the
    /// member joins; under exactly once each claim takes the partition's
    /// transactional id ([`output::claim_output`]).
    output: OnceLock<Arc<KafkaOutput>>,
}

impl Member {
    pub(super) fn new(
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
            revocations: Arc::new(Revocations::default()),
            joined_at: Mutex::new(Instant::now()),
            started_at: Instant::now(),
            output: OnceLock::new(),
        }
    }

    /// Give the member the pipeline's output producer (before it joins).
    pub(super) fn set_output(&self, out: Arc<KafkaOutput>) {
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
        if let Some(out) = self.output.get().filter(|o| o.per_partition()) {
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

    /// When `e` says another member holds one of our partitions now: drop
    /// it (logged) and answer true. When it was `host group reset` that
    /// took it (the partition is still assigned to this member), or its
    /// row is gone, claim it again: the claim reads the position the
    /// reset left.
    pub(super) fn drop_if_fenced(&self, e: &GroupError) -> bool {
        let GroupError::Fenced {
            topic,
            partition,
            holder,
            now,
            ..
        } = e
        else {
            return false;
        };
        let tp = (topic.clone(), *partition);
        let gone = now.get() == 0;
        if gone || holder.starts_with(RESET_OWNER) {
            tracing::warn!(
                topic,
                partition,
                "{}: claiming the partition again",
                if gone {
                    "its row in sluice_partitions is gone".to_string()
                } else {
                    format!("the group was reset ({holder})")
                }
            );
            match self.claim(&tp) {
                Ok(_) => return true,
                Err(why) => tracing::warn!(
                    topic,
                    partition,
                    "could not claim it again, dropping it: {why}"
                ),
            }
        } else {
            tracing::warn!(topic, partition, "{e}");
        }
        self.release(&tp);
        true
    }

    /// Fail when no assignment came within the join wait: the
    /// coordinator did not let the member join.
    ///
    /// # Errors
    /// [`EngineError::Source`], saying what to check.
    pub(super) fn check_joined(
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
    pub(super) fn settled(
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
    pub(super) fn sync(
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
        self.revocations.revoke(partitions, lost, DRAIN_WAIT);
        self.changed();
        for tp in partitions {
            self.release(tp);
            tracing::info!(topic = %tp.0, partition = tp.1, lost, "revoked");
        }
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
pub(super) fn commit_before_leaving(source: &mut KafkaSource, holdings: &Holdings) {
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
