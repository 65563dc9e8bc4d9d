//! `host demo` runs in the suite; its summary is checked against what it
//! left on disk (`--keep`).

use serde_json::Value;

use crate::support::{Db, host, plugin, stderr};

#[test]
fn demo_summary_matches_what_it_produced() {
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("demo");
    let company = plugin("company");
    let out = host(&[
        "demo",
        "--json",
        "--keep",
        keep.to_str().unwrap(),
        "--plugin",
        company.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["table_matches_expected"], true);
    // Killed with SIGKILL mid-batch; the restart re-ran that batch with
    // the same offsets, and the table is still exact.
    assert_eq!(s["batches_rerun_after_restart"], 1);
    assert!(s["killed_batch"].as_u64().is_some(), "{s}");
    assert!(s["records_in_killed_batch"].as_u64().unwrap() > 0, "{s}");
    // The kill landed after a part of the batch committed: the restart
    // found those offsets applied, did not apply them again, and applied
    // the rest (the table check below shows: once).
    let applied = s["applied_before_kill"].as_u64().unwrap();
    assert!(applied > 0, "no part had committed before the kill: {s}");
    assert!(
        applied < s["records_in_killed_batch"].as_u64().unwrap(),
        "{s}"
    );
    assert_eq!(
        s["already_applied_on_restart"].as_u64().unwrap(),
        applied,
        "{s}"
    );
    assert_eq!(s["rerun_with_same_offsets"], true);
    assert_eq!(s["dead_letters"], 1);

    let db = Db::at(format!("sqlite:{}", keep.join("sink.db").display()));
    assert_eq!(
        s["rows_in_companies"].as_i64().unwrap(),
        db.scalar("SELECT COUNT(*) FROM companies")
    );
    assert_eq!(
        s["dead_letters"].as_i64().unwrap(),
        db.scalar("SELECT COUNT(*) FROM sluice_dead_letters")
    );

    let mut batches = 0;
    let (mut input, mut output, mut filtered) = (0, 0, 0);
    for e in std::fs::read_dir(keep.join("checkpoint/commits"))
        .unwrap()
        .flatten()
    {
        let c: Value = serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap();
        batches += 1;
        input += c["entry"]["counts"]["input"].as_u64().unwrap();
        output += c["entry"]["counts"]["output"].as_u64().unwrap();
        filtered += c["entry"]["counts"]["filtered"].as_u64().unwrap();
    }
    assert_eq!(s["batches"].as_u64().unwrap(), batches);
    assert_eq!(
        s["events_produced"].as_u64().unwrap(),
        input,
        "every produced event was read once"
    );
    assert_eq!(s["changes_applied"].as_u64().unwrap(), output);
    assert_eq!(s["events_filtered"].as_u64().unwrap(), filtered);
    assert_eq!(
        input,
        output + filtered + 1,
        "outputs + filtered + the dead letter"
    );
}
