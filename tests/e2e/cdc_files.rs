//! The `cdc` plugin on event files written for the tests after the
//! producers' documented envelopes (tests/fixtures/cdc/README.md):
//! Debezium's MySQL and PostgreSQL connectors and Maxwell. Each file is
//! produced to a real broker, applied into real SQLite and PostgreSQL
//! tables, and the tables are compared with the expected ones cell by
//! cell; then a reset back in time must not make a row older, and a
//! kill -9 between the sink's writes and its commit must lose nothing.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde_json::value::RawValue;
use sluice_host::capability::sql::SqlValue;

use crate::support::kafka::{Broker, Mock, producer};
use crate::support::{Db, HostProcess, RunArgs, host, stderr};

const WAIT: Duration = Duration::from_secs(60);

/// Produce the file's events to topic `cdc`, partition 0, in order.
fn produce_file(b: &dyn Broker, file: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/cdc")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let p = producer(&b.bootstrap());
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        // The key and value as JSON, kept byte for byte; `null` is none
        // (a null value: a tombstone).
        let e: HashMap<String, Box<RawValue>> = serde_json::from_str(line).unwrap();
        let field = |name: &str| {
            e.get(name)
                .map(|v| v.get().as_bytes())
                .filter(|v| *v != b"null")
        };
        let (key, value) = (field("key"), field("value"));
        p.send("cdc", 0, key, value, &[]);
    }
    p.flush();
}

/// Every row of `table` as text cells, ordered by `id`: `columns` are
/// SQL expressions; `hex:col` is a binary column shown as lower-case hex.
pub(crate) fn cells(db: &Db, table: &str, columns: &[&str]) -> Vec<Vec<String>> {
    let exprs: Vec<String> = columns
        .iter()
        .map(|c| match c.strip_prefix("hex:") {
            Some(b) if db.name == "sqlite" => {
                format!("CASE WHEN {b} IS NULL THEN NULL ELSE lower(hex({b})) END")
            }
            Some(b) => format!("encode({b}, 'hex')"),
            None => format!("CAST({c} AS TEXT)"),
        })
        .collect();
    db.query(&format!(
        "SELECT {} FROM {table} ORDER BY id",
        exprs.join(", ")
    ))
    .into_iter()
    .map(|r| {
        r.into_iter()
            .map(|v| match v {
                SqlValue::Text(t) => t,
                SqlValue::Null => "NULL".into(),
                other => format!("{other:?}"),
            })
            .collect()
    })
    .collect()
}

pub(crate) fn rows(want: &[&[&str]]) -> Vec<Vec<String>> {
    want.iter()
        .map(|r| r.iter().map(|c| c.to_string()).collect())
        .collect()
}

/// `host run` of the cdc component over topic `cdc` with `config` pairs.
pub(crate) fn run_args(
    b: &dyn Broker,
    db: &Db,
    ck: &Path,
    config: &[&str],
    extra: &[&str],
) -> Vec<String> {
    let mut a = RunArgs::new(&b.bootstrap(), &["cdc"], ck)
        .sink_db(db)
        .plugin("cdc")
        .args(["--until-caught-up", "--on-error", "dlq"]);
    for c in config {
        a = a.args(["--config", c]);
    }
    a.args(extra.iter().copied()).build()
}

/// Run to the end; no event may become a dead letter (skipped events,
/// DDL and tombstones are not bad records).
fn run(b: &dyn Broker, db: &Db, ck: &Path, config: &[&str], extra: &[&str]) -> String {
    let (code, log) = HostProcess::start(&run_args(b, db, ck, config, extra)).finish();
    assert_eq!(code, Some(0), "{}: {log}", db.name);
    let dead = db.query("SELECT \"offset\", error FROM sluice_dead_letters");
    assert!(dead.is_empty(), "{}: dead letters {dead:?}", db.name);
    log
}

/// Reset the checkpoint to the topic's start, applying everything again.
fn reset_to_earliest(b: &dyn Broker, db: &Db, ck: &Path) {
    let out = host(&[
        "checkpoint",
        "reset",
        ck.to_str().unwrap(),
        "--to",
        "earliest",
        "--brokers",
        &b.bootstrap(),
        "--sink-db",
        &db.url,
        "--reapply",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// The MySQL connector without schemas (`decimal.handling.mode=string`):
/// a snapshot, inserts, updates, deletes with their tombstones and a
/// primary key change, two tables routed by one wildcard.
#[test]
fn debezium_mysql_events_fill_two_tables_and_a_replay_makes_no_row_older() {
    for db in Db::both() {
        let (weight, price) = if db.name == "sqlite" {
            ("REAL", "TEXT")
        } else {
            ("DOUBLE PRECISION", "NUMERIC(10,2)")
        };
        db.batch(&format!(
            "CREATE TABLE customers (id INTEGER PRIMARY KEY, first_name TEXT NOT NULL, last_name TEXT, \
             email TEXT, _sluice_position TEXT); \
             CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, description TEXT, \
             weight {weight}, price {price}, _sluice_position TEXT)"
        ));
        let mock = Mock::new();
        mock.create_topic("cdc", 1);
        produce_file(&mock, "debezium-mysql.jsonl");
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("ck");
        let config = ["route=inventory.*=*", "format=debezium"];
        let log = run(&mock, &db, &ck, &config, &[]);
        let customers = rows(&[
            &["1001", "Sally", "Thomas", "sally.thomas@acme.com"],
            &["1004", "Anne Marie", "Kretchmar", "annek@noanswer.org"],
            &["1005", "Edward", "Walker", "ed@walker.com"],
        ]);
        let products = rows(&[
            &["101", "scooter", "Small 2-wheel scooter", "3.14", "17.49"],
            &["102", "car battery", "12V car battery", "8.1", "89.50"],
            &[
                "103",
                "hammer",
                "16oz carpenter's hammer",
                "0.75",
                "999999.99",
            ],
        ]);
        let check = |when: &str| {
            let c = cells(
                &db,
                "customers",
                &["id", "first_name", "last_name", "email"],
            );
            assert_eq!(c, customers, "{} {when}", db.name);
            let p = cells(
                &db,
                "products",
                &["id", "name", "description", "weight", "price"],
            );
            assert_eq!(p, products, "{} {when}", db.name);
        };
        check("after the first run");
        let _ = log;

        // Back to the start, applying again: the first six events (the
        // snapshot and the create of 1004) are replayed in one batch, and
        // the run is stopped in the next one, before its commit. 1004
        // stays "Anne Marie" (its row is at the update's position, later
        // than the create's) and the products keep their later prices.
        reset_to_earliest(&mock, &db, &ck);
        let mut replay = HostProcess::spawn(
            &run_args(
                &mock,
                &db,
                &ck,
                &config,
                &["--max-records-per-partition", "6"],
            ),
            &[("SLUICE_FAILPOINT", "sink:after-write@2")],
        );
        replay.wait_for("FAILPOINT sink:after-write", WAIT);
        let c = cells(&db, "customers", &["id", "first_name"]);
        let anne = c.iter().find(|r| r[0] == "1004");
        assert_eq!(
            anne.map(|r| r[1].as_str()),
            Some("Anne Marie"),
            "{}: {c:?}",
            db.name
        );
        let p = cells(&db, "products", &["id", "price"]);
        assert_eq!(
            p.iter().find(|r| r[0] == "101").map(|r| r[1].as_str()),
            Some("17.49"),
            "{}: {p:?}",
            db.name
        );
        replay.kill();
        // Deleted rows leave no position behind, so a replay of their
        // snapshot brings them back until their delete is replayed too.
        run(&mock, &db, &ck, &config, &[]);
        check("after the replay");
    }
}

/// The PostgreSQL connector with schemas (`decimal.handling.mode=precise`):
/// precise and variable-scale decimals, dates, microsecond timestamps and
/// bytea decoded from the schema, a delete with a key-only `before`, and a
/// truncate of another table applied (`truncate=apply`).
#[test]
fn debezium_postgres_events_with_schemas_decode_into_typed_columns_and_truncate() {
    for db in Db::both() {
        let ddl = if db.name == "sqlite" {
            "CREATE TABLE company (id INTEGER PRIMARY KEY, name TEXT NOT NULL, revenue TEXT, \
             founded DATE, logo BLOB, rating TEXT, updated_at TEXT, _sluice_position TEXT); \
             CREATE TABLE audit (id INTEGER PRIMARY KEY, note TEXT, _sluice_position TEXT)"
        } else {
            "CREATE TABLE company (id BIGINT PRIMARY KEY, name TEXT NOT NULL, revenue NUMERIC(20,6), \
             founded DATE, logo BYTEA, rating NUMERIC, updated_at TIMESTAMP, _sluice_position TEXT); \
             CREATE TABLE audit (id INTEGER PRIMARY KEY, note TEXT, _sluice_position TEXT)"
        };
        db.batch(ddl);
        let mock = Mock::new();
        mock.create_topic("cdc", 1);
        produce_file(&mock, "debezium-postgres.jsonl");
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("ck");
        let log = run(&mock, &db, &ck, &["route=shop.*=*", "truncate=apply"], &[]);
        let company = cells(
            &db,
            "company",
            &[
                "id",
                "name",
                "revenue",
                "founded",
                "hex:logo",
                "rating",
                "updated_at",
                "_sluice_position",
            ],
        );
        let want = rows(&[
            &[
                "1",
                "Acme Corp",
                "-1.230000",
                "2001-02-03",
                "000102ff",
                "5",
                "2025-01-01 00:00:00.123456",
                "pg:00000000000024023300",
            ],
            &[
                "3",
                "Gamma",
                "NULL",
                "1969-12-31",
                "",
                "-12.345",
                "1970-01-01 00:00:00",
                "pg:00000000000024023600",
            ],
        ]);
        assert_eq!(company, want, "{}: {log}", db.name);
        let audit = cells(&db, "audit", &["id", "note"]);
        assert_eq!(audit, rows(&[&["3", "after truncate"]]), "{}", db.name);
    }
}

/// Maxwell: a bootstrap (no binlog position: the Kafka offset orders
/// it), inserts and updates with positions, a delete, a DDL event and a
/// row of an unrouted database in between, zero dates, exact
/// decimals and base64 binary; then a kill -9 between the sink's writes
/// and its commit, and the restart applies the part once.
#[test]
fn maxwell_events_with_a_bootstrap_fill_two_tables_and_survive_kill_9_mid_part() {
    for db in Db::both() {
        let ddl = if db.name == "sqlite" {
            "CREATE TABLE company (id INTEGER PRIMARY KEY, name TEXT NOT NULL, revenue TEXT, \
             founded DATE, logo BLOB, _sluice_position TEXT); \
             CREATE TABLE orders (id INTEGER PRIMARY KEY, company_id INTEGER, amount TEXT, \
             placed_at DATETIME, note TEXT, _sluice_position TEXT)"
        } else {
            "CREATE TABLE company (id BIGINT PRIMARY KEY, name TEXT NOT NULL, revenue NUMERIC(20,6), \
             founded DATE, logo BYTEA, _sluice_position TEXT); \
             CREATE TABLE orders (id BIGINT PRIMARY KEY, company_id BIGINT, amount NUMERIC(10,2), \
             placed_at TIMESTAMP, note TEXT, _sluice_position TEXT)"
        };
        db.batch(ddl);
        let mock = Mock::new();
        mock.create_topic("cdc", 1);
        produce_file(&mock, "maxwell.jsonl");
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("ck");
        let config = ["route=shop.*=*", "format=maxwell", "batch_rows=1"];
        // Paused after the sink's write (every statement ran), before the
        // commit; killed there.
        let mut first = HostProcess::spawn(
            &run_args(&mock, &db, &ck, &config, &[]),
            &[("SLUICE_FAILPOINT", "sink:after-write")],
        );
        first.wait_for("FAILPOINT sink:after-write", WAIT);
        first.kill();
        assert_eq!(
            db.scalar("SELECT COUNT(*) FROM company"),
            0,
            "{}: nothing of the killed part is kept",
            db.name
        );
        run(&mock, &db, &ck, &config, &[]);
        let (revenue_1, revenue_3) = if db.name == "sqlite" {
            ("999999999999.999998", "7")
        } else {
            ("999999999999.999998", "7.000000")
        };
        let company = cells(
            &db,
            "company",
            &["id", "name", "revenue", "founded", "hex:logo"],
        );
        let want = rows(&[
            &["1", "Acme Corp", revenue_1, "NULL", "000102ff"],
            &["3", "Gamma", revenue_3, "1999-12-31", "deadbeef"],
        ]);
        assert_eq!(company, want, "{}", db.name);
        let orders = cells(
            &db,
            "orders",
            &["id", "company_id", "amount", "placed_at", "note"],
        );
        assert_eq!(
            orders,
            rows(&[&["10", "3", "13.00", "NULL", "NULL"]]),
            "{}",
            db.name
        );
        let positions = db.sorted_texts("SELECT _sluice_position FROM company");
        assert_eq!(
            positions,
            vec![
                "mysql:0000000006:00000000000000800911:0000000000".to_string(),
                "mysql:0000000006:00000000000000801200:0000000000".to_string(),
            ],
            "{}",
            db.name
        );
    }
}

/// A two-column primary key (the Debezium key struct has both): deletes
/// of several keys in one part are one multi-row statement, and only
/// those rows go.
#[test]
fn deletes_of_a_two_column_key_in_one_part_remove_exactly_those_rows() {
    let event = |op: &str, order: i64, line: i64, qty: i64, pos: u64| {
        let row = format!(r#"{{"order_id":{order},"line":{line},"qty":{qty}}}"#);
        let (before, after) = match op {
            "d" => (row.as_str(), "null"),
            _ => ("null", row.as_str()),
        };
        let value = format!(
            r#"{{"before":{before},"after":{after},"source":{{"connector":"mysql","db":"inventory","table":"order_lines","file":"mysql-bin.000001","pos":{pos},"row":0}},"op":"{op}","ts_ms":1}}"#
        );
        (format!(r#"{{"order_id":{order},"line":{line}}}"#), value)
    };
    for db in Db::both() {
        db.batch(
            "CREATE TABLE order_lines (order_id BIGINT NOT NULL, line INTEGER NOT NULL, qty INTEGER, \
             _sluice_position TEXT, PRIMARY KEY (order_id, line))",
        );
        let mock = Mock::new();
        mock.create_topic("cdc", 1);
        let send = |events: &[(String, String)]| {
            let p = producer(&mock.bootstrap());
            for (k, v) in events {
                p.send("cdc", 0, Some(k.as_bytes()), Some(v.as_bytes()), &[]);
            }
            p.flush();
        };
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("ck");
        let config = ["route=inventory.*=*"];
        send(&[
            event("c", 1, 1, 1, 10),
            event("c", 1, 2, 2, 20),
            event("c", 2, 1, 3, 30),
            event("c", 2, 2, 4, 40),
        ]);
        run(&mock, &db, &ck, &config, &[]);
        send(&[
            event("d", 1, 2, 2, 50),
            event("u", 1, 1, 9, 60),
            event("d", 2, 1, 3, 70),
            // Not in the table: deletes nothing.
            event("d", 3, 3, 0, 80),
        ]);
        run(&mock, &db, &ck, &config, &[]);
        let left: Vec<String> = db
            .query(
                "SELECT CAST(order_id AS TEXT) || '/' || CAST(line AS TEXT) || '=' || CAST(qty AS TEXT) \
                 FROM order_lines ORDER BY order_id, line",
            )
            .into_iter()
            .map(|r| match &r[0] {
                SqlValue::Text(t) => t.clone(),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(left, vec!["1/1=9", "2/2=4"], "{}", db.name);
    }
}
