//! `host run` end to end: the real binary, Apache Kafka, real built
//! plugins, a real SQLite sink.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use sluice_host::capability::sql::SqlValue;

use crate::support::kafka::{Broker, BrokerProcess, producer};
use crate::support::maxwell::Stream;
use crate::support::maxwell::{produce, table};
use crate::support::{Db, RunArgs, host_bin, plugin, stderr};

/// Arguments of a `host run` on `topic` with the company plugin (100
/// records per partition per batch unless `extra` says otherwise).
fn run_args(b: &dyn Broker, topic: &str, ckpt: &Path, db: &Db, extra: &[&str]) -> Vec<String> {
    let mut a = RunArgs::new(&b.bootstrap(), &[topic], ckpt)
        .sink_db(db)
        .args(["--trigger-interval", "100ms", "--kafka-timeout", "20s"]);
    if !extra.contains(&"--max-records-per-partition") {
        a = a.args(["--max-records-per-partition", "100"]);
    }
    a.plugin("company").args(extra).build()
}

fn host_run(args: &[String]) -> Output {
    Command::new(host_bin())
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("SLUICE_FAILPOINT")
        .output()
        .expect("host run")
}

fn progress(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "batch")
        .collect()
}

#[test]
fn settings_come_from_the_environment_and_a_flag_wins_over_it() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("maxwell", 2);
    let mut stream = Stream::new(5);
    produce(&kafka, "maxwell", &mut stream, 300, 2);
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite();
    // Everything but the plugin from SLUICE_*; --max-records-per-partition
    // given both ways: the flag's 1000 wins over the environment's 1.
    let out = Command::new(host_bin())
        .args(["run", "--plugin"])
        .arg(plugin("company"))
        .args(["--max-records-per-partition", "1000"])
        .env("RUST_LOG", "info")
        .env_remove("SLUICE_FAILPOINT")
        .env("SLUICE_BROKERS", kafka.bootstrap())
        .env("SLUICE_TOPICS", "maxwell,maxwell")
        .env("SLUICE_CHECKPOINT", dir.path().join("ckpt"))
        .env("SLUICE_SINK_DB", &db.url)
        .env("SLUICE_UNTIL_CAUGHT_UP", "true")
        .env("SLUICE_PROGRESS", "json")
        .env("SLUICE_TRIGGER_INTERVAL", "100ms")
        .env("SLUICE_MAX_RECORDS_PER_PARTITION", "1")
        .output()
        .expect("host run");
    assert!(out.status.success(), "{}", stderr(&out));
    let batches = progress(&out);
    assert_eq!(batches.len(), 1, "one batch of up to 1000 per partition");
    assert_eq!(batches[0]["counts"]["input"], 300);
    assert_eq!(table(&db), stream.state, "{}", stderr(&out));
    // A bad value in the environment is a usage error naming the variable's
    // flag.
    let bad = Command::new(host_bin())
        .args(["run", "--brokers", "b:1", "--topic", "t", "--checkpoint"])
        .arg(dir.path().join("other"))
        .env("SLUICE_ON_ERROR", "ignore")
        .output()
        .expect("host run");
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("--on-error"), "{}", stderr(&bad));
}

#[test]
fn the_original_complaint_restart_reruns_nothing_on_a_real_broker() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("maxwell", 3);
    let mut stream = Stream::new(21);
    produce(&kafka, "maxwell", &mut stream, 1000, 3);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();

    let out = host_run(&run_args(
        &kafka,
        "maxwell",
        &ckpt,
        &db,
        &["--until-caught-up"],
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    let first = progress(&out);
    assert!(first.len() >= 4, "several batches: {}", first.len());
    assert!(first.iter().all(|p| p["rerun"] == false));
    let input: u64 = first
        .iter()
        .map(|p| p["counts"]["input"].as_u64().unwrap())
        .sum();
    assert_eq!(input, 1000);
    assert_eq!(table(&db), stream.state);

    produce(&kafka, "maxwell", &mut stream, 250, 3);
    let out = host_run(&run_args(
        &kafka,
        "maxwell",
        &ckpt,
        &db,
        &["--until-caught-up"],
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    let second = progress(&out);
    assert!(
        second.iter().all(|p| p["rerun"] == false),
        "no batch is re-run"
    );
    let last_first = first.last().unwrap()["batch_id"].as_u64().unwrap();
    assert_eq!(
        second[0]["batch_id"].as_u64().unwrap(),
        last_first + 1,
        "batch ids continue"
    );
    let input: u64 = second
        .iter()
        .map(|p| p["counts"]["input"].as_u64().unwrap())
        .sum();
    assert_eq!(input, 250, "only new events are read");
    assert!(
        !stderr(&out).contains("re-running"),
        "the log shows no re-run"
    );
    assert_eq!(table(&db), stream.state);
    assert_eq!(
        db.scalar("SELECT SUM(end_offset) FROM sluice_progress"),
        1250,
        "each range applied once"
    );
}

#[test]
fn sigterm_finishes_the_batch_commits_and_exits_0() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("maxwell", 3);
    let mut stream = Stream::new(4);
    produce(&kafka, "maxwell", &mut stream, 300, 3);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    let mut child = Command::new(host_bin())
        .args(run_args(&kafka, "maxwell", &ckpt, &db, &[]))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("\"event\":\"batch\""), "{first}");
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let show = crate::support::host(&["checkpoint", "show", ckpt.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(
        v["next_action"], "resume",
        "the in-flight batch was committed"
    );
    assert!(v["owner"].is_null());
}

const CRASH_POINTS: &[(&str, &str)] = &[
    ("after write-ahead", "engine:after-write-ahead@2"),
    ("in the middle of a sink write", "sink:after-write@3"),
    ("after sink close, before commit", "engine:before-commit@2"),
    ("during the commit file write", "commit:after-write@2"),
];

#[test]
fn crash_matrix_kill_9_then_restart_gives_the_no_crash_table() {
    let kafka = BrokerProcess::start();
    let mut stream = Stream::new(33);
    kafka.create_topic("maxwell", 3);
    produce(&kafka, "maxwell", &mut stream, 600, 3);

    // The run without a crash.
    let dir = tempfile::tempdir().unwrap();
    let clean_db = Db::sqlite();
    let out = host_run(&run_args(
        &kafka,
        "maxwell",
        &dir.path().join("clean"),
        &clean_db,
        &["--until-caught-up"],
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = clean_db
        .query("SELECT pk, row_json, idempotency_key, source_offset FROM companies ORDER BY pk");
    assert_eq!(table(&clean_db), stream.state);

    for (what, fp) in CRASH_POINTS {
        let ckpt: PathBuf = dir.path().join(fp.replace([':', '@'], "-"));
        let db = Db::sqlite();
        let mut child = Command::new(host_bin())
            .args(run_args(
                &kafka,
                "maxwell",
                &ckpt,
                &db,
                &["--until-caught-up"],
            ))
            .env("SLUICE_FAILPOINT", fp)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = BufReader::new(child.stderr.take().unwrap());
        let mut reached = false;
        for line in err.lines().map_while(Result::ok) {
            if line.starts_with("FAILPOINT") {
                reached = true;
                break;
            }
        }
        assert!(reached, "{what}: failpoint {fp} not reached");
        child.kill().unwrap();
        child.wait().unwrap();

        let newest = std::fs::read_dir(ckpt.join("offsets"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .max()
            .unwrap();
        let planned: Value = serde_json::from_str(
            &std::fs::read_to_string(ckpt.join("offsets").join(newest.to_string())).unwrap(),
        )
        .unwrap();
        let committed = ckpt.join("commits").join(newest.to_string()).exists();

        let out = host_run(&run_args(
            &kafka,
            "maxwell",
            &ckpt,
            &db,
            &["--until-caught-up"],
        ));
        assert!(out.status.success(), "{what}: {}", stderr(&out));
        let batches = progress(&out);
        if !committed {
            let rerun = &batches[0];
            assert_eq!(rerun["rerun"], true, "{what}");
            assert_eq!(rerun["batch_id"].as_u64().unwrap(), newest, "{what}");
            let ranges: Vec<(i64, i64)> = rerun["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p["start"].as_i64().unwrap(), p["end"].as_i64().unwrap()))
                .collect();
            let planned: Vec<(i64, i64)> = planned["entry"]["ranges"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p["start"].as_i64().unwrap(), p["end"].as_i64().unwrap()))
                .collect();
            assert_eq!(
                ranges, planned,
                "{what}: the replayed batch has the planned ranges"
            );
        }
        let got = db.query(
            "SELECT pk, row_json, idempotency_key, source_offset FROM companies ORDER BY pk",
        );
        assert_eq!(
            got, expected,
            "{what}: table (rows, idempotency keys, offsets) equals the no-crash run"
        );
        assert_eq!(
            db.scalar("SELECT SUM(end_offset) FROM sluice_progress"),
            600,
            "{what}"
        );
    }
}

#[test]
fn poison_record_through_the_binary() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("maxwell", 1);
    let mut stream = Stream::new(8);
    produce(&kafka, "maxwell", &mut stream, 30, 1);
    let p = producer(&kafka.bootstrap());
    p.send("maxwell", 0, None, Some(b"{\"broken\":"), &[]);
    p.flush();
    produce(&kafka, "maxwell", &mut stream, 30, 1);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();

    let out = host_run(&run_args(
        &kafka,
        "maxwell",
        &ckpt,
        &db,
        &["--until-caught-up"],
    ));
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("bad record at maxwell/0 offset 30") && err.contains("sha256:"),
        "{err}"
    );

    let out = host_run(&run_args(
        &kafka,
        "maxwell",
        &ckpt,
        &db,
        &["--until-caught-up", "--on-error", "dlq"],
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(table(&db), stream.state);
    let out = host_run(&run_args(
        &kafka,
        "maxwell",
        &ckpt,
        &db,
        &["--until-caught-up", "--on-error", "dlq"],
    ));
    assert!(out.status.success());
    assert_eq!(db.scalar("SELECT COUNT(*) FROM sluice_dead_letters"), 1);
}

#[test]
fn second_run_on_an_owned_checkpoint_is_refused_with_exit_3() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("maxwell", 1);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    let mut owner = Command::new(host_bin())
        .args(run_args(&kafka, "maxwell", &ckpt, &db, &[]))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(owner.stderr.take().unwrap()).lines();
    assert!(err.any(|l| l.is_ok_and(|l| l.contains("checkpoint opened"))));
    let out = host_run(&run_args(&kafka, "maxwell", &ckpt, &db, &[]));
    assert_eq!(out.status.code(), Some(3));
    let msg = stderr(&out);
    assert!(
        msg.contains(&format!("is owned by pid {}", owner.id())),
        "{msg}"
    );
    assert!(msg.contains("use --wait to queue or --takeover"), "{msg}");
    owner.kill().unwrap();
    owner.wait().unwrap();
}

#[test]
fn broker_down_for_a_few_seconds_mid_run_on_kafka() {
    let mut kafka = BrokerProcess::start();
    kafka.create_topic("maxwell", 3);
    let mut stream = Stream::new(77);
    produce(&kafka, "maxwell", &mut stream, 1500, 3);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let db = Db::sqlite();
    let mut child = Command::new(host_bin())
        .args(run_args(
            &kafka,
            "maxwell",
            &ckpt,
            &db,
            &["--max-records-per-partition", "20"],
        ))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("host.log")).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().map(|l| l.unwrap()).unwrap_or_default();
    let log = || std::fs::read_to_string(dir.path().join("host.log")).unwrap_or_default();
    assert!(
        first.contains("\"event\":\"batch\""),
        "no first batch: {}",
        log()
    );
    kafka.kill();
    std::thread::sleep(std::time::Duration::from_secs(3));
    kafka.restart();
    let mut input = 0u64;
    for line in lines.by_ref() {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
        input += v["counts"]["input"].as_u64().unwrap();
        if db.scalar("SELECT COALESCE(SUM(end_offset), 0) FROM sluice_progress") == 1500 {
            break;
        }
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(input <= 1500);
    assert_eq!(table(&db), stream.state, "nothing lost or duplicated");
}

/// `host run` of one record of 200,000 bytes on `kafka` with fetch limits
/// of 1,024 bytes.
fn run_an_oversized_record(kafka: &BrokerProcess) -> std::process::Output {
    kafka.create_topic("big", 1);
    let p = producer(&kafka.bootstrap());
    p.send("big", 0, None, Some(&vec![b'x'; 200_000]), &[]);
    p.flush();
    let dir = tempfile::tempdir().unwrap();
    let passthrough = plugin("passthrough");
    crate::support::host(&[
        "run",
        "--brokers",
        &kafka.bootstrap(),
        "--topic",
        "big",
        "--checkpoint",
        dir.path().join("ckpt").to_str().unwrap(),
        "--plugin",
        passthrough.to_str().unwrap(),
        "--until-caught-up",
        "--progress",
        "json",
        "--kafka-timeout",
        "3s",
        "--config",
        "kafka.max.partition.fetch.bytes=1024",
        "--config",
        "kafka.fetch.max.bytes=1024",
        "--config",
        "kafka.message.max.bytes=1000",
    ])
}

/// Kafka sends the first record of a partition even when it is over the
/// consumer's fetch limits (KIP-74): it is read.
#[test]
fn a_record_larger_than_the_fetch_limits_is_read_where_the_broker_sends_it() {
    let out = run_an_oversized_record(&BrokerProcess::start());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let input: u64 = crate::support::json_lines(&out)
        .iter()
        .filter_map(|l| l["counts"]["input"].as_u64())
        .sum();
    assert_eq!(input, 1, "{}", String::from_utf8_lossy(&out.stdout));
}

/// `--sink-plugin-role`: the company plugin creates and keeps its table as
/// a role without privileges on the host's tables (the database, not only
/// the host's checks, keeps it off them); a role that has such a privilege
/// is refused at start, naming the fix, before anything is read.
#[test]
fn a_plugin_role_applies_the_stream_without_reaching_the_host_tables() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("maxwell", 2);
    let mut stream = Stream::new(11);
    produce(&kafka, "maxwell", &mut stream, 300, 2);
    let db = Db::postgres();
    let role = format!("sluice_e2e_plugin_{}", std::process::id());
    db.batch(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} NOLOGIN; GRANT {role} TO CURRENT_USER; \
         GRANT USAGE, CREATE ON SCHEMA public TO {role}"
    ));
    let dir = tempfile::tempdir().unwrap();
    let out = host_run(&run_args(
        &kafka,
        "maxwell",
        &dir.path().join("ck"),
        &db,
        &["--until-caught-up", "--sink-plugin-role", &role],
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("is a superuser"), "{}", stderr(&out));
    assert_eq!(table(&db), stream.state);
    assert_eq!(
        db.query("SELECT tableowner::text FROM pg_tables WHERE tablename = 'companies'"),
        vec![vec![SqlValue::Text(role.clone())]],
        "the plugin's table is made by the plugin role"
    );
    // The host wrote its progress as itself; the role may not read it.
    assert_eq!(
        db.scalar(&format!(
            "SELECT has_table_privilege('{role}', 'public.sluice_progress', 'SELECT')::int"
        )),
        0
    );

    // Without a role, a superuser login is named as the risk it is.
    let out = host_run(&run_args(
        &kafka,
        "maxwell",
        &dir.path().join("ck"),
        &db,
        &["--until-caught-up"],
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is a superuser and no --sink-plugin-role is set"),
        "{}",
        stderr(&out)
    );

    // A column privilege is a privilege too.
    db.batch(&format!(
        "GRANT UPDATE (end_offset) ON public.sluice_progress TO {role}"
    ));
    let out = host_run(&run_args(
        &kafka,
        "maxwell",
        &dir.path().join("ck2"),
        &db,
        &[
            "--until-caught-up",
            "--sink-plugin-role",
            &role,
            "--allow-shared-sink",
        ],
    ));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!(
            "REVOKE ALL ON \"public\".sluice_progress FROM \"{role}\""
        )),
        "{}",
        stderr(&out)
    );
    db.batch(&format!(
        "REVOKE ALL ON public.sluice_progress FROM {role}; DROP OWNED BY {role}; DROP ROLE {role}"
    ));
}

/// Found trying it as a new user: a second job with its own checkpoint on
/// the same sink database and topic applied every record again, and
/// `rm -rf ckpt` to "start over" did the same, with no word. Now the
/// second start is refused (exit 1), naming the first pipeline's
/// checkpoint and the SQL that forgets it; `--allow-shared-sink` runs it.
#[test]
fn a_second_pipeline_on_the_same_sink_and_topic_is_refused() {
    let kafka = BrokerProcess::start();
    kafka.create_topic("maxwell", 2);
    let mut stream = Stream::new(3);
    produce(&kafka, "maxwell", &mut stream, 200, 2);
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite();
    let first = dir.path().join("ck1");
    let out = host_run(&run_args(
        &kafka,
        "maxwell",
        &first,
        &db,
        &["--until-caught-up"],
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = host_run(&run_args(
        &kafka,
        "maxwell",
        &dir.path().join("ck2"),
        &db,
        &["--until-caught-up"],
    ));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("already holds the progress of another pipeline"),
        "{err}"
    );
    assert!(
        err.contains(&format!("checkpoint {}", first.display())),
        "{err}"
    );
    assert!(
        err.contains("DELETE FROM \"main\".sluice_progress WHERE query_id = '"),
        "{err}"
    );
    assert!(err.contains("--allow-shared-sink"), "{err}");
    // The refused start leaves no checkpoint behind (a directory that
    // looked like a pipeline, with a query id of its own).
    assert!(
        !dir.path().join("ck2").exists(),
        "the refused start left {}",
        dir.path().join("ck2").display()
    );
    let rows_before = db.scalar("SELECT count(*) FROM sluice_progress");
    // The first pipeline goes on as before.
    let out = host_run(&run_args(
        &kafka,
        "maxwell",
        &first,
        &db,
        &["--until-caught-up"],
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    // Asked for, both apply: the second one's rows appear beside the first's.
    let out = host_run(&run_args(
        &kafka,
        "maxwell",
        &dir.path().join("ck2"),
        &db,
        &["--until-caught-up", "--allow-shared-sink"],
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        db.scalar("SELECT count(*) FROM sluice_progress"),
        2 * rows_before
    );
    assert_eq!(table(&db), stream.state);
}
