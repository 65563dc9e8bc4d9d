//! Unit tests of the checkpoint API on real files (no Kafka, no wasm).

use std::path::Path;

use super::recovery::list_ids;
use super::*;
use crate::util::now_ms;

fn opts(topics: &[&str]) -> OpenOptions {
    OpenOptions {
        topics: topics.iter().map(|s| s.to_string()).collect(),
        ..OpenOptions::default()
    }
}

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

fn plan(cp: &mut DirCheckpoint, n: u64) {
    cp.append_offsets(&OffsetsEntry {
        batch_id: n,
        epoch: cp.epoch(),
        planned_at_ms: now_ms(),
        ranges: ranges(n),
        plugins: vec![PluginRef {
            stage: StageKind::Map,
            digest: "d".repeat(64),
        }],
        config_digest: "c".into(),
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

fn run_batches(dir: &Path, n: u64) {
    let mut cp = DirCheckpoint::open(dir, &opts(&["t"])).unwrap();
    for i in cp.next_batch_id()..cp.next_batch_id() + n {
        plan(&mut cp, i);
        commit(&mut cp, i);
    }
}

fn resume_at(cp: &DirCheckpoint) -> u64 {
    match cp.recovery() {
        Recovery::Resume { next_batch, .. } => *next_batch,
        other => panic!("expected resume, got {other:?}"),
    }
}

#[test]
fn new_checkpoint_starts_at_batch_zero_with_epoch_one() {
    let d = tempfile::tempdir().unwrap();
    let cp = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap();
    assert_eq!(cp.epoch(), 1);
    assert_eq!(
        cp.recovery(),
        &Recovery::Resume {
            next_batch: 0,
            positions: BTreeMap::new(),
            plugins: vec![]
        }
    );
    assert_eq!(cp.metadata().fingerprint.topics, vec!["t".to_string()]);
}

#[test]
fn committed_batches_resume_after_the_last_one() {
    let d = tempfile::tempdir().unwrap();
    run_batches(d.path(), 3);
    let cp = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap();
    assert_eq!(cp.epoch(), 2, "each acquisition issues a new epoch");
    match cp.recovery() {
        Recovery::Resume {
            next_batch,
            positions,
            ..
        } => {
            assert_eq!(*next_batch, 3);
            assert_eq!(positions[&("t".to_string(), 0)], 30);
            assert_eq!(positions[&("t".to_string(), 1)], 30);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn uncommitted_batch_is_rerun_with_the_same_ranges() {
    let d = tempfile::tempdir().unwrap();
    run_batches(d.path(), 2);
    {
        let mut cp = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap();
        plan(&mut cp, 2);
    }
    let mut cp = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap();
    match cp.recovery() {
        Recovery::Rerun { entry } => {
            assert_eq!(entry.batch_id, 2);
            assert_eq!(entry.ranges, ranges(2));
        }
        other => panic!("{other:?}"),
    }
    // Planning a new batch before re-running is refused.
    let e = cp
        .append_offsets(&OffsetsEntry {
            batch_id: 3,
            epoch: cp.epoch(),
            planned_at_ms: 0,
            ranges: vec![],
            plugins: vec![],
            config_digest: String::new(),
            note: None,
            topics: Default::default(),
            sink_db: None,
            output: None,
        })
        .unwrap_err();
    assert!(matches!(e, CheckpointError::Misuse { .. }), "{e}");
    commit(&mut cp, 2);
    plan(&mut cp, 3);
}

#[test]
fn torn_newest_uncommitted_entry_is_discarded() {
    for damage in ["empty", "truncated", "checksum"] {
        let d = tempfile::tempdir().unwrap();
        run_batches(d.path(), 2);
        {
            let mut cp = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap();
            plan(&mut cp, 2);
        }
        let f = d.path().join("offsets/2");
        let bytes = std::fs::read(&f).unwrap();
        let damaged = match damage {
            "empty" => Vec::new(),
            "truncated" => bytes[..bytes.len() / 2].to_vec(),
            _ => String::from_utf8(bytes)
                .unwrap()
                .replace("\"start\":20", "\"start\":21")
                .into_bytes(),
        };
        std::fs::write(&f, damaged).unwrap();
        let cp = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap();
        assert_eq!(resume_at(&cp), 2, "{damage}: re-planned");
        assert!(!f.exists(), "{damage}: moved aside");
        assert!(d.path().join("offsets/2.torn").exists());
    }
}

fn corrupt_message(dir: &Path) -> String {
    match DirCheckpoint::open(dir, &opts(&["t"])) {
        Err(e @ CheckpointError::Corrupt { .. }) => e.to_string(),
        Err(e) => panic!("expected corrupt, got {e}"),
        Ok(cp) => panic!("expected corrupt, got {:?}", cp.recovery()),
    }
}

#[test]
fn damage_other_than_a_torn_tail_is_corruption() {
    // Missing middle entry.
    let d = tempfile::tempdir().unwrap();
    run_batches(d.path(), 4);
    std::fs::remove_file(d.path().join("offsets/1")).unwrap();
    let m = corrupt_message(d.path());
    assert!(m.starts_with("checkpoint corrupt: "), "{m}");
    assert!(m.contains("offsets/1: missing"), "{m}");

    // Commit without its offsets entry (the newest).
    let d = tempfile::tempdir().unwrap();
    run_batches(d.path(), 2);
    std::fs::copy(d.path().join("commits/1"), d.path().join("commits/2")).unwrap();
    let m = corrupt_message(d.path());
    assert!(
        m.contains("commits/2: commit entry without its offsets entry"),
        "{m}"
    );

    // Bad checksum on a committed entry (even the newest).
    let d = tempfile::tempdir().unwrap();
    run_batches(d.path(), 2);
    let f = d.path().join("offsets/1");
    let s = std::fs::read_to_string(&f)
        .unwrap()
        .replace("\"end\":20", "\"end\":25");
    std::fs::write(&f, s).unwrap();
    let m = corrupt_message(d.path());
    assert!(m.contains("offsets/1: checksum mismatch"), "{m}");

    // Torn commit entry.
    let d = tempfile::tempdir().unwrap();
    run_batches(d.path(), 2);
    std::fs::write(d.path().join("commits/1"), b"").unwrap();
    let m = corrupt_message(d.path());
    assert!(m.contains("commits/1: empty file"), "{m}");

    // Unknown format version, even on the newest uncommitted entry.
    let d = tempfile::tempdir().unwrap();
    run_batches(d.path(), 1);
    {
        let mut cp = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap();
        plan(&mut cp, 1);
    }
    let f = d.path().join("offsets/1");
    let s = std::fs::read_to_string(&f)
        .unwrap()
        .replace("\"format_version\":1", "\"format_version\":7");
    std::fs::write(&f, s).unwrap();
    let m = corrupt_message(d.path());
    assert!(m.contains("offsets/1: unknown format version 7"), "{m}");

    // Corrupt metadata.
    let d = tempfile::tempdir().unwrap();
    run_batches(d.path(), 1);
    std::fs::write(d.path().join("metadata"), b"{").unwrap();
    let m = corrupt_message(d.path());
    assert!(m.contains("metadata: not a complete entry"), "{m}");

    // An uncommitted entry that is not the newest.
    let d = tempfile::tempdir().unwrap();
    run_batches(d.path(), 3);
    std::fs::remove_file(d.path().join("commits/1")).unwrap();
    let m = corrupt_message(d.path());
    assert!(m.contains("commits/1: missing"), "{m}");
}

#[test]
fn corruption_is_refused_without_touching_the_files() {
    let d = tempfile::tempdir().unwrap();
    run_batches(d.path(), 3);
    std::fs::remove_file(d.path().join("offsets/1")).unwrap();
    let before: Vec<_> = std::fs::read_dir(d.path().join("offsets"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let _ = corrupt_message(d.path());
    let after: Vec<_> = std::fs::read_dir(d.path().join("offsets"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(before.len(), after.len());
}

#[test]
fn retention_keeps_the_last_k_batches_and_recovery_still_works() {
    let d = tempfile::tempdir().unwrap();
    let o = OpenOptions {
        retention: 5,
        ..opts(&["t"])
    };
    {
        let mut cp = DirCheckpoint::open(d.path(), &o).unwrap();
        for i in 0..12 {
            plan(&mut cp, i);
            commit(&mut cp, i);
        }
    }
    let ids = list_ids(&d.path().join("offsets")).unwrap();
    assert_eq!(ids.into_iter().collect::<Vec<_>>(), vec![7, 8, 9, 10, 11]);
    assert_eq!(list_ids(&d.path().join("commits")).unwrap().len(), 5);
    let cp = DirCheckpoint::open(d.path(), &o).unwrap();
    assert_eq!(resume_at(&cp), 12);
}

#[test]
fn interrupted_prune_leftovers_are_not_corruption() {
    let d = tempfile::tempdir().unwrap();
    let o = OpenOptions {
        retention: 3,
        ..opts(&["t"])
    };
    {
        let mut cp = DirCheckpoint::open(d.path(), &o).unwrap();
        for i in 0..6 {
            plan(&mut cp, i);
            commit(&mut cp, i);
        }
    }
    // A prune that removed offsets/2 but died before commits/2.
    std::fs::copy(d.path().join("commits/3"), d.path().join("commits/2")).unwrap();
    let cp = DirCheckpoint::open(d.path(), &o).unwrap();
    assert_eq!(resume_at(&cp), 6);
    assert!(!d.path().join("commits/2").exists(), "leftover removed");
}

#[test]
fn fingerprint_mismatch_is_refused_with_a_diff_unless_allowed() {
    let d = tempfile::tempdir().unwrap();
    drop(DirCheckpoint::open(d.path(), &opts(&["a", "b"])).unwrap());
    let e = DirCheckpoint::open(d.path(), &opts(&["b", "c"])).unwrap_err();
    let m = e.to_string();
    assert!(m.contains("+ added:   c"), "{m}");
    assert!(m.contains("- removed: a"), "{m}");
    assert!(m.contains("--allow-fingerprint-change"), "{m}");
    let o = OpenOptions {
        allow_fingerprint_change: true,
        ..opts(&["b", "c"])
    };
    let cp = DirCheckpoint::open(d.path(), &o).unwrap();
    assert_eq!(
        cp.metadata().fingerprint.topics,
        vec!["b".to_string(), "c".to_string()]
    );
    drop(cp);
    assert!(
        DirCheckpoint::open(d.path(), &opts(&["c", "b"])).is_ok(),
        "order does not matter"
    );
}

#[test]
fn a_compatible_contract_version_is_no_fingerprint_change() {
    let now = Fingerprint::new(&["t".to_string()]);
    let older_patch = Fingerprint {
        contract: "sluice:plugin@0.2.0".into(),
        ..now.clone()
    };
    assert_eq!(older_patch.diff(&now), None, "0.2.0 resumes under 0.2.x");
    for other in ["sluice:plugin@0.1.0", "sluice:plugin@1.0.0", "something"] {
        let old = Fingerprint {
            contract: other.into(),
            ..now.clone()
        };
        let d = old
            .diff(&now)
            .expect("an incompatible contract is a change");
        assert!(
            d.contains(&format!("contract: checkpoint {other} vs host")),
            "{d}"
        );
    }
    let moved = Fingerprint {
        topics: vec!["u".into()],
        ..older_patch
    };
    let d = moved.diff(&now).expect("topics still count");
    assert!(!d.contains("contract"), "{d}");
}

#[test]
fn a_held_lock_is_refused_naming_the_owner() {
    let d = tempfile::tempdir().unwrap();
    let owner = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap();
    let e = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap_err();
    assert!(e.is_owned());
    let m = e.to_string();
    assert!(m.contains(&format!("pid {}", std::process::id())), "{m}");
    assert!(m.contains("(epoch 1)"), "{m}");
    assert!(m.contains("use --wait to queue or --takeover"), "{m}");
    // Waiting gives up after the timeout while the owner stays.
    let o = OpenOptions {
        wait: Some(Duration::from_millis(100)),
        ..opts(&["t"])
    };
    assert!(DirCheckpoint::open(d.path(), &o).unwrap_err().is_owned());
    drop(owner);
    assert_eq!(DirCheckpoint::open(d.path(), &o).unwrap().epoch(), 2);
}

#[test]
fn a_zombie_with_an_older_epoch_cannot_commit() {
    let d = tempfile::tempdir().unwrap();
    let mut zombie = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap();
    plan(&mut zombie, 0);
    // The lock file is removed behind the owner's back (an operator, or a
    // second node on a shared mount): a new owner gets a new epoch.
    std::fs::remove_file(d.path().join("lock")).unwrap();
    let mut newer = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap();
    assert_eq!(newer.epoch(), 2);
    let e = zombie
        .commit(&CommitEntry {
            batch_id: 0,
            epoch: Epoch::new(1),
            committed_at_ms: 0,
            counts: Counts::default(),
            timings_ms: Timings::default(),
            plugins: vec![],
            data_loss: vec![],
            note: None,
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            CheckpointError::Fenced { ours, current, .. } if ours == 1 && current == 2
        ),
        "{e}"
    );
    assert!(!d.path().join("commits/0").exists());
    // The new owner re-runs batch 0 and commits it.
    assert!(matches!(newer.recovery(), Recovery::Rerun { .. }));
    commit(&mut newer, 0);
}

#[test]
fn plugin_store_is_content_addressed() {
    let d = tempfile::tempdir().unwrap();
    let cp = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap();
    let digest = cp.store_plugin(b"component bytes").unwrap();
    assert_eq!(digest, cp.store_plugin(b"component bytes").unwrap());
    assert_eq!(cp.load_plugin(&digest).unwrap().1, b"component bytes");
    std::fs::write(cp.plugin_path(&digest), b"tampered").unwrap();
    assert!(matches!(
        cp.load_plugin(&digest),
        Err(CheckpointError::Corrupt { .. })
    ));
}

#[test]
fn status_reads_an_owned_checkpoint_without_writing() {
    let d = tempfile::tempdir().unwrap();
    run_batches(d.path(), 2);
    let mut cp = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap();
    plan(&mut cp, 2);
    let s = status(d.path()).unwrap();
    assert_eq!(s.owner.as_ref().map(|o| o.pid), Some(std::process::id()));
    assert_eq!(s.epoch, 2);
    assert_eq!(s.next_action, "rerun");
    assert_eq!(s.next_batch, 2);
    assert_eq!(s.last_committed.as_ref().map(|c| c.batch_id), Some(1));
    drop(cp);
    let s = status(d.path()).unwrap();
    assert!(s.owner.is_none());
    assert!(matches!(
        status(&d.path().join("nope")),
        Err(CheckpointError::NotACheckpoint { .. })
    ));
}

#[test]
fn a_planted_lock_symlink_is_refused_and_its_target_untouched() {
    // Found by an attack run: a `lock` symlink planted in the checkpoint
    // directory made the owner truncate and overwrite the link's target.
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    drop(DirCheckpoint::open(&ck, &opts(&["t"])).unwrap());
    let victim = d.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::remove_file(ck.join("lock")).unwrap();
    std::os::unix::fs::symlink(&victim, ck.join("lock")).unwrap();
    let e = DirCheckpoint::open(&ck, &opts(&["t"])).unwrap_err();
    assert!(matches!(e, CheckpointError::Unsafe { .. }), "{e}");
    assert!(e.to_string().contains("is a symlink"), "{e}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    // Nor is it followed by the lock itself, should the check be raced.
    assert!(trust::open_own_file(&ck.join("lock")).is_err());
}

#[test]
fn a_symlinked_entry_directory_or_a_shared_directory_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    drop(DirCheckpoint::open(&ck, &opts(&["t"])).unwrap());
    // `offsets` pointing into another directory.
    let elsewhere = d.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::remove_dir_all(ck.join("offsets")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, ck.join("offsets")).unwrap();
    let e = DirCheckpoint::open(&ck, &opts(&["t"])).unwrap_err();
    assert!(e.to_string().contains("offsets: is a symlink"), "{e}");
    std::fs::remove_file(ck.join("offsets")).unwrap();
    std::fs::create_dir(ck.join("offsets")).unwrap();
    // A group-writable checkpoint directory.
    std::fs::set_permissions(&ck, std::fs::Permissions::from_mode(0o775)).unwrap();
    let e = DirCheckpoint::open(&ck, &opts(&["t"])).unwrap_err();
    assert!(e.to_string().contains("chmod 700"), "{e}");
    std::fs::set_permissions(&ck, std::fs::Permissions::from_mode(0o700)).unwrap();
    // The checkpoint directory itself a symlink.
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&ck, &link).unwrap();
    let e = DirCheckpoint::open(&link, &opts(&["t"])).unwrap_err();
    assert!(e.to_string().contains("is a symlink"), "{e}");
    assert!(DirCheckpoint::open(&ck, &opts(&["t"])).is_ok());
}

#[test]
fn checkpoint_directories_are_0700_and_files_0600() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    run_batches(&ck, 2);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for sub in ["", "offsets", "commits", "plugins"] {
        assert_eq!(mode(&ck.join(sub)), 0o700, "{sub}");
    }
    for file in ["lock", "epoch", "metadata", "offsets/0", "commits/1"] {
        assert_eq!(mode(&ck.join(file)), 0o600, "{file}");
    }
}

#[test]
fn a_fifo_or_a_symlinked_entry_file_is_refused_without_blocking() {
    // Found by an attack run: a FIFO named `epoch` hung `host run` in
    // open(2) with the lock held; one named `lock` hung `checkpoint show`;
    // a symlinked `offsets/0` was followed.
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    run_batches(&ck, 2);
    std::fs::remove_file(ck.join("epoch")).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(ck.join("epoch"))
            .status()
            .unwrap()
            .success()
    );
    let e = DirCheckpoint::open(&ck, &opts(&["t"])).unwrap_err();
    assert!(
        e.to_string().contains("neither a file nor a directory"),
        "{e}"
    );
    std::fs::remove_file(ck.join("epoch")).unwrap();
    std::fs::remove_file(ck.join("lock")).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(ck.join("lock"))
            .status()
            .unwrap()
            .success()
    );
    // Answers (an error: that is no lock) instead of blocking.
    assert!(status(&ck).is_err());
    std::fs::remove_file(ck.join("lock")).unwrap();
    let outside = d.path().join("outside");
    std::fs::copy(ck.join("offsets/0"), &outside).unwrap();
    std::fs::remove_file(ck.join("offsets/0")).unwrap();
    std::os::unix::fs::symlink(&outside, ck.join("offsets/0")).unwrap();
    assert!(
        status(&ck).is_err(),
        "a symlinked entry is not read through"
    );
}

/// The directory behind the checkpoint seam: a batch planned and not
/// committed is claimed as a re-run of exactly its ranges under the new
/// epoch, its write-ahead is the entry on disk (ranges in any order, but
/// no others), and after its commit a claim continues at its ends; a
/// partition the entry does not name is new.
#[test]
fn dir_store_claims_an_uncommitted_batch_as_its_rerun_and_checks_it_is_the_same() {
    let d = tempfile::tempdir().unwrap();
    run_batches(d.path(), 2);
    {
        let mut cp = DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap();
        plan(&mut cp, 2);
    }
    let store = DirStore::new(DirCheckpoint::open(d.path(), &opts(&["t"])).unwrap());
    assert!(!store.is_new());
    assert_eq!(store.epoch(), Some(Epoch::new(3)));
    let mut known = store.known_partitions();
    known.sort();
    assert_eq!(known, vec![("t".to_string(), 0), ("t".to_string(), 1)]);
    let c = store.claim(&("t".into(), 1), "").unwrap();
    assert_eq!(c.epoch, Epoch::new(3));
    match c.start {
        Start::Rerun(p) => assert_eq!((p.batch, p.start, p.end), (2, 20, 30)),
        other => panic!("expected the re-run, got {other:?}"),
    }
    assert_eq!(store.claim(&("t".into(), 7), "").unwrap().start, Start::New);

    let mut reversed = ranges(2);
    reversed.reverse();
    let batch = |ranges: Vec<PartitionRange>| Batch {
        entry: OffsetsEntry {
            batch_id: store.next_batch_id(),
            epoch: Epoch::new(3),
            planned_at_ms: now_ms(),
            ranges,
            plugins: Vec::new(),
            config_digest: String::new(),
            note: None,
            topics: Default::default(),
            sink_db: None,
            output: None,
        },
        epochs: Default::default(),
        rerun: true,
        started_latest: Default::default(),
    };
    let mut other = ranges(2);
    other[0].end += 1;
    assert!(matches!(
        store.write_ahead(&batch(other)),
        Err(CheckpointError::Misuse { .. })
    ));
    let rerun = batch(reversed);
    store.write_ahead(&rerun).unwrap();
    let done = CommitEntry {
        batch_id: 2,
        epoch: Epoch::new(3),
        committed_at_ms: now_ms(),
        counts: Counts::default(),
        timings_ms: Timings::default(),
        plugins: vec![],
        data_loss: vec![],
        note: None,
    };
    assert!(store.commit(&rerun, &done).unwrap().is_empty());
    assert_eq!(store.last_committed(), Some(2));
    assert_eq!(
        store.claim(&("t".into(), 0), "").unwrap().start,
        Start::At(30)
    );
}

#[test]
fn a_new_checkpoint_nothing_was_planned_in_is_removed_and_a_waiter_starts_over() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("ck");
    let a = DirCheckpoint::open(&dir, &opts(&["t"])).unwrap();
    // A second process waits for the lock (`--wait`) while the first one
    // gives up and removes the checkpoint it had just created.
    let waiter = {
        let dir = dir.clone();
        std::thread::spawn(move || {
            let o = OpenOptions {
                wait: Some(std::time::Duration::from_secs(10)),
                ..opts(&["t"])
            };
            DirCheckpoint::open(&dir, &o)
        })
    };
    // Long enough for the waiter to be blocked on the lock file.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let first_id = a.query_id().to_string();
    assert!(a.discard_if_unused());
    assert!(!dir.exists(), "the directory it made is gone");
    drop(a);
    // The waiter locked the removed file, saw it vanish, and made a new
    // checkpoint of its own, locked at the path where others look: a third
    // process finds it owned (without the inode check it would lock a new
    // file and be a second owner).
    let b = waiter.join().unwrap().unwrap();
    assert_ne!(b.query_id(), first_id);
    assert!(dir.join("metadata").exists());
    assert!(matches!(
        DirCheckpoint::open(&dir, &opts(&["t"])),
        Err(CheckpointError::Owned { .. })
    ));
    drop(b);

    // One that a batch was planned in stays; so does one that existed.
    let mut b = DirCheckpoint::open(&parent.path().join("planned"), &opts(&["t"])).unwrap();
    plan(&mut b, 0);
    assert!(!b.discard_if_unused());
    assert!(parent.path().join("planned/offsets/0").exists());
    drop(b);
    let again = DirCheckpoint::open(&parent.path().join("planned"), &opts(&["t"])).unwrap();
    assert!(!again.discard_if_unused(), "not created by this open");

    // A directory the user made empty is emptied again, not removed.
    let empty = parent.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let c = DirCheckpoint::open(&empty, &opts(&["t"])).unwrap();
    assert!(c.discard_if_unused());
    assert!(empty.exists());
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
}
