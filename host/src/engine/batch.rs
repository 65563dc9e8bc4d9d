//! One batch: a fetch thread reads the planned ranges in pieces, the map
//! threads (`map_threads`) map them, this thread takes each mapped piece
//! back in the order it was read, and a sink thread (one per sink
//! connection, a range's parts all on one) applies each as a part of its
//! range; the error policy decides about bad records on both sides.
//! Nothing here commits: the loop in `engine` does, after [`run_batch`]
//! returned success.

use crossbeam_channel::SendTimeoutError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::checkpoint::{Counts, DataLossGap, Epoch, OffsetsEntry, PartitionRange, Timings};
use crate::metrics::Metrics;
use crate::plugin::CallContext;
use crate::sink::SinkDriver;
use crate::source::{Handoff, KafkaSource, Piece, TopicPartition};

use super::batch_run::{BatchRun, RangeState};
use super::map_threads::{MapEnv, MapPool, Mapped, map_thread};
use super::ownership::gate::PartitionGate;
use super::policy::on_data_loss;
use super::progress::ms;
use super::sink_thread::{
    SINK_QUEUE, SinkEnv, SinkJob, SinkPolicy, SinkReport, lanes_of, run_sink,
};
use super::stages::Stages;
use super::{EngineError, PipelineConfig};

/// Pieces queued between the fetch thread and the map at most.
pub(super) const PIECE_QUEUE: usize = 4;

/// Records handed to one map call at most: the fetch thread delivers
/// pieces of this size, so the map of one piece overlaps the reading of
/// the next (2,000 records of ~200 bytes: ~0.4 MB, a few ms of mapping).
pub(super) const MAP_PIECE_RECORDS: usize = 2_000;

/// Sets its flag when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What a batch runs with: the pipeline's parts, borrowed for one batch.
pub(super) struct BatchEnv<'a> {
    pub(super) cfg: &'a PipelineConfig,
    pub(super) source: &'a mut KafkaSource,
    pub(super) stages: &'a mut Stages,
    pub(super) driver: &'a SinkDriver,
    /// The checkpoint's query id (in every idempotency key).
    pub(super) query_id: &'a str,
    /// Each planned partition's owner epoch (one for every partition of a
    /// checkpoint directory, also when re-running a batch planned by an
    /// older owner): its map and sink calls carry it, and the sink fences
    /// on it.
    pub(super) epochs: &'a BTreeMap<TopicPartition, Epoch>,
    /// The partitions a rebalance or the database's fencing takes during
    /// the batch (a group member's; a sole owner's gate never drops one).
    /// Their parts not started are abandoned, the batch goes on with the
    /// others, and the fetch thread answers rebalances until the sink has
    /// finished.
    pub(super) gate: &'a PartitionGate,
    pub(super) metrics: &'a Metrics,
    /// Set when the user asked to stop: map no further piece.
    pub(super) stop: &'a AtomicBool,
    /// The producer of the outputs (`--output-topic`).
    pub(super) output: Option<&'a crate::output::KafkaOutput>,
}

/// `s.spawn(f)` with a thread name (shown by `top -H`, `perf report
/// --sort comm` and panic messages).
///
/// # Panics
/// When the OS cannot start a thread, as `s.spawn` does.
fn spawn_named<'scope, 'env, T: Send + 'scope>(
    s: &'scope std::thread::Scope<'scope, 'env>,
    name: String,
    f: impl FnOnce() -> T + Send + 'scope,
) -> std::thread::ScopedJoinHandle<'scope, T> {
    std::thread::Builder::new()
        .name(name.clone())
        .spawn_scoped(s, f)
        .unwrap_or_else(|e| panic!("cannot start the {name} thread: {e}"))
}

/// What a batch did, for its commit entry.
#[derive(Default)]
pub(super) struct BatchDone {
    pub(super) counts: Counts,
    /// Fetch, map and sink times; plan and commit are the caller's.
    pub(super) timings: Timings,
    /// For a re-run: planned offsets found deleted (`--on-data-loss skip`).
    pub(super) gaps: Vec<DataLossGap>,
}

/// Fetch, map and sink one batch, planned as `entry` (`rerun`: by an
/// earlier run that did not commit it).
///
/// # Errors
/// Any [`EngineError`]; the batch must then not be committed.
pub(super) fn run_batch(
    env: BatchEnv<'_>,
    entry: &OffsetsEntry,
    rerun: bool,
) -> Result<BatchDone, EngineError> {
    let BatchEnv {
        cfg,
        source,
        stages,
        driver,
        query_id,
        epochs,
        gate,
        metrics,
        stop,
        output,
    } = env;
    let mut timings = Timings::default();
    let (ranges, gaps) = ranges_to_read(source, cfg, entry, rerun)?;
    let (range_epochs, ctxs) = call_contexts(entry, epochs, query_id);
    let Stages {
        maps, sinks, files, ..
    } = stages;
    // One sink thread per connection, each with the sink instance granted
    // that connection (none: no sink stage, only progress rows).
    let lanes = driver.connections();
    if !sinks.is_empty() && sinks.len() != lanes {
        return Err(EngineError::Internal(format!(
            "{} sink instances for {lanes} sink connections",
            sinks.len()
        )));
    }
    let sink_failed = AtomicBool::new(false);
    let (sink_txs, sink_rxs): (Vec<_>, Vec<_>) = (0..lanes)
        .map(|_| std::sync::mpsc::sync_channel::<SinkJob>(SINK_QUEUE))
        .unzip();
    let sink_env = SinkEnv {
        driver,
        policy: SinkPolicy {
            on_error: cfg.on_error,
            stage: maps.first().map_or(0, Vec::len),
            attempts: cfg.attempts,
        },
        metrics,
        ranges: entry.ranges.len(),
        gate,
        failed: &sink_failed,
        output,
    };
    let map_env = MapEnv {
        ranges: &entry.ranges,
        ctxs: &ctxs,
        on_error: cfg.on_error,
        attempts: cfg.attempts,
        gate,
        metrics,
        stop,
    };
    // The fetch thread reads pieces, this thread hands each to a map
    // thread (`--map-threads`) as it arrives and takes the mapped pieces
    // back in the same order, and the sink threads (`--sink-connections`)
    // apply each as a part of its range while the next is read and mapped.
    let mut fetch_time = Duration::ZERO;
    let cancel = AtomicBool::new(false);
    // Set once the sink threads have ended: the fetch thread stops serving.
    let sunk = AtomicBool::new(false);
    let (mut counts, map_time, report) = std::thread::scope(|s| {
        let mut instances = sinks.iter_mut();
        let sinkers: Vec<_> = sink_rxs
            .into_iter()
            .enumerate()
            .map(|(lane, rx)| {
                let instance = instances.next();
                let env = &sink_env;
                let name = match lanes {
                    1 => "sluice-sink".to_string(),
                    _ => format!("sluice-sink-{lane}"),
                };
                spawn_named(s, name, move || {
                    // Log lines of a sink thread name its connection.
                    let _span = (lanes > 1)
                        .then(|| tracing::info_span!("sink", connection = lane).entered());
                    run_sink(rx, lane, instance, env)
                })
            })
            .collect();
        // Ends the fetch thread's serving even if this closure panics (the
        // scope then joins the threads).
        let _sunk_on_unwind = SetOnDrop(&sunk);
        // Owned by this closure, so that even a panic here drops the sink
        // queue's sender and the sink thread ends (the scope joins it).
        let mut run = BatchRun {
            cfg,
            files,
            entry,
            ctxs: &ctxs,
            epochs: &range_epochs,
            gate,
            states: entry.ranges.iter().map(|_| RangeState::default()).collect(),
            counts: Counts::default(),
            map_time: Duration::ZERO,
            sinks: sink_txs,
            lanes: lanes_of(&entry.ranges, lanes),
            sink_failed: &sink_failed,
        };
        // Bounded, like the sink queue: when the map falls behind, records
        // wait in librdkafka's own (bounded) queue, not here.
        let (tx, rx) = crossbeam_channel::bounded::<Piece>(PIECE_QUEUE);
        let fetch_ranges = &ranges;
        let cancel_ref = &cancel;
        let sunk_ref = &sunk;
        let fetcher = spawn_named(s, "sluice-fetch".into(), move || {
            let t = Instant::now();
            let r = source.fetch(
                fetch_ranges,
                MAP_PIECE_RECORDS,
                cancel_ref,
                &mut |p, wait| match tx.send_timeout(p, wait) {
                    Ok(()) => Handoff::Taken,
                    Err(SendTimeoutError::Timeout(p)) => Handoff::Busy(p),
                    Err(SendTimeoutError::Disconnected(_)) => Handoff::Closed,
                },
            );
            let took = t.elapsed();
            drop(tx);
            // Until the sinks have applied the batch, a group member goes
            // on answering the coordinator, keeping about one batch's
            // worth of what arrives (see `PartitionGate::serve_until`).
            if r.is_ok() {
                let ahead = fetch_ranges
                    .iter()
                    .map(|r| usize::try_from(r.end - r.start).unwrap_or(0))
                    .sum::<usize>()
                    .max(MAP_PIECE_RECORDS);
                gate.serve_until(source, sunk_ref, ahead);
            }
            (r, took)
        });
        // One sender and one receiver per map thread; dropping the pool
        // ends the threads (after the call they are in).
        let mut pool = {
            let (mut jobs, mut answers) = (Vec::new(), Vec::new());
            for (n, chain) in maps.iter_mut().enumerate() {
                let (job_tx, job_rx) = std::sync::mpsc::channel::<Piece>();
                let (answer_tx, answer_rx) = std::sync::mpsc::channel::<Mapped>();
                let env = &map_env;
                spawn_named(s, format!("sluice-map-{n}"), move || {
                    map_thread(chain, env, job_rx, answer_tx)
                });
                jobs.push(job_tx);
                answers.push(answer_rx);
            }
            MapPool::new(jobs, answers)
        };
        let processed = (|| -> Result<(), EngineError> {
            // Planned ranges that a re-run found wholly deleted: nothing to
            // read, but their sinks still record the range as applied.
            for (i, (planned, read)) in entry.ranges.iter().zip(&ranges).enumerate() {
                if planned.start != planned.end && read.start == read.end {
                    run.finish(i)?;
                }
            }
            for piece in rx.iter() {
                pool.hand_out(piece)?;
                while pool.full()
                    && let Some(mapped) = pool.next()?
                {
                    run.take_mapped(mapped)?;
                }
            }
            while let Some(mapped) = pool.next()? {
                run.take_mapped(mapped)?;
            }
            Ok(())
        })();
        drop(pool);
        // Stops the fetch thread if we failed.
        cancel.store(true, Ordering::Relaxed);
        drop(rx);
        // Closes the sink queues: each sink thread applies what is queued
        // and ends.
        run.sinks.clear();
        let reports: Vec<_> = sinkers.into_iter().map(|h| h.join()).collect();
        sunk.store(true, Ordering::Relaxed);
        let (fetched, took) = match fetcher.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        fetch_time = took;
        let report = one_report(processed, reports, entry.ranges.len())?;
        if let Err(e) = fetched {
            return Err(e.into());
        }
        // Every planned non-empty range must have been read, mapped and
        // handed to the sink (which applied every part) before the batch
        // may commit.
        for (i, (planned, state)) in entry.ranges.iter().zip(&run.states).enumerate() {
            if planned.start != planned.end && !state.finished && !run.dropped(i) {
                return Err(EngineError::Internal(format!(
                    "the fetch ended without finishing {}/{} [{}, {})",
                    planned.topic, planned.partition, planned.start, planned.end
                )));
            }
        }
        Ok((run.counts, run.map_time, report))
    })?;
    timings.fetch = ms(fetch_time);
    add_sink_report(&mut counts, &report, entry, gate);
    timings.map = ms(map_time);
    timings.sink = ms(report.time);
    timings.transaction = ms(report.transactions);
    Ok(BatchDone {
        counts,
        timings,
        gaps,
    })
}

/// The ranges a batch reads: its planned ones, but a re-run's may have
/// lost their start to retention since they were planned (the data-loss
/// policy decides; the gaps are returned).
///
/// # Errors
/// [`EngineError::BeyondEnd`] when the log is shorter than the planned
/// end, the data-loss policy's, the source's.
fn ranges_to_read(
    source: &KafkaSource,
    cfg: &PipelineConfig,
    entry: &OffsetsEntry,
    rerun: bool,
) -> Result<(Vec<PartitionRange>, Vec<DataLossGap>), EngineError> {
    // A re-run may find part of its planned range deleted by retention since
    // it was planned: the data-loss policy applies here too.
    let mut ranges = entry.ranges.clone();
    let mut gaps = Vec::new();
    if rerun {
        for r in ranges.iter_mut().filter(|r| r.end > r.start) {
            let (low, high) = source.watermarks(&r.topic, r.partition)?;
            if high < r.end {
                // The log is shorter than when the batch was planned: it
                // was truncated or recreated (on a broker without topic
                // ids; with them the planner has refused it already).
                return Err(EngineError::BeyondEnd {
                    topic: r.topic.clone(),
                    partition: r.partition,
                    position: r.end,
                    high,
                    reset: cfg.reset_command(&r.topic),
                });
            }
            if low > r.start {
                // The error names what was deleted; the gap, what of this
                // range is lost.
                let mut gap = on_data_loss(
                    cfg.on_data_loss,
                    &r.topic,
                    r.partition,
                    (r.start, low),
                    "re-run batch",
                )?;
                gap.to = gap.to.min(r.end);
                r.start = gap.to;
                gaps.push(gap);
            }
        }
    }
    Ok((ranges, gaps))
}

/// Each range's owner epoch, and the call context its map and sink calls
/// carry.
fn call_contexts(
    entry: &OffsetsEntry,
    epochs: &BTreeMap<TopicPartition, Epoch>,
    query_id: &str,
) -> (Vec<Epoch>, Vec<CallContext>) {
    let range_epochs: Vec<Epoch> = entry
        .ranges
        .iter()
        .map(|r| {
            epochs
                .get(&(r.topic.clone(), r.partition))
                .copied()
                .unwrap_or_default()
        })
        .collect();
    let ctxs: Vec<CallContext> = range_epochs
        .iter()
        .map(|e| CallContext {
            query_id: query_id.to_string(),
            batch_id: entry.batch_id,
            epoch: e.get(),
        })
        .collect();
    (range_epochs, ctxs)
}

/// One report of all the sink threads (`reports`), or the first error:
/// a sink's own error explains a stopped sink; otherwise the first
/// failure of the map side (`processed`) is reported, and a sink error
/// behind it is logged, not lost. A sink thread's panic goes on.
///
/// # Errors
/// As said.
fn one_report(
    processed: Result<(), EngineError>,
    reports: Vec<std::thread::Result<Result<SinkReport, EngineError>>>,
    ranges: usize,
) -> Result<SinkReport, EngineError> {
    // One report of all the sink threads, or the first thread's error
    // (the others' logged).
    let mut report: Result<SinkReport, EngineError> = Ok(SinkReport::empty(ranges));
    for r in reports {
        match (&mut report, r) {
            (_, Err(panic)) => std::panic::resume_unwind(panic),
            (Ok(all), Ok(Ok(one))) => all.merge(one),
            (Ok(_), Ok(Err(e))) => report = Err(e),
            (Err(_), Ok(Err(e))) => {
                tracing::error!("another sink connection failed too: {e}")
            }
            (Err(_), Ok(Ok(_))) => {}
        }
    }
    // A sink's own error explains a stopped sink; otherwise the
    // first failure of the map side is reported, and a sink error
    // behind it is logged, not lost.
    match (processed, report) {
        (Err(EngineError::SinkStopped), Err(e)) | (Ok(()), Err(e)) => Err(e),
        (Err(e), sunk) => {
            if let Err(sink_error) = sunk {
                tracing::error!("the sink failed too: {sink_error}");
            }
            Err(e)
        }
        (Ok(()), Ok(report)) => Ok(report),
    }
}

/// Add what the sinks report to `counts`, saying where a range was
/// applied already (an earlier run of this batch, or an earlier batch: a
/// reset back or a restored checkpoint, unless other members apply the
/// pipeline's partitions too).
fn add_sink_report(
    counts: &mut Counts,
    report: &SinkReport,
    entry: &OffsetsEntry,
    gate: &PartitionGate,
) {
    for (range, before) in entry.ranges.iter().zip(&report.already_applied) {
        if before.offsets == 0 {
            continue;
        }
        counts.already_applied += before.offsets;
        if before.by_other_batch && !gate.others_apply() {
            tracing::warn!(topic = %range.topic, partition = range.partition, already_applied = before.offsets, "{} of the {} offsets of [{}, {}) were already applied by an earlier batch (the sink's progress rows, sluice_progress, show them), so they were not applied again: this is a reset back or a restored checkpoint. Nothing to do if that is what you meant; if the destination no longer holds them (its tables were emptied), stop the pipeline and `host checkpoint reset … --sink-db URL --reapply` to a position before them (on a destination that still holds them, that applies them twice)", before.offsets, range.end - range.start, range.start, range.end);
        } else {
            tracing::info!(topic = %range.topic, partition = range.partition, already_applied = before.offsets, "{} of the {} offsets of [{}, {}) were already applied by an earlier run of this batch; not applied again", before.offsets, range.end - range.start, range.start, range.end);
        }
    }
    counts.add(&report.counts);
    counts.output = counts.output.saturating_sub(report.rejected_outputs);
    counts.input = counts.input.saturating_sub(report.abandoned.0);
    counts.output = counts.output.saturating_sub(report.abandoned.1);
}
