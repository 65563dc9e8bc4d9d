//! The micro-batch loop (DESIGN.md, "Micro-batch loop"): plan →
//! write-ahead → fetch → map chain → sink (per part of each partition's
//! range) → commit.
//!
//! Within a batch the stages overlap: a fetch thread reads the planned
//! ranges and hands over pieces of at most `MAP_PIECE_RECORDS` (2,000) records,
//! `--map-threads` map threads (each with its own instances of the map
//! chain; a range sticks to one) map the pieces while the next are read,
//! this thread takes the mapped pieces back in the order they were read,
//! and a sink thread applies each mapped piece, in order, while the next is
//! mapped (the map and sink stages are separate instances; with
//! `--sink-connections N`, N sink threads, each with its own connection
//! and sink instance, a partition's pieces all on one of them). A partition's range thus
//! reaches the sink in consecutive parts, each its own
//! `open`/`write`/`close` (one transaction with the SQL capability, whose
//! progress row records the part's end). Keys depend only on source
//! coordinates, so how a range is split does not change what the sink
//! receives, and a re-run resumes after the last part applied. (DESIGN.md
//! says "guest calls with whole batches" and one transaction per
//! partition; parts keep every guarantee, and let reading, mapping and
//! sinking overlap instead of the sink trailing the fetch.)
//!
//! One loop for every mode (DESIGN.md, "One engine, two stores"): a
//! single host is a pipeline whose store is a checkpoint directory and
//! who holds every partition under one epoch; a group member's store is
//! the sink database and it holds what the group coordinator assigns it,
//! each partition under its own owner epoch. Both reach the store only
//! through the checkpoint seam ([`crate::checkpoint::Checkpoint`]).
//!
//! Files: this one is the loop ([`run_with`]: startup, then per batch
//! boundary → plan → write-ahead → fetch, map, sink → commit → report);
//! `startup` assembles the pipeline, `open` opens a checkpoint directory
//! (`member::join` a group's store), `boundary` acts
//! on control requests (swap, handover) and group swaps between batches,
//! `plan` holds the partitions and chooses the ranges, `batch` runs one
//! batch's fetch and map (with `map_threads` mapping the pieces and
//! `sink_thread` applying the parts), `stages` loads, assembles and swaps
//! the plugins, `error` holds [`EngineError`], `config` the settings,
//! `policy` the error policy (bad records, lost data, retries),
//! `progress` the per-batch report, `member` what a group member adds
//! (claims on assign, revokes, the group's swaps), `outputs` what a
//! batch's end and a re-run ask of the Kafka output (its transaction).
//!
//! Invariants:
//! - `offsets/N` is durable before any record of batch N is read; `commits/N`
//!   is written only after every partition's sink closed cleanly. A batch
//!   that fails is never committed, so the next start re-runs it with the
//!   same ranges and therefore the same idempotency keys.
//! - Offsets are numeric everywhere; `earliest`/`latest` are resolved at the
//!   first plan of a new checkpoint only. Partitions discovered later start
//!   at their log start offset.
//! - Shutdown is injected ([`run`] takes a stop flag): a stop request lets
//!   the in-flight batch finish and commit.

mod batch;
mod boundary;
mod config;
mod error;
mod map_threads;
mod member;
mod open;
mod outputs;
mod plan;
mod policy;
mod progress;
mod sink_thread;
mod stages;
mod startup;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::checkpoint::group::GroupError;
use crate::checkpoint::{
    Batch, CheckpointError, CommitEntry, Counts, Epoch, OffsetsEntry, PluginRef,
};
use crate::sink::SinkError;
use crate::source::TopicPartition;
use crate::util::now_ms;

use batch::{BatchEnv, run_batch};
pub use config::{
    DataLossPolicy, ErrorPolicy, PipelineConfig, ProgressMode, StartingOffsets,
    default_map_threads, redact_property, shell_word,
};
pub use error::EngineError;
pub use open::Acquire;
pub use plan::ends;
use progress::ms;
pub use progress::{PartitionProgress, Progress};
pub use stages::{swap_targets, swapped_refs};

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Epoch of this run (a checkpoint directory's; 0 in a group, whose
    /// epochs are per partition).
    pub epoch: Epoch,
    /// Batch re-run at start (an uncommitted batch of a previous run).
    pub reran: Option<u64>,
    /// Batches committed by this run (including a re-run one).
    pub batches: u64,
    /// Id of the last committed batch.
    pub last_batch: Option<u64>,
    /// Totals over the run.
    pub counts: Counts,
    /// This run ended by handing the checkpoint over to a `--takeover`.
    pub handed_over: bool,
    /// With `--takeover`: old owner's last commit → our first write-ahead.
    pub takeover_gap_ms: Option<i64>,
    /// Plugins used by each committed batch (batch id, stage digests).
    pub plugins_per_batch: Vec<(u64, Vec<PluginRef>)>,
}

/// Run the pipeline until `stop` is set (or, with `until_caught_up`, until
/// the data available at start is processed, or until a `--takeover`
/// process asks for the checkpoint).
///
/// # Errors
/// [`EngineError`]; the batch in flight is not committed.
pub fn run(cfg: &PipelineConfig, stop: Arc<AtomicBool>) -> Result<RunSummary, EngineError> {
    run_with(cfg, stop, Acquire::Normal)
}

/// [`run`], choosing how the checkpoint is acquired. With `cfg.group`
/// the process runs as a member of that pipeline group until `stop` is
/// set (or, with `until_caught_up`, until every partition held is read up
/// to its high watermark and the assignment is quiet); leaving the group
/// hands its partitions to the others.
///
/// # Errors
/// As [`run`]; [`EngineError::Takeover`] when a takeover gives up (the
/// checkpoint untouched).
pub fn run_with(
    cfg: &PipelineConfig,
    stop: Arc<AtomicBool>,
    acquire: Acquire,
) -> Result<RunSummary, EngineError> {
    let mut p = startup::start(cfg, acquire)?;
    let r = run_batches(&mut p, cfg, &stop);
    if r.is_err() {
        if let Some(out) = &p.output {
            out.abort_open_transaction();
        }
        // A new checkpoint whose first batch could not even be planned
        // (the brokers did not answer, say) is not left behind.
        p.cp.discard_if_unused();
    }
    if let Some(g) = &p.group {
        if r.is_ok() {
            member::commit_before_leaving(&mut p.source, &p.holdings);
        }
        g.swaps.leave();
    }
    let (summary, handover) = r?;
    if let Some(h) = handover {
        p.hand_over(h);
    }
    Ok(summary)
}

/// Sleep up to `d`, waking early when `stop` or `wake` is set; a group
/// member answers the coordinator meanwhile.
fn idle(p: &mut startup::Pipeline, stop: &AtomicBool, d: Duration) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) && !p.wake.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        let slice = (until - now).min(Duration::from_millis(50));
        if p.group.is_some() {
            p.source.serve(slice);
        } else {
            std::thread::sleep(slice);
        }
    }
}

/// Whether the run is done with `--until-caught-up`: every partition held
/// reached the high watermark it had when first planned (and a group
/// member's assignment settled).
fn caught_up(p: &startup::Pipeline, cfg: &PipelineConfig) -> Result<bool, EngineError> {
    if !cfg.until_caught_up || !p.planner.caught_up(&p.holdings, &cfg.topics) {
        return Ok(false);
    }
    match &p.group {
        Some(g) => g.member.settled(&p.source, cfg),
        None => Ok(true),
    }
}

/// When `e` says another member holds one of our partitions now (a group
/// member's write refused): the member drops it, and the caller plans
/// again.
fn dropped_fenced(p: &startup::Pipeline, e: &GroupError) -> bool {
    p.group.as_ref().is_some_and(|g| g.member.drop_if_fenced(e))
}

/// The loop of [`run_with`]: batches until stopped, caught up or handed
/// over (the handover is returned for the caller to finish).
fn run_batches(
    p: &mut startup::Pipeline,
    cfg: &PipelineConfig,
    stop: &AtomicBool,
) -> Result<(RunSummary, Option<crate::control::Handover>), EngineError> {
    let mut summary = RunSummary {
        epoch: p.cp.epoch().unwrap_or_default(),
        ..RunSummary::default()
    };
    loop {
        // Batch boundary: act on control requests (a single host: not
        // before a re-run, an uncommitted batch is finished first) and on
        // the group's swaps.
        p.wake.store(false, Ordering::Relaxed);
        let rerun_first = p.cp.holds_all() && p.holdings.any_rerun();
        if !rerun_first && let Some(h) = boundary::serve_requests(p, cfg) {
            summary.handed_over = true;
            return Ok((summary, Some(h)));
        }
        if stop.load(Ordering::Relaxed) && !rerun_first {
            tracing::info!(
                "stop requested: the last batch is committed, {}",
                if p.group.is_some() {
                    "leaving the group"
                } else {
                    "exiting"
                }
            );
            break;
        }
        boundary::serve_group(p, cfg)?;

        // Plan and write ahead.
        let batch_started = Instant::now();
        let planned = p.planner.plan(&p.source, cfg, p.cp.as_ref(), &p.holdings)?;
        report_takeover(p, &mut summary);
        if !planned.worth_a_batch {
            // Nothing to read: stop fetching until the next batch (see
            // KafkaSource::pause); a member keeps answering the group.
            match &p.group {
                None => p.source.pause(),
                Some(g) => g.member.check_joined(&p.source, cfg)?,
            }
            if caught_up(p, cfg)? {
                tracing::info!("caught up with the data available at start");
                break;
            }
            idle(
                p,
                stop,
                cfg.trigger_interval.saturating_sub(batch_started.elapsed()),
            );
            continue;
        }
        let batch = Batch {
            entry: OffsetsEntry {
                batch_id: p.cp.next_batch_id(),
                epoch: p.cp.epoch().unwrap_or_default(),
                planned_at_ms: now_ms(),
                ranges: planned.ranges,
                plugins: p.stages.refs.clone(),
                config_digest: p.config_digest.clone(),
                note: None,
                topics: planned.topics,
                sink_db: p.sink_identity.clone(),
                output: cfg.output.as_ref().map(|o| o.identity(&cfg.brokers)),
            },
            epochs: planned.epochs,
            rerun: planned.rerun,
            started_latest: planned.started_latest,
        };
        if !batch.rerun && !p.rewind_checked {
            outputs::refuse_rewound(p, cfg, &batch.entry)?;
            p.rewind_checked = true;
        }
        match p.cp.write_ahead(&batch) {
            Ok(()) => {}
            Err(CheckpointError::Group(e)) if e.is_fenced() => {
                p.holdings.started(&batch);
                dropped_fenced(p, &e);
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        p.holdings.written_ahead(&batch);
        if !batch.rerun {
            crate::util::failpoint("engine:after-write-ahead");
        }
        let mut gaps = planned.gaps;
        let (rerun, full) = (batch.rerun, planned.full);
        let batch_id = batch.entry.batch_id;
        if let Ok(mut s) = p.status.lock() {
            s.current_batch = Some(batch_id);
        }
        let plan_ms = ms(batch_started.elapsed());

        // Exactly once to a topic: a batch planned by an earlier run is
        // not run again when its transaction committed before that run
        // stopped (the brokers hold its input positions).
        let committed_before = rerun && outputs::committed_before(p, cfg, &batch.entry)?;

        // Fetch, map and sink.
        let done = if committed_before {
            Ok(batch::BatchDone::default())
        } else {
            run_batch(
                BatchEnv {
                    cfg,
                    source: &mut p.source,
                    stages: &mut p.stages,
                    driver: &p.driver,
                    query_id: p.cp.query_id(),
                    epochs: &batch.epochs,
                    revocations: p.group.as_ref().map(|g| g.member.revocations.as_ref()),
                    metrics: &p.metrics,
                    stop,
                    output: p.output.as_deref(),
                },
                &batch.entry,
                rerun,
            )
        };
        // A group member's partitions taken during the batch: revoked
        // (drained and released already) or fenced by the database.
        let (dropped, fenced) = match &p.group {
            Some(g) => g.member.revocations.take(),
            None => Default::default(),
        };
        for e in &fenced {
            dropped_fenced(p, e);
        }
        let done = done.map_err(|e| {
            p.planner
                .explain_read_error(&p.source, cfg, &batch.entry.ranges, e)
        });
        let done = match done {
            Ok(d) => d,
            Err(EngineError::Sink(SinkError::Group(e))) if dropped_fenced(p, &e) => continue,
            Err(e) => match p.group.as_ref() {
                None => return Err(e),
                Some(g) => {
                    // A claim that failed during the batch stops the
                    // member (as at the top of the loop).
                    let changes = g
                        .member
                        .sync(&mut p.source, &p.metrics)
                        .inspect_err(|_| tracing::error!("batch {batch_id} failed: {e}"))?;
                    // A rebalance drains and releases the revoked
                    // partitions without failing the batch; only a read of
                    // a partition taken while it was being read may still
                    // end it. Its planned range is run by whoever holds it
                    // now.
                    let took = changes.revoked.iter().any(|tp| {
                        batch
                            .entry
                            .ranges
                            .iter()
                            .any(|r| r.topic == tp.0 && r.partition == tp.1)
                    });
                    for tp in &changes.revoked {
                        p.planner.forget(tp);
                    }
                    if took && matches!(e, EngineError::Source(_)) {
                        tracing::info!("a rebalance took a partition of batch {batch_id}: {e}");
                        continue;
                    }
                    return Err(e);
                }
            },
        };
        let counts = done.counts;
        if let Some(o) = cfg.output.as_ref().filter(|_| {
            counts.produced == 0
                && counts.output > 0
                && !p.stages.sinks.is_empty()
                && !p.told_sink_silent
        }) {
            p.told_sink_silent = true;
            tracing::warn!(
                "batch {batch_id}: the sink stage sent nothing to --output-topic {} (the kafka capability's kafka.send); a sink that never sends needs no --output-topic",
                o.topics.join(", ")
            );
        }
        let mut timings = done.timings;
        gaps.extend(done.gaps);
        timings.plan = plan_ms;

        // Commit the partitions still ours. A dropped partition's planned
        // range is left to its next owner.
        // Every output acknowledged (at-least-once), or committed with
        // the input positions in the batch's transaction (exactly once),
        // before the batch is recorded as done.
        if !committed_before {
            timings.transaction += outputs::finish(p, &batch.entry)?;
        }
        crate::util::failpoint("engine:before-commit");
        let commit_started = Instant::now();
        let batch = without(batch, &dropped);
        let commit = CommitEntry {
            batch_id,
            epoch: batch.entry.epoch,
            committed_at_ms: now_ms(),
            counts: counts.clone(),
            timings_ms: timings.clone(),
            plugins: p.stages.refs.clone(),
            data_loss: gaps.clone(),
            note: committed_before.then(|| {
                "its output transaction had committed before the restart: recorded as done without running it again".to_string()
            }),
        };
        let fenced = p.cp.commit(&batch, &commit)?;
        // A partition another member took meanwhile keeps its planned
        // range for that member; the others are committed all the same.
        let batch = without(
            batch,
            &fenced
                .iter()
                .filter_map(|e| match e {
                    GroupError::Fenced {
                        topic, partition, ..
                    } => Some((topic.clone(), *partition)),
                    _ => None,
                })
                .collect(),
        );
        for e in &fenced {
            dropped_fenced(p, e);
        }
        p.last_commit_ms = Some(commit.committed_at_ms);
        timings.commit = ms(commit_started.elapsed());
        p.planner.committed(&p.holdings, &batch.entry.ranges);
        // The ends applied, of the partitions still held, to the Kafka
        // consumer group (informational: never read back).
        let applied: BTreeMap<TopicPartition, i64> = ends(&batch.entry.ranges)
            .into_iter()
            .filter(|(tp, _)| p.holdings.holds(tp))
            .collect();
        p.source.commit_group(&applied);

        // Report.
        summary.batches += 1;
        summary.last_batch = Some(batch_id);
        if rerun && p.group.is_none() {
            summary.reran = Some(batch_id);
        }
        summary
            .plugins_per_batch
            .push((batch_id, p.stages.refs.clone()));
        summary.counts.add(&counts);
        let lag = p.planner.lag(&p.holdings);
        p.metrics.batch(&counts, &timings, rerun, &lag);
        let mut event = Progress::new(
            &batch.entry,
            &batch.epochs,
            rerun,
            &counts,
            &timings,
            batch_started.elapsed(),
            lag,
            &gaps,
        );
        if let Some(g) = &p.group {
            event = event.in_group(&g.name, &g.owner);
        }
        event.emit(cfg.progress);
        if let Ok(mut s) = p.status.lock() {
            s.current_batch = None;
            s.last_committed = Some(batch_id);
            s.last_progress = serde_json::to_value(&event).ok();
        }

        if caught_up(p, cfg)? {
            tracing::info!("caught up with the data available at start");
            break;
        }
        if !full {
            idle(
                p,
                stop,
                cfg.trigger_interval.saturating_sub(batch_started.elapsed()),
            );
        }
    }
    Ok((summary, None))
}

/// `batch` without the partitions in `dropped` (taken from this group
/// member during the batch or fenced at its commit), logged.
fn without(mut batch: Batch, dropped: &std::collections::BTreeSet<TopicPartition>) -> Batch {
    if dropped.is_empty() {
        return batch;
    }
    let names: Vec<String> = dropped.iter().map(|(t, p)| format!("{t}/{p}")).collect();
    tracing::info!(
        batch = batch.entry.batch_id,
        "committing batch {} without {}: taken from this member during the batch; its next owner runs the rest of the planned range",
        batch.entry.batch_id,
        names.join(", ")
    );
    batch
        .entry
        .ranges
        .retain(|r| !dropped.contains(&(r.topic.clone(), r.partition)));
    batch.epochs.retain(|tp, _| !dropped.contains(tp));
    batch
}

/// After a takeover, at our first write-ahead (planning just finished):
/// tell the old owner and record the gap.
fn report_takeover(p: &mut startup::Pipeline, summary: &mut RunSummary) {
    if let Some(t) = p.takeover.take() {
        summary.takeover_gap_ms = Some(t.report(p.cp.epoch().unwrap_or_default()));
    }
}
