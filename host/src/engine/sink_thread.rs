//! The sink threads of a batch, one per sink connection
//! (`--sink-connections`): each applies the mapped parts routed to it, in
//! the order queued, with retries, and gives the records the sink stage
//! rejects the error policy. The parts of one partition's range all go to
//! one thread ([`lanes_of`]), so they are applied in offset order; parts of
//! different partitions on different threads commit in no set order,
//! which nothing depends on (each part's transaction carries its own
//! progress row and fencing).

use std::time::{Duration, Instant};

use sluice_guest::wire::SinkRecord;

use crate::metrics::Metrics;
use crate::output::KafkaOutput;
use crate::plugin::{Instance, PluginError};
use crate::sink::{
    Applied, AppliedBefore, DeadLetter, Deliver, Outgoing, PartitionBatch, SinkDriver, SinkError,
};
use crate::source::SourceRecord;

use super::ownership::gate::PartitionGate;
use super::policy::{Rejection, on_bad_record, with_retries};
use super::{EngineError, ErrorPolicy};
use crate::checkpoint::Counts;

/// Parts queued for the sink thread at most: the map runs this far ahead
/// of the sink (a part holds one piece, or more while every record of its
/// range so far trapped).
pub(super) const SINK_QUEUE: usize = 2;

/// A part of a range, mapped and ready for the sink: the part's source
/// records, its outputs (source indices into `records`) and dead letters.
pub(super) struct SinkJob {
    /// Index of the range in the batch.
    pub(super) range: usize,
    /// The partition's owner epoch: the sink fences the part on it.
    pub(super) epoch: crate::checkpoint::Epoch,
    pub(super) part: crate::plugin::PartitionContext,
    pub(super) records: Vec<SourceRecord>,
    pub(super) outputs: Vec<crate::plugin::chain::ChainOutput>,
    pub(super) dead_letters: Vec<DeadLetter>,
}

/// The sink thread (connection) of each range of a batch, of `lanes`:
/// the ranges with records to apply are dealt out in turn (a range
/// planned empty is never sunk), and every part of a range goes to its
/// range's thread, so a partition's parts are applied in offset order.
pub(super) fn lanes_of(ranges: &[crate::checkpoint::PartitionRange], lanes: usize) -> Vec<usize> {
    let mut next = 0;
    ranges
        .iter()
        .map(|r| {
            if r.end <= r.start {
                return 0;
            }
            next += 1;
            (next - 1) % lanes.max(1)
        })
        .collect()
}

/// What the sink threads did in one batch.
pub(super) struct SinkReport {
    /// Records the sink stage rejected (`bad_records`, `skipped`), dead
    /// letters written (of both sides) and outputs handed to the Kafka
    /// producer (`produced`).
    pub(super) counts: Counts,
    /// Outputs of the records the sink rejected (counted as outputs when
    /// the map stage made them).
    pub(super) rejected_outputs: u64,
    /// Per range: the offsets the progress rows showed applied before (not
    /// applied again).
    pub(super) already_applied: Vec<AppliedBefore>,
    /// Source records and outputs of parts abandoned because their
    /// partition was taken from this group member (counted by the map
    /// side when it handed them over).
    pub(super) abandoned: (u64, u64),
    /// Time spent applying parts, summed over the threads.
    pub(super) time: Duration,
    /// Time the parts' own output transactions took (a pipeline group
    /// under exactly once), summed; part of `time`.
    pub(super) transactions: Duration,
}

impl SinkReport {
    /// Nothing done yet, in a batch of `ranges` ranges.
    pub(super) fn empty(ranges: usize) -> Self {
        SinkReport {
            counts: Counts::default(),
            rejected_outputs: 0,
            already_applied: vec![AppliedBefore::default(); ranges],
            abandoned: (0, 0),
            time: Duration::ZERO,
            transactions: Duration::ZERO,
        }
    }

    /// Add another thread's report of the same batch.
    pub(super) fn merge(&mut self, other: SinkReport) {
        self.counts.add(&other.counts);
        self.rejected_outputs += other.rejected_outputs;
        for (a, b) in self.already_applied.iter_mut().zip(other.already_applied) {
            a.offsets += b.offsets;
            a.by_other_batch |= b.by_other_batch;
        }
        self.abandoned.0 += other.abandoned.0;
        self.abandoned.1 += other.abandoned.1;
        self.time += other.time;
        self.transactions += other.transactions;
    }
}

/// Most records the sink stage may reject in one part before it is taken
/// as broken (each rejection writes the part again), the same number as
/// the map stages' trap budget per partition and batch.
pub(super) const SINK_REJECTIONS: usize = 48;

/// How the sink thread treats records the sink stage rejects.
pub(super) struct SinkPolicy {
    pub(super) on_error: ErrorPolicy,
    /// Position of the sink stage in the pipeline (after the map stages),
    /// for dead letters.
    pub(super) stage: usize,
    pub(super) attempts: u32,
}

/// What every sink thread of a batch shares.
pub(super) struct SinkEnv<'a> {
    pub(super) driver: &'a SinkDriver,
    pub(super) policy: SinkPolicy,
    pub(super) metrics: &'a Metrics,
    /// Ranges in the batch.
    pub(super) ranges: usize,
    /// The partitions taken during the batch (a group member's).
    pub(super) gate: &'a PartitionGate,
    /// Set by a sink thread whose part failed: the batch will not commit,
    /// so the other threads start no further part and the map side hands
    /// out no more.
    pub(super) failed: &'a std::sync::atomic::AtomicBool,
    /// The producer of the outputs (`--output-topic`): a map-only
    /// pipeline's part's outputs are produced before it is applied; a
    /// sink stage's `kafka.send` records after its `close`, before the
    /// part is recorded applied.
    pub(super) output: Option<&'a KafkaOutput>,
}

/// A sink thread of a batch, on connection `lane` with `sink` (the sink
/// stage's instance granted that connection): apply each part, in the
/// order queued, with retries. A record the sink rejects (`bad-record` from `sink.write`) gets
/// the error policy: under `dlq`/`skip` the part is applied again without
/// it (and with its dead letter); under `fail` the batch stops. Stops at
/// the first part that fails (the batch is then not committed).
///
/// For a group member (its `gate`), a part of a partition taken from
/// it is not started, and a part the database fences drops its partition
/// only; the other partitions' parts go on.
pub(super) fn run_sink(
    jobs: std::sync::mpsc::Receiver<SinkJob>,
    lane: usize,
    sink: Option<&mut Instance>,
    env: &SinkEnv<'_>,
) -> Result<SinkReport, EngineError> {
    let r = apply_parts(jobs, lane, sink, env);
    if r.is_err() {
        env.failed.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    r
}

/// [`run_sink`]'s loop.
fn apply_parts(
    jobs: std::sync::mpsc::Receiver<SinkJob>,
    lane: usize,
    mut sink: Option<&mut Instance>,
    env: &SinkEnv<'_>,
) -> Result<SinkReport, EngineError> {
    let SinkEnv {
        driver,
        ref policy,
        metrics,
        ranges,
        gate,
        failed,
        output,
    } = *env;
    let mut report = SinkReport::empty(ranges);
    // What a part hands over goes to the output stage; with a sink
    // database (a progress row per part) acknowledged, or committed in the
    // part's own transaction, before the part's row commits.
    let acked_first = driver.grant().is_some();
    let with_part = output.and_then(|o| o.map_outputs_with_part(sink.is_some()));
    let sent = std::sync::atomic::AtomicU64::new(0);
    let transactions = std::sync::Mutex::new(Duration::ZERO);
    let deliver_to =
        |ctx: &crate::plugin::PartitionContext, outgoing: Outgoing<'_>| -> Result<u64, String> {
            let Some(out) = output else {
                return Err("no --output-topic".into());
            };
            let records = match outgoing {
                Outgoing::Sent(records) => records,
                Outgoing::Mapped(mapped) => {
                    KafkaOutput::of_mapped(with_part.unwrap_or_default(), &mapped)
                }
            };
            let (n, took) = out
                .deliver(ctx, &records, acked_first)
                .map_err(|e| e.to_string())?;
            if let Ok(mut t) = transactions.lock() {
                *t += took;
            }
            sent.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            Ok(n)
        };
    let deliver = output.map(|_| Deliver {
        to: &deliver_to,
        with_part: with_part.is_some(),
    });
    for job in jobs {
        if failed.load(std::sync::atomic::Ordering::Relaxed) {
            // Another connection's part failed: this batch is not
            // committed, and its re-run applies what is left.
            break;
        }
        let tp = (job.part.topic.clone(), job.part.partition);
        // Held while the part is applied: a revoke of its partition waits
        // for it (drain, then release).
        let Some(_in_flight) = gate.begin(&tp) else {
            tracing::debug!(topic = %tp.0, partition = tp.1, "[{}, {}) abandoned: the partition was taken from this member", job.part.start_offset, job.part.end_offset);
            report.abandoned.0 += job.records.len() as u64;
            report.abandoned.1 += job.outputs.len() as u64;
            continue;
        };
        // Source records the sink rejected in this part, and their dead
        // letters (policy `dlq`).
        let mut rejected: Vec<usize> = Vec::new();
        let mut dead_letters = job.dead_letters.clone();
        let t = Instant::now();
        if let Some(out) = output.filter(|_| sink.is_none() && with_part.is_none()) {
            // A map-only pipeline's outputs, produced before the part is
            // applied: where that writes a progress row (a sink
            // database), the outputs are acknowledged first, so a part
            // recorded as done never lacks its outputs. Without one, the
            // batch's commit waits for them (`engine::run_batches`).
            report.counts.produced += out
                .send_map_outputs(
                    job.part.batch.batch_id,
                    &job.part.topic,
                    job.part.partition,
                    &job.outputs,
                    acked_first,
                )
                .map_err(EngineError::Output)?;
        }
        // Only a sink plugin reads idempotency keys: without one (mapped
        // records counted and discarded) none is made.
        let keys: Vec<String> = if sink.is_some() || with_part.is_some() {
            job.outputs
                .iter()
                .map(|o| o.idempotency_key(&job.part.topic, job.part.partition))
                .collect()
        } else {
            Vec::new()
        };
        let applied = loop {
            let sink_records: Vec<SinkRecord<'_>> = job
                .outputs
                .iter()
                .zip(keys.iter().map(String::as_str).chain(std::iter::repeat("")))
                .filter(|(o, _)| !rejected.contains(&o.source_index))
                .map(|(o, key)| {
                    let s = &job.records[o.source_index];
                    SinkRecord {
                        idempotency_key: key,
                        record: s.view_with(
                            &job.part.topic,
                            job.part.partition,
                            o.key.as_deref(),
                            o.value.as_deref(),
                            &o.headers,
                        ),
                    }
                })
                .collect();
            let batch = PartitionBatch {
                epoch: job.epoch,
                range: job.part.clone(),
                records: &sink_records,
                dead_letters: &dead_letters,
                deliver,
            };
            let r = with_retries(policy.attempts, "sink", SinkError::is_retryable, || {
                let r = driver.apply(lane, sink.as_deref_mut(), &batch);
                if let Err(e) = &r {
                    if matches!(e, SinkError::Plugin(PluginError::Trap(_))) {
                        metrics.trap();
                    }
                    // The part was rolled back: the next attempt starts from
                    // a fresh plugin instance, not from state the sink kept
                    // (rows it buffered for `close`, say).
                    if let Some(s) = sink.as_deref_mut() {
                        s.discard();
                    }
                }
                r
            });
            let (offset, message, error) = match r {
                Err(SinkError::Rejected {
                    offset,
                    message,
                    error,
                }) => (offset, message, error),
                other => break other,
            };
            let (path, digest) = match error.as_ref() {
                PluginError::Stage { path, digest, .. } => {
                    (path.display().to_string(), digest.clone())
                }
                _ => Default::default(),
            };
            let Ok(src) = job.records.binary_search_by_key(&offset, |r| r.offset) else {
                return Err(EngineError::Internal(format!(
                    "the sink rejected offset {offset} of {}/{}, which is not in the part",
                    job.part.topic, job.part.partition
                )));
            };
            if policy.on_error != ErrorPolicy::Fail && rejected.len() >= SINK_REJECTIONS {
                tracing::error!(topic = %job.part.topic, partition = job.part.partition, "the sink stage rejected {SINK_REJECTIONS} records of one part: it looks broken, not fed bad records; stopping");
                return Err(EngineError::Sink(SinkError::Plugin(*error)));
            }
            let rejection = Rejection {
                topic: &job.part.topic,
                partition: job.part.partition,
                record: &job.records[src],
                batch: job.part.batch.batch_id,
                plugin: &path,
                digest: &digest,
                stage: policy.stage,
                message,
                by_sink: true,
            };
            if let Some(d) = on_bad_record(policy.on_error, rejection, &mut report.counts)? {
                let at = dead_letters.partition_point(|x| x.offset < offset);
                dead_letters.insert(at, d);
            }
            report.rejected_outputs +=
                job.outputs.iter().filter(|o| o.source_index == src).count() as u64;
            rejected.push(src);
        };
        report.time += t.elapsed();
        let fenced = match &applied {
            Err(SinkError::Group(g)) => g.fenced(),
            _ => None,
        };
        if let Some(f) = fenced {
            // Another member holds the partition: nothing of this part
            // was applied, and no later part of it starts.
            report.abandoned.0 += job.records.len() as u64;
            report.abandoned.1 += job.outputs.len() as u64;
            gate.fenced(&tp, f);
            continue;
        }
        let applied = applied?;
        let before = match applied {
            Applied::Written {
                dead_lettered,
                applied_before,
                ..
            } => {
                report.counts.dead_lettered += dead_lettered;
                applied_before
            }
            Applied::AlreadyApplied { applied_before } => {
                tracing::debug!(topic = %job.part.topic, partition = job.part.partition, "[{}, {}) was applied before; not applied again", job.part.start_offset, job.part.end_offset);
                report.counts.dead_lettered += dead_letters.len() as u64;
                applied_before
            }
        };
        if let Some(a) = report.already_applied.get_mut(job.range) {
            a.offsets += before.offsets;
            a.by_other_batch |= before.by_other_batch;
        }
    }
    report.counts.produced += sent.into_inner();
    report.transactions += transactions.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::PartitionRange;

    fn range(partition: i32, start: i64, end: i64) -> PartitionRange {
        PartitionRange {
            topic: "t".into(),
            partition,
            start,
            end,
        }
    }

    #[test]
    fn ranges_with_records_are_dealt_out_over_the_connections_in_turn() {
        let ranges = [
            range(0, 0, 10),
            range(1, 5, 5),
            range(2, 0, 1),
            range(3, 7, 7),
            range(4, 3, 9),
            range(5, 0, 4),
        ];
        // Planned-empty ranges (1, 3) take no turn.
        assert_eq!(lanes_of(&ranges, 2), vec![0, 0, 1, 0, 0, 1]);
        assert_eq!(lanes_of(&ranges, 3), vec![0, 0, 1, 0, 2, 0]);
        assert_eq!(lanes_of(&ranges, 1), vec![0; 6]);
        assert_eq!(lanes_of(&ranges, 0), vec![0; 6], "0 is taken as 1");
    }

    #[test]
    fn reports_of_the_connections_add_up_per_range() {
        let mut a = SinkReport::empty(2);
        a.counts.dead_lettered = 1;
        a.rejected_outputs = 2;
        a.already_applied[0].offsets = 5;
        a.abandoned = (1, 1);
        a.time = Duration::from_millis(10);
        let mut b = SinkReport::empty(2);
        b.counts.dead_lettered = 3;
        b.already_applied[1] = AppliedBefore {
            offsets: 7,
            by_other_batch: true,
        };
        b.abandoned = (2, 0);
        b.time = Duration::from_millis(5);
        a.merge(b);
        assert_eq!(a.counts.dead_lettered, 4);
        assert_eq!(a.rejected_outputs, 2);
        assert_eq!(
            a.already_applied,
            vec![
                AppliedBefore {
                    offsets: 5,
                    by_other_batch: false
                },
                AppliedBefore {
                    offsets: 7,
                    by_other_batch: true
                }
            ]
        );
        assert_eq!(a.abandoned, (3, 1));
        assert_eq!(a.time, Duration::from_millis(15));
    }
}
