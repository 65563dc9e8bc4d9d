//! Planning a batch, for a single host and a group member alike: which
//! partitions are held, and each one's `[start, end)`.
//!
//! The partitions held are in [`Holdings`], each with its owner epoch and
//! where it continues ([`Start`]). A store that holds every partition (a
//! checkpoint directory) has the planner claim each partition it
//! discovers; a group member's holdings change in the rebalance callback
//! (claim on assign, drop on revoke).
//!
//! - A partition with a range planned and not committed ([`Start::Rerun`])
//!   is run again with exactly those bounds, so its records get the same
//!   idempotency keys; while any is held, the batch is made of those
//!   re-runs only.
//! - Otherwise `start` is the partition's position (the end of its last
//!   committed range, or what its progress row shows applied). A partition
//!   with none starts at the configured starting offsets when it existed
//!   as the pipeline began (a new pipeline's topics, or, for a single
//!   host, a topic it never read, as first planned in this run), at its
//!   log start when it appeared later: a partition added to a running
//!   topic, a topic created while a group runs. Its records were all
//!   produced after the pipeline began, so `--starting-offsets latest`
//!   must not skip them (Spark's Kafka source reads partitions it
//!   discovers later from their earliest offset for the same reason).
//!   `end = min(high watermark, start + max records per partition)`, and,
//!   with `--until-caught-up`, no further than the high watermark seen
//!   when the partition was first planned.
//!
//! Every plan (and a re-run) first asks the broker for each topic's
//! identity and refuses a topic that is not the one the positions belong
//! to ([`TopicIdentity::changed`]): the offsets of a deleted and recreated
//! topic name other records, so nothing is read until a reset says where
//! to go.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

use crate::checkpoint::{
    Checkpoint, CheckpointError, Claimed, DataLossGap, Epoch, PartitionRange, Start, TopicIdentity,
};
use crate::source::{KafkaSource, TopicInfo, TopicPartition};

use super::policy::on_data_loss;
use super::{EngineError, PipelineConfig, StartingOffsets};

/// What the planner asks of the pipeline's owner (the ownership seam,
/// `super::ownership`): which partitions it comes to hold by planning.
pub(super) trait Discovery {
    /// `tp` was discovered by a plan and is not held: claim it (a sole
    /// owner, who holds every partition), or `None` (a group member, who
    /// holds what the coordinator assigns).
    ///
    /// # Errors
    /// The store's.
    fn claim_discovered(
        &self,
        cp: &dyn Checkpoint,
        tp: &TopicPartition,
    ) -> Option<Result<Claimed, CheckpointError>>;

    /// Whether a plan looks at a topic of which this process holds
    /// nothing yet (`holds_any` false): a sole owner does (it discovers
    /// the topic's partitions); a group member does not (the coordinator
    /// assigns them, once the topic exists).
    fn plans_topic(&self, holds_any: bool) -> bool;

    /// Whether a topic of which this process holds no position
    /// (`topic_known` false) is new to the pipeline, its partitions
    /// starting at the configured starting offsets: yes for a sole owner
    /// (it sees every partition: a topic added with
    /// `--allow-fingerprint-change`); no for a group member (other members
    /// may hold its positions).
    fn new_to_pipeline(&self, topic_known: bool) -> bool;
}

/// The partitions this process holds and where each continues: filled by
/// the planner (a single host) or by the rebalance callback (a group
/// member), advanced by each commit.
#[derive(Default)]
pub(crate) struct Holdings(Mutex<BTreeMap<TopicPartition, Claimed>>);

impl Holdings {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<TopicPartition, Claimed>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is held now.
    pub(crate) fn snapshot(&self) -> BTreeMap<TopicPartition, Claimed> {
        self.lock().clone()
    }

    /// Hold `tp` as claimed.
    pub(crate) fn hold(&self, tp: TopicPartition, claimed: Claimed) {
        self.lock().insert(tp, claimed);
    }

    /// Hold `tp` no longer.
    pub(crate) fn release(&self, tp: &TopicPartition) {
        self.lock().remove(tp);
    }

    /// Whether a range planned and not committed is held.
    pub(crate) fn any_rerun(&self) -> bool {
        self.lock()
            .values()
            .any(|c| matches!(c.start, Start::Rerun(_)))
    }

    /// Whether `tp` is held.
    pub(crate) fn holds(&self, tp: &TopicPartition) -> bool {
        self.lock().contains_key(tp)
    }

    /// `batch` was written ahead: its non-empty ranges are in flight (a
    /// batch that fails is run again with these bounds, as the store
    /// records them), and a start chosen at the high watermark is the
    /// partition's position from now on (the store recorded it).
    pub(crate) fn written_ahead(&self, batch: &crate::checkpoint::Batch) {
        self.mark_written(batch, true);
    }

    /// A write-ahead of `batch` was refused (a partition fenced): the
    /// starts it recorded at the high watermark hold all the same (the
    /// store records each one before it fails), so the next plan does not
    /// choose them again.
    pub(crate) fn started(&self, batch: &crate::checkpoint::Batch) {
        self.mark_written(batch, false);
    }

    fn mark_written(&self, batch: &crate::checkpoint::Batch, ranges: bool) {
        let mut held = self.lock();
        for r in &batch.entry.ranges {
            let tp = (r.topic.clone(), r.partition);
            let Some(c) = held.get_mut(&tp) else {
                continue;
            };
            if ranges && r.end > r.start {
                c.start = Start::Rerun(crate::checkpoint::Planned {
                    batch: batch.entry.batch_id,
                    start: r.start,
                    end: r.end,
                    plugins: batch.entry.plugins.clone(),
                });
            } else if batch.started_latest.contains(&tp) {
                c.start = Start::At(r.start);
            }
        }
    }

    /// The committed ranges' ends become their partitions' positions.
    fn advance(&self, ranges: &[PartitionRange]) {
        let mut held = self.lock();
        for r in ranges {
            if let Some(c) = held.get_mut(&(r.topic.clone(), r.partition)) {
                c.start = Start::At(r.end);
            }
        }
    }
}

/// A planned batch.
pub(crate) struct Planned {
    /// One range per partition planned (empty ranges included, so every
    /// position is recorded).
    pub(crate) ranges: Vec<PartitionRange>,
    /// Each range's owner epoch.
    pub(crate) epochs: BTreeMap<TopicPartition, Epoch>,
    /// The ranges are re-runs of ranges planned and not committed.
    pub(crate) rerun: bool,
    /// Partitions started at the high watermark (`latest`) without reading.
    pub(crate) started_latest: BTreeSet<TopicPartition>,
    /// Ranges skipped under `--on-data-loss skip`.
    pub(crate) gaps: Vec<DataLossGap>,
    /// False when nothing would change (no data, no new position).
    pub(crate) worth_a_batch: bool,
    /// Some partition hit the per-batch cap: more data is waiting.
    pub(crate) full: bool,
    /// Identity of each topic as planned.
    pub(crate) topics: BTreeMap<String, TopicIdentity>,
}

/// Targets and watermarks across batches of one run.
pub(crate) struct Planner {
    /// The checkpoint had no position when this process started, and none
    /// was committed since.
    new_pipeline: bool,
    /// Topics new to the pipeline in this run, each with the partitions
    /// it had at the pipeline's beginning: those start at the configured
    /// starting offsets. Filled by the first plan that knows what this
    /// process holds (for a member, only the topics it held some of).
    fresh: BTreeMap<String, BTreeSet<i32>>,
    /// That plan has not run yet (a group member waits for its first
    /// assignment).
    fresh_open: bool,
    /// With `--until-caught-up`: each partition's high watermark when it
    /// was first planned.
    targets: BTreeMap<TopicPartition, i64>,
    /// Whether a plan of new ranges ran (targets are set from the first
    /// one on).
    planned_once: bool,
    highs: BTreeMap<TopicPartition, i64>,
    /// The identity the positions belong to, per topic.
    identities: BTreeMap<String, TopicIdentity>,
}

impl Planner {
    /// A planner for the pipeline whose checkpoint is `cp`.
    pub(crate) fn new(cp: &dyn Checkpoint) -> Self {
        Planner {
            new_pipeline: cp.is_new(),
            fresh: BTreeMap::new(),
            fresh_open: true,
            targets: BTreeMap::new(),
            planned_once: false,
            highs: BTreeMap::new(),
            identities: cp.topic_identities(),
        }
    }

    /// Ask the broker for `topic` and refuse it when it is not the topic
    /// the positions belong to. Returns its partitions.
    fn check_topic(
        &mut self,
        source: &KafkaSource,
        cfg: &PipelineConfig,
        topic: &str,
        known: bool,
    ) -> Result<Vec<i32>, EngineError> {
        let TopicInfo { id, partitions } = source.describe(topic)?;
        let now = TopicIdentity::new(id, partitions.len());
        let now = match self.identities.get(topic) {
            Some(was) => {
                if let Some(why) = was.changed(&now) {
                    return Err(EngineError::TopicRecreated {
                        topic: topic.to_string(),
                        why,
                        was: was.describe(),
                        now: now.describe(),
                        reset: cfg.reset_command(topic),
                    });
                }
                was.updated(&now)
            }
            None => {
                if known {
                    // A checkpoint from before identities were recorded.
                    tracing::info!(topic, "recording the topic's identity: {}", now.describe());
                }
                now
            }
        };
        self.identities.insert(topic.to_string(), now);
        Ok(partitions)
    }

    /// A topic this planner has not checked yet: take the identity its
    /// checkpoint recorded for it. In a pipeline group another member may
    /// have planned the topic (the positions this member now claims belong
    /// to that identity), so a topic deleted and created again since is
    /// refused here too instead of being recorded as new (found on Apache
    /// Kafka: a member that held nothing until the recreate applied the new
    /// topic's records under the old positions).
    fn adopt_recorded(&mut self, cp: &dyn Checkpoint, topic: &str) {
        if !self.identities.contains_key(topic)
            && let Some(recorded) = cp.topic_identities().remove(topic)
        {
            self.identities.insert(topic.to_string(), recorded);
        }
    }

    /// The watermarks of `partitions` of `topic`; when they cannot be read,
    /// the topic's identity is checked again, so that a topic deleted and
    /// created again (with fewer partitions) since it was checked is
    /// reported as such, with its reset, rather than as a broker that does
    /// not answer.
    ///
    /// # Errors
    /// [`EngineError::TopicRecreated`], or the source's.
    fn watermarks(
        &mut self,
        source: &KafkaSource,
        cfg: &PipelineConfig,
        topic: &str,
        partitions: &[i32],
    ) -> Result<BTreeMap<i32, (i64, i64)>, EngineError> {
        match source.watermarks_of(topic, partitions) {
            Ok(marks) => Ok(marks),
            Err(e) => {
                self.check_topic(source, cfg, topic, true)?;
                Err(e.into())
            }
        }
    }

    /// Plan the next batch of the partitions held (with `owner` claiming
    /// those discovered since the last plan, if it does). `at_start`: the
    /// owner knows what it holds ([`super::ownership::Ownership::knows_holdings`]);
    /// the first such plan is where the pipeline begins.
    ///
    /// # Errors
    /// [`EngineError::TopicRecreated`], [`EngineError::BeyondEnd`], the
    /// data-loss policy's, the source's, a claim's.
    pub(crate) fn plan(
        &mut self,
        source: &KafkaSource,
        cfg: &PipelineConfig,
        cp: &dyn Checkpoint,
        holdings: &Holdings,
        owner: &dyn Discovery,
        at_start: bool,
    ) -> Result<Planned, EngineError> {
        let held = holdings.snapshot();
        if held.values().any(|c| matches!(c.start, Start::Rerun(_))) {
            return self.plan_reruns(source, cfg, cp, &held);
        }
        // Targets are set from the first plan of new ranges on (a re-run
        // runs before it).
        let first_plan = !self.planned_once;
        self.planned_once = true;
        // The pipeline begins at the first plan that knows what this
        // process holds: a single host's first, a member's first after its
        // first assignment (possibly empty: a member that held nothing then
        // begins with nothing, and reads what it gets later from the log
        // start).
        let mut planned = Planned {
            ranges: Vec::new(),
            epochs: BTreeMap::new(),
            rerun: false,
            started_latest: BTreeSet::new(),
            gaps: Vec::new(),
            worth_a_batch: false,
            full: false,
            topics: BTreeMap::new(),
        };
        for topic in &cfg.topics {
            let position = |c: &Claimed| match c.start {
                Start::At(p) => Some(p),
                _ => None,
            };
            let topic_known = held
                .iter()
                .any(|(tp, c)| &tp.0 == topic && position(c).is_some());
            let mut mine: BTreeMap<i32, Claimed> = held
                .iter()
                .filter(|(tp, _)| &tp.0 == topic)
                .map(|(tp, c)| (tp.1, c.clone()))
                .collect();
            if !owner.plans_topic(!mine.is_empty()) {
                // A group member holds none of it (it may not even exist
                // yet: the coordinator assigns its partitions once it
                // does).
                continue;
            }
            self.adopt_recorded(cp, topic);
            let partitions = self.check_topic(source, cfg, topic, topic_known)?;
            if self.fresh_open
                && at_start
                && (self.new_pipeline || owner.new_to_pipeline(topic_known))
            {
                self.fresh
                    .entry(topic.clone())
                    .or_insert_with(|| partitions.iter().copied().collect());
            }
            for &p in &partitions {
                if let std::collections::btree_map::Entry::Vacant(v) = mine.entry(p) {
                    let tp = (topic.clone(), p);
                    if let Some(claimed) = owner.claim_discovered(cp, &tp) {
                        let claimed = claimed?;
                        holdings.hold(tp, claimed.clone());
                        v.insert(claimed);
                    }
                }
            }
            let wanted: Vec<i32> = mine.keys().copied().collect();
            if wanted.is_empty() {
                continue;
            }
            let marks = self.watermarks(source, cfg, topic, &wanted)?;
            for (partition, (low, high)) in marks {
                let Some(claimed) = mine.get(&partition) else {
                    continue;
                };
                let tp = (topic.clone(), partition);
                self.highs.insert(tp.clone(), high);
                let known = position(claimed);
                let mut start = match known {
                    Some(p) => p,
                    // A partition the pipeline met as it began: the
                    // configured starting offsets.
                    None if self
                        .fresh
                        .get(topic)
                        .is_some_and(|f| f.contains(&partition)) =>
                    {
                        match cfg.starting_offsets {
                            StartingOffsets::Earliest => low,
                            StartingOffsets::Latest => {
                                planned.started_latest.insert(tp.clone());
                                high
                            }
                        }
                    }
                    // One that appeared since: every record in it came
                    // after the pipeline began.
                    None => {
                        tracing::info!(
                            topic,
                            partition,
                            "a partition added since the pipeline began: reading from its log start offset {low}"
                        );
                        low
                    }
                };
                if start < low {
                    let gap =
                        on_data_loss(cfg.on_data_loss, topic, partition, (start, low), "planning")?;
                    planned.gaps.push(gap);
                    start = low;
                }
                if start > high {
                    // A topic deleted and recreated since its identity was
                    // read above shows as a short log: say which it is.
                    self.check_topic(source, cfg, topic, true)?;
                    return Err(EngineError::BeyondEnd {
                        topic: topic.clone(),
                        partition,
                        position: start,
                        high,
                        reset: cfg.reset_command(topic),
                    });
                }
                if cfg.until_caught_up && (first_plan || !self.targets.contains_key(&tp)) {
                    self.targets.insert(tp.clone(), high);
                }
                let cap = start.saturating_add(
                    i64::try_from(cfg.max_records_per_partition).unwrap_or(i64::MAX),
                );
                let mut end = high.min(cap);
                if cfg.until_caught_up
                    && let Some(t) = self.targets.get(&tp)
                {
                    end = end.min((*t).max(start));
                }
                planned.full |= end == cap && end > start;
                planned.worth_a_batch |= end > start || known != Some(start);
                planned.epochs.insert(tp, claimed.epoch);
                planned.ranges.push(PartitionRange {
                    topic: topic.clone(),
                    partition,
                    start,
                    end,
                });
            }
            // Once more after the watermarks: a topic recreated while they
            // were read must not be planned under the old one's identity.
            self.check_topic(source, cfg, topic, true)?;
        }
        if at_start {
            self.fresh_open = false;
        }
        planned.topics = self.topics(cfg);
        Ok(planned)
    }

    /// The re-run of every range held that was planned and not committed,
    /// with its bounds, after checking its topics and reading its high
    /// watermarks (for the lag its progress reports).
    fn plan_reruns(
        &mut self,
        source: &KafkaSource,
        cfg: &PipelineConfig,
        cp: &dyn Checkpoint,
        held: &BTreeMap<TopicPartition, Claimed>,
    ) -> Result<Planned, EngineError> {
        let mut ranges = Vec::new();
        let mut epochs = BTreeMap::new();
        for (tp, c) in held {
            if let Start::Rerun(p) = &c.start {
                ranges.push(PartitionRange {
                    topic: tp.0.clone(),
                    partition: tp.1,
                    start: p.start,
                    end: p.end,
                });
                epochs.insert(tp.clone(), c.epoch);
            }
        }
        let next = cp.next_batch_id();
        let batches: BTreeSet<u64> = held
            .values()
            .filter_map(|c| match &c.start {
                Start::Rerun(p) => Some(p.batch),
                _ => None,
            })
            .collect();
        tracing::info!(
            batch = next,
            "re-running uncommitted batch {} with its planned ranges",
            batches
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for r in &ranges {
            by_topic.entry(&r.topic).or_default().push(r.partition);
        }
        for (topic, partitions) in by_topic {
            self.adopt_recorded(cp, topic);
            self.check_topic(source, cfg, topic, true)?;
            for (partition, (_, high)) in self.watermarks(source, cfg, topic, &partitions)? {
                self.highs.insert((topic.to_string(), partition), high);
            }
        }
        Ok(Planned {
            ranges,
            epochs,
            rerun: true,
            started_latest: BTreeSet::new(),
            gaps: Vec::new(),
            worth_a_batch: true,
            full: true,
            topics: self.topics(cfg),
        })
    }

    /// The identities of the pipeline's topics, as last checked.
    fn topics(&self, cfg: &PipelineConfig) -> BTreeMap<String, TopicIdentity> {
        self.identities
            .iter()
            .filter(|(t, _)| cfg.topics.contains(t))
            .map(|(t, i)| (t.clone(), i.clone()))
            .collect()
    }

    /// `e`, a read of `ranges` that failed, as what it was when one of
    /// their topics was deleted and created again during the fetch (the
    /// new log shorter than the position: "offset out of range"):
    /// [`EngineError::TopicRecreated`], with the reset to run. `e` itself
    /// otherwise, and without asking when the brokers did not answer (a
    /// second wait of the broker timeout would only delay the error).
    pub(crate) fn explain_read_error(
        &mut self,
        source: &KafkaSource,
        cfg: &PipelineConfig,
        ranges: &[PartitionRange],
        e: EngineError,
    ) -> EngineError {
        use crate::source::SourceError as S;
        if !matches!(
            e,
            EngineError::Source(
                S::OutOfRange { .. } | S::Client(_) | S::FetchStalled { .. } | S::LogShrunk { .. }
            )
        ) {
            return e;
        }
        let topics: BTreeSet<&str> = ranges.iter().map(|r| r.topic.as_str()).collect();
        for topic in topics {
            if let Err(recreated @ EngineError::TopicRecreated { .. }) =
                self.check_topic(source, cfg, topic, true)
            {
                tracing::debug!("read failed: {e}");
                return recreated;
            }
        }
        e
    }

    /// Record a committed batch's ranges (those still held).
    pub(crate) fn committed(&mut self, holdings: &Holdings, ranges: &[PartitionRange]) {
        holdings.advance(ranges);
        self.new_pipeline = false;
    }

    /// Forget `tp`'s target and watermark (it was revoked).
    pub(crate) fn forget(&mut self, tp: &TopicPartition) {
        self.targets.remove(tp);
        self.highs.remove(tp);
    }

    /// With `--until-caught-up`: every partition held reached its target
    /// (a partition of the pipeline's topics claimed since the last plan
    /// has none yet, so it is not caught up; one of a topic the pipeline
    /// no longer reads is).
    pub(crate) fn caught_up(&self, holdings: &Holdings, topics: &[String]) -> bool {
        if !self.planned_once {
            return false;
        }
        let held = holdings.snapshot();
        held.iter()
            .all(|(tp, c)| match (&c.start, self.targets.get(tp)) {
                (Start::At(p), Some(t)) => p >= t,
                (Start::At(_), None) => !topics.contains(&tp.0),
                _ => false,
            })
    }

    /// Records between each position held and the last high watermark
    /// seen.
    pub(crate) fn lag(&self, holdings: &Holdings) -> BTreeMap<TopicPartition, i64> {
        let held = holdings.snapshot();
        self.highs
            .iter()
            .filter(|(tp, _)| held.contains_key(*tp))
            .map(|(tp, h)| {
                let at = match held.get(tp).map(|c| &c.start) {
                    Some(Start::At(p)) => *p,
                    _ => 0,
                };
                (tp.clone(), (h - at).max(0))
            })
            .collect()
    }
}

/// Positions after a batch: the end of each range.
pub fn ends(ranges: &[PartitionRange]) -> BTreeMap<TopicPartition, i64> {
    ranges
        .iter()
        .map(|r| ((r.topic.clone(), r.partition), r.end))
        .collect()
}
