//! Moving a pipeline's `sluice_progress` rows with a `host checkpoint
//! reset`, so that what the sink shows applied agrees with where the
//! checkpoint says to read next.
//!
//! Two changes exist, applied in one database transaction:
//! - **Forget** a partition: its row is deleted. For a topic that was
//!   deleted and created again (or a partition whose log now ends below
//!   what was read): the row's offsets name records of the old log, so
//!   none of the new log's offsets may count as applied.
//! - **Re-apply from** an offset: the row keeps only what it shows applied
//!   below that offset, so the records from there on are applied again
//!   (for a user who emptied the destination tables and wants them
//!   refilled). Without it a reset back skips what was applied, which is
//!   what exactly-once across resets means.
//!
//! The caller holds the checkpoint lock, so no pipeline writes these rows
//! meanwhile.

use std::collections::BTreeMap;
use std::ops::Range;

use super::applied::AppliedSet;
use super::{SinkDriver, SinkError};
use crate::capability::sql::{Backend, DbError, SqlValue};

/// One change to one partition's progress row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowChange {
    /// Delete the row.
    Forget,
    /// Keep only what is applied below this offset.
    ReapplyFrom(i64),
}

/// What a partition's row showed, and what was done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowReport {
    /// The row before (`None`: no row).
    pub before: Option<AppliedSet>,
    /// The row after (`None`: no row).
    pub after: Option<AppliedSet>,
}

/// A progress row as a reset or a recorded start writes it.
pub(super) struct RowWrite<'a> {
    pub(super) query_id: &'a str,
    pub(super) topic: &'a str,
    pub(super) partition: i32,
    pub(super) epoch: u64,
    pub(super) batch_id: u64,
    /// Recorded as the row's writer; `None` keeps an existing row's.
    pub(super) owner: Option<&'a str>,
}

impl SinkDriver {
    /// Make `w`'s progress row `after` (`None`: delete it), inside the
    /// transaction open on `b`.
    pub(super) fn write_row(
        &self,
        b: &mut dyn Backend,
        w: &RowWrite<'_>,
        after: Option<&AppliedSet>,
    ) -> Result<(), DbError> {
        let key = [
            SqlValue::Text(w.query_id.to_string()),
            SqlValue::Text(w.topic.to_string()),
            SqlValue::Integer(w.partition.into()),
        ];
        let Some(a) = after else {
            return b
                .execute(
                    &format!(
                        "DELETE FROM {} WHERE query_id = $1 AND topic = $2 AND \"partition\" = $3",
                        self.tables.progress
                    ),
                    &key,
                )
                .map(drop);
        };
        let mut params = key.to_vec();
        params.extend([
            SqlValue::Integer(a.end().unwrap_or(0)),
            SqlValue::Text(a.holes_text()),
            SqlValue::Integer(i64::try_from(w.epoch).unwrap_or(i64::MAX)),
            SqlValue::Integer(i64::try_from(w.batch_id).unwrap_or(i64::MAX)),
            SqlValue::Integer(crate::util::now_ms()),
            SqlValue::Text(w.owner.unwrap_or_default().to_string()),
        ]);
        let owner = if w.owner.is_some() {
            ", owner = excluded.owner"
        } else {
            ""
        };
        b.execute(
            &format!(
                "INSERT INTO {} (query_id, topic, \"partition\", end_offset, holes, epoch, batch_id, updated_at_ms, owner) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (query_id, topic, \"partition\") DO UPDATE SET \
                   end_offset = excluded.end_offset, holes = excluded.holes, epoch = excluded.epoch, \
                   batch_id = excluded.batch_id, updated_at_ms = excluded.updated_at_ms{owner}",
                self.tables.progress
            ),
            &params,
        )
        .map(drop)
    }

    /// Run `f` in one transaction on the sink's session: committed when it
    /// succeeds (rolled back instead with `dry_run`), rolled back when it
    /// fails. `err` turns a database error of begin/commit into the
    /// caller's.
    pub(super) fn in_own_transaction<T>(
        &self,
        g: &crate::capability::sql::SqlGrant,
        err: impl Fn(DbError) -> SinkError,
        dry_run: bool,
        f: impl FnOnce(&mut dyn Backend) -> Result<T, SinkError>,
    ) -> Result<T, SinkError> {
        let mut s = g.lock();
        s.begin().map_err(&err)?;
        match f(s.backend()) {
            Ok(v) if !dry_run => {
                s.commit().map_err(&err)?;
                Ok(v)
            }
            Ok(v) => {
                s.rollback();
                Ok(v)
            }
            Err(e) => {
                s.rollback();
                Err(e)
            }
        }
    }
}

impl SinkDriver {
    /// The progress rows of `query_id`, per (topic, partition).
    ///
    /// # Errors
    /// [`SinkError::Sql`] when the table cannot be read or a row is
    /// damaged.
    pub fn progress_rows(
        &self,
        query_id: &str,
    ) -> Result<BTreeMap<(String, i32), AppliedSet>, SinkError> {
        match &self.sql {
            Some(g) => self.read_rows(g.lock().backend(), query_id),
            None => Ok(BTreeMap::new()),
        }
    }

    /// [`SinkDriver::progress_rows`] on `b`.
    pub(super) fn read_rows(
        &self,
        b: &mut dyn Backend,
        query_id: &str,
    ) -> Result<BTreeMap<(String, i32), AppliedSet>, SinkError> {
        let err = |error: DbError| SinkError::Sql {
            during: "reading sluice_progress",
            site: format!("query id {query_id}"),
            error,
        };
        let rows = b
            .query(
                &format!(
                    "SELECT topic, \"partition\", end_offset, holes FROM {} WHERE query_id = $1",
                    self.tables.progress
                ),
                &[SqlValue::Text(query_id.to_string())],
            )
            .map_err(err)?;
        let mut out = BTreeMap::new();
        for row in rows.rows {
            match (row.first(), row.get(1), row.get(2), row.get(3)) {
                (
                    Some(SqlValue::Text(t)),
                    Some(SqlValue::Integer(p)),
                    Some(SqlValue::Integer(end)),
                    Some(SqlValue::Text(holes)),
                ) => {
                    let set = AppliedSet::from_row(*end, holes).map_err(|m| {
                        err(DbError {
                            message: format!("row of {t}/{p}: {m}"),
                            code: "sluice".into(),
                        })
                    })?;
                    out.insert((t.clone(), i32::try_from(*p).unwrap_or(i32::MAX)), set);
                }
                _ => {
                    return Err(err(DbError {
                        message: format!("unexpected row {row:?}"),
                        code: "sluice".into(),
                    }));
                }
            }
        }
        Ok(out)
    }

    /// Apply `changes` to the progress rows of `query_id` in one
    /// transaction (all or nothing). Rows that change are written with
    /// `epoch` and `batch_id` (the reset's). Returns each partition's row
    /// before and after.
    ///
    /// # Errors
    /// [`SinkError::Sql`]; nothing is changed then.
    pub fn reset_progress(
        &self,
        query_id: &str,
        epoch: u64,
        batch_id: u64,
        changes: &BTreeMap<(String, i32), RowChange>,
    ) -> Result<BTreeMap<(String, i32), RowReport>, SinkError> {
        let Some(g) = &self.sql else {
            return Ok(BTreeMap::new());
        };
        let err = |error: DbError| SinkError::Sql {
            during: "moving sluice_progress for a reset",
            site: format!("query id {query_id}"),
            error,
        };
        self.in_own_transaction(g, err, false, |b| {
            // Read inside the transaction that changes them.
            let rows = self.read_rows(b, query_id)?;
            let mut out = BTreeMap::new();
            for ((topic, partition), change) in changes {
                let before = rows.get(&(topic.clone(), *partition)).cloned();
                let after = match (&before, change) {
                    (None, _) | (Some(_), RowChange::Forget) => None,
                    (Some(b), RowChange::ReapplyFrom(at)) => b.below(*at),
                };
                if after != before {
                    let w = RowWrite {
                        query_id,
                        topic,
                        partition: *partition,
                        epoch,
                        batch_id,
                        owner: None,
                    };
                    self.write_row(b, &w, after.as_ref()).map_err(err)?;
                }
                out.insert((topic.clone(), *partition), RowReport { before, after });
            }
            Ok(out)
        })
    }
}

/// One partition of a `host group reset`: the progress row the reset
/// computed from, and the row to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMove {
    /// The row as read when the reset was computed (`None`: no row).
    pub before: Option<AppliedSet>,
    /// The row after (`None`: no row).
    pub after: Option<AppliedSet>,
}

impl SinkDriver {
    /// Move a pipeline group's partitions (`host group reset`), in one
    /// transaction: each partition of `moves` is claimed by the reset
    /// (its owner epoch goes up, fencing any member still writing it, and
    /// the batch in flight is abandoned), its progress row (query id =
    /// `group`) becomes `after`, written with that epoch, and the reset is
    /// recorded in `sluice_group_resets` with `target` and `audit`. With
    /// `dry_run` everything is rolled back. Returns the owner epoch each
    /// partition was given.
    ///
    /// # Errors
    /// [`SinkError::ProgressChanged`] when a row is no longer what the
    /// reset was computed from (a member wrote it since: stop the members
    /// first); [`SinkError::Group`]; [`SinkError::Sql`]. Nothing changes
    /// then.
    #[allow(clippy::too_many_arguments)]
    pub fn reset_group(
        &self,
        tables: &crate::checkpoint::group::GroupTables,
        group: &str,
        moves: &BTreeMap<(String, i32), GroupMove>,
        by: &str,
        target: &str,
        audit: &str,
        dry_run: bool,
    ) -> Result<BTreeMap<(String, i32), crate::checkpoint::Epoch>, SinkError> {
        use crate::checkpoint::group::{RESET_OWNER, abandon_planned, claim_on, record_reset};
        let Some(g) = &self.sql else {
            return Ok(BTreeMap::new());
        };
        let err = |error: DbError| SinkError::Sql {
            during: "moving a pipeline group's partitions",
            site: format!("group {group}"),
            error,
        };
        let owner = format!("{RESET_OWNER} ({by})");
        self.in_own_transaction(g, err, dry_run, |b| {
            let rows = self.read_rows(b, group)?;
            let mut epochs = BTreeMap::new();
            for ((topic, partition), m) in moves {
                // Abandoned first: a range in flight that cannot be read
                // (changed by hand) does not stop the reset that mends it.
                abandon_planned(b, tables, group, (topic, *partition)).map_err(SinkError::Group)?;
                let claim = claim_on(
                    b,
                    tables,
                    group,
                    (topic, *partition),
                    (&owner, ""),
                    crate::checkpoint::Epoch::default(),
                )
                .map_err(SinkError::Group)?;
                let now = rows.get(&(topic.clone(), *partition));
                if now != m.before.as_ref() {
                    return Err(SinkError::ProgressChanged {
                        site: format!("{topic}/{partition}"),
                        now: now.map_or("no row".into(), |r| {
                            format!("end_offset {:?}, holes {}", r.end(), r.holes_text())
                        }),
                    });
                }
                if m.after != m.before || m.after.is_none() {
                    let w = RowWrite {
                        query_id: group,
                        topic,
                        partition: *partition,
                        epoch: claim.epoch.get(),
                        batch_id: 0,
                        owner: Some(&owner),
                    };
                    self.write_row(b, &w, m.after.as_ref()).map_err(err)?;
                }
                epochs.insert((topic.clone(), *partition), claim.epoch);
            }
            record_reset(b, tables, group, by, target, audit).map_err(SinkError::Group)?;
            Ok(epochs)
        })
    }
}

impl SinkDriver {
    /// A pipeline group's member starts `topic/partition`, which has no
    /// progress row, at `at` (`--starting-offsets latest`): record that
    /// the offsets below were never applied, under the member's owner
    /// `epoch`, so that whoever holds the partition next starts there too.
    /// Nothing happens when a row exists already.
    ///
    /// # Errors
    /// [`SinkError::Group`] (fenced); [`SinkError::Sql`].
    pub fn start_at(
        &self,
        group: &str,
        topic: &str,
        partition: i32,
        epoch: crate::checkpoint::Epoch,
        at: i64,
    ) -> Result<(), SinkError> {
        let (Some(g), Some((tables, _))) = (&self.sql, &self.group) else {
            return Ok(());
        };
        let err = |error: DbError| SinkError::Sql {
            during: "recording where a partition starts",
            site: format!("{topic}/{partition}"),
            error,
        };
        self.in_own_transaction(g, err, false, |b| {
            crate::checkpoint::group::fence(b, tables, group, topic, partition, epoch)
                .map_err(SinkError::Group)?;
            let rows = self.read_rows(b, group)?;
            if rows.contains_key(&(topic.to_string(), partition)) {
                return Ok(());
            }
            let w = RowWrite {
                query_id: group,
                topic,
                partition,
                epoch: epoch.get(),
                batch_id: 0,
                owner: Some(&self.owner),
            };
            match AppliedSet::empty().skip_to(at) {
                Some(row) => self.write_row(b, &w, Some(&row)).map_err(err),
                None => Ok(()),
            }
        })
    }
}

impl SinkDriver {
    /// Add the offsets of `range` that `query_id`'s progress row on
    /// `topic/partition` (`at`) does not show applied yet, as written by
    /// batch `batch` under `epoch`, on `b` inside the caller's transaction
    /// (a pipeline group's store, after a claim: see
    /// [`crate::checkpoint::Checkpoint::record_committed`]). Returns
    /// whether the row changed.
    ///
    /// # Errors
    /// [`DbError`]; a row whose holes do not parse is one.
    pub fn record_applied_on(
        &self,
        b: &mut dyn Backend,
        (query_id, topic, partition): (&str, &str, i32),
        epoch: crate::checkpoint::Epoch,
        range: Range<i64>,
        batch: u64,
    ) -> Result<bool, DbError> {
        let sluice = |message: String| DbError {
            message,
            code: "sluice".into(),
        };
        let mut applied = self
            .read_rows(b, query_id)
            .map_err(|e| sluice(e.to_string()))?
            .remove(&(topic.to_string(), partition))
            .unwrap_or_default();
        let missing = applied.missing(&range);
        if missing.is_empty() {
            return Ok(false);
        }
        for m in missing {
            applied.record(m).map_err(sluice)?;
        }
        let w = RowWrite {
            query_id,
            topic,
            partition,
            epoch: epoch.get(),
            batch_id: batch,
            owner: Some(&self.owner),
        };
        self.write_row(b, &w, Some(&applied))?;
        Ok(true)
    }
}

impl AppliedSet {
    /// This row moved forward to `at`: what lies between its end and `at`
    /// becomes a hole (never applied; a later move back reaches it). A row
    /// that ends at or past `at` is returned as it is. No row becomes one
    /// whose offsets below `at` are all a hole.
    pub fn skip_to(&self, at: i64) -> Option<AppliedSet> {
        match self.end() {
            None if at <= 0 => None,
            None => Some(AppliedSet::from_parts(
                at,
                vec![Range { start: 0, end: at }],
            )),
            Some(end) if end >= at => Some(self.clone()),
            Some(end) => {
                let mut holes = self.holes().to_vec();
                match holes.last_mut() {
                    Some(last) if last.end == end => last.end = at,
                    _ => holes.push(end..at),
                }
                Some(AppliedSet::from_parts(at, holes))
            }
        }
    }

    /// What this row shows applied below `at` (`None`: nothing, the row
    /// can go).
    pub fn below(&self, at: i64) -> Option<AppliedSet> {
        let end = self.end()?.min(at);
        let holes: Vec<Range<i64>> = self
            .holes()
            .iter()
            .filter(|h| h.start < end)
            .map(|h| h.start..h.end.min(end))
            .collect();
        if end <= 0 || holes.iter().map(|h| h.end - h.start).sum::<i64>() >= end {
            return None;
        }
        Some(AppliedSet::from_parts(end, holes))
    }

    /// How many offsets of `range` this row shows applied.
    pub fn applied_in(&self, range: &Range<i64>) -> u64 {
        let missing: i64 = self.missing(range).iter().map(|m| m.end - m.start).sum();
        u64::try_from((range.end - range.start).max(0) - missing).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_moved_forward_records_what_it_jumps_over_as_a_hole() {
        let s = AppliedSet::from_row(100, "[[10,20]]").unwrap();
        assert_eq!(
            s.skip_to(150),
            Some(AppliedSet::from_row(150, "[[10,20],[100,150]]").unwrap())
        );
        assert_eq!(s.skip_to(100), Some(s.clone()));
        assert_eq!(s.skip_to(50), Some(s.clone()));
        // A hole that ends at the end grows.
        let h = AppliedSet::from_row(100, "[[90,100]]").unwrap();
        assert_eq!(
            h.skip_to(120),
            Some(AppliedSet::from_row(120, "[[90,120]]").unwrap())
        );
        assert_eq!(
            AppliedSet::empty().skip_to(30),
            Some(AppliedSet::from_row(30, "[[0,30]]").unwrap())
        );
        assert_eq!(AppliedSet::empty().skip_to(0), None);
    }

    #[test]
    fn a_row_cut_at_an_offset_keeps_what_lies_below() {
        let s = AppliedSet::from_row(100, "[[10,20],[50,60]]").unwrap();
        assert_eq!(s.below(200), Some(s.clone()));
        assert_eq!(
            s.below(55),
            Some(AppliedSet::from_row(55, "[[10,20],[50,55]]").unwrap())
        );
        assert_eq!(
            s.below(30),
            Some(AppliedSet::from_row(30, "[[10,20]]").unwrap())
        );
        assert_eq!(s.below(0), None);
        // Only a hole below: nothing applied, the row goes.
        assert_eq!(
            AppliedSet::from_row(40, "[[0,30]]").unwrap().below(20),
            None
        );
        assert_eq!(AppliedSet::empty().below(10), None);
        assert_eq!(s.applied_in(&(0..100)), 80);
        assert_eq!(s.applied_in(&(15..55)), 30);
        assert_eq!(s.applied_in(&(100..150)), 0);
        assert_eq!(AppliedSet::empty().applied_in(&(0..10)), 0);
    }
}
