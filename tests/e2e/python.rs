//! Plugins written in Python with `guest-sdk-python`, built with
//! componentize-py by the test command into `target/python/NAME.wasm`:
//! the same contract, `host test` and `host run` unchanged.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde_json::Value;
use sluice_host::engine;

use crate::engine_mock::{pipeline, produce, table};
use crate::kafka::{Broker, Mock};
use crate::maxwell::Stream;
use crate::support::{Db, guest_plugin, host, json_lines, plugin, stderr};

/// A Python plugin built by the test command.
pub(crate) fn python_plugin(name: &str) -> PathBuf {
    guest_plugin("python", name)
}

/// `host test` of `plugin` over `input` (`--format records`), with `more`:
/// its outputs, bad records and the SQL a sink stage would send.
pub(crate) fn host_test(
    plugin: &std::path::Path,
    input: &std::path::Path,
    more: &[&str],
) -> Vec<Value> {
    let mut args = vec![
        "test",
        "--plugin",
        plugin.to_str().unwrap(),
        "--format",
        "records",
        "--input",
        input.to_str().unwrap(),
    ];
    args.extend(more);
    let out = host(&args);
    assert!(
        out.status.success() || out.status.code() == Some(1),
        "{}",
        stderr(&out)
    );
    json_lines(&out)
}

/// Maxwell events from the cdc fixture (Maxwell's documented format) and
/// edge cases of the company map: no key, a key of several `pk.*`
/// fields, non-ASCII, JSON that is not an object, an array `data`.
pub(crate) fn maxwell_input() -> tempfile::NamedTempFile {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/cdc/maxwell.jsonl");
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&std::fs::read(fixture).unwrap()).unwrap();
    for line in [
        r#"{"key":null,"value":{"database":"shop","table":"company","type":"delete","data":{"id":9,"name":"Zürich \"Ü\""}}}"#,
        r#"{"key":{"database":"shop","table":"company","pk.code":"A","pk.region":2},"value":{"database":"shop","table":"company","type":"update","data":{"code":"A", "region":2,"v":1.10}}}"#,
        r#"{"key":"not json","value":{"database":"shop","table":"company","type":"insert","data":{"id":3}}}"#,
        r#"{"key":null,"value":"{not json"}"#,
        r#"{"key":null,"value":"[1,2]"}"#,
        r#"{"key":null,"value":{"table":"company","type":"insert","data":[1]}}"#,
        r#"{"key":null,"value":{"table":"company","type":"insert","data":{"name":"no id"}}}"#,
        r#"{"key":null,"value":{"table":"company","type":"insert","data":null}}"#,
        r#"{"key":{"pk.id":5},"value":"\ufeff{\"table\":\"company\",\"type\":\"insert\",\"data\":{\"id\":5}}"}"#,
        r#"{"key":null,"value":null}"#,
        // Updates that move a row to another key (Maxwell's `old` holds
        // the previous id), a composite key with one column changed, and
        // `old`s that move nothing.
        r#"{"key":{"database":"shop","table":"company","pk.id":21},"value":{"database":"shop","table":"company","type":"update","data":{"id":21,"name":"moved"},"old":{"id":20,"name":"was"}}}"#,
        r#"{"key":{"database":"shop","table":"company","pk.code":"A","pk.region":3},"value":{"database":"shop","table":"company","type":"update","data":{"code":"A","region":3},"old":{"region":2}}}"#,
        r#"{"key":null,"value":{"database":"shop","table":"company","type":"update","data":{"id":22},"old":{"id":"22x"}}}"#,
        r#"{"key":null,"value":{"database":"shop","table":"company","type":"update","data":{"id":23},"old":null}}"#,
        r#"{"key":null,"value":{"database":"shop","table":"company","type":"update","data":{"id":24},"old":{"id":null}}}"#,
        r#"{"key":null,"value":{"database":"shop","table":"company","type":"update","data":{"id":25},"old":[1]}}"#,
        r#"{"key":null,"value":{"database":"shop","table":"company","type":"insert","data":{"id":26},"old":{"id":1}}}"#,
    ] {
        writeln!(f, "{line}").unwrap();
    }
    f
}

#[test]
fn the_python_company_maps_and_writes_every_event_exactly_as_the_rust_company_does() {
    let input = maxwell_input();
    for table in ["company", "orders"] {
        let config = format!("table={table}");
        let more = ["--config", config.as_str()];
        let rust = host_test(&plugin("company"), input.path(), &more);
        let python = host_test(&python_plugin("company"), input.path(), &more);
        // Outputs and the sink's statements, in order, byte for byte.
        let outputs = |lines: &[Value]| -> Vec<String> {
            lines
                .iter()
                .filter(|l| l["type"] == "output" || l["type"] == "sql")
                .map(Value::to_string)
                .collect()
        };
        let rejected = |lines: &[Value]| -> Vec<i64> {
            lines
                .iter()
                .filter(|l| l["type"] == "bad_record")
                .map(|l| l["offset"].as_i64().unwrap())
                .collect()
        };
        assert!(outputs(&rust).len() >= 2, "{table}: {rust:?}");
        assert_eq!(outputs(&python), outputs(&rust), "{table}");
        assert_eq!(rejected(&python), rejected(&rust), "{table}");
    }
}

#[test]
fn a_python_pipeline_applies_each_change_once_and_resumes_after_a_restart() {
    let mock = Mock::new();
    mock.create_topic("maxwell", 3);
    let mut stream = Stream::new(11);
    produce(&mock, "maxwell", &mut stream, 400, 3);
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite();
    let mut cfg = pipeline(&mock.bootstrap(), "maxwell", &dir.path().join("ckpt"), &db);
    cfg.plugins = vec![python_plugin("company")];
    let first = engine::run(&cfg, Arc::new(AtomicBool::new(false))).unwrap();
    assert_eq!(first.counts.input, 400);
    assert_eq!(table(&db), stream.state);

    produce(&mock, "maxwell", &mut stream, 200, 3);
    let second = engine::run(&cfg, Arc::new(AtomicBool::new(false))).unwrap();
    assert_eq!(second.reran, None);
    assert_eq!(second.counts.input, 200, "only the new events are read");
    assert_eq!(table(&db), stream.state);
    // The sink recorded each row's last change with its idempotency key.
    let keys = db.scalar("SELECT COUNT(*) FROM companies WHERE idempotency_key LIKE 'maxwell/%'");
    assert_eq!(keys as usize, stream.state.len());
}

#[test]
fn python_errors_reach_the_host_as_bad_records_traps_and_fatal_errors() {
    let misbehave = python_plugin("misbehave");
    let input = tempfile::NamedTempFile::new().unwrap();
    // `host test` of misbehave over these values (lines of input).
    let run = |values: &[&str]| {
        std::fs::write(input.path(), values.join("\n") + "\n").unwrap();
        host(&[
            "test",
            "--plugin",
            misbehave.to_str().unwrap(),
            "--input",
            input.path().to_str().unwrap(),
            "--config",
            "greeting=hello from config",
        ])
    };
    let out = run(&["a", "bad", "raise", "greet", "log", "json", "b"]);
    // A record that made the plugin trap exits 1 after the others ran.
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let lines = json_lines(&out);
    let by_offset = |o: i64| -> &Value {
        lines
            .iter()
            .find(|l| l["offset"] == o)
            .unwrap_or_else(|| panic!("no line for offset {o}: {lines:?}"))
    };
    assert_eq!(by_offset(0)["value"], "a");
    assert_eq!(by_offset(1)["type"], "bad_record");
    assert_eq!(by_offset(1)["error"], "bad at offset 1");
    // An uncaught exception is a trap; the host names the exception and
    // the line of the plugin that raised it.
    let trap = by_offset(2)["error"].as_str().unwrap();
    assert!(
        trap.contains("ValueError: python raised at offset 2 (at app.py:"),
        "{trap}"
    );
    assert!(trap.contains(", in map)"), "{trap}");
    assert_eq!(by_offset(3)["value"], "hello from config");
    assert_eq!(by_offset(4)["value"], "logged");
    assert!(
        stderr(&out).contains("log line at offset 4"),
        "{}",
        stderr(&out)
    );
    // The SDK's JSON error is a bad record, like `?` on a JSON error in Rust.
    assert_eq!(by_offset(5)["type"], "bad_record");
    assert!(
        by_offset(5)["error"]
            .as_str()
            .unwrap()
            .starts_with("not JSON"),
        "{lines:?}"
    );
    assert_eq!(by_offset(6)["value"], "b");

    // Fatal stops the run with the plugin's message.
    let out = run(&["a", "fatal"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("misbehave gave up"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_python_passthrough_forwards_keys_values_and_headers_unchanged() {
    let input = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        input.path(),
        concat!(
            r#"{"key":"k1","value":"v1","headers":[{"key":"h","value":"x"},{"key":"empty","value":null}]}"#,
            "\n",
            r#"{"key_b64":"/w==","value":null}"#,
            "\n",
            r#"{"value":""}"#,
            "\n"
        ),
    )
    .unwrap();
    let rust = host_test(&plugin("passthrough"), input.path(), &[]);
    let python = host_test(&python_plugin("passthrough"), input.path(), &[]);
    assert_eq!(rust.len(), 3);
    assert_eq!(python, rust);
}

#[test]
fn a_python_plugin_is_contained_like_a_rust_one_deadline_memory_cap_and_sandbox() {
    let connect = crate::js::assert_contained("python").expect("the probe runs");
    assert!(connect.starts_with("denied"), "{connect}");
}

#[test]
fn a_python_sleep_past_the_deadline_traps_at_once() {
    use sluice_host::plugin::{CallContext, Limits, PluginError, Runtime, TrapKind};
    let rt = Runtime::new(Limits {
        call_timeout: std::time::Duration::from_millis(1000),
        memory_bytes: 256 << 20,
    })
    .expect("runtime");
    let p = rt
        .load(&python_plugin("misbehave"), Arc::new(Default::default()))
        .expect("load");
    let mut inst = p.instance();
    let rec = |v: &'static [u8]| vec![sluice_guest::wire::Record::with_value("t", 0, 0, v)];
    let started = std::time::Instant::now();
    let err = inst
        .map(&CallContext::default(), &rec(b"sleep"))
        .expect_err("must trap");
    assert!(started.elapsed() < std::time::Duration::from_millis(900));
    assert!(
        matches!(&err, PluginError::Trap(t) if matches!(t.kind, TrapKind::WaitPastDeadline { .. })),
        "{err}"
    );
    let ok = inst
        .map(&CallContext::default(), &rec(b"nap"))
        .expect("a short sleep is served");
    let outs = sluice_guest::wire::decode_outputs(&ok.outputs).unwrap();
    assert_eq!(outs[0].value, Some(&b"slept"[..]));
}

/// kill -9 of a pipeline whose map stage is the `lang` passthrough (the
/// sink: sql-counter, a counter bumped per record), just before the second
/// part of its one 5,000-record batch commits; the restart applies the
/// rest, each record once, with the values the plugin passed on.
pub(crate) fn killed_between_parts_then_exact(plugin: &std::path::Path) {
    let mock = crate::engine_mock::raw_topic((0..5000).map(|i| format!("v{i}")));
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite();
    let args = crate::support::RunArgs::new(&mock.bootstrap(), &["raw"], &dir.path().join("ckpt"))
        .sink_db(&db)
        .plugin_file(plugin)
        .plugin("sql_counter")
        .args(["--until-caught-up", "--max-records-per-partition", "10000"])
        .args(["--progress", "none"])
        .build();
    let mut run = crate::support::HostProcess::spawn(
        &args,
        &[("SLUICE_FAILPOINT", "sink:before-db-commit@2")],
    );
    run.wait_for("FAILPOINT", std::time::Duration::from_secs(180));
    run.kill();
    assert_eq!(db.counted(), 2000);
    let out = std::process::Command::new(crate::support::host_bin())
        .args(&args)
        .env_remove("SLUICE_FAILPOINT")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(db.counted(), 5000);
    assert_eq!(
        db.scalar("SELECT COUNT(DISTINCT idempotency_key) FROM seen"),
        5000
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM seen WHERE value = 'v' || substr(idempotency_key, 7)"),
        5000,
        "every value passed on unchanged"
    );
}

#[test]
fn a_python_map_killed_between_parts_resumes_and_applies_each_record_once() {
    killed_between_parts_then_exact(&python_plugin("passthrough"));
}

#[test]
fn a_python_sink_sends_each_good_record_once_through_the_kafka_capability() {
    let broker = crate::kafka::BrokerProcess::start();
    crate::output_sender::a_sender_produces_each_good_input_once(&broker, &python_plugin("sender"));
}
