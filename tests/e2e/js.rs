//! Plugins written in JavaScript with `guest-sdk-js`, built with
//! ComponentizeJS by the test command into `target/js/NAME.wasm`: the same
//! contract, `host test` and `host run` unchanged, traps and the sandbox
//! as for Rust plugins.

use std::path::PathBuf;

use serde_json::Value;
use sluice_host::plugin::PluginError;

use crate::python::python_plugin;
use crate::support::languages::{
    applies_each_change_once_and_resumes_after_a_restart, assert_contained,
    errors_reach_the_host_as_bad_records_traps_and_fatal_errors, host_test,
    killed_between_parts_then_exact, maxwell_input,
};
use crate::support::{guest_plugin, host, plugin, stderr};

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
    applies_each_change_once_and_resumes_after_a_restart(js_plugin("company"), 12);
}

#[test]
fn js_errors_reach_the_host_as_bad_records_traps_and_fatal_errors() {
    errors_reach_the_host_as_bad_records_traps_and_fatal_errors(&js_plugin("misbehave"), |trap| {
        // Named at the line of the plugin's source (not the bundle's).
        assert!(
            trap.contains("guest panicked: TypeError: javascript threw at offset 2 (at app.js:"),
            "{trap}"
        );
        assert!(trap.ends_with(", in raise)"), "{trap}");
    });
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
    killed_between_parts_then_exact(&js_plugin("passthrough"));
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
    let broker = crate::support::kafka::BrokerProcess::start();
    crate::output_sender::a_sender_produces_each_good_input_once(&broker, &js_plugin("sender"));
}
