//! Tests of a plugin's `apply` (the bulk path) on real SQLite and
//! PostgreSQL databases: the table ends as the changes applied one by
//! one would leave it, and the statements it makes are held to the same
//! guard, role and transaction as a plugin's own.

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

/// The table's rows as (k, v, extra), ordered by k.
fn rows(g: &SqlGrant, table: &str) -> Vec<(String, i64, String)> {
    let q = g
        .plugin_query(&format!("SELECT k, v, extra FROM {table} ORDER BY k"), &[])
        .unwrap();
    q.rows
        .into_iter()
        .map(|r| match r.as_slice() {
            [SqlValue::Text(k), SqlValue::Integer(v), SqlValue::Text(e)] => {
                (k.clone(), *v, e.clone())
            }
            other => panic!("unexpected row {other:?}"),
        })
        .collect()
}

/// Thousands of changes over few keys, cut into calls of many sizes, end
/// as the same changes one by one: the deleted keys gone, each other key
/// with its last value, and a column the upserts do not list back at its
/// default where the key was deleted and inserted again.
#[test]
fn apply_ends_as_the_changes_one_by_one() {
    one_by_one(40);
}

/// The same over 5,000 keys: the larger calls keep hundreds of rows after
/// the fold, which go by `COPY` and merge on PostgreSQL (the staging
/// table shows it), the smaller ones by statements, on one table.
#[test]
fn apply_by_copy_ends_as_the_changes_one_by_one() {
    one_by_one(5_000);
}

/// Whether `g`'s connection holds a bulk-path staging table (PostgreSQL).
pub(super) fn staged(g: &SqlGrant) -> bool {
    let mut s = g.lock();
    let q = s
        .backend()
        .query(
            "SELECT count(*) FROM pg_class WHERE relname LIKE 'sluice\\_stage\\_%' \
               AND relpersistence = 't' AND pg_table_is_visible(oid)",
            &[],
        )
        .unwrap();
    q.rows != vec![vec![SqlValue::Integer(0)]]
}

fn one_by_one(key_space: u64) {
    let d = tempfile::tempdir().unwrap();
    for g in grants(d.path()) {
        window(&g);
        g.plugin_execute("DROP TABLE IF EXISTS bulk_t", &[])
            .unwrap();
        g.plugin_execute(
            "CREATE TABLE bulk_t (k TEXT PRIMARY KEY, v BIGINT NOT NULL, extra TEXT NOT NULL DEFAULT 'default')",
            &[],
        )
        .unwrap();
        let columns = names(&["k", "v"]);
        let key = names(&["k"]);
        // Rows marked by a statement of their own keep the mark through
        // upserts, lose it through a delete.
        let mut model: BTreeMap<String, (i64, String)> = BTreeMap::new();
        let mut seed: u64 = 0x5eed;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let mut applied = 0;
        for call in 0..60 {
            let len = [0, 1, 2, 3, 63, 64, 65, 511, 512, 513, 1500][call % 11];
            let mut changes = Vec::new();
            for _ in 0..len {
                let k = format!("k{}", next(key_space));
                if next(4) == 0 {
                    model.remove(&k);
                    changes.push(Change::Delete(vec![text(&k)]));
                } else {
                    let v = next(1_000_000) as i64;
                    model
                        .entry(k.clone())
                        .and_modify(|e| e.0 = v)
                        .or_insert((v, "default".into()));
                    changes.push(Change::Upsert(vec![text(&k), SqlValue::Integer(v)]));
                }
            }
            applied += len;
            g.plugin_apply(("bulk_t", &columns, &key), None, changes)
                .unwrap();
            g.plugin_execute(
                "UPDATE bulk_t SET extra = 'marked' WHERE extra = 'default'",
                &[],
            )
            .unwrap();
            for e in model.values_mut() {
                e.1 = "marked".into();
            }
            let want: Vec<(String, i64, String)> = model
                .iter()
                .map(|(k, (v, e))| (k.clone(), *v, e.clone()))
                .collect();
            assert_eq!(
                rows(&g, "bulk_t"),
                want,
                "{:?} after call {call}",
                g.dialect()
            );
        }
        assert!(applied > 10_000);
        // A delete then an upsert of one key in one call: the unlisted
        // column is back at its default, as one by one.
        g.plugin_apply(
            ("bulk_t", &columns, &key),
            None,
            vec![
                Change::Upsert(vec![text("z"), SqlValue::Integer(1)]),
                Change::Delete(vec![text("z")]),
                Change::Upsert(vec![text("z"), SqlValue::Integer(2)]),
            ],
        )
        .unwrap();
        g.plugin_execute("UPDATE bulk_t SET extra = 'marked' WHERE k = 'z'", &[])
            .unwrap();
        g.plugin_apply(
            ("bulk_t", &columns, &key),
            None,
            vec![
                Change::Delete(vec![text("z")]),
                Change::Upsert(vec![text("z"), SqlValue::Integer(3)]),
                Change::Upsert(vec![text("z"), SqlValue::Integer(4)]),
            ],
        )
        .unwrap();
        let z = g
            .plugin_query("SELECT v, extra FROM bulk_t WHERE k = 'z'", &[])
            .unwrap();
        assert_eq!(z.rows, vec![vec![SqlValue::Integer(4), text("default")]]);
        if g.dialect() == Dialect::Postgres {
            assert_eq!(staged(&g), key_space > 1_000, "COPY used");
        }
        g.lock().rollback();
    }
}

/// A key of two columns, a key-only table, NULL keys (never folded), and
/// the count of rows changed.
#[test]
fn apply_takes_keys_of_several_columns_and_counts_rows() {
    let d = tempfile::tempdir().unwrap();
    for g in grants(d.path()) {
        window(&g);
        g.plugin_execute("DROP TABLE IF EXISTS bulk_two", &[])
            .unwrap();
        g.plugin_execute(
            "CREATE TABLE bulk_two (a BIGINT NOT NULL, b TEXT NOT NULL, v TEXT, PRIMARY KEY (a, b))",
            &[],
        )
        .unwrap();
        let t = (
            "bulk_two",
            &names(&["a", "b", "v"])[..],
            &names(&["a", "b"])[..],
        );
        let up =
            |a: i64, b: &str, v: &str| Change::Upsert(vec![SqlValue::Integer(a), text(b), text(v)]);
        let changes: Vec<Change> = (0..700)
            .map(|i| up(i % 300, "x", &format!("v{i}")))
            .collect();
        assert_eq!(g.plugin_apply(t, None, changes), Ok(300));
        let del = |a: i64, b: &str| Change::Delete(vec![SqlValue::Integer(a), text(b)]);
        let changes = vec![del(1, "x"), del(2, "x"), del(2, "y"), up(3, "y", "new")];
        assert_eq!(g.plugin_apply(t, None, changes), Ok(3));
        let q = g
            .plugin_query("SELECT COUNT(*), MAX(v) FROM bulk_two WHERE b = 'x'", &[])
            .unwrap();
        assert_eq!(q.rows, vec![vec![SqlValue::Integer(298), text("v699")]]);

        g.plugin_execute("DROP TABLE IF EXISTS bulk_keys", &[])
            .unwrap();
        g.plugin_execute("CREATE TABLE bulk_keys (k TEXT UNIQUE)", &[])
            .unwrap();
        let t = ("bulk_keys", &names(&["k"])[..], &names(&["k"])[..]);
        let changes = vec![
            Change::Upsert(vec![text("a")]),
            Change::Upsert(vec![text("a")]),
            Change::Upsert(vec![SqlValue::Null]),
            Change::Upsert(vec![SqlValue::Null]),
        ];
        assert_eq!(g.plugin_apply(t, None, changes), Ok(3));
        let q = g
            .plugin_query("SELECT COUNT(*) FROM bulk_keys", &[])
            .unwrap();
        assert_eq!(q.rows, vec![vec![SqlValue::Integer(3)]]);
        g.lock().rollback();
    }
}

/// The bulk path is a plugin's statements: a bad target or change, a
/// failing row and a host table all fail the range, and the error names
/// the change.
#[test]
fn apply_is_held_to_the_guard_and_fails_the_range() {
    let d = tempfile::tempdir().unwrap();
    for g in grants(d.path()) {
        // A host table (on SQLite the authorizer refuses the compiled
        // statement, so the table is there; PostgreSQL's guard refuses
        // the text, and the suite's database keeps its own).
        if g.dialect() == Dialect::Sqlite {
            let mut s = g.lock();
            s.backend()
                .batch("CREATE TABLE IF NOT EXISTS sluice_progress (query_id TEXT PRIMARY KEY, v TEXT)")
                .unwrap();
        }
        // Outside a range's window, even with nothing to apply.
        let key = names(&["k"]);
        let (_, e) = g.plugin_apply(("t", &key, &key), None, vec![]).unwrap_err();
        assert!(e.message.contains("only available inside sink"), "{e}");
        window(&g);
        let (row, e) = g
            .plugin_apply(
                (
                    "sluice_progress",
                    &names(&["query_id", "v"]),
                    &names(&["query_id"]),
                ),
                None,
                vec![Change::Upsert(vec![text("q"), text("forged")])],
            )
            .unwrap_err();
        assert_eq!(row, 0);
        assert!(
            e.message
                .contains("table sluice_progress belongs to the host"),
            "{:?}: {e}",
            g.dialect()
        );
        let after = g.plugin_execute("SELECT 1", &[]).unwrap_err();
        assert!(after.message.contains("already failed"), "{after}");
        g.lock().rollback();

        for (table, columns, key, why) in [
            (
                "t; DROP TABLE x",
                vec!["k"],
                vec!["k"],
                "not a plain SQL identifier",
            ),
            ("t", vec!["k"], vec!["v"], "key column v is not a column"),
            ("t", vec!["k", "k"], vec!["k"], "each named once"),
        ] {
            window(&g);
            let (row, e) = g
                .plugin_apply((table, &names(&columns), &names(&key)), None, vec![])
                .unwrap_err();
            assert_eq!((row, e.code.as_str()), (0, "sluice"));
            assert!(e.message.contains(why), "{e}");
            assert!(g.plugin_execute("SELECT 1", &[]).is_err());
            g.lock().rollback();
        }

        window(&g);
        g.plugin_execute("DROP TABLE IF EXISTS bulk_nn", &[])
            .unwrap();
        g.plugin_execute(
            "CREATE TABLE bulk_nn (k TEXT PRIMARY KEY, v BIGINT NOT NULL)",
            &[],
        )
        .unwrap();
        let t = ("bulk_nn", &names(&["k", "v"])[..], &names(&["k"])[..]);
        let (row, e) = g
            .plugin_apply(t, None, vec![Change::Upsert(vec![text("a")])])
            .unwrap_err();
        assert_eq!(row, 0);
        assert!(e.message.contains("carries 1 values"), "{e}");
        g.lock().rollback();

        // 600 upserts go as a 512-row statement, then 64 and 16 and 8:
        // a NULL in upsert 590 fails the 16-row statement from upsert 576.
        window(&g);
        g.plugin_execute(
            "CREATE TABLE bulk_nn (k TEXT PRIMARY KEY, v BIGINT NOT NULL)",
            &[],
        )
        .unwrap();
        // Change 0 a delete, so the upserts are changes 1 to 600.
        let mut changes = vec![Change::Delete(vec![text("gone")])];
        changes.extend((0..600).map(|i| {
            let v = if i == 590 {
                SqlValue::Null
            } else {
                SqlValue::Integer(i)
            };
            Change::Upsert(vec![text(&format!("k{i}")), v])
        }));
        let (row, e) = g.plugin_apply(t, None, changes).unwrap_err();
        // By `COPY` on PostgreSQL: the merge carries every upsert, from
        // change 1.
        let first = match g.dialect() {
            Dialect::Sqlite => 577,
            Dialect::Postgres => 1,
        };
        assert_eq!(row, first, "{e}");
        assert!(
            e.code == "23502" || e.code.starts_with("SQLITE_CONSTRAINT"),
            "{e:?}"
        );
        g.lock().rollback();
    }
}

/// On PostgreSQL the statements run in the plugin's role: a table the
/// role was not granted is refused by the database itself.
#[test]
fn apply_runs_in_the_plugin_role() {
    let Ok(url) = std::env::var("SLUICE_TEST_PG_URL") else {
        return;
    };
    let g = SqlGrant::connect(&url).unwrap();
    let role = "sluice_test_apply_role";
    {
        let mut s = g.lock();
        let b = s.backend();
        // What an earlier run left (fails when there was none).
        let _ = b.batch(&format!("REVOKE ALL ON SCHEMA public FROM {role}"));
        b.batch(&format!(
            "DROP TABLE IF EXISTS bulk_private; CREATE TABLE bulk_private (k TEXT PRIMARY KEY); \
             DROP TABLE IF EXISTS bulk_granted; CREATE TABLE bulk_granted (k TEXT PRIMARY KEY); \
             DROP ROLE IF EXISTS {role}; CREATE ROLE {role} NOLOGIN; \
             GRANT {role} TO CURRENT_USER; GRANT USAGE ON SCHEMA public TO {role}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON bulk_granted TO {role}"
        ))
        .unwrap();
    }
    g.set_plugin_role(Some(role.into())).unwrap();
    let key = names(&["k"]);
    window(&g);
    assert_eq!(
        g.plugin_apply(
            ("bulk_granted", &key, &key),
            None,
            vec![Change::Upsert(vec![text("a")])]
        ),
        Ok(1)
    );
    let (_, e) = g
        .plugin_apply(
            ("bulk_private", &key, &key),
            None,
            vec![Change::Upsert(vec![text("a")])],
        )
        .unwrap_err();
    assert_eq!(e.code, "42501", "{e}");
    g.lock().end_plugin_window();
    g.lock().rollback();
    g.set_plugin_role(None).unwrap();
    g.lock()
        .backend()
        .batch(&format!(
            "DROP TABLE bulk_private; DROP TABLE bulk_granted; \
             REVOKE ALL ON SCHEMA public FROM {role}; DROP ROLE {role}"
        ))
        .unwrap();
}

/// On PostgreSQL, the `COPY` form as a plugin role: a committed part's
/// staged rows never reach the next part; a value the host cannot encode,
/// or the server refuses, fails the range naming its change; a column
/// whose type changed gets a new staging table; and a role without the
/// TEMPORARY privilege gets the statements instead, with the same result.
#[test]
fn apply_by_copy_as_a_plugin_role_across_parts_types_and_privileges() {
    let Ok(url) = std::env::var("SLUICE_TEST_PG_URL") else {
        return;
    };
    let admin = SqlGrant::connect(&url).unwrap();
    let db = "sluice_test_copy_temp";
    let role = "sluice_test_copy_role";
    let sql = |g: &SqlGrant, sql: &str| g.lock().backend().batch(sql).unwrap();
    sql(&admin, &format!("DROP DATABASE IF EXISTS {db}"));
    sql(&admin, &format!("CREATE DATABASE {db}"));
    let _ = admin
        .lock()
        .backend()
        .batch(&format!("DROP ROLE IF EXISTS {role}"));
    sql(&admin, &format!("CREATE ROLE {role} NOLOGIN"));
    let db_url = format!("{}/{db}", url.rsplit_once('/').map(|(b, _)| b).unwrap());
    let connect = || {
        let g = SqlGrant::connect(&db_url).unwrap();
        g.set_plugin_role(Some(role.into())).unwrap();
        g
    };
    let g = connect();
    sql(
        &g,
        &format!(
            "CREATE TABLE big (k TEXT PRIMARY KEY, v BIGINT NOT NULL, s VARCHAR(3)); \
             GRANT {role} TO CURRENT_USER; GRANT USAGE ON SCHEMA public TO {role}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON big TO {role}"
        ),
    );
    let columns = names(&["k", "v", "s"]);
    let key = names(&["k"]);
    let t = ("big", &columns[..], &key[..]);
    let up =
        |i: usize, v: SqlValue, s: &str| Change::Upsert(vec![text(&format!("k{i}")), v, text(s)]);
    let int = |i: usize| SqlValue::Integer(i as i64);
    let commit = |g: &SqlGrant| {
        assert_eq!(g.lock().end_plugin_window(), None);
        g.lock().commit().unwrap();
    };
    let count_sum = |g: &SqlGrant| {
        g.plugin_query("SELECT count(*), coalesce(sum(v), 0)::text FROM big", &[])
            .unwrap()
            .rows
    };

    window(&g);
    assert_eq!(
        g.plugin_apply(t, None, (0..1000).map(|i| up(i, int(i), "a")).collect()),
        Ok(1000)
    );
    assert!(staged(&g), "COPY as the plugin role");
    commit(&g);
    // The next part deletes half and rewrites the rest: had the first
    // part's rows stayed staged, the merge would bring them back.
    window(&g);
    let mut changes: Vec<Change> = (0..500)
        .map(|i| Change::Delete(vec![text(&format!("k{i}"))]))
        .collect();
    changes.extend((500..1000).map(|i| up(i, int(1), "b")));
    assert_eq!(g.plugin_apply(t, None, changes), Ok(1000));
    assert_eq!(
        count_sum(&g),
        vec![vec![SqlValue::Integer(500), text("500")]]
    );
    commit(&g);

    // A value the host cannot encode for the column (change 700), and one
    // the server refuses (change 800: too long for varchar(3)).
    // Both are data exceptions (class 22), never a lost connection.
    for (bad, want, code) in [
        (up(700, text("not a number"), "a"), 700, "22P02"),
        (up(800, int(1), "too long"), 800, "22001"),
    ] {
        window(&g);
        let mut changes: Vec<Change> = (0..1000).map(|i| up(i, int(i), "c")).collect();
        changes[want] = bad;
        let (row, e) = g.plugin_apply(t, None, changes).unwrap_err();
        assert_eq!(row, want, "{e}");
        assert_eq!(e.code, code, "{e}");
        assert!(
            g.plugin_execute("SELECT 1", &[]).is_err(),
            "the range failed"
        );
        g.lock().end_plugin_window();
        g.lock().rollback();
    }
    // The column widened: a new staging table takes the long value.
    sql(&g, "ALTER TABLE big ALTER COLUMN s TYPE TEXT");
    window(&g);
    let mut changes: Vec<Change> = (0..1000).map(|i| up(i, int(2), "d")).collect();
    changes[800] = up(800, int(2), "no longer too long");
    assert_eq!(g.plugin_apply(t, None, changes), Ok(1000));
    commit(&g);

    // Without TEMPORARY (PUBLIC's, revoked), a new connection: statements,
    // same rows, no staging table.
    sql(
        &admin,
        &format!("REVOKE TEMPORARY ON DATABASE {db} FROM PUBLIC"),
    );
    let g2 = connect();
    window(&g2);
    assert_eq!(
        g2.plugin_apply(t, None, (0..1000).map(|i| up(i, int(3), "e")).collect()),
        Ok(1000)
    );
    assert!(!staged(&g2));
    assert_eq!(
        count_sum(&g2),
        vec![vec![SqlValue::Integer(1000), text("3000")]]
    );
    commit(&g2);
    drop((g, g2));
    sql(&admin, &format!("DROP DATABASE {db}"));
    sql(&admin, &format!("DROP ROLE {role}"));
}

/// On PostgreSQL, text (and integer) values reach columns of types the
/// host has no binary encoder for — `uuid`, `numeric(10,2)`, `timestamp`,
/// `date`, `bit(3)`, an enum — read by the types' own input functions,
/// alike by statements (a call of 10 rows) and by `COPY` (a call of 300,
/// with deletes by a `uuid` key); a value the type refuses fails the call
/// in both forms.
#[test]
fn apply_binds_text_to_typed_columns_alike_by_statements_and_by_copy() {
    let Ok(url) = std::env::var("SLUICE_TEST_PG_URL") else {
        return;
    };
    let g = SqlGrant::connect(&url).unwrap();
    let sql = |sql: &str| g.lock().backend().batch(sql).unwrap();
    sql("DROP TABLE IF EXISTS typed_by_copy, typed_by_statements; \
         DROP TYPE IF EXISTS typed_mood; CREATE TYPE typed_mood AS ENUM ('sad', 'ok', 'happy')");
    for t in ["typed_by_copy", "typed_by_statements"] {
        sql(&format!(
            "CREATE TABLE {t} (k uuid PRIMARY KEY, n numeric(10,2), ts timestamp, d date, \
             b bit(3), m typed_mood, i bigint, f float8)"
        ));
    }
    let columns = names(&["k", "n", "ts", "d", "b", "m", "i", "f"]);
    let key = names(&["k"]);
    let uuid = |i: usize| text(&format!("00000000-0000-4000-8000-{i:012}"));
    let change = |i: usize| {
        if i % 7 == 3 {
            // A key upserted below (i - 1 < i), deleted again here.
            return Change::Delete(vec![uuid(i - 1)]);
        }
        Change::Upsert(vec![
            uuid(i),
            text(&format!("{}.{:03}", i, i % 1000)),
            text(&format!("2024-03-01 10:00:{:02}.123456", i % 60)),
            text("2024-02-29"),
            text(["101", "010", "111"][i % 3]),
            text(["sad", "ok", "happy"][i % 3]),
            SqlValue::Integer(i as i64),
            text("0.25"),
        ])
    };
    let changes: Vec<Change> = (0..300).map(change).collect();
    window(&g);
    let copied = g.plugin_apply(("typed_by_copy", &columns, &key), None, changes.clone());
    assert!(copied.is_ok(), "{copied:?}");
    assert!(staged(&g), "the 300-row call went by COPY");
    for part in changes.chunks(10) {
        let applied = g.plugin_apply(("typed_by_statements", &columns, &key), None, part.to_vec());
        assert!(applied.is_ok(), "{applied:?}");
    }
    let all = |t: &str| {
        g.plugin_query(
            &format!("SELECT CAST({t} AS text) FROM {t} ORDER BY k"),
            &[],
        )
        .unwrap()
        .rows
    };
    let (by_copy, by_statements) = (all("typed_by_copy"), all("typed_by_statements"));
    assert_eq!(by_copy.len(), 300 - 2 * 43, "deletes applied");
    assert_eq!(by_copy, by_statements);
    assert_eq!(
        by_copy[1],
        vec![text(
            "(00000000-0000-4000-8000-000000000001,1.00,\"2024-03-01 10:00:01.123456\",2024-02-29,010,ok,1,0.25)"
        )],
        "numeric(10,2) rounds 1.001 as a cast would"
    );
    // A value the type refuses fails the call, reported as the first
    // change of the failing statement: the 10-row statement's, or the
    // merge's (a staged text column is read as its type in the merge, so
    // `COPY` itself cannot name the row).
    for (t, n) in [("typed_by_copy", 300), ("typed_by_statements", 10)] {
        let mut changes: Vec<Change> = (1000..1000 + n).map(change).collect();
        let bad = n - 1; // an upsert ((1000 + bad) % 7 != 3)
        if let Change::Upsert(row) = &mut changes[bad] {
            row[3] = text("2024-02-30");
        }
        let (row, e) = g
            .plugin_apply((t, &columns, &key), None, changes)
            .unwrap_err();
        assert_eq!(e.code, "22008", "{t}: {e}");
        assert_eq!(row, 0, "{t}: {e}");
        g.lock().end_plugin_window();
        g.lock().rollback();
        window(&g);
    }
    // Text the host itself cannot read as a bigint: a data exception
    // too, by statements as by `COPY`.
    for n in [10, 300] {
        let mut changes: Vec<Change> = (2000..2000 + n).map(change).collect();
        let Change::Upsert(row) = &mut changes[0] else {
            panic!("change 2000 is an upsert");
        };
        row[6] = text("12 apples");
        let (_, e) = g
            .plugin_apply(("typed_by_copy", &columns, &key), None, changes)
            .unwrap_err();
        assert_eq!(e.code, "22P02", "{n}: {e}");
        g.lock().end_plugin_window();
        g.lock().rollback();
        window(&g);
    }
    // A bit string of the wrong length is refused by `COPY` as by the
    // statements (an explicit cast to bit(3) would pad it).
    let mut changes: Vec<Change> = (3000..3300).map(change).collect();
    let Change::Upsert(row) = &mut changes[0] else {
        panic!("change 3000 is an upsert");
    };
    row[4] = text("1");
    let (_, e) = g
        .plugin_apply(("typed_by_copy", &columns, &key), None, changes)
        .unwrap_err();
    assert_eq!(e.code, "22026", "{e}");
    g.lock().end_plugin_window();
    g.lock().rollback();
    sql("DROP TABLE typed_by_copy, typed_by_statements; DROP TYPE typed_mood");
}
