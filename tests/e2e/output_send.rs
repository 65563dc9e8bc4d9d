//! A sink stage producing to Kafka topics (the `kafka` capability,
//! `kafka.send`, contract 0.2.4) with the `router` plugin: each JSON
//! event goes to `cdc.<table>`, tombstones to `other`.
//!
//! Exactly once runs on nisshi 0.7.0 (transactions); what a
//! `read_committed` consumer sees is computed from the raw record batches
//! ([`crate::txn_view`]). At-least-once with a sink database runs on
//! nisshi 0.8.1 and reads the topics with an ordinary consumer.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use kafka_protocol::records::Record;

use crate::kafka::{Broker, BrokerProcess, producer};
use crate::output::host_run;
use crate::support::{HostProcess, RunArgs, json_lines, stderr};
use crate::txn_view::committed_view;

const WAIT: Duration = Duration::from_secs(60);
/// Inputs: 3 partitions, 100 records each per batch (2 batches).
const N: usize = 600;

/// Where input `i` goes: its table's topic, `other` for a tombstone,
/// nowhere for a record that is not JSON (a bad record, skipped).
fn route(i: usize) -> Option<&'static str> {
    match i {
        _ if i % 97 == 13 => None,
        _ if i % 50 == 49 => Some("other"),
        _ if i.is_multiple_of(3) => Some("cdc.users"),
        _ => Some("cdc.orders"),
    }
}

/// Topics `in` (3 partitions), `cdc.orders` (2), `cdc.users` (1),
/// `other` (1); `n` inputs: JSON events with a table, header `h` naming
/// the input, every 50th a tombstone and a few not JSON.
fn fill(broker: &BrokerProcess, n: usize) {
    broker.create_topic("in", 3);
    broker.create_topic("cdc.orders", 2);
    broker.create_topic("cdc.users", 1);
    broker.create_topic("other", 1);
    let p = producer(&broker.bootstrap());
    for i in 0..n {
        let value = match route(i) {
            None => "not json".to_string(),
            Some("cdc.users") => format!(r#"{{"database":"shop","table":"users","i":{i}}}"#),
            Some(_) => format!(r#"{{"database":"shop","table":"orders","i":{i}}}"#),
        };
        let header = i.to_string();
        p.send(
            "in",
            (i % 3) as i32,
            Some(format!("k{}", i % 7).as_bytes()),
            (i % 50 != 49).then_some(value.as_bytes()),
            &[("h", Some(header.as_bytes()))],
        );
    }
    p.flush();
}

fn router_args(broker: &BrokerProcess, ckpt: &Path) -> RunArgs {
    RunArgs::new(&broker.bootstrap(), &["in"], ckpt)
        .plugin("router")
        .args([
            "--config",
            "route.prefix=cdc.",
            "--config",
            "route.topic=other",
            "--output-topic",
            "cdc.orders,cdc.users",
            "--output-topic",
            "other",
            "--on-error",
            "skip",
            "--until-caught-up",
            "--progress",
            "json",
            "--max-records-per-partition",
            "100",
        ])
}

/// The input named by a record's header `h`.
fn input_of(r: &Record) -> usize {
    let h = r
        .headers
        .iter()
        .find(|(k, _)| k.as_str() == "h")
        .and_then(|(_, v)| v.as_ref())
        .unwrap_or_else(|| panic!("no header h in {r:?}"));
    String::from_utf8_lossy(h).parse().unwrap()
}

/// Check that `r`, read from `topic`, is its input's record, and add it
/// to `seen` with the idempotency-key header it carries.
fn note(seen: &mut Seen, topic: &'static str, r: &Record) {
    let i = input_of(r);
    check_record(i, topic, r.key.as_deref(), r.value.as_deref());
    let key = r
        .headers
        .iter()
        .find(|(k, _)| k.as_str() == "sluice-idempotency-key")
        .and_then(|(_, v)| v.as_ref())
        .map(|v| String::from_utf8_lossy(v).into_owned());
    seen.entry(topic)
        .or_default()
        .entry(i)
        .or_default()
        .push(key);
}

/// Per topic, the inputs seen and how often, with the idempotency-key
/// header each carried.
type Seen = BTreeMap<&'static str, BTreeMap<usize, Vec<Option<String>>>>;

const TOPICS: [(&str, i32); 3] = [("cdc.orders", 2), ("cdc.users", 1), ("other", 1)];

/// What a `read_committed` consumer sees of the three topics; no
/// transaction may be left open.
fn committed(broker: &BrokerProcess) -> Seen {
    let mut seen = Seen::new();
    for (topic, partitions) in TOPICS {
        for p in 0..partitions {
            let v = committed_view(&broker.bootstrap(), topic, p);
            assert_eq!(v.open, 0, "{topic}/{p}: a transaction left open");
            for r in &v.visible {
                note(&mut seen, topic, r);
            }
        }
    }
    seen
}

/// Input `i` arrived in `topic` with its own key and value.
fn check_record(i: usize, topic: &str, key: Option<&[u8]>, value: Option<&[u8]>) {
    assert_eq!(route(i), Some(topic), "input {i} in {topic}");
    assert_eq!(key, Some(format!("k{}", i % 7).as_bytes()), "input {i}");
    match value {
        None => assert_eq!(i % 50, 49, "input {i} is no tombstone"),
        Some(v) => assert!(
            String::from_utf8_lossy(v).contains(&format!(r#""i":{i}}}"#)),
            "input {i}: {}",
            String::from_utf8_lossy(v)
        ),
    }
}

/// Every routable input in its topic: once (`at_most` 1), or at least
/// once with every copy carrying the input's idempotency key.
fn assert_each_routed(seen: &Seen, at_most: usize) {
    for i in (0..N).filter(|&i| route(i).is_some()) {
        let topic = route(i).unwrap();
        let copies = seen
            .get(topic)
            .and_then(|t| t.get(&i))
            .unwrap_or_else(|| panic!("input {i} never reached {topic}"));
        assert!(
            copies.len() <= at_most,
            "input {i} seen {} times in {topic}",
            copies.len()
        );
        let want = format!("in/{}/{}", i % 3, i / 3);
        for k in copies {
            match at_most {
                1 => assert_eq!(k, &None, "exactly once adds no idempotency key: input {i}"),
                _ => assert_eq!(k.as_deref(), Some(want.as_str()), "input {i}"),
            }
        }
    }
    let skipped: Vec<usize> = seen
        .values()
        .flat_map(|t| t.keys().copied())
        .filter(|&i| route(i).is_none())
        .collect();
    assert!(skipped.is_empty(), "bad records produced: {skipped:?}");
}

#[test]
fn a_sink_routes_each_record_to_its_topic_exactly_once_across_kills() {
    let broker = BrokerProcess::transactional();
    fill(&broker, N);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let args = router_args(&broker, &ckpt).build();
    // Killed inside batch 1's transaction: its records were sent, the
    // positions added, nothing committed; the restart aborts and re-runs.
    let mut paused = HostProcess::spawn(
        &args,
        &[("SLUICE_FAILPOINT", "output:before-commit-transaction@2")],
    );
    paused.wait_for("FAILPOINT", WAIT);
    paused.kill();
    let out = host_run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let events = json_lines(&out);
    assert_eq!(events[0]["batch_id"], 1, "{events:?}");
    assert_eq!(events[0]["rerun"], true, "{events:?}");
    let bad = (300..N).filter(|&i| route(i).is_none()).count() as u64;
    assert_eq!(events[0]["counts"]["skipped"], bad, "{events:?}");
    assert_eq!(
        events[0]["counts"]["produced"],
        300 - bad,
        "each routable input of the batch sent once, the failed attempts' sends dropped: {events:?}"
    );
    let seen = committed(&broker);
    assert_each_routed(&seen, 1);
}

#[test]
fn a_sink_sending_with_a_sink_database_is_at_least_once_with_equal_keys() {
    let broker = BrokerProcess::start();
    fill(&broker, N);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let db = dir.path().join("sink.db");
    let sink_db = format!("sqlite:{}", db.display());
    // Exactly once cannot cover a database as well: refused, naming the
    // flag to pass.
    let refused = host_run(
        &router_args(&broker, &ckpt)
            .args(["--sink-db", &sink_db])
            .build(),
    );
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("--output-guarantee at-least-once"),
        "{}",
        stderr(&refused)
    );
    // Killed after batch 1's first part was produced, before its progress
    // row committed: the restart writes the part (and sends) again.
    let args = router_args(&broker, &ckpt)
        .args(["--sink-db", &sink_db, "--output-guarantee", "at-least-once"])
        .build();
    let mut paused = HostProcess::spawn(&args, &[("SLUICE_FAILPOINT", "sink:before-db-commit@4")]);
    paused.wait_for("FAILPOINT", WAIT);
    paused.kill();
    let out = host_run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let seen = read_all(&broker);
    assert_each_routed(&seen, 2);
    let twice = seen
        .values()
        .flat_map(|t| t.values())
        .filter(|c| c.len() > 1)
        .count();
    assert!(
        twice > 0,
        "the part killed before its commit was sent twice"
    );
    // A third run finds everything applied and sends nothing.
    let out = host_run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(read_all(&broker), seen);
}

/// Every record of the three topics, read_uncommitted (no transactions
/// under at-least-once).
fn read_all(broker: &BrokerProcess) -> Seen {
    let mut seen = Seen::new();
    for (topic, partitions) in TOPICS {
        for p in 0..partitions {
            for r in &crate::txn_view::raw_records(&broker.bootstrap(), topic, p) {
                note(&mut seen, topic, r);
            }
        }
    }
    seen
}

#[test]
fn output_topics_are_refused_where_they_cannot_be_used() {
    let broker = BrokerProcess::start();
    fill(&broker, 30);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = |n: &str| dir.path().join(n);
    let base = |name: &str| {
        RunArgs::new(&broker.bootstrap(), &["in"], &ckpt(name)).args([
            "--until-caught-up",
            "--output-guarantee",
            "at-least-once",
        ])
    };
    // A map-only pipeline writes one topic.
    let out = host_run(
        &base("a")
            .plugin("passthrough")
            .args(["--output-topic", "cdc.orders,other"])
            .build(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("writes its outputs to one"),
        "{}",
        stderr(&out)
    );
    // A topic the pipeline does not name: the range fails, nothing is
    // committed past it.
    let out = host_run(
        &base("c")
            .plugin("router")
            .args(["--config", "route.topic=other", "--output-topic", "other"])
            .build(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("is not one this pipeline produces to (other): name it with --output-topic"),
        "{err}"
    );
    let shown =
        crate::support::host(&["checkpoint", "show", "--json", ckpt("c").to_str().unwrap()]);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert!(
        shown["last_committed"].is_null(),
        "nothing committed: {shown}"
    );
}

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
    let broker = BrokerProcess::transactional();
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

/// The inputs `i` (header `h`) found in `out`'s partitions, with how often.
fn read_out(broker: &dyn crate::kafka::Broker, partitions: i32) -> BTreeMap<usize, usize> {
    let mut seen = BTreeMap::new();
    for p in 0..partitions {
        for r in crate::txn_view::raw_records(&broker.bootstrap(), "out", p) {
            *seen.entry(input_of(&r)).or_default() += 1;
        }
    }
    seen
}

/// Wait until every input below `n` is in `out`.
fn wait_for_out(broker: &dyn crate::kafka::Broker, n: usize, members: &[&HostProcess]) {
    let until = std::time::Instant::now() + WAIT;
    loop {
        let seen = read_out(broker, 2);
        if (0..n).all(|i| seen.contains_key(&i)) {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "{} of {n} inputs in out: {}",
            seen.len(),
            members
                .iter()
                .map(|m| m.log())
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_group_swap_keeps_the_sinks_topics_and_refuses_a_sink_that_cannot_send() {
    use crate::kafka::Mock;
    let db = crate::support::Db::sqlite();
    let mock = Mock::new();
    mock.create_topic("events", 4);
    mock.create_topic("out", 2);
    let produce = |range: std::ops::Range<usize>| {
        let p = producer(&mock.bootstrap());
        for i in range {
            let value = format!(r#"{{"table":"out","i":{i}}}"#);
            let h = i.to_string();
            p.send(
                "events",
                (i % 4) as i32,
                Some(format!("k{i}").as_bytes()),
                Some(value.as_bytes()),
                &[("h", Some(h.as_bytes()))],
            );
        }
        p.flush();
    };
    let args: Vec<String> = [
        "run",
        "--brokers",
        &mock.bootstrap(),
        "--topic",
        "events",
        "--group",
        "gs",
        "--sink-db",
        &db.url,
        "--trigger-interval",
        "100ms",
        "--config",
        "kafka.session.timeout.ms=6000",
        "--output-topic",
        "out",
        "--output-guarantee",
        "at-least-once",
        "--plugin",
        crate::support::plugin("sender").to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut a = HostProcess::start(&args);
    produce(0..40);
    wait_for_out(&mock, 40, &[&a]);
    let group = |more: &[&str]| {
        let mut v = vec!["group", "swap", "--sink-db", &db.url, "--group", "gs"];
        v.extend(more);
        let out = crate::support::host(&v);
        (
            out.status.code(),
            format!("{}{}", stderr(&out), String::from_utf8_lossy(&out.stdout)),
        )
    };
    // The router sends each event to its table's topic (`out` here): the
    // swapped-in sink must have the topics too.
    let router = crate::support::plugin("router");
    let (code, out) = group(&["--plugin", router.to_str().unwrap(), "--stage", "sink"]);
    assert_eq!(code, Some(0), "{out}\n{}", a.log());
    produce(40..80);
    wait_for_out(&mock, 80, &[&a]);
    // A sink built before the kafka capability is not installed: the
    // member keeps the router and goes on sending.
    let old = crate::support::plugin("old_contract");
    let (code, out) = group(&["--plugin", old.to_str().unwrap(), "--stage", "sink"]);
    assert_ne!(code, Some(0), "{out}");
    assert!(
        out.contains("cannot send records to the output topics out"),
        "{out}\n{}",
        a.log()
    );
    produce(80..120);
    wait_for_out(&mock, 120, &[&a]);
    assert_eq!(a.term(), Some(0), "{}", a.log());
    assert!(a.log().contains("group swap 1 installed"), "{}", a.log());
}
