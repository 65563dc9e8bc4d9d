//! Pipeline groups on KIP-848's consumer protocol
//! (`--config kafka.group.protocol=consumer`, Apache Kafka 4.0 and later):
//! the brokers assign the partitions and time a member's session out
//! (`group.consumer.session.timeout.ms`, 6 s on the test brokers); the
//! owner epoch in the sink database stays the fencing token.

use std::time::Duration;

use crate::support::counter::{assert_exactly_once, produce, wait_for_count};
use crate::support::kafka::{Broker, BrokerProcess};
use crate::support::{Db, HostProcess};

/// `host run --group g848` with the counting sink on the consumer
/// protocol (no session or heartbeat settings: the brokers own them).
fn member_args(kafka: &BrokerProcess, db: &Db) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--brokers", &kafka.bootstrap(), "--topic", "events"]
        .map(String::from)
        .to_vec();
    args.extend(
        [
            "--group",
            "g848",
            "--sink-db",
            &db.url,
            "--max-records-per-partition",
            "50",
            "--trigger-interval",
            "100ms",
            "--config",
            "kafka.group.protocol=consumer",
            "--plugin",
            &crate::support::plugin("sql_counter").display().to_string(),
        ]
        .map(String::from),
    );
    args
}

#[test]
fn two_members_on_the_consumer_protocol_and_a_kill_9_apply_each_record_once() {
    let db = Db::sqlite();
    let kafka = BrokerProcess::start();
    kafka.create_topic("events", 6);
    produce(&kafka, "events", 0, 600, 6);
    let args = member_args(&kafka, &db);
    let mut a = HostProcess::start(&args);
    let mut b = HostProcess::start(&args);
    wait_for_count(&db, 600, "first 600", Duration::from_secs(90), &[&a, &b]);
    // Kafka's own tool: a consumer-protocol group shows the brokers'
    // assignor (`uniform` by default), a classic one the members'
    // (`cooperative-sticky`).
    let described = kafka.describe_group("g848");
    assert!(
        described.contains("uniform") && !described.contains("cooperative-sticky"),
        "not a consumer-protocol group:\n{described}"
    );
    // a dies without leaving; its session ends on the brokers and b (or
    // a new member) takes its partitions from where a's rows say.
    a.kill();
    produce(&kafka, "events", 600, 600, 6);
    let mut c = HostProcess::start(&args);
    wait_for_count(
        &db,
        1200,
        "after the kill",
        Duration::from_secs(120),
        &[&b, &c],
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_exactly_once(&db, 1200);
    let (lb, lc) = (b.log(), c.log());
    assert_eq!(b.term(), Some(0), "{lb}");
    assert_eq!(c.term(), Some(0), "{lc}");
}
