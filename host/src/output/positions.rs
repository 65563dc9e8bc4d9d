//! The pipeline's input positions on the output cluster (KIP-447): the
//! consumer group a transaction commits them to, and reading them back
//! (stable offsets only) to tell whether a transaction committed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use super::destination::Destination;
use super::settings::Settings;
use super::{GroupOffsets, OutputError};

/// A consumer of the positions group on the output cluster.
pub(super) struct Positions {
    reader: BaseConsumer,
    /// The group's name, for messages.
    group: String,
    timeout: Duration,
}

impl Positions {
    /// The positions kept in consumer group `group`.
    ///
    /// # Errors
    /// [`OutputError::Client`] for the reader.
    pub(super) fn new(
        settings: &Settings,
        group: &str,
        dest: &Destination,
    ) -> Result<Positions, OutputError> {
        Ok(Positions {
            reader: settings.offsets_reader(group, dest)?,
            group: group.to_string(),
            timeout: settings.timeout,
        })
    }

    /// The group's metadata, for a transaction of batch `batch` to commit
    /// positions in.
    ///
    /// # Errors
    /// [`OutputError::Transaction`] when librdkafka has none (a bug).
    pub(super) fn metadata(
        &self,
        batch: u64,
        dest: &Destination,
    ) -> Result<ConsumerGroupMetadata, OutputError> {
        self.reader.group_metadata().ok_or_else(|| {
            dest.transaction_error(
                batch,
                format!("no group metadata for the positions group {}", self.group),
            )
        })
    }

    /// The offsets the group holds for `partitions`, each with its
    /// metadata: `(offset, metadata)`, absent for a partition with none.
    /// Only stable offsets are answered (none in an open transaction: the
    /// brokers' "unstable offset" answer is retried for the timeout).
    ///
    /// # Errors
    /// [`OutputError::Client`] when the group coordinator does not answer
    /// within the timeout.
    pub(super) fn committed(
        &self,
        partitions: &[(String, i32)],
        dest: &Destination,
    ) -> Result<GroupOffsets, OutputError> {
        let mut tpl = TopicPartitionList::new();
        for (t, p) in partitions {
            tpl.add_partition(t, *p);
        }
        let started = Instant::now();
        let answered = loop {
            let asked = self
                .reader
                .committed_offsets(tpl.clone(), self.timeout)
                .and_then(|answered| {
                    // A partition's own error (an offset still in an
                    // open transaction: UNSTABLE_OFFSET_COMMIT).
                    match answered.elements().iter().find_map(|e| e.error().err()) {
                        Some(e) => Err(e),
                        None => Ok(answered),
                    }
                });
            match asked {
                Ok(answered) => break answered,
                Err(e) if started.elapsed() < self.timeout => {
                    tracing::debug!("reading the group's committed offsets: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => {
                    return Err(dest.client_error(format!(
                        "reading the consumer group's committed offsets for {} s: {e}",
                        started.elapsed().as_secs()
                    )));
                }
            }
        };
        Ok(answered
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((
                    (e.topic().to_string(), e.partition()),
                    (o, e.metadata().to_string()),
                )),
                _ => None,
            })
            .collect())
    }
}

/// The input `positions` as the list a transaction commits, each
/// partition's offset carrying `marker` as its metadata.
///
/// # Errors
/// librdkafka's, for a partition it cannot add.
pub(super) fn positions_with_marker(
    positions: &BTreeMap<(String, i32), i64>,
    marker: &str,
) -> Result<TopicPartitionList, KafkaError> {
    let mut offsets = TopicPartitionList::with_capacity(positions.len());
    for ((topic, partition), end) in positions {
        offsets.add_partition_offset(topic, *partition, Offset::Offset(*end))?;
        if let Some(mut e) = offsets.find_partition(topic, *partition) {
            e.set_metadata(marker);
        }
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_position_carries_the_batch_marker() {
        let positions: BTreeMap<(String, i32), i64> = [
            (("in".to_string(), 0), 200),
            (("in".to_string(), 2), 7),
            (("other".to_string(), 1), 0),
        ]
        .into();
        let marker = super::super::batch_marker("q", 3);
        let list = positions_with_marker(&positions, &marker).unwrap();
        let got: Vec<(String, i32, Offset, String)> = list
            .elements()
            .iter()
            .map(|e| {
                (
                    e.topic().to_string(),
                    e.partition(),
                    e.offset(),
                    e.metadata().to_string(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("in".into(), 0, Offset::Offset(200), marker.clone()),
                ("in".into(), 2, Offset::Offset(7), marker.clone()),
                ("other".into(), 1, Offset::Offset(0), marker),
            ]
        );
    }
}
