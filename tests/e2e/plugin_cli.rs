//! `host test` and `host plugin inspect` through the real binary and the
//! real built components.

use std::io::Write;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::support::{host, json_lines, plugin, stderr};

const ROW1: &str = r#"{"id":1,"name":"Acme","founded":"0000-00-00 00:00:00","valuation":999999999999.999998,"logo":"iVBORw0KGgoAAAANSUhEUg=="}"#;
const ROW1_UPDATED: &str = r#"{"id":1,"name":"Acme Corp","founded":"0000-00-00 00:00:00","valuation":999999999999.999998,"logo":"iVBORw0KGgoAAAANSUhEUg=="}"#;

fn maxwell(kind: &str, data: Option<&str>, extra: &str) -> String {
    let data = data.map(|d| format!(r#","data":{d}"#)).unwrap_or_default();
    format!(
        r#"{{"database":"shop","table":"company","type":"{kind}","ts":1700000000,"xid":42,"commit":true{data}{extra}}}"#
    )
}

fn record(offset: i64, key: Option<&str>, value: Value) -> String {
    let mut r = json!({"topic": "maxwell", "partition": 1, "offset": offset, "timestamp": 1_700_000_000_000i64});
    r["key"] = key.map_or(Value::Null, |k| Value::String(k.to_string()));
    match value {
        Value::Object(m) => {
            for (k, v) in m {
                r[k] = v;
            }
        }
        v => r["value"] = v,
    }
    r.to_string()
}

fn write_input(lines: &[String]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    for l in lines {
        writeln!(f, "{l}").expect("write input");
    }
    f
}

/// `host test --plugin <built plugin> --input FILE`.
fn host_test(plugin_name: &str, input: &std::path::Path) -> std::process::Output {
    host(&[
        "test",
        "--plugin",
        plugin(plugin_name).to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ])
}

#[test]
fn company_maps_every_kind_of_maxwell_event() {
    let key1 = r#"{"database":"shop","table":"company","pk.id":1}"#;
    let lines = vec![
        // 0 insert
        record(10, Some(key1), Value::String(maxwell("insert", Some(ROW1), ""))),
        // 1 update with `old`
        record(11, Some(key1), Value::String(maxwell("update", Some(ROW1_UPDATED), r#","old":{"name":"Acme"}"#))),
        // 2 delete
        record(12, Some(key1), Value::String(maxwell("delete", Some(ROW1_UPDATED), ""))),
        // 3..=7 bootstrap run: start, insert x3, complete
        record(13, None, Value::String(maxwell("bootstrap-start", Some("{}"), ""))),
        record(14, None, Value::String(maxwell("bootstrap-insert", Some(r#"{"id":2,"name":"B"}"#), ""))),
        record(15, None, Value::String(maxwell("bootstrap-insert", Some(r#"{"id":3,"name":"C"}"#), ""))),
        record(16, None, Value::String(maxwell("bootstrap-insert", Some(r#"{"id":4,"name":"D"}"#), ""))),
        record(17, None, Value::String(maxwell("bootstrap-complete", Some("{}"), ""))),
        // 8 DDL (ts in ms, no data)
        record(18, None, Value::String(r#"{"type":"table-alter","database":"shop","table":"company","old":{"columns":[]},"def":{"columns":[]},"ts":1700000000123,"sql":"ALTER TABLE company ADD COLUMN x INT"}"#.into())),
        // 9 another table
        record(19, None, Value::String(r#"{"database":"shop","table":"orders","type":"insert","ts":1,"data":{"id":7}}"#.into())),
        // 10 malformed JSON
        record(20, None, Value::String(r#"{"database":"shop","table":"company","type":"ins"#.into())),
        // 11 non-UTF-8 bytes
        record(21, None, json!({"value_b64": base64::engine::general_purpose::STANDARD.encode(b"\xff\xfe{\"a\":1}")})),
    ];
    let input = write_input(&lines);
    let out = host(&[
        "test",
        "--plugin",
        plugin("company").to_str().unwrap(),
        "--input",
        input.path().to_str().unwrap(),
        "--format",
        "records",
    ]);
    assert!(out.status.success(), "host test failed: {}", stderr(&out));
    let got = json_lines(&out);
    let outputs: Vec<&Value> = got.iter().filter(|v| v["type"] == "output").collect();
    let bad: Vec<&Value> = got.iter().filter(|v| v["type"] == "bad_record").collect();

    let offsets: Vec<i64> = outputs
        .iter()
        .map(|o| o["offset"].as_i64().unwrap())
        .collect();
    assert_eq!(offsets, vec![10, 11, 12, 14, 15, 16], "kept events");
    let keys: Vec<&str> = outputs
        .iter()
        .map(|o| o["idempotency_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys[0], "maxwell/1/10");
    assert_eq!(keys[5], "maxwell/1/16");

    let value = |i: usize| outputs[i]["value"].as_str().unwrap().to_string();
    // Kafka's upsert convention: the row, byte-exact (big decimal, zero
    // date and base64 binary column), keyed by the primary key; a delete
    // is a tombstone.
    assert_eq!(value(0), ROW1);
    assert_eq!(value(1), ROW1_UPDATED);
    assert!(outputs[2]["value"].is_null(), "delete: {}", outputs[2]);
    assert_eq!(outputs[2]["key"], r#"{"id":1}"#);
    assert_eq!(
        outputs[3]["key"], r#"{"id":2}"#,
        "bootstrap-insert keyed by data.id: {}",
        outputs[3]
    );
    assert_eq!(outputs[0]["key"], r#"{"id":1}"#);

    let bad_offsets: Vec<i64> = bad.iter().map(|b| b["offset"].as_i64().unwrap()).collect();
    assert_eq!(bad_offsets, vec![20, 21]);
    assert!(bad[0]["error"].as_str().unwrap().contains("not JSON"));
    assert!(bad[1]["error"].as_str().unwrap().contains("not JSON"));
    assert!(bad[0]["plugin_digest"].as_str().unwrap().len() == 64);
}

#[test]
fn lines_format_and_chained_stages() {
    let input = write_input(&[
        maxwell("insert", Some(r#"{"id":5,"name":"Acme"}"#), ""),
        "".to_string(),
    ]);
    let out = host(&[
        "test",
        "--plugin",
        plugin("passthrough").to_str().unwrap(),
        "--plugin",
        plugin("company").to_str().unwrap(),
        "--input",
        input.path().to_str().unwrap(),
        "--no-sink",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let got = json_lines(&out);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["idempotency_key"], "test/0/0");
    assert_eq!(got[0]["key"], r#"{"id":5}"#, "the key is the primary key");
    assert_eq!(
        got[0]["value"], r#"{"id":5,"name":"Acme"}"#,
        "the value is the row"
    );
    assert_eq!(got[1]["type"], "bad_record", "an empty line is not JSON");
}

#[test]
fn host_test_shows_the_output_partition_a_java_client_would_pick() {
    // Keys with Java murmur2 hashes from Kafka's UtilsTest.testMurmur2:
    // "21" -973932308, "foobar" -790332482 (& 0x7fffffff, then % 64).
    let input = write_input(&[
        record(0, Some("21"), json!("a")),
        record(1, Some("foobar"), json!("b")),
        record(2, None, json!("c")),
    ]);
    let out = host(&[
        "test",
        "--plugin",
        plugin("passthrough").to_str().unwrap(),
        "--input",
        input.path().to_str().unwrap(),
        "--format",
        "records",
        "--output-topic",
        "out",
        "--output-partitions",
        "64",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let got = json_lines(&out);
    let to: Vec<&Value> = got.iter().map(|l| &l["produced_to"]).collect();
    let p = |h: i64| (h & 0x7fff_ffff) % 64;
    assert_eq!(
        to,
        [
            &json!({"topic": "out", "partition": p(-973_932_308)}),
            &json!({"topic": "out", "partition": p(-790_332_482)}),
            &json!({"topic": "out", "partition": null}),
        ]
    );
    // Without --output-topic, nothing about producing.
    let out = host_test("passthrough", input.path());
    assert!(
        json_lines(&out)
            .iter()
            .all(|l| l.get("produced_to").is_none())
    );
}

#[test]
fn config_reaches_the_plugin() {
    let input = write_input(&[
        r#"{"database":"shop","table":"orders","type":"insert","data":{"id":1}}"#.to_string(),
    ]);
    let run = |extra: &[&str]| {
        let mut args = vec![
            "test",
            "--plugin",
            plugin("company").to_str().unwrap().to_string().leak(),
            "--input",
            input.path().to_str().unwrap().to_string().leak(),
            "--no-sink",
        ];
        args.extend_from_slice(extra);
        json_lines(&host(&args)).len()
    };
    assert_eq!(run(&[]), 0);
    assert_eq!(run(&["--config", "table=orders"]), 1);
    // host run's config file rehearses the same pairs; a flag wins.
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        file,
        "brokers = \"127.0.0.1:9\"\n[config]\ntable = \"orders\""
    )
    .unwrap();
    let path = file.path().to_str().unwrap();
    assert_eq!(run(&["--config-file", path]), 1);
    assert_eq!(
        run(&["--config-file", path, "--config", "table=company"]),
        0
    );
}

#[test]
fn trap_exits_non_zero_with_one_line_reason() {
    let input = write_input(&["ok".to_string(), "panic".to_string()]);
    let out = host_test("misbehave", input.path());
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("host: 1 record(s) made the plugin trap"),
        "{err}"
    );
    assert!(
        last.contains("misbehave panicked on purpose at offset 1"),
        "{err}"
    );
    // Narrowed down to the record, and the other record's output is shown.
    assert!(last.contains("test/0 offset 1:"), "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["type"], "output");
    assert_eq!(lines[0]["value"], "ok");
    assert_eq!(lines[1]["type"], "bad_record");
    assert_eq!(lines[1]["offset"], 1);
}

#[test]
fn a_plugin_cannot_flood_host_memory_with_outputs_or_the_log_with_lines() {
    // Found by an attack run: one record making 3 M outputs took 980 MB of
    // host memory under a 256 MiB plugin cap, and 200,000 log calls and
    // 1 MiB of stderr became 724,000 log lines.
    let input = write_input(&["fanout".to_string()]);
    let out = host_test("misbehave", input.path());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("more than the limit of 1000000 per call"),
        "{}",
        stderr(&out)
    );

    let input = write_input(&["logflood".to_string(), "after".to_string()]);
    let out = std::process::Command::new(crate::support::host_bin())
        .args(["test", "--plugin"])
        .arg(plugin("misbehave"))
        .arg("--input")
        .arg(input.path())
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let lines = err.lines().count();
    assert!(lines < 1_000, "{lines} log lines");
    assert!(
        err.contains("plugin log lines dropped (at most 200 lines per call and 1000 per second"),
        "{err}"
    );
    let outputs = json_lines(&out);
    assert_eq!(outputs[0]["value"], "flooded");
    assert_eq!(outputs[1]["value"], "after");
}

#[test]
fn unusable_files_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, "hello, I am text").unwrap();
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let cases = [
        (text.clone(), "not a WebAssembly file"),
        (core.clone(), "core WebAssembly module, not a component"),
        (plugin("wrong-world"), "exports no Sluice stage"),
        (
            plugin("future_version"),
            "built for contract sluice:plugin@9.0.0",
        ),
        (dir.path().join("missing.wasm"), "cannot read"),
    ];
    for (path, want) in cases {
        for args in [
            vec!["plugin", "inspect", path.to_str().unwrap()],
            vec![
                "test",
                "--plugin",
                path.to_str().unwrap(),
                "--input",
                "/dev/null",
            ],
        ] {
            let out = host(&args);
            assert_eq!(out.status.code(), Some(1), "{args:?}");
            let err = stderr(&out);
            assert!(err.contains(want), "{args:?}: {err}");
            assert!(
                err.contains(path.to_str().unwrap()),
                "names the file: {err}"
            );
        }
    }
}

#[test]
fn inspect_reports_stages_version_and_imports() {
    let out = host(&[
        "plugin",
        "inspect",
        plugin("company").to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stages"], json!(["map", "sink"]));
    assert_eq!(v["contract_version"], "0.2.4");
    let digest = v["digest"].as_str().unwrap();
    assert!(digest.starts_with("sha256:") && digest.len() == 7 + 64);
    let imports: Vec<&str> = v["imports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap())
        .collect();
    assert!(imports.contains(&"sluice:plugin/config@0.2.4"));
    assert!(imports.contains(&"sluice:plugin/log@0.2.4"));
    assert!(
        imports.contains(&"sluice:plugin/sql@0.2.4")
            && imports.contains(&"sluice:plugin/kafka@0.2.4"),
        "the sink stage asks for sql and kafka"
    );
    let out = host(&[
        "plugin",
        "inspect",
        plugin("passthrough").to_str().unwrap(),
        "--json",
    ]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stages"], json!(["map"]));
    let imports = v["imports"].as_array().unwrap();
    assert!(
        !imports
            .iter()
            .any(|i| i == "sluice:plugin/sql@0.2.4" || i == "sluice:plugin/kafka@0.2.4"),
        "map-only plugins get no sql, no kafka"
    );
}

#[test]
fn out_of_range_durations_and_sizes_are_usage_errors_not_panics() {
    // Found by an attack run: a huge --plugin-timeout overflowed the
    // deadline ticks (exit 101), --trigger-interval 0s spun while idle, and
    // a SQLite path that cannot be created exited 1.
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let base = [
        "run",
        "--brokers",
        "127.0.0.1:1",
        "--topic",
        "t",
        "--checkpoint",
        ckpt.to_str().unwrap(),
    ];
    let no_dir = format!(
        "sqlite:{}",
        dir.path().join("no/such/dir/sink.db").display()
    );
    for (extra, says) in [
        (
            vec!["--plugin-timeout", "92233720368547758s75ms"],
            "--plugin-timeout",
        ),
        (vec!["--plugin-timeout", "25h"], "--plugin-timeout"),
        (vec!["--trigger-interval", "0s"], "--trigger-interval"),
        (vec!["--kafka-timeout", "100ms"], "--kafka-timeout"),
        (vec!["--plugin-memory", "8GiB"], "--plugin-memory"),
        (vec!["--wait", "30d"], "--wait"),
        (vec!["--sink-db", no_dir.as_str()], "sink database"),
        (
            vec!["--sink-db-password-file", "/no/such/file"],
            "--sink-db-password-file",
        ),
    ] {
        let mut argv: Vec<&str> = base.to_vec();
        argv.extend(&extra);
        let out = host(&argv);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{extra:?}: {}", stderr(&out));
    }
    let out = host(&[
        "test",
        "--plugin-timeout",
        "92233720368547759s",
        "--plugin",
        "x",
        "--input",
        "-",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!ckpt.exists(), "nothing was created");
}

#[test]
fn cli_reference_matches_help() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md")).unwrap();
    for cmd in [
        "",
        "run",
        "demo",
        "test",
        "swap",
        "status",
        "plugin new",
        "plugin inspect",
        "checkpoint show",
        "checkpoint reset",
        "group status",
        "group swap",
        "group reset",
        "group adopt",
        "group disband",
    ] {
        let mut args: Vec<&str> = cmd.split_whitespace().collect();
        args.push("--help");
        let out = std::process::Command::new(crate::support::host_bin())
            .args(&args)
            .env("COLUMNS", "100")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            doc.contains(help.trim_end()),
            "docs/cli.md is out of date for `host {cmd} --help`: run scripts/cli-docs.sh"
        );
    }
}

#[test]
fn closed_stdout_ends_quietly_with_141() {
    // stdout is a pipe whose read end is already closed: the first write
    // fails with EPIPE. Both kinds of output are covered: `plugin inspect`
    // (line output) and `host test` (streamed records).
    let input = write_input(&[maxwell("insert", Some(ROW1), "")]);
    for args in [
        vec!["plugin", "inspect", plugin("company").to_str().unwrap()],
        vec![
            "test",
            "--plugin",
            plugin("company").to_str().unwrap(),
            "--input",
            input.path().to_str().unwrap(),
        ],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(crate::support::host_bin())
            .args(&args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `host test --sink-db --dry-run` rehearses company's sink on a fresh
/// database: each partition in its own transaction, rolled back, the next
/// one on a fresh instance whose `init` creates the table again; nothing
/// stays. Without --dry-run the same parts are committed, as `host run`
/// would apply them; without a database they are `not_run`.
#[test]
fn a_sink_test_commits_per_partition_and_a_dry_run_keeps_nothing() {
    let record = |partition: i32, id: i32| {
        let value = maxwell("insert", Some(&format!(r#"{{"id":{id}}}"#)), "");
        json!({"partition": partition, "value": value}).to_string()
    };
    let input = write_input(&[record(0, 1), record(1, 2), record(0, 3)]);
    let db = crate::support::Db::sqlite();
    let company = plugin("company");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "test",
            "--plugin",
            company.to_str().unwrap(),
            "--format",
            "records",
            "--input",
            input.path().to_str().unwrap(),
        ];
        args.extend(extra);
        let out = host(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        json_lines(&out)
    };
    let parts = |got: &[Value]| -> Vec<(i64, i64, i64, String)> {
        got.iter()
            .filter(|l| l["type"] == "part")
            .map(|l| {
                (
                    l["partition"].as_i64().unwrap(),
                    l["start_offset"].as_i64().unwrap(),
                    l["end_offset"].as_i64().unwrap(),
                    l["outcome"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    // A part's line follows its last record; offsets are line numbers.
    let got = run(&["--sink-db", &db.url, "--dry-run"]);
    let inserts: Vec<(i64, i64)> = got
        .iter()
        .filter(|l| l["type"] == "sql" && l["statement"].as_str().unwrap().starts_with("INSERT"))
        .map(|l| {
            (
                l["partition"].as_i64().unwrap(),
                l["rows_changed"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(inserts, vec![(0, 1), (1, 1), (0, 1)], "{got:?}");
    let creates = got
        .iter()
        .filter(|l| {
            l["call"] == "open" && l["statement"].as_str().unwrap().contains("CREATE TABLE")
        })
        .count();
    assert_eq!(
        creates, 2,
        "init runs once per partition's instance: {got:?}"
    );
    let rolled_back = |p: i64, s: i64, e: i64| (p, s, e, "rolled_back".to_string());
    assert_eq!(parts(&got), [rolled_back(1, 1, 2), rolled_back(0, 0, 3)]);
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM sqlite_master WHERE name = 'companies'"),
        0,
        "rolled back"
    );

    let got = run(&["--sink-db", &db.url]);
    let committed = |p: i64, s: i64, e: i64| (p, s, e, "committed".to_string());
    assert_eq!(parts(&got), [committed(1, 1, 2), committed(0, 0, 3)]);
    assert_eq!(
        db.sorted_texts("SELECT pk FROM companies"),
        [r#"{"id":1}"#, r#"{"id":2}"#, r#"{"id":3}"#]
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM sqlite_master WHERE name = 'sluice_progress'"),
        0,
        "host test keeps no progress"
    );

    // Without a database nothing runs: the parts say so.
    let got = run(&[]);
    let not_run = |p: i64, s: i64, e: i64| (p, s, e, "not_run".to_string());
    assert_eq!(parts(&got), [not_run(1, 1, 2), not_run(0, 0, 3)]);
}

/// `host test --sink-db` fails a part the way `host run` would: an SQL
/// error the sink caught and went past still rolls the part back; a
/// record the sink rejects prints the statement that failed before its
/// `bad_record` line; `--sink-db` without a sink stage is a usage error.
#[test]
fn a_sink_rehearsal_fails_where_host_run_would_and_shows_the_failing_statement() {
    let db = crate::support::Db::sqlite();
    let rehearse = |lines: &[&str], extra: &[&str]| {
        let input = write_input(&lines.iter().map(|l| l.to_string()).collect::<Vec<_>>());
        let mut args = vec![
            "test".to_string(),
            "--plugin".into(),
            plugin("sql_counter").to_str().unwrap().into(),
            "--input".into(),
            input.path().to_str().unwrap().into(),
            "--sink-db".into(),
            db.url.clone(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        host(&args)
    };
    let out = rehearse(&["one", "swallow-quietly"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("host run would roll this part back: no such table: no_such_table"),
        "{}",
        stderr(&out)
    );

    let out = rehearse(&["one", "sql-reject", "three"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let got = json_lines(&out);
    let at = |offset: i64| -> Vec<&Value> {
        got.iter()
            .filter(|l| l["offset"] == offset && l["type"] != "output")
            .collect()
    };
    let rejected = at(1);
    assert_eq!(rejected.len(), 2, "{got:?}");
    assert_eq!(rejected[0]["type"], "sql");
    assert_eq!(
        rejected[0]["statement"],
        "INSERT INTO no_such_table VALUES (1)"
    );
    assert!(
        rejected[0]["error"]
            .as_str()
            .unwrap()
            .contains("no such table"),
        "{got:?}"
    );
    assert_eq!(rejected[1]["type"], "bad_record");
    assert!(at(2).iter().any(|l| l["type"] == "sql"), "{got:?}");

    let out = host(&[
        "test",
        "--plugin",
        plugin("passthrough").to_str().unwrap(),
        "--input",
        write_input(&["x".to_string()]).path().to_str().unwrap(),
        "--sink-db",
        &db.url,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}
