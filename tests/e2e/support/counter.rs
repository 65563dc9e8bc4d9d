//! The counting sink (`tests/fixtures/sql-counter`: a counter row and one
//! `seen` row per record, keyed by its idempotency key) and the numbered
//! records it counts: what the group, move and growth tests share.

use std::time::{Duration, Instant};

use super::kafka::{Broker, producer};
use super::{Db, HostProcess};

/// Produce records `k{i}` → `v{i}` for `i` in `from..from + n` to
/// `topic`, record `i` to partition `i % partitions`.
pub fn produce(b: &dyn Broker, topic: &str, from: usize, n: usize, partitions: i32) {
    produce_keyed(
        b,
        topic,
        from..from + n,
        |i| (i as i32) % partitions,
        |i| format!("v{i}"),
    );
}

/// Produce records `k{i}` → `value(i)` for `i` in `range`, record `i` to
/// `partition(i)`, with a new producer (its first metadata request sees
/// the partitions the topic has now); flushed.
pub fn produce_keyed(
    b: &dyn Broker,
    topic: &str,
    range: std::ops::Range<usize>,
    partition: impl Fn(usize) -> i32,
    value: impl Fn(usize) -> String,
) {
    let p = producer(&b.bootstrap());
    for i in range {
        p.send(
            topic,
            partition(i),
            Some(format!("k{i}").as_bytes()),
            Some(value(i).as_bytes()),
            &[],
        );
    }
    p.flush();
}

/// Every record counted once and seen once.
pub fn assert_exactly_once(db: &Db, n: i64) {
    assert_eq!(db.counted(), n, "{}: counter", db.name);
    assert_eq!(
        db.scalar("SELECT count(DISTINCT idempotency_key) FROM seen"),
        n,
        "{}: distinct keys",
        db.name
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM seen"),
        n,
        "{}: rows",
        db.name
    );
}

/// The counter, 0 before the sink made its tables.
pub fn counted(db: &Db) -> i64 {
    let rows = sluice_host::capability::sql::connect(&db.url)
        .and_then(|mut b| b.query("SELECT n FROM counters WHERE name = 'records'", &[]));
    match rows
        .ok()
        .and_then(|r| r.rows.into_iter().next())
        .and_then(|r| r.into_iter().next())
    {
        Some(sluice_host::capability::sql::SqlValue::Integer(n)) => n,
        _ => 0,
    }
}

/// Wait (at most `within`) until the counter shows `n`; fail naming
/// `what`, the count reached and each member's log.
pub fn wait_for_count(db: &Db, n: i64, what: &str, within: Duration, members: &[&HostProcess]) {
    let started = Instant::now();
    while counted(db) != n {
        if started.elapsed() > within {
            let logs: Vec<String> = members
                .iter()
                .enumerate()
                .map(|(i, m)| format!("--- member {i}\n{}", m.log()))
                .collect();
            panic!("{what}: {} of {n}\n{}", counted(db), logs.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
