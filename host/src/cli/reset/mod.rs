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

mod rows;
pub(super) mod targets;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;

use super::{CliError, ExitCode, WithCode};
use crate::capability::sql::{SqlGrant, redact};
use crate::checkpoint::{self, DirCheckpoint, OpenOptions, ResetRecord, TopicIdentity};
use crate::engine::{redact_property, shell_word};
use crate::sink::SinkDriver;
use crate::util::rfc3339_ms;
use rows::{Found, RowPlan, describe_moves, plan_rows};
use targets::{Target, ask_broker, positions, recreated_topics, targets};

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
    #[arg(long, value_name = "SERVERS", value_parser = crate::cli::parse_brokers)]
    pub brokers: Option<String>,
    /// The pipeline's sink database (`sqlite:PATH` or `postgres://…`),
    /// whose `sluice_progress` rows move with the reset. Required when
    /// they must move (a recreated or truncated topic, --reapply) and
    /// the pipeline has a sink database.
    #[arg(long, value_name = "URL", value_parser = crate::cli::SinkDbUrl)]
    pub sink_db: Option<String>,
    /// File whose first line is the sink database's password (PostgreSQL),
    /// for a --sink-db URL without one (else `PGPASSWORD`, `~/.pgpass`).
    #[arg(long, value_name = "FILE")]
    pub sink_db_password_file: Option<PathBuf>,
    /// PostgreSQL schema of the host's tables, as given to `host run`
    /// [default: public].
    #[arg(long, value_name = "SCHEMA")]
    pub sink_schema: Option<String>,
    /// Apply the records from the new positions again even where the
    /// sink's progress rows show them applied (say, after emptying the
    /// destination tables). Needs --sink-db.
    #[arg(long)]
    pub reapply: bool,
    /// Leave the sink's progress rows as they are: offsets they show
    /// applied are not applied again.
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

/// Run `host checkpoint reset`.
///
/// # Errors
/// Exit 3 while the checkpoint is owned; 2 for bad targets, or when the
/// sink's progress rows must move and no `--sink-db` was given; 1 for a
/// corrupt checkpoint, a broker or database error.
pub fn run(a: ResetArgs) -> Result<(), CliError> {
    let dir = &a.dir;
    let kafka = kafka_properties(&a.config)?;
    if a.reapply && a.keep_sink_progress {
        return Err(anyhow!(
            "--reapply moves the sink's progress rows and --keep-sink-progress leaves them: pick one"
        ))
        .code(ExitCode::Usage);
    }
    let target = Target::parse(&a.to)?;
    // Take the lock before reading what the reset is computed from, so no
    // pipeline runs between the read and the write.
    let cp = lock(&a)?;
    let s = checkpoint::status(dir)?;
    let moving = moving_topics(&a.topics, &s.metadata.fingerprint.topics)?;
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
        check_sink_db(url, a.sink_schema.as_deref(), recorded_sink.as_deref())?;
    }
    let driver = match &a.sink_db {
        Some(url) if !a.keep_sink_progress => Some(
            SqlGrant::connect_with(url, a.sink_db_password_file.as_deref())
                .and_then(|g| {
                    g.set_host_schema(a.sink_schema.clone())?;
                    SinkDriver::new(Some(g))
                })
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
        return Err(rows_advice(
            &a,
            &kafka,
            db,
            &plan.notes,
            recreated.is_empty(),
        ));
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
        for line in describe_moves(&rows, &changes, &after, a.reapply) {
            outln!("{line}")?;
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
    if let Some(out) = s
        .last_planned
        .as_ref()
        .and_then(|o| o.output.as_deref())
        .filter(|o| o.ends_with("(exactly-once)"))
    {
        outln!(
            "note: this pipeline produces to {out}: where the reset moves a partition back, the next start refuses to produce those offsets' outputs again (they were committed) unless it is started once with --output-reprocess"
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

/// `--config kafka.NAME=VALUE` pairs as librdkafka properties.
pub(super) fn kafka_properties(
    config: &[(String, String)],
) -> Result<BTreeMap<String, String>, CliError> {
    let mut kafka = BTreeMap::new();
    for (k, v) in config {
        let Some(name) = k.strip_prefix("kafka.") else {
            return Err(anyhow!(
                "--config {k}=…: checkpoint reset takes librdkafka properties only, as kafka.NAME=VALUE"
            ))
            .code(ExitCode::Usage);
        };
        kafka.insert(name.to_string(), v.clone());
    }
    Ok(kafka)
}

/// Refuse a running pipeline, then take the checkpoint's lock (none for a
/// dry run).
fn lock(a: &ResetArgs) -> Result<Option<DirCheckpoint>, CliError> {
    let s = checkpoint::status(&a.dir)?;
    if a.dry_run {
        return Ok(None);
    }
    if s.owner.is_some() {
        return Err(CliError {
            code: ExitCode::Owned,
            error: anyhow!(
                "checkpoint {} is owned by {}; stop it (SIGTERM) before resetting: reset refuses to move a running pipeline",
                a.dir.display(),
                checkpoint::describe_owner(&s.owner)
            ),
        });
    }
    let options = OpenOptions {
        topics: s.metadata.fingerprint.topics.clone(),
        create: false,
        ..OpenOptions::default()
    };
    DirCheckpoint::open(&a.dir, &options)
        .map(Some)
        .map_err(|e| CliError {
            code: if e.is_owned() {
                ExitCode::Owned
            } else {
                ExitCode::Failed
            },
            error: e.into(),
        })
}

/// The topics `--topic` names (each must be one of the checkpoint's
/// `all`), or all of them.
pub(super) fn moving_topics(given: &[String], all: &[String]) -> Result<Vec<String>, CliError> {
    if let Some(t) = given.iter().find(|t| !all.contains(t)) {
        return Err(anyhow!(
            "topic `{t}` is not in this checkpoint (its topics: {})",
            all.join(", ")
        ))
        .code(ExitCode::Usage);
    }
    Ok(if given.is_empty() {
        all.to_vec()
    } else {
        given.to_vec()
    })
}

/// `--sink-db` must be the database the pipeline keeps its progress in
/// (`recorded`, redacted) and, for SQLite, an existing file.
fn check_sink_db(url: &str, schema: Option<&str>, recorded: Option<&str>) -> Result<(), CliError> {
    let given = crate::capability::sql::sink_identity_in(url, schema)
        .map_err(|e| anyhow!("--sink-db {}: {e}", redact(url)))?;
    if let Some(recorded) = recorded
        && given != recorded
    {
        return Err(anyhow!(
            "--sink-db {given} is not the database this pipeline keeps its progress in ({recorded}, recorded in its newest offsets entry; `#schema=` is --sink-schema); nothing was changed. Pass that one: moving the rows of another database would make the pipeline skip or repeat records"
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
    Ok(())
}

/// The refusal when the sink's rows must move and no `--sink-db` was
/// given: why (`notes`), and the command to run, with the pipeline's sink
/// database `db`. `may_keep`: `--keep-sink-progress` is a safe choice too.
fn rows_advice(
    a: &ResetArgs,
    kafka: &BTreeMap<String, String>,
    db: &str,
    notes: &[String],
    may_keep: bool,
) -> CliError {
    let dir = &a.dir;
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
    for (k, v) in kafka {
        cmd.push_str(&format!(
            " --config {}",
            shell_word(&format!("kafka.{k}={}", redact_property(k, v)))
        ));
    }
    cmd.push_str(&format!(" --sink-db {}", shell_word(db)));
    if a.reapply {
        cmd.push_str(" --reapply");
    }
    CliError {
        code: ExitCode::Usage,
        error: anyhow!(
            "{}. The pipeline's sink database keeps progress rows that must be checked or moved with the checkpoint, or the next run would take the new records at their offsets as already applied; nothing was changed. Run `{cmd}`{}{}",
            notes.join("; "),
            if cmd.contains("***") {
                " (with the secrets where *** stands)"
            } else {
                ""
            },
            if may_keep {
                ", or pass --keep-sink-progress to leave the rows as they are"
            } else {
                ""
            }
        ),
    }
}
