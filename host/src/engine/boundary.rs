//! The batch boundary (after a commit, before the next plan): the one
//! moment the engine acts on control requests and on a group's swaps. A
//! swap replaces a stage's template, so the next batch runs the new
//! plugin and records its digest in its write-ahead entry; a handover
//! offers the checkpoint and, once the requester confirms, gives it up.

use crate::control::handover;
use crate::control::{Handover, HandoverNote, Request, SwapRequest};
use crate::util::now_ms;

use super::PipelineConfig;
use super::stages::{install_swap, show_refs};
use super::startup::Pipeline;

/// Act on the queued control requests. Returns a confirmed handover: the
/// control socket is unlinked and the note written, the caller must now
/// release the checkpoint ([`Pipeline::hand_over`](super::startup::Pipeline::hand_over)).
pub(super) fn serve_requests(p: &mut Pipeline, cfg: &PipelineConfig) -> Option<Handover> {
    for req in crate::control::pending(&p.requests) {
        match req {
            Request::Swap(swap) => swap_in(p, *swap),
            Request::Handover(h) => {
                let note = HandoverNote {
                    epoch: p.cp.epoch().unwrap_or_default(),
                    last_batch: p.cp.last_committed(),
                    last_commit_ms: p.last_commit_ms,
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
                    handover::note_path(&cfg.checkpoint),
                    serde_json::to_vec_pretty(&note).unwrap_or_default(),
                );
                // Unlink our socket before the new owner binds its own.
                if let Some(c) = p.control.as_mut() {
                    c.unlink();
                }
                return Some(h);
            }
        }
    }
    None
}

/// Install a swapped-in plugin and answer the requester with the batch it
/// takes effect from.
fn swap_in(p: &mut Pipeline, swap: SwapRequest) {
    let result = install_swap(
        &mut p.stages,
        p.cp.as_ref(),
        &p.grants,
        swap.plugin,
        &swap.bytes,
        swap.stage,
        swap.index,
    )
    .map(|()| p.cp.next_batch_id());
    if let Ok(batch) = &result {
        tracing::info!(
            batch,
            "plugin swap installed: [{}] from batch {batch}",
            show_refs(&p.stages.refs)
        );
        if let Ok(mut s) = p.status.lock() {
            s.plugins = p.stages.refs.clone();
            s.swaps += 1;
        }
        p.metrics.swap();
    }
    let _ = swap.reply.send(result);
}

/// A group member's boundary: take the assignment changes since the last
/// one (the planner forgets what was revoked), start the next batch's
/// revocations afresh, and install a group swap that compiled.
///
/// # Errors
/// [`super::EngineError::Claim`] for a claim that failed in the rebalance
/// callback.
pub(super) fn serve_group(
    p: &mut Pipeline,
    cfg: &PipelineConfig,
) -> Result<(), super::EngineError> {
    let Some(g) = p.group.as_mut() else {
        return Ok(());
    };
    // Revokes answered between batches are out of the holdings already;
    // the ones during the last batch were acted on.
    p.source.serve(std::time::Duration::from_millis(10));
    let changes = g.member.sync(&mut p.source, &p.metrics)?;
    for tp in &changes.revoked {
        p.planner.forget(tp);
    }
    g.member.revocations.take();
    let next = p.cp.next_batch_id();
    if g.swaps.at_boundary(cfg, &mut p.stages, &p.grants, next) {
        p.metrics.swap();
    }
    Ok(())
}
