//! Kafka-protocol brokers for tests: librdkafka's in-process mock cluster
//! (fast, fault injection) and a real broker process (nisshi, or Tansu
//! 0.6.0 where its faults are the subject; SQLite storage) started per
//! test, plus a producer helper.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};

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

/// Which broker binary a [`BrokerProcess`] runs. Both take the same
/// command line (nisshi is Tansu renamed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// nisshi 0.8.1, the suite's broker.
    Nisshi,
    /// Tansu 0.6.0, kept for what only its faults show: a record over the
    /// fetch limits that it never sends, and consumer-group generations
    /// bumped on every join.
    Tansu,
    /// nisshi 0.7.0, for exactly-once output: the last release that runs
    /// transactions (0.8.x refuses a transactional id). Its SQLite storage
    /// writes COMMIT/ABORT markers and stores offsets committed in a
    /// transaction, but sends readers no aborted-transaction list (see
    /// `txn_view`).
    NisshiTxn,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Nisshi | Kind::NisshiTxn => "nisshi",
            Kind::Tansu => "tansu",
        }
    }

    /// The binary: `SLUICE_NISSHI` / `SLUICE_TANSU`, else where
    /// scripts/test.sh installs it.
    fn bin(self) -> PathBuf {
        let (var, version, dir) = match self {
            Kind::Nisshi => ("SLUICE_NISSHI", "0.8.1", "bin"),
            Kind::Tansu => ("SLUICE_TANSU", "0.6.0", "bin"),
            Kind::NisshiTxn => ("SLUICE_NISSHI_TXN", "0.7.0", "nisshi-0.7.0/bin"),
        };
        let p = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/sluice-tools")
                .join(dir)
                .join(self.name())
        });
        assert!(
            p.exists(),
            "{} is missing: scripts/test.sh installs {} {version} (or set {var})",
            p.display(),
            self.name()
        );
        p
    }
}

/// A Kafka-protocol broker process (nisshi, or Tansu 0.6.0) with SQLite
/// storage in a temp dir, on a free port.
pub struct BrokerProcess {
    child: Child,
    port: u16,
    bin: PathBuf,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start `BIN broker` on `port` with SQLite storage `broker.db` in `dir`
/// (log appended to `dir/broker.log`) and wait until it listens.
fn spawn_broker(bin: &std::path::Path, dir: &std::path::Path, port: u16) -> Child {
    let url = format!("tcp://127.0.0.1:{port}");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("broker.log"))
        .unwrap();
    let mut child = Command::new(bin)
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
            "--storage-engine",
            "sqlite://broker.db",
        ])
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start the broker");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{} did not listen on {port}", bin.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

impl BrokerProcess {
    /// The suite's broker, nisshi.
    pub fn start() -> BrokerProcess {
        BrokerProcess::of(Kind::Nisshi)
    }

    /// nisshi 0.7.0, whose brokers run transactions (see
    /// [`Kind::NisshiTxn`]).
    pub fn transactional() -> BrokerProcess {
        BrokerProcess::of(Kind::NisshiTxn)
    }

    /// Tansu 0.6.0, for the tests of its faults (see [`Kind::Tansu`]).
    pub fn tansu() -> BrokerProcess {
        BrokerProcess::of(Kind::Tansu)
    }

    fn of(kind: Kind) -> BrokerProcess {
        let bin = kind.bin();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = spawn_broker(&bin, dir.path(), port);
        BrokerProcess {
            child,
            port,
            bin,
            _dir: dir,
        }
    }

    /// Stop the broker process (for outage tests).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Start it again on the same port and storage.
    pub fn restart(&mut self) {
        self.child = spawn_broker(&self.bin, self._dir.path(), self.port);
    }

    /// Give `topic` `partitions` partitions, as CreatePartitions would:
    /// no broker here implements that request (Tansu 0.6.0 answers
    /// UnsupportedFeature; nisshi 0.8.1 has no handler for it; the mock
    /// cluster does not answer it), so the new partitions are written
    /// into the broker's own SQLite storage, the rows its CreateTopics
    /// writes for each partition (`topition`, `watermark`) and the
    /// topic's partition count, which its Metadata and
    /// DescribeTopicPartitions answers read. Clients see the topic grow at
    /// their next metadata request, as with a real broker.
    pub fn grow_topic(&self, topic: &str, partitions: i32) {
        let db = self._dir.path().join("broker.db");
        let mut c = sluice_host::capability::sql::connect(&format!("sqlite:{}", db.display()))
            .expect("the broker's storage");
        let q = topic.replace('\'', "''");
        let before = match c
            .query(
                &format!("SELECT partitions FROM topic WHERE name = '{q}'"),
                &[],
            )
            .expect("topic row")
            .rows
            .first()
            .and_then(|r| r.first())
        {
            Some(sluice_host::capability::sql::SqlValue::Integer(n)) => *n as i32,
            other => panic!("topic {topic} is not in the broker's storage: {other:?}"),
        };
        assert!(
            partitions > before,
            "{topic} has {before} partitions already"
        );
        let mut sql = format!(
            "BEGIN; UPDATE topic SET partitions = {partitions}, last_updated = current_timestamp \
             WHERE name = '{q}';"
        );
        for p in before..partitions {
            sql.push_str(&format!(
                "INSERT INTO topition (topic, partition) SELECT id, {p} FROM topic WHERE name = '{q}'; \
                 INSERT INTO watermark (topition) SELECT tp.id FROM topition tp JOIN topic t \
                 ON tp.topic = t.id WHERE t.name = '{q}' AND tp.partition = {p};"
            ));
        }
        sql.push_str("COMMIT;");
        c.batch(&sql)
            .expect("grow the topic in the broker's storage");
    }

    pub fn topic(&self, args: &[&str]) -> std::process::Output {
        Command::new(&self.bin)
            .arg("topic")
            .args(args)
            .current_dir(self._dir.path())
            .output()
            .expect("broker topic command")
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Broker for BrokerProcess {
    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
    fn create_topic(&self, name: &str, partitions: i32) {
        let broker = format!("tcp://127.0.0.1:{}", self.port);
        let out = self.topic(&[
            "create",
            name,
            "--broker",
            &broker,
            "--partitions",
            &partitions.to_string(),
        ]);
        assert!(
            out.status.success(),
            "topic create {name}: {:?} {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
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
