//! `host demo`: the whole company pipeline on an embedded Kafka-protocol
//! broker (librdkafka's in-process mock cluster) and an embedded SQLite
//! sink, with no setup.
//!
//! It produces a realistic Maxwell stream for a `company` table (a
//! bootstrap run, inserts, updates with `old`, deletes, a DDL event, events
//! of another table and one malformed event), runs the pipeline until it is
//! caught up with `--on-error dlq` and stops cleanly; produces a backlog,
//! runs `host run` on it as a child process and kills that with SIGKILL
//! in the middle of its batch (`crash`); restarts, and reports what
//! happened: how many records the killed batch had and how many of them
//! its committed parts had applied, that the restart re-ran it with the
//! same offsets, did not apply those again and applied the rest once, and
//! that the table equals the expected state.

mod crash;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde::Serialize;

use crate::capability::sql::{SqlValue, connect};
use crate::engine::{self, ErrorPolicy, PipelineConfig};

/// Partitions of the demo topic.
const PARTITIONS: i32 = 3;

/// Companies changed by the backlog, and how often each.
const BACKLOG_IDS: u32 = 600;
const BACKLOG_ROUNDS: u32 = 30;

/// What `host demo` reports.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct DemoSummary {
    /// Kafka records produced (both phases).
    pub events_produced: u64,
    /// Change records applied to `companies` (sink outputs).
    pub changes_applied: u64,
    /// Events skipped as not a row change of `company`.
    pub events_filtered: u64,
    /// Rows in `companies` at the end.
    pub rows_in_companies: u64,
    /// Rows in `sluice_dead_letters`.
    pub dead_letters: u64,
    /// Batches committed over both runs.
    pub batches: u64,
    /// Batches re-run by the restart: the one killed mid-way.
    pub batches_rerun_after_restart: u64,
    /// The batch killed with SIGKILL mid-way (`None`: it finished before
    /// the kill could land, which the summary says).
    pub killed_batch: Option<u64>,
    /// Records planned in the killed batch (its write-ahead ranges).
    pub records_in_killed_batch: u64,
    /// Of those, records the batch's committed parts had applied before
    /// the kill (the restart skips them).
    pub applied_before_kill: u64,
    /// Offsets the restart found applied already (the progress rows of the
    /// parts that committed before the kill) and did not apply again.
    pub already_applied_on_restart: u64,
    /// The restart committed the killed batch with the ranges it had
    /// planned.
    pub rerun_with_same_offsets: bool,
    /// The table equals the state the produced events imply.
    pub table_matches_expected: bool,
    /// Where the checkpoint and database are (with `--keep`).
    pub kept_in: Option<PathBuf>,
}

/// Generates the Maxwell stream and keeps the expected table.
struct Maxwell {
    producer: BaseProducer,
    expected: BTreeMap<String, String>,
    produced: u64,
    ts: u64,
}

impl Maxwell {
    fn send(&mut self, id: Option<u32>, table: &str, value: &str) -> Result<(), String> {
        let key = match id {
            Some(id) => format!(r#"{{"database":"shop","table":"{table}","pk.id":{id}}}"#),
            None => format!(r#"{{"database":"shop","table":"{table}"}}"#),
        };
        let partition = id.map_or(0, |i| (i % PARTITIONS as u32) as i32);
        let rec = BaseRecord::to("maxwell")
            .partition(partition)
            .key(&key)
            .payload(value);
        self.producer
            .send(rec)
            .map_err(|(e, _)| format!("produce: {e}"))?;
        self.producer.poll(Duration::ZERO);
        self.produced += 1;
        Ok(())
    }

    fn row(id: u32, version: u32) -> String {
        format!(
            r#"{{"id":{id},"name":"Company {id}","revision":{version},"valuation":999999999999.999998,"founded":"0000-00-00 00:00:00","logo":"iVBORw0KGgo="}}"#
        )
    }

    fn change(&mut self, kind: &str, id: u32, version: u32, old: bool) -> Result<(), String> {
        self.ts += 1;
        let data = Self::row(id, version);
        let old = if old { r#","old":{"revision":0}"# } else { "" };
        let value = format!(
            r#"{{"database":"shop","table":"company","type":"{kind}","ts":{},"xid":{},"commit":true,"data":{data}{old}}}"#,
            self.ts,
            self.ts * 7
        );
        self.send(Some(id), "company", &value)?;
        let pk = format!(r#"{{"id":{id}}}"#);
        if kind == "delete" {
            self.expected.remove(&pk);
        } else {
            self.expected.insert(pk, data);
        }
        Ok(())
    }

    /// The first load: a bootstrap run, live changes, noise, one bad event.
    fn first_phase(&mut self) -> Result<(), String> {
        self.send(None, "company", r#"{"database":"shop","table":"company","type":"bootstrap-start","ts":1700000000,"data":{}}"#)?;
        for id in 1..=20 {
            self.change("bootstrap-insert", id, 1, false)?;
        }
        self.send(None, "company", r#"{"database":"shop","table":"company","type":"bootstrap-complete","ts":1700000001,"data":{}}"#)?;
        self.send(
            None,
            "company",
            r#"{"type":"table-alter","database":"shop","table":"company","old":{"columns":[]},"def":{"columns":[]},"ts":1700000002000,"sql":"ALTER TABLE company ADD COLUMN revision INT"}"#,
        )?;
        for id in 21..=60 {
            self.change("insert", id, 1, false)?;
            self.send(
                Some(id),
                "orders",
                &format!(r#"{{"database":"shop","table":"orders","type":"insert","ts":1700000003,"data":{{"id":{id},"company_id":{id}}}}}"#),
            )?;
        }
        for id in (1..=60).step_by(3) {
            self.change("update", id, 2, true)?;
        }
        self.send(
            Some(7),
            "company",
            r#"{"database":"shop","table":"company","type":"update","ts":17000"#,
        )?;
        for id in (5..=60).step_by(10) {
            self.change("delete", id, 2, false)?;
        }
        self.flush()
    }

    /// A backlog: every company changed `rounds` times (inserts, then
    /// updates), for a batch large enough to be killed mid-way.
    fn backlog(&mut self, rounds: u32) -> Result<(), String> {
        for round in 0..rounds {
            for id in 1..=BACKLOG_IDS {
                let pk = format!(r#"{{"id":{id}}}"#);
                let kind = if self.expected.contains_key(&pk) {
                    "update"
                } else {
                    "insert"
                };
                self.change(kind, id, 10 + round, kind == "update")?;
            }
        }
        self.flush()
    }

    /// More changes after the first stop.
    fn second_phase(&mut self) -> Result<(), String> {
        for id in 55..=80 {
            self.change(
                if self.expected.contains_key(&format!(r#"{{"id":{id}}}"#)) {
                    "update"
                } else {
                    "insert"
                },
                id,
                3,
                true,
            )?;
        }
        self.change("delete", 2, 3, false)?;
        self.flush()
    }

    fn flush(&self) -> Result<(), String> {
        self.producer
            .flush(Duration::from_secs(30))
            .map_err(|e| format!("flush: {e}"))
    }
}

/// Find the company component: `plugin`, or where cargo puts it next to
/// this binary (`target/wasm32-wasip2/{release,debug}/company.wasm`).
///
/// # Errors
/// A message with the build command when it is nowhere.
pub fn find_company_plugin(plugin: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = plugin {
        return Ok(p.to_path_buf());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let target = exe.parent().and_then(Path::parent);
    let candidates: Vec<PathBuf> = target
        .map(|t| {
            ["release", "debug"]
                .iter()
                .map(|p| t.join("wasm32-wasip2").join(p).join("company.wasm"))
                .collect()
        })
        .unwrap_or_default();
    candidates.iter().find(|p| p.exists()).cloned().ok_or_else(|| {
        format!(
            "the company plugin is not built (looked in {}); build it with `cargo build --target wasm32-wasip2 --release -p company`, or pass --plugin",
            candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}

fn count(url: &str, sql: &str) -> Result<u64, String> {
    let rows = connect(url)
        .and_then(|mut b| b.query(sql, &[]))
        .map_err(|e| e.to_string())?;
    match rows.rows.first().and_then(|r| r.first()) {
        Some(SqlValue::Integer(n)) => Ok(*n as u64),
        other => Err(format!("unexpected {other:?} from {sql}")),
    }
}

/// Run the demo in `dir` (kept by the caller if asked).
///
/// # Errors
/// A message saying which step failed.
pub fn run(dir: &Path, plugin: &Path) -> Result<DemoSummary, String> {
    let cluster = MockCluster::new(1).map_err(|e| format!("mock cluster: {e}"))?;
    cluster
        .create_topic("maxwell", PARTITIONS, 1)
        .map_err(|e| format!("create topic: {e}"))?;
    let bootstrap = cluster.bootstrap_servers();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .map_err(|e| format!("producer: {e}"))?;
    let mut maxwell = Maxwell {
        producer,
        expected: BTreeMap::new(),
        produced: 0,
        ts: 1_700_000_100,
    };
    tracing::info!(
        "demo: broker {bootstrap}, topic maxwell ({PARTITIONS} partitions), working dir {}",
        dir.display()
    );
    maxwell.first_phase()?;

    let db = dir.join("sink.db");
    let url = format!("sqlite:{}", db.display());
    let mut cfg = PipelineConfig::new(bootstrap, vec!["maxwell".into()], dir.join("checkpoint"));
    cfg.plugins = vec![plugin.to_path_buf()];
    cfg.sink_db = Some(url.clone());
    cfg.on_error = ErrorPolicy::Dlq;
    cfg.until_caught_up = true;
    cfg.max_records_per_partition = 25;
    cfg.trigger_interval = Duration::from_millis(100);
    cfg.progress = crate::engine::ProgressMode::None;
    cfg.kafka_timeout = Duration::from_secs(20);
    let stop = Arc::new(AtomicBool::new(false));
    let first = engine::run(&cfg, stop.clone()).map_err(|e| format!("first run: {e}"))?;
    tracing::info!(
        batches = first.batches,
        "demo: first run caught up and stopped; producing more"
    );

    maxwell.second_phase()?;
    maxwell.backlog(BACKLOG_ROUNDS)?;
    tracing::info!(
        "demo: produced a backlog; running `host run` on it and killing it (SIGKILL) mid-batch"
    );
    let killed = crash::kill_mid_batch(&cfg, dir)?;
    // Restart: resume from the checkpoint with the recorded plugin, in
    // batches as large as the killed run's.
    cfg.plugins.clear();
    cfg.max_records_per_partition = crash::BACKLOG_BATCH;
    let second = engine::run(&cfg, stop).map_err(|e| format!("restart: {e}"))?;
    let rerun_with_same_offsets = match &killed {
        Some(k) => crash::committed_with(&cfg.checkpoint, k)?,
        None => false,
    };

    let rows: BTreeMap<String, String> = connect(&url)
        .and_then(|mut b| b.query("SELECT pk, row_json FROM companies", &[]))
        .map_err(|e| e.to_string())?
        .rows
        .into_iter()
        .filter_map(|r| match (r.first(), r.get(1)) {
            (Some(SqlValue::Text(k)), Some(SqlValue::Text(v))) => Some((k.clone(), v.clone())),
            _ => None,
        })
        .collect();
    Ok(DemoSummary {
        events_produced: maxwell.produced,
        changes_applied: first.counts.output + second.counts.output,
        events_filtered: first.counts.filtered + second.counts.filtered,
        rows_in_companies: count(&url, "SELECT COUNT(*) FROM companies")?,
        dead_letters: count(&url, "SELECT COUNT(*) FROM sluice_dead_letters")?,
        batches: first.batches + killed.as_ref().map_or(0, |k| k.committed_before) + second.batches,
        batches_rerun_after_restart: u64::from(second.reran.is_some()),
        killed_batch: killed.as_ref().map(|k| k.entry.batch_id),
        records_in_killed_batch: killed.as_ref().map_or(0, |k| k.planned),
        applied_before_kill: killed.as_ref().map_or(0, |k| k.applied),
        already_applied_on_restart: second.counts.already_applied,
        rerun_with_same_offsets,
        table_matches_expected: rows == maxwell.expected,
        kept_in: None,
    })
}
