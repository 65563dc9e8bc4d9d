//! The hand-written baseline of topic-to-topic copying: read every record
//! of IN (all partitions, from offset 0 to the high watermarks at start)
//! with a plain rdkafka consumer and produce each, key, value and headers
//! as read, to OUT with an idempotent producer (`acks=all`, Java's murmur2
//! partitioner, `linger.ms=5`: the host's settings), then wait for every
//! acknowledgement. At-least-once, no offsets committed. With
//! `--transactional N`, exactly once as Kafka Streams does it: a
//! transactional producer commits every N records with the input
//! positions in the transaction. Prints `records seconds`.
//!
//! Usage: copy-loop BOOTSTRAP IN OUT [--transactional N]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("copy-loop: {what}: {e}");
    std::process::exit(1);
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let every: Option<usize> = match a.get(4).map(String::as_str) {
        None => None,
        Some("--transactional") => a.get(5).and_then(|n| n.parse().ok()),
        Some(_) => None,
    };
    if a.len() != 4 && every.is_none() {
        eprintln!("usage: copy-loop BOOTSTRAP IN OUT [--transactional N]");
        std::process::exit(2);
    }
    let (bootstrap, input, output) = (&a[1], &a[2], &a[3]);
    let started = Instant::now();
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "bench-copy-loop")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "100")
        .set("reconnect.backoff.ms", "10")
        .create()
        .unwrap_or_else(|e| fail("consumer", e));
    let mut props = ClientConfig::new();
    props
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        .set("reconnect.backoff.ms", "10");
    if every.is_some() {
        props
            .set("transactional.id", "bench-copy-loop")
            .set("transaction.timeout.ms", "600000");
    }
    let p: ThreadedProducer<DefaultProducerContext> =
        props.create().unwrap_or_else(|e| fail("producer", e));
    let timeout = Duration::from_secs(60);
    if every.is_some() {
        p.init_transactions(timeout)
            .unwrap_or_else(|e| fail("init_transactions", e));
        p.begin_transaction().unwrap_or_else(|e| fail("begin", e));
    }
    let md = c
        .fetch_metadata(Some(input), timeout)
        .unwrap_or_else(|e| fail("metadata", e));
    let parts: Vec<i32> = md.topics()[0].partitions().iter().map(|p| p.id()).collect();
    let mut tpl = TopicPartitionList::new();
    let mut highs = BTreeMap::new();
    for &part in &parts {
        let (_, high) = c
            .fetch_watermarks(input, part, timeout)
            .unwrap_or_else(|e| fail("watermarks", e));
        if high > 0 {
            highs.insert(part, high);
            tpl.add_partition_offset(input, part, Offset::Beginning)
                .unwrap_or_else(|e| fail("assign", e));
        }
    }
    c.assign(&tpl).unwrap_or_else(|e| fail("assign", e));
    let mut next: BTreeMap<i32, i64> = highs.keys().map(|p| (*p, 0)).collect();
    let mut n = 0usize;
    let mut in_txn = 0usize;
    let commit = |next: &BTreeMap<i32, i64>| {
        let mut offsets = TopicPartitionList::new();
        for (part, o) in next {
            let _ = offsets.add_partition_offset(input, *part, Offset::Offset(*o));
        }
        let group = c
            .group_metadata()
            .unwrap_or_else(|| fail("group", "no metadata"));
        p.send_offsets_to_transaction(&offsets, &group, timeout)
            .unwrap_or_else(|e| fail("send_offsets", e));
        p.commit_transaction(timeout)
            .unwrap_or_else(|e| fail("commit", e));
    };
    while next.iter().any(|(part, o)| *o < highs[part]) {
        let Some(m) = c.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m.unwrap_or_else(|e| fail("read", e));
        next.insert(m.partition(), m.offset() + 1);
        let mut r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(output);
        if let Some(k) = m.key() {
            r = r.key(k);
        }
        if let Some(v) = m.payload() {
            r = r.payload(v);
        }
        if let Some(h) = m.headers() {
            r = r.headers(h.detach());
        }
        loop {
            match p.send(r) {
                Ok(()) => break,
                Err((e, back)) => {
                    if !matches!(
                        e,
                        rdkafka::error::KafkaError::MessageProduction(
                            rdkafka::types::RDKafkaErrorCode::QueueFull
                        )
                    ) {
                        fail("produce", e);
                    }
                    r = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        n += 1;
        in_txn += 1;
        if let Some(every) = every
            && in_txn >= every
        {
            commit(&next);
            p.begin_transaction().unwrap_or_else(|e| fail("begin", e));
            in_txn = 0;
        }
    }
    if every.is_some() {
        commit(&next);
    } else {
        p.flush(timeout).unwrap_or_else(|e| fail("flush", e));
    }
    println!("{n} {:.3}", started.elapsed().as_secs_f64());
}
