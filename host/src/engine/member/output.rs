//! A claim under exactly once to a topic in a pipeline group (DESIGN.md,
//! "Output to Kafka"): each part of a partition commits its outputs and
//! the partition's position (the part's end) in a Kafka transaction of
//! the partition's own producer, and then its progress row in the sink
//! database. A member that stops between the two leaves a part whose
//! transaction committed and whose row did not; the next claim finds it
//! here and records it applied, so it is not produced twice.

use crate::checkpoint::{Checkpoint, Claimed, Start};
use crate::output::KafkaOutput;
use crate::source::TopicPartition;

/// After `tp` was claimed in the database (`c`): take the partition's
/// transactional id, whose `init_transactions` fences the previous
/// owner's producer and finishes or aborts its open transaction; then
/// read the partition's position in the pipeline's consumer group on the
/// output cluster (stable offsets only) and hold it against the claim:
/// - inside the planned range `c` re-runs: the parts below it committed
///   their transactions; they are recorded applied (fenced by the new
///   epoch), and the re-run skips them as it skips any applied part;
/// - at or below where the claim continues: nothing to do (parts without
///   outputs commit no transaction);
/// - past it: the database is older than the transactions (a restored
///   backup, a `host group reset` back) and running would produce those
///   outputs again: refused, unless `--output-reprocess`.
///
/// # Errors
/// The reason, for the claim's error: the producer or the group
/// coordinator failed, the database refused the record (fenced), or the
/// position is past the claim's.
pub(super) fn claim_output(
    cp: &dyn Checkpoint,
    out: &KafkaOutput,
    tp: &TopicPartition,
    c: &Claimed,
) -> Result<(), String> {
    let id = out.claim_partition(tp).map_err(|e| e.to_string())?;
    let held = out
        .committed(std::slice::from_ref(tp))
        .map_err(|e| e.to_string())?;
    let Some((committed, _)) = held.get(tp).cloned() else {
        tracing::debug!(
            topic = tp.0,
            partition = tp.1,
            transactional_id = id,
            "output transactions initialized; no position committed yet"
        );
        return Ok(());
    };
    let continues = match &c.start {
        Start::Rerun(p) if committed > p.start && committed <= p.end => {
            let recorded = cp
                .record_committed(tp, c.epoch, p.start..committed, p.batch)
                .map_err(|e| e.to_string())?;
            if !recorded {
                return Ok(());
            }
            tracing::info!(
                topic = tp.0,
                partition = tp.1,
                transactional_id = id,
                "the output transactions of batch {}'s parts up to offset {committed} committed before the member that ran them recorded them: recorded applied now, not produced again",
                p.batch
            );
            return Ok(());
        }
        Start::Rerun(p) => Some(p.start),
        Start::At(n) => Some(*n),
        Start::New => None,
    };
    if continues.is_some_and(|at| committed <= at) {
        tracing::debug!(
            topic = tp.0,
            partition = tp.1,
            transactional_id = id,
            committed,
            "output transactions initialized"
        );
        return Ok(());
    }
    let at = continues.map_or_else(
        || "has no position (no progress row)".to_string(),
        |at| format!("continues at {at}"),
    );
    if out.reprocess() {
        tracing::warn!(
            topic = tp.0,
            partition = tp.1,
            "--output-reprocess: the output transactions committed offset {committed}, the group's checkpoint {at}; producing the outputs in between again"
        );
        return Ok(());
    }
    Err(format!(
        "this pipeline's output transactions committed {}/{} up to offset {committed}, but the group's checkpoint in the sink database {at}: the database is older than the transactions (restored from a backup) or was reset back, and running it would make those outputs visible twice to read_committed consumers. Restore the newest database; to produce them again on purpose (after `host group reset`), start the members once with --output-reprocess",
        tp.0, tp.1
    ))
}
