//! Sending: one producer's records, in order, and the acknowledgements
//! they wait for. Every output and every record a sink sent goes through
//! a [`Sender`] (the pipeline's producer, a batch's transactional
//! producer, or an input partition's). Under at-least-once each record
//! carries its idempotency key in the header
//! [`IDEMPOTENCY_KEY_HEADER`]; the delivery callback keeps the first
//! failure, which the next send or flush reports.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;

use crate::capability::kafka::Sent;

use super::destination::Destination;
use super::{IDEMPOTENCY_KEY_HEADER, OutputError};

/// The producer's callbacks: keep the first failure.
#[derive(Default)]
pub(super) struct Deliveries {
    pub(super) first_error: Mutex<Option<String>>,
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

/// One producer and how its records are sent.
pub(super) struct Sender {
    producer: ThreadedProducer<Deliveries>,
    /// At-least-once: each record carries its idempotency key.
    keyed: bool,
    /// Bound on waiting for the brokers.
    timeout: Duration,
}

/// One record for [`Sender::produce`].
pub(super) struct Produce<'a> {
    pub(super) topic: &'a str,
    /// `None`: by key (the producer's partitioner).
    pub(super) partition: Option<i32>,
    pub(super) key: Option<&'a [u8]>,
    pub(super) value: Option<&'a [u8]>,
    pub(super) headers: &'a [(String, Option<Vec<u8>>)],
    /// The record's idempotency key, made only where it is sent (at-least-
    /// once) or named (an error): formatting it for every output costs.
    pub(super) idempotency_key: &'a dyn Fn() -> String,
}

impl Sender {
    /// Send on `producer` (`keyed`: at-least-once), waiting at most
    /// `timeout` on the brokers.
    pub(super) fn new(
        producer: ThreadedProducer<Deliveries>,
        keyed: bool,
        timeout: Duration,
    ) -> Sender {
        Sender {
            producer,
            keyed,
            timeout,
        }
    }

    /// The producer, for its transactions.
    pub(super) fn producer(&self) -> &ThreadedProducer<Deliveries> {
        &self.producer
    }

    /// Forget the failure kept so far (a failed delivery fails its own
    /// transaction only).
    pub(super) fn forget(&self) {
        self.producer.context().forget();
    }

    /// Queue `r`, a record a sink sent (or a map output that goes with its
    /// part), with the idempotency key it carries.
    ///
    /// # Errors
    /// As [`Sender::produce`].
    pub(super) fn produce_sent(&self, dest: &Destination, r: &Sent) -> Result<(), OutputError> {
        self.produce(
            dest,
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
    ///
    /// # Errors
    /// [`OutputError::Delivery`] when the local queue stayed full for the
    /// timeout or librdkafka refused the record.
    pub(super) fn produce(&self, dest: &Destination, r: Produce<'_>) -> Result<(), OutputError> {
        let keyed = self.keyed;
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
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if started.elapsed() < self.timeout =>
                {
                    // The local queue is full: wait for acknowledgements.
                    record = back;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => {
                    let full = matches!(
                        e,
                        KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)
                    );
                    return Err(dest.delivery(format!(
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

    /// Wait until every record handed over so far is acknowledged by the
    /// brokers (at most the timeout).
    ///
    /// # Errors
    /// [`OutputError::Delivery`] naming the first record that failed, or
    /// the timeout.
    pub(super) fn flush(&self, dest: &Destination) -> Result<(), OutputError> {
        self.producer
            .flush(self.timeout)
            .map_err(|e| dest.delivery(format!("waiting for acknowledgements: {e}")))?;
        self.check(dest)
    }

    /// The first failed delivery, as an error.
    ///
    /// # Errors
    /// [`OutputError::Delivery`].
    pub(super) fn check(&self, dest: &Destination) -> Result<(), OutputError> {
        let first = self
            .producer
            .context()
            .first_error
            .lock()
            .ok()
            .and_then(|f| f.clone());
        match first {
            Some(m) => Err(dest.delivery(m)),
            None => Ok(()),
        }
    }
}
