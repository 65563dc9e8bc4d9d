//! A pipeline moving between its two stores: `host group adopt` (a
//! checkpoint directory becomes a pipeline group) and `host group
//! disband` (a group becomes a checkpoint directory's pipeline again),
//! with the non-idempotent `sql-counter` sink counting every record, a
//! batch left uncommitted by a SIGKILL before the move, and each command
//! SIGKILLed half-way and run again.

use std::time::Duration;

use crate::support::counter::{assert_exactly_once, produce, wait_for_count};
use crate::support::kafka::{Broker, Mock};
use crate::support::{Db, HostProcess, host, plugin, stderr};

/// The pipeline's flags, with the store's (`--checkpoint DIR` or
/// `--group NAME`) and `extra` after them.
fn run_args(b: &dyn Broker, db: &Db, store: &[&str], extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "run",
        "--brokers",
        &b.bootstrap(),
        "--topic",
        "events",
        "--sink-db",
        &db.url,
        "--max-records-per-partition",
        "20",
        "--trigger-interval",
        "100ms",
        "--config",
        "kafka.session.timeout.ms=6000",
        "--config",
        "kafka.heartbeat.interval.ms=500",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(store.iter().map(|s| s.to_string()));
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// `host group SUB --sink-db DB --group g --checkpoint DIR`, killed at
/// each of `failpoints` in turn (each run a new process), then run to the
/// end. Returns the finishing run's exit code and output.
fn group_move(sub: &str, db: &Db, dir: &str, failpoints: &[&str]) -> (Option<i32>, String) {
    let args: Vec<String> = [
        "group",
        sub,
        "--sink-db",
        &db.url,
        "--group",
        "g",
        "--checkpoint",
        dir,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for fp in failpoints {
        let mut p = HostProcess::spawn(&args, &[("SLUICE_FAILPOINT", fp)]);
        p.wait_for("FAILPOINT", Duration::from_secs(60));
        p.kill();
    }
    let out = host(&args.iter().map(String::as_str).collect::<Vec<_>>());
    (
        out.status.code(),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out)),
    )
}

/// A single host's pipeline, with a batch planned and not committed,
/// becomes a group of two members and then a single host again: every
/// record counted once across both moves, each move killed half-way and
/// finished by running it again, and each store refusing to run the
/// pipeline while the other holds it. Once the group went on to another
/// directory, adopting the first one again (stale positions) is refused.
#[test]
fn a_single_host_pipeline_becomes_a_group_and_back_exactly_once() {
    let db = Db::sqlite();
    let mock = Mock::new();
    mock.create_topic("events", 4);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    let dir_s = dir.display().to_string();
    let counter = plugin("sql_counter").display().to_string();
    let single = |extra: &[&str]| run_args(&mock, &db, &["--checkpoint", &dir_s], extra);

    // A single host applies 200 records, then is killed with its next
    // batch planned (written ahead) and not committed.
    produce(&mock, "events", 0, 200, 4);
    let out = host(
        &single(&["--plugin", &counter, "--until-caught-up"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_exactly_once(&db, 200);
    produce(&mock, "events", 200, 100, 4);
    let mut p = HostProcess::spawn(
        &single(&["--until-caught-up"]),
        &[("SLUICE_FAILPOINT", "engine:after-write-ahead")],
    );
    p.wait_for("FAILPOINT", Duration::from_secs(60));
    p.kill();
    assert_eq!(db.counted(), 200, "the killed batch applied nothing");

    // A group on the same sink is refused, and told to adopt.
    let members = |extra: &[&str]| run_args(&mock, &db, &["--group", "g"], extra);
    let out = host(
        &members(&["--plugin", &counter, "--until-caught-up"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("host group adopt"), "{err}");

    // Adopt, killed after it marked the directory and again after its
    // database transaction, then run to the end.
    let (code, said) = group_move(
        "adopt",
        &db,
        &dir_s,
        &["adopt:after-mark", "adopt:after-db"],
    );
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("now pipeline group g"), "{said}");
    let out = host(
        &single(&["--until-caught-up"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("moved to pipeline group g"), "{err}");
    assert_eq!(db.counted(), 200);

    // Two members without --plugin: the group's plugins. The range the
    // single host planned is run again by whoever claims it.
    let a = HostProcess::start(&members(&[]));
    let b = HostProcess::start(&members(&[]));
    wait_for_count(
        &db,
        300,
        "the group applies what the single host left",
        Duration::from_secs(90),
        &[&a, &b],
    );
    produce(&mock, "events", 300, 100, 4);
    wait_for_count(
        &db,
        400,
        "the group applies new records",
        Duration::from_secs(90),
        &[&a, &b],
    );
    let (mut a, mut b) = (a, b);
    assert_eq!(a.term(), Some(0), "{}", a.log());
    assert_eq!(b.term(), Some(0), "{}", b.log());
    assert_exactly_once(&db, 400);

    // Disband into the same directory, killed after writing it and again
    // after its database transaction, then run to the end; members are
    // refused from then on.
    let (code, said) = group_move(
        "disband",
        &db,
        &dir_s,
        &["disband:after-dir", "disband:after-db"],
    );
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("is now the pipeline of checkpoint"), "{said}");
    let out = host(
        &members(&["--until-caught-up"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("host group disband"), "{err}");

    // The single host again, without --plugin.
    produce(&mock, "events", 400, 100, 4);
    let out = host(
        &single(&["--until-caught-up"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_exactly_once(&db, 500);

    // Adopted again, then disbanded into another directory: the first
    // one's positions are stale now, and adopting it again is refused.
    let (code, said) = group_move("adopt", &db, &dir_s, &[]);
    assert_eq!(code, Some(0), "{said}");
    let other = tmp.path().join("other").display().to_string();
    let (code, said) = group_move("disband", &db, &other, &[]);
    assert_eq!(code, Some(0), "{said}");
    let (code, said) = group_move("adopt", &db, &dir_s, &[]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("stale"), "{said}");
    produce(&mock, "events", 500, 100, 4);
    let out = host(
        &run_args(
            &mock,
            &db,
            &["--checkpoint", &other],
            &["--until-caught-up"],
        )
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_exactly_once(&db, 600);
}
