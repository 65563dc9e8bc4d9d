//! A sink stage sending with `kafka.send` from the `sender` fixture (one
//! record per input; Rust here, Python and JavaScript in `python` and
//! `js`): only a part's last attempt is produced, a refused send fails
//! the part, and `host test` shows what would be sent. Exactly once on
//! Apache Kafka, read through [`crate::txn_view`].

use std::collections::BTreeMap;
use std::path::Path;

use crate::output::host_run;
use crate::output_send::input_of;
use crate::support::kafka::{Broker, BrokerProcess, producer};
use crate::support::{RunArgs, json_lines, stderr};
use crate::txn_view::committed_view;

/// `in` (2 partitions) with `n` records `v{i}`, every 37th `bad`, header
/// `h` naming the input; `out` (2 partitions).
fn fill_for_sender(broker: &BrokerProcess, n: usize) {
    broker.create_topic("in", 2);
    broker.create_topic("out", 2);
    let p = producer(&broker.bootstrap());
    for i in 0..n {
        let value = if i % 37 == 5 {
            "bad".to_string()
        } else {
            format!("v{i}")
        };
        let header = i.to_string();
        p.send(
            "in",
            (i % 2) as i32,
            Some(format!("k{i}").as_bytes()),
            Some(value.as_bytes()),
            &[("h", Some(header.as_bytes()))],
        );
    }
    p.flush();
}

/// Run the sender fixture `sink` (Rust, Python or JavaScript) exactly
/// once over inputs with bad records (`--on-error skip`): each part with a
/// bad record is written twice or more, and only the last attempt's
/// records may be produced, each good input visible once.
pub(crate) fn a_sender_produces_each_good_input_once(broker: &BrokerProcess, sink: &Path) {
    let n = 400;
    fill_for_sender(broker, n);
    let dir = tempfile::tempdir().unwrap();
    let args = RunArgs::new(&broker.bootstrap(), &["in"], &dir.path().join("ck"))
        .plugin_file(sink)
        .args([
            "--output-topic",
            "out",
            "--on-error",
            "skip",
            "--until-caught-up",
            "--progress",
            "json",
        ])
        .build();
    let out = host_run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let bad = (0..n).filter(|i| i % 37 == 5).count();
    let produced: u64 = json_lines(&out)
        .iter()
        .map(|e| e["counts"]["produced"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(produced as usize, n - bad, "{}", stderr(&out));
    let mut seen: BTreeMap<usize, usize> = BTreeMap::new();
    for p in 0..2 {
        let v = committed_view(&broker.bootstrap(), "out", p);
        assert_eq!((v.open, v.aborted), (0, 0), "out/{p}");
        for r in &v.visible {
            let i = input_of(r);
            assert_eq!(r.value.as_deref(), Some(format!("v{i}").as_bytes()));
            assert_eq!(r.key.as_deref(), Some(format!("k{i}").as_bytes()));
            *seen.entry(i).or_default() += 1;
        }
    }
    let wrong: Vec<(usize, usize)> = (0..n)
        .filter(|i| i % 37 != 5)
        .map(|i| (i, seen.get(&i).copied().unwrap_or(0)))
        .filter(|(_, c)| *c != 1)
        .collect();
    assert!(
        wrong.is_empty(),
        "inputs not visible exactly once: {wrong:?}"
    );
}

#[test]
fn what_a_failed_attempt_sent_is_dropped_and_a_refusal_fails_the_range() {
    let broker = BrokerProcess::start();
    a_sender_produces_each_good_input_once(&broker, &crate::support::plugin("sender"));

    // A sink that ignores the host's refusal (a topic not named) still
    // fails its range: nothing is committed past it.
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let out = host_run(
        &RunArgs::new(&broker.bootstrap(), &["in"], &ckpt)
            .plugin("sender")
            .args([
                "--config",
                "topic=elsewhere",
                "--config",
                "ignore=true",
                "--output-topic",
                "out",
                "--on-error",
                "skip",
                "--until-caught-up",
            ])
            .build(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("called kafka.send, which the host refused")
            && err.contains("topic \"elsewhere\" is not one this pipeline produces to (out)"),
        "{err}"
    );
    let shown = crate::support::host(&["checkpoint", "show", "--json", ckpt.to_str().unwrap()]);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert!(
        shown["last_committed"].is_null(),
        "nothing committed: {shown}"
    );
    // The fix troubleshooting.md gives: create the topic and name it too.
    // The batch planned with `out` alone runs again with both.
    broker.create_topic("elsewhere", 1);
    let out = host_run(
        &RunArgs::new(&broker.bootstrap(), &["in"], &ckpt)
            .plugin("sender")
            .args([
                "--config",
                "topic=elsewhere",
                "--output-topic",
                "out,elsewhere",
                "--on-error",
                "skip",
                "--until-caught-up",
            ])
            .build(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn host_test_shows_what_a_sink_would_send_and_where() {
    let input = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        input.path(),
        concat!(
            r#"{"key":"k1","value":"{\"table\":\"orders\",\"id\":1}","headers":[{"key":"h","value":"1"}]}"#,
            "\n",
            r#"{"key":"k2","value":"{\"table\":\"users\"}"}"#,
            "\n",
            r#"{"value":"{\"table\":\"orders\"}"}"#,
            "\n",
        ),
    )
    .unwrap();
    let router = crate::support::plugin("router");
    let test = |more: &[&str]| {
        let mut args = vec![
            "test",
            "--plugin",
            router.to_str().unwrap(),
            "--format",
            "records",
            "--input",
            input.path().to_str().unwrap(),
            "--config",
            "route.prefix=cdc.",
        ];
        args.extend(more);
        crate::support::host(&args)
    };
    let out = test(&[
        "--output-topic",
        "cdc.orders,cdc.users",
        "--output-partitions",
        "3",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let sends: Vec<serde_json::Value> = json_lines(&out)
        .into_iter()
        .filter(|l| l["type"] == "send")
        .collect();
    assert_eq!(sends.len(), 3, "{sends:?}");
    let to: Vec<(String, serde_json::Value)> = sends
        .iter()
        .map(|s| {
            let t = &s["produced_to"];
            (
                t["topic"].as_str().unwrap().to_string(),
                t["partition"].clone(),
            )
        })
        .collect();
    // The partitions are Kafka's murmur2 of the key modulo 3, as
    // `partition_of_key` (checked against Kafka's own values) gives them.
    let by_key = |k: &[u8]| sluice_host::output::partition_of_key(Some(k), 3).unwrap();
    assert_eq!(
        to,
        [
            ("cdc.orders".to_string(), serde_json::json!(by_key(b"k1"))),
            ("cdc.users".to_string(), serde_json::json!(by_key(b"k2"))),
            ("cdc.orders".to_string(), serde_json::Value::Null),
        ]
    );
    assert_eq!(sends[0]["idempotency_key"], "test/0/0");
    assert_eq!(
        sends[0]["headers"],
        serde_json::json!([{"key": "h", "value": "1"}])
    );
    assert_eq!(sends[0]["key"], "k1");
    // Without the users topic the host refuses the send, and says so.
    let out = test(&["--output-topic", "cdc.orders", "--output-partitions", "3"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out)
            .contains("topic \"cdc.users\" is not one this pipeline produces to (cdc.orders)"),
        "{}",
        stderr(&out)
    );
}
