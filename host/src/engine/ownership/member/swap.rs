//! A group member's side of `host group swap` (DESIGN.md, "Scale beyond
//! one machine: pipeline groups"): at each batch boundary the member asks
//! the group's store for a newer swap; a new one is read and compiled on a
//! thread of its own, off the batch path, and installed at the first batch
//! boundary after it compiled. The next batch's write-ahead records the
//! new digests. A swap that cannot be loaded leaves the member on its old
//! plugins, and the member's row says why (`host group status`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::capability::sql::SqlGrant;
use crate::checkpoint::group::{GroupStore, Swap};
use crate::plugin::{Plugin, Runtime};

use crate::engine::PipelineConfig;
use crate::engine::stages::{Stages, assemble, show_refs};

/// How often the store is asked for a new swap.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How often the member's row says it is alive (from a thread of its
/// own, so a long batch does not make it look gone).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

/// Why a swap's components could not be compiled.
struct NotCompiled {
    /// The components could not be read (the database): try again later.
    retry: bool,
    why: String,
}

/// Compiled components of a swap, or why they could not be.
type Compiled = Result<Vec<(Plugin, Vec<u8>)>, NotCompiled>;

/// Watches the group's swaps for one member and reports what it runs.
pub(in crate::engine) struct GroupSwaps {
    store: Arc<GroupStore>,
    runtime: Arc<Runtime>,
    member: String,
    /// The last swap acted on (installed or refused).
    seen: u64,
    /// Why that swap was not installed.
    error: Option<String>,
    /// A swap being compiled.
    pending: Option<(Swap, Receiver<Compiled>)>,
    last_check: Instant,
    /// Stops the heartbeat thread.
    alive: Arc<AtomicBool>,
    /// What was last reported, for the heartbeat to write again.
    reported: Arc<Mutex<Reported>>,
}

/// A member's report: its plugins, the last swap acted on, why that swap
/// was not installed.
type Reported = (Vec<crate::checkpoint::PluginRef>, u64, Option<String>);

impl GroupSwaps {
    /// Start watching after the member joined with `stages`. `seen` is
    /// the last swap asked *before* the member read the group's plugins
    /// (so a swap asked while it started is still acted on); later ones
    /// are installed as they come.
    ///
    /// # Errors
    /// The group store's.
    pub(in crate::engine) fn start(
        store: Arc<GroupStore>,
        runtime: Arc<Runtime>,
        member: String,
        stages: &Stages,
        seen: u64,
        live: Arc<Mutex<crate::control::LiveStatus>>,
    ) -> Result<Self, crate::checkpoint::group::GroupError> {
        store.report(&member, &stages.refs, seen, None)?;
        let alive = Arc::new(AtomicBool::new(true));
        let reported = Arc::new(Mutex::new((stages.refs.clone(), seen, None)));
        let (beat, who, running, state) = (
            store.clone(),
            member.clone(),
            alive.clone(),
            reported.clone(),
        );
        std::thread::spawn(move || {
            let mut last = Instant::now();
            while running.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                if last.elapsed() >= HEARTBEAT_EVERY && running.load(Ordering::Relaxed) {
                    last = Instant::now();
                    // A row that is gone (deleted by hand) is written again.
                    // The member's own view (what `host status` shows of a
                    // single host), for `host status --group`.
                    let view = live
                        .lock()
                        .ok()
                        .and_then(|l| serde_json::to_string(&*l).ok())
                        .unwrap_or_else(|| "null".into());
                    let r = beat.touch(&who, &view).and_then(|found| {
                        if found {
                            return Ok(());
                        }
                        let (refs, seen, error): Reported =
                            state.lock().unwrap_or_else(|p| p.into_inner()).clone();
                        beat.report(&who, &refs, seen, error.as_deref())
                    });
                    if let Err(e) = r {
                        tracing::warn!("could not record that this member is alive: {e}");
                    }
                }
            }
        });
        Ok(GroupSwaps {
            store,
            runtime,
            member,
            seen,
            error: None,
            pending: None,
            last_check: Instant::now(),
            alive,
            reported,
        })
    }

    /// At a batch boundary: install a swap that compiled (the batch
    /// `next_batch` is the first to run it), start compiling a newer one,
    /// and record the member's row when any of that changed (the heartbeat
    /// thread keeps it fresh otherwise). Store errors are logged,
    /// not returned: the pipeline goes on with the plugins it has. True
    /// when a swap was installed.
    pub(in crate::engine) fn at_boundary(
        &mut self,
        cfg: &PipelineConfig,
        stages: &mut Stages,
        grants: &[SqlGrant],
        next_batch: u64,
    ) -> bool {
        let mut changed = false;
        let mut installed = false;
        if let Some((swap, rx)) = &self.pending {
            let compiled = match rx.try_recv() {
                Ok(c) => Some(c),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => Some(Err(NotCompiled {
                    retry: true,
                    why: "the thread compiling it stopped".to_string(),
                })),
            };
            match compiled {
                Some(Err(NotCompiled { retry: true, why })) => {
                    // Asked again at the next check.
                    tracing::warn!(
                        swap = swap.id,
                        "could not read group swap {}: {why}; trying again",
                        swap.id
                    );
                    self.pending = None;
                }
                Some(compiled) => {
                    let swap = swap.clone();
                    self.pending = None;
                    installed = self.install(cfg, stages, grants, &swap, compiled, next_batch);
                    changed = true;
                }
                None => {}
            }
        }
        if self.pending.is_none() && self.last_check.elapsed() >= CHECK_EVERY {
            self.last_check = Instant::now();
            match self.store.latest_swap() {
                Ok(Some(swap)) if swap.id > self.seen => {
                    if swap.plugins == stages.refs {
                        self.seen = swap.id;
                        self.error = None;
                        changed = true;
                    } else {
                        tracing::info!(
                            swap = swap.id,
                            "group swap {} asked by {}: compiling [{}]",
                            swap.id,
                            swap.requested_by,
                            show_refs(&swap.plugins)
                        );
                        let rx = self.compile(cfg, &swap);
                        self.pending = Some((swap, rx));
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("could not read the group's swaps: {e}"),
            }
        }
        if changed {
            *self.reported.lock().unwrap_or_else(|p| p.into_inner()) =
                (stages.refs.clone(), self.seen, self.error.clone());
            if let Err(e) =
                self.store
                    .report(&self.member, &stages.refs, self.seen, self.error.as_deref())
            {
                tracing::warn!("could not record this member's state in the group: {e}");
            }
        }
        installed
    }

    /// Read and compile `swap`'s components on a thread of their own.
    fn compile(&self, cfg: &PipelineConfig, swap: &Swap) -> Receiver<Compiled> {
        let (tx, rx) = mpsc::channel();
        let store = self.store.clone();
        let runtime = self.runtime.clone();
        let config = Arc::new(cfg.plugin_config.clone());
        // In the order the stages name them (the map chain's order).
        let mut digests: Vec<String> = Vec::new();
        for r in &swap.plugins {
            if !digests.contains(&r.digest) {
                digests.push(r.digest.clone());
            }
        }
        let group = cfg.group.clone().unwrap_or_default();
        std::thread::spawn(move || {
            let compiled = digests
                .iter()
                .map(|d| {
                    let bytes = store.load_plugin(d).map_err(|e| NotCompiled {
                        retry: matches!(e, crate::checkpoint::group::GroupError::Db { .. }),
                        why: e.to_string(),
                    })?;
                    let path = std::path::PathBuf::from(format!("group {group}: {d}"));
                    let plugin =
                        runtime
                            .load_bytes(&path, &bytes, config.clone())
                            .map_err(|e| NotCompiled {
                                retry: false,
                                why: e.to_string(),
                            })?;
                    Ok((plugin, bytes))
                })
                .collect();
            let _ = tx.send(compiled);
        });
        rx
    }

    fn install(
        &mut self,
        cfg: &PipelineConfig,
        stages: &mut Stages,
        grants: &[SqlGrant],
        swap: &Swap,
        compiled: Compiled,
        next_batch: u64,
    ) -> bool {
        self.seen = swap.id;
        let mut from_store = cfg.clone();
        from_store.plugins.clear();
        let assembled = compiled.map_err(|e| e.why).and_then(|loaded| {
            assemble(&from_store, &loaded, &swap.plugins, grants).map_err(|e| e.to_string())
        });
        match assembled {
            Ok(mut new) if new.refs == swap.plugins => {
                // The sink swapped in keeps the output topics, and must
                // be able to send to them.
                if let Some(k) = stages.kafka.clone()
                    && let Err(why) = new.grant_kafka(k)
                {
                    self.refuse(swap, why);
                    return false;
                }
                *stages = new;
                self.error = None;
                tracing::info!(
                    swap = swap.id,
                    batch = next_batch,
                    "group swap {} installed: [{}] from batch {next_batch}",
                    swap.id,
                    show_refs(&stages.refs)
                );
                return true;
            }
            Ok(new) => self.refuse(
                swap,
                format!(
                    "the components make [{}], not the stages asked for",
                    show_refs(&new.refs)
                ),
            ),
            Err(e) => self.refuse(swap, e),
        }
        false
    }

    fn refuse(&mut self, swap: &Swap, why: String) {
        tracing::error!(
            swap = swap.id,
            "group swap {} not installed, this member keeps its plugins: {why}",
            swap.id
        );
        self.error = Some(why);
    }

    /// The member leaves the group: its heartbeat stops, its row goes.
    pub(in crate::engine) fn leave(&self) {
        self.alive.store(false, Ordering::Relaxed);
        if let Err(e) = self.store.leave(&self.member) {
            tracing::warn!("could not remove this member's row from the group: {e}");
        }
    }
}
