//! A pipeline moving between its stores (`host group adopt`, `host group
//! disband`): the sink's rows change hands in the same database
//! transaction as the group's rows (`checkpoint::group::moves`). The
//! progress rows and dead letters are renamed from one query id to the
//! other, so what was applied stays applied and the idempotency keys (made
//! of source coordinates only) stay the same: nothing is applied twice or
//! skipped by the move.

use std::collections::BTreeMap;

use super::reset::RowWrite;
use super::{SinkDriver, SinkError};
use crate::capability::sql::{Backend, DbError, SqlValue};
use crate::checkpoint::Epoch;
use crate::checkpoint::group::{ADOPT_OWNER, Adopted, GroupTables, Planned, adopt_on, disband_on};

impl SinkDriver {
    /// Rename `from`'s progress rows and dead letters to `to`, on `b`
    /// inside the caller's transaction. Returns the progress rows moved.
    fn rename_rows(&self, b: &mut dyn Backend, from: &str, to: &str) -> Result<u64, DbError> {
        let params = [
            SqlValue::Text(from.to_string()),
            SqlValue::Text(to.to_string()),
        ];
        let moved = b.execute(
            &format!(
                "UPDATE {} SET query_id = $2 WHERE query_id = $1",
                self.tables.progress
            ),
            &params,
        )?;
        b.execute(
            &format!(
                "UPDATE {} SET query_id = $2 WHERE query_id = $1",
                self.tables.dead_letters
            ),
            &params,
        )?;
        Ok(moved)
    }

    /// The highest epoch `query_id`'s progress rows were written with.
    ///
    /// # Errors
    /// [`SinkError::Sql`].
    pub fn progress_epoch(&self, query_id: &str) -> Result<Epoch, SinkError> {
        let Some(g) = &self.sql else {
            return Ok(Epoch::default());
        };
        let rows = g
            .lock()
            .backend()
            .query(
                &format!(
                    "SELECT max(epoch) FROM {} WHERE query_id = $1",
                    self.tables.progress
                ),
                &[SqlValue::Text(query_id.to_string())],
            )
            .map_err(|error| SinkError::Sql {
                during: "reading sluice_progress",
                site: format!("query id {query_id}"),
                error,
            })?;
        Ok(match rows.rows.first().map(Vec::as_slice) {
            Some([SqlValue::Integer(e)]) => Epoch::new(*e as u64),
            _ => Epoch::default(),
        })
    }

    /// `host group adopt`, in one transaction: group `group` takes over the
    /// pipeline `a` (its row, its ranges to run again), the checkpoint's
    /// progress rows and dead letters become the group's, and each of the
    /// checkpoint's `positions` that its row does not reach (a `latest`
    /// start, a reset forward) is recorded in the row, the offsets below
    /// as never applied, so the member that claims it starts there; a
    /// position (or a range's end) behind what its row shows applied
    /// becomes a range run again up to the row's end.
    /// Returns false when the group had taken this checkpoint over already
    /// (nothing changed).
    ///
    /// # Errors
    /// [`SinkError::Group`] ([`crate::checkpoint::group::GroupError::Exists`]),
    /// [`SinkError::Sql`]; nothing changes then.
    pub fn adopt_into_group(
        &self,
        tables: &GroupTables,
        group: &str,
        a: &Adopted<'_>,
        positions: &BTreeMap<(String, i32), i64>,
    ) -> Result<bool, SinkError> {
        let Some(g) = &self.sql else {
            return Ok(false);
        };
        let err = |error: DbError| SinkError::Sql {
            during: "moving the checkpoint's rows into the group",
            site: format!("group {group}"),
            error,
        };
        self.in_own_transaction(g, err, false, |b| {
            // What the checkpoint's rows show applied, before they become
            // the group's. A range handed over that ends below a row's end
            // (a reset back into offsets never applied; a capped batch
            // after one) is run on to that end, and a position behind it
            // becomes the range [position, row end): the member runs it,
            // applying only what the row lacks (the keys are those of the
            // offsets, whatever the bounds), as the checkpoint would have.
            let rows = self.read_rows(b, a.query_id)?;
            let row_end = |tp: &(String, i32)| rows.get(tp).and_then(|r| r.end());
            let mut reruns = a.reruns.clone();
            for (tp, planned) in &mut reruns {
                if let Some(end) = row_end(tp) {
                    planned.end = planned.end.max(end);
                }
            }
            for (tp, at) in positions {
                if let Some(end) = row_end(tp)
                    && end > *at
                {
                    let plugins = a.plugins.to_vec();
                    reruns.insert(
                        tp.clone(),
                        Planned {
                            batch: 0,
                            start: *at,
                            end,
                            plugins,
                        },
                    );
                }
            }
            let adopted = Adopted {
                reruns: &reruns,
                ..a.clone()
            };
            if !adopt_on(b, tables, group, &adopted).map_err(SinkError::Group)? {
                return Ok(false);
            }
            self.rename_rows(b, a.query_id, group).map_err(err)?;
            // The other positions: a row that does not reach one (a
            // `latest` start, a reset forward) records it, the offsets
            // below as never applied.
            for ((topic, partition), at) in positions {
                let tp = (topic.clone(), *partition);
                if reruns.contains_key(&tp) {
                    continue;
                }
                let after = match rows.get(&tp) {
                    Some(r) => r.skip_to(*at).filter(|after| after != r),
                    None => crate::sink::applied::AppliedSet::empty().skip_to(*at),
                };
                if let Some(after) = after {
                    let w = RowWrite {
                        query_id: group,
                        topic,
                        partition: *partition,
                        epoch: a.epoch.get(),
                        batch_id: 0,
                        owner: Some(ADOPT_OWNER),
                    };
                    self.write_row(b, &w, Some(&after)).map_err(err)?;
                }
            }
            Ok(true)
        })
    }

    /// `host group disband`, in one transaction: group `group`'s pipeline
    /// goes to the checkpoint whose query id is `query_id` (at `to`, for
    /// messages): the group records it and fences every partition, and its
    /// progress rows and dead letters become the checkpoint's.
    ///
    /// # Errors
    /// [`SinkError::Group`], [`SinkError::Sql`]; nothing changes then.
    pub fn disband_group(
        &self,
        tables: &GroupTables,
        group: &str,
        query_id: &str,
        to: &str,
        epoch: Epoch,
    ) -> Result<(), SinkError> {
        let Some(g) = &self.sql else {
            return Ok(());
        };
        let err = |error: DbError| SinkError::Sql {
            during: "moving the group's rows to the checkpoint",
            site: format!("group {group}"),
            error,
        };
        self.in_own_transaction(g, err, false, |b| {
            let fenced_at = disband_on(b, tables, group, to).map_err(SinkError::Group)?;
            // A member that claimed a partition after the caller read the
            // epochs would have the checkpoint's epoch or more: its rows
            // would fence the checkpoint's writes.
            if fenced_at >= epoch {
                return Err(SinkError::Sql {
                    during: "moving the group's rows to the checkpoint",
                    site: format!("group {group}"),
                    error: DbError {
                        message: format!(
                            "a member claimed a partition meanwhile (owner epoch {fenced_at}, the checkpoint's is {epoch}): stop every member, then run the same command again"
                        ),
                        code: "sluice".into(),
                    },
                });
            }
            self.rename_rows(b, group, query_id).map_err(err)?;
            Ok(())
        })
    }
}
