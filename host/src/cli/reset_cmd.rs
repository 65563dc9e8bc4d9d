//! `host checkpoint reset`: move a checkpoint to other offsets, and the
//! sink's progress rows with it, in one audited step.
//!
//! Order: the checkpoint lock is taken first, and everything the reset is
//! computed from is read after it (no pipeline runs meanwhile); then the
//! sink's rows change in one database transaction; then the reset's
//! write-ahead/commit pair is written. A crash between the two leaves rows
//! that were moved and a checkpoint that was not: after a recreated topic
//! the next run stops as before and the same reset can be repeated; after
//! `--reapply` the rows show less applied than was, so the records between
//! the cut and the old position are applied again when a reset reaches
//! them. Run the reset again in either case.
//!
//! An uncommitted batch is re-run first, except when one of its topics
//! was recreated (its re-run would be refused): the reset then abandons
//! it with an empty, noted commit entry.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;

use super::{CliError, ExitCode, WithCode};
use crate::capability::sql::{SqlGrant, redact};
use crate::checkpoint::{self, Checkpoint, DirCheckpoint, OpenOptions, ResetRecord, TopicIdentity};
use crate::engine::{redact_property, shell_word};
use crate::sink::SinkDriver;
use crate::sink::applied::AppliedSet;
use crate::sink::reset::RowChange;
use crate::source::KafkaSource;
use crate::util::rfc3339_ms;

/// The options of `host checkpoint reset`.
#[derive(Debug, Args)]
pub struct ResetArgs {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// `earliest`, `latest`, `timestamp:MS` (first offset at or after
    /// that time, ms since the Unix epoch) or `offsets:JSON` with
    /// `{"topic":{"partition":offset}}` (unlisted partitions keep their
    /// position).
    #[arg(long, value_name = "TARGET")]
    pub to: String,
    /// Kafka bootstrap servers (needed for earliest, latest and
    /// timestamp; with offsets:JSON they let the reset check and record
    /// the topics' identities).
    #[arg(long, value_name = "SERVERS")]
    pub brokers: Option<String>,
    /// The pipeline's sink database (`sqlite:PATH` or `postgres://…`),
    /// whose `sluice_progress` rows move with the reset. Required when
    /// they must move (a recreated or truncated topic, --reapply) and
    /// the pipeline has a sink database.
    #[arg(long, value_name = "URL")]
    pub sink_db: Option<String>,
    /// Apply the records from the new positions again even where the
    /// sink's progress rows show them applied (say, after emptying the
    /// destination tables). Needs --sink-db.
    #[arg(long)]
    pub reapply: bool,
    /// Leave the sink's progress rows as they are: offsets they show
    /// applied are skipped.
    #[arg(long)]
    pub keep_sink_progress: bool,
    /// Move only this topic (repeatable); the others keep their
    /// positions. Default: every topic of the checkpoint.
    #[arg(long = "topic", value_name = "NAME")]
    pub topics: Vec<String>,
    /// librdkafka property for the broker lookups, as `kafka.NAME=VALUE`
    /// (the pipeline's security settings, say). Repeatable.
    #[arg(long = "config", value_name = "kafka.NAME=VALUE", value_parser = super::parse_kv)]
    pub config: Vec<(String, String)>,
    /// Print before/after and write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Where `--to` moves the partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// Each partition's log start.
    Earliest,
    /// Each partition's high watermark.
    Latest,
    /// The first offset at or after this time (ms since the Unix epoch).
    Timestamp(i64),
    /// Explicit offsets: the JSON text after `offsets:`.
    Offsets(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Earliest => f.write_str("earliest"),
            Target::Latest => f.write_str("latest"),
            Target::Timestamp(ms) => write!(f, "timestamp:{ms}"),
            Target::Offsets(json) => write!(f, "offsets:{json}"),
        }
    }
}

impl Target {
    /// Parse `--to`.
    fn parse(to: &str) -> Result<Self, CliError> {
        if let Some(json) = to.strip_prefix("offsets:") {
            return Ok(Target::Offsets(json.to_string()));
        }
        match to {
            "earliest" => Ok(Target::Earliest),
            "latest" => Ok(Target::Latest),
            _ => match to
                .strip_prefix("timestamp:")
                .and_then(|ms| ms.parse::<i64>().ok())
            {
                Some(ms) if ms >= 0 => Ok(Target::Timestamp(ms)),
                _ => Err(anyhow!(
                    "--to `{to}`: use earliest, latest, timestamp:MS (milliseconds since the Unix epoch, not negative) or offsets:JSON"
                ))
                .code(ExitCode::Usage),
            },
        }
    }
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

/// What the broker says now, per topic.
struct Broker {
    identity: BTreeMap<String, TopicIdentity>,
    /// `(log start, high watermark)` per partition.
    watermarks: BTreeMap<(String, i32), (i64, i64)>,
    source: KafkaSource,
}

fn ask_broker(
    brokers: &str,
    kafka: &BTreeMap<String, String>,
    topics: &[String],
) -> Result<Broker, CliError> {
    let source = KafkaSource::new(
        brokers,
        kafka,
        "sluice-reset",
        false,
        Duration::from_secs(30),
    )?;
    let mut identity = BTreeMap::new();
    let mut watermarks = BTreeMap::new();
    for topic in topics {
        let info = source.describe(topic)?;
        for p in &info.partitions {
            watermarks.insert((topic.clone(), *p), source.watermarks(topic, *p)?);
        }
        identity.insert(
            topic.clone(),
            TopicIdentity::new(info.id, info.partitions.len()),
        );
    }
    Ok(Broker {
        identity,
        watermarks,
        source,
    })
}

/// The positions after the reset: `to` for the partitions of `moving`
/// (every partition the broker reports for a recreated topic, which starts
/// at its log start unless `offsets:JSON` names it), the current position
/// for every other partition.
fn targets(
    to: &Target,
    broker: Option<&Broker>,
    moving: &[String],
    recreated: &BTreeMap<String, String>,
    current: &BTreeMap<(String, i32), i64>,
) -> Result<BTreeMap<(String, i32), i64>, CliError> {
    // Partitions of another topic, or of a topic that was not recreated
    // and is not moving, keep their position.
    let mut out: BTreeMap<(String, i32), i64> = current
        .iter()
        .filter(|((t, _), _)| !recreated.contains_key(t))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let partitions_of = |topic: &str| -> Vec<i32> {
        broker.map_or_else(Vec::new, |b| {
            b.watermarks
                .keys()
                .filter(|(t, _)| t == topic)
                .map(|(_, p)| *p)
                .collect()
        })
    };
    let low_of = |topic: &str, p: i32| -> i64 {
        broker
            .and_then(|b| b.watermarks.get(&(topic.to_string(), p)))
            .map_or(0, |(low, _)| *low)
    };
    for topic in recreated.keys() {
        for p in partitions_of(topic) {
            out.insert((topic.clone(), p), low_of(topic, p));
        }
    }
    if let Target::Offsets(json) = to {
        let parsed: BTreeMap<String, BTreeMap<String, i64>> = serde_json::from_str(json)
            .context("--to offsets:JSON expects {\"topic\":{\"partition\":offset}}")
            .code(ExitCode::Usage)?;
        for (topic, parts) in parsed {
            if !moving.contains(&topic) {
                return Err(anyhow!(
                    "topic `{topic}` is not among the topics this reset moves ({})",
                    moving.join(", ")
                ))
                .code(ExitCode::Usage);
            }
            for (p, o) in parts {
                let p: i32 = p
                    .parse()
                    .map_err(|_| anyhow!("partition `{p}` is not a number"))
                    .code(ExitCode::Usage)?;
                if !out.contains_key(&(topic.clone(), p)) {
                    let known: Vec<String> = out
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
                if let Some((_, high)) = broker.and_then(|b| b.watermarks.get(&(topic.clone(), p)))
                    && o > *high
                {
                    return Err(anyhow!(
                        "offset {o} for {topic}/{p} is past its high watermark {high}: the pipeline would stop there (\"beyond the high watermark\")"
                    ))
                    .code(ExitCode::Usage);
                }
                out.insert((topic.clone(), p), o);
            }
        }
        return Ok(out);
    }
    let broker = broker
        .ok_or_else(|| anyhow!("--to {to} needs --brokers to look the offsets up"))
        .code(ExitCode::Usage)?;
    for topic in moving {
        let parts = partitions_of(topic);
        let found = match to {
            Target::Timestamp(ms) => Some(broker.source.offsets_for_timestamp(topic, &parts, *ms).map_err(|e| {
                anyhow!("{e}; this broker cannot answer timestamp lookups, reset with --to offsets:JSON instead")
            })?),
            _ => None,
        };
        for p in parts {
            let (low, high) = broker.watermarks[&(topic.clone(), p)];
            let o = match &found {
                Some(t) => t.get(&p).copied().unwrap_or(high),
                None if *to == Target::Earliest => low,
                None => high,
            };
            out.insert((topic.clone(), p), o);
        }
    }
    Ok(out)
}

/// The topics of `now` that are not the topics on record, each with why.
fn recreated_topics(
    recorded: &BTreeMap<String, TopicIdentity>,
    now: &BTreeMap<String, TopicIdentity>,
) -> BTreeMap<String, String> {
    now.iter()
        .filter_map(|(t, now)| Some((t.clone(), recorded.get(t)?.changed(now)?)))
        .collect()
}

/// What the broker reports now.
struct Found<'a> {
    identity: &'a BTreeMap<String, TopicIdentity>,
    watermarks: &'a BTreeMap<(String, i32), (i64, i64)>,
    /// The topics that are not the ones on record ([`recreated_topics`]).
    recreated: &'a BTreeMap<String, String>,
}

/// What the reset does to the sink's progress rows, and why.
#[derive(Debug, Default)]
struct RowPlan {
    /// Per partition.
    changes: BTreeMap<(String, i32), RowChange>,
    /// One line per reason, for the output and the entry's note.
    notes: Vec<String>,
    /// The rows must be read or moved: without them the reset would make
    /// the pipeline skip records it never applied.
    needs_rows: bool,
    /// Topic identities to record with the reset.
    identities: BTreeMap<String, TopicIdentity>,
}

/// Decide what happens to the progress rows. A row whose offsets belong
/// to a log that is gone is forgotten: every partition of a topic whose
/// identity changed, and any partition whose log now ends below the end
/// the row shows applied (which also catches a truncated or recreated
/// topic on a broker without topic ids). With `reapply` every other row
/// keeps only what lies below the new position.
fn plan_rows(
    recorded: &BTreeMap<String, TopicIdentity>,
    found: Option<&Found<'_>>,
    moving: &[String],
    before: &BTreeMap<(String, i32), i64>,
    after: &BTreeMap<(String, i32), i64>,
    rows: &BTreeMap<(String, i32), AppliedSet>,
    reapply: bool,
) -> RowPlan {
    let mut plan = RowPlan {
        identities: recorded.clone(),
        needs_rows: reapply,
        ..RowPlan::default()
    };
    if reapply {
        plan.notes
            .push("--reapply changes the sink's progress rows".into());
    }
    if let Some(f) = found {
        for (topic, now) in f.identity {
            if let Some(why) = f.recreated.get(topic) {
                plan.notes.push(format!(
                    "topic {topic} was deleted and created again: {why}"
                ));
                plan.needs_rows = true;
                for tp in before
                    .keys()
                    .chain(after.keys())
                    .chain(rows.keys())
                    .filter(|(t, _)| t == topic)
                {
                    plan.changes.insert(tp.clone(), RowChange::Forget);
                }
            }
            let next = match recorded.get(topic) {
                Some(was) if !f.recreated.contains_key(topic) => was.updated(now),
                _ => now.clone(),
            };
            plan.identities.insert(topic.clone(), next);
        }
        for (tp, (_, high)) in f.watermarks {
            if plan.changes.contains_key(tp) {
                continue;
            }
            if before.get(tp).is_some_and(|pos| pos > high) {
                // The checkpoint is past the log's end: truncated, recreated,
                // or reset forward past it. Only the rows can tell which.
                plan.needs_rows = true;
                if !rows.contains_key(tp) {
                    plan.notes.push(format!(
                        "{}/{}: the checkpoint's position {} is beyond the log's end {high}",
                        tp.0, tp.1, before[tp]
                    ));
                }
            }
            if let Some(end) = rows.get(tp).and_then(AppliedSet::end)
                && end > *high
            {
                plan.notes.push(format!(
                    "{}/{}: the log now ends at {high}, below the offsets the sink applied (up to {end}): it was truncated or recreated",
                    tp.0, tp.1
                ));
                plan.changes.insert(tp.clone(), RowChange::Forget);
            }
        }
    }
    if reapply {
        for (tp, o) in after.iter().filter(|((t, _), _)| moving.contains(t)) {
            plan.changes
                .entry(tp.clone())
                .or_insert(RowChange::ReapplyFrom(*o));
        }
    }
    plan
}

fn show(set: Option<&AppliedSet>) -> String {
    match set.and_then(AppliedSet::end) {
        None => "no row".into(),
        Some(end) => {
            let holes = set.map(AppliedSet::holes).unwrap_or_default();
            if holes.is_empty() {
                format!("applied below {end}")
            } else {
                let h: Vec<String> = holes
                    .iter()
                    .map(|h| format!("[{}, {})", h.start, h.end))
                    .collect();
                format!("applied below {end} except {}", h.join(" "))
            }
        }
    }
}

/// Run `host checkpoint reset`.
///
/// # Errors
/// Exit 3 while the checkpoint is owned; 2 for bad targets, or when the
/// sink's progress rows must move and no `--sink-db` was given; 1 for a
/// corrupt checkpoint, a broker or database error.
pub fn run(a: ResetArgs) -> Result<(), CliError> {
    let dir = &a.dir;
    let mut kafka = BTreeMap::new();
    for (k, v) in &a.config {
        let Some(name) = k.strip_prefix("kafka.") else {
            return Err(anyhow!(
                "--config {k}=…: checkpoint reset takes librdkafka properties only, as kafka.NAME=VALUE"
            ))
            .code(ExitCode::Usage);
        };
        kafka.insert(name.to_string(), v.clone());
    }
    if a.reapply && a.keep_sink_progress {
        return Err(anyhow!(
            "--reapply moves the sink's progress rows and --keep-sink-progress leaves them: pick one"
        ))
        .code(ExitCode::Usage);
    }
    let target = Target::parse(&a.to)?;
    let s = checkpoint::status(dir)?;
    if s.owner.is_some() && !a.dry_run {
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
    // Take the lock before reading what the reset is computed from, so no
    // pipeline runs between the read and the write.
    let cp = if a.dry_run {
        None
    } else {
        Some(
            DirCheckpoint::open(
                dir,
                &OpenOptions {
                    topics: s.metadata.fingerprint.topics.clone(),
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
            })?,
        )
    };
    let s = checkpoint::status(dir)?;
    let all = s.metadata.fingerprint.topics.clone();
    let moving: Vec<String> = if a.topics.is_empty() {
        all.clone()
    } else {
        for t in &a.topics {
            if !all.contains(t) {
                return Err(anyhow!(
                    "topic `{t}` is not in this checkpoint (its topics: {})",
                    all.join(", ")
                ))
                .code(ExitCode::Usage);
            }
        }
        a.topics.clone()
    };
    let before = positions(&s);
    let recorded: BTreeMap<String, TopicIdentity> = s
        .last_planned
        .as_ref()
        .map(|o| o.topics.clone())
        .unwrap_or_default();
    let recorded_sink = s.last_planned.as_ref().and_then(|o| o.sink_db.clone());
    let broker = match &a.brokers {
        Some(b) => Some(ask_broker(b, &kafka, &moving)?),
        None => None,
    };
    let recreated = broker
        .as_ref()
        .map(|b| recreated_topics(&recorded, &b.identity))
        .unwrap_or_default();
    // An uncommitted batch is normally re-run first. When one of its topics
    // was recreated the re-run is refused, so the reset abandons the batch
    // (an audited, empty commit entry) instead.
    let abandon = s.next_action == "rerun";
    if abandon && recreated.is_empty() && !a.dry_run {
        return Err(CliError {
            code: ExitCode::Failed,
            error: anyhow!(
                "checkpoint {}: batch {} is planned but not committed; run the pipeline once so it is re-run and committed, then reset (if that run refuses because a topic was deleted and recreated, reset with --brokers, which lets the reset see that and abandon the batch)",
                dir.display(),
                s.next_batch
            ),
        });
    }
    let after = targets(&target, broker.as_ref(), &moving, &recreated, &before)?;

    if let Some(url) = &a.sink_db {
        let given = crate::capability::sql::sink_identity(url)
            .map_err(|e| anyhow!("--sink-db {}: {e}", redact(url)))?;
        if let Some(recorded) = &recorded_sink
            && given != *recorded
        {
            return Err(anyhow!(
                "--sink-db {given} is not the database this pipeline keeps its progress in ({recorded}, recorded in its newest offsets entry); nothing was changed. Pass that one: moving the rows of another database would make the pipeline skip or repeat records"
            ))
            .code(ExitCode::Usage);
        }
        if let Some(path) = given.strip_prefix("sqlite:")
            && !std::path::Path::new(path).exists()
        {
            return Err(anyhow!(
                "--sink-db {given}: no such file; nothing was changed (the reset moves the rows of the pipeline's existing sink database, it never creates one)"
            ))
            .code(ExitCode::Usage);
        }
    }
    let driver = match &a.sink_db {
        Some(url) if !a.keep_sink_progress => Some(
            SqlGrant::connect(url)
                .and_then(|g| SinkDriver::new(Some(g)))
                .map_err(|e| anyhow!("sink database {}: {e}", redact(url)))?,
        ),
        _ => None,
    };
    let rows = match &driver {
        Some(d) => d.progress_rows(&s.metadata.query_id)?,
        None => BTreeMap::new(),
    };
    let found = broker.as_ref().map(|b| Found {
        identity: &b.identity,
        watermarks: &b.watermarks,
        recreated: &recreated,
    });
    let plan = plan_rows(
        &recorded,
        found.as_ref(),
        &moving,
        &before,
        &after,
        &rows,
        a.reapply,
    );
    if driver.is_none() && !a.keep_sink_progress && recorded_sink.is_some() && plan.needs_rows {
        let db = recorded_sink.as_deref().unwrap_or("URL");
        let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        let mut cmd = format!(
            "host checkpoint reset {}",
            shell_word(&abs.display().to_string())
        );
        for t in &a.topics {
            cmd.push_str(&format!(" --topic {}", shell_word(t)));
        }
        cmd.push_str(&format!(" --to {}", shell_word(&a.to)));
        if let Some(b) = &a.brokers {
            cmd.push_str(&format!(" --brokers {}", shell_word(b)));
        }
        for (k, v) in &kafka {
            cmd.push_str(&format!(
                " --config {}",
                shell_word(&format!("kafka.{k}={}", redact_property(k, v)))
            ));
        }
        cmd.push_str(&format!(" --sink-db {}", shell_word(db)));
        if a.reapply {
            cmd.push_str(" --reapply");
        }
        return Err(anyhow!(
            "{}. The pipeline's sink database keeps progress rows that must be checked or moved with the checkpoint, or their offsets would be skipped as already applied; nothing was changed. Run `{cmd}`{}{}",
            plan.notes.join("; "),
            if cmd.contains("***") {
                " (with the secrets where *** stands)"
            } else {
                ""
            },
            if recreated.is_empty() {
                ", or pass --keep-sink-progress to leave the rows as they are"
            } else {
                ""
            }
        ))
        .code(ExitCode::Usage);
    }
    if a.reapply && driver.is_none() {
        return Err(anyhow!(
            "--reapply moves the sink's progress rows: pass --sink-db URL (the pipeline's sink database)"
        ))
        .code(ExitCode::Usage);
    }
    let RowPlan {
        changes,
        notes,
        identities,
        ..
    } = plan;
    if broker.is_none() && !recorded.is_empty() {
        tracing::warn!(
            "no --brokers: topic identities were not checked; after a topic was deleted and recreated, reset with --brokers so the checkpoint records the new topic"
        );
    }

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
    for n in &notes {
        outln!("{n}")?;
    }
    let query_id = s.metadata.query_id.clone();
    if driver.is_some() {
        for (tp, change) in &changes {
            let row = rows.get(tp);
            let new = match change {
                RowChange::Forget => None,
                RowChange::ReapplyFrom(at) => row.and_then(|r| r.below(*at)),
            };
            if row != new.as_ref() {
                outln!(
                    "sink progress {}/{}: {} -> {}",
                    tp.0,
                    tp.1,
                    show(row),
                    show(new.as_ref())
                )?;
            }
        }
        if !a.reapply {
            for (tp, o) in &after {
                let Some(row) = rows.get(tp).filter(|_| !changes.contains_key(tp)) else {
                    continue;
                };
                let n = row.applied_in(&(*o..row.end().unwrap_or(*o).max(*o)));
                if n > 0 {
                    outln!(
                        "sink progress {}/{}: {n} offsets from {o} on are already applied and will be skipped (--reapply applies them again: only for a destination that lost them, or they are applied twice)",
                        tp.0,
                        tp.1
                    )?;
                }
            }
        }
    }
    if a.keep_sink_progress && recorded_sink.is_some() {
        for t in recreated.keys() {
            outln!(
                "warning: --keep-sink-progress leaves the sink's rows of the old topic {t}: if its database still holds them, the next run skips the new topic's records at the offsets they show applied"
            )?;
        }
    }
    for ((t, p), o) in &after {
        let low = broker
            .as_ref()
            .and_then(|b| b.watermarks.get(&(t.clone(), *p)))
            .map_or(*o, |(low, _)| *low);
        if recreated.contains_key(t) && *o > low {
            outln!(
                "note: offsets [{low}, {o}) of the new topic {t}/{p} will not be applied (the reset moves past them)"
            )?;
        }
    }
    if !recreated.is_empty() {
        outln!(
            "note: the new topic's records get the idempotency keys (topic/partition/offset) the old one's had: a sink that deduplicates by key alone must forget the old topic's keys first"
        )?;
    }
    if abandon {
        outln!(
            "batch {} was planned but not committed and cannot be re-run (a topic was recreated): the reset abandons it",
            s.next_batch
        )?;
    }
    let Some(mut cp) = cp else {
        outln!("dry run: nothing written")?;
        return Ok(());
    };
    let plugins = s
        .last_committed
        .as_ref()
        .map(|c| c.plugins.clone())
        .or_else(|| s.last_planned.as_ref().map(|o| o.plugins.clone()))
        .unwrap_or_default();
    if abandon {
        cp.abandon(format!(
            "abandoned by `host checkpoint reset --to {}` (pid {}): {}",
            a.to,
            std::process::id(),
            notes.join("; ")
        ))?;
    }
    let batch_id = cp.next_batch_id();
    let mut moved = 0usize;
    if let Some(d) = &driver {
        let done = d.reset_progress(&query_id, cp.epoch().get(), batch_id, &changes)?;
        moved = done.values().filter(|r| r.before != r.after).count();
    }
    let mut note = format!(
        "reset to {} by `host checkpoint reset` (pid {}, {})",
        a.to,
        std::process::id(),
        rfc3339_ms(crate::util::now_ms())
    );
    if driver.is_some() {
        note.push_str(&format!("; sink progress rows moved: {moved}"));
    }
    for n in &notes {
        note.push_str("; ");
        note.push_str(n);
    }
    let sink_db = a.sink_db.as_deref().map(redact).or(recorded_sink);
    let batch = cp.reset(
        &after,
        plugins,
        ResetRecord {
            note,
            topics: identities,
            sink_db,
        },
    )?;
    if driver.is_some() {
        outln!("moved {moved} sink progress row(s) in one transaction")?;
    }
    outln!(
        "wrote batch {batch} (offsets/{batch} and commits/{batch}); the next run starts from AFTER"
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: Option<&str>, partitions: u32) -> TopicIdentity {
        TopicIdentity {
            id: s.map(str::to_string),
            partitions,
        }
    }

    fn tp(p: i32) -> (String, i32) {
        ("t".to_string(), p)
    }

    #[test]
    fn rows_of_a_recreated_or_shortened_log_are_forgotten_and_others_kept() {
        let moving = vec!["t".to_string()];
        let recorded = BTreeMap::from([("t".to_string(), id(Some("OLD"), 2))]);
        let before = BTreeMap::from([(tp(0), 10), (tp(1), 50)]);
        let after = BTreeMap::from([(tp(0), 0), (tp(1), 0)]);
        let rows = BTreeMap::from([
            (tp(0), AppliedSet::from_row(10, "[]").unwrap()),
            (tp(1), AppliedSet::from_row(10, "[]").unwrap()),
        ]);
        // Same id; partition 1 was reset forward past its end (50 > 15)
        // but its row (applied up to 10) fits the log: nothing forgotten,
        // yet the rows had to be read to know.
        let marks = BTreeMap::from([(tp(0), (0, 15)), (tp(1), (0, 15))]);
        let same = BTreeMap::from([("t".to_string(), id(Some("OLD"), 2))]);
        let gone = recreated_topics(&recorded, &same);
        let f = Found {
            identity: &same,
            watermarks: &marks,
            recreated: &gone,
        };
        let plan = plan_rows(&recorded, Some(&f), &moving, &before, &after, &rows, false);
        assert!(plan.changes.is_empty(), "{:?}", plan.changes);
        assert!(plan.needs_rows);
        // A new id: every partition forgotten, the new id recorded.
        let new = BTreeMap::from([("t".to_string(), id(Some("NEW"), 3))]);
        let gone = recreated_topics(&recorded, &new);
        let f = Found {
            identity: &new,
            watermarks: &marks,
            recreated: &gone,
        };
        let plan = plan_rows(&recorded, Some(&f), &moving, &before, &after, &rows, false);
        assert_eq!(plan.changes.len(), 2);
        assert!(plan.changes.values().all(|c| *c == RowChange::Forget));
        assert_eq!(plan.identities["t"], id(Some("NEW"), 3));
        assert!(plan.notes[0].contains("OLD to NEW"), "{:?}", plan.notes);
        // No ids at all (an old broker): a log that ends below what the
        // sink applied is another log.
        let none = BTreeMap::from([("t".to_string(), id(None, 2))]);
        let short = BTreeMap::from([(tp(0), (0, 5)), (tp(1), (0, 15))]);
        let gone = recreated_topics(&none, &none);
        let f = Found {
            identity: &none,
            watermarks: &short,
            recreated: &gone,
        };
        let plan = plan_rows(&none, Some(&f), &moving, &before, &after, &rows, false);
        assert_eq!(plan.changes, BTreeMap::from([(tp(0), RowChange::Forget)]));
        // --reapply cuts the other rows at the new positions.
        let plan = plan_rows(&none, Some(&f), &moving, &before, &after, &rows, true);
        assert_eq!(plan.changes[&tp(1)], RowChange::ReapplyFrom(0));
        assert_eq!(plan.changes[&tp(0)], RowChange::Forget);
        // Without the broker nothing can be told.
        let plan = plan_rows(&recorded, None, &moving, &before, &after, &rows, false);
        assert!(plan.changes.is_empty() && !plan.needs_rows);
    }
}
