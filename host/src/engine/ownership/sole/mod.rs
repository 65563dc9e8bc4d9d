//! The sole owner of a checkpoint directory (DESIGN.md, "Lock, epoch,
//! fencing" and "Handover and swap"): it holds every partition under the
//! directory's epoch, claiming each one the planner discovers. At the
//! batch boundary — the one moment it acts on control requests — a swap
//! replaces a stage's template (the next batch runs the new plugin and
//! records its digest in its write-ahead entry), and a handover offers the
//! checkpoint and, once the requester confirms, ends the run; but an
//! uncommitted batch of an earlier run is re-run first. Between batches
//! it sleeps, woken early by a request.

mod open;

pub(in crate::engine) use open::OpenDir;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::checkpoint::{Checkpoint, CheckpointError, Claimed, Fenced, OffsetsEntry};
use crate::control::handover::{self, Takeover};
use crate::control::{ControlServer, Handover, HandoverNote, Request, ServerContext, SwapRequest};
use crate::metrics::Metrics;
use crate::source::{KafkaSource, TopicPartition};
use crate::util::now_ms;

use super::gate::PartitionGate;
use super::{LoopState, Next, Ownership, StartOwner, Started, Starting};
use crate::engine::plan::Discovery;
use crate::engine::plan::Holdings;
use crate::engine::progress::Progress;
use crate::engine::stages::{install_swap, show_refs};
use crate::engine::{EngineError, PipelineConfig};

/// A checkpoint directory's owner (see the module doc).
pub(in crate::engine) struct SoleOwner {
    /// The control socket; dropped (and unlinked) before the checkpoint
    /// is released, so it is never the next owner's.
    control: Option<ControlServer>,
    requests: Receiver<Request>,
    /// Set by the control socket when a request is queued.
    wake: Arc<AtomicBool>,
    /// With `--takeover`: the old owner, to tell when we first wrote.
    takeover: Option<Takeover>,
    gate: PartitionGate,
}

/// How a directory's owner starts (see [`StartOwner`]).
pub(in crate::engine) struct SoleStart {
    /// With `--takeover`: the old owner.
    pub(in crate::engine) takeover: Option<Takeover>,
}

impl StartOwner for SoleStart {
    /// A reader of the partitions the planner assigns, its informational
    /// commits to `sluice-<pipeline id>` (or `--commit-offsets-to`), and
    /// the control socket in the directory (`host swap`, `host status`,
    /// `--takeover`).
    fn start(self: Box<Self>, s: Starting<'_>) -> Result<Started, EngineError> {
        let cfg = s.cfg;
        let consumer_group = cfg
            .commit_offsets_to
            .clone()
            .unwrap_or_else(|| format!("sluice-{}", s.cp.query_id()));
        let source = KafkaSource::new(
            &cfg.brokers,
            &cfg.kafka,
            &consumer_group,
            cfg.commit_offsets_to.is_some(),
            cfg.kafka_timeout,
        )?;
        let metrics = Metrics::new();
        if let Some(e) = s.cp.epoch() {
            metrics.set_epoch(e);
        }
        let (tx, requests) = std::sync::mpsc::channel();
        let wake = Arc::new(AtomicBool::new(false));
        let control = ControlServer::start(
            &cfg.checkpoint,
            ServerContext {
                runtime: s.runtime.clone(),
                config: Arc::new(cfg.plugin_config.clone()),
                status: s.status.clone(),
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
        Ok(Started {
            owner: Box::new(SoleOwner {
                control: Some(control),
                requests,
                wake,
                takeover: self.takeover,
                gate: PartitionGate::sole(),
            }),
            source,
            metrics,
        })
    }
}

impl Discovery for SoleOwner {
    fn claim_discovered(
        &self,
        cp: &dyn Checkpoint,
        tp: &TopicPartition,
    ) -> Option<Result<Claimed, CheckpointError>> {
        Some(cp.claim(tp, ""))
    }

    fn plans_topic(&self, _holds_any: bool) -> bool {
        true
    }

    fn new_to_pipeline(&self, topic_known: bool) -> bool {
        !topic_known
    }
}

impl Ownership for SoleOwner {
    fn fenced(&self, _f: &Fenced) -> bool {
        // A directory fences the whole checkpoint (CheckpointError::Fenced
        // ends the run), never one partition.
        false
    }

    fn at_boundary(&mut self, at: &mut LoopState<'_>, stop: bool) -> Result<Next, EngineError> {
        self.wake.store(false, Ordering::Relaxed);
        // An uncommitted batch of an earlier run is finished first.
        if at.holdings.any_rerun() {
            return Ok(Next::Plan);
        }
        if let Some(h) = self.serve_requests(at) {
            return Ok(Next::HandOver(h));
        }
        if stop {
            tracing::info!("stop requested: the last batch is committed, exiting");
            return Ok(Next::Stop);
        }
        Ok(Next::Plan)
    }

    fn nothing_to_read(
        &mut self,
        source: &mut KafkaSource,
        _cfg: &PipelineConfig,
    ) -> Result<(), EngineError> {
        // Stop fetching until the next batch (see KafkaSource::pause).
        source.pause();
        Ok(())
    }

    fn settled(&self, _source: &KafkaSource, _cfg: &PipelineConfig) -> Result<bool, EngineError> {
        Ok(true)
    }

    fn idle(&mut self, _source: &mut KafkaSource, stop: &AtomicBool, d: Duration) {
        let until = Instant::now() + d;
        while !stop.load(Ordering::Relaxed) && !self.wake.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= until {
                return;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(50)));
        }
    }

    fn gate(&self) -> &PartitionGate {
        &self.gate
    }

    fn knows_holdings(&self, _source: &KafkaSource) -> bool {
        true
    }

    fn took_over(&mut self, cp: &dyn Checkpoint) -> Option<i64> {
        self.takeover
            .take()
            .map(|t| t.report(cp.epoch().unwrap_or_default()))
    }

    fn batch_failed(
        &self,
        _at: &mut LoopState<'_>,
        _entry: &OffsetsEntry,
        e: EngineError,
    ) -> Result<(), EngineError> {
        Err(e)
    }

    fn label(&self, event: Progress) -> Progress {
        event
    }

    fn leave(
        self: Box<Self>,
        _ok: bool,
        handover: Option<Handover>,
        cp: Arc<dyn Checkpoint>,
        _source: &mut KafkaSource,
        _holdings: &Holdings,
    ) {
        let Some(h) = handover else {
            // The control socket goes while the lock is still held, so it
            // is never the next owner's.
            drop(self);
            drop(cp);
            return;
        };
        // Give the checkpoint up to the process that asked for it: release
        // the claim, then wait (bounded) for the new owner's report so the
        // gap gets logged, then stop serving the control socket.
        let epoch = cp.epoch().unwrap_or_default();
        let last_batch = cp.last_committed();
        // The only holder of the store: dropping it releases the lock.
        drop(cp);
        tracing::info!(epoch = epoch.get(), last_batch = ?last_batch, "handed over: lock released");
        handover::finish(h);
        drop(self);
    }
}

impl SoleOwner {
    /// Act on the queued control requests. Returns a confirmed handover:
    /// the control socket is unlinked and the note written, the run must
    /// now release the checkpoint.
    fn serve_requests(&mut self, at: &mut LoopState<'_>) -> Option<Handover> {
        for req in crate::control::pending(&self.requests) {
            match req {
                Request::Swap(swap) => swap_in(at, *swap),
                Request::Handover(h) => {
                    let note = HandoverNote {
                        epoch: at.cp.epoch().unwrap_or_default(),
                        last_batch: at.cp.last_committed(),
                        last_commit_ms: at.last_commit_ms,
                        released_at_ms: now_ms(),
                        pid: std::process::id(),
                    };
                    if !handover::offer(&h, note.clone()) {
                        tracing::warn!(
                            "the takeover requester went away before confirming; still the owner"
                        );
                        continue;
                    }
                    let _ = std::fs::write(
                        handover::note_path(&at.cfg.checkpoint),
                        serde_json::to_vec_pretty(&note).unwrap_or_default(),
                    );
                    // Unlink our socket before the new owner binds its own.
                    if let Some(c) = self.control.as_mut() {
                        c.unlink();
                    }
                    return Some(h);
                }
            }
        }
        None
    }
}

/// Install a swapped-in plugin and answer the requester with the batch it
/// takes effect from.
fn swap_in(at: &mut LoopState<'_>, swap: SwapRequest) {
    let result = install_swap(
        at.stages,
        at.cp.as_ref(),
        at.grants,
        swap.plugin,
        &swap.bytes,
        swap.stage,
        swap.index,
    )
    .map(|()| at.cp.next_batch_id());
    if let Ok(batch) = &result {
        tracing::info!(
            batch,
            "plugin swap installed: [{}] from batch {batch}",
            show_refs(&at.stages.refs)
        );
        if let Ok(mut s) = at.status.lock() {
            s.plugins = at.stages.refs.clone();
            s.swaps += 1;
        }
        at.metrics.swap();
    }
    let _ = swap.reply.send(result);
}
