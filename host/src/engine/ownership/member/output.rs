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
/// - past it (or inside the range with another batch's marker): the
///   database is older than the transactions (a restored backup, a
///   `host group reset` back, a topic created again) and running would
///   produce those outputs again: refused, unless `--output-reprocess`,
///   which moves the position back to where the claim continues.
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
    // Only per input partition (exactly once in a group).
    let Some(id) = out.claim_partition(tp).map_err(|e| e.to_string())? else {
        return Ok(());
    };
    let held = out
        .committed(std::slice::from_ref(tp))
        .map_err(|e| e.to_string())?;
    let Some((committed, metadata)) = held.get(tp).cloned() else {
        tracing::debug!(
            topic = tp.0,
            partition = tp.1,
            transactional_id = id,
            "output transactions initialized; no position committed yet"
        );
        return Ok(());
    };
    // The batch whose part committed the position, where the brokers keep
    // the metadata (nisshi 0.7.0 does not: the offset alone decides).
    let marked = crate::output::marked_batch(&metadata, cp.query_id());
    let continues = match decide(&c.start, committed, marked) {
        Decision::Record(range, batch) => {
            let recorded = cp
                .record_committed(tp, c.epoch, range, batch)
                .map_err(|e| e.to_string())?;
            if recorded {
                tracing::info!(
                    topic = tp.0,
                    partition = tp.1,
                    transactional_id = id,
                    "the output transactions of batch {batch}'s parts up to offset {committed} committed before the member that ran them recorded them: recorded applied now, not produced again"
                );
            }
            return Ok(());
        }
        Decision::Nothing => {
            tracing::debug!(
                topic = tp.0,
                partition = tp.1,
                transactional_id = id,
                committed,
                "output transactions initialized"
            );
            return Ok(());
        }
        Decision::Ahead(continues) => continues,
    };
    let at = continues.map_or_else(
        || "has no position (no progress row: a new sink database, or the topic was deleted and created again)".to_string(),
        |at| format!("continues at {at}"),
    );
    if out.reprocess() {
        tracing::warn!(
            topic = tp.0,
            partition = tp.1,
            "--output-reprocess: the output transactions committed offset {committed}, the group's checkpoint {at}; producing the outputs in between again"
        );
        // The position moves back with the checkpoint, so that no later
        // claim takes the old one for a part that committed.
        out.move_position(tp, continues.unwrap_or(0))
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    Err(format!(
        "this pipeline's output transactions committed {}/{} up to offset {committed}, but the group's checkpoint in the sink database {at}: the database is older than the transactions (restored from a backup) or was reset back, and running it would make those outputs visible twice to read_committed consumers. Restore the newest database; to produce them again on purpose (after `host group reset`), start every member once with --output-reprocess, then without it",
        tp.0, tp.1
    ))
}

/// What a claim does with the position `committed` (its part's batch
/// `marked`, when the brokers kept the metadata).
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// Record these offsets applied by this batch: parts of the planned
    /// range that committed their transaction and not their row.
    Record(std::ops::Range<i64>, u64),
    /// Nothing committed past where the claim continues.
    Nothing,
    /// Committed past where the claim continues (`None`: it has no
    /// position).
    Ahead(Option<i64>),
}

/// [`claim_output`]'s rule, for a claim that continues at `start`.
fn decide(start: &Start, committed: i64, marked: Option<u64>) -> Decision {
    let continues = match start {
        Start::Rerun(p)
            if committed > p.start && committed <= p.end && marked.is_none_or(|b| b == p.batch) =>
        {
            return Decision::Record(p.start..committed, p.batch);
        }
        Start::Rerun(p) => Some(p.start),
        Start::At(n) => Some(*n),
        Start::New => None,
    };
    // No position: offsets start at 0 (a position moved back to 0 by
    // --output-reprocess is none either).
    if committed <= continues.unwrap_or(0) {
        Decision::Nothing
    } else {
        Decision::Ahead(continues)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::group::Planned;

    fn rerun(batch: u64, start: i64, end: i64) -> Start {
        Start::Rerun(Planned {
            batch,
            start,
            end,
            plugins: Vec::new(),
        })
    }

    #[test]
    fn a_claim_records_committed_parts_of_its_range_and_refuses_positions_ahead() {
        // Parts of the planned range [100, 200) of batch 7 committed up
        // to 150 (with the batch's marker, or none kept): recorded.
        assert_eq!(
            decide(&rerun(7, 100, 200), 150, Some(7)),
            Decision::Record(100..150, 7)
        );
        assert_eq!(
            decide(&rerun(7, 100, 200), 200, None),
            Decision::Record(100..200, 7)
        );
        // Nothing of it committed (the position is the range's start or
        // below: parts without outputs commit none).
        assert_eq!(decide(&rerun(7, 100, 200), 100, Some(6)), Decision::Nothing);
        assert_eq!(decide(&rerun(7, 100, 200), 40, None), Decision::Nothing);
        // Inside the range but another batch's: an old position from
        // before a reset back, not this range's parts.
        assert_eq!(
            decide(&rerun(7, 100, 200), 150, Some(3)),
            Decision::Ahead(Some(100))
        );
        // Past the range, or past a position with no range planned.
        assert_eq!(
            decide(&rerun(7, 100, 200), 201, Some(7)),
            Decision::Ahead(Some(100))
        );
        assert_eq!(decide(&Start::At(100), 100, None), Decision::Nothing);
        assert_eq!(
            decide(&Start::At(100), 101, None),
            Decision::Ahead(Some(100))
        );
        assert_eq!(decide(&Start::New, 0, None), Decision::Nothing);
        assert_eq!(decide(&Start::New, 5, None), Decision::Ahead(None));
    }
}
