//! Output to Kafka (DESIGN.md, "Output to Kafka"): a pipeline's map
//! outputs written to a topic (`host run --output-topic NAME`).
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
//! duplicates. **Exactly once** through Kafka transactions is the default
//! of the CLI and comes in a later step; until then it is refused at start
//! with the flag that chooses at-least-once.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use serde::{Deserialize, Serialize};

use crate::plugin::chain::ChainOutput;

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
    /// The topic every output goes to (it must exist).
    pub topic: String,
    /// The output cluster's bootstrap servers (`None`: the input's).
    pub brokers: Option<String>,
    /// librdkafka properties of the producer (`--config
    /// output.kafka.<name>=v`, the file's `[output_kafka]` table). When
    /// the output cluster is the input's, the input's `kafka.*` settings
    /// apply first (its security settings, say) and these override them.
    pub kafka: BTreeMap<String, String>,
    /// At-least-once or exactly once.
    pub guarantee: OutputGuarantee,
}

impl OutputConfig {
    /// What a batch's re-run must produce to again: `topic on brokers
    /// (guarantee)`, the brokers being the input's when `brokers` is
    /// `None`. Recorded in each write-ahead entry.
    pub fn identity(&self, input_brokers: &str) -> String {
        format!(
            "{} on {} ({})",
            self.topic,
            self.brokers.as_deref().unwrap_or(input_brokers),
            self.guarantee.as_str()
        )
    }
}

/// Properties of the input's `kafka.*` settings that do not carry over
/// to the producer: they are a consumer's.
const CONSUMER_ONLY: &[&str] = &[
    "group.id",
    "group.instance.id",
    "isolation.level",
    "auto.offset.reset",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "fetch.wait.max.ms",
    "fetch.min.bytes",
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "fetch.message.max.bytes",
    "queued.min.messages",
    "queued.max.messages.kbytes",
    "fetch.queue.backoff.ms",
    "check.crcs",
];

/// Properties the guarantees rest on: set last, over any the user gave
/// (a missing output topic is an error at start, not one the broker
/// creates with its defaults on the first metadata read).
const FIXED: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("allow.auto.create.topics", "false"),
];

/// Properties a user may not set for the output producer: the host's
/// own (transactions are the host's, per pipeline).
const REFUSED: &[&str] = &["transactional.id"];

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

/// The producer's callbacks: keep the first failure.
#[derive(Default)]
struct Deliveries {
    first_error: Mutex<Option<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result {
            let key = m
                .headers()
                .and_then(|h| {
                    use rdkafka::message::Headers as _;
                    h.iter()
                        .find(|h| h.key == IDEMPOTENCY_KEY_HEADER)
                        .and_then(|h| h.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                })
                .map(|k| format!(" (the output of {k})"))
                .unwrap_or_default();
            if let Ok(mut first) = self.first_error.lock()
                && first.is_none()
            {
                *first = Some(format!("{e}{key}"));
            }
        }
    }
}

/// The producer of a pipeline's outputs.
pub struct KafkaOutput {
    producer: ThreadedProducer<Deliveries>,
    topic: String,
    brokers: String,
    guarantee: OutputGuarantee,
    /// Bound on waiting for the brokers (metadata, acknowledgements, a
    /// full local queue).
    timeout: Duration,
}

impl KafkaOutput {
    /// A producer for `cfg` whose topic was found on the output cluster
    /// (`cfg.brokers`, else `input_brokers` with the input's
    /// `input_kafka` settings under `cfg.kafka`). `timeout` bounds each
    /// wait on the brokers.
    ///
    /// # Errors
    /// [`OutputError::Client`] for a property librdkafka refuses or an
    /// unreachable cluster, [`OutputError::NoTopic`] when the topic is not
    /// there.
    pub fn connect(
        cfg: &OutputConfig,
        input_brokers: &str,
        input_kafka: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<Self, OutputError> {
        let brokers = cfg
            .brokers
            .clone()
            .unwrap_or_else(|| input_brokers.to_string());
        let client = |message: String| OutputError::Client {
            topic: cfg.topic.clone(),
            brokers: brokers.clone(),
            message,
        };
        let mut props = ClientConfig::new();
        props
            .set("bootstrap.servers", &brokers)
            .set("client.id", "sluice-output")
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "5")
            .set("reconnect.backoff.ms", "10")
            // librdkafka retries an output for 5 minutes by default; the
            // host waits as long as each Kafka operation may take.
            .set("message.timeout.ms", timeout.as_millis().to_string());
        if cfg.brokers.is_none() {
            for (k, v) in input_kafka {
                if !CONSUMER_ONLY.contains(&k.as_str()) {
                    props.set(k, v);
                }
            }
        }
        for (k, v) in &cfg.kafka {
            if REFUSED.contains(&k.as_str()) {
                return Err(client(format!(
                    "output.kafka.{k} is the host's to set, not a setting"
                )));
            }
            props.set(k, v);
        }
        for (k, v) in FIXED {
            props.set(*k, *v);
        }
        // A flush waits until each output was acknowledged or failed
        // (`message.timeout.ms`), with some slack for the callbacks.
        let message_timeout = props
            .get("message.timeout.ms")
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(timeout, Duration::from_millis);
        let producer: ThreadedProducer<Deliveries> = props
            .create_with_context(Deliveries::default())
            .map_err(|e| client(e.to_string()))?;
        let meta = producer
            .client()
            .fetch_metadata(Some(&cfg.topic), timeout)
            .map_err(|e| client(format!("reading the topic's metadata: {e}")))?;
        let found = meta.topics().iter().find(|t| t.name() == cfg.topic);
        match found.map(|t| (t.error(), t.partitions().len())) {
            None
            | Some((
                Some(rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART),
                _,
            )) => {
                return Err(OutputError::NoTopic {
                    topic: cfg.topic.clone(),
                    brokers,
                });
            }
            Some((Some(e), _)) => {
                return Err(client(format!(
                    "the brokers answer {} for the topic (an ACL that does not let this client describe or write it? a leader not elected yet?)",
                    RDKafkaErrorCode::from(e)
                )));
            }
            Some((None, 0)) => {
                return Err(client("the topic has no partitions".to_string()));
            }
            Some((None, _)) => {}
        }
        Ok(KafkaOutput {
            producer,
            topic: cfg.topic.clone(),
            brokers,
            guarantee: cfg.guarantee,
            timeout: message_timeout + Duration::from_secs(5),
        })
    }

    /// The output topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Hand the outputs of a part of `input_topic`/`input_partition` to
    /// the producer, in order. Returns how many, once they are queued,
    /// not acknowledged ([`KafkaOutput::flush`] waits). Under
    /// at-least-once a header [`IDEMPOTENCY_KEY_HEADER`] the map emitted
    /// (one an upstream pipeline wrote, kept by a passthrough) is
    /// replaced by this output's own.
    ///
    /// # Errors
    /// [`OutputError::Delivery`] when an earlier output failed, or the
    /// local queue stayed full for the timeout.
    pub fn send(
        &self,
        input_topic: &str,
        input_partition: i32,
        outputs: &[ChainOutput],
    ) -> Result<u64, OutputError> {
        self.check()?;
        let keyed = self.guarantee == OutputGuarantee::AtLeastOnce;
        let mut sent = 0;
        for o in outputs {
            let mut headers = OwnedHeaders::new_with_capacity(o.headers.len() + 1);
            for (k, v) in o
                .headers
                .iter()
                .filter(|(k, _)| !(keyed && k == IDEMPOTENCY_KEY_HEADER))
            {
                headers = headers.insert(Header {
                    key: k,
                    value: v.as_deref(),
                });
            }
            let key = keyed.then(|| o.idempotency_key(input_topic, input_partition));
            if let Some(k) = &key {
                headers = headers.insert(Header {
                    key: IDEMPOTENCY_KEY_HEADER,
                    value: Some(k.as_bytes()),
                });
            }
            let mut record: BaseRecord<'_, [u8], [u8], ()> =
                BaseRecord::to(&self.topic).headers(headers);
            if let Some(k) = &o.key {
                record = record.key(k.as_slice());
            }
            if let Some(v) = &o.value {
                record = record.payload(v.as_slice());
            }
            let started = Instant::now();
            loop {
                match self.producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r))
                        if started.elapsed() < self.timeout =>
                    {
                        // The local queue is full: wait for acknowledgements.
                        record = r;
                        self.producer.poll(Duration::from_millis(10));
                    }
                    Err((e, _)) => {
                        let full = matches!(
                            e,
                            KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)
                        );
                        return Err(self.delivery(format!(
                            "{e} (the output of {}){}",
                            o.idempotency_key(input_topic, input_partition),
                            if full {
                                "; the producer's local queue stayed full for the timeout: are the brokers reachable? (output.kafka.queue.buffering.max.messages and .kbytes bound the queue)"
                            } else {
                                ""
                            }
                        )));
                    }
                }
            }
            sent += 1;
        }
        Ok(sent)
    }

    /// Wait until every output handed over so far is acknowledged by the
    /// brokers (at most the timeout).
    ///
    /// # Errors
    /// [`OutputError::Delivery`] naming the first output that failed, or
    /// the timeout.
    pub fn flush(&self) -> Result<(), OutputError> {
        self.producer
            .flush(self.timeout)
            .map_err(|e| self.delivery(format!("waiting for acknowledgements: {e}")))?;
        self.check()
    }

    /// The first failed delivery, as an error.
    fn check(&self) -> Result<(), OutputError> {
        let first = self
            .producer
            .context()
            .first_error
            .lock()
            .ok()
            .and_then(|f| f.clone());
        match first {
            Some(m) => Err(self.delivery(m)),
            None => Ok(()),
        }
    }

    fn delivery(&self, message: String) -> OutputError {
        OutputError::Delivery {
            topic: self.topic.clone(),
            brokers: self.brokers.clone(),
            message,
        }
    }
}
