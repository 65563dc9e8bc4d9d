//! Partitions added to a running topic, what users do to scale a topic:
//! a single host and a group of two members read each new partition from
//! its log start, each record once (the non-idempotent `sql-counter` sink
//! counts), also under `--starting-offsets latest`: every record of a
//! partition that appeared after the pipeline began was produced after it
//! began, so none of them may be skipped.
//!
//! The partitions are added as operators add them, through Kafka's admin
//! API (CreatePartitions, [`BrokerProcess::create_partitions`]).

use std::time::{Duration, Instant};

use crate::support::counter::{produce_keyed, wait_for_count};
use crate::support::kafka::{Broker, BrokerProcess};
use crate::support::{Db, HostProcess, RunArgs, plugin};

const WAIT: Duration = Duration::from_secs(90);

/// Send values `{tag}{i}` (keys `k{i}`) for `i` in `range` to `partition`.
fn produce(b: &dyn Broker, topic: &str, partition: i32, tag: &str, range: std::ops::Range<usize>) {
    produce_keyed(b, topic, range, |_| partition, |i| format!("{tag}{i}"));
}

/// Each of `values` was applied exactly once, and nothing else was.
fn assert_applied_once(db: &Db, mut values: Vec<String>) {
    values.sort();
    assert_eq!(db.sorted_texts("SELECT value FROM seen"), values);
    assert_eq!(db.counted(), values.len() as i64, "the counter");
    assert_eq!(
        db.scalar("SELECT count(DISTINCT idempotency_key) FROM seen"),
        values.len() as i64
    );
}

fn values(tag: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{tag}{i}")).collect()
}

/// A single host started with `--starting-offsets latest` on a topic of
/// one partition: what was there before it started is skipped (latest);
/// two partitions added while it runs are read from offset 0 within a
/// planning round, each record once.
#[test]
fn a_single_host_reads_partitions_added_while_it_runs_from_their_log_start() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("grow", 1);
    produce(&kafka, "grow", 0, "before", 0..10);
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite();
    let args = RunArgs::new(&kafka.bootstrap(), &["grow"], &dir.path().join("ckpt"))
        .sink_db(&db)
        .plugin("passthrough")
        .plugin("sql_counter")
        .args([
            "--starting-offsets",
            "latest",
            "--trigger-interval",
            "100ms",
        ])
        .build();
    let mut host = HostProcess::start(&args);
    host.wait_for("batch committed", WAIT);
    produce(&kafka, "grow", 0, "p0-", 0..5);
    wait_for_count(&db, 5, "partition 0 after the start", WAIT, &[&host]);

    kafka.create_partitions("grow", 3);
    produce(&kafka, "grow", 1, "p1-", 0..7);
    produce(&kafka, "grow", 2, "p2-", 0..4);
    wait_for_count(&db, 16, "the added partitions", WAIT, &[&host]);
    produce(&kafka, "grow", 2, "p2-", 4..6);
    wait_for_count(&db, 18, "more in an added partition", WAIT, &[&host]);
    assert_eq!(host.term(), Some(0), "{}", host.log());
    let log = host.log();
    for p in [1, 2] {
        assert!(
            log.contains(&format!(
                "a partition added since the pipeline began: reading from its log start offset 0 topic=\"grow\" partition={p}"
            )),
            "{log}"
        );
    }
    let mut want = values("p0-", 0..5);
    want.extend(values("p1-", 0..7));
    want.extend(values("p2-", 0..6));
    assert_applied_once(&db, want);
    assert_eq!(
        db.scalar("SELECT count(*) FROM seen WHERE idempotency_key = 'grow/1/0'"),
        1,
        "partition 1 from offset 0"
    );
}

/// `host run --group GROUP` of the counting sink over `grow`, with
/// `--starting-offsets latest` and a metadata refresh of 1 s.
fn member(kafka: &BrokerProcess, db: &Db, group: &str) -> HostProcess {
    HostProcess::start(
        &[
            "run",
            "--brokers",
            &kafka.bootstrap(),
            "--topic",
            "grow",
            "--group",
            group,
            "--sink-db",
            &db.url,
            "--trigger-interval",
            "100ms",
            "--starting-offsets",
            "latest",
            "--config",
            "kafka.session.timeout.ms=6000",
            "--config",
            "kafka.heartbeat.interval.ms=500",
            "--config",
            "kafka.topic.metadata.refresh.interval.ms=1000",
            "--plugin",
            &plugin("sql_counter").display().to_string(),
        ]
        .map(String::from),
    )
}

/// Three members of a new group started together with `--starting-offsets
/// latest` on a topic of two partitions: one of them holds nothing. The
/// partition added while they run goes to it, and it must read it from
/// offset 0 although it never committed a batch (the pipeline began
/// before the partition existed).
///
/// Fails on Apache Kafka (2 runs in 3 here): the member's first plan
/// comes after the partition was added, so it counts the partition among
/// those the pipeline met as it began and starts it at `latest`, skipping
/// the records produced into it. Open issue "What a new user met this
/// week", item 13 (`latest` in a group); this test is its test.
#[test]
#[ignore = "`latest` in a group skips an added partition's records when a member's first plan comes after it (open issue, item 13)"]
fn a_member_that_began_with_nothing_reads_an_added_partition_from_its_log_start() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("grow", 2);
    produce(&kafka, "grow", 0, "before", 0..10);
    let db = Db::sqlite();
    let mut members: Vec<HostProcess> = (0..3).map(|_| member(&kafka, &db, "g3")).collect();
    for m in &mut members {
        m.wait_for("joined the pipeline group", WAIT);
    }
    // Both partitions claimed and planned (`latest` is the high watermark
    // at a partition's first plan): their holders have committed a batch.
    let started_at = |ms: &[HostProcess]| {
        ms.iter()
            .filter(|m| {
                let log = m.log();
                log.contains("claimed;") && log.contains("batch committed")
            })
            .map(|m| m.log().matches("claimed;").count())
            .sum::<usize>()
    };
    let started = Instant::now();
    while started_at(&members) < 2 {
        assert!(started.elapsed() < WAIT, "no assignment");
        std::thread::sleep(Duration::from_millis(100));
    }
    let refs: Vec<&HostProcess> = members.iter().collect();
    produce(&kafka, "grow", 0, "p0-", 0..3);
    produce(&kafka, "grow", 1, "p1-", 0..3);
    wait_for_count(&db, 6, "the first two partitions", WAIT, &refs);

    kafka.create_partitions("grow", 3);
    produce(&kafka, "grow", 2, "p2-", 0..5);
    wait_for_count(&db, 11, "the added partition", WAIT, &refs);
    produce(&kafka, "grow", 2, "p2-", 5..7);
    wait_for_count(&db, 13, "more in the added partition", WAIT, &refs);
    let codes: Vec<Option<i32>> = members.iter_mut().map(|m| m.term()).collect();
    let logs: String = members
        .iter()
        .enumerate()
        .map(|(i, m)| format!("--- member {i}\n{}", m.log()))
        .collect();
    assert_eq!(codes, vec![Some(0); 3], "{logs}");
    let mut want = values("p0-", 0..3);
    want.extend(values("p1-", 0..3));
    want.extend(values("p2-", 0..7));
    assert_applied_once(&db, want);
}

/// Two members of a group started with `--starting-offsets latest` on a
/// topic of two partitions; two partitions added while they run are
/// assigned after the members' next metadata refresh (lowered to 1 s
/// here) and read from offset 0, each record once.
#[test]
fn a_group_reads_partitions_added_while_it_runs_from_their_log_start() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("grow", 2);
    produce(&kafka, "grow", 0, "before", 0..10);
    let db = Db::sqlite();
    let member = || member(&kafka, &db, "gg");
    let mut a = member();
    a.wait_for("batch committed", WAIT);
    let mut b = member();
    b.wait_for("claimed", WAIT);
    produce(&kafka, "grow", 0, "p0-", 0..3);
    produce(&kafka, "grow", 1, "p1-", 0..3);
    wait_for_count(&db, 6, "the first two partitions", WAIT, &[&a, &b]);

    kafka.create_partitions("grow", 4);
    produce(&kafka, "grow", 2, "p2-", 0..5);
    produce(&kafka, "grow", 3, "p3-", 0..4);
    wait_for_count(&db, 15, "the added partitions", WAIT, &[&a, &b]);
    produce(&kafka, "grow", 3, "p3-", 4..6);
    wait_for_count(&db, 17, "more in an added partition", WAIT, &[&a, &b]);
    let (ca, cb) = (a.term(), b.term());
    let logs = format!("--- a\n{}--- b\n{}", a.log(), b.log());
    assert_eq!((ca, cb), (Some(0), Some(0)), "{logs}");
    for p in [2, 3] {
        assert!(
            logs.contains(&format!(
                "a partition added since the pipeline began: reading from its log start offset 0 topic=\"grow\" partition={p}"
            )),
            "{logs}"
        );
    }
    let mut want = values("p0-", 0..3);
    want.extend(values("p1-", 0..3));
    want.extend(values("p2-", 0..5));
    want.extend(values("p3-", 0..6));
    assert_applied_once(&db, want);
}
