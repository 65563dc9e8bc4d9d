//! One progress event per committed batch, in the spirit of Spark's
//! `StreamingQueryProgress`: a JSON line on stdout (for machines) and a log
//! line (for people).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use serde::Serialize;

use crate::checkpoint::{Counts, DataLossGap, Epoch, OffsetsEntry, Timings};
use crate::source::TopicPartition;
use crate::util::rfc3339_millis;

use super::ProgressMode;
use crate::status_line;

/// Per-partition part of a progress event.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionProgress {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// First offset of the batch.
    pub start: i64,
    /// End offset (exclusive).
    pub end: i64,
    /// Records left between `end` and the high watermark at plan time.
    pub lag: i64,
    /// The partition's owner epoch (its fencing token).
    pub epoch: Epoch,
}

/// A committed batch, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct Progress {
    /// Always `"batch"`.
    pub event: &'static str,
    /// Batch id.
    pub batch_id: u64,
    /// Fencing epoch of a checkpoint directory (0 for a group member:
    /// each partition's owner epoch is in `partitions`).
    pub epoch: Epoch,
    /// True when this batch re-ran an uncommitted batch of a previous run.
    pub rerun: bool,
    /// Commit time (RFC 3339, UTC, with milliseconds).
    pub committed_at: String,
    /// Record counts.
    pub counts: Counts,
    /// Input records per second over the whole batch.
    pub rows_per_sec: f64,
    /// Phase durations, ms.
    pub durations_ms: Timings,
    /// Whole batch, ms.
    pub total_ms: f64,
    /// Ranges and lag.
    pub partitions: Vec<PartitionProgress>,
    /// Skipped (deleted) ranges.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub data_loss: Vec<DataLossGap>,
    /// The pipeline group (`--group`), for a group member.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// This member (pid, host), for a group member.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
}

impl Progress {
    /// Build the event of a committed batch, whose partitions ran under
    /// `epochs` (the top-level epoch is `entry.epoch`: a checkpoint
    /// directory's, 0 in a group, where each partition has its own).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        entry: &OffsetsEntry,
        epochs: &BTreeMap<TopicPartition, Epoch>,
        rerun: bool,
        counts: &Counts,
        timings: &Timings,
        total: Duration,
        lag: BTreeMap<TopicPartition, i64>,
        gaps: &[DataLossGap],
    ) -> Self {
        let secs = total.as_secs_f64().max(1e-9);
        Progress {
            event: "batch",
            batch_id: entry.batch_id,
            epoch: entry.epoch,
            rerun,
            committed_at: rfc3339_millis(crate::util::now_ms()),
            counts: counts.clone(),
            rows_per_sec: (counts.input as f64 / secs).round(),
            durations_ms: timings.clone(),
            total_ms: (total.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0,
            partitions: entry
                .ranges
                .iter()
                .map(|r| PartitionProgress {
                    topic: r.topic.clone(),
                    partition: r.partition,
                    start: r.start,
                    end: r.end,
                    lag: lag
                        .get(&(r.topic.clone(), r.partition))
                        .copied()
                        .unwrap_or(0),
                    epoch: epochs
                        .get(&(r.topic.clone(), r.partition))
                        .copied()
                        .unwrap_or(entry.epoch),
                })
                .collect(),
            data_loss: gaps.to_vec(),
            group: None,
            member: None,
        }
    }

    /// The event of a member of pipeline group `group`.
    pub fn in_group(mut self, group: &str, member: &str) -> Self {
        self.group = Some(group.to_string());
        self.member = Some(member.to_string());
        self
    }

    /// Report the batch: JSON line on stdout, live status line on stderr,
    /// or neither; and a log line in every case.
    pub fn emit(&self, mode: ProgressMode) {
        let lag: i64 = self.partitions.iter().map(|p| p.lag).sum();
        let mode = match mode {
            ProgressMode::Auto if std::io::stdout().is_terminal() => ProgressMode::Line,
            ProgressMode::Auto => ProgressMode::Json,
            m => m,
        };
        match mode {
            ProgressMode::Json => {
                if let Ok(line) = serde_json::to_string(self) {
                    let stdout = std::io::stdout();
                    let mut out = stdout.lock();
                    let _ = writeln!(out, "{line}");
                    let _ = out.flush();
                }
            }
            ProgressMode::Line => status_line::set(format!(
                "{}batch {} | epoch {} | {} in, {} out | {:.0} rows/s | lag {} | {:.0} ms",
                match (&self.group, &self.member) {
                    (Some(g), Some(m)) => format!("group {g} ({m}) | "),
                    _ => String::new(),
                },
                self.batch_id,
                self.epoch,
                self.counts.input,
                self.counts.output,
                self.rows_per_sec,
                lag,
                self.total_ms
            )),
            _ => {}
        }
        tracing::info!(
            batch = self.batch_id,
            epoch = self.epoch.get(),
            rerun = self.rerun,
            input = self.counts.input,
            output = self.counts.output,
            bad = self.counts.bad_records,
            rows_per_sec = self.rows_per_sec,
            lag,
            "batch committed in {} ms",
            self.total_ms
        );
    }
}

/// `d` in milliseconds, rounded to µs (the unit of every duration in the
/// progress event and the commit entry).
pub(super) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_members_event_names_the_group_and_member_and_others_do_not() {
        let entry = OffsetsEntry {
            batch_id: 7,
            ranges: vec![crate::source::PartitionRange {
                topic: "t".into(),
                partition: 0,
                start: 0,
                end: 10,
            }],
            epoch: Epoch::new(1),
            planned_at_ms: 0,
            plugins: Vec::new(),
            config_digest: String::new(),
            note: None,
            topics: BTreeMap::new(),
            sink_db: None,
            output: None,
        };
        let lag = BTreeMap::from([(("t".to_string(), 0), 5)]);
        let plain = Progress::new(
            &entry,
            &BTreeMap::new(),
            false,
            &Counts::default(),
            &Timings::default(),
            Duration::from_millis(1),
            lag.clone(),
            &[],
        );
        let json = serde_json::to_value(&plain).unwrap();
        assert!(json.get("group").is_none(), "{json}");
        assert_eq!(json["partitions"][0]["lag"], 5, "{json}");
        let member = plain.in_group("orders-sync", "pid 1 on a");
        let json = serde_json::to_value(&member).unwrap();
        assert_eq!(json["group"], "orders-sync", "{json}");
        assert_eq!(json["member"], "pid 1 on a", "{json}");
    }
}
