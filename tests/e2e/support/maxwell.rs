//! A deterministic Maxwell CDC stream for the `company` table, and the
//! table state it should produce (the model the tests compare against).

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_host::capability::sql::SqlValue;
use sluice_host::engine::PipelineConfig;

use super::kafka::{Broker, producer};
use super::{Db, plugin};

/// One produced event.
#[derive(Debug, Clone)]
pub struct Event {
    /// Kafka key (Maxwell's hash key format).
    pub key: String,
    /// Kafka value.
    pub value: String,
    /// Company id (partitioning key).
    pub id: u32,
}

/// Generates events; `state` is what `companies` must hold afterwards
/// (`pk` → row JSON text).
pub struct Stream {
    seed: u64,
    pub state: BTreeMap<String, String>,
    version: BTreeMap<u32, u32>,
    pub ts: u64,
}

impl Stream {
    pub fn new(seed: u64) -> Self {
        Stream {
            seed,
            state: BTreeMap::new(),
            version: BTreeMap::new(),
            ts: 1_700_000_000,
        }
    }

    fn next(&mut self) -> u64 {
        // xorshift64*: deterministic, no dependency.
        self.seed ^= self.seed >> 12;
        self.seed ^= self.seed << 25;
        self.seed ^= self.seed >> 27;
        self.seed.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The next change event for a company among `ids` ids.
    pub fn event(&mut self, ids: u32) -> Event {
        let id = (self.next() % u64::from(ids)) as u32 + 1;
        self.ts += 1;
        let pk = format!(r#"{{"id":{id}}}"#);
        let exists = self.state.contains_key(&pk);
        let roll = self.next() % 10;
        let key = format!(r#"{{"database":"shop","table":"company","pk.id":{id}}}"#);
        let (kind, row) = if exists && roll == 0 {
            ("delete", self.state.get(&pk).cloned().unwrap_or_default())
        } else {
            let v = self.version.entry(id).or_insert(0);
            *v += 1;
            let row = format!(
                r#"{{"id":{id},"name":"Company {id} v{v}","valuation":{}.{:06},"founded":"0000-00-00 00:00:00","logo":"AAEC"}}"#,
                999_999_999_000u64 + u64::from(id),
                u64::from(*v) * 7 % 1_000_000
            );
            (if exists { "update" } else { "insert" }, row)
        };
        let old = if kind == "update" {
            r#","old":{"name":"previous"}"#
        } else {
            ""
        };
        let value = format!(
            r#"{{"database":"shop","table":"company","type":"{kind}","ts":{},"xid":{},"commit":true,"data":{row}{old}}}"#,
            self.ts,
            self.ts * 3
        );
        if kind == "delete" {
            self.state.remove(&pk);
        } else {
            self.state.insert(pk, row);
        }
        Event { key, value, id }
    }
}

/// The company pipeline over `topic` into `db`, until caught up, in
/// small batches.
pub fn pipeline(
    bootstrap: &str,
    topic: &str,
    checkpoint: &std::path::Path,
    db: &Db,
) -> PipelineConfig {
    let mut cfg = PipelineConfig::new(bootstrap, vec![topic.to_string()], checkpoint);
    cfg.plugins = vec![plugin("company")];
    cfg.sink_db = Some(db.url.clone());
    cfg.until_caught_up = true;
    cfg.max_records_per_partition = 150;
    cfg.trigger_interval = Duration::from_millis(50);
    cfg.kafka_timeout = Duration::from_secs(20);
    cfg.progress = sluice_host::engine::ProgressMode::None;
    cfg
}

/// Produce `n` events of `stream` to `topic`, each to the partition of its
/// company id.
pub fn produce(b: &dyn Broker, topic: &str, stream: &mut Stream, n: usize, partitions: i32) {
    let p = producer(&b.bootstrap());
    for _ in 0..n {
        let e = stream.event(60);
        p.send(
            topic,
            (e.id % partitions as u32) as i32,
            Some(e.key.as_bytes()),
            Some(e.value.as_bytes()),
            &[],
        );
    }
    p.flush();
}

/// What `companies` holds: `pk` → row JSON text.
pub fn table(db: &Db) -> std::collections::BTreeMap<String, String> {
    db.query("SELECT pk, row_json FROM companies")
        .into_iter()
        .map(|r| match (&r[0], &r[1]) {
            (SqlValue::Text(k), SqlValue::Text(v)) => (k.clone(), v.clone()),
            other => panic!("{other:?}"),
        })
        .collect()
}
