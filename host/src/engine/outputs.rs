//! What the engine asks of the Kafka output (`--output-topic`,
//! [`crate::output`]) at a batch's end, and when an earlier run's batch is
//! run again: commit the batch's transaction with its input positions
//! (exactly once) or wait for every acknowledgement (at-least-once), and
//! decide whether an interrupted batch's transaction committed.

use crate::checkpoint::OffsetsEntry;
use crate::output::OutputGuarantee;
use crate::source::TopicPartition;

use super::progress::ms;
use super::{EngineError, PipelineConfig, ends, startup};

/// Refuse what exactly once to a topic cannot hold yet (exit 2, each
/// naming `--output-guarantee at-least-once`): a pipeline group (it needs
/// a producer per member), a `--sink-db` (a part's progress row and dead
/// letters would commit before the batch's Kafka transaction) and
/// `--output-brokers` naming another cluster (a cluster takes offsets
/// only for its own topics, KIP-447). Nothing without exactly once.
///
/// # Errors
/// [`EngineError::Config`] saying which and why.
pub(super) fn refuse_unfit_exactly_once(cfg: &PipelineConfig) -> Result<(), EngineError> {
    let Some(o) = cfg
        .output
        .as_ref()
        .filter(|o| o.guarantee == OutputGuarantee::ExactlyOnce)
    else {
        return Ok(());
    };
    if cfg.group.is_some() {
        return Err(EngineError::Config(format!(
            "--output-topic {} in a pipeline group: exactly once (per-member transactions) is not built yet for groups; pass --output-guarantee at-least-once (an idempotent producer; each output carries its idempotency key in the `{}` header so consumers can drop duplicates), or run a single host",
            o.topics.join(", "),
            crate::output::IDEMPOTENCY_KEY_HEADER
        )));
    }
    if cfg.sink_db.is_some() {
        return Err(EngineError::Config(format!(
            "--output-topic {} with --sink-db: exactly once cannot cover both yet (a part's progress row and dead letters would commit in the database before the batch's Kafka transaction, so a crash between the two would lose that part's outputs). Drop --sink-db (and --on-error dlq), or pass --output-guarantee at-least-once (outputs acknowledged before each progress row)",
            o.topics.join(", ")
        )));
    }
    if let Some(other) = o.brokers.as_deref().filter(|b| *b != cfg.brokers) {
        return Err(EngineError::Config(format!(
            "--output-topic {} on --output-brokers {other}: exactly once commits the input positions in the output's transaction (KIP-447), and a Kafka cluster takes offsets only for its own topics, so the output topic must be on the input's cluster (--brokers). For another cluster pass --output-guarantee at-least-once (each output carries its idempotency key in the `{}` header)",
            o.topics.join(", "),
            crate::output::IDEMPOTENCY_KEY_HEADER
        )));
    }
    Ok(())
}

/// Before batch `entry` is recorded as done: under exactly once, commit
/// its transaction with its input positions (each with the batch's
/// marker) in the pipeline's consumer group; under at-least-once, wait
/// until every output is acknowledged. Returns the transaction's time in
/// ms (0 without one).
///
/// # Errors
/// [`EngineError::Output`]: the batch must not be recorded as done.
pub(super) fn finish(p: &startup::Pipeline, entry: &OffsetsEntry) -> Result<f64, EngineError> {
    let Some(out) = &p.output else {
        return Ok(0.0);
    };
    if !out.exactly_once() {
        out.flush()?;
        return Ok(0.0);
    }
    let took = out.commit_transaction(
        entry.batch_id,
        &ends(&entry.ranges),
        &crate::output::batch_marker(p.cp.query_id(), entry.batch_id),
    )?;
    Ok(ms(took))
}

/// Exactly once to a topic: whether the transaction of `entry`, a batch
/// an earlier run planned and did not record as done, committed. The
/// producer's `init_transactions` at start finished or aborted that run's
/// transaction; the consumer group's committed offsets then tell which
/// ([`crate::output::transaction_committed`]), read on the output
/// cluster, whose coordinator keeps them. `false` without exactly
/// once.
///
/// # Errors
/// [`EngineError::Output`] when the group coordinator does not answer or
/// the group's offsets contradict the checkpoint (something else
/// committed to the pipeline's group).
pub(super) fn committed_before(
    p: &startup::Pipeline,
    entry: &OffsetsEntry,
) -> Result<bool, EngineError> {
    let Some(out) = p.output.as_ref().filter(|o| o.exactly_once()) else {
        return Ok(false);
    };
    let ends = ends(&entry.ranges);
    let partitions: Vec<TopicPartition> = ends.keys().cloned().collect();
    let committed = out.committed(&partitions)?;
    tracing::debug!(
        batch = entry.batch_id,
        "the consumer group holds {committed:?}, the batch planned {ends:?}"
    );
    let yes = crate::output::transaction_committed(
        p.cp.query_id(),
        entry.batch_id,
        &ends,
        &committed,
    )
    .map_err(|message| {
        EngineError::Output(out.transaction_error(
            entry.batch_id,
            format!(
                "deciding whether it committed before the restart: {message}. Did another tool commit offsets to this pipeline's consumer group {} on the output cluster?",
                crate::output::transactional_id(p.cp.query_id())
            ),
        ))
    })?;
    tracing::info!(
        batch = entry.batch_id,
        "batch {} was planned by an earlier run: its output transaction {}",
        entry.batch_id,
        if yes {
            "committed, so it is recorded as done without running it again"
        } else {
            "did not commit (aborted, or never begun), so it runs again"
        }
    );
    Ok(yes)
}
