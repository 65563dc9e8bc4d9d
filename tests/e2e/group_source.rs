//! The Kafka reader as a consumer-group member (`KafkaSource::member`):
//! two members of one group on librdkafka's mock cluster and on Apache
//! Kafka split the partitions through the coordinator, each claim is
//! asked of the member's `Membership` before the partition is read, a
//! revoke is told before the partition goes, and a member reads its
//! partitions from the offsets its claims returned.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_host::source::{Handoff, KafkaSource, Membership, PartitionRange, TopicPartition};

use crate::support::kafka::{Broker, BrokerProcess, Mock, producer};

/// A member's answers: every partition starts at `start`; what was asked
/// is recorded.
#[derive(Default)]
struct Recorder {
    start: i64,
    assigned: Mutex<Vec<TopicPartition>>,
    revoked: Mutex<Vec<(TopicPartition, bool)>>,
}

impl Membership for Recorder {
    fn assigned(
        &self,
        partitions: &[TopicPartition],
        member_id: &str,
    ) -> Vec<(TopicPartition, Result<i64, String>)> {
        assert!(
            !member_id.is_empty(),
            "assigned before the member had an id"
        );
        self.assigned.lock().unwrap().extend_from_slice(partitions);
        partitions
            .iter()
            .map(|tp| (tp.clone(), Ok(self.start)))
            .collect()
    }

    fn revoked(&self, partitions: &[TopicPartition], lost: bool) {
        self.revoked
            .lock()
            .unwrap()
            .extend(partitions.iter().map(|tp| (tp.clone(), lost)));
    }
}

fn member(b: &dyn Broker, group: &str, m: Arc<Recorder>) -> KafkaSource {
    let props = BTreeMap::from([
        // Short timeouts so that the test's rebalances are quick on both
        // brokers.
        ("session.timeout.ms".to_string(), "6000".to_string()),
        ("heartbeat.interval.ms".to_string(), "500".to_string()),
    ]);
    KafkaSource::member(
        &b.bootstrap(),
        &props,
        group,
        &["g".to_string()],
        m,
        false,
        Duration::from_secs(20),
    )
    .expect("group member")
}

/// Serve `members` until `done` holds for their held partitions, or fail
/// after `within`.
fn serve_until(
    members: &mut [&mut KafkaSource],
    within: Duration,
    what: &str,
    done: impl Fn(&[Vec<TopicPartition>]) -> bool,
) {
    let started = Instant::now();
    loop {
        for m in members.iter_mut() {
            m.serve(Duration::from_millis(50));
        }
        let held: Vec<Vec<TopicPartition>> = members.iter().map(|m| m.context().held()).collect();
        if done(&held) {
            return;
        }
        assert!(started.elapsed() < within, "{what}: still {held:?}");
    }
}

fn two_members_split_and_hand_back_the_partitions(b: &dyn Broker) {
    b.create_topic("g", 4);
    let p = producer(&b.bootstrap());
    for i in 0..8 {
        p.send("g", i % 4, None, Some(format!("v{i}").as_bytes()), &[]);
    }
    p.flush();
    let (ra, rb) = (
        Arc::new(Recorder::default()),
        Arc::new(Recorder {
            start: 1,
            ..Recorder::default()
        }),
    );
    let mut a = member(b, "grp", ra.clone());
    serve_until(&mut [&mut a], Duration::from_secs(60), "a alone", |h| {
        h[0].len() == 4
    });
    assert_eq!(
        ra.assigned.lock().unwrap().len(),
        4,
        "claimed before reading"
    );

    let mut bm = member(b, "grp", rb.clone());
    serve_until(
        &mut [&mut a, &mut bm],
        Duration::from_secs(90),
        "split",
        |h| {
            let mut all: Vec<&TopicPartition> = h.iter().flatten().collect();
            all.sort();
            all.dedup();
            !h[0].is_empty() && !h[1].is_empty() && h[0].len() + h[1].len() == 4 && all.len() == 4
        },
    );
    // Cooperative: a gave up only what b took, and was told first.
    let revoked: Vec<TopicPartition> = ra
        .revoked
        .lock()
        .unwrap()
        .iter()
        .map(|(tp, lost)| {
            assert!(!lost, "a revoke in a rebalance is not a lost assignment");
            tp.clone()
        })
        .collect();
    let mut b_held = bm.context().held();
    b_held.sort();
    let mut revoked_sorted = revoked.clone();
    revoked_sorted.sort();
    assert_eq!(revoked_sorted, b_held);

    // b reads its partitions from where its claims said (offset 1).
    let changes = bm.sync_group();
    assert_eq!(changes.assigned.len(), b_held.len());
    assert!(changes.assigned.values().all(|s| *s == 1));
    let ranges: Vec<PartitionRange> = b_held
        .iter()
        .map(|(t, p)| PartitionRange {
            topic: t.clone(),
            partition: *p,
            start: 1,
            end: 2,
        })
        .collect();
    let mut got = Vec::new();
    bm.fetch(&ranges, 100, &AtomicBool::new(false), &mut |piece, _| {
        got.extend(piece.records.iter().map(|r| r.offset));
        Handoff::Taken
    })
    .expect("fetch from the claimed offsets");
    assert_eq!(got, vec![1; b_held.len()]);
    // A range of a partition it does not hold is not read: nothing of it
    // is delivered (a batch drops such a range, see `engine::revoke`).
    let theirs = a.context().held()[0].clone();
    let mut delivered = 0;
    bm.fetch(
        &[PartitionRange {
            topic: theirs.0,
            partition: theirs.1,
            start: 0,
            end: 1,
        }],
        100,
        &AtomicBool::new(false),
        &mut |piece, _| {
            delivered += 1 + piece.records.len();
            Handoff::Taken
        },
    )
    .expect("a range not held is skipped, not an error");
    assert_eq!(delivered, 0);

    // b leaves: a gets everything back.
    drop(bm);
    serve_until(&mut [&mut a], Duration::from_secs(60), "a again", |h| {
        h[0].len() == 4
    });
}

#[test]
fn group_members_split_partitions_on_the_mock_cluster() {
    two_members_split_and_hand_back_the_partitions(&Mock::new());
}

#[test]
fn group_members_split_partitions_on_kafka() {
    two_members_split_and_hand_back_the_partitions(&BrokerProcess::start());
}
