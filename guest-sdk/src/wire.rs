//! The packed batch encoding shared by host and guest.
//!
//! The layouts are specified in `wit/plugin.wit` (`packed-records`,
//! `packed-outputs`, `packed-sink-records`): little-endian integers,
//! length-prefixed byte strings, `0xFFFF_FFFF` as the length of an absent
//! (`none`) byte string. Decoding borrows from the buffer (no copies) and
//! never panics: malformed input is a [`WireError`].

use std::fmt;

/// Length marker of an absent optional byte string (`none`).
const NONE_LEN: u32 = u32::MAX;

/// How a record's timestamp was set (Kafka's `timestampType`, KIP-32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimestampType {
    /// No timestamp; `timestamp` is 0.
    #[default]
    NotAvailable,
    /// Set by the producer.
    CreateTime,
    /// Set by the broker on append.
    LogAppendTime,
}

impl TimestampType {
    fn to_u8(self) -> u8 {
        match self {
            TimestampType::NotAvailable => 0,
            TimestampType::CreateTime => 1,
            TimestampType::LogAppendTime => 2,
        }
    }

    fn from_u8(v: u8) -> Result<Self, WireError> {
        Ok(match v {
            0 => TimestampType::NotAvailable,
            1 => TimestampType::CreateTime,
            2 => TimestampType::LogAppendTime,
            other => return Err(WireError(format!("unknown timestamp type {other}"))),
        })
    }

    /// The name used in JSON (`not-available`, `create-time`, `log-append-time`).
    pub fn as_str(self) -> &'static str {
        match self {
            TimestampType::NotAvailable => "not-available",
            TimestampType::CreateTime => "create-time",
            TimestampType::LogAppendTime => "log-append-time",
        }
    }
}

/// A packed buffer could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed packed batch: {}", self.0)
    }
}

impl std::error::Error for WireError {}

/// One Kafka record header, borrowed. `value: None` is a header without a
/// value, distinct from `Some(b"")`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    /// Header name.
    pub key: &'a str,
    /// Header value, if any.
    pub value: Option<&'a [u8]>,
}

/// A header with owned bytes: (key, value), `None` = no value.
pub type OwnedHeader = (String, Option<Vec<u8>>);

/// A record's headers, owned, in order.
pub type OwnedHeaders = Vec<OwnedHeader>;

/// Copy borrowed headers into owned ones.
pub fn owned_headers(headers: &[Header<'_>]) -> OwnedHeaders {
    headers
        .iter()
        .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
        .collect()
}

/// Borrow owned headers as [`Header`]s.
pub fn header_views(headers: &[OwnedHeader]) -> Vec<Header<'_>> {
    headers
        .iter()
        .map(|(k, v)| Header {
            key: k,
            value: v.as_deref(),
        })
        .collect()
}

/// One Kafka record, borrowed from a packed batch (or from anywhere, in
/// native tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// Source topic.
    pub topic: &'a str,
    /// Source partition.
    pub partition: i32,
    /// Source offset.
    pub offset: i64,
    /// Milliseconds since the Unix epoch (0 when not available).
    pub timestamp: i64,
    /// How `timestamp` was set.
    pub timestamp_type: TimestampType,
    /// `None` is a null key, `Some(b"")` an empty key.
    pub key: Option<&'a [u8]>,
    /// `None` is a tombstone, `Some(b"")` an empty value.
    pub value: Option<&'a [u8]>,
    /// Headers in wire order.
    pub headers: Vec<Header<'a>>,
}

impl<'a> Record<'a> {
    /// A record with only a value, as `host test --format lines` builds them:
    /// no key, no headers, no timestamp.
    pub fn with_value(topic: &'a str, partition: i32, offset: i64, value: &'a [u8]) -> Self {
        Record {
            topic,
            partition,
            offset,
            timestamp: 0,
            timestamp_type: TimestampType::NotAvailable,
            key: None,
            value: Some(value),
            headers: Vec::new(),
        }
    }
}

/// One output of a map stage, borrowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output<'a> {
    /// Index of the input record in the call's batch.
    pub input_index: u32,
    /// Output key (`None` = null key).
    pub key: Option<&'a [u8]>,
    /// Output value (`None` = tombstone).
    pub value: Option<&'a [u8]>,
    /// Output headers.
    pub headers: Vec<Header<'a>>,
}

/// One record handed to a sink, borrowed: source coordinates, mapped
/// content and its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkRecord<'a> {
    /// `{topic}/{partition}/{offset}` or `{topic}/{partition}/{offset}#{n}`.
    pub idempotency_key: &'a str,
    /// Source coordinates and mapped key/value/headers.
    pub record: Record<'a>,
}

// ---------------------------------------------------------------- encoding

/// Appends packed entries to a buffer. The count prefix is patched in by
/// [`Encoder::finish`].
#[derive(Debug)]
pub struct Encoder {
    buf: Vec<u8>,
    count: u32,
}

impl Default for Encoder {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl Encoder {
    /// A new encoder with room for `bytes` bytes.
    pub fn with_capacity(bytes: usize) -> Self {
        let mut buf = Vec::with_capacity(bytes.max(4));
        buf.extend_from_slice(&0u32.to_le_bytes());
        Encoder { buf, count: 0 }
    }

    /// Number of entries appended so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes written so far (including the count prefix).
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when no entry was appended.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Forget every entry appended after `len`/`count` were observed (used
    /// to drop a rejected record's partial outputs).
    pub fn truncate(&mut self, len: usize, count: u32) {
        self.buf.truncate(len.max(4));
        self.count = count;
    }

    /// Append one `packed-records` entry.
    pub fn push_record(&mut self, r: &Record<'_>) {
        self.count += 1;
        self.record_body(r);
    }

    /// Append one `packed-outputs` entry.
    pub fn push_output(
        &mut self,
        input_index: u32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header<'_>],
    ) {
        self.count += 1;
        self.buf.extend_from_slice(&input_index.to_le_bytes());
        self.opt_bytes(key);
        self.opt_bytes(value);
        self.headers(headers);
    }

    /// Append one `packed-sink-records` entry.
    pub fn push_sink_record(&mut self, idempotency_key: &str, r: &Record<'_>) {
        self.count += 1;
        self.bytes(idempotency_key.as_bytes());
        self.record_body(r);
    }

    /// The finished buffer.
    pub fn finish(mut self) -> Vec<u8> {
        self.buf[..4].copy_from_slice(&self.count.to_le_bytes());
        self.buf
    }

    fn record_body(&mut self, r: &Record<'_>) {
        self.bytes(r.topic.as_bytes());
        self.buf.extend_from_slice(&r.partition.to_le_bytes());
        self.buf.extend_from_slice(&r.offset.to_le_bytes());
        self.buf.extend_from_slice(&r.timestamp.to_le_bytes());
        self.buf.push(r.timestamp_type.to_u8());
        self.opt_bytes(r.key);
        self.opt_bytes(r.value);
        self.headers(&r.headers);
    }

    fn headers(&mut self, headers: &[Header<'_>]) {
        self.buf
            .extend_from_slice(&(headers.len() as u32).to_le_bytes());
        for h in headers {
            self.bytes(h.key.as_bytes());
            self.opt_bytes(h.value);
        }
    }

    fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(b);
    }

    fn opt_bytes(&mut self, b: Option<&[u8]>) {
        match b {
            Some(b) => self.bytes(b),
            None => self.buf.extend_from_slice(&NONE_LEN.to_le_bytes()),
        }
    }
}

// ---------------------------------------------------------------- decoding

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], WireError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                WireError(format!(
                    "{what}: needs {n} bytes at byte {}, buffer has {}",
                    self.pos,
                    self.buf.len()
                ))
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], WireError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, WireError> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn i32(&mut self, what: &str) -> Result<i32, WireError> {
        self.array::<4>(what).map(i32::from_le_bytes)
    }

    fn i64(&mut self, what: &str) -> Result<i64, WireError> {
        self.array::<8>(what).map(i64::from_le_bytes)
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8], WireError> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }

    fn str(&mut self, what: &str) -> Result<&'a str, WireError> {
        let b = self.bytes(what)?;
        std::str::from_utf8(b).map_err(|e| WireError(format!("{what}: not UTF-8: {e}")))
    }

    fn opt_bytes(&mut self, what: &str) -> Result<Option<&'a [u8]>, WireError> {
        let n = self.u32(what)?;
        if n == NONE_LEN {
            return Ok(None);
        }
        self.take(n as usize, what).map(Some)
    }

    fn headers(&mut self) -> Result<Vec<Header<'a>>, WireError> {
        let n = self.u32("header count")? as usize;
        // Every header takes at least 8 bytes: refuse counts the buffer
        // cannot hold before allocating for them.
        if n > (self.buf.len() - self.pos) / 8 {
            return Err(WireError(format!("header count {n} exceeds the buffer")));
        }
        let mut headers = Vec::with_capacity(n);
        for _ in 0..n {
            let key = self.str("header key")?;
            let value = self.opt_bytes("header value")?;
            headers.push(Header { key, value });
        }
        Ok(headers)
    }

    fn record(&mut self) -> Result<Record<'a>, WireError> {
        Ok(Record {
            topic: self.str("topic")?,
            partition: self.i32("partition")?,
            offset: self.i64("offset")?,
            timestamp: self.i64("timestamp")?,
            timestamp_type: TimestampType::from_u8(self.array::<1>("timestamp type")?[0])?,
            key: self.opt_bytes("key")?,
            value: self.opt_bytes("value")?,
            headers: self.headers()?,
        })
    }

    fn count(&mut self, min_entry: usize) -> Result<usize, WireError> {
        let n = self.u32("count")? as usize;
        if n > (self.buf.len() - self.pos) / min_entry {
            return Err(WireError(format!("count {n} exceeds the buffer")));
        }
        Ok(n)
    }

    fn done(&self) -> Result<(), WireError> {
        if self.pos != self.buf.len() {
            return Err(WireError(format!(
                "{} trailing bytes after the last entry",
                self.buf.len() - self.pos
            )));
        }
        Ok(())
    }
}

/// Smallest possible encoded record: topic len, partition, offset,
/// timestamp, type, key len, value len, header count.
const MIN_RECORD: usize = 4 + 4 + 8 + 8 + 1 + 4 + 4 + 4;

/// Decode a `packed-records` buffer.
///
/// # Errors
/// [`WireError`] when the buffer is truncated, has trailing bytes, an
/// unknown timestamp type or a topic/header name that is not UTF-8.
pub fn decode_records(buf: &[u8]) -> Result<Vec<Record<'_>>, WireError> {
    let mut r = Reader { buf, pos: 0 };
    let n = r.count(MIN_RECORD)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(r.record()?);
    }
    r.done()?;
    Ok(out)
}

/// The number of outputs a `packed-outputs` buffer says it holds, read
/// from its count prefix without decoding them.
///
/// # Errors
/// [`WireError`] when the prefix is missing or claims more entries than
/// the buffer can hold.
pub fn count_outputs(buf: &[u8]) -> Result<usize, WireError> {
    Reader { buf, pos: 0 }.count(16)
}

/// Decode a `packed-outputs` buffer.
///
/// # Errors
/// [`WireError`] as for [`decode_records`].
pub fn decode_outputs(buf: &[u8]) -> Result<Vec<Output<'_>>, WireError> {
    let mut r = Reader { buf, pos: 0 };
    let n = r.count(16)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(Output {
            input_index: r.u32("input index")?,
            key: r.opt_bytes("key")?,
            value: r.opt_bytes("value")?,
            headers: r.headers()?,
        });
    }
    r.done()?;
    Ok(out)
}

/// Decode a `packed-sink-records` buffer.
///
/// # Errors
/// [`WireError`] as for [`decode_records`].
pub fn decode_sink_records(buf: &[u8]) -> Result<Vec<SinkRecord<'_>>, WireError> {
    let mut r = Reader { buf, pos: 0 };
    let n = r.count(MIN_RECORD + 4)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(SinkRecord {
            idempotency_key: r.str("idempotency key")?,
            record: r.record()?,
        });
    }
    r.done()?;
    Ok(out)
}

/// The idempotency key of the `n`-th output (0-based) of the source record
/// at `topic`/`partition`/`offset`: `{topic}/{partition}/{offset}` for the
/// first output, `{topic}/{partition}/{offset}#{n}` for the others
/// (DESIGN.md, "Idempotency key").
///
/// Written with `itoa` rather than `format!`: the host makes one key per
/// output record that a sink plugin receives, and `format!` took about a
/// third of the host's map thread (Sluice's docs/benchmarks.md, session 16).
pub fn idempotency_key(topic: &str, partition: i32, offset: i64, n: u32) -> String {
    let mut ints = itoa::Buffer::new();
    // "/" + i32 + "/" + i64 + "#" + u32 fit in 1 + 11 + 1 + 20 + 1 + 10.
    let mut key = String::with_capacity(topic.len() + 44);
    key.push_str(topic);
    key.push('/');
    key.push_str(ints.format(partition));
    key.push('/');
    key.push_str(ints.format(offset));
    if n != 0 {
        key.push('#');
        key.push_str(ints.format(n));
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record<'static> {
        Record {
            topic: "maxwell",
            partition: 2,
            offset: 41,
            timestamp: 1_700_000_000_000,
            timestamp_type: TimestampType::CreateTime,
            key: None,
            value: Some(b""),
            headers: vec![
                Header {
                    key: "a",
                    value: None,
                },
                Header {
                    key: "b",
                    value: Some(b"\xff"),
                },
            ],
        }
    }

    #[test]
    fn records_round_trip_keeping_none_distinct_from_empty() {
        let mut e = Encoder::default();
        e.push_record(&sample());
        let mut tomb = sample();
        tomb.value = None;
        tomb.key = Some(b"");
        e.push_record(&tomb);
        let buf = e.finish();
        let got = decode_records(&buf).unwrap();
        assert_eq!(got, vec![sample(), tomb]);
        assert_eq!(got[0].value, Some(&b""[..]));
        assert_eq!(got[1].value, None);
    }

    #[test]
    fn outputs_and_sink_records_round_trip() {
        let mut e = Encoder::default();
        e.push_output(3, Some(b"k"), None, &[]);
        let buf = e.finish();
        let got = decode_outputs(&buf).unwrap();
        assert_eq!(got[0].input_index, 3);
        assert_eq!(got[0].value, None);

        let mut e = Encoder::default();
        e.push_sink_record("maxwell/2/41#1", &sample());
        let buf = e.finish();
        let got = decode_sink_records(&buf).unwrap();
        assert_eq!(got[0].idempotency_key, "maxwell/2/41#1");
        assert_eq!(got[0].record, sample());
    }

    #[test]
    fn truncation_is_an_error_at_every_length() {
        let mut e = Encoder::default();
        e.push_record(&sample());
        let buf = e.finish();
        for n in 0..buf.len() {
            assert!(decode_records(&buf[..n]).is_err(), "prefix {n} accepted");
        }
        let mut long = buf.clone();
        long.push(0);
        assert!(decode_records(&long).unwrap_err().0.contains("trailing"));
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        let buf = u32::MAX.to_le_bytes();
        assert!(decode_records(&buf).unwrap_err().0.contains("exceeds"));
    }

    #[test]
    fn truncate_drops_partial_outputs() {
        let mut e = Encoder::default();
        e.push_output(0, None, Some(b"x"), &[]);
        let (len, count) = (e.len(), e.count());
        e.push_output(1, None, Some(b"y"), &[]);
        e.truncate(len, count);
        let buf = e.finish();
        assert_eq!(decode_outputs(&buf).unwrap().len(), 1);
    }

    // Fuzzing the decoders (issue 17): the host decodes what a plugin
    // returns, so no byte string may make it panic, loop or allocate
    // beyond the input's size. proptest's default 256 cases per property; a long
    // run: `PROPTEST_CASES=1000000 cargo test -p sluice-guest --lib wire`.
    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        /// An owned record, from which borrowed [`Record`]s are made.
        type Owned = (
            String,
            i32,
            i64,
            i64,
            u8,
            Option<Vec<u8>>,
            Option<Vec<u8>>,
            Vec<(String, Option<Vec<u8>>)>,
        );

        fn owned() -> impl Strategy<Value = Owned> {
            let bytes = || proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40));
            (
                ".{0,12}",
                any::<i32>(),
                any::<i64>(),
                any::<i64>(),
                0u8..3,
                bytes(),
                bytes(),
                proptest::collection::vec((".{0,8}", bytes()), 0..4),
            )
        }

        fn view(o: &Owned) -> Record<'_> {
            Record {
                topic: &o.0,
                partition: o.1,
                offset: o.2,
                timestamp: o.3,
                timestamp_type: match o.4 {
                    0 => TimestampType::NotAvailable,
                    1 => TimestampType::CreateTime,
                    _ => TimestampType::LogAppendTime,
                },
                key: o.5.as_deref(),
                value: o.6.as_deref(),
                headers: o
                    .7
                    .iter()
                    .map(|(k, v)| Header {
                        key: k,
                        value: v.as_deref(),
                    })
                    .collect(),
            }
        }

        /// The records packed as records, as outputs and as sink records:
        /// one valid buffer for each decoder.
        fn encoded(records: &[Owned]) -> [Vec<u8>; 3] {
            let (mut r, mut o, mut s) =
                (Encoder::default(), Encoder::default(), Encoder::default());
            for (i, rec) in records.iter().enumerate() {
                let v = view(rec);
                r.push_record(&v);
                o.push_output(i as u32, rec.5.as_deref(), rec.6.as_deref(), &v.headers);
                s.push_sink_record(&idempotency_key(v.topic, v.partition, v.offset, 0), &v);
            }
            [r.finish(), o.finish(), s.finish()]
        }

        proptest! {
            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
                let _ = decode_records(&bytes);
                let _ = decode_outputs(&bytes);
                let _ = decode_sink_records(&bytes);
                if let Ok(n) = count_outputs(&bytes) {
                    // A count is never larger than the buffer could hold.
                    prop_assert!(n <= bytes.len());
                }
            }

            #[test]
            fn records_round_trip(records in proptest::collection::vec(owned(), 0..6)) {
                let mut e = Encoder::default();
                for o in &records {
                    e.push_record(&view(o));
                }
                let buf = e.finish();
                let got = decode_records(&buf).unwrap();
                let want: Vec<Record<'_>> = records.iter().map(view).collect();
                prop_assert_eq!(got, want);
            }

            #[test]
            fn outputs_round_trip_and_their_count_matches(records in proptest::collection::vec(owned(), 0..6)) {
                let mut e = Encoder::default();
                for (i, o) in records.iter().enumerate() {
                    e.push_output(i as u32, o.5.as_deref(), o.6.as_deref(), &view(o).headers);
                }
                let buf = e.finish();
                prop_assert_eq!(count_outputs(&buf).unwrap(), records.len());
                let got = decode_outputs(&buf).unwrap();
                prop_assert_eq!(got.len(), records.len());
                for (i, (g, o)) in got.iter().zip(&records).enumerate() {
                    prop_assert_eq!(g.input_index, i as u32);
                    prop_assert_eq!(g.key, o.5.as_deref());
                    prop_assert_eq!(g.value, o.6.as_deref());
                }
            }

            #[test]
            fn mutated_buffers_never_panic(
                records in proptest::collection::vec(owned(), 1..4),
                edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
                cut in any::<usize>(),
            ) {
                for mut buf in encoded(&records) {
                    for (pos, byte) in &edits {
                        let i = pos % buf.len();
                        buf[i] = *byte;
                    }
                    let cut = cut % (buf.len() + 1);
                    for b in [&buf[..], &buf[..cut]] {
                        // Whatever decodes holds no more entries than the
                        // buffer has bytes.
                        if let Ok(v) = decode_records(b) {
                            prop_assert!(v.len() <= b.len());
                        }
                        if let Ok(v) = decode_outputs(b) {
                            prop_assert!(v.len() <= b.len());
                        }
                        if let Ok(v) = decode_sink_records(b) {
                            prop_assert!(v.len() <= b.len());
                        }
                        let _ = count_outputs(b);
                    }
                }
            }
        }
    }

    #[test]
    fn idempotency_keys_follow_the_design() {
        assert_eq!(idempotency_key("t", 0, 5, 0), "t/0/5");
        assert_eq!(idempotency_key("t", 0, 5, 2), "t/0/5#2");
        assert_eq!(
            idempotency_key("a.b-c", i32::MAX, i64::MAX, u32::MAX),
            format!("a.b-c/{}/{}#{}", i32::MAX, i64::MAX, u32::MAX)
        );
        assert_eq!(idempotency_key("t", -1, -1, 1), "t/-1/-1#1");
    }
}
