//! The Kafka reader: partition discovery, watermarks and fetching exact
//! offset ranges (rdkafka with its bundled librdkafka).
//!
//! Invariants:
//! - Partitions are assigned manually (`assign`), never through consumer
//!   group balancing: the checkpoint owns the offsets. A `group.id` is set
//!   only when the user asks for informational group commits.
//! - `isolation.level=read_committed`; `auto.offset.reset=error`, so a
//!   planned offset that no longer exists is an error, never a silent jump.
//! - [`KafkaSource::fetch`] delivers exactly the records of each planned
//!   `[start, end)` that are in the log (compaction gaps and control records
//!   are absent, which is not loss); records read past `end` are kept for
//!   the next batch, so consecutive batches do not re-fetch.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use sluice_guest::wire::{OwnedHeaders, Record, TimestampType, header_views};

mod describe;
use describe::Described;

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

/// Part of one planned range, delivered by [`KafkaSource::fetch`].
#[derive(Debug)]
pub struct Piece {
    /// Index of the range in the `ranges` given to `fetch`.
    pub range: usize,
    /// Records in offset order, following the range's previous piece.
    pub records: Vec<SourceRecord>,
    /// Set on the range's last piece: the whole range has been delivered.
    pub done: bool,
}

/// Per-range buffers of a fetch in progress.
struct Pieces<'a> {
    bufs: Vec<Vec<SourceRecord>>,
    size: usize,
    /// Set by the receiver when it stops taking pieces; checked every turn
    /// of the poll loop, so a failed batch does not wait for the fetch.
    cancel: &'a AtomicBool,
    deliver: &'a mut dyn FnMut(Piece) -> bool,
}

impl Pieces<'_> {
    fn send(&mut self, range: usize, done: bool) -> Result<(), SourceError> {
        let records = std::mem::take(&mut self.bufs[range]);
        if (self.deliver)(Piece {
            range,
            records,
            done,
        }) {
            Ok(())
        } else {
            Err(SourceError::Cancelled)
        }
    }

    fn push(&mut self, range: usize, rec: SourceRecord) -> Result<(), SourceError> {
        let buf = &mut self.bufs[range];
        if buf.capacity() == 0 {
            buf.reserve_exact(self.size);
        }
        buf.push(rec);
        if buf.len() >= self.size {
            self.send(range, false)?;
        }
        Ok(())
    }

    fn finish(&mut self, range: usize) -> Result<(), SourceError> {
        self.send(range, true)
    }
}

/// How long a broker's "unknown topic" answer is retried before the topic
/// is reported missing (shorter than the broker timeout, which is for
/// brokers that do not answer).
const UNKNOWN_TOPIC_PATIENCE: Duration = Duration::from_secs(5);

/// A consumer that reads exact ranges.
pub struct KafkaSource {
    consumer: BaseConsumer,
    /// Client for metadata and ListOffsets only (see [`KafkaSource::new`]).
    meta: Arc<BaseConsumer>,
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
    let headers = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default();
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
            .set("reconnect.backoff.ms", "10");
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
        let mut meta_cfg = cfg.clone();
        meta_cfg.set("client.id", "sluice-meta");
        let meta: Arc<BaseConsumer> = Arc::new(
            meta_cfg
                .create()
                .map_err(|e| SourceError::Client(hide_secrets(e.to_string(), properties)))?,
        );

        // librdkafka needs a group.id even for manual assignment; without
        // `subscribe` the consumer never joins the group.
        cfg.set("group.id", group_id);
        let consumer: BaseConsumer = cfg
            .create()
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
        })
    }

    /// The client for metadata and ListOffsets requests. Before the first
    /// fetch the consumer is idle, and asking it warms its metadata cache
    /// and connections, so its first fetch starts at once (measured on the
    /// mock cluster: the first plan and fetch took ~50 ms and ~37 ms longer
    /// through the metadata client alone). Once it fetches, the metadata
    /// client answers, so requests do not queue behind Fetch requests.
    fn admin(&self) -> &BaseConsumer {
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
            last,
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
                Ok(v) => return Ok(v),
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

    /// Make the consumer deliver each active range from its start: keep a
    /// partition's fetch position (and buffered records) when the range
    /// continues where the previous one ended, add new partitions
    /// incrementally, and re-assign everything otherwise.
    fn position_for(&mut self, ranges: &[PartitionRange]) -> Result<(), SourceError> {
        let mut add = TopicPartitionList::new();
        let mut reassign = false;
        for r in ranges {
            match self.assigned.get(&(r.topic.clone(), r.partition)) {
                Some(next) if *next == r.start => {}
                Some(_) => reassign = true,
                None => {
                    add.add_partition_offset(&r.topic, r.partition, Offset::Offset(r.start))
                        .map_err(|e| SourceError::Client(e.to_string()))?;
                }
            }
        }
        if reassign {
            let mut tpl = TopicPartitionList::new();
            let mut wanted: BTreeMap<TopicPartition, i64> = self.assigned.clone();
            for r in ranges {
                wanted.insert((r.topic.clone(), r.partition), r.start);
            }
            for ((t, p), o) in &wanted {
                tpl.add_partition_offset(t, *p, Offset::Offset(*o))
                    .map_err(|e| SourceError::Client(e.to_string()))?;
            }
            self.consumer
                .assign(&tpl)
                .map_err(|e| SourceError::Client(format!("assign: {e}")))?;
            self.pending.clear();
            self.assigned = wanted;
        } else if add.count() > 0 {
            self.consumer
                .incremental_assign(&add)
                .map_err(|e| SourceError::Client(format!("assign: {e}")))?;
            for r in ranges {
                self.assigned
                    .entry((r.topic.clone(), r.partition))
                    .or_insert(r.start);
            }
        }
        Ok(())
    }

    /// Stop fetching the assigned partitions until the next
    /// [`KafkaSource::fetch`]: for an idle pipeline, between batches.
    ///
    /// librdkafka 2.12.1 crashes (SIGSEGV in `rd_kafka_metadata_cache_find`
    /// from `rd_kafka_metadata_update_op`) when a Fetch answer carries
    /// KIP-951 leader tags for a topic with an all-zero topic id: it then
    /// looks the topic up by a name the answer does not have. Tansu 0.6.0
    /// answers a Fetch for a deleted topic's old id that way, so a topic
    /// deleted and recreated under a consumer that keeps fetching crashed
    /// the host in 5 of 6 tries. Fetching only while a batch reads ranges
    /// that the plan just checked against the broker's topic id (see
    /// `engine::plan`) leaves a recreation during that batch's fetch as
    /// the only window. Records buffered by librdkafka are dropped and
    /// fetched again from the next undelivered offset on resume, which
    /// is where `assigned` says the next range starts.
    pub fn pause(&mut self) {
        if self.paused || self.assigned.is_empty() {
            return;
        }
        if let Ok(tpl) = self.consumer.assignment()
            && self.consumer.pause(&tpl).is_ok()
        {
            self.paused = true;
        }
    }

    fn resume(&mut self) -> Result<(), SourceError> {
        if !self.paused {
            return Ok(());
        }
        let tpl = self
            .consumer
            .assignment()
            .map_err(|e| SourceError::Client(format!("assignment: {e}")))?;
        self.consumer
            .resume(&tpl)
            .map_err(|e| SourceError::Client(format!("resume: {e}")))?;
        self.paused = false;
        Ok(())
    }

    /// Forget the consumer's positions (after a failed fetch): the next
    /// fetch assigns from scratch.
    fn reset(&mut self) {
        let _ = self.resume();
        let _ = self.consumer.unassign();
        self.assigned.clear();
        self.pending.clear();
    }

    /// Read every record in `ranges` (empty ranges are skipped) and hand
    /// them to `deliver` in pieces of at most `piece_records` records as
    /// they arrive, so the caller can map one piece while the next is
    /// read. Pieces of one range come in offset order; the last piece of
    /// each non-empty range has `done` set (it may hold no records, e.g.
    /// when the range ends on a control record). Pieces of different ranges
    /// interleave.
    ///
    /// # Errors
    /// [`SourceError::OutOfRange`] when a range was deleted from the log;
    /// [`SourceError::Unavailable`] when the brokers do not deliver within
    /// the timeout; [`SourceError::Cancelled`] when `deliver` returned
    /// false or `cancel` was set. After an error the pieces delivered so far are incomplete and
    /// the next fetch starts from a fresh assignment.
    pub fn fetch(
        &mut self,
        ranges: &[PartitionRange],
        piece_records: usize,
        cancel: &AtomicBool,
        deliver: &mut dyn FnMut(Piece) -> bool,
    ) -> Result<(), SourceError> {
        let active: Vec<PartitionRange> =
            ranges.iter().filter(|r| r.end > r.start).cloned().collect();
        if active.is_empty() {
            return Ok(());
        }
        if !self.meta_warm {
            // The metadata client answers from the next plan on: connect it
            // (bootstrap, broker list) in the background while this batch
            // runs, rather than at start, where it would compete with the
            // consumer's own bootstrap.
            self.meta_warm = true;
            let warm = Arc::clone(&self.meta);
            let _ = std::thread::Builder::new()
                .name("sluice-meta-warm".into())
                .spawn(move || {
                    let _ = warm.fetch_metadata(None, Duration::from_secs(5));
                });
        }
        let mut pieces = Pieces {
            bufs: ranges.iter().map(|_| Vec::new()).collect(),
            size: piece_records.max(1),
            cancel,
            deliver,
        };
        let result = self.fetch_into(ranges, &active, &mut pieces);
        match result {
            Ok(()) => {
                for r in &active {
                    self.assigned.insert((r.topic.clone(), r.partition), r.end);
                }
                Ok(())
            }
            Err(e) => {
                self.reset();
                Err(e)
            }
        }
    }

    fn fetch_into(
        &mut self,
        ranges: &[PartitionRange],
        active: &[PartitionRange],
        pieces: &mut Pieces<'_>,
    ) -> Result<(), SourceError> {
        self.resume()?;
        self.position_for(active)?;
        let index: HashMap<TopicPartition, usize> = ranges
            .iter()
            .enumerate()
            .filter(|(_, r)| r.end > r.start)
            .map(|(i, r)| ((r.topic.clone(), r.partition), i))
            .collect();
        let mut remaining: HashMap<TopicPartition, i64> = HashMap::new();
        for r in active {
            let tp = (r.topic.clone(), r.partition);
            let i = index[&tp];
            let mut complete = false;
            if let Some(q) = self.pending.get_mut(&tp) {
                while let Some(rec) = q.pop_front() {
                    if rec.offset < r.start {
                        continue;
                    }
                    if rec.offset >= r.end {
                        // Records arrive in offset order: the range is done.
                        q.push_front(rec);
                        complete = true;
                        break;
                    }
                    complete = rec.offset == r.end - 1;
                    pieces.push(i, rec)?;
                }
            }
            if complete {
                pieces.finish(i)?;
            } else {
                remaining.insert(tp, r.end);
            }
        }
        self.poll_until_done(ranges, &index, &mut remaining, pieces)
    }

    fn poll_until_done(
        &mut self,
        ranges: &[PartitionRange],
        index: &HashMap<TopicPartition, usize>,
        remaining: &mut HashMap<TopicPartition, i64>,
        pieces: &mut Pieces<'_>,
    ) -> Result<(), SourceError> {
        // The timeout bounds the time without progress, not the fetch: a
        // long batch behind a slow sink is not a stalled broker.
        let mut started = Instant::now();
        let mut progressed = false;
        let mut last_error = String::from("no records delivered");
        let mut last_position_check = Instant::now();
        // Records arrive in runs from one partition: remember the last
        // partition's index so most records need no key allocation or hash.
        let mut last: Option<(TopicPartition, Option<usize>)> = None;
        // The clock is read after a poll that delivered no record (empty
        // or an error) and every CLOCK_EVERY turns, not for every record.
        const CLOCK_EVERY: u32 = 256;
        let mut since_clock = 0u32;
        while !remaining.is_empty() {
            if pieces.cancel.load(Ordering::Relaxed) {
                return Err(SourceError::Cancelled);
            }
            since_clock += 1;
            if since_clock >= CLOCK_EVERY {
                since_clock = 0;
                if progressed {
                    progressed = false;
                    started = Instant::now();
                }
                if started.elapsed() > self.timeout {
                    return Err(self.fetch_timed_out(remaining, started.elapsed(), last_error));
                }
                // Control records and compaction gaps leave no message at
                // the end of a range: the consumer position tells us we are
                // past it.
                if last_position_check.elapsed() > Duration::from_millis(200) {
                    last_position_check = Instant::now();
                    if let Ok(pos) = self.consumer.position() {
                        for e in pos.elements() {
                            if let Offset::Offset(o) = e.offset() {
                                let tp = (e.topic().to_string(), e.partition());
                                if remaining.get(&tp).is_some_and(|end| o >= *end) {
                                    remaining.remove(&tp);
                                    if let Some(i) = index.get(&tp) {
                                        pieces.finish(*i)?;
                                    }
                                }
                            }
                        }
                    }
                    continue;
                }
            }
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    progressed = true;
                    let offset = m.offset();
                    let i = match &last {
                        Some(((t, p), i)) if *p == m.partition() && t == m.topic() => *i,
                        _ => {
                            let tp = (m.topic().to_string(), m.partition());
                            let i = index.get(&tp).copied();
                            last = Some((tp, i));
                            i
                        }
                    };
                    let Some(i) = i else {
                        // Assigned but not planned this batch: keep for later.
                        let tp = (m.topic().to_string(), m.partition());
                        self.pending.entry(tp).or_default().push_back(to_record(&m));
                        continue;
                    };
                    let r = &ranges[i];
                    if offset < r.start {
                        continue;
                    }
                    if offset >= r.end {
                        self.pending
                            .entry((r.topic.clone(), r.partition))
                            .or_default()
                            .push_back(to_record(&m));
                    } else {
                        pieces.push(i, to_record(&m))?;
                    }
                    if offset >= r.end - 1
                        && remaining.remove(&(r.topic.clone(), r.partition)).is_some()
                    {
                        pieces.finish(i)?;
                    }
                }
                Some(Err(KafkaError::MessageConsumption(
                    RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange,
                ))) => {
                    return Err(self.out_of_range(ranges, remaining));
                }
                Some(Err(e)) => {
                    last_error = e.to_string();
                    tracing::debug!("kafka: {e}");
                    since_clock = CLOCK_EVERY;
                }
                None => {
                    // Idle: the clock checks run on the next turn.
                    since_clock = CLOCK_EVERY;
                }
            }
        }
        Ok(())
    }

    /// The error for a fetch that delivered nothing more within the
    /// timeout: [`SourceError::FetchStalled`] when the broker answers and
    /// its high watermark is past the consumer's position on some missing
    /// partition, [`SourceError::Unavailable`] otherwise.
    fn fetch_timed_out(
        &self,
        remaining: &HashMap<TopicPartition, i64>,
        waited: Duration,
        last: String,
    ) -> SourceError {
        let positions: HashMap<TopicPartition, i64> = self
            .consumer
            .position()
            .map(|tpl| {
                tpl.elements()
                    .iter()
                    .filter_map(|e| match e.offset() {
                        Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut missing: Vec<(&TopicPartition, &i64)> = remaining.iter().collect();
        missing.sort();
        let mut stalled = Vec::new();
        // A few quick questions at most: one stalled partition explains
        // the error, and a broker that does not answer them is the
        // "unavailable" case.
        let asked = Instant::now();
        for (tp, _) in &missing {
            if asked.elapsed() > Duration::from_secs(5) {
                break;
            }
            let Some(pos) = positions
                .get(*tp)
                .copied()
                .or_else(|| self.assigned.get(*tp).copied())
            else {
                continue;
            };
            if let Ok((_, high)) = self
                .meta
                .fetch_watermarks(&tp.0, tp.1, Duration::from_secs(2))
                && high > pos
            {
                stalled.push(format!(
                    "{}/{} at offset {pos} (high watermark {high})",
                    tp.0, tp.1
                ));
            }
        }
        if !stalled.is_empty() {
            return SourceError::FetchStalled {
                stalled: stalled.join(", "),
                waited,
                last,
                limits: self.fetch_limits.clone(),
            };
        }
        let what: Vec<String> = missing
            .iter()
            .map(|((t, p), end)| format!("{t}/{p} up to {end}"))
            .collect();
        self.unavailable(format!("fetching {}", what.join(", ")), waited, last)
    }

    fn out_of_range(
        &self,
        ranges: &[PartitionRange],
        remaining: &HashMap<TopicPartition, i64>,
    ) -> SourceError {
        for r in ranges {
            if !remaining.contains_key(&(r.topic.clone(), r.partition)) {
                continue;
            }
            if let Ok((low, _)) = self.watermarks(&r.topic, r.partition)
                && low > r.start
            {
                return SourceError::OutOfRange {
                    topic: r.topic.clone(),
                    partition: r.partition,
                    start: r.start,
                    end: r.end,
                    log_start: low,
                };
            }
        }
        SourceError::Client("offset out of range reported by the broker, but no planned range is below its log start".into())
    }

    /// Commit `positions` to the consumer group given at creation (for lag
    /// dashboards only; never read back). Does nothing without a group.
    pub fn commit_group(&self, positions: &BTreeMap<TopicPartition, i64>) {
        if !self.commit_group {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for ((t, p), o) in positions {
            if tpl.add_partition_offset(t, *p, Offset::Offset(*o)).is_err() {
                return;
            }
        }
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
            tracing::warn!("informational consumer-group commit failed: {e}");
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
