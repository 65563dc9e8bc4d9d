//! [`DirStore`]: a checkpoint directory behind the checkpoint seam
//! ([`Checkpoint`]). The directory is claimed as a whole when it is
//! opened (lock and epoch, [`DirCheckpoint::open`]); every partition's
//! claim returns that epoch and the position recovery found: the end of
//! the last committed batch, or the range of the uncommitted batch to
//! run again.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use super::{
    Batch, Checkpoint, CheckpointError, Claimed, CommitEntry, DirCheckpoint, Epoch, Fenced,
    Planned, Recovery, Start, TopicIdentity,
};

/// A claimed checkpoint directory, shared by the batch loop and the
/// planner (writes are serialized by a mutex; only the loop writes).
pub struct DirStore {
    cp: Mutex<DirCheckpoint>,
    location: String,
    query_id: String,
    epoch: Epoch,
    recovery: Recovery,
}

impl DirStore {
    /// Wrap an opened (claimed) directory.
    pub fn new(cp: DirCheckpoint) -> Self {
        DirStore {
            location: cp.location(),
            query_id: cp.query_id().to_string(),
            epoch: cp.epoch(),
            recovery: cp.recovery().clone(),
            cp: Mutex::new(cp),
        }
    }

    fn cp(&self) -> MutexGuard<'_, DirCheckpoint> {
        self.cp.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where processing continued when the directory was opened.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// The partitions recovery knows a position of (or a range to run
    /// again): claim these before the first plan.
    pub fn known_partitions(&self) -> Vec<(String, i32)> {
        match &self.recovery {
            Recovery::Resume { positions, .. } => positions.keys().cloned().collect(),
            Recovery::Rerun { entry } => entry
                .ranges
                .iter()
                .map(|r| (r.topic.clone(), r.partition))
                .collect(),
        }
    }

    /// Give the directory up: its lock is released when the returned
    /// checkpoint is dropped.
    pub fn into_inner(self) -> DirCheckpoint {
        self.cp.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

impl Checkpoint for DirStore {
    fn discard_if_unused(&self) -> bool {
        self.cp().discard_if_unused()
    }

    fn location(&self) -> String {
        self.location.clone()
    }

    fn query_id(&self) -> &str {
        &self.query_id
    }

    fn epoch(&self) -> Option<Epoch> {
        Some(self.epoch)
    }

    fn is_new(&self) -> bool {
        matches!(&self.recovery, Recovery::Resume { next_batch: 0, positions, .. } if positions.is_empty())
    }

    fn claim(&self, tp: &(String, i32), _member: &str) -> Result<Claimed, CheckpointError> {
        let start = match &self.recovery {
            Recovery::Resume { positions, .. } => {
                positions.get(tp).map_or(Start::New, |p| Start::At(*p))
            }
            Recovery::Rerun { entry } => {
                let committed = self.cp().last_committed() >= Some(entry.batch_id);
                match entry
                    .ranges
                    .iter()
                    .find(|r| r.topic == tp.0 && r.partition == tp.1)
                {
                    // Once the re-run committed, its ends are the position.
                    Some(r) if committed => Start::At(r.end),
                    Some(r) => Start::Rerun(Planned {
                        batch: entry.batch_id,
                        start: r.start,
                        end: r.end,
                        plugins: entry.plugins.clone(),
                    }),
                    None => Start::New,
                }
            }
        };
        Ok(Claimed {
            epoch: self.epoch,
            start,
        })
    }

    fn topic_identities(&self) -> BTreeMap<String, TopicIdentity> {
        self.cp().topic_identities().clone()
    }

    fn last_committed(&self) -> Option<u64> {
        self.cp().last_committed()
    }

    fn next_batch_id(&self) -> u64 {
        self.cp().next_batch_id()
    }

    fn write_ahead(&self, batch: &Batch) -> Result<(), CheckpointError> {
        let mut cp = self.cp();
        if !batch.rerun {
            return cp.append_offsets(&batch.entry);
        }
        // A re-run's entry is on disk already: it must be the batch
        // recovery found uncommitted, with the same ranges.
        match &self.recovery {
            Recovery::Rerun { entry }
                if entry.batch_id == batch.entry.batch_id
                    && sorted(&entry.ranges) == sorted(&batch.entry.ranges)
                    && cp.last_committed() < Some(entry.batch_id) =>
            {
                Ok(())
            }
            _ => Err(CheckpointError::Misuse {
                dir: PathBuf::from(&self.location),
                reason: format!(
                    "batch {} is not the uncommitted batch recovery found, or its ranges differ",
                    batch.entry.batch_id
                ),
            }),
        }
    }

    fn commit(&self, _batch: &Batch, done: &CommitEntry) -> Result<Vec<Fenced>, CheckpointError> {
        self.cp().commit(done)?;
        Ok(Vec::new())
    }

    fn store_plugin(&self, bytes: &[u8]) -> Result<String, CheckpointError> {
        self.cp().store_plugin(bytes)
    }

    fn load_plugin(&self, digest: &str) -> Result<(PathBuf, Vec<u8>), CheckpointError> {
        self.cp().load_plugin(digest)
    }
}

/// `ranges` in (topic, partition) order.
fn sorted(ranges: &[crate::checkpoint::PartitionRange]) -> Vec<crate::checkpoint::PartitionRange> {
    let mut v = ranges.to_vec();
    v.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    v
}
