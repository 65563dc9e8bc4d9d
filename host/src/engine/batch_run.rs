//! A running batch's ranges ([`BatchRun`]): each range's state, taking
//! the mapped pieces back in the order they were read, handing each to
//! its range's sink thread as a part (the error policy deciding about bad
//! records of the map), and finishing a range at its planned end.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::checkpoint::{Counts, Epoch, OffsetsEntry};
use crate::plugin::chain::ChainResult;
use crate::plugin::{CallContext, PluginError, Trapped};
use crate::source::SourceRecord;

use super::map_threads::Mapped;
use super::ownership::gate::PartitionGate;
use super::policy::{Rejection, on_bad_record};
use super::sink_thread::SinkJob;
use super::{EngineError, PipelineConfig};

/// One partition's range within a batch: what was read and mapped and not
/// yet sunk, and how far the sink got.
#[derive(Default)]
pub(super) struct RangeState {
    /// Records read and mapped since the last sink of this range.
    pub(super) records: Vec<SourceRecord>,
    /// Their map results (source indices into `records`).
    pub(super) mapped: ChainResult,
    /// Records of the range found trapping so far, and the first trap.
    pub(super) trapped: usize,
    pub(super) first_trap: Option<Box<Trapped>>,
    /// Records of the range read so far, sunk or held.
    pub(super) seen: usize,
    /// Offsets below this were handed to the sink thread (`None`: nothing
    /// yet, the range's start).
    pub(super) sunk_to: Option<i64>,
    /// The range's last piece arrived and its last part was handed to the
    /// sink thread.
    pub(super) finished: bool,
}

/// The map side of one batch (the fetch and the sink run on threads of
/// their own).
pub(super) struct BatchRun<'a> {
    pub(super) cfg: &'a PipelineConfig,
    /// Digest → file, for messages.
    pub(super) files: &'a BTreeMap<String, String>,
    pub(super) entry: &'a OffsetsEntry,
    /// The call context of each range (its owner epoch included).
    pub(super) ctxs: &'a [CallContext],
    /// Each range's owner epoch, typed (the sink fences on it).
    pub(super) epochs: &'a [Epoch],
    /// The partitions dropped during the batch ([`BatchEnv::gate`]).
    pub(super) gate: &'a PartitionGate,
    pub(super) states: Vec<RangeState>,
    pub(super) counts: Counts,
    pub(super) map_time: Duration,
    /// Parts for the sink threads, one queue per sink connection, each in
    /// order (emptied once the batch's pieces are all handed over: the
    /// sink threads then end).
    pub(super) sinks: Vec<std::sync::mpsc::SyncSender<SinkJob>>,
    /// Each range's sink thread ([`lanes_of`]).
    pub(super) lanes: Vec<usize>,
    /// Set when a sink thread failed: no further part is handed out.
    pub(super) sink_failed: &'a AtomicBool,
}

impl BatchRun<'_> {
    /// Whether range `i`'s partition was taken from this group member
    /// during the batch: its records are no longer mapped or sunk.
    pub(super) fn dropped(&self, i: usize) -> bool {
        let r = &self.entry.ranges[i];
        self.gate.is_dropped(&(r.topic.clone(), r.partition))
    }

    /// Take a map thread's answer for the next piece of its range and sink
    /// it as a part of the range, unless it is the range's last piece
    /// ([`BatchRun::finish`] sinks that, up to the planned end, and runs
    /// next).
    pub(super) fn take_mapped(&mut self, m: Mapped) -> Result<(), EngineError> {
        let Mapped {
            range: i,
            records,
            done,
            result,
            trapped,
            first_trap,
            took,
        } = m;
        self.map_time += took;
        let mapped = result.map_err(|e| match e {
            // Under `fail` the map thread named the record that traps.
            PluginError::Trap(trap)
                if self.cfg.on_error == super::ErrorPolicy::Fail && trap.site.contains(" offset ") =>
            {
                EngineError::TrappedOnRecord {
                    trap,
                    aside: if self.cfg.sink_db.is_some() {
                        "to set the records that trap aside and go on, run with `--on-error dlq` (the trap becomes their error in sluice_dead_letters)"
                    } else {
                        "to set the records that trap aside and go on, run with `--on-error skip` (or give a --sink-db and `--on-error dlq`, which keeps them)"
                    },
                }
            }
            e => e.into(),
        })?;
        self.take_piece(i, records, done, mapped, (trapped, first_trap))?;
        if done {
            self.finish(i)?;
        }
        Ok(())
    }

    fn take_piece(
        &mut self,
        i: usize,
        records: Vec<SourceRecord>,
        done: bool,
        mapped: ChainResult,
        (trapped, first_trap): (usize, Option<Box<Trapped>>),
    ) -> Result<(), EngineError> {
        if records.is_empty() || self.dropped(i) {
            return Ok(());
        }
        let range = &self.entry.ranges[i];
        if self.states[i].finished {
            return Err(EngineError::Internal(format!(
                "records of {}/{} arrived after its range [{}, {}) was finished",
                range.topic, range.partition, range.start, range.end
            )));
        }
        let st = &mut self.states[i];
        st.trapped = trapped;
        if st.first_trap.is_none() {
            st.first_trap = first_trap;
        }
        let base = st.records.len();
        st.mapped
            .outputs
            .extend(mapped.outputs.into_iter().map(|mut o| {
                o.source_index += base;
                o
            }));
        st.mapped
            .rejected
            .extend(mapped.rejected.into_iter().map(|mut b| {
                b.source_index += base;
                b
            }));
        st.seen += records.len();
        let next = records.last().map(|r| r.offset + 1);
        if st.records.is_empty() {
            st.records = records;
        } else {
            st.records.extend(records);
        }
        // Sink the piece now, as a part of the range, so the sink keeps up
        // with the fetch instead of trailing it and the piece's memory is
        // reused for the next one — unless every record of the range so far
        // trapped: that may turn out to be a broken plugin (see `finish`),
        // which must stop the batch rather than dead-letter or skip the
        // range.
        if !done
            && st.trapped < st.seen
            && let Some(next) = next
        {
            self.sink_held(i, next)?;
        }
        Ok(())
    }

    /// Range `i` is read and mapped: sink the rest of it.
    pub(super) fn finish(&mut self, i: usize) -> Result<(), EngineError> {
        if self.dropped(i) {
            return Ok(());
        }
        let range = &self.entry.ranges[i];
        let st = &mut self.states[i];
        if st.finished {
            return Err(EngineError::Internal(format!(
                "range [{}, {}) of {}/{} finished twice",
                range.start, range.end, range.topic, range.partition
            )));
        }
        if st.seen > 1
            && st.trapped == st.seen
            && let Some(first) = st.first_trap.take()
        {
            // Not one record could be mapped: a broken plugin (or limit)
            // rather than bad records. Stop instead of dead-lettering or
            // skipping the whole range (none of it was sunk).
            tracing::error!(
                "every record of {}/{} [{}, {}) made the plugin trap: it looks broken, not fed bad records; stopping",
                range.topic,
                range.partition,
                range.start,
                range.end
            );
            return Err(EngineError::Plugin(PluginError::Trap(first)));
        }
        // The last part, up to the planned end (which may lie past the last
        // record: control records, compaction gaps); the whole range when
        // nothing was sunk yet.
        if st.sunk_to != Some(range.end) {
            self.sink_held(i, range.end)?;
        }
        self.states[i].finished = true;
        Ok(())
    }

    /// Hand the records range `i` holds to the sink thread as the part
    /// `[sunk_to, end)` of the range (`end`: the offset after the last held
    /// record, or the range's end), after applying the bad-record policy.
    /// The sink thread applies it with one sink call (one transaction with
    /// the SQL capability), retried as configured.
    fn sink_held(&mut self, i: usize, end: i64) -> Result<(), EngineError> {
        let range = &self.entry.ranges[i];
        let cfg = self.cfg;
        let ctx = &self.ctxs[i];
        let epoch = self.epochs[i];
        let counts = &mut self.counts;
        let st = &mut self.states[i];
        let start = st.sunk_to.unwrap_or(range.start);
        let recs = std::mem::take(&mut st.records);
        let mapped = std::mem::take(&mut st.mapped);
        counts.input += recs.len() as u64;
        let mut dead_letters = Vec::new();
        for b in &mapped.rejected {
            let plugin = self.files.get(&b.plugin_digest);
            let rejection = Rejection {
                topic: &range.topic,
                partition: range.partition,
                record: &recs[b.source_index],
                batch: self.entry.batch_id,
                plugin: plugin.map_or("", String::as_str),
                digest: &b.plugin_digest,
                stage: b.stage,
                message: b.message.clone(),
                by_sink: false,
            };
            dead_letters.extend(on_bad_record(cfg.on_error, rejection, counts)?);
        }
        let mut with_output = vec![false; recs.len()];
        for o in &mapped.outputs {
            with_output[o.source_index] = true;
        }
        counts.output += mapped.outputs.len() as u64;
        counts.filtered += with_output
            .iter()
            .enumerate()
            .filter(|(i, has)| !**has && !mapped.rejected.iter().any(|b| b.source_index == *i))
            .count() as u64;

        let job = SinkJob {
            range: i,
            epoch,
            part: crate::plugin::PartitionContext {
                batch: ctx.clone(),
                topic: range.topic.clone(),
                partition: range.partition,
                start_offset: start,
                end_offset: end,
            },
            records: recs,
            outputs: mapped.outputs,
            dead_letters,
        };
        // A sink thread stopped only because a part failed: the caller
        // reports that error.
        if self.sink_failed.load(Ordering::Relaxed) {
            return Err(EngineError::SinkStopped);
        }
        self.sinks
            .get(self.lanes.get(i).copied().unwrap_or(0))
            .ok_or(EngineError::SinkStopped)?
            .send(job)
            .map_err(|_| EngineError::SinkStopped)?;
        self.states[i].sunk_to = Some(end);
        Ok(())
    }
}
