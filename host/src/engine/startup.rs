//! Startup: everything between `host run` and the first plan, for a
//! single host and a group member alike. Checks what the user gave
//! (plugins, sink database, topics) before touching the checkpoint,
//! opens the store (a checkpoint directory, asking a running owner to
//! hand over with `--takeover`; or the group's store in the sink
//! database, `member::join`), and assembles the running [`Pipeline`]:
//! stages, Kafka reader, sink driver, metrics, status and, for a
//! directory, the control socket.
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
    self, Checkpoint, DirCheckpoint, DirStore, OpenOptions, PluginRef, Recovery,
};
use crate::control::Handover;
use crate::control::handover::{self, Takeover};
use crate::control::{ControlServer, LiveStatus, Request, ServerContext};
use crate::metrics::{Metrics, MetricsServer};
use crate::plugin::{Plugin, Runtime};
use crate::sink::SinkDriver;
use crate::source::KafkaSource;
use crate::util::now_ms;

use super::member::Member;
use super::member::swap::GroupSwaps;
use super::plan::{Holdings, Planner};
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

/// What a group member has besides the pipeline.
pub(super) struct GroupParts {
    /// The group's name.
    pub(super) name: String,
    /// This member (pid, host), for progress and metrics.
    pub(super) owner: String,
    pub(super) member: Arc<Member>,
    pub(super) swaps: GroupSwaps,
}

/// A started pipeline: the claimed checkpoint and everything a batch
/// needs. Dropping it releases the checkpoint and removes the control
/// socket.
pub(super) struct Pipeline {
    pub(super) cp: Arc<dyn Checkpoint>,
    pub(super) holdings: Arc<Holdings>,
    pub(super) planner: Planner,
    pub(super) stages: Stages,
    pub(super) sql: Option<SqlGrant>,
    pub(super) source: KafkaSource,
    pub(super) driver: Arc<SinkDriver>,
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
    /// A group member's parts (`None` for a single host).
    pub(super) group: Option<GroupParts>,
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

pub(super) fn sink_db_error(url: &str) -> impl FnOnce(sql::DbError) -> EngineError + '_ {
    move |error| EngineError::SinkDb {
        url: sql::redact(url),
        error,
    }
}

/// What opening the store gave: the store, the plugins to run, and the
/// store's own parts.
pub(super) struct Opened {
    pub(super) cp: Arc<dyn Checkpoint>,
    pub(super) stages: Stages,
    pub(super) driver: Arc<SinkDriver>,
    pub(super) takeover: Option<Takeover>,
    /// For a group member: its answers to the coordinator and the
    /// group's store (for the swaps), the last swap asked before it read
    /// the group's plugins, and who it is.
    pub(super) group: Option<(Arc<Member>, Arc<checkpoint::group::GroupStore>, u64, String)>,
}

/// Check the configuration, claim the checkpoint and assemble the
/// pipeline.
///
/// # Errors
/// [`EngineError::Config`] for flags that do not fit together,
/// [`EngineError::PluginLoad`], [`EngineError::SinkDb`],
/// [`EngineError::Source`] (a missing topic), [`EngineError::Takeover`],
/// [`EngineError::Checkpoint`] (owned, corrupt, fingerprint),
/// [`EngineError::PluginAuthority`].
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
    let holdings = Arc::new(Holdings::default());
    let opened = match &cfg.group {
        Some(group) => super::member::join(cfg, group, &runtime, &holdings)?,
        None => open_dir(cfg, &runtime, acquire, &holdings)?,
    };
    let Opened {
        cp,
        stages,
        driver,
        takeover,
        group,
    } = opened;
    let sql = driver.grant().cloned();
    let sink_identity = match cfg.sink_db.as_deref() {
        Some(url) => Some(
            sql::sink_identity_in(url, cfg.sink_schema.as_deref())
                .map_err(|e| EngineError::Config(format!("--sink-db {}: {e}", sql::redact(url))))?,
        ),
        None => None,
    };
    // A pipeline of its own on the same sink and topics (another
    // checkpoint directory, or a group where this is one) would apply
    // every record again: its progress rows are its own.
    if !cfg.allow_shared_sink {
        refuse_shared_sink(cfg, &driver, cp.query_id(), sink_identity.as_deref())?;
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

    let (source, metrics, group) = match group {
        None => {
            let consumer_group = cfg
                .commit_offsets_to
                .clone()
                .unwrap_or_else(|| format!("sluice-{}", cp.query_id()));
            let source = KafkaSource::new(
                &cfg.brokers,
                &cfg.kafka,
                &consumer_group,
                cfg.commit_offsets_to.is_some(),
                cfg.kafka_timeout,
            )?;
            let metrics = Metrics::new();
            if let Some(e) = cp.epoch() {
                metrics.set_epoch(e);
            }
            (source, metrics, None)
        }
        Some((member, store, swaps_before, owner)) => {
            let name = cp.query_id().to_string();
            let source = KafkaSource::member(
                &cfg.brokers,
                &cfg.kafka,
                &name,
                &cfg.topics,
                member.clone(),
                // Offsets are committed to the Kafka group too, for lag
                // dashboards and tools that read them (the database stays
                // the checkpoint).
                true,
                cfg.kafka_timeout,
            )?;
            tracing::info!(group = name, "joined the pipeline group");
            let swaps =
                GroupSwaps::start(store, runtime.clone(), owner.clone(), &stages, swaps_before)?;
            let metrics = Metrics::in_group(&name, &owner);
            (
                source,
                metrics,
                Some(GroupParts {
                    name,
                    owner,
                    member,
                    swaps,
                }),
            )
        }
    };
    let metrics = Arc::new(metrics);
    let metrics_server = match cfg.metrics_addr {
        Some(addr) => {
            Some(MetricsServer::start(addr, metrics.clone()).map_err(EngineError::Config)?)
        }
        None => None,
    };

    // The status the control socket serves (a checkpoint directory's):
    // status, handover, swap.
    let status = Arc::new(Mutex::new(LiveStatus {
        pid: std::process::id(),
        hostname: crate::util::hostname(),
        epoch: cp.epoch().unwrap_or_default(),
        since_ms: now_ms(),
        query_id: cp.query_id().to_string(),
        last_committed: cp.last_committed(),
        plugins: stages.refs.clone(),
        ..LiveStatus::default()
    }));
    let (tx, requests) = std::sync::mpsc::channel();
    let wake = Arc::new(AtomicBool::new(false));
    let control = if group.is_none() {
        Some(
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
        )
    } else {
        None
    };

    let planner = Planner::new(cp.as_ref());
    Ok(Pipeline {
        cp,
        holdings,
        planner,
        stages,
        sql,
        source,
        driver,
        takeover,
        config_digest: config_digest(cfg),
        sink_identity,
        metrics,
        _metrics_server: metrics_server,
        status,
        requests,
        wake,
        control,
        last_commit_ms: None,
        group,
    })
}

/// Connect the sink database of `cfg` (if any) as the SQL capability,
/// with the statement limit, host schema and plugin role set.
///
/// # Errors
/// [`EngineError::SinkDb`].
pub(super) fn connect_sink(cfg: &PipelineConfig) -> Result<Option<SqlGrant>, EngineError> {
    let Some(url) = cfg.sink_db.as_deref() else {
        return Ok(None);
    };
    let g = SqlGrant::connect_with(url, cfg.sink_db_password_file.as_deref())
        .map_err(sink_db_error(url))?;
    g.limit_statements(cfg.limits.call_timeout)
        .and_then(|()| g.set_host_schema(cfg.sink_schema.clone()))
        .and_then(|()| g.set_plugin_role(cfg.sink_plugin_role.clone()))
        .map_err(sink_db_error(url))?;
    Ok(Some(g))
}

/// Open and claim the checkpoint directory of `cfg` (after a handover
/// with `--takeover`), and load the plugins: `--plugin`, or those it
/// records.
fn open_dir(
    cfg: &PipelineConfig,
    runtime: &Runtime,
    acquire: Acquire,
    holdings: &Holdings,
) -> Result<Opened, EngineError> {
    let read_stored = |digest: &str| checkpoint::read_stored_plugin(&cfg.checkpoint, digest);
    let location = format!("the checkpoint {}", cfg.checkpoint.display());

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
        preloaded = Some(load_plugins(
            cfg,
            runtime,
            (&recorded, &location),
            &read_stored,
        )?);
    }
    if matches!(acquire, Acquire::Takeover(_)) && !cfg.allow_fingerprint_change {
        // A pipeline the checkpoint would refuse must not make the owner
        // hand over and exit first.
        checkpoint::check_fingerprint(&cfg.checkpoint, &cfg.topics)?;
    }
    let sql = connect_sink(cfg)?;
    if let Some(url) = cfg.sink_db.as_deref() {
        sql::sink_identity_in(url, cfg.sink_schema.as_deref())
            .map_err(|e| EngineError::Config(format!("--sink-db {}: {e}", sql::redact(url))))?;
    }
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

    let dir = DirCheckpoint::open(
        &cfg.checkpoint,
        &OpenOptions {
            topics: cfg.topics.clone(),
            allow_fingerprint_change: cfg.allow_fingerprint_change,
            wait,
            retention: cfg.retention,
            create: true,
        },
    )?;
    let store = DirStore::new(dir);
    tracing::info!(checkpoint = %store.location(), epoch = store.epoch().unwrap_or_default().get(), query_id = store.query_id(), "checkpoint opened");

    // Every partition the checkpoint knows is ours from here on; the
    // planner claims those that appear later.
    for tp in store.known_partitions() {
        let claimed = store.claim(&tp, "")?;
        holdings.hold(tp, claimed);
    }

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
    let (recorded, pending_rerun) = match store.recovery() {
        Recovery::Resume { plugins, .. } => (plugins.clone(), None),
        Recovery::Rerun { entry } => (entry.plugins.clone(), Some(entry.clone())),
    };
    // A batch planned against one sink and re-run against another would
    // be applied without the progress rows that show what of it was.
    if let (Some(entry), Some(url)) = (&pending_rerun, cfg.sink_db.as_deref())
        && let Ok(ours) = sql::sink_identity_in(url, cfg.sink_schema.as_deref())
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
        _ => load_plugins(cfg, runtime, (&recorded, &location), &|d: &str| {
            store.load_plugin(d)
        })?,
    };
    for (_, bytes) in &loaded {
        store.store_plugin(bytes)?;
    }
    let stages = assemble(cfg, &loaded, &recorded, sql.as_ref())?;
    Ok(Opened {
        cp: Arc::new(store),
        stages,
        driver: Arc::new(driver),
        takeover,
        group: None,
    })
}

impl Pipeline {
    /// Give the checkpoint up to the process that asked for it: release
    /// the claim, then wait (bounded) for the new owner's report so the
    /// gap gets logged, then stop serving the control socket.
    pub(super) fn hand_over(self, h: Handover) {
        let Pipeline {
            cp, control, group, ..
        } = self;
        let epoch = cp.epoch().unwrap_or_default();
        let last_batch = cp.last_committed();
        // The only holder of the store (a directory: no member): dropping
        // it releases the lock.
        drop(group);
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
