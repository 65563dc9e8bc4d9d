//! Opening the pipeline's store: a checkpoint directory ([`open_dir`]:
//! after a handover with `--takeover`, with the plugins it records or the
//! `--plugin` files), the pieces a group's store shares with it
//! ([`Opened`], [`connect_sink`]); `member::join` opens a group's.

use std::sync::Arc;
use std::time::Duration;

use crate::capability::sql::{self, SqlGrant};
use crate::checkpoint::{
    self, Checkpoint, DirCheckpoint, DirStore, OpenOptions, PluginRef, Recovery,
};
use crate::control::handover::{self, Takeover};
use crate::plugin::{Plugin, Runtime};
use crate::sink::SinkDriver;
use crate::source::KafkaSource;

use super::member::Member;
use super::plan::Holdings;
use super::stages::{Stages, assemble, load_plugins};
use super::{EngineError, PipelineConfig, shell_word};

/// How `run` acquires the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Acquire {
    /// Fail at once (or queue with `--wait`) if another process owns it.
    #[default]
    Normal,
    /// Ask the owner to hand over, waiting at most this long for it.
    Takeover(Duration),
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

/// Until disarmed, removes a checkpoint this run created and planned
/// nothing in when dropped ([`Checkpoint::discard_if_unused`]): so every
/// `?` between opening a new checkpoint and running its first batch
/// leaves no directory behind.
pub(super) struct DiscardIfNew<'a>(pub(super) Option<&'a dyn Checkpoint>);

impl DiscardIfNew<'_> {
    /// The start went through: keep the checkpoint.
    pub(super) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for DiscardIfNew<'_> {
    fn drop(&mut self) {
        if let Some(cp) = self.0.take() {
            cp.discard_if_unused();
        }
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

/// Connect the sink database of `cfg` (if any) as the SQL capability,
/// with the statement limit, host schema and plugin role set: one
/// session per `--sink-connections` (none without a sink database).
///
/// # Errors
/// [`EngineError::SinkDb`].
pub(super) fn connect_sink(cfg: &PipelineConfig) -> Result<Vec<SqlGrant>, EngineError> {
    let Some(url) = cfg.sink_db.as_deref() else {
        return Ok(Vec::new());
    };
    let n = cfg.sink_connections.max(1);
    if n > 1 && !sql::is_postgres_url(url) {
        return Err(EngineError::Config(format!(
            "--sink-connections {n} is for a PostgreSQL --sink-db: SQLite lets one connection write at a time"
        )));
    }
    (0..n)
        .map(|i| {
            let g = SqlGrant::connect_with(url, cfg.sink_db_password_file.as_deref())
                .and_then(|g| {
                    g.limit_statements(cfg.limits.call_timeout)?;
                    g.set_host_schema(cfg.sink_schema.clone())?;
                    g.set_plugin_role(cfg.sink_plugin_role.clone())?;
                    Ok(g)
                })
                .map_err(|mut e| {
                    if n > 1 {
                        // Connections past the server's max_connections
                        // (53300) fail here, not the first.
                        e.message = format!(
                            "{} (connection {} of {n}, --sink-connections; each is a server backend, counted against max_connections)",
                            e.message,
                            i + 1
                        );
                    }
                    e
                })
                .map_err(sink_db_error(url))?;
            Ok(g)
        })
        .collect()
}

/// Open and claim the checkpoint directory of `cfg` (after a handover
/// with `--takeover`), and load the plugins: `--plugin`, or those it
/// records.
pub(super) fn open_dir(
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
            super::outputs::unfit_topics(o, sink).map_err(EngineError::Config)?;
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
    guard.disarm();
    Ok(Opened {
        cp: store,
        stages,
        driver: Arc::new(driver),
        takeover,
        group: None,
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
pub(super) fn refuse_discarding_outputs(
    cfg: &PipelineConfig,
    has_sink: bool,
) -> Result<(), EngineError> {
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

/// Refuse to start when the sink database holds another pipeline's
/// progress on our topics ([`SinkDriver::other_pipelines`]): two
/// checkpoints on one sink would both apply every record.
pub(super) fn refuse_shared_sink(
    cfg: &PipelineConfig,
    driver: &SinkDriver,
    query_id: &str,
) -> Result<(), EngineError> {
    let url = cfg.sink_db.as_deref().map(|u| {
        sql::sink_identity_in(u, cfg.sink_schema.as_deref()).unwrap_or_else(|_| sql::redact(u))
    });
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
    // The same pipeline in the other store (the owner each row records:
    // `…, checkpoint DIR` or `…, group NAME`): say how to move it here.
    let db = shell_word(
        cfg.sink_db
            .as_deref()
            .map(sql::redact)
            .as_deref()
            .unwrap_or("URL"),
    );
    let moving: Vec<String> = others
        .iter()
        .filter_map(|o| match &cfg.group {
            Some(group) => o.owner.rsplit_once(", checkpoint ").map(|(_, dir)| {
                format!(
                    "If that is this pipeline before it became a group, stop it and run `host group adopt --sink-db {db} --group {} --checkpoint {}` to make it group {group} exactly once. ",
                    shell_word(group),
                    shell_word(dir)
                )
            }),
            None => o.owner.rsplit_once(", group ").map(|(_, group)| {
                format!(
                    "If that is pipeline group {group} and this checkpoint is to run it, stop its members and run `host group disband --sink-db {db} --group {} --checkpoint {}` first. ",
                    shell_word(group),
                    shell_word(&cfg.checkpoint.display().to_string())
                )
            }),
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    Err(EngineError::SharedSink {
        moving: moving.concat(),
        url: url.unwrap_or_default(),
        others: described.join("; "),
        delete: ids
            .iter()
            .map(|q| driver.delete_rows_sql(q))
            .collect::<Vec<_>>()
            .join("; "),
    })
}
