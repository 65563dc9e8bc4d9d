//! Recovery: read the entry directories, without side effects, and decide
//! where processing continues ([`Recovery`]): resume after the last
//! committed batch, or re-run the planned, uncommitted one with its exact
//! ranges. The one repair allowed (a torn, uncommitted newest offsets
//! entry) is reported here and done by the opener.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use super::entry::{self, CommitEntry, EnvelopeError, OffsetsEntry};
use super::{CheckpointError, Epoch, Recovery, fsio, io_err};

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

pub(super) fn list_ids(dir: &Path) -> Result<BTreeSet<u64>, CheckpointError> {
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
    let bytes = super::trust::read(path).map_err(io_err(path, "read entry"))?;
    Ok(entry::decode(kind, &bytes))
}

/// Read the entry directories and decide where processing continues.
pub(super) fn analyze(dir: &Path, current_epoch: Epoch) -> Result<Analysis, CheckpointError> {
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
