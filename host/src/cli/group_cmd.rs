//! `host group …`: views of a pipeline group's checkpoint in the sink
//! database.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde::Serialize;

use super::{CliError, ExitCode, WithCode};
use crate::capability::sql::{self, SqlGrant};
use crate::checkpoint::group::{GroupStore, PartitionRow};
use crate::sink::SinkDriver;
use crate::util::rfc3339_ms;

/// `host group …` subcommands.
#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// Show a pipeline group: its topics and plugins, and each partition's
    /// owner, owner epoch, when it was claimed, the range in flight and the
    /// end applied. Read-only.
    Status(GroupArgs),
}

/// Which group, in which database.
#[derive(Debug, Args)]
pub struct GroupArgs {
    /// The group's sink database (`sqlite:PATH` or `postgres://…`).
    #[arg(long, value_name = "URL")]
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
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One partition as `host group status` shows it.
#[derive(Debug, Serialize)]
struct Shown {
    #[serde(flatten)]
    row: PartitionRow,
    /// End offset the progress row shows applied.
    applied_end: Option<i64>,
    /// When that row was last written, ms since the Unix epoch: an owner
    /// whose partitions have data but whose rows stop moving is stuck or
    /// gone.
    last_write_ms: Option<i64>,
}

/// Run `host group …`.
///
/// # Errors
/// Exit 1 when the database cannot be read; 2 for a group it does not
/// hold.
pub fn run(cmd: GroupCommand) -> Result<(), CliError> {
    let GroupCommand::Status(a) = cmd;
    let url = sql::redact(&a.sink_db);
    if let Some(path) = a
        .sink_db
        .strip_prefix("sqlite://")
        .or_else(|| a.sink_db.strip_prefix("sqlite:"))
        && !std::path::Path::new(path).exists()
    {
        return Err(anyhow::anyhow!("--sink-db {url}: no such file")).code(ExitCode::Usage);
    }
    let grant = SqlGrant::connect_with(&a.sink_db, a.sink_db_password_file.as_deref())
        .and_then(|g| g.set_host_schema(a.sink_schema.clone()).map(|()| g))
        .map_err(|e| anyhow::anyhow!("sink database {url}: {e}"))?;
    let schema = grant.host_schema();
    let no_group = || {
        Err(anyhow::anyhow!(
            "sink database {url} holds no pipeline group {} (is the name, the database or --sink-schema right?)",
            a.group
        ))
        .code(ExitCode::Usage)
    };
    let Some(store) = GroupStore::open_existing(
        &a.sink_db,
        a.sink_db_password_file.as_deref(),
        &schema,
        &a.group,
    )?
    else {
        return no_group();
    };
    let Some((fingerprint, plugins)) = store.info()? else {
        return no_group();
    };
    let rows = store.partitions()?;
    let driver = SinkDriver::new(Some(grant)).map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    let mut shown = Vec::new();
    for row in rows {
        let applied = driver.applied(&a.group, &row.topic, row.partition)?;
        shown.push(Shown {
            row,
            applied_end: applied.map(|(end, _)| end),
            last_write_ms: applied.map(|(_, at)| at),
        });
    }
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "group": a.group,
                "topics": fingerprint.topics,
                "contract": fingerprint.contract,
                "plugins": plugins,
                "partitions": shown,
            }))?
        )?;
        return Ok(());
    }
    outln!("group       {}", a.group)?;
    outln!(
        "topics      {}  ({})",
        fingerprint.topics.join(", "),
        fingerprint.contract
    )?;
    for p in &plugins {
        outln!("plugin      {:?} sha256:{}", p.stage, p.digest)?;
    }
    if shown.is_empty() {
        outln!("partitions  none claimed yet (members still joining?)")?;
    }
    for s in &shown {
        let r = &s.row;
        outln!(
            "{}/{}  owner {} (epoch {}, since {})  applied to {}{}{}",
            r.topic,
            r.partition,
            r.owner,
            r.owner_epoch,
            rfc3339_ms(r.claimed_at_ms),
            s.applied_end
                .map_or("nothing yet".to_string(), |e| e.to_string()),
            s.last_write_ms.map_or(String::new(), |t| format!(
                " (last write {})",
                rfc3339_ms(t)
            )),
            match &r.planned {
                Some(p) => format!("  in flight [{}, {}) batch {}", p.start, p.end, p.batch),
                None => String::new(),
            }
        )?;
    }
    Ok(())
}
