//! Startup: everything between `host run` and the first plan. Checks what
//! the user gave (plugins, sink database, topics) before touching the
//! checkpoint, asks a running owner to hand over (`--takeover`), opens and
//! claims the checkpoint, and assembles the running [`Pipeline`]: stages,
//! Kafka reader, sink driver, metrics and the control socket.
//!
//! Order matters for what a failure leaves behind: a mistyped plugin path,
//! an unreachable database or a missing topic fails before a new
//! checkpoint exists (so the corrected command is not refused by it), and
//! with `--takeover` everything is compiled and the fingerprint checked
//! before the owner is asked to stop.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::capability::sql::{self, SqlGrant};
use crate::checkpoint::{
    self, Checkpoint, DirCheckpoint, Epoch, OffsetsEntry, OpenOptions, PluginRef, Recovery,
};
use crate::control::Handover;
use crate::control::handover::{self, Takeover};
use crate::control::{ControlServer, LiveStatus, Request, ServerContext};
use crate::metrics::{Metrics, MetricsServer};
use crate::plugin::{Plugin, Runtime};
use crate::sink::SinkDriver;
use crate::source::KafkaSource;
use crate::util::now_ms;

use super::plan::Planner;
use super::stages::{Stages, assemble, config_digest, load_plugins};
use super::{EngineError, ErrorPolicy, PipelineConfig};

/// How `run` acquires the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Acquire {
    /// Fail at once (or queue with `--wait`) if another process owns it.
    #[default]
    Normal,
    /// Ask the owner to hand over, waiting at most this long for it.
    Takeover(Duration),
}

/// A started pipeline: the claimed checkpoint and everything a batch
/// needs. Dropping it releases the checkpoint and removes the control
/// socket.
pub(super) struct Pipeline {
    pub(super) cp: Box<dyn Checkpoint>,
    pub(super) epoch: Epoch,
    pub(super) query_id: String,
    pub(super) stages: Stages,
    pub(super) sql: Option<SqlGrant>,
    pub(super) source: KafkaSource,
    pub(super) driver: SinkDriver,
    pub(super) planner: Planner,
    /// A batch planned but not committed by an earlier run: run it first.
    pub(super) pending_rerun: Option<OffsetsEntry>,
    /// With `--takeover`: the old owner, to tell when we first wrote.
    pub(super) takeover: Option<Takeover>,
    /// Written into every write-ahead entry.
    pub(super) config_digest: String,
    /// The sink database, redacted (see [`sql::sink_identity`]).
    pub(super) sink_identity: Option<String>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) _metrics_server: Option<MetricsServer>,
    pub(super) status: Arc<Mutex<LiveStatus>>,
    pub(super) requests: Receiver<Request>,
    /// Set by the control socket when a request is queued.
    pub(super) wake: Arc<AtomicBool>,
    pub(super) control: Option<ControlServer>,
    /// When this run last committed, ms since the Unix epoch.
    pub(super) last_commit_ms: Option<i64>,
}

/// The plugins a checkpoint directory records for resuming, read without
/// opening it (its owner may hold the lock).
fn recorded_plugins(cfg: &PipelineConfig) -> Vec<PluginRef> {
    checkpoint::status(&cfg.checkpoint)
        .ok()
        .map(|s| {
            s.last_committed
                .map(|c| c.plugins)
                .filter(|p| !p.is_empty())
                .or(s.last_planned.map(|o| o.plugins))
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

fn sink_db_error(url: &str) -> impl FnOnce(sql::DbError) -> EngineError + '_ {
    move |error| EngineError::SinkDb {
        url: sql::redact(url),
        error,
    }
}

/// Check the configuration, claim the checkpoint and assemble the
/// pipeline.
///
/// # Errors
/// [`EngineError::Config`] for flags that do not fit together,
/// [`EngineError::PluginLoad`], [`EngineError::SinkDb`],
/// [`EngineError::Source`] (a missing topic), [`EngineError::Takeover`],
/// [`EngineError::Checkpoint`] (owned, corrupt, fingerprint).
pub(super) fn start(cfg: &PipelineConfig, acquire: Acquire) -> Result<Pipeline, EngineError> {
    if cfg.topics.is_empty() {
        return Err(EngineError::Config("no topics: pass --topic NAME".into()));
    }
    if cfg.on_error == ErrorPolicy::Dlq && cfg.sink_db.is_none() {
        return Err(EngineError::Config(
            "--on-error dlq stores dead letters in the sink database: pass --sink-db sqlite:PATH or postgres://…".into(),
        ));
    }
    let runtime = Arc::new(Runtime::new(cfg.limits).map_err(EngineError::Config)?);
    let read_stored = |digest: &str| checkpoint::read_stored_plugin(&cfg.checkpoint, digest);

    // Validate what the user gave before creating or touching the
    // checkpoint: the plugins (with --takeover, also the ones the
    // checkpoint records, and its fingerprint) and the sink database. With
    // --takeover all of it happens before the owner is asked to stop.
    let recorded = match acquire {
        Acquire::Takeover(_) => recorded_plugins(cfg),
        Acquire::Normal => Vec::new(),
    };
    let mut preloaded = None;
    if !cfg.plugins.is_empty() || matches!(acquire, Acquire::Takeover(_)) {
        preloaded = Some(load_plugins(cfg, &runtime, &recorded, &read_stored)?);
    }
    if matches!(acquire, Acquire::Takeover(_)) && !cfg.allow_fingerprint_change {
        // A pipeline the checkpoint would refuse must not make the owner
        // hand over and exit first.
        checkpoint::check_fingerprint(&cfg.checkpoint, &cfg.topics)?;
    }
    let sql = match &cfg.sink_db {
        Some(url) => Some(
            SqlGrant::connect_with(url, cfg.sink_db_password_file.as_deref())
                .map_err(sink_db_error(url))?,
        ),
        None => None,
    };
    if let Some(g) = &sql {
        let url = cfg.sink_db.as_deref().unwrap_or_default();
        g.limit_statements(cfg.limits.call_timeout)
            .and_then(|()| g.set_host_schema(cfg.sink_schema.clone()))
            .and_then(|()| g.set_plugin_role(cfg.sink_plugin_role.clone()))
            .map_err(sink_db_error(url))?;
    }
    let sink_identity = match cfg.sink_db.as_deref() {
        Some(url) => Some(
            sql::sink_identity_in(url, cfg.sink_schema.as_deref())
                .map_err(|e| EngineError::Config(format!("--sink-db {}: {e}", sql::redact(url))))?,
        ),
        None => None,
    };
    let mut takeover = None;
    let mut wait = cfg.wait;
    if let Acquire::Takeover(timeout) = acquire {
        takeover = handover::request(&cfg.checkpoint, timeout)
            .map_err(|e| EngineError::Takeover(e.to_string()))?;
        // The old owner released the lock before answering; allow for a
        // forked child still holding the descriptor for a moment.
        wait = Some(wait.unwrap_or(Duration::ZERO).max(Duration::from_secs(10)));
    }

    // A new checkpoint records the topics in its fingerprint: check they
    // exist first, so a mistyped topic leaves no checkpoint behind that a
    // corrected command would then refuse.
    if !checkpoint::exists(&cfg.checkpoint) {
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

    let cp: Box<dyn Checkpoint> = Box::new(DirCheckpoint::open(
        &cfg.checkpoint,
        &OpenOptions {
            topics: cfg.topics.clone(),
            allow_fingerprint_change: cfg.allow_fingerprint_change,
            wait,
            retention: cfg.retention,
            create: true,
        },
    )?);
    let epoch = cp.epoch();
    let query_id = cp.query_id().to_string();
    tracing::info!(checkpoint = %cp.location(), epoch = epoch.get(), query_id, "checkpoint opened");

    let checkpoint_dir =
        std::path::absolute(&cfg.checkpoint).unwrap_or_else(|_| cfg.checkpoint.clone());
    let driver = SinkDriver::new(sql.clone())
        .map_err(sink_db_error(cfg.sink_db.as_deref().unwrap_or_default()))?
        .reconnect_for(cfg.sink_retry_for)
        .owner(format!(
            "pid {} on {}, checkpoint {}",
            std::process::id(),
            crate::util::hostname(),
            checkpoint_dir.display()
        ));
    if !cfg.allow_shared_sink {
        refuse_shared_sink(cfg, &driver, &query_id, sink_identity.as_deref())?;
    }
    if let Some(g) = &sql
        && let Some(user) = g
            .unconfined_superuser()
            .map_err(sink_db_error(cfg.sink_db.as_deref().unwrap_or_default()))?
    {
        tracing::warn!(
            "the sink database login role {user} is a superuser and no --sink-plugin-role is set: plugin SQL runs as a superuser, which the host's statement checks cannot fully confine (server files, settings, other databases); run plugins under a role of their own (README, \"Sink stages and the SQL capability\")"
        );
    }
    let (recorded, pending_rerun) = match cp.recovery() {
        Recovery::Resume { plugins, .. } => (plugins.clone(), None),
        Recovery::Rerun { entry } => (entry.plugins.clone(), Some(entry.clone())),
    };
    // A batch planned against one sink and re-run against another would
    // be applied without the progress rows that show what of it was.
    if let (Some(entry), Some(ours)) = (&pending_rerun, &sink_identity)
        && let Some(planned) = &entry.sink_db
        // A password given another way (the URL, a file) is the same sink.
        && planned.replace(":***@", "@") != ours.replace(":***@", "@")
    {
        return Err(EngineError::Config(format!(
            "batch {} was planned against sink database {planned} and is to be run again, but this run's sink is {ours} (`#schema=` is --sink-schema): re-running it there could apply records twice. Start with the same --sink-db and --sink-schema",
            entry.batch_id
        )));
    }
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
        _ => load_plugins(cfg, &runtime, &recorded, &|d: &str| cp.load_plugin(d))?,
    };
    for (_, bytes) in &loaded {
        cp.store_plugin(bytes)?;
    }
    let stages = assemble(cfg, &loaded, &recorded, sql.as_ref())?;
    drop(loaded);

    let group = cfg
        .commit_offsets_to
        .clone()
        .unwrap_or_else(|| format!("sluice-{query_id}"));
    let source = KafkaSource::new(
        &cfg.brokers,
        &cfg.kafka,
        &group,
        cfg.commit_offsets_to.is_some(),
        cfg.kafka_timeout,
    )?;
    let metrics = Arc::new(Metrics::new());
    metrics.set_epoch(epoch);
    let metrics_server = match cfg.metrics_addr {
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
    let (tx, requests) = std::sync::mpsc::channel();
    let wake = Arc::new(AtomicBool::new(false));
    let control = ControlServer::start(
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
    })?;

    let planner = Planner::new(cp.recovery(), cp.topic_identities());
    Ok(Pipeline {
        cp,
        epoch,
        query_id,
        stages,
        sql,
        source,
        driver,
        planner,
        pending_rerun,
        takeover,
        config_digest: config_digest(cfg),
        sink_identity,
        metrics,
        _metrics_server: metrics_server,
        status,
        requests,
        wake,
        control: Some(control),
        last_commit_ms: None,
    })
}

impl Pipeline {
    /// Give the checkpoint up to the process that asked for it: release
    /// the claim, then wait (bounded) for the new owner's report so the
    /// gap gets logged, then stop serving the control socket.
    pub(super) fn hand_over(self, h: Handover) {
        let Pipeline {
            cp, control, epoch, ..
        } = self;
        let last_batch = cp.last_committed();
        drop(cp);
        tracing::info!(epoch = epoch.get(), last_batch = ?last_batch, "handed over: lock released");
        handover::finish(h);
        drop(control);
    }
}

/// Refuse to start when the sink database holds another pipeline's
/// progress on our topics ([`SinkDriver::other_pipelines`]): two
/// checkpoints on one sink would both apply every record.
pub(super) fn refuse_shared_sink(
    cfg: &PipelineConfig,
    driver: &SinkDriver,
    query_id: &str,
    url: Option<&str>,
) -> Result<(), EngineError> {
    let others = driver
        .other_pipelines(query_id, &cfg.topics)
        .map_err(EngineError::Sink)?;
    if others.is_empty() {
        return Ok(());
    }
    let described: Vec<String> = others
        .iter()
        .map(|o| {
            format!(
                "query id {} on topic {} ({} partitions, last written {}{})",
                o.query_id,
                o.topic,
                o.partitions,
                crate::util::rfc3339_ms(o.updated_at_ms),
                if o.owner.is_empty() {
                    " by a host that did not record its checkpoint".to_string()
                } else {
                    format!(" by {}", o.owner)
                }
            )
        })
        .collect();
    let mut ids: Vec<&str> = others.iter().map(|o| o.query_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    Err(EngineError::SharedSink {
        url: url.unwrap_or_default().to_string(),
        others: described.join("; "),
        delete: ids
            .iter()
            .map(|q| driver.delete_rows_sql(q))
            .collect::<Vec<_>>()
            .join("; "),
    })
}
