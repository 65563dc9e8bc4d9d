//! The partition gate: which partitions a running batch may still write,
//! shared by the loop, the fetch thread (whose consumer poll runs the
//! rebalance callback) and the batch's map and sink threads. Every batch
//! has one; a sole owner's never drops a partition (nobody revokes it),
//! so the threads never ask which kind of owner they serve.
//!
//! For a group member (DESIGN.md, "Scale beyond one machine: pipeline
//! groups"):
//! - a **revoke** marks the partitions dropped, then waits until the parts
//!   of them the sink is applying now (if any; one per partition, on
//!   `--sink-connections` connections at once) have finished, committed or
//!   rolled back, before the callback acknowledges the revoke. The parts
//!   of them not started yet are abandoned: their offsets stay in the
//!   planned range in the database, which the next owner runs again with
//!   the same bounds. So the next owner's claim never waits on this
//!   member's open transaction, and a sink's side effects for one
//!   partition never come from two members at once.
//! - a **lost** assignment (the session timed out: another member may
//!   own the partitions already) marks them dropped without waiting: no
//!   part of them starts from then on.
//! - a part **fenced** by the database (another member claimed the
//!   partition) drops that partition only.
//!
//! Partitions not dropped keep running: the batch finishes them and
//! commits them. Invariant: once a partition is dropped, no part of it
//! starts in this batch ([`PartitionGate::begin`] refuses it).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::checkpoint::Fenced;
use crate::source::{KafkaSource, TopicPartition};

/// How long a revoke waits at most for a part in flight. A part is
/// bounded by the plugin's call timeout, but one that meets lock
/// contention is retried for up to `--sink-retry-for`; the consumer does
/// not poll meanwhile, and librdkafka leaves the group after
/// `max.poll.interval.ms` (5 min by default). After this wait the revoke
/// is acknowledged anyway: the database's fencing still refuses the part
/// if the next owner claims first.
pub const DRAIN_WAIT: Duration = Duration::from_secs(60);

/// Why a partition was dropped from the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// A cooperative revoke: drained, then released.
    Revoked,
    /// The assignment was lost (session timeout).
    Lost,
    /// The database refused a part: another member holds the partition.
    Fenced,
}

#[derive(Default)]
struct State {
    dropped: BTreeMap<TopicPartition, Dropped>,
    /// The partitions of the parts the sinks are applying now (one part
    /// per partition at most: a partition's parts share one connection).
    in_flight: BTreeSet<TopicPartition>,
    /// The refusals behind [`Dropped::Fenced`], for the member to act on
    /// after the batch.
    fenced: Vec<Fenced>,
}

/// The partitions a running batch must no longer write, and the part in
/// flight (see the module doc).
#[derive(Default)]
pub struct PartitionGate {
    state: Mutex<State>,
    /// Signalled when a part ends.
    part_ended: Condvar,
    /// A group member's gate: its consumer is served while a batch is
    /// applied, and other members apply the pipeline's partitions too.
    shared: bool,
}

/// A part being applied; ends it (and wakes a waiting revoke) on drop.
pub struct InFlight<'a> {
    of: &'a PartitionGate,
    tp: TopicPartition,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.of.lock().in_flight.remove(&self.tp);
        self.of.part_ended.notify_all();
    }
}

impl PartitionGate {
    /// A sole owner's gate: nothing revokes its partitions.
    pub fn sole() -> Self {
        PartitionGate::default()
    }

    /// A group member's gate (see the module doc).
    pub fn shared() -> Self {
        PartitionGate {
            shared: true,
            ..PartitionGate::default()
        }
    }

    /// Whether other processes apply this pipeline's partitions too (a
    /// group): a range applied by another batch is then the ordinary
    /// trace of a rebalance, not a reset back.
    pub fn others_apply(&self) -> bool {
        self.shared
    }

    /// After the fetch, until `done` is set (the batch's sinks ended): a
    /// group member goes on answering the coordinator, so a rebalance
    /// meanwhile is drained and released at once (see the module doc)
    /// instead of after the whole batch, and `max.poll.interval.ms` is
    /// kept however long the sinks take. Records that arrive meanwhile
    /// are kept for the next batch, up to `ahead` records; then the
    /// partitions are paused (which drops what librdkafka had read
    /// ahead). A sole owner's consumer has nothing to answer and is left
    /// alone.
    pub fn serve_until(&self, source: &mut KafkaSource, done: &AtomicBool, ahead: usize) {
        if !self.shared {
            return;
        }
        while !done.load(Ordering::Relaxed) {
            if source.pending_records() >= ahead {
                source.pause();
            }
            source.serve(Duration::from_millis(20));
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The coordinator takes `partitions` (`lost`: the session timed out).
    /// Marks them dropped; for a revoke, waits until no part of them is in
    /// flight (at most `wait`), so that the caller acknowledges the revoke
    /// only then. Returns whether a part had to be waited for.
    pub fn revoke(&self, partitions: &[TopicPartition], lost: bool, wait: Duration) -> bool {
        let mut st = self.lock();
        for tp in partitions {
            st.dropped.insert(
                tp.clone(),
                if lost {
                    Dropped::Lost
                } else {
                    Dropped::Revoked
                },
            );
        }
        let busy = |st: &State| partitions.iter().any(|tp| st.in_flight.contains(tp));
        if lost || !busy(&st) {
            return false;
        }
        let until = Instant::now() + wait;
        for (topic, partition) in partitions.iter().filter(|tp| st.in_flight.contains(*tp)) {
            tracing::info!(
                topic,
                partition,
                "revoked while a part of it is being applied: acknowledging the revoke once that part has ended"
            );
        }
        while busy(&st) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    "a part of a revoked partition is still being applied after {} s: acknowledging the revoke anyway (the database refuses that part if the next owner claims the partition first)",
                    wait.as_secs()
                );
                break;
            }
            st = self
                .part_ended
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        true
    }

    /// A sink starts a part of `tp`: `None` when `tp` was dropped (the
    /// part is abandoned), else a guard that ends the part when dropped.
    /// Parts of different partitions may be in flight at once; a
    /// partition's own parts run one after another.
    pub fn begin(&self, tp: &TopicPartition) -> Option<InFlight<'_>> {
        let mut st = self.lock();
        if st.dropped.contains_key(tp) {
            return None;
        }
        st.in_flight.insert(tp.clone());
        Some(InFlight {
            of: self,
            tp: tp.clone(),
        })
    }

    /// Whether `tp` was dropped from the batch.
    pub fn is_dropped(&self, tp: &TopicPartition) -> bool {
        self.lock().dropped.contains_key(tp)
    }

    /// A part of `tp` was refused: another member holds it (`why`).
    pub fn fenced(&self, tp: &TopicPartition, why: Fenced) {
        let mut st = self.lock();
        st.dropped.entry(tp.clone()).or_insert(Dropped::Fenced);
        st.fenced.push(why);
    }

    /// At a batch's end: the partitions dropped during it and the fencing
    /// refusals, cleared for the next batch.
    pub fn take(&self) -> (BTreeSet<TopicPartition>, Vec<Fenced>) {
        let mut st = self.lock();
        let dropped = std::mem::take(&mut st.dropped).into_keys().collect();
        (dropped, std::mem::take(&mut st.fenced))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn tp(p: i32) -> TopicPartition {
        ("t".to_string(), p)
    }

    #[test]
    fn a_revoke_waits_for_the_part_in_flight_of_its_partitions_only() {
        let r = Arc::new(PartitionGate::shared());
        // A part of another partition does not hold the revoke up.
        let other = r.begin(&tp(1)).unwrap();
        assert!(!r.revoke(&[tp(0)], false, Duration::from_secs(5)));
        assert!(
            r.begin(&tp(0)).is_none(),
            "a dropped partition starts no part"
        );
        drop(other);

        let part = r.begin(&tp(2)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let r2 = r.clone();
        let waiter = std::thread::spawn(move || {
            let waited = r2.revoke(&[tp(2)], false, Duration::from_secs(30));
            tx.send(Instant::now()).unwrap();
            waited
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            rx.try_recv().is_err(),
            "the revoke returned before the part ended"
        );
        let ended = Instant::now();
        drop(part);
        let acknowledged = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(acknowledged >= ended);
        assert!(waiter.join().unwrap());

        let (dropped, fenced) = r.take();
        assert_eq!(dropped, BTreeSet::from([tp(0), tp(2)]));
        assert!(fenced.is_empty());
        assert!(
            r.begin(&tp(0)).is_some(),
            "take starts the next batch afresh"
        );
    }

    #[test]
    fn a_revoke_waits_for_every_part_of_its_partitions_in_flight_on_several_connections() {
        let r = Arc::new(PartitionGate::shared());
        let (a, b, other) = (
            r.begin(&tp(0)).unwrap(),
            r.begin(&tp(1)).unwrap(),
            r.begin(&tp(2)).unwrap(),
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let r2 = r.clone();
        let waiter = std::thread::spawn(move || {
            let waited = r2.revoke(&[tp(0), tp(1)], false, Duration::from_secs(30));
            tx.send(()).unwrap();
            waited
        });
        std::thread::sleep(Duration::from_millis(150));
        drop(a);
        std::thread::sleep(Duration::from_millis(150));
        assert!(
            rx.try_recv().is_err(),
            "the revoke returned while a part of partition 1 was in flight"
        );
        drop(b);
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(waiter.join().unwrap());
        // The part of partition 2 never held the revoke up, and ends
        // without a trace.
        drop(other);
        assert!(r.lock().in_flight.is_empty());
    }

    #[test]
    fn a_lost_assignment_does_not_wait_and_a_stuck_part_is_waited_for_only_so_long() {
        let r = PartitionGate::shared();
        let _part = r.begin(&tp(0)).unwrap();
        let t = Instant::now();
        assert!(!r.revoke(&[tp(0)], true, Duration::from_secs(30)));
        assert!(t.elapsed() < Duration::from_secs(1));
        let t = Instant::now();
        assert!(r.revoke(&[tp(0)], false, Duration::from_millis(300)));
        assert!(t.elapsed() >= Duration::from_millis(300));
    }

    #[test]
    fn a_fenced_partition_is_dropped_and_its_refusal_kept() {
        let r = PartitionGate::shared();
        r.fenced(
            &tp(3),
            Fenced {
                partition: tp(3),
                ours: crate::checkpoint::Epoch::new(1),
                now: crate::checkpoint::Epoch::new(2),
                holder: "b".into(),
            },
        );
        assert!(r.is_dropped(&tp(3)));
        let (dropped, fenced) = r.take();
        assert_eq!(dropped, BTreeSet::from([tp(3)]));
        assert_eq!(fenced.len(), 1);
    }
}
