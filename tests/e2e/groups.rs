//! Pipeline groups end to end: several `host run --group NAME` processes on
//! one topic, a real broker's group coordinator splitting the partitions,
//! the checkpoint and fencing in the sink database, and the deliberately
//! non-idempotent `sql-counter` sink: every record counted exactly once.

use std::time::{Duration, Instant};

use crate::support::counter::{assert_exactly_once, counted, produce, wait_for_count};
use crate::support::kafka::{Broker, BrokerProcess, Mock};
use crate::support::{Db, HostProcess, plugin};

/// `host run --group NAME` with the counting sink, small batches.
pub(crate) fn member_args(b: &dyn Broker, db: &Db, group: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "run",
        "--brokers",
        &b.bootstrap(),
        "--topic",
        "events",
        "--group",
        group,
        "--sink-db",
        &db.url,
        "--max-records-per-partition",
        "50",
        "--trigger-interval",
        "100ms",
        "--config",
        "kafka.session.timeout.ms=6000",
        "--config",
        "kafka.heartbeat.interval.ms=500",
        "--plugin",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push(plugin("sql_counter").display().to_string());
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Every record `records` (values `v{i}`) was applied by the plugin
/// version `tag` (the tag-v1 and tag-v2 fixtures prefix `v1:` and `v2:`).
fn assert_applied_by(db: &Db, records: std::ops::Range<usize>, tag: &str, when: &str) {
    let values = db.sorted_texts("SELECT value FROM seen");
    for i in records {
        assert!(
            values.contains(&format!("{tag}:v{i}")),
            "record {i} ({when}) is not {tag}: {values:?}"
        );
    }
}

/// `host group SUB --sink-db DB --group GROUP ARGS…`: its exit code and
/// its stdout and stderr.
fn group_cmd(sub: &str, db: &Db, group: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut v = vec!["group", sub, "--sink-db", &db.url, "--group", group];
    v.extend(args);
    let out = std::process::Command::new(crate::support::host_bin())
        .args(&v)
        .output()
        .unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The offsets consumer group `group` has committed for `events`' 6
/// partitions (-1: none).
fn kafka_committed(b: &dyn Broker, group: &str) -> Vec<i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", b.bootstrap())
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..6 {
        tpl.add_partition("events", p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    (0..6)
        .map(
            |p| match got.find_partition("events", p).map(|e| e.offset()) {
                Some(rdkafka::Offset::Offset(o)) => o,
                _ => -1,
            },
        )
        .collect()
}

/// Two members that start together on 6 partitions with
/// `--until-caught-up`: each record is applied by exactly one of them,
/// and both exit 0.
#[test]
fn two_members_apply_each_record_once() {
    for db in Db::both() {
        let mock = Mock::new();
        mock.create_topic("events", 6);
        produce(&mock, "events", 0, 600, 6);
        let a = HostProcess::start(&member_args(&mock, &db, "g1", &["--until-caught-up"]));
        let b = HostProcess::start(&member_args(&mock, &db, "g1", &["--until-caught-up"]));
        let (ca, la) = a.finish();
        let (cb, lb) = b.finish();
        assert_eq!(ca, Some(0), "{}: a\n{la}", db.name);
        assert_eq!(cb, Some(0), "{}: b\n{lb}", db.name);
        assert_exactly_once(&db, 600);
        // The group's status names every partition, applied to its end,
        // nothing in flight.
        let out = std::process::Command::new(crate::support::host_bin())
            .args([
                "group",
                "status",
                "--sink-db",
                &db.url,
                "--group",
                "g1",
                "--json",
                "--brokers",
                &mock.bootstrap(),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["topics"], serde_json::json!(["events"]), "{v}");
        let parts = v["partitions"].as_array().unwrap();
        assert_eq!(parts.len(), 6, "{v}");
        assert!(
            parts.iter().all(|p| p["applied_end"] == 100
                && p["planned"].is_null()
                && p["owner_epoch"].as_u64() >= Some(1)
                && p["last_write_ms"].as_i64() > Some(0)
                && p["high_watermark"] == 100
                && p["lag"] == 0
                && p["member_id"].as_str().is_some_and(|m| !m.is_empty())),
            "{v}"
        );
        // Both left the group: no member rows, nothing unclaimed.
        assert_eq!(v["members"], serde_json::json!([]), "{v}");
        assert_eq!(v["unclaimed"], serde_json::json!([]), "{v}");
        // The ends applied are in the Kafka group too (for dashboards).
        assert_eq!(
            kafka_committed(&mock, "g1"),
            vec![100; 6],
            "{}\n--- a\n{la}\n--- b\n{lb}",
            db.name
        );
        let none = std::process::Command::new(crate::support::host_bin())
            .args(["group", "status", "--sink-db", &db.url, "--group", "nope"])
            .output()
            .unwrap();
        assert_eq!(none.status.code(), Some(2));
        // A member without the group's sink stage would record records as
        // applied without writing them: refused before it joins.
        let mut sinkless = member_args(&mock, &db, "g1", &["--until-caught-up"]);
        let at = sinkless
            .iter()
            .position(|a| a.ends_with("sql_counter.wasm"))
            .unwrap();
        sinkless[at] = plugin("passthrough").display().to_string();
        let (code, log) = HostProcess::start(&sinkless).finish();
        assert_eq!(code, Some(2), "{log}");
        assert!(
            log.contains("runs a sink stage and this member's plugins have none"),
            "{log}"
        );
        assert_exactly_once(&db, 600);
    }
}

/// The hand-over scenario: a member started with `a_args` applies 300
/// records; one with `b_args` joins (and logs `b_says`, if given); 300 more
/// arrive and both apply them; the first is stopped with SIGTERM and 300
/// more arrive, which the second applies. Each record counted once.
fn hand_over(mock: &Mock, db: &Db, a_args: &[String], b_args: &[String], b_says: Option<&str>) {
    mock.create_topic("events", 6);
    produce(mock, "events", 0, 300, 6);
    let mut a = HostProcess::start(a_args);
    let within = Duration::from_secs(60);
    wait_for_count(db, 300, "a applies the first records", within, &[&a]);
    let mut b = HostProcess::start(b_args);
    if let Some(says) = b_says {
        b.wait_for(says, within);
    }
    b.wait_for("claimed", within);
    produce(mock, "events", 300, 300, 6);
    wait_for_count(db, 600, "both apply the second records", within, &[&a, &b]);
    assert_eq!(a.term(), Some(0), "{}", a.log());
    produce(mock, "events", 600, 300, 6);
    wait_for_count(
        db,
        900,
        "b takes over a's partitions",
        Duration::from_secs(90),
        &[&a, &b],
    );
    // Give any duplicate a moment to show.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(b.term(), Some(0), "{}", b.log());
    assert_exactly_once(db, 900);
}

/// A member joins a running one, then the first is stopped with SIGTERM
/// while records keep arriving: its partitions move to the other member,
/// and nothing is lost or counted twice.
#[test]
fn a_member_that_stops_hands_its_partitions_to_the_other() {
    let db = Db::sqlite();
    let mock = Mock::new();
    // b brings no plugin: it runs the group's current one, from the
    // group's store in the database.
    let mut b_args = member_args(&mock, &db, "g2", &[]);
    let at = b_args.iter().position(|a| a == "--plugin").unwrap();
    b_args.drain(at..at + 2);
    hand_over(
        &mock,
        &db,
        &member_args(&mock, &db, "g2", &[]),
        &b_args,
        Some("running the group's current plugins"),
    );
}

/// Three members on one group; one is killed with SIGKILL in the middle
/// of a part (its transaction open), another is frozen with SIGSTOP past
/// the session timeout and thawed later (a zombie), a fourth joins, and
/// two are stopped with SIGTERM: the coordinator moves the partitions
/// each time, the new owners' claims fence the old ones, and every
/// record is counted once. b and c apply their parts on 3 sink
/// connections each and d on 2 (`--sink-connections`): a zombie's parts
/// in flight on several connections are fenced alike.
#[test]
fn a_killed_member_and_a_zombie_lose_and_double_nothing() {
    let db = Db::postgres();
    let mock = Mock::new();
    mock.create_topic("events", 6);
    produce(&mock, "events", 0, 300, 6);
    let mut a = HostProcess::spawn(
        &member_args(&mock, &db, "g3", &[]),
        &[("SLUICE_FAILPOINT", "sink:after-write")],
    );
    let three = ["--sink-connections", "3"];
    let mut b = HostProcess::start(&member_args(&mock, &db, "g3", &three));
    let mut c = HostProcess::start(&member_args(&mock, &db, "g3", &three));
    let logs = |ms: &[&HostProcess]| {
        ms.iter()
            .enumerate()
            .map(|(i, m)| format!("--- member {i}\n{}", m.log()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let within = Duration::from_secs(90);
    // a stops inside its first part, after the sink wrote, before the
    // commit; it is killed there.
    a.wait_for("FAILPOINT sink:after-write", within);
    a.kill();
    wait_for_count(
        &db,
        300,
        "the others apply the first records, a's after its session ended",
        within,
        &[&a, &b, &c],
    );
    produce(&mock, "events", 300, 300, 6);
    wait_for_count(&db, 600, "two members go on", within, &[&a, &b, &c]);
    // b freezes past its session timeout (6 s); c takes everything.
    b.signal("STOP");
    std::thread::sleep(Duration::from_secs(9));
    produce(&mock, "events", 600, 300, 6);
    wait_for_count(
        &db,
        900,
        "c applies while b is frozen",
        within,
        &[&a, &b, &c],
    );
    b.signal("CONT");
    produce(&mock, "events", 900, 300, 6);
    wait_for_count(
        &db,
        1200,
        "b rejoins and the group goes on",
        within,
        &[&a, &b, &c],
    );
    // A fourth member joins; then b and c are stopped with SIGTERM, and d
    // takes everything.
    let mut d = HostProcess::start(&member_args(&mock, &db, "g3", &["--sink-connections", "2"]));
    d.wait_for("joined the pipeline group", within);
    produce(&mock, "events", 1200, 300, 6);
    wait_for_count(&db, 1500, "three members apply", within, &[&a, &b, &c, &d]);
    assert_eq!(c.term(), Some(0), "{}", logs(&[&a, &b, &c, &d]));
    assert_eq!(b.term(), Some(0), "{}", logs(&[&a, &b, &c, &d]));
    produce(&mock, "events", 1500, 300, 6);
    wait_for_count(
        &db,
        1800,
        "the fourth member takes over from the two stopped",
        within,
        &[&a, &b, &c, &d],
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(d.term(), Some(0), "{}", logs(&[&a, &b, &c, &d]));
    for (m, n) in [(&b, 3), (&c, 3), (&d, 2)] {
        assert!(
            m.log()
                .contains(&format!("on {n} sink connections at once")),
            "{}",
            m.log()
        );
    }
    assert_exactly_once(&db, 1800);
}

/// A member frozen in the middle of a part, its transaction open and the
/// shared counter row locked: the other member waits on that lock (and
/// on the frozen member's partition rows) and retries instead of failing,
/// takes the partitions over once PostgreSQL ends the idle session, and
/// the frozen member, thawed, is fenced: every record counted once.
#[test]
fn a_member_frozen_mid_part_holds_the_group_up_only_until_its_session_ends() {
    let db = Db::postgres();
    let mock = Mock::new();
    mock.create_topic("events", 6);
    produce(&mock, "events", 0, 300, 6);
    let dir = tempfile::tempdir().unwrap();
    let resume = dir.path().join("resume");
    let resume_s = resume.display().to_string();
    let mut b = HostProcess::spawn(
        &member_args(&mock, &db, "g7", &[]),
        &[
            ("SLUICE_FAILPOINT", "sink:before-db-commit@2"),
            ("SLUICE_FAILPOINT_RESUME_FILE", &resume_s),
        ],
    );
    b.wait_for("FAILPOINT sink:before-db-commit", Duration::from_secs(60));
    b.signal("STOP");
    std::fs::write(&resume, b"").unwrap();
    let a = HostProcess::start(&member_args(&mock, &db, "g7", &[]));
    produce(&mock, "events", 300, 300, 6);
    wait_for_count(
        &db,
        600,
        "a applies everything once the frozen member's session is ended",
        Duration::from_secs(180),
        &[&a, &b],
    );
    b.signal("CONT");
    std::thread::sleep(Duration::from_secs(3));
    let mut a = a;
    let code_a = a.term();
    let log_a = a.log();
    assert_eq!(code_a, Some(0), "a\n{log_a}\n--- b\n{}", b.log());
    for p in 0..6 {
        assert!(
            log_a.contains(&format!("partition={p} epoch=2")),
            "a did not claim partition {p} from the frozen member:\n{log_a}"
        );
    }
    let code_b = b.term();
    let log_b = b.log();
    assert_eq!(code_b, Some(0), "b, fenced, goes on:\n{log_b}");
    assert!(log_b.contains("fenced"), "b was not fenced:\n{log_b}");
    assert_exactly_once(&db, 600);
}

/// Revoke = drain, then release. A member alone on 6 partitions is in the
/// middle of a part (paused before its commit) when a second member
/// joins and the coordinator revokes half of its partitions. The member
/// answers the revoke during its batch, without waiting for the batch to
/// end: if the part in flight is of a revoked partition, the revoke is
/// acknowledged only once that part has ended (the newcomer claims
/// nothing before), else at once (the newcomer claims its partitions
/// while the part is still paused). Either way the batch goes on with the
/// partitions kept and commits them, and every record is counted once.
#[test]
fn a_revoke_mid_batch_drains_the_part_in_flight_and_commits_the_rest() {
    let db = Db::postgres();
    let mock = Mock::new();
    mock.create_topic("events", 6);
    produce(&mock, "events", 0, 600, 6);
    let dir = tempfile::tempdir().unwrap();
    let resume = dir.path().join("resume");
    let resume_s = resume.display().to_string();
    let mut a = HostProcess::spawn(
        &member_args(&mock, &db, "g-drain", &[]),
        &[
            ("SLUICE_FAILPOINT", "sink:before-db-commit"),
            ("SLUICE_FAILPOINT_RESUME_FILE", &resume_s),
        ],
    );
    let within = Duration::from_secs(60);
    a.wait_for("FAILPOINT sink:before-db-commit", within);
    let mut b = HostProcess::start(&member_args(&mock, &db, "g-drain", &[]));
    let logs = |a: &HostProcess, b: &HostProcess| format!("--- a\n{}\n--- b\n{}", a.log(), b.log());
    let waiting = "revoked while a part of it is being applied";
    let started = Instant::now();
    let drained = loop {
        if a.logged(waiting, Duration::ZERO).is_some() {
            break true;
        }
        if b.logged("claimed", Duration::ZERO).is_some() {
            break false;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "no rebalance reached the paused member\n{}",
            logs(&a, &b)
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!(
        "the part in flight is of a {} partition",
        if drained { "revoked" } else { "kept" }
    );
    if drained {
        // The revoke waits for the part: the newcomer gets nothing yet.
        std::thread::sleep(Duration::from_secs(3));
        assert!(
            b.logged("claimed", Duration::ZERO).is_none(),
            "the revoke was acknowledged while a part of a revoked partition was in flight\n{}",
            logs(&a, &b)
        );
    } else {
        // Released at once: the part in flight is of a partition kept.
        assert!(!resume.exists());
        assert!(
            a.logged(waiting, Duration::ZERO).is_none(),
            "{}",
            logs(&a, &b)
        );
    }
    std::fs::write(&resume, b"").unwrap();
    b.wait_for("claimed", within);
    wait_for_count(&db, 600, "both members apply everything", within, &[&a, &b]);
    a.wait_for("committing batch 1 without", within);
    std::thread::sleep(Duration::from_secs(1));
    let log_a = a.log();
    assert!(
        !log_a.contains("a rebalance took a partition"),
        "the batch was given up instead of committed for the partitions kept\n{log_a}"
    );
    assert_eq!(a.term(), Some(0), "{}", logs(&a, &b));
    assert_eq!(b.term(), Some(0), "{}", logs(&a, &b));
    assert_exactly_once(&db, 600);
}

/// Rolling upgrade in a group: a member with the map plugin `tag-v2`
/// joins one running `tag-v1`, then the old member is stopped: every
/// record is applied once, tagged by exactly one version, and what
/// arrives after the old member left is all v2.
#[test]
fn a_rolling_upgrade_tags_each_record_with_exactly_one_version() {
    let db = Db::sqlite();
    let mock = Mock::new();
    let tag = |v: &str| plugin(v).display().to_string();
    hand_over(
        &mock,
        &db,
        &member_args(&mock, &db, "g4", &["--plugin", &tag("tag_v1")]),
        &member_args(&mock, &db, "g4", &["--plugin", &tag("tag_v2"), "--upgrade"]),
        None,
    );
    let values = db.sorted_texts("SELECT value FROM seen");
    let mut untagged: Vec<String> = values
        .iter()
        .map(|v| {
            let (tag, rest) = v.split_once(':').unwrap_or(("", v));
            assert!(tag == "v1" || tag == "v2", "untagged or doubly tagged: {v}");
            rest.to_string()
        })
        .collect();
    untagged.sort();
    untagged.dedup();
    assert_eq!(untagged.len(), 900, "each record once, by one version");
    assert_applied_by(&db, 600..900, "v2", "after the old member left");
}

/// `host group swap` on a running group of two `tag-v1` members: both
/// install `tag-v2` at a batch boundary and say so, every record is
/// applied once by exactly one version, everything produced after the
/// swap returned is v2, and `host group status` shows both members on
/// v2. Components that cannot replace the group's map stage are refused
/// before anything is stored.
#[test]
fn a_group_swap_reaches_every_member_at_a_batch_boundary() {
    let db = Db::postgres();
    let mock = Mock::new();
    mock.create_topic("events", 6);
    let tag = |v: &str| plugin(v).display().to_string();
    let args = member_args(&mock, &db, "g8", &["--plugin", &tag("tag_v1")]);
    let a = HostProcess::start(&args);
    let b = HostProcess::start(&args);
    produce(&mock, "events", 0, 300, 6);
    let within = Duration::from_secs(60);
    wait_for_count(&db, 300, "both apply the first records", within, &[&a, &b]);
    let group = |args: &[&str]| group_cmd(args[0], &db, "g8", &args[1..]);
    for (bad, says) in [
        (plugin("wrong-world"), "exports no Sluice stage"),
        (plugin("sql_counter"), "exports no map stage"),
    ] {
        let (code, out) = group(&["swap", "--plugin", bad.to_str().unwrap(), "--stage", "map"]);
        assert_eq!(code, Some(2), "{}: {out}", bad.display());
        assert!(out.contains(says), "{}: {out}", bad.display());
    }
    let (code, out) = group(&["swap", "--plugin", &tag("tag_v2"), "--stage", "map"]);
    assert_eq!(
        code,
        Some(0),
        "{out}\n--- a\n{}\n--- b\n{}",
        a.log(),
        b.log()
    );
    assert_eq!(out.matches(": installed").count(), 2, "{out}");
    produce(&mock, "events", 300, 300, 6);
    wait_for_count(&db, 600, "both apply after the swap", within, &[&a, &b]);
    let (code, status) = group(&["status", "--json"]);
    assert_eq!(code, Some(0), "{status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let v2 = sluice_host::plugin::digest(&std::fs::read(plugin("tag_v2")).unwrap());
    let members = status["members"].as_array().unwrap();
    assert_eq!(members.len(), 2, "{status}");
    for m in members {
        assert_eq!(m["swap_id"], 1, "{status}");
        assert!(m["plugins"].to_string().contains(&v2), "{status}");
    }
    let (mut a, mut b) = (a, b);
    assert_eq!(a.term(), Some(0), "{}", a.log());
    assert_eq!(b.term(), Some(0), "{}", b.log());
    assert!(a.log().contains("group swap 1 installed"), "{}", a.log());
    assert_exactly_once(&db, 600);
    let values = db.sorted_texts("SELECT value FROM seen");
    for v in &values {
        let tag = v.split_once(':').map_or("", |(t, _)| t);
        assert!(tag == "v1" || tag == "v2", "untagged or doubly tagged: {v}");
    }
    assert_applied_by(&db, 300..600, "v2", "produced after the swap");
    // Members that left are gone from the group's rows.
    let (_, status) = group(&["status", "--json"]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        status["members"].as_array().map(Vec::len),
        Some(0),
        "{status}"
    );
}

/// Plugin authority: after `host group swap` to `tag-v2`, a member
/// restarted with the command line it had before the swap (`--plugin
/// tag-v1`, as a service manager would) is refused with the commands to
/// run and does not put the group back on v1; a member started without
/// `--plugin` runs v2; `--upgrade` makes the given plugins the group's
/// on purpose.
#[test]
fn a_member_restarted_with_pre_swap_plugins_does_not_roll_the_group_back() {
    let db = Db::sqlite();
    let mock = Mock::new();
    mock.create_topic("events", 6);
    let tag = |v: &str| plugin(v).display().to_string();
    let v1_args = member_args(&mock, &db, "g12", &["--plugin", &tag("tag_v1")]);
    let a = HostProcess::start(&v1_args);
    produce(&mock, "events", 0, 120, 6);
    let within = Duration::from_secs(60);
    wait_for_count(&db, 120, "the v1 member applies", within, &[&a]);
    let (code, out) = group_cmd(
        "swap",
        &db,
        "g12",
        &["--plugin", &tag("tag_v2"), "--stage", "map"],
    );
    assert_eq!(
        code,
        Some(0),
        "{out}
{}",
        a.log()
    );
    let mut a = a;
    assert_eq!(a.term(), Some(0), "{}", a.log());

    // The pre-swap command line again: refused, nothing applied by v1.
    let mut again = v1_args.clone();
    again.push("--until-caught-up".into());
    produce(&mock, "events", 120, 120, 6);
    let refs: Vec<&str> = again.iter().map(String::as_str).collect();
    let out = crate::support::host(&refs);
    let said = crate::support::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    for needle in [
        "group g12 runs",
        "host group swap` 1",
        "--upgrade",
        "without --plugin",
    ] {
        assert!(said.contains(needle), "{needle:?} not in: {said}");
    }
    assert_eq!(counted(&db), 120, "the refused member applied records");

    // Without --plugin: the group's plugins, v2.
    let mut plain = Vec::new();
    let mut it = member_args(&mock, &db, "g12", &[]).into_iter();
    while let Some(a) = it.next() {
        if a == "--plugin" {
            it.next();
        } else {
            plain.push(a);
        }
    }
    let b = HostProcess::start(&plain);
    wait_for_count(
        &db,
        240,
        "the member without --plugin applies",
        within,
        &[&b],
    );
    let mut b = b;
    assert_eq!(b.term(), Some(0), "{}", b.log());
    assert_applied_by(&db, 120..240, "v2", "applied after the swap");

    // --upgrade: on purpose, the group goes back to v1.
    let mut upgrade = v1_args.clone();
    upgrade.extend(["--upgrade".to_string(), "--until-caught-up".to_string()]);
    produce(&mock, "events", 240, 60, 6);
    let refs: Vec<&str> = upgrade.iter().map(String::as_str).collect();
    let out = crate::support::host(&refs);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        crate::support::stderr(&out)
    );
    assert_exactly_once(&db, 300);
    assert_applied_by(&db, 240..300, "v1", "applied after --upgrade");
}

/// A group whose topic was deleted and created again (here: the same
/// name on another cluster, a new topic id, as the single-host test does
/// on the mock cluster) is refused before anything of the new topic is
/// read: the group's store records the identity its positions belong to,
/// as a checkpoint directory does. The advised `host group reset` then
/// lets a member apply the new topic once.
#[test]
fn a_group_refuses_a_recreated_topic_before_reading_and_the_advised_reset_moves_it_on() {
    let db = Db::sqlite();
    let old = Mock::new();
    old.create_topic("events", 2);
    produce(&old, "events", 0, 10, 2);
    let mut args = member_args(&old, &db, "g13", &["--until-caught-up"]);
    let out = crate::support::host(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        crate::support::stderr(&out)
    );
    assert_exactly_once(&db, 10);

    let new = Mock::new();
    new.create_topic("events", 2);
    produce(&new, "events", 100, 16, 2);
    let at = args.iter().position(|a| a == "--brokers").unwrap();
    args[at + 1] = new.bootstrap();
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = crate::support::host(&refs);
    let err = crate::support::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("was deleted and created again"), "{err}");
    assert!(err.contains("topic id"), "{err}");
    assert_eq!(db.counted(), 10, "nothing of the new topic applied: {err}");

    follow_group_reset_advice(&err);
    let out = crate::support::host(&refs);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        crate::support::stderr(&out)
    );
    // The new topic's offsets (and so its idempotency keys) repeat the old
    // one's: count by value.
    assert_eq!(db.counted(), 26);
    let mut values = db.sorted_texts("SELECT value FROM seen");
    assert_eq!(values.len(), 26, "{values:?}");
    values.dedup();
    assert_eq!(values.len(), 26, "a record applied twice: {values:?}");
}

/// Run the `host group reset …` command that `err` advises, as printed;
/// fail unless it succeeds.
pub(crate) fn follow_group_reset_advice(err: &str) {
    let start = err
        .find("with `host group reset ")
        .unwrap_or_else(|| panic!("no reset advice in: {err}"))
        + "with `".len();
    let cmd = &err[start..start + err[start..].find('`').unwrap()];
    let words: Vec<&str> = cmd.split_whitespace().collect();
    let reset = crate::support::host(&words[1..]);
    assert!(
        reset.status.success(),
        "`{cmd}`: {}{}",
        String::from_utf8_lossy(&reset.stdout),
        crate::support::stderr(&reset)
    );
}

/// `host status --group` against a running member: the member's own view
/// (its last committed batch and progress, recorded by its heartbeat) and
/// the group's (topics, plugins, each partition's owner and applied end),
/// from the sink database; as a table and as JSON.
#[test]
fn host_status_shows_a_group_members_view_and_the_groups() {
    let db = Db::sqlite();
    let mock = Mock::new();
    mock.create_topic("events", 2);
    produce(&mock, "events", 0, 60, 2);
    let a = HostProcess::start(&member_args(&mock, &db, "g14", &[]));
    wait_for_count(
        &db,
        60,
        "the member applies",
        Duration::from_secs(60),
        &[&a],
    );
    let status = |json: bool| {
        let mut args = vec!["status", "--group", "g14", "--sink-db", &db.url];
        if json {
            args.push("--json");
        }
        let out = crate::support::host(&args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            crate::support::stderr(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The heartbeat records the member's view every 5 s.
    let started = std::time::Instant::now();
    let v = loop {
        let v: serde_json::Value = serde_json::from_str(&status(true)).unwrap();
        if v["members"][0]["live"]["last_committed"].is_u64() {
            break v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no member view: {v}\n{}",
            a.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let live = &v["members"][0]["live"];
    assert_eq!(live["pid"].as_u64(), Some(u64::from(a.pid())), "{v}");
    assert_eq!(live["last_progress"]["group"], "g14", "{v}");
    assert_eq!(v["partitions"].as_array().map(Vec::len), Some(2), "{v}");
    let applied: i64 = v["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["applied_end"].as_i64().unwrap_or(0))
        .sum();
    assert_eq!(applied, 60, "{v}");
    let text = status(false);
    assert!(text.contains("group       g14"), "{text}");
    assert!(text.contains("last batch"), "{text}");
    let mut a = a;
    assert_eq!(a.term(), Some(0), "{}", a.log());
}

/// `host group reset`: refused while a member is live; with --force and
/// --reapply a running member is fenced, claims again and applies from the
/// new position; forward, the records jumped over are recorded as never
/// applied and skipped; back over them without --reapply is refused; a
/// dry run changes nothing; every reset is in sluice_group_resets.
#[test]
fn a_group_reset_moves_the_group_and_a_running_member_follows() {
    let db = Db::sqlite();
    let mock = Mock::new();
    mock.create_topic("events", 2);
    produce(&mock, "events", 0, 100, 2);
    let bootstrap = mock.bootstrap();
    let reset = |args: &[&str]| {
        let mut v = args.to_vec();
        v.extend(["--brokers", bootstrap.as_str()]);
        group_cmd("reset", &db, "g9", &v)
    };
    let mut a = HostProcess::start(&member_args(&mock, &db, "g9", &[]));
    let within = Duration::from_secs(60);
    wait_for_count(&db, 100, "a applies the first records", within, &[&a]);
    // Let a report itself (every 5 s at most).
    std::thread::sleep(Duration::from_secs(1));
    let back = r#"offsets:{"events":{"0":20}}"#;
    let (code, out) = reset(&["--to", back, "--reapply"]);
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains("live members"), "{out}");
    let (code, out) = reset(&["--to", back, "--reapply", "--dry-run"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("would be refused (exit 3)"), "{out}");
    let (code, out) = reset(&["--to", back, "--reapply", "--force"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("events/0: applied to 50 -> reads from 20 next; [20, 50) applied (again"),
        "{out}"
    );
    produce(&mock, "events", 100, 10, 2);
    wait_for_count(
        &db,
        140,
        "a claims again and applies [20, 50) of partition 0 again, then the new records",
        within,
        &[&a],
    );
    assert!(a.log().contains("the group was reset"), "{}", a.log());
    assert_eq!(a.term(), Some(0), "{}", a.log());

    // Forward: the 20 new records are skipped and recorded as a hole.
    produce(&mock, "events", 110, 20, 2);
    let (code, out) = reset(&["--to", "latest"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("events/1: applied to 55 -> reads from 65 next; [55, 65) jumped over, recorded as never applied"),
        "{out}"
    );
    let (code, log) =
        HostProcess::start(&member_args(&mock, &db, "g9", &["--until-caught-up"])).finish();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(db.counted(), 140);
    // Back over the hole without --reapply: refused, nothing changed.
    let (code, out) = reset(&["--to", "earliest"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("never applied [55, 65)"), "{out}");
    let (code, out) = reset(&["--to", "earliest", "--reapply", "--dry-run"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("dry run: nothing was changed"), "{out}");
    // Past the log: refused (the partition would never be read again).
    let (code, out) = reset(&["--to", r#"offsets:{"events":{"1":999999}}"#]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("past its high watermark"), "{out}");
    assert_eq!(db.scalar("SELECT count(*) FROM sluice_group_resets"), 2);
    assert_eq!(
        db.scalar(
            "SELECT end_offset FROM sluice_progress WHERE query_id = 'g9' AND \"partition\" = 1"
        ),
        65
    );
}

/// `--starting-offsets latest` holds for the partitions of a new group,
/// and where it started is recorded: a member that takes the partitions
/// over later starts there too, not at the log start. Partitions that
/// appear while the group runs are read from offset 0 (the records
/// produced to them before the claim are not skipped): the coordinator
/// assigns them after the member's next metadata refresh. Here they are
/// those of a second topic of the group, created while it runs (grow.rs
/// adds partitions to a running topic).
#[test]
fn latest_holds_for_a_new_group_and_partitions_that_appear_later_are_read_from_0() {
    let mock = Mock::new();
    let db = Db::sqlite();
    mock.create_topic("events", 2);
    produce(&mock, "events", 0, 20, 2);
    let member = |extra: &[&str]| {
        let mut v = vec![
            "--topic",
            "later",
            "--config",
            "kafka.topic.metadata.refresh.interval.ms=1000",
        ];
        v.extend(extra);
        HostProcess::start(&member_args(&mock, &db, "g10", &v))
    };
    let mut a = member(&["--starting-offsets", "latest"]);
    a.wait_for("claimed", Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(a.term(), Some(0), "{}", a.log());
    assert_eq!(counted(&db), 0, "{}", a.log());
    produce(&mock, "events", 20, 20, 2);
    let b = member(&[]);
    let within = Duration::from_secs(60);
    wait_for_count(
        &db,
        20,
        "b starts where a started (latest)",
        within,
        &[&a, &b],
    );
    mock.create_topic("later", 2);
    produce(&mock, "later", 0, 10, 2);
    wait_for_count(
        &db,
        30,
        "the new partitions are claimed and read from offset 0",
        Duration::from_secs(90),
        &[&b],
    );
    let mut b = b;
    assert_eq!(b.term(), Some(0), "{}", b.log());
    let log = b.log();
    assert!(
        log.contains("reading from offset 10 topic=\"events\""),
        "{log}"
    );
    assert!(
        log.contains("a partition added since the pipeline began: reading from its log start offset 0 topic=\"later\""),
        "{log}"
    );
    assert_exactly_once(&db, 30);
}

/// `host group swap` on a group with two map stages: it must say which
/// (`--index`), within range, and may not make one component two of them.
#[test]
fn a_group_swap_of_one_of_two_map_stages_needs_a_valid_index() {
    let db = Db::sqlite();
    let mock = Mock::new();
    mock.create_topic("events", 2);
    produce(&mock, "events", 0, 10, 2);
    let tag = |v: &str| plugin(v).display().to_string();
    let (code, log) = HostProcess::start(&member_args(
        &mock,
        &db,
        "g11",
        &[
            "--plugin",
            &tag("tag_v1"),
            "--plugin",
            &tag("tag_v2"),
            "--until-caught-up",
        ],
    ))
    .finish();
    assert_eq!(code, Some(0), "{log}");
    let v2 = tag("tag_v2");
    for (args, says) in [
        (vec!["--plugin", &v2], "say which with --index"),
        (vec!["--plugin", &v2, "--index", "5"], "has 2 map stage(s)"),
        (vec!["--plugin", &v2, "--index", "0"], "as two map stages"),
    ] {
        let (code, out) = group_cmd("swap", &db, "g11", &args);
        assert_eq!(code, Some(2), "{args:?}: {out}");
        assert!(out.contains(says), "{args:?}: {out}");
    }
    assert_eq!(db.scalar("SELECT count(*) FROM sluice_group_swaps"), 0);
}

/// The two-member case on Apache Kafka's own group coordinator: the
/// members split the partitions and each record is applied once.
#[test]
fn two_members_apply_each_record_once_on_kafka() {
    let db = Db::sqlite();
    let kafka = BrokerProcess::start();
    kafka.create_topic("events", 6);
    produce(&kafka, "events", 0, 600, 6);
    let a = HostProcess::start(&member_args(&kafka, &db, "g5", &["--until-caught-up"]));
    let b = HostProcess::start(&member_args(&kafka, &db, "g5", &["--until-caught-up"]));
    let (ca, la) = a.finish();
    let (cb, lb) = b.finish();
    assert_eq!(ca, Some(0), "a\n{la}");
    assert_eq!(cb, Some(0), "b\n{lb}");
    assert_exactly_once(&db, 600);
}

#[test]
fn blank_or_oversized_group_names_are_usage_errors() {
    let db = Db::sqlite();
    let mock = Mock::new();
    for name in ["", "   ", " g", &"g".repeat(201)] {
        let (code, log) = HostProcess::start(&member_args(&mock, &db, name, &[])).finish();
        assert_eq!(code, Some(2), "{name:?}: {log}");
        assert!(log.contains("a group name is 1 to 200 characters"), "{log}");
    }
}

/// A sink that holds the progress of a pipeline of its own (a checkpoint
/// directory) on the same topic is not taken over by a group, whose
/// progress rows are its own: it would apply every record again.
#[test]
fn a_group_refuses_a_sink_that_a_checkpointed_pipeline_writes() {
    let db = Db::sqlite();
    let mock = Mock::new();
    mock.create_topic("events", 2);
    produce(&mock, "events", 0, 20, 2);
    let dir = tempfile::tempdir().unwrap();
    let mut local = member_args(&mock, &db, "unused", &["--until-caught-up"]);
    let at = local.iter().position(|a| a == "--group").unwrap();
    local[at] = "--checkpoint".into();
    local[at + 1] = dir.path().join("ck").display().to_string();
    let (code, log) = HostProcess::start(&local).finish();
    assert_eq!(code, Some(0), "{log}");
    let (code, log) =
        HostProcess::start(&member_args(&mock, &db, "g6", &["--until-caught-up"])).finish();
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("already holds the progress of another pipeline"),
        "{log}"
    );
    assert_exactly_once(&db, 20);
}

/// A range in flight changed by hand into something unreadable: status
/// still shows the group and names the partition, a member refuses to
/// claim it (exit 1, saying what to do), and `host group reset` mends the
/// row. A sink database of another kind is a usage error everywhere.
#[test]
fn a_corrupt_range_in_flight_is_shown_refused_and_mended_by_a_reset() {
    let db = Db::sqlite();
    let mock = Mock::new();
    mock.create_topic("events", 2);
    produce(&mock, "events", 0, 40, 2);
    let run =
        || HostProcess::start(&member_args(&mock, &db, "g11", &["--until-caught-up"])).finish();
    let (code, log) = run();
    assert_eq!(code, Some(0), "{log}");
    db.batch(
        "UPDATE sluice_partitions SET planned = '{\"batch\": 7, \"start\"' \
         WHERE group_name = 'g11' AND \"partition\" = 1",
    );

    let (code, out) = group_cmd("status", &db, "g11", &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("in flight: UNREADABLE"), "{out}");
    assert!(out.contains("host group reset"), "{out}");
    let (code, log) = run();
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("could not claim events/1"), "{log}");
    assert!(log.contains("unreadable row in"), "{log}");
    assert!(log.contains("`host group reset` rewrites"), "{log}");

    let bootstrap = mock.bootstrap();
    let (code, out) = group_cmd(
        "reset",
        &db,
        "g11",
        &[
            "--to",
            r#"offsets:{"events":{"1":20}}"#,
            "--brokers",
            &bootstrap,
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = group_cmd("status", &db, "g11", &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("UNREADABLE"), "{out}");
    produce(&mock, "events", 40, 10, 2);
    let (code, log) = run();
    assert_eq!(code, Some(0), "{log}");
    assert_exactly_once(&db, 50);

    for args in [
        vec![
            "group",
            "status",
            "--sink-db",
            "mysql://u@h/db",
            "--group",
            "g11",
        ],
        vec![
            "run",
            "--brokers",
            &bootstrap,
            "--topic",
            "events",
            "--group",
            "g11",
            "--sink-db",
            "mysql://u:secret@h/db",
            "--plugin",
            "x.wasm",
        ],
    ] {
        let out = std::process::Command::new(crate::support::host_bin())
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("unsupported sink database"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }
}
