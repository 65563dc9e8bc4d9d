//! A group member whose part runs longer than `max.poll.interval.ms`
//! keeps its assignment (DESIGN.md, "Ownership: who holds a partition":
//! a member keeps serving its consumer while a part is applied).
//!
//! librdkafka makes a member leave its group when the application does
//! not poll the consumer for `max.poll.interval.ms`
//! (`MAXPOLL … Application maximum poll interval … exceeded … leaving
//! group`); its partitions are then revoked as lost and claimed again.
//! The host polls while the batch waits on a slow sink, so neither
//! happens, however long the part.

use std::time::Duration;

use crate::support::counter::{assert_exactly_once, produce, wait_for_count};
use crate::support::kafka::{Broker, BrokerProcess};
use crate::support::{Db, HostProcess, plugin};

/// One member on 3 partitions of 20,000 records each, all in one batch
/// (pieces of 2,000 records: more than the batch's queues hold, so the
/// fetch waits on the sink). Its first part is held before its commit for
/// twice the poll interval (7 s); then everything is applied once, the
/// member never left its group, and each partition was claimed once.
#[test]
fn a_part_longer_than_the_poll_interval_keeps_the_assignment() {
    let db = Db::sqlite();
    let kafka = BrokerProcess::start();
    kafka.create_topic("events", 3);
    produce(&kafka, "events", 0, 60_000, 3);
    let dir = tempfile::tempdir().unwrap();
    let resume = dir.path().join("resume");
    let resume_s = resume.display().to_string();
    let args: Vec<String> = [
        "run",
        "--brokers",
        &kafka.bootstrap(),
        "--topic",
        "events",
        "--group",
        "g-long",
        "--sink-db",
        &db.url,
        "--max-records-per-partition",
        "20000",
        "--trigger-interval",
        "100ms",
        "--config",
        "kafka.session.timeout.ms=6000",
        "--config",
        "kafka.heartbeat.interval.ms=500",
        "--config",
        "kafka.max.poll.interval.ms=7000",
        "--plugin",
        &plugin("sql_counter").display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    let mut a = HostProcess::spawn(
        &args,
        &[
            ("SLUICE_FAILPOINT", "sink:before-db-commit"),
            ("SLUICE_FAILPOINT_RESUME_FILE", &resume_s),
        ],
    );
    a.wait_for("FAILPOINT sink:before-db-commit", Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(14));
    std::fs::write(&resume, b"").unwrap();
    wait_for_count(&db, 60_000, "every record", Duration::from_secs(180), &[&a]);
    std::thread::sleep(Duration::from_secs(1));
    let log = a.log();
    assert_eq!(a.term(), Some(0), "{log}");
    assert!(
        !log.contains("maximum poll interval"),
        "the member stopped polling while its part was held:\n{log}"
    );
    for p in 0..3 {
        assert!(
            log.contains(&format!("partition={p} epoch=1")),
            "partition {p} was not claimed:\n{log}"
        );
        assert!(
            !log.contains(&format!("partition={p} epoch=2")),
            "partition {p} was lost and claimed again:\n{log}"
        );
    }
    assert_exactly_once(&db, 60_000);
}
