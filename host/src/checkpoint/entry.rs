//! Checkpoint entries and their on-disk envelope.
//!
//! Every checkpoint file is one JSON object followed by a newline:
//!
//! ```json
//! {"format_version":1,"kind":"offsets","checksum":"sha256:<hex>","entry":{…}}
//! ```
//!
//! `checksum` is the sha256 of the exact bytes of `entry` as they appear in
//! the file (kept raw on read, so no re-serialisation is involved). A
//! decoder never panics: any input yields an entry or an [`EnvelopeError`].

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::Epoch;
use crate::source::PartitionRange;

/// The checkpoint format version this host reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// Why a checkpoint file could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Zero bytes.
    #[error("empty file (0 bytes)")]
    Empty,
    /// Not a complete JSON envelope (truncated or garbage).
    #[error("not a complete entry: {0}")]
    Torn(String),
    /// The content does not match its checksum.
    #[error("checksum mismatch: file says {stored}, content hashes to {actual}")]
    BadChecksum {
        /// Checksum in the file.
        stored: String,
        /// Checksum of the content.
        actual: String,
    },
    /// Written by a host with another format version.
    #[error("unknown format version {0} (this host reads version {FORMAT_VERSION})")]
    UnknownVersion(u64),
    /// The envelope holds another kind of entry.
    #[error("expected a {expected} entry, found {found}")]
    WrongKind {
        /// Expected kind.
        expected: &'static str,
        /// Found kind.
        found: String,
    },
    /// The entry does not have the fields of its kind.
    #[error("invalid {kind} entry: {reason}")]
    Invalid {
        /// Kind.
        kind: &'static str,
        /// serde's message.
        reason: String,
    },
}

impl EnvelopeError {
    /// True for damage a crash mid-write could explain (empty, truncated,
    /// checksum mismatch), as opposed to a version or schema mismatch.
    pub fn is_torn(&self) -> bool {
        matches!(
            self,
            EnvelopeError::Empty | EnvelopeError::Torn(_) | EnvelopeError::BadChecksum { .. }
        )
    }
}

#[derive(Deserialize)]
struct EnvelopeIn<'a> {
    format_version: u64,
    kind: String,
    checksum: String,
    #[serde(borrow)]
    entry: &'a RawValue,
}

fn checksum(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Encode `entry` of `kind` into file bytes.
///
/// # Errors
/// serde_json's error (not expected for these types).
pub fn encode<T: Serialize>(kind: &str, entry: &T) -> serde_json::Result<Vec<u8>> {
    let body = serde_json::to_string(entry)?;
    let mut out = format!(
        "{{\"format_version\":{FORMAT_VERSION},\"kind\":{},\"checksum\":\"{}\",\"entry\":",
        serde_json::to_string(kind)?,
        checksum(body.as_bytes())
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out.extend_from_slice(b"}\n");
    Ok(out)
}

/// Decode file bytes holding an entry of `kind`.
///
/// # Errors
/// [`EnvelopeError`], never a panic.
pub fn decode<T: DeserializeOwned>(kind: &'static str, bytes: &[u8]) -> Result<T, EnvelopeError> {
    if bytes.is_empty() {
        return Err(EnvelopeError::Empty);
    }
    // The version is checked before anything else, so a file from a newer
    // host is reported as such even if its envelope changed shape.
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes)
        && let Some(version) = v.get("format_version").and_then(serde_json::Value::as_u64)
        && version != u64::from(FORMAT_VERSION)
    {
        return Err(EnvelopeError::UnknownVersion(version));
    }
    let env: EnvelopeIn<'_> =
        serde_json::from_slice(bytes).map_err(|e| EnvelopeError::Torn(e.to_string()))?;
    if env.format_version != u64::from(FORMAT_VERSION) {
        return Err(EnvelopeError::UnknownVersion(env.format_version));
    }
    let actual = checksum(env.entry.get().as_bytes());
    if actual != env.checksum {
        return Err(EnvelopeError::BadChecksum {
            stored: env.checksum,
            actual,
        });
    }
    if env.kind != kind {
        return Err(EnvelopeError::WrongKind {
            expected: kind,
            found: env.kind,
        });
    }
    serde_json::from_str(env.entry.get()).map_err(|e| EnvelopeError::Invalid {
        kind,
        reason: e.to_string(),
    })
}

/// Which stage a plugin serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StageKind {
    /// A map stage.
    Map,
    /// A sink stage.
    Sink,
}

/// A plugin used by a batch, by content digest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PluginRef {
    /// The stage it serves.
    pub stage: StageKind,
    /// Lower-case hex sha256 of the component (its name in `plugins/`).
    pub digest: String,
}

/// Write-ahead entry `offsets/<N>`: what batch N will process, written
/// before any of it is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetsEntry {
    /// Batch id N.
    pub batch_id: u64,
    /// Fencing epoch of the writer.
    pub epoch: Epoch,
    /// Planning time, milliseconds since the Unix epoch.
    pub planned_at_ms: i64,
    /// Planned ranges, one per topic-partition, sorted.
    pub ranges: Vec<PartitionRange>,
    /// Plugins of the pipeline in stage order.
    pub plugins: Vec<PluginRef>,
    /// sha256 of the pipeline configuration that affects output.
    pub config_digest: String,
    /// Why this entry exists when not planned by the engine (for example
    /// `reset to earliest by checkpoint reset`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Identity of each planned topic as the broker described it at
    /// planning time; the next plan refuses a topic whose identity changed
    /// (deleted and created again). Empty in entries of hosts before 0.3.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub topics: BTreeMap<String, TopicIdentity>,
    /// The sink database that keeps this pipeline's progress rows, with
    /// any password removed (`None`: no sink database). `checkpoint reset`
    /// reads it to know that the rows must move with the offsets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink_db: Option<String>,
    /// Where the batch's outputs go (`--output-topic`: `topic on brokers
    /// (guarantee)`): a re-run must produce them there again. Absent
    /// without an output topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

/// What identifies a topic beyond its name, so that a topic deleted and
/// created again under the same name is told apart from the one the
/// checkpoint's offsets belong to.
///
/// With a KIP-516 topic id (Kafka 2.8 and later, Tansu, librdkafka's mock
/// cluster) any recreation is detected. Without one only what a topic
/// cannot do without being recreated is: lose partitions, or (checked by
/// the planner) end below a position already read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicIdentity {
    /// The KIP-516 topic id, base64 as Kafka's tools print it; `None` when
    /// the broker returned none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Number of partitions.
    pub partitions: u32,
}

impl TopicIdentity {
    /// The identity of a topic with topic id `id` and `partitions`
    /// partitions.
    pub fn new(id: Option<String>, partitions: usize) -> Self {
        TopicIdentity {
            id,
            partitions: u32::try_from(partitions).unwrap_or(u32::MAX),
        }
    }

    /// What to record after `now` was found to be the same topic as
    /// `self`: `now`, keeping the id on record when the broker returned
    /// none (a downgraded broker), to compare against once it returns one.
    pub fn updated(&self, now: &TopicIdentity) -> TopicIdentity {
        TopicIdentity {
            id: now.id.clone().or_else(|| self.id.clone()),
            partitions: now.partitions,
        }
    }

    /// Why `now` cannot be the same topic as `self` (`None`: it can be).
    /// With ids on both sides only the ids count: fewer partitions under
    /// the same id can only be a stale answer (a lagging broker), not
    /// another topic.
    pub fn changed(&self, now: &TopicIdentity) -> Option<String> {
        if let (Some(old), Some(new)) = (&self.id, &now.id) {
            return (old != new).then(|| format!("its topic id changed from {old} to {new}"));
        }
        if now.partitions < self.partitions {
            return Some(format!(
                "its partition count fell from {} to {} (partitions are never removed from a topic)",
                self.partitions, now.partitions
            ));
        }
        None
    }

    /// For messages: `id X, N partitions` or `no topic id, N partitions`.
    pub fn describe(&self) -> String {
        match &self.id {
            Some(id) => format!("topic id {id}, {} partitions", self.partitions),
            None => format!("no topic id, {} partitions", self.partitions),
        }
    }
}

/// Record counts of a batch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Records read from Kafka.
    #[serde(default)]
    pub input: u64,
    /// Records that reached the sink.
    #[serde(default)]
    pub output: u64,
    /// Inputs that produced no output (filtered by a map stage).
    #[serde(default)]
    pub filtered: u64,
    /// Inputs rejected as bad records.
    #[serde(default)]
    pub bad_records: u64,
    /// Bad records written to the dead-letter table.
    #[serde(default)]
    pub dead_lettered: u64,
    /// Bad records set aside by `--on-error skip` (counted and logged, not
    /// written anywhere). Offsets found applied before are
    /// `already_applied`, never "skipped".
    #[serde(default)]
    pub skipped: u64,
    /// Offsets of the batch's ranges that the sink's progress rows showed
    /// applied before — by an earlier run of this batch that was killed
    /// after some parts committed, or by an earlier batch after a reset
    /// back — and that were therefore not applied again (offsets, not
    /// records: control records and compaction gaps count too).
    #[serde(default)]
    pub already_applied: u64,
    /// Outputs produced to the output topic (`--output-topic`); absent
    /// from entries of pipelines without one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub produced: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Counts {
    /// Add `other`'s counts to these.
    pub fn add(&mut self, other: &Counts) {
        self.input += other.input;
        self.output += other.output;
        self.filtered += other.filtered;
        self.bad_records += other.bad_records;
        self.dead_lettered += other.dead_lettered;
        self.skipped += other.skipped;
        self.already_applied += other.already_applied;
        self.produced += other.produced;
    }
}

/// Per-phase durations of a batch, milliseconds. Fetch runs on its own
/// thread while pieces are mapped and finished partitions sunk, so `fetch`,
/// `map` and `sink` overlap and may add up to more than the batch took.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Planning (partition discovery, watermarks).
    #[serde(default)]
    pub plan: f64,
    /// Fetching records.
    #[serde(default)]
    pub fetch: f64,
    /// Map chain (sum of the map calls, over every map thread).
    #[serde(default)]
    pub map: f64,
    /// Sink (sum over partitions).
    #[serde(default)]
    pub sink: f64,
    /// Writing the commit entry.
    #[serde(default)]
    pub commit: f64,
    /// Committing the output transaction (exactly once to a Kafka topic:
    /// the input positions added to it and its commit, which waits for
    /// the outputs' acknowledgements). Absent when zero.
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    pub transaction: f64,
}

fn is_zero_ms(v: &f64) -> bool {
    *v == 0.0
}

/// A range that was gone from the log when read (retention deleted it)
/// and was skipped under `--on-data-loss skip`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataLossGap {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// First missing offset.
    pub from: i64,
    /// First offset still present (exclusive end of the gap).
    pub to: i64,
}

/// Commit entry `commits/<N>`: batch N's effects are durable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommitEntry {
    /// Batch id N.
    pub batch_id: u64,
    /// Fencing epoch of the writer.
    pub epoch: Epoch,
    /// Commit time, milliseconds since the Unix epoch.
    pub committed_at_ms: i64,
    /// Record counts.
    #[serde(default)]
    pub counts: Counts,
    /// Phase durations.
    #[serde(default)]
    pub timings_ms: Timings,
    /// Plugins actually used, in stage order.
    #[serde(default)]
    pub plugins: Vec<PluginRef>,
    /// Ranges skipped because retention deleted them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_loss: Vec<DataLossGap>,
    /// Why, when not committed by the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> OffsetsEntry {
        OffsetsEntry {
            batch_id: 7,
            epoch: Epoch::new(2),
            planned_at_ms: 1,
            ranges: vec![PartitionRange {
                topic: "t".into(),
                partition: 0,
                start: 5,
                end: 9,
            }],
            plugins: vec![PluginRef {
                stage: StageKind::Map,
                digest: "ab".into(),
            }],
            config_digest: "cd".into(),
            note: None,
            topics: BTreeMap::new(),
            sink_db: None,
            output: None,
        }
    }

    #[test]
    fn round_trip() {
        let bytes = encode("offsets", &sample()).unwrap();
        assert_eq!(decode::<OffsetsEntry>("offsets", &bytes).unwrap(), sample());
    }

    #[test]
    fn a_topic_with_another_id_or_fewer_partitions_is_another_topic() {
        let t = |id: Option<&str>, partitions| TopicIdentity {
            id: id.map(str::to_string),
            partitions,
        };
        let old = t(Some("AAAA"), 3);
        assert_eq!(old.changed(&t(Some("AAAA"), 3)), None);
        // Partitions added: the same topic.
        assert_eq!(old.changed(&t(Some("AAAA"), 4)), None);
        let m = old.changed(&t(Some("BBBB"), 3)).unwrap();
        assert!(m.contains("AAAA") && m.contains("BBBB"), "{m}");
        // Fewer partitions under the same id: a stale answer, not another
        // topic.
        assert_eq!(old.changed(&t(Some("AAAA"), 2)), None);
        // Without an id on either side only the partition count can tell.
        assert_eq!(t(None, 3).changed(&t(Some("BBBB"), 3)), None);
        assert_eq!(old.changed(&t(None, 5)), None);
        assert!(t(None, 3).changed(&t(None, 1)).unwrap().contains("3 to 1"));
        assert!(old.changed(&t(None, 2)).is_some());
        // Entries of older hosts have no `topics`; new ones round-trip it.
        let mut e = sample();
        let bytes = encode("offsets", &e).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains("\"topics\""));
        e.topics.insert("t".into(), old.clone());
        e.sink_db = Some("sqlite:/x.db".into());
        let back: OffsetsEntry = decode("offsets", &encode("offsets", &e).unwrap()).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn damage_is_classified() {
        let bytes = encode("offsets", &sample()).unwrap();
        assert_eq!(
            decode::<OffsetsEntry>("offsets", b""),
            Err(EnvelopeError::Empty)
        );
        for cut in 1..bytes.len() - 2 {
            let e = decode::<OffsetsEntry>("offsets", &bytes[..cut]).unwrap_err();
            assert!(e.is_torn(), "cut {cut}: {e}");
        }
        let flipped = String::from_utf8(bytes.clone())
            .unwrap()
            .replace("\"start\":5", "\"start\":6");
        assert!(matches!(
            decode::<OffsetsEntry>("offsets", flipped.as_bytes()),
            Err(EnvelopeError::BadChecksum { .. })
        ));
        let v2 = String::from_utf8(bytes.clone())
            .unwrap()
            .replace("\"format_version\":1", "\"format_version\":2");
        assert_eq!(
            decode::<OffsetsEntry>("offsets", v2.as_bytes()),
            Err(EnvelopeError::UnknownVersion(2))
        );
        assert!(matches!(
            decode::<CommitEntry>("commit", &bytes),
            Err(EnvelopeError::WrongKind { .. })
        ));
    }

    // 2,000 cases per property; a long run (issue 17's fuzzing):
    // `PROPTEST_CASES=200000 cargo test -p host --lib checkpoint::entry`.
    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(2000)
        ))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<OffsetsEntry>("offsets", &bytes);
            let _ = decode::<CommitEntry>("commit", &bytes);
        }

        #[test]
        fn mutated_entries_never_panic_and_never_pass_with_changed_content(
            pos in 0usize..400, byte in any::<u8>()
        ) {
            let bytes = encode("offsets", &sample()).unwrap();
            let mut m = bytes.clone();
            let i = pos % m.len();
            m[i] = byte;
            if let Ok(e) = decode::<OffsetsEntry>("offsets", &m) {
                // Only changes outside the checksummed entry (whitespace,
                // the kind's quotes re-typed identically…) may still decode,
                // and they must decode to the same entry.
                prop_assert_eq!(e, sample());
            }
        }
    }
}
