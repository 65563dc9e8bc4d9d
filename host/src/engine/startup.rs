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

use std::sync::{Arc, Mutex};

use crate::capability::sql::{self, SqlGrant};
use crate::checkpoint::Checkpoint;
use crate::control::Handover;
use crate::control::LiveStatus;
use crate::metrics::{Metrics, MetricsServer};
use crate::output::KafkaOutput;
use crate::plugin::Runtime;
use crate::sink::SinkDriver;
use crate::source::KafkaSource;
use crate::util::now_ms;

use super::open::{Acquire, DiscardIfNew, sink_db_error};
use super::ownership::{self, LoopState, Opened, Ownership, Started, Starting};
use super::plan::{Holdings, Planner};
use super::stages::{Stages, config_digest};
use super::{EngineError, ErrorPolicy, PipelineConfig};

/// A started pipeline: its owner, the claimed checkpoint and everything a
/// batch needs. Dropping it drops the owner first (a directory's control
/// socket goes while the lock is still held, so it is never the next
/// owner's), then releases the checkpoint (fields drop in declaration
/// order).
pub(super) struct Pipeline {
    /// Who holds which partitions.
    pub(super) owner: Box<dyn Ownership>,
    pub(super) cp: Arc<dyn Checkpoint>,
    pub(super) holdings: Arc<Holdings>,
    pub(super) planner: Planner,
    pub(super) stages: Stages,
    /// Every sink connection's SQL capability (`--sink-connections`; empty
    /// without a sink database): a swapped-in sink gets one instance each.
    pub(super) grants: Vec<SqlGrant>,
    pub(super) source: KafkaSource,
    pub(super) driver: Arc<SinkDriver>,
    /// Written into every write-ahead entry.
    pub(super) config_digest: String,
    /// The sink database, redacted (see [`sql::sink_identity`]).
    pub(super) sink_identity: Option<String>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) _metrics_server: Option<MetricsServer>,
    pub(super) status: Arc<Mutex<LiveStatus>>,
    /// When this run last committed, ms since the Unix epoch.
    pub(super) last_commit_ms: Option<i64>,
    /// The producer of the outputs (`--output-topic`).
    pub(super) output: Option<Arc<KafkaOutput>>,
    /// Exactly once: the first batch this run planned afresh was checked
    /// against the positions the output transactions committed
    /// ([`super::outputs::refuse_rewound`]).
    pub(super) rewind_checked: bool,
    /// A batch's sink stage sent nothing to the output topics it may send
    /// to, and the user was told (once a run).
    pub(super) told_sink_silent: bool,
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
    let opener = ownership::opener(cfg);
    opener.refuse_unfit(cfg)?;
    super::outputs::refuse_unfit_exactly_once(cfg)?;
    // The output topic and the producer's settings are checked before
    // the checkpoint is opened, a takeover asked or a group joined.
    let mut output = match &cfg.output {
        Some(o) => Some(KafkaOutput::connect(
            o,
            &cfg.brokers,
            &cfg.kafka,
            cfg.kafka_timeout,
        )?),
        None => None,
    };
    let runtime = Arc::new(Runtime::new(cfg.limits).map_err(EngineError::Config)?);
    let holdings = Arc::new(Holdings::default());
    let Opened {
        cp,
        mut stages,
        driver,
        scope,
        start,
    } = opener.open(cfg, &runtime, acquire, &holdings)?;
    let guard = DiscardIfNew(Some(cp.as_ref()));
    if let (Some(out), Some(o)) = (&mut output, &cfg.output) {
        let sink = stages
            .sinks
            .first()
            .map(|s| (s.path(), s.digest(), s.sends_records()));
        super::outputs::unfit_topics(o, sink).map_err(EngineError::Config)?;
        if !stages.sinks.is_empty() {
            stages
                .grant_kafka(Arc::new(out.grant()))
                .map_err(EngineError::Config)?;
        }
        if out.exactly_once() {
            // Never exactly once blind: the brokers must keep offsets
            // committed in a transaction and fence old producers.
            let input = cfg.topics.first().map_or("", String::as_str);
            out.probe_exactly_once(cp.query_id(), input)?;
        }
        // A sole owner's transaction covers a batch, a group member's a
        // part of one input partition (see `output::TransactionScope`).
        out.start_transactions(scope, cp.query_id())?;
        let topics = o.topics.join(", ");
        if stages.sinks.is_empty() {
            tracing::info!(
                topic = topics,
                guarantee = o.guarantee.as_str(),
                "producing the outputs to {topics}"
            );
        } else {
            tracing::info!(
                topics,
                guarantee = o.guarantee.as_str(),
                "the sink stage may send to {topics}"
            );
        }
    }
    let grants = driver.grants();
    if grants.len() > 1 {
        tracing::info!(
            connections = grants.len(),
            "applying the parts of different partitions on {} sink connections at once",
            grants.len()
        );
    }
    let sink_identity = match cfg.sink_db.as_deref() {
        Some(url) => Some(
            sql::sink_identity_in(url, cfg.sink_schema.as_deref())
                .map_err(|e| EngineError::Config(format!("--sink-db {}: {e}", sql::redact(url))))?,
        ),
        None => None,
    };
    if let Some(g) = grants.first()
        && let Some(user) = g
            .unconfined_superuser()
            .map_err(sink_db_error(cfg.sink_db.as_deref().unwrap_or_default()))?
    {
        tracing::warn!(
            "the sink database login role {user} is a superuser and no --sink-plugin-role is set: plugin SQL runs as a superuser, which the host's statement checks cannot fully confine (server files, settings, other databases); run plugins under a role of their own (docs/plugins.md, \"A plugin role\")"
        );
    }

    // What `host status` shows: served on the control socket (a
    // checkpoint directory), recorded by the heartbeat (a group member).
    let status = Arc::new(Mutex::new(LiveStatus {
        pid: std::process::id(),
        hostname: crate::util::hostname(),
        epoch: cp.epoch().unwrap_or_default(),
        since_ms: now_ms(),
        query_id: cp.query_id().to_string(),
        last_committed: cp.last_committed(),
        plugins: stages.refs.clone(),
        output: cfg.output.as_ref().map(|o| {
            let shown = o.identity(&cfg.brokers);
            match output.as_ref().and_then(KafkaOutput::transactional_ids) {
                Some(ids) => format!("{shown}, {ids}"),
                None => shown,
            }
        }),
        ..LiveStatus::default()
    }));
    let output = output.map(Arc::new);
    let Started {
        owner,
        source,
        metrics,
    } = start.start(Starting {
        cfg,
        cp: &cp,
        stages: &stages,
        runtime: &runtime,
        status: &status,
        output: output.as_ref(),
    })?;
    let metrics = Arc::new(metrics);
    let metrics_server = match cfg.metrics_addr {
        Some(addr) => {
            Some(MetricsServer::start(addr, metrics.clone()).map_err(EngineError::Config)?)
        }
        None => None,
    };

    let planner = Planner::new(cp.as_ref());
    guard.disarm();
    Ok(Pipeline {
        owner,
        cp,
        holdings,
        planner,
        stages,
        grants,
        source,
        driver,
        config_digest: config_digest(cfg),
        sink_identity,
        metrics,
        _metrics_server: metrics_server,
        status,
        last_commit_ms: None,
        output,
        rewind_checked: false,
        told_sink_silent: false,
    })
}

impl Pipeline {
    /// Run `f` with the owner and what it may reach of the rest.
    pub(super) fn with_owner<T>(
        &mut self,
        cfg: &PipelineConfig,
        f: impl FnOnce(&mut dyn Ownership, &mut LoopState<'_>) -> T,
    ) -> T {
        let Pipeline {
            owner,
            cp,
            holdings,
            planner,
            source,
            stages,
            grants,
            metrics,
            status,
            last_commit_ms,
            ..
        } = self;
        let mut at = LoopState {
            cfg,
            cp,
            holdings,
            planner,
            source,
            stages,
            grants,
            metrics,
            status,
            last_commit_ms: *last_commit_ms,
        };
        f(owner.as_mut(), &mut at)
    }

    /// The run ends (`ok`: without an error; `handover`: to a
    /// `--takeover`): the owner leaves its group or releases the
    /// checkpoint ([`Ownership::leave`]).
    pub(super) fn leave(self, ok: bool, handover: Option<Handover>) {
        let Pipeline {
            owner,
            cp,
            mut source,
            holdings,
            ..
        } = self;
        owner.leave(ok, handover, cp, &mut source, &holdings);
    }
}
