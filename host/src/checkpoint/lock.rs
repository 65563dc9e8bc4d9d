//! The checkpoint lock and the fencing epoch.
//!
//! `lock` is `flock`ed (exclusive, via `std::fs::File::try_lock`) by the
//! owner for its whole life; the OS releases it when the process dies, so a
//! crashed owner never leaves a stale lock. Each acquisition issues epoch
//! E+1 (stored in `epoch`) and writes the owner's pid, hostname, epoch and
//! start time into `lock` for the error message of the next comer.
//!
//! flock is node-local: two hosts mounting the same checkpoint over NFS are
//! not excluded by it. The epoch re-check before every commit still stops a
//! process whose epoch was superseded.

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::entry::{self, EnvelopeError};
use super::{Epoch, fsio};
use crate::util::rfc3339_ms;

/// Who holds a checkpoint (contents of `lock`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerInfo {
    /// Process id.
    pub pid: u32,
    /// Host name.
    pub hostname: String,
    /// The owner's fencing epoch.
    pub epoch: Epoch,
    /// Acquisition time, milliseconds since the Unix epoch.
    pub since_ms: i64,
}

impl OwnerInfo {
    /// `pid P on HOST since TIME (epoch E)`, for messages.
    pub fn describe(&self) -> String {
        format!(
            "pid {} on {} since {} (epoch {})",
            self.pid,
            self.hostname,
            self.since(),
            self.epoch
        )
    }

    /// `since` as RFC 3339 (UTC).
    pub fn since(&self) -> String {
        rfc3339_ms(self.since_ms)
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct EpochFile {
    epoch: Epoch,
}

/// Outcome of trying to lock.
pub(crate) enum LockAttempt {
    /// We hold the lock (the file handle keeps it).
    Held(File),
    /// Someone else holds it; what they wrote about themselves, if readable.
    Owned(Option<OwnerInfo>),
    /// The lock was taken on a file that is no longer `dir/lock`: its
    /// owner removed the checkpoint it had created (a refused start,
    /// `DirCheckpoint::discard_if_unused`) while we waited. Open it again.
    Vanished,
}

/// Read the owner info written in `lock` (best effort).
pub(crate) fn read_owner(dir: &Path) -> Option<OwnerInfo> {
    let bytes = super::trust::read(&dir.join("lock")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Try to take the lock; with `wait`, retry until it is free or the time
/// is up.
pub(crate) fn acquire(dir: &Path, wait: Option<Duration>) -> std::io::Result<LockAttempt> {
    let file = match super::trust::open_own_file(&dir.join("lock")) {
        Ok(f) => f,
        // The directory went between its creation and here: a previous
        // owner removed the checkpoint it had just created.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LockAttempt::Vanished),
        Err(e) => return Err(e),
    };
    // Without --wait, still retry for a moment: a `host status` probe holds
    // a shared lock for an instant and must not make a start fail.
    let deadline = Some(Instant::now() + wait.unwrap_or(Duration::from_millis(200)));
    loop {
        match file.try_lock() {
            Ok(()) => {
                // The usual check of a lock file that may be unlinked: the
                // file locked must still be the one at the path.
                use std::os::unix::fs::MetadataExt;
                let ours = file.metadata()?;
                return match std::fs::symlink_metadata(dir.join("lock")) {
                    Ok(m) if m.dev() == ours.dev() && m.ino() == ours.ino() => {
                        Ok(LockAttempt::Held(file))
                    }
                    Ok(_) => Ok(LockAttempt::Vanished),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LockAttempt::Vanished),
                    Err(e) => Err(e),
                };
            }
            Err(TryLockError::WouldBlock) => match deadline {
                Some(d) if Instant::now() < d => std::thread::sleep(Duration::from_millis(20)),
                _ => return Ok(LockAttempt::Owned(read_owner(dir))),
            },
            Err(TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// True when some process holds the lock right now. Probes with a shared
/// lock, released at once; never creates the file.
pub(crate) fn is_owned(dir: &Path) -> std::io::Result<bool> {
    let file = match super::trust::open_regular(&dir.join("lock")) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    match file.try_lock_shared() {
        Ok(()) => Ok(false),
        Err(TryLockError::WouldBlock) => Ok(true),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// Write our owner info into the held lock file.
pub(crate) fn write_owner(file: &mut File, owner: &OwnerInfo) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(owner).map_err(std::io::Error::other)?;
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(&bytes)?;
    file.sync_all()
}

/// The last issued epoch (0 when none was ever issued).
pub(crate) fn read_epoch(dir: &Path) -> Result<Epoch, EnvelopeError> {
    let mut bytes = Vec::new();
    match super::trust::open_regular(&dir.join("epoch")) {
        Ok(mut f) => f
            .read_to_end(&mut bytes)
            .map_err(|e| EnvelopeError::Torn(e.to_string()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Epoch::default()),
        Err(e) => return Err(EnvelopeError::Torn(e.to_string())),
    };
    entry::decode::<EpochFile>("epoch", &bytes).map(|e| e.epoch)
}

/// Store `epoch` as the last issued one.
pub(crate) fn write_epoch(dir: &Path, epoch: Epoch) -> std::io::Result<()> {
    let bytes = entry::encode("epoch", &EpochFile { epoch }).map_err(std::io::Error::other)?;
    fsio::write_replace(dir, "epoch", &bytes, "epoch")
}
