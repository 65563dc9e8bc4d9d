//! Kafka brokers for tests: librdkafka's in-process mock cluster (fast,
//! fault injection, no transactions kept) and Apache Kafka itself
//! ([`BrokerProcess`]: KRaft brokers started per test from the jars that
//! scripts/kafka.sh fetches from Maven Central), plus a producer helper.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use rdkafka::types::RDKafkaErrorCode;

/// Something that speaks the Kafka protocol.
pub trait Broker {
    /// bootstrap.servers
    fn bootstrap(&self) -> String;
    /// Create a topic with `partitions` partitions.
    fn create_topic(&self, name: &str, partitions: i32);
}

/// librdkafka's mock cluster, in this process.
pub struct Mock {
    pub cluster: MockCluster<'static, DefaultProducerContext>,
}

impl Mock {
    pub fn new() -> Mock {
        Mock {
            cluster: MockCluster::new(1).expect("mock cluster"),
        }
    }
}

impl Broker for Mock {
    fn bootstrap(&self) -> String {
        self.cluster.bootstrap_servers()
    }
    fn create_topic(&self, name: &str, partitions: i32) {
        self.cluster
            .create_topic(name, partitions, 1)
            .expect("create topic");
    }
}

/// The Kafka version the suite runs: servers/kafka/pom.xml pins it.
pub const KAFKA_VERSION: &str = "4.4.0";

/// The directory of Kafka's jars: `SLUICE_KAFKA_LIB`, else where
/// scripts/kafka.sh fetches them (`$SLUICE_TOOLS/kafka-4.4.0/lib`,
/// `SLUICE_TOOLS` defaulting to `~/.cache/sluice-tools`).
fn kafka_lib() -> PathBuf {
    let lib = std::env::var_os("SLUICE_KAFKA_LIB")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let tools = std::env::var_os("SLUICE_TOOLS")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var("HOME").unwrap_or_default())
                        .join(".cache/sluice-tools")
                });
            tools.join(format!("kafka-{KAFKA_VERSION}")).join("lib")
        });
    assert!(
        lib.join(format!("kafka_2.13-{KAFKA_VERSION}.jar")).exists(),
        "Apache Kafka {KAFKA_VERSION} is missing from {}: `bash scripts/kafka.sh fetch` \
         (scripts/test.sh runs it) fetches it from Maven Central, or set SLUICE_KAFKA_LIB",
        lib.display()
    );
    lib
}

/// The repository's servers/kafka directory (log4j2.properties).
fn kafka_conf() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../servers/kafka")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `java` with Kafka's classpath and logging configuration: the broker's
/// heap is kept small (tests move kilobytes) and the JIT to its first
/// tier, which starts a broker about a second sooner on 2 cores.
fn java(lib: &std::path::Path, main: &str) -> Command {
    let mut cmd = Command::new("java");
    cmd.args([
        "-Xms128m",
        "-Xmx512m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-Djava.awt.headless=true",
    ])
    .arg(format!(
        "-Dlog4j2.configurationFile={}",
        kafka_conf().join("log4j2.properties").display()
    ))
    .arg("-cp")
    .arg(format!("{}/*", lib.display()))
    .arg(main);
    cmd
}

/// One KRaft node of a [`BrokerProcess`]: broker and controller in one
/// process.
struct Node {
    id: u32,
    port: u16,
    controller_port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// Apache Kafka, started for one test: one KRaft node (broker and
/// controller in one process) or three (replication factor 3,
/// `min.insync.replicas=2`, a controller quorum of three), each on free
/// ports of 127.0.0.1 with its log dirs in a temp dir. Dropping it kills
/// every node.
///
/// Settings that differ from Kafka's defaults, for tests: topics are not
/// created on first use (`auto.create.topics.enable=false`, as on most
/// production clusters: a test creates its topics); the group
/// coordinator starts a rebalance at once and accepts session timeouts
/// from 1 s, for both protocols (classic and KIP-848 `consumer`); the
/// internal topics have 4 partitions; a node that stops heartbeating is
/// fenced by the controller after 3 s (default 9 s), so a killed leader's
/// partitions move sooner.
pub struct BrokerProcess {
    nodes: Vec<Node>,
    lib: PathBuf,
    _dir: tempfile::TempDir,
}

impl BrokerProcess {
    /// One broker.
    pub fn start() -> BrokerProcess {
        BrokerProcess::with_nodes(1, "")
    }

    /// One broker that checks ACLs (KRaft's `StandardAuthorizer`; every
    /// resource without an ACL stays open to everyone), for tests of what
    /// a client that is refused something sees.
    pub fn with_acls() -> BrokerProcess {
        BrokerProcess::with_nodes(
            1,
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n\
             allow.everyone.if.no.acl.found=true\n",
        )
    }

    /// Deny this suite's clients (the `ANONYMOUS` principal of a
    /// PLAINTEXT listener) every transactional id that starts with
    /// `prefix` (Kafka's `kafka-acls --deny-principal`), as a cluster that
    /// grants no TransactionalId ACL would.
    pub fn deny_transactional_ids(&self, prefix: &str) {
        let out = java(&self.lib, "org.apache.kafka.tools.AclCommand")
            .args([
                "--bootstrap-server",
                &self.bootstrap(),
                "--add",
                "--deny-principal",
                "User:ANONYMOUS",
                "--operation",
                "All",
                "--transactional-id",
                prefix,
                "--resource-pattern-type",
                "prefixed",
            ])
            .output()
            .expect("run java (Kafka's AclCommand)");
        assert!(
            out.status.success(),
            "kafka-acls: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Three brokers: every topic replicated three times, writes need
    /// two in-sync replicas (`acks=all`, which transactional and
    /// idempotent producers use).
    pub fn cluster() -> BrokerProcess {
        BrokerProcess::with_nodes(3, "")
    }

    /// `n` nodes with `extra` (`key=value` lines) added to each node's
    /// properties.
    fn with_nodes(n: u32, extra: &str) -> BrokerProcess {
        let lib = kafka_lib();
        let dir = tempfile::tempdir().unwrap();
        let mut nodes: Vec<Node> = (1..=n)
            .map(|id| Node {
                id,
                port: free_port(),
                controller_port: free_port(),
                dir: dir.path().join(format!("node{id}")),
                child: None,
            })
            .collect();
        let voters = nodes
            .iter()
            .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port))
            .collect::<Vec<_>>()
            .join(",");
        let rf = n.min(3);
        let isr = if n >= 3 { 2 } else { 1 };
        let cluster_id = cluster_id();
        for node in &nodes {
            std::fs::create_dir_all(&node.dir).unwrap();
            let props = format!(
                "process.roles=broker,controller\n\
                 node.id={id}\n\
                 controller.quorum.voters={voters}\n\
                 listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}\n\
                 advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
                 controller.listener.names=CONTROLLER\n\
                 inter.broker.listener.name=PLAINTEXT\n\
                 listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n\
                 log.dirs={logs}\n\
                 auto.create.topics.enable=false\n\
                 num.partitions=1\n\
                 default.replication.factor={rf}\n\
                 min.insync.replicas={isr}\n\
                 offsets.topic.replication.factor={rf}\n\
                 offsets.topic.num.partitions=4\n\
                 transaction.state.log.replication.factor={rf}\n\
                 transaction.state.log.min.isr={isr}\n\
                 transaction.state.log.num.partitions=4\n\
                 share.coordinator.state.topic.replication.factor={rf}\n\
                 share.coordinator.state.topic.min.isr={isr}\n\
                 group.initial.rebalance.delay.ms=0\n\
                 group.min.session.timeout.ms=1000\n\
                 group.consumer.min.session.timeout.ms=1000\n\
                 group.consumer.session.timeout.ms=6000\n\
                 group.consumer.min.heartbeat.interval.ms=500\n\
                 group.consumer.heartbeat.interval.ms=500\n\
                 broker.heartbeat.interval.ms=500\n\
                 broker.session.timeout.ms=3000\n\
                 {extra}",
                id = node.id,
                port = node.port,
                cport = node.controller_port,
                logs = node.dir.join("data").display(),
            );
            std::fs::write(node.dir.join("server.properties"), props).unwrap();
            let out = java(&lib, "kafka.tools.StorageTool")
                .args(["format", "--ignore-formatted", "-t", &cluster_id, "-c"])
                .arg(node.dir.join("server.properties"))
                .output()
                .expect("run java (Kafka's StorageTool)");
            assert!(
                out.status.success(),
                "kafka-storage format: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for node in &mut nodes {
            node.child = Some(spawn_node(&lib, node));
        }
        let broker = BrokerProcess {
            nodes,
            lib,
            _dir: dir,
        };
        for node in &broker.nodes {
            broker.wait_listening(node);
        }
        broker.wait_for_brokers(n as usize);
        broker
    }

    fn node(&self, id: u32) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    fn wait_listening(&self, node: &Node) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", node.port)).is_err() {
            if Instant::now() > deadline {
                panic!(
                    "Kafka node {} did not listen on {} within 60 s; its log:\n{}",
                    node.id,
                    node.port,
                    std::fs::read_to_string(node.dir.join("broker.log")).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Wait until the cluster's metadata lists `n` live brokers.
    fn wait_for_brokers(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .expect("metadata client");
        loop {
            if let Ok(m) = c.fetch_metadata(None, Duration::from_secs(5))
                && m.brokers().len() >= n
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Kafka cluster did not list {n} brokers within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kill every node (SIGKILL), for outage tests.
    pub fn kill(&mut self) {
        for node in &mut self.nodes {
            kill_node(node);
        }
    }

    /// Start every node again on the same ports and log dirs, and wait
    /// until all of them are back.
    pub fn restart(&mut self) {
        for node in &mut self.nodes {
            if node.child.is_none() {
                node.child = Some(spawn_node(&self.lib, node));
            }
        }
        for node in &self.nodes {
            self.wait_listening(node);
        }
        self.wait_for_brokers(self.nodes.len());
    }

    /// Kill node `id` (SIGKILL): no controlled shutdown, its leaderships
    /// move when the controller fences it.
    pub fn kill_node(&mut self, id: u32) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"));
        kill_node(node);
    }

    /// Stop node `id` the way an operator does (SIGTERM: a controlled
    /// shutdown that hands its leaderships over first), waiting at most
    /// 60 s for it to exit.
    pub fn stop_node(&mut self, id: u32) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"));
        if let Some(mut child) = node.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(60);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("Kafka node {id} did not stop within 60 s of SIGTERM");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Start node `id` again and wait until the cluster lists all nodes.
    pub fn restart_node(&mut self, id: u32) {
        let lib = self.lib.clone();
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"));
        if node.child.is_none() {
            node.child = Some(spawn_node(&lib, node));
        }
        self.wait_listening(self.node(id));
        self.wait_for_brokers(self.nodes.len());
        self.wait_in_sync();
    }

    /// Wait (at most 120 s) until every partition of every topic, the
    /// internal ones included, has all nodes in its in-sync replicas: a
    /// rolling restart stops the next broker only then.
    fn wait_in_sync(&self) {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .expect("metadata client");
        let n = self.nodes.len();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let lagging: Vec<String> = match c.fetch_metadata(None, Duration::from_secs(10)) {
                Ok(m) => m
                    .topics()
                    .iter()
                    .flat_map(|t| {
                        t.partitions()
                            .iter()
                            .filter(|p| p.isr().len() < n)
                            .map(|p| format!("{}/{}", t.name(), p.id()))
                    })
                    .collect(),
                Err(e) => vec![e.to_string()],
            };
            if lagging.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not all replicas in sync within 120 s: {lagging:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What Kafka's own tool says of consumer group `group`
    /// (`kafka-consumer-groups --describe --state`): its coordinator,
    /// assignment strategy (a consumer-protocol group shows the brokers'
    /// assignor), state and member count.
    pub fn describe_group(&self, group: &str) -> String {
        let out = java(
            &self.lib,
            "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
        )
        .args([
            "--bootstrap-server",
            &self.bootstrap(),
            "--describe",
            "--group",
            group,
            "--state",
        ])
        .output()
        .expect("run java (Kafka's ConsumerGroupCommand)");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// The node ids, in order.
    pub fn node_ids(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// The node that leads `topic`'s `partition` now.
    pub fn leader_of(&self, topic: &str, partition: i32) -> u32 {
        let (id, _) = leader(&self.bootstrap(), topic, partition);
        u32::try_from(id).unwrap_or_else(|_| panic!("{topic}/{partition} has no leader"))
    }

    fn admin(&self) -> AdminClient<DefaultClientContext> {
        ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .expect("admin client")
    }

    /// Delete `topic` (DeleteTopics) and wait until the metadata no
    /// longer lists it.
    pub fn delete_topic(&self, topic: &str) {
        let results = block_on(
            self.admin()
                .delete_topics(&[topic], &AdminOptions::new().operation_timeout(Some(WAIT))),
        )
        .expect("delete topics");
        for r in results {
            r.unwrap_or_else(|(t, e)| panic!("delete topic {t}: {e}"));
        }
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .expect("metadata client");
        let deadline = Instant::now() + WAIT;
        while c
            .fetch_metadata(None, Duration::from_secs(5))
            .map(|m| m.topics().iter().any(|t| t.name() == topic))
            .unwrap_or(true)
        {
            assert!(Instant::now() < deadline, "{topic} is still listed");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Give `topic` `partitions` partitions in all (CreatePartitions,
    /// KIP-195); clients see them at their next metadata request.
    pub fn create_partitions(&self, topic: &str, partitions: usize) {
        let results = block_on(self.admin().create_partitions(
            &[NewPartitions::new(topic, partitions)],
            &AdminOptions::new().operation_timeout(Some(WAIT)),
        ))
        .expect("create partitions");
        for r in results {
            r.unwrap_or_else(|(t, e)| panic!("create partitions of {t}: {e}"));
        }
    }
}

/// How long an admin request may take.
const WAIT: Duration = Duration::from_secs(30);

/// Run an admin future (rdkafka's complete on its own threads).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// A KRaft cluster id: 16 random bytes in Kafka's `Uuid` text form
/// (URL-safe base64, no padding).
fn cluster_id() -> String {
    use base64::Engine;
    let mut bytes = [0u8; 16];
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
        ^ u128::from(std::process::id()) << 64;
    bytes.copy_from_slice(&seed.to_le_bytes());
    // A first byte of 1..=100 makes the text start with a letter (A..Z):
    // never the all-zero id, never a leading `-` that the tool would take
    // for an option.
    bytes[0] = bytes[0] % 100 + 1;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Start `node`'s `kafka.Kafka` with its log appended to
/// `node.dir/broker.log`.
fn spawn_node(lib: &std::path::Path, node: &Node) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(node.dir.join("broker.log"))
        .unwrap();
    let err = log.try_clone().unwrap();
    java(lib, "kafka.Kafka")
        .arg(node.dir.join("server.properties"))
        .current_dir(&node.dir)
        .stdout(log)
        .stderr(err)
        .spawn()
        .expect("start Kafka (java)")
}

fn kill_node(node: &mut Node) {
    if let Some(mut child) = node.child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Broker for BrokerProcess {
    fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// CreateTopics, replicated on every node (up to 3); retried while a
    /// topic of the same name is still being deleted.
    fn create_topic(&self, name: &str, partitions: i32) {
        let rf = i32::try_from(self.nodes.len().min(3)).unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            let results = block_on(self.admin().create_topics(
                &[NewTopic::new(name, partitions, TopicReplication::Fixed(rf))],
                &AdminOptions::new().operation_timeout(Some(WAIT)),
            ))
            .expect("create topics");
            match results.into_iter().next().expect("one result") {
                Ok(_) => return,
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err((t, e)) => panic!("create topic {t}: {e}"),
            }
        }
    }
}

/// A producer with explicit partitions.
pub struct Producer_ {
    p: BaseProducer,
}

pub fn producer(bootstrap: &str) -> Producer_ {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000")
        .create()
        .expect("producer");
    Producer_ { p }
}

impl Producer_ {
    /// Send one record; `value: None` is a tombstone.
    pub fn send(
        &self,
        topic: &str,
        partition: i32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&str, Option<&[u8]>)],
    ) {
        let mut h = OwnedHeaders::new();
        for (k, v) in headers {
            h = h.insert(Header { key: k, value: *v });
        }
        let mut rec: BaseRecord<'_, [u8], [u8]> =
            BaseRecord::to(topic).partition(partition).headers(h);
        if let Some(k) = key {
            rec = rec.key(k);
        }
        if let Some(v) = value {
            rec = rec.payload(v);
        }
        let mut rec = rec;
        loop {
            match self.p.send(rec) {
                Ok(()) => break,
                Err((e, r)) => {
                    // Queue full: serve delivery reports and retry.
                    assert!(
                        matches!(
                            e,
                            rdkafka::error::KafkaError::MessageProduction(
                                rdkafka::types::RDKafkaErrorCode::QueueFull
                            )
                        ),
                        "produce: {e}"
                    );
                    self.p.poll(Duration::from_millis(50));
                    rec = r;
                }
            }
        }
        self.p.poll(Duration::ZERO);
    }

    /// Send one value with the producer timestamp `ms` (KIP-32
    /// CreateTime; `-1` is Kafka's "no timestamp").
    pub fn send_at(&self, topic: &str, partition: i32, value: &[u8], ms: i64) {
        let rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
            .partition(partition)
            .payload(value)
            .timestamp(ms);
        self.p.send(rec).map_err(|(e, _)| e).expect("produce");
        self.p.poll(Duration::ZERO);
    }

    pub fn flush(&self) {
        self.p.flush(Duration::from_secs(30)).expect("flush");
    }
}

/// A mock cluster whose one-partition topic `raw` holds `values` (no keys,
/// offsets from 0).
pub fn raw_topic<V: AsRef<[u8]>>(values: impl IntoIterator<Item = V>) -> Mock {
    let mock = Mock::new();
    mock.create_topic("raw", 1);
    let p = producer(&mock.bootstrap());
    for v in values {
        p.send("raw", 0, None, Some(v.as_ref()), &[]);
    }
    p.flush();
    mock
}

/// The broker that leads `topic`/`partition` (waiting up to 60 s for one
/// to be elected): its node id and `host:port`.
pub fn leader(bootstrap: &str, topic: &str, partition: i32) -> (i32, String) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("metadata client");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let m = c
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        let leader = m
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .and_then(|t| t.partitions().iter().find(|p| p.id() == partition))
            .map(|p| p.leader());
        if let Some(b) = leader.and_then(|id| m.brokers().iter().find(|b| b.id() == id)) {
            return (b.id(), format!("{}:{}", b.host(), b.port()));
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{topic}/{partition} has no leader"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
