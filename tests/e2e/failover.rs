//! Broker failures on a three-broker Apache Kafka cluster (replication
//! factor 3, `min.insync.replicas=2`): the leader of the partitions
//! killed with SIGKILL inside a batch and inside its output transaction,
//! and a rolling restart of all three brokers under a two-member
//! pipeline group. Exactly once to a topic throughout: what a
//! `read_committed` consumer reads ([`crate::txn_view`]) holds each input
//! once, and the group's progress rows cover each input once.

use std::time::{Duration, Instant};

use crate::output::{fill_input, send_inputs};
use crate::output_group::member_args;
use crate::output_txn::{assert_each_input_once, run_args, views};
use crate::support::kafka::BrokerProcess;
use crate::support::{Db, HostProcess, stderr};

const WAIT: Duration = Duration::from_secs(120);

/// Run `args` to the end, again while it fails (a run may stop on the
/// broker failure it met: the next start recovers), at most 4 times.
/// Returns every run's log.
fn run_until_done(args: &[String]) -> String {
    let mut logs = String::new();
    for attempt in 1..=4 {
        let out = crate::output::host_run(args);
        logs.push_str(&format!(
            "--- run {attempt}: {:?}\n{}",
            out.status,
            stderr(&out)
        ));
        if out.status.success() {
            return logs;
        }
        assert_eq!(out.status.code(), Some(1), "{logs}");
    }
    panic!("no run finished in 4 tries:\n{logs}");
}

/// A single host paused at `failpoint` of batch 1; the leader of
/// `topic`/0 is killed (SIGKILL) while it waits; the host goes on. The
/// killed broker comes back once the host finished (or stopped), and a
/// last run applies what is left: each input visible once.
fn leader_killed_at(failpoint: &str, topic: &str) -> String {
    let mut cluster = BrokerProcess::cluster();
    fill_input(&cluster, 600);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let args = run_args(&cluster, &ckpt);
    let resume = dir.path().join("resume");
    let mut host = HostProcess::spawn(
        &args,
        &[
            ("SLUICE_FAILPOINT", failpoint),
            ("SLUICE_FAILPOINT_RESUME_FILE", resume.to_str().unwrap()),
        ],
    );
    host.wait_for("FAILPOINT", WAIT);
    let leader = cluster.leader_of(topic, 0);
    cluster.kill_node(leader);
    std::fs::write(&resume, b"").unwrap();
    let code = host.wait();
    let mut log = format!("--- paused run: {code:?}\n{}", host.log());
    assert!(matches!(code, Some(0 | 1)), "{log}");
    cluster.restart_node(leader);
    log.push_str(&run_until_done(&args));
    assert_each_input_once(&views(&cluster));
    log
}

#[test]
fn the_input_leader_killed_mid_batch_loses_and_repeats_nothing() {
    // Batch 1 is planned (its write-ahead entry written), nothing fetched
    // yet: its fetch meets the dead leader and must read from the new one.
    let log = leader_killed_at("engine:after-write-ahead@2", "in");
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn the_output_leader_killed_mid_transaction_loses_and_repeats_nothing() {
    // Batch 1's outputs are sent and its input positions added to the
    // transaction, not committed: the commit meets the dead leader of
    // out/0 (the transaction's markers must reach its new leader), or
    // fails and the next start decides it.
    let log = leader_killed_at("output:before-commit-transaction@2", "out");
    assert!(!log.contains("panicked"), "{log}");
}

/// Members of one pipeline group kept running as a service manager
/// would: one that exits is started again, once its exit was the
/// watchdog's (a librdkafka call that outlived its timeout: exit 1 and
/// the message); any other exit fails the test.
struct Supervised {
    args: Vec<String>,
    members: Vec<HostProcess>,
    logs: String,
    restarts: usize,
}

impl Supervised {
    fn start(args: Vec<String>, n: usize) -> Supervised {
        let members = (0..n).map(|_| HostProcess::start(&args)).collect();
        Supervised {
            args,
            members,
            logs: String::new(),
            restarts: 0,
        }
    }

    /// Start again each member that exited the watchdog's way.
    fn supervise(&mut self) {
        for m in &mut self.members {
            if m.running() {
                continue;
            }
            let code = m.wait();
            let log = m.log();
            assert!(
                code == Some(1) && log.contains("did not return within"),
                "a member exited otherwise than by the watchdog: {code:?}\n{log}"
            );
            self.logs.push_str(&format!("--- exited member\n{log}\n"));
            self.restarts += 1;
            *m = HostProcess::start(&self.args);
        }
    }

    /// Wait until `n` outputs are visible, supervising meanwhile.
    fn wait_visible(&mut self, cluster: &BrokerProcess, n: usize) {
        let until = Instant::now() + Duration::from_secs(240);
        loop {
            self.supervise();
            let seen: usize = views(cluster).iter().map(|v| v.visible.len()).sum();
            if seen >= n {
                return;
            }
            assert!(
                Instant::now() < until,
                "{seen} of {n} outputs visible\n{}{}",
                self.logs,
                self.members
                    .iter()
                    .map(|m| m.log())
                    .collect::<Vec<_>>()
                    .join("\n---\n")
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

#[test]
fn a_rolling_restart_of_all_brokers_under_a_two_member_group_is_exactly_once() {
    let mut cluster = BrokerProcess::cluster();
    fill_input(&cluster, 300);
    let db = Db::sqlite();
    let mut group = Supervised::start(member_args(&cluster, &db), 2);
    group.wait_visible(&cluster, 300);
    // Each broker in turn: a controlled shutdown (SIGTERM), back after a
    // few seconds, inputs arriving meanwhile.
    for (i, id) in cluster.node_ids().into_iter().enumerate() {
        cluster.stop_node(id);
        std::thread::sleep(Duration::from_secs(3));
        group.supervise();
        send_inputs(&cluster, 300 + i * 100..400 + i * 100);
        cluster.restart_node(id);
        std::thread::sleep(Duration::from_secs(2));
    }
    group.wait_visible(&cluster, 600);
    // A moment more: nothing further may become visible.
    std::thread::sleep(Duration::from_secs(2));
    assert_each_input_once(&views(&cluster));
    eprintln!(
        "members restarted after the watchdog stopped them: {}",
        group.restarts
    );
    let logs: Vec<String> = group.members.iter().map(|m| m.log()).collect();
    for m in &mut group.members {
        assert_eq!(m.term(), Some(0), "{}", logs.join("\n---\n"));
    }
    assert_eq!(
        db.scalar(
            "SELECT CAST(SUM(end_offset) AS BIGINT) FROM sluice_progress WHERE query_id = 'eo'"
        ),
        600,
        "{}",
        logs.join("\n---\n")
    );
}
