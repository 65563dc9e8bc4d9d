//! The Kafka output stage (DESIGN.md, "Output to Kafka"): [`KafkaOutput`],
//! the one type the engine calls, beside the SQL sink. It knows its
//! transaction mode — none (at-least-once), one transaction per batch (a
//! single host under exactly once), one per part of each input partition
//! (a pipeline group under exactly once) — and offers the loop a few
//! verbs: deliver a part's records, finish a batch, recover at a claim,
//! release a partition, abort.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::producer::{Producer, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;

use crate::capability::kafka::Sent;
use crate::plugin::PartitionContext;
use crate::plugin::chain::ChainOutput;
use sluice_guest::wire::SinkRecord;

use super::destination::Destination;
use super::per_partition::PartitionTransactions;
use super::positions::Positions;
use super::send::{Deliveries, Produce, Sender};
use super::settings::Settings;
use super::transaction::BatchTransaction;
use super::{GroupOffsets, OutputConfig, OutputError, OutputGuarantee};

/// What one output transaction covers under exactly once: decided by who
/// holds the input partitions (a sole owner commits a batch at a time, a
/// group member a part of one partition at a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionScope {
    /// One transaction per batch, under the pipeline's transactional id.
    Batch,
    /// One transaction per part of an input partition, under the
    /// partition's transactional id.
    InputPartition,
}

/// The transaction mode.
enum Transactions {
    /// At-least-once (or exactly once before [`KafkaOutput::start_transactions`]).
    None,
    PerBatch(BatchTransaction),
    PerInputPartition(PartitionTransactions),
}

/// The Kafka output stage (see the module doc).
pub struct KafkaOutput {
    dest: Destination,
    settings: Settings,
    /// The idempotent producer of at-least-once.
    sender: Sender,
    guarantee: OutputGuarantee,
    /// `--output-reprocess`: produce again what the transactions covered.
    reprocess: bool,
    transactions: Transactions,
    /// The pipeline (its query id), once transactions started.
    query_id: String,
}

impl KafkaOutput {
    /// A producer for `cfg` whose topics were found on the output cluster
    /// (`cfg.brokers`, else `input_brokers` with the input's
    /// `input_kafka` settings under `cfg.kafka`). `timeout` bounds each
    /// wait on the brokers. Exactly once starts with
    /// [`KafkaOutput::start_transactions`].
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
        let settings = Settings::new(cfg, &brokers, input_kafka, timeout)?;
        let client = |message: String| OutputError::Client {
            topic: cfg.topics.join(", "),
            brokers: brokers.clone(),
            message,
        };
        let producer: ThreadedProducer<Deliveries> =
            settings.producer(Deliveries::default()).map_err(client)?;
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
        let keyed = cfg.guarantee == OutputGuarantee::AtLeastOnce;
        Ok(KafkaOutput {
            sender: Sender::new(producer, keyed, settings.timeout),
            dest: Destination { topics, brokers },
            settings,
            guarantee: cfg.guarantee,
            reprocess: cfg.reprocess,
            transactions: Transactions::None,
            query_id: String::new(),
        })
    }

    /// Exactly once for pipeline `query_id` (nothing under at-least-once):
    /// - [`TransactionScope::Batch`]: a transactional producer whose
    ///   `transactional.id` is [`super::transactional_id`], registered now
    ///   (`init_transactions` fences every earlier producer of the id — a
    ///   crashed run, the owner before a takeover — and finishes their
    ///   open transaction);
    /// - [`TransactionScope::InputPartition`]: a producer per input
    ///   partition, made when the partition is claimed
    ///   ([`KafkaOutput::claim_partition`]).
    ///
    /// Either way the input positions go to consumer group
    /// `sluice-<query id>` on the output cluster.
    ///
    /// # Errors
    /// [`OutputError::NoTransactions`] when the brokers refuse
    /// transactions to this client, [`OutputError::Client`] otherwise.
    pub fn start_transactions(
        &mut self,
        scope: TransactionScope,
        query_id: &str,
    ) -> Result<(), OutputError> {
        if !self.exactly_once() {
            return Ok(());
        }
        self.query_id = query_id.to_string();
        let id = super::transactional_id(query_id);
        let positions = Positions::new(&self.settings, &id, &self.dest)?;
        self.transactions = match scope {
            TransactionScope::Batch => {
                let producer =
                    self.settings
                        .transactional(&id, Deliveries::default(), &self.dest)?;
                tracing::info!(transactional_id = id, "output transactions initialized");
                Transactions::PerBatch(BatchTransaction::new(
                    Sender::new(producer, false, self.settings.timeout),
                    positions,
                    self.settings.timeout,
                ))
            }
            TransactionScope::InputPartition => {
                let parts = PartitionTransactions::new(query_id, positions, self.settings.timeout);
                tracing::info!(
                    "output transactions per input partition (transactional ids {})",
                    super::partition_transactional_id(query_id, "<topic>", "<partition>")
                );
                Transactions::PerInputPartition(parts)
            }
        };
        Ok(())
    }

    /// The transactional ids this output commits under, for `host
    /// status`: `transactional id X` or `transactional ids X:<topic>:<partition>`;
    /// `None` without transactions.
    pub fn transactional_ids(&self) -> Option<String> {
        match &self.transactions {
            Transactions::None => None,
            Transactions::PerBatch(_) => Some(format!(
                "transactional id {}",
                super::transactional_id(&self.query_id)
            )),
            Transactions::PerInputPartition(_) => Some(format!(
                "transactional ids {}",
                super::partition_transactional_id(&self.query_id, "<topic>", "<partition>")
            )),
        }
    }

    /// The output topic of a map-only pipeline: the first one named.
    pub fn topic(&self) -> &str {
        self.dest.topics.first().map_or("", |(t, _)| t.as_str())
    }

    /// The output topics, each with its partition count, as the `kafka`
    /// capability grants them to a sink stage.
    pub fn grant(&self) -> crate::capability::kafka::KafkaGrant {
        crate::capability::kafka::KafkaGrant::new(self.dest.topics.iter().cloned().collect())
    }

    /// Whether outputs go in transactions (exactly once).
    pub fn exactly_once(&self) -> bool {
        self.guarantee == OutputGuarantee::ExactlyOnce
    }

    /// Whether `--output-reprocess` was given.
    pub fn reprocess(&self) -> bool {
        self.reprocess
    }

    /// The settings, for the probe.
    pub(super) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The map outputs of a map-only pipeline (`has_sink` false) go with
    /// their part, in its database transaction, to this topic: a group
    /// under exactly once (the part's Kafka transaction commits inside the
    /// window of its database transaction). `None`: they are sent before
    /// the part ([`KafkaOutput::send_map_outputs`]), or there is a sink.
    pub fn map_outputs_with_part(&self, has_sink: bool) -> Option<&str> {
        match &self.transactions {
            Transactions::PerInputPartition(_) if !has_sink => Some(self.topic()),
            _ => None,
        }
    }

    /// The records a part hands over as it commits: the map's records
    /// themselves (see [`KafkaOutput::map_outputs_with_part`]), each with
    /// its idempotency key, as records to `topic`.
    pub fn of_mapped(topic: &str, records: &[&SinkRecord<'_>]) -> Vec<Sent> {
        records
            .iter()
            .map(|r| Sent {
                topic: topic.to_string(),
                partition: None,
                key: r.record.key.map(<[u8]>::to_vec),
                value: r.record.value.map(<[u8]>::to_vec),
                headers: r
                    .record
                    .headers
                    .iter()
                    .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                    .collect(),
                idempotency_key: r.idempotency_key.to_string(),
            })
            .collect()
    }

    /// Deliver what a part of input partition `part` hands over as it
    /// commits (records a sink sent with `kafka.send`, or the map outputs
    /// of a part they go with): in the part's own transaction (per input
    /// partition), in the batch's (per batch), or sent (at-least-once;
    /// acknowledged before returning when `acked_first`: the part then
    /// writes its progress row). Returns how many, and the time spent in
    /// a part's transaction.
    ///
    /// # Errors
    /// [`OutputError::Delivery`], [`OutputError::Transaction`].
    pub fn deliver(
        &self,
        part: &PartitionContext,
        records: &[Sent],
        acked_first: bool,
    ) -> Result<(u64, Duration), OutputError> {
        if let Transactions::PerInputPartition(parts) = &self.transactions {
            return parts.commit_part(part, records, &self.dest);
        }
        let sender = self.batch_sender(part.batch.batch_id, !records.is_empty())?;
        sender.check(&self.dest)?;
        for r in records {
            sender.produce_sent(&self.dest, r)?;
        }
        if acked_first {
            sender.flush(&self.dest)?;
        }
        Ok((records.len() as u64, Duration::ZERO))
    }

    /// Send the outputs of a part of batch `batch` from
    /// `input_topic`/`input_partition`, in order, to the output topic,
    /// before the part is applied (per batch: in the batch's transaction,
    /// opened by the first); acknowledged before returning when
    /// `acked_first`. Under at-least-once a header
    /// [`super::IDEMPOTENCY_KEY_HEADER`] the map emitted (one an upstream
    /// pipeline wrote, kept by a passthrough) is replaced by this output's
    /// own. Returns how many.
    ///
    /// # Errors
    /// [`OutputError::Delivery`] when an earlier output failed, or the
    /// local queue stayed full for the timeout; [`OutputError::Transaction`]
    /// when the transaction cannot be opened.
    pub fn send_map_outputs(
        &self,
        batch: u64,
        input_topic: &str,
        input_partition: i32,
        outputs: &[ChainOutput],
        acked_first: bool,
    ) -> Result<u64, OutputError> {
        let sender = self.batch_sender(batch, !outputs.is_empty())?;
        sender.check(&self.dest)?;
        for o in outputs {
            sender.produce(
                &self.dest,
                Produce {
                    topic: self.topic(),
                    partition: None,
                    key: o.key.as_deref(),
                    value: o.value.as_deref(),
                    headers: &o.headers,
                    idempotency_key: &|| o.idempotency_key(input_topic, input_partition),
                },
            )?;
        }
        if acked_first {
            sender.flush(&self.dest)?;
        }
        Ok(outputs.len() as u64)
    }

    /// Before batch `batch` is recorded as done: commit its transaction
    /// with its input `positions` (each with `marker`) per batch; wait
    /// until every output is acknowledged under at-least-once; nothing per
    /// input partition (each part committed its own). Returns the
    /// transaction's time.
    ///
    /// # Errors
    /// [`OutputError`]: the batch must not be recorded as done.
    pub fn finish_batch(
        &self,
        batch: u64,
        positions: &BTreeMap<(String, i32), i64>,
        marker: &str,
    ) -> Result<Duration, OutputError> {
        match &self.transactions {
            Transactions::PerBatch(t) => t.commit(batch, positions, marker, &self.dest),
            Transactions::PerInputPartition(_) => Ok(Duration::ZERO),
            Transactions::None => {
                self.batch_sender(batch, false)?.flush(&self.dest)?;
                Ok(Duration::ZERO)
            }
        }
    }

    /// Per batch: the offsets the positions group holds for `partitions`
    /// (see [`Positions::committed`]); `None` in the other modes (per input
    /// partition, a claim reads its own: [`KafkaOutput::committed`]).
    ///
    /// # Errors
    /// [`OutputError::Client`] when the group coordinator does not answer.
    pub fn batch_positions(
        &self,
        partitions: &[(String, i32)],
    ) -> Result<Option<GroupOffsets>, OutputError> {
        match &self.transactions {
            Transactions::PerBatch(t) => t.positions.committed(partitions, &self.dest).map(Some),
            _ => Ok(None),
        }
    }

    /// Per input partition: the offsets the positions group holds for
    /// `partitions`.
    ///
    /// # Errors
    /// [`OutputError::Client`]; outside that mode, an internal one.
    pub fn committed(&self, partitions: &[(String, i32)]) -> Result<GroupOffsets, OutputError> {
        match &self.transactions {
            Transactions::PerInputPartition(p) => p.positions.committed(partitions, &self.dest),
            _ => Err(self
                .dest
                .client_error("no per-partition transactions (a bug)".into())),
        }
    }

    /// A claim of input partition `tp`: per input partition, make its
    /// transactional producer and register it (`init_transactions`), which
    /// fences the producer of the member that held `tp` before and
    /// finishes or aborts its open transaction; returns the transactional
    /// id. `None` in the other modes.
    ///
    /// # Errors
    /// [`OutputError::NoTransactions`], [`OutputError::Client`].
    pub fn claim_partition(&self, tp: &(String, i32)) -> Result<Option<String>, OutputError> {
        match &self.transactions {
            Transactions::PerInputPartition(p) => p.claim(tp, &self.settings, &self.dest).map(Some),
            _ => Ok(None),
        }
    }

    /// Per input partition: move `tp`'s position back to `at`
    /// (`--output-reprocess`).
    ///
    /// # Errors
    /// [`OutputError::Transaction`]; outside that mode, an internal one.
    pub fn move_position(&self, tp: &(String, i32), at: i64) -> Result<(), OutputError> {
        match &self.transactions {
            Transactions::PerInputPartition(p) => p.move_position(tp, at, &self.dest),
            _ => Err(self
                .dest
                .client_error("no per-partition transactions (a bug)".into())),
        }
    }

    /// `tp` is no longer this member's: drop its producer, if any.
    pub fn release_partition(&self, tp: &(String, i32)) {
        if let Transactions::PerInputPartition(p) = &self.transactions {
            p.release(tp);
        }
    }

    /// Per batch: abort the open transaction of a batch that failed (best
    /// effort).
    pub fn abort_open_transaction(&self) {
        if let Transactions::PerBatch(t) = &self.transactions {
            t.abort_open();
        }
    }

    /// [`OutputError::Transaction`] of batch `batch` on this output.
    pub fn transaction_error(&self, batch: u64, message: String) -> OutputError {
        self.dest.transaction_error(batch, message)
    }

    /// The producer of what is sent outside a part's own transaction: the
    /// batch's transactional one (per batch) or the idempotent one
    /// (at-least-once). Exactly once before its transactions started, or
    /// per input partition (whose records go with their part), has none:
    /// sending there would be at-least-once unawares.
    ///
    /// # Errors
    /// [`OutputError::Transaction`] (a bug).
    fn batch_sender(&self, batch: u64, any: bool) -> Result<&Sender, OutputError> {
        match &self.transactions {
            Transactions::PerBatch(t) => {
                if any {
                    t.begin(batch, &self.dest)?;
                }
                Ok(&t.sender)
            }
            Transactions::None if !self.exactly_once() => Ok(&self.sender),
            _ => Err(self.dest.transaction_error(
                batch,
                "exactly once without a transaction to send in (a bug)".into(),
            )),
        }
    }

    /// The output's topics and cluster, for the probe's errors.
    pub(super) fn destination(&self) -> &Destination {
        &self.dest
    }
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
