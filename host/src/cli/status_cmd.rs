//! `host status`: a single host's view (its control socket when it runs,
//! else its checkpoint directory), or a pipeline group's (each member's
//! own view as its heartbeat recorded it, and the group's, from the sink
//! database).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use super::CliError;
use crate::checkpoint::{self, StageKind};
use crate::control::protocol::{Command, StatusAnswer};
use crate::control::{Client, ClientError};
use crate::util::rfc3339_ms;

/// Flags of `host status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Checkpoint directory (a single host).
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "group",
        conflicts_with = "group"
    )]
    pub checkpoint: Option<PathBuf>,
    /// A pipeline group instead: each member's own view (recorded every
    /// 5 s) and the group's, from its sink database (`--sink-db`).
    #[arg(long, value_name = "NAME", requires = "sink_db")]
    pub group: Option<String>,
    /// The group's sink database (`sqlite:PATH` or `postgres://…`).
    #[arg(long, value_name = "URL", value_parser = crate::cli::SinkDbUrl)]
    pub sink_db: Option<String>,
    /// File whose first line is the database's password (PostgreSQL).
    #[arg(long, value_name = "FILE")]
    pub sink_db_password_file: Option<PathBuf>,
    /// PostgreSQL schema of the host's tables [default: public].
    #[arg(long, value_name = "SCHEMA")]
    pub sink_schema: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Run `host status`: the live owner's view when one runs, else the
/// checkpoint's.
///
/// # Errors
/// Exit 1 for an unreadable checkpoint.
pub fn status(args: StatusArgs) -> Result<(), CliError> {
    let (Some(checkpoint), None) = (&args.checkpoint, &args.group) else {
        let db = crate::cli::group_cmd::GroupDb {
            sink_db: args.sink_db.unwrap_or_default(),
            group: args.group.unwrap_or_default(),
            sink_db_password_file: args.sink_db_password_file,
            sink_schema: args.sink_schema,
        };
        return crate::cli::group_cmd::status::show(&db, None, args.json);
    };
    let live = match Client::connect(checkpoint, Duration::from_secs(5))
        .and_then(|mut c| c.request::<StatusAnswer>(&Command::Status))
    {
        Ok(a) => Some(a.status),
        Err(ClientError::NotRunning { .. }) => None,
        // An owner that answers wrongly (another host version, say) is
        // still an owner: say so, then show the checkpoint's view.
        Err(e) => {
            tracing::warn!("the owner's control socket did not answer as expected: {e}");
            None
        }
    };
    let on_disk = checkpoint::status(checkpoint)?;
    if args.json {
        // `owner`: "answering" (live holds its status), "not answering"
        // (the lock is held, control.sock is silent: a stopped or hung
        // owner, or another version) or "none".
        let owner = match (&live, &on_disk.owner) {
            (Some(_), _) => "answering",
            (None, Some(_)) => "not answering",
            (None, None) => "none",
        };
        let v = json!({
            "running": live.is_some() || on_disk.owner.is_some(),
            "owner": owner,
            "live": live,
            "checkpoint": on_disk,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    match &live {
        Some(s) => {
            outln!(
                "owner       pid {} on {} since {} (epoch {})",
                s.pid,
                s.hostname,
                rfc3339_ms(s.since_ms),
                s.epoch
            )?;
            match s.current_batch {
                Some(b) => outln!("current     batch {b} in flight")?,
                None => outln!("current     between batches")?,
            }
            match s.last_committed {
                Some(b) => outln!("committed   batch {b}")?,
                None => outln!("committed   none yet")?,
            }
            for p in &s.plugins {
                let stage = match p.stage {
                    StageKind::Map => "map",
                    StageKind::Sink => "sink",
                };
                outln!("plugin      {stage} sha256:{}", p.digest)?;
            }
            if let Some(o) = &s.output {
                outln!("output      {o}")?;
            }
            if let Some(p) = s.last_progress.as_ref().and_then(|p| p.as_object()) {
                outln!(
                    "last batch  {} at {}: {} in, {} out, {} rows/s, {} ms",
                    p["batch_id"],
                    p["committed_at"].as_str().unwrap_or_default(),
                    p["counts"]["input"],
                    p["counts"]["output"],
                    p["rows_per_sec"],
                    p["total_ms"]
                )?;
                let lag = s
                    .last_progress
                    .as_ref()
                    .map_or(0, crate::cli::group_cmd::status::total_lag);
                outln!("lag         {lag} records")?;
            }
        }
        None => match &on_disk.owner {
            // The lock is held but nobody answers on control.sock: the
            // owner is frozen (SIGSTOP), busy past 5 s, or another
            // version.
            Some(o) => outln!(
                "owner       {} holds the lock but does not answer on control.sock (stopped, hung, or another host version); `checkpoint show` reads the files",
                o.describe()
            )?,
            None => outln!("owner       none (not running)")?,
        },
    }
    if live.is_none()
        && let Some(o) = on_disk
            .last_planned
            .as_ref()
            .and_then(|e| e.output.as_ref())
    {
        outln!("output      {o} (the last planned batch's)")?;
    }
    outln!("epoch       {} (last issued)", on_disk.epoch)?;
    if let Some(c) = &on_disk.last_committed {
        outln!(
            "checkpoint  last committed batch {} ({})",
            c.batch_id,
            rfc3339_ms(c.committed_at_ms)
        )?;
    }
    Ok(())
}
