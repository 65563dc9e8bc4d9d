//! The ceiling: read every record of a topic (all partitions, from offset
//! 0 to the high watermark at start) with a plain rdkafka consumer and
//! discard it. Prints `records seconds`.
//!
//! Usage: bare-consumer BOOTSTRAP TOPIC

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 3 {
        eprintln!("usage: bare-consumer BOOTSTRAP TOPIC");
        std::process::exit(2);
    }
    let started = Instant::now();
    let c: BaseConsumer = match ClientConfig::new()
        .set("bootstrap.servers", &a[1])
        .set("group.id", "bench-bare")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "100")
        // As the host sets it: librdkafka otherwise holds the first
        // metadata request back for up to 50 ms in some starts.
        .set("reconnect.backoff.ms", "10")
        // The host's read-ahead settings too (see host/src/source).
        .set("fetch.queue.backoff.ms", "10")
        .set("queued.max.messages.kbytes", "8192")
        .create()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("consumer: {e}");
            std::process::exit(1);
        }
    };
    let md = match c.fetch_metadata(Some(&a[2]), Duration::from_secs(10)) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("metadata: {e}");
            std::process::exit(1);
        }
    };
    let mut tpl = TopicPartitionList::new();
    let mut remaining = 0i64;
    let mut ends = std::collections::HashMap::new();
    for t in md.topics() {
        for p in t.partitions() {
            let (_, high) = c
                .fetch_watermarks(&a[2], p.id(), Duration::from_secs(10))
                .unwrap_or((0, 0));
            let _ = tpl.add_partition_offset(&a[2], p.id(), Offset::Offset(0));
            ends.insert(p.id(), high);
            remaining += high;
        }
    }
    let total = remaining;
    if c.assign(&tpl).is_err() {
        std::process::exit(1);
    }
    while remaining > 0 {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            use rdkafka::Message;
            std::hint::black_box(m.payload());
            remaining -= 1;
        }
        if started.elapsed() > Duration::from_secs(600) {
            eprintln!("timed out with {remaining} records left");
            std::process::exit(1);
        }
    }
    let read = started.elapsed();
    // Close as the host does (1 ms polls until librdkafka reports the close
    // done), so neither side pays rust-rdkafka's 100 ms close steps in Drop.
    if c.close_queue().is_ok() {
        while !c.closed() && started.elapsed() < Duration::from_secs(600) {
            let _ = c.poll(Duration::from_millis(1));
        }
    }
    println!("{total} {:.3}", read.as_secs_f64());
}
