//! `host checkpoint …`: views of a checkpoint directory.

use std::path::PathBuf;

use clap::Subcommand;

use super::CliError;
use crate::checkpoint;
use crate::util::rfc3339_ms;

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
    /// Move a checkpoint to other offsets by writing a new, audited
    /// write-ahead/commit pair (history is never edited), and the sink's
    /// progress rows with it. Refused while another process owns the
    /// checkpoint.
    ///
    /// With --brokers the reset also records each topic's identity as the
    /// broker reports it now: after a topic was deleted and recreated this
    /// is how the pipeline is told to read the new topic, and the sink's
    /// progress rows of the old one are forgotten (they need --sink-db).
    /// Offsets the sink shows applied are otherwise not applied again
    /// after a reset back; --reapply applies them again.
    Reset(super::reset::ResetArgs),
}

/// Run `host checkpoint …`.
///
/// # Errors
/// Exit 1 for a corrupt, missing or unreadable checkpoint.
pub fn run(cmd: CheckpointCommand) -> Result<(), CliError> {
    match cmd {
        CheckpointCommand::Reset(args) => super::reset::run(args),
        CheckpointCommand::Show { dir, json } => {
            let s = checkpoint::status(&dir)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&s)?)?;
                return Ok(());
            }
            let m = &s.metadata;
            outln!("checkpoint  {}", s.dir.display())?;
            outln!("query id    {}", m.query_id)?;
            outln!("created     {}", rfc3339_ms(m.created_at_ms))?;
            outln!(
                "topics      {}  ({})",
                m.fingerprint.topics.join(", "),
                m.fingerprint.contract
            )?;
            if let Some(o) = &s.last_planned {
                for (t, id) in &o.topics {
                    outln!("identity    {t}: {}", id.describe())?;
                }
                if let Some(db) = &o.sink_db {
                    outln!("sink db     {db}")?;
                }
            }
            match &s.owner {
                Some(o) => outln!("owner       {}", o.describe())?,
                None => outln!("owner       none (not running)")?,
            }
            outln!("epoch       {} (last issued)", s.epoch)?;
            match &s.last_planned {
                Some(o) => outln!(
                    "planned     batch {} (epoch {}, {})",
                    o.batch_id,
                    o.epoch,
                    rfc3339_ms(o.planned_at_ms)
                )?,
                None => outln!("planned     none")?,
            }
            match &s.last_committed {
                Some(c) => outln!(
                    "committed   batch {} (epoch {}, {}; {} in, {} out, {} dead-lettered)",
                    c.batch_id,
                    c.epoch,
                    rfc3339_ms(c.committed_at_ms),
                    c.counts.input,
                    c.counts.output,
                    c.counts.dead_lettered
                )?,
                None => outln!("committed   none")?,
            }
            if s.next_action == "rerun" {
                outln!(
                    "next        re-run batch {} with its planned ranges",
                    s.next_batch
                )?;
            } else {
                outln!("next        batch {}", s.next_batch)?;
            }
            if let Some(t) = &s.torn_entry {
                outln!("torn        {t} (discarded at the next start)")?;
            }
            if let Some(o) = &s.last_planned {
                let committed = s.last_committed.as_ref().map(|c| c.batch_id) == Some(o.batch_id);
                outln!()?;
                outln!(
                    "{:<24} {:>9} {:>14} {:>14}  BATCH",
                    "TOPIC",
                    "PARTITION",
                    "START",
                    "END"
                )?;
                for r in &o.ranges {
                    outln!(
                        "{:<24} {:>9} {:>14} {:>14}  {} {}",
                        r.topic,
                        r.partition,
                        r.start,
                        r.end,
                        o.batch_id,
                        if committed { "committed" } else { "planned" }
                    )?;
                }
                outln!()?;
                for p in &o.plugins {
                    outln!("plugin      {:?} sha256:{}", p.stage, p.digest)?;
                }
            }
            outln!(
                "store       {} component(s) in plugins/",
                s.stored_plugins.len()
            )?;
            Ok(())
        }
    }
}
