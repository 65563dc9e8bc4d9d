//! Exactly once in a pipeline group: a transactional producer per input
//! partition the member holds, whose `transactional.id` names the group
//! and the partition ([`super::partition_transactional_id`]), so that the
//! member that claims a partition next fences the producer of the one
//! before (`init_transactions`, KIP-98) and finishes or aborts its open
//! transaction. Each part of a partition commits its outputs and the
//! partition's input position (the part's end, KIP-447's offsets in the
//! transaction) in one transaction of that producer.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::producer::Producer;

use super::OutputError;
use super::destination::{Destination, commit_failed};
use super::positions::{Positions, positions_with_marker};
use super::send::{Deliveries, Sender};
use super::settings::Settings;
use crate::capability::kafka::Sent;
use crate::plugin::PartitionContext;

/// The transactional producers of the input partitions a member holds.
pub(super) struct PartitionTransactions {
    /// The pipeline group (the prefix of each transactional id).
    group: String,
    /// The positions group on the output cluster.
    pub(super) positions: Positions,
    producers: Mutex<BTreeMap<(String, i32), Arc<PartProducer>>>,
    timeout: Duration,
}

/// One input partition's producer.
struct PartProducer {
    sender: Sender,
    /// The end of the last part it committed: a part that ends there or
    /// below is being applied again after its database commit failed,
    /// and its outputs are not produced again.
    committed_to: Mutex<Option<i64>>,
}

impl PartitionTransactions {
    /// Exactly once in pipeline group `group`: each part's outputs commit
    /// in a transaction of their input partition's own producer
    /// ([`PartitionTransactions::claim`]), with the partition's position
    /// committed to `positions`.
    pub(super) fn new(group: &str, positions: Positions, timeout: Duration) -> Self {
        PartitionTransactions {
            group: group.to_string(),
            positions,
            producers: Mutex::new(BTreeMap::new()),
            timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, i32), Arc<PartProducer>>> {
        self.producers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The producer of input partition `tp`, when this member holds it.
    fn producer(&self, tp: &(String, i32)) -> Option<Arc<PartProducer>> {
        self.lock().get(tp).cloned()
    }

    /// The transactional id of input partition `tp`.
    pub(super) fn id(&self, tp: &(String, i32)) -> String {
        super::partition_transactional_id(&self.group, &tp.0, tp.1)
    }

    /// A claim of input partition `tp`: make its transactional producer
    /// and register it (`init_transactions`), which fences the producer
    /// of the member that held `tp` before and finishes or aborts its
    /// open transaction. Replaces a producer of `tp` this member had.
    /// Returns the transactional id.
    ///
    /// # Errors
    /// [`OutputError::NoTransactions`], [`OutputError::Client`].
    pub(super) fn claim(
        &self,
        tp: &(String, i32),
        settings: &Settings,
        dest: &Destination,
    ) -> Result<String, OutputError> {
        let id = self.id(tp);
        let producer = settings.transactional(&id, Deliveries::default(), dest)?;
        let part = Arc::new(PartProducer {
            sender: Sender::new(producer, false, settings.timeout),
            committed_to: Mutex::new(None),
        });
        self.lock().insert(tp.clone(), part);
        Ok(id)
    }

    /// `tp` is no longer this member's: drop its producer (its parts
    /// all ended before a revoke releases it).
    pub(super) fn release(&self, tp: &(String, i32)) {
        self.lock().remove(tp);
    }

    /// Commit one part of input partition `part.topic/part.partition` in
    /// a transaction of the partition's producer: `records` (in order),
    /// and the position `part.end_offset` committed to the positions
    /// group with the part's batch marker ([`super::batch_marker`]).
    /// Returns how many records, and how long the transaction took.
    ///
    /// # Errors
    /// [`OutputError::Transaction`]: the transaction did not commit (it is
    /// aborted where librdkafka says it can be, else left to the
    /// partition's next owner); the part must not be recorded applied.
    pub(super) fn commit_part(
        &self,
        part: &PartitionContext,
        records: &[Sent],
        dest: &Destination,
    ) -> Result<(u64, Duration), OutputError> {
        let batch = part.batch.batch_id;
        let tp = (part.topic.clone(), part.partition);
        let Some(part_producer) = self.producer(&tp) else {
            return Err(dest.transaction_error(
                batch,
                format!(
                    "{}/{} has no transactional producer: this member does not hold the partition",
                    tp.0, tp.1
                ),
            ));
        };
        let group = self.positions.metadata(batch, dest)?;
        let mut committed_to = part_producer
            .committed_to
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(to) = *committed_to
            && part.start_offset < to
            && to < part.end_offset
        {
            // Cut otherwise than the part that committed (a batch run
            // again in this process): its outputs below `to` would be
            // produced twice. The partition's next claim sorts it out.
            return Err(dest.transaction_error(
                batch,
                format!(
                    "{}/{} [{}, {}) overlaps a part whose output transaction committed up to {to} without its database commit; stopping so that the partition's next claim records that part",
                    tp.0, tp.1, part.start_offset, part.end_offset
                ),
            ));
        }
        if committed_to.is_some_and(|to| part.end_offset <= to) {
            tracing::info!(
                topic = tp.0,
                partition = tp.1,
                "[{}, {}): its output transaction committed before its database commit failed; not produced again",
                part.start_offset,
                part.end_offset
            );
            return Ok((0, Duration::ZERO));
        }
        let sender = &part_producer.sender;
        let producer = sender.producer();
        let started = Instant::now();
        let failed = |what: &str, e: rdkafka::error::KafkaError| {
            let message = commit_failed(what, &e, || {
                match producer.abort_transaction(self.timeout) {
                    Ok(()) => "; the transaction was aborted".to_string(),
                    Err(e) => format!("; aborting it failed too: {e}"),
                }
            });
            dest.transaction_error(batch, format!("{}/{}: {message}", tp.0, tp.1))
        };
        // A failed delivery fails its own transaction only (librdkafka's
        // commit refuses a transaction with one): forget it.
        sender.forget();
        producer
            .begin_transaction()
            .map_err(|e| failed("beginning it", e))?;
        for r in records {
            if let Err(e) = sender.produce_sent(dest, r) {
                let _ = producer.abort_transaction(self.timeout);
                return Err(e);
            }
        }
        let positions = BTreeMap::from([(tp.clone(), part.end_offset)]);
        let marker = super::batch_marker(&part.batch.query_id, batch);
        let offsets = positions_with_marker(&positions, &marker)
            .map_err(|e| failed("listing the input position", e))?;
        super::watchdog::bounded("send_offsets_to_transaction", self.timeout, || {
            producer.send_offsets_to_transaction(&offsets, &group, self.timeout)
        })
        .map_err(|e| failed("adding the input position to it", e))?;
        crate::util::failpoint("output:before-commit-transaction");
        producer
            .commit_transaction(self.timeout)
            .map_err(|e| failed("committing it", e))?;
        *committed_to = Some(part.end_offset);
        sender.check(dest)?;
        Ok((records.len() as u64, started.elapsed()))
    }

    /// Move input partition `tp`'s position in the positions group to
    /// `at` (a transaction of the partition's producer with no outputs),
    /// for `--output-reprocess`: the checkpoint was moved back on purpose.
    ///
    /// # Errors
    /// [`OutputError::Transaction`] (batch 0).
    pub(super) fn move_position(
        &self,
        tp: &(String, i32),
        at: i64,
        dest: &Destination,
    ) -> Result<(), OutputError> {
        let Some(producer) = self.producer(tp) else {
            return Err(dest.client_error(format!(
                "{}/{} has no transactional producer (a bug)",
                tp.0, tp.1
            )));
        };
        let failed = |what: &str, e: rdkafka::error::KafkaError| {
            dest.transaction_error(
                0,
                format!(
                    "{}/{}: moving its position back to {at}: {what}: {e}",
                    tp.0, tp.1
                ),
            )
        };
        let group = self.positions.metadata(0, dest)?;
        let positions = BTreeMap::from([(tp.clone(), at)]);
        let offsets = positions_with_marker(&positions, "sluice:reprocess")
            .map_err(|e| failed("listing the position", e))?;
        let p = producer.sender.producer();
        p.begin_transaction().map_err(|e| failed("beginning", e))?;
        if let Err(e) =
            super::watchdog::bounded("send_offsets_to_transaction", self.timeout, || {
                p.send_offsets_to_transaction(&offsets, &group, self.timeout)
            })
        {
            let _ = p.abort_transaction(self.timeout);
            return Err(failed("adding the position", e));
        }
        p.commit_transaction(self.timeout)
            .map_err(|e| failed("committing", e))
    }
}
