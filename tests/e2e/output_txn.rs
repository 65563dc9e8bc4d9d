//! Exactly once to a Kafka topic (`host run --output-topic`, the default
//! guarantee) on Apache Kafka. What a `read_committed` consumer sees is
//! read and checked against the output partitions' raw record batches
//! ([`crate::txn_view`]):
//! each input's outputs must be there once after a kill -9 before the
//! transaction, inside it, and after its commit but before the
//! checkpoint's commit entry, and after a second run of the same pipeline
//! (a copy of its checkpoint) fenced the first one mid-transaction.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::output::{fill_input, host_run};
use crate::support::kafka::{Broker, BrokerProcess};
use crate::support::{HostProcess, RunArgs, host, json_lines, stderr};
use crate::txn_view::{CommittedView, committed_view};

const WAIT: Duration = Duration::from_secs(60);
const N: usize = 600;

pub(crate) fn broker_with_input() -> BrokerProcess {
    let broker = BrokerProcess::start();
    fill_input(&broker, N);
    broker
}

/// `host run` of the passthrough map into `out`, exactly once, 100
/// records per partition per batch (two batches of 300 for [`N`]).
pub(crate) fn run_args(broker: &BrokerProcess, ckpt: &Path) -> Vec<String> {
    RunArgs::new(&broker.bootstrap(), &["in"], ckpt)
        .plugin("passthrough")
        .args([
            "--output-topic",
            "out",
            "--until-caught-up",
            "--progress",
            "json",
            "--max-records-per-partition",
            "100",
        ])
        .build()
}

/// Both output partitions as a `read_committed` reader sees them.
pub(crate) fn views(broker: &BrokerProcess) -> Vec<CommittedView> {
    (0..2)
        .map(|p| committed_view(&broker.bootstrap(), "out", p))
        .collect()
}

/// Check that each input of [`fill_input`] is visible exactly once, as
/// the passthrough emitted it: value or tombstone, key, the header `h`
/// naming the input, no idempotency key added.
pub(crate) fn assert_each_input_once(views: &[CommittedView]) {
    let mut seen: BTreeMap<usize, usize> = BTreeMap::new();
    for (p, v) in views.iter().enumerate() {
        assert_eq!(v.open, 0, "partition {p}: a transaction left open");
        for r in &v.visible {
            let h = r
                .headers
                .iter()
                .find(|(k, _)| k.as_str() == "h")
                .and_then(|(_, v)| v.as_ref())
                .unwrap_or_else(|| panic!("no header h on {r:?}"));
            let i: usize = String::from_utf8_lossy(h).parse().unwrap();
            *seen.entry(i).or_default() += 1;
            let value = format!("v{i}");
            assert_eq!(
                r.value.as_deref(),
                (i % 50 != 49).then_some(value.as_bytes()),
                "input {i}"
            );
            assert_eq!(
                r.key.as_deref(),
                Some(format!("k{}", i % 7).as_bytes()),
                "input {i}"
            );
            let upstream = r
                .headers
                .iter()
                .find(|(k, _)| k.as_str() == "sluice-idempotency-key");
            assert_eq!(upstream.is_some(), i.is_multiple_of(10), "input {i}: {r:?}");
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "visible more than once: {twice:?}");
    let missing: Vec<usize> = (0..N).filter(|i| !seen.contains_key(i)).collect();
    assert!(missing.is_empty(), "never visible: {missing:?}");
}

/// The checkpoint's query id.
fn query_id(ckpt: &Path) -> String {
    let out = host(&["checkpoint", "show", "--json", ckpt.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    shown["metadata"]["query_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no query_id in {shown}"))
        .to_string()
}

/// The offsets (with metadata) the pipeline's consumer group holds for
/// `in`'s 3 partitions.
fn group_offsets(broker: &BrokerProcess, group: &str) -> Vec<(i64, String)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("group.id", group)
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 {
        tpl.add_partition("in", p);
    }
    c.committed_offsets(tpl, Duration::from_secs(20))
        .unwrap()
        .elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => (o, e.metadata().to_string()),
            other => panic!("{}: {other:?}", e.partition()),
        })
        .collect()
}

#[test]
fn each_output_is_visible_once_with_the_input_positions_in_the_transaction() {
    let broker = broker_with_input();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let out = host_run(&run_args(&broker, &ckpt));
    assert!(out.status.success(), "{}", stderr(&out));
    let events = json_lines(&out);
    assert_eq!(events.len(), 2, "{events:?}");
    for e in &events {
        assert_eq!(e["counts"]["produced"], 300, "{e}");
        assert!(
            e["durations_ms"]["transaction"].as_f64().unwrap_or(0.0) > 0.0,
            "{e}"
        );
    }
    let views = views(&broker);
    assert_each_input_once(&views);
    assert_eq!(views.iter().map(|v| v.aborted).sum::<usize>(), 0);
    // One transaction per batch, its marker on each partition that had
    // outputs.
    assert!(views.iter().all(|v| v.commits == 2), "{views:?}");
    // The input positions went in the last transaction, with its marker
    // as metadata.
    let q = query_id(&ckpt);
    let marker = format!("sluice:{q}:batch:1");
    for (offset, metadata) in group_offsets(&broker, &format!("sluice-{q}")) {
        assert_eq!(offset, 200);
        assert_eq!(metadata, marker);
    }
}

/// Kill the host at `failpoint`, start it again: each input once.
/// Returns the restart's progress events and what the restart logged.
fn killed_at_then_restarted(
    broker: &BrokerProcess,
    failpoint: &str,
) -> (Vec<serde_json::Value>, String) {
    killed_at_then_restarted_with(broker, broker, &[], failpoint)
}

/// [`killed_at_then_restarted`] reading `input`'s topic `in` and
/// producing to `output`'s topic `out`, with `extra` flags.
fn killed_at_then_restarted_with(
    input: &BrokerProcess,
    output: &BrokerProcess,
    extra: &[&str],
    failpoint: &str,
) -> (Vec<serde_json::Value>, String) {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let mut args = run_args(input, &ckpt);
    args.extend(extra.iter().map(|a| a.to_string()));
    let mut paused = HostProcess::spawn(&args, &[("SLUICE_FAILPOINT", failpoint)]);
    paused.wait_for("FAILPOINT", WAIT);
    paused.kill();
    let out = std::process::Command::new(crate::support::host_bin())
        .args(&args)
        .env("RUST_LOG", "info,sluice_host::engine::outputs=debug")
        .output()
        .unwrap();
    assert!(out.status.success(), "{failpoint}: {}", stderr(&out));
    eprintln!("{failpoint}: {}", stderr(&out));
    let views = views(output);
    assert_each_input_once(&views);
    let shown = host(&["checkpoint", "show", "--json", ckpt.to_str().unwrap()]);
    (
        json_lines(&out),
        format!(
            "{}\n{}",
            stderr(&out),
            String::from_utf8_lossy(&shown.stdout)
        ),
    )
}

#[test]
fn a_kill_before_during_or_after_the_transaction_leaves_each_output_once() {
    // Before any output of batch 1: it is planned, not produced.
    let broker = broker_with_input();
    let (events, _) = killed_at_then_restarted(&broker, "engine:after-write-ahead@2");
    assert_eq!(events[0]["rerun"], true, "{events:?}");
    assert_eq!(events[0]["counts"]["produced"], 300, "{events:?}");

    // Inside the transaction: outputs sent, positions added, no commit.
    // The restart's init_transactions aborts it and the batch runs again.
    let broker = broker_with_input();
    let (events, _) = killed_at_then_restarted(&broker, "output:before-commit-transaction@2");
    assert_eq!(events[0]["rerun"], true, "{events:?}");
    assert_eq!(events[0]["counts"]["produced"], 300, "{events:?}");

    // After the commit, before the checkpoint's commit entry: the
    // restart finds the batch's marker and does not run it again.
    let broker = broker_with_input();
    let (events, log) = killed_at_then_restarted(&broker, "engine:before-commit@2");
    assert_eq!(events[0]["batch_id"], 1, "{events:?}");
    assert_eq!(events[0]["rerun"], true, "{events:?}");
    assert!(
        events[0]["counts"]["produced"].as_u64().unwrap_or(0) == 0,
        "{events:?}"
    );
    assert!(
        log.contains("its output transaction had committed before the restart"),
        "{log}"
    );
    let views = views(&broker);
    assert_eq!(views.iter().map(|v| v.aborted).sum::<usize>(), 0);
    assert_eq!(
        views.iter().map(|v| v.visible.len()).sum::<usize>(),
        N,
        "nothing produced twice, even aborted"
    );
}

#[test]
fn exactly_once_stays_on_the_input_cluster_and_keeps_dashboard_commits_apart() {
    // Another cluster cannot take the input positions in its transaction
    // (Kafka accepts offsets only for its own topics): refused, naming
    // at-least-once.
    let input = broker_with_input();
    let other = BrokerProcess::start();
    other.create_topic("out", 2);
    let dir = tempfile::tempdir().unwrap();
    let mut args = run_args(&input, &dir.path().join("ck"));
    args.extend(["--output-brokers".to_string(), other.bootstrap()]);
    let out = host_run(&args);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("must be on the input's cluster")
            && stderr(&out).contains("--output-guarantee at-least-once"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join("ck").exists());

    // --commit-offsets-to names a dashboard group: the transactions keep
    // their own group, so a kill after a commit is still decided right,
    // and the dashboard group gets its ordinary commits.
    let (events, log) = killed_at_then_restarted_with(
        &input,
        &input,
        &["--commit-offsets-to", "dash"],
        "engine:before-commit@2",
    );
    assert_eq!(events[0]["rerun"], true, "{events:?}");
    assert!(
        log.contains("its output transaction had committed before the restart"),
        "{log}"
    );
    let dash = group_offsets(&input, "dash");
    assert!(dash.iter().all(|(o, _)| *o == 200), "{dash:?}");
}

#[test]
fn a_second_run_of_the_pipeline_fences_the_first_mid_transaction() {
    // The first run stops inside batch 1's transaction and stays alive (a
    // zombie: paused, partitioned away). A second run of the same
    // pipeline (its checkpoint copied, as a restore from a backup would)
    // initializes the transactional id, which aborts the zombie's open
    // transaction and fences its producer; it runs the batch again. The
    // zombie, resumed, must not make its outputs visible: the brokers
    // answer its commit with PRODUCER_FENCED and it stops, saying so.
    let broker = broker_with_input();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let args = run_args(&broker, &ckpt);
    let resume = dir.path().join("resume");
    let mut zombie = HostProcess::spawn(
        &args,
        &[
            ("SLUICE_FAILPOINT", "output:before-commit-transaction@2"),
            ("SLUICE_FAILPOINT_RESUME_FILE", resume.to_str().unwrap()),
        ],
    );
    zombie.wait_for("FAILPOINT", WAIT);
    let copy = dir.path().join("copy");
    let cp = std::process::Command::new("cp")
        .args(["-a", ckpt.to_str().unwrap(), copy.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(cp.success());
    // The copy's lock file is not the zombie's flock: the copy opens.
    let out = host_run(&run_args(&broker, &copy));
    assert!(out.status.success(), "{}", stderr(&out));
    let events = json_lines(&out);
    assert_eq!(events[0]["rerun"], true, "{events:?}");
    assert_eq!(events[0]["counts"]["produced"], 300, "{events:?}");
    std::fs::write(&resume, b"").unwrap();
    let (code, log) = zombie.finish();
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("did not commit") && log.contains("initialized the transactional id since"),
        "{log}"
    );
    let views = views(&broker);
    assert_each_input_once(&views);
    assert_eq!(
        views.iter().map(|v| v.aborted).sum::<usize>(),
        300,
        "the zombie's outputs are in an aborted transaction"
    );
}

#[test]
fn host_status_shows_where_the_outputs_go() {
    let broker = broker_with_input();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let args: Vec<String> = run_args(&broker, &ckpt)
        .into_iter()
        .filter(|a| a != "--until-caught-up")
        .collect();
    let mut running = HostProcess::start(&args);
    running.wait_for("batch committed", WAIT);
    let out = host(&["status", "--checkpoint", ckpt.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let q = query_id(&ckpt);
    assert!(
        said.contains(&format!(
            "output      out on {} (exactly-once), transactional id sluice-{q}",
            broker.bootstrap()
        )),
        "{said}"
    );
    // A swap cannot give the pipeline a sink stage (it would receive the
    // outputs the topic gets): the company plugin maps and sinks.
    let company = crate::support::plugin("company");
    let out = host(&[
        "swap",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--plugin",
        company.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("the pipeline has no sink stage to replace"),
        "{}",
        stderr(&out)
    );
    assert_eq!(running.term(), Some(0), "{}", running.log());
    let out = host(&["status", "--checkpoint", ckpt.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        said.contains(&format!(
            "output      out on {} (exactly-once) (the last planned batch's)",
            broker.bootstrap()
        )),
        "{said}"
    );
}

#[test]
fn a_broker_down_at_the_commit_stops_the_host_and_loses_nothing() {
    // Batch 1's outputs and positions are in its transaction when the
    // broker goes away: the commit fails, the host stops with exit 1
    // naming the batch and recording nothing; with the broker back, the
    // restart aborts that transaction and runs the batch again.
    let mut broker = broker_with_input();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let mut args = run_args(&broker, &ckpt);
    args.extend(["--kafka-timeout".to_string(), "5s".to_string()]);
    let resume = dir.path().join("resume");
    let mut host_at = HostProcess::spawn(
        &args,
        &[
            ("SLUICE_FAILPOINT", "output:before-commit-transaction@2"),
            ("SLUICE_FAILPOINT_RESUME_FILE", resume.to_str().unwrap()),
        ],
    );
    host_at.wait_for("FAILPOINT", WAIT);
    broker.kill();
    std::fs::write(&resume, b"").unwrap();
    let (code, log) = host_at.finish();
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("the transaction of batch 1 to out on") && log.contains("did not commit"),
        "{log}"
    );
    broker.restart();
    let out = host_run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let events = json_lines(&out);
    assert_eq!(events[0]["batch_id"], 1, "{events:?}");
    assert_eq!(events[0]["rerun"], true, "{events:?}");
    assert_each_input_once(&views(&broker));
}

/// Copy directory `from` to `to`, recursively, as a backup tool would:
/// files and directories (a running host's control socket is skipped).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        let kind = e.file_type().unwrap();
        if kind.is_dir() {
            copy_dir(&e.path(), &target);
        } else if kind.is_file() {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

#[test]
fn an_older_copy_of_the_checkpoint_is_refused_unless_reprocessing_is_asked_for() {
    // The first 300 inputs, then a backup of the checkpoint; 300 more run
    // by the original. The backup would produce those 300 again.
    let broker = BrokerProcess::start();
    crate::output::fill_input(&broker, N / 2);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let out = host_run(&run_args(&broker, &ckpt));
    assert!(out.status.success(), "{}", stderr(&out));
    let backup = dir.path().join("backup");
    copy_dir(&ckpt, &backup);
    crate::output::send_inputs(&broker, N / 2..N);
    let out = host_run(&run_args(&broker, &ckpt));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_each_input_once(&views(&broker));

    let out = host_run(&run_args(&broker, &backup));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("already committed input positions past the checkpoint's")
            && err.contains("in/0: the transactions committed 200")
            && err.contains("the checkpoint continues at 100")
            && err.contains("--output-reprocess"),
        "{err}"
    );
    assert_each_input_once(&views(&broker));
    let shown = host(&["checkpoint", "show", "--json", backup.to_str().unwrap()]);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(
        shown["last_planned"]["batch_id"], shown["last_committed"]["batch_id"],
        "nothing written ahead: {shown}"
    );

    // Asked for, the second half is produced again (a reset back on
    // purpose), and the group's positions follow the run again.
    let mut args = run_args(&broker, &backup);
    args.push("--output-reprocess".into());
    let out = host_run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let visible: usize = views(&broker).iter().map(|v| v.visible.len()).sum();
    assert_eq!(visible, N + N / 2);
    let out = host_run(&run_args(&broker, &ckpt));
    assert!(
        out.status.success(),
        "the original runs on: {}",
        stderr(&out)
    );

    // A reset back says what the next start needs, and that start is
    // refused without it.
    let reset = host(&[
        "checkpoint",
        "reset",
        ckpt.to_str().unwrap(),
        "--to",
        "earliest",
        "--brokers",
        &broker.bootstrap(),
    ]);
    assert!(reset.status.success(), "{}", stderr(&reset));
    let said = String::from_utf8_lossy(&reset.stdout);
    assert!(
        said.contains("unless it is started once with --output-reprocess"),
        "{said}"
    );
    let out = host_run(&run_args(&broker, &ckpt));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn a_copy_taken_while_a_batch_was_in_flight_is_refused_too() {
    // The copy shows batch 1 planned, not committed; the original then
    // commits it and more. Re-running the copy's batch 1 would produce
    // it again: the group holds positions past its end.
    let broker = broker_with_input();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let args = run_args(&broker, &ckpt);
    let mut paused =
        HostProcess::spawn(&args, &[("SLUICE_FAILPOINT", "engine:after-write-ahead@2")]);
    paused.wait_for("FAILPOINT", WAIT);
    let backup = dir.path().join("backup");
    copy_dir(&ckpt, &backup);
    paused.kill();
    let out = host_run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    // One more batch past the copy's planned one.
    crate::output::send_inputs(&broker, N..N + 300);
    let out = host_run(&args);
    assert!(out.status.success(), "{}", stderr(&out));

    let out = host_run(&run_args(&broker, &backup));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("already committed input positions past the checkpoint's")
            && err.contains("in/0: the transactions committed 300")
            && err.contains("the checkpoint continues at 200"),
        "{err}"
    );
    let visible: usize = views(&broker).iter().map(|v| v.visible.len()).sum();
    assert_eq!(visible, N + 300, "nothing produced twice");
}
