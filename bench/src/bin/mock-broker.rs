//! Start librdkafka's mock cluster with one topic, print its bootstrap
//! servers, and keep it up until stdin closes.
//!
//! Usage: mock-broker TOPIC PARTITIONS

use std::io::Read;

use rdkafka::mocking::MockCluster;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(topic), Some(parts)) = (args.get(1), args.get(2).and_then(|p| p.parse::<i32>().ok()))
    else {
        eprintln!("usage: mock-broker TOPIC PARTITIONS");
        std::process::exit(2);
    };
    let cluster = match MockCluster::new(1) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mock cluster: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = cluster.create_topic(topic, parts, 1) {
        eprintln!("create topic: {e}");
        std::process::exit(1);
    }
    println!("{}", cluster.bootstrap_servers());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}
