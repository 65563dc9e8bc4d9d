//! The bulk path's PostgreSQL form for many rows: the rows left after the
//! fold go by binary `COPY` into a temporary staging table of the
//! target's columns, then one `DELETE … USING` merges the deletes and one
//! `INSERT … SELECT … ON CONFLICT` the upserts, in the part's transaction.
//! Measured cheaper for the server than 512-row `VALUES` statements (5.64
//! against 6.85 CPU-seconds per million new rows of the company table,
//! docs/benchmarks.md, session 25), and one round trip per kind instead of
//! one per statement.
//!
//! The staging table is the session's own (`CREATE TEMP TABLE IF NOT
//! EXISTS … ON COMMIT DELETE ROWS AS SELECT … WITH NO DATA`: the target's
//! column types, no constraints, emptied at each commit), created by the
//! plugin role, which needs PostgreSQL's TEMPORARY privilege (PUBLIC has
//! it by default); the session falls back to the statements where it
//! cannot create one. It is always named `pg_temp.…`, so no table of
//! another schema on the search path can stand in for it, and its name
//! carries the target columns' types, so a target whose column types
//! changed gets a new one. Values are encoded for the staging columns'
//! types the way they are bound to a statement's parameters, so both
//! forms take and refuse the same values.

use sha2::{Digest, Sha256};

use super::{SqlValue, Target};

/// Rows left after the fold from which a call goes by `COPY`: below, the
/// fixed cost (creating the staging table if needed, three round trips)
/// outweighs the statements'.
pub const COPY_MIN_ROWS: usize = 256;

/// The staging column that marks a row as a delete (not a target column:
/// a target with a column of this name keeps to the statements).
const DELETE_FLAG: &str = "sluice_delete";

/// A target column's type, as the database names it (`format_type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnType {
    /// E.g. `numeric(10,2)`, `timestamp without time zone`.
    pub name: String,
    /// The type without its modifier, as a cast names it
    /// (`format_type(oid, -1)`: `numeric`, `"bit"` — a bare `bit` would
    /// be `bit(1)`), so the merge's assignment applies the modifier as a
    /// statement's would (a bit string of another length is refused,
    /// not padded).
    pub cast: String,
    /// Values for it are sent as text (a type without a binary encoder in
    /// the host): its staging column is `text`, cast to `name` in the
    /// merge.
    pub as_text: bool,
}

/// A target's staging table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// Its name, qualified: `pg_temp.sluice_stage_…` (the session's
    /// temporary schema).
    pub name: String,
    /// Creates it when the session has none yet.
    pub create: String,
    /// Per target column, the type a `text` staging column stands in
    /// for (`None`: the staging column has the target's type).
    pub stand_in: Vec<Option<String>>,
}

/// A call's changes as a `COPY` into the [`Stage`] and its merge
/// statements.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyPlan {
    /// The staging table.
    pub stage: Stage,
    /// Its columns: the target's, then the delete flag `sluice_delete`.
    pub columns: Vec<String>,
    /// Per staging column, the type its `text` stands in for
    /// ([`Stage::stand_in`], then `None` for the flag).
    pub stand_in: Vec<Option<String>>,
    /// The rows to stage, in the staging columns' order: the deletes (key
    /// values, NULL elsewhere, flag 1), then the upserts (flag 0).
    pub rows: Vec<Vec<SqlValue>>,
    /// Per staged row, the index in the changes of the change it carries.
    pub origin: Vec<usize>,
    /// `DELETE … USING` the staged deletes (`None`: there are none).
    pub delete: Option<String>,
    /// `INSERT … SELECT` the staged upserts (`None`: there are none).
    pub upsert: Option<String>,
    /// The merge statements' parameters: the version guard's low version,
    /// or none.
    pub params: Vec<SqlValue>,
}

impl CopyPlan {
    /// The change a failing merge statement is reported as: the first
    /// one it carries.
    pub fn first_of(&self, deletes: bool) -> usize {
        let flag = SqlValue::Integer(i64::from(deletes));
        self.rows
            .iter()
            .zip(&self.origin)
            .find(|(r, _)| r.last() == Some(&flag))
            .map_or(0, |(_, o)| *o)
    }
}

impl Target {
    /// Whether a [`super::Folded::Sets`] of `rows` rows (deletes and upserts)
    /// goes by `COPY` on PostgreSQL: at least [`COPY_MIN_ROWS`], and no
    /// column named like the staging table's delete flag. A call that
    /// is not folded ([`super::Folded::InOrder`]) keeps to the statements.
    pub fn wants_copy(&self, rows: usize) -> bool {
        rows >= COPY_MIN_ROWS && !self.stored.1.iter().any(|c| c == DELETE_FLAG)
    }

    /// The staging table of this table, column list and the columns'
    /// `types` (one per column): `pg_temp.sluice_stage_` and 16 hex
    /// digits of the SHA-256 of them, made by `CREATE TEMP TABLE IF NOT
    /// EXISTS … ON COMMIT DELETE ROWS AS SELECT <columns>, FALSE AS
    /// sluice_delete FROM <table> WITH NO DATA`, a column whose values go
    /// as text selected as `CAST(c AS text) AS c`.
    pub fn stage(&self, types: &[ColumnType]) -> Stage {
        let name = format!("pg_temp.{}", self.stage_name(types));
        let select: Vec<String> = self
            .columns
            .iter()
            .zip(types)
            .map(|(c, t)| match t.as_text {
                true => format!("CAST({c} AS text) AS {c}"),
                false => c.clone(),
            })
            .collect();
        let create = format!(
            "CREATE TEMP TABLE IF NOT EXISTS {name} ON COMMIT DELETE ROWS AS SELECT {}, FALSE AS {DELETE_FLAG} FROM {} WITH NO DATA",
            select.join(", "),
            self.table
        );
        let stand_in = types
            .iter()
            .map(|t| t.as_text.then(|| t.cast.clone()))
            .collect();
        Stage {
            name,
            create,
            stand_in,
        }
    }

    /// Staging column `c` (an index) of `alias` as the target column's
    /// type: `alias.c`, or `CAST(alias.c AS type)` for a `text` stand-in.
    fn staged(&self, stage: &Stage, alias: &str, c: usize) -> String {
        let name = &self.columns[c];
        match stage.stand_in.get(c).and_then(Option::as_deref) {
            Some(ty) => format!("CAST({alias}.{name} AS {ty})"),
            None => format!("{alias}.{name}"),
        }
    }

    /// The table's name and its columns' as the database stores them,
    /// for [`Target::stage`]'s type lookup.
    pub fn stored_names(&self) -> (&str, &[String]) {
        (&self.stored.0, &self.stored.1)
    }

    /// The deletes and upserts of a [`super::Folded::Sets`] (each with its index
    /// in the changes) as a [`CopyPlan`] into `stage`. A versioned
    /// target's deletes stage their version in the version column, and
    /// both merges keep to the guard ([`Target::versioned`]).
    pub fn copy_plan(
        &self,
        deletes: Vec<(usize, Vec<SqlValue>)>,
        upserts: Vec<(usize, Vec<SqlValue>)>,
        stage: Stage,
    ) -> CopyPlan {
        let s = &stage.name;
        // The staging table's own name, as the alias its columns are
        // named by.
        let alias = s.trim_start_matches("pg_temp.");
        let cols = self.columns.join(", ");
        let delete = (!deletes.is_empty()).then(|| {
            let on: Vec<String> = self
                .key
                .iter()
                .map(|&k| {
                    let staged = self.staged(&stage, alias, k);
                    format!("{}.{} = {staged}", self.table, self.columns[k])
                })
                .collect();
            let guard = self
                .version
                .as_ref()
                .and_then(|v| self.guard(&self.staged(&stage, alias, v.column), 1))
                .map(|g| format!(" AND {g}"));
            format!(
                "DELETE FROM {} USING {s} AS {alias} WHERE {alias}.{DELETE_FLAG} AND {}{}",
                self.table,
                on.join(" AND "),
                guard.unwrap_or_default()
            )
        });
        let upsert = (!upserts.is_empty()).then(|| {
            let select: Vec<String> = (0..self.columns.len())
                .map(|c| self.staged(&stage, alias, c))
                .collect();
            let guard = self
                .version_column()
                .and_then(|v| self.guard(&format!("excluded.{v}"), 1))
                .map(|g| format!(" WHERE {g}"));
            format!(
                "INSERT INTO {} ({cols}) SELECT {} FROM {s} AS {alias} WHERE NOT {alias}.{DELETE_FLAG} {}{}",
                self.table,
                select.join(", "),
                self.on_conflict(),
                guard.unwrap_or_default()
            )
        });
        let mut rows = Vec::with_capacity(deletes.len() + upserts.len());
        let mut origin = Vec::with_capacity(rows.capacity());
        for (i, mut key) in deletes {
            let mut row = vec![SqlValue::Null; self.columns.len() + 1];
            if let Some(v) = &self.version {
                row[v.column] = key.pop().unwrap_or(SqlValue::Null);
            }
            for (&k, v) in self.key.iter().zip(key) {
                row[k] = v;
            }
            row[self.columns.len()] = SqlValue::Integer(1);
            rows.push(row);
            origin.push(i);
        }
        for (i, mut row) in upserts {
            row.push(SqlValue::Integer(0));
            rows.push(row);
            origin.push(i);
        }
        let mut columns = self.columns.clone();
        columns.push(DELETE_FLAG.to_string());
        let mut stand_in = stage.stand_in.clone();
        stand_in.push(None);
        CopyPlan {
            stage,
            columns,
            stand_in,
            rows,
            origin,
            delete,
            upsert,
            params: self.tail(),
        }
    }

    /// `sluice_stage_` and 16 hex digits of the SHA-256 of the table's
    /// name, its columns' and their `types`.
    fn stage_name(&self, types: &[ColumnType]) -> String {
        let mut h = Sha256::new();
        h.update(self.table.as_bytes());
        for c in self.columns.iter().chain(types.iter().map(|t| &t.name)) {
            h.update([0]);
            h.update(c.as_bytes());
        }
        format!("sluice_stage_{}", &hex::encode(h.finalize())[..16])
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Change, Folded, fold};
    use super::*;

    fn t() -> Target {
        let n = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Target::new("t", &n(&["k", "v"]), &n(&["k"])).unwrap()
    }

    fn typed(types: &[(&str, bool)]) -> Vec<ColumnType> {
        types
            .iter()
            .map(|(name, as_text)| ColumnType {
                name: name.to_string(),
                cast: name.split('(').next().unwrap_or(name).to_string(),
                as_text: *as_text,
            })
            .collect()
    }

    fn text(s: String) -> SqlValue {
        SqlValue::Text(s)
    }

    #[test]
    fn many_rows_go_by_copy_with_deletes_first_and_their_merges() {
        let mut changes: Vec<Change> = (0..300)
            .map(|i| Change::Upsert(vec![text(format!("k{i}")), SqlValue::Integer(i)]))
            .collect();
        changes.push(Change::Delete(vec![text("k5".into())]));
        changes.push(Change::Delete(vec![text("x".into())]));
        let Folded::Sets { deletes, upserts } = fold(&t(), changes).unwrap() else {
            panic!("not folded");
        };
        assert!(t().wants_copy(deletes.len() + upserts.len()));
        let types = typed(&[("text", false), ("numeric(10,2)", true)]);
        let plan = t().copy_plan(deletes, upserts, t().stage(&types));
        let stage = &plan.stage.name;
        assert!(stage.starts_with("pg_temp.sluice_stage_") && stage.len() == 37);
        let alias = &stage["pg_temp.".len()..];
        assert_eq!(
            plan.stage.create,
            format!(
                "CREATE TEMP TABLE IF NOT EXISTS {s} ON COMMIT DELETE ROWS AS SELECT k, CAST(v AS text) AS v, FALSE AS sluice_delete FROM t WITH NO DATA",
                s = stage
            )
        );
        assert_eq!(
            plan.delete.as_deref(),
            Some(
                format!(
                    "DELETE FROM t USING {stage} AS {a} WHERE {a}.sluice_delete AND t.k = {a}.k",
                    a = alias
                )
                .as_str()
            )
        );
        assert_eq!(
            plan.upsert.as_deref(),
            Some(
                format!(
                    "INSERT INTO t (k, v) SELECT {a}.k, CAST({a}.v AS numeric) FROM {stage} AS {a} WHERE NOT {a}.sluice_delete ON CONFLICT (k) DO UPDATE SET v = excluded.v",
                    a = alias
                )
                .as_str()
            )
        );
        assert_eq!(plan.columns, vec!["k", "v", "sluice_delete"]);
        assert_eq!(plan.stand_in, [None, Some("numeric".into()), None]);
        // k5's delete was its last change: 2 deletes, 299 upserts.
        assert_eq!(plan.rows.len(), 301);
        assert_eq!(
            plan.rows[0],
            vec![text("k5".into()), SqlValue::Null, SqlValue::Integer(1)]
        );
        assert_eq!(plan.origin[..3], [300, 301, 0]);
        assert_eq!(
            plan.rows[2],
            vec![
                text("k0".into()),
                SqlValue::Integer(0),
                SqlValue::Integer(0)
            ]
        );
        assert_eq!((plan.first_of(true), plan.first_of(false)), (300, 0));
    }

    #[test]
    fn few_rows_unfolded_calls_and_a_flag_named_column_keep_to_statements() {
        let few: Vec<Change> = (0..300)
            .map(|i| Change::Upsert(vec![text(format!("k{}", i % 10)), SqlValue::Integer(i)]))
            .collect();
        let Folded::Sets { deletes, upserts } = fold(&t(), few).unwrap() else {
            panic!("not folded");
        };
        assert_eq!((deletes.len(), upserts.len()), (0, 10));
        assert!(!t().wants_copy(10));
        assert!(t().wants_copy(COPY_MIN_ROWS));
        let mixed = vec![
            Change::Upsert(vec![SqlValue::Integer(1), SqlValue::Integer(1)]),
            Change::Delete(vec![text("1".into())]),
        ];
        assert!(matches!(fold(&t(), mixed).unwrap(), Folded::InOrder(_)));
        let n = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let flagged = Target::new("t", &n(&["k", "sluice_delete"]), &n(&["k"])).unwrap();
        assert!(!flagged.wants_copy(300));
        // Another column list, or other types, is another staging table.
        let other = Target::new("t", &n(&["k"]), &n(&["k"])).unwrap();
        let types = |v: &[&str]| typed(&v.iter().map(|t| (*t, false)).collect::<Vec<_>>());
        assert_ne!(
            other.stage(&types(&["text"])),
            t().stage(&types(&["text", "bigint"]))
        );
        assert_ne!(
            t().stage(&types(&["text", "character varying(3)"])),
            t().stage(&types(&["text", "text"]))
        );
        // A key sent as text is cast where the deletes meet the table.
        let uuid = typed(&[("uuid", true), ("bigint", false)]);
        let plan = t().copy_plan(
            vec![(0, vec![text("x".into())])],
            Vec::new(),
            t().stage(&uuid),
        );
        let alias = &plan.stage.name["pg_temp.".len()..];
        assert!(
            plan.delete
                .as_deref()
                .unwrap()
                .ends_with(&format!("t.k = CAST({alias}.k AS uuid)")),
            "{:?}",
            plan.delete
        );
    }
}
