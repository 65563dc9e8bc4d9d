//! The checkpoint as a directory (DESIGN.md, "Checkpoint directory"):
//! [`DirCheckpoint`] takes the directory's `flock`, issues the next epoch
//! and implements [`Checkpoint`] with crash-safe files; free functions read
//! a directory without locking it (for `--takeover` and `host status`).
//!
//! Slightly over 650 lines: the lock, the epoch and the log files of one
//! directory, whose invariants (a commit re-checks the epoch it wrote
//! under) read best together.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::entry::{self, CommitEntry, Counts, OffsetsEntry, PluginRef, Timings, TopicIdentity};
use super::recovery::{analyze, list_ids};
use super::{
    CheckpointError, Epoch, Fingerprint, Metadata, Moved, OpenOptions, OwnerInfo, Recovery,
    ResetRecord, fsio, io_err, lock, trust,
};
use crate::source::PartitionRange;
use crate::util::now_ms;

/// True when `dir` holds a checkpoint (its `metadata` file exists, even if
/// unreadable: opening it then reports why). False for a missing or empty
/// directory, which [`DirCheckpoint::open`] would create a checkpoint in.
pub fn exists(dir: &Path) -> bool {
    dir.join("metadata").exists()
}

/// Check, without opening or locking it, that a pipeline subscribed to
/// `topics` matches the fingerprint of the checkpoint at `dir` (a missing
/// checkpoint matches anything). `--takeover` checks this before asking
/// the owner to hand over.
///
/// # Errors
/// [`CheckpointError::FingerprintMismatch`] naming what differs (topics,
/// plugin contract); [`CheckpointError::Corrupt`] or
/// [`CheckpointError::Io`] when the metadata cannot be read.
pub fn check_fingerprint(dir: &Path, topics: &[String]) -> Result<(), CheckpointError> {
    match read_metadata(dir)? {
        Some(m) => match m.fingerprint.diff(&Fingerprint::new(topics)) {
            Some(diff) => Err(CheckpointError::FingerprintMismatch {
                dir: dir.to_path_buf(),
                diff,
            }),
            None => Ok(()),
        },
        None => Ok(()),
    }
}

pub(super) fn read_metadata(dir: &Path) -> Result<Option<Metadata>, CheckpointError> {
    let path = dir.join("metadata");
    match trust::read(&path) {
        Ok(bytes) => entry::decode::<Metadata>("metadata", &bytes)
            .map(Some)
            .map_err(|e| CheckpointError::Corrupt {
                file: path,
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path, "read metadata")(e)),
    }
}

fn write_metadata(dir: &Path, m: &Metadata) -> Result<(), CheckpointError> {
    let bytes = entry::encode("metadata", m)
        .map_err(|e| io_err(dir.join("metadata"), "encode metadata")(io::Error::other(e)))?;
    fsio::write_replace(dir, "metadata", &bytes, "metadata")
        .map_err(io_err(dir.join("metadata"), "write metadata"))
}

/// File name of the owner's control socket in a checkpoint directory
/// (served by `control`).
pub const CONTROL_SOCKET: &str = "control.sock";

/// An open, locked checkpoint. Dropping it releases the lock.
#[derive(Debug)]
pub struct DirCheckpoint {
    dir: PathBuf,
    _lock: File,
    epoch: Epoch,
    metadata: Metadata,
    retention: u64,
    /// Newest batch with an offsets entry.
    last_planned: Option<u64>,
    /// Newest batch with a commit entry.
    last_committed: Option<u64>,
    recovery: Recovery,
    /// Topic identities of the newest offsets entry.
    topics: BTreeMap<String, TopicIdentity>,
    /// Set when this open created the checkpoint (wrote its metadata).
    created: Option<Created>,
}

/// What [`DirCheckpoint::open`] created.
#[derive(Debug, Clone, Copy)]
struct Created {
    /// The directory did not exist before.
    dir: bool,
}

impl DirCheckpoint {
    /// Open (or create) the checkpoint at `dir`, take its lock, issue a
    /// new epoch and work out where processing continues.
    ///
    /// # Errors
    /// [`CheckpointError::Owned`] when another process holds it (after
    /// `wait`, if given), [`CheckpointError::Corrupt`],
    /// [`CheckpointError::FingerprintMismatch`], [`CheckpointError::Io`].
    pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Self, CheckpointError> {
        let mut tries = 0;
        let (mut lock_file, dir_existed) = loop {
            let existed = dir.exists();
            if opts.create {
                trust::create_dir(dir).map_err(io_err(dir, "create directory"))?;
            } else if !dir.join("metadata").exists() {
                return Err(CheckpointError::NotACheckpoint {
                    dir: dir.to_path_buf(),
                });
            }
            if let Err(e) = trust::check(dir) {
                // Removed under us by a previous owner's discard: start over.
                if opts.create && !dir.exists() && tries < 100 {
                    tries += 1;
                    continue;
                }
                return Err(e);
            }
            match lock::acquire(dir, opts.wait).map_err(io_err(dir.join("lock"), "lock"))? {
                lock::LockAttempt::Held(f) => break (f, existed),
                lock::LockAttempt::Owned(owner) => {
                    return Err(CheckpointError::Owned {
                        dir: dir.to_path_buf(),
                        owner,
                        waited: opts.wait,
                    });
                }
                lock::LockAttempt::Vanished if tries < 100 => tries += 1,
                lock::LockAttempt::Vanished => {
                    return Err(io_err(dir.join("lock"), "lock")(io::Error::other(
                        "the checkpoint was removed and created again 100 times while this process tried to lock it",
                    )));
                }
            }
        };
        // From here on we are the only writer. A pipeline that moved to a
        // group is checked under the lock: a `host group adopt` that held
        // it until now may have just marked it.
        if !opts.allow_moved
            && let Some(moved) = moved_marker(dir)?
        {
            return Err(CheckpointError::Moved {
                dir: dir.to_path_buf(),
                moved,
            });
        }
        for sub in ["offsets", "commits", "plugins"] {
            trust::create_dir(&dir.join(sub)).map_err(io_err(dir.join(sub), "create directory"))?;
        }
        remove_temp_files(dir);

        let fingerprint = Fingerprint::new(&opts.topics);
        let mut created = None;
        let metadata = match read_metadata(dir)? {
            Some(mut m) => {
                if let Some(diff) = m.fingerprint.diff(&fingerprint) {
                    if !opts.allow_fingerprint_change {
                        return Err(CheckpointError::FingerprintMismatch {
                            dir: dir.to_path_buf(),
                            diff,
                        });
                    }
                    tracing::warn!(checkpoint = %dir.display(), "adopting a new fingerprint:\n{diff}");
                    m.fingerprint = fingerprint;
                    write_metadata(dir, &m)?;
                }
                m
            }
            None => {
                let m = Metadata {
                    query_id: uuid::Uuid::new_v4().to_string(),
                    created_at_ms: now_ms(),
                    fingerprint,
                };
                write_metadata(dir, &m)?;
                created = Some(Created { dir: !dir_existed });
                m
            }
        };

        let previous = lock::read_epoch(dir).map_err(|e| CheckpointError::Corrupt {
            file: dir.join("epoch"),
            reason: e.to_string(),
        })?;
        if previous.get() >= u64::MAX / 2 {
            return Err(CheckpointError::Corrupt {
                file: dir.join("epoch"),
                reason: format!("epoch {previous} out of range"),
            });
        }
        let analysis = analyze(dir, previous)?;
        let epoch = previous.max(opts.min_epoch).next();
        lock::write_epoch(dir, epoch).map_err(io_err(dir.join("epoch"), "write epoch"))?;
        lock::write_owner(
            &mut lock_file,
            &OwnerInfo {
                pid: std::process::id(),
                hostname: crate::util::hostname(),
                epoch,
                since_ms: now_ms(),
            },
        )
        .map_err(io_err(dir.join("lock"), "write owner"))?;

        if let Some((id, why)) = &analysis.torn {
            let from = dir.join("offsets").join(id.to_string());
            let to = dir.join("offsets").join(format!("{id}.torn"));
            tracing::warn!(
                file = %from.display(),
                "discarding torn write-ahead entry of uncommitted batch {id} ({why}); the batch is re-planned"
            );
            std::fs::rename(&from, &to).map_err(io_err(from, "discard torn entry"))?;
        }
        for id in &analysis.stale_commits {
            let _ = std::fs::remove_file(dir.join("commits").join(id.to_string()));
        }
        Ok(DirCheckpoint {
            dir: dir.to_path_buf(),
            _lock: lock_file,
            epoch,
            metadata,
            retention: opts.retention.max(1),
            last_planned: analysis.last_planned.as_ref().map(|o| o.batch_id),
            last_committed: analysis.last_committed.as_ref().map(|c| c.batch_id),
            topics: analysis
                .last_planned
                .as_ref()
                .map(|o| o.topics.clone())
                .unwrap_or_default(),
            recovery: analysis.recovery,
            created,
        })
    }

    /// Remove this checkpoint if this process created it (this open wrote
    /// its metadata) and no batch was ever planned in it (`offsets/` is
    /// empty): a start refused after the checkpoint was opened — a sink
    /// shared with another pipeline, a broker that did not answer the
    /// first plan — then leaves no directory behind that looks like a
    /// pipeline. The directory itself goes too when this process made it
    /// (not one the user created empty). Call it while still holding the
    /// checkpoint; the lock file goes last, and a process that waited for
    /// it (`--wait`) sees it vanish and starts over
    /// ([`lock::LockAttempt::Vanished`]). Returns whether it removed it.
    pub fn discard_if_unused(&self) -> bool {
        let Some(created) = self.created else {
            return false;
        };
        let dir = &self.dir;
        let planned =
            std::fs::read_dir(dir.join("offsets")).map_or(true, |mut rd| rd.next().is_some());
        if planned {
            return false;
        }
        if let Ok(rd) = std::fs::read_dir(dir.join("plugins")) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        for sub in ["offsets", "commits", "plugins"] {
            let _ = std::fs::remove_dir(dir.join(sub));
        }
        remove_temp_files(dir);
        // The lock file last: a newcomer may lock a new one from then on,
        // and nothing of its files is touched after that.
        for file in ["metadata", "epoch", CONTROL_SOCKET, "lock"] {
            let _ = std::fs::remove_file(dir.join(file));
        }
        if created.dir {
            let _ = std::fs::remove_dir(dir);
        }
        tracing::info!(checkpoint = %dir.display(), "removed the checkpoint this run created: no batch was planned in it");
        true
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The checkpoint's metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    fn check_epoch(&self) -> Result<(), CheckpointError> {
        let current = lock::read_epoch(&self.dir).map_err(|e| CheckpointError::Corrupt {
            file: self.dir.join("epoch"),
            reason: e.to_string(),
        })?;
        if current != self.epoch {
            return Err(CheckpointError::Fenced {
                dir: self.dir.clone(),
                ours: self.epoch,
                current,
            });
        }
        Ok(())
    }

    /// Remove entries of batches older than the retention window. Offsets
    /// go first: recovery treats commits older than the oldest offsets
    /// entry as leftovers of an interrupted prune.
    fn prune(&self, newest: u64) {
        let Some(keep_from) = (newest + 1).checked_sub(self.retention) else {
            return;
        };
        for sub in ["offsets", "commits"] {
            let d = self.dir.join(sub);
            if let Ok(ids) = list_ids(&d) {
                for id in ids.range(..keep_from) {
                    let _ = std::fs::remove_file(d.join(id.to_string()));
                }
            }
            let _ = std::fs::read_dir(&d).map(|rd| {
                for e in rd.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if let Some(id) = name
                        .strip_suffix(".torn")
                        .and_then(|n| n.parse::<u64>().ok())
                        && id < keep_from
                    {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            });
        }
    }

    /// Move the checkpoint to `positions` with an audited write-ahead and
    /// commit pair (batch N = the next id, empty ranges at the new
    /// positions, `note` saying why). `topics` are the identities the
    /// positions belong to (after a recreated topic: the new one's), and
    /// `sink_db` the redacted sink database the pipeline keeps using.
    /// History is never edited. Only valid when no batch is pending re-run.
    ///
    /// # Errors
    /// [`CheckpointError::Misuse`] when a batch is uncommitted;
    /// [`CheckpointError::Fenced`]; [`CheckpointError::Io`].
    pub fn reset(
        &mut self,
        positions: &BTreeMap<(String, i32), i64>,
        plugins: Vec<PluginRef>,
        reset: ResetRecord,
    ) -> Result<u64, CheckpointError> {
        let ResetRecord {
            note,
            topics,
            sink_db,
        } = reset;
        if self.last_planned != self.last_committed {
            return Err(CheckpointError::Misuse {
                dir: self.dir.clone(),
                reason: "the newest batch is not committed; run the pipeline once so it is re-run and committed, then reset".into(),
            });
        }
        let batch_id = self.next_batch_id();
        let ranges = positions
            .iter()
            .map(|((t, p), o)| PartitionRange {
                topic: t.clone(),
                partition: *p,
                start: *o,
                end: *o,
            })
            .collect();
        self.append_offsets(&OffsetsEntry {
            batch_id,
            epoch: self.epoch,
            planned_at_ms: now_ms(),
            ranges,
            plugins: plugins.clone(),
            config_digest: String::new(),
            note: Some(note.clone()),
            topics,
            sink_db,
            output: None,
        })?;
        self.commit_empty(batch_id, plugins, note)?;
        Ok(batch_id)
    }

    /// Commit batch `batch_id` with zero counts, saying why in `note`.
    fn commit_empty(
        &mut self,
        batch_id: u64,
        plugins: Vec<PluginRef>,
        note: String,
    ) -> Result<(), CheckpointError> {
        self.commit(&CommitEntry {
            batch_id,
            epoch: self.epoch,
            committed_at_ms: now_ms(),
            counts: Counts::default(),
            timings_ms: Timings::default(),
            plugins,
            data_loss: Vec::new(),
            note: Some(note),
        })
    }

    /// Give up the planned, uncommitted batch without running it again:
    /// write its commit entry with zero counts and `note` saying why. Only
    /// for a batch that cannot be re-run (a topic of it was recreated), by
    /// `host checkpoint reset`, which then moves the positions. Returns the
    /// batch id.
    ///
    /// # Errors
    /// [`CheckpointError::Misuse`] when no batch is uncommitted;
    /// [`CheckpointError::Fenced`]; [`CheckpointError::Io`].
    pub fn abandon(&mut self, note: String) -> Result<u64, CheckpointError> {
        let Some(batch_id) = self
            .last_planned
            .filter(|p| Some(*p) != self.last_committed)
        else {
            return Err(CheckpointError::Misuse {
                dir: self.dir.clone(),
                reason: "no uncommitted batch to abandon".into(),
            });
        };
        self.commit_empty(batch_id, Vec::new(), note)?;
        tracing::warn!(checkpoint = %self.dir.display(), batch = batch_id, "abandoned uncommitted batch {batch_id}");
        Ok(batch_id)
    }

    /// Record that the pipeline moved to a group (`host group adopt`), or
    /// is moving here from one (`host group disband`, until it is done):
    /// `host run` refuses the directory meanwhile.
    ///
    /// # Errors
    /// [`CheckpointError::Io`].
    pub fn mark_moved(&self, moved: &Moved) -> Result<(), CheckpointError> {
        let bytes = serde_json::to_vec_pretty(moved)
            .map_err(|e| io_err(&self.dir, "encode moved")(io::Error::other(e)))?;
        fsio::write_replace(&self.dir, MOVED, &bytes, "moved")
            .map_err(io_err(self.dir.join(MOVED), "write moved marker"))
    }

    /// The pipeline runs from this directory again: remove the marker.
    ///
    /// # Errors
    /// [`CheckpointError::Io`].
    pub fn clear_moved(&self) -> Result<(), CheckpointError> {
        match std::fs::remove_file(self.dir.join(MOVED)) {
            Ok(()) => fsio::sync_dir(&self.dir).map_err(io_err(&self.dir, "sync directory")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(self.dir.join(MOVED), "remove moved marker")(e)),
        }
    }

    /// Path of a stored component.
    pub fn plugin_path(&self, digest: &str) -> PathBuf {
        self.dir.join("plugins").join(digest)
    }
}

impl DirCheckpoint {
    /// The directory, for messages.
    pub fn location(&self) -> String {
        self.dir.display().to_string()
    }

    /// Stable id of the pipeline (a UUID v4); sinks key progress by it.
    pub fn query_id(&self) -> &str {
        &self.metadata.query_id
    }

    /// Our fencing epoch, issued when it was opened.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Where processing continues (as found when opened).
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// Topic identities of the newest offsets entry.
    pub fn topic_identities(&self) -> &BTreeMap<String, TopicIdentity> {
        &self.topics
    }

    /// Newest committed batch id.
    pub fn last_committed(&self) -> Option<u64> {
        self.last_committed
    }

    /// Id the next planned batch must have.
    pub fn next_batch_id(&self) -> u64 {
        self.last_committed.map_or(0, |c| c + 1)
    }

    /// Write the write-ahead entry of batch `entry.batch_id`, durably,
    /// before any of its records is read.
    ///
    /// # Errors
    /// [`CheckpointError::Misuse`] when the id is not the next one or the
    /// previous batch is uncommitted; [`CheckpointError::Fenced`];
    /// [`CheckpointError::Io`].
    pub fn append_offsets(&mut self, entry: &OffsetsEntry) -> Result<(), CheckpointError> {
        let expected = self.next_batch_id();
        if entry.batch_id != expected || self.last_planned.is_some_and(|p| p >= expected) {
            return Err(CheckpointError::Misuse {
                dir: self.dir.clone(),
                reason: format!(
                    "cannot plan batch {}: the next batch is {expected}{}",
                    entry.batch_id,
                    if self.last_planned.is_some_and(|p| p >= expected) {
                        " and it is planned but not committed (re-run it first)"
                    } else {
                        ""
                    }
                ),
            });
        }
        if entry.epoch != self.epoch {
            return Err(CheckpointError::Misuse {
                dir: self.dir.clone(),
                reason: format!("entry epoch {} is not ours ({})", entry.epoch, self.epoch),
            });
        }
        self.check_epoch()?;
        let bytes = entry::encode("offsets", entry)
            .map_err(|e| io_err(&self.dir, "encode offsets")(io::Error::other(e)))?;
        let odir = self.dir.join("offsets");
        fsio::write_new(&odir, &entry.batch_id.to_string(), &bytes, "offsets").map_err(io_err(
            odir.join(entry.batch_id.to_string()),
            "write offsets entry",
        ))?;
        self.last_planned = Some(entry.batch_id);
        self.topics.clone_from(&entry.topics);
        Ok(())
    }

    /// Write the commit entry of the planned batch `entry.batch_id`, after
    /// re-checking that our epoch is still the newest.
    ///
    /// # Errors
    /// [`CheckpointError::Fenced`] (nothing written),
    /// [`CheckpointError::Misuse`] when that batch is not the planned,
    /// uncommitted one; [`CheckpointError::Io`].
    pub fn commit(&mut self, entry: &CommitEntry) -> Result<(), CheckpointError> {
        if self.last_planned != Some(entry.batch_id) || self.last_committed == Some(entry.batch_id)
        {
            return Err(CheckpointError::Misuse {
                dir: self.dir.clone(),
                reason: format!(
                    "cannot commit batch {}: it is not the planned, uncommitted batch",
                    entry.batch_id
                ),
            });
        }
        self.check_epoch()?;
        let bytes = entry::encode("commit", entry)
            .map_err(|e| io_err(&self.dir, "encode commit")(io::Error::other(e)))?;
        let cdir = self.dir.join("commits");
        fsio::write_new(&cdir, &entry.batch_id.to_string(), &bytes, "commit").map_err(io_err(
            cdir.join(entry.batch_id.to_string()),
            "write commit entry",
        ))?;
        self.last_committed = Some(entry.batch_id);
        self.prune(entry.batch_id);
        Ok(())
    }

    /// Keep a component's bytes, by SHA-256 (idempotent). Returns the
    /// digest, lower-case hex.
    ///
    /// # Errors
    /// [`CheckpointError::Io`].
    pub fn store_plugin(&self, bytes: &[u8]) -> Result<String, CheckpointError> {
        let digest = crate::plugin::digest(bytes);
        let pdir = self.dir.join("plugins");
        match fsio::write_new(&pdir, &digest, bytes, "plugin") {
            Ok(()) => Ok(digest),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(digest),
            Err(e) => Err(io_err(pdir.join(&digest), "store plugin")(e)),
        }
    }

    /// Read a stored component and verify its digest.
    ///
    /// # Errors
    /// [`CheckpointError::Corrupt`] when missing or altered.
    pub fn load_plugin(&self, digest: &str) -> Result<(PathBuf, Vec<u8>), CheckpointError> {
        read_stored_plugin(&self.dir, digest)
    }
}

/// The marker file of a pipeline that moved to a group.
const MOVED: &str = "moved";

/// The `moved` marker of the checkpoint at `dir`, if it has one.
///
/// # Errors
/// [`CheckpointError::Corrupt`] for an unreadable marker.
pub fn moved_marker(dir: &Path) -> Result<Option<Moved>, CheckpointError> {
    match std::fs::read(dir.join(MOVED)) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| CheckpointError::Corrupt {
                    file: dir.join(MOVED),
                    reason: format!(
                        "{e}; it records the group the pipeline moved to (`host group adopt`)"
                    ),
                })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(dir.join(MOVED), "read moved marker")(e)),
    }
}

/// Read `dir/plugins/<digest>` and verify its digest (no lock needed: the
/// store is content-addressed and append-only). Returns its path and bytes.
///
/// # Errors
/// [`CheckpointError::Corrupt`] when missing or altered.
pub fn read_stored_plugin(dir: &Path, digest: &str) -> Result<(PathBuf, Vec<u8>), CheckpointError> {
    let path = dir.join("plugins").join(digest);
    let bytes = trust::read(&path).map_err(|e| CheckpointError::Corrupt {
        file: path.clone(),
        reason: format!("stored plugin unreadable: {e}"),
    })?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if actual != digest {
        return Err(CheckpointError::Corrupt {
            file: path,
            reason: format!("content hashes to {actual}"),
        });
    }
    Ok((path, bytes))
}

fn remove_temp_files(dir: &Path) {
    for sub in [".", "offsets", "commits", "plugins"] {
        if let Ok(rd) = std::fs::read_dir(dir.join(sub)) {
            for e in rd.flatten() {
                if fsio::is_temp_name(&e.file_name().to_string_lossy()) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}
