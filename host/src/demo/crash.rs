//! The demo's crash: `host run` as a child process on the demo's broker
//! and checkpoint, killed with SIGKILL while a batch is in flight — after
//! its write-ahead entry, before its commit entry — exactly as `kill -9`
//! or a lost machine would end it.
//!
//! The child is watched as a user could watch it: through the checkpoint
//! (read-only, as `host checkpoint show` does) and the sink's progress
//! rows (`sluice_progress`). When a batch is planned and not committed,
//! and at least one of its parts has committed (a progress row ends inside
//! the batch's ranges), the child is frozen with SIGSTOP, the checkpoint
//! read again (the commit may have landed in between; then it runs on to
//! the next batch), and then killed. So the restart has something to show:
//! the parts that committed before the kill are not applied again, the
//! rest of the batch is applied once.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::capability::sql::{SqlValue, connect};
use crate::checkpoint::{OffsetsEntry, status};
use crate::engine::PipelineConfig;

/// Records per partition in a batch of the killed run and the restart:
/// sunk in parts of 2,000 and 500, so several batches each have a moment
/// when one part has committed and the batch has not.
pub(super) const BACKLOG_BATCH: u64 = 2_500;

/// How long the child may take to reach a batch in flight.
const WAIT: Duration = Duration::from_secs(120);

/// A batch killed mid-way.
pub(super) struct Killed {
    /// Its write-ahead entry.
    pub entry: OffsetsEntry,
    /// Records its ranges hold.
    pub planned: u64,
    /// Of those, records its committed parts applied.
    pub applied: u64,
    /// Batches the child committed before the one killed.
    pub committed_before: u64,
}

/// The newest planned entry and the newest committed batch id.
fn newest(dir: &Path) -> Option<(Option<OffsetsEntry>, u64)> {
    let s = status(dir).ok()?;
    Some((s.last_planned, s.last_committed.map_or(0, |c| c.batch_id)))
}

/// A batch planned and not committed.
fn in_flight(dir: &Path) -> Option<(OffsetsEntry, u64)> {
    match newest(dir)? {
        (Some(p), committed) if p.batch_id > committed => Some((p, committed)),
        _ => None,
    }
}

fn signal(child: &Child, sig: Signal) -> Result<(), String> {
    let pid = i32::try_from(child.id())
        .ok()
        .and_then(Pid::from_raw)
        .ok_or("child pid out of range")?;
    kill_process(pid, sig).map_err(|e| format!("signal {sig:?} to the child: {e}"))
}

/// Run `host run` (the recorded plugin, until caught up) on `cfg`'s
/// broker, checkpoint and sink, and kill it mid-batch, after a part of
/// the batch committed. `Ok(None)` when it finished before a batch could
/// be caught so.
///
/// # Errors
/// The child could not start, failed, or took longer than two minutes.
pub(super) fn kill_mid_batch(cfg: &PipelineConfig, dir: &Path) -> Result<Option<Killed>, String> {
    let ckpt = &cfg.checkpoint;
    let base = newest(ckpt).map_or(0, |(_, c)| c);
    let exe = std::env::current_exe().map_err(|e| format!("the host binary: {e}"))?;
    let log = std::fs::File::create(dir.join("killed-run.log"))
        .map_err(|e| format!("{}: {e}", dir.join("killed-run.log").display()))?;
    let mut child = Command::new(exe)
        .arg("run")
        .args(["--brokers", &cfg.brokers, "--topic", "maxwell"])
        .arg("--checkpoint")
        .arg(ckpt)
        .args(["--sink-db", cfg.sink_db.as_deref().unwrap_or_default()])
        .args([
            "--on-error",
            "dlq",
            "--until-caught-up",
            "--progress",
            "none",
        ])
        .args(["--max-records-per-partition", &BACKLOG_BATCH.to_string()])
        .env("RUST_LOG", "warn")
        .env_remove("SLUICE_FAILPOINT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting `host run`: {e}"))?;
    let started = Instant::now();
    loop {
        if let Some(code) = child.try_wait().map_err(|e| e.to_string())? {
            return if code.success() {
                Ok(None)
            } else {
                Err(format!(
                    "`host run` exited with {code} before it could be killed (its log: {})",
                    dir.join("killed-run.log").display()
                ))
            };
        }
        if started.elapsed() > WAIT {
            let _ = child.kill();
            return Err("`host run` planned no batch within two minutes".into());
        }
        // A batch in flight with a part committed (its progress rows end
        // inside the batch's ranges).
        let caught =
            || in_flight(ckpt).filter(|(entry, _)| applied_of(cfg, entry).is_ok_and(|n| n > 0));
        let Some((seen, _)) = caught() else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        signal(&child, Signal::STOP)?;
        let Some((entry, committed)) = caught().filter(|(e, _)| e.batch_id == seen.batch_id) else {
            // That batch committed between the look and the stop (and the
            // next may have no part committed yet): look again.
            signal(&child, Signal::CONT)?;
            continue;
        };
        signal(&child, Signal::KILL)?;
        let _ = child.wait();
        let planned = entry
            .ranges
            .iter()
            .map(|r| u64::try_from(r.end - r.start).unwrap_or(0))
            .sum();
        let applied = applied_of(cfg, &entry)?;
        return Ok(Some(Killed {
            entry,
            planned,
            applied,
            committed_before: committed.saturating_sub(base),
        }));
    }
}

/// Records of `entry`'s ranges below each partition's progress row.
fn applied_of(cfg: &PipelineConfig, entry: &OffsetsEntry) -> Result<u64, String> {
    let url = cfg.sink_db.as_deref().unwrap_or_default();
    let rows = connect(url)
        .and_then(|mut b| {
            b.query(
                "SELECT \"partition\", end_offset FROM sluice_progress WHERE topic = 'maxwell'",
                &[],
            )
        })
        .map_err(|e| format!("reading sluice_progress: {e}"))?;
    let mut applied = 0;
    for row in rows.rows {
        let (Some(SqlValue::Integer(p)), Some(SqlValue::Integer(end))) = (row.first(), row.get(1))
        else {
            continue;
        };
        for r in entry.ranges.iter().filter(|r| i64::from(r.partition) == *p) {
            applied += u64::try_from((end.min(&r.end) - r.start).max(0)).unwrap_or(0);
        }
    }
    Ok(applied)
}

/// The batch `killed` is committed now, and its write-ahead entry (the
/// one a re-run reads its ranges from) still holds the ranges the killed
/// run had planned.
///
/// # Errors
/// A checkpoint file that cannot be read or decoded.
pub(super) fn committed_with(ckpt: &Path, killed: &Killed) -> Result<bool, String> {
    let id = killed.entry.batch_id.to_string();
    let read = |sub: &str| {
        let path = ckpt.join(sub).join(&id);
        std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let planned: OffsetsEntry = crate::checkpoint::decode("offsets", &read("offsets")?)
        .map_err(|e| format!("offsets/{id}: {e}"))?;
    let committed = ckpt.join("commits").join(&id).exists();
    Ok(committed && planned.ranges == killed.entry.ranges)
}
