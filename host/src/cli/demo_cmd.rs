//! `host demo`: the company pipeline on an embedded broker and SQLite.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::{CliError, ExitCode, WithCode};
use crate::demo;

/// Flags of `host demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Keep the checkpoint and database in DIR for inspection (default: a
    /// temporary directory, removed at the end).
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,
    /// The company component (default: the one cargo built next to this
    /// binary).
    #[arg(long, value_name = "FILE")]
    pub plugin: Option<PathBuf>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Run `host demo`.
///
/// # Errors
/// Exit 1 when a step fails or the table does not match.
pub fn run(args: DemoArgs) -> Result<(), CliError> {
    let plugin = demo::find_company_plugin(args.plugin.as_deref())
        .map_err(anyhow::Error::msg)
        .code(ExitCode::Usage)?;
    let temp;
    let dir = match &args.keep {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            if std::fs::read_dir(d)?.next().is_some() {
                return Err(CliError {
                    code: ExitCode::Usage,
                    error: anyhow::anyhow!("--keep {}: the directory is not empty", d.display()),
                });
            }
            d.clone()
        }
        None => {
            temp = tempfile::tempdir().context("creating a temporary directory")?;
            temp.path().to_path_buf()
        }
    };
    let mut summary = demo::run(&dir, &plugin).map_err(anyhow::Error::msg)?;
    if args.keep.is_some() {
        summary.kept_in = Some(dir.clone());
    }
    if args.json {
        outln!("{}", serde_json::to_string(&summary)?)?;
    } else {
        outln!(
            "Sluice demo: Maxwell CDC -> company plugin -> SQLite, on an embedded Kafka broker"
        )?;
        outln!(
            "  events produced                {}",
            summary.events_produced
        )?;
        outln!(
            "  changes applied                {}",
            summary.changes_applied
        )?;
        outln!(
            "  events filtered                {} (bootstrap markers, DDL, other tables)",
            summary.events_filtered
        )?;
        outln!(
            "  rows in companies              {}",
            summary.rows_in_companies
        )?;
        outln!(
            "  dead letters                   {} (the malformed event, with its original bytes)",
            summary.dead_letters
        )?;
        outln!("  batches                        {}", summary.batches)?;
        match summary.killed_batch {
            Some(b) => {
                outln!(
                    "  killed (SIGKILL) mid-batch     batch {b}: {} records planned, {} of them applied by parts that had committed",
                    summary.records_in_killed_batch,
                    summary.applied_before_kill
                )?;
                outln!(
                    "  restart                        re-ran batch {b} {}: {} offsets already applied by those parts (not applied again), the other {} applied once",
                    if summary.rerun_with_same_offsets {
                        "with the same offsets"
                    } else {
                        "WITH OTHER OFFSETS"
                    },
                    summary.already_applied_on_restart,
                    summary
                        .records_in_killed_batch
                        .saturating_sub(summary.already_applied_on_restart)
                )?;
            }
            None => outln!(
                "  killed (SIGKILL) mid-batch     no: the batch finished before the kill landed"
            )?,
        }
        outln!(
            "  table matches expected state   {}",
            if summary.table_matches_expected {
                "yes: each change applied exactly once, none lost, across a clean stop and a kill -9"
            } else {
                "NO"
            }
        )?;
        if let Some(d) = &summary.kept_in {
            outln!(
                "Kept in {}: `host checkpoint show {}/checkpoint`, `sqlite3 {}/sink.db 'select * from companies'`",
                d.display(),
                d.display(),
                d.display()
            )?;
        }
    }
    if !summary.table_matches_expected {
        return Err(CliError {
            code: ExitCode::Failed,
            error: anyhow::anyhow!("the companies table does not match the expected state"),
        });
    }
    Ok(())
}
