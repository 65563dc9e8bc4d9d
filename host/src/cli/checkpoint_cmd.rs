//! `host checkpoint …`: read-only views of a checkpoint directory.

use clap::Subcommand;

use super::CliError;

/// `host checkpoint …` subcommands.
#[derive(Debug, Subcommand)]
pub enum CheckpointCommand {}

/// Run `host checkpoint …`.
///
/// # Errors
/// Exit 1 for a corrupt or unreadable checkpoint.
pub fn run(cmd: CheckpointCommand) -> Result<(), CliError> {
    match cmd {}
}
