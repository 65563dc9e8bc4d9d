//! The rough edges a new user hits in the first hour: a broker list in the
//! wrong form, `produce`'s help and partitioning, lag while a batch is
//! re-run, and a plugin generated outside the repository.

use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::support::kafka::raw_topic;
use crate::support::kafka::{Broker, Mock};
use crate::support::{Db, HostProcess, RunArgs, host_bin, stderr};

/// Arguments, environment, and the reason the error must give.
type Case = (Vec<String>, Vec<(&'static str, &'static str)>, &'static str);

/// A broker list librdkafka cannot parse fails at once (exit 2) with the
/// entry and the reason, on the flag, in the environment and in a config
/// file, instead of a 30 s wait ending in "unavailable".
#[test]
fn a_broker_list_in_the_wrong_form_fails_at_once_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let file = dir.path().join("pipeline.toml");
    std::fs::write(
        &file,
        "brokers = \"tcp://127.0.0.1:9092\"\ntopics = [\"t\"]\n",
    )
    .unwrap();
    let flag = ["--brokers", "tcp://127.0.0.1:9092"];
    let cases: Vec<Case> = vec![
        (
            ["run", "--topic", "t", "--checkpoint"]
                .iter()
                .map(|s| s.to_string())
                .chain([ckpt.display().to_string()])
                .chain(flag.iter().map(|s| s.to_string()))
                .collect(),
            vec![],
            "`tcp://` is not a Kafka protocol",
        ),
        (
            vec![
                "run".into(),
                "--checkpoint".into(),
                ckpt.display().to_string(),
            ],
            vec![
                ("SLUICE_BROKERS", "127.0.0.1:9092x"),
                ("SLUICE_TOPICS", "t"),
            ],
            "`9092x` is not a port",
        ),
        (
            vec![
                "run".into(),
                "--checkpoint".into(),
                ckpt.display().to_string(),
                "--config-file".into(),
                file.display().to_string(),
            ],
            vec![],
            "`tcp://` is not a Kafka protocol",
        ),
        (
            vec![
                "run".into(),
                "--checkpoint".into(),
                ckpt.display().to_string(),
                "--topic".into(),
                "t".into(),
                "--brokers".into(),
                "ssl://127.0.0.1:9093".into(),
            ],
            vec![],
            "does not match security.protocol=plaintext",
        ),
        (
            vec![
                "group".into(),
                "status".into(),
                "--group".into(),
                "g".into(),
                "--sink-db".into(),
                format!("sqlite:{}", dir.path().join("db").display()),
                "--brokers".into(),
                "tcp://127.0.0.1:9092".into(),
            ],
            vec![],
            "`tcp://` is not a Kafka protocol",
        ),
    ];
    for (args, env, why) in cases {
        let started = Instant::now();
        let out = Command::new(host_bin())
            .args(&args)
            .envs(env)
            .output()
            .expect("spawn host");
        let took = started.elapsed();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(err.contains("HOST:PORT"), "{args:?}: {err}");
        assert!(took < Duration::from_secs(5), "{args:?} took {took:?}");
        assert!(!ckpt.exists(), "nothing is created before the check");
    }
}

/// A batch re-run after a crash reports the lag behind the high
/// watermark, as every other batch does (it reported 0 while thousands of
/// records were pending: a re-run is planned from the write-ahead log).
/// A broker that is not there (nothing listens on the port; a host name
/// that does not resolve) is named at once, with librdkafka's first real
/// error, not after the broker timeout; the client's repeats of it are
/// summarised; the error the host stops with names the cause and what to
/// check, not "BrokerTransportFailure".
#[test]
fn a_broker_that_is_not_there_is_named_at_once_with_the_real_cause() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let refused = format!("127.0.0.1:{closed}");
    for (brokers, cause, check) in [
        (
            refused.as_str(),
            "Connection refused",
            "is the broker running, on that port?",
        ),
        (
            "kafka.invalid:9092",
            "Failed to resolve 'kafka.invalid:9092'",
            "check the host name in --brokers",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let args = RunArgs::new(brokers, &["t"], &dir.path().join("ckpt"))
            .plugin("passthrough")
            .args(["--kafka-timeout", "8s"])
            .build();
        let started = Instant::now();
        let mut host = HostProcess::start(&args);
        let line = host.wait_for(cause, Duration::from_secs(5));
        assert!(line.contains("WARN"), "{line}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let (code, log) = host.finish();
        assert_eq!(code, Some(1), "{log}");
        let last = log.lines().last().unwrap_or_default();
        assert!(last.contains(cause) && last.contains(check), "{log}");
        assert!(!log.contains("BrokerTransportFailure"), "{log}");
        assert!(
            log.lines().count() <= 3,
            "the client's repeats are not shown: {log}"
        );
    }
}

#[test]
fn a_rerun_batch_reports_the_records_still_pending_as_lag() {
    let mock = raw_topic((0..5000).map(|i| format!("v{i}")));
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite();
    let args = RunArgs::new(&mock.bootstrap(), &["raw"], &dir.path().join("ckpt"))
        .sink_db(&db)
        .plugin("sql_counter")
        .args(["--until-caught-up", "--max-records-per-partition", "1000"])
        .args(["--progress", "json"])
        .build();
    // Killed after the second batch's write-ahead entry: [1000, 2000) is
    // planned, not committed.
    let mut run = HostProcess::spawn(&args, &[("SLUICE_FAILPOINT", "engine:after-write-ahead@2")]);
    run.wait_for("FAILPOINT", Duration::from_secs(60));
    run.kill();
    let out = Command::new(host_bin())
        .args(&args)
        .env_remove("SLUICE_FAILPOINT")
        .output()
        .expect("host run");
    assert!(out.status.success(), "{}", stderr(&out));
    let batches: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "batch")
        .collect();
    assert_eq!(batches.len(), 4, "{batches:?}");
    let lags: Vec<(bool, i64, i64)> = batches
        .iter()
        .map(|b| {
            let p = &b["partitions"][0];
            (
                b["rerun"].as_bool().unwrap(),
                p["end"].as_i64().unwrap(),
                p["lag"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        lags,
        [
            (true, 2000, 3000),
            (false, 3000, 2000),
            (false, 4000, 1000),
            (false, 5000, 0)
        ]
    );
    assert_eq!(db.counted(), 5000, "each record applied once");
}

/// The `produce` helper of the README: `--help` is a success on stdout,
/// and `--lines` spreads a file over the topic's partitions.
#[test]
fn produce_helps_on_stdout_and_spreads_lines_over_partitions() {
    let bin = bench_bin("produce");
    let help = Command::new(&bin).arg("--help").output().unwrap();
    assert_eq!(help.status.code(), Some(0), "{}", stderr(&help));
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("--lines") && text.contains("round-robin"),
        "{text}"
    );
    let usage = Command::new(&bin).arg("b:9092").output().unwrap();
    assert_eq!(usage.status.code(), Some(2), "{}", stderr(&usage));

    let mock = Mock::new();
    mock.create_topic("raw", 3);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lines.txt");
    let lines: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&file, lines).unwrap();
    let out = Command::new(&bin)
        .args([&mock.bootstrap(), "raw", "--lines"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", mock.bootstrap())
        .create()
        .unwrap();
    let highs: Vec<i64> = (0..3)
        .map(|p| {
            consumer
                .fetch_watermarks("raw", p, Duration::from_secs(10))
                .unwrap()
                .1
        })
        .collect();
    assert_eq!(highs, [6667, 6667, 6666]);
}

/// A binary of the benchmarks crate built next to this test
/// (`cargo build -p sluice-bench`, done by the README test command).
fn bench_bin(name: &str) -> std::path::PathBuf {
    let p = host_bin().with_file_name(name);
    assert!(
        p.exists(),
        "{} is missing: build it first (`cargo build -p sluice-bench`)",
        p.display()
    );
    p
}

/// `host plugin new` writes a crate outside the repository that builds
/// and tests natively and as a component with nothing but crates.io, and
/// whose component `host test` runs, sink included; `export!` adds no
/// doc-test of its own to the user's crate.
#[test]
fn a_generated_plugin_builds_tests_and_runs_outside_the_repository() {
    let parent = tempfile::tempdir().unwrap();
    let target = parent.path().join("target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let cargo_in = |dir: &std::path::Path, args: &[&str]| {
        let out = Command::new(&cargo)
            .args(args)
            .current_dir(dir)
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("RUSTFLAGS")
            .output()
            .expect("cargo");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "cargo {args:?} in {}: {text}",
            dir.display()
        );
        text
    };
    for (name, flags, unit_tests) in [
        ("map-only", vec![], 1),
        ("sink-only", vec!["--sink"], 1),
        ("both", vec!["--map", "--sink"], 2),
    ] {
        let mut args = vec![
            "plugin",
            "new",
            name,
            "--dir",
            parent.path().to_str().unwrap(),
        ];
        args.extend(flags);
        let out = crate::support::host(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        let dir = parent.path().join(name);
        for f in [
            "Cargo.toml",
            "src/lib.rs",
            "sample.txt",
            "README.md",
            "sluice-sdk/wit/plugin.wit",
        ] {
            assert!(dir.join(f).exists(), "{name}: {f}");
        }
        let tested = cargo_in(&dir, &["test"]);
        assert!(
            tested.contains(&format!("test result: ok. {unit_tests} passed")),
            "{tested}"
        );
        assert!(
            !tested.contains("__sluice_export"),
            "a doc-test leaked: {tested}"
        );
        assert!(tested.contains("Doc-tests"), "{tested}");
    }
    // The same name again: refused, nothing overwritten.
    let again = crate::support::host(&[
        "plugin",
        "new",
        "both",
        "--dir",
        parent.path().to_str().unwrap(),
    ]);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));

    let both = parent.path().join("both");
    cargo_in(&both, &["build", "--target", "wasm32-wasip2"]);
    let wasm = target.join("wasm32-wasip2/debug/both.wasm");
    let db = both.join("try.db");
    let out = Command::new(host_bin())
        .args(["test", "--plugin"])
        .arg(&wasm)
        .args(["--input", "sample.txt", "--sink-db"])
        .arg(format!("sqlite:{}", db.display()))
        .current_dir(&both)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = crate::support::json_lines(&out);
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["sql", "output", "sql", "bad_record", "part"],
        "{lines:?}"
    );
    assert_eq!(lines[4]["outcome"], "committed");
    let rows = Db::at(format!("sqlite:{}", db.display()))
        .sorted_texts("SELECT idempotency_key || ' ' || value FROM both_records");
    assert_eq!(
        rows,
        [r#"test/0/0 {"table":"orders","data":{"id":1,"price":999999999999.999998}}"#]
    );
}

/// `host plugin new --lang python` writes a plugin outside the repository
/// whose `build.sh` makes a virtualenv with the shipped SDK and
/// componentize-py (from PyPI), runs its unit tests and builds the
/// component, which `host test` then runs, sink included.
#[test]
fn a_generated_python_plugin_builds_tests_and_runs_outside_the_repository() {
    let parent = tempfile::tempdir().unwrap();
    let out = crate::support::host(&[
        "plugin",
        "new",
        "py-orders",
        "--lang",
        "python",
        "--map",
        "--sink",
        "--dir",
        parent.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let dir = parent.path().join("py-orders");
    for f in [
        "app.py",
        "test_app.py",
        "build.sh",
        "sample.txt",
        "README.md",
    ] {
        assert!(dir.join(f).exists(), "{f}");
    }
    assert!(dir.join("sluice-sdk/sluice_guest/wit/plugin.wit").exists());
    let built = Command::new("bash")
        .arg("build.sh")
        .current_dir(&dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    assert!(built.status.success(), "build.sh: {text}");
    assert!(text.contains("Ran 2 tests"), "{text}");
    let db = dir.join("try.db");
    let out = Command::new(host_bin())
        .args([
            "test",
            "--plugin",
            "py_orders.wasm",
            "--input",
            "sample.txt",
            "--sink-db",
        ])
        .arg(format!("sqlite:{}", db.display()))
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let kinds: Vec<String> = crate::support::json_lines(&out)
        .iter()
        .map(|l| l["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["sql", "output", "sql", "bad_record", "part"]);
    let rows = Db::at(format!("sqlite:{}", db.display()))
        .sorted_texts("SELECT idempotency_key || ' ' || value FROM py_orders_records");
    assert_eq!(
        rows,
        [r#"test/0/0 {"table":"orders","data":{"id":1,"price":999999999999.999998}}"#]
    );
}

/// `host plugin new --lang js` writes a plugin outside the repository
/// whose `npm run build` installs the shipped SDK's pinned build tools
/// (npm registry), runs its unit tests under Node.js and builds the
/// component, which `host test` then runs, sink included.
#[test]
fn a_generated_js_plugin_builds_tests_and_runs_outside_the_repository() {
    let parent = tempfile::tempdir().unwrap();
    let out = crate::support::host(&[
        "plugin",
        "new",
        "js-orders",
        "--lang",
        "js",
        "--map",
        "--sink",
        "--dir",
        parent.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let dir = parent.path().join("js-orders");
    for f in [
        "app.js",
        "app.test.js",
        "package.json",
        "sample.txt",
        "README.md",
    ] {
        assert!(dir.join(f).exists(), "{f}");
    }
    assert!(dir.join("sluice-sdk/wit/plugin.wit").exists());
    let built = Command::new("npm")
        .args(["run", "build"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    assert!(built.status.success(), "npm run build: {text}");
    assert!(text.contains("# pass 2"), "{text}");
    let db = dir.join("try.db");
    let out = Command::new(host_bin())
        .args([
            "test",
            "--plugin",
            "js_orders.wasm",
            "--input",
            "sample.txt",
            "--sink-db",
        ])
        .arg(format!("sqlite:{}", db.display()))
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let kinds: Vec<String> = crate::support::json_lines(&out)
        .iter()
        .map(|l| l["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["sql", "output", "sql", "bad_record", "part"]);
    let rows = Db::at(format!("sqlite:{}", db.display()))
        .sorted_texts("SELECT idempotency_key || ' ' || value FROM js_orders_records");
    assert_eq!(
        rows,
        [r#"test/0/0 {"table":"orders","data":{"id":1,"price":999999999999.999998}}"#]
    );
}
