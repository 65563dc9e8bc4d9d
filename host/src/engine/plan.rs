//! Planning a batch: discover partitions, read watermarks, and choose each
//! partition's `[start, end)`.
//!
//! `start` is the previous batch's end (numeric, from the checkpoint). A
//! partition never seen before starts at the configured starting offset on
//! a new checkpoint, and at its log start offset when discovered later.
//! `end = min(high watermark, start + max records per partition)`, and,
//! with `--until-caught-up`, no further than the high watermark seen at the
//! first plan of this run.
//!
//! Every plan (and the start of a re-run) first asks the broker for each
//! topic's identity and refuses a topic that is not the one the
//! checkpoint's offsets belong to ([`TopicIdentity::changed`]): the
//! offsets of a deleted and recreated topic name other records, so
//! nothing is read until `host checkpoint reset` says where to go.

use std::collections::BTreeMap;

use crate::checkpoint::{DataLossGap, OffsetsEntry, PartitionRange, Recovery, TopicIdentity};
use crate::source::{KafkaSource, TopicInfo, TopicPartition};

use super::policy::on_data_loss;
use super::{EngineError, PipelineConfig, StartingOffsets};

/// A planned batch.
pub(crate) struct Planned {
    /// One range per known partition (empty ranges included, so every
    /// position is recorded).
    pub(crate) ranges: Vec<PartitionRange>,
    /// Ranges skipped under `--on-data-loss skip`.
    pub(crate) gaps: Vec<DataLossGap>,
    /// False when nothing would change (no data, no new partition).
    pub(crate) worth_a_batch: bool,
    /// Some partition hit the per-batch cap: more data is waiting.
    pub(crate) full: bool,
    /// Identity of each topic as planned.
    pub(crate) topics: BTreeMap<String, TopicIdentity>,
}

/// Positions and targets across batches of one run.
pub(crate) struct Planner {
    positions: BTreeMap<TopicPartition, i64>,
    new_checkpoint: bool,
    targets: Option<BTreeMap<TopicPartition, i64>>,
    highs: BTreeMap<TopicPartition, i64>,
    /// The identity the positions belong to, per topic.
    identities: BTreeMap<String, TopicIdentity>,
}

impl Planner {
    /// Positions from `recovery`, belonging to the topics `identities`
    /// describe (the newest offsets entry's).
    pub(crate) fn new(recovery: &Recovery, identities: &BTreeMap<String, TopicIdentity>) -> Self {
        let (positions, new_checkpoint) = match recovery {
            Recovery::Resume {
                positions,
                next_batch,
                ..
            } => (positions.clone(), *next_batch == 0 && positions.is_empty()),
            Recovery::Rerun { entry } => (
                entry
                    .ranges
                    .iter()
                    .map(|r| ((r.topic.clone(), r.partition), r.start))
                    .collect(),
                false,
            ),
        };
        Planner {
            positions,
            new_checkpoint,
            targets: None,
            highs: BTreeMap::new(),
            identities: identities.clone(),
        }
    }

    /// Ask the broker for `topic` and refuse it when it is not the topic
    /// the positions belong to. Returns its partitions.
    fn check_topic(
        &mut self,
        source: &KafkaSource,
        cfg: &PipelineConfig,
        topic: &str,
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
                if self.positions.keys().any(|(t, _)| t == topic) {
                    // A checkpoint from before identities were recorded.
                    tracing::info!(topic, "recording the topic's identity: {}", now.describe());
                }
                now
            }
        };
        self.identities.insert(topic.to_string(), now);
        Ok(partitions)
    }

    /// Check every topic of `entry` before the batch is re-run with its
    /// planned ranges.
    ///
    /// # Errors
    /// [`EngineError::TopicRecreated`], or the source's error.
    pub(crate) fn check_topics(
        &mut self,
        source: &KafkaSource,
        cfg: &PipelineConfig,
        entry: &OffsetsEntry,
    ) -> Result<(), EngineError> {
        let topics: std::collections::BTreeSet<&String> =
            entry.ranges.iter().map(|r| &r.topic).collect();
        for topic in topics {
            self.check_topic(source, cfg, topic)?;
        }
        Ok(())
    }

    /// Read the high watermark of each partition a re-run batch reads, so
    /// that its progress reports the lag behind it (a re-run is planned
    /// from the write-ahead log, not by [`Planner::plan`]).
    pub(crate) fn observe_highs(
        &mut self,
        source: &KafkaSource,
        entry: &OffsetsEntry,
    ) -> Result<(), EngineError> {
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for r in &entry.ranges {
            by_topic.entry(&r.topic).or_default().push(r.partition);
        }
        for (topic, partitions) in by_topic {
            for (partition, (_, high)) in source.watermarks_of(topic, &partitions)? {
                self.highs.insert((topic.to_string(), partition), high);
            }
        }
        Ok(())
    }

    pub(crate) fn plan(
        &mut self,
        source: &KafkaSource,
        cfg: &PipelineConfig,
    ) -> Result<Planned, EngineError> {
        let mut ranges = Vec::new();
        let mut gaps = Vec::new();
        let mut worth = false;
        let mut full = false;
        let first_plan = self.targets.is_none();
        let mut targets = self.targets.take().unwrap_or_default();
        for topic in &cfg.topics {
            let partitions = self.check_topic(source, cfg, topic)?;
            let marks = source.watermarks_of(topic, &partitions)?;
            for (partition, (low, high)) in marks {
                let tp = (topic.clone(), partition);
                self.highs.insert(tp.clone(), high);
                let known = self.positions.get(&tp).copied();
                // A topic with no known partition at all (a new checkpoint,
                // or a topic added with --allow-fingerprint-change) starts
                // at the configured starting offsets; a new partition of a
                // known topic at its log start.
                let topic_known = self.positions.keys().any(|(t, _)| t == topic);
                let mut start = match known {
                    Some(p) => p,
                    None if self.new_checkpoint || !topic_known => match cfg.starting_offsets {
                        StartingOffsets::Earliest => low,
                        StartingOffsets::Latest => high,
                    },
                    None => {
                        tracing::info!(
                            topic,
                            partition,
                            "new partition: starting at its log start offset {low}"
                        );
                        low
                    }
                };
                if start < low {
                    let gap =
                        on_data_loss(cfg.on_data_loss, topic, partition, (start, low), "planning")?;
                    gaps.push(gap);
                    start = low;
                }
                if start > high {
                    // A topic deleted and recreated since its identity was
                    // read above shows as a short log: say which it is.
                    self.check_topic(source, cfg, topic)?;
                    return Err(EngineError::BeyondEnd {
                        topic: topic.clone(),
                        partition,
                        position: start,
                        high,
                        reset: cfg.reset_command(topic),
                    });
                }
                if cfg.until_caught_up && (first_plan || !targets.contains_key(&tp)) {
                    targets.insert(tp.clone(), high);
                }
                let cap = start.saturating_add(
                    i64::try_from(cfg.max_records_per_partition).unwrap_or(i64::MAX),
                );
                let mut end = high.min(cap);
                if cfg.until_caught_up
                    && let Some(t) = targets.get(&tp)
                {
                    end = end.min((*t).max(start));
                }
                full |= end == cap && end > start;
                worth |= end > start || known != Some(start);
                ranges.push(PartitionRange {
                    topic: topic.clone(),
                    partition,
                    start,
                    end,
                });
            }
            // Once more after the watermarks: a topic recreated while they
            // were read must not be planned under the old one's identity.
            self.check_topic(source, cfg, topic)?;
        }
        self.targets = Some(targets);
        Ok(Planned {
            ranges,
            gaps,
            worth_a_batch: worth,
            full,
            topics: self
                .identities
                .iter()
                .filter(|(t, _)| cfg.topics.contains(t))
                .map(|(t, i)| (t.clone(), i.clone()))
                .collect(),
        })
    }

    /// Record a committed batch.
    pub(crate) fn committed(&mut self, entry: &OffsetsEntry) {
        self.positions.extend(ends(&entry.ranges));
        self.new_checkpoint = false;
    }

    /// With `--until-caught-up`: every partition reached its target.
    pub(crate) fn caught_up(&self) -> bool {
        match &self.targets {
            Some(t) => t
                .iter()
                .all(|(tp, target)| self.positions.get(tp).is_some_and(|p| p >= target)),
            None => false,
        }
    }

    /// Records between each position and the last high watermark seen.
    pub(crate) fn lag(&self) -> BTreeMap<TopicPartition, i64> {
        self.highs
            .iter()
            .map(|(tp, h)| {
                (
                    tp.clone(),
                    (h - self.positions.get(tp).copied().unwrap_or(0)).max(0),
                )
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
