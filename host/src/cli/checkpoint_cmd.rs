//! `host checkpoint …`: views of a checkpoint directory.

use std::path::PathBuf;

use clap::Subcommand;

use super::CliError;
use crate::checkpoint::{self, rfc3339_ms};

/// `host checkpoint …` subcommands.
#[derive(Debug, Subcommand)]
pub enum CheckpointCommand {
    /// Show owner, epoch, last planned and committed batch, per-partition
    /// offsets and plugin digests. Read-only: works while another process
    /// owns the checkpoint.
    Show {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Run `host checkpoint …`.
///
/// # Errors
/// Exit 1 for a corrupt, missing or unreadable checkpoint.
pub fn run(cmd: CheckpointCommand) -> Result<(), CliError> {
    match cmd {
        CheckpointCommand::Show { dir, json } => {
            let s = checkpoint::status(&dir)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
                return Ok(());
            }
            let m = &s.metadata;
            println!("checkpoint  {}", s.dir.display());
            println!("query id    {}", m.query_id);
            println!("created     {}", rfc3339_ms(m.created_at_ms));
            println!(
                "topics      {}  ({})",
                m.fingerprint.topics.join(", "),
                m.fingerprint.contract
            );
            match &s.owner {
                Some(o) => println!(
                    "owner       pid {} on {} since {} (epoch {})",
                    o.pid,
                    o.hostname,
                    o.since(),
                    o.epoch
                ),
                None => println!("owner       none (not running)"),
            }
            println!("epoch       {} (last issued)", s.epoch);
            match &s.last_planned {
                Some(o) => println!(
                    "planned     batch {} (epoch {}, {})",
                    o.batch_id,
                    o.epoch,
                    rfc3339_ms(o.planned_at_ms)
                ),
                None => println!("planned     none"),
            }
            match &s.last_committed {
                Some(c) => println!(
                    "committed   batch {} (epoch {}, {}; {} in, {} out, {} dead-lettered)",
                    c.batch_id,
                    c.epoch,
                    rfc3339_ms(c.committed_at_ms),
                    c.counts.input,
                    c.counts.output,
                    c.counts.dead_lettered
                ),
                None => println!("committed   none"),
            }
            if s.next_action == "rerun" {
                println!(
                    "next        re-run batch {} with its planned ranges",
                    s.next_batch
                );
            } else {
                println!("next        batch {}", s.next_batch);
            }
            if let Some(t) = &s.torn_entry {
                println!("torn        {t} (discarded at the next start)");
            }
            if let Some(o) = &s.last_planned {
                let committed = s.last_committed.as_ref().map(|c| c.batch_id) == Some(o.batch_id);
                println!();
                println!(
                    "{:<24} {:>9} {:>14} {:>14}  BATCH",
                    "TOPIC", "PARTITION", "START", "END"
                );
                for r in &o.ranges {
                    println!(
                        "{:<24} {:>9} {:>14} {:>14}  {} {}",
                        r.topic,
                        r.partition,
                        r.start,
                        r.end,
                        o.batch_id,
                        if committed { "committed" } else { "planned" }
                    );
                }
                println!();
                for p in &o.plugins {
                    println!("plugin      {:?} sha256:{}", p.stage, p.digest);
                }
            }
            println!(
                "store       {} component(s) in plugins/",
                s.stored_plugins.len()
            );
            Ok(())
        }
    }
}
