//! One timestamp rule for `host run` and `host test`: a record without a
//! timestamp (Kafka's `-1`) reaches plugins as `0` / `not-available`, the
//! form the WIT contract documents.

use crate::support::kafka::{Broker, Mock, producer};
use crate::support::{Db, host, plugin, stderr};
use sluice_host::capability::sql::SqlValue;

/// What the misbehave fixture saw for records with these producer
/// timestamps, under `host run` (read from the mock cluster, written by
/// sql-counter into `seen`).
fn seen_by_run(stamps: &[i64]) -> Vec<String> {
    let mock = Mock::new();
    mock.create_topic("ts", 1);
    let p = producer(&mock.bootstrap());
    for ms in stamps {
        p.send_at("ts", 0, b"timestamp", *ms);
    }
    p.flush();
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite();
    let (m, c) = (plugin("misbehave"), plugin("sql_counter"));
    let out = host(&[
        "run",
        "--brokers",
        &mock.bootstrap(),
        "--topic",
        "ts",
        "--checkpoint",
        dir.path().join("ckpt").to_str().unwrap(),
        "--sink-db",
        &db.url,
        "--plugin",
        m.to_str().unwrap(),
        "--plugin",
        c.to_str().unwrap(),
        "--until-caught-up",
        "--progress",
        "none",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    db.query("SELECT value FROM seen ORDER BY idempotency_key")
        .into_iter()
        .map(|r| match &r[0] {
            SqlValue::Text(v) => v.clone(),
            other => panic!("{other:?}"),
        })
        .collect()
}

/// The same under `host test`, from a records file.
fn seen_by_test(stamps: &[i64]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let lines: Vec<String> = stamps
        .iter()
        .map(|ms| format!("{{\"timestamp\":{ms},\"value\":\"timestamp\"}}"))
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let m = plugin("misbehave");
    let out = host(&[
        "test",
        "--plugin",
        m.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--format",
        "records",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    crate::support::json_lines(&out)
        .into_iter()
        .map(|l| l["value"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_missing_timestamp_reaches_plugins_alike_under_run_and_test() {
    let stamps = [-1, 1_700_000_000_123];
    let want = vec![
        "timestamp: 0 NotAvailable".to_string(),
        "timestamp: 1700000000123 CreateTime".to_string(),
    ];
    assert_eq!(seen_by_run(&stamps), want);
    assert_eq!(seen_by_test(&stamps), want);
    // Other negative stamps are no timestamp either (under `host test`;
    // a broker refuses them).
    assert_eq!(seen_by_test(&[-5]), want[..1].to_vec());
}
