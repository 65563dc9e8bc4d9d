//! What the engine asks of the Kafka output (`--output-topic`,
//! [`crate::output`]) at a batch's end, and when an earlier run's batch is
//! run again: commit the batch's transaction with its input positions
//! (exactly once) or wait for every acknowledgement (at-least-once), and
//! decide whether an interrupted batch's transaction committed.

use std::collections::BTreeMap;

use crate::checkpoint::OffsetsEntry;
use crate::output::{GroupOffsets, KafkaOutput, OutputConfig, OutputGuarantee};
use crate::source::TopicPartition;

use super::progress::ms;
use super::{EngineError, PipelineConfig, ends};

/// Refuse what exactly once to a topic cannot hold yet (exit 2, naming
/// `--output-guarantee at-least-once`): `--output-brokers` naming another
/// cluster (a cluster takes offsets only for its own topics, KIP-447).
/// Nothing without exactly once. (What each owner cannot cover is refused
/// where it opens its store.)
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
    // A sole owner refuses a sink database (`ownership::sole::open`), a
    // group member dead letters (`ownership::member::join`).
    if let Some(other) = o.brokers.as_deref().filter(|b| *b != cfg.brokers) {
        return Err(EngineError::Config(format!(
            "--output-topic {} on --output-brokers {other}: exactly once commits the input positions in the output's transaction (KIP-447), and a Kafka cluster takes offsets only for its own topics, so the output topic must be on the input's cluster (--brokers). For another cluster pass --output-guarantee at-least-once (each output carries its idempotency key in the `{}` header)",
            o.topics.join(", "),
            crate::output::IDEMPOTENCY_KEY_HEADER
        )));
    }
    Ok(())
}

/// Refuse output topics the pipeline cannot use: several for a map-only
/// pipeline (its outputs go to one), or any for a sink stage that cannot
/// send (`sink`: its file, digest and whether it imports the `kafka`
/// capability of contract 0.2.4). Checked at start (before a `--takeover`
/// asks the owner) and for a swapped-in sink.
///
/// # Errors
/// The reason, for the user.
pub(super) fn unfit_topics(
    o: &OutputConfig,
    sink: Option<(&std::path::Path, &str, bool)>,
) -> Result<(), String> {
    match sink {
        Some((path, digest, false)) => Err(format!(
            "--output-topic {} needs a sink stage that sends records (the kafka capability of contract 0.2.4), and {} (sha256 {}) does not import sluice:plugin/kafka; run a map-only pipeline to write the map's outputs to one topic, or rebuild the sink with sluice-guest 0.2.4 and kafka::send",
            o.topics.join(", "),
            path.display(),
            digest
        )),
        None if o.topics.len() > 1 => Err(format!(
            "--output-topic names {} topics ({}), but a map-only pipeline writes its outputs to one; several are for a sink stage that sends records with the kafka capability",
            o.topics.len(),
            o.topics.join(", ")
        )),
        _ => Ok(()),
    }
}

/// Exactly once, before the first batch a run plans afresh (`entry`) is
/// written ahead: refuse when the pipeline's consumer group on the output
/// cluster holds, for a partition of the batch, a position past where the
/// batch starts it. Those positions came from transactions that committed
/// outputs for the offsets in between, so running the batch would make
/// them visible twice: the checkpoint is older than its last committed
/// batch (a restored backup or copy) or was reset back. `--output-reprocess`
/// (`cfg.output.reprocess`) lets the start go on, for a reset back made on
/// purpose. ([`committed_before`] checks a re-run batch the same way.)
///
/// # Errors
/// [`EngineError::Config`] naming each such partition, both positions and
/// the batch whose transaction committed the group's (when the brokers
/// keep the metadata); [`EngineError::Output`] when the group coordinator
/// does not answer.
pub(super) fn refuse_rewound(
    out: Option<&KafkaOutput>,
    query_id: &str,
    cfg: &PipelineConfig,
    entry: &OffsetsEntry,
) -> Result<(), EngineError> {
    let Some(out) = out else {
        return Ok(());
    };
    let starts: BTreeMap<TopicPartition, i64> = entry
        .ranges
        .iter()
        .map(|r| ((r.topic.clone(), r.partition), r.start))
        .collect();
    let partitions: Vec<TopicPartition> = starts.keys().cloned().collect();
    // Per batch only: a group member checks each partition as it claims
    // it.
    match out.batch_positions(&partitions)? {
        Some(held) => rewound(query_id, cfg, &starts, &held),
        None => Ok(()),
    }
}

/// Refuse (or, with `--output-reprocess`, warn and go on) when `held`
/// (the pipeline's group offsets) is past `positions` (where this run
/// continues each partition) anywhere. See [`refuse_rewound`].
///
/// # Errors
/// [`EngineError::Config`], as [`refuse_rewound`].
fn rewound(
    query_id: &str,
    cfg: &PipelineConfig,
    positions: &BTreeMap<TopicPartition, i64>,
    held: &GroupOffsets,
) -> Result<(), EngineError> {
    let ahead: Vec<String> = positions
        .iter()
        .filter_map(|(tp, at)| {
            let (offset, metadata) = held.get(tp)?;
            (offset > at).then(|| {
                let by = crate::output::marked_batch(metadata, query_id)
                    .map(|b| format!(", by batch {b}"))
                    .unwrap_or_default();
                format!(
                    "{}/{}: the transactions committed {offset}{by}, the checkpoint continues at {at}",
                    tp.0, tp.1
                )
            })
        })
        .collect();
    if ahead.is_empty() {
        return Ok(());
    }
    if cfg.output.as_ref().is_some_and(|o| o.reprocess) {
        tracing::warn!(
            "--output-reprocess: producing again the outputs of offsets this pipeline's transactions already committed ({})",
            ahead.join("; ")
        );
        return Ok(());
    }
    let group = crate::output::transactional_id(query_id);
    Err(EngineError::Config(format!(
        "this pipeline's output transactions already committed input positions past the checkpoint's ({}; consumer group {group} on the output cluster): the checkpoint is older than its last committed batch (a restored backup or a copy) or was reset back, and running it would make the outputs of those offsets visible twice to read_committed consumers. Run the newest copy of the checkpoint; to produce them again on purpose (after `host checkpoint reset`), start once with --output-reprocess",
        ahead.join("; ")
    )))
}

/// Before batch `entry` is recorded as done: under exactly once, commit
/// its transaction with its input positions (each with the batch's
/// marker) in the pipeline's consumer group; under at-least-once, wait
/// until every output is acknowledged. Returns the transaction's time in
/// ms (0 without one).
///
/// # Errors
/// [`EngineError::Output`]: the batch must not be recorded as done.
pub(super) fn finish(
    out: Option<&KafkaOutput>,
    query_id: &str,
    entry: &OffsetsEntry,
) -> Result<f64, EngineError> {
    let Some(out) = out else {
        return Ok(0.0);
    };
    let took = out.finish_batch(
        entry.batch_id,
        &ends(&entry.ranges),
        &crate::output::batch_marker(query_id, entry.batch_id),
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
    out: Option<&KafkaOutput>,
    query_id: &str,
    cfg: &PipelineConfig,
    entry: &OffsetsEntry,
) -> Result<bool, EngineError> {
    let Some(out) = out else {
        return Ok(false);
    };
    let ends = ends(&entry.ranges);
    let partitions: Vec<TopicPartition> = ends.keys().cloned().collect();
    // Per batch only: in a group each part committed its own transaction,
    // and the claim recorded those of a planned range that committed.
    let Some(committed) = out.batch_positions(&partitions)? else {
        return Ok(false);
    };
    // Past the batch's end: later batches committed, so this checkpoint
    // is an older copy (or was reset back). Refused, or run again on
    // purpose.
    let past_end = ends
        .iter()
        .any(|(tp, end)| committed.get(tp).is_some_and(|(o, _)| o > end));
    if past_end {
        rewound(query_id, cfg, &ends, &committed)?;
        return Ok(false);
    }
    tracing::debug!(
        batch = entry.batch_id,
        "the consumer group holds {committed:?}, the batch planned {ends:?}"
    );
    let yes = crate::output::transaction_committed(
        query_id,
        entry.batch_id,
        &ends,
        &committed,
    )
    .map_err(|message| {
        EngineError::Output(out.transaction_error(
            entry.batch_id,
            format!(
                "deciding whether it committed before the restart: {message}. Did another tool commit offsets to this pipeline's consumer group {} on the output cluster?",
                crate::output::transactional_id(query_id)
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
