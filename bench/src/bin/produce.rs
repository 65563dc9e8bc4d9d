//! Produce N Maxwell company events (~200 bytes) over P partitions and
//! write the expected final table as JSON; or produce the lines of a file
//! (`-`: stdin), one record value per line, without keys.
//!
//! Usage: produce BOOTSTRAP TOPIC PARTITIONS N EXPECTED.json
//!        produce BOOTSTRAP TOPIC --lines FILE

use std::io::BufRead;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use sluice_bench::Events;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() == 5 && a[3] == "--lines" {
        produce_lines(&a[1], &a[2], &a[4]);
        return;
    }
    if a.len() != 6 {
        eprintln!(
            "usage: produce BOOTSTRAP TOPIC PARTITIONS N EXPECTED.json\n       produce BOOTSTRAP TOPIC --lines FILE   (FILE - = stdin; one record value per line)"
        );
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
        send(
            &p,
            BaseRecord::to(&a[2])
                .partition((id % parts) as i32)
                .key(&key)
                .payload(&value),
        );
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

/// Send each line of `file` (`-`: stdin) to `topic` as one record value
/// with no key (librdkafka's partitioner picks the partition), then flush.
fn produce_lines(bootstrap: &str, topic: &str, file: &str) {
    let input: Box<dyn BufRead> = if file == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        match std::fs::File::open(file) {
            Ok(f) => Box::new(std::io::BufReader::new(f)),
            Err(e) => {
                eprintln!("{file}: {e}");
                std::process::exit(1);
            }
        }
    };
    let p: BaseProducer = match ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("producer: {e}");
            std::process::exit(1);
        }
    };
    let mut n = 0u64;
    for line in input.lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{file}: {e}");
                std::process::exit(1);
            }
        };
        send(&p, BaseRecord::<(), _>::to(topic).payload(line.as_bytes()));
        n += 1;
    }
    if let Err(e) = p.flush(Duration::from_secs(60)) {
        eprintln!(
            "flush: {e} (is the broker at {bootstrap} running, and does topic {topic} exist?)"
        );
        std::process::exit(1);
    }
    eprintln!("produced {n} records to {topic}");
}

/// Queue `rec`, serving delivery reports while the local queue is full.
fn send<K: rdkafka::message::ToBytes + ?Sized, V: rdkafka::message::ToBytes + ?Sized>(
    p: &BaseProducer,
    mut rec: BaseRecord<'_, K, V>,
) {
    while let Err((_, r)) = p.send(rec) {
        p.poll(Duration::from_millis(20));
        rec = r;
    }
}
