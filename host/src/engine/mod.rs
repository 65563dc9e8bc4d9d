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
mod batch_run;
mod config;
mod error;
mod map_threads;
mod open;
mod outputs;
mod ownership;
mod plan;
mod policy;
mod progress;
mod sink_thread;
mod stages;
mod startup;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

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
use ownership::Next;
pub use plan::ends;
use progress::ms;
pub use progress::{PartitionProgress, Progress};
pub use stages::{swap_targets, swapped_refs};
use startup::Pipeline;

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Epoch of this run (a checkpoint directory's; 0 in a group, whose
    /// epochs are per partition).
    pub epoch: Epoch,
    /// Batch re-run at start: the run's first batch, when it ran again
    /// what a previous run planned and did not commit (a group member's
    /// too, for the planned ranges its claims found).
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
    let mut summary = RunSummary {
        epoch: p.cp.epoch().unwrap_or_default(),
        ..RunSummary::default()
    };
    let r = run_batches(&mut p, cfg, &stop, &mut summary);
    if r.is_err() {
        if let Some(out) = &p.output {
            out.abort_open_transaction();
        }
        // A new checkpoint whose first batch could not even be planned
        // (the brokers did not answer, say) is not left behind.
        p.cp.discard_if_unused();
    }
    match r {
        Ok(handover) => {
            summary.handed_over = handover.is_some();
            p.leave(true, handover);
            Ok(summary)
        }
        Err(e) => {
            p.leave(false, None);
            Err(e)
        }
    }
}

/// The loop of [`run_with`]: batches until stopped, caught up or handed
/// over (the handover is returned for the owner to finish). Each turn:
/// boundary → plan → write-ahead → fetch, map, sink → commit → report.
fn run_batches(
    p: &mut Pipeline,
    cfg: &PipelineConfig,
    stop: &AtomicBool,
    summary: &mut RunSummary,
) -> Result<Option<crate::control::Handover>, EngineError> {
    loop {
        // Batch boundary: the owner acts on what changed since the last.
        let stopping = stop.load(Ordering::Relaxed);
        match p.with_owner(cfg, |owner, at| owner.at_boundary(at, stopping))? {
            Next::Plan => {}
            Next::Stop => break,
            Next::HandOver(h) => return Ok(Some(h)),
        }

        // Plan and write ahead.
        let batch_started = Instant::now();
        let knows = p.owner.knows_holdings(&p.source);
        let mut planned = p.planner.plan(
            &p.source,
            cfg,
            p.cp.as_ref(),
            &p.holdings,
            p.owner.as_ref(),
            knows,
        )?;
        if let Some(gap) = p.owner.took_over(p.cp.as_ref()) {
            summary.takeover_gap_ms = Some(gap);
        }
        if !planned.worth_a_batch {
            p.owner.nothing_to_read(&mut p.source, cfg)?;
            if caught_up(p, cfg)? {
                break;
            }
            let left = cfg.trigger_interval.saturating_sub(batch_started.elapsed());
            p.owner.idle(&mut p.source, stop, left);
            continue;
        }
        let mut gaps = std::mem::take(&mut planned.gaps);
        let full = planned.full;
        let Some(batch) = write_ahead(p, cfg, planned)? else {
            continue;
        };
        let (rerun, batch_id) = (batch.rerun, batch.entry.batch_id);
        let plan_ms = ms(batch_started.elapsed());

        // Exactly once to a topic: a batch planned by an earlier run is
        // not run again when its transaction committed before that run
        // stopped (the brokers hold its input positions).
        let committed_before = rerun
            && outputs::committed_before(p.output.as_deref(), p.cp.query_id(), cfg, &batch.entry)?;

        // Fetch, map and sink.
        let Some(done) = apply(p, cfg, stop, &batch, committed_before)? else {
            continue;
        };
        let counts = done.counts;
        warn_sink_silent(p, cfg, batch_id, &counts);
        let mut timings = done.timings;
        gaps.extend(done.gaps);
        timings.plan = plan_ms;

        // Commit the partitions still ours. Every output acknowledged
        // (at-least-once), or committed with the input positions in the
        // batch's transaction (exactly once), before the batch is recorded
        // as done.
        if !committed_before {
            timings.transaction +=
                outputs::finish(p.output.as_deref(), p.cp.query_id(), &batch.entry)?;
        }
        crate::util::failpoint("engine:before-commit");
        let commit_started = Instant::now();
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
        let batch = commit_batch(p, batch, &commit)?;
        timings.commit = ms(commit_started.elapsed());

        // Report.
        if rerun && summary.batches == 0 {
            summary.reran = Some(batch_id);
        }
        summary.batches += 1;
        summary.last_batch = Some(batch_id);
        summary
            .plugins_per_batch
            .push((batch_id, p.stages.refs.clone()));
        summary.counts.add(&counts);
        let lag = p.planner.lag(&p.holdings);
        p.metrics.batch(&counts, &timings, rerun, &lag);
        let event = Progress::new(
            &batch.entry,
            &batch.epochs,
            rerun,
            &counts,
            &timings,
            batch_started.elapsed(),
            lag,
            &gaps,
        );
        let event = p.owner.label(event);
        event.emit(cfg.progress);
        if let Ok(mut s) = p.status.lock() {
            s.current_batch = None;
            s.last_committed = Some(batch_id);
            s.last_progress = serde_json::to_value(&event).ok();
        }

        if caught_up(p, cfg)? {
            break;
        }
        if !full {
            let left = cfg.trigger_interval.saturating_sub(batch_started.elapsed());
            p.owner.idle(&mut p.source, stop, left);
        }
    }
    Ok(None)
}

/// Write the planned batch ahead. `None` when a partition turned out
/// fenced (dropped, or claimed again): the loop plans again.
///
/// # Errors
/// The checkpoint's.
fn write_ahead(
    p: &mut Pipeline,
    cfg: &PipelineConfig,
    planned: plan::Planned,
) -> Result<Option<Batch>, EngineError> {
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
        outputs::refuse_rewound(p.output.as_deref(), p.cp.query_id(), cfg, &batch.entry)?;
        p.rewind_checked = true;
    }
    match p.cp.write_ahead(&batch) {
        Ok(()) => {}
        Err(CheckpointError::Group(e)) if e.is_fenced() => {
            p.holdings.started(&batch);
            if let Some(f) = e.fenced() {
                p.owner.fenced(&f);
            }
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    }
    p.holdings.written_ahead(&batch);
    if !batch.rerun {
        crate::util::failpoint("engine:after-write-ahead");
    }
    if let Ok(mut s) = p.status.lock() {
        s.current_batch = Some(batch.entry.batch_id);
    }
    Ok(Some(batch))
}

/// Fetch, map and sink `batch` (nothing when its output transaction
/// committed before). The partitions the gate dropped during it are left
/// out of the batch; `None` when the failure was the owner's to absorb
/// (a partition fenced or taken by a rebalance): the loop plans again.
///
/// # Errors
/// The batch's, when the owner does not absorb it.
fn apply(
    p: &mut Pipeline,
    cfg: &PipelineConfig,
    stop: &AtomicBool,
    batch: &Batch,
    committed_before: bool,
) -> Result<Option<batch::BatchDone>, EngineError> {
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
                gate: p.owner.gate(),
                metrics: &p.metrics,
                stop,
                output: p.output.as_deref(),
            },
            &batch.entry,
            batch.rerun,
        )
    };
    let done = done.map_err(|e| {
        p.planner
            .explain_read_error(&p.source, cfg, &batch.entry.ranges, e)
    });
    let Err(e) = done else {
        return Ok(done.ok());
    };
    // The partitions the database fenced during the batch are dropped
    // (or claimed again) before anything else.
    let (_, fenced) = p.owner.gate().take();
    for f in &fenced {
        p.owner.fenced(f);
    }
    if let EngineError::Sink(SinkError::Group(g)) = &e
        && g.fenced().is_some_and(|f| p.owner.fenced(&f))
    {
        return Ok(None);
    }
    p.with_owner(cfg, |owner, at| owner.batch_failed(at, &batch.entry, e))?;
    Ok(None)
}

/// Commit `batch` without the partitions dropped during it (taken from
/// this member, or fenced by the store at the commit): their planned
/// ranges are left to their next owner. Returns the batch committed.
///
/// # Errors
/// The checkpoint's.
fn commit_batch(
    p: &mut Pipeline,
    batch: Batch,
    commit: &CommitEntry,
) -> Result<Batch, EngineError> {
    let (dropped, fenced) = p.owner.gate().take();
    for f in &fenced {
        p.owner.fenced(f);
    }
    let batch = without(batch, &dropped);
    let fenced = p.cp.commit(&batch, commit)?;
    let batch = without(batch, &fenced.iter().map(|f| f.partition.clone()).collect());
    for f in &fenced {
        p.owner.fenced(f);
    }
    p.last_commit_ms = Some(commit.committed_at_ms);
    p.planner.committed(&p.holdings, &batch.entry.ranges);
    // The ends applied, of the partitions still held, to the Kafka
    // consumer group (informational: never read back).
    let applied: BTreeMap<TopicPartition, i64> = ends(&batch.entry.ranges)
        .into_iter()
        .filter(|(tp, _)| p.holdings.holds(tp))
        .collect();
    p.source.commit_group(&applied);
    Ok(batch)
}

/// Once a run: the sink stage sent nothing to the output topics it may
/// send to.
fn warn_sink_silent(p: &mut Pipeline, cfg: &PipelineConfig, batch_id: u64, counts: &Counts) {
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
}

/// Whether the run is done with `--until-caught-up`: every partition held
/// reached the high watermark it had when first planned, and the owner's
/// holdings settled (said so).
fn caught_up(p: &Pipeline, cfg: &PipelineConfig) -> Result<bool, EngineError> {
    if !cfg.until_caught_up || !p.planner.caught_up(&p.holdings, &cfg.topics) {
        return Ok(false);
    }
    let settled = p.owner.settled(&p.source, cfg)?;
    if settled {
        tracing::info!("caught up with the data available at start");
    }
    Ok(settled)
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
