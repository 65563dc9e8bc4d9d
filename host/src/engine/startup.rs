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

use crate::capability::sql::{self, SqlGrant};
use crate::checkpoint::Checkpoint;
use crate::control::Handover;
use crate::control::handover::{self, Takeover};
use crate::control::{ControlServer, LiveStatus, Request, ServerContext};
use crate::metrics::{Metrics, MetricsServer};
use crate::output::{KafkaOutput, OutputGuarantee};
use crate::plugin::Runtime;
use crate::sink::SinkDriver;
use crate::source::KafkaSource;
use crate::util::now_ms;

use super::member::Member;
use super::member::swap::GroupSwaps;
use super::open::{Acquire, DiscardIfNew, Opened, open_dir, refuse_shared_sink, sink_db_error};
use super::plan::{Holdings, Planner};
use super::stages::{Stages, config_digest};
use super::{EngineError, ErrorPolicy, PipelineConfig};

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
/// needs. Dropping it removes the control socket, then releases the
/// checkpoint (fields drop in declaration order: the socket goes while
/// the lock is still held, so it is never the next owner's).
pub(super) struct Pipeline {
    pub(super) control: Option<ControlServer>,
    pub(super) cp: Arc<dyn Checkpoint>,
    pub(super) holdings: Arc<Holdings>,
    pub(super) planner: Planner,
    pub(super) stages: Stages,
    /// Every sink connection's SQL capability (`--sink-connections`; empty
    /// without a sink database): a swapped-in sink gets one instance each.
    pub(super) grants: Vec<SqlGrant>,
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
    /// When this run last committed, ms since the Unix epoch.
    pub(super) last_commit_ms: Option<i64>,
    /// A group member's parts (`None` for a single host).
    pub(super) group: Option<GroupParts>,
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
    let opened = match &cfg.group {
        Some(group) => super::member::join(cfg, group, &runtime, &holdings)?,
        None => open_dir(cfg, &runtime, acquire, &holdings)?,
    };
    let Opened {
        cp,
        mut stages,
        driver,
        takeover,
        group,
    } = opened;
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
        if out.exactly_once() && group.is_some() {
            if let Some(s) = stages.sinks.first() {
                return Err(EngineError::Config(format!(
                    "--output-topic {} with the sink stage {} in a pipeline group: exactly once in a group is for map-only pipelines (a part's Kafka transaction commits before its database transaction, so a sink's SQL could be lost when a member stops between the two). Run the map stages only, or pass --output-guarantee at-least-once",
                    o.topics.join(", "),
                    s.path().display()
                )));
            }
            // A transactional producer per input partition, made when the
            // partition is claimed; their positions go to the consumer
            // group `sluice-<group>` on the output cluster.
            let positions = crate::output::transactional_id(cp.query_id());
            out.init_partition_transactions(cp.query_id(), &positions)?;
            tracing::info!(
                "output transactions per input partition (transactional ids {})",
                crate::output::partition_transactional_id(cp.query_id(), "<topic>", "<partition>")
            );
        } else if out.exactly_once() {
            // Fences the producers of earlier runs of this pipeline and
            // ends their open transaction, before anything is read.
            // Its consumer group on the output cluster takes the input
            // positions: the pipeline's own name, whatever
            // --commit-offsets-to says (that group, on the input cluster,
            // still gets informational commits).
            let id = crate::output::transactional_id(cp.query_id());
            out.init_transactions(&id, &id)?;
            tracing::info!(transactional_id = id, "output transactions initialized");
        }
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
    // A pipeline of its own on the same sink and topics (another
    // checkpoint directory, or a group) would apply every record again:
    // its progress rows are its own. (A group member checks before it
    // creates the group.)
    if !cfg.allow_shared_sink && group.is_none() {
        refuse_shared_sink(cfg, &driver, cp.query_id())?;
    }
    if group.is_none() {
        super::open::refuse_discarding_outputs(cfg, !stages.sinks.is_empty())?;
    }
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
            let mut shown = o.identity(&cfg.brokers);
            if o.guarantee == OutputGuarantee::ExactlyOnce && group.is_some() {
                shown.push_str(&format!(
                    ", transactional ids {}",
                    crate::output::partition_transactional_id(
                        cp.query_id(),
                        "<topic>",
                        "<partition>"
                    )
                ));
            } else if o.guarantee == OutputGuarantee::ExactlyOnce {
                shown.push_str(&format!(
                    ", transactional id {}",
                    crate::output::transactional_id(cp.query_id())
                ));
            }
            shown
        }),
        ..LiveStatus::default()
    }));
    let output = output.map(Arc::new);
    if let (Some(out), Some((member, ..))) = (&output, &group) {
        // Claims come from the consumer's rebalances from here on.
        member.set_output(out.clone());
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
            let swaps = GroupSwaps::start(
                store,
                runtime.clone(),
                owner.clone(),
                &stages,
                swaps_before,
                status.clone(),
            )?;
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
    guard.disarm();
    Ok(Pipeline {
        cp,
        holdings,
        planner,
        stages,
        grants,
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
        output,
        rewind_checked: false,
        told_sink_silent: false,
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
