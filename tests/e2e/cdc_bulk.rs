//! The `cdc` sink on the SQL capability's bulk path (`sql.apply-versioned`)
//! with parts of many keys: on PostgreSQL those calls go by `COPY` and a
//! guarded merge, on SQLite by multi-row statements; typed columns, the
//! ordering rule (a replay held back, positions of another form applied
//! in stream order) and deletes end as the stream says.

use crate::support::kafka::{Broker, Mock, producer};
use crate::support::{Db, HostProcess, RunArgs};
use sluice_host::capability::sql::SqlValue;

fn maxwell(kind: &str, position: Option<u64>, data: &str) -> String {
    let position = position
        .map(|p| format!(r#","position":"mysql-bin.000003:{p}""#))
        .unwrap_or_default();
    format!(
        r#"{{"database":"shop","table":"company","type":"{kind}","ts":1,"xid":9{position},"data":{data}}}"#
    )
}

fn row(id: u32, name: &str) -> String {
    format!(
        r#"{{"id":{id},"name":"{name}","revenue":{id}.125,"founded":"2001-02-03","updated":"2020-01-02 03:04:05.123456"}}"#
    )
}

/// The changes the sink's warnings with `what` count, over all parts
/// ("table company: N change(s) of …").
fn reported(log: &str, what: &str) -> usize {
    log.lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| l.split("table company: ").nth(1))
        .filter_map(|l| l.split(' ').next()?.parse::<usize>().ok())
        .sum()
}

/// 1,000 inserts, 400 updates, 300 deletes, a replay of 400 inserts at
/// their old positions (held back), and 310 Maxwell bootstrap rows (no
/// binlog position: 300 new keys, 10 over rows at binlog positions,
/// applied in stream order with a warning), in parts of 2,000 records:
/// each flush keeps up to 1,000 keys, so calls of hundreds of rows.
#[test]
fn many_keys_a_part_go_by_copy_and_the_ordering_rule_holds() {
    for db in Db::both() {
        let pg = db.name != "sqlite";
        let (revenue, founded, updated) = match pg {
            true => ("NUMERIC(20,6)", "DATE", "TIMESTAMP"),
            false => ("TEXT", "TEXT", "TEXT"),
        };
        db.batch(&format!(
            "CREATE TABLE company (id BIGINT PRIMARY KEY, name TEXT NOT NULL, revenue {revenue}, \
             founded {founded}, updated {updated}, _sluice_position TEXT)"
        ));
        let mock = Mock::new();
        mock.create_topic("cdc", 1);
        // (id, event): Maxwell's Kafka key carries the primary key.
        let mut events: Vec<(u32, String)> = Vec::new();
        let at = |base: u64, id: u32| Some(base + u64::from(id));
        for id in 1..=1000 {
            events.push((id, maxwell("insert", at(1_000, id), &row(id, "first"))));
        }
        for id in 1..=400 {
            events.push((id, maxwell("update", at(5_000, id), &row(id, "updated"))));
        }
        for id in 701..=1000 {
            events.push((id, maxwell("delete", at(9_000, id), &row(id, "gone"))));
        }
        for id in 1..=400 {
            events.push((id, maxwell("insert", at(1_000, id), &row(id, "replayed"))));
        }
        for id in (1..=10).chain(2001..=2300) {
            events.push((id, maxwell("bootstrap-insert", None, &row(id, "bootstrap"))));
        }
        let p = producer(&mock.bootstrap());
        for (id, e) in &events {
            let key = format!(r#"{{"database":"shop","table":"company","pk.id":{id}}}"#);
            p.send("cdc", 0, Some(key.as_bytes()), Some(e.as_bytes()), &[]);
        }
        p.flush();
        let dir = tempfile::tempdir().unwrap();
        let args = RunArgs::new(&mock.bootstrap(), &["cdc"], &dir.path().join("ck"))
            .sink_db(&db)
            .plugin("cdc")
            .args([
                "--config",
                "route=shop.company=company",
                "--config",
                "format=maxwell",
                "--until-caught-up",
            ])
            .build();
        let (code, log) = HostProcess::spawn(
            &args,
            &[("RUST_LOG", "info,sluice_host::capability::sql=debug")],
        )
        .finish();
        assert_eq!(code, Some(0), "{log}");
        assert_eq!(
            log.contains("rows loaded by COPY"),
            pg,
            "COPY on PostgreSQL only"
        );
        assert_eq!(reported(&log, "not applied"), 400, "the replay: {log}");
        assert_eq!(
            reported(&log, "applied in stream order"),
            10,
            "the bootstrap over binlog rows: {log}"
        );
        let mut want: Vec<(i64, String)> = Vec::new();
        for id in (1..=700).chain(2001..=2300) {
            let name = match id {
                1..=10 | 2001.. => "bootstrap",
                11..=400 => "updated",
                _ => "first",
            };
            want.push((i64::from(id), name.to_string()));
        }
        let got: Vec<(i64, String)> = db
            .query("SELECT id, name FROM company ORDER BY id")
            .into_iter()
            .map(|r| match r.as_slice() {
                [SqlValue::Integer(id), SqlValue::Text(name)] => (*id, name.clone()),
                other => panic!("unexpected row {other:?}"),
            })
            .collect();
        assert_eq!(got, want, "{}", db.name);
        // Typed values, exactly, whichever way they went.
        let typed = db.query(
            "SELECT CAST(revenue AS TEXT), CAST(founded AS TEXT), CAST(updated AS TEXT), \
             _sluice_position FROM company WHERE id = 500",
        );
        let (revenue, updated) = match pg {
            true => ("500.125000", "2020-01-02 03:04:05.123456"),
            false => ("500.125", "2020-01-02 03:04:05.123456"),
        };
        assert_eq!(
            typed,
            vec![vec![
                SqlValue::Text(revenue.into()),
                SqlValue::Text("2001-02-03".into()),
                SqlValue::Text(updated.into()),
                SqlValue::Text("mysql:0000000003:00000000000000001500:0000000000".into()),
            ]],
            "{}",
            db.name
        );
    }
}
