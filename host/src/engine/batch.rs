//! One batch: a fetch thread reads the planned ranges in pieces, the map
//! threads (`map_threads`) map them, this thread takes each mapped piece
//! back in the order it was read, and a sink thread (one per sink
//! connection, a range's parts all on one) applies each as a part of its
//! range; the error policy decides about bad records on both sides.
//! Nothing here commits: the loop in `engine` does, after [`run_batch`]
//! returned success.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::TrySendError;
use std::time::{Duration, Instant};

use crate::checkpoint::{Counts, DataLossGap, Epoch, OffsetsEntry, Timings};
use crate::metrics::Metrics;
use crate::plugin::chain::ChainResult;
use crate::plugin::{CallContext, PluginError, Trapped};
use crate::sink::SinkDriver;
use crate::source::{Handoff, KafkaSource, Piece, SourceRecord, TopicPartition};

use super::map_threads::{MapEnv, MapPool, Mapped, map_thread};
use super::member::revoke::Revocations;
use super::policy::{Rejection, on_bad_record, on_data_loss};
use super::progress::ms;
use super::sink_thread::{
    SINK_QUEUE, SinkEnv, SinkJob, SinkPolicy, SinkReport, lanes_of, run_sink,
};
use super::stages::Stages;
use super::{EngineError, PipelineConfig};

/// Records handed to one map call at most: the fetch thread delivers
/// pieces of this size, so the map of one piece overlaps the reading of
/// the next (2,000 records of ~200 bytes: ~0.4 MB, a few ms of mapping).
pub(super) const MAP_PIECE_RECORDS: usize = 2_000;

/// One partition's range within a batch: what was read and mapped and not
/// yet sunk, and how far the sink got.
#[derive(Default)]
pub(super) struct RangeState {
    /// Records read and mapped since the last sink of this range.
    records: Vec<SourceRecord>,
    /// Their map results (source indices into `records`).
    mapped: ChainResult,
    /// Records of the range found trapping so far, and the first trap.
    trapped: usize,
    first_trap: Option<Box<Trapped>>,
    /// Records of the range read so far, sunk or held.
    seen: usize,
    /// Offsets below this were handed to the sink thread (`None`: nothing
    /// yet, the range's start).
    sunk_to: Option<i64>,
    /// The range's last piece arrived and its last part was handed to the
    /// sink thread.
    finished: bool,
}

/// The map side of one batch (the fetch and the sink run on threads of
/// their own).
pub(super) struct BatchRun<'a> {
    cfg: &'a PipelineConfig,
    /// Digest → file, for messages.
    files: &'a BTreeMap<String, String>,
    entry: &'a OffsetsEntry,
    /// The call context of each range (its owner epoch included).
    ctxs: &'a [CallContext],
    /// Each range's owner epoch, typed (the sink fences on it).
    epochs: &'a [Epoch],
    /// A group member's partitions dropped during the batch
    /// ([`BatchEnv::revocations`]).
    revocations: Option<&'a Revocations>,
    states: Vec<RangeState>,
    counts: Counts,
    map_time: Duration,
    /// Parts for the sink threads, one queue per sink connection, each in
    /// order (emptied once the batch's pieces are all handed over: the
    /// sink threads then end).
    sinks: Vec<std::sync::mpsc::SyncSender<SinkJob>>,
    /// Each range's sink thread ([`lanes_of`]).
    lanes: Vec<usize>,
    /// Set when a sink thread failed: no further part is handed out.
    sink_failed: &'a AtomicBool,
}

/// Pieces queued between the fetch thread and the map at most.
pub(super) const PIECE_QUEUE: usize = 4;

impl BatchRun<'_> {
    /// Whether range `i`'s partition was taken from this group member
    /// during the batch: its records are no longer mapped or sunk.
    fn dropped(&self, i: usize) -> bool {
        let r = &self.entry.ranges[i];
        self.revocations
            .is_some_and(|rv| rv.is_dropped(&(r.topic.clone(), r.partition)))
    }

    /// Take a map thread's answer for the next piece of its range and sink
    /// it as a part of the range, unless it is the range's last piece
    /// ([`BatchRun::finish`] sinks that, up to the planned end, and runs
    /// next).
    fn take_mapped(&mut self, m: Mapped) -> Result<(), EngineError> {
        let Mapped {
            range: i,
            records,
            done,
            result,
            trapped,
            first_trap,
            took,
        } = m;
        self.map_time += took;
        let mapped = result.map_err(|e| match e {
            // Under `fail` the map thread named the record that traps.
            PluginError::Trap(trap)
                if self.cfg.on_error == super::ErrorPolicy::Fail && trap.site.contains(" offset ") =>
            {
                EngineError::TrappedOnRecord {
                    trap,
                    aside: if self.cfg.sink_db.is_some() {
                        "to set the records that trap aside and go on, run with `--on-error dlq` (the trap becomes their error in sluice_dead_letters)"
                    } else {
                        "to set the records that trap aside and go on, run with `--on-error skip` (or give a --sink-db and `--on-error dlq`, which keeps them)"
                    },
                }
            }
            e => e.into(),
        })?;
        self.take_piece(i, records, done, mapped, (trapped, first_trap))?;
        if done {
            self.finish(i)?;
        }
        Ok(())
    }

    fn take_piece(
        &mut self,
        i: usize,
        records: Vec<SourceRecord>,
        done: bool,
        mapped: ChainResult,
        (trapped, first_trap): (usize, Option<Box<Trapped>>),
    ) -> Result<(), EngineError> {
        if records.is_empty() || self.dropped(i) {
            return Ok(());
        }
        let range = &self.entry.ranges[i];
        if self.states[i].finished {
            return Err(EngineError::Internal(format!(
                "records of {}/{} arrived after its range [{}, {}) was finished",
                range.topic, range.partition, range.start, range.end
            )));
        }
        let st = &mut self.states[i];
        st.trapped = trapped;
        if st.first_trap.is_none() {
            st.first_trap = first_trap;
        }
        let base = st.records.len();
        st.mapped
            .outputs
            .extend(mapped.outputs.into_iter().map(|mut o| {
                o.source_index += base;
                o
            }));
        st.mapped
            .rejected
            .extend(mapped.rejected.into_iter().map(|mut b| {
                b.source_index += base;
                b
            }));
        st.seen += records.len();
        let next = records.last().map(|r| r.offset + 1);
        if st.records.is_empty() {
            st.records = records;
        } else {
            st.records.extend(records);
        }
        // Sink the piece now, as a part of the range, so the sink keeps up
        // with the fetch instead of trailing it and the piece's memory is
        // reused for the next one — unless every record of the range so far
        // trapped: that may turn out to be a broken plugin (see `finish`),
        // which must stop the batch rather than dead-letter or skip the
        // range.
        if !done
            && st.trapped < st.seen
            && let Some(next) = next
        {
            self.sink_held(i, next)?;
        }
        Ok(())
    }

    /// Range `i` is read and mapped: sink the rest of it.
    fn finish(&mut self, i: usize) -> Result<(), EngineError> {
        if self.dropped(i) {
            return Ok(());
        }
        let range = &self.entry.ranges[i];
        let st = &mut self.states[i];
        if st.finished {
            return Err(EngineError::Internal(format!(
                "range [{}, {}) of {}/{} finished twice",
                range.start, range.end, range.topic, range.partition
            )));
        }
        if st.seen > 1
            && st.trapped == st.seen
            && let Some(first) = st.first_trap.take()
        {
            // Not one record could be mapped: a broken plugin (or limit)
            // rather than bad records. Stop instead of dead-lettering or
            // skipping the whole range (none of it was sunk).
            tracing::error!(
                "every record of {}/{} [{}, {}) made the plugin trap: it looks broken, not fed bad records; stopping",
                range.topic,
                range.partition,
                range.start,
                range.end
            );
            return Err(EngineError::Plugin(PluginError::Trap(first)));
        }
        // The last part, up to the planned end (which may lie past the last
        // record: control records, compaction gaps); the whole range when
        // nothing was sunk yet.
        if st.sunk_to != Some(range.end) {
            self.sink_held(i, range.end)?;
        }
        self.states[i].finished = true;
        Ok(())
    }

    /// Hand the records range `i` holds to the sink thread as the part
    /// `[sunk_to, end)` of the range (`end`: the offset after the last held
    /// record, or the range's end), after applying the bad-record policy.
    /// The sink thread applies it with one sink call (one transaction with
    /// the SQL capability), retried as configured.
    fn sink_held(&mut self, i: usize, end: i64) -> Result<(), EngineError> {
        let range = &self.entry.ranges[i];
        let cfg = self.cfg;
        let ctx = &self.ctxs[i];
        let epoch = self.epochs[i];
        let counts = &mut self.counts;
        let st = &mut self.states[i];
        let start = st.sunk_to.unwrap_or(range.start);
        let recs = std::mem::take(&mut st.records);
        let mapped = std::mem::take(&mut st.mapped);
        counts.input += recs.len() as u64;
        let mut dead_letters = Vec::new();
        for b in &mapped.rejected {
            let plugin = self.files.get(&b.plugin_digest);
            let rejection = Rejection {
                topic: &range.topic,
                partition: range.partition,
                record: &recs[b.source_index],
                batch: self.entry.batch_id,
                plugin: plugin.map_or("", String::as_str),
                digest: &b.plugin_digest,
                stage: b.stage,
                message: b.message.clone(),
                by_sink: false,
            };
            dead_letters.extend(on_bad_record(cfg.on_error, rejection, counts)?);
        }
        let mut with_output = vec![false; recs.len()];
        for o in &mapped.outputs {
            with_output[o.source_index] = true;
        }
        counts.output += mapped.outputs.len() as u64;
        counts.filtered += with_output
            .iter()
            .enumerate()
            .filter(|(i, has)| !**has && !mapped.rejected.iter().any(|b| b.source_index == *i))
            .count() as u64;

        let job = SinkJob {
            range: i,
            epoch,
            part: crate::plugin::PartitionContext {
                batch: ctx.clone(),
                topic: range.topic.clone(),
                partition: range.partition,
                start_offset: start,
                end_offset: end,
            },
            records: recs,
            outputs: mapped.outputs,
            dead_letters,
        };
        // A sink thread stopped only because a part failed: the caller
        // reports that error.
        if self.sink_failed.load(Ordering::Relaxed) {
            return Err(EngineError::SinkStopped);
        }
        self.sinks
            .get(self.lanes.get(i).copied().unwrap_or(0))
            .ok_or(EngineError::SinkStopped)?
            .send(job)
            .map_err(|_| EngineError::SinkStopped)?;
        self.states[i].sunk_to = Some(end);
        Ok(())
    }
}

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
    /// A pipeline group's member: the partitions a rebalance or the
    /// database's fencing takes during the batch. Their parts not started
    /// are abandoned, the batch goes on with the others, and the fetch
    /// thread answers rebalances until the sink has finished.
    pub(super) revocations: Option<&'a Revocations>,
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
        revocations,
        metrics,
        stop,
        output,
    } = env;
    let mut timings = Timings::default();
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
    // Each range's calls carry its partition's owner epoch.
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
        revocations,
        failed: &sink_failed,
        output,
    };
    let map_env = MapEnv {
        ranges: &entry.ranges,
        ctxs: &ctxs,
        on_error: cfg.on_error,
        attempts: cfg.attempts,
        revocations,
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
            revocations,
            states: entry.ranges.iter().map(|_| RangeState::default()).collect(),
            counts: Counts::default(),
            map_time: Duration::ZERO,
            sinks: sink_txs,
            lanes: lanes_of(&entry.ranges, lanes),
            sink_failed: &sink_failed,
        };
        // Bounded, like the sink queue: when the map falls behind, records
        // wait in librdkafka's own (bounded) queue, not here.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Piece>(PIECE_QUEUE);
        let fetch_ranges = &ranges;
        let cancel_ref = &cancel;
        let sunk_ref = &sunk;
        let fetcher = spawn_named(s, "sluice-fetch".into(), move || {
            let t = Instant::now();
            let r = source.fetch(
                fetch_ranges,
                MAP_PIECE_RECORDS,
                cancel_ref,
                &mut |p| match tx.try_send(p) {
                    Ok(()) => Handoff::Taken,
                    Err(TrySendError::Full(p)) => Handoff::Busy(p),
                    Err(TrySendError::Disconnected(_)) => Handoff::Closed,
                },
            );
            let took = t.elapsed();
            drop(tx);
            // A group member goes on answering the coordinator until the
            // sink has applied the batch: a rebalance meanwhile is drained
            // and released at once (see `revoke`), instead of waiting for
            // the whole batch, and the other partitions keep running.
            // Records that arrive meanwhile are kept for the next batch, up
            // to about one batch's worth; then the partitions are paused
            // (which drops what librdkafka had read ahead).
            if r.is_ok() && revocations.is_some() {
                let ahead = fetch_ranges
                    .iter()
                    .map(|r| usize::try_from(r.end - r.start).unwrap_or(0))
                    .sum::<usize>()
                    .max(MAP_PIECE_RECORDS);
                while !sunk_ref.load(Ordering::Relaxed) {
                    if source.pending_records() >= ahead {
                        source.pause();
                    }
                    source.serve(Duration::from_millis(20));
                }
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
        // One report of all the sink threads, or the first thread's error
        // (the others' logged).
        let mut report: Result<SinkReport, EngineError> = Ok(SinkReport::empty(entry.ranges.len()));
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
        let report = match (processed, report) {
            (Err(EngineError::SinkStopped), Err(e)) | (Ok(()), Err(e)) => return Err(e),
            (Err(e), sunk) => {
                if let Err(sink_error) = sunk {
                    tracing::error!("the sink failed too: {sink_error}");
                }
                return Err(e);
            }
            (Ok(()), Ok(report)) => report,
        };
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
    for (range, before) in entry.ranges.iter().zip(&report.already_applied) {
        if before.offsets == 0 {
            continue;
        }
        counts.already_applied += before.offsets;
        if before.by_other_batch && revocations.is_none() {
            tracing::warn!(topic = %range.topic, partition = range.partition, already_applied = before.offsets, "{} of the {} offsets of [{}, {}) were already applied by an earlier batch (the sink's progress rows, sluice_progress, show them), so they were not applied again: this is a reset back or a restored checkpoint. Nothing to do if that is what you meant; if the destination no longer holds them (its tables were emptied), stop the pipeline and `host checkpoint reset … --sink-db URL --reapply` to a position before them (on a destination that still holds them, that applies them twice)", before.offsets, range.end - range.start, range.start, range.end);
        } else {
            tracing::info!(topic = %range.topic, partition = range.partition, already_applied = before.offsets, "{} of the {} offsets of [{}, {}) were already applied by an earlier run of this batch; not applied again", before.offsets, range.end - range.start, range.start, range.end);
        }
    }
    counts.add(&report.counts);
    counts.output = counts.output.saturating_sub(report.rejected_outputs);
    counts.input = counts.input.saturating_sub(report.abandoned.0);
    counts.output = counts.output.saturating_sub(report.abandoned.1);
    timings.map = ms(map_time);
    timings.sink = ms(report.time);
    timings.transaction = ms(report.transactions);
    Ok(BatchDone {
        counts,
        timings,
        gaps,
    })
}
