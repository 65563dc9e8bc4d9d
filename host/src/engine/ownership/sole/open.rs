//! Opening a checkpoint directory for its sole owner: after a handover
//! with `--takeover`, with the plugins it records or the `--plugin` files.
//! Everything the user gave is checked before the checkpoint is created
//! or touched, so a refused start leaves nothing behind.

use std::sync::Arc;
use std::time::Duration;

use crate::capability::sql;
use crate::checkpoint::{
    self, Checkpoint, DirCheckpoint, DirStore, OpenOptions, PluginRef, Recovery,
};
use crate::control::handover;
use crate::output::{OutputGuarantee, TransactionScope};
use crate::plugin::{Plugin, Runtime};
use crate::sink::SinkDriver;
use crate::source::KafkaSource;

use crate::engine::open::{Acquire, DiscardIfNew, connect_sink, refuse_shared_sink, sink_db_error};
use crate::engine::plan::Holdings;
use crate::engine::stages::{assemble, load_plugins};
use crate::engine::{EngineError, PipelineConfig};

use super::super::{Open, Opened};
use super::SoleStart;

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

/// Open and claim the checkpoint directory of `cfg` (after a handover
/// with `--takeover`), and load the plugins: `--plugin`, or those it
/// records.
fn open(
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
    let grants = connect_sink(cfg)?;
    if let Some(url) = cfg.sink_db.as_deref() {
        sql::sink_identity_in(url, cfg.sink_schema.as_deref())
            .map_err(|e| EngineError::Config(format!("--sink-db {}: {e}", sql::redact(url))))?;
    }
    if let (Acquire::Takeover(_), Some(loaded)) = (acquire, &preloaded) {
        // Before the owner is asked to stop.
        refuse_discarding_outputs(cfg, loaded.iter().any(|(p, _)| p.stages().sink))?;
        if let Some(o) = &cfg.output {
            let sink = loaded
                .iter()
                .find(|(p, _)| p.stages().sink)
                .map(|(p, _)| (p.path(), p.digest(), p.sends_records()));
            crate::engine::outputs::unfit_topics(o, sink).map_err(EngineError::Config)?;
        }
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
            ..OpenOptions::default()
        },
    )?;
    let store = Arc::new(DirStore::new(dir));
    tracing::info!(checkpoint = %store.location(), epoch = store.epoch().unwrap_or_default().get(), query_id = store.query_id(), "checkpoint opened");
    let guard = DiscardIfNew(Some(store.as_ref()));

    // Every partition the checkpoint knows is ours from here on; the
    // planner claims those that appear later.
    for tp in store.known_partitions() {
        let claimed = store.claim(&tp, "")?;
        holdings.hold(tp, claimed);
    }

    let checkpoint_dir =
        std::path::absolute(&cfg.checkpoint).unwrap_or_else(|_| cfg.checkpoint.clone());
    let driver = SinkDriver::new(grants.first().cloned())
        .map_err(sink_db_error(cfg.sink_db.as_deref().unwrap_or_default()))?
        .with_connections(grants.iter().skip(1).cloned().collect())
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
    // A batch whose outputs went to a topic and is run again without it
    // (or with another) would be recorded as done without its outputs
    // there.
    if let Some(entry) = &pending_rerun
        && let Some(planned) = &entry.output
    {
        let ours = cfg.output.as_ref().map(|o| o.identity(&cfg.brokers));
        if !cfg
            .output
            .as_ref()
            .is_some_and(|o| o.covers(planned, &cfg.brokers))
        {
            return Err(EngineError::Config(format!(
                "batch {} produced its outputs to {planned} and is to be run again, but this run's outputs go to {}: they could be missing there. Start with --output-topic naming at least those topics (more is fine), the same --output-brokers and --output-guarantee; let the batch commit, then change them",
                entry.batch_id,
                ours.as_deref().unwrap_or("nowhere (no --output-topic)")
            )));
        }
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
    let stages = assemble(cfg, &loaded, &recorded, &grants)?;
    // A pipeline of its own on the same sink and topics (another
    // checkpoint directory, or a group) would apply every record again:
    // its progress rows are its own. (A group member checks before it
    // creates the group.)
    if !cfg.allow_shared_sink {
        refuse_shared_sink(cfg, &driver, store.query_id())?;
    }
    refuse_discarding_outputs(cfg, !stages.sinks.is_empty())?;
    guard.disarm();
    Ok(Opened {
        cp: store,
        stages,
        driver: Arc::new(driver),
        scope: TransactionScope::Batch,
        start: Box::new(SoleStart { takeover }),
    })
}

/// Refuse to start a pipeline of checkpoint directory `cfg.checkpoint`
/// whose last batch produced its outputs to a topic when this run has no
/// `--output-topic` and (`has_sink`) no sink stage: from here on its
/// outputs would be counted and discarded, a forgotten flag rather than a
/// choice.
///
/// # Errors
/// [`EngineError::Config`] naming where the outputs went.
fn refuse_discarding_outputs(cfg: &PipelineConfig, has_sink: bool) -> Result<(), EngineError> {
    if cfg.output.is_some() || has_sink {
        return Ok(());
    }
    let last = checkpoint::status(&cfg.checkpoint)
        .ok()
        .and_then(|s| s.last_planned)
        .and_then(|e| e.output.map(|o| (e.batch_id, o)));
    match last {
        Some((batch, to)) => Err(EngineError::Config(format!(
            "batch {batch} of this pipeline produced its outputs to {to}, but this run has no --output-topic and no sink stage: its outputs would be counted and discarded. Start it with the same --output-topic (and --output-brokers, --output-guarantee); to skip records on purpose, use `host checkpoint reset`"
        ))),
        None => Ok(()),
    }
}

/// The sole owner's opener (see [`Open`]).
pub(in crate::engine) struct OpenDir;

impl Open for OpenDir {
    /// A directory's batch commits its Kafka transaction after its parts'
    /// progress rows: exactly once to a topic cannot cover a sink database
    /// too (a group's claims recover it, see `member`).
    fn refuse_unfit(&self, cfg: &PipelineConfig) -> Result<(), EngineError> {
        if let Some(o) = cfg
            .output
            .as_ref()
            .filter(|o| o.guarantee == OutputGuarantee::ExactlyOnce)
            && cfg.sink_db.is_some()
        {
            return Err(EngineError::Config(format!(
                "--output-topic {} with --sink-db: exactly once cannot cover both yet (a part's progress row and dead letters would commit in the database before the batch's Kafka transaction, so a crash between the two would lose that part's outputs). Drop --sink-db (and --on-error dlq), or pass --output-guarantee at-least-once (outputs acknowledged before each progress row)",
                o.topics.join(", ")
            )));
        }
        Ok(())
    }

    fn open(
        self: Box<Self>,
        cfg: &PipelineConfig,
        runtime: &Arc<Runtime>,
        acquire: Acquire,
        holdings: &Arc<Holdings>,
    ) -> Result<Opened, EngineError> {
        open(cfg, runtime, acquire, holdings)
    }
}
