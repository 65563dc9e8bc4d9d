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

mod dir;
mod entry;
mod fsio;
pub mod group;
mod lock;
mod recovery;
mod status;
mod trust;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The offset range entries record (defined with the reader that fetches
/// it).
pub use crate::source::PartitionRange;
pub use dir::{DirCheckpoint, check_fingerprint, exists, read_stored_plugin};
pub use entry::{
    CommitEntry, Counts, DataLossGap, EnvelopeError, FORMAT_VERSION, OffsetsEntry, PluginRef,
    StageKind, Timings, TopicIdentity, decode,
};
pub use lock::OwnerInfo;
pub use status::{Status, status};

/// A fencing epoch (DESIGN.md, "Lock, epoch, fencing"): issued by the
/// checkpoint, one higher at each claim; every write-ahead and commit
/// checks that ours is still the newest, so an owner that lost its claim
/// (a zombie) cannot write. Serialized as the bare number; sinks receive
/// it as a `u64` in the plugin contract's context.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Epoch(u64);

impl Epoch {
    /// Epoch `n`.
    pub const fn new(n: u64) -> Self {
        Epoch(n)
    }

    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The epoch issued after this one.
    pub const fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq<u64> for Epoch {
    fn eq(&self, other: &u64) -> bool {
        self.0 == *other
    }
}

/// Default number of batches whose entries are kept.
pub const DEFAULT_RETENTION: u64 = 100;

/// Errors of the checkpoint module. Each names the directory or file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Another live process holds the lock.
    #[error("checkpoint {dir} is owned by {}; {}", describe_owner(.owner), owned_advice(*.waited))]
    Owned {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What the owner wrote about itself (None while it is writing).
        owner: Option<OwnerInfo>,
        /// How long we queued for it (`--wait`), if we did.
        waited: Option<Duration>,
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
        ours: Epoch,
        /// The newest epoch.
        current: Epoch,
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
    /// Another local user could change the checkpoint (see `trust`).
    #[error("checkpoint {}: {reason}", .path.display())]
    Unsafe {
        /// The directory or entry.
        path: PathBuf,
        /// What is wrong, and how to fix it.
        reason: String,
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

/// What to do about an owned checkpoint, after queueing `waited` or not.
fn owned_advice(waited: Option<Duration>) -> String {
    match waited {
        Some(w) => format!(
            "it was still owned after waiting {} (--wait): stop the owner (SIGTERM), wait longer, or ask it to hand over with --takeover",
            humantime::format_duration(w)
        ),
        None => "use --wait to queue or --takeover to ask it to hand over".into(),
    }
}

pub(crate) fn describe_owner(owner: &Option<OwnerInfo>) -> String {
    match owner {
        Some(o) => o.describe(),
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

    /// What differs from `now`, one line each, or `None` when equal.
    pub(crate) fn diff(&self, now: &Fingerprint) -> Option<String> {
        let same_contract = self.contract == now.contract
            || (compatible_contract(&self.contract) && compatible_contract(&now.contract));
        if self.topics == now.topics && same_contract {
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
        if !same_contract {
            lines.push(format!(
                "  contract: checkpoint {} vs host {}",
                self.contract, now.contract
            ));
        }
        Some(lines.join("\n"))
    }
}

/// Whether a fingerprint's `sluice:plugin@<version>` is one this host
/// implements ([`crate::plugin::contract_compatible`]): a checkpoint made
/// by a host of contract 0.2.0 resumes under 0.2.1, whose additions are
/// only new imports a plugin may use.
fn compatible_contract(contract: &str) -> bool {
    contract
        .strip_prefix("sluice:plugin@")
        .is_some_and(crate::plugin::contract_compatible)
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

/// A checkpoint as the batch loop sees it: claimed with a fencing epoch
/// when opened, then write-ahead ([`Checkpoint::append_offsets`]) and
/// commit ([`Checkpoint::commit`]) in strict alternation, plus the
/// content-addressed plugin store. Dropping it releases the claim.
///
/// [`DirCheckpoint`] (a directory guarded by `flock`) is today's one
/// implementation. The batch loop and the batch boundary use only this
/// trait; opening is implementation-specific, and so is what startup and
/// `--takeover` read before opening (the directory's status, fingerprint
/// and plugin store, and the control socket and handover note that live
/// in it). Another store (the sink database, for pipeline groups) brings
/// its own opener and needs no change to the loop.
///
/// Every write checks that our epoch is still the newest and fails with
/// [`CheckpointError::Fenced`] otherwise, writing nothing.
pub trait Checkpoint: Send {
    /// Where it lives, for messages (the directory today).
    fn location(&self) -> String;
    /// Our fencing epoch, issued when it was opened.
    fn epoch(&self) -> Epoch;
    /// Stable id of the pipeline's checkpoint (a UUID v4); sinks key their
    /// progress rows by it.
    fn query_id(&self) -> &str;
    /// Where processing continues (as found when opened).
    fn recovery(&self) -> &Recovery;
    /// Identity of each topic when the newest batch was planned (empty for
    /// a new checkpoint or one written by a host before 0.3).
    fn topic_identities(&self) -> &BTreeMap<String, TopicIdentity>;
    /// Newest committed batch id.
    fn last_committed(&self) -> Option<u64>;
    /// Id the next planned batch must have.
    fn next_batch_id(&self) -> u64 {
        self.last_committed().map_or(0, |c| c + 1)
    }
    /// Write the write-ahead entry of batch `entry.batch_id`, durably,
    /// before any of its records is read.
    ///
    /// # Errors
    /// [`CheckpointError::Misuse`] when the id is not the next one or the
    /// previous batch is uncommitted; [`CheckpointError::Fenced`];
    /// [`CheckpointError::Io`].
    fn append_offsets(&mut self, entry: &OffsetsEntry) -> Result<(), CheckpointError>;
    /// Write the commit entry of the planned batch `entry.batch_id`, after
    /// re-checking that our epoch is still the newest.
    ///
    /// # Errors
    /// [`CheckpointError::Fenced`] (nothing written),
    /// [`CheckpointError::Misuse`] when that batch is not the planned,
    /// uncommitted one; [`CheckpointError::Io`].
    fn commit(&mut self, entry: &CommitEntry) -> Result<(), CheckpointError>;
    /// Keep a component's bytes, by SHA-256 (idempotent). Returns the
    /// digest, lower-case hex.
    ///
    /// # Errors
    /// [`CheckpointError::Io`].
    fn store_plugin(&self, bytes: &[u8]) -> Result<String, CheckpointError>;
    /// Read a stored component and verify its digest. Returns where it
    /// was read from (for messages) and its bytes.
    ///
    /// # Errors
    /// [`CheckpointError::Corrupt`] when missing or altered.
    fn load_plugin(&self, digest: &str) -> Result<(PathBuf, Vec<u8>), CheckpointError>;
}

#[cfg(test)]
mod tests;
