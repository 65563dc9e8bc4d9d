//! The group store on real SQLite and PostgreSQL databases.

use super::*;
use crate::capability::sql::{self, Dialect, SqlValue};
use crate::checkpoint::{Fingerprint, StageKind};

fn urls(dir: &std::path::Path) -> Vec<String> {
    sql::test_databases(dir, "group.db")
}

fn schema(url: &str) -> &'static str {
    if url.starts_with("sqlite:") {
        "main"
    } else {
        "public"
    }
}

fn store(url: &str, group: &str) -> GroupStore {
    GroupStore::open(url, None, schema(url), group).unwrap()
}

fn planned(batch: u64, start: i64, end: i64) -> Planned {
    Planned {
        batch,
        start,
        end,
        plugins: vec![PluginRef {
            stage: StageKind::Sink,
            digest: "d1".into(),
        }],
    }
}

#[test]
fn members_join_with_the_same_pipeline_and_others_are_refused_with_a_diff() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()) {
        let a = store(&url, "g");
        let fp = Fingerprint::new(&["orders".into()]);
        let v1 = vec![PluginRef {
            stage: StageKind::Sink,
            digest: "v1".into(),
        }];
        assert_eq!(a.join(&fp, &v1).unwrap(), v1, "{url}");
        // A second member with other plugins gets the group's.
        let b = store(&url, "g");
        assert_eq!(b.join(&fp, &[]).unwrap(), v1, "{url}");
        let e = b
            .join(&Fingerprint::new(&["orders".into(), "refunds".into()]), &v1)
            .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("+ added:   refunds"), "{url}: {msg}");
        assert!(msg.contains("group topics: orders"), "{url}: {msg}");
        // Another group name is another pipeline.
        assert_eq!(store(&url, "h").join(&fp, &[]).unwrap(), vec![]);
        // A swap changes what new members start with.
        let v2 = vec![PluginRef {
            stage: StageKind::Sink,
            digest: "v2".into(),
        }];
        a.set_plugins(&v2).unwrap();
        assert_eq!(store(&url, "g").join(&fp, &[]).unwrap(), v2);
    }
}

#[test]
fn a_claim_fences_the_previous_owner_and_hands_over_its_planned_range() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()) {
        let (a, b) = (store(&url, "g"), store(&url, "g"));
        let first = a
            .claim("t", 0, ("pid 1 on a", "m-a"), Epoch::default())
            .unwrap();
        assert_eq!(first.epoch, Epoch::new(1), "{url}");
        assert_eq!(first.previous_owner, "");
        assert_eq!(first.planned, None);
        a.plan(&[("t".into(), 0, first.epoch, planned(7, 100, 200))])
            .unwrap();

        // b takes it over (a paused past its session timeout, say).
        let second = b
            .claim("t", 0, ("pid 2 on b", "m-b"), Epoch::default())
            .unwrap();
        assert_eq!(second.epoch, Epoch::new(2), "{url}");
        assert_eq!(second.previous_owner, "pid 1 on a");
        assert_eq!(second.planned, Some(planned(7, 100, 200)), "same bounds");

        // a, still running, is refused everywhere and told by whom.
        for e in [
            a.plan(&[("t".into(), 0, first.epoch, planned(8, 200, 300))])
                .unwrap_err(),
            a.finish(7, &[("t".into(), 0, first.epoch)])
                .unwrap()
                .remove(0),
        ] {
            match e {
                GroupError::Fenced {
                    now, ours, holder, ..
                } => {
                    assert_eq!((now, ours), (Epoch::new(2), Epoch::new(1)), "{url}");
                    assert_eq!(holder, "pid 2 on b");
                }
                other => panic!("{url}: {other}"),
            }
        }
        let mut conn = sql::connect(&url).unwrap();
        assert!(matches!(
            fence(conn.as_mut(), a.tables(), "g", "t", 0, first.epoch),
            Err(GroupError::Fenced { .. })
        ));
        fence(conn.as_mut(), b.tables(), "g", "t", 0, second.epoch).unwrap();
        assert!(matches!(
            fence(conn.as_mut(), b.tables(), "g", "t", 9, second.epoch),
            Err(GroupError::Fenced { holder, .. }) if holder.contains("gone")
        ));

        // A finish of another batch leaves the range; of its own clears it.
        assert!(
            b.finish(6, &[("t".into(), 0, second.epoch)])
                .unwrap()
                .is_empty()
        );
        assert!(b.partitions().unwrap()[0].planned.is_some());
        assert!(
            b.finish(7, &[("t".into(), 0, second.epoch)])
                .unwrap()
                .is_empty()
        );
        let rows = b.partitions().unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].planned, None);
        assert_eq!(rows[0].member_id, "m-b");
        assert_eq!(
            b.owners().unwrap().get("pid 2 on b"),
            Some(&vec![("t".to_string(), 0)])
        );
    }
}

#[test]
fn a_plan_over_several_partitions_records_nothing_when_one_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()) {
        let (a, b) = (store(&url, "g"), store(&url, "g"));
        let e0 = a.claim("t", 0, ("a", ""), Epoch::default()).unwrap().epoch;
        let e1 = a.claim("t", 1, ("a", ""), Epoch::default()).unwrap().epoch;
        b.claim("t", 1, ("b", ""), Epoch::default()).unwrap();
        assert!(
            a.plan(&[
                ("t".into(), 0, e0, planned(1, 0, 10)),
                ("t".into(), 1, e1, planned(1, 0, 10)),
            ])
            .is_err()
        );
        assert!(
            a.partitions().unwrap().iter().all(|p| p.planned.is_none()),
            "{url}: the write-ahead is all or nothing"
        );
    }
}

/// A claim waits for a part's transaction that holds the partition's row
/// (on the sink's own connection), so the part either commits before the
/// claim or is fenced after it; never both.
#[test]
fn a_claim_waits_for_a_part_in_flight_and_fences_the_next() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()) {
        let a = store(&url, "g");
        let epoch = a.claim("t", 0, ("a", ""), Epoch::default()).unwrap().epoch;
        let mut sink = sql::connect(&url).unwrap();
        sink.batch(match sink.dialect() {
            Dialect::Sqlite => "BEGIN IMMEDIATE",
            Dialect::Postgres => "BEGIN",
        })
        .unwrap();
        fence(sink.as_mut(), a.tables(), "g", "t", 0, epoch).unwrap();
        let url2 = url.clone();
        let started = std::time::Instant::now();
        let claimer = std::thread::spawn(move || {
            let b = store(&url2, "g");
            (
                b.claim("t", 0, ("b", ""), Epoch::default()).unwrap().epoch,
                started.elapsed(),
            )
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        sink.batch("COMMIT").unwrap();
        let (next, waited) = claimer.join().unwrap();
        assert_eq!(next, Epoch::new(2), "{url}");
        assert!(
            waited >= std::time::Duration::from_millis(250),
            "{url}: the claim did not wait for the part ({waited:?})"
        );
        sink.batch("BEGIN").unwrap();
        assert!(matches!(
            fence(sink.as_mut(), a.tables(), "g", "t", 0, epoch),
            Err(GroupError::Fenced { .. })
        ));
        sink.batch("ROLLBACK").unwrap();
    }
}

#[test]
fn plugins_are_stored_by_content_and_checked_when_loaded() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()) {
        let a = store(&url, "g");
        let d = a.store_plugin(b"\0asm component bytes").unwrap();
        assert_eq!(d, crate::plugin::digest(b"\0asm component bytes"));
        assert_eq!(a.store_plugin(b"\0asm component bytes").unwrap(), d);
        assert_eq!(a.load_plugin(&d).unwrap(), b"\0asm component bytes");
        assert!(matches!(
            a.load_plugin("nope"),
            Err(GroupError::BadRow { .. })
        ));
        let mut b = sql::connect(&url).unwrap();
        b.execute(
            &format!("UPDATE {} SET bytes = $1", a.tables.plugins),
            &[SqlValue::Blob(b"tampered".to_vec())],
        )
        .unwrap();
        let e = a.load_plugin(&d).unwrap_err().to_string();
        assert!(e.contains("do not have that digest"), "{url}: {e}");
    }
}

#[test]
fn swaps_are_numbered_per_group_and_become_what_new_members_start_with() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()) {
        let g = store(&url, "g");
        let fp = Fingerprint::new(&["orders".into()]);
        let v = |d: &str| {
            vec![PluginRef {
                stage: StageKind::Map,
                digest: d.into(),
            }]
        };
        g.join(&fp, &v("v1")).unwrap();
        assert_eq!(g.latest_swap().unwrap(), None, "{url}");
        let first = g.request_swap(&v("v1"), &v("v2"), "tester").unwrap();
        let second = g.request_swap(&v("v2"), &v("v3"), "tester").unwrap();
        assert_eq!((first.id, second.id), (1, 2), "{url}");
        // A swap computed from plugins the group no longer runs (another
        // swap came first) is refused, and nothing is recorded.
        let raced = g.request_swap(&v("v2"), &v("v4"), "tester").unwrap_err();
        assert!(
            matches!(raced, GroupError::SwapRace { .. }),
            "{url}: {raced}"
        );
        // Another group's swaps are its own.
        let h = store(&url, "h");
        h.join(&fp, &v("v1")).unwrap();
        assert_eq!(
            h.request_swap(&v("v1"), &v("v9"), "tester").unwrap().id,
            1,
            "{url}"
        );
        let last = g.latest_swap().unwrap().unwrap();
        assert_eq!((last.id, last.plugins), (2, v("v3")), "{url}");
        assert_eq!(last.requested_by, "tester", "{url}");
        assert_eq!(g.info().unwrap().unwrap().1, v("v3"), "{url}");
    }
}

#[test]
fn members_report_what_they_run_and_leave_without_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()) {
        let g = store(&url, "g");
        let v1 = vec![PluginRef {
            stage: StageKind::Sink,
            digest: "v1".into(),
        }];
        g.report("pid 1 on a", &v1, 0, None).unwrap();
        g.report("pid 2 on b", &v1, 0, None).unwrap();
        g.report("pid 2 on b", &v1, 3, Some("does not compile"))
            .unwrap();
        store(&url, "other")
            .report("pid 9 on z", &v1, 0, None)
            .unwrap();
        let rows = g.members().unwrap();
        assert_eq!(rows.len(), 2, "{url}: {rows:?}");
        assert_eq!(rows[1].member, "pid 2 on b", "{url}");
        assert_eq!(rows[1].swap_id, 3, "{url}");
        assert_eq!(rows[1].swap_error.as_deref(), Some("does not compile"));
        assert!(rows[1].seen_at_ms >= rows[1].started_at_ms, "{url}");
        assert!(g.touch("pid 1 on a", "{}").unwrap(), "{url}");
        g.leave("pid 1 on a").unwrap();
        // Gone: the heartbeat says so, and the member reports again.
        assert!(!g.touch("pid 1 on a", "{}").unwrap(), "{url}");
        let rows = g.members().unwrap();
        assert_eq!(rows.len(), 1, "{url}: {rows:?}");
        assert_eq!(rows[0].member, "pid 2 on b", "{url}");
    }
}

#[test]
fn a_claim_goes_above_the_epoch_the_progress_row_was_written_with() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()) {
        let g = store(&url, "g");
        // No partition row (deleted by hand, say) but progress written at
        // epoch 15: the claim takes 16, not 1.
        let c = g.claim("t", 0, ("a", ""), Epoch::new(15)).unwrap();
        assert_eq!(c.epoch, Epoch::new(16), "{url}");
        // A row above the floor keeps counting from itself.
        let c = g.claim("t", 0, ("b", ""), Epoch::new(3)).unwrap();
        assert_eq!(c.epoch, Epoch::new(17), "{url}");
    }
}
