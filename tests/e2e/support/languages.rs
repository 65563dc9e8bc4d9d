//! What the tests of plugins in Python and JavaScript share: `host test`
//! over a file, the Maxwell input of the company plugins, and the checks
//! every guest language passes alike (a pipeline applies each change once
//! and resumes, errors reach the host as bad records, traps and fatal
//! errors, a kill between parts applies each record once).

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_guest::wire::{self, Record};
use sluice_host::engine;
use sluice_host::plugin::{CallContext, Limits, PluginError, Runtime, TrapKind};

use super::kafka::{Broker, Mock};
use super::maxwell::{Stream, pipeline, produce, table};
use super::{Db, guest_plugin, host, json_lines, stderr};

/// `host test` of `plugin` over `input` (`--format records`), with `more`:
/// its outputs, bad records and the SQL a sink stage would send.
pub fn host_test(plugin: &std::path::Path, input: &std::path::Path, more: &[&str]) -> Vec<Value> {
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
pub fn maxwell_input() -> tempfile::NamedTempFile {
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

pub fn applies_each_change_once_and_resumes_after_a_restart(company: PathBuf, seed: u64) {
    let mock = Mock::new();
    mock.create_topic("maxwell", 3);
    let mut stream = Stream::new(seed);
    produce(&mock, "maxwell", &mut stream, 400, 3);
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite();
    let mut cfg = pipeline(&mock.bootstrap(), "maxwell", &dir.path().join("ckpt"), &db);
    cfg.plugins = vec![company];
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

/// `host test` of the `misbehave` fixture: a bad record, an uncaught
/// exception (a trap, checked by `trap_names_the_source`), config, logs,
/// a JSON error, and a fatal error.
pub fn errors_reach_the_host_as_bad_records_traps_and_fatal_errors(
    misbehave: &Path,
    trap_names_the_source: impl Fn(&str),
) {
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
    // the line of the plugin's source that raised it.
    trap_names_the_source(by_offset(2)["error"].as_str().unwrap());
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

/// kill -9 of a pipeline whose map stage is the `lang` passthrough (the
/// sink: sql-counter, a counter bumped per record), just before the second
/// part of its one 5,000-record batch commits; the restart applies the
/// rest, each record once, with the values the plugin passed on.
pub fn killed_between_parts_then_exact(plugin: &std::path::Path) {
    let mock = super::kafka::raw_topic((0..5000).map(|i| format!("v{i}")));
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
pub fn assert_contained(lang: &str) -> Result<String, PluginError> {
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
