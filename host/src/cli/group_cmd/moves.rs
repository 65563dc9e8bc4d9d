//! `host group adopt` and `host group disband`: a pipeline moves between
//! its two stores, exactly once, in one command each way (DESIGN.md, "One
//! engine, two stores").
//!
//! - **adopt**: a stopped pipeline that ran with `--checkpoint DIR` becomes
//!   pipeline group NAME. In one database transaction the group's row is
//!   made (topics, plugins, topic identities), the uncommitted batch's
//!   ranges (if any) become the partitions' ranges in flight, and the
//!   checkpoint's progress rows and dead letters become the group's. The
//!   directory is marked as moved before that transaction (`host run
//!   --checkpoint DIR` refuses it, naming the group), and its
//!   uncommitted batch is closed after it.
//! - **disband**: a stopped group becomes the pipeline of a checkpoint
//!   directory (a new one, or the one it was adopted from). The directory
//!   is marked as moving first, gets an entry with the group's positions
//!   (or, for ranges in flight, an uncommitted batch to run again with
//!   their bounds), under an epoch above every epoch the group wrote;
//!   then in one transaction the group records where it went, its
//!   partitions are fenced and its rows become the directory's; then the
//!   mark goes.
//!
//! Either command can be run again after a crash at any point: each step
//! sees what the previous run finished and goes on from there. Between
//! the steps, whichever store is not the pipeline's refuses to run it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;

use super::GroupDb;
use crate::capability::sql::{self, SqlGrant};
use crate::checkpoint::group::{Adopted, GroupStore, Planned};
use crate::checkpoint::{
    self, DirCheckpoint, Fingerprint, Moved, OffsetsEntry, OpenOptions, PartitionRange, Recovery,
    ResetRecord,
};
use crate::cli::{CliError, ExitCode, WithCode};
use crate::sink::SinkDriver;
use crate::util::now_ms;

/// Flags of `host group adopt`.
#[derive(Debug, Args)]
pub struct AdoptArgs {
    #[command(flatten)]
    db: GroupDb,
    /// The checkpoint directory of the pipeline to adopt. Its host must be
    /// stopped (SIGTERM: it commits the batch in flight and exits).
    #[arg(long, value_name = "DIR")]
    checkpoint: PathBuf,
}

/// Flags of `host group disband`.
#[derive(Debug, Args)]
pub struct DisbandArgs {
    #[command(flatten)]
    db: GroupDb,
    /// The checkpoint directory that takes the pipeline over: a new one,
    /// or the one the group adopted. Every member must be stopped.
    #[arg(long, value_name = "DIR")]
    checkpoint: PathBuf,
}

/// The sink database of `db`, as the SQL capability.
fn connect(db: &GroupDb) -> Result<SqlGrant, CliError> {
    SqlGrant::connect_with(&db.sink_db, db.sink_db_password_file.as_deref())
        .and_then(|g| g.set_host_schema(db.sink_schema.clone()).map(|()| g))
        .map_err(|e| anyhow!("sink database {}: {e}", db.shown()))
        .code(ExitCode::Failed)
}

/// Open the checkpoint at `dir` (its owner stopped), whatever its mark.
fn open_dir(dir: &std::path::Path, options: OpenOptions) -> Result<DirCheckpoint, CliError> {
    DirCheckpoint::open(
        dir,
        &OpenOptions {
            allow_moved: true,
            ..options
        },
    )
    .map_err(|e| {
        let code = if e.is_owned() {
            ExitCode::Owned
        } else {
            ExitCode::Failed
        };
        CliError {
            code,
            error: anyhow!("{e}; stop its host first (SIGTERM: it commits the batch in flight)"),
        }
    })
}

/// Run `host group adopt`.
///
/// # Errors
/// Exit 3 while the checkpoint's host runs; 2 for a checkpoint that
/// moved to another group, records no plugins, or a group that exists
/// and runs; 1 when a database or file operation fails (run it again).
pub(super) fn adopt(a: AdoptArgs) -> Result<(), CliError> {
    let group = a.db.group.clone();
    let url = a.db.shown();
    let status = checkpoint::status(&a.checkpoint).code(ExitCode::Usage)?;
    let mut cp = open_dir(
        &a.checkpoint,
        OpenOptions {
            topics: status.metadata.fingerprint.topics.clone(),
            create: false,
            ..OpenOptions::default()
        },
    )?;
    // Read again under the lock: what the adopt works from.
    let status = checkpoint::status(&a.checkpoint).code(ExitCode::Usage)?;
    // A marker naming this group is an earlier adopt's (finished, or
    // killed after it wrote the marker): its steps are run again, each
    // doing only what is left. Any other is someone else's move.
    let marked = checkpoint::moved_marker(&a.checkpoint)?;
    if let Some(m) = &marked
        && (m.group != group || m.moving_here)
    {
        return Err(anyhow!(
            "checkpoint {}: {}",
            a.checkpoint.display(),
            if m.moving_here {
                format!("a `host group disband` of group {} into it is not finished: run that command again", m.group)
            } else {
                format!("its pipeline moved to {} already", m.to)
            }
        ))
        .code(ExitCode::Usage);
    }
    // The uncommitted batch is handed to the group as it was planned: on
    // the sink it was planned against (a re-run elsewhere could apply
    // records twice).
    let here = sql::sink_identity_in(&a.db.sink_db, a.db.sink_schema.as_deref()).ok();
    if let (Some(planned), Some(here)) = (
        status
            .last_planned
            .as_ref()
            .and_then(|e| e.sink_db.as_ref()),
        &here,
    ) && planned.replace(":***@", "@") != here.replace(":***@", "@")
    {
        return Err(anyhow!(
            "checkpoint {} ran against sink database {planned}, not {here} (`#schema=` is --sink-schema): its progress rows are there. Adopt it into a group on that database",
            a.checkpoint.display()
        ))
        .code(ExitCode::Usage);
    }
    let (positions, reruns, plugins) = match cp.recovery() {
        Recovery::Resume {
            positions, plugins, ..
        } => (positions.clone(), BTreeMap::new(), plugins.clone()),
        Recovery::Rerun { entry } => {
            let mut positions = BTreeMap::new();
            let mut reruns = BTreeMap::new();
            for r in &entry.ranges {
                let tp = (r.topic.clone(), r.partition);
                if r.end > r.start {
                    reruns.insert(
                        tp,
                        Planned {
                            batch: entry.batch_id,
                            start: r.start,
                            end: r.end,
                            plugins: entry.plugins.clone(),
                        },
                    );
                } else {
                    positions.insert(tp, r.start);
                }
            }
            (positions, reruns, entry.plugins.clone())
        }
    };
    // The last commit of an abandoned batch or a reset records none: the
    // newest write-ahead entry does.
    let plugins = if plugins.is_empty() {
        status
            .last_planned
            .as_ref()
            .map(|e| e.plugins.clone())
            .unwrap_or_default()
    } else {
        plugins
    };
    if plugins.is_empty() {
        return Err(anyhow!(
            "checkpoint {} records no plugins (it never ran a batch): start the group with `host run --group {group} --plugin FILE …` instead",
            a.checkpoint.display()
        ))
        .code(ExitCode::Usage);
    }
    let grant = connect(&a.db)?;
    let store = GroupStore::open(
        &a.db.sink_db,
        a.db.sink_db_password_file.as_deref(),
        &grant.host_schema(),
        &group,
    )?;
    // A group that adopted this checkpoint and has since gone to another
    // directory holds newer positions than this one: adopting it again
    // would go back to these.
    let here_dir = std::path::absolute(&a.checkpoint).unwrap_or_else(|_| a.checkpoint.clone());
    if store.adopted_from()?.as_deref() == Some(cp.query_id())
        && let Some(to) = store.moved_to()?
        && to != format!("checkpoint {}", here_dir.display())
    {
        return Err(anyhow!(
            "group {group} adopted this checkpoint and has since moved to {to}: its positions are there, this directory's are stale. Adopt that directory instead"
        ))
        .code(ExitCode::Usage);
    }
    for r in &plugins {
        let (_, bytes) = cp.load_plugin(&r.digest)?;
        store.store_plugin(&bytes)?;
    }
    let driver = SinkDriver::new(Some(grant)).map_err(|e| anyhow!("{url}: {e}"))?;
    let fingerprint = Fingerprint::new(&status.metadata.fingerprint.topics);
    let query_id = cp.query_id().to_string();
    let adopted = Adopted {
        query_id: &query_id,
        fingerprint: &fingerprint,
        plugins: &plugins,
        topics: cp.topic_identities(),
        epoch: cp.epoch(),
        reruns: &reruns,
    };
    // Marked first: from here until the group holds the rows, `host run
    // --checkpoint` is refused; a run of this command again finishes.
    cp.mark_moved(&Moved {
        group: group.clone(),
        to: format!("pipeline group {group} in {url}"),
        at_ms: now_ms(),
        moving_here: false,
    })?;
    crate::util::failpoint("adopt:after-mark");
    let changed = driver
        .adopt_into_group(store.tables(), &group, &adopted, &positions)
        .inspect_err(|_| {
            // The pipeline stays here only if this run marked the
            // directory and the group does not hold it (the transaction
            // did not commit, as far as the database says now).
            let held = store.adopted_from().ok().flatten().as_deref() == Some(&query_id)
                && store.moved_to().ok().flatten().is_none();
            if marked.is_none()
                && !held
                && let Err(c) = cp.clear_moved()
            {
                tracing::error!("{c}");
            }
        })
        .map_err(|e| match e {
            crate::sink::SinkError::Group(
                g @ crate::checkpoint::group::GroupError::Exists { .. },
            ) => CliError {
                code: ExitCode::Usage,
                error: g.into(),
            },
            other => CliError {
                code: ExitCode::Failed,
                error: anyhow!("{other}; nothing was moved: run the same command again"),
            },
        })?;
    crate::util::failpoint("adopt:after-db");
    // The group runs the uncommitted batch's ranges now: close it here.
    if !reruns.is_empty() {
        cp.abandon(format!(
            "its ranges moved to pipeline group {group} (host group adopt), which runs them again"
        ))?;
    }
    outln!(
        "checkpoint {} (query id {query_id}) is now pipeline group {group} in {url}{}",
        a.checkpoint.display(),
        if changed {
            ""
        } else {
            " (its rows had moved already)"
        }
    )?;
    outln!(
        "  {} partition position(s), {} range(s) in flight to run again, plugins [{}]",
        positions.len() + reruns.len(),
        reruns.len(),
        plugins
            .iter()
            .map(|p| format!(
                "{:?} sha256:{}",
                p.stage,
                &p.digest[..12.min(p.digest.len())]
            ))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    outln!(
        "start its members (no --plugin: they run the group's) with\n  {}",
        run_command(&["--group", &group], &a.db, &fingerprint.topics)
    )?;
    Ok(())
}

/// Run `host group disband`.
///
/// # Errors
/// Exit 3 while a member is live; 2 for a directory that holds another
/// pipeline, or a group that moved elsewhere; 1 when a database or file
/// operation fails (run it again).
pub(super) fn disband(a: DisbandArgs) -> Result<(), CliError> {
    let group = a.db.group.clone();
    let url = a.db.shown();
    let dir = std::path::absolute(&a.checkpoint).unwrap_or_else(|_| a.checkpoint.clone());
    let to = format!("checkpoint {}", dir.display());
    let o = a.db.open()?;
    // Made by an older host, the group's row may lack the columns a move
    // writes: opening the store adds them.
    let store = GroupStore::open(
        &a.db.sink_db,
        a.db.sink_db_password_file.as_deref(),
        &o.grant.host_schema(),
        &group,
    )?;
    let moved = {
        let mut s = o.grant.lock();
        crate::checkpoint::group::moved_to(s.backend(), store.tables(), &group)?
    };
    let marker = checkpoint::moved_marker(&dir).ok().flatten();
    if let Some(where_) = &moved {
        if *where_ != to {
            return Err(anyhow!(
                "group {group}: its pipeline moved to {where_} already"
            ))
            .code(ExitCode::Usage);
        }
        // The rows moved; only the directory's mark may be left.
        let ours = marker
            .as_ref()
            .is_some_and(|m| m.group == group && m.moving_here);
        if ours {
            let cp = open_dir(
                &dir,
                OpenOptions {
                    topics: o.fingerprint.topics.clone(),
                    create: false,
                    ..OpenOptions::default()
                },
            )?;
            cp.clear_moved()?;
        }
        outln!(
            "pipeline group {group} in {url} is now the pipeline of {to} ({})",
            if ours {
                "its rows had moved already; this run finished the move"
            } else {
                "it was disbanded already; nothing to do"
            }
        )?;
        return Ok(());
    }
    let now = now_ms();
    let live: Vec<String> = o
        .store
        .live_members(now)?
        .into_iter()
        .map(|m| m.member)
        .collect();
    if !live.is_empty() {
        return Err(anyhow!(
            "group {group} has live members ({}): stop them first (SIGTERM: each commits its batch and leaves)",
            live.join(", ")
        ))
        .code(ExitCode::Owned);
    }
    // A directory of another pipeline is refused; one this command made
    // and was killed in before it marked it (metadata, no batch) is fine.
    let fresh = checkpoint::status(&dir).is_ok_and(|s| s.last_planned.is_none())
        && marker.as_ref().is_none_or(|m| m.group == group);
    if checkpoint::exists(&dir) && !fresh && marker.as_ref().is_none_or(|m| m.group != group) {
        return Err(anyhow!(
            "{} is the checkpoint of another pipeline: give a new directory, or the one group {group} adopted",
            dir.display()
        ))
        .code(ExitCode::Usage);
    }

    // Where the group is: the end each progress row shows applied, and
    // the ranges in flight.
    let driver = SinkDriver::new(Some(o.grant.clone())).map_err(|e| anyhow!("{url}: {e}"))?;
    let applied = driver.progress_rows(&group)?;
    let rows = o.store.partitions()?;
    if let Some(r) = rows.iter().find(|r| r.planned_unreadable.is_some()) {
        return Err(anyhow!(
            "group {group}: the range in flight of {}/{} cannot be read; mend it with `host group reset` first",
            r.topic,
            r.partition
        ))
        .code(ExitCode::Usage);
    }
    let floor = rows
        .iter()
        .map(|r| r.owner_epoch.next())
        .chain([driver.progress_epoch(&group)?])
        .max()
        .unwrap_or_default();
    let mut cp = open_dir(
        &dir,
        OpenOptions {
            topics: o.fingerprint.topics.clone(),
            allow_fingerprint_change: true,
            min_epoch: floor,
            ..OpenOptions::default()
        },
    )?;
    cp.mark_moved(&Moved {
        group: group.clone(),
        to: format!("pipeline group {group} in {url}"),
        at_ms: now,
        moving_here: true,
    })?;
    // A batch left uncommitted here is an earlier attempt's (adopt closes
    // the directory's own): its ranges are written again below.
    if matches!(cp.recovery(), Recovery::Rerun { .. }) {
        cp.abandon("superseded by a repeated host group disband".into())?;
    }
    for p in &o.plugins {
        cp.store_plugin(&o.store.load_plugin(&p.digest)?)?;
    }
    let positions: BTreeMap<(String, i32), i64> = applied
        .iter()
        .filter_map(|(tp, a)| a.end().map(|e| (tp.clone(), e)))
        .collect();
    let in_flight: BTreeMap<(String, i32), (i64, i64)> = rows
        .iter()
        .filter_map(|r| {
            r.planned
                .as_ref()
                .map(|p| ((r.topic.clone(), r.partition), (p.start, p.end)))
        })
        .collect();
    let note = format!("moved from pipeline group {group} in {url} (host group disband)");
    let sink_db = sql::sink_identity_in(&a.db.sink_db, a.db.sink_schema.as_deref()).ok();
    let topics = o.store.topics()?;
    if in_flight.is_empty() {
        cp.reset(
            &positions,
            o.plugins.clone(),
            ResetRecord {
                note,
                topics,
                sink_db,
            },
        )?;
    } else {
        // The ranges in flight run again with their bounds (the same
        // idempotency keys): an uncommitted batch, with every other
        // partition at its position.
        let mut ranges: BTreeMap<(String, i32), PartitionRange> = positions
            .iter()
            .map(|((t, p), e)| {
                (
                    (t.clone(), *p),
                    PartitionRange {
                        topic: t.clone(),
                        partition: *p,
                        start: *e,
                        end: *e,
                    },
                )
            })
            .collect();
        for ((t, p), (start, end)) in &in_flight {
            ranges.insert(
                (t.clone(), *p),
                PartitionRange {
                    topic: t.clone(),
                    partition: *p,
                    start: *start,
                    end: *end,
                },
            );
        }
        cp.append_offsets(&OffsetsEntry {
            batch_id: cp.next_batch_id(),
            epoch: cp.epoch(),
            planned_at_ms: now,
            ranges: ranges.into_values().collect(),
            plugins: o.plugins.clone(),
            config_digest: String::new(),
            note: Some(note),
            topics,
            sink_db,
            output: None,
        })?;
    }
    crate::util::failpoint("disband:after-dir");
    driver
        .disband_group(o.store.tables(), &group, cp.query_id(), &to, cp.epoch())
        .map_err(|e| anyhow!("{e}; the group is unchanged: run the same command again"))?;
    crate::util::failpoint("disband:after-db");
    cp.clear_moved()?;
    outln!(
        "pipeline group {group} in {url} is now the pipeline of {to} (query id {}, epoch {})",
        cp.query_id(),
        cp.epoch()
    )?;
    outln!(
        "  {} partition position(s), {} range(s) in flight to run again",
        positions.len(),
        in_flight.len()
    )?;
    outln!(
        "start it (no --plugin: it runs the plugins the group ran) with\n  {}",
        run_command(
            &["--checkpoint", &dir.display().to_string()],
            &a.db,
            &o.fingerprint.topics
        )
    )?;
    Ok(())
}

/// The `host run` command line of the pipeline in its new store (`store`:
/// `--group NAME` or `--checkpoint DIR`), for the user to copy.
fn run_command(store: &[&str], db: &GroupDb, topics: &[String]) -> String {
    let word = crate::engine::shell_word;
    let mut cmd = format!("host run {} {}", store[0], word(store[1]));
    cmd.push_str(&format!(" --sink-db {}", word(&db.shown())));
    if let Some(s) = &db.sink_schema {
        cmd.push_str(&format!(" --sink-schema {}", word(s)));
    }
    if let Some(f) = &db.sink_db_password_file {
        cmd.push_str(&format!(
            " --sink-db-password-file {}",
            word(&f.display().to_string())
        ));
    }
    cmd.push_str(" --brokers SERVERS");
    for t in topics {
        cmd.push_str(&format!(" --topic {}", word(t)));
    }
    cmd
}
