//! `host group reset`: move a stopped pipeline group to other offsets.
//!
//! A group's position is in the sink database: each partition's progress
//! row (what was applied; a member claiming the partition reads from its
//! end) and its planned range (the batch in flight). The reset computes
//! the new rows, then in one transaction claims every moved partition for
//! itself (its owner epoch goes up, so a member still writing is fenced;
//! a member fenced this way claims the partition again and reads from the
//! new position), abandons the batches in flight (what they applied is in
//! the rows), writes the rows and records the reset in
//! `sluice_group_resets`.
//!
//! - **Forward** (past what was applied): the offsets jumped over become a
//!   hole in the row, never applied; a later reset back reaches them.
//! - **Back** with `--reapply`: the row keeps only what lies below the
//!   new position, so everything from there is applied again.
//! - **Back** without `--reapply`: what the row shows applied stays
//!   applied (exactly once across resets), so the position does not move;
//!   a range with holes is refused (only `--reapply` reaches them in a
//!   group).

use std::collections::BTreeMap;

use anyhow::anyhow;
use clap::Args;

use super::GroupDb;
use crate::cli::reset::targets::{Target, ask_broker, targets};
use crate::cli::reset::{kafka_properties, moving_topics};
use crate::cli::{CliError, ExitCode, WithCode};
use crate::sink::SinkDriver;
use crate::sink::applied::AppliedSet;
use crate::sink::reset::GroupMove;
use crate::util::now_ms;

/// Flags of `host group reset`.
#[derive(Debug, Args)]
pub struct GroupResetArgs {
    #[command(flatten)]
    db: GroupDb,
    /// `earliest`, `latest`, `timestamp:MS` (first offset at or after
    /// that time, ms since the Unix epoch) or `offsets:JSON` with
    /// `{"topic":{"partition":offset}}` (unlisted partitions keep their
    /// position).
    #[arg(long, value_name = "TARGET")]
    to: String,
    /// Kafka bootstrap servers: the targets are looked up there, and
    /// every offset is checked against its partition's log (a position
    /// past the high watermark would leave the partition unread).
    #[arg(long, value_name = "SERVERS", value_parser = crate::cli::parse_brokers)]
    brokers: String,
    /// Apply the records from the new positions again even where the
    /// progress rows show them applied (say, after emptying the
    /// destination tables).
    #[arg(long)]
    reapply: bool,
    /// Move only this topic (repeatable); the others keep their
    /// positions. Default: every topic of the group.
    #[arg(long = "topic", value_name = "NAME")]
    topics: Vec<String>,
    /// Reset even though a member reported within the last 30 s (one
    /// killed a moment ago). A member still running is fenced off the
    /// partitions and claims them again at the new positions.
    #[arg(long)]
    force: bool,
    /// librdkafka property for the broker lookups, as `kafka.NAME=VALUE`.
    /// Repeatable.
    #[arg(long = "config", value_name = "kafka.NAME=VALUE", value_parser = crate::cli::parse_kv)]
    config: Vec<(String, String)>,
    /// Print before/after and write nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Run `host group reset`.
///
/// # Errors
/// Exit 3 while members are live (without `--force`); 2 for bad targets
/// or a move back over holes without `--reapply`; 1 for a broker or
/// database error, or rows that changed while the reset was computed.
pub fn run(a: GroupResetArgs) -> Result<(), CliError> {
    let kafka = kafka_properties(&a.config)?;
    let target = Target::parse(&a.to)?;
    let group = a.db.group.clone();
    let o = a.db.open()?;
    let moving = moving_topics(&a.topics, &o.fingerprint.topics)?;
    let now = now_ms();
    let live: Vec<String> = o
        .store
        .live_members(now)?
        .into_iter()
        .map(|m| format!("{} (seen {} s ago)", m.member, m.seen_ago_ms(now) / 1000))
        .collect();
    if !live.is_empty() && !a.force && !a.dry_run {
        return Err(anyhow!(
            "group {group} has live members: {}. Stop them first (SIGTERM); pass --force if they are gone",
            live.join(", ")
        ))
        .code(ExitCode::Owned);
    }
    let driver = SinkDriver::new(Some(o.grant.clone()))
        .map_err(|e| anyhow!("sink database {}: {e}", a.db.shown()))?;
    let rows = driver.progress_rows(&group)?;
    let in_flight: BTreeMap<(String, i32), (i64, i64)> = o
        .store
        .partitions()?
        .into_iter()
        .filter_map(|p| Some(((p.topic, p.partition), p.planned.map(|r| (r.start, r.end))?)))
        .collect();
    // Where each partition's next owner would read from now.
    let mut current: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for (tp, set) in &rows {
        if let Some(end) = set.end() {
            current.insert(tp.clone(), end);
        }
    }
    for (tp, (start, _)) in &in_flight {
        current.insert(tp.clone(), *start);
    }
    let broker = Some(ask_broker(&a.brokers, &kafka, &moving)?);
    let after = targets(
        &target,
        broker.as_ref(),
        &moving,
        &BTreeMap::new(),
        &current,
    )?;
    let mut moves = BTreeMap::new();
    let mut lines = Vec::new();
    let mut audit = serde_json::Map::new();
    for ((topic, partition), to) in after.iter().filter(|((t, _), _)| moving.contains(t)) {
        let tp = (topic.clone(), *partition);
        let before = rows.get(&tp).cloned();
        let had = before.clone().unwrap_or_else(AppliedSet::empty);
        let end = had.end();
        let new = if a.reapply {
            had.below(*to)
                .unwrap_or_else(AppliedSet::empty)
                .skip_to(*to)
        } else if end.is_some_and(|e| e > *to) {
            let missing = had.missing(&(*to..end.unwrap_or(*to)));
            if !missing.is_empty() {
                let shown: Vec<String> = missing
                    .iter()
                    .map(|m| format!("[{}, {})", m.start, m.end))
                    .collect();
                return Err(anyhow!(
                    "{topic}/{partition}: between {to} and {} the sink never applied {}; in a group only --reapply moves back over them (it applies everything from {to} again)",
                    end.unwrap_or(*to),
                    shown.join(", ")
                ))
                .code(ExitCode::Usage);
            }
            before.clone()
        } else {
            had.skip_to(*to)
        };
        let from = new.as_ref().and_then(AppliedSet::end);
        let flight = in_flight.get(&tp).map_or(String::new(), |(s, e)| {
            format!(" (in flight [{s}, {e}), abandoned)")
        });
        let why = match (end, from) {
            (Some(e), Some(f)) if f < e => {
                format!("; [{f}, {e}) applied (again, where it was applied before)")
            }
            (Some(e), Some(f)) if f == e && *to < e => {
                format!(
                    "; [{to}, {e}) is applied already and stays so (--reapply applies it again)"
                )
            }
            (e, Some(f)) if f > e.unwrap_or(0) && *to == f => format!(
                "; [{}, {f}) jumped over, recorded as never applied",
                e.unwrap_or(0)
            ),
            _ => String::new(),
        };
        lines.push(format!(
            "{topic}/{partition}: applied to {}{flight} -> reads from {} next{why}",
            end.map_or("nothing".into(), |e| e.to_string()),
            from.map_or("its log start".into(), |f| f.to_string()),
        ));
        audit.insert(
            format!("{topic}/{partition}"),
            serde_json::json!({ "before": end, "in_flight": in_flight.get(&tp), "after": from }),
        );
        moves.insert(tp, GroupMove { before, after: new });
    }
    for l in &lines {
        outln!("{l}")?;
    }
    if a.dry_run {
        outln!("dry run: nothing was changed")?;
        if !live.is_empty() && !a.force {
            outln!(
                "members are live ({}): the reset itself would be refused (exit 3) until they stop, or with --force",
                live.join(", ")
            )?;
        }
        return Ok(());
    }
    let by = format!("pid {} on {}", std::process::id(), crate::util::hostname());
    driver
        .reset_group(
            o.store.tables(),
            &group,
            &moves,
            &by,
            &target.to_string(),
            &serde_json::Value::Object(audit).to_string(),
            false,
        )
        .map_err(|e| {
            anyhow!(
                "group {group}: {e}; nothing was changed (are members running? stop them first)"
            )
        })?;
    // The positions now belong to the topics the broker has: the next
    // plan records their identities anew (a recreated topic is refused
    // until then).
    o.store
        .set_topics(&moving.iter().map(|t| (t.clone(), None)).collect())
        .map_err(|e| {
            anyhow!("group {group}: the partitions were moved, but the topics' identities could not be cleared ({e}): run the same reset again")
        })?;
    outln!(
        "group {group} reset: {} partition(s) moved; members read from the new positions when they claim them",
        moves.len()
    )?;
    Ok(())
}
