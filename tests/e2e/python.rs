//! Plugins written in Python with `guest-sdk-python`, built with
//! componentize-py by the test command into `target/python/NAME.wasm`:
//! the same contract, `host test` and `host run` unchanged.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use crate::support::languages::{
    applies_each_change_once_and_resumes_after_a_restart,
    errors_reach_the_host_as_bad_records_traps_and_fatal_errors, host_test,
    killed_between_parts_then_exact, maxwell_input,
};
use crate::support::{guest_plugin, plugin};

/// A Python plugin built by the test command.
pub(crate) fn python_plugin(name: &str) -> PathBuf {
    guest_plugin("python", name)
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
    applies_each_change_once_and_resumes_after_a_restart(python_plugin("company"), 11);
}

#[test]
fn python_errors_reach_the_host_as_bad_records_traps_and_fatal_errors() {
    errors_reach_the_host_as_bad_records_traps_and_fatal_errors(
        &python_plugin("misbehave"),
        |trap| {
            assert!(
                trap.contains("ValueError: python raised at offset 2 (at app.py:"),
                "{trap}"
            );
            assert!(trap.contains(", in map)"), "{trap}");
        },
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
    let connect = crate::support::languages::assert_contained("python").expect("the probe runs");
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

#[test]
fn a_python_map_killed_between_parts_resumes_and_applies_each_record_once() {
    killed_between_parts_then_exact(&python_plugin("passthrough"));
}

#[test]
fn a_python_sink_sends_each_good_record_once_through_the_kafka_capability() {
    let broker = crate::support::kafka::BrokerProcess::start();
    crate::output_sender::a_sender_produces_each_good_input_once(&broker, &python_plugin("sender"));
}
