//! The `kafka` capability (`wit/plugin.wit`, interface `kafka`, contract
//! 0.2.4): what a sink stage may produce, and the records a range sent.
//!
//! A [`KafkaGrant`] names the topics the pipeline produces to
//! (`--output-topic`, each with its partition count as found at start).
//! Each sink instance keeps an [`Outbox`]: `kafka.send` checks the records
//! against the grant and queues them; the sink driver takes them when the
//! range's `close` succeeded and hands them to the output producer
//! (`crate::output`). A refused call poisons the outbox, so the range
//! fails even when the plugin ignored the error.

use std::collections::BTreeMap;

/// Most bytes one range may send: 64 MiB, counting each record's topic,
/// key, value, headers and idempotency key, and [`RECORD_OVERHEAD`]. The
/// records wait in host memory until the range closes, which the
/// plugin's memory cap does not bound.
pub const OUTBOX_BYTES: usize = 64 << 20;

/// What each record counts towards [`OUTBOX_BYTES`] besides its bytes
/// (the host's own bookkeeping of it), so that many empty records are
/// bounded too: 64 bytes.
pub const RECORD_OVERHEAD: usize = 64;

/// The topics a pipeline's sink stage may produce to, with their
/// partition counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaGrant {
    topics: BTreeMap<String, i32>,
}

impl KafkaGrant {
    /// A grant of `topics` (name → partition count).
    pub fn new(topics: BTreeMap<String, i32>) -> Self {
        KafkaGrant { topics }
    }

    /// The granted topics, sorted.
    pub fn topics(&self) -> impl Iterator<Item = &str> {
        self.topics.keys().map(String::as_str)
    }

    /// Why `r` may not be sent, if it may not.
    fn refuse(&self, r: &Sent) -> Option<String> {
        let Some(&partitions) = self.topics.get(&r.topic) else {
            let granted: Vec<&str> = self.topics().collect();
            return Some(format!(
                "topic {:?} is not one this pipeline produces to ({}): name it with --output-topic",
                r.topic,
                granted.join(", ")
            ));
        };
        match r.partition {
            Some(p) if p < 0 || p >= partitions => Some(format!(
                "topic {:?} has partitions 0 to {}, not {p} (the count read at start: restart the pipeline after adding partitions)",
                r.topic,
                partitions - 1
            )),
            _ => None,
        }
    }
}

/// One record a sink sent (the WIT `output-record`): the guest SDK's own
/// type, so the record has one definition on both sides of the boundary.
pub use sluice_guest::kafka::OutputRecord as Sent;

/// What `r` counts towards [`OUTBOX_BYTES`].
fn bytes_of(r: &Sent) -> usize {
    let opt = |b: &Option<Vec<u8>>| b.as_ref().map_or(0, Vec::len);
    RECORD_OVERHEAD
        + r.topic.len()
        + r.idempotency_key.len()
        + opt(&r.key)
        + opt(&r.value)
        + r.headers
            .iter()
            .map(|(k, v)| RECORD_OVERHEAD / 4 + k.len() + opt(v))
            .sum::<usize>()
}

/// The records a sink instance sent in the range being written, or why a
/// send was refused.
#[derive(Debug, Default)]
pub struct Outbox {
    records: Vec<Sent>,
    bytes: usize,
    refused: Option<String>,
}

impl Outbox {
    /// Queue `records` under `grant` (`None`: not granted).
    ///
    /// # Errors
    /// The reason, for the plugin, when the capability is not granted, a
    /// record names a topic or partition the grant lacks, or the range
    /// passes [`OUTBOX_BYTES`]; then nothing of the call is queued and the
    /// range fails at [`Outbox::take`].
    pub fn send(&mut self, grant: Option<&KafkaGrant>, records: Vec<Sent>) -> Result<(), String> {
        let r = self.check(grant, &records);
        match r {
            Ok(bytes) => {
                self.bytes += bytes;
                self.records.extend(records);
                Ok(())
            }
            Err(e) => {
                if self.refused.is_none() {
                    self.refused = Some(e.clone());
                }
                Err(e)
            }
        }
    }

    fn check(&self, grant: Option<&KafkaGrant>, records: &[Sent]) -> Result<usize, String> {
        let Some(grant) = grant else {
            return Err(
                "no kafka capability granted (name the topics with --output-topic; only the sink stage may send)"
                    .into(),
            );
        };
        let mut bytes = 0;
        for r in records {
            if let Some(why) = grant.refuse(r) {
                return Err(format!("{why} (record {:?})", r.idempotency_key));
            }
            bytes += bytes_of(r);
        }
        if self.bytes + bytes > OUTBOX_BYTES {
            return Err(format!(
                "one range may send at most {} MiB; this call would bring it to {} bytes",
                OUTBOX_BYTES >> 20,
                self.bytes + bytes
            ));
        }
        Ok(bytes)
    }

    /// Forget what was sent (a range begins).
    pub fn clear(&mut self) {
        *self = Outbox::default();
    }

    /// What the range sent, in order, emptying the outbox.
    ///
    /// # Errors
    /// The first refusal, when a send was refused.
    pub fn take(&mut self) -> Result<Vec<Sent>, String> {
        let out = std::mem::take(self);
        match out.refused {
            Some(e) => Err(e),
            None => Ok(out.records),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> KafkaGrant {
        KafkaGrant::new(BTreeMap::from([("a".into(), 2), ("b".into(), 1)]))
    }

    fn sent(topic: &str, partition: Option<i32>, value: usize) -> Sent {
        Sent {
            topic: topic.into(),
            partition,
            key: Some(b"k".to_vec()),
            value: Some(vec![0; value]),
            headers: vec![("h".into(), None)],
            idempotency_key: format!("in/0/{value}"),
        }
    }

    #[test]
    fn granted_records_are_kept_in_order_until_taken() {
        let g = grant();
        let mut o = Outbox::default();
        o.send(Some(&g), vec![sent("a", None, 1), sent("b", Some(0), 2)])
            .unwrap();
        o.send(Some(&g), vec![sent("a", Some(1), 3)]).unwrap();
        let got = o.take().unwrap();
        let values: Vec<usize> = got
            .iter()
            .map(|s| s.value.as_ref().unwrap().len())
            .collect();
        assert_eq!(values, [1, 2, 3]);
        assert!(o.take().unwrap().is_empty(), "taking empties the outbox");
    }

    #[test]
    fn a_refused_send_fails_the_range_even_when_ignored() {
        let g = grant();
        let mut o = Outbox::default();
        o.send(Some(&g), vec![sent("a", None, 1)]).unwrap();
        let e = o
            .send(Some(&g), vec![sent("b", None, 2), sent("c", None, 3)])
            .unwrap_err();
        assert!(e.contains("\"c\"") && e.contains("a, b"), "{e}");
        o.send(Some(&g), vec![sent("a", None, 4)]).unwrap();
        assert_eq!(o.take().unwrap_err(), e);
        let e = o.send(Some(&g), vec![sent("a", Some(2), 1)]).unwrap_err();
        assert!(e.contains("partitions 0 to 1, not 2"), "{e}");
        o.clear();
        assert!(o.take().unwrap().is_empty(), "a new range starts clean");
        let e = o.send(None, vec![sent("a", None, 1)]).unwrap_err();
        assert!(e.contains("no kafka capability"), "{e}");
    }

    #[test]
    fn a_range_may_not_send_more_than_the_cap() {
        let g = grant();
        let mut o = Outbox::default();
        o.send(Some(&g), vec![sent("a", None, OUTBOX_BYTES / 2)])
            .unwrap();
        let e = o
            .send(Some(&g), vec![sent("a", None, OUTBOX_BYTES / 2)])
            .unwrap_err();
        assert!(e.contains("at most 64 MiB"), "{e}");
    }
}
