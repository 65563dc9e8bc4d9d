//! The statements the sink runs on a destination table: the multi-row
//! upsert and delete, each guarded by the ordering rule
//! ([`crate::position`]) so that a change older than its row changes
//! nothing; the unguarded one-row forms for a change applied in stream
//! order; and the query of stored positions that tells the sink which
//! changes the guard held back.

use crate::table::{Column, Dialect, Kind, Table, quote};

impl Table {
    /// Placeholder `$n` for column `c`, cast where the dialect needs it
    /// (a bit string through `varbit`: a bare `bit` is `bit(1)`).
    fn placeholder(&self, c: &Column, n: usize) -> String {
        match (self.dialect, c.kind) {
            (Dialect::Sqlite, _) | (_, Kind::Binary | Kind::Text) => format!("${n}"),
            (Dialect::Postgres, Kind::Bits) => format!("CAST(CAST(${n} AS TEXT) AS varbit)"),
            (Dialect::Postgres, _) => format!("CAST(CAST(${n} AS TEXT) AS {})", c.cast),
        }
    }

    /// `INSERT … ON CONFLICT (key) DO UPDATE … WHERE` [the guard](Self::guard)
    /// holds, of `rows` rows (≥ 1) for columns `set` (indexes; the
    /// position column is added last in each row) and key columns `key`
    /// (indexes into `columns`). Placeholders run `$1…` row after row,
    /// `set.len() + 1` per row, then the rows' position domain. The rows
    /// must have distinct keys
    /// (PostgreSQL refuses to update one row twice in one statement).
    /// Its count of changed rows is short by the rows the guard held back.
    pub fn upsert(&self, set: &[usize], key: &[usize], rows: usize) -> String {
        let (t, pos) = (&self.sql_name, quote(&self.position_column().name));
        let domain = format!("${}", rows.max(1) * (set.len() + 1) + 1);
        let guard = self.guard(&format!("{t}.{pos}"), &format!("excluded.{pos}"), &domain);
        format!("{} WHERE {guard}", self.upsert_unguarded(set, key, rows))
    }

    /// [`Self::upsert`] without the guard: for a change applied in stream
    /// order because its position and its row's cannot be compared.
    pub fn upsert_unguarded(&self, set: &[usize], key: &[usize], rows: usize) -> String {
        let t = &self.sql_name;
        let pos = quote(&self.position_column().name);
        let names: Vec<String> = set.iter().map(|&i| quote(&self.columns[i].name)).collect();
        let values = self.value_rows(set, rows.max(1));
        let updates: String = set
            .iter()
            .filter(|i| !key.contains(i))
            .map(|&i| {
                let c = quote(&self.columns[i].name);
                format!("{c} = excluded.{c}, ")
            })
            .collect();
        let conflict: Vec<String> = key.iter().map(|&i| quote(&self.columns[i].name)).collect();
        format!(
            "INSERT INTO {t} ({}, {pos}) VALUES {} ON CONFLICT ({}) DO UPDATE SET {updates}{pos} = excluded.{pos}",
            names.join(", "),
            values.join(", "),
            conflict.join(", "),
        )
    }

    /// The ordering rule ([`crate::position::compare`]) in SQL: the row's
    /// `stored` position is NULL, or of the change's domain `domain` (a
    /// parameter: the statement's changes share it) and not newer than
    /// `change`. Between the domain (a prefix of `change`) and `change`
    /// lie exactly the positions that start with the domain and are not
    /// newer, so two plain text comparisons do it.
    fn guard(&self, stored: &str, change: &str, domain: &str) -> String {
        format!("({stored} IS NULL OR ({stored} >= {domain} AND {stored} <= {change}))")
    }

    /// The stored positions of `rows` keys (key columns `key`, indexes):
    /// `SELECT i, position` for each key that has a row, `i` its 1-based
    /// number in the list. Placeholders: the key values, row after row.
    pub fn positions(&self, key: &[usize], rows: usize) -> String {
        let t = &self.sql_name;
        let pos = quote(&self.position_column().name);
        let names: Vec<String> = (0..key.len()).map(|n| format!("k{n}")).collect();
        let values: Vec<String> = (0..rows.max(1))
            .map(|row| {
                let cells: Vec<String> = key
                    .iter()
                    .enumerate()
                    .map(|(n, &i)| self.placeholder(&self.columns[i], row * key.len() + n + 1))
                    .collect();
                format!("({}, {})", row + 1, cells.join(", "))
            })
            .collect();
        let on: Vec<String> = key
            .iter()
            .zip(&names)
            .map(|(&i, k)| format!("{t}.{} = v.{k}", quote(&self.columns[i].name)))
            .collect();
        format!(
            "WITH v (i, {}) AS (VALUES {}) SELECT v.i, {t}.{pos} FROM v JOIN {t} ON {}",
            names.join(", "),
            values.join(", "),
            on.join(" AND ")
        )
    }

    /// `rows` rows of placeholders for columns `cols` (indexes) and the
    /// position after them: `($1, $2), ($3, $4)`, numbered row after row.
    fn value_rows(&self, cols: &[usize], rows: usize) -> Vec<String> {
        let width = cols.len() + 1;
        (0..rows)
            .map(|row| {
                let base = row * width;
                let mut cells: Vec<String> = cols
                    .iter()
                    .enumerate()
                    .map(|(n, &i)| self.placeholder(&self.columns[i], base + n + 1))
                    .collect();
                cells.push(format!("${}", base + width));
                format!("({})", cells.join(", "))
            })
            .collect()
    }

    /// `DELETE` of the one row with key columns `key` (indexes), whatever
    /// its position (a change applied in stream order). Placeholders:
    /// the key values.
    pub fn delete_unguarded(&self, key: &[usize]) -> String {
        format!("DELETE FROM {} WHERE {}", self.sql_name, self.key_is(key))
    }

    /// `"k1" = $1 AND "k2" = $2` for key columns `key` (indexes), cast as
    /// [`Self::placeholder`] does.
    fn key_is(&self, key: &[usize]) -> String {
        key.iter()
            .enumerate()
            .map(|(n, &i)| {
                let c = &self.columns[i];
                format!("{} = {}", quote(&c.name), self.placeholder(c, n + 1))
            })
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// `DELETE` of the rows with key columns `key` (indexes), `rows` of
    /// them (≥ 1), each where [the guard](Self::guard) holds (its count
    /// is short by the rows held back, and by keys without a row).
    /// Placeholders per row: the key values, then the position; last the
    /// rows' position domain.
    /// One row: a plain `WHERE`; more: a `WITH … (VALUES …)` list, which
    /// both SQLite (≥ 3.8.3) and PostgreSQL take.
    pub fn delete(&self, key: &[usize], rows: usize) -> String {
        let t = &self.sql_name;
        let pos = quote(&self.position_column().name);
        let width = key.len() + 1;
        if rows <= 1 {
            return format!(
                "DELETE FROM {t} WHERE {} AND {}",
                self.key_is(key),
                self.guard(&pos, &format!("${width}"), &format!("${}", width + 1))
            );
        }
        let names: Vec<String> = (0..key.len()).map(|n| format!("k{n}")).collect();
        let values = self.value_rows(key, rows);
        let columns: Vec<String> = key
            .iter()
            .map(|&i| format!("{t}.{}", quote(&self.columns[i].name)))
            .collect();
        let matches: Vec<String> = columns
            .iter()
            .zip(&names)
            .map(|(c, k)| format!("{c} = v.{k}"))
            .collect();
        // The `IN` finds the rows through the primary key; `EXISTS` alone
        // would scan the whole table, once per statement.
        let (cols, ks) = match key.len() {
            1 => (columns.join(", "), names.join(", ")),
            _ => (format!("({})", columns.join(", ")), names.join(", ")),
        };
        format!(
            "WITH v ({}, pos) AS (VALUES {}) DELETE FROM {t} WHERE {cols} IN (SELECT {ks} FROM v) \
             AND EXISTS (SELECT 1 FROM v WHERE {} AND {})",
            names.join(", "),
            values.join(", "),
            matches.join(" AND "),
            self.guard(
                &format!("{t}.{pos}"),
                "v.pos",
                &format!("${}", rows * width + 1)
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::table::{Dialect, sample};

    /// The guard of `stored` against `change` for `dialect`, as the
    /// statements write it.
    fn guard(dialect: Dialect, stored: &str, change: &str, domain: &str) -> String {
        sample(dialect).guard(stored, change, domain)
    }

    #[test]
    fn postgres_statements_cast_what_is_not_text() {
        let t = sample(Dialect::Postgres);
        let unguarded = "INSERT INTO \"company\" (\"id\", \"name\", \"revenue\", \"logo\", \"_sluice_position\") VALUES \
             (CAST(CAST($1 AS TEXT) AS int8), $2, CAST(CAST($3 AS TEXT) AS numeric), $4, $5) \
             ON CONFLICT (\"id\") DO UPDATE SET \"name\" = excluded.\"name\", \"revenue\" = excluded.\"revenue\", \
             \"logo\" = excluded.\"logo\", \"_sluice_position\" = excluded.\"_sluice_position\"";
        assert_eq!(t.upsert_unguarded(&[0, 1, 2, 3], &[0], 1), unguarded);
        let stored = "\"company\".\"_sluice_position\"";
        assert_eq!(
            t.upsert(&[0, 1, 2, 3], &[0], 1),
            format!(
                "{unguarded} WHERE {}",
                guard(
                    Dialect::Postgres,
                    stored,
                    "excluded.\"_sluice_position\"",
                    "$6"
                )
            )
        );
        assert_eq!(
            t.delete(&[0], 1),
            format!(
                "DELETE FROM \"company\" WHERE \"id\" = CAST(CAST($1 AS TEXT) AS int8) AND {}",
                guard(Dialect::Postgres, "\"_sluice_position\"", "$2", "$3")
            )
        );
        assert_eq!(
            t.delete_unguarded(&[0]),
            "DELETE FROM \"company\" WHERE \"id\" = CAST(CAST($1 AS TEXT) AS int8)"
        );
        assert_eq!(
            t.positions(&[0], 2),
            "WITH v (i, k0) AS (VALUES (1, CAST(CAST($1 AS TEXT) AS int8)), (2, CAST(CAST($2 AS TEXT) AS int8))) \
             SELECT v.i, \"company\".\"_sluice_position\" FROM v JOIN \"company\" ON \"company\".\"id\" = v.k0"
        );
        // The row's position is of the change's domain and not newer.
        assert_eq!(
            guard(Dialect::Postgres, "s", "c", "$9"),
            "(s IS NULL OR (s >= $9 AND s <= c))"
        );
    }

    #[test]
    fn many_rows_go_in_one_statement() {
        let t = sample(Dialect::Sqlite);
        let stored = "\"company\".\"_sluice_position\"";
        assert_eq!(
            t.upsert(&[0, 1], &[0], 2),
            format!(
                "INSERT INTO \"company\" (\"id\", \"name\", \"_sluice_position\") VALUES ($1, $2, $3), ($4, $5, $6) \
                 ON CONFLICT (\"id\") DO UPDATE SET \"name\" = excluded.\"name\", \"_sluice_position\" = excluded.\"_sluice_position\" \
                 WHERE {}",
                guard(
                    Dialect::Sqlite,
                    stored,
                    "excluded.\"_sluice_position\"",
                    "$7"
                )
            )
        );
        assert_eq!(
            t.delete(&[0], 2),
            format!(
                "WITH v (k0, pos) AS (VALUES ($1, $2), ($3, $4)) DELETE FROM \"company\" WHERE \"company\".\"id\" IN (SELECT k0 FROM v) \
                 AND EXISTS (SELECT 1 FROM v WHERE \"company\".\"id\" = v.k0 AND {})",
                guard(Dialect::Sqlite, stored, "v.pos", "$5")
            )
        );
    }
}
