//! The pieces a fetch hands over: each planned range's records in
//! pieces of at most a given size, offered in order to the batch, which
//! may be busy (its map or sink behind): the fetch then keeps them and
//! goes on serving the consumer (see [`super::KafkaSource::fetch`]).

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::{SourceError, SourceRecord};

/// Part of one planned range, delivered by [`KafkaSource::fetch`].
#[derive(Debug)]
pub struct Piece {
    /// Index of the range in the `ranges` given to `fetch`.
    pub range: usize,
    /// Records in offset order, following the range's previous piece.
    pub records: Vec<SourceRecord>,
    /// Set on the range's last piece: the whole range has been delivered.
    pub done: bool,
}

/// What became of a piece offered to the batch (the `deliver` callback
/// of [`KafkaSource::fetch`], which waits for room at most the time it is
/// given).
#[derive(Debug)]
pub enum Handoff {
    /// The batch took the piece.
    Taken,
    /// The batch had no room for it in the time given (its map or sink is
    /// behind): offered again later, the consumer served meanwhile.
    Busy(Piece),
    /// The batch takes no more pieces: the fetch ends with
    /// [`SourceError::Cancelled`].
    Closed,
}

/// How long a fetch waits for a busy batch to take a piece before it
/// serves the consumer once more (rebalances, `max.poll.interval.ms`).
pub(super) const BUSY_TURN: Duration = Duration::from_millis(50);

/// Per-range buffers of a fetch in progress.
pub(super) struct Pieces<'a> {
    pub(super) bufs: Vec<Vec<SourceRecord>>,
    /// Per range, the offset after the last record handed over.
    pub(super) next: Vec<i64>,
    pub(super) size: usize,
    /// Set by the receiver when it stops taking pieces; checked every turn
    /// of the poll loop, so a failed batch does not wait for the fetch.
    pub(super) cancel: &'a AtomicBool,
    /// Offers a piece, waiting for room at most the given time.
    pub(super) deliver: &'a mut dyn FnMut(Piece, Duration) -> Handoff,
    /// Pieces made but not yet taken by a busy batch, in the order made.
    pub(super) outbox: VecDeque<Piece>,
}

impl Pieces<'_> {
    pub(super) fn send(&mut self, range: usize, done: bool) -> Result<(), SourceError> {
        let records = std::mem::take(&mut self.bufs[range]);
        self.outbox.push_back(Piece {
            range,
            records,
            done,
        });
        // Waiting here for room, as a blocking send would, keeps short
        // stalls as fast as before: handing the piece to the outbox at
        // once made a sink-bound batch ~30 % slower (bench/ab.py, company
        // into SQLite: 204 → 282 ms, cause not pinned down).
        self.offer(BUSY_TURN)
    }

    /// Offer the waiting pieces, in order, the first one waiting for room
    /// at most `d`; stop at the first the batch does not take.
    fn offer(&mut self, mut d: Duration) -> Result<(), SourceError> {
        while let Some(piece) = self.outbox.pop_front() {
            match (self.deliver)(piece, d) {
                Handoff::Taken => d = Duration::ZERO,
                Handoff::Busy(piece) => {
                    self.outbox.push_front(piece);
                    return Ok(());
                }
                Handoff::Closed => return Err(SourceError::Cancelled),
            }
        }
        Ok(())
    }

    /// Whether pieces wait for a busy batch.
    pub(super) fn busy(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// Offer the waiting pieces, waiting for room up to `d`; whether all
    /// were taken.
    pub(super) fn wait(&mut self, d: Duration) -> Result<bool, SourceError> {
        self.offer(d)?;
        Ok(!self.busy())
    }

    pub(super) fn push(&mut self, range: usize, rec: SourceRecord) -> Result<(), SourceError> {
        // A record the range already handed over (the consumer's position
        // moved back under it) is not handed over twice.
        if rec.offset < self.next[range] {
            tracing::debug!(offset = rec.offset, "record delivered again: dropped");
            return Ok(());
        }
        self.next[range] = rec.offset + 1;
        let buf = &mut self.bufs[range];
        if buf.capacity() == 0 {
            buf.reserve_exact(self.size);
        }
        buf.push(rec);
        if buf.len() >= self.size {
            self.send(range, false)?;
        }
        Ok(())
    }

    pub(super) fn finish(&mut self, range: usize) -> Result<(), SourceError> {
        self.send(range, true)
    }
}
