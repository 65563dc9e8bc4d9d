//! A topic deleted and created again (DeleteTopics, then CreateTopics:
//! Apache Kafka gives it a new topic id) under two running members of a
//! pipeline group: each stops with exit 1 and the recreated-topic
//! message, nothing of the new topic is applied under the old positions,
//! and the reset the message advises lets the group apply the new topic
//! from its start, each record once (the non-idempotent `sql-counter`
//! sink counts).

use std::time::Duration;

use crate::groups::{follow_group_reset_advice, member_args};
use crate::support::counter::{produce, wait_for_count};
use crate::support::kafka::{Broker, BrokerProcess};
use crate::support::{Db, HostProcess};

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn a_topic_recreated_under_running_members_stops_them_and_the_advised_reset_moves_on() {
    let db = Db::sqlite();
    let kafka = BrokerProcess::start();
    kafka.create_topic("events", 2);
    produce(&kafka, "events", 0, 10, 2);
    let args = member_args(&kafka, &db, "g14", &[]);
    let mut a = HostProcess::start(&args);
    let mut b = HostProcess::start(&args);
    wait_for_count(&db, 10, "the old topic", WAIT, &[&a, &b]);

    kafka.delete_topic("events");
    kafka.create_topic("events", 2);
    produce(&kafka, "events", 100, 16, 2);
    let mut logs = Vec::new();
    for (name, m) in [("a", &mut a), ("b", &mut b)] {
        if m.logged("was deleted and created again", WAIT).is_none() {
            panic!("{name} did not see the recreated topic:\n{}", m.log());
        }
        let code = m.wait();
        let log = m.log();
        assert_eq!(code, Some(1), "{name}\n{log}");
        logs.push(log);
    }
    let err = logs.remove(0);
    assert_eq!(db.counted(), 10, "nothing of the new topic applied: {err}");

    follow_group_reset_advice(&err);
    let args = member_args(&kafka, &db, "g14", &["--until-caught-up"]);
    let a = HostProcess::start(&args);
    let b = HostProcess::start(&args);
    let (ca, la) = a.finish();
    let (cb, lb) = b.finish();
    assert_eq!(ca, Some(0), "{la}");
    assert_eq!(cb, Some(0), "{lb}");
    // The new topic's offsets repeat the old one's: count by value.
    assert_eq!(db.counted(), 26);
    let mut values = db.sorted_texts("SELECT value FROM seen");
    assert_eq!(values.len(), 26, "{values:?}");
    values.dedup();
    assert_eq!(values.len(), 26, "a record applied twice: {values:?}");
}
