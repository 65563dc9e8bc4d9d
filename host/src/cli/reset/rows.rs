//! What a reset does to the sink's progress rows (`sluice_progress`):
//! which rows are forgotten, which are cut at the new position, and the
//! notes that say why.

use std::collections::BTreeMap;

use crate::checkpoint::TopicIdentity;
use crate::sink::applied::AppliedSet;
use crate::sink::reset::RowChange;

/// What the broker reports now.
pub(super) struct Found<'a> {
    pub(super) identity: &'a BTreeMap<String, TopicIdentity>,
    pub(super) watermarks: &'a BTreeMap<(String, i32), (i64, i64)>,
    /// The topics that are not the ones on record ([`recreated_topics`]).
    pub(super) recreated: &'a BTreeMap<String, String>,
}

/// What the reset does to the sink's progress rows, and why.
#[derive(Debug, Default)]
pub(super) struct RowPlan {
    /// Per partition.
    pub(super) changes: BTreeMap<(String, i32), RowChange>,
    /// One line per reason, for the output and the entry's note.
    pub(super) notes: Vec<String>,
    /// The rows must be read or moved: without them the reset would make
    /// the pipeline skip records it never applied.
    pub(super) needs_rows: bool,
    /// Topic identities to record with the reset.
    pub(super) identities: BTreeMap<String, TopicIdentity>,
}

/// Decide what happens to the progress rows. A row whose offsets belong
/// to a log that is gone is forgotten: every partition of a topic whose
/// identity changed, and any partition whose log now ends below the end
/// the row shows applied (which also catches a truncated or recreated
/// topic on a broker without topic ids). With `reapply` every other row
/// keeps only what lies below the new position.
pub(super) fn plan_rows(
    recorded: &BTreeMap<String, TopicIdentity>,
    found: Option<&Found<'_>>,
    moving: &[String],
    before: &BTreeMap<(String, i32), i64>,
    after: &BTreeMap<(String, i32), i64>,
    rows: &BTreeMap<(String, i32), AppliedSet>,
    reapply: bool,
) -> RowPlan {
    let mut plan = RowPlan {
        identities: recorded.clone(),
        needs_rows: reapply,
        ..RowPlan::default()
    };
    if reapply {
        plan.notes
            .push("--reapply changes the sink's progress rows".into());
    }
    if let Some(f) = found {
        for (topic, now) in f.identity {
            if let Some(why) = f.recreated.get(topic) {
                plan.notes.push(format!(
                    "topic {topic} was deleted and created again: {why}"
                ));
                plan.needs_rows = true;
                for tp in before
                    .keys()
                    .chain(after.keys())
                    .chain(rows.keys())
                    .filter(|(t, _)| t == topic)
                {
                    plan.changes.insert(tp.clone(), RowChange::Forget);
                }
            }
            let next = match recorded.get(topic) {
                Some(was) if !f.recreated.contains_key(topic) => was.updated(now),
                _ => now.clone(),
            };
            plan.identities.insert(topic.clone(), next);
        }
        for (tp, (_, high)) in f.watermarks {
            if plan.changes.contains_key(tp) {
                continue;
            }
            if before.get(tp).is_some_and(|pos| pos > high) {
                // The checkpoint is past the log's end: truncated, recreated,
                // or reset forward past it. Only the rows can tell which.
                plan.needs_rows = true;
                if !rows.contains_key(tp) {
                    plan.notes.push(format!(
                        "{}/{}: the checkpoint's position {} is beyond the log's end {high}",
                        tp.0, tp.1, before[tp]
                    ));
                }
            }
            if let Some(end) = rows.get(tp).and_then(AppliedSet::end)
                && end > *high
            {
                plan.notes.push(format!(
                    "{}/{}: the log now ends at {high}, below the offsets the sink applied (up to {end}): it was truncated or recreated",
                    tp.0, tp.1
                ));
                plan.changes.insert(tp.clone(), RowChange::Forget);
            }
        }
    }
    if reapply {
        for (tp, o) in after.iter().filter(|((t, _), _)| moving.contains(t)) {
            plan.changes
                .entry(tp.clone())
                .or_insert(RowChange::ReapplyFrom(*o));
        }
    }
    plan
}

fn show(set: Option<&AppliedSet>) -> String {
    match set.and_then(AppliedSet::end) {
        None => "no row".into(),
        Some(end) => {
            let holes = set.map(AppliedSet::holes).unwrap_or_default();
            if holes.is_empty() {
                format!("applied below {end}")
            } else {
                let h: Vec<String> = holes
                    .iter()
                    .map(|h| format!("[{}, {})", h.start, h.end))
                    .collect();
                format!("applied below {end} except {}", h.join(" "))
            }
        }
    }
}

/// What the reset does to each row, one line per row that changes, and,
/// unless `reapply`, the offsets at or after the new position that a row
/// it keeps shows applied (they will not be applied again).
pub(super) fn describe_moves(
    rows: &BTreeMap<(String, i32), AppliedSet>,
    changes: &BTreeMap<(String, i32), RowChange>,
    after: &BTreeMap<(String, i32), i64>,
    reapply: bool,
) -> Vec<String> {
    let mut lines = Vec::new();
    for (tp, change) in changes {
        let row = rows.get(tp);
        let new = match change {
            RowChange::Forget => None,
            RowChange::ReapplyFrom(at) => row.and_then(|r| r.below(*at)),
        };
        if row != new.as_ref() {
            lines.push(format!(
                "sink progress {}/{}: {} -> {}",
                tp.0,
                tp.1,
                show(row),
                show(new.as_ref())
            ));
        }
    }
    if reapply {
        return lines;
    }
    for (tp, o) in after {
        let Some(row) = rows.get(tp).filter(|_| !changes.contains_key(tp)) else {
            continue;
        };
        let n = row.applied_in(&(*o..row.end().unwrap_or(*o).max(*o)));
        if n > 0 {
            lines.push(format!(
                "sink progress {}/{}: {n} offsets from {o} on are already applied and will not be applied again (--reapply applies them again: only for a destination that lost them, or they are applied twice)",
                tp.0, tp.1
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::super::targets::recreated_topics;
    use super::*;

    fn id(s: Option<&str>, partitions: u32) -> TopicIdentity {
        TopicIdentity {
            id: s.map(str::to_string),
            partitions,
        }
    }

    fn tp(p: i32) -> (String, i32) {
        ("t".to_string(), p)
    }

    #[test]
    fn rows_of_a_recreated_or_shortened_log_are_forgotten_and_others_kept() {
        let moving = vec!["t".to_string()];
        let recorded = BTreeMap::from([("t".to_string(), id(Some("OLD"), 2))]);
        let before = BTreeMap::from([(tp(0), 10), (tp(1), 50)]);
        let after = BTreeMap::from([(tp(0), 0), (tp(1), 0)]);
        let rows = BTreeMap::from([
            (tp(0), AppliedSet::from_row(10, "[]").unwrap()),
            (tp(1), AppliedSet::from_row(10, "[]").unwrap()),
        ]);
        // Same id; partition 1 was reset forward past its end (50 > 15)
        // but its row (applied up to 10) fits the log: nothing forgotten,
        // yet the rows had to be read to know.
        let marks = BTreeMap::from([(tp(0), (0, 15)), (tp(1), (0, 15))]);
        let same = BTreeMap::from([("t".to_string(), id(Some("OLD"), 2))]);
        let gone = recreated_topics(&recorded, &same);
        let f = Found {
            identity: &same,
            watermarks: &marks,
            recreated: &gone,
        };
        let plan = plan_rows(&recorded, Some(&f), &moving, &before, &after, &rows, false);
        assert!(plan.changes.is_empty(), "{:?}", plan.changes);
        assert!(plan.needs_rows);
        // A new id: every partition forgotten, the new id recorded.
        let new = BTreeMap::from([("t".to_string(), id(Some("NEW"), 3))]);
        let gone = recreated_topics(&recorded, &new);
        let f = Found {
            identity: &new,
            watermarks: &marks,
            recreated: &gone,
        };
        let plan = plan_rows(&recorded, Some(&f), &moving, &before, &after, &rows, false);
        assert_eq!(plan.changes.len(), 2);
        assert!(plan.changes.values().all(|c| *c == RowChange::Forget));
        assert_eq!(plan.identities["t"], id(Some("NEW"), 3));
        assert!(plan.notes[0].contains("OLD to NEW"), "{:?}", plan.notes);
        // No ids at all (an old broker): a log that ends below what the
        // sink applied is another log.
        let none = BTreeMap::from([("t".to_string(), id(None, 2))]);
        let short = BTreeMap::from([(tp(0), (0, 5)), (tp(1), (0, 15))]);
        let gone = recreated_topics(&none, &none);
        let f = Found {
            identity: &none,
            watermarks: &short,
            recreated: &gone,
        };
        let plan = plan_rows(&none, Some(&f), &moving, &before, &after, &rows, false);
        assert_eq!(plan.changes, BTreeMap::from([(tp(0), RowChange::Forget)]));
        // --reapply cuts the other rows at the new positions.
        let plan = plan_rows(&none, Some(&f), &moving, &before, &after, &rows, true);
        assert_eq!(plan.changes[&tp(1)], RowChange::ReapplyFrom(0));
        assert_eq!(plan.changes[&tp(0)], RowChange::Forget);
        // Without the broker nothing can be told.
        let plan = plan_rows(&recorded, None, &moving, &before, &after, &rows, false);
        assert!(plan.changes.is_empty() && !plan.needs_rows);
    }

    #[test]
    fn moves_are_described_one_line_per_changed_row_and_kept_rows_warn_of_skips() {
        let rows = BTreeMap::from([
            (tp(0), AppliedSet::from_row(10, "[]").unwrap()),
            (tp(1), AppliedSet::from_row(50, "[]").unwrap()),
        ]);
        let changes = BTreeMap::from([(tp(0), RowChange::Forget)]);
        let after = BTreeMap::from([(tp(0), 0), (tp(1), 20)]);
        let lines = describe_moves(&rows, &changes, &after, false);
        assert_eq!(
            lines[0], "sink progress t/0: applied below 10 -> no row",
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with("sink progress t/1: 30 offsets from 20 on are already applied"),
            "{lines:?}"
        );
        assert_eq!(describe_moves(&rows, &changes, &after, true).len(), 1);
    }
}
