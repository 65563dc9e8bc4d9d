//! One active owner per checkpoint, `--wait`, `--takeover` and `host swap`
//! on Apache Kafka with the real binary and built plugins.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::kafka::{Broker, BrokerProcess, producer};
use crate::support::{Db, HostProcess, RunArgs, guest_plugin, host, host_bin, plugin, stderr};

fn args(
    b: &dyn Broker,
    topic: &str,
    ckpt: &Path,
    db: &Db,
    plugins: &[PathBuf],
    extra: &[&str],
) -> Vec<String> {
    plugins
        .iter()
        .fold(
            RunArgs::new(&b.bootstrap(), &[topic], ckpt).sink_db(db),
            |a, p| a.plugin_file(p),
        )
        .args([
            "--max-records-per-partition",
            "200",
            "--trigger-interval",
            "100ms",
        ])
        .args(["--retention", "100000", "--progress", "none"])
        .args(extra)
        .build()
}

/// Produce `n` plain records `e<i>` over 3 partitions, about `per_sec` a
/// second, in a background thread.
fn produce_steadily(
    bootstrap: String,
    topic: &'static str,
    n: usize,
    per_sec: usize,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let p = producer(&bootstrap);
        let started = Instant::now();
        for i in 0..n {
            p.send(
                topic,
                (i % 3) as i32,
                Some(format!("k{i}").as_bytes()),
                Some(format!("e{i}").as_bytes()),
                &[],
            );
            let due = Duration::from_secs_f64(i as f64 / per_sec as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        p.flush();
    })
}

/// Wait until the sink's progress rows cover `n` records.
fn wait_applied(db: &Db, n: i64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let done = db
            .query("SELECT COALESCE(SUM(end_offset), 0) FROM sluice_progress")
            .first()
            .and_then(|r| r.first().cloned());
        if done == Some(sluice_host::capability::sql::SqlValue::Integer(n)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {done:?} of {n} applied in time"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Wait until the sink applied at least one record.
fn wait_some_applied(db: &Db, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while db.scalar("SELECT COALESCE(SUM(end_offset), 0) FROM sluice_progress") == 0 {
        assert!(Instant::now() < deadline, "nothing applied in time");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn assert_each_once(db: &Db, n: i64) {
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM seen"),
        n,
        "nothing duplicated"
    );
    assert_eq!(
        db.scalar("SELECT COUNT(DISTINCT idempotency_key) FROM seen"),
        n,
        "nothing lost"
    );
    assert_eq!(
        db.scalar("SELECT n FROM counters WHERE name = 'records'"),
        n
    );
}

fn epoch_of(ckpt: &Path) -> u64 {
    let out = host(&["checkpoint", "show", ckpt.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["epoch"].as_u64().unwrap()
}

#[test]
fn a_second_owner_is_refused_and_reads_nothing_and_wait_queues() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("events", 3);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    let plugins = [plugin("passthrough"), plugin("sql_counter")];
    let feed = produce_steadily(kafka.bootstrap(), "events", 300, 1000);
    feed.join().unwrap();
    let mut first = HostProcess::start(&args(&kafka, "events", &ckpt, &db, &plugins, &[]));
    first.wait_for("batch committed", Duration::from_secs(60));
    let epoch = epoch_of(&ckpt);

    let out = Command::new(host_bin())
        .args(args(&kafka, "events", &ckpt, &db, &plugins, &[]))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("use --wait to queue or --takeover"));
    assert_eq!(epoch_of(&ckpt), epoch, "the refused run issued no epoch");

    // A frozen owner (SIGSTOP) still holds the lock: `host status` says so
    // instead of "not running", and a `--wait` that runs out says it
    // waited.
    first.signal("STOP");
    let status = host(&["status", "--checkpoint", ckpt.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(
        said.contains("holds the lock but does not answer on control.sock"),
        "{said}"
    );
    let status = host(&["status", "--checkpoint", ckpt.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["running"], true, "{v}");
    assert_eq!(v["owner"], "not answering", "{v}");
    let out = Command::new(host_bin())
        .args(args(
            &kafka,
            "events",
            &ckpt,
            &db,
            &plugins,
            &["--wait", "1s"],
        ))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("still owned after waiting 1s (--wait)"),
        "{}",
        stderr(&out)
    );
    first.signal("CONT");

    // The first is unaffected.
    let more = produce_steadily(kafka.bootstrap(), "events", 60, 1000);
    more.join().unwrap();
    wait_applied(&db, 360, Duration::from_secs(60));

    // --wait queues, and starts as soon as the owner stops.
    let mut waiting = HostProcess::start(&args(
        &kafka,
        "events",
        &ckpt,
        &db,
        &plugins,
        &["--wait", "60s"],
    ));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !waiting.log().contains("checkpoint opened"),
        "must wait for the owner"
    );
    assert_eq!(first.term(), Some(0));
    let stopped = Instant::now();
    waiting.wait_for("checkpoint opened", Duration::from_secs(10));
    assert!(
        stopped.elapsed() < Duration::from_secs(3),
        "took {:?}",
        stopped.elapsed()
    );
    drop(waiting);
    assert_each_once(&db, 360);
}

#[test]
fn takeover_under_continuous_load_applies_every_event_once() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("events", 3);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    let plugins = [plugin("passthrough"), plugin("sql_counter")];
    let feed = produce_steadily(kafka.bootstrap(), "events", 20_000, 2500);
    let mut old = HostProcess::start(&args(&kafka, "events", &ckpt, &db, &plugins, &[]));
    old.wait_for("batch committed", Duration::from_secs(60));
    // A takeover the checkpoint would refuse (other topics) fails before
    // asking for the handover: the owner keeps running.
    let out = Command::new(host_bin())
        .args(args(
            &kafka,
            "other-topic",
            &ckpt,
            &db,
            &plugins,
            &["--takeover", "60s"],
        ))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("fingerprint"), "{}", stderr(&out));
    assert!(old.running(), "the owner keeps running:\n{}", old.log());
    // So does one whose sink database cannot be opened.
    let unreachable = Db::at(format!(
        "sqlite:{}",
        dir.path().join("no-such-dir/sink.db").display()
    ));
    let out = Command::new(host_bin())
        .args(args(
            &kafka,
            "events",
            &ckpt,
            &unreachable,
            &plugins,
            &["--takeover", "60s"],
        ))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("sink database"), "{}", stderr(&out));
    assert!(old.running(), "the owner keeps running:\n{}", old.log());
    std::thread::sleep(Duration::from_secs(2));
    let mut new = HostProcess::start(&args(
        &kafka,
        "events",
        &ckpt,
        &db,
        &plugins,
        &["--takeover", "60s"],
    ));
    let took = new.wait_for("took over: gap", Duration::from_secs(90));
    assert_eq!(old.wait(), Some(0), "the old owner exits 0:\n{}", old.log());
    assert!(
        old.log().contains("handover complete: gap"),
        "{}",
        old.log()
    );
    assert!(took.contains(" ms"), "{took}");
    feed.join().unwrap();
    wait_applied(&db, 20_000, Duration::from_secs(120));
    assert_eq!(new.term(), Some(0));
    assert_each_once(&db, 20_000);
    assert!(ckpt.join("handover").exists(), "handover note written");
}

#[test]
fn kill_9_of_the_new_owner_right_after_takeover_then_restart_is_exact() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("events", 3);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    let plugins = [plugin("passthrough"), plugin("sql_counter")];
    produce_steadily(kafka.bootstrap(), "events", 3000, 100_000)
        .join()
        .unwrap();
    let mut old = HostProcess::start(&args(&kafka, "events", &ckpt, &db, &plugins, &[]));
    old.wait_for("batch committed", Duration::from_secs(60));
    let mut new = HostProcess::start(&args(
        &kafka,
        "events",
        &ckpt,
        &db,
        &plugins,
        &["--takeover"],
    ));
    new.wait_for("took over", Duration::from_secs(60));
    new.kill();
    assert_eq!(old.wait(), Some(0));
    let out = Command::new(host_bin())
        .args(args(
            &kafka,
            "events",
            &ckpt,
            &db,
            &[],
            &["--until-caught-up"],
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_each_once(&db, 3000);
}

/// Tag of each applied record by batch: (batch id of its offset, tag).
fn tags_by_batch(db: &Db, ckpt: &Path) -> Vec<(u64, String)> {
    // Which batch planned each offset.
    let mut plan: Vec<(String, i64, i64, i64, u64)> = Vec::new();
    for e in std::fs::read_dir(ckpt.join("offsets")).unwrap().flatten() {
        let Ok(id) = e.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        let v: Value = serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap();
        for r in v["entry"]["ranges"].as_array().unwrap() {
            plan.push((
                r["topic"].as_str().unwrap().to_string(),
                r["partition"].as_i64().unwrap(),
                r["start"].as_i64().unwrap(),
                r["end"].as_i64().unwrap(),
                id,
            ));
        }
    }
    db.query("SELECT idempotency_key, value FROM seen")
        .into_iter()
        .map(|row| {
            let (
                sluice_host::capability::sql::SqlValue::Text(key),
                sluice_host::capability::sql::SqlValue::Text(value),
            ) = (&row[0], &row[1])
            else {
                panic!("{row:?}")
            };
            let mut parts = key.split('/');
            let (t, p, o) = (
                parts.next().unwrap(),
                parts.next().unwrap().parse::<i64>().unwrap(),
                parts.next().unwrap().parse::<i64>().unwrap(),
            );
            let batch = plan
                .iter()
                .find(|(pt, pp, s, e, _)| pt == t && *pp == p && o >= *s && o < *e)
                .map(|x| x.4)
                .unwrap_or_else(|| panic!("offset {key} in no batch"));
            (batch, value.split(':').next().unwrap().to_string())
        })
        .collect()
}

#[test]
fn swap_under_load_switches_exactly_at_the_reported_batch_and_bad_swaps_are_rejected() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("events", 3);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    let feed = produce_steadily(kafka.bootstrap(), "events", 6000, 300);
    // On three map threads (one per partition): the swap must replace the
    // map instance of every thread at the same boundary.
    let mut run = HostProcess::start(&args(
        &kafka,
        "events",
        &ckpt,
        &db,
        &[plugin("tag_v1"), plugin("sql_counter")],
        &["--map-threads", "3"],
    ));
    run.wait_for("batch committed", Duration::from_secs(60));
    // Some records must have gone through v1 before the swap.
    wait_some_applied(&db, Duration::from_secs(60));

    let boundary = swap_map(&ckpt, &plugin("tag_v2"));

    // Bad swaps: rejected, the running plugin (v2) keeps running.
    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, "not wasm").unwrap();
    for (bad, why) in [
        (text.clone(), "not a WebAssembly file"),
        (plugin("wrong-world"), "exports no Sluice stage"),
        (plugin("future_version"), "sluice:plugin@9.0.0"),
        (plugin("fat_start"), "needs 3"),
        (plugin("sql_counter"), "exports no map stage"),
    ] {
        let out = host(&[
            "swap",
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--plugin",
            bad.to_str().unwrap(),
            "--stage",
            "map",
        ]);
        assert_eq!(out.status.code(), Some(1), "{}", bad.display());
        let e = stderr(&out);
        assert!(
            e.contains("swap rejected") && e.contains(why),
            "{}: {e}",
            bad.display()
        );
    }

    let status = host(&["status", "--checkpoint", ckpt.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["running"], true);
    assert_eq!(v["live"]["swaps"], 1);

    feed.join().unwrap();
    wait_applied(&db, 6000, Duration::from_secs(120));
    assert_eq!(run.term(), Some(0));
    assert_each_once(&db, 6000);
    let tags = tags_by_batch(&db, &ckpt);
    assert!(tags.iter().any(|(_, t)| t == "v1") && tags.iter().any(|(_, t)| t == "v2"));
    for (batch, tag) in &tags {
        let want = if *batch < boundary { "v1" } else { "v2" };
        assert_eq!(tag, want, "batch {batch}, boundary {boundary}");
    }
    // A restart without --plugin resumes with the swapped-in plugin.
    let more = produce_steadily(kafka.bootstrap(), "events", 30, 100_000);
    more.join().unwrap();
    let out = Command::new(host_bin())
        .args(args(
            &kafka,
            "events",
            &ckpt,
            &db,
            &[],
            &["--until-caught-up"],
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM seen WHERE value LIKE 'v2:%'"),
        tags.iter().filter(|t| t.1 == "v2").count() as i64 + 30
    );
}

/// Swap the map stage of the owner of `ckpt` to `plugin`: the batch id
/// from which it applies.
fn swap_map(ckpt: &Path, plugin: &Path) -> u64 {
    let out = host(&[
        "swap",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--plugin",
        plugin.to_str().unwrap(),
        "--stage",
        "map",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    said.trim()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("{said}"))
}

#[test]
fn swaps_from_rust_to_python_to_javascript_to_rust_keep_a_non_idempotent_counter_exact() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("events", 3);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    let mut run = HostProcess::start(&args(
        &kafka,
        "events",
        &ckpt,
        &db,
        &[plugin("tag_v1"), plugin("sql_counter")],
        &[],
    ));
    // Each plugin maps a burst of 300 records before the next swap.
    produce_steadily(kafka.bootstrap(), "events", 300, 100_000)
        .join()
        .unwrap();
    run.wait_for("batch committed", Duration::from_secs(60));
    wait_applied(&db, 300, Duration::from_secs(120));
    let mut boundaries = Vec::new();
    let next = [
        guest_plugin("python", "tag"),
        guest_plugin("js", "tag"),
        plugin("tag_v2"),
    ];
    for (i, p) in next.iter().enumerate() {
        boundaries.push(swap_map(&ckpt, p));
        produce_steadily(kafka.bootstrap(), "events", 300, 100_000)
            .join()
            .unwrap();
        wait_applied(&db, 300 * (i as i64 + 2), Duration::from_secs(120));
    }
    assert_eq!(run.term(), Some(0));
    assert_each_once(&db, 1200);
    let tags = tags_by_batch(&db, &ckpt);
    for want in ["v1", "py", "js", "v2"] {
        assert!(
            tags.iter().any(|(_, t)| t == want),
            "no {want} output: {boundaries:?}"
        );
    }
    for (batch, tag) in &tags {
        let era = boundaries.iter().filter(|b| batch >= b).count();
        assert_eq!(
            tag,
            ["v1", "py", "js", "v2"][era],
            "batch {batch}, boundaries {boundaries:?}"
        );
    }
}

#[test]
fn checkpoint_reset_is_refused_while_owned_dry_run_writes_nothing_and_offsets_take_effect() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("events", 3);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    let plugins = [plugin("passthrough"), plugin("sql_counter")];
    produce_steadily(kafka.bootstrap(), "events", 90, 100_000)
        .join()
        .unwrap();
    let ck = ckpt.to_str().unwrap();

    let mut owner = HostProcess::start(&args(&kafka, "events", &ckpt, &db, &plugins, &[]));
    owner.wait_for("batch committed", Duration::from_secs(60));
    let out = host(&[
        "checkpoint",
        "reset",
        ck,
        "--to",
        "offsets:{\"events\":{\"0\":5}}",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("is owned by pid"), "{}", stderr(&out));
    assert_eq!(owner.term(), Some(0));
    wait_applied(&db, 90, Duration::from_secs(5));

    // Partitions the checkpoint does not know are refused, not kept.
    for bad in ["{\"events\":{\"7\":3}}", "{\"events\":{\"-1\":3}}"] {
        let out = host(&["checkpoint", "reset", ck, "--to", &format!("offsets:{bad}")]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("is not in this checkpoint (its partitions: 0, 1, 2)"),
            "{}",
            stderr(&out)
        );
    }

    let listing = |d: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(ckpt.join(d))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = (listing("offsets"), listing("commits"));
    let out = host(&[
        "checkpoint",
        "reset",
        ck,
        "--to",
        "earliest",
        "--brokers",
        &kafka.bootstrap(),
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("dry run: nothing written"), "{text}");
    assert!(
        text.contains("events                           0             30              0"),
        "{text}"
    );
    assert_eq!(
        (listing("offsets"), listing("commits")),
        before,
        "dry run changed nothing"
    );

    let out = host(&[
        "checkpoint",
        "reset",
        ck,
        "--to",
        "timestamp:0",
        "--brokers",
        &kafka.bootstrap(),
        "--dry-run",
    ]);
    assert!(
        out.status.success() || stderr(&out).contains("cannot answer timestamp lookups"),
        "{}",
        stderr(&out)
    );

    let out = host(&[
        "checkpoint",
        "reset",
        ck,
        "--to",
        "offsets:{\"events\":{\"0\":5}}",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let show: Value =
        serde_json::from_slice(&host(&["checkpoint", "show", ck, "--json"]).stdout).unwrap();
    assert!(
        show["last_committed"]["note"]
            .as_str()
            .unwrap()
            .contains("reset to offsets:"),
        "{show}"
    );

    // A fresh sink: the run processes exactly from the reset positions.
    let fresh = Db::sqlite();
    let out = Command::new(host_bin())
        .args(args(
            &kafka,
            "events",
            &ckpt,
            &fresh,
            &[],
            &["--until-caught-up"],
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fresh.scalar("SELECT COUNT(*) FROM seen"), 25);
    assert_eq!(
        fresh.scalar("SELECT COUNT(*) FROM seen WHERE idempotency_key = 'events/0/5'"),
        1
    );
    assert_eq!(
        fresh.scalar("SELECT COUNT(*) FROM seen WHERE idempotency_key = 'events/0/4'"),
        0
    );
}
