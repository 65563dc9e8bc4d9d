//! Plugins written in JavaScript with `guest-sdk-js`, built with
//! ComponentizeJS by the test command into `target/js/NAME.wasm`: the same
//! contract, `host test` and `host run` unchanged, traps and the sandbox
//! as for Rust plugins.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_guest::wire::{self, Record};
use sluice_host::engine;
use sluice_host::plugin::{CallContext, Limits, PluginError, Runtime, TrapKind};

use crate::engine_mock::{pipeline, produce, table};
use crate::kafka::{Broker, Mock};
use crate::maxwell::Stream;
use crate::python::{host_test, maxwell_input, python_plugin};
use crate::support::{Db, guest_plugin, host, json_lines, plugin, stderr};

/// A JavaScript plugin built by the test command.
fn js_plugin(name: &str) -> PathBuf {
    guest_plugin("js", name)
}

/// Outputs and sink statements of `host test` lines, as JSON text.
fn outputs(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l["type"] == "output" || l["type"] == "sql")
        .map(Value::to_string)
        .collect()
}

/// Offsets of the bad records of `host test` lines.
fn rejected(lines: &[Value]) -> Vec<i64> {
    lines
        .iter()
        .filter(|l| l["type"] == "bad_record")
        .map(|l| l["offset"].as_i64().unwrap())
        .collect()
}

#[test]
fn the_js_company_maps_and_writes_every_event_exactly_as_the_rust_and_python_ones_do() {
    let input = maxwell_input();
    for table in ["company", "orders"] {
        let config = format!("table={table}");
        let more = ["--config", config.as_str()];
        let rust = host_test(&plugin("company"), input.path(), &more);
        let js = host_test(&js_plugin("company"), input.path(), &more);
        let python = host_test(&python_plugin("company"), input.path(), &more);
        assert!(outputs(&rust).len() >= 2, "{table}: {rust:?}");
        assert_eq!(outputs(&js), outputs(&rust), "{table}");
        assert_eq!(rejected(&js), rejected(&rust), "{table}");
        assert_eq!(outputs(&js), outputs(&python), "{table}");
    }
}

#[test]
fn a_js_pipeline_applies_each_change_once_and_resumes_after_a_restart() {
    let mock = Mock::new();
    mock.create_topic("maxwell", 3);
    let mut stream = Stream::new(12);
    produce(&mock, "maxwell", &mut stream, 400, 3);
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite();
    let mut cfg = pipeline(&mock.bootstrap(), "maxwell", &dir.path().join("ckpt"), &db);
    cfg.plugins = vec![js_plugin("company")];
    let first = engine::run(&cfg, Arc::new(AtomicBool::new(false))).unwrap();
    assert_eq!(first.counts.input, 400);
    assert_eq!(table(&db), stream.state);

    produce(&mock, "maxwell", &mut stream, 200, 3);
    let second = engine::run(&cfg, Arc::new(AtomicBool::new(false))).unwrap();
    assert_eq!(second.reran, None);
    assert_eq!(second.counts.input, 200, "only the new events are read");
    assert_eq!(table(&db), stream.state);
    let keys = db.scalar("SELECT COUNT(*) FROM companies WHERE idempotency_key LIKE 'maxwell/%'");
    assert_eq!(keys as usize, stream.state.len());
}

#[test]
fn js_errors_reach_the_host_as_bad_records_traps_and_fatal_errors() {
    let misbehave = js_plugin("misbehave");
    let input = tempfile::NamedTempFile::new().unwrap();
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
    // An uncaught error is a trap; the host names the error and the line
    // of the plugin's source that threw it (not the bundle's).
    let trap = by_offset(2)["error"].as_str().unwrap();
    assert!(
        trap.contains("guest panicked: TypeError: javascript threw at offset 2 (at app.js:"),
        "{trap}"
    );
    assert!(trap.ends_with(", in raise)"), "{trap}");
    assert_eq!(by_offset(3)["value"], "hello from config");
    assert_eq!(by_offset(4)["value"], "logged");
    assert!(
        stderr(&out).contains("log line at offset 4"),
        "{}",
        stderr(&out)
    );
    assert_eq!(by_offset(5)["type"], "bad_record");
    assert!(
        by_offset(5)["error"]
            .as_str()
            .unwrap()
            .starts_with("not JSON"),
        "{lines:?}"
    );
    assert_eq!(by_offset(6)["value"], "b");

    let out = run(&["a", "fatal"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("misbehave gave up"),
        "{}",
        stderr(&out)
    );
}

fn values(vals: &[&'static [u8]]) -> Vec<Record<'static>> {
    vals.iter()
        .enumerate()
        .map(|(i, v)| Record::with_value("probe", 0, i as i64, v))
        .collect()
}

fn first_value(result: &sluice_host::plugin::MapResult) -> String {
    let outs = wire::decode_outputs(&result.outputs).expect("decodable outputs");
    String::from_utf8_lossy(outs[0].value.expect("a value")).into_owned()
}

/// Deadlines, the memory cap and the sandbox hold for a component of
/// another language (`lang`, built from its misbehave fixture) as for a
/// Rust one: a loop stops at the deadline, an allocation at the cap, each
/// followed by a fresh instance that works; the environment is empty and
/// no connection leaves. Returns what the network probe gave (or the
/// error it trapped with), for the caller's assertions.
pub(crate) fn assert_contained(lang: &str) -> Result<String, PluginError> {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().unwrap().port().to_string();
    let config = Arc::new(BTreeMap::from([("port".to_string(), port)]));
    let cap = 256 << 20;
    let rt = Runtime::new(Limits {
        call_timeout: Duration::from_millis(1500),
        memory_bytes: cap,
    })
    .expect("runtime");
    let p = rt
        .load(&guest_plugin(lang, "misbehave"), config)
        .expect("load");
    let mut inst = p.instance();
    let ctx = CallContext::default();

    let started = Instant::now();
    let err = inst.map(&ctx, &values(&[b"spin"])).expect_err("must trap");
    assert!(
        matches!(&err, PluginError::Trap(t) if matches!(t.kind, TrapKind::Timeout { .. })),
        "{lang}: {err}"
    );
    assert!(started.elapsed() < Duration::from_millis(1500 + 3000));
    let ok = inst.map(&ctx, &values(&[b"fine"])).expect("fresh instance");
    assert_eq!(first_value(&ok), "fine");

    let err = inst.map(&ctx, &values(&[b"grow"])).expect_err("must trap");
    match &err {
        PluginError::Trap(t) => match t.kind {
            TrapKind::OutOfMemory { limit, .. } => assert_eq!(limit, cap),
            ref other => panic!("{lang}: expected out of memory, got {other}"),
        },
        other => panic!("{lang}: expected a trap, got {other}"),
    }
    let ok = inst.map(&ctx, &values(&[b"x"])).expect("recovers");
    assert_eq!(first_value(&ok), "x");

    let env = inst.map(&ctx, &values(&[b"read-env"])).expect("probe runs");
    assert!(
        first_value(&env).starts_with("denied"),
        "{lang}: {}",
        first_value(&env)
    );
    let connect = inst
        .map(&ctx, &values(&[b"connect"]))
        .map(|r| first_value(&r));
    assert!(
        listener.accept().is_err(),
        "{lang}: the guest reached the listener"
    );
    connect
}

#[test]
fn a_js_plugin_is_contained_like_a_rust_one_deadline_memory_cap_and_sandbox() {
    // ComponentizeJS has no network API once `http` is disabled at build
    // time: `fetch` traps (contained like any trap) instead of connecting.
    match assert_contained("js") {
        Err(PluginError::Trap(_)) => {}
        Ok(v) => assert!(v.starts_with("denied"), "{v}"),
        Err(other) => panic!("{other}"),
    }
}

#[test]
fn the_js_passthrough_forwards_keys_values_and_headers_unchanged() {
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
    let js = host_test(&js_plugin("passthrough"), input.path(), &[]);
    assert_eq!(rust.len(), 3);
    assert_eq!(js, rust);
}

#[test]
fn a_js_map_killed_between_parts_resumes_and_applies_each_record_once() {
    crate::python::killed_between_parts_then_exact(&js_plugin("passthrough"));
}

#[test]
fn a_component_that_imports_wasi_http_is_refused_at_load_naming_the_import() {
    // ComponentizeJS's default features import wasi:http, which the
    // sandbox does not grant (sluice-guest-build disables them).
    let out = host(&["plugin", "inspect", js_plugin("http").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(e.contains("cannot instantiate"), "{e}");
    assert!(e.contains("wasi:http/types@"), "{e}");
    assert!(e.contains("the sandbox grants only"), "{e}");
}

#[test]
fn a_js_sink_sends_each_good_record_once_through_the_kafka_capability() {
    let broker = crate::kafka::BrokerProcess::start();
    crate::output_sender::a_sender_produces_each_good_input_once(&broker, &js_plugin("sender"));
}
