//! What a `read_committed` consumer sees of a partition, two ways: as
//! computed from the partition's raw record batches, and as a real
//! `read_committed` consumer (librdkafka, honouring the broker's
//! aborted-transaction list) reads it. [`committed_view`] computes the
//! first and checks that the second agrees.
//!
//! The computed view fetches the partition from its leader with
//! `read_uncommitted` over the Kafka protocol (Fetch v11,
//! `kafka-protocol` crate) and applies the rule of KIP-98: a record
//! written outside a transaction is visible; a transactional record is
//! visible only if its producer's transaction ended with a COMMIT control
//! record (control record key: version `i16`, type `i16`, 0 = ABORT,
//! 1 = COMMIT; Kafka's `ControlRecordType`), and not if it ended with an
//! ABORT or has not ended. It also counts what a consumer does not show:
//! aborted records, open transactions, the markers.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{
    FetchRequest, FetchResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use kafka_protocol::records::{Record, RecordBatchDecoder};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Fetch version used: the last without flexible encoding.
const FETCH_VERSION: i16 = 11;

/// Fetch's API key.
const FETCH: i16 = 1;

/// A partition's records as a `read_committed` consumer would see them,
/// and what it would not.
#[derive(Debug, Default)]
pub struct CommittedView {
    /// Records visible to `read_committed`, in offset order.
    pub visible: Vec<Record>,
    /// Transactional records whose transaction was aborted.
    pub aborted: usize,
    /// Transactional records whose transaction has not ended (a
    /// `read_committed` consumer stops before the first of them).
    pub open: usize,
    /// COMMIT control records.
    pub commits: usize,
    /// ABORT control records.
    pub aborts: usize,
}

/// One exchange on `stream`: request `request` (API key `key`) at
/// `version`, answered by an `A`.
fn call<Q, A>(stream: &mut TcpStream, key: i16, request: &Q, version: i16, id: i32) -> A
where
    Q: Encodable + HeaderVersion,
    A: Decodable + HeaderVersion,
{
    let header = RequestHeader::default()
        .with_request_api_key(key)
        .with_request_api_version(version)
        .with_correlation_id(id)
        .with_client_id(Some(StrBytes::from_static_str("sluice-test-view")));
    let mut body = BytesMut::new();
    header
        .encode(&mut body, Q::header_version(version))
        .expect("request header");
    request.encode(&mut body, version).expect("request");
    let size = i32::try_from(body.len()).expect("request size");
    stream.write_all(&size.to_be_bytes()).expect("send");
    stream.write_all(&body).expect("send");
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).expect("response size");
    let mut answer = vec![0u8; usize::try_from(i32::from_be_bytes(size)).expect("size")];
    stream.read_exact(&mut answer).expect("response");
    let mut answer = Bytes::from(answer);
    let header =
        ResponseHeader::decode(&mut answer, A::header_version(version)).expect("response header");
    assert_eq!(header.correlation_id, id, "correlation id");
    A::decode(&mut answer, version).expect("response body")
}

/// Every record of `topic`/`partition` up to its high watermark, control
/// records included, read from the partition's leader.
pub fn raw_records(bootstrap: &str, topic: &str, partition: i32) -> Vec<Record> {
    let mut stream =
        TcpStream::connect(crate::support::kafka::leader(bootstrap, topic, partition).1)
            .expect("connect to the leader");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut records: Vec<Record> = Vec::new();
    let mut offset = 0i64;
    for id in 1.. {
        let request = FetchRequest::default()
            .with_replica_id((-1).into())
            .with_max_wait_ms(100)
            .with_min_bytes(1)
            .with_max_bytes(16 << 20)
            .with_isolation_level(0)
            .with_topics(vec![
                FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partitions(vec![
                        FetchPartition::default()
                            .with_partition(partition)
                            .with_fetch_offset(offset)
                            .with_partition_max_bytes(8 << 20),
                    ]),
            ]);
        let answer: FetchResponse = call(&mut stream, FETCH, &request, FETCH_VERSION, id);
        let data = &answer.responses[0].partitions[0];
        assert_eq!(
            data.error_code, 0,
            "fetch {topic}/{partition} at {offset}: error code {}",
            data.error_code
        );
        let before = records.len();
        if let Some(mut bytes) = data.records.clone() {
            for set in RecordBatchDecoder::decode_all(&mut bytes).expect("record batches") {
                records.extend(set.records.into_iter().filter(|r| r.offset >= offset));
            }
        }
        if let Some(last) = records.last() {
            offset = offset.max(last.offset + 1);
        }
        if offset >= data.high_watermark {
            break;
        }
        assert!(
            records.len() > before || id < 100,
            "fetch {topic}/{partition} at {offset} returns nothing below the high watermark {}",
            data.high_watermark
        );
    }
    records
}

/// What a `read_committed` consumer sees of `topic`/`partition` (see the
/// module's rule), checked against what a real one reads.
pub fn committed_view(bootstrap: &str, topic: &str, partition: i32) -> CommittedView {
    let raw = raw_records(bootstrap, topic, partition);
    // What was written after these records were fetched is not compared.
    let end = raw.last().map_or(0, |r| r.offset + 1);
    let view = view_of(raw);
    if view.open == 0 {
        let computed: Vec<i64> = view.visible.iter().map(|r| r.offset).collect();
        let mut read = read_committed(bootstrap, topic, partition);
        read.retain(|o| *o < end);
        assert_eq!(
            read, computed,
            "{topic}/{partition}: the offsets a read_committed consumer read, against those the raw batches show committed"
        );
    }
    view
}

/// The offsets a `read_committed` consumer (librdkafka) reads of
/// `topic`/`partition`, from its start to its end.
pub fn read_committed(bootstrap: &str, topic: &str, partition: i32) -> Vec<i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "sluice-test-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .expect("read_committed consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)
        .expect("partition");
    c.assign(&tpl).expect("assign");
    let mut offsets = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < deadline,
            "{topic}/{partition}: no end reached within 60 s"
        );
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => offsets.push(m.offset()),
            Some(Err(KafkaError::PartitionEOF(_))) => return offsets,
            Some(Err(e)) => panic!("reading {topic}/{partition}: {e}"),
            None => {}
        }
    }
}

/// [`committed_view`] of records already read.
pub fn view_of(records: Vec<Record>) -> CommittedView {
    let mut view = CommittedView::default();
    let mut pending: HashMap<i64, Vec<Record>> = HashMap::new();
    for r in records {
        if r.control {
            let key = r.key.as_deref().unwrap_or_default();
            assert!(
                key.len() >= 4,
                "control record at {} without a key",
                r.offset
            );
            let kind = i16::from_be_bytes([key[2], key[3]]);
            let ended = pending.remove(&r.producer_id).unwrap_or_default();
            match kind {
                1 => {
                    view.commits += 1;
                    view.visible.extend(ended);
                }
                0 => {
                    view.aborts += 1;
                    view.aborted += ended.len();
                }
                other => panic!("control record type {other} at {}", r.offset),
            }
        } else if r.transactional {
            pending.entry(r.producer_id).or_default().push(r);
        } else {
            view.visible.push(r);
        }
    }
    view.open = pending.values().map(Vec::len).sum();
    view.visible.sort_by_key(|r| r.offset);
    view
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64, producer_id: i64, transactional: bool, control: Option<i16>) -> Record {
        Record {
            transactional,
            control: control.is_some(),
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id,
            producer_epoch: 0,
            timestamp_type: kafka_protocol::records::TimestampType::Creation,
            offset,
            sequence: 0,
            timestamp: 0,
            key: control.map(|t| {
                let mut k = vec![0, 0];
                k.extend_from_slice(&t.to_be_bytes());
                Bytes::from(k)
            }),
            value: Some(Bytes::from(format!("v{offset}"))),
            headers: Default::default(),
        }
    }

    #[test]
    fn only_committed_transactions_and_plain_records_are_visible() {
        let view = view_of(vec![
            record(0, 7, true, None),
            record(1, 8, true, None),
            record(2, 9, false, None),
            record(3, 7, true, Some(0)),
            record(4, 8, true, Some(1)),
            record(5, 7, true, None),
        ]);
        let offsets: Vec<i64> = view.visible.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [1, 2]);
        assert_eq!(
            (view.aborted, view.open, view.commits, view.aborts),
            (1, 1, 1, 1)
        );
    }
}
