//! One part of a partition's range applied in one database transaction:
//! read the progress row → find the offsets it does not show applied →
//! run the plugin over each missing piece → store the dead letters →
//! record the pieces in the row (conditional on the row being as read, and
//! never over a newer epoch) → commit. Any error rolls everything back.

use std::ops::Range;

use super::applied::AppliedSet;
use super::tables::StoredRow;
use super::{
    Applied, AppliedBefore, PartitionBatch, Sends, SinkDriver, SinkError, run_plugin, site,
};
use crate::capability::sql::{DbError, SqlGrant};
use crate::plugin::{Instance, PartitionContext};

/// What a part's transaction found to do.
enum Outcome {
    /// The progress row shows every offset applied: nothing to write.
    NothingToDo(AppliedBefore),
    /// Written; commit.
    Applied(Applied),
}

/// A database error met while `during`, on part `r`.
fn sql_error(r: &PartitionContext, during: &'static str) -> impl FnOnce(DbError) -> SinkError {
    let site = site(r);
    move |error| SinkError::Sql {
        during,
        site,
        error,
    }
}

/// The offsets of `r` that `applied` does not show applied, and what is
/// was applied before; logs when only some of the range is missing.
fn missing(
    applied: &AppliedSet,
    row: Option<&StoredRow>,
    r: &PartitionContext,
) -> (Vec<Range<i64>>, AppliedBefore) {
    // Usually the whole range; after a crash, the rest of a range an
    // earlier run of this batch applied in part; after a reset back, a hole
    // a reset forward left, and not what was applied around it.
    let range = r.start_offset..r.end_offset;
    let missing = applied.missing(&range);
    let by_other_batch = row.is_some_and(|row| row.batch_id != r.batch.batch_id as i64);
    let offsets = applied.applied_in(&range);
    let applied_before = AppliedBefore {
        offsets,
        by_other_batch: by_other_batch && offsets > 0,
    };
    let whole = missing.len() == 1 && missing[0] == range;
    if !missing.is_empty() && !whole {
        let pieces: Vec<String> = missing
            .iter()
            .map(|m| format!("[{}, {})", m.start, m.end))
            .collect();
        let by = row.map_or(-1, |row| row.batch_id);
        if by_other_batch {
            tracing::debug!(topic = %r.topic, partition = r.partition, "some offsets of [{}, {}) are already applied in the sink (sluice_progress, last written by batch {by}: a reset back or a restored checkpoint); writing only the missing ones: {}", r.start_offset, r.end_offset, pieces.join(", "));
        } else {
            tracing::info!(topic = %r.topic, partition = r.partition, "some offsets of [{}, {}) were applied by an earlier run of batch {by}; writing only the missing ones: {}", r.start_offset, r.end_offset, pieces.join(", "));
        }
    }
    (missing, applied_before)
}

/// Run the plugin over each piece (its own `open`/`write`/`close`, all in
/// this transaction). Returns the records written, how many pieces the
/// plugin said were applied already, and what the pieces sent with
/// `kafka.send` (produced only once the part is ready to commit).
fn write_pieces<'p>(
    g: &SqlGrant,
    instance: Option<&mut Instance>,
    pieces: &[PartitionBatch<'p>],
    r: &PartitionContext,
) -> Result<(u64, usize, Sends<'p>), SinkError> {
    let Some(i) = instance else {
        let written = pieces.iter().map(|p| p.records.len() as u64).sum();
        return Ok((written, 0, Sends::of_map_outputs(pieces)));
    };
    g.lock()
        .open_plugin_window()
        .map_err(sql_error(r, "opening the plugin's window"))?;
    let (mut written, mut said_applied) = (0, 0);
    let mut sends = Sends::default();
    let mut out = Ok(());
    for piece in pieces {
        let r = run_plugin(i, piece).and_then(|a| Ok((a, Sends::take(i, &piece.range)?)));
        match r {
            Ok((Applied::Written { records, .. }, sent)) => {
                written += records;
                sends.extend(sent);
            }
            Ok((Applied::AlreadyApplied { .. }, _)) => said_applied += 1,
            Err(e) => {
                out = Err(e);
                break;
            }
        }
    }
    let window = g.lock().end_plugin_window();
    // Contention or a lost connection wins over anything the plugin made
    // of it (a sink that rejects a record on any SQL error): the part is
    // applied again, nobody's record is dead-lettered for a lock wait.
    if let Some(e) = &window
        && (e.is_contention() || e.is_connection_lost())
    {
        return Err(sql_error(r, "the plugin's SQL")(e.clone()));
    }
    // A rejection wins over another SQL error the sink met on the way
    // (say, the constraint violation it rejects the record for): the whole
    // part is rolled back and written again without the record, so any
    // other error recurs.
    if let Err(e @ SinkError::Rejected { .. }) = out {
        return Err(e);
    }
    if let Some(e) = window {
        return Err(sql_error(r, "the plugin's SQL")(e));
    }
    out.map(|()| (written, said_applied, sends))
}

/// Add the written pieces to `applied`, warning when that opens a hole
/// right after what the row showed (offsets never applied).
fn record_pieces(
    applied: &mut AppliedSet,
    pieces: &[Range<i64>],
    row: Option<&StoredRow>,
    r: &PartitionContext,
) -> Result<(), SinkError> {
    let holes_before = applied.holes().len();
    for piece in pieces {
        applied.record(piece.clone()).map_err(|e| {
            sql_error(r, "updating sluice_progress")(DbError {
                message: format!("cannot record the range applied: {e}"),
                code: "sluice".into(),
            })
        })?;
    }
    if applied.holes().len() > holes_before
        && let (Some(new), Some(row)) = (applied.holes().last(), row)
        && new.start == row.end
    {
        tracing::warn!(topic = %r.topic, partition = r.partition, "offsets [{}, {}) were never applied to the sink and this range starts past them (a reset forward, retention, or a sink database older than the checkpoint); recorded as a hole in sluice_progress, applied if a reset back reaches them", new.start, new.end);
    }
    Ok(())
}

impl SinkDriver {
    /// Apply `batch` in one transaction of `g`: committed when it was
    /// written, rolled back when nothing was missing or anything failed.
    ///
    /// # Errors
    /// [`SinkError`]; nothing of the part is applied then.
    pub(super) fn apply_transactional(
        &self,
        g: &SqlGrant,
        instance: Option<&mut Instance>,
        batch: &PartitionBatch<'_>,
    ) -> Result<Applied, SinkError> {
        let r = &batch.range;
        g.lock().begin().map_err(sql_error(r, "begin"))?;
        let result = self.in_transaction(g, instance, batch);
        let mut s = g.lock();
        match result {
            Ok(Outcome::NothingToDo(applied_before)) => {
                s.rollback();
                Ok(Applied::AlreadyApplied { applied_before })
            }
            Ok(Outcome::Applied(a)) => {
                s.commit().map_err(sql_error(r, "commit"))?;
                Ok(a)
            }
            Err(e) => {
                s.rollback();
                Err(e)
            }
        }
    }

    /// The work inside the transaction (see the module doc).
    fn in_transaction(
        &self,
        g: &SqlGrant,
        instance: Option<&mut Instance>,
        batch: &PartitionBatch<'_>,
    ) -> Result<Outcome, SinkError> {
        let r = &batch.range;
        if let Some((tables, group)) = &self.group {
            crate::checkpoint::group::fence(
                g.lock().backend(),
                tables,
                group,
                &r.topic,
                r.partition,
                batch.epoch,
            )
            .map_err(SinkError::Group)?;
        }
        // What the row shows applied, and the row as read (the update
        // below is conditional on it being unchanged).
        let (mut applied, row) = self
            .tables
            .read_progress(g.lock().backend(), r, batch.epoch)?;
        let (missing, applied_before) = missing(&applied, row.as_ref(), r);
        if missing.is_empty() {
            return Ok(Outcome::NothingToDo(applied_before));
        }
        let pieces: Vec<PartitionBatch<'_>> = missing.iter().map(|m| batch.slice(m)).collect();
        let (written, said_applied, sends) = write_pieces(g, instance, &pieces, r)?;

        let mut s = g.lock();
        let b = s.backend();
        for d in pieces.iter().flat_map(|p| p.dead_letters) {
            self.tables
                .insert_dead_letter(b, r, d)
                .map_err(sql_error(r, "inserting dead letters"))?;
        }
        record_pieces(&mut applied, &missing, row.as_ref(), r)?;
        let changed = self
            .tables
            .write_progress(b, (r, batch.epoch), &applied, row, &self.owner)
            .map_err(sql_error(r, "updating sluice_progress"))?;
        drop(s);
        if changed == 0 {
            // The row changed since it was read: a newer epoch (fenced), or
            // another writer of the same query id.
            let (_, now) = self
                .tables
                .read_progress(g.lock().backend(), r, batch.epoch)?;
            return Err(SinkError::ProgressChanged {
                site: site(r),
                now: now.map_or_else(
                    || "no row".to_string(),
                    |row| {
                        format!(
                            "end_offset {}, holes {}, batch {}",
                            row.end, row.holes, row.batch_id
                        )
                    },
                ),
            });
        }
        // The part is ready to commit: what the sink sent is produced and
        // acknowledged now, so the commit never records a part whose
        // records are missing (a failed commit sends them again).
        sends.deliver(batch)?;
        crate::util::failpoint("sink:before-db-commit");
        Ok(Outcome::Applied(if said_applied == pieces.len() {
            Applied::AlreadyApplied {
                applied_before: AppliedBefore {
                    offsets: (r.end_offset - r.start_offset).max(0) as u64,
                    ..applied_before
                },
            }
        } else {
            Applied::Written {
                records: written,
                // Dead letters of the whole range, stored now or by an
                // earlier run.
                dead_lettered: batch.dead_letters.len() as u64,
                applied_before,
            }
        }))
    }
}
