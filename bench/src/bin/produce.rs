//! Produce N Maxwell company events (~200 bytes) over P partitions and
//! write the expected final table as JSON; or produce the lines of a file
//! (`-`: stdin), one record value per line, without keys, round-robin
//! over the partitions; or one record per line of a file of record
//! objects, as `host test --format records` reads them (`{"key": …, "value": …, "partition": N}`: a JSON string is
//! its text, any other JSON value its exact source text, `null` or a
//! missing field none, so `"value": null` is a tombstone).
//!
//! Usage: produce BOOTSTRAP TOPIC PARTITIONS N EXPECTED.json
//!        produce BOOTSTRAP TOPIC --lines FILE
//!        produce BOOTSTRAP TOPIC --records FILE
//!        produce --help

use std::io::BufRead;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext};
use sluice_bench::Events;

/// Counts failed deliveries and keeps the first error.
#[derive(Default)]
struct Deliveries {
    failed: AtomicU64,
    first: Mutex<Option<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed.fetch_add(1, Ordering::Relaxed);
            let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert_with(|| e.to_string());
        }
    }
}

type Prod = BaseProducer<Deliveries>;

/// A producer to `bootstrap` that has checked `topic` exists (so records
/// are not queued for a topic the broker will never take), and the
/// topic's partition count; exits 1 with what to do otherwise.
fn connect(bootstrap: &str, topic: &str, settings: &[(&str, &str)]) -> (Prod, u32) {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap);
    for (k, v) in settings {
        cfg.set(*k, *v);
    }
    let p: Prod = match cfg.create_with_context(Deliveries::default()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("producer: {e}");
            std::process::exit(1);
        }
    };
    match p
        .client()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
    {
        Err(e) => {
            eprintln!("broker {bootstrap}: {e} (is the broker running and reachable?)");
            std::process::exit(1);
        }
        Ok(md) => {
            let partitions = md
                .topics()
                .iter()
                .find(|t| t.name() == topic && t.error().is_none())
                .map_or(0, |t| t.partitions().len() as u32);
            if partitions == 0 {
                eprintln!(
                    "topic `{topic}` does not exist on {bootstrap}: create it first (with Tansu: tansu topic create {topic} --broker tcp://{bootstrap} --partitions 3)"
                );
                std::process::exit(1);
            }
            (p, partitions)
        }
    }
}

/// Flush, then exit 1 if any record was not delivered.
fn finish(p: &Prod, bootstrap: &str, topic: &str, timeout: Duration) {
    if let Err(e) = p.flush(timeout) {
        eprintln!("flush: {e} (is the broker at {bootstrap} running?)");
        std::process::exit(1);
    }
    let failed = p.context().failed.load(Ordering::Relaxed);
    if failed > 0 {
        let first = p
            .context()
            .first
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default();
        eprintln!("{failed} records were not delivered to {topic}: {first}");
        std::process::exit(1);
    }
}

/// Fill a Kafka topic with test data: generated Maxwell company events
/// (with the expected final table written as JSON), the lines of a file,
/// or the record objects `host test --format records` reads.
#[derive(Debug, Parser)]
#[command(
    name = "produce",
    version,
    max_term_width = 100,
    after_help = "Examples:\n  produce 127.0.0.1:9092 maxwell 3 1000 /tmp/expected.json\n  produce 127.0.0.1:9092 raw --lines sample.txt\n  produce 127.0.0.1:9092 raw --records events.jsonl"
)]
struct Args {
    /// Kafka bootstrap servers, HOST:PORT[,HOST:PORT…].
    bootstrap: String,
    /// The topic (it must exist).
    topic: String,
    /// Generated events: PARTITIONS N EXPECTED.json — N Maxwell company
    /// events (~200 bytes) over partitions 0..PARTITIONS, by company id,
    /// and the final table they imply written to EXPECTED.json.
    #[arg(
        value_names = ["PARTITIONS", "N", "EXPECTED"],
        num_args = 3,
        required_unless_present_any = ["lines", "records"],
        conflicts_with_all = ["lines", "records"]
    )]
    generate: Vec<String>,
    /// One record value per line of FILE (`-`: stdin), no key; spread
    /// round-robin over the topic's partitions (line i goes to partition
    /// i mod the partition count).
    #[arg(long, value_name = "FILE", conflicts_with = "records")]
    lines: Option<String>,
    /// One record object per line of FILE (`-`: stdin):
    /// {"key":…,"value":…,"partition":N}; a JSON string is its text, any
    /// other JSON value its source text, null or missing none (a null
    /// value is a tombstone); with no partition, librdkafka's partitioner
    /// places the record by its key.
    #[arg(long, value_name = "FILE")]
    records: Option<String>,
}

fn main() {
    let a = Args::parse();
    if let Some(file) = &a.lines {
        produce_lines(&a.bootstrap, &a.topic, file, false);
        return;
    }
    if let Some(file) = &a.records {
        produce_lines(&a.bootstrap, &a.topic, file, true);
        return;
    }
    let [parts, n, expected] = a.generate.as_slice() else {
        eprintln!(
            "produce: PARTITIONS N EXPECTED.json, --lines FILE or --records FILE is needed (see --help)"
        );
        std::process::exit(2);
    };
    let number = |what: &str, v: &str| -> u64 {
        match v.parse::<u64>() {
            Ok(n) if n > 0 || what == "N" => n,
            _ => {
                eprintln!("produce: {what} `{v}` is not a positive whole number");
                std::process::exit(2);
            }
        }
    };
    let parts = number("PARTITIONS", parts);
    let n = number("N", n);
    let (p, _) = connect(
        &a.bootstrap,
        &a.topic,
        &[
            ("linger.ms", "20"),
            ("batch.num.messages", "10000"),
            ("queue.buffering.max.messages", "1000000"),
        ],
    );
    let mut ev = Events::new();
    let mut bytes = 0usize;
    // BENCH_COMPANIES: how many company ids the events cycle through
    // (5,000 by default: each key changes ~200 times in 1M events; as
    // many as events: every event inserts a new key, nothing to fold).
    let companies: u64 = std::env::var("BENCH_COMPANIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    for _ in 0..n {
        let (id, key, value) = ev.next_event(companies);
        bytes += value.len();
        send(
            &p,
            BaseRecord::to(&a.topic)
                .partition((id % parts) as i32)
                .key(&key)
                .payload(&value),
        );
        p.poll(Duration::ZERO);
    }
    finish(&p, &a.bootstrap, &a.topic, Duration::from_secs(120));
    let json = serde_json::to_string(&ev.expected).unwrap_or_default();
    if let Err(e) = std::fs::write(expected, json) {
        eprintln!("{expected}: {e}");
        std::process::exit(1);
    }
    eprintln!(
        "produced {n} events, {} bytes per value on average",
        bytes / n.max(1) as usize
    );
}

/// Send each line of `file` (`-`: stdin) to `topic`: as one record value
/// with no key, round-robin over the partitions (librdkafka's sticky
/// partitioner would put a whole file into one partition), or, with
/// `records`, as the record the line's object describes; then flush.
fn produce_lines(bootstrap: &str, topic: &str, file: &str, records: bool) {
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
    let (p, partitions) = connect(bootstrap, topic, &[]);
    let mut n = 0u64;
    for line in input.lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{file}: {e}");
                std::process::exit(1);
            }
        };
        if !records {
            let partition = (n % u64::from(partitions)) as i32;
            send(
                &p,
                BaseRecord::<(), _>::to(topic)
                    .partition(partition)
                    .payload(line.as_bytes()),
            );
            n += 1;
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        let Some((partition, key, value)) = record(&line) else {
            eprintln!(
                "{file}: line {}: not a record object ({{\"key\":…,\"value\":…,\"partition\":N}}): {line}",
                n + 1
            );
            std::process::exit(2);
        };
        let mut rec = BaseRecord::<[u8], [u8]>::to(topic);
        if let Some(k) = &key {
            rec = rec.key(k.as_slice());
        }
        if let Some(v) = &value {
            rec = rec.payload(v.as_slice());
        }
        if let Some(part) = partition {
            rec = rec.partition(part);
        }
        send(&p, rec);
        n += 1;
    }
    finish(&p, bootstrap, topic, Duration::from_secs(60));
    eprintln!("produced {n} records to {topic}");
}

/// A record object's partition, key and value bytes (`None`: not an
/// object of those fields).
type Parts = (Option<i32>, Option<Vec<u8>>, Option<Vec<u8>>);

fn record(line: &str) -> Option<Parts> {
    let obj: std::collections::BTreeMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_str(line).ok()?;
    if obj
        .keys()
        .any(|k| !["key", "value", "partition"].contains(&k.as_str()))
    {
        return None;
    }
    let bytes = |name: &str| -> Option<Vec<u8>> {
        let raw = obj.get(name)?.get();
        if raw == "null" {
            return None;
        }
        Some(match serde_json::from_str::<String>(raw) {
            Ok(text) => text.into_bytes(),
            Err(_) => raw.as_bytes().to_vec(),
        })
    };
    let partition = match obj.get("partition") {
        Some(p) => Some(p.get().parse::<i32>().ok()?),
        None => None,
    };
    Some((partition, bytes("key"), bytes("value")))
}

/// Queue `rec`, serving delivery reports while the local queue is full.
fn send<K: rdkafka::message::ToBytes + ?Sized, V: rdkafka::message::ToBytes + ?Sized>(
    p: &Prod,
    mut rec: BaseRecord<'_, K, V>,
) {
    while let Err((_, r)) = p.send(rec) {
        p.poll(Duration::from_millis(20));
        rec = r;
    }
}
