//! Handover of a checkpoint from its running owner to a `host run
//! --takeover` process, all three sides of it:
//!
//! 1. the requester ([`request`]) connects, sends `handover`, and waits;
//! 2. the owner's socket thread (`serve`) queues a [`Handover`] for the
//!    engine, which at its next batch boundary (after a commit, before the
//!    next plan) answers with a [`HandoverNote`] while still holding the
//!    lock ([`offer`]);
//! 3. the requester confirms with `go`; only then does the owner release
//!    the lock and exit. Anything else (the requester went away, no `go`
//!    within 10 s) leaves the owner running as before.
//!
//! After taking the lock, the new owner reports its first write-ahead
//! ([`Takeover::report`]) and both sides log the gap: the old owner's last
//! commit to the new owner's first write-ahead, the time no batch was in
//! progress.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::channel;
use std::time::Duration;

use super::protocol::{Answer, Command, HandoverOffer, answer, refusal};
use super::{Client, ClientError, Handover, HandoverNote, Request, ServerContext};
use crate::checkpoint::Epoch;
use crate::util::now_ms;

/// How long the owner waits for `go` after its offer.
const GO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the old owner waits for the new owner's report.
const REPORT_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a takeover gave up; the checkpoint was not touched.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TakeoverError(String);

/// The socket side of a handover conversation, after the `handover` line.
pub(super) fn serve(
    reader: &mut BufReader<UnixStream>,
    writer: &mut UnixStream,
    ctx: &ServerContext,
) -> std::io::Result<()> {
    let (note_tx, note_rx) = channel();
    let (go_tx, go_rx) = channel();
    // Dropped at the end of this conversation, which wakes the engine.
    let (_finished_tx, finished_rx) = channel::<()>();
    let queued = ctx.requests.send(Request::Handover(Handover {
        note: note_tx,
        go: go_rx,
        finished: finished_rx,
    }));
    if queued.is_err() {
        return answer(writer, &refusal("the engine is stopping"));
    }
    ctx.wake.store(true, Ordering::Relaxed);
    let Ok(note) = note_rx.recv() else {
        return answer(writer, &refusal("the engine stopped before handing over"));
    };
    // Phase 1: offer. Phase 2: release only if the requester is still there
    // and confirms.
    let offer = HandoverOffer {
        phase: "ready".into(),
        note: note.clone(),
    };
    let mut line = String::new();
    let mut go = answer(writer, &Answer::ok(offer)).is_ok();
    if go {
        reader.get_ref().set_read_timeout(Some(GO_TIMEOUT))?;
        go = reader.read_line(&mut line).is_ok()
            && serde_json::from_str::<Command>(&line).is_ok_and(|c| c == Command::Go);
    }
    let _ = go_tx.send(go);
    if !go {
        return Ok(());
    }
    reader.get_ref().set_read_timeout(Some(REPORT_TIMEOUT))?;
    line.clear();
    if reader.read_line(&mut line).is_ok()
        && let Ok(Command::TookOver {
            first_write_ahead_ms,
            epoch,
        }) = serde_json::from_str(&line)
    {
        let from = note.last_commit_ms.unwrap_or(note.released_at_ms);
        tracing::info!(
            new_epoch = epoch.get(),
            "handover complete: gap from our last commit to the new owner's first write-ahead: {} ms",
            first_write_ahead_ms - from
        );
    }
    Ok(())
}

/// The engine's side, at a batch boundary: send `note` and wait for the
/// requester's confirmation. True: release the lock now and stop; the
/// conversation's end can be awaited with [`finish`]. False: the requester
/// went away; stay the owner.
pub fn offer(h: &Handover, note: HandoverNote) -> bool {
    if h.note.send(note).is_err() {
        return false;
    }
    h.go.recv_timeout(GO_TIMEOUT + Duration::from_secs(5)) == Ok(true)
}

/// After releasing: wait (bounded) for the new owner's report, so the gap
/// gets logged before this process exits.
pub fn finish(h: Handover) {
    let _ = h
        .finished
        .recv_timeout(REPORT_TIMEOUT + Duration::from_secs(10));
}

/// The requester's side of an accepted handover: the owner has released
/// the lock.
pub struct Takeover {
    client: Client,
    note: HandoverNote,
}

/// Ask the owner of checkpoint `dir` to hand over, waiting at most
/// `timeout` for its batch boundary. `Ok(None)`: nobody owns it, start
/// normally.
///
/// # Errors
/// [`TakeoverError`] when the owner holds the lock but does not answer,
/// refuses, or the conversation breaks; the owner keeps running and the
/// checkpoint is untouched.
pub fn request(dir: &Path, timeout: Duration) -> Result<Option<Takeover>, TakeoverError> {
    let mut client = match Client::connect(dir, timeout) {
        Ok(c) => c,
        Err(ClientError::NotRunning { .. }) => {
            if crate::checkpoint::status(dir).is_ok_and(|s| s.owner.is_some()) {
                return Err(TakeoverError(format!(
                    "checkpoint {} is owned but its owner does not answer on control.sock; not touching it",
                    dir.display()
                )));
            }
            tracing::info!("--takeover: no running owner, starting normally");
            return Ok(None);
        }
        Err(e) => return Err(TakeoverError(e.to_string())),
    };
    tracing::info!("--takeover: asking the owner to hand over at its next batch boundary");
    let offer: HandoverOffer = client.request(&Command::Handover).map_err(|e| {
        TakeoverError(format!(
            "{e}; the checkpoint was not touched and the owner keeps running"
        ))
    })?;
    // Confirm: the owner releases the lock only now.
    client
        .send(&Command::Go)
        .map_err(|e| TakeoverError(format!("{e}; the owner keeps running")))?;
    Ok(Some(Takeover {
        client,
        note: offer.note,
    }))
}

impl Takeover {
    /// Where the old owner stopped.
    pub fn note(&self) -> &HandoverNote {
        &self.note
    }

    /// Tell the old owner our first write-ahead happens now (planning just
    /// finished), log the gap from its last commit and return it, ms.
    pub fn report(mut self, epoch: Epoch) -> i64 {
        let first = now_ms();
        let from = self.note.last_commit_ms.unwrap_or(self.note.released_at_ms);
        tracing::info!(
            old_epoch = self.note.epoch.get(),
            "took over: gap from the old owner's last commit to our first write-ahead: {} ms",
            first - from
        );
        let _ = self.client.send(&Command::TookOver {
            first_write_ahead_ms: first,
            epoch,
        });
        first - from
    }
}

/// Where the old owner writes its note after releasing (`handover` in the
/// checkpoint directory), for `host status` and people reading the
/// directory.
pub fn note_path(dir: &Path) -> PathBuf {
    dir.join("handover")
}
