//! `host run`: the pipeline. Its settings are defined once, in
//! [`Settings`] (flags, `SLUICE_*` environment, TOML file); this file
//! adds the per-start flags, signals and exit codes.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use super::settings::{self, Settings};
use super::{CliError, ExitCode, WithCode, parse_duration, parse_kv};
use crate::engine::{self, PipelineConfig};

/// Flags of `host run`: the [`Settings`] (also from the environment and
/// the config file) and the flags that only make sense for one start.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The pipeline's settings.
    #[command(flatten)]
    pub settings: Settings,
    /// Plugin configuration pair (`kafka.<property>=…` goes to the
    /// consumer's librdkafka instead, `output.kafka.<property>=…` to the
    /// output producer's). Repeatable; applied over the config file's
    /// tables.
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub config: Vec<(String, String)>,
    /// TOML file with the same settings, by their long names in snake
    /// case (`max_records_per_partition = 5000`; `topics` and `plugins` as
    /// lists; `[config]`, `[kafka]` and `[output_kafka]` tables). Flags and `SLUICE_*`
    /// variables override it.
    #[arg(
        long,
        value_name = "FILE",
        env = "SLUICE_CONFIG_FILE",
        hide_env_values = true
    )]
    pub config_file: Option<PathBuf>,
    /// Accept topics that differ from the checkpoint's.
    #[arg(long)]
    pub allow_fingerprint_change: bool,
    /// Start even though the sink database holds progress of another
    /// pipeline (another checkpoint) on the same topics: both pipelines
    /// then apply every record.
    #[arg(long)]
    pub allow_shared_sink: bool,
    /// In a pipeline group: make these --plugin files the group's plugins
    /// although the group runs others (a rolling upgrade: members started
    /// later without --plugin take them; running members keep theirs).
    /// Without it a member whose --plugin files differ from the group's
    /// is refused, so a restart with old files never undoes a swap. A
    /// single host (--checkpoint) takes a differing --plugin as an
    /// upgrade already.
    #[arg(long)]
    pub upgrade: bool,
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
}

/// Merge flags, environment and config file into a pipeline definition.
///
/// # Errors
/// Exit 2 for an unreadable or invalid config file or a missing setting.
pub fn pipeline(args: &RunArgs) -> Result<PipelineConfig, CliError> {
    let merged = match &args.config_file {
        Some(p) => args.settings.over(&Settings::from_file(p)?)?,
        None => args.settings.clone(),
    };
    let mut cfg = settings::resolve(merged, &args.config)?;
    cfg.allow_fingerprint_change = args.allow_fingerprint_change;
    cfg.allow_shared_sink = args.allow_shared_sink;
    cfg.upgrade = args.upgrade;
    cfg.wait = args
        .wait
        .map(|d| settings::within("--wait", d, settings::WAIT, settings::show_duration))
        .transpose()?;
    if let Some(d) = args.takeover {
        settings::within("--takeover", d, settings::WAIT, settings::show_duration)?;
    }
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
    let result = if cfg.group.is_some() {
        if args.takeover.is_some() || args.wait.is_some() {
            return Err::<(), _>(anyhow::anyhow!(
                "--takeover and --wait are for a checkpoint directory; a group member hands partitions over through the consumer group (start the new member, stop the old)"
            ))
            .code(ExitCode::Usage);
        }
        engine::run_with(&cfg, stop, acquire)
    } else {
        engine::run_with(&cfg, stop, acquire)
    };
    match result {
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
            } else if matches!(
                e,
                engine::EngineError::Config(_)
                    | engine::EngineError::PluginAuthority { .. }
                    | engine::EngineError::Output(
                        crate::output::OutputError::NotExactlyOnce { .. }
                    )
            )
                // A SQLite file that cannot be opened or created is a path
                // the user gave, not a database that is down.
                || matches!(&e, engine::EngineError::SinkDb { url, .. } if url.starts_with("sqlite:"))
            {
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
    use crate::engine::{ErrorPolicy, ProgressMode};
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
    fn the_old_group_id_name_still_sets_the_offset_mirror_and_the_new_one_wins() {
        let cfg = merged(&["--group-id", "dash"], BASE).unwrap();
        assert_eq!(cfg.commit_offsets_to.as_deref(), Some("dash"));
        let file = format!("{BASE}group_id = \"old\"\n");
        assert_eq!(
            merged(&[], &file).unwrap().commit_offsets_to.as_deref(),
            Some("old")
        );
        assert!(merged(&["--commit-offsets-to", "new", "--group-id", "old"], BASE).is_err());
        let cfg = merged(&["--commit-offsets-to", "new", "--group-id", "new"], BASE).unwrap();
        assert_eq!(cfg.commit_offsets_to.as_deref(), Some("new"));
        assert!(!merged(&[], BASE).unwrap().allow_shared_sink);
        assert!(
            merged(&["--allow-shared-sink"], BASE)
                .unwrap()
                .allow_shared_sink
        );
    }

    #[test]
    fn output_settings_come_from_flags_config_pairs_and_the_file() {
        use crate::output::{OutputConfig, OutputGuarantee};
        assert_eq!(merged(&[], BASE).unwrap().output, None);
        let cfg = merged(
            &[
                "--output-topic",
                "out.v1",
                "--output-guarantee",
                "at-least-once",
                "--config",
                "output.kafka.linger.ms=20",
                "--config",
                "kafka.security.protocol=plaintext",
            ],
            BASE,
        )
        .unwrap();
        assert_eq!(
            cfg.output,
            Some(OutputConfig {
                topics: vec!["out.v1".into()],
                brokers: None,
                kafka: [("linger.ms".to_string(), "20".to_string())].into(),
                guarantee: OutputGuarantee::AtLeastOnce,
                reprocess: false,
            })
        );
        assert_eq!(
            cfg.kafka.get("security.protocol").map(String::as_str),
            Some("plaintext")
        );
        assert!(!cfg.plugin_config.contains_key("output.kafka.linger.ms"));
        // The file; exactly once is the default guarantee; flags win.
        let file = format!(
            "{BASE}output_topic = \"o\"\noutput_brokers = \"x:1\"\n[output_kafka]\n\"compression.type\" = \"lz4\"\n"
        );
        let cfg = merged(&[], &file).unwrap();
        let o = cfg.output.unwrap();
        assert_eq!(o.topics, ["o"]);
        assert_eq!(o.brokers.as_deref(), Some("x:1"));
        assert_eq!(o.guarantee, OutputGuarantee::ExactlyOnce);
        assert_eq!(
            o.kafka.get("compression.type").map(String::as_str),
            Some("lz4")
        );
        let o = merged(&["--output-topic", "p"], &file)
            .unwrap()
            .output
            .unwrap();
        assert_eq!(o.topics, ["p"]);
        // Several topics (a sink stage sends to them): repeated, or
        // separated by commas, or a list in the file; each kept once.
        let o = merged(
            &[
                "--output-topic",
                "a,b",
                "--output-topic",
                "c",
                "--output-topic",
                "a",
            ],
            BASE,
        )
        .unwrap()
        .output
        .unwrap();
        assert_eq!(o.topics, ["a", "b", "c"]);
        // Reprocessing is for exactly once only.
        let e = merged(
            &[
                "--output-topic",
                "a",
                "--output-guarantee",
                "at-least-once",
                "--output-reprocess",
            ],
            BASE,
        )
        .unwrap_err();
        assert_eq!(e.code, ExitCode::Usage);
        let o = merged(&["--output-topic", "a", "--output-reprocess"], BASE)
            .unwrap()
            .output
            .unwrap();
        assert!(o.reprocess);
        // The topics a write-ahead entry records do not depend on order.
        let named = |flag: &str| {
            merged(&["--output-topic", flag], BASE)
                .unwrap()
                .output
                .unwrap()
                .identity("in:9092")
        };
        assert_eq!(named("b,a"), named("a,b"));
        assert_eq!(named("a,b"), "a, b on in:9092 (exactly-once)");
        let listed = format!("{BASE}output_topic = [\"x\", \"y\"]\n");
        let o = merged(&[], &listed).unwrap().output.unwrap();
        assert_eq!(o.topics, ["x", "y"]);
        // Refused: the other output settings without a topic; names Kafka
        // would refuse.
        for flags in [
            &["--output-guarantee", "at-least-once"][..],
            &["--output-brokers", "x:1"],
            &["--config", "output.kafka.acks=1"],
            &["--output-topic", "a b"],
            &["--output-topic", ".."],
            &["--output-topic", "é"],
        ] {
            let e = merged(flags, BASE).unwrap_err();
            assert_eq!(e.code, ExitCode::Usage, "{flags:?}");
        }
        assert!(
            T::try_parse_from(["t", "--output-guarantee", "exactly-twice"]).is_err(),
            "clap refuses an unknown guarantee"
        );
        let long = "t".repeat(250);
        assert!(merged(&["--output-topic", &long], BASE).is_err());
        assert!(merged(&["--output-topic", &long[..249]], BASE).is_ok());
    }

    #[test]
    fn sink_connections_default_to_one_and_take_a_postgres_sink_only() {
        assert_eq!(merged(&[], BASE).unwrap().sink_connections, 1);
        let pg = format!("{BASE}sink_db = \"postgres://u@h/d\"\n");
        assert_eq!(
            merged(&["--sink-connections", "4"], &pg)
                .unwrap()
                .sink_connections,
            4
        );
        let alias = format!("{BASE}sink_db = \"postgresql://u@h/d\"\n");
        assert_eq!(
            merged(&["--sink-connections", "2"], &alias)
                .unwrap()
                .sink_connections,
            2
        );
        assert_eq!(
            merged(&["--sink-connections", "1"], BASE)
                .unwrap()
                .sink_connections,
            1
        );
        let file = format!("{pg}sink_connections = 3\n");
        assert_eq!(merged(&[], &file).unwrap().sink_connections, 3);
        assert_eq!(
            merged(&["--sink-connections", "2"], &file)
                .unwrap()
                .sink_connections,
            2,
            "the flag wins over the file"
        );
        for (flags, file, says) in [
            (vec!["--sink-connections", "0"], pg.clone(), "out of range"),
            (vec!["--sink-connections", "65"], pg.clone(), "out of range"),
            (
                vec!["--sink-connections", "2"],
                format!("{BASE}sink_db = \"sqlite:x.db\"\n"),
                "SQLite lets one connection write at a time",
            ),
            (
                vec!["--sink-connections", "2"],
                BASE.to_string(),
                "without a --sink-db there is no connection",
            ),
        ] {
            let e = merged(&flags, &file).unwrap_err();
            assert_eq!(e.code, ExitCode::Usage, "{flags:?} {file}");
            assert!(format!("{:#}", e.error).contains(says), "{:#}", e.error);
        }
        // One connection is fine on SQLite.
        let sqlite = format!("{BASE}sink_db = \"sqlite:x.db\"\nsink_connections = 1\n");
        assert_eq!(merged(&[], &sqlite).unwrap().sink_connections, 1);
    }

    #[test]
    fn file_sets_progress_metrics_and_attempts_and_flags_win() {
        let file = format!(
            "{BASE}progress = \"line\"\nmetrics_addr = \"127.0.0.1:9464\"\nattempts = 5\nmap_threads = 3\n"
        );
        let cfg = merged(&[], &file).unwrap();
        assert_eq!(cfg.progress, ProgressMode::Line);
        assert_eq!(cfg.metrics_addr, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(cfg.attempts, 5);
        assert_eq!(cfg.map_threads, 3, "map_threads in the file");
        let cfg = merged(
            &[
                "--progress",
                "none",
                "--metrics-addr",
                "0.0.0.0:1",
                "--attempts",
                "2",
                "--map-threads",
                "2",
            ],
            &file,
        )
        .unwrap();
        assert_eq!(cfg.map_threads, 2);
        assert_eq!(cfg.progress, ProgressMode::None);
        assert_eq!(cfg.metrics_addr, Some("0.0.0.0:1".parse().unwrap()));
        assert_eq!(cfg.attempts, 2);
        assert_eq!(merged(&[], BASE).unwrap().progress, ProgressMode::Auto);
        assert_eq!(
            merged(&[], BASE).unwrap().map_threads,
            crate::engine::default_map_threads()
        );
    }

    #[test]
    fn file_durations_bytes_tables_and_lists_merge_under_the_flags() {
        let file = format!(
            "{BASE}trigger_interval = \"250ms\"\nplugin_memory = \"64MiB\"\non_error = \"skip\"\nuntil_caught_up = true\n[config]\ntable = \"orders\"\n[kafka]\n\"fetch.max.bytes\" = \"1000\"\n"
        );
        let cfg = merged(&[], &file).unwrap();
        assert_eq!(cfg.trigger_interval, Duration::from_millis(250));
        assert_eq!(cfg.limits.memory_bytes, 64 << 20);
        assert_eq!(cfg.on_error, ErrorPolicy::Skip);
        assert!(cfg.until_caught_up);
        assert_eq!(cfg.plugin_config["table"], "orders");
        assert_eq!(cfg.kafka["fetch.max.bytes"], "1000");
        assert_eq!(cfg.plugins, vec![PathBuf::from("p.wasm")]);
        let cfg = merged(
            &[
                "--trigger-interval",
                "2s",
                "--on-error",
                "fail",
                "--config",
                "table=users",
                "--config",
                "kafka.fetch.max.bytes=5",
                "--topic",
                "b",
                "--topic",
                "a",
            ],
            &file,
        )
        .unwrap();
        assert_eq!(cfg.trigger_interval, Duration::from_secs(2));
        assert_eq!(cfg.on_error, ErrorPolicy::Fail);
        assert_eq!(cfg.plugin_config["table"], "users");
        assert_eq!(cfg.kafka["fetch.max.bytes"], "5");
        assert_eq!(cfg.topics, ["a", "b"]);
        assert_eq!(cfg.limits.memory_bytes, 64 << 20, "the file's value stays");
    }

    #[test]
    fn an_endless_config_or_password_file_is_refused_not_read_forever() {
        // Found by an attack run: `--config-file /dev/zero` grew by 2 GB a
        // second.
        let e = Settings::from_file(std::path::Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.code, ExitCode::Usage);
        assert!(
            format!("{:#}", e.error).contains("larger than"),
            "{:#}",
            e.error
        );
        let e =
            crate::capability::sql::password::read_password_file(std::path::Path::new("/dev/zero"))
                .unwrap_err();
        assert!(e.message.contains("larger than"), "{e}");
    }

    #[test]
    fn zero_attempts_or_retention_and_bad_keys_are_usage_errors() {
        for (flags, file, says) in [
            (vec!["--attempts", "0"], BASE.to_string(), "--attempts"),
            (vec![], format!("{BASE}attempts = 0\n"), "--attempts"),
            (vec!["--retention", "0"], BASE.to_string(), "--retention"),
            (
                vec!["--map-threads", "0"],
                BASE.to_string(),
                "--map-threads",
            ),
            (
                vec![],
                format!("{BASE}map_threads = 1000\n"),
                "--map-threads",
            ),
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
            (
                vec![],
                format!("{BASE}trigger_interval = \"soon\"\n"),
                "trigger_interval",
            ),
            (vec![], format!("{BASE}on_error = \"ignore\"\n"), "on_error"),
            (vec![], "topics = [\"t\"]\n".to_string(), "--brokers"),
            (
                vec![],
                format!("{BASE}sink_db = \"postgres://u:SECRETX@h/d\" junk\n"),
                "line 6",
            ),
        ] {
            let e = merged(&flags, &file).unwrap_err();
            assert_eq!(e.code, ExitCode::Usage, "{flags:?} {file}");
            assert!(format!("{:#}", e.error).contains(says), "{:#}", e.error);
            assert!(
                !format!("{:#}", e.error).contains("SECRETX"),
                "{:#}",
                e.error
            );
        }
    }
}
