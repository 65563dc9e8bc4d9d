//! `host swap` and `host status`: talk to the running owner over its
//! control socket.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use super::{CliError, ExitCode, WithCode, parse_duration};
use crate::checkpoint::{self, StageKind};
use crate::control::protocol::{Command, StatusAnswer, SwapAnswer};
use crate::control::{Client, ClientError};
use crate::util::rfc3339_ms;

/// Flags of `host swap`.
#[derive(Debug, Args)]
pub struct SwapArgs {
    /// Checkpoint directory of the running pipeline.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: PathBuf,
    /// The new plugin component.
    #[arg(long, value_name = "FILE")]
    pub plugin: PathBuf,
    /// Which stage to replace (default: every stage the new plugin exports).
    #[arg(long, value_enum)]
    pub stage: Option<SwapStage>,
    /// Which map stage (0-based) when the pipeline has several.
    #[arg(long, value_name = "N")]
    pub index: Option<usize>,
    /// How long to wait for the owner's answer (it answers at the next
    /// batch boundary).
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// Stage kinds for `--stage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SwapStage {
    /// A map stage.
    Map,
    /// The sink stage.
    Sink,
}

/// Run `host swap`.
///
/// # Errors
/// Exit 1 when the owner rejects the plugin (the old one keeps running) or
/// nobody owns the checkpoint.
pub fn swap(args: SwapArgs) -> Result<(), CliError> {
    let path = std::fs::canonicalize(&args.plugin)
        .map_err(|e| anyhow::anyhow!("plugin {}: {e}", args.plugin.display()))
        .code(ExitCode::Usage)?;
    let stage = args.stage.map(|s| match s {
        SwapStage::Map => StageKind::Map,
        SwapStage::Sink => StageKind::Sink,
    });
    let mut client = Client::connect(&args.checkpoint, args.timeout)?;
    let answer: Result<SwapAnswer, _> = client.request(&Command::Swap {
        path,
        stage,
        index: args.index,
    });
    match answer {
        Ok(a) => {
            outln!(
                "swapped in sha256:{} from batch {}",
                a.digest,
                a.effective_batch
            )?;
            Ok(())
        }
        Err(ClientError::Refused(reason)) => Err(CliError {
            code: ExitCode::Failed,
            error: anyhow::anyhow!("swap rejected, the running plugin is unchanged: {reason}"),
        }),
        Err(ClientError::Timeout { timeout, .. }) => Err(CliError {
            code: ExitCode::Failed,
            error: anyhow::anyhow!(
                "no answer within {} s; the swap is still queued and may take effect at the next batch boundary: check `host status`",
                timeout.as_secs()
            ),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Flags of `host status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Checkpoint directory.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: PathBuf,
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
    let live = match Client::connect(&args.checkpoint, Duration::from_secs(5))
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
    let on_disk = checkpoint::status(&args.checkpoint)?;
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
                let lag: i64 = p["partitions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|x| x["lag"].as_i64().unwrap_or(0))
                    .sum();
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
