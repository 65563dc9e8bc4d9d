//! Where a pipeline's outputs go (the output topics and their cluster),
//! and the wording of every error that names them: a producer that cannot
//! be made, a delivery that failed, a transaction that did not commit.

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::OutputError;

/// The output topics, each with its partition count (in the order given:
/// a map-only pipeline's outputs go to the first), and the output
/// cluster's bootstrap servers.
pub(super) struct Destination {
    pub(super) topics: Vec<(String, i32)>,
    pub(super) brokers: String,
}

impl Destination {
    /// The output topics, for messages: `a, b`.
    pub(super) fn topic_list(&self) -> String {
        let names: Vec<&str> = self.topics.iter().map(|(t, _)| t.as_str()).collect();
        names.join(", ")
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
    pub(super) fn transaction_error(&self, batch: u64, message: String) -> OutputError {
        OutputError::Transaction {
            batch,
            topic: self.topic_list(),
            brokers: self.brokers.clone(),
            message,
        }
    }

    /// [`OutputError::Delivery`] on this output.
    pub(super) fn delivery(&self, message: String) -> OutputError {
        OutputError::Delivery {
            topic: self.topic_list(),
            brokers: self.brokers.clone(),
            message,
        }
    }

    /// [`OutputError::NoTransactions`] on this output.
    pub(super) fn no_transactions(&self, message: String) -> OutputError {
        OutputError::NoTransactions {
            topic: self.topic_list(),
            brokers: self.brokers.clone(),
            message,
        }
    }
}

/// What to say of a transaction that failed at `what` with `e`; `abort`
/// is called (and its answer added) when librdkafka says the transaction
/// can be aborted (rust-rdkafka's `txn_requires_abort`). A fenced
/// producer's is left to the producer that fenced it.
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
