//! Output to Kafka (`host run --output-topic`): a map-only pipeline's
//! outputs produced to a topic of an Apache Kafka broker, read back with
//! a consumer. At-least-once: everything arrives, a kill -9 after the
//! outputs were acknowledged and before the batch's commit entry produces
//! the batch again, and the duplicates carry the same idempotency key.
//! What is refused at start, and why.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::support::kafka::{Broker, BrokerProcess, producer};
use crate::support::{HostProcess, RunArgs, host, json_lines, stderr};

/// `host` with owned arguments.
pub(crate) fn host_run(args: &[String]) -> std::process::Output {
    host(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

const WAIT: Duration = Duration::from_secs(60);

/// One record read back from the output topic.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Produced {
    partition: i32,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Produced {
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_ref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

/// Every record of `topic` (`partitions` partitions), read up to the high
/// watermarks.
fn read_all(bootstrap: &str, topic: &str, partitions: i32) -> Vec<Produced> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "output-test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    let mut highs = BTreeMap::new();
    for p in 0..partitions {
        let (_, high) = c
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .expect("watermarks");
        highs.insert(p, high);
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("assign");
    }
    c.assign(&tpl).expect("assign");
    let mut next: BTreeMap<i32, i64> = (0..partitions).map(|p| (p, 0)).collect();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    while next.iter().any(|(p, o)| *o < highs[p]) {
        assert!(
            std::time::Instant::now() < deadline,
            "read {topic}: {next:?} of {highs:?}"
        );
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.expect("read");
        next.insert(m.partition(), m.offset() + 1);
        out.push(Produced {
            partition: m.partition(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers: m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default(),
        });
    }
    out
}

/// An Apache Kafka broker with topic `in` (3 partitions) holding `n` records
/// (key `k{i % 7}`, value `v{i}`, a header `h: {i}`; every 50th a
/// tombstone; every 10th also an upstream pipeline's
/// `sluice-idempotency-key`, which the output must replace) and an empty
/// topic `out` (2 partitions).
fn broker_with_input(n: usize) -> BrokerProcess {
    let broker = BrokerProcess::start();
    fill_input(&broker, n);
    broker
}

/// [`broker_with_input`]'s topics and records on `broker`.
pub(crate) fn fill_input(broker: &BrokerProcess, n: usize) {
    broker.create_topic("in", 3);
    broker.create_topic("out", 2);
    send_inputs(broker, 0..n);
}

/// Inputs `range` of [`fill_input`]'s shape, appended to topic `in`.
pub(crate) fn send_inputs(broker: &BrokerProcess, range: std::ops::Range<usize>) {
    let p = producer(&broker.bootstrap());
    for i in range {
        let value = format!("v{i}");
        let header = i.to_string();
        let upstream = format!("up/0/{i}");
        let mut headers = vec![("h", Some(header.as_bytes()))];
        if i % 10 == 0 {
            headers.insert(0, ("sluice-idempotency-key", Some(upstream.as_bytes())));
        }
        p.send(
            "in",
            (i % 3) as i32,
            Some(format!("k{}", i % 7).as_bytes()),
            (i % 50 != 49).then_some(value.as_bytes()),
            &headers,
        );
    }
    p.flush();
}

/// The input record each output came from, by its idempotency key
/// (`in/{partition}/{offset}`), with how often it arrived.
fn by_key(read: &[Produced]) -> BTreeMap<String, Vec<Produced>> {
    let mut m: BTreeMap<String, Vec<Produced>> = BTreeMap::new();
    for r in read {
        let key = r
            .header("sluice-idempotency-key")
            .unwrap_or_else(|| panic!("no idempotency key on {r:?}"));
        m.entry(key).or_default().push(r.clone());
    }
    m
}

/// Check that `read` holds every input of [`broker_with_input`] as the
/// passthrough map emits it (key, value or tombstone, the input's headers
/// then the idempotency key), each key on one partition.
fn assert_every_input_once_or_more(read: &[Produced], n: usize) {
    let keyed = by_key(read);
    assert_eq!(keyed.len(), n, "distinct inputs produced");
    let mut partition_of_key: BTreeMap<Vec<u8>, i32> = BTreeMap::new();
    // Input i went to partition i % 3 at offset i / 3.
    for i in 0..n {
        let id = format!("in/{}/{}", i % 3, i / 3);
        let copies = keyed
            .get(&id)
            .unwrap_or_else(|| panic!("the output of {id} is missing"));
        let first = &copies[0];
        for c in copies {
            assert_eq!(c, first, "copies of {id} differ");
        }
        assert_eq!(first.key.as_deref(), Some(format!("k{}", i % 7).as_bytes()));
        let value = format!("v{i}");
        assert_eq!(
            first.value.as_deref(),
            (i % 50 != 49).then_some(value.as_bytes()),
            "{id}"
        );
        assert_eq!(
            first.headers,
            vec![
                ("h".to_string(), Some(i.to_string().into_bytes())),
                (
                    "sluice-idempotency-key".to_string(),
                    Some(id.clone().into_bytes())
                ),
            ],
            "{id}"
        );
        let p = *partition_of_key
            .entry(first.key.clone().unwrap_or_default())
            .or_insert(first.partition);
        assert_eq!(p, first.partition, "key of {id} on two partitions");
        assert_eq!(
            sluice_host::output::partition_of_key(first.key.as_deref(), 2),
            Some(first.partition),
            "{id}: not where a Java client (and host test) puts its key"
        );
    }
    assert!(
        partition_of_key.values().collect::<BTreeSet<_>>().len() > 1,
        "7 keys all on one of 2 partitions: not partitioned by key? {partition_of_key:?}"
    );
}

fn run_args(broker: &BrokerProcess, ckpt: &std::path::Path) -> RunArgs {
    RunArgs::new(&broker.bootstrap(), &["in"], ckpt)
        .plugin("passthrough")
        .args([
            "--output-topic",
            "out",
            "--output-guarantee",
            "at-least-once",
            "--until-caught-up",
            "--progress",
            "json",
            "--max-records-per-partition",
            "100",
        ])
}

#[test]
fn a_map_only_pipeline_produces_each_output_with_its_idempotency_key() {
    let n = 600;
    let broker = broker_with_input(n);
    let dir = tempfile::tempdir().unwrap();
    let out = host_run(&run_args(&broker, &dir.path().join("ck")).build());
    assert!(out.status.success(), "{}", stderr(&out));
    let produced: u64 = json_lines(&out)
        .iter()
        .map(|e| e["counts"]["produced"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(produced, n as u64, "{}", stderr(&out));
    let read = read_all(&broker.bootstrap(), "out", 2);
    assert_eq!(read.len(), n, "no crash, no duplicate");
    // Started again without --output-topic, the outputs would be
    // discarded from here on: refused, naming the topic.
    let again: Vec<String> = run_args(&broker, &dir.path().join("ck"))
        .build()
        .into_iter()
        .filter(|a| {
            ![
                "--output-topic",
                "out",
                "--output-guarantee",
                "at-least-once",
            ]
            .contains(&a.as_str())
        })
        .collect();
    let out = host_run(&again);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("produced its outputs to out on")
            && stderr(&out).contains("would be counted and discarded"),
        "{}",
        stderr(&out)
    );
    assert_every_input_once_or_more(&read, n);
    // Order within an output partition follows the inputs' order per
    // input partition.
    for p in 0..2 {
        let mut last: BTreeMap<String, i64> = BTreeMap::new();
        for r in read.iter().filter(|r| r.partition == p) {
            let id = r.header("sluice-idempotency-key").unwrap();
            let (tp, off) = id.rsplit_once('/').unwrap();
            let off: i64 = off.parse().unwrap();
            let prev = last.insert(tp.to_string(), off);
            assert!(prev.is_none_or(|x| x < off), "{id} after {prev:?}");
        }
    }
}

#[test]
fn a_kill_after_the_outputs_and_before_the_commit_produces_that_batch_again_under_one_key_each() {
    let n = 600;
    let broker = broker_with_input(n);
    let dir = tempfile::tempdir().unwrap();
    // Batch 1 (the second: 100 records of each partition) is produced and
    // acknowledged, then the host dies before writing its commit entry.
    // A 20 s linger keeps outputs in the producer until something flushes
    // them: only the flush before the commit has sent them at the kill.
    let args = run_args(&broker, &dir.path().join("ck"))
        .args(["--config", "output.kafka.linger.ms=20000"])
        .build();
    let mut paused = HostProcess::spawn(&args, &[("SLUICE_FAILPOINT", "engine:before-commit@2")]);
    paused.wait_for("FAILPOINT", WAIT);
    paused.kill();
    let before = read_all(&broker.bootstrap(), "out", 2);
    assert_eq!(
        before.len(),
        600,
        "two batches of 300 produced before the kill"
    );

    // The batch is re-run only where its outputs went.
    let elsewhere: Vec<String> = args
        .iter()
        .take_while(|a| *a != "--output-topic")
        .cloned()
        .chain(["--until-caught-up".to_string()])
        .collect();
    let out = host_run(&elsewhere);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("batch 1 produced its outputs to out on")
            && stderr(&out).contains("this run's outputs go to nowhere"),
        "{}",
        stderr(&out)
    );

    let out = host_run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let events = json_lines(&out);
    assert_eq!(events[0]["rerun"], true, "{events:?}");
    let read = read_all(&broker.bootstrap(), "out", 2);
    assert_every_input_once_or_more(&read, n);
    // Exactly the re-run batch (inputs 300..600 by offset: offsets 100..200
    // of each partition) came twice; nothing else.
    let twice: Vec<String> = by_key(&read)
        .into_iter()
        .filter(|(_, c)| c.len() > 1)
        .map(|(k, c)| {
            assert_eq!(c.len(), 2, "{k}");
            k
        })
        .collect();
    assert_eq!(twice.len(), 300, "{twice:?}");
    assert!(
        twice.iter().all(|k| {
            let off: i64 = k.rsplit_once('/').unwrap().1.parse().unwrap();
            (100..200).contains(&off)
        }),
        "{twice:?}"
    );
}

#[test]
fn what_the_output_flags_refuse_and_why() {
    let broker = broker_with_input(10);
    let dir = tempfile::tempdir().unwrap();
    let base = RunArgs::new(&broker.bootstrap(), &["in"], &dir.path().join("ck"))
        .plugin("passthrough")
        .args(["--until-caught-up"]);

    // Exactly once (the default) on brokers that accept transactions but
    // keep no offsets committed in one (librdkafka's mock cluster): the
    // probe at start refuses, naming the flag, before anything is read.
    let mock = crate::support::kafka::Mock::new();
    mock.create_topic("in", 3);
    mock.create_topic("out", 2);
    let on_mock = RunArgs::new(&mock.bootstrap(), &["in"], &dir.path().join("ck"))
        .plugin("passthrough")
        .args(["--until-caught-up", "--output-topic", "out"]);
    let out = host_run(&on_mock.clone().build());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("exactly once to out on")
            && err.contains("kept no offset committed in a transaction")
            && err.contains("--output-guarantee at-least-once"),
        "{err}"
    );
    assert!(
        !dir.path().join("ck").exists(),
        "a refused start leaves no checkpoint"
    );
    // At-least-once runs there.
    let out = host_run(
        &on_mock
            .clone()
            .args(["--output-guarantee", "at-least-once"])
            .build(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::remove_dir_all(dir.path().join("ck")).unwrap();

    // A pipeline group there: refused the same way.
    let db = crate::support::Db::sqlite();
    let mut grouped = on_mock
        .clone()
        .args(["--group", "g", "--sink-db", &db.url])
        .build();
    let at = grouped.iter().position(|a| a == "--checkpoint").unwrap();
    grouped.drain(at..at + 2);
    let out = host_run(&grouped);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("kept no offset committed in a transaction")
            && err.contains("--output-guarantee at-least-once"),
        "{err}"
    );

    // Brokers that refuse this client transactional ids (no ACL for
    // them): a clear error at start, naming the ACL and the flag.
    let acls = BrokerProcess::with_acls();
    acls.create_topic("in", 1);
    acls.create_topic("out", 1);
    acls.deny_transactional_ids("sluice-");
    let out = host_run(
        &RunArgs::new(&acls.bootstrap(), &["in"], &dir.path().join("ck"))
            .plugin("passthrough")
            .args(["--until-caught-up", "--output-topic", "out"])
            .build(),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("needs Kafka transactions, which the brokers refuse")
            && err.contains("TransactionalId")
            && err.contains("--output-guarantee at-least-once"),
        "{err}"
    );
    assert!(
        !dir.path().join("ck").exists(),
        "a refused start leaves no checkpoint"
    );

    // Exactly once with a sink database (dead letters, progress rows):
    // the database would commit a part before the Kafka transaction.
    let out = host_run(
        &base
            .clone()
            .args(["--output-topic", "out", "--sink-db", &db.url])
            .build(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("exactly once cannot cover both yet"),
        "{}",
        stderr(&out)
    );

    // A topic that is not there.
    let out = host_run(
        &base
            .clone()
            .args([
                "--output-topic",
                "nowhere",
                "--output-guarantee",
                "at-least-once",
            ])
            .build(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("output topic nowhere does not exist on"),
        "{}",
        stderr(&out)
    );
    assert!(
        !dir.path().join("ck").exists(),
        "checked before the checkpoint is made"
    );

    // A sink stage receives the map's outputs itself; it may send to the
    // topic only when it was built with the kafka capability (contract
    // 0.2.4), which a 0.2.0 plugin lacks.
    let sink = RunArgs::new(&broker.bootstrap(), &["in"], &dir.path().join("ck2"))
        .plugin("old_contract")
        .args([
            "--sink-db",
            &format!("sqlite:{}", dir.path().join("s.db").display()),
        ])
        .args([
            "--output-topic",
            "out",
            "--output-guarantee",
            "at-least-once",
        ]);
    let out = host_run(&sink.build());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("does not import sluice:plugin/kafka"),
        "{}",
        stderr(&out)
    );

    // The other output flags without --output-topic, and a bad name.
    for flags in [
        vec!["--output-guarantee", "at-least-once"],
        vec!["--output-brokers", "127.0.0.1:1"],
        vec!["--config", "output.kafka.linger.ms=1"],
        vec!["--output-topic", "no spaces"],
    ] {
        let out = host_run(&base.clone().args(flags.clone()).build());
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", stderr(&out));
    }
    assert_eq!(read_all(&broker.bootstrap(), "out", 2).len(), 0);
}
