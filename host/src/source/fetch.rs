//! Fetching exact ranges: position the consumer at each planned start
//! (reusing what the previous batch read past its end), poll until every
//! range is complete, and hand the records over in pieces (`pieces`),
//! pausing what reads too far ahead (`pause`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::pieces::{BUSY_TURN, Handoff, Piece, Pieces};
use super::{KafkaSource, PartitionRange, SourceError, TopicPartition, to_record};

impl KafkaSource {
    /// Make the consumer deliver each active range from its start: keep a
    /// partition's fetch position (and buffered records) when the range
    /// continues where the previous one ended, add new partitions
    /// incrementally, and re-assign everything otherwise.
    fn position_for(&mut self, ranges: &[PartitionRange]) -> Result<(), SourceError> {
        if self.context().is_member() {
            return self.seek_for(ranges);
        }
        let mut add = TopicPartitionList::new();
        let mut reassign = false;
        for r in ranges {
            match self.assigned.get(&(r.topic.clone(), r.partition)) {
                Some(next) if *next == r.start => {}
                Some(_) => reassign = true,
                None => {
                    add.add_partition_offset(&r.topic, r.partition, Offset::Offset(r.start))
                        .map_err(|e| SourceError::Client(e.to_string()))?;
                }
            }
        }
        if reassign {
            let mut tpl = TopicPartitionList::new();
            let mut wanted: BTreeMap<TopicPartition, i64> = self.assigned.clone();
            for r in ranges {
                wanted.insert((r.topic.clone(), r.partition), r.start);
            }
            for ((t, p), o) in &wanted {
                tpl.add_partition_offset(t, *p, Offset::Offset(*o))
                    .map_err(|e| SourceError::Client(e.to_string()))?;
            }
            self.consumer
                .assign(&tpl)
                .map_err(|e| SourceError::Client(format!("assign: {e}")))?;
            self.pending.clear();
            self.assigned = wanted;
        } else if add.count() > 0 {
            self.consumer
                .incremental_assign(&add)
                .map_err(|e| SourceError::Client(format!("assign: {e}")))?;
            for r in ranges {
                self.assigned
                    .entry((r.topic.clone(), r.partition))
                    .or_insert(r.start);
            }
        }
        Ok(())
    }

    /// [`KafkaSource::position_for`] for a group member, whose partitions
    /// come from the coordinator: seek those whose range does not start
    /// where the consumer stands. A range of a partition no longer held
    /// (a rebalance took it) is left alone: the caller drops it.
    fn seek_for(&mut self, ranges: &[PartitionRange]) -> Result<(), SourceError> {
        // The changes stay for `sync_group`: the batch loop acts on them.
        self.absorb_group_changes();
        let held = self.context().held();
        for r in ranges {
            let tp = (r.topic.clone(), r.partition);
            if !held.contains(&tp) || self.assigned.get(&tp) == Some(&r.start) {
                continue;
            }
            self.pending.remove(&tp);
            self.consumer
                .seek(&r.topic, r.partition, Offset::Offset(r.start), self.timeout)
                .map_err(|e| {
                    SourceError::Client(format!(
                        "seek {}/{} to {}: {e}",
                        r.topic, r.partition, r.start
                    ))
                })?;
            self.assigned.insert(tp, r.start);
        }
        Ok(())
    }

    /// Forget the consumer's positions (after a failed fetch): the next
    /// fetch assigns from scratch.
    fn reset(&mut self) {
        let _ = self.resume();
        // A group member keeps its assignment (it is the coordinator's);
        // its next fetch seeks instead.
        if !self.context().is_member() {
            let _ = self.consumer.unassign();
        }
        self.assigned.clear();
        self.pending.clear();
    }

    /// Read every record in `ranges` (empty ranges are skipped) and hand
    /// them to `deliver` in pieces of at most `piece_records` records as
    /// they arrive, so the caller can map one piece while the next is
    /// read. Pieces of one range come in offset order; the last piece of
    /// each non-empty range has `done` set (it may hold no records, e.g.
    /// when the range ends on a control record). Pieces of different ranges
    /// interleave. A group member reads only the partitions it holds: a
    /// range of a partition it does not hold, or that a rebalance revokes
    /// during the fetch, is not read further and gets no last piece (the
    /// batch drops it; see [`super::group`]).
    ///
    /// `deliver` offers a piece, waiting for room at most the time it is
    /// given (none, or `BUSY_TURN` when pieces already wait): when the
    /// batch stays busy ([`Handoff::Busy`]) the piece is offered again
    /// while the consumer goes on being polled, so a group member answers rebalances and stays within
    /// `max.poll.interval.ms` however long the batch's sink takes. What
    /// the polls return meanwhile is kept in order (a record per turn of
    /// `BUSY_TURN` at most; librdkafka's own queue is bounded by
    /// `queued.max.messages.kbytes`).
    ///
    /// # Errors
    /// [`SourceError::OutOfRange`] when a range was deleted from the log;
    /// [`SourceError::Unavailable`] when the brokers do not deliver within
    /// the timeout (a busy batch does not count); [`SourceError::Cancelled`]
    /// when `deliver` answered [`Handoff::Closed`] or `cancel` was set.
    /// After an error the pieces delivered so far are incomplete and the
    /// next fetch starts from a fresh assignment.
    pub fn fetch(
        &mut self,
        ranges: &[PartitionRange],
        piece_records: usize,
        cancel: &AtomicBool,
        deliver: &mut dyn FnMut(Piece, Duration) -> Handoff,
    ) -> Result<(), SourceError> {
        let active: Vec<PartitionRange> =
            ranges.iter().filter(|r| r.end > r.start).cloned().collect();
        if active.is_empty() {
            return Ok(());
        }
        if !self.meta_warm {
            // The metadata client answers from the next plan on: connect it
            // (bootstrap, broker list) in the background while this batch
            // runs, rather than at start, where it would compete with the
            // consumer's own bootstrap.
            self.meta_warm = true;
            let warm = Arc::clone(&self.meta);
            let _ = std::thread::Builder::new()
                .name("sluice-meta-warm".into())
                .spawn(move || {
                    let _ = warm.fetch_metadata(None, Duration::from_secs(5));
                });
        }
        let mut pieces = Pieces {
            bufs: ranges.iter().map(|_| Vec::new()).collect(),
            next: ranges.iter().map(|r| r.start).collect(),
            size: piece_records.max(1),
            cancel,
            deliver,
            outbox: VecDeque::new(),
        };
        let result = self.fetch_into(ranges, &active, &mut pieces);
        match result {
            Ok(()) => {
                // A group member's partition revoked during the fetch has
                // no position here any more.
                // One taken and given back during it starts where its new
                // claim says (set when the assignment was absorbed).
                let held = self.context().held();
                let member = self.context().is_member();
                for r in &active {
                    let tp = (r.topic.clone(), r.partition);
                    if !member || (held.contains(&tp) && !self.fetch_dropped.contains(&tp)) {
                        self.assigned.insert(tp, r.end);
                    }
                }
                Ok(())
            }
            Err(e) => {
                self.reset();
                Err(e)
            }
        }
    }

    fn fetch_into(
        &mut self,
        ranges: &[PartitionRange],
        active: &[PartitionRange],
        pieces: &mut Pieces<'_>,
    ) -> Result<(), SourceError> {
        self.resume()?;
        self.position_for(active)?;
        self.fetch_dropped.clear();
        // A group member reads only the partitions it still holds; the
        // ranges of the others are dropped from the batch (see
        // `KafkaSource::member`).
        let still: Vec<PartitionRange>;
        let active = if self.context().is_member() {
            let held = self.context().held();
            still = active
                .iter()
                .filter(|r| held.contains(&(r.topic.clone(), r.partition)))
                .cloned()
                .collect();
            &still[..]
        } else {
            active
        };
        let index: HashMap<TopicPartition, usize> = ranges
            .iter()
            .enumerate()
            .filter(|(_, r)| r.end > r.start)
            .map(|(i, r)| ((r.topic.clone(), r.partition), i))
            .collect();
        let mut remaining: HashMap<TopicPartition, i64> = HashMap::new();
        for r in active {
            let tp = (r.topic.clone(), r.partition);
            let i = index[&tp];
            let mut complete = false;
            if let Some(q) = self.pending.get_mut(&tp) {
                while let Some(rec) = q.pop_front() {
                    if rec.offset < r.start {
                        continue;
                    }
                    if rec.offset >= r.end {
                        // Records arrive in offset order: the range is done.
                        q.push_front(rec);
                        complete = true;
                        break;
                    }
                    complete = rec.offset == r.end - 1;
                    pieces.push(i, rec)?;
                }
            }
            if complete {
                pieces.finish(i)?;
            } else {
                remaining.insert(tp, r.end);
            }
        }
        self.poll_until_done(ranges, &index, &mut remaining, pieces)
    }

    fn poll_until_done(
        &mut self,
        ranges: &[PartitionRange],
        index: &HashMap<TopicPartition, usize>,
        remaining: &mut HashMap<TopicPartition, i64>,
        pieces: &mut Pieces<'_>,
    ) -> Result<(), SourceError> {
        // The timeout bounds the time without progress, not the fetch: a
        // long batch behind a slow sink is not a stalled broker.
        let mut started = Instant::now();
        let mut progressed = false;
        let mut last_error = String::from("no records delivered");
        let mut last_position_check = Instant::now();
        // Records arrive in runs from one partition: remember the last
        // partition's index so most records need no key allocation or hash.
        let mut last: Option<(TopicPartition, Option<usize>)> = None;
        // The clock is read after a poll that delivered no record (empty
        // or an error) and every CLOCK_EVERY turns, not for every record.
        const CLOCK_EVERY: u32 = 256;
        let mut since_clock = 0u32;
        let member = self.context().is_member();
        let mut rebalances = self.context().rebalances();
        while !remaining.is_empty() || pieces.busy() {
            if pieces.cancel.load(Ordering::Relaxed) {
                return Err(SourceError::Cancelled);
            }
            let mut poll_for = Duration::from_millis(100);
            if pieces.busy() && !pieces.wait(BUSY_TURN)? {
                // A slow sink is not a stalled broker; the poll below
                // serves the consumer.
                progressed = true;
                poll_for = Duration::from_millis(10);
            }
            since_clock += 1;
            if since_clock >= CLOCK_EVERY {
                since_clock = 0;
                if progressed {
                    progressed = false;
                    started = Instant::now();
                }
                if started.elapsed() > self.timeout {
                    return Err(self.fetch_timed_out(remaining, started.elapsed(), last_error));
                }
                // Control records and compaction gaps leave no message at
                // the end of a range: the consumer position tells us we are
                // past it.
                if last_position_check.elapsed() > Duration::from_millis(200) {
                    last_position_check = Instant::now();
                    if let Ok(pos) = self.consumer.position() {
                        for e in pos.elements() {
                            if let Offset::Offset(o) = e.offset() {
                                let tp = (e.topic().to_string(), e.partition());
                                if remaining.get(&tp).is_some_and(|end| o >= *end) {
                                    remaining.remove(&tp);
                                    if let Some(i) = index.get(&tp) {
                                        pieces.finish(*i)?;
                                    }
                                }
                            }
                        }
                    }
                    continue;
                }
            }
            // The record leaves the consumer's borrow at once (every kept
            // record is copied anyway): a rebalance is applied below.
            let polled = match self.consumer.poll(poll_for) {
                Some(Ok(m)) => {
                    let new_tp = match &last {
                        Some(((t, p), _)) if *p == m.partition() && t == m.topic() => None,
                        _ => Some((m.topic().to_string(), m.partition())),
                    };
                    Some(Ok((new_tp, m.offset(), to_record(&m))))
                }
                Some(Err(e)) => Some(Err(e)),
                None => None,
            };
            // A rebalance runs inside the poll: apply it before the record
            // the poll returned, which belongs to the new assignment.
            if member && self.context().rebalances() != rebalances {
                rebalances = self.context().rebalances();
                self.drop_taken(remaining);
                if let Some((tp, i)) = &mut last {
                    *i = self.slot(index, tp);
                }
            }
            match polled {
                Some(Ok((new_tp, offset, rec))) => {
                    progressed = true;
                    if let Some(tp) = new_tp {
                        let i = self.slot(index, &tp);
                        last = Some((tp, i));
                    }
                    let Some((tp, i)) = &last else {
                        continue;
                    };
                    let Some(i) = *i else {
                        // Assigned but not planned this batch, or taken and
                        // given back during it: keep for later (its
                        // assignment was absorbed above), a piece's worth
                        // at most before the partition is paused.
                        self.keep_read_ahead(tp, rec, pieces.size);
                        continue;
                    };
                    let r = &ranges[i];
                    if offset < r.start {
                        continue;
                    }
                    if offset >= r.end {
                        // About one more range's worth is kept (the next
                        // batch's records, read while this one waits).
                        let cap = usize::try_from(r.end - r.start)
                            .unwrap_or(0)
                            .max(pieces.size);
                        self.keep_read_ahead(tp, rec, cap);
                    } else {
                        pieces.push(i, rec)?;
                    }
                    if offset >= r.end - 1 && remaining.remove(tp).is_some() {
                        pieces.finish(i)?;
                    }
                }
                Some(Err(KafkaError::MessageConsumption(
                    RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange,
                ))) => {
                    return Err(self.out_of_range(ranges, remaining));
                }
                Some(Err(e)) => {
                    last_error = e.to_string();
                    tracing::debug!("kafka: {e}");
                    since_clock = CLOCK_EVERY;
                }
                None => {
                    // Idle: the clock checks run on the next turn.
                    since_clock = CLOCK_EVERY;
                }
            }
        }
        Ok(())
    }

    /// The index of `tp`'s range in the fetch, `None` when it has none or
    /// a rebalance took it during the fetch.
    fn slot(&self, index: &HashMap<TopicPartition, usize>, tp: &TopicPartition) -> Option<usize> {
        index
            .get(tp)
            .copied()
            .filter(|_| !self.fetch_dropped.contains(tp))
    }

    /// Apply the rebalances of the last poll during a fetch: every
    /// partition taken is no longer read in this fetch (its range is
    /// dropped from the batch, the others go on), even if it was assigned
    /// again in the same poll.
    fn drop_taken(&mut self, remaining: &mut HashMap<TopicPartition, i64>) {
        self.absorb_group_changes();
        for tp in &self.group_changes.revoked {
            if remaining.remove(tp).is_some() {
                tracing::debug!(topic = %tp.0, partition = tp.1, "revoked during the fetch: no longer read");
            }
            self.fetch_dropped.insert(tp.clone());
        }
    }

    /// The error for a fetch that delivered nothing more within the
    /// timeout: [`SourceError::LogShrunk`] when the broker answers with a
    /// high watermark below a missing partition's planned end (the log is
    /// shorter than when the range was planned),
    /// [`SourceError::FetchStalled`] when its high watermark is past the
    /// consumer's position on some missing partition,
    /// [`SourceError::Unavailable`] otherwise.
    fn fetch_timed_out(
        &self,
        remaining: &HashMap<TopicPartition, i64>,
        waited: Duration,
        last: String,
    ) -> SourceError {
        let positions: HashMap<TopicPartition, i64> = self
            .consumer
            .position()
            .map(|tpl| {
                tpl.elements()
                    .iter()
                    .filter_map(|e| match e.offset() {
                        Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut missing: Vec<(&TopicPartition, &i64)> = remaining.iter().collect();
        missing.sort();
        let mut stalled = Vec::new();
        let mut shrunk = Vec::new();
        // A few quick questions at most: one stalled partition explains
        // the error, and a broker that does not answer them is the
        // "unavailable" case.
        let asked = Instant::now();
        for (tp, end) in &missing {
            if asked.elapsed() > Duration::from_secs(5) {
                break;
            }
            let Some(pos) = positions
                .get(*tp)
                .copied()
                .or_else(|| self.assigned.get(*tp).copied())
            else {
                continue;
            };
            let Ok((_, high)) = self
                .meta
                .fetch_watermarks(&tp.0, tp.1, Duration::from_secs(2))
            else {
                continue;
            };
            if high < **end {
                // The range was planned below an earlier high watermark:
                // the log is shorter now than it was.
                shrunk.push(format!(
                    "{}/{} planned up to {end}, high watermark now {high}",
                    tp.0, tp.1
                ));
            } else if high > pos {
                stalled.push(format!(
                    "{}/{} at offset {pos} (high watermark {high})",
                    tp.0, tp.1
                ));
            }
        }
        if !shrunk.is_empty() {
            return SourceError::LogShrunk {
                shrunk: shrunk.join(", "),
                waited,
            };
        }
        if !stalled.is_empty() {
            return SourceError::FetchStalled {
                stalled: stalled.join(", "),
                waited,
                last,
                limits: self.fetch_limits.clone(),
            };
        }
        let what: Vec<String> = missing
            .iter()
            .map(|((t, p), end)| format!("{t}/{p} up to {end}"))
            .collect();
        self.unavailable(format!("fetching {}", what.join(", ")), waited, last)
    }

    fn out_of_range(
        &self,
        ranges: &[PartitionRange],
        remaining: &HashMap<TopicPartition, i64>,
    ) -> SourceError {
        for r in ranges {
            if !remaining.contains_key(&(r.topic.clone(), r.partition)) {
                continue;
            }
            if let Ok((low, _)) = self.watermarks(&r.topic, r.partition)
                && low > r.start
            {
                return SourceError::OutOfRange {
                    topic: r.topic.clone(),
                    partition: r.partition,
                    start: r.start,
                    end: r.end,
                    log_start: low,
                };
            }
        }
        SourceError::Client("offset out of range reported by the broker, but no planned range is below its log start".into())
    }
}
