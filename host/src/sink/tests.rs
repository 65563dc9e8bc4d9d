//! Unit tests of the sink driver on real SQLite and PostgreSQL databases.

use super::*;
use crate::capability::sql::{self, SqlValue};
use crate::plugin::CallContext;

fn databases(dir: &std::path::Path) -> Vec<String> {
    sql::test_databases(dir, "sink.db")
}

fn part(batch: u64, start: i64, end: i64) -> PartitionContext {
    PartitionContext {
        batch: CallContext {
            query_id: "q1".into(),
            batch_id: batch,
            epoch: 1,
        },
        topic: "t".into(),
        partition: 0,
        start_offset: start,
        end_offset: end,
    }
}

/// Apply `range` with no sink plugin and no records: only its progress
/// row (and fencing) is written.
fn apply_empty(driver: &SinkDriver, range: PartitionContext) -> Result<Applied, SinkError> {
    driver.apply(
        0,
        None,
        &PartitionBatch {
            deliver: None,
            epoch: crate::checkpoint::Epoch::new(range.batch.epoch),
            range,
            records: &[],
            dead_letters: &[],
        },
    )
}

/// Both databases look up an unqualified table name in the session's
/// temporary schema first. Should plugin SQL ever get a TEMP
/// sluice_progress onto the connection (here the test puts it there,
/// claiming [0, 1000) applied), the host still reads and writes its
/// own, schema-qualified table.
#[test]
fn a_temporary_table_named_like_a_host_table_does_not_fool_the_host() {
    let dir = tempfile::tempdir().unwrap();
    for url in databases(dir.path()) {
        let grant = SqlGrant::connect(&url).unwrap();
        let driver = SinkDriver::new(Some(grant.clone())).unwrap();
        let apply = |batch, start, end| apply_empty(&driver, part(batch, start, end));
        apply(1, 0, 10).unwrap();
        grant
            .lock()
            .backend()
            .batch(
                "CREATE TEMP TABLE sluice_progress (query_id TEXT, topic TEXT, \"partition\" INTEGER, \
                   end_offset BIGINT, batch_id BIGINT, epoch BIGINT, updated_at_ms BIGINT, holes TEXT, \
                   PRIMARY KEY (query_id, topic, \"partition\")); \
                 INSERT INTO sluice_progress VALUES ('q1', 't', 0, 1000, 1, 1, 0, '[]');",
            )
            .unwrap();
        assert_eq!(
            apply(2, 10, 20).unwrap(),
            Applied::Written {
                records: 0,
                dead_lettered: 0,
                applied_before: AppliedBefore::default(),
            },
            "{url}"
        );
        let mut s = grant.lock();
        let b = s.backend();
        b.batch("DROP TABLE sluice_progress").unwrap();
        let rows = b
            .query("SELECT end_offset FROM sluice_progress", &[])
            .unwrap();
        assert_eq!(rows.rows, vec![vec![SqlValue::Integer(20)]], "{url}");
        // On PostgreSQL plugin SQL is checked by its text, so names
        // spelled with Unicode escapes are refused.
        if b.dialect() == sql::Dialect::Postgres {
            drop(s);
            grant.lock().begin().unwrap();
            grant.lock().open_plugin_window().unwrap();
            let e = grant
                .plugin_execute(
                    "CREATE TEMP TABLE U&\"sluice\\005fprogress\" (p INTEGER)",
                    &[],
                )
                .unwrap_err();
            assert!(e.message.contains("Unicode-escaped identifiers"), "{e}");
            grant.lock().rollback();
        }
    }
}

/// Found by an attack run: `ALTER ROLE CURRENT_USER SET search_path =
/// shadow, public` made the host's next connection create and use an
/// empty `shadow.sluice_progress` (the host looked its tables up through
/// `current_schema()`), so a reset applied everything twice. The host now
/// names its schema; a redirect of later connections (here at the
/// database level, which touches only this test's database) changes
/// nothing, and tables an older host left in another schema are pointed
/// out instead of started over.
#[test]
fn a_search_path_redirect_does_not_move_the_host_tables() {
    let Some(url) = databases(tempfile::tempdir().unwrap().path()).pop() else {
        return;
    };
    if !url.starts_with("postgres") {
        return;
    }
    let name = url.rsplit_once('/').map(|(_, n)| n.to_string()).unwrap();
    let apply =
        |driver: &SinkDriver, batch, start, end| apply_empty(driver, part(batch, start, end));
    let first = SqlGrant::connect(&url).unwrap();
    apply(&SinkDriver::new(Some(first.clone())).unwrap(), 1, 0, 10).unwrap();
    first
        .lock()
        .backend()
        .batch(&format!(
            "CREATE SCHEMA shadow; ALTER DATABASE {name} SET search_path = shadow, public"
        ))
        .unwrap();
    let redirected = SqlGrant::connect(&url).unwrap();
    let current = redirected
        .lock()
        .backend()
        .query("SELECT current_schema()::text", &[])
        .unwrap();
    assert_eq!(current.rows, vec![vec![SqlValue::Text("shadow".into())]]);
    let driver = SinkDriver::new(Some(redirected.clone())).unwrap();
    assert!(
        matches!(
            apply(&driver, 1, 0, 10).unwrap(),
            Applied::AlreadyApplied { .. }
        ),
        "the redirected connection must still find the applied range"
    );
    let shadow = redirected
        .lock()
        .backend()
        .query("SELECT to_regclass('shadow.sluice_progress') IS NULL", &[])
        .unwrap();
    assert_eq!(shadow.rows, vec![vec![SqlValue::Integer(1)]]);

    // Tables of an older host in the current schema, none in the named one.
    first
        .lock()
        .backend()
        .batch(&format!("ALTER DATABASE {name} SET search_path = public"))
        .unwrap();
    let moved = SqlGrant::connect(&url).unwrap();
    moved.set_host_schema(Some("elsewhere".into())).unwrap();
    let Err(e) = SinkDriver::new(Some(moved)) else {
        panic!("tables in another schema were not pointed out");
    };
    assert!(e.message.contains("Pass --sink-schema public"), "{e}");
}

/// A second pipeline (another query id) on the same sink and topic is
/// found, with its owner; its own rows and other topics are not.
#[test]
fn another_pipelines_rows_on_the_same_topics_are_found() {
    let dir = tempfile::tempdir().unwrap();
    for url in databases(dir.path()) {
        let grant = SqlGrant::connect(&url).unwrap();
        let first = SinkDriver::new(Some(grant.clone()))
            .unwrap()
            .owner("pid 1 on a, checkpoint /ck1");
        apply_empty(&first, part(1, 0, 10)).unwrap();
        let second = SinkDriver::new(Some(grant.clone())).unwrap();
        assert_eq!(second.other_pipelines("q1", &["t".into()]).unwrap(), vec![]);
        assert_eq!(second.other_pipelines("q2", &["u".into()]).unwrap(), vec![]);
        let found = second.other_pipelines("q2", &["t".into()]).unwrap();
        assert_eq!(found.len(), 1, "{url}");
        assert_eq!(found[0].query_id, "q1");
        assert_eq!(found[0].partitions, 1);
        assert_eq!(found[0].owner, "pid 1 on a, checkpoint /ck1");
        // The advised statement removes exactly those rows.
        grant
            .lock()
            .backend()
            .batch(&second.delete_rows_sql("q1"))
            .unwrap();
        assert_eq!(second.other_pipelines("q2", &["t".into()]).unwrap(), vec![]);
    }
}

/// In a pipeline group every part is fenced by the partition's owner
/// epoch: after another member's claim, the old owner's part is refused
/// and rolled back, the new owner's applies.
#[test]
fn a_group_members_part_is_fenced_after_another_members_claim() {
    use crate::checkpoint::group::{GroupError, GroupStore};
    let dir = tempfile::tempdir().unwrap();
    for url in databases(dir.path()) {
        let schema = if url.starts_with("sqlite:") {
            "main"
        } else {
            "public"
        };
        let (a, b) = (
            GroupStore::open(&url, None, schema, "g").unwrap(),
            GroupStore::open(&url, None, schema, "g").unwrap(),
        );
        let mine = a
            .claim("t", 0, ("a", ""), crate::checkpoint::Epoch::default())
            .unwrap()
            .epoch;
        let grant = SqlGrant::connect(&url).unwrap();
        let driver = SinkDriver::new(Some(grant.clone()))
            .unwrap()
            .in_group(a.tables().clone(), "g");
        let apply = |epoch: u64, start, end| {
            let mut range = part(1, start, end);
            range.batch.epoch = epoch;
            apply_empty(&driver, range)
        };
        apply(mine.get(), 0, 10).unwrap();
        let theirs = b
            .claim("t", 0, ("b", ""), crate::checkpoint::Epoch::default())
            .unwrap()
            .epoch;
        match apply(mine.get(), 10, 20) {
            Err(SinkError::Group(GroupError::Fenced { holder, .. })) => assert_eq!(holder, "b"),
            other => panic!("{url}: {other:?}"),
        }
        let rows = grant
            .lock()
            .backend()
            .query(
                "SELECT end_offset FROM sluice_progress WHERE query_id = 'q1'",
                &[],
            )
            .unwrap();
        assert_eq!(
            rows.rows,
            vec![vec![SqlValue::Integer(10)]],
            "{url}: rolled back"
        );
        apply(theirs.get(), 10, 20).unwrap();
    }
}
