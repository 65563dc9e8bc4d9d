//! The Kafka reader: partition discovery, watermarks and fetching exact
//! offset ranges (rdkafka with its bundled librdkafka).
//!
//! Invariants:
//! - Partitions are assigned manually (`assign`): the checkpoint owns the
//!   offsets, and the `group.id` is used only for informational commits.
//!   The exception is a pipeline group's member ([`KafkaSource::member`],
//!   `group`): the group coordinator assigns, each partition is claimed
//!   before it is read, and ranges are positioned with `seek`.
//! - `isolation.level=read_committed`; `auto.offset.reset=error`, so a
//!   planned offset that no longer exists is an error, never a silent jump.
//! - [`KafkaSource::fetch`] delivers exactly the records of each planned
//!   `[start, end)` that are in the log (compaction gaps and control records
//!   are absent, which is not loss); records read past `end` are kept for
//!   the next batch, so consecutive batches do not re-fetch.
//!
//! Files: this one holds the vocabulary ([`SourceRecord`],
//! [`PartitionRange`], [`SourceError`]) and the client's construction;
//! `metadata` asks brokers for partitions, identities and watermarks,
//! `fetch` reads ranges, `describe` is the FFI call behind topic ids,
//! `group` answers the group coordinator's rebalances, `headers` reads a
//! record's headers (names that are not UTF-8 included).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicI32;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::Message;
use sluice_guest::wire::{OwnedHeaders, Record, TimestampType, header_views};

mod brokers;
mod client_log;
mod describe;
mod fetch;
pub mod group;
mod headers;
mod metadata;
mod pause;
mod pieces;

pub use brokers::check_brokers;
pub use group::{AssignmentChanges, Membership, START_EARLIEST, START_LATEST, SourceContext};
pub use pieces::{Handoff, Piece};

/// A (topic, partition) pair.
pub type TopicPartition = (String, i32);

/// A topic as the broker describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    /// KIP-516 topic id in Kafka's base64 form; `None` when the broker
    /// returns none (Kafka before 2.8).
    pub id: Option<String>,
    /// Partition ids, sorted, never empty.
    pub partitions: Vec<i32>,
}

/// One record as read from Kafka, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRecord {
    /// Offset in its partition.
    pub offset: i64,
    /// Milliseconds since the Unix epoch (0 when not available; see
    /// [`timestamp`]).
    pub timestamp: i64,
    /// How the timestamp was set.
    pub timestamp_type: TimestampType,
    /// Key (`None` = null key).
    pub key: Option<Vec<u8>>,
    /// Value (`None` = tombstone).
    pub value: Option<Vec<u8>>,
    /// Headers in order.
    pub headers: OwnedHeaders,
}

impl SourceRecord {
    /// The record as the plugin contract sees it (borrowed), at
    /// `topic`/`partition`.
    pub fn view<'a>(&'a self, topic: &'a str, partition: i32) -> Record<'a> {
        self.view_with(
            topic,
            partition,
            self.key.as_deref(),
            self.value.as_deref(),
            &self.headers,
        )
    }

    /// This record's coordinates and timestamp with other content (a map
    /// stage's output, which keeps its source's coordinates).
    pub fn view_with<'a>(
        &self,
        topic: &'a str,
        partition: i32,
        key: Option<&'a [u8]>,
        value: Option<&'a [u8]>,
        headers: &'a OwnedHeaders,
    ) -> Record<'a> {
        Record {
            topic,
            partition,
            offset: self.offset,
            timestamp: self.timestamp,
            timestamp_type: self.timestamp_type,
            key,
            value,
            headers: header_views(headers),
        }
    }
}

/// `[start, end)` of one topic-partition: what a batch plans, the reader
/// fetches and the checkpoint records (serialized as
/// `{"topic":…,"partition":…,"start":…,"end":…}` in write-ahead entries).
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct PartitionRange {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// First offset (inclusive).
    pub start: i64,
    /// End offset (exclusive); `start == end` means nothing to read.
    pub end: i64,
}

/// Errors of the Kafka reader.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The client could not be created (bad property, …).
    #[error("kafka client: {0}")]
    Client(String),
    /// A subscribed topic does not exist.
    #[error(
        "topic `{topic}` does not exist on {brokers} (create it first; Sluice never auto-creates topics)"
    )]
    UnknownTopic {
        /// Topic.
        topic: String,
        /// Bootstrap servers.
        brokers: String,
    },
    /// The brokers did not answer in time.
    #[error("kafka brokers {brokers} unavailable: {what} did not succeed within {} s (last error: {last}); is the broker running and reachable?", .waited.as_secs())]
    Unavailable {
        /// Bootstrap servers.
        brokers: String,
        /// The operation.
        what: String,
        /// How long we tried.
        waited: Duration,
        /// The last error seen.
        last: String,
    },
    /// The broker answers and holds records past the position, but none
    /// arrived: typically a record larger than the consumer's fetch limits.
    #[error(
        "fetch stalled on {stalled}: the broker answers and holds records there, but none arrived within {} s (last error: {last}). A record larger than the consumer's fetch limits stalls a partition on brokers that do not send an oversized first record anyway: raise them with --config kafka.max.partition.fetch.bytes=BYTES, kafka.fetch.max.bytes=BYTES and kafka.receive.message.max.bytes=BYTES (now {limits}); the broker's own message.max.bytes bounds what it stores", .waited.as_secs())]
    FetchStalled {
        /// `topic/partition at offset P (high watermark H)`, comma-separated.
        stalled: String,
        /// How long we waited.
        waited: Duration,
        /// The last consumer error seen.
        last: String,
        /// The fetch limits in force.
        limits: String,
    },
    /// The broker answers, but a partition's log now ends below the end of
    /// the range planned from its earlier high watermark: the topic was
    /// deleted and created again, or the log was truncated (an unclean
    /// leader election). The engine checks the topic's identity to tell
    /// which.
    #[error(
        "the log ends below the planned range on {shrunk}: no record arrived within {} s, and a high watermark does not go back on a live log. The topic was deleted and created again, or its log was truncated (an unclean leader election); nothing of the range was committed. Check the topic, then reset the checkpoint to the offsets to read with `host checkpoint reset`", .waited.as_secs()
    )]
    LogShrunk {
        /// `topic/partition planned up to E, high watermark now H`,
        /// comma-separated.
        shrunk: String,
        /// How long we waited for records.
        waited: Duration,
    },
    /// The receiver of a fetch stopped taking records (it failed).
    #[error("fetch cancelled: the batch stopped before every record was read")]
    Cancelled,
    /// Offsets planned for reading were deleted from the log.
    #[error(
        "offsets out of range on {topic}/{partition}: the planned range [{start}, {end}) is no longer in the log (log start offset {log_start}); retention deleted it before it was read"
    )]
    OutOfRange {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Planned start.
        start: i64,
        /// Planned end.
        end: i64,
        /// Current log start offset.
        log_start: i64,
    },
}

/// How long a broker's "unknown topic" answer is retried before the topic
/// is reported missing (shorter than the broker timeout, which is for
/// brokers that do not answer).
const UNKNOWN_TOPIC_PATIENCE: Duration = Duration::from_secs(5);

/// A consumer that reads exact ranges.
pub struct KafkaSource {
    consumer: BaseConsumer<SourceContext>,
    /// Client for metadata and ListOffsets only (see [`KafkaSource::new`]).
    meta: Arc<BaseConsumer<SourceContext>>,
    /// The metadata client's background connect was started.
    meta_warm: bool,
    brokers: String,
    timeout: Duration,
    /// Partitions currently assigned, with the next offset the consumer
    /// will deliver after what we have taken or buffered.
    assigned: BTreeMap<TopicPartition, i64>,
    /// Records read past the end of the previous batch.
    pending: HashMap<TopicPartition, VecDeque<SourceRecord>>,
    commit_group: bool,
    /// The fetch size limits in force, for messages.
    fetch_limits: String,
    /// Broker that answers DescribeTopics ([`NO_BROKER`]: ask Metadata).
    describe_via: AtomicI32,
    /// The assigned partitions are paused ([`KafkaSource::pause`]).
    paused: bool,
    /// Partitions paused during a fetch because they had read about a
    /// range's worth past their range (see `KafkaSource::keep_read_ahead`);
    /// resumed by the next fetch (or a reset), forgotten when a rebalance
    /// revokes or assigns them (their pause state is set there).
    paused_ahead: HashSet<TopicPartition>,
    /// A group member's assignment changes not yet taken by
    /// [`KafkaSource::sync_group`].
    group_changes: AssignmentChanges,
    /// Partitions a rebalance took during the current fetch: dropped
    /// from it, even if assigned again meanwhile (their records from then
    /// on belong to the new assignment).
    fetch_dropped: HashSet<TopicPartition>,
    /// Connection failures the clients reported.
    errors: Arc<client_log::ClientErrors>,
}

/// Serve the metadata client's events (its log lines and client errors:
/// rust-rdkafka queues them, `log.queue=true`, until the client is polled)
/// every 200 ms on a thread of its own, for as long as the client lives,
/// so that a connection failure is reported when it happens
/// ([`client_log`]), not when the client is dropped. The client has no
/// assignment: a poll returns no record.
fn serve_events(meta: &Arc<BaseConsumer<SourceContext>>) {
    let weak = Arc::downgrade(meta);
    let spawned = std::thread::Builder::new()
        .name("sluice-meta-events".into())
        .spawn(move || {
            while let Some(meta) = weak.upgrade() {
                let _ = meta.poll(Duration::from_millis(200));
            }
        });
    if let Err(e) = spawned {
        tracing::debug!("metadata client event thread: {e}");
    }
}

/// [`KafkaSource::describe_via`] before a broker is known.
const NO_BROKER: i32 = i32::MIN;

/// True for a librdkafka property whose value is a secret
/// (`sasl.password`, `ssl.key.password`, `sasl.oauthbearer.client.secret`,
/// …): messages show it as `***`.
pub fn is_secret_property(name: &str) -> bool {
    ["password", "secret", "token"]
        .iter()
        .any(|w| name.contains(w))
}

/// `message` with the values of the secret `properties` replaced by `***`
/// (librdkafka repeats a rejected value in its error text).
fn hide_secrets(message: String, properties: &BTreeMap<String, String>) -> String {
    properties
        .iter()
        .filter(|(k, v)| is_secret_property(k) && !v.is_empty())
        .fold(message, |m, (_, v)| m.replace(v.as_str(), "***"))
}

/// The one rule for a record's timestamp, for `host run` and `host test`
/// alike: a negative timestamp (Kafka's `-1`, "no timestamp", KIP-32) or
/// the `not-available` type is `(0, not-available)`, as the WIT contract
/// documents; anything else passes unchanged.
pub fn timestamp(ms: i64, kind: TimestampType) -> (i64, TimestampType) {
    if ms < 0 || kind == TimestampType::NotAvailable {
        (0, TimestampType::NotAvailable)
    } else {
        (ms, kind)
    }
}

fn to_record(m: &rdkafka::message::BorrowedMessage<'_>) -> SourceRecord {
    let (timestamp, timestamp_type) = match m.timestamp() {
        rdkafka::Timestamp::NotAvailable => timestamp(-1, TimestampType::NotAvailable),
        rdkafka::Timestamp::CreateTime(t) => timestamp(t, TimestampType::CreateTime),
        rdkafka::Timestamp::LogAppendTime(t) => timestamp(t, TimestampType::LogAppendTime),
    };
    let headers = headers::record_headers(m);
    SourceRecord {
        offset: m.offset(),
        timestamp,
        timestamp_type,
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers,
    }
}

/// Log target of rust-rdkafka's consumer module. Its `Drop` reports an
/// error when the consumer was already closed (by [`KafkaSource`]'s own
/// `Drop`, below); the CLI drops that one message from this target.
pub const CONSUMER_LOG_TARGET: &str = "rdkafka::consumer::base_consumer";

impl Drop for KafkaSource {
    /// Close the consumer before rust-rdkafka's `Drop` does: that one polls
    /// in 100 ms steps until librdkafka reports the close done, which adds
    /// up to 100 ms to every exit (seen with strace). Polling in 1 ms steps
    /// ends as soon as it is done (pending informational group commits are
    /// still flushed by the close). If it is not done within the broker
    /// timeout, the crate's `Drop` takes over and waits as it always did.
    fn drop(&mut self) {
        if self.consumer.close_queue().is_err() {
            return;
        }
        let started = Instant::now();
        while !self.consumer.closed() && started.elapsed() < self.timeout {
            let _ = self.consumer.poll(Duration::from_millis(1));
        }
    }
}

impl KafkaSource {
    /// A reader for `brokers` using `group_id` (committed to only when
    /// `commit_group`), with extra librdkafka `properties` (they
    /// override the defaults below, except the ones the guarantees rest on:
    /// `enable.auto.commit`, `enable.auto.offset.store`, `auto.offset.reset`
    /// and `isolation.level`). `timeout` bounds every broker operation.
    ///
    /// # Errors
    /// [`SourceError::Client`] for an invalid property.
    pub fn new(
        brokers: &str,
        properties: &BTreeMap<String, String>,
        group_id: &str,
        commit_group: bool,
        timeout: Duration,
    ) -> Result<Self, SourceError> {
        Self::with_context(
            brokers,
            properties,
            group_id,
            commit_group,
            timeout,
            SourceContext::default(),
        )
    }

    /// A member of consumer group `group` subscribed to `topics`, whose
    /// assignment changes go through `membership` ([`group`]): the
    /// classic protocol with `partition.assignment.strategy` set to
    /// `cooperative-sticky` (a `--config kafka.partition.assignment.strategy`
    /// overrides it), or KIP-848's consumer protocol when `properties`
    /// set `group.protocol=consumer` (Kafka 4.0 and later; the brokers
    /// assign and time sessions out, so no strategy is set). Offsets are
    /// committed to the group only when `commit_group`. Rebalances happen
    /// inside the reads.
    ///
    /// # Errors
    /// [`SourceError::Client`] for an invalid property or a failed
    /// subscription.
    pub fn member(
        brokers: &str,
        properties: &BTreeMap<String, String>,
        group: &str,
        topics: &[String],
        membership: Arc<dyn Membership>,
        commit_group: bool,
        timeout: Duration,
    ) -> Result<Self, SourceError> {
        let consumer_protocol = properties
            .get("group.protocol")
            .is_some_and(|p| p.eq_ignore_ascii_case("consumer"));
        let mut props = BTreeMap::new();
        if !consumer_protocol {
            props.insert(
                "partition.assignment.strategy".to_string(),
                "cooperative-sticky".to_string(),
            );
        }
        props.extend(properties.iter().map(|(k, v)| (k.clone(), v.clone())));
        let source = Self::with_context(
            brokers,
            &props,
            group,
            commit_group,
            timeout,
            SourceContext::member(membership),
        )?;
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        rdkafka::consumer::Consumer::subscribe(&source.consumer, &names)
            .map_err(|e| SourceError::Client(format!("subscribe to {}: {e}", topics.join(", "))))?;
        Ok(source)
    }

    /// Take the group's assignment changes since the last call and apply
    /// them to the read positions: a newly assigned partition reads from
    /// its claimed start, a revoked one is forgotten with what was
    /// buffered of it. Nothing for a source that is not a group member.
    pub fn sync_group(&mut self) -> AssignmentChanges {
        self.absorb_group_changes();
        std::mem::take(&mut self.group_changes)
    }

    /// Apply the rebalances that ran in the last poll to the read
    /// positions (before a record that poll returned is kept: it belongs
    /// to the new assignment), and keep them for [`KafkaSource::sync_group`].
    fn absorb_group_changes(&mut self) {
        let c = self.context().take_changes();
        if c == AssignmentChanges::default() {
            return;
        }
        for tp in &c.revoked {
            self.assigned.remove(tp);
            self.pending.remove(tp);
            self.paused_ahead.remove(tp);
            self.group_changes.assigned.remove(tp);
            self.group_changes.revoked.push(tp.clone());
        }
        let mut again = rdkafka::TopicPartitionList::new();
        for (tp, start) in &c.assigned {
            self.assigned.insert(tp.clone(), *start);
            self.pending.remove(tp);
            self.paused_ahead.remove(tp);
            self.group_changes.assigned.insert(tp.clone(), *start);
            again.add_partition(&tp.0, tp.1);
        }
        self.group_changes.failed.extend(c.failed);
        // librdkafka keeps a partition's pause flag across a revoke and a
        // new assignment of it: give a newly assigned partition the state
        // of the others, or one paused before a revoke never fetches again.
        if again.count() > 0 {
            use rdkafka::consumer::Consumer as _;
            let r = if self.paused {
                self.consumer.pause(&again)
            } else {
                self.consumer.resume(&again)
            };
            if let Err(e) = r {
                tracing::warn!("pause state of newly assigned partitions: {e}");
            }
        }
    }

    /// The consumer's context (the group assignment, for a member).
    pub fn context(&self) -> &SourceContext {
        rdkafka::consumer::Consumer::context(&self.consumer)
    }

    /// Records read ahead and kept for the next fetch (see
    /// [`KafkaSource::serve`]).
    pub fn pending_records(&self) -> usize {
        self.pending.values().map(VecDeque::len).sum()
    }

    /// Serve the consumer for up to `timeout` without fetching a batch:
    /// rebalances and group heartbeats happen here; records that arrive
    /// are kept for the next fetch.
    pub fn serve(&mut self, timeout: Duration) {
        let polled = match self.consumer.poll(timeout) {
            Some(Ok(m)) => Some(((m.topic().to_string(), m.partition()), to_record(&m))),
            _ => None,
        };
        self.absorb_group_changes();
        if let Some((tp, rec)) = polled {
            self.pending.entry(tp).or_default().push_back(rec);
        }
    }

    fn with_context(
        brokers: &str,
        properties: &BTreeMap<String, String>,
        group_id: &str,
        commit_group: bool,
        timeout: Duration,
        context: SourceContext,
    ) -> Result<Self, SourceError> {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", brokers)
            .set("client.id", "sluice")
            .set("fetch.wait.max.ms", "100")
            .set("topic.metadata.refresh.interval.ms", "10000")
            .set("socket.keepalive.enable", "true")
            // librdkafka holds back a new cluster connection for half the
            // reconnect backoff (at least 11 ms) after the last one, and
            // the consumer's coordinator query starts one at creation: the
            // first metadata request then waited ~50 ms in about a third of
            // starts on the mock cluster, and ~60 ms on every start on
            // Tansu. With 10 ms the wait is at most ~13 ms. Reconnects to a
            // down broker still back off exponentially (up to
            // reconnect.backoff.max.ms, 10 s by default).
            .set("reconnect.backoff.ms", "10")
            // When the local queue passes `queued.max.messages.kbytes`,
            // librdkafka stops fetching and, by default, waits 1 s
            // (`fetch.queue.backoff.ms`) before fetching again, although
            // the host drains the queue in milliseconds: 400,000 events on
            // 48 partitions took 2.4 s instead of 0.55 s (docs/benchmarks.md,
            // session 11). A smaller queue (librdkafka's default is 64 MiB)
            // halved peak RSS there and read as fast.
            .set("fetch.queue.backoff.ms", "10")
            .set("queued.max.messages.kbytes", "8192");
        for (k, v) in properties {
            cfg.set(k, v);
        }
        cfg.set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "false");
        // Metadata and ListOffsets (watermarks, timestamp lookups) go over a
        // client of their own: on the fetching client's connection they wait
        // behind in-flight Fetch requests, which the broker answers in order
        // (measured on Tansu: planning took ~700 ms instead of ~60 ms while
        // the consumer was prefetching). Same settings, so the same
        // read_committed answers; no group.id, so it never closes a group.
        let errors = Arc::new(client_log::ClientErrors::default());
        let mut meta_cfg = cfg.clone();
        meta_cfg.set("client.id", "sluice-meta");
        let meta: Arc<BaseConsumer<SourceContext>> = Arc::new(
            meta_cfg
                .create_with_context(SourceContext::default().with_errors(errors.clone()))
                .map_err(|e| SourceError::Client(hide_secrets(e.to_string(), properties)))?,
        );

        serve_events(&meta);

        // librdkafka needs a group.id even for manual assignment; without
        // `subscribe` the consumer never joins the group.
        cfg.set("group.id", group_id);
        let consumer: BaseConsumer<SourceContext> = cfg
            .create_with_context(context.with_errors(errors.clone()))
            .map_err(|e| SourceError::Client(hide_secrets(e.to_string(), properties)))?;
        // librdkafka's defaults (CONFIGURATION.md of librdkafka 2.12).
        let fetch_limits = [
            ("max.partition.fetch.bytes", "1048576"),
            ("fetch.max.bytes", "52428800"),
            ("receive.message.max.bytes", "100000000"),
        ]
        .iter()
        .map(|(k, default)| {
            let v = cfg
                .get(k)
                .or_else(|| {
                    (*k == "max.partition.fetch.bytes")
                        .then(|| cfg.get("fetch.message.max.bytes"))
                        .flatten()
                })
                .unwrap_or(default);
            format!("{k}={v}")
        })
        .collect::<Vec<_>>()
        .join(", ");
        Ok(KafkaSource {
            consumer,
            meta,
            meta_warm: false,
            brokers: brokers.to_string(),
            timeout,
            assigned: BTreeMap::new(),
            pending: HashMap::new(),
            commit_group,
            fetch_limits,
            describe_via: AtomicI32::new(NO_BROKER),
            paused: false,
            paused_ahead: HashSet::new(),
            group_changes: AssignmentChanges::default(),
            fetch_dropped: HashSet::new(),
            errors,
        })
    }

    /// The client for metadata and ListOffsets requests. Before the first
    /// fetch the consumer is idle, and asking it warms its metadata cache
    /// and connections, so its first fetch starts at once (measured on the
    /// mock cluster: the first plan and fetch took ~50 ms and ~37 ms longer
    /// through the metadata client alone). Once it fetches, the metadata
    /// client answers, so requests do not queue behind Fetch requests.
    fn admin(&self) -> &BaseConsumer<SourceContext> {
        if self.assigned.is_empty() {
            &self.consumer
        } else {
            &self.meta
        }
    }

    fn unavailable(&self, what: String, waited: Duration, last: String) -> SourceError {
        SourceError::Unavailable {
            brokers: self.brokers.clone(),
            what,
            waited,
            last: self.errors.cause(&last),
        }
    }

    /// Retry `f` with backoff until it succeeds or the timeout passes.
    fn retry<T, E: std::fmt::Display>(
        &self,
        what: impl Fn() -> String,
        mut f: impl FnMut() -> Result<T, E>,
    ) -> Result<T, SourceError> {
        let started = Instant::now();
        let mut delay = Duration::from_millis(100);
        loop {
            match f() {
                Ok(v) => {
                    self.errors.recovered();
                    return Ok(v);
                }
                Err(e) => {
                    if started.elapsed() >= self.timeout {
                        return Err(self.unavailable(what(), started.elapsed(), e.to_string()));
                    }
                    tracing::debug!("{}: {e}; retrying", what());
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_property_values_are_hidden_in_client_errors() {
        let props = BTreeMap::from([
            ("ssl.key.password".to_string(), "keypw".to_string()),
            ("client.id".to_string(), "keypw-client".to_string()),
        ]);
        let m = hide_secrets(
            "not supported in this build: ssl.key.password keypw".into(),
            &props,
        );
        assert_eq!(m, "not supported in this build: ssl.key.password ***");
        assert!(is_secret_property("sasl.oauthbearer.client.secret"));
        assert!(!is_secret_property("fetch.max.bytes"));
        assert_eq!(
            timestamp(-1, TimestampType::CreateTime),
            (0, TimestampType::NotAvailable)
        );
        assert_eq!(
            timestamp(5, TimestampType::LogAppendTime),
            (5, TimestampType::LogAppendTime)
        );
    }
}
