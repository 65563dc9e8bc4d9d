//! The session's side of the bulk path's `COPY` form
//! ([`bulk::CopyPlan`], PostgreSQL): whether a call may take it, the
//! connection's staging tables, and the load and merge.

use tokio_postgres::types::Type;

use super::super::postgres::binds_in_binary;
use super::super::{Dialect, SqlValue, bulk};
use super::{DbError, Session, Untrusted};

/// Staging tables one connection keeps at most (each is emptied at every
/// commit that touched it); a call for another target then goes by
/// statements.
const MAX_STAGES: usize = 32;

impl Session {
    /// Whether a plugin's `apply` may go by `COPY` here: PostgreSQL, a
    /// real database, not recording (`host test` shows statements), and a
    /// connection that can stage.
    pub(super) fn copy_allowed(&self) -> bool {
        self.backend.dialect() == Dialect::Postgres
            && !self.dry
            && self.ran.is_none()
            && self.no_stage.is_none()
    }

    /// The staging table for `target` on this connection, made if needed
    /// (by the plugin role, in the plugin's window): `None` when the call
    /// goes by statements instead — the table or a column is not there
    /// (the statements then say so), the connection holds
    /// [`MAX_STAGES`] already, or the plugin role may not create
    /// temporary tables (42501; tried in a savepoint, so the transaction
    /// goes on, and not tried again on this connection).
    ///
    /// # Errors
    /// The guard's refusal (a host table), or the database's error on
    /// the type lookup or the creation; the transaction then fails.
    pub(super) fn stage_for(
        &mut self,
        target: &bulk::Target,
    ) -> Result<Option<bulk::Stage>, DbError> {
        let Some(types) = self.column_types(target)? else {
            return Ok(None);
        };
        let stage = target.stage(&types);
        // The guard sees the target's name before anything is staged.
        let approved = self.approve(&stage.create)?;
        if self.stages.contains(&stage.name) || self.new_stages.contains(&stage.name) {
            return Ok(Some(stage));
        }
        if self.stages.len() + self.new_stages.len() >= MAX_STAGES {
            return Ok(None);
        }
        self.host_statement("SAVEPOINT sluice_stage")?;
        match self.run_approved(approved, |b| b.batch(&stage.create)) {
            Ok(()) => {
                self.host_statement("RELEASE SAVEPOINT sluice_stage")?;
                self.new_stages.push(stage.name.clone());
                Ok(Some(stage))
            }
            Err(refused) => {
                self.host_statement("ROLLBACK TO SAVEPOINT sluice_stage")?;
                if refused.code != "42501" {
                    self.failed = Some(refused.clone());
                    return Err(refused);
                }
                self.failed = None;
                tracing::warn!(
                    "the SQL capability's bulk path cannot create its temporary staging table on this connection ({refused}); it sends multi-row statements instead (grant the plugin role TEMPORARY on the database for COPY)"
                );
                self.no_stage = Some(refused.message);
                Ok(None)
            }
        }
    }

    /// The types of `target`'s columns as PostgreSQL names them
    /// (`format_type`) and whether their values go as text
    /// ([`binds_in_binary`]), looked up as the plugin's statements find
    /// the table (its search path); `None` when the table or a column is
    /// not there.
    fn column_types(
        &mut self,
        target: &bulk::Target,
    ) -> Result<Option<Vec<bulk::ColumnType>>, DbError> {
        let (table, columns) = target.stored_names();
        let columns = serde_json::Value::from(columns).to_string();
        let rows = self.backend.query(
            "SELECT format_type(a.atttypid, a.atttypmod), format_type(a.atttypid, -1), a.atttypid::int8 \
               FROM json_array_elements_text($1::json) WITH ORDINALITY AS c(name, i) \
               LEFT JOIN pg_attribute a ON a.attnum > 0 AND NOT a.attisdropped \
                 AND a.attname = c.name \
                 AND a.attrelid = (SELECT r.oid FROM pg_class r \
                                    WHERE r.relname = $2 AND pg_table_is_visible(r.oid)) \
              ORDER BY c.i",
            &[SqlValue::Text(columns), SqlValue::Text(table.to_string())],
        );
        let rows = match rows {
            Ok(r) => r,
            Err(e) => {
                self.failed = Some(e.clone());
                return Err(e);
            }
        };
        Ok(rows
            .rows
            .into_iter()
            .map(|r| match r.as_slice() {
                [
                    SqlValue::Text(name),
                    SqlValue::Text(cast),
                    SqlValue::Integer(oid),
                ] => Some(bulk::ColumnType {
                    name: name.clone(),
                    cast: cast.clone(),
                    as_text: !u32::try_from(*oid)
                        .ok()
                        .and_then(Type::from_oid)
                        .is_some_and(|t| binds_in_binary(&t)),
                }),
                _ => None,
            })
            .collect())
    }

    /// A statement of the host's own in the plugin's window; its error
    /// fails the transaction.
    fn host_statement(&mut self, sql: &str) -> Result<(), DbError> {
        self.backend
            .batch(sql)
            .inspect_err(|e| self.failed = Some(e.clone()))
    }

    /// Apply a [`bulk::CopyPlan`]: `COPY` its rows into the staging table
    /// (in plugin mode, as the plugin role), then its merge statements,
    /// which pass the guard as a plugin's own; rows changed.
    ///
    /// # Errors
    /// The index in the changes of the change the failure is reported as
    /// (the row that could not be loaded, or the first of the failing
    /// merge statement), and the error; the transaction then fails.
    pub(super) fn apply_by_copy(&mut self, plan: &bulk::CopyPlan) -> Result<u64, (usize, DbError)> {
        for (sql, deletes) in [(&plan.delete, true), (&plan.upsert, false)] {
            if let Some(sql) = sql {
                self.approve(sql).map_err(|e| (plan.first_of(deletes), e))?;
            }
        }
        // A second call in one transaction finds the first one's rows.
        let again = self.filled.contains(&plan.stage.name);
        let loaded = {
            let mut untrusted = Untrusted::new(self.backend.as_mut());
            let b = untrusted.backend();
            let emptied = match again {
                true => b
                    .execute(&format!("DELETE FROM {}", plan.stage.name), &[])
                    .map_err(|e| (0, e)),
                false => Ok(0),
            };
            emptied.and_then(|_| {
                b.copy_in(&plan.stage.name, &plan.columns, &plan.stand_in, &plan.rows)
            })
        };
        if !again {
            self.filled.push(plan.stage.name.clone());
        }
        if let Err((row, e)) = loaded {
            self.failed = Some(e.clone());
            return Err((plan.origin.get(row).copied().unwrap_or_default(), e));
        }
        tracing::debug!(
            rows = plan.rows.len(),
            stage = %plan.stage.name,
            "sql.apply: rows loaded by COPY, merging"
        );
        let mut changed = 0;
        for (sql, deletes) in [(&plan.delete, true), (&plan.upsert, false)] {
            if let Some(sql) = sql {
                changed += self
                    .execute_batch(sql, std::slice::from_ref(&plan.params))
                    .map_err(|(_, e)| (plan.first_of(deletes), e))?;
            }
        }
        Ok(changed)
    }
}
