//! Crashes, signals and resets of the real `host` binary on the mock
//! cluster, checked through the non-idempotent sql-counter sink (a counter
//! bumped per record: a duplicate or a loss shows): kill -9 between parts
//! of a range, SIGTERM and a second SIGINT mid-batch, a reset forward then
//! back, and a seeded random walk of all of them.

use std::path::Path;
use std::time::Duration;

use sluice_host::capability::sql::{SqlValue, connect};

use crate::support::kafka::raw_topic;
use crate::support::kafka::{Broker, Mock, producer};
use crate::support::{Db, HostProcess, PrivatePg, RunArgs};

/// How long to wait for a log line.
const WAIT: Duration = Duration::from_secs(60);

/// A `host run` of 5,000 records in one partition and one batch (sunk in
/// parts of 2,000), paused just before its second part commits; with the
/// broker, the directory, the database and its arguments.
fn paused_before_the_second_part_commits() -> (Mock, tempfile::TempDir, Db, Vec<String>, HostProcess)
{
    let mock = raw_topic((0..5000).map(|i| format!("v{i}")));
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite();
    let args = counter_run_args(&mock, &dir.path().join("ckpt"), &db, "10000");
    let mut run = HostProcess::spawn(&args, &[("SLUICE_FAILPOINT", "sink:before-db-commit@2")]);
    run.wait_for("FAILPOINT", WAIT);
    (mock, dir, db, args, run)
}

#[test]
fn a_crash_between_parts_of_a_range_resumes_after_the_last_part_applied() {
    // 5,000 records in one partition, one batch: the host sinks them in
    // parts [0, 2000), [2000, 4000), [4000, 5000), each its own
    // transaction. Kill -9 just before the second part commits, restart:
    // the re-run skips [0, 2000) and applies the rest once, which a
    // non-idempotent sink (a counter bumped per record) shows exactly.
    let (_mock, _dir, db, args, mut run) = paused_before_the_second_part_commits();
    run.kill();
    assert_eq!(db.scalar("SELECT end_offset FROM sluice_progress"), 2000);
    assert_eq!(db.counted(), 2000);

    let log = run_to_end(&args);
    assert!(
        log.contains(
            "2000 of the 5000 offsets of [0, 5000) were already applied by an earlier run of this batch; not applied again"
        ),
        "{log}"
    );
    assert_eq!(db.scalar("SELECT end_offset FROM sluice_progress"), 5000);
    assert_eq!(db.counted(), 5000);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM seen"), 5000);
}

#[test]
fn the_bulk_path_killed_before_its_part_commits_applies_each_record_once() {
    // sql-counter with bulk=true writes each part through `sql.apply` in
    // `close` and bumps its counter by the rows that call changed. Killed
    // after the second part's bulk statements and progress row, before
    // its commit (and, earlier, after its write): only the first part is
    // there, and a restart applies the rest once.
    for fp in ["sink:before-db-commit@2", "sink:after-write@2"] {
        for db in Db::both() {
            let mock = raw_topic((0..5000).map(|i| format!("v{i}")));
            let dir = tempfile::tempdir().unwrap();
            let mut args = counter_run_args(&mock, &dir.path().join("ckpt"), &db, "10000");
            args.extend(["--config".to_string(), "bulk=true".to_string()]);
            let mut run = HostProcess::spawn(&args, &[("SLUICE_FAILPOINT", fp)]);
            run.wait_for("FAILPOINT", WAIT);
            run.kill();
            let what = format!("{fp} {}", db.name);
            assert_eq!(db.scalar("SELECT COUNT(*) FROM seen_bulk"), 2000, "{what}");
            first_part_only_then_all_once(&db, &args);
            assert_eq!(db.scalar("SELECT COUNT(*) FROM seen_bulk"), 5000, "{what}");
        }
    }
}

#[test]
fn parts_of_other_partitions_commit_on_their_own_connections_while_one_part_waits() {
    // Two partitions of 4,500 records, one batch: each range is applied in
    // three parts (2,000, 2,000, 500), no sink plugin (only progress rows),
    // PostgreSQL. The first part to reach its commit is held there
    // (transaction open). With one connection nothing else commits; with
    // `--sink-connections 2` the other partition's three parts commit on
    // the other connection meanwhile, in order (no holes), and the held
    // partition's later parts wait behind their first on its connection.
    // Released, the run applies everything.
    for connections in ["1", "2"] {
        let mock = Mock::new();
        mock.create_topic("raw", 2);
        let p = producer(&mock.bootstrap());
        for i in 0..9000 {
            p.send("raw", i % 2, None, Some(format!("v{i}").as_bytes()), &[]);
        }
        p.flush();
        let dir = tempfile::tempdir().unwrap();
        let resume = dir.path().join("resume");
        let db = Db::postgres();
        let args = RunArgs::new(&mock.bootstrap(), &["raw"], &dir.path().join("ckpt"))
            .sink_db(&db)
            .plugin("passthrough")
            .args(["--until-caught-up", "--progress", "none"])
            .args(["--sink-connections", connections])
            .build();
        let mut run = HostProcess::spawn(
            &args,
            &[
                ("SLUICE_FAILPOINT", "sink:before-db-commit@1"),
                ("SLUICE_FAILPOINT_RESUME_FILE", resume.to_str().unwrap()),
            ],
        );
        run.wait_for("FAILPOINT", WAIT);
        let rows =
            || db.sorted_texts("SELECT end_offset::text || ' ' || holes FROM sluice_progress");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while connections == "2" && rows() != ["4500 []"] && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        // A moment for anything else that could commit to show.
        std::thread::sleep(Duration::from_millis(500));
        if connections == "1" {
            assert_eq!(rows(), Vec::<String>::new(), "one connection, held");
        } else {
            assert_eq!(
                rows(),
                vec!["4500 []"],
                "the other partition's parts only, in order"
            );
        }
        std::fs::write(&resume, b"").unwrap();
        let (code, log) = run.finish();
        assert_eq!(code, Some(0), "{log}");
        assert_eq!(rows(), vec!["4500 []", "4500 []"], "{log}");
        assert_eq!(
            log.contains("on 2 sink connections at once"),
            connections == "2",
            "{log}"
        );
    }
}

/// `host run` over `raw` into SQLite through sql-counter (a counter bumped
/// per record: a duplicate or a loss shows in it), `max` records per
/// partition per batch, until caught up.
fn counter_run_args(mock: &Mock, ckpt: &Path, db: &Db, max: &str) -> Vec<String> {
    RunArgs::new(&mock.bootstrap(), &["raw"], ckpt)
        .sink_db(db)
        .plugin("sql_counter")
        .args(["--until-caught-up", "--max-records-per-partition", max])
        .args(["--progress", "none"])
        .build()
}

/// Run `host` with `args` (info logs, no failpoint) and assert it exits 0;
/// its stderr.
fn run_to_end(args: &[String]) -> String {
    let out = std::process::Command::new(crate::support::host_bin())
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("SLUICE_FAILPOINT")
        .env_remove("SLUICE_FAILPOINT_RESUME_FILE")
        .output()
        .unwrap();
    let log = crate::support::stderr(&out);
    assert!(out.status.success(), "{log}");
    log
}

/// After a stop in the second part of a 5,000-record batch: only the
/// first part (2,000 records) is applied, and a restart applies the rest,
/// each record once.
fn first_part_only_then_all_once(db: &Db, args: &[String]) {
    assert_eq!(db.scalar("SELECT end_offset FROM sluice_progress"), 2000);
    assert_eq!(db.counted(), 2000);
    run_to_end(args);
    assert_eq!(db.counted(), 5000);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM seen"), 5000);
}

#[test]
fn sigterm_mid_batch_finishes_and_commits_that_batch_then_exits_0() {
    // 5,000 records, 1,000 per batch. SIGTERM arrives while the second
    // batch is paused just after its write-ahead entry (until the test
    // has seen the stop request): that batch is still sunk and committed,
    // no third batch starts, and the process exits 0. A restart applies
    // the rest, each record once.
    let mock = raw_topic((0..5000).map(|i| format!("v{i}")));
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite();
    let args = counter_run_args(&mock, &dir.path().join("ckpt"), &db, "1000");
    let resume = dir.path().join("resume");
    let mut run = HostProcess::spawn(
        &args,
        &[
            ("SLUICE_FAILPOINT", "engine:after-write-ahead@2"),
            ("SLUICE_FAILPOINT_RESUME_FILE", resume.to_str().unwrap()),
        ],
    );
    run.wait_for("FAILPOINT", WAIT);
    run.signal("TERM");
    run.wait_for("SIGTERM: stop requested", WAIT);
    std::fs::write(&resume, "").unwrap();
    let (code, log) = run.finish();
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("stopped cleanly"), "{log}");
    first_part_only_then_all_once(&db, &args);
}

#[test]
fn a_second_signal_aborts_with_exit_130_and_the_batch_runs_again_exactly_once() {
    // One batch of 5,000 records, sunk in parts of 2,000. The second part
    // hangs before its commit; SIGINT asks for a stop (which waits for the
    // batch), a second SIGINT aborts at once: exit 130, a message that
    // says so, the first part applied and nothing else. The restart
    // finishes the batch with every record counted once.
    let (_mock, _dir, db, args, mut run) = paused_before_the_second_part_commits();
    run.signal("INT");
    run.wait_for("SIGINT: stop requested", WAIT);
    run.signal("INT");
    let (code, log) = run.finish();
    assert_eq!(code, Some(130), "{log}");
    assert!(
        log.contains("SIGINT: aborting now (exit 130): a batch in flight is not committed"),
        "{log}"
    );
    first_part_only_then_all_once(&db, &args);
}

#[test]
fn reset_forward_then_back_applies_the_skipped_records_once() {
    // `host run` applies [0, 100); `checkpoint reset` forward to 200 and
    // a run to the end apply [200, 300); a reset back to 100 then applies
    // the skipped [100, 200) and skips [200, 300). A counter bumped per
    // record ends at exactly 300.
    let mock = raw_topic((0..100).map(|i| format!("v{i}")));
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite();
    let ckpt = dir.path().join("ckpt");
    let args = counter_run_args(&mock, &ckpt, &db, "60");
    let run = || {
        run_to_end(&args);
    };
    let reset = |to: i64| {
        let out = crate::support::host(&[
            "checkpoint",
            "reset",
            ckpt.to_str().unwrap(),
            "--to",
            &format!("offsets:{{\"raw\":{{\"0\":{to}}}}}"),
        ]);
        assert!(out.status.success(), "{}", crate::support::stderr(&out));
    };
    run();
    let p = producer(&mock.bootstrap());
    for i in 100..300 {
        p.send("raw", 0, None, Some(format!("v{i}").as_bytes()), &[]);
    }
    p.flush();
    reset(200);
    run();
    assert_eq!(db.counted(), 200);
    reset(100);
    run();
    assert_eq!(db.counted(), 300);
    assert_eq!(
        db.scalar("SELECT COUNT(DISTINCT idempotency_key) FROM seen"),
        300
    );
    assert_eq!(db.scalar("SELECT end_offset FROM sluice_progress"), 300);
}

/// What the sink's progress row shows applied per partition of `raw`
/// (every offset below `end_offset` except the `holes`), and what
/// sql-counter wrote; both checked against each other.
fn check_applied_exactly(db: &Db, partitions: i32, what: &str) {
    let mut b = connect(&db.url).unwrap();
    let Ok(counter) = b.query("SELECT n FROM counters WHERE name = 'records'", &[]) else {
        return; // nothing applied yet
    };
    let n = match counter.rows.first().and_then(|r| r.first()) {
        Some(SqlValue::Integer(n)) => *n,
        _ => 0,
    };
    let keys: Vec<String> = b
        .query("SELECT idempotency_key FROM seen", &[])
        .unwrap()
        .rows
        .into_iter()
        .map(|r| match &r[0] {
            SqlValue::Text(k) => k.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    let distinct: std::collections::BTreeSet<&String> = keys.iter().collect();
    assert_eq!(
        (n as usize, keys.len()),
        (distinct.len(), distinct.len()),
        "{what}: counter, rows in seen and distinct keys differ"
    );
    for p in 0..partitions {
        let row = b
            .query(
                "SELECT end_offset, holes FROM sluice_progress WHERE topic = 'raw' AND \"partition\" = $1",
                &[SqlValue::Integer(p.into())],
            )
            .unwrap();
        let shown: std::collections::BTreeSet<i64> = match row.rows.first().map(|r| (&r[0], &r[1]))
        {
            None => Default::default(),
            Some((SqlValue::Integer(end), SqlValue::Text(holes))) => {
                let holes: Vec<(i64, i64)> = serde_json::from_str(holes).unwrap();
                (0..*end)
                    .filter(|o| !holes.iter().any(|(s, e)| s <= o && o < e))
                    .collect()
            }
            other => panic!("{other:?}"),
        };
        let prefix = format!("raw/{p}/");
        let written: std::collections::BTreeSet<i64> = distinct
            .iter()
            .filter_map(|k| k.strip_prefix(&prefix))
            .map(|o| o.parse().unwrap())
            .collect();
        assert_eq!(written, shown, "{what}: partition {p}");
    }
}

#[test]
fn random_runs_crashes_and_resets_apply_every_offset_once() {
    // A seeded random walk over what operators and machines do: runs to
    // caught up with various batch sizes, kill -9 at a failpoint, resets
    // forward and back (also into holes), more records. After every step
    // the records sql-counter wrote (counter, `seen`) are exactly the
    // offsets the progress row shows applied; at the end a reset to
    // earliest applies every record exactly once. SLUICE_CHAOS_STEPS and
    // SLUICE_CHAOS_SEED run a longer or another walk.
    random_walk(&Db::sqlite(), 2, &[], 7);
}

#[test]
fn random_runs_crashes_and_resets_on_several_sink_connections_apply_every_offset_once() {
    // The same walk on PostgreSQL with the parts of 5 partitions applied on
    // 3 connections at once (`--sink-connections 3`): parts commit in no
    // set order across connections, every connection's transaction bumps
    // the one counter row (so they queue on its lock), and a kill -9 may
    // leave any of them uncommitted.
    random_walk(
        &Db::postgres(),
        5,
        &["--sink-connections", "3", "--map-threads", "2"],
        11,
    );
}

/// The random walk of the tests above on `db`, over `partitions`
/// partitions of `raw`, each `host run` with `extra` arguments;
/// `seed` unless SLUICE_CHAOS_SEED says otherwise.
fn random_walk(db: &Db, partitions: i32, extra: &[&str], seed: u64) {
    let steps: u64 = std::env::var("SLUICE_CHAOS_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let mut state: u64 = std::env::var("SLUICE_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(seed)
        .max(1);
    let mut next = move |n: u64| {
        // xorshift64: a fixed, dependency-free sequence per seed.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let mock = Mock::new();
    mock.create_topic("raw", partitions);
    let mut total = vec![0i64; partitions as usize];
    let produce = |n: usize, total: &mut [i64]| {
        let p = producer(&mock.bootstrap());
        for i in 0..n {
            let part = (i % partitions as usize) as i32;
            p.send("raw", part, None, Some(format!("v{i}").as_bytes()), &[]);
            total[part as usize] += 1;
        }
        p.flush();
    };
    produce(200, &mut total);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let ck = ckpt.to_str().unwrap().to_string();
    let args = |max: &str| {
        let mut a = counter_run_args(&mock, &ckpt, db, max);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run = |max: &str| {
        run_to_end(&args(max));
    };
    for step in 0..steps {
        let what = match next(5) {
            0 | 1 => {
                let max = ["7", "50", "1000"][next(3) as usize];
                run(max);
                format!("step {step}: run, max {max}")
            }
            2 => {
                let fp = [
                    "sink:before-db-commit",
                    "sink:after-write",
                    "engine:after-write-ahead",
                    "engine:before-commit",
                ][next(4) as usize];
                let at = format!("{fp}@{}", 1 + next(3));
                let mut w = HostProcess::spawn(&args("13"), &[("SLUICE_FAILPOINT", &at)]);
                // Killed at the failpoint, or it finished before reaching it.
                w.logged("FAILPOINT", WAIT);
                w.kill();
                format!("step {step}: kill -9 at {at}")
            }
            3 => {
                // Anywhere, or near the end (mostly a jump forward, which
                // leaves a hole for a later reset back to fill).
                let to: Vec<String> = (0..partitions)
                    .map(|p| {
                        let t = total[p as usize] as u64;
                        let o = if next(2) == 0 {
                            next(t + 1)
                        } else {
                            t - next(t.min(30) + 1)
                        };
                        format!("\"{p}\":{o}")
                    })
                    .collect();
                let to = format!("offsets:{{\"raw\":{{{}}}}}", to.join(","));
                let reset = || crate::support::host(&["checkpoint", "reset", &ck, "--to", &to]);
                let mut out = reset();
                if crate::support::stderr(&out).contains("run the pipeline once") {
                    // As the message says: finish the killed run's batch.
                    run("1000");
                    out = reset();
                }
                let e = crate::support::stderr(&out);
                // Refused (and harmless) only before the first run.
                assert!(
                    out.status.success() || e.contains("not a checkpoint directory"),
                    "{e}"
                );
                format!("step {step}: reset {to} (ok: {})", out.status.success())
            }
            _ => {
                produce(20 + next(60) as usize, &mut total);
                format!("step {step}: produce, totals {total:?}")
            }
        };
        eprintln!("{what}");
        check_applied_exactly(db, partitions, &what);
    }
    // Finish what is pending, then everything from the start.
    run("1000");
    let zero: Vec<String> = (0..partitions).map(|p| format!("\"{p}\":0")).collect();
    let out = crate::support::host(&[
        "checkpoint",
        "reset",
        &ck,
        "--to",
        &format!("offsets:{{\"raw\":{{{}}}}}", zero.join(",")),
    ]);
    assert!(out.status.success(), "{}", crate::support::stderr(&out));
    run("50");
    check_applied_exactly(db, partitions, "final");
    let sum: i64 = total.iter().sum();
    assert_eq!(db.counted(), sum);
    assert_eq!(
        db.sorted_texts("SELECT holes FROM sluice_progress"),
        vec!["[]"; partitions as usize]
    );
}

#[test]
fn a_sink_database_restart_mid_run_loses_and_duplicates_nothing() {
    // Found by an attack run: a PostgreSQL restart killed the job within a
    // second (57P01, then 08000 retried on the dead connection). Now the
    // host reconnects and applies the part in flight again from its
    // progress row; the non-idempotent counter shows each record once.
    // A private server: the suite's shared one must not be restarted.
    let pg = PrivatePg::start();
    let db = Db::at(pg.url());
    let mock = raw_topic((0..6000).map(|i| format!("v{i}")));
    let dir = tempfile::tempdir().unwrap();
    let args = |ckpt: &str, extra: &[&str]| {
        RunArgs::new(&mock.bootstrap(), &["raw"], &dir.path().join(ckpt))
            .sink_db(&db)
            .plugin("sql_counter")
            .args(["--until-caught-up", "--max-records-per-partition", "20"])
            .args([
                "--trigger-interval",
                "10ms",
                "--progress",
                "none",
                "--attempts",
                "1",
            ])
            .args(extra)
            .build()
    };
    let mut run = HostProcess::start(&args("ckpt", &[]));
    run.wait_for("batch committed", WAIT);
    pg.stop();
    std::thread::sleep(Duration::from_secs(2));
    pg.start_again();
    let (code, log) = run.finish();
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("sink database connection lost"), "{log}");
    assert!(log.contains("sink database reconnected"), "{log}");
    assert_eq!(db.counted(), 6000, "{log}");
    assert_eq!(
        db.scalar("SELECT COUNT(DISTINCT idempotency_key) FROM seen"),
        6000
    );
    assert_eq!(db.scalar("SELECT COUNT(*) FROM seen"), 6000);

    // A database that stays away stops the job after --sink-retry-for,
    // naming the database, with nothing committed past what it applied.
    let more = producer(&mock.bootstrap());
    for i in 0..4000 {
        more.send("raw", 0, None, Some(format!("w{i}").as_bytes()), &[]);
    }
    more.flush();
    let mut run = HostProcess::start(&args("ckpt", &["--sink-retry-for", "2s"]));
    // Mid-run, not at start-up: the host opens its tables just after the
    // checkpoint, and a database gone then is a start-up error (exit 1,
    // naming the database) without a reconnect.
    run.wait_for("batch committed", WAIT);
    pg.stop();
    let (code, log) = run.finish();
    assert_ne!(code, Some(0), "{log}");
    assert!(log.contains("stayed unreachable"), "{log}");
    pg.start_again();
    let (code, log) = HostProcess::start(&args("ckpt", &[])).finish();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(db.counted(), 10_000, "{log}");
    assert_eq!(db.scalar("SELECT COUNT(*) FROM seen"), 10_000);
}
