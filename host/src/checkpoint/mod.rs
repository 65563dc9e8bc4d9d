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
mod dir_store;
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
pub use dir::{
    CONTROL_SOCKET, DirCheckpoint, check_fingerprint, exists, moved_marker, read_stored_plugin,
};
pub use dir_store::DirStore;
pub use entry::{
    CommitEntry, Counts, DataLossGap, EnvelopeError, FORMAT_VERSION, OffsetsEntry, PluginRef,
    StageKind, Timings, TopicIdentity, decode,
};
pub use group::Planned;
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
    /// The pipeline runs in a pipeline group now (`host group adopt`).
    #[error(
        "checkpoint {}: the pipeline {} ({}); run it as a group member (`host run --group {} --sink-db URL …`), or bring it back here with `host group disband --group {} --sink-db URL --checkpoint {}`. If a `host group adopt` or `host group disband` was interrupted, run the same command again: it finishes the move", .dir.display(), if .moved.moving_here { format!("is moving here from {}", .moved.to) } else { format!("moved to {}", .moved.to) }, crate::util::rfc3339_ms(.moved.at_ms), .moved.group, .moved.group, .dir.display()
    )]
    Moved {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Where the pipeline went.
        moved: Moved,
    },
    /// A call out of the documented order (a bug in the caller).
    #[error("checkpoint {dir}: {reason}")]
    Misuse {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The sink database's store of a pipeline group.
    #[error(transparent)]
    Group(#[from] group::GroupError),
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
    /// The epoch issued is above this one too (a pipeline coming from a
    /// group, whose progress rows carry the group's owner epochs).
    pub min_epoch: Epoch,
    /// Open a checkpoint whose pipeline moved to a group (only `host group
    /// adopt` and `host group disband` do).
    pub allow_moved: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            topics: Vec::new(),
            allow_fingerprint_change: false,
            wait: None,
            retention: DEFAULT_RETENTION,
            create: true,
            min_epoch: Epoch::default(),
            allow_moved: false,
        }
    }
}

/// The `moved` marker of a checkpoint directory whose pipeline runs in a
/// pipeline group (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    /// The group.
    pub group: String,
    /// The group and its database, for messages.
    pub to: String,
    /// When, ms since the Unix epoch.
    pub at_ms: i64,
    /// The pipeline is moving here from the group (`host group disband`
    /// not finished), rather than gone to it.
    #[serde(default)]
    pub moving_here: bool,
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

/// Where a claimed partition continues (DESIGN.md, "Recovery" and "Claim
/// on assign").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// At this offset: the end of the last committed batch (a directory),
    /// or the end the partition's progress row shows applied (a group).
    At(i64),
    /// A range planned and not committed: run it again with exactly these
    /// bounds, so its records get the same idempotency keys.
    Rerun(Planned),
    /// No position yet: the planner decides (the configured starting
    /// offsets for a new pipeline or a topic new to it, else the log
    /// start).
    New,
}

/// A claimed partition: the owner epoch that fences every write of it,
/// and where reading continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The fencing token of this partition for this process.
    pub epoch: Epoch,
    /// Where it continues.
    pub start: Start,
}

/// A batch as the store writes it ahead and commits it.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Id, ranges (one per partition planned, empty ones included),
    /// plugins, topic identities, config digest, sink database.
    pub entry: OffsetsEntry,
    /// Each planned partition's owner epoch (the one its claim returned).
    pub epochs: BTreeMap<(String, i32), Epoch>,
    /// The ranges were planned earlier and not committed: this is their
    /// re-run, with the same bounds.
    pub rerun: bool,
    /// Partitions whose start was set at the high watermark without
    /// reading (`--starting-offsets latest`): the store records it, so
    /// whoever holds the partition next starts there too.
    pub started_latest: BTreeSet<(String, i32)>,
}

/// What the sink applied of a partition, as the sink database's store
/// reads it when claiming (the sink driver owns `sluice_progress` and
/// implements this; the store stays below it).
pub trait AppliedProgress: Send + Sync {
    /// The end `query_id`'s progress row on `topic/partition` shows
    /// applied and the epoch it was written with (`None`: no row), read
    /// on `b` inside the caller's transaction.
    ///
    /// # Errors
    /// The database's.
    fn applied_on(
        &self,
        b: &mut dyn crate::capability::sql::Backend,
        query_id: &str,
        topic: &str,
        partition: i32,
    ) -> Result<Option<(i64, Epoch)>, crate::capability::sql::DbError>;
    /// Record that `topic/partition` starts at `at` (no row yet: the
    /// offsets below `at` become a hole), fenced by `epoch`.
    ///
    /// # Errors
    /// [`group::GroupError::Fenced`] when another member holds it now;
    /// [`group::GroupError::Db`].
    fn start_at(
        &self,
        query_id: &str,
        topic: &str,
        partition: i32,
        epoch: Epoch,
        at: i64,
    ) -> Result<(), group::GroupError>;
    /// Record `range` of `topic/partition` applied by batch `batch` under
    /// `epoch`, on `b` inside the caller's transaction: only the offsets
    /// the row does not show applied yet are added (those below its end
    /// that are not holes stay as they are). Returns whether any was.
    ///
    /// # Errors
    /// The database's.
    fn record_applied_on(
        &self,
        b: &mut dyn crate::capability::sql::Backend,
        at: (&str, &str, i32),
        epoch: Epoch,
        range: std::ops::Range<i64>,
        batch: u64,
    ) -> Result<bool, crate::capability::sql::DbError>;
}

/// A partition whose owner epoch moved past ours (DESIGN.md, "fencing
/// token"): a write for it was refused, nothing of it was written, and
/// another owner holds it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced {
    /// The partition, as (topic, partition).
    pub partition: (String, i32),
    /// The owner epoch we wrote with.
    pub ours: Epoch,
    /// The owner epoch the store holds now (0: the partition's row is
    /// gone).
    pub now: Epoch,
    /// Who holds it now, as the store records it.
    pub holder: String,
}

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fenced on {}/{}: owner epoch {} is now held by {} (ours was {}); this member drops the partition",
            self.partition.0, self.partition.1, self.now, self.holder, self.ours
        )
    }
}

/// The checkpoint seam (DESIGN.md, "One engine, two stores"): what the
/// one batch loop needs of the store that holds a pipeline's checkpoint.
/// [`DirStore`] (a directory, one host, one epoch for every partition)
/// and [`group::DbStore`] (the sink database, a pipeline group, one owner
/// epoch per partition) implement it.
///
/// Order: partitions are claimed ([`Checkpoint::claim`]); each batch is
/// written ahead ([`Checkpoint::write_ahead`]) before any of its records
/// is read, and committed ([`Checkpoint::commit`]) only after every
/// partition's sink closed cleanly. Every write checks the epochs it
/// carries: a store that finds a newer one writes nothing for that
/// partition (the whole batch, for a directory) and says so.
pub trait Checkpoint: Send + Sync {
    /// Where it lives, for messages (the directory, or the group and
    /// database).
    fn location(&self) -> String;
    /// The key sinks record progress under: the directory's query id (a
    /// UUID v4), or the group's name.
    fn query_id(&self) -> &str;
    /// The one epoch of a store claimed as a whole (a directory), `None`
    /// when each partition has its own (a group).
    fn epoch(&self) -> Option<Epoch>;
    /// True for a pipeline with no position yet: partitions with
    /// [`Start::New`] start at the configured starting offsets.
    fn is_new(&self) -> bool;
    /// Claim `tp` for this process (`member`: its Kafka member id, empty
    /// for a single host): its owner epoch and where it continues.
    ///
    /// # Errors
    /// The store's (a group's database down, a row changed by hand).
    fn claim(&self, tp: &(String, i32), member: &str) -> Result<Claimed, CheckpointError>;
    /// Identity of each topic when the newest batch was planned.
    fn topic_identities(&self) -> BTreeMap<String, TopicIdentity>;
    /// Newest committed batch id of this store (a directory), or of this
    /// process (a group member).
    fn last_committed(&self) -> Option<u64>;
    /// Id the next planned batch gets (for a re-run, the id it had).
    fn next_batch_id(&self) -> u64;
    /// Write `batch` ahead, durably, before any of its records is read.
    /// A re-run's ranges were written already; a directory checks them,
    /// a group records them under the new owner epochs.
    ///
    /// # Errors
    /// [`CheckpointError::Fenced`] (a directory: stop);
    /// [`CheckpointError::Group`] with [`group::GroupError::Fenced`] for a
    /// partition another member holds now (drop it and plan again);
    /// [`CheckpointError::Misuse`], [`CheckpointError::Io`].
    fn write_ahead(&self, batch: &Batch) -> Result<(), CheckpointError>;
    /// Commit `batch`, whose ranges are now applied (`done`: counts,
    /// timings, plugins, data loss). Returns the partitions another owner
    /// took meanwhile, not committed (their planned ranges are left to
    /// it; a directory's owner holds every partition or none, so it
    /// returns none: a newer epoch fails the whole commit).
    ///
    /// # Errors
    /// [`CheckpointError::Fenced`], [`CheckpointError::Group`],
    /// [`CheckpointError::Io`]; nothing is committed then.
    fn commit(&self, batch: &Batch, done: &CommitEntry) -> Result<Vec<Fenced>, CheckpointError>;
    /// Keep a component's bytes, by SHA-256 (idempotent). Returns the
    /// digest, lower-case hex.
    ///
    /// # Errors
    /// [`CheckpointError::Io`], [`CheckpointError::Group`].
    fn store_plugin(&self, bytes: &[u8]) -> Result<String, CheckpointError>;
    /// Read a stored component and verify its digest. Returns where it
    /// was read from (for messages) and its bytes.
    ///
    /// # Errors
    /// [`CheckpointError::Corrupt`] when missing or altered.
    fn load_plugin(&self, digest: &str) -> Result<(PathBuf, Vec<u8>), CheckpointError>;
    /// After a start that failed before any batch was planned: remove the
    /// store if this process created it, so a refused start leaves nothing
    /// that looks like a pipeline (a directory: see
    /// [`DirCheckpoint::discard_if_unused`]; a group keeps its rows, which
    /// other members share). Returns whether it removed anything.
    fn discard_if_unused(&self) -> bool {
        false
    }
    /// A pipeline group under exactly once to a topic: record `range` of
    /// `tp` applied under `epoch` by batch `batch`. These are offsets a
    /// part's Kafka transaction committed (the brokers hold them as the
    /// pipeline's input position) whose database commit did not follow:
    /// the member that ran the part stopped between the two. Fenced on
    /// `epoch`. Returns whether any offset was not recorded applied yet.
    ///
    /// # Errors
    /// [`CheckpointError::Group`] (fenced, the database);
    /// [`CheckpointError::Misuse`] for a directory, whose batches commit
    /// their outputs and positions in one transaction.
    fn record_committed(
        &self,
        tp: &(String, i32),
        epoch: Epoch,
        range: std::ops::Range<i64>,
        batch: u64,
    ) -> Result<bool, CheckpointError> {
        let _ = (epoch, batch);
        Err(CheckpointError::Misuse {
            dir: PathBuf::from(self.location()),
            reason: format!(
                "{}/{} [{}, {}): only a pipeline group records a part applied from its output transaction",
                tp.0, tp.1, range.start, range.end
            ),
        })
    }
}

#[cfg(test)]
mod tests;
