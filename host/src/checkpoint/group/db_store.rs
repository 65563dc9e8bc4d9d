//! [`DbStore`]: a pipeline group's checkpoint in the sink database behind
//! the checkpoint seam ([`Checkpoint`]). Each partition is claimed on its
//! own when the group coordinator assigns it (its owner epoch goes up);
//! the write-ahead records each planned range under its partition's
//! owner epoch, and the commit clears them, fenced the same way. What
//! was applied is read from the sink's progress rows
//! ([`AppliedProgress`]), in the claim's transaction.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{GroupError, GroupStore, Planned};
use crate::checkpoint::{
    AppliedProgress, Batch, Checkpoint, CheckpointError, Claimed, CommitEntry, Epoch, Fenced,
    Start, TopicIdentity,
};

/// A group member's view of the group's checkpoint.
pub struct DbStore {
    store: Arc<GroupStore>,
    progress: Arc<dyn AppliedProgress>,
    group: String,
    location: String,
    /// Who claims (pid and host), recorded with each claim.
    owner: String,
    /// The group had no partition rows when this member started.
    new_group: bool,
    /// The last batch this member committed (0: none).
    committed: AtomicU64,
    /// Topic identities as last planned by this member.
    identities: Mutex<BTreeMap<String, TopicIdentity>>,
}

impl DbStore {
    /// The checkpoint of the group `store` keeps, read and claimed by
    /// `owner` (pid and host); `progress` reads the sink's progress rows.
    /// `location` names the group and database for messages.
    ///
    /// # Errors
    /// [`GroupError::Db`].
    pub fn new(
        store: Arc<GroupStore>,
        progress: Arc<dyn AppliedProgress>,
        owner: String,
        location: String,
    ) -> Result<Self, GroupError> {
        // A group that adopted a checkpoint has positions (in its progress
        // rows) even before any partition was claimed.
        let new_group = store.partitions()?.is_empty() && store.adopted_from()?.is_none();
        let identities = store.topics()?;
        Ok(DbStore {
            group: store.group().to_string(),
            store,
            progress,
            location,
            owner,
            new_group,
            committed: AtomicU64::new(0),
            identities: Mutex::new(identities),
        })
    }

    /// The group's store.
    pub fn store(&self) -> &Arc<GroupStore> {
        &self.store
    }
}

impl Checkpoint for DbStore {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn query_id(&self) -> &str {
        &self.group
    }

    fn epoch(&self) -> Option<Epoch> {
        None
    }

    fn is_new(&self) -> bool {
        self.new_group
    }

    fn claim(
        &self,
        (topic, partition): &(String, i32),
        member: &str,
    ) -> Result<Claimed, CheckpointError> {
        // The progress is read in the claim's transaction, on the group
        // store's connection: the sink's may have a part's transaction
        // open (a claim comes from a rebalance during a batch).
        let (c, applied) =
            self.store
                .claim_reading(topic, *partition, (&self.owner, member), |b| {
                    let applied = self
                        .progress
                        .applied_on(b, &self.group, topic, *partition)
                        .map_err(|error| GroupError::Db {
                            group: self.group.clone(),
                            during: "reading the partition's progress (sluice_progress)",
                            error,
                        })?;
                    Ok((applied, applied.map(|(_, e)| e).unwrap_or_default()))
                })?;
        let start = match (c.planned, applied) {
            (Some(p), _) => Start::Rerun(p),
            (None, Some((end, _))) => Start::At(end),
            (None, None) => Start::New,
        };
        Ok(Claimed {
            epoch: c.epoch,
            start,
        })
    }

    /// As the group's store records them now (another member may have
    /// recorded a topic this member has not planned yet); what this member
    /// last knew when the store cannot be read.
    fn topic_identities(&self) -> BTreeMap<String, TopicIdentity> {
        let mut known = self.identities.lock().unwrap_or_else(|p| p.into_inner());
        match self.store.topics() {
            Ok(recorded) => {
                for (topic, identity) in recorded {
                    known.entry(topic).or_insert(identity);
                }
            }
            Err(e) => tracing::debug!("reading the group's topic identities: {e}"),
        }
        known.clone()
    }

    fn last_committed(&self) -> Option<u64> {
        match self.committed.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    fn next_batch_id(&self) -> u64 {
        self.committed.load(Ordering::Relaxed) + 1
    }

    fn write_ahead(&self, batch: &Batch) -> Result<(), CheckpointError> {
        let epoch = |t: &String, p: i32| {
            batch
                .epochs
                .get(&(t.clone(), p))
                .copied()
                .unwrap_or_default()
        };
        // Every start chosen at the high watermark is recorded, also past a
        // partition that is fenced meanwhile (the caller holds the others
        // at these starts from now on); the first refusal is returned.
        let mut refused = None;
        for r in &batch.entry.ranges {
            let latest = batch
                .started_latest
                .contains(&(r.topic.clone(), r.partition));
            if latest
                && let Err(e) = self.progress.start_at(
                    &self.group,
                    &r.topic,
                    r.partition,
                    epoch(&r.topic, r.partition),
                    r.start,
                )
            {
                refused.get_or_insert(e);
            }
        }
        if let Some(e) = refused {
            return Err(e.into());
        }
        let parts: Vec<(String, i32, Epoch, Planned)> = batch
            .entry
            .ranges
            .iter()
            .filter(|r| r.end > r.start)
            .map(|r| {
                (
                    r.topic.clone(),
                    r.partition,
                    epoch(&r.topic, r.partition),
                    Planned {
                        batch: batch.entry.batch_id,
                        start: r.start,
                        end: r.end,
                        plugins: batch.entry.plugins.clone(),
                    },
                )
            })
            .collect();
        self.store.plan(&parts)?;
        // The identities the planned positions belong to, recorded when
        // they change (first plan, more partitions), so that a member
        // started after the topic was deleted and created again refuses
        // it too.
        let mut known = self.identities.lock().unwrap_or_else(|p| p.into_inner());
        if *known != batch.entry.topics {
            let changed = batch
                .entry
                .topics
                .iter()
                .filter(|(t, i)| known.get(*t) != Some(*i))
                .map(|(t, i)| (t.clone(), Some(i.clone())))
                .collect();
            self.store.set_topics(&changed)?;
            known.clone_from(&batch.entry.topics);
        }
        Ok(())
    }

    fn commit(&self, batch: &Batch, done: &CommitEntry) -> Result<Vec<Fenced>, CheckpointError> {
        let parts: Vec<(String, i32, Epoch)> = batch
            .entry
            .ranges
            .iter()
            .filter(|r| r.end > r.start)
            .map(|r| {
                let tp = (r.topic.clone(), r.partition);
                let epoch = batch.epochs.get(&tp).copied().unwrap_or_default();
                (tp.0, tp.1, epoch)
            })
            .collect();
        let fenced = self.store.finish(done.batch_id, &parts)?;
        self.committed.store(done.batch_id, Ordering::Relaxed);
        Ok(fenced.iter().filter_map(GroupError::fenced).collect())
    }

    fn record_committed(
        &self,
        (topic, partition): &(String, i32),
        epoch: Epoch,
        range: std::ops::Range<i64>,
        batch: u64,
    ) -> Result<bool, CheckpointError> {
        // On the store's connection, like a claim: the sink's may have a
        // part's transaction open.
        Ok(self.store.tx(|b| {
            super::fence(
                b,
                self.store.tables(),
                &self.group,
                topic,
                *partition,
                epoch,
            )?;
            self.progress
                .record_applied_on(
                    b,
                    (&self.group, topic, *partition),
                    epoch,
                    range.clone(),
                    batch,
                )
                .map_err(|error| GroupError::Db {
                    group: self.group.clone(),
                    during: "recording a part its output transaction committed (sluice_progress)",
                    error,
                })
        })?)
    }

    fn store_plugin(&self, bytes: &[u8]) -> Result<String, CheckpointError> {
        Ok(self.store.store_plugin(bytes)?)
    }

    fn load_plugin(&self, digest: &str) -> Result<(PathBuf, Vec<u8>), CheckpointError> {
        let bytes = self
            .store
            .load_plugin(digest)
            .map_err(|e| CheckpointError::Corrupt {
                file: PathBuf::from(format!("sluice_group_plugins {digest}")),
                reason: e.to_string(),
            })?;
        Ok((
            PathBuf::from(format!("group {}: {digest}", self.group)),
            bytes,
        ))
    }
}
