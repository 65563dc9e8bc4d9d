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

mod config;
mod plan;
mod progress;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use sluice_guest::wire::{Record, SinkRecord};

use crate::checkpoint::{
    Checkpoint, CheckpointError, CommitEntry, Counts, OffsetsEntry, OpenOptions, PartitionRange,
    PluginRef, Recovery, StageKind, Timings, now_ms,
};
use crate::control::{ControlServer, HandoverNote, LiveStatus, Request, ServerContext};
use crate::metrics::{Metrics, MetricsServer};
use crate::plugin::chain::{
    ChainResult, DEFAULT_ISOLATION_TRAPS, TrapBudget, isolate_traps, run_chain,
};
use crate::plugin::{CallContext, Instance, Plugin, PluginError, Runtime};
use crate::sink::sql::{DbError, SqlGrant};
use crate::sink::{Applied, DeadLetter, PartitionBatch, SinkDriver, SinkError, Skipped};
use crate::source::{FetchRange, KafkaSource, Piece, SourceError, SourceRecord, TopicPartition};

pub use config::{
    DataLossPolicy, ErrorPolicy, PipelineConfig, ProgressMode, StartingOffsets, redact_property,
    shell_word,
};
pub use progress::{PartitionProgress, Progress};

/// For a printed command holding `***`: say what to do about it.
fn secrets_hint(cmd: &str) -> &'static str {
    if cmd.contains("***") {
        " (with the secrets where *** stands)"
    } else {
        ""
    }
}

/// Why the job stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The checkpoint refused (owned, corrupt, fenced, fingerprint).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Kafka failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A plugin could not be loaded (nothing was processed).
    #[error(transparent)]
    PluginLoad(PluginError),
    /// A plugin failed (after retries). (Not a `source`: the message
    /// already contains it, and an error chain would print it twice.)
    #[error("{0}; batch not committed, it is re-run on the next start")]
    Plugin(PluginError),
    /// The sink failed (after retries).
    #[error("{0}; batch not committed, it is re-run on the next start")]
    Sink(SinkError),
    /// The sink database is unreachable or refused the schema.
    #[error("sink database {url}: {error}")]
    SinkDb {
        /// The `--sink-db` URL, password redacted.
        url: String,
        /// The database's error.
        error: DbError,
    },
    /// A bad record under `--on-error fail`.
    #[error(
        "bad record at {topic}/{partition} offset {offset}, rejected by plugin {plugin} (sha256:{digest}): {message}; batch {batch} not committed (--on-error fail). Fix the plugin or the data, or restart with --on-error dlq (dead-letter it into the --sink-db database) or --on-error skip"
    )]
    BadRecord {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// Plugin file.
        plugin: String,
        /// Plugin digest.
        digest: String,
        /// The stage's message.
        message: String,
        /// Batch id.
        batch: u64,
    },
    /// Planned offsets were deleted by retention (`--on-data-loss fail`).
    #[error(
        "data loss on {topic}/{partition}: offsets [{from}, {to}) were deleted from the log (retention) before Sluice read them. Restart with --on-data-loss skip to continue at offset {to} (the gap is recorded in the commit entry)"
    )]
    DataLoss {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// First missing offset.
        from: i64,
        /// Log start offset now.
        to: i64,
    },
    /// The checkpoint is ahead of the log.
    #[error(
        "{topic}/{partition}: the checkpoint's position {position} is beyond the partition's high watermark {high}: the topic was deleted and recreated, or truncated. Nothing was read. Sluice will not guess where to resume: reset the checkpoint (and the sink's progress rows) with `{reset}`{}, then start the pipeline again", secrets_hint(.reset)
    )]
    BeyondEnd {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Stored position.
        position: i64,
        /// High watermark now.
        high: i64,
        /// The command that resets checkpoint and sink progress.
        reset: String,
    },
    /// A topic is not the one the checkpoint's offsets belong to.
    #[error(
        "topic `{topic}` was deleted and created again since this checkpoint last read it: {why} (checkpoint: {was}; broker now: {now}). The checkpoint's offsets belong to the old topic, so nothing was read. To process the new topic from its start, reset the checkpoint (and the sink's progress rows) with `{reset}`{}, then start the pipeline again", secrets_hint(.reset)
    )]
    TopicRecreated {
        /// Topic.
        topic: String,
        /// What differs.
        why: String,
        /// The identity on record.
        was: String,
        /// The identity the broker reports.
        now: String,
        /// The command that resets checkpoint and sink progress.
        reset: String,
    },
    /// Inconsistent configuration.
    #[error("{0}")]
    Config(String),
    /// `--takeover` gave up; the checkpoint was not touched.
    #[error("takeover: {0}")]
    Takeover(String),
    /// A broken invariant inside the host (a bug): the batch is not
    /// committed.
    #[error(
        "internal error: {0}; batch not committed, it is re-run on the next start (please report this)"
    )]
    Internal(String),
    /// The sink thread stopped before the map side handed over every part.
    /// It stops only on a failed part, and that error is what `run`
    /// reports; this one only tells the map side to stop.
    #[error(
        "the sink stopped after a failed part; batch not committed, it is re-run on the next start"
    )]
    SinkStopped,
}

impl From<PluginError> for EngineError {
    fn from(e: PluginError) -> Self {
        EngineError::Plugin(e)
    }
}

impl From<SinkError> for EngineError {
    fn from(e: SinkError) -> Self {
        EngineError::Sink(e)
    }
}

impl EngineError {
    /// True when another process owns the checkpoint.
    pub fn is_owned(&self) -> bool {
        matches!(self, EngineError::Checkpoint(e) if e.is_owned())
    }
}

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

/// The loaded stages of the pipeline.
struct Stages {
    maps: Vec<Instance>,
    sink: Option<Instance>,
    refs: Vec<PluginRef>,
    /// Digest → file, for messages.
    files: BTreeMap<String, String>,
}

/// Read and compile the pipeline's plugins: the `--plugin` files, or the
/// components the checkpoint recorded (from its content-addressed store).
fn load_plugins(
    cfg: &PipelineConfig,
    runtime: &Runtime,
    recorded: &[PluginRef],
) -> Result<Vec<(Plugin, Vec<u8>)>, EngineError> {
    let config = Arc::new(cfg.plugin_config.clone());
    let mut loaded = Vec::new();
    if cfg.plugins.is_empty() {
        if recorded.is_empty() {
            return Err(EngineError::Config(format!(
                "no plugins: pass --plugin FILE (the checkpoint {} records none to resume with)",
                cfg.checkpoint.display()
            )));
        }
        let mut seen: Vec<&str> = Vec::new();
        for r in recorded {
            if seen.contains(&r.digest.as_str()) {
                continue;
            }
            seen.push(&r.digest);
            let (path, bytes) = crate::checkpoint::read_stored_plugin(&cfg.checkpoint, &r.digest)?;
            let plugin = runtime
                .load_bytes(&path, &bytes, config.clone())
                .map_err(EngineError::PluginLoad)?;
            loaded.push((plugin, bytes));
        }
        tracing::info!("resuming with the plugins recorded in the checkpoint");
    } else {
        for path in &cfg.plugins {
            let bytes = std::fs::read(path).map_err(|source| {
                EngineError::PluginLoad(PluginError::Read {
                    path: path.clone(),
                    source,
                })
            })?;
            let plugin = runtime
                .load_bytes(path, &bytes, config.clone())
                .map_err(EngineError::PluginLoad)?;
            loaded.push((plugin, bytes));
        }
    }
    Ok(loaded)
}

/// Arrange loaded plugins into the map chain and the sink.
fn assemble(
    cfg: &PipelineConfig,
    loaded: &[(Plugin, Vec<u8>)],
    recorded: &[PluginRef],
    sql: Option<&SqlGrant>,
) -> Result<Stages, EngineError> {
    let mut refs = Vec::new();
    let mut maps = Vec::new();
    let mut sink = None;
    let mut files = BTreeMap::new();
    let mut sink_ref: Option<String> = None;
    for (p, _) in loaded {
        files.insert(p.digest().to_string(), p.path().display().to_string());
        let wants = |stage: StageKind| {
            if cfg.plugins.is_empty() {
                recorded
                    .iter()
                    .any(|r| r.digest == p.digest() && r.stage == stage)
            } else {
                match stage {
                    StageKind::Map => p.stages().map,
                    StageKind::Sink => p.stages().sink,
                }
            }
        };
        if wants(StageKind::Map) {
            refs.push(PluginRef {
                stage: StageKind::Map,
                digest: p.digest().to_string(),
            });
            maps.push(p.instance());
        }
        if wants(StageKind::Sink) {
            if let Some(other) = &sink_ref {
                return Err(EngineError::Config(format!(
                    "two plugins export a sink stage ({} and {}); a pipeline has one sink",
                    files.get(other).cloned().unwrap_or_default(),
                    p.path().display()
                )));
            }
            sink_ref = Some(p.digest().to_string());
            sink = Some(p.instance_with_sql(sql.cloned()));
        }
    }
    if let Some(d) = sink_ref {
        refs.push(PluginRef {
            stage: StageKind::Sink,
            digest: d,
        });
    }
    if !cfg.plugins.is_empty() && !recorded.is_empty() && recorded != refs.as_slice() {
        tracing::warn!(
            "plugin upgrade: the checkpoint's last batch ran [{}], this run uses [{}]",
            show_refs(recorded),
            show_refs(&refs)
        );
    }
    if sink.is_none() {
        tracing::warn!("no plugin exports a sink stage: mapped records are counted and discarded");
    }
    Ok(Stages {
        maps,
        sink,
        refs,
        files,
    })
}

fn show_refs(v: &[PluginRef]) -> String {
    v.iter()
        .map(|r| {
            format!(
                "{:?} sha256:{}",
                r.stage,
                &r.digest[..12.min(r.digest.len())]
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn config_digest(cfg: &PipelineConfig) -> String {
    let v = serde_json::json!({
        "plugin_config": cfg.plugin_config,
        "on_error": format!("{:?}", cfg.on_error),
    });
    hex::encode(Sha256::digest(v.to_string().as_bytes()))
}

fn ms(d: Duration) -> f64 {
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

/// Borrowed views of fetched records for the map chain.
fn record_views<'a>(topic: &'a str, partition: i32, recs: &'a [SourceRecord]) -> Vec<Record<'a>> {
    recs.iter()
        .map(|r| Record {
            topic,
            partition,
            offset: r.offset,
            timestamp: r.timestamp,
            timestamp_type: r.timestamp_type,
            key: r.key.as_deref(),
            value: r.value.as_deref(),
            headers: sluice_guest::wire::header_views(&r.headers),
        })
        .collect()
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
            url: crate::sink::sql::redact(url),
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
        url: crate::sink::sql::redact(cfg.sink_db.as_deref().unwrap_or_default()),
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
        hostname: gethostname::gethostname().to_string_lossy().into_owned(),
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
                    sink_db: cfg.sink_db.as_deref().map(crate::sink::sql::redact),
                };
                cp.append_offsets(&entry)?;
                crate::checkpoint::failpoint("engine:after-write-ahead");
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

        crate::checkpoint::failpoint("engine:before-commit");
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

/// Replace stage(s) with a validated plugin (at a batch boundary).
fn install_swap(
    stages: &mut Stages,
    cp: &Checkpoint,
    sql: Option<&SqlGrant>,
    plugin: Plugin,
    bytes: &[u8],
    stage: Option<StageKind>,
    index: Option<usize>,
) -> Result<(), String> {
    let offers = plugin.stages();
    let want_map = match stage {
        Some(StageKind::Map) => {
            if !offers.map {
                return Err(format!(
                    "plugin {} (sha256:{}) exports no map stage",
                    plugin.path().display(),
                    plugin.digest()
                ));
            }
            true
        }
        Some(StageKind::Sink) => false,
        None => offers.map,
    };
    let want_sink = match stage {
        Some(StageKind::Sink) => {
            if !offers.sink {
                return Err(format!(
                    "plugin {} (sha256:{}) exports no sink stage",
                    plugin.path().display(),
                    plugin.digest()
                ));
            }
            true
        }
        Some(StageKind::Map) => false,
        None => offers.sink,
    };
    let map_index = if want_map {
        let i = match (index, stages.maps.len()) {
            (Some(i), n) if i < n => i,
            (Some(i), n) => return Err(format!("--index {i}: the pipeline has {n} map stage(s)")),
            (None, 1) => 0,
            (None, 0) => return Err("the pipeline has no map stage to replace".into()),
            (None, n) => {
                return Err(format!(
                    "the pipeline has {n} map stages: say which with --index"
                ));
            }
        };
        Some(i)
    } else {
        None
    };
    if want_sink && stages.sink.is_none() {
        return Err("the pipeline has no sink stage to replace".into());
    }
    cp.store_plugin(bytes).map_err(|e| e.to_string())?;
    stages.files.insert(
        plugin.digest().to_string(),
        plugin.path().display().to_string(),
    );
    if let Some(i) = map_index {
        stages.maps[i] = plugin.instance();
        if let Some(r) = stages
            .refs
            .iter_mut()
            .filter(|r| r.stage == StageKind::Map)
            .nth(i)
        {
            r.digest = plugin.digest().to_string();
        }
    }
    if want_sink {
        stages.sink = Some(plugin.instance_with_sql(sql.cloned()));
        for r in stages
            .refs
            .iter_mut()
            .filter(|r| r.stage == StageKind::Sink)
        {
            r.digest = plugin.digest().to_string();
        }
    }
    Ok(())
}

fn add_counts(total: &mut Counts, c: &Counts) {
    total.input += c.input;
    total.output += c.output;
    total.filtered += c.filtered;
    total.bad_records += c.bad_records;
    total.dead_lettered += c.dead_lettered;
    total.skipped += c.skipped;
}

/// Retry `f` while it fails with a retryable error.
fn with_retries<T, E: std::fmt::Display>(
    attempts: u32,
    what: &str,
    retryable: impl Fn(&E) -> bool,
    mut f: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let mut delay = Duration::from_millis(200);
    let mut attempt = 1;
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if attempt < attempts && retryable(&e) => {
                tracing::warn!(
                    "{what} failed (attempt {attempt} of {attempts}), retrying in {} ms: {e}",
                    delay.as_millis()
                );
                std::thread::sleep(delay);
                delay *= 4;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

fn sink_retryable(e: &SinkError) -> bool {
    match e {
        SinkError::Plugin(p) => p.is_retryable(),
        // Connection problems (08…) and serialization failures/deadlocks
        // (40…) are transient; the range was rolled back.
        SinkError::Sql { error, .. } => {
            error.code.starts_with("08")
                || error.code.starts_with("40")
                || error.code == "SQLITE_BUSY"
        }
        _ => false,
    }
}

/// Map a piece of a partition's range through the chain, retrying retryable
/// failures and traps (whole-call `bad-record` errors are handled by the
/// chain itself). When the call still traps and `isolate` is given (error
/// policy `dlq` or `skip`; the process's stop flag), the records that make
/// it trap are found by [`isolate_traps`] and become bad records; under
/// `fail` the trap stops the batch.
fn map_partition(
    maps: &mut [Instance],
    ctx: &CallContext,
    records: &[Record<'_>],
    attempts: u32,
    isolate: Option<(&AtomicBool, &mut RangeTraps)>,
    metrics: &Metrics,
) -> Result<ChainResult, PluginError> {
    let r = with_retries(attempts, "map", PluginError::is_retryable, || {
        let r = run_chain(maps, ctx, records);
        if matches!(r, Err(PluginError::Trap(_))) {
            metrics.trap();
        }
        r
    });
    match (r, isolate) {
        (Err(PluginError::Trap(t)), Some((stop, traps))) => {
            if traps.first.is_none() {
                traps.first = Some(t.clone());
            }
            let mut budget = TrapBudget {
                stop,
                traps_left: traps.left,
                attempts,
            };
            let result = isolate_traps(maps, ctx, records, t, &mut budget);
            traps.left = budget.traps_left;
            let result = result?;
            let trapped = result.rejected.iter().filter(|r| r.trapped).count();
            for _ in 0..trapped {
                metrics.trap();
            }
            traps.trapped += trapped;
            Ok(result)
        }
        (other, _) => other,
    }
}

/// Trap isolation across the map calls of one partition's range in a
/// batch: one budget of trapping calls for the whole range, and the count
/// of records found trapping (if that is every record of the range, the
/// plugin is taken as broken; see [`BatchRun::finish`]).
struct RangeTraps {
    left: u32,
    trapped: usize,
    first: Option<Box<crate::plugin::Trapped>>,
}

impl Default for RangeTraps {
    fn default() -> Self {
        RangeTraps {
            left: DEFAULT_ISOLATION_TRAPS,
            trapped: 0,
            first: None,
        }
    }
}

/// Records handed to one map call at most: the fetch thread delivers
/// pieces of this size, so the map of one piece overlaps the reading of
/// the next (2,000 records of ~200 bytes: ~0.4 MB, a few ms of mapping).
const MAP_PIECE_RECORDS: usize = 2_000;

/// One partition's range within a batch: what was read and mapped and not
/// yet sunk, and how far the sink got.
#[derive(Default)]
struct RangeState {
    /// Records read and mapped since the last sink of this range.
    records: Vec<SourceRecord>,
    /// Their map results (source indices into `records`).
    mapped: ChainResult,
    traps: RangeTraps,
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
struct BatchRun<'a> {
    cfg: &'a PipelineConfig,
    maps: &'a mut [Instance],
    /// Digest → file, for messages.
    files: &'a BTreeMap<String, String>,
    entry: &'a OffsetsEntry,
    ctx: CallContext,
    metrics: &'a Metrics,
    stop: &'a AtomicBool,
    states: Vec<RangeState>,
    counts: Counts,
    map_time: Duration,
    /// Parts for the sink thread, in order (`None` once the batch's
    /// pieces are all handed over: the sink thread then ends).
    sink: Option<std::sync::mpsc::SyncSender<SinkJob>>,
}

/// Parts queued for the sink thread at most: the map runs this far ahead
/// of the sink (a part holds one piece, or more while every record of its
/// range so far trapped).
const SINK_QUEUE: usize = 2;

/// Pieces queued between the fetch thread and the map at most.
const PIECE_QUEUE: usize = 4;

/// A part of a range, mapped and ready for the sink: the part's source
/// records, its outputs (source indices into `records`) and dead letters.
struct SinkJob {
    /// Index of the range in the batch.
    range: usize,
    part: crate::plugin::PartitionRange,
    records: Vec<SourceRecord>,
    outputs: Vec<crate::plugin::chain::ChainOutput>,
    dead_letters: Vec<DeadLetter>,
}

/// What the sink thread did in one batch.
struct SinkReport {
    dead_lettered: u64,
    /// Records the sink stage rejected.
    bad_records: u64,
    /// Of those, skipped (policy `skip`).
    skipped: u64,
    /// Outputs of the records the sink rejected (counted as outputs when
    /// the map stage made them).
    rejected_outputs: u64,
    /// Per range: the offsets found applied already and skipped.
    already_applied: Vec<Skipped>,
    time: Duration,
}

/// Most records the sink stage may reject in one part before it is taken
/// as broken (each rejection writes the part again), the same number as
/// the map stages' trap budget per partition and batch.
const SINK_REJECTIONS: usize = 48;

/// How the sink thread treats records the sink stage rejects.
struct SinkPolicy {
    on_error: ErrorPolicy,
    /// Position of the sink stage in the pipeline (after the map stages),
    /// for dead letters.
    stage: usize,
    attempts: u32,
}

/// The sink thread of a batch: apply each part, in the order queued, with
/// retries. A record the sink rejects (`bad-record` from `sink.write`) gets
/// the error policy: under `dlq`/`skip` the part is applied again without
/// it (and with its dead letter); under `fail` the batch stops. Stops at
/// the first part that fails (the batch is then not committed).
fn run_sink(
    jobs: std::sync::mpsc::Receiver<SinkJob>,
    mut sink: Option<&mut Instance>,
    driver: &SinkDriver,
    policy: &SinkPolicy,
    metrics: &Metrics,
    ranges: usize,
) -> Result<SinkReport, EngineError> {
    let mut report = SinkReport {
        dead_lettered: 0,
        bad_records: 0,
        skipped: 0,
        rejected_outputs: 0,
        already_applied: vec![Skipped::default(); ranges],
        time: Duration::ZERO,
    };
    for job in jobs {
        // Source records the sink rejected in this part, and their dead
        // letters (policy `dlq`).
        let mut rejected: Vec<usize> = Vec::new();
        let mut dead_letters = job.dead_letters.clone();
        let t = Instant::now();
        let applied = loop {
            let sink_records: Vec<SinkRecord<'_>> = job
                .outputs
                .iter()
                .filter(|o| !rejected.contains(&o.source_index))
                .map(|o| {
                    let s = &job.records[o.source_index];
                    SinkRecord {
                        idempotency_key: &o.idempotency_key,
                        record: Record {
                            topic: &job.part.topic,
                            partition: job.part.partition,
                            offset: s.offset,
                            timestamp: s.timestamp,
                            timestamp_type: s.timestamp_type,
                            key: o.key.as_deref(),
                            value: o.value.as_deref(),
                            headers: sluice_guest::wire::header_views(&o.headers),
                        },
                    }
                })
                .collect();
            let batch = PartitionBatch {
                range: job.part.clone(),
                records: &sink_records,
                dead_letters: &dead_letters,
            };
            let r = with_retries(policy.attempts, "sink", sink_retryable, || {
                let r = driver.apply(sink.as_deref_mut(), &batch);
                if let Err(e) = &r {
                    if matches!(e, SinkError::Plugin(PluginError::Trap(_))) {
                        metrics.trap();
                    }
                    // The part was rolled back: the next attempt starts from
                    // a fresh plugin instance, not from state the sink kept
                    // (rows it buffered for `close`, say).
                    if let Some(s) = sink.as_deref_mut() {
                        s.discard();
                    }
                }
                r
            });
            let (offset, message, error) = match r {
                Err(SinkError::Rejected {
                    offset,
                    message,
                    error,
                }) => (offset, message, error),
                other => break other?,
            };
            let (path, digest) = match error.as_ref() {
                PluginError::Stage { path, digest, .. } => {
                    (path.display().to_string(), digest.clone())
                }
                _ => Default::default(),
            };
            let Ok(src) = job.records.binary_search_by_key(&offset, |r| r.offset) else {
                return Err(EngineError::Internal(format!(
                    "the sink rejected offset {offset} of {}/{}, which is not in the part",
                    job.part.topic, job.part.partition
                )));
            };
            report.bad_records += 1;
            let site = (&job.part.topic, job.part.partition, offset);
            match policy.on_error {
                ErrorPolicy::Fail => {
                    return Err(EngineError::BadRecord {
                        topic: site.0.clone(),
                        partition: site.1,
                        offset,
                        plugin: path,
                        digest,
                        message,
                        batch: job.part.batch.batch_id,
                    });
                }
                _ if rejected.len() >= SINK_REJECTIONS => {
                    tracing::error!(topic = %site.0, partition = site.1, "the sink stage rejected {SINK_REJECTIONS} records of one part: it looks broken, not fed bad records; stopping");
                    return Err(EngineError::Sink(SinkError::Plugin(*error)));
                }
                ErrorPolicy::Skip => {
                    report.skipped += 1;
                    tracing::warn!(topic = %site.0, partition = site.1, offset, plugin = %digest, "skipping a record the sink rejected: {message}");
                }
                ErrorPolicy::Dlq => {
                    tracing::warn!(topic = %site.0, partition = site.1, offset, plugin = %digest, "dead-lettering a record the sink rejected: {message}");
                    let r = &job.records[src];
                    let at = dead_letters.partition_point(|d| d.offset < offset);
                    dead_letters.insert(
                        at,
                        DeadLetter {
                            topic: job.part.topic.clone(),
                            partition: job.part.partition,
                            offset,
                            timestamp_ms: r.timestamp,
                            key: r.key.clone(),
                            value: r.value.clone(),
                            headers: r.headers.clone(),
                            error: message,
                            plugin_digest: digest,
                            stage: policy.stage,
                        },
                    );
                }
            }
            report.rejected_outputs +=
                job.outputs.iter().filter(|o| o.source_index == src).count() as u64;
            rejected.push(src);
        };
        report.time += t.elapsed();
        let skipped = match applied {
            Applied::Written {
                dead_lettered,
                skipped,
                ..
            } => {
                report.dead_lettered += dead_lettered;
                skipped
            }
            Applied::AlreadyApplied { skipped } => {
                tracing::debug!(topic = %job.part.topic, partition = job.part.partition, "[{}, {}) already applied by the sink; skipped", job.part.start_offset, job.part.end_offset);
                report.dead_lettered += dead_letters.len() as u64;
                skipped
            }
        };
        if let Some(a) = report.already_applied.get_mut(job.range) {
            a.offsets += skipped.offsets;
            a.by_other_batch |= skipped.by_other_batch;
        }
    }
    Ok(report)
}

impl BatchRun<'_> {
    /// Map the next piece of range `i` and sink it as a part of the range,
    /// unless it is the range's last piece (`done`: [`BatchRun::finish`]
    /// sinks it, up to the planned end).
    fn map_piece(
        &mut self,
        i: usize,
        records: Vec<SourceRecord>,
        done: bool,
    ) -> Result<(), EngineError> {
        if records.is_empty() {
            return Ok(());
        }
        let range = &self.entry.ranges[i];
        if self.states[i].finished {
            return Err(EngineError::Internal(format!(
                "records of {}/{} arrived after its range [{}, {}) was finished",
                range.topic, range.partition, range.start, range.end
            )));
        }
        let views = record_views(&range.topic, range.partition, &records);
        let t = Instant::now();
        // With no map stage the chain passes every record through.
        let isolate = (self.cfg.on_error != ErrorPolicy::Fail)
            .then_some((self.stop, &mut self.states[i].traps));
        let mapped = map_partition(
            self.maps,
            &self.ctx,
            &views,
            self.cfg.attempts,
            isolate,
            self.metrics,
        )?;
        self.map_time += t.elapsed();
        drop(views);
        let st = &mut self.states[i];
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
            && st.traps.trapped < st.seen
            && let Some(next) = next
        {
            self.sink_held(i, next)?;
        }
        Ok(())
    }

    /// Range `i` is read and mapped: sink the rest of it.
    fn finish(&mut self, i: usize) -> Result<(), EngineError> {
        let range = &self.entry.ranges[i];
        let st = &mut self.states[i];
        if st.finished {
            return Err(EngineError::Internal(format!(
                "range [{}, {}) of {}/{} finished twice",
                range.start, range.end, range.topic, range.partition
            )));
        }
        if st.seen > 1
            && st.traps.trapped == st.seen
            && let Some(first) = st.traps.first.take()
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
        let ctx = &self.ctx;
        let counts = &mut self.counts;
        let st = &mut self.states[i];
        let start = st.sunk_to.unwrap_or(range.start);
        let recs = std::mem::take(&mut st.records);
        let mapped = std::mem::take(&mut st.mapped);
        counts.input += recs.len() as u64;
        let mut dead_letters = Vec::new();
        for b in &mapped.rejected {
            let r = &recs[b.source_index];
            counts.bad_records += 1;
            match cfg.on_error {
                ErrorPolicy::Fail => {
                    return Err(EngineError::BadRecord {
                        topic: range.topic.clone(),
                        partition: range.partition,
                        offset: r.offset,
                        plugin: self
                            .files
                            .get(&b.plugin_digest)
                            .cloned()
                            .unwrap_or_default(),
                        digest: b.plugin_digest.clone(),
                        message: b.message.clone(),
                        batch: self.entry.batch_id,
                    });
                }
                ErrorPolicy::Skip => {
                    counts.skipped += 1;
                    tracing::warn!(topic = %range.topic, partition = range.partition, offset = r.offset, plugin = %b.plugin_digest, "skipping bad record: {}", b.message);
                }
                ErrorPolicy::Dlq => {
                    tracing::warn!(topic = %range.topic, partition = range.partition, offset = r.offset, plugin = %b.plugin_digest, "dead-lettering bad record: {}", b.message);
                    dead_letters.push(DeadLetter {
                        topic: range.topic.clone(),
                        partition: range.partition,
                        offset: r.offset,
                        timestamp_ms: r.timestamp,
                        key: r.key.clone(),
                        value: r.value.clone(),
                        headers: r.headers.clone(),
                        error: b.message.clone(),
                        plugin_digest: b.plugin_digest.clone(),
                        stage: b.stage,
                    });
                }
            }
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
            part: crate::plugin::PartitionRange {
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
        // The sink thread stopped only because a part failed: the caller
        // reports that error.
        self.sink
            .as_ref()
            .ok_or(EngineError::SinkStopped)?
            .send(job)
            .map_err(|_| EngineError::SinkStopped)?;
        self.states[i].sunk_to = Some(end);
        Ok(())
    }
}

/// Fetch, map and sink one batch. Returns counts, timings (plan and commit
/// are filled in by the caller) and, for a re-run, ranges found deleted.
#[allow(clippy::too_many_arguments)]
fn run_batch(
    cfg: &PipelineConfig,
    source: &mut KafkaSource,
    stages: &mut Stages,
    driver: &SinkDriver,
    entry: &OffsetsEntry,
    query_id: &str,
    epoch: u64,
    rerun: bool,
    metrics: &Metrics,
    stop: &AtomicBool,
) -> Result<(Counts, Timings, Vec<crate::checkpoint::DataLossGap>), EngineError> {
    let mut timings = Timings::default();
    let ranges: Vec<FetchRange> = entry
        .ranges
        .iter()
        .map(|r| FetchRange {
            topic: r.topic.clone(),
            partition: r.partition,
            start: r.start,
            end: r.end,
        })
        .collect();
    // A re-run may find part of its planned range deleted by retention since
    // it was planned: the data-loss policy applies here too.
    let mut ranges = ranges;
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
                match cfg.on_data_loss {
                    DataLossPolicy::Fail => {
                        return Err(EngineError::DataLoss {
                            topic: r.topic.clone(),
                            partition: r.partition,
                            from: r.start,
                            to: low,
                        });
                    }
                    DataLossPolicy::Skip => {
                        let to = low.min(r.end);
                        tracing::warn!(topic = %r.topic, partition = r.partition, "data loss in re-run batch: offsets [{}, {to}) were deleted; skipping them", r.start);
                        gaps.push(crate::checkpoint::DataLossGap {
                            topic: r.topic.clone(),
                            partition: r.partition,
                            from: r.start,
                            to,
                        });
                        r.start = to;
                    }
                }
            }
        }
    }
    // Our epoch, also when re-running a batch planned by an older owner:
    // sinks fence on it.
    let ctx = CallContext {
        query_id: query_id.to_string(),
        batch_id: entry.batch_id,
        epoch,
    };
    let Stages {
        maps, sink, files, ..
    } = stages;
    let (sink_tx, sink_rx) = std::sync::mpsc::sync_channel::<SinkJob>(SINK_QUEUE);
    let sink_policy = SinkPolicy {
        on_error: cfg.on_error,
        stage: maps.len(),
        attempts: cfg.attempts,
    };
    // Three threads: the fetch reads pieces, this thread maps each piece as
    // it arrives, and the sink thread applies each mapped piece as a part
    // of its range while the next is read and mapped.
    let mut fetch_time = Duration::ZERO;
    let cancel = AtomicBool::new(false);
    let (mut counts, map_time, report) = std::thread::scope(|s| {
        let sinker = s.spawn(|| {
            run_sink(
                sink_rx,
                sink.as_mut(),
                driver,
                &sink_policy,
                metrics,
                entry.ranges.len(),
            )
        });
        // Owned by this closure, so that even a panic here drops the sink
        // queue's sender and the sink thread ends (the scope joins it).
        let mut run = BatchRun {
            cfg,
            maps,
            files,
            entry,
            ctx,
            metrics,
            stop,
            states: entry.ranges.iter().map(|_| RangeState::default()).collect(),
            counts: Counts::default(),
            map_time: Duration::ZERO,
            sink: Some(sink_tx),
        };
        // Bounded, like the sink queue: when the map falls behind, records
        // wait in librdkafka's own (bounded) queue, not here.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Piece>(PIECE_QUEUE);
        let fetch_ranges = &ranges;
        let cancel_ref = &cancel;
        let fetcher = s.spawn(move || {
            let t = Instant::now();
            let r = source.fetch(fetch_ranges, MAP_PIECE_RECORDS, cancel_ref, &mut |p| {
                tx.send(p).is_ok()
            });
            (r, t.elapsed())
        });
        let processed = (|| -> Result<(), EngineError> {
            // Planned ranges that a re-run found wholly deleted: nothing to
            // read, but their sinks still record the range as applied.
            for (i, (planned, read)) in entry.ranges.iter().zip(&ranges).enumerate() {
                if planned.start != planned.end && read.start == read.end {
                    run.finish(i)?;
                }
            }
            for piece in rx.iter() {
                let done = piece.done;
                let i = piece.range;
                run.map_piece(i, piece.records, done)?;
                if done {
                    run.finish(i)?;
                }
            }
            Ok(())
        })();
        // Stops the fetch thread if we failed.
        cancel.store(true, Ordering::Relaxed);
        drop(rx);
        // Closes the sink queue: the sink thread applies what is queued and
        // ends.
        run.sink = None;
        let (fetched, took) = match fetcher.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        fetch_time = took;
        let report = match sinker.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        // The sink's own error explains a stopped sink; otherwise the
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
        for (planned, state) in entry.ranges.iter().zip(&run.states) {
            if planned.start != planned.end && !state.finished {
                return Err(EngineError::Internal(format!(
                    "the fetch ended without finishing {}/{} [{}, {})",
                    planned.topic, planned.partition, planned.start, planned.end
                )));
            }
        }
        Ok((run.counts, run.map_time, report))
    })?;
    timings.fetch = ms(fetch_time);
    for (range, skipped) in entry.ranges.iter().zip(&report.already_applied) {
        if skipped.offsets == 0 {
            continue;
        }
        if skipped.by_other_batch {
            let again = format!(
                "host checkpoint reset {} --topic {} --to {} --sink-db {} --reapply",
                shell_word(&cfg.checkpoint.display().to_string()),
                shell_word(&range.topic),
                shell_word(&format!(
                    "offsets:{{\"{}\":{{\"{}\":{}}}}}",
                    range.topic, range.partition, range.start
                )),
                shell_word(&crate::sink::sql::redact(
                    cfg.sink_db.as_deref().unwrap_or("URL")
                ))
            );
            tracing::warn!(topic = %range.topic, partition = range.partition, skipped = skipped.offsets, "{} of the {} offsets of [{}, {}) were skipped: the sink's progress rows (sluice_progress) show them applied by an earlier batch, so this is a reset back or a restored checkpoint. With the pipeline stopped, `{again}` applies them again", skipped.offsets, range.end - range.start, range.start, range.end);
        } else {
            tracing::info!(topic = %range.topic, partition = range.partition, skipped = skipped.offsets, "{} of the {} offsets of [{}, {}) were applied by an earlier run of this batch; skipped", skipped.offsets, range.end - range.start, range.start, range.end);
        }
    }
    counts.dead_lettered += report.dead_lettered;
    counts.bad_records += report.bad_records;
    counts.skipped += report.skipped;
    counts.output = counts.output.saturating_sub(report.rejected_outputs);
    timings.map = ms(map_time);
    timings.sink = ms(report.time);
    Ok((counts, timings, gaps))
}

/// Positions after a batch: the end of each range.
pub fn ends(ranges: &[PartitionRange]) -> BTreeMap<TopicPartition, i64> {
    ranges
        .iter()
        .map(|r| ((r.topic.clone(), r.partition), r.end))
        .collect()
}
