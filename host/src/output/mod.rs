//! Output to Kafka (DESIGN.md, "Output to Kafka"): a pipeline's map
//! outputs written to a topic (`host run --output-topic NAME`), or the
//! records a sink stage sends to the topics the pipeline names (the
//! `kafka` capability, [`crate::capability::kafka`]).
//!
//! Each output is produced as the map emitted it: its key (or none), its
//! value (or none: a tombstone) and its headers, in the order of the
//! records it came from; the producer picks the partition from the key
//! with Java's hash (`partitioner=murmur2_random`), so a key lands where
//! a Java client would put it.
//!
//! **At-least-once** (`--output-guarantee at-least-once`): an idempotent
//! producer (`enable.idempotence`, `acks=all`: no duplicates from the
//! producer's own retries, order kept per partition). A part's outputs are
//! acknowledged by the brokers before anything records that part as done
//! (its progress row, the batch's commit entry), so a crash loses nothing
//! and may write an output again; every output carries its idempotency key
//! in the header [`IDEMPOTENCY_KEY_HEADER`] so a consumer can drop the
//! duplicates.
//!
//! **Exactly once** (the default; KIP-98 transactions, KIP-447 offsets in
//! the transaction): a transactional producer whose `transactional.id` is
//! `sluice-<query id>` ([`transactional_id`]), so a restart or a takeover
//! of the same pipeline fences the producer before it
//! (`init_transactions`). A batch's outputs and its input positions (the
//! ends of its ranges, each with the metadata [`batch_marker`]) commit in
//! one transaction, before the checkpoint's commit entry is written. A
//! batch the checkpoint shows uncommitted at start is decided by the
//! consumer group's committed offsets, read after `init_transactions`
//! finished or aborted the last producer's transaction: when they carry
//! the batch's marker its transaction committed, and the batch is
//! recorded as done without running it again; otherwise it is run again,
//! its earlier outputs being in an aborted transaction (or never sent).
//!
//! Files: this one holds the vocabulary (guarantee, configuration, the
//! transaction's ids and markers, errors); `stage` the output stage the
//! engine calls ([`KafkaOutput`], its transaction mode and verbs);
//! `settings` the producer's properties and the clients made from them;
//! `send` sending one producer's records and their acknowledgements;
//! `transaction` a batch's transaction; `per_partition` the transactions per
//! input partition; `positions` the input positions on the output
//! cluster; `destination` the topics and cluster, and the wording of
//! errors; `probe` the check at start that exactly once can hold;
//! `watchdog` a bound on librdkafka calls that may hang; `partitioner` the
//! partition of a keyed output.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod destination;
mod partitioner;
mod per_partition;
mod positions;
mod probe;
mod send;
mod settings;
mod stage;
mod transaction;
mod watchdog;

pub use partitioner::partition_of_key;
pub use stage::{KafkaOutput, TransactionScope};

/// Name of the header that carries each output's idempotency key
/// (`{topic}/{partition}/{offset}[#n]` of the input it came from,
/// DESIGN.md "Idempotency key") under at-least-once.
pub const IDEMPOTENCY_KEY_HEADER: &str = "sluice-idempotency-key";

/// What the output topic's consumers may rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutputGuarantee {
    /// Each input's outputs visible once to `read_committed` consumers,
    /// through Kafka transactions (KIP-98, KIP-447).
    ExactlyOnce,
    /// Each input's outputs at least once, duplicates carrying equal
    /// [`IDEMPOTENCY_KEY_HEADER`] values.
    AtLeastOnce,
}

impl OutputGuarantee {
    /// The flag's spelling (`exactly-once`, `at-least-once`).
    pub fn as_str(self) -> &'static str {
        match self {
            OutputGuarantee::ExactlyOnce => "exactly-once",
            OutputGuarantee::AtLeastOnce => "at-least-once",
        }
    }
}

/// Where and how a pipeline's outputs are produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputConfig {
    /// The topics produced to (each must exist): a map-only pipeline's
    /// outputs go to the one topic; a sink stage may send to any of them
    /// (the `kafka` capability).
    pub topics: Vec<String>,
    /// The output cluster's bootstrap servers (`None`: the input's).
    pub brokers: Option<String>,
    /// librdkafka properties of the producer (`--config
    /// output.kafka.<name>=v`, the file's `[output_kafka]` table). When
    /// the output cluster is the input's, the input's `kafka.*` settings
    /// apply first (its security settings, say) and these override them.
    pub kafka: BTreeMap<String, String>,
    /// At-least-once or exactly once.
    pub guarantee: OutputGuarantee,
    /// Exactly once: produce the outputs of offsets the pipeline's
    /// transactions already covered again, on purpose
    /// (`--output-reprocess`, after `host checkpoint reset` moved the
    /// checkpoint back); without it such a start is refused.
    pub reprocess: bool,
}

impl OutputConfig {
    /// What a batch's re-run must produce to again: `topic on brokers
    /// (guarantee)`, the brokers being the input's when `brokers` is
    /// `None`. Recorded in each write-ahead entry.
    pub fn identity(&self, input_brokers: &str) -> String {
        // Sorted: naming the same topics in another order changes nothing.
        let mut topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        topics.sort_unstable();
        format!(
            "{} on {} ({})",
            topics.join(", "),
            self.brokers.as_deref().unwrap_or(input_brokers),
            self.guarantee.as_str()
        )
    }
}

impl OutputConfig {
    /// Whether a batch recorded with output `recorded` (an
    /// [`OutputConfig::identity`]) may run again with this output: the
    /// same cluster and guarantee, and at least the recorded topics (a
    /// topic added for a sink that was refused one is fine; the batch's
    /// earlier outputs were aborted, or acknowledged where they went).
    pub fn covers(&self, recorded: &str, input_brokers: &str) -> bool {
        if self.identity(input_brokers) == recorded {
            return true;
        }
        let parse = |id: &str| -> Option<(Vec<String>, String)> {
            let (topics, rest) = id.split_once(" on ")?;
            let topics = topics.split(", ").map(str::to_string).collect();
            Some((topics, rest.to_string()))
        };
        match (parse(recorded), parse(&self.identity(input_brokers))) {
            (Some((then, where_then)), Some((now, where_now))) => {
                where_then == where_now && then.iter().all(|t| now.contains(t))
            }
            _ => false,
        }
    }
}

/// The `transactional.id` of the pipeline whose query id is `query_id`:
/// `sluice-<query id>`, the same across restarts and takeovers, so that
/// each new producer fences the one before it. (A cluster with ACLs must
/// let the host's principal write transactional ids with the prefix
/// `sluice-`.)
pub fn transactional_id(query_id: &str) -> String {
    format!("sluice-{query_id}")
}

/// The `transactional.id` of input partition `topic/partition` in
/// pipeline group `group` (exactly once in a group: a producer per input
/// partition): `sluice-<group>:<topic>:<partition>`. Every member that
/// holds the partition uses the same id, so each claim fences the
/// producer of the member before it. Topic names cannot hold `:`, so two
/// partitions never share an id. (Messages pass `<topic>`, `<partition>`
/// for the pattern.) (A cluster with ACLs must let the
/// host's principal write transactional ids with the prefix `sluice-`.)
pub fn partition_transactional_id(
    group: &str,
    topic: &str,
    partition: impl std::fmt::Display,
) -> String {
    format!("sluice-{group}:{topic}:{partition}")
}

/// The offset metadata a batch's transaction commits with each input
/// position: `sluice:<query id>:batch:<batch id>` (Kafka keeps it with
/// the committed offset; at most `offset.metadata.max.bytes`, 4096 by
/// default).
pub fn batch_marker(query_id: &str, batch_id: u64) -> String {
    format!("sluice:{query_id}:batch:{batch_id}")
}

/// The batch id in committed offset metadata written by [`batch_marker`]
/// for `query_id`; `None` for anything else (no metadata, another
/// pipeline's, a tool's).
pub fn marked_batch(metadata: &str, query_id: &str) -> Option<u64> {
    metadata
        .strip_prefix("sluice:")?
        .strip_prefix(query_id)?
        .strip_prefix(":batch:")?
        .parse()
        .ok()
}

/// What a consumer group holds per partition: `(topic, partition)` to
/// `(committed offset, its metadata)`.
pub type GroupOffsets = BTreeMap<(String, i32), (i64, String)>;

/// Whether batch `batch`'s transaction committed, from what the consumer
/// group holds: `committed` maps a partition to its committed offset and
/// metadata (read with stable offsets after `init_transactions`), `ends`
/// the batch's planned end of each of its partitions. `Ok(true)` when
/// every partition holds the batch's end with the batch's
/// [`batch_marker`] (or with no metadata: a broker that does not keep
/// the metadata of offsets committed in a transaction, nisshi 0.7.0),
/// `Ok(false)` when none does (the transaction was aborted or never
/// committed: the batch runs again).
///
/// Without metadata the answer rests on the offsets alone: the group
/// holds a batch's start until its transaction commits its end (ranges
/// are never empty). That fails only after a reset moved the checkpoint
/// back below offsets the group still holds from before it, where a
/// batch's end can equal such an offset.
///
/// # Errors
/// A description when only some partitions hold the batch's position, or
/// one holds the marker of this batch at another offset or of a later
/// batch: a transaction commits all of its offsets or none, so the group
/// was written by something else.
pub fn transaction_committed(
    query_id: &str,
    batch: u64,
    ends: &BTreeMap<(String, i32), i64>,
    committed: &GroupOffsets,
) -> Result<bool, String> {
    let mut done = Vec::new();
    let mut not_done = Vec::new();
    for (tp, end) in ends {
        let name = format!("{}/{}", tp.0, tp.1);
        let Some((offset, metadata)) = committed.get(tp) else {
            not_done.push(name);
            continue;
        };
        let marked = marked_batch(metadata, query_id);
        if offset == end && (metadata.is_empty() || marked == Some(batch)) {
            done.push(name);
        } else if let Some(b) = marked.filter(|b| *b >= batch) {
            return Err(format!(
                "{name} holds offset {offset} with the metadata of batch {b}, but batch {batch} planned it up to {end}"
            ));
        } else {
            not_done.push(name);
        }
    }
    match (done.is_empty(), not_done.is_empty()) {
        (false, true) => Ok(true),
        (true, _) => Ok(false),
        (false, false) => Err(format!(
            "{} hold batch {batch}'s committed position but {} do not",
            done.join(", "),
            not_done.join(", ")
        )),
    }
}

/// Errors of the Kafka output.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The producer could not be made (an invalid property, say).
    #[error("output producer for {topic} on {brokers}: {message}")]
    Client {
        /// The output topic.
        topic: String,
        /// The output cluster.
        brokers: String,
        /// librdkafka's message.
        message: String,
    },
    /// The output topic is not on the output cluster.
    #[error(
        "output topic {topic} does not exist on {brokers}: create it (e.g. `kafka-topics --create --topic {topic} --partitions N`), or give another --output-topic"
    )]
    NoTopic {
        /// The output topic.
        topic: String,
        /// The output cluster.
        brokers: String,
    },
    /// The output cluster does not let this producer use transactions.
    #[error(
        "exactly once to {topic} on {brokers} needs Kafka transactions, which the brokers refuse ({message}). Let this client's principal write transactional ids with the prefix `sluice-` (an ACL on TransactionalId, and IdempotentWrite on the cluster), use a broker that supports transactions (Kafka 2.5 or later for the offsets in the transaction), or pass --output-guarantee at-least-once (an idempotent producer; each output carries its idempotency key in the `{header}` header so consumers can drop duplicates)",
        header = IDEMPOTENCY_KEY_HEADER
    )]
    NoTransactions {
        /// The output topic.
        topic: String,
        /// The output cluster.
        brokers: String,
        /// librdkafka's message.
        message: String,
    },
    /// The output cluster accepts transactions but lacks what exactly
    /// once rests on (keeping offsets committed in a transaction, fencing
    /// old producers): found by the probe at start
    /// ([`KafkaOutput::probe_exactly_once`]).
    #[error(
        "exactly once to {topic} on {brokers} is refused: a probe transaction at start showed that the brokers do not do what it rests on: {lacks}. Use brokers that do (Apache Kafka 2.5 or later; librdkafka's mock cluster does not keep offsets committed in a transaction), or pass --output-guarantee at-least-once (an idempotent producer; each output carries its idempotency key in the `{header}` header so consumers can drop duplicates)",
        header = IDEMPOTENCY_KEY_HEADER
    )]
    NotExactlyOnce {
        /// The output topics.
        topic: String,
        /// The output cluster.
        brokers: String,
        /// What the probe found missing.
        lacks: String,
    },
    /// A batch's transaction could not be committed: it is aborted (or
    /// left to the next producer of the pipeline to abort), and the
    /// checkpoint does not record the batch as done.
    #[error(
        "the transaction of batch {batch} to {topic} on {brokers} did not commit: {message}. The checkpoint does not record the batch (in a pipeline group: the part) as done; the next start (the partition's next claim) asks the brokers whether the transaction committed and runs it again if it did not, so each output is visible once to read_committed consumers"
    )]
    Transaction {
        /// The batch.
        batch: u64,
        /// The output topic.
        topic: String,
        /// The output cluster.
        brokers: String,
        /// What failed.
        message: String,
    },
    /// The brokers refused or never acknowledged an output; nothing after
    /// it is recorded as done, so a re-run produces it again.
    #[error(
        "producing to {topic} on {brokers} failed: {message}; the batch is not committed and its re-run produces its outputs again. Check that the brokers are up, that this client may write the topic (ACLs), that enough replicas are in sync for acks=all (min.insync.replicas) and the record size limits (message.max.bytes); a slow cluster may need a longer --kafka-timeout (it is also the producer's message.timeout.ms)"
    )]
    Delivery {
        /// The output topic.
        topic: String,
        /// The output cluster.
        brokers: String,
        /// What failed, with the input record's idempotency key.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ends(v: &[(&str, i32, i64)]) -> BTreeMap<(String, i32), i64> {
        v.iter()
            .map(|(t, p, e)| ((t.to_string(), *p), *e))
            .collect()
    }

    fn held(v: &[(&str, i32, i64, &str)]) -> BTreeMap<(String, i32), (i64, String)> {
        v.iter()
            .map(|(t, p, o, m)| ((t.to_string(), *p), (*o, m.to_string())))
            .collect()
    }

    #[test]
    fn a_rerun_may_name_more_topics_on_the_same_cluster_and_guarantee() {
        let cfg = |topics: &[&str], guarantee| OutputConfig {
            topics: topics.iter().map(|t| t.to_string()).collect(),
            brokers: None,
            kafka: BTreeMap::new(),
            guarantee,
            reprocess: false,
        };
        let eo = OutputGuarantee::ExactlyOnce;
        let recorded = cfg(&["b", "a"], eo).identity("k:9092");
        assert_eq!(recorded, "a, b on k:9092 (exactly-once)");
        assert!(cfg(&["a", "b"], eo).covers(&recorded, "k:9092"));
        assert!(cfg(&["c", "b", "a"], eo).covers(&recorded, "k:9092"));
        assert!(!cfg(&["a"], eo).covers(&recorded, "k:9092"), "b missing");
        assert!(!cfg(&["a", "b"], eo).covers(&recorded, "other:9092"));
        let alo = OutputGuarantee::AtLeastOnce;
        assert!(!cfg(&["a", "b"], alo).covers(&recorded, "k:9092"));
        assert!(!cfg(&["a", "b"], eo).covers("garbage", "k:9092"));
    }

    #[test]
    fn a_marker_names_its_pipeline_and_batch() {
        let m = batch_marker("q-1", 42);
        assert_eq!(marked_batch(&m, "q-1"), Some(42));
        assert_eq!(marked_batch(&m, "q"), None, "another pipeline's");
        assert_eq!(marked_batch(&m, "q-12"), None);
        assert_eq!(marked_batch("", "q-1"), None);
        assert_eq!(marked_batch("sluice:q-1:batch:x", "q-1"), None);
        assert_eq!(transactional_id("q-1"), "sluice-q-1");
        assert_eq!(
            partition_transactional_id("g:1", "in.x", 3),
            "sluice-g:1:in.x:3"
        );
    }

    #[test]
    fn a_batch_committed_when_every_partition_holds_its_end_and_marker() {
        let planned = ends(&[("in", 0, 200), ("in", 1, 150)]);
        let m7 = batch_marker("q", 7);
        let m6 = batch_marker("q", 6);
        // Committed: both partitions hold batch 7's ends and marker.
        let both = held(&[("in", 0, 200, &m7), ("in", 1, 150, &m7)]);
        assert_eq!(transaction_committed("q", 7, &planned, &both), Ok(true));
        // Not committed: the previous batch's positions, or none at all.
        let before = held(&[("in", 0, 100, &m6), ("in", 1, 90, &m6)]);
        assert_eq!(transaction_committed("q", 7, &planned, &before), Ok(false));
        assert_eq!(
            transaction_committed("q", 7, &planned, &BTreeMap::new()),
            Ok(false)
        );
        // A broker that drops the metadata: the offsets decide.
        let plain = held(&[("in", 0, 200, ""), ("in", 1, 150, "")]);
        assert_eq!(transaction_committed("q", 7, &planned, &plain), Ok(true));
        let plain = held(&[("in", 0, 100, ""), ("in", 1, 90, "")]);
        assert_eq!(transaction_committed("q", 7, &planned, &plain), Ok(false));
        // An earlier batch's marker at the end offset (a reset moved the
        // checkpoint back) is not this batch's.
        let earlier = held(&[("in", 0, 200, &m6), ("in", 1, 150, &m6)]);
        assert_eq!(transaction_committed("q", 7, &planned, &earlier), Ok(false));
        // Half of a transaction cannot be: refused, naming both sides.
        let half = held(&[("in", 0, 200, &m7), ("in", 1, 90, &m6)]);
        let e = transaction_committed("q", 7, &planned, &half).unwrap_err();
        assert!(e.contains("in/0") && e.contains("in/1"), "{e}");
        // The marker at another offset, or a later batch's, is refused.
        let moved = held(&[("in", 0, 201, &m7), ("in", 1, 150, &m7)]);
        assert!(transaction_committed("q", 7, &planned, &moved).is_err());
        let later = held(&[("in", 0, 300, &batch_marker("q", 8)), ("in", 1, 150, &m7)]);
        assert!(transaction_committed("q", 7, &planned, &later).is_err());
    }
}
