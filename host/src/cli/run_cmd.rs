//! `host run`: the pipeline. Flags and the TOML config file share one
//! definition ([`FileConfig`] mirrors the flags); flags win.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::Deserialize;

use super::{CliError, ExitCode, WithCode, parse_bytes, parse_duration, parse_kv};
use crate::engine::{
    self, DataLossPolicy, ErrorPolicy, PipelineConfig, ProgressMode, StartingOffsets,
};
use crate::plugin::Limits;

/// Flags of `host run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Kafka bootstrap servers, `HOST:PORT[,HOST:PORT…]`.
    #[arg(long, value_name = "SERVERS")]
    pub brokers: Option<String>,
    /// Topic to read; repeat for several.
    #[arg(long = "topic", value_name = "NAME")]
    pub topics: Vec<String>,
    /// Checkpoint directory (created if missing). One process owns it.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// Plugin component; repeat to chain map stages in order (a plugin
    /// exporting a sink stage provides the sink). Without it, the plugins
    /// recorded in the checkpoint are used; a different one is an upgrade.
    #[arg(long = "plugin", value_name = "FILE")]
    pub plugins: Vec<PathBuf>,
    /// Plugin configuration pair (`kafka.<property>=…` goes to librdkafka
    /// instead). Repeatable.
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub config: Vec<(String, String)>,
    /// TOML file with the same settings (flags override it).
    #[arg(long, value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// Sink database: `sqlite:PATH` or `postgres://USER@HOST:PORT/DB`.
    /// Sink plugins reach it through the sql capability, exactly once.
    #[arg(long, value_name = "URL")]
    pub sink_db: Option<String>,
    /// Records per partition per batch [default: 10000].
    #[arg(long, value_name = "N")]
    pub max_records_per_partition: Option<u64>,
    /// Time between batch starts when the topics have little data
    /// [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub trigger_interval: Option<Duration>,
    /// Process what is available at start, then exit 0.
    #[arg(long)]
    pub until_caught_up: bool,
    /// Bad records: `fail` stops before committing, `dlq` stores them in
    /// sluice_dead_letters (needs --sink-db), `skip` counts and logs them
    /// [default: fail].
    #[arg(long, value_enum, value_name = "POLICY")]
    pub on_error: Option<ErrorPolicy>,
    /// Offsets deleted by retention before they were read: `fail` stops,
    /// `skip` resumes at the log start and records the gap [default: fail].
    #[arg(long, value_enum, value_name = "POLICY")]
    pub on_data_loss: Option<DataLossPolicy>,
    /// Where a new checkpoint starts reading [default: earliest].
    #[arg(long, value_enum, value_name = "WHERE")]
    pub starting_offsets: Option<StartingOffsets>,
    /// Also commit processed offsets to this consumer group after each
    /// batch, for lag dashboards only (the checkpoint stays the truth).
    #[arg(long, value_name = "GROUP")]
    pub group_id: Option<String>,
    /// Batches of checkpoint entries to keep [default: 100].
    #[arg(long, value_name = "N")]
    pub retention: Option<u64>,
    /// Accept topics that differ from the checkpoint's.
    #[arg(long)]
    pub allow_fingerprint_change: bool,
    /// Queue for the checkpoint lock instead of failing when another
    /// process owns it (optionally at most this long) [default: 1h].
    #[arg(long, value_name = "TIMEOUT", num_args = 0..=1, default_missing_value = "1h", value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Ask the running owner to hand over at its next batch boundary (it
    /// commits, releases the lock and exits 0), waiting at most TIMEOUT for
    /// its answer; plugins are compiled before asking. Gives up without
    /// touching the checkpoint if the owner does not answer [default: 60s].
    #[arg(long, value_name = "TIMEOUT", num_args = 0..=1, default_missing_value = "60s", value_parser = parse_duration, conflicts_with = "wait")]
    pub takeover: Option<Duration>,
    /// Bound on each Kafka operation (metadata, watermarks, fetch of a
    /// batch) before the job stops with an error [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub kafka_timeout: Option<Duration>,
    /// Attempts for retryable plugin or sink failures and traps
    /// [default: 3].
    #[arg(long, value_name = "N")]
    pub attempts: Option<u32>,
    /// Deadline of one plugin call [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub plugin_timeout: Option<Duration>,
    /// Memory cap of each plugin instance [default: 256MiB].
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub plugin_memory: Option<u64>,
    /// Serve Prometheus metrics on IP:PORT (`GET /metrics`), e.g.
    /// `127.0.0.1:9464`.
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Progress output: `auto` (a live status line when stdout is a
    /// terminal, else JSON), `json` (one line per batch on stdout), `line`
    /// (status line on stderr), `none` [default: auto].
    #[arg(long, value_enum, value_name = "MODE")]
    pub progress: Option<ProgressMode>,
}

/// The config file (TOML). Every field mirrors a flag of the same name.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `--brokers`.
    pub brokers: Option<String>,
    /// `--topic`, as a list.
    #[serde(default)]
    pub topics: Vec<String>,
    /// `--checkpoint`.
    pub checkpoint: Option<PathBuf>,
    /// `--plugin`, as a list.
    #[serde(default)]
    pub plugins: Vec<PathBuf>,
    /// Plugin configuration (`--config`).
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// librdkafka properties (`--config kafka.<name>=…`).
    #[serde(default)]
    pub kafka: BTreeMap<String, String>,
    /// `--sink-db`.
    pub sink_db: Option<String>,
    /// `--max-records-per-partition`.
    pub max_records_per_partition: Option<u64>,
    /// `--trigger-interval` (e.g. "500ms").
    pub trigger_interval: Option<String>,
    /// `--until-caught-up`.
    #[serde(default)]
    pub until_caught_up: bool,
    /// `--on-error`.
    pub on_error: Option<ErrorPolicy>,
    /// `--on-data-loss`.
    pub on_data_loss: Option<DataLossPolicy>,
    /// `--starting-offsets`.
    pub starting_offsets: Option<StartingOffsets>,
    /// `--group-id`.
    pub group_id: Option<String>,
    /// `--retention`.
    pub retention: Option<u64>,
    /// `--kafka-timeout`.
    pub kafka_timeout: Option<String>,
    /// `--attempts`.
    pub attempts: Option<u32>,
    /// `--plugin-timeout`.
    pub plugin_timeout: Option<String>,
    /// `--plugin-memory` (e.g. "256MiB").
    pub plugin_memory: Option<String>,
    /// `--metrics-addr` (e.g. "127.0.0.1:9464").
    pub metrics_addr: Option<String>,
    /// `--progress`.
    pub progress: Option<ProgressMode>,
}

fn missing(flag: &str) -> CliError {
    usage(format!(
        "{flag} is required (as a flag or in --config-file)"
    ))
}

/// A usage error (exit 2) with `message`.
fn usage(message: impl std::fmt::Display) -> CliError {
    CliError {
        code: ExitCode::Usage,
        error: anyhow::anyhow!("{message}"),
    }
}

/// Merge the config file and the flags into a pipeline definition.
///
/// # Errors
/// Exit 2 for an unreadable or invalid config file or a missing setting.
pub fn pipeline(args: &RunArgs) -> Result<PipelineConfig, CliError> {
    let file: FileConfig = match &args.config_file {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read config file {}", p.display()))
                .code(ExitCode::Usage)?;
            toml::from_str(&text)
                .with_context(|| format!("config file {}", p.display()))
                .code(ExitCode::Usage)?
        }
        None => FileConfig::default(),
    };
    let dur = |s: &Option<String>, name: &str| -> Result<Option<Duration>, CliError> {
        s.as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|e| anyhow::anyhow!("config file: {name}: {e}"))
            .code(ExitCode::Usage)
    };
    let brokers = args
        .brokers
        .clone()
        .or(file.brokers.clone())
        .ok_or_else(|| missing("--brokers"))?;
    let topics = if args.topics.is_empty() {
        file.topics.clone()
    } else {
        args.topics.clone()
    };
    if topics.is_empty() {
        return Err(missing("--topic"));
    }
    let checkpoint = args
        .checkpoint
        .clone()
        .or(file.checkpoint.clone())
        .ok_or_else(|| missing("--checkpoint"))?;
    let mut topics = topics;
    topics.sort();
    topics.dedup();
    if topics.iter().any(|t| t.trim().is_empty()) || brokers.trim().is_empty() {
        return Err(usage("--brokers and --topic must not be empty"));
    }
    let mut cfg = PipelineConfig::new(brokers, topics, checkpoint);
    cfg.plugins = if args.plugins.is_empty() {
        file.plugins.clone()
    } else {
        args.plugins.clone()
    };
    cfg.plugin_config = file.config.clone();
    cfg.kafka = file.kafka.clone();
    for (k, v) in &args.config {
        match k.strip_prefix("kafka.") {
            Some(prop) => cfg.kafka.insert(prop.to_string(), v.clone()),
            None => cfg.plugin_config.insert(k.clone(), v.clone()),
        };
    }
    cfg.sink_db = args.sink_db.clone().or(file.sink_db.clone());
    if let Some(n) = args
        .max_records_per_partition
        .or(file.max_records_per_partition)
    {
        if n == 0 {
            return Err(usage("--max-records-per-partition must be at least 1"));
        }
        cfg.max_records_per_partition = n;
    }
    if let Some(d) = args
        .trigger_interval
        .or(dur(&file.trigger_interval, "trigger_interval")?)
    {
        cfg.trigger_interval = d;
    }
    cfg.until_caught_up = args.until_caught_up || file.until_caught_up;
    cfg.on_error = args.on_error.or(file.on_error).unwrap_or(cfg.on_error);
    cfg.on_data_loss = args
        .on_data_loss
        .or(file.on_data_loss)
        .unwrap_or(cfg.on_data_loss);
    cfg.starting_offsets = args
        .starting_offsets
        .or(file.starting_offsets)
        .unwrap_or(cfg.starting_offsets);
    cfg.group_id = args.group_id.clone().or(file.group_id.clone());
    cfg.retention = args.retention.or(file.retention).unwrap_or(cfg.retention);
    if cfg.retention == 0 {
        return Err(usage(
            "--retention must be at least 1 (the newest batch is always kept)",
        ));
    }
    cfg.allow_fingerprint_change = args.allow_fingerprint_change;
    cfg.wait = args.wait;
    if let Some(d) = args
        .kafka_timeout
        .or(dur(&file.kafka_timeout, "kafka_timeout")?)
    {
        if d < Duration::from_secs(1) {
            return Err(usage("--kafka-timeout must be at least 1s"));
        }
        cfg.kafka_timeout = d;
    }
    cfg.attempts = args.attempts.or(file.attempts).unwrap_or(cfg.attempts);
    if cfg.attempts == 0 {
        return Err(usage("--attempts must be at least 1 (1 = no retries)"));
    }
    let defaults = Limits::default();
    let memory = match (&args.plugin_memory, &file.plugin_memory) {
        (Some(m), _) => *m,
        (None, Some(s)) => parse_bytes(s)
            .map_err(|e| anyhow::anyhow!("config file: plugin_memory: {e}"))
            .code(ExitCode::Usage)?,
        (None, None) => defaults.memory_bytes,
    };
    cfg.limits = Limits {
        call_timeout: args
            .plugin_timeout
            .or(dur(&file.plugin_timeout, "plugin_timeout")?)
            .unwrap_or(defaults.call_timeout),
        memory_bytes: memory,
    };
    if cfg.limits.call_timeout < super::MIN_PLUGIN_TIMEOUT {
        return Err(usage(
            "--plugin-timeout must be at least 10ms (deadlines are checked every 5 ms)",
        ));
    }
    cfg.progress = args
        .progress
        .or(file.progress)
        .unwrap_or(ProgressMode::Auto);
    cfg.metrics_addr = match (args.metrics_addr, &file.metrics_addr) {
        (Some(a), _) => Some(a),
        (None, Some(s)) => Some(
            s.parse()
                .map_err(|e| anyhow::anyhow!("config file: metrics_addr `{s}`: {e}"))
                .code(ExitCode::Usage)?,
        ),
        (None, None) => None,
    };
    Ok(cfg)
}

/// SIGINT/SIGTERM handling for `host run`, on its own thread: the first
/// signal sets `stop` (the batch in flight finishes and commits, then the
/// process exits 0); a second one logs and exits 130 at once, leaving the
/// batch in flight uncommitted (the next start re-runs it, exactly once
/// on the SQL sink).
///
/// # Errors
/// The signal handlers could not be installed.
fn watch_signals(stop: Arc<AtomicBool>) -> Result<(), CliError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("installing signal handlers")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let name = |sig| if sig == SIGINT { "SIGINT" } else { "SIGTERM" };
            let mut seen = false;
            for sig in signals.forever() {
                if !seen {
                    seen = true;
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    // Logged from another thread: a blocked stderr must not
                    // keep this one from seeing the second signal.
                    let _ = std::thread::Builder::new().spawn(move || {
                        tracing::info!(
                            "{}: stop requested: finishing the batch in flight, then exiting (signal again to abort)",
                            name(sig)
                        );
                    });
                } else {
                    // Exit within a second even if the log write blocks.
                    let _ = std::thread::Builder::new().spawn(|| {
                        std::thread::sleep(Duration::from_secs(1));
                        signal_hook::low_level::exit(130);
                    });
                    tracing::warn!(
                        "{}: aborting now (exit 130): a batch in flight is not committed; the next start runs it again",
                        name(sig)
                    );
                    signal_hook::low_level::exit(130);
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// Run `host run`.
///
/// # Errors
/// Exit 3 when the checkpoint is owned, 2 for bad settings, 1 when the job
/// fails.
pub fn run(args: RunArgs) -> Result<(), CliError> {
    let cfg = pipeline(&args)?;
    let stop = Arc::new(AtomicBool::new(false));
    watch_signals(stop.clone())?;
    let acquire = match args.takeover {
        Some(t) => engine::Acquire::Takeover(t),
        None => engine::Acquire::Normal,
    };
    match engine::run_with(&cfg, stop, acquire) {
        Ok(summary) if summary.handed_over => {
            tracing::info!(
                batches = summary.batches,
                "handed over to the new owner; exiting"
            );
            Ok(())
        }
        Ok(summary) => {
            tracing::info!(
                batches = summary.batches,
                input = summary.counts.input,
                output = summary.counts.output,
                "stopped cleanly"
            );
            Ok(())
        }
        Err(e) => {
            let code = if e.is_owned() || matches!(e, engine::EngineError::Takeover(_)) {
                ExitCode::Owned
            } else if matches!(e, engine::EngineError::Config(_)) {
                ExitCode::Usage
            } else {
                ExitCode::Failed
            };
            Err(CliError {
                code,
                error: e.into(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        run: RunArgs,
    }

    fn merged(flags: &[&str], file: &str) -> Result<PipelineConfig, CliError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pipeline.toml");
        std::fs::write(&path, file).unwrap();
        let mut argv = vec!["t", "--config-file", path.to_str().unwrap()];
        argv.extend_from_slice(flags);
        pipeline(&T::try_parse_from(argv).unwrap().run)
    }

    const BASE: &str = r#"
brokers = "b:9092"
topics = ["t"]
checkpoint = "ck"
plugins = ["p.wasm"]
"#;

    #[test]
    fn file_sets_progress_metrics_and_attempts_and_flags_win() {
        let file =
            format!("{BASE}progress = \"line\"\nmetrics_addr = \"127.0.0.1:9464\"\nattempts = 5\n");
        let cfg = merged(&[], &file).unwrap();
        assert_eq!(cfg.progress, ProgressMode::Line);
        assert_eq!(cfg.metrics_addr, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(cfg.attempts, 5);
        let cfg = merged(
            &[
                "--progress",
                "none",
                "--metrics-addr",
                "0.0.0.0:1",
                "--attempts",
                "2",
            ],
            &file,
        )
        .unwrap();
        assert_eq!(cfg.progress, ProgressMode::None);
        assert_eq!(cfg.metrics_addr, Some("0.0.0.0:1".parse().unwrap()));
        assert_eq!(cfg.attempts, 2);
        assert_eq!(merged(&[], BASE).unwrap().progress, ProgressMode::Auto);
    }

    #[test]
    fn zero_attempts_or_retention_and_bad_keys_are_usage_errors() {
        for (flags, file, says) in [
            (vec!["--attempts", "0"], BASE.to_string(), "--attempts"),
            (vec![], format!("{BASE}attempts = 0\n"), "--attempts"),
            (vec!["--retention", "0"], BASE.to_string(), "--retention"),
            (
                vec!["--plugin-timeout", "0s"],
                BASE.to_string(),
                "--plugin-timeout",
            ),
            (
                vec![],
                format!("{BASE}plugin_timeout = \"1ms\"\n"),
                "--plugin-timeout",
            ),
            (
                vec![],
                format!("{BASE}metrics_addr = \"nowhere\"\n"),
                "metrics_addr",
            ),
            (vec![], format!("{BASE}atempts = 3\n"), "atempts"),
        ] {
            let e = merged(&flags, &file).unwrap_err();
            assert_eq!(e.code, ExitCode::Usage, "{flags:?} {file}");
            assert!(format!("{:#}", e.error).contains(says), "{:#}", e.error);
        }
    }
}
