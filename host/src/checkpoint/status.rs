//! A read-only view of a checkpoint for `host checkpoint show` and
//! `host status`: works while another process owns it (takes no lock,
//! writes nothing).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::dir::read_metadata;
use super::recovery::analyze;
use super::{
    CheckpointError, CommitEntry, Epoch, Metadata, OffsetsEntry, OwnerInfo, Recovery, lock,
};

/// What `host checkpoint show` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// The directory.
    pub dir: PathBuf,
    /// Metadata.
    pub metadata: Metadata,
    /// The live owner, if the lock is held.
    pub owner: Option<OwnerInfo>,
    /// Last issued epoch.
    pub epoch: Epoch,
    /// Newest write-ahead entry.
    pub last_planned: Option<OffsetsEntry>,
    /// Newest commit entry.
    pub last_committed: Option<CommitEntry>,
    /// `resume` (next batch is new) or `rerun` (newest batch uncommitted).
    pub next_action: String,
    /// Id of the next batch to run (new or re-run).
    pub next_batch: u64,
    /// Digests in the plugin store.
    pub stored_plugins: Vec<String>,
    /// A torn newest entry the next owner will discard.
    pub torn_entry: Option<String>,
}

/// Read the checkpoint at `dir` without locking or writing.
///
/// # Errors
/// [`CheckpointError::NotACheckpoint`], [`CheckpointError::Corrupt`],
/// [`CheckpointError::Io`].
pub fn status(dir: &Path) -> Result<Status, CheckpointError> {
    let metadata = read_metadata(dir)?.ok_or_else(|| CheckpointError::NotACheckpoint {
        dir: dir.to_path_buf(),
    })?;
    let epoch = lock::read_epoch(dir).map_err(|e| CheckpointError::Corrupt {
        file: dir.join("epoch"),
        reason: e.to_string(),
    })?;
    let owned = lock::is_owned(dir).map_err(|source| CheckpointError::Io {
        path: dir.join("lock"),
        op: "probe lock",
        source,
    })?;
    let owner = if owned { lock::read_owner(dir) } else { None };
    let analysis = analyze(dir, epoch)?;
    let (next_action, next_batch) = match &analysis.recovery {
        Recovery::Resume { next_batch, .. } => ("resume", *next_batch),
        Recovery::Rerun { entry } => ("rerun", entry.batch_id),
    };
    let mut stored_plugins: Vec<String> = std::fs::read_dir(dir.join("plugins"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.len() == 64 && n.chars().all(|c| c.is_ascii_hexdigit()))
                .collect()
        })
        .unwrap_or_default();
    stored_plugins.sort();
    Ok(Status {
        dir: dir.to_path_buf(),
        metadata,
        owner,
        epoch,
        last_planned: analysis.last_planned,
        last_committed: analysis.last_committed,
        next_action: next_action.to_string(),
        next_batch,
        stored_plugins,
        torn_entry: analysis.torn.map(|(id, e)| format!("offsets/{id}: {e}")),
    })
}
