//! `host group status`: a pipeline group as its tables in the sink
//! database show it. Read-only.

use clap::Args;
use serde::Serialize;

use super::{CliError, GroupDb};
use crate::checkpoint::group::{MemberRow, PartitionRow};
use crate::sink::SinkDriver;
use crate::util::{now_ms, rfc3339_ms};

/// Flags of `host group status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    db: GroupDb,
    /// Kafka bootstrap servers: also show each partition's high watermark
    /// and lag (records not applied yet), and partitions no member has
    /// claimed.
    #[arg(long, value_name = "SERVERS", value_parser = crate::cli::parse_brokers)]
    brokers: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
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
    /// The partition's high watermark (with `--brokers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    high_watermark: Option<i64>,
    /// Records between what was applied (or the log start) and the high
    /// watermark (with `--brokers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    lag: Option<i64>,
}

/// Run `host group status`.
///
/// # Errors
/// Exit 1 when the database cannot be read; 2 for a group it does not
/// hold.
pub(super) fn status(a: StatusArgs) -> Result<(), CliError> {
    show(&a.db, a.brokers.as_deref(), a.json)
}

/// Show group `db.group` (with `brokers`: also watermarks and lag), as a
/// table or one JSON object: `host group status`, and `host status
/// --group`.
///
/// # Errors
/// As [`status`].
pub(crate) fn show(db: &GroupDb, brokers: Option<&str>, json: bool) -> Result<(), CliError> {
    let url = db.shown();
    let group = &db.group;
    let o = db.open()?;
    let (store, fingerprint, plugins) = (o.store, o.fingerprint, o.plugins);
    let members = store.members()?;
    let rows = store.partitions()?;
    let driver = SinkDriver::new(Some(o.grant)).map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    // (log start, high watermark) of every partition of the group's
    // topics, from the broker.
    let mut marks = std::collections::BTreeMap::new();
    if let Some(brokers) = brokers {
        let source = crate::source::KafkaSource::new(
            brokers,
            &Default::default(),
            "sluice-group-status",
            false,
            std::time::Duration::from_secs(30),
        )?;
        for topic in &fingerprint.topics {
            for p in source.describe(topic)?.partitions {
                marks.insert((topic.clone(), p), source.watermarks(topic, p)?);
            }
        }
    }
    let mut shown = Vec::new();
    for row in rows {
        let applied = driver.applied(group, &row.topic, row.partition)?;
        let mark = marks.remove(&(row.topic.clone(), row.partition));
        let applied_end = applied.map(|(end, _)| end);
        shown.push(Shown {
            high_watermark: mark.map(|(_, high)| high),
            lag: mark.map(|(low, high)| (high - applied_end.unwrap_or(low).max(low)).max(0)),
            row,
            applied_end,
            last_write_ms: applied.map(|(_, at)| at),
        });
    }
    // What is left: partitions of the topics no member claimed yet (added
    // since, or the group is still joining).
    let unclaimed: Vec<String> = marks.keys().map(|(t, p)| format!("{t}/{p}")).collect();
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "group": group,
                "topics": fingerprint.topics,
                "contract": fingerprint.contract,
                "plugins": plugins,
                "members": members,
                "partitions": shown,
                "unclaimed": unclaimed,
            }))?
        )?;
        return Ok(());
    }
    outln!("group       {group}")?;
    outln!(
        "topics      {}  ({})",
        fingerprint.topics.join(", "),
        fingerprint.contract
    )?;
    for p in &plugins {
        outln!("plugin      {:?} sha256:{}", p.stage, p.digest)?;
    }
    for m in &members {
        let other = if m.plugins == plugins {
            ""
        } else {
            "  (not the group's current plugins)"
        };
        outln!("member      {}{other}", show_member(m))?;
    }
    if shown.is_empty() {
        outln!("partitions  none claimed yet (members still joining?)")?;
    }
    for s in &shown {
        let r = &s.row;
        outln!(
            "{}/{}  owner {}{} (epoch {}, since {})  applied to {}{}{}{}",
            r.topic,
            r.partition,
            r.owner,
            if r.member_id.is_empty() {
                String::new()
            } else {
                format!(", member id {}", r.member_id)
            },
            r.owner_epoch,
            rfc3339_ms(r.claimed_at_ms),
            s.applied_end
                .map_or("nothing yet".to_string(), |e| e.to_string()),
            s.last_write_ms.map_or(String::new(), |t| format!(
                " (last write {})",
                rfc3339_ms(t)
            )),
            match (&r.planned, &r.planned_unreadable) {
                (Some(p), _) => format!("  in flight [{}, {}) batch {}", p.start, p.end, p.batch),
                (None, Some(why)) => format!(
                    "  in flight: UNREADABLE ({why}; members refuse to claim the partition: `host group reset` rewrites the row)"
                ),
                (None, None) => String::new(),
            },
            match (s.high_watermark, s.lag) {
                (Some(h), Some(l)) => format!("  high watermark {h}, lag {l}"),
                _ => String::new(),
            }
        )?;
    }
    if !unclaimed.is_empty() {
        outln!("unclaimed   {}", unclaimed.join(", "))?;
    }
    Ok(())
}

/// One member's line: what it runs, its last swap, when it was seen.
fn show_member(m: &MemberRow) -> String {
    let now = now_ms();
    let age = m.seen_ago_ms(now);
    let plugins: Vec<String> = m
        .plugins
        .iter()
        .map(|p| {
            format!(
                "{:?} sha256:{}",
                p.stage,
                &p.digest[..12.min(p.digest.len())]
            )
        })
        .collect();
    let mut line = format!(
        "{}  runs [{}]  last seen {} ({} s ago{})",
        m.member,
        plugins.join(", "),
        rfc3339_ms(m.seen_at_ms),
        age / 1000,
        if !m.live(now) {
            ": gone, or stopped without leaving"
        } else {
            ""
        }
    );
    if m.swap_id > 0 {
        line.push_str(&format!("  swap {}", m.swap_id));
    }
    if let Some(e) = &m.swap_error {
        line.push_str(&format!(" NOT installed: {e}"));
    }
    // Its own view, as of its last heartbeat.
    if let Some(v) = &m.live {
        match v["current_batch"].as_u64() {
            Some(b) => line.push_str(&format!("\n              batch {b} in flight")),
            None => line.push_str("\n              between batches"),
        }
        if let Some(p) = v["last_progress"].as_object() {
            let lag = total_lag(&v["last_progress"]);
            line.push_str(&format!(
                "; last batch {} at {}: {} in, {} out, {} rows/s; lag {lag} records",
                p["batch_id"],
                p["committed_at"].as_str().unwrap_or_default(),
                p["counts"]["input"],
                p["counts"]["output"],
                p["rows_per_sec"],
            ));
        }
    }
    line
}

/// The records left over every partition of a progress event (JSON, as
/// `host status` reads it from a control socket or a member's row).
pub(crate) fn total_lag(progress: &serde_json::Value) -> i64 {
    progress["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| x["lag"].as_i64().unwrap_or(0))
        .sum()
}
