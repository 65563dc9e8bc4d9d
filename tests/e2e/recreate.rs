//! A topic deleted and created again under the same name (or read through
//! a checkpoint of another cluster's topic of that name): the host must
//! stop before reading it, never skip its records, and the advice it
//! prints, followed literally, must apply the new records exactly once.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::kafka::{Broker, BrokerProcess, Mock, producer};
use crate::support::{Db, RunArgs, host_bin, stderr};

/// Arguments of `host run` of the non-idempotent sql-counter sink over
/// `topics`, then `extra`.
fn counter_args(
    bootstrap: &str,
    topics: &[&str],
    ckpt: &Path,
    db: &Db,
    extra: &[&str],
) -> Vec<String> {
    RunArgs::new(bootstrap, topics, ckpt)
        .sink_db(db)
        .plugin("sql_counter")
        .args(extra)
        .build()
}

/// `host run` of sql-counter over `topic` until caught up, 7 records per
/// partition per batch.
fn run(bootstrap: &str, topic: &str, ckpt: &Path, db: &Db) -> Output {
    let args = counter_args(
        bootstrap,
        &[topic],
        ckpt,
        db,
        &[
            "--until-caught-up",
            "--max-records-per-partition",
            "7",
            "--progress",
            "none",
        ],
    );
    Command::new(host_bin())
        .args(&args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn produce(b: &dyn Broker, topic: &str, partition: i32, values: impl IntoIterator<Item = String>) {
    let p = producer(&b.bootstrap());
    for v in values {
        p.send(topic, partition, None, Some(v.as_bytes()), &[]);
    }
    p.flush();
}

/// Wait for `child`; kill it and fail after `limit`.
fn wait_at_most(mut child: std::process::Child, limit: std::time::Duration) -> Output {
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("still running after {limit:?}: {}", stderr(&out));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// Assert that `out` is a success, showing its stderr otherwise.
fn ok(out: Output) -> Output {
    assert!(out.status.success(), "{}", stderr(&out));
    out
}

/// A mock cluster whose one-partition topic `raw` holds `v0`…`v{n-1}`,
/// all applied to `db` by one run under a new checkpoint (the temp dir
/// that holds it, and its path).
fn applied_once(n: usize, db: &Db) -> (Mock, tempfile::TempDir, std::path::PathBuf) {
    let mock = Mock::new();
    mock.create_topic("raw", 1);
    produce(&mock, "raw", 0, (0..n).map(|i| format!("v{i}")));
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    ok(run(&mock.bootstrap(), "raw", &ckpt, db));
    (mock, dir, ckpt)
}

/// Each value in `seen` with how often the sink applied it.
fn seen(db: &Db) -> std::collections::BTreeMap<String, i64> {
    db.query("SELECT value, COUNT(*) FROM seen GROUP BY value")
        .into_iter()
        .map(|r| match (&r[0], &r[1]) {
            (
                sluice_host::capability::sql::SqlValue::Text(v),
                sluice_host::capability::sql::SqlValue::Integer(n),
            ) => (v.clone(), *n),
            other => panic!("{other:?}"),
        })
        .collect()
}

/// The command between the backticks after `with ` in the host's error,
/// run as it stands (`host` replaced by the built binary).
fn follow_advice(err: &str) -> Output {
    let start = err
        .find("with `host checkpoint reset ")
        .unwrap_or_else(|| panic!("no reset advice in: {err}"))
        + "with `".len();
    let cmd = &err[start..start + err[start..].find('`').unwrap()];
    let words: Vec<&str> = cmd.split_whitespace().collect();
    assert_eq!(words[0], "host", "{cmd}");
    let out = Command::new(host_bin())
        .args(&words[1..])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    out
}

/// The whole story on one broker: 10 records applied, the topic recreated
/// with 15 records (more than the old position), the run refused with
/// nothing applied, the advice followed, and the 15 new records applied
/// once. `recreate` deletes and recreates the topic and fills it.
fn recreate_and_grow(
    bootstrap: impl Fn() -> String,
    recreate: impl FnOnce(),
    first: impl FnOnce(),
) {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    first();
    let out = run(&bootstrap(), "raw", &ckpt, &db);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(db.counted(), 10);

    recreate();
    let out = run(&bootstrap(), "raw", &ckpt, &db);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("was deleted and created again"), "{err}");
    assert!(err.contains("topic id"), "{err}");
    assert!(err.contains("--topic raw --to earliest"), "{err}");
    assert_eq!(db.counted(), 10, "nothing of the new topic applied: {err}");

    let reset = follow_advice(&err);
    let said = String::from_utf8_lossy(&reset.stdout);
    assert!(
        said.contains("sink progress raw/0: applied below 10 -> no row"),
        "{said}"
    );
    let out = run(&bootstrap(), "raw", &ckpt, &db);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(db.counted(), 25);
    let s = seen(&db);
    assert_eq!(s.len(), 25, "{s:?}");
    assert!(s.values().all(|n| *n == 1), "{s:?}");
    assert!((0..15).all(|i| s.contains_key(&format!("new{i}"))), "{s:?}");
}

#[test]
fn a_recreated_topic_that_grew_past_the_old_position_is_refused_then_applied_once_mock() {
    // The mock cluster cannot delete a topic; a second cluster's topic of
    // the same name is the same case to the host: another topic id.
    let old = Mock::new();
    old.create_topic("raw", 1);
    let new = Mock::new();
    new.create_topic("raw", 1);
    let addr = std::cell::RefCell::new(old.bootstrap());
    recreate_and_grow(
        || addr.borrow().clone(),
        || {
            produce(&new, "raw", 0, (0..15).map(|i| format!("new{i}")));
            *addr.borrow_mut() = new.bootstrap();
        },
        || produce(&old, "raw", 0, (0..10).map(|i| format!("old{i}"))),
    );
}

#[test]
fn a_recreated_topic_that_grew_past_the_old_position_is_refused_then_applied_once_on_kafka() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("raw", 1);
    recreate_and_grow(
        || kafka.bootstrap(),
        || {
            kafka.delete_topic("raw");
            kafka.create_topic("raw", 1);
            produce(&kafka, "raw", 0, (0..15).map(|i| format!("new{i}")));
        },
        || produce(&kafka, "raw", 0, (0..10).map(|i| format!("old{i}"))),
    );
}

#[test]
fn the_beyond_the_end_advice_followed_literally_applies_the_rest_once() {
    // A checkpoint reset forward past the log's end (here by hand) stops
    // the next run with "beyond the high watermark"; its advice resets to
    // earliest and must not forget what the sink applied (the log was not
    // recreated: its topic id is the same), so only the new records are
    // applied, and the skip is a warning with counts.
    let db = Db::sqlite();
    let (mock, _dir, ckpt) = applied_once(10, &db);
    let out = crate::support::host(&[
        "checkpoint",
        "reset",
        ckpt.to_str().unwrap(),
        "--to",
        "offsets:{\"raw\":{\"0\":50}}",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    produce(&mock, "raw", 0, (10..15).map(|i| format!("v{i}")));
    let out = run(&mock.bootstrap(), "raw", &ckpt, &db);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("beyond the partition's high watermark 15"),
        "{err}"
    );
    let reset = follow_advice(&err);
    let said = String::from_utf8_lossy(&reset.stdout);
    assert!(
        said.contains("10 offsets from 0 on are already applied and will not be applied again"),
        "{said}"
    );
    let out = run(&mock.bootstrap(), "raw", &ckpt, &db);
    let log = stderr(&out);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("WARN") && log.contains("were already applied by an earlier batch"),
        "{log}"
    );
    assert_eq!(db.counted(), 15);
    assert!(seen(&db).values().all(|n| *n == 1));
}

#[test]
fn a_reset_that_must_move_sink_rows_without_sink_db_is_refused_with_the_command() {
    for db in Db::both() {
        refused_then_moved_on(&db);
    }
}

/// [`a_reset_that_must_move_sink_rows_without_sink_db_is_refused_with_the_command`]
/// on one database.
fn refused_then_moved_on(db: &Db) {
    let (_old, _dir, ckpt) = applied_once(3, db);
    let new = Mock::new();
    new.create_topic("raw", 1);
    let ck = ckpt.to_str().unwrap();
    let out = crate::support::host(&[
        "checkpoint",
        "reset",
        ck,
        "--to",
        "earliest",
        "--brokers",
        &new.bootstrap(),
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("--sink-db {}", db.url)), "{err}");
    assert!(err.contains("nothing was changed"), "{err}");
    // With it, the old topic's row is forgotten: the new topic's records
    // are applied from offset 0.
    produce(&new, "raw", 0, (0..3).map(|i| format!("v{i}")));
    let out = crate::support::host(&[
        "checkpoint",
        "reset",
        ck,
        "--to",
        "earliest",
        "--brokers",
        &new.bootstrap(),
        "--sink-db",
        &db.url,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    ok(run(&new.bootstrap(), "raw", &ckpt, db));
    assert_eq!(db.counted(), 6);
    let shown = crate::support::host(&["checkpoint", "show", ck]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("identity    raw: topic id"), "{shown}");
}

#[test]
fn reapply_applies_again_what_the_sink_shows_applied() {
    for db in Db::both() {
        reapply_on(&db);
    }
}

/// [`reapply_applies_again_what_the_sink_shows_applied`] on one database.
fn reapply_on(db: &Db) {
    let (mock, _dir, ckpt) = applied_once(8, db);
    let ck = ckpt.to_str().unwrap();
    let reset = |extra: &[&str]| {
        let mut args = vec![
            "checkpoint",
            "reset",
            ck,
            "--to",
            "offsets:{\"raw\":{\"0\":5}}",
        ];
        args.extend_from_slice(extra);
        crate::support::host(&args)
    };
    let out = reset(&["--reapply"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = reset(&["--reapply", "--sink-db", &db.url]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("applied below 8 -> applied below 5"),
        "{said}"
    );
    ok(run(&mock.bootstrap(), "raw", &ckpt, db));
    assert_eq!(
        db.counted(),
        11,
        "{}: offsets 5, 6 and 7 applied a second time",
        db.name
    );
}

/// `host run` of sql-counter over `raw` with progress lines on stdout,
/// planning every `trigger`: the process (stderr piped) and its stdout
/// lines as they come.
fn counting_host(
    bootstrap: &str,
    ckpt: &Path,
    db: &Db,
    trigger: &str,
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead, BufReader};
    let args = counter_args(
        bootstrap,
        &["raw"],
        ckpt,
        db,
        &["--trigger-interval", trigger, "--progress", "json"],
    );
    let mut host = Command::new(host_bin())
        .args(&args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = host.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    (host, rx)
}

#[test]
fn recreating_a_topic_with_more_partitions_under_a_running_host_never_crashes_it() {
    // librdkafka 2.12.1 crashed (SIGSEGV, exit 139) in 5 of 6 tries when
    // a topic was deleted and recreated under a consumer that kept
    // fetching from a broker with a fault in its Fetch answers (see
    // KafkaSource::pause). Each round: the host runs idle over the topic, the topic
    // is recreated with one more partition, and the host must stop with
    // exit 1 and the recreated-topic message; the reset it advises then
    // lets the next round start.
    let kafka = BrokerProcess::start();
    kafka.create_topic("raw", 1);
    produce(&kafka, "raw", 0, (0..5).map(|i| format!("v{i}")));
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    ok(run(&kafka.bootstrap(), "raw", &ckpt, &db));
    let mut advice = None::<String>;
    for round in 0..20 {
        if let Some(err) = advice.take() {
            follow_advice(&err);
        }
        let (host, lines) = counting_host(&kafka.bootstrap(), &ckpt, &db, "50ms");
        // Idle by then: the previous round's records applied (one batch
        // line), and the next plan found nothing to read. A deletion in
        // the middle of a fetch can still crash librdkafka on a broker
        // with that fault (see KafkaSource::pause); an idle host must
        // never.
        if round > 0 {
            let line = lines
                .recv_timeout(std::time::Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("round {round}: no batch committed: {e}"));
            assert!(line.contains("\"batch_id\""), "{line}");
        }
        std::thread::sleep(std::time::Duration::from_millis(700));
        kafka.delete_topic("raw");
        kafka.create_topic("raw", 2 + round);
        produce(&kafka, "raw", 0, (0..3).map(|i| format!("r{round}-{i}")));
        let out = wait_at_most(host, std::time::Duration::from_secs(60));
        let err = stderr(&out);
        assert_eq!(
            out.status.code(),
            Some(1),
            "round {round}: the host must stop with exit 1, not a signal: {:?} {err}",
            out.status
        );
        assert!(
            err.contains("was deleted and created again"),
            "round {round}: {err}"
        );
        advice = Some(err);
    }
    // Nothing applied twice; the last generation applied whole. (A round's
    // records are applied by the next round's host before the topic goes
    // again, unless the machine is slow enough to delete them unread.)
    follow_advice(&advice.unwrap());
    ok(run(&kafka.bootstrap(), "raw", &ckpt, &db));
    let s = seen(&db);
    assert!(s.values().all(|n| *n == 1), "{s:?}");
    assert_eq!(db.counted(), s.len() as i64);
    assert!((0..3).all(|i| s.contains_key(&format!("r19-{i}"))), "{s:?}");
    assert!((0..5).all(|i| s.contains_key(&format!("v{i}"))), "{s:?}");
}

/// A topic deleted and created again under a host that is busy reading it
/// (a producer adds a record every 10 ms, so every batch fetches and the
/// broker creates the topic again as soon as it is gone), `rounds` times:
/// the host must stop with exit 1 and the recreated-topic message each
/// time, never die of a signal, and the advice it prints must let the
/// next round start. Returns how each round that did not end so went.
///
/// A broker that answers a Fetch for the deleted topic's id with fields
/// the negotiated version lacks crashed librdkafka 2.12.1 here (SIGSEGV;
/// see `KafkaSource::pause`).
fn recreate_under_a_busy_host(broker: &BrokerProcess, rounds: usize) -> Vec<String> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    broker.create_topic("raw", 1);
    let bootstrap = broker.bootstrap();
    let stop = Arc::new(AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        let bootstrap = bootstrap.clone();
        std::thread::spawn(move || {
            let p = producer(&bootstrap);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                p.send("raw", 0, None, Some(format!("t{n}").as_bytes()), &[]);
                n += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            p.flush();
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    let mut advice = None::<String>;
    let mut failures = Vec::new();
    for round in 0..rounds {
        if let Some(err) = advice.take() {
            follow_advice(&err);
        }
        let (host, rx) = counting_host(&bootstrap, &ckpt, &db, "20ms");
        // Busy: three batches that read records.
        let mut busy = 0;
        while busy < 3 {
            let line = rx
                .recv_timeout(std::time::Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("round {round}: no batch committed: {e}"));
            if line.contains("\"batch_id\"") && !line.contains("\"input\":0") {
                busy += 1;
            }
        }
        broker.delete_topic("raw");
        broker.create_topic("raw", 1);
        let out = wait_at_most(host, std::time::Duration::from_secs(60));
        let err = stderr(&out);
        match out.status.code() {
            Some(1) if err.contains("was deleted and created again") => advice = Some(err),
            _ => {
                failures.push(format!(
                    "round {round}: {:?}: {}",
                    out.status,
                    err.lines().last().unwrap_or_default()
                ));
                // The next round starts over on the new topic.
                advice = None;
                let _ = std::fs::remove_dir_all(&ckpt);
                db.batch("DELETE FROM sluice_progress");
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    trickle.join().unwrap();
    // What reached the sink was counted once per write. (A record can be
    // applied twice across the generations: a recreation that lands
    // during a batch's fetch lets that fetch read the new topic at the old
    // offsets, which the reset then reads again from its start; README,
    // "A topic deleted and created again", states this limit.)
    if failures.is_empty() {
        let rows = db.scalar("SELECT count(*) FROM seen");
        assert_eq!(db.counted(), rows);
        let again = db.scalar(
            "SELECT count(*) FROM (SELECT value FROM seen GROUP BY value HAVING count(*) > 1)",
        );
        eprintln!(
            "{rounds} recreations under a busy host: {rows} applications, {again} values applied twice"
        );
    }
    failures
}

/// `run`'s arguments plus a failpoint: the host stops at `failpoint` and
/// is killed there (SIGKILL), leaving the batch it planned uncommitted.
fn run_until_killed_at(bootstrap: &str, topic: &str, ckpt: &Path, db: &Db, failpoint: &str) {
    use std::io::{BufRead, BufReader};
    let args = counter_args(
        bootstrap,
        &[topic],
        ckpt,
        db,
        &["--until-caught-up", "--progress", "none"],
    );
    let mut child = Command::new(host_bin())
        .args(&args)
        .env("RUST_LOG", "warn")
        .env("SLUICE_FAILPOINT", failpoint)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    for line in BufReader::new(err).lines() {
        if line.unwrap().contains("FAILPOINT") {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_topic_recreated_under_an_uncommitted_batch_is_reset_by_abandoning_the_batch() {
    // The host dies after planning batch 1 of the old topic; the topic is
    // recreated. The re-run is refused (recreated topic), and the advised
    // reset must not refuse in turn ("re-run first"): it abandons the
    // batch with a noted commit entry and moves on.
    let old = Mock::new();
    old.create_topic("raw", 1);
    produce(&old, "raw", 0, (0..4).map(|i| format!("old{i}")));
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    ok(run(&old.bootstrap(), "raw", &ckpt, &db));
    produce(&old, "raw", 0, (4..8).map(|i| format!("old{i}")));
    run_until_killed_at(
        &old.bootstrap(),
        "raw",
        &ckpt,
        &db,
        "engine:after-write-ahead",
    );
    let shown = crate::support::host(&["checkpoint", "show", ckpt.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("re-run batch"),
        "{}",
        String::from_utf8_lossy(&shown.stdout)
    );

    let new = Mock::new();
    new.create_topic("raw", 1);
    produce(&new, "raw", 0, (0..6).map(|i| format!("new{i}")));
    let out = run(&new.bootstrap(), "raw", &ckpt, &db);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("was deleted and created again"), "{err}");
    let reset = follow_advice(&err);
    let said = String::from_utf8_lossy(&reset.stdout);
    assert!(said.contains("the reset abandons it"), "{said}");
    ok(run(&new.bootstrap(), "raw", &ckpt, &db));
    let s = seen(&db);
    assert!(s.values().all(|n| *n == 1), "{s:?}");
    assert!((0..6).all(|i| s.contains_key(&format!("new{i}"))), "{s:?}");
    assert_eq!(db.counted(), s.len() as i64);
    let shown = crate::support::host(&["checkpoint", "show", "--json", ckpt.to_str().unwrap()]);
    assert!(shown.status.success());
}

#[test]
fn the_advice_moves_only_the_recreated_topic_and_offsets_json_cannot_skip_its_records() {
    // Two topics, read from another cluster that holds both under the
    // same names: both are "recreated". `--topic b` moves b alone, and an
    // `offsets:{}` that names none of b's partitions must start them at
    // their log start, not keep the old topic's positions; `a`, reset on
    // its own, keeps its position, so nothing of it is read twice.
    let old = Mock::new();
    old.create_topic("a", 1);
    old.create_topic("b", 1);
    produce(&old, "a", 0, (0..5).map(|i| format!("a{i}")));
    produce(&old, "b", 0, (0..5).map(|i| format!("old-b{i}")));
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    let two = |bootstrap: &str| {
        let args = counter_args(
            bootstrap,
            &["a", "b"],
            &ckpt,
            &db,
            &["--until-caught-up", "--progress", "none"],
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::support::host(&args)
    };
    ok(two(&old.bootstrap()));
    assert_eq!(db.counted(), 10);
    let new = Mock::new();
    new.create_topic("a", 1);
    new.create_topic("b", 1);
    produce(&new, "a", 0, (0..5).map(|i| format!("a{i}")));
    produce(&new, "b", 0, (0..7).map(|i| format!("new-b{i}")));
    let ck = ckpt.to_str().unwrap();
    // offsets:JSON for `b` naming no partition: b/0 must start at its log
    // start (0), not keep the old topic's position 5.
    let out = crate::support::host(&[
        "checkpoint",
        "reset",
        ck,
        "--topic",
        "b",
        "--to",
        "offsets:{}",
        "--brokers",
        &new.bootstrap(),
        "--sink-db",
        &db.url,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("topic b was deleted and created again"),
        "{said}"
    );
    // `a` on the new cluster is another topic too: reset it alone, keeping
    // its position (its 5 records are the same ones).
    let out = crate::support::host(&[
        "checkpoint",
        "reset",
        ck,
        "--topic",
        "a",
        "--to",
        "offsets:{\"a\":{\"0\":5}}",
        "--brokers",
        &new.bootstrap(),
        "--keep-sink-progress",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    ok(two(&new.bootstrap()));
    let s = seen(&db);
    assert!(s.values().all(|n| *n == 1), "{s:?}");
    assert!(
        (0..7).all(|i| s.contains_key(&format!("new-b{i}"))),
        "{s:?}"
    );
    assert_eq!(db.counted(), 10 + 7);
}

#[test]
fn a_reset_with_another_sink_database_is_refused_and_creates_nothing() {
    // A typo in --sink-db used to create an empty database, "move" no
    // rows, and let the next run skip the new topic's records.
    let db = Db::sqlite();
    let (_old, dir, ckpt) = applied_once(4, &db);
    let new = Mock::new();
    new.create_topic("raw", 1);
    produce(&new, "raw", 0, (0..6).map(|i| format!("new{i}")));
    let typo = dir.path().join("typo.db");
    let ck = ckpt.to_str().unwrap();
    let bootstrap = new.bootstrap();
    let reset = |db_url: &str, extra: &[&str]| {
        let mut args = vec![
            "checkpoint",
            "reset",
            ck,
            "--to",
            "earliest",
            "--brokers",
            &bootstrap,
            "--sink-db",
            db_url,
        ];
        args.extend_from_slice(extra);
        crate::support::host(&args)
    };
    let typo_url = format!("sqlite:{}", typo.display());
    for extra in [&[][..], &["--dry-run"][..]] {
        let out = reset(&typo_url, extra);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(
            err.contains("is not the database this pipeline keeps its progress in"),
            "{err}"
        );
        assert!(
            !typo.exists(),
            "{extra:?}: the reset created {}",
            typo.display()
        );
    }
    // The recorded path is absolute: the same database named relatively
    // from its own directory is accepted.
    let db_path = db.url.strip_prefix("sqlite:").unwrap();
    let (db_dir, db_file) = db_path.rsplit_once('/').unwrap();
    let out = Command::new(host_bin())
        .args([
            "checkpoint",
            "reset",
            ck,
            "--to",
            "earliest",
            "--brokers",
            &new.bootstrap(),
            "--sink-db",
            &format!("sqlite:{db_file}"),
        ])
        .current_dir(db_dir)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    ok(run(&new.bootstrap(), "raw", &ckpt, &db));
    assert_eq!(db.counted(), 4 + 6);
}

#[test]
fn a_reset_to_an_offset_past_the_high_watermark_is_refused() {
    let db = Db::sqlite();
    let (mock, _dir, ckpt) = applied_once(3, &db);
    let out = crate::support::host(&[
        "checkpoint",
        "reset",
        ckpt.to_str().unwrap(),
        "--to",
        "offsets:{\"raw\":{\"0\":999}}",
        "--brokers",
        &mock.bootstrap(),
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("past its high watermark 3"), "{err}");
    for bad in ["bogus", "timestamp:-5"] {
        let out =
            crate::support::host(&["checkpoint", "reset", ckpt.to_str().unwrap(), "--to", bad]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("use earliest, latest"), "{bad}: {err}");
    }
}

#[test]
fn recreating_a_topic_under_a_busy_host_stops_it_cleanly_every_time() {
    let broker = BrokerProcess::start();
    let failures = recreate_under_a_busy_host(&broker, 10);
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_topic_recreated_shorter_between_plan_and_fetch_is_reported_as_recreated() {
    // The busy-host test failed 3 times in 10 rounds on CI: the topic was
    // recreated after a batch was planned and before its fetch read
    // anything; the new log ended below the planned range and the broker
    // answered the fetch with no records (no "offset out of range"), so
    // the host reported an unavailable broker after its timeout. Here the
    // host pauses between planning batch 1 of a second run and its fetch,
    // and the topic comes back with 2 records where 8 were planned.
    use std::io::{BufRead, BufReader};
    let broker = BrokerProcess::start();
    broker.create_topic("raw", 1);
    produce(&broker, "raw", 0, (0..4).map(|i| format!("old{i}")));
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    ok(run(&broker.bootstrap(), "raw", &ckpt, &db));
    produce(&broker, "raw", 0, (4..8).map(|i| format!("old{i}")));
    let resume = dir.path().join("resume");
    let mut args = counter_args(
        &broker.bootstrap(),
        &["raw"],
        &ckpt,
        &db,
        &["--until-caught-up", "--progress", "none"],
    );
    args.extend(["--kafka-timeout".into(), "5s".into()]);
    let mut child = Command::new(host_bin())
        .args(&args)
        .env("RUST_LOG", "warn")
        .env("SLUICE_FAILPOINT", "engine:after-write-ahead")
        .env("SLUICE_FAILPOINT_RESUME_FILE", &resume)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 && !line.contains("FAILPOINT") {
        line.clear();
    }
    assert!(line.contains("FAILPOINT"), "the host never paused");
    broker.delete_topic("raw");
    broker.create_topic("raw", 1);
    produce(&broker, "raw", 0, (0..2).map(|i| format!("new{i}")));
    std::fs::write(&resume, b"").unwrap();
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        rest
    });
    let out = wait_at_most(child, std::time::Duration::from_secs(60));
    let rest = reader.join().unwrap();
    assert_eq!(out.status.code(), Some(1), "{rest}");
    assert!(rest.contains("was deleted and created again"), "{rest}");
    // Nothing of the planned range was applied: the old run's 4 only.
    assert_eq!(db.counted(), 4);
}
