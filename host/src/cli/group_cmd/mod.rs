//! `host group …`: a pipeline group's checkpoint in the sink database,
//! looked at (`status`) and acted on (`swap`, `reset`), and a pipeline
//! moved between a checkpoint directory and a group (`adopt`, `disband`).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{CliError, ExitCode, WithCode};
use crate::capability::sql::{self, SqlGrant};
use crate::checkpoint::group::GroupStore;
use crate::checkpoint::{Fingerprint, PluginRef};

mod moves;
mod reset;
pub(super) mod status;
mod swap;

/// `host group …` subcommands.
#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// Show a pipeline group: its topics and plugins, its members (what
    /// each runs, when it was last seen), and each partition's owner, owner
    /// epoch, when it was claimed, the range in flight and the end
    /// applied. Read-only.
    Status(status::StatusArgs),
    /// Give every member of a running group a new plugin: it is stored in
    /// the group's tables, each member compiles it off its batch path and
    /// installs it at its next batch boundary (the parts' write-ahead
    /// records the new digest); members that join later start with it.
    /// Waits for the live members' answers.
    Swap(swap::SwapArgs),
    /// Move a stopped pipeline group to other offsets: its partitions'
    /// progress rows move in one transaction, the batches in flight are
    /// abandoned, each partition's owner epoch goes up, and the reset is
    /// recorded in `sluice_group_resets`. Refused while members are live
    /// (unless --force).
    Reset(reset::GroupResetArgs),
    /// Make a stopped pipeline that ran with `--checkpoint DIR` this
    /// pipeline group, exactly once: its progress rows, ranges in flight,
    /// plugins and topics become the group's in one transaction, and the
    /// directory is marked as moved (`host run --checkpoint DIR` then
    /// refuses it and names the group).
    Adopt(moves::AdoptArgs),
    /// Make a stopped pipeline group the pipeline of a checkpoint
    /// directory (a new one, or the one it adopted), exactly once: its
    /// positions and ranges in flight are written there, and its progress
    /// rows become the directory's; members are refused from then on.
    Disband(moves::DisbandArgs),
}

/// Which group, in which database.
#[derive(Debug, Args)]
pub struct GroupDb {
    /// The group's sink database (`sqlite:PATH` or `postgres://…`).
    #[arg(long, value_name = "URL", value_parser = crate::cli::SinkDbUrl)]
    pub sink_db: String,
    /// The pipeline group's name (`host run --group NAME`).
    #[arg(long, value_name = "NAME")]
    pub group: String,
    /// File whose first line is the database's password (PostgreSQL).
    #[arg(long, value_name = "FILE")]
    pub sink_db_password_file: Option<PathBuf>,
    /// PostgreSQL schema of the host's tables [default: public].
    #[arg(long, value_name = "SCHEMA")]
    pub sink_schema: Option<String>,
}

/// An open group: the sink's session, the group's store, its fingerprint
/// and current plugins.
pub(super) struct Opened {
    pub(super) grant: SqlGrant,
    pub(super) store: GroupStore,
    pub(super) fingerprint: Fingerprint,
    pub(super) plugins: Vec<PluginRef>,
}

impl GroupDb {
    /// The database URL with any password hidden.
    pub(super) fn shown(&self) -> String {
        sql::redact(&self.sink_db)
    }

    /// Open the group, creating nothing.
    ///
    /// # Errors
    /// Exit 2 for a database file that does not exist or a group the
    /// database does not hold; 1 when it cannot be read.
    pub(super) fn open(&self) -> Result<Opened, CliError> {
        let url = self.shown();
        if let Some(path) = self
            .sink_db
            .strip_prefix("sqlite://")
            .or_else(|| self.sink_db.strip_prefix("sqlite:"))
            && !std::path::Path::new(path).exists()
        {
            return Err(anyhow::anyhow!("--sink-db {url}: no such file")).code(ExitCode::Usage);
        }
        let grant = SqlGrant::connect_with(&self.sink_db, self.sink_db_password_file.as_deref())
            .and_then(|g| g.set_host_schema(self.sink_schema.clone()).map(|()| g))
            .map_err(|e| anyhow::anyhow!("sink database {url}: {e}"))?;
        let no_group = || {
            anyhow::anyhow!(
                "sink database {url} holds no pipeline group {} (is the name, the database or --sink-schema right?)",
                self.group
            )
        };
        let store = GroupStore::open_existing(
            &self.sink_db,
            self.sink_db_password_file.as_deref(),
            &grant.host_schema(),
            &self.group,
        )?
        .ok_or_else(no_group)
        .code(ExitCode::Usage)?;
        let (fingerprint, plugins) = store.info()?.ok_or_else(no_group).code(ExitCode::Usage)?;
        Ok(Opened {
            grant,
            store,
            fingerprint,
            plugins,
        })
    }
}

/// Run `host group …`.
///
/// # Errors
/// As each subcommand says.
pub fn run(cmd: GroupCommand) -> Result<(), CliError> {
    match cmd {
        GroupCommand::Status(a) => status::status(a),
        GroupCommand::Swap(a) => swap::swap(a),
        GroupCommand::Reset(a) => reset::run(a),
        GroupCommand::Adopt(a) => moves::adopt(a),
        GroupCommand::Disband(a) => moves::disband(a),
    }
}
