//! Checkpoint crash safety and locking across real processes: a child
//! process (this test binary re-run in a helper mode) writes the checkpoint
//! and is SIGKILLed at numbered failpoints inside append, commit and epoch
//! issue; another process races for the lock.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_host::checkpoint::{
    CommitEntry, Counts, DirCheckpoint, OffsetsEntry, OpenOptions, PartitionRange, Recovery,
    Timings,
};
use sluice_host::util::now_ms;

fn opts() -> OpenOptions {
    OpenOptions {
        topics: vec!["t".into()],
        retention: 4,
        ..OpenOptions::default()
    }
}

/// For opens right after a release: another test thread may fork a child
/// at that moment, and the forked child shares the lock's open file
/// description until it execs (O_CLOEXEC closes it only then).
fn opts_waiting() -> OpenOptions {
    OpenOptions {
        wait: Some(Duration::from_secs(5)),
        ..opts()
    }
}

/// The deterministic plan of batch `n`.
fn ranges(n: u64) -> Vec<PartitionRange> {
    (0..2)
        .map(|p| PartitionRange {
            topic: "t".into(),
            partition: p,
            start: n as i64 * 10,
            end: n as i64 * 10 + 10,
        })
        .collect()
}

fn plan(cp: &mut DirCheckpoint, n: u64, r: Vec<PartitionRange>) {
    cp.append_offsets(&OffsetsEntry {
        batch_id: n,
        epoch: cp.epoch(),
        planned_at_ms: now_ms(),
        ranges: r,
        plugins: vec![],
        config_digest: "cfg".into(),
        note: None,
        topics: Default::default(),
        sink_db: None,
        output: None,
    })
    .unwrap();
}

fn commit(cp: &mut DirCheckpoint, n: u64) {
    cp.commit(&CommitEntry {
        batch_id: n,
        epoch: cp.epoch(),
        committed_at_ms: now_ms(),
        counts: Counts::default(),
        timings_ms: Timings::default(),
        plugins: vec![],
        data_loss: vec![],
        note: None,
    })
    .unwrap();
}

/// Re-run what recovery asks for, then run `more` new batches. Returns the
/// id of the next batch.
fn drive(cp: &mut DirCheckpoint, more: u64, report: bool) -> u64 {
    if let Recovery::Rerun { entry } = cp.recovery().clone() {
        commit(cp, entry.batch_id);
        if report {
            println!("COMMITTED {}", entry.batch_id);
        }
    }
    let start = cp.next_batch_id();
    for n in start..start + more {
        plan(cp, n, ranges(n));
        if report {
            println!("PLANNED {n}");
        }
        commit(cp, n);
        if report {
            println!("COMMITTED {n}");
        }
    }
    cp.next_batch_id()
}

/// Helper mode: the checkpoint writer run in a child process.
#[test]
#[ignore = "helper process for checkpoint crash tests"]
fn child_writer() {
    let dir = std::env::var("SLUICE_CHILD_DIR").expect("SLUICE_CHILD_DIR");
    let mut cp = DirCheckpoint::open(Path::new(&dir), &opts_waiting()).unwrap();
    println!("OPENED {}", cp.epoch());
    drive(&mut cp, 6, true);
}

/// Helper mode: take the lock, report, hold it until stdin closes.
#[test]
#[ignore = "helper process for lock tests"]
fn child_locker() {
    let dir = std::env::var("SLUICE_CHILD_DIR").expect("SLUICE_CHILD_DIR");
    match DirCheckpoint::open(Path::new(&dir), &opts()) {
        Ok(cp) => {
            println!("OWNED {}", cp.epoch());
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            drop(cp);
        }
        Err(e) if e.is_owned() => println!("REFUSED"),
        Err(e) => println!("ERROR {e}"),
    }
}

fn spawn_child(name: &str, dir: &Path, failpoint: Option<&str>) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        name,
        "--ignored",
        "--nocapture",
        "--test-threads",
        "1",
        "-q",
    ])
    .env("SLUICE_CHILD_DIR", dir)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    match failpoint {
        Some(fp) => cmd.env("SLUICE_FAILPOINT", fp),
        None => cmd.env_remove("SLUICE_FAILPOINT"),
    };
    cmd.spawn().expect("spawn child")
}

/// Run the writer until it pauses at `fp`, SIGKILL it, return what it
/// reported (COMMITTED ids).
fn crash_at(dir: &Path, fp: &str) -> Option<Vec<u64>> {
    let mut child = spawn_child("checkpoint::child_writer", dir, Some(fp));
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with("FAILPOINT ") {
                let _ = tx.send(());
            }
        }
    });
    let reached = rx.recv_timeout(Duration::from_secs(20)).is_ok();
    // SIGKILL: exactly what a crash (or `kill -9`) does.
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    if !reached {
        return None; // the failpoint was not hit (e.g. @3 of a once-only point)
    }
    let committed = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("COMMITTED "))
        .map(|n| n.trim().parse().unwrap())
        .collect();
    Some(committed)
}

fn positions_after(n: u64) -> BTreeMap<(String, i32), i64> {
    ranges(n)
        .into_iter()
        .map(|r| ((r.topic, r.partition), r.end))
        .collect()
}

/// How many times each (failpoint, hit, history) case is repeated.
const REPEATS: usize = 4;

const FAILPOINTS: &[&str] = &[
    "offsets:before-write",
    "offsets:after-write",
    "offsets:after-fsync",
    "offsets:after-link",
    "commit:before-write",
    "commit:after-write",
    "commit:after-fsync",
    "commit:after-link",
    "epoch:before-write",
    "epoch:after-write",
    "epoch:after-fsync",
    "epoch:after-rename",
];

#[test]
fn crash_at_every_failpoint_recovers_to_a_legal_state() {
    let mut crashes = 0;
    for fp in FAILPOINTS {
        for hit in 1..=3 {
            for (rep, pre) in [0u64, 3].repeat(REPEATS).into_iter().enumerate() {
                let _ = rep;
                let d = tempfile::tempdir().unwrap();
                if pre > 0 {
                    let mut cp = DirCheckpoint::open(d.path(), &opts()).unwrap();
                    drive(&mut cp, pre, false);
                }
                let Some(reported) = crash_at(d.path(), &format!("{fp}@{hit}")) else {
                    assert!(
                        fp.starts_with("epoch") && hit > 1,
                        "{fp}@{hit} never reached"
                    );
                    continue;
                };
                crashes += 1;
                let last_reported = reported.iter().max().copied().or(pre.checked_sub(1));
                let first_unreported = last_reported.map_or(0, |c| c + 1);

                let mut cp = DirCheckpoint::open(d.path(), &opts_waiting())
                    .unwrap_or_else(|e| panic!("{fp}@{hit} pre {pre}: recovery refused: {e}"));
                match cp.recovery().clone() {
                    Recovery::Resume {
                        next_batch,
                        positions,
                        ..
                    } => {
                        assert!(
                            next_batch == first_unreported || next_batch == first_unreported + 1,
                            "{fp}@{hit} pre {pre}: resume at {next_batch}, reported up to {last_reported:?} (a committed batch lost or one invented)"
                        );
                        let want = if next_batch == 0 {
                            BTreeMap::new()
                        } else {
                            positions_after(next_batch - 1)
                        };
                        assert_eq!(positions, want, "{fp}@{hit}: resume positions");
                    }
                    Recovery::Rerun { entry } => {
                        assert_eq!(
                            entry.batch_id, first_unreported,
                            "{fp}@{hit} pre {pre}: re-run id"
                        );
                        assert_eq!(
                            entry.ranges,
                            ranges(entry.batch_id),
                            "{fp}@{hit}: re-run ranges"
                        );
                    }
                }
                // Carry on: the log stays contiguous and usable.
                let next = drive(&mut cp, 2, false);
                drop(cp);
                let cp = DirCheckpoint::open(d.path(), &opts_waiting()).unwrap();
                assert!(
                    matches!(cp.recovery(), Recovery::Resume { next_batch, .. } if *next_batch == next),
                    "{fp}@{hit}: after carrying on"
                );
            }
        }
    }
    // 8 append/commit points x 3 hits + 4 epoch points x 1 hit, x 2 histories.
    assert_eq!(crashes, (8 * 3 + 4) * 2 * REPEATS, "crashes exercised");
}

/// The helper's verdict line (OWNED n / REFUSED / ERROR …), skipping the
/// test harness's own output.
fn read_line(child: &mut Child) -> String {
    let out = child.stdout.as_mut().unwrap();
    loop {
        let mut line = String::new();
        // Byte by byte: a BufReader would hold on to bytes past the line.
        let mut b = [0u8; 1];
        let mut eof = true;
        while out.read(&mut b).unwrap_or(0) == 1 {
            eof = false;
            if b[0] == b'\n' {
                break;
            }
            line.push(b[0] as char);
        }
        if ["OWNED", "REFUSED", "ERROR"]
            .iter()
            .any(|p| line.starts_with(p))
            || eof
        {
            return line;
        }
    }
}

#[test]
fn two_processes_racing_for_the_lock_never_both_own_it() {
    let d = tempfile::tempdir().unwrap();
    let mut epochs = Vec::new();
    for round in 0..100 {
        let mut a = spawn_child("checkpoint::child_locker", d.path(), None);
        let mut b = spawn_child("checkpoint::child_locker", d.path(), None);
        let la = read_line(&mut a);
        let lb = read_line(&mut b);
        let owners = [&la, &lb].iter().filter(|l| l.starts_with("OWNED")).count();
        let refused = [&la, &lb].iter().filter(|l| *l == &"REFUSED").count();
        assert_eq!((owners, refused), (1, 1), "round {round}: {la:?} / {lb:?}");
        let owner_line = if la.starts_with("OWNED") { &la } else { &lb };
        epochs.push(owner_line["OWNED ".len()..].parse::<u64>().unwrap());
        drop(a.stdin.take());
        drop(b.stdin.take());
        a.wait().unwrap();
        b.wait().unwrap();
    }
    let expected: Vec<u64> = (1..=100).collect();
    assert_eq!(epochs, expected, "one new epoch per acquisition");
}

#[test]
fn kill_9_of_the_owner_frees_the_lock_at_once() {
    let d = tempfile::tempdir().unwrap();
    let mut owner = spawn_child("checkpoint::child_locker", d.path(), None);
    assert!(read_line(&mut owner).starts_with("OWNED"));
    assert!(
        DirCheckpoint::open(d.path(), &opts())
            .unwrap_err()
            .is_owned()
    );
    owner.kill().unwrap();
    owner.wait().unwrap();
    let t = Instant::now();
    let cp = DirCheckpoint::open(d.path(), &opts_waiting()).expect("lock freed by the OS");
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(cp.epoch(), 2);
}

#[test]
fn checkpoint_show_reads_an_owned_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    let mut cp = DirCheckpoint::open(d.path(), &opts()).unwrap();
    drive(&mut cp, 3, false);
    plan(&mut cp, 3, ranges(3));
    let digest = cp.store_plugin(b"not really a component").unwrap();

    let dir = d.path().to_str().unwrap();
    let out = crate::support::host(&["checkpoint", "show", dir, "--json"]);
    assert!(out.status.success(), "{}", crate::support::stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["owner"]["pid"], std::process::id());
    assert_eq!(v["epoch"], 1);
    assert_eq!(v["last_planned"]["batch_id"], 3);
    assert_eq!(v["last_committed"]["batch_id"], 2);
    assert_eq!(v["next_action"], "rerun");
    assert_eq!(v["last_planned"]["ranges"][1]["end"], 40);
    assert_eq!(v["stored_plugins"][0], digest.as_str());

    let out = crate::support::host(&["checkpoint", "show", dir]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("owner       pid {}", std::process::id())),
        "{text}"
    );
    assert!(text.contains("next        re-run batch 3"), "{text}");
    assert!(
        text.contains(
            "t                                1             30             40  3 planned"
        ),
        "{text}"
    );

    drop(cp);
    std::fs::remove_file(d.path().join("offsets/1")).unwrap();
    let out = crate::support::host(&["checkpoint", "show", dir]);
    assert_eq!(out.status.code(), Some(1));
    let err = crate::support::stderr(&out);
    assert!(
        err.contains("checkpoint corrupt: ") && err.contains("offsets/1: missing"),
        "{err}"
    );
}
