//! The baseline for pipeline-group hand-overs: a plain rdkafka consumer in
//! a consumer group (classic protocol, cooperative-sticky, as `host run
//! --group` joins), that prints one JSON line per partition when it reads
//! its first record after being assigned it:
//! `{"partition":P,"first_ms":MS}` (ms since the Unix epoch). It leaves the
//! group (close) when stdin closes; kill it for a crash.
//!
//! Usage: group-consumer BOOTSTRAP TOPIC GROUP SESSION_TIMEOUT_MS

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 5 {
        eprintln!("usage: group-consumer BOOTSTRAP TOPIC GROUP SESSION_TIMEOUT_MS");
        std::process::exit(2);
    }
    let c: BaseConsumer = match ClientConfig::new()
        .set("bootstrap.servers", &a[1])
        .set("group.id", &a[3])
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", &a[4])
        .set("heartbeat.interval.ms", "500")
        .set("enable.auto.commit", "true")
        .set("auto.offset.reset", "earliest")
        .create()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("consumer: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = c.subscribe(&[&a[2]]) {
        eprintln!("subscribe: {e}");
        std::process::exit(1);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        s.store(true, Ordering::Relaxed);
    });
    let mut seen: BTreeSet<i32> = BTreeSet::new();
    while !stop.load(Ordering::Relaxed) {
        match c.poll(Duration::from_millis(50)) {
            Some(Ok(m)) if seen.insert(m.partition()) => {
                println!(
                    "{{\"partition\":{},\"first_ms\":{}}}",
                    m.partition(),
                    now_ms()
                );
                let _ = std::io::stdout().flush();
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => eprintln!("poll: {e}"),
            None => {}
        }
        // A partition taken away and given back counts again.
        if let Ok(held) = c.assignment() {
            let now: BTreeSet<i32> = held.elements().iter().map(|e| e.partition()).collect();
            seen.retain(|p| now.contains(p));
        }
    }
    drop(c);
}
