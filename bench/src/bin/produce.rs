//! Produce N Maxwell company events (~200 bytes) over P partitions and
//! write the expected final table as JSON.
//!
//! Usage: produce BOOTSTRAP TOPIC PARTITIONS N EXPECTED.json

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use sluice_bench::Events;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 6 {
        eprintln!("usage: produce BOOTSTRAP TOPIC PARTITIONS N EXPECTED.json");
        std::process::exit(2);
    }
    let parts: u64 = a[3].parse().unwrap_or(1);
    let n: u64 = a[4].parse().unwrap_or(0);
    let p: BaseProducer = match ClientConfig::new()
        .set("bootstrap.servers", &a[1])
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("producer: {e}");
            std::process::exit(1);
        }
    };
    let mut ev = Events::new();
    let mut bytes = 0usize;
    for _ in 0..n {
        let (id, key, value) = ev.next_event(5000);
        bytes += value.len();
        let mut rec = BaseRecord::to(&a[2])
            .partition((id % parts) as i32)
            .key(&key)
            .payload(&value);
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((_, r)) => {
                    p.poll(Duration::from_millis(20));
                    rec = r;
                }
            }
        }
        p.poll(Duration::ZERO);
    }
    if let Err(e) = p.flush(Duration::from_secs(120)) {
        eprintln!("flush: {e}");
        std::process::exit(1);
    }
    let json = serde_json::to_string(&ev.expected).unwrap_or_default();
    if let Err(e) = std::fs::write(&a[5], json) {
        eprintln!("{}: {e}", a[5]);
        std::process::exit(1);
    }
    eprintln!(
        "produced {n} events, {} bytes per value on average",
        bytes / n.max(1) as usize
    );
}
