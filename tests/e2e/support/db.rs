//! A database for one test: SQLite in a temp dir, or a fresh database on
//! the suite's PostgreSQL server (`SLUICE_TEST_PG_URL`, set by
//! scripts/test.sh), with small query helpers.

use sluice_host::capability::sql::{SqlValue, connect};

/// A database for one test: its URL and, for SQLite, the temp dir.
pub struct Db {
    pub url: String,
    pub name: &'static str,
    _dir: Option<tempfile::TempDir>,
}

impl Db {
    pub fn sqlite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("sink.db").display());
        Db {
            url,
            name: "sqlite",
            _dir: Some(dir),
        }
    }

    /// A fresh database on the test PostgreSQL server.
    pub fn postgres() -> Db {
        let admin = std::env::var("SLUICE_TEST_PG_URL").expect(
            "SLUICE_TEST_PG_URL is not set: run the suite with scripts/test.sh, which starts a throwaway PostgreSQL",
        );
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let name = format!(
            "sluice_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        connect(&admin)
            .unwrap()
            .batch(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap();
        Db {
            url: format!("{base}/{name}"),
            name: "postgres",
            _dir: None,
        }
    }

    /// A fresh database owned by a fresh role without any special
    /// attribute (no superuser, no CREATEROLE), connected as that role:
    /// what a managed database hands an application.
    pub fn postgres_plain() -> Db {
        let admin = Db::postgres();
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let role = format!(
            "sluice_plain_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let (base, name) = admin.url.rsplit_once('/').unwrap();
        let mut b = connect(&admin.url).unwrap();
        b.batch(&format!(
            "CREATE ROLE {role} LOGIN; ALTER DATABASE {name} OWNER TO {role}; \
             ALTER SCHEMA public OWNER TO {role}"
        ))
        .unwrap();
        let url = format!("{}/{name}", base.replace("postgres@", &format!("{role}@")));
        assert!(
            url.contains(&format!("{role}@")),
            "SLUICE_TEST_PG_URL must connect as `postgres@` for the plain-role databases: {}",
            admin.url
        );
        Db {
            url,
            name: "postgres as a plain role",
            _dir: None,
        }
    }

    /// The databases attack regressions run on: SQLite, PostgreSQL as its
    /// superuser and as a plain role.
    pub fn attacked() -> Vec<Db> {
        vec![Db::sqlite(), Db::postgres(), Db::postgres_plain()]
    }

    /// An existing database (not removed afterwards).
    pub fn at(url: String) -> Db {
        Db {
            url,
            name: "existing",
            _dir: None,
        }
    }

    pub fn both() -> Vec<Db> {
        vec![Db::sqlite(), Db::postgres()]
    }

    /// Run statements without results, as the database's owner.
    pub fn batch(&self, sql: &str) {
        connect(&self.url).unwrap().batch(sql).unwrap();
    }

    pub fn query(&self, sql: &str) -> Vec<Vec<SqlValue>> {
        connect(&self.url).unwrap().query(sql, &[]).unwrap().rows
    }

    pub fn scalar(&self, sql: &str) -> i64 {
        match self.query(sql).first().and_then(|r| r.first()) {
            Some(SqlValue::Integer(n)) => *n,
            other => panic!("{}: {sql}: {other:?}", self.name),
        }
    }

    /// The first column of every row, as text, sorted.
    pub fn sorted_texts(&self, sql: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .query(sql)
            .into_iter()
            .map(|r| match r.first() {
                Some(SqlValue::Text(t)) => t.clone(),
                other => panic!("{}: {sql}: {other:?}", self.name),
            })
            .collect();
        v.sort();
        v
    }

    /// The records the sql-counter fixture counted (its non-idempotent
    /// counter: a duplicate or a loss shows in it).
    pub fn counted(&self) -> i64 {
        self.scalar("SELECT n FROM counters WHERE name = 'records'")
    }
}
