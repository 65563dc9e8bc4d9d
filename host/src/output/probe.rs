//! The check at start that exactly once can hold on the output cluster
//! (DESIGN.md, "Output to Kafka": never exactly once blind).
//!
//! Exactly once rests on two things the brokers must do: keep the
//! offsets a transaction commits, with their metadata (KIP-447's
//! `TxnOffsetCommit`; recovery reads the batch marker back), and fence a
//! producer once a newer one registered the same `transactional.id`
//! (KIP-98; a zombie's commit must fail). A broker that accepts the
//! requests and does neither (librdkafka's mock cluster keeps no offsets
//! committed in a transaction) would let the host print "exactly-once"
//! and then produce a batch twice after a crash. So before anything is
//! read, a probe transaction commits an offset with a marker to a probe
//! consumer group, reads it back with stable offsets, registers a second
//! producer of the same id and checks that the first one's next
//! transaction is refused. Each start probes with its own transactional
//! id and group, so a probe cut short (a kill, a crash) leaves nothing in
//! the way of the next one.

use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::{KafkaOutput, OutputError};

/// The prefix of a probe's offset metadata: `sluice:probe:<nonce>`.
const PROBE_MARKER: &str = "sluice:probe:";

impl KafkaOutput {
    /// Probe the output cluster for what exactly once needs (see the
    /// module doc), as pipeline `query_id`: the transactional id and
    /// consumer group `sluice-<query id>:probe:<nonce>` (one per start, so
    /// members that start together do not fence each other's probe, and a
    /// probe cut short leaves no open transaction in the next one's way),
    /// the group holding one offset of `input_topic`'s partition 0 (an
    /// input topic: the pipeline may read it, where Kafka's ACLs check
    /// READ for an offset commit, and exactly once keeps the input on the
    /// output cluster). Takes a few round trips to the transaction and
    /// group coordinators.
    ///
    /// # Errors
    /// [`OutputError::NotExactlyOnce`] when the cluster lacks one of the
    /// two; [`OutputError::NoTransactions`] when the brokers refuse
    /// transactions to this client; [`OutputError::Client`] when they
    /// cannot be reached or answer otherwise than the probe expects.
    pub fn probe_exactly_once(&self, query_id: &str, input_topic: &str) -> Result<(), OutputError> {
        match self.probe(query_id, input_topic)? {
            None => Ok(()),
            Some(lacks) => Err(OutputError::NotExactlyOnce {
                topic: self.destination().topic_list(),
                brokers: self.destination().brokers.clone(),
                lacks,
            }),
        }
    }

    /// [`KafkaOutput::probe_exactly_once`]: `Some(what the cluster
    /// lacks)`, or `None` when it passed.
    fn probe(&self, query_id: &str, topic: &str) -> Result<Option<String>, OutputError> {
        let (settings, dest) = (self.settings(), self.destination());
        let timeout = settings.timeout;
        let started = Instant::now();
        let nonce = nonce();
        let id = format!("{}:probe:{nonce}", super::transactional_id(query_id));
        let group = id.clone();
        let marker = format!("{PROBE_MARKER}{nonce}");
        let reader = settings.offsets_reader(&group, dest)?;
        let metadata = reader.group_metadata().ok_or_else(|| {
            dest.client_error(format!("no group metadata for the probe group {group}"))
        })?;
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset(topic, 0, Offset::Offset(0))
            .map_err(|e| dest.client_error(format!("the probe's offset: {e}")))?;
        if let Some(mut e) = offsets.find_partition(topic, 0) {
            e.set_metadata(marker.clone());
        }

        // 1. A transaction that commits an offset with its marker.
        let first = settings.transactional(&id, Quiet, dest)?;
        let committed = first
            .begin_transaction()
            .and_then(|()| {
                super::watchdog::bounded("send_offsets_to_transaction", timeout, || {
                    first.send_offsets_to_transaction(&offsets, &metadata, timeout)
                })
            })
            .and_then(|()| first.commit_transaction(timeout));
        if let Err(e) = committed {
            if unsupported(&e) {
                return Ok(Some(format!(
                    "they refused a transaction that commits consumer offsets ({e})"
                )));
            }
            return Err(dest.client_error(format!("the probe transaction ({id}): {e}")));
        }

        // 2. The offset and its marker, read back as stable offsets.
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, 0);
        let kept = loop {
            let answer = reader
                .committed_offsets(tpl.clone(), timeout)
                .map_err(|e| e.to_string())
                .and_then(|a| {
                    let e = a.elements().into_iter().next().ok_or("no answer")?;
                    e.error().map_err(|e| e.to_string())?;
                    Ok((e.offset(), e.metadata().to_string()))
                });
            match answer {
                Ok(kept) => break kept,
                Err(e) if started.elapsed() < timeout => {
                    tracing::debug!("reading the probe group's offset back: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => {
                    return Err(dest.client_error(format!(
                        "reading the probe group {group}'s offset back: {e}"
                    )));
                }
            }
        };
        match kept {
            (Offset::Offset(0), m) if m == marker => {}
            (offset, m) => {
                return Ok(Some(format!(
                    "they kept no offset committed in a transaction: consumer group {group} holds {} for {}/0 after a transaction committed offset 0 with metadata `{marker}`, so a restart could not tell whether a batch's transaction committed",
                    match offset {
                        Offset::Offset(o) => format!("offset {o} with metadata `{m}`"),
                        other => format!("{other:?}"),
                    },
                    topic
                )));
            }
        }

        // 3. A second producer of the id fences the first.
        let _second = settings.transactional(&id, Quiet, dest)?;
        let zombie = first
            .begin_transaction()
            .and_then(|()| first.send_offsets_to_transaction(&offsets, &metadata, timeout))
            .and_then(|()| first.commit_transaction(timeout));
        match zombie {
            Err(e) if fenced(&e) => {}
            Err(e) => {
                return Err(dest.client_error(format!(
                    "the probe's fenced producer ({id}) failed otherwise than fenced: {e}"
                )));
            }
            Ok(()) => {
                return Ok(Some(format!(
                    "they let a producer commit after a newer producer registered its transactional id {id}, so a paused or partitioned host could commit a batch that its successor commits again"
                )));
            }
        }
        tracing::info!(
            "exactly once checked: the output cluster keeps offsets committed in a transaction and fences old producers (probe took {} ms)",
            started.elapsed().as_millis()
        );
        Ok(None)
    }
}

/// The callbacks of the probe's producers: librdkafka's logs and errors
/// at debug level, since the probe fences one of them on purpose (its
/// "fenced by a newer instance" is the expected answer, not an error).
struct Quiet;

impl ClientContext for Quiet {
    fn log(&self, _: RDKafkaLogLevel, facility: &str, message: &str) {
        tracing::debug!("librdkafka (exactly-once probe): {facility}: {message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!("librdkafka (exactly-once probe): {error}: {reason}");
    }
}

impl ProducerContext for Quiet {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// A probe's nonce: this process and the time, in hex.
fn nonce() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}", std::process::id(), nanos)
}

/// Whether `e` says the brokers do not support the request.
fn unsupported(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::UnsupportedVersion | RDKafkaErrorCode::UnsupportedFeature)
    )
}

/// Whether `e` says the producer was fenced by a newer one of its
/// transactional id (Kafka answers PRODUCER_FENCED, or
/// INVALID_PRODUCER_EPOCH on some requests; librdkafka raises `_FENCED`).
fn fenced(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::Fenced
        )
    )
}
