//! `host checkpoint …`: views of a checkpoint directory.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Subcommand;

use super::{CliError, ExitCode, WithCode};
use crate::checkpoint::{self, Checkpoint, OpenOptions, rfc3339_ms};
use crate::source::KafkaSource;

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
    /// write-ahead/commit pair (history is never edited). Refused while
    /// another process owns the checkpoint.
    Reset {
        /// The checkpoint directory.
        dir: PathBuf,
        /// `earliest`, `latest`, `timestamp:MS` (first offset at or after
        /// that time, ms since the Unix epoch) or `offsets:JSON` with
        /// `{"topic":{"partition":offset}}` (unlisted partitions keep their
        /// position).
        #[arg(long, value_name = "TARGET")]
        to: String,
        /// Kafka bootstrap servers (needed for earliest, latest and
        /// timestamp).
        #[arg(long, value_name = "SERVERS")]
        brokers: Option<String>,
        /// Print before/after and write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Current positions: the ends of the newest committed batch.
fn positions(s: &checkpoint::Status) -> BTreeMap<(String, i32), i64> {
    match (&s.last_planned, &s.last_committed) {
        (Some(o), Some(c)) if o.batch_id == c.batch_id => o
            .ranges
            .iter()
            .map(|r| ((r.topic.clone(), r.partition), r.end))
            .collect(),
        (Some(o), _) => o
            .ranges
            .iter()
            .map(|r| ((r.topic.clone(), r.partition), r.start))
            .collect(),
        _ => BTreeMap::new(),
    }
}

fn targets(
    to: &str,
    brokers: Option<&str>,
    topics: &[String],
    current: &BTreeMap<(String, i32), i64>,
) -> Result<BTreeMap<(String, i32), i64>, CliError> {
    if let Some(json) = to.strip_prefix("offsets:") {
        let parsed: BTreeMap<String, BTreeMap<String, i64>> = serde_json::from_str(json)
            .context("--to offsets:JSON expects {\"topic\":{\"partition\":offset}}")
            .code(ExitCode::Usage)?;
        let mut out = current.clone();
        for (topic, parts) in parsed {
            if !topics.contains(&topic) {
                return Err(anyhow!(
                    "topic `{topic}` is not in this checkpoint (its topics: {})",
                    topics.join(", ")
                ))
                .code(ExitCode::Usage);
            }
            for (p, o) in parts {
                let p: i32 = p
                    .parse()
                    .map_err(|_| anyhow!("partition `{p}` is not a number"))
                    .code(ExitCode::Usage)?;
                if !current.contains_key(&(topic.clone(), p)) {
                    let known: Vec<String> = current
                        .keys()
                        .filter(|(t, _)| *t == topic)
                        .map(|(_, p)| p.to_string())
                        .collect();
                    return Err(anyhow!(
                        "partition {p} of `{topic}` is not in this checkpoint (its partitions: {}); a partition the pipeline has not read yet starts at its earliest offset",
                        known.join(", ")
                    ))
                    .code(ExitCode::Usage);
                }
                if o < 0 {
                    return Err(anyhow!("offset {o} for {topic}/{p} is negative"))
                        .code(ExitCode::Usage);
                }
                out.insert((topic.clone(), p), o);
            }
        }
        return Ok(out);
    }
    let brokers = brokers
        .ok_or_else(|| anyhow!("--to {to} needs --brokers to look the offsets up"))
        .code(ExitCode::Usage)?;
    let source = KafkaSource::new(
        brokers,
        &BTreeMap::new(),
        "sluice-reset",
        false,
        Duration::from_secs(30),
    )?;
    let mut out = BTreeMap::new();
    for topic in topics {
        let parts = source.partitions(topic)?;
        let by_time = match to.strip_prefix("timestamp:") {
            Some(ms) => {
                let ms: i64 = ms
                    .parse()
                    .map_err(|_| {
                        anyhow!("--to timestamp:MS expects milliseconds since the Unix epoch")
                    })
                    .code(ExitCode::Usage)?;
                Some(source.offsets_for_timestamp(topic, &parts, ms).map_err(|e| {
                    anyhow!("{e}; this broker cannot answer timestamp lookups, reset with --to offsets:JSON instead")
                })?)
            }
            None => None,
        };
        for p in parts {
            let (low, high) = source.watermarks(topic, p)?;
            let o = match (to, &by_time) {
                ("earliest", _) => low,
                ("latest", _) => high,
                (_, Some(t)) => t.get(&p).copied().unwrap_or(high),
                _ => {
                    return Err(anyhow!(
                        "--to `{to}`: use earliest, latest, timestamp:MS or offsets:JSON"
                    ))
                    .code(ExitCode::Usage);
                }
            };
            out.insert((topic.clone(), p), o);
        }
    }
    Ok(out)
}

/// Run `host checkpoint …`.
///
/// # Errors
/// Exit 1 for a corrupt, missing or unreadable checkpoint.
pub fn run(cmd: CheckpointCommand) -> Result<(), CliError> {
    match cmd {
        CheckpointCommand::Reset {
            dir,
            to,
            brokers,
            dry_run,
        } => {
            let s = checkpoint::status(&dir)?;
            if s.owner.is_some() && !dry_run {
                let owner = s.owner.clone();
                return Err(CliError {
                    code: ExitCode::Owned,
                    error: anyhow!(
                        "checkpoint {} is owned by {}; stop it (SIGTERM) before resetting: reset refuses to move a running pipeline",
                        dir.display(),
                        checkpoint::describe_owner(&owner)
                    ),
                });
            }
            if s.next_action == "rerun" && !dry_run {
                return Err(CliError {
                    code: ExitCode::Failed,
                    error: anyhow!(
                        "checkpoint {}: batch {} is planned but not committed; run the pipeline once so it is re-run and committed, then reset",
                        dir.display(),
                        s.next_batch
                    ),
                });
            }
            let topics = s.metadata.fingerprint.topics.clone();
            let before = positions(&s);
            let after = targets(&to, brokers.as_deref(), &topics, &before)?;
            outln!(
                "{:<24} {:>9} {:>14} {:>14}",
                "TOPIC",
                "PARTITION",
                "BEFORE",
                "AFTER"
            )?;
            for ((t, p), o) in &after {
                let b = before
                    .get(&(t.clone(), *p))
                    .map_or("-".to_string(), |b| b.to_string());
                outln!("{t:<24} {p:>9} {b:>14} {o:>14}")?;
            }
            if dry_run {
                outln!("dry run: nothing written")?;
                return Ok(());
            }
            let mut cp = Checkpoint::open(
                &dir,
                &OpenOptions {
                    topics,
                    create: false,
                    ..OpenOptions::default()
                },
            )
            .map_err(|e| CliError {
                code: if e.is_owned() {
                    ExitCode::Owned
                } else {
                    ExitCode::Failed
                },
                error: e.into(),
            })?;
            let plugins = s.last_committed.map(|c| c.plugins).unwrap_or_default();
            let note = format!(
                "reset to {to} by `host checkpoint reset` (pid {}, {})",
                std::process::id(),
                rfc3339_ms(checkpoint::now_ms())
            );
            let batch = cp.reset(&after, plugins, note)?;
            outln!(
                "wrote batch {batch} (offsets/{batch} and commits/{batch}); the next run starts from AFTER"
            )?;
            Ok(())
        }
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
            match &s.owner {
                Some(o) => outln!(
                    "owner       pid {} on {} since {} (epoch {})",
                    o.pid,
                    o.hostname,
                    o.since(),
                    o.epoch
                )?,
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
