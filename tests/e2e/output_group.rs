//! Kafka output in a pipeline group (`host run --group --output-topic`).
//!
//! Exactly once: each part of an input partition commits its outputs
//! and the partition's position in a transaction of the partition's own
//! producer (`sluice-<group>:<topic>:<partition>`), then its progress row
//! in the sink database; the next member to claim the partition fences
//! that producer and records a part whose transaction committed but whose
//! row did not. On Apache Kafka, read through [`crate::txn_view`].
//!
//! At-least-once (librdkafka's mock cluster): a group swap keeps a
//! sending sink's topics.

use std::time::{Duration, Instant};

use crate::output_txn::{assert_each_input_once, broker_with_input, views};
use crate::support::kafka::{Broker, BrokerProcess};
use crate::support::{Db, HostProcess};

/// `host run` of the passthrough map into `out` as a member of group
/// `eo`, 100 records per partition per batch.
pub(crate) fn member_args(broker: &BrokerProcess, db: &Db) -> Vec<String> {
    [
        "run",
        "--brokers",
        &broker.bootstrap(),
        "--topic",
        "in",
        "--group",
        "eo",
        "--sink-db",
        &db.url,
        "--plugin",
        crate::support::plugin("passthrough").to_str().unwrap(),
        "--output-topic",
        "out",
        "--max-records-per-partition",
        "100",
        "--trigger-interval",
        "100ms",
        "--config",
        "kafka.session.timeout.ms=6000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Wait until `n` outputs are visible to `read_committed` readers of
/// `out`, or fail showing `member`'s log.
fn wait_visible(broker: &BrokerProcess, n: usize, member: &HostProcess) {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let seen: usize = views(broker).iter().map(|v| v.visible.len()).sum();
        if seen >= n {
            return;
        }
        assert!(
            Instant::now() < until,
            "{seen} of {n} outputs visible\n{}",
            member.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A member killed at `failpoint` (inside a part's transaction, or
/// between its commit and the part's database commit); a second member
/// takes its partitions: each input visible exactly once.
fn killed_member_at(failpoint: &str) -> String {
    let broker = broker_with_input();
    let db = Db::sqlite();
    let args = member_args(&broker, &db);
    let mut a = HostProcess::spawn(&args, &[("SLUICE_FAILPOINT", failpoint)]);
    a.wait_for("FAILPOINT", Duration::from_secs(90));
    a.kill();
    let mut b = HostProcess::start(&args);
    wait_visible(&broker, 600, &b);
    // A moment more: nothing further may become visible.
    std::thread::sleep(Duration::from_secs(2));
    let v = views(&broker);
    assert_each_input_once(&v);
    assert_eq!(b.term(), Some(0), "{}", b.log());
    assert_eq!(
        db.scalar(
            "SELECT CAST(SUM(end_offset) AS BIGINT) FROM sluice_progress WHERE query_id = 'eo'"
        ),
        600,
        "{}",
        b.log()
    );
    b.log()
}

#[test]
fn a_member_killed_after_a_parts_transaction_committed_is_not_produced_again() {
    // The part's outputs and position committed in Kafka; its progress row
    // did not. The next member's claim must record the part applied.
    let log = killed_member_at("sink:before-db-commit@2");
    assert!(
        log.contains("recorded applied now, not produced again"),
        "{log}"
    );
}

#[test]
fn a_member_killed_inside_a_parts_transaction_is_aborted_and_run_again() {
    // The part's transaction is open when the member dies: the next
    // member's init_transactions of the partition's id aborts it.
    let log = killed_member_at("output:before-commit-transaction@2");
    assert!(!log.contains("recorded applied now"), "{log}");
}

#[test]
fn exactly_once_in_a_group_refuses_a_sink_stage_and_dead_letters() {
    let broker = BrokerProcess::start();
    broker.create_topic("in", 1);
    broker.create_topic("out", 1);
    let db = Db::sqlite();
    let mut args = member_args(&broker, &db);
    args.extend(["--on-error".to_string(), "dlq".to_string()]);
    let out = crate::support::host(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(out.status.code(), Some(2));
    let err = crate::support::stderr(&out);
    assert!(err.contains("--on-error dlq in a pipeline group"), "{err}");
    let mut args = member_args(&broker, &db);
    args.extend([
        "--plugin".to_string(),
        crate::support::plugin("router")
            .to_str()
            .unwrap()
            .to_string(),
    ]);
    let out = crate::support::host(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        crate::support::stderr(&out)
    );
    let err = crate::support::stderr(&out);
    assert!(
        err.contains("exactly once in a group is for map-only pipelines"),
        "{err}"
    );
}

#[test]
fn a_frozen_member_past_its_session_commits_nothing_its_successor_runs() {
    // Member b stops (SIGSTOP) inside a part's Kafka transaction (its
    // outputs and the position sent, the commit not), holding the part's
    // database transaction. Its session ends; a takes the partitions once
    // PostgreSQL ends b's idle session, and a's claim of each partition's
    // transactional id aborts b's open transaction. b, resumed, must make
    // nothing visible: the brokers refuse its commit (fenced), and it
    // says so.
    let broker = broker_with_input();
    let db = Db::postgres();
    let args = member_args(&broker, &db);
    let dir = tempfile::tempdir().unwrap();
    let resume = dir.path().join("resume");
    let resume_s = resume.display().to_string();
    let mut b = HostProcess::spawn(
        &args,
        &[
            ("SLUICE_FAILPOINT", "output:before-commit-transaction@2"),
            ("SLUICE_FAILPOINT_RESUME_FILE", &resume_s),
        ],
    );
    b.wait_for("FAILPOINT", Duration::from_secs(90));
    b.signal("STOP");
    std::fs::write(&resume, b"").unwrap();
    let mut a = HostProcess::start(&args);
    let until = Instant::now() + Duration::from_secs(240);
    loop {
        let seen: usize = views(&broker).iter().map(|v| v.visible.len()).sum();
        if seen >= 600 {
            break;
        }
        assert!(
            Instant::now() < until,
            "{seen} of 600 visible\n--- a\n{}\n--- b\n{}",
            a.log(),
            b.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    b.signal("CONT");
    let fenced = b.logged(
        "initialized the transactional id since",
        Duration::from_secs(30),
    );
    assert!(fenced.is_some(), "b was not fenced:\n{}", b.log());
    assert_each_input_once(&views(&broker));
    let log_a = a.log();
    assert_eq!(a.term(), Some(0), "{log_a}\n--- b\n{}", b.log());
    b.kill();
    assert_eq!(
        db.scalar(
            "SELECT CAST(SUM(end_offset) AS BIGINT) FROM sluice_progress WHERE query_id = 'eo'"
        ),
        600,
        "{log_a}\n--- b\n{}",
        b.log()
    );
}

#[test]
fn a_group_reset_back_is_refused_at_the_claim_unless_reprocessing_on_purpose() {
    // The group applied everything; `host group reset --reapply` moves
    // its rows back to the start while the output transactions' positions
    // stay at the ends. A member then refuses each partition (the outputs
    // would be visible twice); started with --output-reprocess it produces
    // them all again, on purpose, and moves the positions back with it.
    let broker = broker_with_input();
    let db = Db::sqlite();
    let args = member_args(&broker, &db);
    let mut a = HostProcess::start(&args);
    wait_visible(&broker, 600, &a);
    assert_eq!(a.term(), Some(0), "{}", a.log());
    let out = crate::support::host(&[
        "group",
        "reset",
        "--sink-db",
        &db.url,
        "--group",
        "eo",
        "--to",
        "earliest",
        "--brokers",
        &broker.bootstrap(),
        "--reapply",
    ]);
    assert!(out.status.success(), "{}", crate::support::stderr(&out));
    let mut refused = HostProcess::start(&args);
    let code = refused.wait();
    let log = refused.log();
    assert_ne!(code, Some(0), "{log}");
    assert!(
        log.contains("output transactions committed in/") && log.contains("--output-reprocess"),
        "{log}"
    );
    let seen: usize = views(&broker).iter().map(|v| v.visible.len()).sum();
    assert_eq!(seen, 600, "the refused member produced something");

    let mut again = args.clone();
    again.push("--output-reprocess".into());
    let mut b = HostProcess::start(&again);
    wait_visible(&broker, 1200, &b);
    std::thread::sleep(Duration::from_secs(2));
    let log = b.log();
    assert_eq!(b.term(), Some(0), "{log}");
    assert!(
        log.contains("--output-reprocess: the output transactions committed"),
        "{log}"
    );
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for v in views(&broker) {
        assert_eq!(v.open, 0);
        for r in &v.visible {
            let h = r
                .headers
                .iter()
                .find(|(k, _)| k.as_str() == "h")
                .and_then(|(_, v)| v.clone());
            *seen
                .entry(String::from_utf8_lossy(&h.unwrap_or_default()).into_owned())
                .or_default() += 1;
        }
    }
    assert_eq!(seen.len(), 600);
    assert!(seen.values().all(|n| *n == 2), "{seen:?}");
}

/// The inputs `i` (header `h`) found in `out`'s partitions, with how often.
fn read_out(
    broker: &dyn crate::support::kafka::Broker,
    partitions: i32,
) -> std::collections::BTreeMap<usize, usize> {
    let mut seen = std::collections::BTreeMap::new();
    for p in 0..partitions {
        for r in crate::txn_view::raw_records(&broker.bootstrap(), "out", p) {
            *seen.entry(crate::output_send::input_of(&r)).or_default() += 1;
        }
    }
    seen
}

/// Wait until every input below `n` is in `out`.
fn wait_for_out(broker: &dyn crate::support::kafka::Broker, n: usize, members: &[&HostProcess]) {
    let until = std::time::Instant::now() + Duration::from_secs(60);
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
    use crate::support::kafka::Mock;
    let db = crate::support::Db::sqlite();
    let mock = Mock::new();
    mock.create_topic("events", 4);
    mock.create_topic("out", 2);
    let produce = |range: std::ops::Range<usize>| {
        let p = crate::support::kafka::producer(&mock.bootstrap());
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
            format!(
                "{}{}",
                crate::support::stderr(&out),
                String::from_utf8_lossy(&out.stdout)
            ),
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

#[test]
fn a_member_producing_elsewhere_than_the_live_members_is_refused() {
    // Member a produces to `out`; b, started with another topic (or
    // none), would split the group's records between them: refused before
    // it joins, naming both.
    let broker = broker_with_input();
    broker.create_topic("out2", 1);
    let db = Db::sqlite();
    let args = member_args(&broker, &db);
    let mut a = HostProcess::start(&args);
    wait_visible(&broker, 600, &a);
    // Its heartbeat (every 5 s) records where it produces.
    std::thread::sleep(Duration::from_secs(6));
    let mut other = args.clone();
    let at = other.iter().position(|x| x == "out").unwrap();
    other[at] = "out2".into();
    let refused = |args: &[String]| {
        let out = crate::support::host(&args.iter().map(String::as_str).collect::<Vec<_>>());
        (out.status.code(), crate::support::stderr(&out))
    };
    let (code, err) = refused(&other);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("produces to out on") && err.contains("would produce to out2 on"),
        "{err}"
    );
    let mut none = args.clone();
    none.drain(at - 1..=at);
    let (code, err) = refused(&none);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no topic (no --output-topic)"), "{err}");
    assert_eq!(a.term(), Some(0), "{}", a.log());
}

#[test]
fn a_group_swap_under_exactly_once_changes_the_outputs_at_a_batch_boundary_once() {
    // The member maps with tag-v1 (values `v1:…`); `host group swap`
    // installs tag-v2 at a batch boundary while inputs keep coming. Each
    // input is visible once, tagged by the one plugin that ran its batch.
    let broker = broker_with_input();
    let db = Db::sqlite();
    let mut args = member_args(&broker, &db);
    let at = args
        .iter()
        .position(|x| x.ends_with("passthrough.wasm"))
        .unwrap();
    args[at] = crate::support::plugin("tag_v1").display().to_string();
    let mut a = HostProcess::start(&args);
    wait_visible(&broker, 600, &a);
    let out = crate::support::host(&[
        "group",
        "swap",
        "--sink-db",
        &db.url,
        "--group",
        "eo",
        "--plugin",
        crate::support::plugin("tag_v2").to_str().unwrap(),
        "--stage",
        "map",
    ]);
    assert!(out.status.success(), "{}", crate::support::stderr(&out));
    crate::output::send_inputs(&broker, 600..1200);
    wait_visible(&broker, 1200, &a);
    std::thread::sleep(Duration::from_secs(2));
    let log = a.log();
    assert_eq!(a.term(), Some(0), "{log}");
    assert!(log.contains("group swap 1 installed"), "{log}");
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut total = 0;
    for v in views(&broker) {
        assert_eq!(v.open, 0);
        for r in &v.visible {
            total += 1;
            let value =
                String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
            *seen.entry(value).or_default() += 1;
        }
    }
    assert_eq!(total, 1200, "{log}");
    for i in (0..1200).filter(|i| i % 50 != 49) {
        let n1 = seen.get(&format!("v1:v{i}")).copied().unwrap_or(0);
        let n2 = seen.get(&format!("v2:v{i}")).copied().unwrap_or(0);
        assert_eq!(n1 + n2, 1, "input {i}: v1 {n1}, v2 {n2}");
        if i < 600 {
            assert_eq!(n1, 1, "input {i} came before the swap");
        }
    }
    assert!(
        seen.keys().any(|k| k.starts_with("v2:v")),
        "tag-v2 never ran: {log}"
    );
}
