//! Pausing the consumer: an idle one between batches, and a partition
//! that read about one range ahead during a fetch. librdkafka drops what it had
//! buffered for a paused partition and, on resume, fetches again from the
//! record after the last one polled.

use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;

use super::{KafkaSource, SourceError, SourceRecord, TopicPartition};

impl KafkaSource {
    /// Stop fetching the assigned partitions until the next
    /// [`KafkaSource::fetch`]: for an idle pipeline, between batches.
    ///
    /// librdkafka 2.12.1 crashes (SIGSEGV in `rd_kafka_metadata_cache_find`
    /// from `rd_kafka_metadata_update_op`) when a Fetch answer carries
    /// KIP-951 leader tags for a topic with an all-zero topic id: it then
    /// looks the topic up by a name the answer does not have. Tansu 0.6.0
    /// answers a Fetch for a deleted topic's old id that way, so a topic
    /// deleted and recreated under a consumer that keeps fetching crashed
    /// the host in 5 of 6 tries. Fetching only while a batch reads ranges
    /// that the plan just checked against the broker's topic id (see
    /// `engine::plan`) leaves a recreation during that batch's fetch as
    /// the only window (nisshi 0.8.1, Tansu's successor, answers as Kafka
    /// does: no crash in the suite's recreations under a busy host; kept
    /// for Tansu 0.6.0 and any broker with its fault, and because an idle
    /// consumer need not fetch). Records buffered by librdkafka are
    /// dropped and fetched again from the next undelivered offset on
    /// resume, which is where `assigned` says the next range starts.
    pub fn pause(&mut self) {
        if self.paused || self.assigned.is_empty() {
            return;
        }
        if let Ok(tpl) = self.consumer.assignment()
            && self.consumer.pause(&tpl).is_ok()
        {
            self.paused = true;
        }
    }

    pub(super) fn resume(&mut self) -> Result<(), SourceError> {
        if !self.paused {
            return self.resume_ahead();
        }
        let tpl = self
            .consumer
            .assignment()
            .map_err(|e| SourceError::Client(format!("assignment: {e}")))?;
        self.consumer
            .resume(&tpl)
            .map_err(|e| SourceError::Client(format!("resume: {e}")))?;
        self.paused = false;
        // The whole assignment was resumed, the read-ahead pauses with it.
        self.paused_ahead.clear();
        Ok(())
    }

    /// Resume the partitions [`KafkaSource::keep_read_ahead`] paused.
    pub(super) fn resume_ahead(&mut self) -> Result<(), SourceError> {
        if self.paused_ahead.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for (t, p) in &self.paused_ahead {
            tpl.add_partition(t, *p);
        }
        self.consumer
            .resume(&tpl)
            .map_err(|e| SourceError::Client(format!("resume: {e}")))?;
        self.paused_ahead.clear();
        Ok(())
    }

    /// Keep `rec` for the next fetch (it is past its partition's range, or
    /// the partition has no range in this fetch); once `cap` records are
    /// kept, pause the partition until then.
    ///
    /// Without the pause, a partition done early goes on being drained
    /// into `pending` while the fetch waits for the slowest one: on the
    /// mock cluster with 64 partitions the first batch copied the whole
    /// topic (1,000,000 records, peak RSS 340 MiB) before it ended.
    /// Pausing drops what librdkafka had buffered for the partition; on
    /// resume it fetches again from the record after the last one kept
    /// here, where the next range's records continue.
    pub(super) fn keep_read_ahead(&mut self, tp: &TopicPartition, rec: SourceRecord, cap: usize) {
        // Most records go to a partition that already has a queue: clone
        // its name only for a new one.
        let q = match self.pending.get_mut(tp) {
            Some(q) => q,
            None => self.pending.entry(tp.clone()).or_default(),
        };
        q.push_back(rec);
        if q.len() >= cap && !self.paused_ahead.contains(tp) {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&tp.0, tp.1);
            // librdkafka 2.12.1 answers a pause with success whatever the
            // partition (per-partition errors are not reported): counted
            // as paused either way, so a failure is not retried per record.
            if let Err(e) = self.consumer.pause(&tpl) {
                tracing::debug!(topic = %tp.0, partition = tp.1, "pause read-ahead: {e}");
            }
            self.paused_ahead.insert(tp.clone());
        }
    }
}
