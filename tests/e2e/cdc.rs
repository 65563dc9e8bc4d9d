//! The `cdc` plugin end to end: Maxwell and Debezium events produced to a
//! real broker, the built component as map and sink, destination tables
//! with typed columns in real SQLite and PostgreSQL.

use crate::support::kafka::{Broker, Mock, producer};
use crate::support::{Db, HostProcess, RunArgs};
use sluice_host::capability::sql::SqlValue;

/// The user's table: typed columns and the position column.
fn create_company(db: &Db) {
    let (revenue, logo) = if db.name == "sqlite" {
        ("TEXT", "BLOB")
    } else {
        ("NUMERIC(20,6)", "BYTEA")
    };
    db.batch(&format!(
        "CREATE TABLE company (id BIGINT PRIMARY KEY, name TEXT NOT NULL, revenue {revenue}, \
         founded DATE, logo {logo}, _sluice_position TEXT)"
    ));
}

/// One `--until-caught-up` run of the cdc component as map and sink,
/// with the pipeline's checkpoint in `ck`.
fn run(b: &dyn Broker, db: &Db, ck: &std::path::Path, extra: &[&str]) -> (Option<i32>, String) {
    let args = RunArgs::new(&b.bootstrap(), &["cdc"], ck)
        .sink_db(db)
        .plugin("cdc")
        .args([
            "--config",
            "route=shop.company=company",
            "--until-caught-up",
        ])
        .args(extra)
        .build();
    HostProcess::start(&args).finish()
}

fn produce(b: &dyn Broker, events: &[(Option<&str>, Option<&str>)]) {
    let p = producer(&b.bootstrap());
    for (k, v) in events {
        p.send("cdc", 0, k.map(str::as_bytes), v.map(str::as_bytes), &[]);
    }
    p.flush();
}

/// The table as text rows: id, name, revenue, founded, hex(logo), position.
fn rows(db: &Db) -> Vec<Vec<String>> {
    let hex = if db.name == "sqlite" {
        "CASE WHEN logo IS NULL THEN NULL ELSE lower(hex(logo)) END"
    } else {
        "encode(logo, 'hex')"
    };
    db.query(&format!(
        "SELECT CAST(id AS TEXT), name, CAST(revenue AS TEXT), CAST(founded AS TEXT), {hex}, _sluice_position FROM company ORDER BY id"
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

const MAXWELL_KEY_1: &str = r#"{"database":"shop","table":"company","pk.id":1}"#;

fn maxwell(kind: &str, position: &str, data: &str) -> String {
    format!(
        r#"{{"database":"shop","table":"company","type":"{kind}","ts":1,"xid":9,"position":"{position}","data":{data}}}"#
    )
}

fn debezium(op: &str, lsn: u64, before: &str, after: &str) -> String {
    format!(
        r#"{{"before":{before},"after":{after},"source":{{"connector":"postgresql","db":"src","schema":"shop","table":"company","lsn":{lsn}}},"op":"{op}","ts_ms":1}}"#
    )
}

/// Both producers' events into one table on both databases: typed
/// values exact, deletes and tombstones, skipped events counted as
/// filtered, bad records dead-lettered, and a change older than the row
/// never applied.
#[test]
fn maxwell_and_debezium_changes_fill_typed_columns_exactly_once() {
    for db in Db::both() {
        let mock = Mock::new();
        mock.create_topic("cdc", 1);
        create_company(&db);
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("ck");
        let m1 = maxwell(
            "insert",
            "mysql-bin.000003:100",
            r#"{"id":1,"name":"Acme","revenue":999999999999.999998,"founded":"0000-00-00","logo":"AAEC/w=="}"#,
        );
        let m1u = maxwell(
            "update",
            "mysql-bin.000003:200",
            r#"{"id":1,"name":"Acme Corp","revenue":12.5,"founded":"2001-02-03","logo":null,"extra":"x"}"#,
        );
        let d2 = debezium(
            "c",
            500,
            "null",
            r#"{"id":2,"name":"Beta","revenue":"0.000001","founded":null,"logo":"3q2+7w=="}"#,
        );
        let d3 = debezium(
            "r",
            400,
            "null",
            r#"{"id":3,"name":"Gamma","revenue":"7","founded":null,"logo":null}"#,
        );
        let d3del = debezium("d", 600, r#"{"id":3,"name":"Gamma"}"#, "null");
        let ddl =
            r#"{"database":"shop","type":"table-alter","sql":"ALTER TABLE company ADD x INT"}"#;
        let other = maxwell("insert", "mysql-bin.000003:300", r#"{"id":9}"#)
            .replace("\"company\"", "\"orders\"");
        let no_name = maxwell("insert", "mysql-bin.000003:350", r#"{"id":4,"name":null}"#);
        produce(
            &mock,
            &[
                (Some(MAXWELL_KEY_1), Some(&m1)),
                (Some(MAXWELL_KEY_1), Some(&m1u)),
                (Some(r#"{"id":2}"#), Some(&d2)),
                (Some(r#"{"id":3}"#), Some(&d3)),
                (Some(r#"{"id":3}"#), Some(&d3del)),
                (Some(r#"{"id":3}"#), None),
                (None, Some(ddl)),
                (None, Some(&other)),
                (
                    Some(r#"{"database":"shop","table":"company","pk.id":4}"#),
                    Some(&no_name),
                ),
                (None, Some("{not json")),
            ],
        );
        let (code, log) = run(
            &mock,
            &db,
            &ck,
            &["--on-error", "dlq", "--config", "formt=x"],
        );
        assert_eq!(code, Some(0), "{}: {log}", db.name);
        // Skipped, and said so once: the unrouted table and the unknown key.
        assert_eq!(
            log.matches("events of shop.orders match no route").count(),
            1,
            "{log}"
        );
        assert!(log.contains("--config formt is not a cdc setting"), "{log}");
        // NUMERIC(20,6) on PostgreSQL shows its scale; SQLite's TEXT keeps
        // the source's text.
        let revenue = if db.name == "sqlite" {
            "12.5"
        } else {
            "12.500000"
        };
        let want: Vec<Vec<String>> = vec![
            vec![
                "1",
                "Acme Corp",
                revenue,
                "2001-02-03",
                "NULL",
                "mysql:0000000003:00000000000000000200:0000000000",
            ],
            vec![
                "2",
                "Beta",
                "0.000001",
                "NULL",
                "deadbeef",
                "pg:00000000000000000500",
            ],
        ]
        .into_iter()
        .map(|r| r.into_iter().map(String::from).collect())
        .collect();
        assert_eq!(rows(&db), want, "{}: {log}", db.name);
        let dead = db.sorted_texts("SELECT error FROM sluice_dead_letters");
        assert_eq!(dead.len(), 2, "{}: {dead:?}", db.name);
        assert!(
            dead.iter()
                .any(|e| e.contains("column company.name is NOT NULL")),
            "{dead:?}"
        );
        assert!(
            dead.iter().any(|e| e.contains("not a JSON object")),
            "{dead:?}"
        );
        assert!(log.contains("source column extra"), "{log}");

        // Exact decimals: the first insert's value, before the update.
        produce(
            &mock,
            &[
                (
                    Some(r#"{"database":"shop","table":"company","pk.id":5}"#),
                    Some(&maxwell(
                        "insert",
                        "mysql-bin.000004:10",
                        r#"{"id":5,"name":"E","revenue":999999999999.999998,"founded":"0000-00-00 00:00:00","logo":"AAEC/w=="}"#,
                    )),
                ),
                // Two changes of one key in one part, the second without a
                // column: the column keeps the first change's value, as
                // when they are applied one by one.
                (
                    Some(r#"{"database":"shop","table":"company","pk.id":7}"#),
                    Some(&maxwell(
                        "insert",
                        "mysql-bin.000004:20",
                        r#"{"id":7,"name":"G","logo":"AAEC/w=="}"#,
                    )),
                ),
                (
                    Some(r#"{"database":"shop","table":"company","pk.id":7}"#),
                    Some(&maxwell(
                        "update",
                        "mysql-bin.000004:30",
                        r#"{"id":7,"name":"G2"}"#,
                    )),
                ),
                // A delete, then an insert of the same key in one part: the
                // row is the insert's alone, as when both are applied.
                (
                    Some(r#"{"id":2}"#),
                    Some(&debezium("d", 700, r#"{"id":2}"#, "null")),
                ),
                (
                    Some(r#"{"id":2}"#),
                    Some(&debezium("c", 800, "null", r#"{"id":2,"name":"B2"}"#)),
                ),
                // Older than the row: not applied (a replay, another partition).
                (
                    Some(MAXWELL_KEY_1),
                    Some(&maxwell(
                        "update",
                        "mysql-bin.000003:150",
                        r#"{"id":1,"name":"Stale"}"#,
                    )),
                ),
            ],
        );
        let (code, log) = run(&mock, &db, &ck, &["--on-error", "dlq"]);
        assert_eq!(code, Some(0), "{}: {log}", db.name);
        let rows = rows(&db);
        assert_eq!(rows[0][1], "Acme Corp", "{}: {rows:?}", db.name);
        assert_eq!(
            rows[2][..5],
            ["5", "E", "999999999999.999998", "NULL", "000102ff"],
            "{}",
            db.name
        );
        assert_eq!(
            rows[1][..5],
            ["2", "B2", "NULL", "NULL", "NULL"],
            "{}",
            db.name
        );
        assert_eq!(
            rows[3][..5],
            ["7", "G2", "NULL", "NULL", "000102ff"],
            "{}",
            db.name
        );
    }
}

/// A destination table that does not exist, lacks the position column or
/// has no unique key: the pipeline stops with what to do, nothing applied.
#[test]
fn a_missing_table_or_position_column_stops_with_the_fix() {
    let db = Db::sqlite();
    let mock = Mock::new();
    mock.create_topic("cdc", 1);
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    produce(
        &mock,
        &[(
            Some(MAXWELL_KEY_1),
            Some(&maxwell("insert", "b.000001:4", r#"{"id":1,"name":"A"}"#)),
        )],
    );
    let (code, log) = run(&mock, &db, &ck, &[]);
    assert_ne!(code, Some(0), "{log}");
    assert!(
        log.contains("destination table company does not exist"),
        "{log}"
    );
    db.batch("CREATE TABLE company (id INTEGER PRIMARY KEY, name TEXT)");
    let (code, log) = run(&mock, &db, &ck, &[]);
    assert_ne!(code, Some(0), "{log}");
    assert!(
        log.contains("ALTER TABLE company ADD COLUMN _sluice_position TEXT"),
        "{log}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM company"), 0);
    // A table without a key to upsert by.
    db.batch(
        "DROP TABLE company; CREATE TABLE company (id INTEGER, name TEXT, _sluice_position TEXT)",
    );
    let (code, log) = run(&mock, &db, &ck, &[]);
    assert_ne!(code, Some(0), "{log}");
    assert!(
        log.contains(
            "table company has no PRIMARY KEY or UNIQUE index on the changes' key columns (\"id\")"
        ) && log.contains("CREATE UNIQUE INDEX company_sluice_key ON company (\"id\")"),
        "{log}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM company"), 0);
}

/// Values that do not fit their column: text into an integer column and
/// an overlong `varchar` are bad records naming the column in the
/// default (multi-row) mode; a value only the database refuses (a date
/// it cannot read) stops the part naming `batch_rows=1`, and with
/// `batch_rows=1` it is a bad record too. Nothing else is lost.
#[test]
fn values_that_do_not_fit_are_bad_records_or_stop_with_the_fix() {
    let db = Db::postgres();
    let mock = Mock::new();
    mock.create_topic("cdc", 1);
    db.batch(
        "CREATE TABLE company (id BIGINT PRIMARY KEY, name VARCHAR(5), founded DATE, \
         flag SMALLINT, _sluice_position TEXT)",
    );
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    // Maxwell inserts of ids at binlog positions, keyed as Maxwell keys them.
    let send = |events: &[(u32, u32, &str)]| {
        let events: Vec<(String, String)> = events
            .iter()
            .map(|(id, pos, data)| {
                (
                    format!(r#"{{"database":"shop","table":"company","pk.id":{id}}}"#),
                    maxwell("insert", &format!("b.000001:{pos}"), data),
                )
            })
            .collect();
        let refs: Vec<(Option<&str>, Option<&str>)> = events
            .iter()
            .map(|(k, v)| (Some(k.as_str()), Some(v.as_str())))
            .collect();
        produce(&mock, &refs);
    };
    send(&[
        (1, 10, r#"{"id":1,"name":"ok"}"#),
        (2, 20, r#"{"id":"two","name":"x"}"#),
        (3, 30, r#"{"id":3,"name":"toolong"}"#),
        (4, 40, r#"{"id":4,"name":"ok4"}"#),
    ]);
    let (code, log) = run(&mock, &db, &ck, &["--on-error", "dlq"]);
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(
        db.sorted_texts("SELECT CAST(id AS TEXT) || ':' || name FROM company"),
        ["1:ok", "4:ok4"],
        "{log}"
    );
    let dead = db.sorted_texts("SELECT error FROM sluice_dead_letters");
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(
        dead.iter()
            .any(|e| e.contains("company.id (int8) cannot take two")),
        "{dead:?}"
    );
    assert!(
        dead.iter()
            .any(|e| e.contains("holds at most 5 characters, the value has 7")),
        "{dead:?}"
    );

    // Only the database can tell this date is wrong; `true` for a
    // smallint is refused by the host's binding (a data exception too,
    // not a lost connection to retry).
    send(&[
        (5, 50, r#"{"id":5,"name":"d","founded":"2024-13-45"}"#),
        (6, 60, r#"{"id":6,"name":"e"}"#),
        (7, 70, r#"{"id":7,"name":"f","flag":true}"#),
    ]);
    let (code, log) = run(&mock, &db, &ck, &["--on-error", "dlq"]);
    assert_ne!(code, Some(0), "{log}");
    assert!(log.contains("batch_rows=1"), "{log}");
    assert!(log.contains("cdc/0 offsets [4, 7)"), "{log}");
    assert_eq!(db.scalar("SELECT count(*) FROM company"), 2, "{log}");
    let (code, log) = run(
        &mock,
        &db,
        &ck,
        &["--on-error", "dlq", "--config", "batch_rows=1"],
    );
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(
        db.sorted_texts("SELECT CAST(id AS TEXT) FROM company"),
        ["1", "4", "6"],
        "{log}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM sluice_dead_letters"), 4);
    assert!(
        !log.contains("reconnect"),
        "a refused value is not a lost connection: {log}"
    );
}

/// `host test` with the cdc component: on a real database the sink's
/// statements run and are printed per record, a change the table refuses
/// is a bad record of the sink's stage, and nothing is kept; without a
/// database `create=print` logs the table's DDL and the statements show
/// in the dialect asked for.
#[test]
fn host_test_prints_each_statement_with_its_parameters_and_keeps_nothing() {
    use crate::support::{host, json_lines, plugin, stderr};
    let record = |key: &str, value: &str| format!(r#"{{"key":{key},"value":{value}}}"#);
    let input = tempfile::NamedTempFile::new().unwrap();
    let lines = [
        record(
            MAXWELL_KEY_1,
            &maxwell(
                "insert",
                "mysql-bin.000003:100",
                r#"{"id":1,"name":"Acme","revenue":12.5,"logo":"AAEC/w=="}"#,
            ),
        ),
        record(
            r#"{"database":"shop","table":"company","pk.id":2}"#,
            &maxwell("insert", "mysql-bin.000003:200", r#"{"id":2,"name":null}"#),
        ),
        record(
            MAXWELL_KEY_1,
            &maxwell("delete", "mysql-bin.000003:300", r#"{"id":1}"#),
        ),
    ];
    std::fs::write(input.path(), lines.join("\n")).unwrap();
    let cdc = plugin("cdc");
    let test = |extra: &[&str]| {
        let mut args = vec![
            "test",
            "--plugin",
            cdc.to_str().unwrap(),
            "--format",
            "records",
            "--input",
            input.path().to_str().unwrap(),
            "--config",
            "route=shop.company=company",
            "--config",
            "batch_rows=1",
        ];
        args.extend_from_slice(extra);
        host(&args)
    };
    let sql_of = |got: &[serde_json::Value], offset: i64| -> Vec<(String, serde_json::Value)> {
        got.iter()
            .filter(|l| l["type"] == "sql" && l["offset"] == offset)
            .map(|l| {
                (
                    l["statement"].as_str().unwrap().to_string(),
                    l["params"].clone(),
                )
            })
            .collect()
    };
    for db in Db::both() {
        create_company(&db);
        let out = test(&["--sink-db", &db.url]);
        assert!(out.status.success(), "{}: {}", db.name, stderr(&out));
        let got = json_lines(&out);
        // Offset 0's upsert, after the read of the table's columns (the
        // rehearsal that offset 1 broke is not printed; the one without
        // it starts on a fresh instance, which reads them again).
        let first = sql_of(&got, 0);
        let upsert = first
            .iter()
            .find(|(s, _)| s.starts_with("INSERT INTO \"company\""));
        let Some((_, params)) = upsert else {
            panic!("{}: no upsert at offset 0: {got:?}", db.name)
        };
        let params = params.as_array().unwrap();
        assert_eq!(params[1], "Acme");
        assert_eq!(params[3]["b64"], "AAEC/w==", "bytes as base64: {params:?}");
        let insert = got
            .iter()
            .find(|l| l["type"] == "sql" && l["offset"] == 0 && l["rows_changed"] == 1);
        assert!(insert.is_some(), "{}: the upsert ran: {got:?}", db.name);
        // Offset 1 breaks NOT NULL: a bad record of the sink (stage 1).
        let bad: Vec<_> = got.iter().filter(|l| l["type"] == "bad_record").collect();
        assert_eq!(bad.len(), 1, "{got:?}");
        assert_eq!(
            (bad[0]["offset"].clone(), bad[0]["stage"].clone()),
            (1.into(), 1.into())
        );
        assert!(
            bad[0]["error"].as_str().unwrap().contains("company.name"),
            "{bad:?}"
        );
        assert!(sql_of(&got, 1).is_empty(), "{got:?}");
        let delete = sql_of(&got, 2);
        assert_eq!(delete.len(), 1, "{got:?}");
        assert!(
            delete[0].0.starts_with("DELETE FROM \"company\""),
            "{delete:?}"
        );
        // Rolled back: the table is as it was.
        assert_eq!(db.scalar("SELECT COUNT(*) FROM company"), 0, "{}", db.name);
    }

    // No database: the table is guessed and its DDL logged.
    let out = test(&["--sink-dialect", "postgres"]);
    assert_eq!(out.status.code(), Some(1), "no table, no create=print");
    assert!(stderr(&out).contains("create=print"), "{}", stderr(&out));
    let out = test(&["--sink-dialect", "postgres", "--config", "create=print"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            r#"CREATE TABLE "company" ("id" BIGINT NOT NULL, "name" TEXT, "revenue" NUMERIC, "logo" TEXT, "_sluice_position" TEXT, PRIMARY KEY ("id"))"#
        ),
        "{err}"
    );
    let got = json_lines(&out);
    let first = sql_of(&got, 0);
    assert!(
        first
            .iter()
            .any(|(s, _)| s.contains("CAST(CAST($1 AS TEXT) AS int8)")),
        "{first:?}"
    );
    assert!(
        got.iter()
            .filter(|l| l["type"] == "sql")
            .all(|l| l.get("rows_changed").is_none())
    );
    // A dialect with a database is a usage error.
    let db = Db::sqlite();
    let out = test(&["--sink-db", &db.url, "--sink-dialect", "postgres"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}
