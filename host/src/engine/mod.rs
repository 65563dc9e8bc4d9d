//! The micro-batch loop (DESIGN.md, "Micro-batch loop"): plan →
//! write-ahead → fetch → map chain → sink (per part of each partition's
//! range) → commit.
//!
//! Within a batch the stages overlap: a fetch thread reads the planned
//! ranges and hands over pieces of at most `MAP_PIECE_RECORDS` (2,000) records,
//! this thread maps each piece while the next is read, and a sink thread
//! applies each mapped piece, in order, while the next is mapped (the map
//! and sink stages are separate instances). A partition's range thus
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
//! control requests → plan → write-ahead → `batch::run_batch` → commit);
//! `plan` chooses the ranges, `batch` runs one batch's fetch and map
//! (with `sink_thread` applying the parts), `stages` loads, assembles and
//! swaps the plugins, `error` holds [`EngineError`], `config` the
//! settings, `progress` the per-batch report.
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
mod config;
mod error;
mod plan;
mod progress;
mod sink_thread;
mod stages;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::capability::sql::SqlGrant;
use crate::checkpoint::{
    Checkpoint, CommitEntry, Counts, OffsetsEntry, OpenOptions, PartitionRange, PluginRef, Recovery,
};
use crate::control::{ControlServer, HandoverNote, LiveStatus, Request, ServerContext};
use crate::metrics::{Metrics, MetricsServer};
use crate::plugin::{Plugin, Runtime};
use crate::sink::SinkDriver;
use crate::source::{KafkaSource, TopicPartition};
use crate::util::now_ms;

use batch::{add_counts, run_batch};
pub use config::{
    DataLossPolicy, ErrorPolicy, PipelineConfig, ProgressMode, StartingOffsets, redact_property,
    shell_word,
};
pub use error::EngineError;
pub use progress::{PartitionProgress, Progress};
use stages::{assemble, config_digest, install_swap, load_plugins, show_refs};

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Epoch of this run.
    pub epoch: u64,
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

pub(super) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
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

/// How `run` acquires the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Acquire {
    /// Fail at once (or queue with `--wait`) if another process owns it.
    #[default]
    Normal,
    /// Ask the owner to hand over, waiting at most this long for it.
    Takeover(Duration),
}

/// Ask the running owner to hand over. Returns the connection (to report
/// our first write-ahead) and the owner's note, or `None` when nobody owns
/// the checkpoint.
fn request_handover(
    cfg: &PipelineConfig,
    timeout: Duration,
) -> Result<Option<(crate::control::Client, serde_json::Value)>, EngineError> {
    use crate::control::{Client, ClientError};
    let mut client = match Client::connect(&cfg.checkpoint, timeout) {
        Ok(c) => c,
        Err(ClientError::NotRunning { .. }) => {
            if crate::checkpoint::status(&cfg.checkpoint).is_ok_and(|s| s.owner.is_some()) {
                return Err(EngineError::Takeover(format!(
                    "checkpoint {} is owned but its owner does not answer on control.sock; not touching it",
                    cfg.checkpoint.display()
                )));
            }
            tracing::info!("--takeover: no running owner, starting normally");
            return Ok(None);
        }
        Err(e) => return Err(EngineError::Takeover(e.to_string())),
    };
    tracing::info!("--takeover: asking the owner to hand over at its next batch boundary");
    let answer = client
        .request(&serde_json::json!({"op": "handover"}))
        .map_err(|e| {
            EngineError::Takeover(format!(
                "{e}; the checkpoint was not touched and the owner keeps running"
            ))
        })?;
    // Confirm: the owner releases the lock only now.
    client
        .send(&serde_json::json!({"op": "go"}))
        .map_err(|e| EngineError::Takeover(format!("{e}; the owner keeps running")))?;
    Ok(Some((client, answer["note"].clone())))
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
    if cfg.topics.is_empty() {
        return Err(EngineError::Config("no topics: pass --topic NAME".into()));
    }
    if cfg.on_error == ErrorPolicy::Dlq && cfg.sink_db.is_none() {
        return Err(EngineError::Config(
            "--on-error dlq stores dead letters in the sink database: pass --sink-db sqlite:PATH or postgres://…".into(),
        ));
    }
    let runtime = Arc::new(Runtime::new(cfg.limits).map_err(EngineError::Config)?);

    // With --takeover, compile everything first, then ask the owner.
    let mut handover = None;
    let mut preloaded = None;
    let mut wait = cfg.wait;
    if let Acquire::Takeover(timeout) = acquire {
        let recorded = crate::checkpoint::status(&cfg.checkpoint)
            .ok()
            .map(|s| {
                s.last_committed
                    .map(|c| c.plugins)
                    .filter(|p| !p.is_empty())
                    .or(s.last_planned.map(|o| o.plugins))
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        preloaded = Some(load_plugins(cfg, &runtime, &recorded)?);
        // A pipeline the checkpoint would refuse must not make the owner
        // hand over and exit first.
        if !cfg.allow_fingerprint_change {
            crate::checkpoint::check_fingerprint(&cfg.checkpoint, &cfg.topics)?;
        }
        handover = request_handover(cfg, timeout)?;
        // The old owner released the lock before answering; allow for a
        // forked child still holding the descriptor for a moment.
        wait = Some(wait.unwrap_or(Duration::ZERO).max(Duration::from_secs(10)));
    }

    // Validate what the user gave before creating or touching the
    // checkpoint: explicit plugins and the sink database.
    if preloaded.is_none() && !cfg.plugins.is_empty() {
        preloaded = Some(load_plugins(cfg, &runtime, &[])?);
    }
    let sql = match &cfg.sink_db {
        Some(url) => Some(SqlGrant::connect(url).map_err(|error| EngineError::SinkDb {
            url: crate::capability::sql::redact(url),
            error,
        })?),
        None => None,
    };

    // A new checkpoint records the topics in its fingerprint: check they
    // exist first, so a mistyped topic leaves no checkpoint behind that a
    // corrected command would then refuse.
    if !crate::checkpoint::exists(&cfg.checkpoint) {
        let probe = KafkaSource::new(
            &cfg.brokers,
            &cfg.kafka,
            "sluice-topic-check",
            false,
            cfg.kafka_timeout,
        )?;
        for topic in &cfg.topics {
            probe.partitions(topic)?;
        }
    }

    let mut cp = Checkpoint::open(
        &cfg.checkpoint,
        &OpenOptions {
            topics: cfg.topics.clone(),
            allow_fingerprint_change: cfg.allow_fingerprint_change,
            wait,
            retention: cfg.retention,
            create: true,
        },
    )?;
    let epoch = cp.epoch();
    let query_id = cp.metadata().query_id.clone();
    tracing::info!(checkpoint = %cfg.checkpoint.display(), epoch, query_id, "checkpoint opened");

    let driver = SinkDriver::new(sql.clone()).map_err(|error| EngineError::SinkDb {
        url: crate::capability::sql::redact(cfg.sink_db.as_deref().unwrap_or_default()),
        error,
    })?;
    let recorded = match cp.recovery() {
        Recovery::Resume { plugins, .. } => plugins.clone(),
        Recovery::Rerun { entry } => entry.plugins.clone(),
    };
    // Plugins preloaded before a takeover must still be the ones to use:
    // the old owner may have swapped one in meanwhile.
    let preloaded_ok = |l: &[(Plugin, Vec<u8>)]| {
        !l.is_empty()
            && (!cfg.plugins.is_empty()
                || recorded
                    .iter()
                    .all(|r| l.iter().any(|(p, _)| p.digest() == r.digest)))
    };
    let loaded = match preloaded {
        Some(l) if preloaded_ok(&l) => l,
        _ => load_plugins(cfg, &runtime, &recorded)?,
    };
    for (_, bytes) in &loaded {
        cp.store_plugin(bytes)?;
    }
    let mut stages = assemble(cfg, &loaded, &recorded, sql.as_ref())?;
    drop(loaded);
    let group = cfg
        .group_id
        .clone()
        .unwrap_or_else(|| format!("sluice-{query_id}"));
    let mut source = KafkaSource::new(
        &cfg.brokers,
        &cfg.kafka,
        &group,
        cfg.group_id.is_some(),
        cfg.kafka_timeout,
    )?;
    let cdigest = config_digest(cfg);
    let sink_identity = match cfg.sink_db.as_deref() {
        Some(url) => Some(crate::capability::sql::sink_identity(url).map_err(|e| {
            EngineError::Config(format!(
                "--sink-db {}: {e}",
                crate::capability::sql::redact(url)
            ))
        })?),
        None => None,
    };
    let metrics = Arc::new(Metrics::new());
    metrics.set_epoch(epoch);
    let _metrics_server = match cfg.metrics_addr {
        Some(addr) => {
            Some(MetricsServer::start(addr, metrics.clone()).map_err(EngineError::Config)?)
        }
        None => None,
    };

    // The control socket: status, handover, swap.
    let status = Arc::new(Mutex::new(LiveStatus {
        pid: std::process::id(),
        hostname: crate::util::hostname(),
        epoch,
        since_ms: now_ms(),
        query_id: query_id.clone(),
        last_committed: cp.last_committed(),
        plugins: stages.refs.clone(),
        ..LiveStatus::default()
    }));
    let (tx, rx) = std::sync::mpsc::channel();
    let wake = Arc::new(AtomicBool::new(false));
    let mut control = Some(
        ControlServer::start(
            &cfg.checkpoint,
            ServerContext {
                runtime: runtime.clone(),
                config: Arc::new(cfg.plugin_config.clone()),
                status: status.clone(),
                requests: tx,
                wake: wake.clone(),
            },
        )
        .map_err(|e| {
            EngineError::Config(format!(
                "control socket in {}: {e}",
                cfg.checkpoint.display()
            ))
        })?,
    );

    let mut summary = RunSummary {
        epoch,
        ..RunSummary::default()
    };
    let mut planner = plan::Planner::new(cp.recovery(), cp.topic_identities());
    let mut pending_rerun = match cp.recovery() {
        Recovery::Rerun { entry } => Some(entry.clone()),
        Recovery::Resume { .. } => None,
    };
    let mut last_commit_ms = None;

    loop {
        // Batch boundary: act on control requests.
        wake.store(false, Ordering::Relaxed);
        if pending_rerun.is_none() {
            for req in crate::control::pending(&rx) {
                match req {
                    Request::Swap(swap) => {
                        let result = install_swap(
                            &mut stages,
                            &cp,
                            sql.as_ref(),
                            swap.plugin,
                            &swap.bytes,
                            swap.stage,
                            swap.index,
                        )
                        .map(|()| cp.next_batch_id());
                        if let Ok(batch) = &result {
                            tracing::info!(
                                batch,
                                "plugin swap installed: [{}] from batch {batch}",
                                show_refs(&stages.refs)
                            );
                            if let Ok(mut s) = status.lock() {
                                s.plugins = stages.refs.clone();
                                s.swaps += 1;
                            }
                            metrics.swap();
                        }
                        let _ = swap.reply.send(result);
                    }
                    Request::Handover(h) => {
                        let note = HandoverNote {
                            epoch,
                            last_batch: cp.last_committed(),
                            last_commit_ms,
                            released_at_ms: now_ms(),
                            pid: std::process::id(),
                        };
                        if h.note.send(note.clone()).is_err()
                            || h.go.recv_timeout(Duration::from_secs(15)) != Ok(true)
                        {
                            tracing::warn!(
                                "the takeover requester went away before confirming; still the owner"
                            );
                            continue;
                        }
                        let _ = std::fs::write(
                            cfg.checkpoint.join("handover"),
                            serde_json::to_vec_pretty(&note).unwrap_or_default(),
                        );
                        // Unlink our socket before the new owner binds its own.
                        if let Some(c) = control.as_mut() {
                            c.unlink();
                        }
                        drop(cp);
                        tracing::info!(epoch, last_batch = ?note.last_batch, "handed over: lock released");
                        summary.handed_over = true;
                        // Wait (bounded) for the new owner's report, then stop.
                        let _ = h.finished.recv_timeout(Duration::from_secs(70));
                        drop(control.take());
                        return Ok(summary);
                    }
                }
            }
        }
        if stop.load(Ordering::Relaxed) && pending_rerun.is_none() {
            tracing::info!("stop requested: the last batch is committed, exiting");
            break;
        }
        let batch_started = Instant::now();
        let (entry, gaps, rerun, full) = match pending_rerun.take() {
            Some(entry) => {
                tracing::info!(
                    batch = entry.batch_id,
                    "re-running uncommitted batch {} with its planned ranges",
                    entry.batch_id
                );
                planner.check_topics(&source, cfg, &entry)?;
                if let Some((client, note)) = handover.take() {
                    report_takeover(client, &note, epoch, &mut summary);
                }
                (entry, Vec::new(), true, true)
            }
            None => {
                let planned = planner.plan(&source, cfg)?;
                if let Some((client, note)) = handover.take() {
                    report_takeover(client, &note, epoch, &mut summary);
                }
                if !planned.worth_a_batch {
                    // Nothing to read: stop fetching until the next batch
                    // (see KafkaSource::pause).
                    source.pause();
                    if cfg.until_caught_up && planner.caught_up() {
                        tracing::info!("caught up with the data available at start");
                        break;
                    }
                    sleep_unless(
                        &stop,
                        &wake,
                        cfg.trigger_interval.saturating_sub(batch_started.elapsed()),
                    );
                    continue;
                }
                let entry = OffsetsEntry {
                    batch_id: cp.next_batch_id(),
                    epoch,
                    planned_at_ms: now_ms(),
                    ranges: planned.ranges,
                    plugins: stages.refs.clone(),
                    config_digest: cdigest.clone(),
                    note: None,
                    topics: planned.topics,
                    sink_db: sink_identity.clone(),
                };
                cp.append_offsets(&entry)?;
                crate::util::failpoint("engine:after-write-ahead");
                (entry, planned.gaps, false, planned.full)
            }
        };
        if let Ok(mut s) = status.lock() {
            s.current_batch = Some(entry.batch_id);
        }
        let plan_ms = ms(batch_started.elapsed());
        let (counts, mut timings, rerun_gaps) = run_batch(
            cfg,
            &mut source,
            &mut stages,
            &driver,
            &entry,
            &query_id,
            epoch,
            rerun,
            &metrics,
            &stop,
        )?;
        let mut gaps = gaps;
        gaps.extend(rerun_gaps);
        timings.plan = plan_ms;

        crate::util::failpoint("engine:before-commit");
        let commit_started = Instant::now();
        let commit = CommitEntry {
            batch_id: entry.batch_id,
            epoch,
            committed_at_ms: now_ms(),
            counts: counts.clone(),
            timings_ms: timings.clone(),
            plugins: stages.refs.clone(),
            data_loss: gaps.clone(),
            note: None,
        };
        cp.commit(&commit)?;
        last_commit_ms = Some(commit.committed_at_ms);
        timings.commit = ms(commit_started.elapsed());
        planner.committed(&entry);
        source.commit_group(&ends(&entry.ranges));

        summary.batches += 1;
        summary.last_batch = Some(entry.batch_id);
        if rerun {
            summary.reran = Some(entry.batch_id);
        }
        summary
            .plugins_per_batch
            .push((entry.batch_id, stages.refs.clone()));
        add_counts(&mut summary.counts, &counts);
        let lag = planner.lag();
        metrics.batch(&counts, &timings, rerun, &lag);
        let event = Progress::new(
            &entry,
            epoch,
            rerun,
            &counts,
            &timings,
            batch_started.elapsed(),
            lag,
            &gaps,
        );
        event.emit(cfg.progress);
        if let Ok(mut s) = status.lock() {
            s.current_batch = None;
            s.last_committed = Some(entry.batch_id);
            s.last_progress = serde_json::to_value(&event).ok();
        }

        if cfg.until_caught_up && planner.caught_up() {
            tracing::info!("caught up with the data available at start");
            break;
        }
        if !full {
            sleep_unless(
                &stop,
                &wake,
                cfg.trigger_interval.saturating_sub(batch_started.elapsed()),
            );
        }
    }
    Ok(summary)
}

/// Tell the old owner when our first write-ahead happens (now: planning
/// just finished) and log the gap from its last commit.
fn report_takeover(
    mut client: crate::control::Client,
    note: &serde_json::Value,
    epoch: u64,
    summary: &mut RunSummary,
) {
    let first = now_ms();
    let from = note["last_commit_ms"]
        .as_i64()
        .or(note["released_at_ms"].as_i64())
        .unwrap_or(first);
    tracing::info!(
        old_epoch = note["epoch"].as_u64().unwrap_or_default(),
        "took over: gap from the old owner's last commit to our first write-ahead: {} ms",
        first - from
    );
    summary.takeover_gap_ms = Some(first - from);
    let _ = client.send(
        &serde_json::json!({"op": "took-over", "first_write_ahead_ms": first, "epoch": epoch}),
    );
}

/// Positions after a batch: the end of each range.
pub fn ends(ranges: &[PartitionRange]) -> BTreeMap<TopicPartition, i64> {
    ranges
        .iter()
        .map(|r| ((r.topic.clone(), r.partition), r.end))
        .collect()
}
