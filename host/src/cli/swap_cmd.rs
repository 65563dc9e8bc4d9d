//! `host swap`: hand a running owner a new plugin over its control
//! socket.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{CliError, ExitCode, WithCode, parse_duration};
use crate::checkpoint::StageKind;
use crate::control::protocol::{Command, SwapAnswer};
use crate::control::{Client, ClientError};

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
