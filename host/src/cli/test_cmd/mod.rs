//! `host test`: run a plugin's stages over records from a file and print
//! what they do as JSON lines: map outputs, bad records, and the SQL
//! statements of a sink stage (`sink`: committed per part with
//! `--sink-db`, rolled back with `--dry-run`, or not run). No Kafka,
//! no checkpoint: the quickest way to see what a plugin does with real
//! input. `input` reads the file.

use std::collections::BTreeMap;
use std::io::{BufWriter, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use clap::{Args, ValueEnum};
use sluice_guest::wire::Record;

use super::{CliError, ExitCode, LimitArgs, WithCode, parse_kv};
use crate::capability::sql::{Dialect, SqlGrant};
use crate::plugin::chain::{
    DEFAULT_ISOLATION_TRAPS, Rejection, TrapBudget, isolate_traps, run_chain,
};
use crate::plugin::{CallContext, PluginError, Runtime};

mod input;
mod sink;

/// Flags of `host test`.
#[derive(Debug, Args)]
pub struct TestArgs {
    /// Plugin component. Its map stage runs over the input (repeat to
    /// chain stages in order); a sink stage gets the mapped records, and
    /// its SQL statements are printed (see --sink-db).
    #[arg(long = "plugin", value_name = "FILE", required = true)]
    pub plugins: Vec<PathBuf>,

    /// Input file, or `-` for stdin.
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,

    /// How to read the input.
    #[arg(long, value_enum, default_value_t = InputFormat::Lines)]
    pub format: InputFormat,

    /// Plugin configuration pair (what the plugin's `config` import
    /// returns). Repeatable.
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub config: Vec<(String, String)>,

    /// `host run`'s TOML config file: its `[config]` table gives the
    /// plugins' pairs (the same file rehearses what a run gets); --config
    /// pairs override it. Its other settings are not read here.
    #[arg(long, value_name = "FILE")]
    pub config_file: Option<PathBuf>,

    /// Database the sink stage writes: `sqlite:PATH` or `postgres://…`.
    /// Each partition's records are one part in one transaction, as under
    /// `host run`, committed when the part succeeds (no progress row is
    /// written: running the same input again applies it again), or rolled
    /// back with --dry-run. Use a scratch database, not a running
    /// pipeline's. Without it the statements are checked and printed, not
    /// run, and the sink's queries return no rows (see --sink-dialect).
    #[arg(long, value_name = "URL", value_parser = crate::cli::SinkDbUrl)]
    pub sink_db: Option<String>,

    /// File whose first line is the --sink-db password (PostgreSQL), as
    /// for `host run`.
    #[arg(long, value_name = "FILE", requires = "sink_db")]
    pub sink_db_password_file: Option<PathBuf>,

    /// Role the sink's statements run as on PostgreSQL (`SET LOCAL ROLE`),
    /// as `host run --sink-plugin-role`.
    #[arg(long, value_name = "ROLE", requires = "sink_db")]
    pub sink_plugin_role: Option<String>,

    /// Without --sink-db: the database the sink is told it writes
    /// (`sql.dialect`). Its statements are checked by the host's rules on
    /// the text only (PostgreSQL: the statement parser; SQLite: the first
    /// keyword; SQLite's authorizer and either database's own errors need
    /// --sink-db).
    #[arg(long, value_enum, default_value_t = SinkDialect::Sqlite, conflicts_with = "sink_db")]
    pub sink_dialect: SinkDialect,

    /// With --sink-db: roll each part's transaction back instead of
    /// committing it, so the database is left as it was (the statements
    /// still take their locks until then).
    #[arg(long)]
    pub dry_run: bool,

    /// Run the map stages only, not a plugin's sink stage.
    #[arg(long)]
    pub no_sink: bool,

    /// Show where `host run --output-topic NAME` would produce: a map-only
    /// pipeline's output lines gain `"produced_to": {"topic", "partition"}`,
    /// the partition picked from the key as the producer does (Java's
    /// murmur2 hash modulo --output-partitions, which it needs; `null`
    /// without a key: any partition); a sink stage may send to the topics
    /// named (repeat the flag, or separate names by commas), each record
    /// it sends shown as a `send` line. Nothing is produced.
    #[arg(
        long,
        value_name = "NAME",
        requires = "output_partitions",
        value_delimiter = ','
    )]
    pub output_topic: Vec<String>,

    /// Partitions of each --output-topic (as the brokers report it);
    /// required with --output-topic.
    #[arg(long, value_name = "N", requires = "output_topic", value_parser = clap::value_parser!(i32).range(1..))]
    pub output_partitions: Option<i32>,

    /// Sandbox limits.
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// The dialects of `--sink-dialect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SinkDialect {
    /// SQLite.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

/// Input formats of `host test`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InputFormat {
    /// Each line is one record value (topic `test`, partition 0, offsets
    /// from 0, no key, no headers).
    Lines,
    /// Each line is a JSON object: topic, partition, offset, timestamp,
    /// timestamp_type, key / key_b64, value / value_b64 (null = absent),
    /// headers: [{key, value / value_b64}].
    Records,
}

/// Put bytes into a JSON object as `name` (UTF-8 text), `name_b64`
/// (other bytes) or `name: null` (absent).
pub(super) fn put_bytes(
    obj: &mut serde_json::Map<String, serde_json::Value>,
    name: &str,
    bytes: Option<&[u8]>,
) {
    match bytes {
        None => {
            obj.insert(name.into(), serde_json::Value::Null);
        }
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => {
                obj.insert(name.into(), s.into());
            }
            Err(_) => {
                obj.insert(format!("{name}_b64"), B64.encode(b).into());
            }
        },
    }
}

/// Run `host test`.
///
/// # Errors
/// Exit 2 for unreadable input, exit 1 for an unloadable plugin, a trap or
/// a fatal stage error.
pub fn run(args: TestArgs) -> Result<(), CliError> {
    let mut input = Vec::new();
    if args.input.as_os_str() == "-" {
        std::io::stdin()
            .read_to_end(&mut input)
            .context("reading stdin")
            .code(ExitCode::Usage)?;
    } else {
        input = std::fs::read(&args.input)
            .with_context(|| format!("cannot read input {}", args.input.display()))
            .code(ExitCode::Usage)?;
    }
    let owned = input::parse_records(&input, args.format).code(ExitCode::Usage)?;

    let runtime = Runtime::new(args.limits.limits()).map_err(anyhow::Error::msg)?;
    let mut config = match &args.config_file {
        Some(p) => crate::cli::settings::Settings::from_file(p)?.config,
        None => BTreeMap::new(),
    };
    config.extend(args.config);
    let config: Arc<BTreeMap<String, String>> = Arc::new(config);
    let mut stages = Vec::new();
    let mut sink_plugin = None;
    for path in &args.plugins {
        let plugin = runtime.load(path, config.clone())?;
        let has = plugin.stages();
        if !has.map && (args.no_sink || !has.sink) {
            return Err(CliError {
                code: ExitCode::Failed,
                error: anyhow::anyhow!(
                    "plugin {} (sha256:{}) has no map stage (it exports: {}); with --no-sink `host test` runs map stages only",
                    path.display(),
                    plugin.digest(),
                    has.names().join(", ")
                ),
            });
        }
        tracing::info!(
            plugin = %path.display(),
            digest = plugin.digest(),
            stages = has.names().join(", "),
            "loaded"
        );
        if has.map {
            stages.push(plugin.instance());
        }
        if has.sink && !args.no_sink {
            if let Some((other, _)) = &sink_plugin {
                return Err(CliError {
                    code: ExitCode::Usage,
                    error: anyhow::anyhow!(
                        "two plugins export a sink stage ({} and {}); a pipeline has one sink (or pass --no-sink)",
                        other,
                        path.display()
                    ),
                });
            }
            sink_plugin = Some((path.display().to_string(), plugin));
        }
    }
    if stages.is_empty() {
        tracing::info!("no map stage: the sink stage gets each record as it was read");
    }
    let grant = match (&sink_plugin, &args.sink_db) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(CliError {
                code: ExitCode::Usage,
                error: anyhow::anyhow!(
                    "--sink-db is for a sink stage, and no plugin given exports one (or --no-sink is set)"
                ),
            });
        }
        (Some(_), Some(url)) => {
            let shown = crate::capability::sql::redact(url);
            let g = SqlGrant::connect_with(url, args.sink_db_password_file.as_deref())
                .and_then(|g| {
                    // The limits of `host run`: each statement bounded by
                    // the plugin call deadline (and a lock wait by half).
                    g.limit_statements(args.limits.plugin_timeout)?;
                    g.set_plugin_role(args.sink_plugin_role.clone())?;
                    Ok(g)
                })
                .map_err(|e| anyhow::anyhow!("sink database {shown}: {e}"))?;
            g.record();
            Some(g)
        }
        (Some(_), None) => {
            let dialect = match args.sink_dialect {
                SinkDialect::Sqlite => Dialect::Sqlite,
                SinkDialect::Postgres => Dialect::Postgres,
            };
            tracing::info!(
                "no --sink-db: the sink's statements are printed, not run, and its queries return no rows (dialect {})",
                dialect.name()
            );
            Some(SqlGrant::dry(dialect))
        }
    };

    let records: Vec<Record<'_>> = owned
        .iter()
        .map(|o| o.record.view(&o.topic, o.partition))
        .collect();
    let ctx = CallContext {
        query_id: "host-test".into(),
        batch_id: 0,
        epoch: 0,
    };
    // A trap is narrowed down to the records that cause it (as under
    // `host run --on-error dlq`), so the author sees which input it is and
    // the outputs of all the others; the command still fails.
    let result = match run_chain(&mut stages, &ctx, &records) {
        Err(PluginError::Trap(t)) => {
            let never = std::sync::atomic::AtomicBool::new(false);
            let mut budget = TrapBudget {
                stop: &never,
                traps_left: DEFAULT_ISOLATION_TRAPS,
                attempts: 1,
            };
            isolate_traps(&mut stages, &ctx, &records, t, &mut budget)?
        }
        other => other?,
    };

    let rehearsal = match (&sink_plugin, &grant) {
        (Some((_, plugin)), Some(grant)) => {
            let mut instance = plugin.instance_with_sql(Some(grant.clone()));
            let topics = args.output_partitions.map(|n| {
                let named = args.output_topic.iter().map(|t| (t.clone(), n));
                crate::capability::kafka::KafkaGrant::new(named.collect())
            });
            instance.grant_kafka(topics.map(std::sync::Arc::new));
            let keep = args.sink_db.is_some() && !args.dry_run;
            let to = sink::Targets {
                keep,
                partitions: args.output_partitions,
            };
            sink::rehearse(&mut instance, grant, &ctx, (&owned, &result.outputs), to)
        }
        _ => sink::Rehearsal::default(),
    };
    let sink_stage = stages.len();
    let sink_digest = sink_plugin
        .as_ref()
        .map(|(_, p)| p.digest().to_string())
        .unwrap_or_default();

    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut outputs = result.outputs.iter().peekable();
    let mut rejected = result.rejected.iter().peekable();
    let mut filtered = 0usize;
    let empty = Vec::new();
    for (i, r) in records.iter().enumerate() {
        let mut any = false;
        for line in rehearsal.before.get(&i).unwrap_or(&empty) {
            writeln!(out, "{line}").map_err(super::stdout_error)?;
        }
        while let Some(o) = outputs.next_if(|o| o.source_index == i) {
            any = true;
            let mut obj = serde_json::Map::new();
            obj.insert("type".into(), "output".into());
            obj.insert(
                "idempotency_key".into(),
                o.idempotency_key(r.topic, r.partition).into(),
            );
            obj.insert("topic".into(), r.topic.into());
            obj.insert("partition".into(), r.partition.into());
            obj.insert("offset".into(), r.offset.into());
            put_bytes(&mut obj, "key", o.key.as_deref());
            put_bytes(&mut obj, "value", o.value.as_deref());
            let headers: Vec<serde_json::Value> = o
                .headers
                .iter()
                .map(|(k, v)| {
                    let mut h = serde_json::Map::new();
                    h.insert("key".into(), k.clone().into());
                    put_bytes(&mut h, "value", v.as_deref());
                    serde_json::Value::Object(h)
                })
                .collect();
            obj.insert("headers".into(), headers.into());
            if let (Some(topic), Some(partitions), None) = (
                args.output_topic.first(),
                args.output_partitions,
                &sink_plugin,
            ) {
                obj.insert(
                    "produced_to".into(),
                    serde_json::json!({
                        "topic": topic,
                        "partition": crate::output::partition_of_key(
                            o.key.as_deref(),
                            partitions
                        ),
                    }),
                );
            }
            writeln!(out, "{}", serde_json::Value::Object(obj)).map_err(super::stdout_error)?;
        }
        while let Some(b) = rejected.next_if(|b| b.source_index == i) {
            any = true;
            let line = serde_json::json!({
                "type": "bad_record",
                "topic": r.topic,
                "partition": r.partition,
                "offset": r.offset,
                "stage": b.stage,
                "plugin_digest": b.plugin_digest,
                "error": b.message,
            });
            writeln!(out, "{line}").map_err(super::stdout_error)?;
        }
        for line in rehearsal.rejected_lines.get(&i).unwrap_or(&empty) {
            writeln!(out, "{line}").map_err(super::stdout_error)?;
        }
        for (_, message) in rehearsal.rejected.iter().filter(|(s, _)| *s == i) {
            any = true;
            let line = serde_json::json!({
                "type": "bad_record",
                "topic": r.topic,
                "partition": r.partition,
                "offset": r.offset,
                "stage": sink_stage,
                "plugin_digest": sink_digest,
                "error": message,
            });
            writeln!(out, "{line}").map_err(super::stdout_error)?;
        }
        for line in rehearsal.after.get(&i).unwrap_or(&empty) {
            writeln!(out, "{line}").map_err(super::stdout_error)?;
        }
        if !any {
            filtered += 1;
        }
    }
    out.flush().map_err(super::stdout_error)?;
    if let Some(e) = rehearsal.failed {
        let hint = if args.sink_db.is_none() && rehearsal.statements > 0 {
            " (no --sink-db: the dry run's queries return no rows, so a sink that reads its tables finds none; give --sink-db to rehearse on your database, or --no-sink to run the map stages only)"
        } else {
            ""
        };
        return Err(CliError {
            code: ExitCode::Failed,
            error: e.context(format!(
                "the sink stage stopped (its SQL statements and the records it sent are printed above; `host run` would produce none of this part's records){hint}"
            )),
        });
    }
    let trapped: Vec<&Rejection> = result.rejected.iter().filter(|r| r.trapped).collect();
    if let Some(first) = trapped.first() {
        return Err(CliError {
            code: ExitCode::Failed,
            error: anyhow::anyhow!(
                "{} record(s) made the plugin trap (their lines above are bad_record); the first: {}",
                trapped.len(),
                first.message
            ),
        });
    }
    tracing::info!(
        records = records.len(),
        outputs = result.outputs.len(),
        bad_records = result.rejected.len() + rehearsal.rejected.len(),
        statements = rehearsal.statements,
        committed_parts = rehearsal.committed,
        filtered,
        "done"
    );
    Ok(())
}
