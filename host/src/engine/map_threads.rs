//! The map stage's threads (`--map-threads`): each owns one instance of
//! every map stage (one chain) and maps the pieces of the ranges given to
//! it; the batch's own thread hands the pieces out as the fetch delivers
//! them and takes the answers back in the order it handed the pieces out,
//! so everything after the map (bad-record policy, parts for the sink)
//! happens exactly as with one thread.
//!
//! A range sticks to the thread that got its first piece: its pieces are
//! mapped in order by one instance, and its trap budget lives in one
//! place. A new range goes to the thread with the least work queued.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use sluice_guest::wire::Record;

use crate::checkpoint::PartitionRange;
use crate::metrics::Metrics;
use crate::plugin::chain::{
    ChainResult, DEFAULT_ISOLATION_TRAPS, TrapBudget, isolate_traps, narrow_trap, run_chain,
};
use crate::plugin::{CallContext, Instance, PluginError, Trapped};
use crate::source::{Piece, SourceRecord};

use super::ownership::gate::PartitionGate;
use super::policy::with_retries;
use super::{EngineError, ErrorPolicy};

/// Map a piece of a partition's range through the chain, retrying retryable
/// failures and traps (whole-call `bad-record` errors are handled by the
/// chain itself). When the call still traps and `isolate` is given (error
/// policy `dlq` or `skip`; the process's stop flag), the records that make
/// it trap are found by [`isolate_traps`] and become bad records; under
/// `fail` (`isolate` is `None`) the trap stops the batch, naming the first
/// record that traps on its own ([`narrow_trap`]). `stop` is the process's
/// stop flag: a stop request ends either search early.
pub(super) fn map_partition(
    maps: &mut [Instance],
    ctx: &CallContext,
    records: &[Record<'_>],
    attempts: u32,
    stop: &AtomicBool,
    isolate: Option<&mut RangeTraps>,
    metrics: &Metrics,
) -> Result<ChainResult, PluginError> {
    let r = with_retries(attempts, "map", PluginError::is_retryable, || {
        let r = run_chain(maps, ctx, records);
        if matches!(r, Err(PluginError::Trap(_))) {
            metrics.trap();
        }
        r
    });
    match (r, isolate) {
        (Err(PluginError::Trap(t)), None) => {
            Err(PluginError::Trap(narrow_trap(maps, ctx, records, t, stop)))
        }
        (Err(PluginError::Trap(t)), Some(traps)) => {
            if traps.first.is_none() {
                traps.first = Some(t.clone());
            }
            let mut budget = TrapBudget {
                stop,
                traps_left: traps.left,
                attempts,
            };
            let result = isolate_traps(maps, ctx, records, t, &mut budget);
            traps.left = budget.traps_left;
            let result = result?;
            let trapped = result.rejected.iter().filter(|r| r.trapped).count();
            for _ in 0..trapped {
                metrics.trap();
            }
            traps.trapped += trapped;
            Ok(result)
        }
        (other, _) => other,
    }
}

/// Trap isolation across the map calls of one partition's range in a
/// batch: one budget of trapping calls for the whole range, and the count
/// of records found trapping (if that is every record of the range, the
/// plugin is taken as broken; see `BatchRun::finish`).
pub(super) struct RangeTraps {
    left: u32,
    trapped: usize,
    first: Option<Box<Trapped>>,
}

impl Default for RangeTraps {
    fn default() -> Self {
        RangeTraps {
            left: DEFAULT_ISOLATION_TRAPS,
            trapped: 0,
            first: None,
        }
    }
}

/// What every map thread of a batch shares.
pub(super) struct MapEnv<'a> {
    pub(super) ranges: &'a [PartitionRange],
    /// The call context of each range (index as in `ranges`).
    pub(super) ctxs: &'a [CallContext],
    pub(super) on_error: ErrorPolicy,
    pub(super) attempts: u32,
    /// The partitions dropped during the batch: not mapped further.
    pub(super) gate: &'a PartitionGate,
    pub(super) metrics: &'a Metrics,
    /// The process's stop flag (ends trap isolation early).
    pub(super) stop: &'a AtomicBool,
}

/// A map thread's answer for one piece, in the order it was handed out.
pub(super) struct Mapped {
    /// Index of the piece's range in the batch's offsets entry.
    pub(super) range: usize,
    /// The piece's records, given back.
    pub(super) records: Vec<SourceRecord>,
    /// The range's last piece.
    pub(super) done: bool,
    /// The chain's result (`Ok` and empty for an empty piece or a range
    /// taken from this group member).
    pub(super) result: Result<ChainResult, PluginError>,
    /// Records of the range found trapping so far.
    pub(super) trapped: usize,
    /// The range's first trap, sent once (with the answer that met it).
    pub(super) first_trap: Option<Box<Trapped>>,
    /// Time in the plugin calls.
    pub(super) took: Duration,
}

/// Map the pieces `jobs` brings with `chain` and answer on `answers`, until
/// `jobs` closes or the answers are no longer read. After a failed call
/// (the batch then stops when it reads that answer) later pieces are
/// taken and dropped unanswered: the thread stays, so handing out a piece
/// cannot fail first and hide the failure behind "thread ended".
pub(super) fn map_thread(
    chain: &mut [Instance],
    env: &MapEnv<'_>,
    jobs: Receiver<Piece>,
    answers: Sender<Mapped>,
) {
    let mut traps: HashMap<usize, RangeTraps> = HashMap::new();
    let mut failed = false;
    for piece in jobs {
        if failed {
            continue;
        }
        let t = Instant::now();
        let st = traps.entry(piece.range).or_default();
        let result = match env.ranges.get(piece.range) {
            Some(range)
                if !piece.records.is_empty()
                    && !env.gate.is_dropped(&(range.topic.clone(), range.partition)) =>
            {
                let views: Vec<Record<'_>> = piece
                    .records
                    .iter()
                    .map(|r| r.view(&range.topic, range.partition))
                    .collect();
                // With no map stage the chain passes every record through.
                let isolate = (env.on_error != ErrorPolicy::Fail).then_some(&mut *st);
                let ctx = &env.ctxs[piece.range];
                map_partition(
                    chain,
                    ctx,
                    &views,
                    env.attempts,
                    env.stop,
                    isolate,
                    env.metrics,
                )
            }
            _ => Ok(ChainResult::default()),
        };
        failed = result.is_err();
        let answer = Mapped {
            range: piece.range,
            records: piece.records,
            done: piece.done,
            result,
            trapped: st.trapped,
            first_trap: st.first.take(),
            took: t.elapsed(),
        };
        if answers.send(answer).is_err() {
            return;
        }
    }
}

/// The batch thread's side of the map threads: hands pieces out and takes
/// the answers back in the same order.
pub(super) struct MapPool {
    jobs: Vec<Sender<Piece>>,
    answers: Vec<Receiver<Mapped>>,
    /// Which thread maps each range that has had a piece.
    sticky: HashMap<usize, usize>,
    /// Threads of the pieces handed out and not yet answered, oldest first.
    waiting: VecDeque<usize>,
    /// Pieces handed out per thread and not yet answered.
    queued: Vec<usize>,
}

impl MapPool {
    /// A pool over the threads whose job senders and answer receivers these
    /// are (same order, at least one).
    pub(super) fn new(jobs: Vec<Sender<Piece>>, answers: Vec<Receiver<Mapped>>) -> Self {
        let n = jobs.len();
        MapPool {
            jobs,
            answers,
            sticky: HashMap::new(),
            waiting: VecDeque::new(),
            queued: vec![0; n],
        }
    }

    /// Pieces in flight before [`MapPool::hand_out`] wants one answered:
    /// twice the threads in all, so each thread usually has its next piece
    /// queued while it maps (ranges stick, so one thread may hold more).
    pub(super) fn full(&self) -> bool {
        self.waiting.len() >= 2 * self.jobs.len()
    }

    /// Give `piece` to the thread of its range (a new range: the thread
    /// with the least queued).
    ///
    /// # Errors
    /// [`EngineError::Internal`] when that thread has ended.
    pub(super) fn hand_out(&mut self, piece: Piece) -> Result<(), EngineError> {
        let least = (0..self.queued.len())
            .min_by_key(|&t| self.queued[t])
            .unwrap_or(0);
        let t = *self.sticky.entry(piece.range).or_insert(least);
        self.jobs[t]
            .send(piece)
            .map_err(|_| EngineError::Internal(format!("map thread {t} ended early")))?;
        self.queued[t] += 1;
        self.waiting.push_back(t);
        Ok(())
    }

    /// The answer for the oldest piece not yet answered (`None`: none is
    /// waiting).
    ///
    /// # Errors
    /// [`EngineError::Internal`] when its thread ended without answering.
    pub(super) fn next(&mut self) -> Result<Option<Mapped>, EngineError> {
        let Some(t) = self.waiting.pop_front() else {
            return Ok(None);
        };
        self.queued[t] -= 1;
        self.answers[t]
            .recv()
            .map(Some)
            .map_err(|_| EngineError::Internal(format!("map thread {t} ended without answering")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(range: usize) -> Piece {
        Piece {
            range,
            records: Vec::new(),
            done: false,
        }
    }

    /// Pieces of one range go to one thread; a new range to the least
    /// busy; answers come back in the order the pieces went out.
    #[test]
    fn ranges_stick_to_a_thread_and_answers_keep_the_hand_out_order() {
        let (tx0, rx0) = std::sync::mpsc::channel();
        let (tx1, rx1) = std::sync::mpsc::channel();
        let (atx0, arx0) = std::sync::mpsc::channel();
        let (atx1, arx1) = std::sync::mpsc::channel();
        let mut pool = MapPool::new(vec![tx0, tx1], vec![arx0, arx1]);
        for r in [0, 1, 0] {
            pool.hand_out(piece(r)).expect("hand out");
        }
        assert!(!pool.full());
        pool.hand_out(piece(2)).expect("hand out");
        // Two pieces in flight per thread: the batch thread waits now.
        assert!(pool.full());
        pool.hand_out(piece(1)).expect("hand out");
        let got = |rx: &Receiver<Piece>| rx.try_iter().map(|p| p.range).collect::<Vec<_>>();
        let (on0, on1) = (got(&rx0), got(&rx1));
        // Range 0 on thread 0, range 1 on thread 1 (idle then), range 2 on
        // thread 1 (1 queued there against 2 on thread 0).
        assert_eq!(on0, vec![0, 0]);
        assert_eq!(on1, vec![1, 2, 1]);
        let answer = |range| Mapped {
            range,
            records: Vec::new(),
            done: false,
            result: Ok(ChainResult::default()),
            trapped: 0,
            first_trap: None,
            took: Duration::ZERO,
        };
        // Thread 1 answers first; the pool still returns thread 0's first.
        for r in on1 {
            atx1.send(answer(r)).expect("answer");
        }
        for r in on0 {
            atx0.send(answer(r)).expect("answer");
        }
        let mut order = Vec::new();
        while let Some(m) = pool.next().expect("answer") {
            order.push(m.range);
        }
        assert_eq!(order, vec![0, 1, 0, 2, 1]);
        assert!(matches!(pool.next(), Ok(None)));
    }

    /// A thread that ended is an error, not a wait forever.
    #[test]
    fn an_ended_thread_is_an_internal_error() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (atx, arx) = std::sync::mpsc::channel::<Mapped>();
        let mut pool = MapPool::new(vec![tx], vec![arx]);
        pool.hand_out(piece(0)).expect("hand out");
        drop(atx);
        assert!(matches!(pool.next(), Err(EngineError::Internal(_))));
        drop(rx);
        assert!(matches!(
            pool.hand_out(piece(0)),
            Err(EngineError::Internal(_))
        ));
    }
}
