//! Tests of a plugin's `apply-versioned` (the bulk path with a version
//! guard) on real SQLite and PostgreSQL databases: the table ends as the
//! changes applied one by one under the guard would leave it, by
//! statements and (PostgreSQL, 256 rows and more) by `COPY`.

use std::collections::BTreeMap;

use super::bulk::Change;
use super::tests::{grants, window};
use super::*;

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

fn text(s: &str) -> SqlValue {
    SqlValue::Text(s.into())
}

/// What one change does to a row one by one under the guard: `stored`
/// the row's version (`None`: NULL), `low` the call's, `change` its own.
fn passes(stored: Option<&str>, low: &str, change: &str) -> bool {
    stored.is_none_or(|s| s >= low && s <= change)
}

/// The table as (k, v, version), ordered by k.
fn table(g: &SqlGrant) -> Vec<(String, i64, Option<String>)> {
    let q = g
        .plugin_query("SELECT k, v, ver FROM ver_t ORDER BY k", &[])
        .unwrap();
    q.rows
        .into_iter()
        .map(|r| match r.as_slice() {
            [SqlValue::Text(k), SqlValue::Integer(v), ver] => (
                k.clone(),
                *v,
                match ver {
                    SqlValue::Text(t) => Some(t.clone()),
                    _ => None,
                },
            ),
            other => panic!("unexpected row {other:?}"),
        })
        .collect()
}

/// Calls of many sizes over a key space of `keys`, each of one domain
/// (`a:` or, now and then, `b:`) with versions that go back now and
/// then (a replay), a key's changes in one call in version order; rows
/// of NULL version made by a statement of their own. The table ends as
/// the changes one by one under the guard, and a call of distinct keys
/// counts exactly the changes that passed it.
fn one_by_one(keys: u64) {
    let d = tempfile::tempdir().unwrap();
    for g in grants(d.path()) {
        window(&g);
        g.plugin_execute("DROP TABLE IF EXISTS ver_t", &[]).unwrap();
        g.plugin_execute(
            "CREATE TABLE ver_t (k TEXT PRIMARY KEY, v BIGINT NOT NULL, ver TEXT)",
            &[],
        )
        .unwrap();
        let columns = names(&["k", "v", "ver"]);
        let key = names(&["k"]);
        let mut model: BTreeMap<String, (i64, Option<String>)> = BTreeMap::new();
        let mut seed: u64 = 0x7e55;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let mut clock: u64 = 1_000;
        for call in 0..40 {
            let len = [1, 2, 40, 255, 256, 700, 1500][call % 7];
            let domain = if next(6) == 0 { "b:" } else { "a:" };
            // Now and then the versions go back (a replay).
            clock = clock.saturating_sub(next(3) * 400) + 1;
            let mut changes = Vec::new();
            let mut distinct = std::collections::HashSet::new();
            let mut passed = 0;
            for _ in 0..len {
                clock += next(3);
                let version = format!("{domain}{clock:010}");
                let k = format!("k{}", next(keys));
                distinct.insert(k.clone());
                let stored = model.get(&k).map(|(_, s)| s.as_deref());
                let exists = stored.is_some();
                let ok = passes(stored.flatten(), domain, &version);
                if next(4) == 0 {
                    if exists && ok {
                        model.remove(&k);
                        passed += 1;
                    }
                    changes.push(Change::Delete(vec![text(&k), text(&version)]));
                } else {
                    let v = next(1_000_000) as i64;
                    if !exists || ok {
                        model.insert(k.clone(), (v, Some(version.clone())));
                        passed += 1;
                    }
                    changes.push(Change::Upsert(vec![
                        text(&k),
                        SqlValue::Integer(v),
                        text(&version),
                    ]));
                }
            }
            let n = g
                .plugin_apply(
                    ("ver_t", &columns, &key),
                    Some(("ver", text(domain))),
                    changes,
                )
                .unwrap();
            if distinct.len() == len {
                assert_eq!(n, passed, "rows changed by call {call}");
            }
            // A few rows of no version, as rows made before the sink.
            let k = format!("k{}", next(keys));
            g.plugin_execute("UPDATE ver_t SET ver = NULL WHERE k = $1", &[text(&k)])
                .unwrap();
            if let Some(row) = model.get_mut(&k) {
                row.1 = None;
            }
            let want: Vec<(String, i64, Option<String>)> = model
                .iter()
                .map(|(k, (v, s))| (k.clone(), *v, s.clone()))
                .collect();
            assert_eq!(table(&g), want, "{:?} after call {call}", g.dialect());
        }
        if g.dialect() == Dialect::Postgres {
            assert_eq!(super::apply_tests::staged(&g), keys > 1_000, "COPY used");
        }
        g.lock().rollback();
    }
}

#[test]
fn apply_versioned_ends_as_the_changes_one_by_one_under_the_guard() {
    one_by_one(60);
}

/// The same over 5,000 keys: calls of 256 rows and more go by `COPY` and
/// a guarded merge on PostgreSQL.
#[test]
fn apply_versioned_by_copy_ends_as_the_changes_one_by_one_under_the_guard() {
    one_by_one(5_000);
}

/// No low version: every older version is held back, any newer applies;
/// a version column that is a key column, or not a column, is refused;
/// a delete without its version is named.
#[test]
fn apply_versioned_without_a_low_version_and_its_refusals() {
    let d = tempfile::tempdir().unwrap();
    for g in grants(d.path()) {
        window(&g);
        g.plugin_execute("DROP TABLE IF EXISTS ver_n", &[]).unwrap();
        g.plugin_execute(
            "CREATE TABLE ver_n (k TEXT PRIMARY KEY, v BIGINT NOT NULL, ver BIGINT)",
            &[],
        )
        .unwrap();
        let columns = names(&["k", "v", "ver"]);
        let key = names(&["k"]);
        let t = ("ver_n", &columns[..], &key[..]);
        let int = SqlValue::Integer;
        let up = |k: &str, v: i64, ver: i64| Change::Upsert(vec![text(k), int(v), int(ver)]);
        let none = || Some(("ver", SqlValue::Null));
        assert_eq!(
            g.plugin_apply(t, none(), vec![up("a", 1, 10), up("b", 1, 10)]),
            Ok(2)
        );
        assert_eq!(
            g.plugin_apply(t, none(), vec![up("a", 2, 9), up("b", 2, 11)]),
            Ok(1)
        );
        assert_eq!(
            g.plugin_apply(
                t,
                none(),
                vec![
                    Change::Delete(vec![text("a"), int(9)]),
                    Change::Delete(vec![text("b"), int(11)])
                ]
            ),
            Ok(1)
        );
        let q = g.plugin_query("SELECT k, v, ver FROM ver_n", &[]).unwrap();
        assert_eq!(q.rows, vec![vec![text("a"), int(1), int(10)]]);
        for (column, why) in [("k", "not a key column"), ("x", "one of the columns")] {
            let (row, e) = g
                .plugin_apply(t, Some((column, SqlValue::Null)), vec![up("a", 1, 1)])
                .unwrap_err();
            assert_eq!(row, 0);
            assert!(e.message.contains(why), "{e}");
            g.lock().end_plugin_window();
            g.lock().rollback();
            window(&g);
        }
        let (row, e) = g
            .plugin_apply(
                t,
                none(),
                vec![up("a", 1, 1), Change::Delete(vec![text("a")])],
            )
            .unwrap_err();
        assert_eq!(row, 1);
        assert!(
            e.message.contains("carries 1 values, table ver_n takes 2"),
            "{e}"
        );
        g.lock().end_plugin_window();
        g.lock().rollback();
    }
}

/// Names a plain identifier cannot write — upper case, a reserved word,
/// a space — given delimited, by statements and by `COPY`.
#[test]
fn apply_versioned_takes_delimited_names() {
    let d = tempfile::tempdir().unwrap();
    for g in grants(d.path()) {
        window(&g);
        g.plugin_execute("DROP TABLE IF EXISTS \"Order Lines\"", &[])
            .unwrap();
        g.plugin_execute(
            "CREATE TABLE \"Order Lines\" (\"Key\" TEXT PRIMARY KEY, \"group\" BIGINT, \"Ver\" TEXT)",
            &[],
        )
        .unwrap();
        let columns = names(&["\"Key\"", "\"group\"", "\"Ver\""]);
        let key = names(&["\"Key\""]);
        let t = ("\"Order Lines\"", &columns[..], &key[..]);
        for (n, version) in [(300, "a:2"), (10, "a:1"), (10, "a:3")] {
            let changes: Vec<Change> = (0..n)
                .map(|i| {
                    Change::Upsert(vec![
                        text(&format!("k{i}")),
                        SqlValue::Integer(i as i64),
                        text(version),
                    ])
                })
                .collect();
            let applied = g.plugin_apply(t, Some(("\"Ver\"", text("a:"))), changes);
            assert_eq!(applied, Ok(if version == "a:1" { 0 } else { n as u64 }));
        }
        let q = g
            .plugin_query(
                "SELECT count(*), min(\"Ver\"), max(\"Ver\") FROM \"Order Lines\"",
                &[],
            )
            .unwrap();
        assert_eq!(
            q.rows,
            vec![vec![SqlValue::Integer(300), text("a:2"), text("a:3")]]
        );
        if g.dialect() == Dialect::Postgres {
            assert!(super::apply_tests::staged(&g), "COPY used");
        }
        g.lock().rollback();
    }
}
