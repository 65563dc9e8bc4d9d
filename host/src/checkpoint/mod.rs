//! The checkpoint: write-ahead offset log, commit log, metadata, lock and
//! fencing epoch (DESIGN.md, "Checkpoint directory" and "Lock, epoch,
//! fencing").
//!
//! ```text
//! metadata          query id, created-at, format version, fingerprint
//! lock              flock'd by the owner: pid, hostname, epoch, since
//! epoch             last issued fencing epoch
//! offsets/<N>       write-ahead entry of batch N
//! commits/<N>       commit entry of batch N
//! plugins/<sha256>  every component ever run, by content
//! ```
//!
//! Invariants this module enforces:
//! - Only the lock holder writes. Each acquisition issues a new epoch.
//! - `offsets/N` is written only after `commits/N-1`; `commits/N` only after
//!   `offsets/N` and only while our epoch is still the newest (a zombie
//!   cannot commit). Both are created atomically and never replaced.
//! - [`Checkpoint::recovery`] answers exactly one of "resume batch N+1 from
//!   these offsets" or "re-run batch N with these exact ranges"; the only
//!   damage it repairs is a torn, uncommitted newest offsets entry. Any other
//!   damage is [`CheckpointError::Corrupt`], never a silent fallback.

mod entry;
mod fsio;
mod lock;
mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::util::now_ms;

pub use entry::{
    CommitEntry, Counts, DataLossGap, EnvelopeError, FORMAT_VERSION, OffsetsEntry, PartitionRange,
    PluginRef, StageKind, Timings, TopicIdentity,
};
pub use lock::OwnerInfo;
pub use status::{Status, status};

/// Default number of batches whose entries are kept.
pub const DEFAULT_RETENTION: u64 = 100;

/// Errors of the checkpoint module. Each names the directory or file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Another live process holds the lock.
    #[error("checkpoint {dir} is owned by {}; use --wait to queue or --takeover to ask it to hand over", describe_owner(.owner))]
    Owned {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What the owner wrote about itself (None while it is writing).
        owner: Option<OwnerInfo>,
    },
    /// A file is damaged beyond the one repair recovery may do.
    #[error("checkpoint corrupt: {}: {reason}", .file.display())]
    Corrupt {
        /// The damaged (or missing) file.
        file: PathBuf,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// Our epoch was superseded: another process owns the checkpoint now.
    #[error(
        "checkpoint {dir}: fenced: this process holds epoch {ours} but epoch {current} was issued since; another process took over, so this one must stop without committing"
    )]
    Fenced {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Our epoch.
        ours: u64,
        /// The newest epoch.
        current: u64,
    },
    /// Subscribed topics or contract differ from the checkpoint's.
    #[error(
        "checkpoint {dir}: the pipeline does not match the checkpoint's fingerprint:\n{diff}\nrestart with the checkpoint's topics, or pass --allow-fingerprint-change to adopt the new set (new topics start at the configured starting offsets) or, after a host upgrade that changed the plugin contract, the new contract (rebuild the plugins against the new sluice-guest first)"
    )]
    FingerprintMismatch {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Human-readable difference.
        diff: String,
    },
    /// The directory is not a checkpoint.
    #[error("{}: not a checkpoint directory (no metadata file)", .dir.display())]
    NotACheckpoint {
        /// The directory.
        dir: PathBuf,
    },
    /// A call out of the documented order (a bug in the caller).
    #[error("checkpoint {dir}: {reason}")]
    Misuse {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// An OS error.
    #[error("checkpoint {}: {op}: {source}", .path.display())]
    Io {
        /// File or directory.
        path: PathBuf,
        /// What we were doing.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

pub(crate) fn describe_owner(owner: &Option<OwnerInfo>) -> String {
    match owner {
        Some(o) => format!(
            "pid {} on {} since {} (epoch {})",
            o.pid,
            o.hostname,
            o.since(),
            o.epoch
        ),
        None => "another process (its owner record is being written)".to_string(),
    }
}

fn io_err(path: impl Into<PathBuf>, op: &'static str) -> impl FnOnce(io::Error) -> CheckpointError {
    let path = path.into();
    move |source| CheckpointError::Io { path, op, source }
}

impl CheckpointError {
    /// True for [`CheckpointError::Owned`] (the CLI maps it to exit code 3).
    pub fn is_owned(&self) -> bool {
        matches!(self, CheckpointError::Owned { .. })
    }
}

/// What the pipeline is, for the restart check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Subscribed topics, sorted.
    pub topics: Vec<String>,
    /// The plugin contract, `sluice:plugin@<version>`.
    pub contract: String,
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

impl Fingerprint {
    /// Fingerprint of a pipeline subscribed to `topics` with this host's
    /// contract version.
    pub fn new(topics: &[String]) -> Self {
        let set: BTreeSet<&String> = topics.iter().collect();
        Fingerprint {
            topics: set.into_iter().cloned().collect(),
            contract: format!("sluice:plugin@{}", crate::plugin::CONTRACT_VERSION),
        }
    }

    fn diff(&self, now: &Fingerprint) -> Option<String> {
        if self == now {
            return None;
        }
        let old: BTreeSet<&String> = self.topics.iter().collect();
        let new: BTreeSet<&String> = now.topics.iter().collect();
        let mut lines = vec![
            format!("  checkpoint topics: {}", join(&self.topics)),
            format!("  pipeline topics:   {}", join(&now.topics)),
        ];
        let added: Vec<String> = new.difference(&old).map(|s| s.to_string()).collect();
        let removed: Vec<String> = old.difference(&new).map(|s| s.to_string()).collect();
        if !added.is_empty() {
            lines.push(format!("  + added:   {}", added.join(", ")));
        }
        if !removed.is_empty() {
            lines.push(format!("  - removed: {}", removed.join(", ")));
        }
        if self.contract != now.contract {
            lines.push(format!(
                "  contract: checkpoint {} vs host {}",
                self.contract, now.contract
            ));
        }
        Some(lines.join("\n"))
    }
}

fn join(v: &[String]) -> String {
    if v.is_empty() {
        "(none)".into()
    } else {
        v.join(", ")
    }
}

/// Contents of `metadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    /// Stable id of this checkpoint (UUID v4); sinks key progress by it.
    pub query_id: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// The pipeline fingerprint.
    pub fingerprint: Fingerprint,
}

/// How to open a checkpoint.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// The pipeline's topics (checked against the fingerprint; used to
    /// create it).
    pub topics: Vec<String>,
    /// Adopt a different fingerprint instead of refusing.
    pub allow_fingerprint_change: bool,
    /// Wait this long for the lock instead of failing at once.
    pub wait: Option<Duration>,
    /// Batches of entries to keep (≥ 1).
    pub retention: u64,
    /// Create the directory if it does not exist.
    pub create: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            topics: Vec::new(),
            allow_fingerprint_change: false,
            wait: None,
            retention: DEFAULT_RETENTION,
            create: true,
        }
    }
}

/// Where processing continues after opening a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// Batch `next_batch` is next, starting at `positions` (the ends of the
    /// last committed batch; empty for a new checkpoint: every partition
    /// starts at its configured starting offset).
    Resume {
        /// Id of the next batch to plan.
        next_batch: u64,
        /// Next offset to read per (topic, partition).
        positions: BTreeMap<(String, i32), i64>,
        /// Plugins of the last committed batch (to resume without
        /// `--plugin`), empty for a new checkpoint.
        plugins: Vec<PluginRef>,
    },
    /// Batch `entry.batch_id` was planned but not committed: run it again
    /// with exactly these ranges.
    Rerun {
        /// The write-ahead entry to replay.
        entry: OffsetsEntry,
    },
}

/// Facts read from the entry directories, without side effects.
#[derive(Debug, Clone)]
pub(crate) struct Analysis {
    pub(crate) recovery: Recovery,
    /// Newest valid offsets entry (if any).
    pub(crate) last_planned: Option<OffsetsEntry>,
    /// Newest commit entry (if any).
    pub(crate) last_committed: Option<CommitEntry>,
    /// A torn newest offsets entry that recovery discards.
    pub(crate) torn: Option<(u64, EnvelopeError)>,
    /// Commit entries older than the oldest offsets entry (retention
    /// leftovers from an interrupted prune).
    pub(crate) stale_commits: Vec<u64>,
}

fn list_ids(dir: &Path) -> Result<BTreeSet<u64>, CheckpointError> {
    let mut ids = BTreeSet::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ids),
        Err(e) => return Err(io_err(dir, "list entries")(e)),
    };
    for e in rd {
        let e = e.map_err(io_err(dir, "list entries"))?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if fsio::is_temp_name(&name) || name.ends_with(".torn") {
            continue;
        }
        match name.parse::<u64>() {
            Ok(id) if id.to_string() == name => {
                ids.insert(id);
            }
            _ => {
                return Err(CheckpointError::Corrupt {
                    file: e.path(),
                    reason: "unexpected file in an entry directory (entries are named by batch id)"
                        .into(),
                });
            }
        }
    }
    Ok(ids)
}

fn read_entry<T: serde::de::DeserializeOwned>(
    path: &Path,
    kind: &'static str,
) -> Result<Result<T, EnvelopeError>, CheckpointError> {
    let bytes = std::fs::read(path).map_err(io_err(path, "read entry"))?;
    Ok(entry::decode(kind, &bytes))
}

/// Read the entry directories and decide where processing continues.
pub(crate) fn analyze(dir: &Path, current_epoch: u64) -> Result<Analysis, CheckpointError> {
    let odir = dir.join("offsets");
    let cdir = dir.join("commits");
    let mut offsets = list_ids(&odir)?;
    let commits = list_ids(&cdir)?;
    let corrupt = |file: PathBuf, reason: String| CheckpointError::Corrupt { file, reason };

    // A torn newest offsets entry without a commit is a crash mid-write:
    // discard it (the batch is re-planned). Anything else is corruption.
    let mut torn = None;
    if let Some(&newest) = offsets.last()
        && !commits.contains(&newest)
    {
        let path = odir.join(newest.to_string());
        if let Err(e) = read_entry::<OffsetsEntry>(&path, "offsets")?
            && e.is_torn()
        {
            torn = Some((newest, e));
            offsets.remove(&newest);
        }
    }

    if let Some(&huge) = offsets
        .iter()
        .chain(commits.iter())
        .find(|&&id| id >= u64::MAX / 2)
    {
        return Err(corrupt(
            odir.join(huge.to_string()),
            "batch id out of range".into(),
        ));
    }
    let (Some(&min), Some(&max)) = (offsets.first(), offsets.last()) else {
        if let Some(c) = commits.iter().next() {
            return Err(corrupt(
                cdir.join(c.to_string()),
                "commit entry without its offsets entry".into(),
            ));
        }
        if let Some((id, _)) = &torn
            && *id > 0
        {
            return Err(corrupt(
                odir.join(id.to_string()),
                format!("torn entry of batch {id} with no earlier entry to resume from"),
            ));
        }
        return Ok(Analysis {
            recovery: Recovery::Resume {
                next_batch: 0,
                positions: BTreeMap::new(),
                plugins: Vec::new(),
            },
            last_planned: None,
            last_committed: None,
            torn,
            stale_commits: Vec::new(),
        });
    };
    if let Some(t) = &torn
        && t.0 != max + 1
    {
        return Err(corrupt(
            odir.join(t.0.to_string()),
            format!("torn entry is not next to the newest valid entry {max}"),
        ));
    }
    for id in min..=max {
        if !offsets.contains(&id) {
            return Err(corrupt(
                odir.join(id.to_string()),
                format!("missing: entries {min}..={max} must be contiguous"),
            ));
        }
    }
    if let Some(&c) = commits.iter().find(|&&c| c > max) {
        return Err(corrupt(
            cdir.join(c.to_string()),
            "commit entry without its offsets entry".into(),
        ));
    }
    let stale_commits: Vec<u64> = commits.iter().copied().filter(|&c| c < min).collect();

    let mut last_planned = None;
    let mut last_committed = None;
    for id in min..=max {
        let opath = odir.join(id.to_string());
        let o: OffsetsEntry =
            read_entry(&opath, "offsets")?.map_err(|e| corrupt(opath.clone(), e.to_string()))?;
        if o.batch_id != id {
            return Err(corrupt(
                opath,
                format!("holds batch {} under the name {id}", o.batch_id),
            ));
        }
        if o.epoch > current_epoch {
            return Err(corrupt(
                opath,
                format!(
                    "written with epoch {} but the epoch file says {current_epoch}; the epoch file was lost or rolled back",
                    o.epoch
                ),
            ));
        }
        let committed = commits.contains(&id);
        if !committed && id != max {
            return Err(corrupt(
                cdir.join(id.to_string()),
                format!(
                    "missing: batch {id} is not committed but batch {max} was planned after it"
                ),
            ));
        }
        if committed {
            let cpath = cdir.join(id.to_string());
            let c: CommitEntry =
                read_entry(&cpath, "commit")?.map_err(|e| corrupt(cpath.clone(), e.to_string()))?;
            if c.batch_id != id {
                return Err(corrupt(
                    cpath,
                    format!("holds batch {} under the name {id}", c.batch_id),
                ));
            }
            if c.epoch > current_epoch {
                return Err(corrupt(
                    cpath,
                    format!(
                        "written with epoch {} but the epoch file says {current_epoch}",
                        c.epoch
                    ),
                ));
            }
            last_committed = Some(c);
        }
        last_planned = Some(o);
    }
    let Some(planned) = last_planned.clone() else {
        return Err(CheckpointError::Misuse {
            dir: dir.to_path_buf(),
            reason: "no offsets entry after listing some".into(),
        });
    };
    let recovery = if commits.contains(&planned.batch_id) {
        Recovery::Resume {
            next_batch: planned.batch_id + 1,
            positions: planned
                .ranges
                .iter()
                .map(|r| ((r.topic.clone(), r.partition), r.end))
                .collect(),
            plugins: last_committed
                .as_ref()
                .map(|c| c.plugins.clone())
                .unwrap_or_default(),
        }
    } else {
        Recovery::Rerun { entry: planned }
    };
    Ok(Analysis {
        recovery,
        last_planned,
        last_committed,
        torn,
        stale_commits,
    })
}

/// True when `dir` holds a checkpoint (its `metadata` file exists, even if
/// unreadable: opening it then reports why). False for a missing or empty
/// directory, which [`Checkpoint::open`] would create a checkpoint in.
pub fn exists(dir: &Path) -> bool {
    dir.join("metadata").exists()
}

fn read_metadata(dir: &Path) -> Result<Option<Metadata>, CheckpointError> {
    let path = dir.join("metadata");
    match std::fs::read(&path) {
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

/// What a reset entry records besides its positions.
#[derive(Debug, Clone, Default)]
pub struct ResetRecord {
    /// Why, by whom, and what was done to the sink's progress.
    pub note: String,
    /// Topic identities the new positions belong to.
    pub topics: BTreeMap<String, TopicIdentity>,
    /// The pipeline's sink database, redacted.
    pub sink_db: Option<String>,
}

/// An open, locked checkpoint. Dropping it releases the lock.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    _lock: File,
    epoch: u64,
    metadata: Metadata,
    retention: u64,
    /// Newest batch with an offsets entry.
    last_planned: Option<u64>,
    /// Newest batch with a commit entry.
    last_committed: Option<u64>,
    recovery: Recovery,
    /// Topic identities of the newest offsets entry.
    topics: BTreeMap<String, TopicIdentity>,
}

impl Checkpoint {
    /// Open (or create) the checkpoint at `dir`, take its lock, issue a
    /// new epoch and work out where processing continues.
    ///
    /// # Errors
    /// [`CheckpointError::Owned`] when another process holds it (after
    /// `wait`, if given), [`CheckpointError::Corrupt`],
    /// [`CheckpointError::FingerprintMismatch`], [`CheckpointError::Io`].
    pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Self, CheckpointError> {
        if opts.create {
            std::fs::create_dir_all(dir).map_err(io_err(dir, "create directory"))?;
        } else if !dir.join("metadata").exists() {
            return Err(CheckpointError::NotACheckpoint {
                dir: dir.to_path_buf(),
            });
        }
        let mut lock_file =
            match lock::acquire(dir, opts.wait).map_err(io_err(dir.join("lock"), "lock"))? {
                lock::Acquire::Held(f) => f,
                lock::Acquire::Owned(owner) => {
                    return Err(CheckpointError::Owned {
                        dir: dir.to_path_buf(),
                        owner,
                    });
                }
            };
        // From here on we are the only writer.
        for sub in ["offsets", "commits", "plugins"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(io_err(dir.join(sub), "create directory"))?;
        }
        remove_temp_files(dir);

        let fingerprint = Fingerprint::new(&opts.topics);
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
                m
            }
        };

        let previous = lock::read_epoch(dir).map_err(|e| CheckpointError::Corrupt {
            file: dir.join("epoch"),
            reason: e.to_string(),
        })?;
        if previous >= u64::MAX / 2 {
            return Err(CheckpointError::Corrupt {
                file: dir.join("epoch"),
                reason: format!("epoch {previous} out of range"),
            });
        }
        let analysis = analyze(dir, previous)?;
        let epoch = previous + 1;
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
        Ok(Checkpoint {
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
        })
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Our fencing epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The checkpoint's metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Where processing continues (as found at open time).
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// Identity of each topic when the newest batch was planned (empty
    /// for a new checkpoint or one written by a host before 0.3).
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

    /// Write the write-ahead entry of batch `entry.batch_id`.
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
    /// re-checking that our epoch is still the newest; then prune entries
    /// older than the retention window.
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

    /// Copy a component into the content-addressed store (idempotent).
    /// Returns its digest.
    ///
    /// # Errors
    /// [`CheckpointError::Io`].
    pub fn store_plugin(&self, bytes: &[u8]) -> Result<String, CheckpointError> {
        let digest = hex::encode(Sha256::digest(bytes));
        let pdir = self.dir.join("plugins");
        match fsio::write_new(&pdir, &digest, bytes, "plugin") {
            Ok(()) => Ok(digest),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(digest),
            Err(e) => Err(io_err(pdir.join(&digest), "store plugin")(e)),
        }
    }

    /// Path of a stored component.
    pub fn plugin_path(&self, digest: &str) -> PathBuf {
        self.dir.join("plugins").join(digest)
    }

    /// Read a stored component and verify its digest.
    ///
    /// # Errors
    /// [`CheckpointError::Corrupt`] when missing or altered.
    pub fn load_plugin(&self, digest: &str) -> Result<Vec<u8>, CheckpointError> {
        read_stored_plugin(&self.dir, digest).map(|(_, b)| b)
    }
}

/// Read `dir/plugins/<digest>` and verify its digest (no lock needed: the
/// store is content-addressed and append-only). Returns its path and bytes.
///
/// # Errors
/// [`CheckpointError::Corrupt`] when missing or altered.
pub fn read_stored_plugin(dir: &Path, digest: &str) -> Result<(PathBuf, Vec<u8>), CheckpointError> {
    let path = dir.join("plugins").join(digest);
    let bytes = std::fs::read(&path).map_err(|e| CheckpointError::Corrupt {
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

#[cfg(test)]
mod tests;
