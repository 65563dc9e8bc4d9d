//! Exactly once for a batch (a single host): one transactional producer
//! whose `transactional.id` is the pipeline's ([`super::transactional_id`]),
//! so a restart or a takeover fences the producer before it. A batch's
//! outputs and its input positions (the ends of its ranges, each with the
//! batch's marker) commit in one transaction (KIP-98, KIP-447), before the
//! checkpoint's commit entry is written.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::producer::Producer;

use super::OutputError;
use super::destination::{Destination, commit_failed};
use super::positions::{Positions, positions_with_marker};
use super::send::Sender;

/// The batch's transaction: its producer, the positions group, and
/// whether a transaction is open.
pub(super) struct BatchTransaction {
    pub(super) sender: Sender,
    pub(super) positions: Positions,
    /// A transaction is open (begun by the first output of a batch, or by
    /// its commit when it had none).
    open: Mutex<bool>,
    timeout: Duration,
}

impl BatchTransaction {
    /// Transactions of `sender` (transactional, registered), committing
    /// input positions to `positions`.
    pub(super) fn new(sender: Sender, positions: Positions, timeout: Duration) -> Self {
        BatchTransaction {
            sender,
            positions,
            open: Mutex::new(false),
            timeout,
        }
    }

    fn open(&self) -> MutexGuard<'_, bool> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open batch `batch`'s transaction unless it is open.
    ///
    /// # Errors
    /// [`OutputError::Transaction`].
    pub(super) fn begin(&self, batch: u64, dest: &Destination) -> Result<(), OutputError> {
        let mut open = self.open();
        if *open {
            return Ok(());
        }
        self.sender
            .producer()
            .begin_transaction()
            .map_err(|e| dest.transaction_error(batch, format!("beginning it: {e}")))?;
        *open = true;
        Ok(())
    }

    /// Commit batch `batch`'s transaction (opening it first when the
    /// batch had no output) with the input `positions` (the next offset
    /// to read of each partition) committed in it to the positions group,
    /// each with the metadata `marker` ([`super::batch_marker`]).
    /// `commit_transaction` first waits until every output is
    /// acknowledged. Returns how long the offsets and the commit took.
    ///
    /// # Errors
    /// [`OutputError::Transaction`]: the transaction is aborted when
    /// librdkafka says it can be; a fenced producer (another run of the
    /// pipeline started) or a fatal error leaves it to the next producer
    /// of the id. Either way the batch must not be recorded as done.
    pub(super) fn commit(
        &self,
        batch: u64,
        positions: &BTreeMap<(String, i32), i64>,
        marker: &str,
        dest: &Destination,
    ) -> Result<Duration, OutputError> {
        let started = Instant::now();
        let group = self.positions.metadata(batch, dest)?;
        self.begin(batch, dest)?;
        let offsets = positions_with_marker(positions, marker)
            .map_err(|e| dest.transaction_error(batch, e.to_string()))?;
        // Every output acknowledged first (the commit would wait for them
        // anyway): a failure names the output, and the transaction holds
        // all of the batch's outputs from here on.
        if let Err(e) = self.sender.flush(dest) {
            let aborted = self.abort();
            return Err(dest.transaction_error(batch, format!("{e}{aborted}")));
        }
        let producer = self.sender.producer();
        let done = super::watchdog::bounded("send_offsets_to_transaction", self.timeout, || {
            producer.send_offsets_to_transaction(&offsets, &group, self.timeout)
        })
        .map_err(|e| ("adding the input positions to it", e))
        .and_then(|()| {
            crate::util::failpoint("output:before-commit-transaction");
            producer
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
                Err(dest.transaction_error(batch, message))
            }
        }
    }

    /// Abort the open transaction, if any, of a batch that failed, so that
    /// `read_committed` readers of the output topic are not held at its
    /// first output until the transaction times out. Best effort (the next
    /// start's `init_transactions` aborts it otherwise).
    pub(super) fn abort_open(&self) {
        if !*self.open() {
            return;
        }
        *self.open() = false;
        match self.sender.producer().abort_transaction(self.timeout) {
            Ok(()) => tracing::info!("the failed batch's output transaction was aborted"),
            Err(e) => tracing::warn!(
                "aborting the failed batch's output transaction: {e} (the next start aborts it)"
            ),
        }
    }

    /// Abort the open transaction (it is closed either way), said as the
    /// end of an error message.
    fn abort(&self) -> String {
        *self.open() = false;
        match self.sender.producer().abort_transaction(self.timeout) {
            Ok(()) => "; the transaction was aborted".to_string(),
            Err(e) => format!("; aborting it failed too: {e}"),
        }
    }
}
