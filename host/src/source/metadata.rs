//! What the reader asks brokers besides records: partitions and topic
//! identity (Metadata, DescribeTopics), watermarks and offsets for a
//! timestamp (ListOffsets), and the informational group commit.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};

use super::describe::Described;
use super::{
    KafkaSource, NO_BROKER, SourceError, TopicInfo, TopicPartition, UNKNOWN_TOPIC_PATIENCE,
    describe,
};

impl KafkaSource {
    /// The partitions of `topic`, sorted.
    ///
    /// # Errors
    /// As [`KafkaSource::describe`].
    pub fn partitions(&self, topic: &str) -> Result<Vec<i32>, SourceError> {
        self.describe(topic).map(|t| t.partitions)
    }

    /// A broker to send DescribeTopics to: one a Metadata answer listed
    /// (asked now if none is known; forgotten when a describe fails).
    fn describe_broker(&self, topic: &str, timeout: Duration) -> Result<i32, KafkaError> {
        let known = self.describe_via.load(Ordering::Relaxed);
        if known != NO_BROKER {
            return Ok(known);
        }
        // Metadata of one topic: the broker list comes with any answer.
        let md = self.admin().fetch_metadata(Some(topic), timeout)?;
        let id = md
            .brokers()
            .iter()
            .map(|b| b.id())
            .find(|id| *id == md.orig_broker_id())
            .or_else(|| md.brokers().first().map(|b| b.id()))
            .ok_or(KafkaError::MetadataFetch(
                RDKafkaErrorCode::BrokerNotAvailable,
            ))?;
        self.describe_via.store(id, Ordering::Relaxed);
        Ok(id)
    }

    /// The identity of `topic` as the broker sees it now: its KIP-516 id
    /// and its partitions (a fresh Metadata request, not a cached answer).
    ///
    /// # Errors
    /// [`SourceError::UnknownTopic`] when the brokers answer for 5 s that
    /// it does not exist; [`SourceError::Unavailable`] when they do not
    /// answer within the timeout.
    pub fn describe(&self, topic: &str) -> Result<TopicInfo, SourceError> {
        let per_call = self.timeout.min(Duration::from_secs(5));
        // A broker that answers "unknown topic" is asked again for a few
        // seconds (metadata can lag a topic's creation), not for the whole
        // broker timeout: a mistyped topic should fail fast. An unreachable
        // broker is still waited for up to the timeout.
        let started = Instant::now();
        let found = self.retry(
            || format!("metadata of topic {topic}"),
            || match describe::describe(
                self.admin(),
                self.describe_broker(topic, per_call)
                    .map_err(|e| e.to_string())?,
                topic,
                per_call,
            )
            .inspect_err(|_| self.describe_via.store(NO_BROKER, Ordering::Relaxed))?
            {
                Described::Topic { id, partitions } if !partitions.is_empty() => {
                    Ok(Some(TopicInfo { id, partitions }))
                }
                Described::Topic { .. } | Described::Unknown => {
                    if started.elapsed() >= UNKNOWN_TOPIC_PATIENCE.min(self.timeout) {
                        Ok(None)
                    } else {
                        Err(format!("topic {topic} not known to the broker (yet)"))
                    }
                }
            },
        )?;
        found.ok_or_else(|| SourceError::UnknownTopic {
            topic: topic.to_string(),
            brokers: self.brokers.clone(),
        })
    }

    /// `(log start offset, high watermark)` of a partition (the last stable
    /// offset under read_committed).
    ///
    /// # Errors
    /// [`SourceError::Unavailable`].
    pub fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), SourceError> {
        let per_call = self.timeout.min(Duration::from_secs(5));
        self.retry(
            || format!("watermarks of {topic}/{partition}"),
            || self.admin().fetch_watermarks(topic, partition, per_call),
        )
    }

    /// [`KafkaSource::watermarks`] of each of `partitions` of `topic`, in
    /// two ListOffsets requests per leader (earliest, then latest) rather
    /// than two per partition: planning 64 partitions took ~19 ms per
    /// batch on the mock cluster one partition at a time, and grows with
    /// the round-trip time to the brokers (docs/benchmarks.md, session
    /// 16). When the grouped lookup fails or leaves a partition out, each
    /// partition is asked alone, with [`KafkaSource::watermarks`]'s
    /// retries and errors.
    ///
    /// # Errors
    /// As [`KafkaSource::watermarks`].
    pub fn watermarks_of(
        &self,
        topic: &str,
        partitions: &[i32],
    ) -> Result<BTreeMap<i32, (i64, i64)>, SourceError> {
        if let Some(marks) = self.grouped_watermarks(topic, partitions) {
            return Ok(marks);
        }
        partitions
            .iter()
            .map(|p| Ok((*p, self.watermarks(topic, *p)?)))
            .collect()
    }

    /// ListOffsets for every partition at once: "earliest" (-2) and
    /// "latest" (-1) are the timestamps that ask for the log start and the
    /// high watermark (the last stable offset under read_committed, as for
    /// a single partition: librdkafka sends the consumer's isolation level
    /// with both). `None` on any error or missing answer.
    fn grouped_watermarks(
        &self,
        topic: &str,
        partitions: &[i32],
    ) -> Option<BTreeMap<i32, (i64, i64)>> {
        let per_call = self.timeout.min(Duration::from_secs(5));
        let ask = |at: Offset| -> Option<BTreeMap<i32, i64>> {
            let mut tpl = TopicPartitionList::new();
            for p in partitions {
                tpl.add_partition_offset(topic, *p, at).ok()?;
            }
            let answer = self.admin().offsets_for_times(tpl, per_call);
            let answer = answer
                .inspect_err(|e| tracing::debug!("grouped ListOffsets on {topic}: {e}"))
                .ok()?;
            answer
                .elements()
                .iter()
                .map(|e| match (e.error(), e.offset()) {
                    (Ok(()), Offset::Offset(o)) if o >= 0 => Some((e.partition(), o)),
                    _ => None,
                })
                .collect()
        };
        let lows = ask(Offset::Beginning)?;
        let highs = ask(Offset::End)?;
        partitions
            .iter()
            .map(|p| Some((*p, (*lows.get(p)?, *highs.get(p)?))))
            .collect()
    }

    /// The earliest offset of each partition whose timestamp is at or after
    /// `ms` (the high watermark when none is). Uses the ListOffsets API.
    ///
    /// # Errors
    /// [`SourceError::Unavailable`] when the broker does not answer the
    /// lookup (some brokers do not implement timestamp lookups).
    pub fn offsets_for_timestamp(
        &self,
        topic: &str,
        partitions: &[i32],
        ms: i64,
    ) -> Result<BTreeMap<i32, i64>, SourceError> {
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition_offset(topic, *p, Offset::Offset(ms))
                .map_err(|e| SourceError::Client(e.to_string()))?;
        }
        let per_call = self.timeout.min(Duration::from_secs(10));
        let answer = self.admin().offsets_for_times(tpl, per_call).map_err(|e| {
            self.unavailable(
                format!("timestamp lookup on {topic} (ListOffsets by time)"),
                per_call,
                e.to_string(),
            )
        })?;
        let mut out = BTreeMap::new();
        for e in answer.elements() {
            if let Err(err) = e.error() {
                return Err(self.unavailable(
                    format!("timestamp lookup on {topic}/{}", e.partition()),
                    per_call,
                    err.to_string(),
                ));
            }
            let offset = match e.offset() {
                Offset::Offset(o) => o,
                Offset::End => self.watermarks(topic, e.partition())?.1,
                other => {
                    return Err(self.unavailable(
                        format!("timestamp lookup on {topic}/{}", e.partition()),
                        per_call,
                        format!("the broker answered {other:?}"),
                    ));
                }
            };
            out.insert(e.partition(), offset);
        }
        Ok(out)
    }

    /// Commit `positions` to the consumer group given at creation (for lag
    /// dashboards only; never read back), without waiting for the answer.
    /// Does nothing without a group.
    pub fn commit_group(&self, positions: &BTreeMap<TopicPartition, i64>) {
        if let Err(e) = self.commit_group_with(positions, CommitMode::Async) {
            tracing::warn!("informational consumer-group commit failed: {e}");
        }
    }

    /// [`KafkaSource::commit_group`], waiting for the coordinator's answer
    /// (before leaving the group: a commit made during a rebalance is
    /// refused, and one still in flight when the consumer closes can be
    /// lost).
    ///
    /// # Errors
    /// The coordinator's refusal (`RebalanceInProgress`,
    /// `IllegalGeneration`, …) or a client error, as text.
    pub fn commit_group_sync(
        &self,
        positions: &BTreeMap<TopicPartition, i64>,
    ) -> Result<(), String> {
        self.commit_group_with(positions, CommitMode::Sync)
    }

    fn commit_group_with(
        &self,
        positions: &BTreeMap<TopicPartition, i64>,
        mode: CommitMode,
    ) -> Result<(), String> {
        if !self.commit_group || positions.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for ((t, p), o) in positions {
            tpl.add_partition_offset(t, *p, Offset::Offset(*o))
                .map_err(|e| e.to_string())?;
        }
        self.consumer.commit(&tpl, mode).map_err(|e| e.to_string())
    }
}
