//! Start librdkafka's mock cluster with one topic (or more), print its
//! bootstrap servers, and keep it up until stdin closes.
//!
//! Usage: mock-broker TOPIC PARTITIONS [TOPIC PARTITIONS]...

use std::io::Read;

use rdkafka::mocking::MockCluster;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let pairs: Vec<(String, i32)> = args[1..]
        .chunks(2)
        .filter_map(|c| match c {
            [t, p] => p.parse::<i32>().ok().map(|p| (t.clone(), p)),
            _ => None,
        })
        .collect();
    if pairs.is_empty() || pairs.len() * 2 != args.len() - 1 {
        eprintln!("usage: mock-broker TOPIC PARTITIONS [TOPIC PARTITIONS]...");
        std::process::exit(2);
    }
    let cluster = match MockCluster::new(1) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mock cluster: {e}");
            std::process::exit(1);
        }
    };
    for (topic, parts) in &pairs {
        if let Err(e) = cluster.create_topic(topic, *parts, 1) {
            eprintln!("create topic {topic}: {e}");
            std::process::exit(1);
        }
    }
    println!("{}", cluster.bootstrap_servers());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}
