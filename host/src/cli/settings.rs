//! The settings of `host run`, defined once: [`Settings`] is filled by
//! clap from the flags and the environment (`SLUICE_<NAME>`), and by serde
//! from the TOML file given with `--config-file` (the same names, snake
//! case). Precedence: flag, then environment, then file, then the default;
//! a switch (`until_caught_up`) is on when any of them turns it on.
//! Environment values never show in `--help` (they may hold a password).
//! [`resolve`] checks the merged values and makes the engine's
//! [`PipelineConfig`] (the engine knows neither clap nor the file).
//!
//! Longer than 650 lines on purpose: every setting is one field here,
//! with its flag, environment name, file key and help, so they cannot
//! drift apart.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{CliError, ExitCode, MIN_PLUGIN_TIMEOUT, WithCode, parse_bytes, parse_duration};
use crate::capability::sql::is_postgres_url;
use crate::engine::{DataLossPolicy, ErrorPolicy, PipelineConfig, ProgressMode, StartingOffsets};
use crate::output::{OutputConfig, OutputGuarantee};
use crate::plugin::Limits;

/// A clap parser for one of the engine's serde enums (lower-case names),
/// so the engine needs no clap.
fn serde_enum<T>(names: &'static [&'static str]) -> impl TypedValueParser<Value = T>
where
    T: DeserializeOwned + Clone + Send + Sync + 'static,
{
    PossibleValuesParser::new(names).try_map(|s| {
        T::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(&s))
            .map_err(|e| e.to_string())
    })
}

/// Serde for durations written as in the flags (`500ms`, `10s`, `2m`).
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|t| super::parse_duration(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Serde for byte counts written as in the flags (`256MiB`, `1048576`).
mod bytes_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(n: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match n {
            Some(n) => s.serialize_str(&n.to_string()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|t| super::parse_bytes(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// What a pipeline is and how it runs: every `host run` setting that the
/// config file may also hold. Each field is a flag (`--max-records-…`),
/// an environment variable (`SLUICE_MAX_RECORDS_…`) and a file key
/// (`max_records_per_partition`); unset fields take the engine's defaults.
#[derive(Debug, Default, Clone, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Kafka bootstrap servers, `HOST:PORT[,HOST:PORT…]`.
    #[arg(
        long,
        value_name = "SERVERS",
        env = "SLUICE_BROKERS",
        hide_env_values = true,
        value_parser = super::parse_brokers
    )]
    pub brokers: Option<String>,
    /// Topic to read; repeat for several, or separate them by commas
    /// (Kafka topic names have none).
    #[arg(
        long = "topic",
        value_name = "NAME",
        env = "SLUICE_TOPICS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    #[serde(default)]
    pub topics: Vec<String>,
    /// Run as a member of pipeline group NAME: the Kafka consumer group
    /// that splits the partitions between the hosts running NAME, and the
    /// key of the group's checkpoint in the sink database (--sink-db
    /// required, --checkpoint not used). Each record is applied by one
    /// member.
    #[arg(
        long,
        value_name = "NAME",
        env = "SLUICE_GROUP",
        hide_env_values = true
    )]
    pub group: Option<String>,
    /// Checkpoint directory (created if missing). One process owns it.
    #[arg(
        long,
        value_name = "DIR",
        env = "SLUICE_CHECKPOINT",
        hide_env_values = true
    )]
    pub checkpoint: Option<PathBuf>,
    /// Plugin component; repeat to chain map stages in order (a plugin
    /// exporting a sink stage provides the sink). Without it, the plugins
    /// recorded in the checkpoint are used; a different one is an upgrade.
    #[arg(long = "plugin", value_name = "FILE")]
    #[serde(default)]
    pub plugins: Vec<PathBuf>,
    /// Plugin configuration (the file's `[config]` table; flags use
    /// `--config KEY=VALUE`).
    #[arg(skip)]
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// librdkafka properties (the file's `[kafka]` table; flags use
    /// `--config kafka.<property>=VALUE`).
    #[arg(skip)]
    #[serde(default)]
    pub kafka: BTreeMap<String, String>,
    /// Sink database: `sqlite:PATH` or `postgres://USER@HOST:PORT/DB`.
    /// Sink plugins reach it through the sql capability, exactly once. A
    /// SQLite file the host creates is readable by its owner only (0600);
    /// an existing one keeps its mode.
    #[arg(
        long,
        value_name = "URL",
        env = "SLUICE_SINK_DB",
        hide_env_values = true,
        value_parser = crate::cli::SinkDbUrl
    )]
    pub sink_db: Option<String>,
    /// File whose first line is the sink database's password (PostgreSQL),
    /// for a --sink-db URL without one. Without it: `PGPASSWORD`, then
    /// `PGPASSFILE` or `~/.pgpass`, as libpq does.
    #[arg(
        long,
        value_name = "FILE",
        env = "SLUICE_SINK_DB_PASSWORD_FILE",
        hide_env_values = true
    )]
    pub sink_db_password_file: Option<PathBuf>,
    /// How long to keep reconnecting when the sink database's connection
    /// is lost (a restart, a failover), or retrying a part that waits on
    /// another session's locks (a deadlock, a frozen group member), before
    /// the job stops; the part in flight is applied again from its
    /// progress row [default: 5m].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, env = "SLUICE_SINK_RETRY_FOR", hide_env_values = true)]
    #[serde(default, with = "duration_text")]
    pub sink_retry_for: Option<Duration>,
    /// Connections to a PostgreSQL sink database that apply parts of
    /// different partitions at once, each part still one transaction with
    /// its progress row; a partition's parts keep their order on one
    /// connection [default: 1].
    #[arg(
        long,
        value_name = "N",
        env = "SLUICE_SINK_CONNECTIONS",
        hide_env_values = true
    )]
    pub sink_connections: Option<usize>,
    /// PostgreSQL schema that holds the host's tables (`sluice_progress`,
    /// `sluice_dead_letters`), always named in full, never found through
    /// `search_path` [default: public].
    #[arg(
        long,
        value_name = "SCHEMA",
        env = "SLUICE_SINK_SCHEMA",
        hide_env_values = true
    )]
    pub sink_schema: Option<String>,
    /// PostgreSQL role that plugin statements run as (`SET LOCAL ROLE`):
    /// one without privileges on the host's tables, so the database itself
    /// keeps plugins off them. Checked at start; see docs/plugins.md, "A plugin role".
    #[arg(
        long,
        value_name = "ROLE",
        env = "SLUICE_SINK_PLUGIN_ROLE",
        hide_env_values = true
    )]
    pub sink_plugin_role: Option<String>,
    /// Records per partition per batch [default: 10000].
    #[arg(
        long,
        value_name = "N",
        env = "SLUICE_MAX_RECORDS_PER_PARTITION",
        hide_env_values = true
    )]
    pub max_records_per_partition: Option<u64>,
    /// Time between batch starts when the topics have little data
    /// [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, env = "SLUICE_TRIGGER_INTERVAL", hide_env_values = true)]
    #[serde(default, with = "duration_text")]
    pub trigger_interval: Option<Duration>,
    /// Process what is available at start, then exit 0.
    #[arg(long, env = "SLUICE_UNTIL_CAUGHT_UP", hide_env_values = true)]
    #[serde(default)]
    pub until_caught_up: bool,
    /// Bad records: `fail` stops before committing, `dlq` stores them in
    /// sluice_dead_letters (needs --sink-db), `skip` counts and logs them
    /// [default: fail].
    #[arg(long, value_name = "POLICY", env = "SLUICE_ON_ERROR", hide_env_values = true, value_parser = serde_enum::<ErrorPolicy>(&["fail", "dlq", "skip"]))]
    pub on_error: Option<ErrorPolicy>,
    /// Offsets deleted by retention before they were read: `fail` stops,
    /// `skip` resumes at the log start and records the gap [default: fail].
    #[arg(long, value_name = "POLICY", env = "SLUICE_ON_DATA_LOSS", hide_env_values = true, value_parser = serde_enum::<DataLossPolicy>(&["fail", "skip"]))]
    pub on_data_loss: Option<DataLossPolicy>,
    /// Where the partitions a pipeline begins with start reading (also
    /// those of a topic added to a checkpoint later); partitions added to
    /// a topic while the pipeline runs start at their log start
    /// [default: earliest].
    #[arg(long, value_name = "WHERE", env = "SLUICE_STARTING_OFFSETS", hide_env_values = true, value_parser = serde_enum::<StartingOffsets>(&["earliest", "latest"]))]
    pub starting_offsets: Option<StartingOffsets>,
    /// Also commit processed offsets to this Kafka consumer group after
    /// each batch, for lag dashboards only: the checkpoint stays the truth,
    /// and the group does not share work between hosts.
    #[arg(
        long,
        value_name = "GROUP",
        env = "SLUICE_COMMIT_OFFSETS_TO",
        hide_env_values = true
    )]
    pub commit_offsets_to: Option<String>,
    /// The old name of --commit-offsets-to (accepted with a warning).
    #[arg(long, value_name = "GROUP", env = "SLUICE_GROUP_ID", hide = true)]
    pub group_id: Option<String>,
    /// Batches of checkpoint entries to keep [default: 100].
    #[arg(
        long,
        value_name = "N",
        env = "SLUICE_RETENTION",
        hide_env_values = true
    )]
    pub retention: Option<u64>,
    /// Bound on each Kafka operation (metadata, watermarks, fetch of a
    /// batch) before the job stops with an error [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, env = "SLUICE_KAFKA_TIMEOUT", hide_env_values = true)]
    #[serde(default, with = "duration_text")]
    pub kafka_timeout: Option<Duration>,
    /// Attempts for retryable plugin or sink failures and traps
    /// [default: 3].
    #[arg(
        long,
        value_name = "N",
        env = "SLUICE_ATTEMPTS",
        hide_env_values = true
    )]
    pub attempts: Option<u32>,
    /// Threads that run the map stage, each with its own plugin
    /// instances; a batch's partitions are spread over them [default: the
    /// available cores less 2 (fetch and sink), at least 1, at most 4].
    #[arg(
        long,
        value_name = "N",
        env = "SLUICE_MAP_THREADS",
        hide_env_values = true
    )]
    pub map_threads: Option<usize>,
    /// Deadline of one plugin call [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, env = "SLUICE_PLUGIN_TIMEOUT", hide_env_values = true)]
    #[serde(default, with = "duration_text")]
    pub plugin_timeout: Option<Duration>,
    /// Memory cap of each plugin instance [default: 256MiB].
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, env = "SLUICE_PLUGIN_MEMORY", hide_env_values = true)]
    #[serde(default, with = "bytes_text")]
    pub plugin_memory: Option<u64>,
    /// Serve Prometheus metrics on IP:PORT (`GET /metrics`), e.g.
    /// `127.0.0.1:9464`.
    #[arg(
        long,
        value_name = "IP:PORT",
        env = "SLUICE_METRICS_ADDR",
        hide_env_values = true
    )]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Progress output: `auto` (a live status line when stdout is a
    /// terminal, else JSON), `json` (one line per batch on stdout), `line`
    /// (status line on stderr), `none` [default: auto].
    #[arg(long, value_name = "MODE", env = "SLUICE_PROGRESS", hide_env_values = true, value_parser = serde_enum::<ProgressMode>(&["auto", "json", "line", "none"]))]
    pub progress: Option<ProgressMode>,
    /// Produce to topic NAME (it must exist). A map-only pipeline's
    /// outputs go there: key, value and headers as the map emitted them,
    /// the partition from the key (Java's murmur2 hash); without it they
    /// are counted and discarded. A sink stage may send records to it
    /// with the `kafka` capability: repeat the flag (or separate names by
    /// commas) for each topic the sink may name.
    #[arg(
        long = "output-topic",
        value_name = "NAME",
        env = "SLUICE_OUTPUT_TOPIC",
        hide_env_values = true,
        value_delimiter = ','
    )]
    #[serde(default, rename = "output_topic", deserialize_with = "one_or_many")]
    pub output_topics: Vec<String>,
    /// Bootstrap servers of the output topic's cluster, when it is not the
    /// input's; its librdkafka properties are `--config
    /// output.kafka.<property>=VALUE` (the file's `[output_kafka]` table)
    /// [default: --brokers, with the input's kafka.* settings].
    #[arg(
        long,
        value_name = "SERVERS",
        env = "SLUICE_OUTPUT_BROKERS",
        hide_env_values = true,
        value_parser = super::parse_brokers
    )]
    pub output_brokers: Option<String>,
    /// What the output topic's consumers may rely on: `exactly-once`
    /// (each output visible once to read_committed consumers: a batch's
    /// outputs and input positions commit in one Kafka transaction, with
    /// transactional.id sluice-<query id>; in a pipeline group, a part's,
    /// with sluice-<group>:<topic>:<partition>, map-only pipelines;
    /// consumers must read with isolation.level=read_committed; the topic
    /// on the input's cluster) or
    /// `at-least-once` (an idempotent producer, for brokers or ACLs
    /// without transactions; each output carries its idempotency key in
    /// the `sluice-idempotency-key` header) [default: exactly-once].
    #[arg(long, value_name = "GUARANTEE", env = "SLUICE_OUTPUT_GUARANTEE", hide_env_values = true, value_parser = serde_enum::<OutputGuarantee>(&["exactly-once", "at-least-once"]))]
    pub output_guarantee: Option<OutputGuarantee>,
    /// Exactly once: start even though the pipeline's output transactions
    /// already committed input positions past the checkpoint's (after
    /// `host checkpoint reset` or `host group reset` moved it back on
    /// purpose), producing the outputs of those offsets again. Without it such a start is refused
    /// (a restored older checkpoint would duplicate outputs).
    #[arg(long, env = "SLUICE_OUTPUT_REPROCESS", hide_env_values = true)]
    #[serde(default)]
    pub output_reprocess: bool,
    /// librdkafka properties of the output producer (the file's
    /// `[output_kafka]` table; flags use `--config
    /// output.kafka.<property>=VALUE`).
    #[arg(skip)]
    #[serde(default)]
    pub output_kafka: BTreeMap<String, String>,
}

impl Settings {
    /// Read a config file.
    ///
    /// # Errors
    /// Exit 2 naming the file and the key that is unknown or malformed.
    pub fn from_file(path: &std::path::Path) -> Result<Settings, CliError> {
        let text = crate::util::read_text_capped(path, 1 << 20)
            .with_context(|| format!("cannot read config file {}", path.display()))
            .code(ExitCode::Usage)?;
        // toml's own message quotes the offending line, which may hold a
        // password: say where instead.
        toml::from_str(&text).map_err(|e| {
            let line = e
                .span()
                .and_then(|s| text.get(..s.start))
                .map_or(1, |before| before.matches('\n').count() + 1);
            // The key of that line, not its value.
            let key = text
                .lines()
                .nth(line - 1)
                .and_then(|l| l.split_once('='))
                .map(|(k, _)| format!(" (`{}`)", k.trim()))
                .unwrap_or_default();
            usage(format!(
                "config file {}, line {line}{key}: {}",
                path.display(),
                e.message()
            ))
        })
    }

    /// These settings over `under`: every field set here (a value, a
    /// non-empty list, `true`) wins, the rest comes from `under`.
    ///
    /// # Errors
    /// Exit 2 if the two do not merge (a bug: both are `Settings`).
    pub fn over(&self, under: &Settings) -> Result<Settings, CliError> {
        let unset = |v: &serde_json::Value| match v {
            serde_json::Value::Null | serde_json::Value::Bool(false) => true,
            serde_json::Value::Array(a) => a.is_empty(),
            serde_json::Value::Object(o) => o.is_empty(),
            _ => false,
        };
        let merge = || -> serde_json::Result<Settings> {
            let mut merged = serde_json::to_value(under)?;
            if let (Some(m), serde_json::Value::Object(top)) =
                (merged.as_object_mut(), serde_json::to_value(self)?)
            {
                for (k, v) in top {
                    if !unset(&v) {
                        m.insert(k, v);
                    }
                }
            }
            serde_json::from_value(merged)
        };
        merge()
            .context("merging flags and config file")
            .code(ExitCode::Usage)
    }
}

/// The ranges durations and sizes must fall in (usage error otherwise):
/// below the floor a setting is meaningless or burns CPU; above the ceiling
/// it is a typo, and deadlines computed from it could overflow.
pub const TRIGGER_INTERVAL: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(24 * 3600));
/// Range of `--kafka-timeout`.
pub const KAFKA_TIMEOUT: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(24 * 3600));
/// Range of `--plugin-timeout` (deadlines are checked every 5 ms).
pub const PLUGIN_TIMEOUT: (Duration, Duration) =
    (MIN_PLUGIN_TIMEOUT, Duration::from_secs(24 * 3600));
/// Range of `--plugin-memory`, bytes: a Wasm32 memory holds at most 4 GiB.
pub const PLUGIN_MEMORY: (u64, u64) = (1 << 20, 4 << 30);
/// Range of `--sink-retry-for`.
pub const SINK_RETRY_FOR: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(24 * 3600));
/// Range of `--sink-connections`: each is a PostgreSQL backend (a
/// process on the server) and a sink plugin instance.
pub const SINK_CONNECTIONS: (usize, usize) = (1, 64);
/// Most `--map-threads`: each thread holds a whole map chain's instances
/// (up to `--plugin-memory` each), so a typo must not start thousands.
pub const MAP_THREADS_MAX: usize = 256;
/// Range of `--wait` and `--takeover`.
pub const WAIT: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(7 * 24 * 3600));

/// `value` of `flag` if it lies in `[min, max]`, else a usage error that
/// says the range (`show` formats the bounds).
pub fn within<T: PartialOrd + Copy>(
    flag: &str,
    value: T,
    (min, max): (T, T),
    show: impl Fn(T) -> String,
) -> Result<T, CliError> {
    if value < min || value > max {
        return Err(usage(format!(
            "{flag} {} is out of range: use {} to {}",
            show(value),
            show(min),
            show(max)
        )));
    }
    Ok(value)
}

/// A byte count in MiB, for range messages.
pub fn show_mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

/// A duration as the flags write it (`1h 30m`, `10ms`).
pub fn show_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn missing(flag: &str) -> CliError {
    usage(format!(
        "{flag} is required (as a flag, in the environment, or in --config-file)"
    ))
}

/// A usage error (exit 2) with `message`.
fn usage(message: impl std::fmt::Display) -> CliError {
    CliError {
        code: ExitCode::Usage,
        error: anyhow::anyhow!("{message}"),
    }
}

/// Check merged settings and make the engine's pipeline definition.
/// `config` are the `--config KEY=VALUE` flags (`kafka.`-prefixed ones go
/// to librdkafka), applied over the file's tables.
///
/// # Errors
/// Exit 2 for a missing or out-of-range setting, naming its flag.
pub fn resolve(s: Settings, config: &[(String, String)]) -> Result<PipelineConfig, CliError> {
    let brokers = s.brokers.ok_or_else(|| missing("--brokers"))?;
    let mut topics = s.topics;
    if topics.is_empty() {
        return Err(missing("--topic"));
    }
    if let Some(g) = &s.group
        && (g.trim().is_empty()
            || g.trim() != g
            || g.chars().count() > 200
            || g.chars().any(char::is_control))
    {
        return Err(usage(format!(
            "--group {g:?}: a group name is 1 to 200 characters, without control characters or surrounding spaces (it is the Kafka consumer group id and a key in the sink database)"
        )));
    }
    let checkpoint = match (&s.group, s.checkpoint) {
        (None, c) => c.ok_or_else(|| missing("--checkpoint"))?,
        (Some(g), None) => {
            if s.sink_db.is_none() {
                return Err(usage(format!(
                    "--group {g} needs --sink-db: a pipeline group keeps its checkpoint (owners, planned ranges, progress) in the sink database"
                )));
            }
            PathBuf::new()
        }
        (Some(_), Some(c)) => {
            return Err(usage(format!(
                "--group and --checkpoint {} exclude each other: a group's checkpoint is in the sink database",
                c.display()
            )));
        }
    };
    topics.sort();
    topics.dedup();
    if topics.iter().any(|t| t.trim().is_empty()) || brokers.trim().is_empty() {
        return Err(usage("--brokers and --topic must not be empty"));
    }
    let mut cfg = PipelineConfig::new(brokers, topics, checkpoint);
    cfg.plugins = s.plugins;
    cfg.plugin_config = s.config;
    cfg.kafka = s.kafka;
    let mut output_kafka = s.output_kafka;
    for (k, v) in config {
        if let Some(prop) = k.strip_prefix("kafka.") {
            cfg.kafka.insert(prop.to_string(), v.clone());
        } else if let Some(prop) = k.strip_prefix("output.kafka.") {
            output_kafka.insert(prop.to_string(), v.clone());
        } else {
            cfg.plugin_config.insert(k.clone(), v.clone());
        }
    }
    brokers_fit("--brokers", &cfg.brokers, &cfg.kafka)?;
    cfg.sink_db = s.sink_db;
    if let Some(f) = &s.sink_db_password_file
        && let Err(e) = std::fs::File::open(f)
    {
        return Err(usage(format!(
            "--sink-db-password-file {}: {e}",
            f.display()
        )));
    }
    cfg.sink_db_password_file = s.sink_db_password_file;
    for (flag, name) in [
        ("--sink-schema", &s.sink_schema),
        ("--sink-plugin-role", &s.sink_plugin_role),
    ] {
        if let Some(n) = name
            && (n.is_empty() || n.len() > 63 || n.contains('\0'))
        {
            return Err(usage(format!(
                "{flag} must be a PostgreSQL name of 1 to 63 bytes"
            )));
        }
    }
    if (s.sink_schema.is_some() || s.sink_plugin_role.is_some())
        && !cfg.sink_db.as_deref().is_some_and(is_postgres_url)
    {
        return Err(usage(
            "--sink-schema and --sink-plugin-role are for a PostgreSQL --sink-db (on SQLite the host's tables are in `main` and the authorizer guards them)",
        ));
    }
    cfg.group = s.group;
    cfg.sink_schema = s.sink_schema;
    cfg.sink_plugin_role = s.sink_plugin_role;
    if let Some(d) = s.sink_retry_for {
        cfg.sink_retry_for = within("--sink-retry-for", d, SINK_RETRY_FOR, show_duration)?;
    }
    if let Some(n) = s.sink_connections {
        cfg.sink_connections =
            within("--sink-connections", n, SINK_CONNECTIONS, |n| n.to_string())?;
        match cfg.sink_db.as_deref() {
            _ if n == 1 => {}
            None => {
                return Err(usage(format!(
                    "--sink-connections {n} applies parts on {n} connections to a PostgreSQL --sink-db; without a --sink-db there is no connection"
                )));
            }
            Some(u) if !is_postgres_url(u) => {
                return Err(usage(format!(
                    "--sink-connections {n} is for a PostgreSQL --sink-db: SQLite lets one connection write at a time, so more would only wait for each other (leave it at 1)"
                )));
            }
            Some(_) => {}
        }
    }
    if let Some(n) = s.max_records_per_partition {
        if n == 0 {
            return Err(usage("--max-records-per-partition must be at least 1"));
        }
        cfg.max_records_per_partition = n;
    }
    if let Some(d) = s.trigger_interval {
        cfg.trigger_interval = within("--trigger-interval", d, TRIGGER_INTERVAL, show_duration)?;
    }
    cfg.until_caught_up = s.until_caught_up;
    cfg.on_error = s.on_error.unwrap_or(cfg.on_error);
    cfg.on_data_loss = s.on_data_loss.unwrap_or(cfg.on_data_loss);
    cfg.starting_offsets = s.starting_offsets.unwrap_or(cfg.starting_offsets);
    if let (Some(old), Some(new)) = (&s.group_id, &s.commit_offsets_to)
        && old != new
    {
        return Err(usage(format!(
            "--group-id {old} and --commit-offsets-to {new} are the same setting (the old and the new name); give only --commit-offsets-to"
        )));
    }
    if let Some(old) = s.group_id {
        tracing::warn!(
            "--group-id (SLUICE_GROUP_ID, `group_id` in the file) is now --commit-offsets-to: it only mirrors committed offsets into a consumer group for lag dashboards, and two hosts with the same value both apply every record"
        );
        if s.commit_offsets_to.is_none() {
            cfg.commit_offsets_to = Some(old);
        }
    }
    if s.commit_offsets_to.is_some() {
        cfg.commit_offsets_to = s.commit_offsets_to;
    }
    cfg.retention = s.retention.unwrap_or(cfg.retention);
    if cfg.retention == 0 {
        return Err(usage(
            "--retention must be at least 1 (the newest batch is always kept)",
        ));
    }
    if let Some(d) = s.kafka_timeout {
        cfg.kafka_timeout = within("--kafka-timeout", d, KAFKA_TIMEOUT, show_duration)?;
    }
    cfg.attempts = s.attempts.unwrap_or(cfg.attempts);
    if cfg.attempts == 0 {
        return Err(usage("--attempts must be at least 1 (1 = no retries)"));
    }
    cfg.map_threads = s.map_threads.unwrap_or(cfg.map_threads);
    if !(1..=MAP_THREADS_MAX).contains(&cfg.map_threads) {
        return Err(usage(format!(
            "--map-threads must be 1 to {MAP_THREADS_MAX} (it was {})",
            cfg.map_threads
        )));
    }
    let defaults = Limits::default();
    let call_timeout = s.plugin_timeout.unwrap_or(defaults.call_timeout);
    let memory_bytes = s.plugin_memory.unwrap_or(defaults.memory_bytes);
    cfg.limits = Limits {
        call_timeout: within(
            "--plugin-timeout",
            call_timeout,
            PLUGIN_TIMEOUT,
            show_duration,
        )?,
        memory_bytes: within("--plugin-memory", memory_bytes, PLUGIN_MEMORY, show_mib)?,
    };
    cfg.progress = s.progress.unwrap_or(ProgressMode::Auto);
    cfg.metrics_addr = s.metrics_addr;
    cfg.output = output(
        s.output_topics,
        s.output_brokers,
        output_kafka,
        s.output_guarantee,
        s.output_reprocess,
    )?;
    Ok(cfg)
}

/// `brokers` (given as `flag`) fit the client's librdkafka properties
/// `kafka` (its `security.protocol`, plaintext by default).
fn brokers_fit(
    flag: &str,
    brokers: &str,
    kafka: &BTreeMap<String, String>,
) -> Result<(), CliError> {
    crate::source::check_brokers(
        brokers,
        Some(
            kafka
                .get("security.protocol")
                .map_or("plaintext", String::as_str),
        ),
    )
    .map_err(|e| usage(format!("{flag} {e}")))
}

/// A config file's `output_topic`: one name, or a list of them.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(t) => vec![t],
        OneOrMany::Many(v) => v,
    })
}

/// The output settings, checked: the other output flags need
/// `--output-topic`; a topic named twice is kept once, in the order first
/// given.
fn output(
    mut topics: Vec<String>,
    brokers: Option<String>,
    kafka: BTreeMap<String, String>,
    guarantee: Option<OutputGuarantee>,
    reprocess: bool,
) -> Result<Option<OutputConfig>, CliError> {
    if topics.is_empty() {
        if brokers.is_some() || guarantee.is_some() || !kafka.is_empty() || reprocess {
            return Err(usage(
                "--output-brokers, --output-guarantee, --output-reprocess and output.kafka.* settings are for the output topic: give --output-topic NAME too",
            ));
        }
        return Ok(None);
    }
    // Kafka's rule for topic names (Topic.java): 1 to 249 characters of
    // ASCII letters, digits, '.', '_' and '-', not "." or "..".
    for topic in &topics {
        if topic.is_empty()
            || topic.len() > 249
            || topic == "."
            || topic == ".."
            || !topic
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(usage(format!(
                "--output-topic {topic:?} is not a Kafka topic name (1 to 249 of a-z, A-Z, 0-9, '.', '_', '-')"
            )));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    topics.retain(|t| seen.insert(t.clone()));
    if reprocess && guarantee == Some(OutputGuarantee::AtLeastOnce) {
        return Err(usage(
            "--output-reprocess is for exactly once (it lets a start produce again what the output transactions committed); at-least-once needs none",
        ));
    }
    if let Some(b) = &brokers {
        brokers_fit("--output-brokers", b, &kafka)?;
    }
    Ok(Some(OutputConfig {
        topics,
        brokers,
        kafka,
        guarantee: guarantee.unwrap_or(OutputGuarantee::ExactlyOnce),
        reprocess,
    }))
}
