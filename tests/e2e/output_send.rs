//! A sink stage producing to Kafka topics (the `kafka` capability,
//! `kafka.send`, contract 0.2.4) with the `router` plugin: each JSON
//! event goes to `cdc.<table>`, tombstones to `other`.
//!
//! On Apache Kafka. Exactly once: what a `read_committed` consumer sees
//! ([`crate::txn_view`]). At-least-once with a sink database: the topics
//! read with an ordinary consumer.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use kafka_protocol::records::Record;

use crate::output::host_run;
use crate::support::kafka::{Broker, BrokerProcess, producer};
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
pub(crate) fn input_of(r: &Record) -> usize {
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
    let broker = BrokerProcess::start();
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
