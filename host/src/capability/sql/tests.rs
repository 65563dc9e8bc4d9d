//! Unit tests of the SQL capability on real SQLite and PostgreSQL databases.

use super::*;

/// The first keyword, as the guard reads it.
fn first_keyword(sql: &str, nested: bool) -> String {
    guard::first_keywords(sql, nested).0
}

#[test]
fn passwords_are_redacted_from_urls() {
    assert_eq!(
        redact("postgres://sink:s3cr@t@db.example:5432/x"),
        "postgres://sink:***@db.example:5432/x"
    );
    assert_eq!(
        redact("postgres://sink@db:5432/x"),
        "postgres://sink@db:5432/x"
    );
    assert_eq!(redact("sqlite:./a:b@c.db"), "sqlite:./a:b@c.db");
    assert_eq!(
        redact("postgres://sink@db/x?sslmode=require&password=SECRET&sslpassword=K"),
        "postgres://sink@db/x?sslmode=require&password=***&sslpassword=***"
    );
    assert_eq!(
        redact("postgres://bob:sec?pw@127.0.0.1:5432/db"),
        "postgres://bob:***@127.0.0.1:5432/db"
    );
    assert_eq!(
        redact("postgres://sink@db/x?user=a@b&password=p"),
        "postgres://sink@db/x?user=a@b&password=***"
    );
    assert_eq!(
        sink_identity("sqlite:rel/sink.db").unwrap(),
        format!(
            "sqlite:{}",
            std::env::current_dir()
                .unwrap()
                .join("rel/sink.db")
                .display()
        )
    );
    assert_eq!(
        redact("host=db user=sink password=SECRET dbname=x"),
        "host=db user=sink password=*** dbname=x"
    );
}

#[test]
fn first_keywords() {
    for nested in [false, true] {
        assert_eq!(first_keyword("  -- hi\n /* x */ commit", nested), "COMMIT");
        assert_eq!(first_keyword("insert into t", nested), "INSERT");
        assert_eq!(first_keyword("", nested), "");
        assert_eq!(
            first_keyword(" ; ;\n-- x\n;vacuum into 'f'", nested),
            "VACUUM"
        );
        assert_eq!(first_keyword("/* never ends", nested), "");
    }
    // Found by an attack run: PostgreSQL nests comments, so this is COMMIT
    // there (the text check used to stop at the first `*/` and see `x`).
    assert_eq!(first_keyword("/* /* */ x */ COMMIT", true), "COMMIT");
    assert_eq!(first_keyword("/*/**/*/rollback", true), "ROLLBACK");
    assert_eq!(
        first_keyword("/* a /* b /* c */ */ */ do $$ $$", true),
        "DO"
    );
    assert_eq!(
        guard::first_keywords(
            "/* x */ alter /* y */ role current_user set search_path = s",
            true
        ),
        ("ALTER".to_string(), "ROLE".to_string())
    );
    // SQLite does not nest: its comment ends at the first `*/`.
    assert_eq!(first_keyword("/* /* */ select 1", false), "SELECT");
}

#[test]
fn sqlite_binds_dollar_placeholders_by_number() {
    let mut b = Sqlite::open(":memory:").unwrap();
    b.batch("CREATE TABLE t (a TEXT, b INTEGER)").unwrap();
    b.execute(
        "INSERT INTO t (b, a) VALUES ($2, $1)",
        &[SqlValue::Text("x".into()), SqlValue::Integer(7)],
    )
    .unwrap();
    let r = b
        .query("SELECT a, b FROM t WHERE b = $1", &[SqlValue::Integer(7)])
        .unwrap();
    assert_eq!(r.columns, vec!["a", "b"]);
    assert_eq!(
        r.rows,
        vec![vec![SqlValue::Text("x".into()), SqlValue::Integer(7)]]
    );
    let e = b
        .execute("INSERT INTO t VALUES ($1, $2)", &[SqlValue::Null])
        .unwrap_err();
    assert!(e.message.contains("2 parameters, 1 given"), "{e}");
}

#[test]
fn plugin_calls_outside_a_window_and_refused_statements_fail() {
    let g = SqlGrant::connect("sqlite::memory:").unwrap();
    assert!(
        g.plugin_execute("SELECT 1", &[])
            .unwrap_err()
            .message
            .contains("only available")
    );
    g.lock().begin().unwrap();
    let e = g.plugin_execute("COMMIT", &[]).unwrap_err();
    assert!(e.message.contains("not allowed"), "{e}");
    let again = g.plugin_execute("SELECT 1", &[]).unwrap_err();
    assert!(again.message.contains("already failed"), "{again}");
    g.lock().rollback();
}

#[test]
fn guard_verdicts_are_remembered_only_for_allowed_statements() {
    let g = SqlGrant::connect("sqlite::memory:").unwrap();
    g.lock()
        .backend()
        .batch("CREATE TABLE sluice_progress (p INTEGER)")
        .unwrap();
    for _ in 0..3 {
        g.lock().begin().unwrap();
        // Rolled back at the end of each round, so made again.
        g.plugin_execute("CREATE TABLE t (a INTEGER)", &[]).unwrap();
        for i in 0..3 {
            g.plugin_execute("INSERT INTO t (a) VALUES ($1)", &[SqlValue::Integer(i)])
                .unwrap();
        }
        // Refused every time, never remembered as allowed.
        let e = g
            .plugin_execute("DELETE FROM sluice_progress", &[])
            .unwrap_err();
        assert!(e.message.contains("belongs to the host"), "{e}");
        g.lock().rollback();
    }
    // Many distinct texts: the memory stays bounded.
    g.lock().begin().unwrap();
    for i in 0..(APPROVED_CAP + 10) {
        g.plugin_query(&format!("SELECT {i}"), &[]).unwrap();
    }
    assert!(g.lock().approved.len() <= APPROVED_CAP);
    // Long texts are checked but not kept.
    let long = format!("SELECT 1 {}", " ".repeat(APPROVED_MAX_LEN));
    g.plugin_query(&long, &[]).unwrap();
    assert!(!g.lock().approved.contains(&long));
    g.lock().rollback();
}

/// Ways around a text check that SQLite's authorizer closes; each must
/// be refused with the host's reason and fail the transaction, and the
/// host's own statements (same texts included) must keep working.
#[test]
fn sqlite_authorizer_refuses_what_the_text_does_not_show() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("sink.db");
    let g = SqlGrant::connect(&format!("sqlite:{}", db.display())).unwrap();
    let host_upsert = "INSERT INTO sluice_progress (p) VALUES ($1)";
    {
        let mut s = g.lock();
        let b = s.backend();
        b.batch("CREATE TABLE sluice_progress (p INTEGER)").unwrap();
        b.execute(host_upsert, &[SqlValue::Integer(1)]).unwrap();
    }
    let setup = [
        "CREATE TABLE t (a TEXT)",
        "CREATE TRIGGER tr AFTER INSERT ON t BEGIN DELETE FROM sluice_progress; END",
        "CREATE VIEW v AS SELECT p FROM sluice_progress",
        "CREATE TEMP TABLE shadow (p INTEGER)",
    ];
    g.lock().begin().unwrap();
    for sql in setup {
        g.plugin_execute(sql, &[]).unwrap();
    }
    g.lock().commit().unwrap();
    let attach = dir.path().join("escape.db");
    let refused: Vec<(String, &str)> = vec![
        // The trigger's body runs the plugin's insert into the host table.
        (
            "INSERT INTO t VALUES ('x')".into(),
            "sluice_progress belongs to the host",
        ),
        (
            "SELECT p FROM v".into(),
            "sluice_progress belongs to the host",
        ),
        // The exact text of a statement the host ran (and may cache).
        (host_upsert.into(), "sluice_progress belongs to the host"),
        (
            "CREATE TEMP TABLE SLUICE_PROGRESS (p INTEGER)".into(),
            "sluice_progress belongs to the host",
        ),
        (
            "CREATE TRIGGER t2 AFTER INSERT ON sluice_progress BEGIN SELECT 1; END".into(),
            "belongs to the host",
        ),
        (
            format!("SELECT 1; ATTACH '{}' AS x", attach.display()),
            "is not allowed",
        ),
        (
            format!(";ATTACH '{}' AS x", attach.display()),
            "not allowed",
        ),
        (";; vacuum into 'copy.db'".into(), "not allowed"),
        // A temporary table renamed to a host table's name would
        // shadow it for unqualified names.
        (
            "ALTER TABLE temp.shadow RENAME TO sluice_progress".into(),
            "temporary table is not allowed",
        ),
    ];
    for (sql, why) in &refused {
        g.lock().begin().unwrap();
        let e = g.plugin_query(sql, &[]).unwrap_err();
        assert!(e.message.contains(why), "{sql}: {e}");
        assert_eq!(e.code, "sluice", "{sql}: {e}");
        let again = g.plugin_query("SELECT 1", &[]).unwrap_err();
        assert!(again.message.contains("already failed"), "{sql}: {again}");
        g.lock().rollback();
    }
    assert!(!attach.exists(), "ATTACH created {}", attach.display());
    assert!(!dir.path().join("copy.db").exists());

    // No false positives: the host table's name as data, and the host's
    // own statements after the plugin's refusals.
    g.lock().begin().unwrap();
    g.plugin_execute("DROP TRIGGER tr", &[]).unwrap();
    g.plugin_execute(
        "INSERT INTO t VALUES ($1)",
        &[SqlValue::Text("sluice_progress".into())],
    )
    .unwrap();
    {
        let mut s = g.lock();
        s.end_plugin_window();
        let b = s.backend();
        b.execute(host_upsert, &[SqlValue::Integer(2)]).unwrap();
        let n = b
            .query("SELECT count(*) FROM sluice_progress", &[])
            .unwrap();
        assert_eq!(n.rows, vec![vec![SqlValue::Integer(2)]]);
        s.commit().unwrap();
    }
}

/// SQLite always; PostgreSQL too when the suite's server is up.
fn grants(dir: &std::path::Path) -> Vec<SqlGrant> {
    let mut v =
        vec![SqlGrant::connect(&format!("sqlite:{}", dir.join("cap.db").display())).unwrap()];
    if let Ok(url) = std::env::var("SLUICE_TEST_PG_URL") {
        v.push(SqlGrant::connect(&url).unwrap());
    }
    v
}

#[test]
fn an_endless_plugin_query_stops_at_the_row_cap_not_at_host_memory() {
    // Found by an attack run: a recursive query pushed host memory to
    // 3 GB in 24 s (results were collected with no cap).
    let d = tempfile::tempdir().unwrap();
    for g in grants(d.path()) {
        g.lock().begin().unwrap();
        let e = g
            .plugin_query(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT i FROM n",
                &[],
            )
            .unwrap_err();
        assert!(
            e.message.contains("more than 100000 rows"),
            "{:?}: {e}",
            g.dialect()
        );
        g.lock().end_plugin_window();
        g.lock().rollback();
    }
}

#[test]
fn a_plugin_statement_stops_at_the_call_deadline() {
    // Found by an attack run: pg_sleep(20) ran 61 s under a 2 s deadline.
    let d = tempfile::tempdir().unwrap();
    for g in grants(d.path()) {
        g.limit_statements(std::time::Duration::from_millis(300));
        g.lock().begin().unwrap();
        let slow = match g.dialect() {
            Dialect::Postgres => "SELECT pg_sleep(20)",
            Dialect::Sqlite => {
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
            }
        };
        let started = std::time::Instant::now();
        let e = g.plugin_query(slow, &[]).unwrap_err();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(
            e.code == "57014" || e.message.contains("time limit of 300 ms"),
            "{:?}: {e}",
            g.dialect()
        );
        g.lock().end_plugin_window();
        g.lock().rollback();
        // The host's own statements afterwards are not bound.
        g.lock().begin().unwrap();
        g.lock().end_plugin_window();
        g.lock().rollback();
    }
}
