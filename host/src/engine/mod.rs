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
//! mapped (the map and sink stages are separate instances). A partition's range thus
//! reaches the sink in consecutive parts, each its own
//! `open`/`write`/`close` (one transaction with the SQL capability, whose
//! progress row records the part's end). Keys depend only on source
//! coordinates, so how a range is split does not change what the sink
//! receives, and a re-run resumes after the last part applied. (DESIGN.md
//! says "guest calls with whole batches" and one transaction per
//! partition; parts keep every guarantee, and let reading, mapping and
//! sinking overlap instead of the sink trailing the fetch.)
//!
//! Files: this one is the loop ([`run_with`]: startup, then per batch
//! boundary → plan → write-ahead → fetch, map, sink → commit → report);
//! `startup` claims the checkpoint and assembles the pipeline,
//! `boundary` acts on control requests (swap, handover) between batches,
//! `plan` chooses the ranges, `batch` runs one batch's fetch and map (with
//! `map_threads` mapping the pieces and `sink_thread` applying the parts),
//! `stages` loads, assembles and swaps the plugins, `error` holds [`EngineError`], `config` the settings,
//! `policy` the error policy (bad records, lost data, retries),
//! `progress` the per-batch report, `revoke` what a group member's batch
//! does when a rebalance takes some of its partitions.
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
mod group;
mod map_threads;
mod plan;
mod policy;
mod progress;
mod revoke;
mod sink_thread;
mod stages;
mod startup;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::checkpoint::{CommitEntry, Counts, Epoch, OffsetsEntry, PluginRef};
use crate::util::now_ms;

use batch::{BatchEnv, run_batch};
pub use config::{
    DataLossPolicy, ErrorPolicy, PipelineConfig, ProgressMode, StartingOffsets,
    default_map_threads, redact_property, shell_word,
};
pub use error::EngineError;
pub use group::run_group;
pub use plan::ends;
use progress::ms;
pub use progress::{PartitionProgress, Progress};
pub use stages::{swap_targets, swapped_refs};
pub use startup::Acquire;

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Epoch of this run.
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

/// Sleep up to `d`, waking early when `stop` or `wake` is set.
fn sleep_unless(stop: &AtomicBool, wake: &AtomicBool, d: Duration) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) && !wake.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
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

/// [`run`], choosing how the checkpoint is acquired.
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
        epoch: p.epoch,
        ..RunSummary::default()
    };
    loop {
        // Batch boundary: act on control requests (not before a re-run:
        // an uncommitted batch is finished first).
        p.wake.store(false, Ordering::Relaxed);
        if p.pending_rerun.is_none()
            && let Some(h) = boundary::serve_requests(&mut p, cfg)
        {
            summary.handed_over = true;
            p.hand_over(h);
            return Ok(summary);
        }
        if stop.load(Ordering::Relaxed) && p.pending_rerun.is_none() {
            tracing::info!("stop requested: the last batch is committed, exiting");
            break;
        }

        // Plan and write ahead (or take the batch to re-run).
        let batch_started = Instant::now();
        let rerun = p.pending_rerun.is_some();
        let (entry, mut gaps, full) = match p.pending_rerun.take() {
            Some(entry) => {
                tracing::info!(
                    batch = entry.batch_id,
                    "re-running uncommitted batch {} with its planned ranges",
                    entry.batch_id
                );
                p.planner.check_topics(&p.source, cfg, &entry)?;
                p.planner.observe_highs(&p.source, &entry)?;
                report_takeover(&mut p, &mut summary);
                (entry, Vec::new(), true)
            }
            None => {
                let planned = p.planner.plan(&p.source, cfg)?;
                report_takeover(&mut p, &mut summary);
                if !planned.worth_a_batch {
                    // Nothing to read: stop fetching until the next batch
                    // (see KafkaSource::pause).
                    p.source.pause();
                    if cfg.until_caught_up && p.planner.caught_up() {
                        tracing::info!("caught up with the data available at start");
                        break;
                    }
                    sleep_unless(
                        &stop,
                        &p.wake,
                        cfg.trigger_interval.saturating_sub(batch_started.elapsed()),
                    );
                    continue;
                }
                let entry = OffsetsEntry {
                    batch_id: p.cp.next_batch_id(),
                    epoch: p.epoch,
                    planned_at_ms: now_ms(),
                    ranges: planned.ranges,
                    plugins: p.stages.refs.clone(),
                    config_digest: p.config_digest.clone(),
                    note: None,
                    topics: planned.topics,
                    sink_db: p.sink_identity.clone(),
                };
                p.cp.append_offsets(&entry)?;
                crate::util::failpoint("engine:after-write-ahead");
                (entry, planned.gaps, planned.full)
            }
        };
        if let Ok(mut s) = p.status.lock() {
            s.current_batch = Some(entry.batch_id);
        }
        let plan_ms = ms(batch_started.elapsed());

        // Fetch, map and sink.
        let done = run_batch(
            BatchEnv {
                cfg,
                source: &mut p.source,
                stages: &mut p.stages,
                driver: &p.driver,
                query_id: &p.query_id,
                epoch: p.epoch,
                epochs: None,
                revocations: None,
                metrics: &p.metrics,
                stop: &stop,
            },
            &entry,
            rerun,
        )?;
        let counts = done.counts;
        let mut timings = done.timings;
        gaps.extend(done.gaps);
        timings.plan = plan_ms;

        // Commit.
        crate::util::failpoint("engine:before-commit");
        let commit_started = Instant::now();
        let commit = CommitEntry {
            batch_id: entry.batch_id,
            epoch: p.epoch,
            committed_at_ms: now_ms(),
            counts: counts.clone(),
            timings_ms: timings.clone(),
            plugins: p.stages.refs.clone(),
            data_loss: gaps.clone(),
            note: None,
        };
        p.cp.commit(&commit)?;
        p.last_commit_ms = Some(commit.committed_at_ms);
        timings.commit = ms(commit_started.elapsed());
        p.planner.committed(&entry);
        p.source.commit_group(&ends(&entry.ranges));

        // Report.
        summary.batches += 1;
        summary.last_batch = Some(entry.batch_id);
        if rerun {
            summary.reran = Some(entry.batch_id);
        }
        summary
            .plugins_per_batch
            .push((entry.batch_id, p.stages.refs.clone()));
        summary.counts.add(&counts);
        let lag = p.planner.lag();
        p.metrics.batch(&counts, &timings, rerun, &lag);
        let event = Progress::new(
            &entry,
            p.epoch,
            rerun,
            &counts,
            &timings,
            batch_started.elapsed(),
            lag,
            &gaps,
        );
        event.emit(cfg.progress);
        if let Ok(mut s) = p.status.lock() {
            s.current_batch = None;
            s.last_committed = Some(entry.batch_id);
            s.last_progress = serde_json::to_value(&event).ok();
        }

        if cfg.until_caught_up && p.planner.caught_up() {
            tracing::info!("caught up with the data available at start");
            break;
        }
        if !full {
            sleep_unless(
                &stop,
                &p.wake,
                cfg.trigger_interval.saturating_sub(batch_started.elapsed()),
            );
        }
    }
    Ok(summary)
}

/// After a takeover, at our first write-ahead (planning just finished):
/// tell the old owner and record the gap.
fn report_takeover(p: &mut startup::Pipeline, summary: &mut RunSummary) {
    if let Some(t) = p.takeover.take() {
        summary.takeover_gap_ms = Some(t.report(p.epoch));
    }
}
