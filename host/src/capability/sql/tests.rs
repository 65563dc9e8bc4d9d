//! Unit tests of the SQL capability on real SQLite and PostgreSQL databases.
//! Longer than a module should be: one short test per rule of the
//! statement guard and the session, each readable on its own; they share
//! only the fixtures at the top.

use super::session::{APPROVED_CAP, APPROVED_MAX_LEN};
use super::sqlite::Sqlite;
use super::*;

/// The first keyword, as the SQLite guard reads it.
fn first_keyword(sql: &str) -> String {
    guard::first_keyword(sql)
}

/// Open a transaction and the plugin window in it.
pub(super) fn window(g: &SqlGrant) {
    let mut s = g.lock();
    s.begin().unwrap();
    s.open_plugin_window().unwrap();
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
fn a_sink_schema_other_than_public_is_part_of_the_identity() {
    let url = "postgres://u:pw@h/db";
    assert_eq!(
        sink_identity_in(url, None).unwrap(),
        "postgres://u:***@h/db"
    );
    assert_eq!(
        sink_identity_in(url, Some("public")).unwrap(),
        "postgres://u:***@h/db"
    );
    assert_eq!(
        sink_identity_in(url, Some("ops")).unwrap(),
        "postgres://u:***@h/db#schema=ops"
    );
}

#[test]
fn first_keywords() {
    assert_eq!(first_keyword("  -- hi\n /* x */ commit"), "COMMIT");
    assert_eq!(first_keyword("insert into t"), "INSERT");
    assert_eq!(first_keyword(""), "");
    assert_eq!(first_keyword(" ; ;\n-- x\n;vacuum into 'f'"), "VACUUM");
    assert_eq!(first_keyword("/* never ends"), "");
    // SQLite does not nest: its comment ends at the first `*/`.
    assert_eq!(first_keyword("/* /* */ select 1"), "SELECT");
}

/// The PostgreSQL guard's verdict: `Ok(watch)` or the refusal.
fn pg_verdict(sql: &str) -> Result<bool, String> {
    guard::check_postgres(sql).map(|a| a.watch)
}

#[test]
fn postgres_guard_refuses_by_parse_not_by_first_word() {
    // Found by an attack run: PostgreSQL nests comments, so these are
    // COMMIT / ROLLBACK / DO there (a text check that stopped at the first
    // `*/` saw `x`).
    for sql in [
        "/* /* */ x */ COMMIT",
        "/*/**/*/rollback",
        "/* a /* b /* c */ */ */ do $$ begin perform 1; end $$",
        "/* x */ alter /* y */ role current_user set search_path = shadow, public",
        "ALTER USER CURRENT_USER SET search_path = shadow",
        "ALTER DATABASE postgres SET search_path = shadow",
        "COPY (SELECT 1) TO PROGRAM 'touch /tmp/sluice-pwned'",
        "SET search_path = shadow",
        "SET LOCAL ROLE postgres",
        "RESET ROLE",
        "CALL p()",
        "BEGIN",
        "SAVEPOINT s",
        "PREPARE TRANSACTION 'x'",
        "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$",
        "CREATE TRIGGER t AFTER INSERT ON x FOR EACH ROW EXECUTE FUNCTION f()",
        "CREATE RULE r AS ON INSERT TO x DO INSTEAD NOTHING",
        "GRANT ALL ON x TO PUBLIC",
        "DROP OWNED BY CURRENT_USER",
        "DROP SCHEMA public CASCADE",
        "CREATE ROLE r",
        "LOCK TABLE x",
        "SELECT 1; COMMIT",
        "DISCARD ALL",
        "VACUUM",
    ] {
        assert!(pg_verdict(sql).is_err(), "{sql} passed");
    }
    // Names no plugin may use, however written.
    for (sql, why) in [
        ("SELECT set_config('role', 'postgres', false)", "set_config"),
        ("SELECT \"SET_CONFIG\"('role', 'x', true)", "set_config"),
        (
            "UPDATE pg_catalog.pg_settings SET setting = 'x' WHERE name = 'role'",
            "pg_settings",
        ),
        ("SELECT query_to_xml('select 1', true, true, '')", "_to_xml"),
        (
            "SELECT table_to_xml(E'sluice\\x5fprogress'::regclass, true, false, '')",
            "_to_xml",
        ),
        ("SELECT pg_advisory_lock(1)", "advisory_"),
        (
            "SELECT * FROM \"public\".\"sluice_progress\"",
            "belongs to the host",
        ),
        ("DELETE FROM Sluice_Dead_Letters", "belongs to the host"),
        (
            "SELECT * FROM U&\"sluice\\005fprogress\"",
            "Unicode-escaped",
        ),
        ("SELECT 1 -- sluice_progress", "belongs to the host"),
    ] {
        let e = pg_verdict(sql).unwrap_err();
        assert!(e.contains(why), "{sql}: {e}");
    }
    // Found by the attack run on the parser-based guard: what got through.
    for (sql, why) in [
        ("SELECT pg_try_advisory_lock(42)", "advisory_"),
        ("SELECT pg_try_advisory_lock_shared(43)", "advisory_"),
        (
            "SELECT schema_to_xml('public', true, false, '')::text",
            "_to_xml",
        ),
        ("SELECT database_to_xml(true, false, '')::text", "_to_xml"),
        ("SELECT pg_notify('chan', 'x')", "pg_notify"),
        (
            "SELECT pg_create_physical_replication_slot('s', true)",
            "replication_slot",
        ),
        ("SELECT * FROM pg_ls_waldir()", "pg_ls_"),
        ("SELECT * FROM pg_hba_file_rules", "pg_hba_file_rules"),
        (
            "UPDATE pg_catalog.pg_class SET relname = 'x' WHERE oid = ('sluice_' || 'progress')::regclass",
            "may not name `pg_catalog`",
        ),
        (
            "UPDATE pg_authid SET rolsuper = true WHERE rolname = 'p'",
            "may not name `pg_authid`",
        ),
        (
            "INSERT INTO pg_catalog.pg_db_role_setting (setdatabase, setrole, setconfig) SELECT d.oid, 0, ARRAY['search_path=evil'] FROM pg_database d",
            "may not name `pg_catalog`",
        ),
        (
            "WITH x AS (UPDATE pg_type SET typname = 'y' RETURNING 1) SELECT * FROM x",
            "may not name `pg_type`",
        ),
        (
            "CREATE TEMP TABLE pg_roles (x int)",
            "may not name `pg_roles`",
        ),
        (
            "INSERT INTO pg_temp_3.staging (k) VALUES ($1)",
            "may not name `pg_temp_3`",
        ),
    ] {
        let e = pg_verdict(sql).unwrap_err();
        assert!(e.contains(why), "{sql}: {e}");
    }
    // Words that only contain a denied name are not refused (found by a
    // review: a column `advisory_fee` failed the range).
    for sql in [
        "INSERT INTO fees (advisory_fee, settings_json) VALUES ($1, $2)",
        "UPDATE t SET my_set_config = $1",
        "SELECT sluice_progress_copy FROM archive",
    ] {
        assert_eq!(pg_verdict(sql), Ok(false), "{sql}");
    }
    // The session's own temporary schema is not a catalog: the bulk path
    // stages there.
    assert_eq!(
        pg_verdict(
            "INSERT INTO t (k, v) SELECT k, v FROM pg_temp.sluice_stage_0123456789abcdef WHERE NOT sluice_delete ON CONFLICT (k) DO UPDATE SET v = excluded.v"
        ),
        Ok(false)
    );
    assert_eq!(
        pg_verdict(
            "CREATE TEMP TABLE IF NOT EXISTS pg_temp.s ON COMMIT DELETE ROWS AS SELECT k, v, FALSE AS sluice_delete FROM t WITH NO DATA"
        ),
        Ok(true)
    );
    // Reading the catalogs stays allowed (a sink may look up its columns).
    assert_eq!(
        pg_verdict("SELECT column_name FROM information_schema.columns WHERE table_name = $1"),
        Ok(false)
    );
    assert!(pg_verdict("SELEC 1").unwrap_err().contains("cannot read"));
    // What sinks run passes; plain DML is not watched, calls and DDL are.
    for (sql, watch) in [
        (
            "INSERT INTO companies (id, doc, version) VALUES ($1, $2, $3) ON CONFLICT (id) DO UPDATE SET doc = excluded.doc, version = excluded.version WHERE companies.version < excluded.version",
            false,
        ),
        ("UPDATE counter SET n = n + $1 WHERE id = 1", false),
        ("DELETE FROM t WHERE id = $1::bigint", false),
        (
            "SELECT a, b FROM t WHERE id IN (SELECT id FROM u) /* nested /* ok */ */",
            false,
        ),
        (
            "WITH d AS (DELETE FROM t RETURNING id) INSERT INTO u SELECT id FROM d",
            false,
        ),
        ("SELECT now()", true),
        ("SELECT * FROM generate_series(1, 3)", true),
        ("INSERT INTO t (at) VALUES (clock_timestamp())", true),
        (
            "CREATE TABLE IF NOT EXISTS t (id BIGINT PRIMARY KEY, doc JSONB, logo BYTEA)",
            true,
        ),
        ("CREATE INDEX IF NOT EXISTS t_doc ON t (doc)", true),
        ("ALTER TABLE t ADD COLUMN IF NOT EXISTS x TEXT", true),
        ("DROP TABLE IF EXISTS t", true),
        ("TRUNCATE t", true),
    ] {
        assert_eq!(pg_verdict(sql), Ok(watch), "{sql}");
    }
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
fn sqlite_placeholders_are_numbered_outside_quotes_and_comments() {
    let n = |s: &str| sqlite::numbered_placeholders(s);
    let rewritten = |s: &str| n(s).unwrap_or_else(|| panic!("not rewritten: {s}"));
    assert_eq!(
        rewritten("VALUES ($1, $2), ($10,$11)"),
        "VALUES (?1, ?2), (?10,?11)"
    );
    assert_eq!(n("SELECT 1"), None);
    assert_eq!(
        rewritten("SELECT '$1', \"$2\", `$3`, [$4], 'it''s $5', $6 -- $7\n/* $8 */ $9"),
        "SELECT '$1', \"$2\", `$3`, [$4], 'it''s $5', ?6 -- $7\n/* $8 */ ?9"
    );
    assert_eq!(rewritten("a$1 + $1"), "a$1 + ?1");
    assert_eq!(rewritten("$1"), "?1");
    // An unterminated quote or comment ends the statement.
    assert_eq!(rewritten("$1 'abc $2"), "?1 'abc $2");
    assert_eq!(rewritten("$1 /* $2"), "?1 /* $2");
    assert_eq!(rewritten("é$1, é $1"), "é$1, é ?1");
    // Other parameter forms, alone or next to `$n`: left as they are.
    for other in [
        "$x", "$1a", "$0", "$01", "$1::text", "$1(x)", ":$1", "@$1", "$1, ?", "$1, ?2", "$1, :a",
        "$1, @a", "$1, $x",
    ] {
        assert_eq!(n(other), None, "{other}");
    }
    // Not parameters: left alone, and the rest is rewritten.
    assert_eq!(rewritten("'?', $1"), "'?', ?1");
}

#[test]
fn remembered_placeholder_rewrites_bind_like_fresh_ones() {
    // The same texts again and again (the rewrite is remembered), mixed
    // with texts that are not rewritten, and more texts than are kept.
    let mut b = Sqlite::open(":memory:").unwrap();
    let two = [SqlValue::Integer(1), SqlValue::Integer(2)];
    for round in 0..3 {
        for i in 0..300i64 {
            let r = b.query(&format!("SELECT $2, $1, {i}"), &two).unwrap();
            assert_eq!(
                r.rows,
                vec![vec![
                    SqlValue::Integer(2),
                    SqlValue::Integer(1),
                    SqlValue::Integer(i)
                ]],
                "round {round}, text {i}"
            );
            let r = b.query("SELECT ?, :a", &two).unwrap();
            assert_eq!(r.rows, vec![two.to_vec()], "round {round}, text {i}");
        }
    }
}

#[test]
fn sqlite_binds_other_placeholder_forms_as_before() {
    let mut b = Sqlite::open(":memory:").unwrap();
    // `$1::t` is one name to SQLite (a TCL suffix): bound by its slot.
    let r = b
        .query(
            "SELECT $2, $1::t",
            &[SqlValue::Integer(1), SqlValue::Integer(2)],
        )
        .unwrap();
    assert_eq!(
        r.rows,
        vec![vec![SqlValue::Integer(2), SqlValue::Integer(1)]]
    );
    let r = b
        .query(
            "SELECT ?, :a",
            &[SqlValue::Integer(1), SqlValue::Integer(2)],
        )
        .unwrap();
    assert_eq!(
        r.rows,
        vec![vec![SqlValue::Integer(1), SqlValue::Integer(2)]]
    );
    let r = b
        .query(
            "SELECT $1, ?, $1",
            &[SqlValue::Integer(1), SqlValue::Integer(2)],
        )
        .unwrap();
    assert_eq!(
        r.rows,
        vec![vec![
            SqlValue::Integer(1),
            SqlValue::Integer(2),
            SqlValue::Integer(1)
        ]]
    );
}

#[test]
fn a_statement_of_thousands_of_placeholders_binds_each_in_order() {
    let mut b = Sqlite::open(":memory:").unwrap();
    b.batch("CREATE TABLE t (a INTEGER, b TEXT)").unwrap();
    let rows = 5000;
    let values: Vec<String> = (0..rows)
        .map(|r| format!("(${}, ${})", 2 * r + 1, 2 * r + 2))
        .collect();
    let params: Vec<SqlValue> = (0..rows)
        .flat_map(|r| [SqlValue::Integer(r), SqlValue::Text(format!("v{r}"))])
        .collect();
    let sql = format!("INSERT INTO t (a, b) VALUES {}", values.join(", "));
    assert_eq!(b.execute(&sql, &params).unwrap(), rows as u64);
    let r = b
        .query("SELECT COUNT(*) FROM t WHERE b = 'v' || a", &[])
        .unwrap();
    assert_eq!(r.rows, vec![vec![SqlValue::Integer(rows)]]);
    // A repeated placeholder is the same value.
    let r = b
        .query(
            "SELECT $1 + $1, $2",
            &[SqlValue::Integer(2), SqlValue::Null],
        )
        .unwrap();
    assert_eq!(r.rows, vec![vec![SqlValue::Integer(4), SqlValue::Null]]);
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
    window(&g);
    let e = g.plugin_execute("COMMIT", &[]).unwrap_err();
    assert!(e.message.contains("not allowed"), "{e}");
    let again = g.plugin_execute("SELECT 1", &[]).unwrap_err();
    assert!(again.message.contains("already failed"), "{again}");
    g.lock().rollback();
}

#[test]
fn execute_batch_runs_each_row_and_names_the_row_that_failed() {
    let d = tempfile::tempdir().unwrap();
    for g in grants(d.path()) {
        window(&g);
        g.plugin_execute(
            "CREATE TABLE IF NOT EXISTS batch_rows (k TEXT PRIMARY KEY, n BIGINT)",
            &[],
        )
        .unwrap();
        let rows: Vec<Vec<SqlValue>> = (0..4)
            .map(|i| vec![SqlValue::Text(format!("k{i}")), SqlValue::Integer(i)])
            .collect();
        let sql = "INSERT INTO batch_rows (k, n) VALUES ($1, $2)";
        assert_eq!(g.plugin_execute_batch(sql, &rows), Ok(4));
        assert_eq!(g.plugin_execute_batch(sql, &[]), Ok(0));
        let q = g
            .plugin_query("SELECT COUNT(*) FROM batch_rows", &[])
            .unwrap();
        assert_eq!(q.rows, vec![vec![SqlValue::Integer(4)]]);
        // Rows run in order (PostgreSQL pipelines them): the last of many
        // upserts of one key wins.
        let upserts: Vec<Vec<SqlValue>> = (10..300)
            .map(|i| vec![SqlValue::Text("k0".into()), SqlValue::Integer(i)])
            .collect();
        let upsert = "INSERT INTO batch_rows (k, n) VALUES ($1, $2) \
                      ON CONFLICT (k) DO UPDATE SET n = excluded.n";
        assert_eq!(g.plugin_execute_batch(upsert, &upserts), Ok(290));
        let q = g
            .plugin_query("SELECT n FROM batch_rows WHERE k = 'k0'", &[])
            .unwrap();
        assert_eq!(q.rows, vec![vec![SqlValue::Integer(299)]]);
        // Row 1 repeats a key: rows 0 ran, row 1 failed, row 2 never ran.
        let again = vec![
            vec![SqlValue::Text("k9".into()), SqlValue::Integer(9)],
            vec![SqlValue::Text("k0".into()), SqlValue::Integer(0)],
            vec![SqlValue::Text("k8".into()), SqlValue::Integer(8)],
        ];
        let (row, e) = g.plugin_execute_batch(sql, &again).unwrap_err();
        assert_eq!(row, 1, "{e}");
        assert!(
            e.code == "23505" || e.code.starts_with("SQLITE_CONSTRAINT"),
            "{e:?}"
        );
        let after = g.plugin_execute("SELECT 1", &[]).unwrap_err();
        assert!(after.message.contains("already failed"), "{after}");
        g.lock().rollback();
        // A row whose value cannot be bound (PostgreSQL: refused before it
        // is sent) fails as that row, not as a later failing one.
        window(&g);
        g.plugin_execute(
            "CREATE TABLE IF NOT EXISTS batch_ints (n INTEGER NOT NULL)",
            &[],
        )
        .unwrap();
        let mixed = vec![
            vec![SqlValue::Integer(1)],
            vec![SqlValue::Integer(2)],
            vec![SqlValue::Text("two and a half".into())],
            vec![SqlValue::Null],
        ];
        let (row, e) = g
            .plugin_execute_batch("INSERT INTO batch_ints (n) VALUES ($1)", &mixed)
            .unwrap_err();
        // SQLite keeps the text (column affinity): its first failure is
        // the NULL.
        let first_bad = if g.dialect() == Dialect::Postgres {
            2
        } else {
            3
        };
        assert_eq!(row, first_bad, "{e:?}");
        g.lock().rollback();
        // A refused statement is reported for row 0 and runs nothing.
        window(&g);
        let (row, e) = g.plugin_execute_batch("COMMIT", &rows).unwrap_err();
        assert_eq!(row, 0);
        assert!(e.message.contains("not allowed"), "{e}");
        g.lock().rollback();
    }
}

#[test]
fn guard_verdicts_are_remembered_only_for_allowed_statements() {
    let g = SqlGrant::connect("sqlite::memory:").unwrap();
    g.lock()
        .backend()
        .batch("CREATE TABLE sluice_progress (p INTEGER)")
        .unwrap();
    for _ in 0..3 {
        window(&g);
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
    window(&g);
    for i in 0..(APPROVED_CAP + 10) {
        g.plugin_query(&format!("SELECT {i}"), &[]).unwrap();
    }
    assert!(g.lock().approved.len() <= APPROVED_CAP);
    // Long texts are remembered by digest, not kept; a refused one stays
    // refused (by the authorizer, whatever the text check remembered).
    let long = format!("SELECT 1 {}", " ".repeat(APPROVED_MAX_LEN));
    g.plugin_query(&long, &[]).unwrap();
    assert!(!g.lock().approved.contains_key(&long));
    assert_eq!(g.lock().approved_long.len(), 1);
    let refused = format!(
        "DELETE FROM sluice_progress {}",
        " ".repeat(APPROVED_MAX_LEN)
    );
    for _ in 0..2 {
        let e = g.plugin_execute(&refused, &[]).unwrap_err();
        assert!(e.message.contains("belongs to the host"), "{e}");
        g.lock().rollback();
        window(&g);
    }
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
    window(&g);
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
        // Column lists are readable (below), but not a host table's, and
        // no other pragma through its table-valued form.
        (
            "SELECT name FROM pragma_table_info('sluice_progress')".into(),
            "sluice_progress belongs to the host",
        ),
        (
            "SELECT * FROM pragma_journal_mode".into(),
            "PRAGMA journal_mode is not allowed",
        ),
        ("PRAGMA table_info(t)".into(), "not allowed"),
        // A temporary table renamed to a host table's name would
        // shadow it for unqualified names.
        (
            "ALTER TABLE temp.shadow RENAME TO sluice_progress".into(),
            "temporary table is not allowed",
        ),
    ];
    for (sql, why) in &refused {
        window(&g);
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
    window(&g);
    let columns = g
        .plugin_query(
            "SELECT name, type FROM pragma_table_info($1)",
            &[SqlValue::Text("t".into())],
        )
        .unwrap();
    assert_eq!(
        columns.rows,
        vec![vec![
            SqlValue::Text("a".into()),
            SqlValue::Text("TEXT".into())
        ]]
    );
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
pub(super) fn grants(dir: &std::path::Path) -> Vec<SqlGrant> {
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
        window(&g);
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
        g.limit_statements(std::time::Duration::from_millis(300))
            .unwrap();
        if g.dialect() == Dialect::Postgres {
            // A session idle inside a transaction is ended after 60 s.
            let idle = g
                .lock()
                .backend()
                .query(
                    "SELECT current_setting('idle_in_transaction_session_timeout')",
                    &[],
                )
                .unwrap();
            assert_eq!(idle.rows, vec![vec![SqlValue::Text("1min".into())]]);
        }
        window(&g);
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

/// A role the plugin statements run as, made for one test (PostgreSQL).
fn plugin_role(admin: &mut dyn Backend, name: &str) {
    admin
        .batch(&format!(
            "DROP ROLE IF EXISTS {name}; CREATE ROLE {name} NOLOGIN; GRANT {name} TO CURRENT_USER; \
             GRANT USAGE, CREATE ON SCHEMA public TO {name}"
        ))
        .unwrap();
}

#[test]
fn a_plugin_role_keeps_plugin_sql_off_the_host_tables_by_privilege() {
    let Ok(url) = std::env::var("SLUICE_TEST_PG_URL") else {
        return;
    };
    let g = SqlGrant::connect(&url).unwrap();
    let schema = "sluice_role_test";
    {
        let mut s = g.lock();
        let b = s.backend();
        b.batch(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; \
             CREATE TABLE {schema}.sluice_progress (p INTEGER); \
             CREATE TABLE {schema}.other (p INTEGER); \
             DROP FUNCTION IF EXISTS public.sluice_test_sneaky(); \
             CREATE FUNCTION public.sluice_test_sneaky() RETURNS int LANGUAGE sql \
               AS $$ SELECT length(set_config('role', 'none', true)) $$"
        ))
        .unwrap();
        plugin_role(b, "sluice_test_plugin");
    }
    let progress = format!("{schema}.sluice_progress");
    // Checked at start: a role with a privilege on a host table is refused.
    g.lock()
        .backend()
        .batch(&format!("GRANT SELECT ON {progress} TO sluice_test_plugin"))
        .unwrap();
    let e = g
        .check_plugin_role("sluice_test_plugin", &[&progress])
        .unwrap_err();
    assert!(e.message.contains("REVOKE ALL ON"), "{e}");
    g.lock()
        .backend()
        .batch(&format!("REVOKE ALL ON {progress} FROM sluice_test_plugin"))
        .unwrap();
    g.check_plugin_role("sluice_test_plugin", &[&progress])
        .unwrap();
    let e = g
        .check_plugin_role("sluice_no_such_role", &[&progress])
        .unwrap_err();
    assert!(e.message.contains("CREATE ROLE"), "{e}");

    g.set_plugin_role(Some("sluice_test_plugin".into()))
        .unwrap();
    // In the window plugin statements run as the role, and the database
    // itself refuses what the role was not granted (as it refuses the
    // host's tables, which the text check refuses first).
    window(&g);
    let who = g.plugin_query("SELECT current_user::text", &[]).unwrap();
    assert_eq!(
        who.rows,
        vec![vec![SqlValue::Text("sluice_test_plugin".into())]]
    );
    let e = g
        .plugin_query(&format!("SELECT p FROM {schema}.other"), &[])
        .unwrap_err();
    assert_eq!(e.code, "42501", "{e}");
    assert!(g.lock().end_plugin_window().is_some());
    g.lock().rollback();

    // A function of the database's that switches the role back is not
    // visible to the guard; the check after the call (a function call is
    // watched) fails the part.
    window(&g);
    let e = g
        .plugin_query("SELECT public.sluice_test_sneaky()", &[])
        .unwrap_err();
    assert!(
        e.message
            .contains("changed the host's transaction, role or settings"),
        "{e}"
    );
    g.lock().end_plugin_window();
    g.lock().rollback();

    // After the window the host writes its table as itself.
    let mut s = g.lock();
    s.begin().unwrap();
    s.open_plugin_window().unwrap();
    assert!(s.end_plugin_window().is_none());
    s.backend()
        .execute(&format!("INSERT INTO {progress} (p) VALUES (1)"), &[])
        .unwrap();
    s.rollback();
    s.backend()
        .batch(&format!(
            "DROP SCHEMA {schema} CASCADE; DROP FUNCTION public.sluice_test_sneaky(); \
             REVOKE ALL ON SCHEMA public FROM sluice_test_plugin; DROP ROLE sluice_test_plugin"
        ))
        .unwrap();
}

/// Each answer PostgreSQL gives the loser of two concurrent `CREATE TABLE
/// IF NOT EXISTS` is taken as "the other session made it"; other
/// duplicates are not.
#[test]
fn concurrent_create_answers_are_recognised() {
    let e = |code: &str, message: &str| DbError {
        message: message.to_string(),
        code: code.to_string(),
    };
    assert!(e("42P07", "relation \"t\" already exists").is_concurrent_create());
    assert!(e("42710", "type \"sluice_progress\" already exists").is_concurrent_create());
    assert!(
        e(
            "23505",
            "duplicate key value violates unique constraint \"pg_type_typname_nsp_index\""
        )
        .is_concurrent_create()
    );
    assert!(!e("42710", "role \"r\" already exists").is_concurrent_create());
    assert!(
        !e(
            "23505",
            "duplicate key value violates unique constraint \"t_pkey\""
        )
        .is_concurrent_create()
    );
    // Found by an attack run: the plugins' `init` on 8 connections at
    // once lost this race on every new database, and with `--attempts 1`
    // the run stopped. It is contention now (retried for
    // `--sink-retry-for`, not `--attempts`); a unique violation of the
    // plugin's own table is not.
    let race = e(
        "23505",
        "duplicate key value violates unique constraint \"pg_type_typname_nsp_index\"",
    );
    assert!(race.is_contention());
    assert!(
        !e(
            "23505",
            "duplicate key value violates unique constraint \"t_pkey\""
        )
        .is_contention()
    );
    // And a server with no free slot is worth reconnecting to.
    assert!(e("53300", "sorry, too many clients already").is_server_full());
    assert!(!e("08006", "connection lost").is_server_full());
}

/// A SQLite database the host creates is private to its owner, as the
/// checkpoint directory is, and so are its WAL files; an existing file
/// keeps its mode.
#[cfg(unix)]
#[test]
fn a_sqlite_file_the_host_creates_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("new.db");
    let mut c = connect(&format!("sqlite:{}", db.display())).unwrap();
    c.batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1)")
        .unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&db), 0o600);
    let wal = dir.path().join("new.db-wal");
    assert!(wal.exists());
    assert_eq!(mode(&wal), 0o600);
    let shared = dir.path().join("shared.db");
    std::fs::write(&shared, b"").unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o640)).unwrap();
    connect(&format!("sqlite:{}", shared.display())).unwrap();
    assert_eq!(mode(&shared), 0o640);
}
