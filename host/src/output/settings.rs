//! The output producer's settings (librdkafka properties): the host's
//! defaults, what carries over from the input's `kafka.*` settings, the
//! user's `output.kafka.*`, and the ones the guarantees rest on; and the
//! clients made from them (a producer, a transactional producer, the
//! reader of a consumer group's committed offsets). Property names are
//! librdkafka's (CONFIGURATION.md).

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;

use super::destination::Destination;
use super::{OutputConfig, OutputError, OutputGuarantee};

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

/// `transaction.timeout.ms` under exactly once unless set: a batch's
/// transaction may stay open this long (10 minutes: below Kafka's default
/// `transaction.max.timeout.ms` of 15 minutes, far above librdkafka's
/// 60 s default, which a slow batch outlives; and never below
/// `message.timeout.ms`, which librdkafka requires).
const TRANSACTION_TIMEOUT_MS: u64 = 600_000;

/// Prefixes of the producer's properties that also reach the reader of
/// the pipeline's committed offsets (how to reach and authenticate to the
/// output cluster).
const CONNECTION_PREFIXES: &[&str] = &[
    "security.",
    "sasl.",
    "ssl.",
    "socket.",
    "broker.address.",
    "client.dns.",
    "reconnect.",
];

/// The producer's properties and the bound on each wait on the brokers.
pub(super) struct Settings {
    props: ClientConfig,
    /// Bound on waiting for the brokers (metadata, acknowledgements, a
    /// full local queue, a transaction's requests): the producer's
    /// `message.timeout.ms` plus 5 s for the callbacks.
    pub(super) timeout: Duration,
}

impl Settings {
    /// The settings of `cfg` on cluster `brokers` (the input's settings
    /// `input_kafka` carry over when it is the input's cluster). `timeout`
    /// is the host's bound on a Kafka operation (`--kafka-timeout`).
    ///
    /// # Errors
    /// [`OutputError::Client`] for a property that is the host's or that a
    /// transactional producer refuses (checked here, before the
    /// checkpoint is opened: no request is sent until
    /// `init_transactions`).
    pub(super) fn new(
        cfg: &OutputConfig,
        brokers: &str,
        input_kafka: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<Settings, OutputError> {
        let client = |message: String| OutputError::Client {
            topic: cfg.topics.join(", "),
            brokers: brokers.to_string(),
            message,
        };
        let mut props = ClientConfig::new();
        props
            .set("bootstrap.servers", brokers)
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
        if cfg.guarantee == OutputGuarantee::ExactlyOnce {
            let ms = |k: &str| props.get(k).and_then(|v| v.parse::<u64>().ok());
            let message = ms("message.timeout.ms").unwrap_or(30_000);
            match ms("transaction.timeout.ms") {
                None => {
                    props.set(
                        "transaction.timeout.ms",
                        TRANSACTION_TIMEOUT_MS.max(message).to_string(),
                    );
                }
                // librdkafka refuses message.timeout.ms above it.
                Some(t) if t < message => {
                    props.set("message.timeout.ms", t.to_string());
                }
                Some(_) => {}
            }
            // What a transactional producer refuses is refused here,
            // before the checkpoint is opened (no request is sent until
            // init_transactions).
            let mut check = props.clone();
            check.set("transactional.id", "sluice-settings-check");
            check
                .create::<BaseProducer>()
                .map_err(|e| client(e.to_string()))?;
        }
        // A flush waits until each output was acknowledged or failed
        // (`message.timeout.ms`), with some slack for the callbacks.
        let message_timeout = props
            .get("message.timeout.ms")
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(timeout, Duration::from_millis);
        Ok(Settings {
            props,
            timeout: message_timeout + Duration::from_secs(5),
        })
    }

    /// A producer with callbacks `context`.
    ///
    /// # Errors
    /// librdkafka's message.
    pub(super) fn producer<C: ProducerContext + 'static>(
        &self,
        context: C,
    ) -> Result<ThreadedProducer<C>, String> {
        self.props
            .create_with_context(context)
            .map_err(|e| e.to_string())
    }

    /// A transactional producer whose `transactional.id` is `id`, with
    /// callbacks `context`, registered with the transaction coordinator
    /// (`init_transactions`, KIP-98: earlier producers of the id are
    /// fenced, their open transaction finished or aborted). Waits at most
    /// the timeout.
    ///
    /// # Errors
    /// [`OutputError::NoTransactions`] when the brokers refuse
    /// transactions to this client, [`OutputError::Client`] otherwise.
    pub(super) fn transactional<C: ProducerContext + 'static>(
        &self,
        id: &str,
        context: C,
        dest: &Destination,
    ) -> Result<ThreadedProducer<C>, OutputError> {
        let mut props = self.props.clone();
        props.set("transactional.id", id);
        let producer: ThreadedProducer<C> = props
            .create_with_context(context)
            .map_err(|e| dest.client_error(e.to_string()))?;
        producer.init_transactions(self.timeout).map_err(|e| {
            let refused = matches!(
                e.rdkafka_error_code(),
                Some(
                    RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                        | RDKafkaErrorCode::ClusterAuthorizationFailed
                        | RDKafkaErrorCode::UnsupportedVersion
                        | RDKafkaErrorCode::UnsupportedFeature
                )
            );
            let message = format!("initializing transactional id {id}: {e}");
            if refused {
                dest.no_transactions(message)
            } else {
                dest.client_error(message)
            }
        })?;
        Ok(producer)
    }

    /// A consumer of consumer group `group` on the output cluster, for
    /// the group's metadata in a transaction and for reading its
    /// committed offsets (stable ones only, KIP-447).
    ///
    /// # Errors
    /// [`OutputError::Client`].
    pub(super) fn offsets_reader(
        &self,
        group: &str,
        dest: &Destination,
    ) -> Result<BaseConsumer, OutputError> {
        let mut reader = ClientConfig::new();
        reader
            .set("bootstrap.servers", &dest.brokers)
            .set("client.id", "sluice-output-offsets")
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            // Stable offsets only (KIP-447): none still in a transaction.
            .set("isolation.level", "read_committed");
        for (k, v) in self.props.config_map().iter() {
            if CONNECTION_PREFIXES.iter().any(|p| k.starts_with(p)) {
                reader.set(*k, *v);
            }
        }
        reader
            .create()
            .map_err(|e| dest.client_error(format!("reader of consumer group {group}: {e}")))
    }
}
