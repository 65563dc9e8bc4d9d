//! The producer of a pipeline's outputs ([`KafkaOutput`]): its settings,
//! the topic check at start, sending a part's outputs, and the batch's
//! transaction (exactly once) or acknowledgements (at-least-once).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{
    BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer,
};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::capability::kafka::Sent;
use crate::plugin::chain::ChainOutput;

use super::{GroupOffsets, IDEMPOTENCY_KEY_HEADER, OutputConfig, OutputError, OutputGuarantee};

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

/// The producer's callbacks: keep the first failure.
#[derive(Default)]
pub(super) struct Deliveries {
    first_error: Mutex<Option<String>>,
}

impl Deliveries {
    /// Forget the failure kept so far.
    pub(super) fn forget(&self) {
        if let Ok(mut first) = self.first_error.lock() {
            *first = None;
        }
    }
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
    pub(super) producer: ThreadedProducer<Deliveries>,
    /// The producer's properties (a transactional producer is made from
    /// them with its `transactional.id`).
    props: ClientConfig,
    /// Exactly once: a transaction is open (begun by the first output of
    /// a batch, or by its commit when it had none).
    in_transaction: Mutex<bool>,
    /// Exactly once: a consumer of the pipeline's consumer group on the
    /// output cluster (whose coordinator keeps the offsets committed in
    /// the transactions), for the group's metadata and for reading them
    /// back. Set with the transactional producer by
    /// [`KafkaOutput::init_transactions`]: `None` until then.
    pub(super) group: Option<BaseConsumer>,
    /// The output topics with their partition counts, in the order
    /// given (a map-only pipeline's outputs go to the first).
    topics: Vec<(String, i32)>,
    brokers: String,
    guarantee: OutputGuarantee,
    /// Bound on waiting for the brokers (metadata, acknowledgements, a
    /// full local queue).
    pub(super) timeout: Duration,
    /// `--output-reprocess`: produce again what the transactions covered.
    reprocess: bool,
    /// A pipeline group under exactly once: the group's name and the
    /// transactional producer of each input partition the member holds
    /// (`parts`); `None` otherwise.
    pub(super) parts: Option<super::parts::PartTransactions>,
}

impl KafkaOutput {
    /// A producer for `cfg` whose topics were found on the output cluster
    /// (`cfg.brokers`, else `input_brokers` with the input's
    /// `input_kafka` settings under `cfg.kafka`). `timeout` bounds each
    /// wait on the brokers.
    ///
    /// # Errors
    /// [`OutputError::Client`] for a property librdkafka refuses or an
    /// unreachable cluster, [`OutputError::NoTopic`] when a topic is not
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
            topic: cfg.topics.join(", "),
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
        let producer: ThreadedProducer<Deliveries> = props
            .create_with_context(Deliveries::default())
            .map_err(|e| client(e.to_string()))?;
        let mut topics = Vec::with_capacity(cfg.topics.len());
        for topic in &cfg.topics {
            let partitions =
                partitions_of(&producer, topic, &brokers, timeout).map_err(|e| match e {
                    OutputError::Client { message, .. } => OutputError::Client {
                        topic: topic.clone(),
                        brokers: brokers.clone(),
                        message,
                    },
                    other => other,
                })?;
            topics.push((topic.clone(), partitions));
        }
        Ok(KafkaOutput {
            producer,
            props,
            in_transaction: Mutex::new(false),
            group: None,
            topics,
            brokers,
            guarantee: cfg.guarantee,
            timeout: message_timeout + Duration::from_secs(5),
            reprocess: cfg.reprocess,
            parts: None,
        })
    }

    /// The output topic of a map-only pipeline: the first one named.
    pub fn topic(&self) -> &str {
        self.topics.first().map_or("", |(t, _)| t.as_str())
    }

    /// The output topics, each with its partition count, as the `kafka`
    /// capability grants them to a sink stage.
    pub fn grant(&self) -> crate::capability::kafka::KafkaGrant {
        crate::capability::kafka::KafkaGrant::new(self.topics.iter().cloned().collect())
    }

    /// The output cluster's bootstrap servers.
    pub(super) fn brokers(&self) -> &str {
        &self.brokers
    }

    /// The output topics, for messages: `a, b`.
    pub(super) fn topic_list(&self) -> String {
        let names: Vec<&str> = self.topics.iter().map(|(t, _)| t.as_str()).collect();
        names.join(", ")
    }

    /// Whether outputs go in transactions (exactly once).
    pub fn exactly_once(&self) -> bool {
        self.guarantee == OutputGuarantee::ExactlyOnce
    }

    /// Exactly once: replace the producer with a transactional one whose
    /// `transactional.id` is `id` ([`super::transactional_id`]) and register it
    /// with the transaction coordinator (`init_transactions`). That fences
    /// every earlier producer of the id (a crashed run, the owner before a
    /// takeover: their later commits fail) and finishes their open
    /// transaction: one being committed completes, any other is aborted.
    /// The input positions go to consumer group `group` on the output
    /// cluster. Waits at most the timeout.
    ///
    /// # Errors
    /// [`OutputError::NoTransactions`] when the brokers refuse
    /// transactions to this client, [`OutputError::Client`] otherwise.
    pub fn init_transactions(&mut self, id: &str, group: &str) -> Result<(), OutputError> {
        let reader = self.offsets_reader(group)?;
        self.producer = self.transactional_producer(id)?;
        self.group = Some(reader);
        Ok(())
    }

    /// Whether `--output-reprocess` was given.
    pub fn reprocess(&self) -> bool {
        self.reprocess
    }

    /// A consumer of consumer group `group` on the output cluster, for
    /// the group's metadata in a transaction and for reading its
    /// committed offsets (stable ones only).
    ///
    /// # Errors
    /// [`OutputError::Client`].
    pub(super) fn offsets_reader(&self, group: &str) -> Result<BaseConsumer, OutputError> {
        let mut reader = ClientConfig::new();
        reader
            .set("bootstrap.servers", &self.brokers)
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
            .map_err(|e| self.client_error(format!("reader of consumer group {group}: {e}")))
    }

    /// A transactional producer whose `transactional.id` is `id`,
    /// registered with the transaction coordinator (`init_transactions`:
    /// earlier producers of the id are fenced, their open transaction
    /// finished or aborted).
    ///
    /// # Errors
    /// [`OutputError::NoTransactions`] when the brokers refuse
    /// transactions to this client, [`OutputError::Client`] otherwise.
    pub(super) fn transactional_producer(
        &self,
        id: &str,
    ) -> Result<ThreadedProducer<Deliveries>, OutputError> {
        self.transactional_producer_with(id, Deliveries::default())
    }

    /// [`KafkaOutput::transactional_producer`] with callbacks `context`.
    ///
    /// # Errors
    /// As [`KafkaOutput::transactional_producer`].
    pub(super) fn transactional_producer_with<C: ProducerContext + 'static>(
        &self,
        id: &str,
        context: C,
    ) -> Result<ThreadedProducer<C>, OutputError> {
        let mut props = self.props.clone();
        props.set("transactional.id", id);
        let producer: ThreadedProducer<C> = props
            .create_with_context(context)
            .map_err(|e| self.client_error(e.to_string()))?;
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
                OutputError::NoTransactions {
                    topic: self.topic_list(),
                    brokers: self.brokers.clone(),
                    message,
                }
            } else {
                self.client_error(message)
            }
        })?;
        Ok(producer)
    }

    /// Exactly once: open the batch's transaction unless it is open.
    fn begin(&self, batch: u64) -> Result<(), OutputError> {
        let mut open = self.open();
        if *open {
            return Ok(());
        }
        if self.group.is_none() {
            return Err(self.transaction_error(
                batch,
                "the producer is not transactional (init_transactions was not called)".into(),
            ));
        }
        self.producer
            .begin_transaction()
            .map_err(|e| self.transaction_error(batch, format!("beginning it: {e}")))?;
        *open = true;
        Ok(())
    }

    /// Exactly once: commit batch `batch`'s transaction (opening it first
    /// when the batch had no output) with the input `positions` (the next
    /// offset to read of each partition) committed in it to the consumer
    /// group given to [`KafkaOutput::init_transactions`], each with the
    /// metadata `marker` ([`super::batch_marker`]).
    /// `commit_transaction` first waits until every output is
    /// acknowledged. Returns how long the offsets and the commit took.
    ///
    /// # Errors
    /// [`OutputError::Transaction`]: the transaction is aborted when
    /// librdkafka says it can be; a fenced producer (another run of the
    /// pipeline started) or a fatal error leaves it to the next producer
    /// of the id. Either way the batch must not be recorded as done.
    pub fn commit_transaction(
        &self,
        batch: u64,
        positions: &BTreeMap<(String, i32), i64>,
        marker: &str,
    ) -> Result<Duration, OutputError> {
        let started = Instant::now();
        let group = self.positions_group(batch)?;
        self.begin(batch)?;
        let offsets = positions_with_marker(positions, marker)
            .map_err(|e| self.transaction_error(batch, e.to_string()))?;
        // Every output acknowledged first (the commit would wait for them
        // anyway): a failure names the output, and the transaction holds
        // all of the batch's outputs from here on.
        if let Err(e) = self.flush() {
            let aborted = self.abort();
            return Err(self.transaction_error(batch, format!("{e}{aborted}")));
        }
        let done = super::watchdog::bounded("send_offsets_to_transaction", self.timeout, || {
            self.producer
                .send_offsets_to_transaction(&offsets, &group, self.timeout)
        })
        .map_err(|e| ("adding the input positions to it", e))
        .and_then(|()| {
            crate::util::failpoint("output:before-commit-transaction");
            self.producer
                .commit_transaction(self.timeout)
                .map_err(|e| ("committing it", e))
        });
        match done {
            Ok(()) => {
                *self.open() = false;
                Ok(started.elapsed())
            }
            Err((what, e)) => {
                let message = commit_failed(what, &e, || self.abort());
                *self.open() = false;
                Err(self.transaction_error(batch, message))
            }
        }
    }

    /// Exactly once: the metadata of the consumer group the input
    /// positions are committed to, for a transaction of batch `batch`.
    ///
    /// # Errors
    /// [`OutputError::Transaction`] when the output transactions were not
    /// initialized (no group: a bug).
    pub(super) fn positions_group(
        &self,
        batch: u64,
    ) -> Result<rdkafka::consumer::ConsumerGroupMetadata, OutputError> {
        self.group
            .as_ref()
            .and_then(|g| g.group_metadata())
            .ok_or_else(|| {
                self.transaction_error(
                    batch,
                    "no consumer group for the input positions (the output transactions were not initialized)"
                        .into(),
                )
            })
    }

    /// Exactly once: the offsets the pipeline's consumer group holds on
    /// the output cluster for `partitions`, each with its metadata:
    /// `(offset, metadata)`, absent for a partition with none. Only stable
    /// offsets are answered (none in an open transaction: the brokers'
    /// "unstable offset" answer is retried for the timeout).
    ///
    /// # Errors
    /// [`OutputError::Client`] when the group coordinator does not answer
    /// within the timeout.
    pub fn committed(&self, partitions: &[(String, i32)]) -> Result<GroupOffsets, OutputError> {
        let reader = self.group.as_ref().ok_or_else(|| {
            self.client_error("no consumer group (init_transactions was not called)".into())
        })?;
        let mut tpl = TopicPartitionList::new();
        for (t, p) in partitions {
            tpl.add_partition(t, *p);
        }
        let started = Instant::now();
        let answered = loop {
            let asked = reader
                .committed_offsets(tpl.clone(), self.timeout)
                .and_then(|answered| {
                    // A partition's own error (an offset still in an
                    // open transaction: UNSTABLE_OFFSET_COMMIT).
                    match answered.elements().iter().find_map(|e| e.error().err()) {
                        Some(e) => Err(e),
                        None => Ok(answered),
                    }
                });
            match asked {
                Ok(answered) => break answered,
                Err(e) if started.elapsed() < self.timeout => {
                    tracing::debug!("reading the group's committed offsets: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => {
                    return Err(self.client_error(format!(
                        "reading the consumer group's committed offsets for {} s: {e}",
                        started.elapsed().as_secs()
                    )));
                }
            }
        };
        Ok(answered
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((
                    (e.topic().to_string(), e.partition()),
                    (o, e.metadata().to_string()),
                )),
                _ => None,
            })
            .collect())
    }

    /// Exactly once: abort the open transaction, if any, of a batch that
    /// failed, so that `read_committed` readers of the output topic are
    /// not held at its first output until the transaction times out.
    /// Best effort (the next start's `init_transactions` aborts it
    /// otherwise).
    pub fn abort_open_transaction(&self) {
        if !*self.open() {
            return;
        }
        match self.abort_transaction() {
            Ok(()) => tracing::info!("the failed batch's output transaction was aborted"),
            Err(e) => tracing::warn!(
                "aborting the failed batch's output transaction: {e} (the next start aborts it)"
            ),
        }
    }

    /// Whether a transaction is open, locked.
    fn open(&self) -> std::sync::MutexGuard<'_, bool> {
        self.in_transaction
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Abort the open transaction; it is closed either way.
    fn abort_transaction(&self) -> Result<(), KafkaError> {
        *self.open() = false;
        self.producer.abort_transaction(self.timeout)
    }

    /// [`KafkaOutput::abort_transaction`], said as the end of an error
    /// message.
    fn abort(&self) -> String {
        match self.abort_transaction() {
            Ok(()) => "; the transaction was aborted".to_string(),
            Err(e) => format!("; aborting it failed too: {e}"),
        }
    }

    /// [`OutputError::Client`] on this output.
    pub(super) fn client_error(&self, message: String) -> OutputError {
        OutputError::Client {
            topic: self.topic_list(),
            brokers: self.brokers.clone(),
            message,
        }
    }

    /// [`OutputError::Transaction`] of batch `batch` on this output.
    pub fn transaction_error(&self, batch: u64, message: String) -> OutputError {
        OutputError::Transaction {
            batch,
            topic: self.topic_list(),
            brokers: self.brokers.clone(),
            message,
        }
    }

    /// Hand the outputs of a part of batch `batch` from
    /// `input_topic`/`input_partition` to the producer, in order, to the
    /// output topic (exactly once: in the batch's transaction, opened by
    /// the first). Returns how many, once they are queued, not
    /// acknowledged ([`KafkaOutput::flush`] waits). Under at-least-once a
    /// header [`IDEMPOTENCY_KEY_HEADER`] the map emitted (one an upstream
    /// pipeline wrote, kept by a passthrough) is replaced by this
    /// output's own.
    ///
    /// # Errors
    /// [`OutputError::Delivery`] when an earlier output failed, or the
    /// local queue stayed full for the timeout; [`OutputError::Transaction`]
    /// when the transaction cannot be opened.
    pub fn send(
        &self,
        batch: u64,
        input_topic: &str,
        input_partition: i32,
        outputs: &[ChainOutput],
    ) -> Result<u64, OutputError> {
        self.check()?;
        if self.exactly_once() && !outputs.is_empty() {
            self.begin(batch)?;
        }
        for o in outputs {
            self.produce(Produce {
                topic: self.topic(),
                partition: None,
                key: o.key.as_deref(),
                value: o.value.as_deref(),
                headers: &o.headers,
                idempotency_key: &|| o.idempotency_key(input_topic, input_partition),
            })?;
        }
        Ok(outputs.len() as u64)
    }

    /// Hand what a sink stage sent with `kafka.send` in a part of batch
    /// `batch` to the producer, in order, as [`KafkaOutput::send`] does
    /// with a map's outputs; each record carries the idempotency key the
    /// sink gave it. The records were checked against [`KafkaOutput::grant`].
    ///
    /// # Errors
    /// As [`KafkaOutput::send`].
    pub fn send_sent(&self, batch: u64, records: &[Sent]) -> Result<u64, OutputError> {
        self.check()?;
        if self.exactly_once() && !records.is_empty() {
            self.begin(batch)?;
        }
        for r in records {
            self.produce_sent(&self.producer, r)?;
        }
        Ok(records.len() as u64)
    }

    /// Queue `r`, a record a sink sent (or a map output under a group's
    /// exactly once), on `producer` with the idempotency key it carries.
    ///
    /// # Errors
    /// As [`KafkaOutput::produce_on`].
    pub(super) fn produce_sent(
        &self,
        producer: &ThreadedProducer<Deliveries>,
        r: &Sent,
    ) -> Result<(), OutputError> {
        self.produce_on(
            producer,
            Produce {
                topic: &r.topic,
                partition: r.partition,
                key: r.key.as_deref(),
                value: r.value.as_deref(),
                headers: &r.headers,
                idempotency_key: &|| r.idempotency_key.clone(),
            },
        )
    }

    /// Queue one record, waiting while the local queue is full (at most
    /// the timeout). Under at-least-once its idempotency key replaces any
    /// [`IDEMPOTENCY_KEY_HEADER`] it had.
    fn produce(&self, r: Produce<'_>) -> Result<(), OutputError> {
        self.produce_on(&self.producer, r)
    }

    /// [`KafkaOutput::produce`] on `producer` (a partition's, in a group).
    fn produce_on(
        &self,
        producer: &ThreadedProducer<Deliveries>,
        r: Produce<'_>,
    ) -> Result<(), OutputError> {
        let keyed = self.guarantee == OutputGuarantee::AtLeastOnce;
        let mut headers = OwnedHeaders::new_with_capacity(r.headers.len() + 1);
        for (k, v) in r
            .headers
            .iter()
            .filter(|(k, _)| !(keyed && k == IDEMPOTENCY_KEY_HEADER))
        {
            headers = headers.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        if keyed {
            let key = (r.idempotency_key)();
            headers = headers.insert(Header {
                key: IDEMPOTENCY_KEY_HEADER,
                value: Some(key.as_bytes()),
            });
        }
        let mut record: BaseRecord<'_, [u8], [u8], ()> = BaseRecord::to(r.topic).headers(headers);
        if let Some(p) = r.partition {
            record = record.partition(p);
        }
        if let Some(k) = r.key {
            record = record.key(k);
        }
        if let Some(v) = r.value {
            record = record.payload(v);
        }
        let started = Instant::now();
        loop {
            match producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if started.elapsed() < self.timeout =>
                {
                    // The local queue is full: wait for acknowledgements.
                    record = back;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => {
                    let full = matches!(
                        e,
                        KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)
                    );
                    return Err(self.delivery(format!(
                        "{e} (the output of {} to {}){}",
                        (r.idempotency_key)(),
                        r.topic,
                        if full {
                            "; the producer's local queue stayed full for the timeout: are the brokers reachable? (output.kafka.queue.buffering.max.messages and .kbytes bound the queue)"
                        } else {
                            ""
                        }
                    )));
                }
            }
        }
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
        self.check_on(&self.producer)
    }

    /// [`KafkaOutput::check`] of `producer`.
    pub(super) fn check_on(
        &self,
        producer: &ThreadedProducer<Deliveries>,
    ) -> Result<(), OutputError> {
        let first = producer
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

    pub(super) fn delivery(&self, message: String) -> OutputError {
        OutputError::Delivery {
            topic: self.topic_list(),
            brokers: self.brokers.clone(),
            message,
        }
    }
}

/// What to say of a transaction that failed at `what` with `e`; `abort`
/// is called (and its answer added) when librdkafka says the transaction
/// can be aborted. A fenced producer's is left to the producer that
/// fenced it.
pub(super) fn commit_failed(what: &str, e: &KafkaError, abort: impl FnOnce() -> String) -> String {
    let abortable = matches!(e, KafkaError::Transaction(t) if t.txn_requires_abort());
    let fenced = matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::Fenced
        )
    );
    let mut message = format!("{what}: {e}");
    if fenced {
        message.push_str(" (another run or group member of this pipeline initialized the transactional id since: a restart, a takeover or a rebalance elsewhere; or the transaction outlived transaction.timeout.ms and the coordinator aborted it: raise --config output.kafka.transaction.timeout.ms, up to the brokers' transaction.max.timeout.ms)");
    } else if abortable {
        message.push_str(&abort());
    }
    message
}

/// One record for [`KafkaOutput::produce`].
struct Produce<'a> {
    topic: &'a str,
    /// `None`: by key (the producer's partitioner).
    partition: Option<i32>,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    headers: &'a [(String, Option<Vec<u8>>)],
    /// The record's idempotency key, made only where it is sent (at-least-
    /// once) or named (an error): formatting it for every output costs.
    idempotency_key: &'a dyn Fn() -> String,
}

/// How many partitions `topic` has on the cluster `producer` reaches.
///
/// # Errors
/// [`OutputError::NoTopic`] when it is not there, [`OutputError::Client`]
/// (its `topic` and `brokers` left for the caller) otherwise.
fn partitions_of(
    producer: &ThreadedProducer<Deliveries>,
    topic: &str,
    brokers: &str,
    timeout: Duration,
) -> Result<i32, OutputError> {
    let client = |message: String| OutputError::Client {
        topic: topic.to_string(),
        brokers: brokers.to_string(),
        message,
    };
    let meta = producer
        .client()
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| {
            client(format!(
                "reading the topic's metadata for {} s: {e} (are the brokers up and reachable from this host? a slow cluster may need a longer --kafka-timeout)",
                timeout.as_secs()
            ))
        })?;
    let found = meta.topics().iter().find(|t| t.name() == topic);
    match found.map(|t| (t.error(), t.partitions().len())) {
        None
        | Some((
            Some(rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART),
            _,
        )) => Err(OutputError::NoTopic {
            topic: topic.to_string(),
            brokers: brokers.to_string(),
        }),
        Some((Some(e), _)) => Err(client(format!(
            "the brokers answer {} for the topic (an ACL that does not let this client describe or write it? a leader not elected yet?)",
            RDKafkaErrorCode::from(e)
        ))),
        Some((None, 0)) => Err(client("the topic has no partitions".to_string())),
        Some((None, n)) => Ok(i32::try_from(n).unwrap_or(i32::MAX)),
    }
}

/// The input `positions` as the list a transaction commits, each
/// partition's offset carrying `marker` as its metadata.
///
/// # Errors
/// librdkafka's, for a partition it cannot add.
pub(super) fn positions_with_marker(
    positions: &BTreeMap<(String, i32), i64>,
    marker: &str,
) -> Result<TopicPartitionList, KafkaError> {
    let mut offsets = TopicPartitionList::with_capacity(positions.len());
    for ((topic, partition), end) in positions {
        offsets.add_partition_offset(topic, *partition, Offset::Offset(*end))?;
        if let Some(mut e) = offsets.find_partition(topic, *partition) {
            e.set_metadata(marker);
        }
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_position_carries_the_batch_marker() {
        let positions: BTreeMap<(String, i32), i64> = [
            (("in".to_string(), 0), 200),
            (("in".to_string(), 2), 7),
            (("other".to_string(), 1), 0),
        ]
        .into();
        let marker = super::super::batch_marker("q", 3);
        let list = positions_with_marker(&positions, &marker).unwrap();
        let got: Vec<(String, i32, Offset, String)> = list
            .elements()
            .iter()
            .map(|e| {
                (
                    e.topic().to_string(),
                    e.partition(),
                    e.offset(),
                    e.metadata().to_string(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("in".into(), 0, Offset::Offset(200), marker.clone()),
                ("in".into(), 2, Offset::Offset(7), marker.clone()),
                ("other".into(), 1, Offset::Offset(0), marker),
            ]
        );
    }
}
