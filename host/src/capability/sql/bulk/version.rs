//! The version guard of the bulk path (`sql.apply-versioned`, contract
//! 0.2.3): each row of the target keeps in a version column the version
//! of the last change applied to it, and a change applies only where the
//! stored version is NULL or lies between the call's `low` and the
//! change's own version (both included). So a replayed or re-snapshotted
//! change older than its row changes nothing, and `low` keeps apart
//! versions that cannot be compared (the cdc sink's source positions of
//! another form start with another prefix, which sorts outside
//! `[low, version]`).
//!
//! In SQL, on both backends: `ON CONFLICT … DO UPDATE SET … WHERE t.v IS
//! NULL OR (t.v >= $low AND t.v <= excluded.v)` for upserts, and the same
//! condition against the delete's version on a delete. A change the guard
//! holds back is not counted in the rows changed.

use super::{DbError, SqlValue, Target, stored};

/// A target's version column and the call's lowest version.
#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    /// Position of the version column among the target's columns.
    pub(super) column: usize,
    /// The lowest stored version a change may replace; NULL: no lower
    /// bound.
    pub(super) low: SqlValue,
}

impl Target {
    /// This target with the version guard on `column` (one of its columns,
    /// not a key column) from `low` on (`SqlValue::Null`: no lower bound).
    ///
    /// # Errors
    /// A host [`DbError`] (code `sluice`) when `column` is not a column of
    /// the target, or is a key column.
    pub fn versioned(mut self, column: &str, low: SqlValue) -> Result<Target, DbError> {
        let column = stored("version column", column)?;
        let at = self.stored.1.iter().position(|c| *c == column);
        let Some(at) = at.filter(|i| !self.key.contains(i)) else {
            return Err(DbError::host(format!(
                "table {}: the version column {column} must be one of the columns and not a key column",
                self.table
            )));
        };
        self.version = Some(Version { column: at, low });
        Ok(self)
    }

    /// Values each execution of a statement carries after its rows: the
    /// low version, when the guard has one.
    pub(super) fn tail(&self) -> Vec<SqlValue> {
        match &self.version {
            Some(Version { low, .. }) if *low != SqlValue::Null => vec![low.clone()],
            _ => Vec::new(),
        }
    }

    /// Values a delete carries: the key's, then the version's when
    /// versioned.
    pub(super) fn delete_width(&self) -> usize {
        self.key.len() + usize::from(self.version.is_some())
    }

    /// The guard against a change of version `change` (SQL), the low
    /// version at placeholder `$low_at`: `None` when not versioned.
    pub(super) fn guard(&self, change: &str, low_at: usize) -> Option<String> {
        let v = &self.version.as_ref()?;
        let stored = format!("{}.{}", self.table, self.columns[v.column]);
        Some(match v.low {
            SqlValue::Null => format!("({stored} IS NULL OR {stored} <= {change})"),
            _ => format!("({stored} IS NULL OR ({stored} >= ${low_at} AND {stored} <= {change}))"),
        })
    }

    /// The version column's name, when versioned.
    pub(super) fn version_column(&self) -> Option<&str> {
        self.version
            .as_ref()
            .map(|v| self.columns[v.column].as_str())
    }

    /// A one-row guarded delete: the key, then the delete's version, then
    /// the low version; `None` when not versioned. Sent one row a
    /// statement, pipelined: a multi-row form would need the key's types
    /// written out (a `VALUES` list is typed from its own values).
    pub(super) fn versioned_delete(&self) -> Option<String> {
        let n = self.key.len();
        let guard = self.guard(&format!("${}", n + 1), n + 2)?;
        let on: Vec<String> = self
            .key_names()
            .iter()
            .enumerate()
            .map(|(i, k)| format!("{k} = ${}", i + 1))
            .collect();
        Some(format!(
            "DELETE FROM {} WHERE {} AND {guard}",
            self.table,
            on.join(" AND ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Change, Folded, fold, statements};
    use super::*;

    fn target(low: SqlValue) -> Target {
        let n = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Target::new("t", &n(&["k", "v", "ver"]), &n(&["k"]))
            .unwrap()
            .versioned("ver", low)
            .unwrap()
    }

    fn text(s: &str) -> SqlValue {
        SqlValue::Text(s.into())
    }

    #[test]
    fn guarded_statements_carry_the_low_version_last() {
        let t = target(text("a:"));
        assert_eq!(
            t.upsert(2),
            "INSERT INTO t (k, v, ver) VALUES ($1, $2, $3), ($4, $5, $6) \
             ON CONFLICT (k) DO UPDATE SET v = excluded.v, ver = excluded.ver \
             WHERE (t.ver IS NULL OR (t.ver >= $7 AND t.ver <= excluded.ver))"
        );
        assert_eq!(
            t.delete(1),
            "DELETE FROM t WHERE k = $1 AND (t.ver IS NULL OR (t.ver >= $3 AND t.ver <= $2))"
        );
        let changes = vec![
            Change::Delete(vec![text("x"), text("a:1")]),
            Change::Upsert(vec![text("y"), SqlValue::Integer(1), text("a:2")]),
            Change::Delete(vec![text("z"), text("a:3")]),
            // y deleted, then upserted: its delete keeps its own version.
            Change::Delete(vec![text("y"), text("a:4")]),
            Change::Upsert(vec![text("y"), SqlValue::Integer(2), text("a:5")]),
        ];
        let steps = statements(&t, fold(&t, changes.clone()).unwrap());
        assert_eq!(steps.len(), 2);
        assert_eq!(
            steps[0].rows,
            [
                vec![text("x"), text("a:1"), text("a:")],
                vec![text("z"), text("a:3"), text("a:")],
                vec![text("y"), text("a:4"), text("a:")]
            ]
        );
        assert_eq!(steps[0].origin, [0, 2, 3]);
        assert_eq!(
            steps[1].rows,
            [vec![
                text("y"),
                SqlValue::Integer(2),
                text("a:5"),
                text("a:")
            ]]
        );
        // By COPY: deletes stage their version in the version column.
        let Folded::Sets { deletes, upserts } = fold(&t, changes).unwrap() else {
            panic!("not folded");
        };
        let types: Vec<crate::capability::sql::bulk::ColumnType> = ["text", "bigint", "text"]
            .iter()
            .map(|n| crate::capability::sql::bulk::ColumnType {
                name: n.to_string(),
                cast: n.to_string(),
                as_text: false,
            })
            .collect();
        let plan = t.copy_plan(deletes, upserts, t.stage(&types));
        assert_eq!(
            plan.rows[0],
            [text("x"), SqlValue::Null, text("a:1"), SqlValue::Integer(1)]
        );
        assert_eq!(plan.params, [text("a:")]);
        let alias = &plan.stage.name["pg_temp.".len()..];
        assert!(
            plan.delete.as_deref().unwrap().ends_with(&format!(
                "t.k = {alias}.k AND (t.ver IS NULL OR (t.ver >= $1 AND t.ver <= {alias}.ver))"
            )),
            "{:?}",
            plan.delete
        );
        assert!(
            plan.upsert
                .unwrap()
                .ends_with("WHERE (t.ver IS NULL OR (t.ver >= $1 AND t.ver <= excluded.ver))")
        );
        // No low version: no parameter for it.
        let open = target(SqlValue::Null);
        assert!(open.tail().is_empty());
        assert_eq!(
            open.delete(1),
            "DELETE FROM t WHERE k = $1 AND (t.ver IS NULL OR t.ver <= $2)"
        );
    }
}
