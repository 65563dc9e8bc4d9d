//! A destination table as the sink sees it: its columns (read once per
//! sink instance) and how each is bound ([`Kind`]). How a change's values
//! become parameters is in [`crate::bind`], how they reach the table in
//! [`crate::bound::apply_chunk`].
//!
//! Columns come from SQLite's `pragma_table_info` or PostgreSQL's
//! `information_schema.columns` (the table in the connection's current
//! schema), with PostgreSQL's `numeric(p,s)` and `varchar(n)`/`bit(n)`
//! limits.

use sluice_guest::Error;
use sluice_guest::sql::{self, Value};

/// The database the sink writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

/// How a column's values are bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Text types: bound as text, as is.
    Text,
    /// `BLOB` / `bytea`: JSON strings are base64 and bound as bytes.
    Binary,
    /// Dates and times: MySQL zero dates follow `zero_dates`.
    Temporal,
    /// Booleans: JSON `true`/`false`.
    Boolean,
    /// Integers: a JSON integer (or a string of one, or a number whose
    /// fraction is zero) within the type's range, the most it may be
    /// (`i64::MAX` for SQLite's INTEGER).
    Integer(i64),
    /// Exact decimals (`numeric`, `decimal`): a JSON number, or a string
    /// of one (`NaN` and `Infinity` too), that the column holds without
    /// rounding (PostgreSQL: within `numeric(p,s)`; SQLite: see
    /// [`sqlite_keeps`]).
    Number,
    /// Floating point of this many mantissa bits (`real`: 24; `double
    /// precision`, `float`, SQLite's REAL: 53): a number, its fraction
    /// rounded to the type as the database does (the column's choice); a
    /// whole number the type cannot hold exactly is refused.
    Float(u32),
    /// PostgreSQL `bit(n)` / `varbit(n)`: a JSON integer (Maxwell's `BIT`)
    /// is written as its `n` binary digits; a string passes as it is.
    Bits,
    /// Anything else (numbers, JSON, UUIDs, enums, arrays): the JSON
    /// text, converted by the database.
    Other,
}

/// One column of a destination table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Its name, as the database reports it.
    pub name: String,
    /// How values are bound.
    pub kind: Kind,
    /// `NOT NULL`.
    pub not_null: bool,
    /// It has a default (an insert may leave it out).
    pub has_default: bool,
    /// PostgreSQL: the type to cast text into (`numeric`, `"s"."mood"`).
    pub cast: String,
    /// PostgreSQL `varchar(n)` / `char(n)`: at most this many characters;
    /// `bit(n)` / `varbit(n)`: at most this many bits.
    pub max_chars: Option<usize>,
    /// PostgreSQL `numeric(p,s)`: (precision, scale) in decimal digits
    /// (a scale may be negative or above the precision, PostgreSQL 15+).
    pub numeric: Option<(i64, i64)>,
}

/// What to do with MySQL's zero dates (`0000-00-00…`) in date and time
/// columns (`zero_dates` config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroDates {
    /// Write NULL (default).
    Null,
    /// The change is a bad record.
    Error,
}

/// A destination table.
#[derive(Debug, Clone)]
pub struct Table {
    /// Its name (a plain identifier).
    pub name: String,
    /// Its columns, in table order.
    pub columns: Vec<Column>,
    /// Its name as the statements write it: quoted, as the database
    /// spells it (a reserved word, or PostgreSQL's mixed case).
    pub sql_name: String,
    /// The position column's index.
    pub(crate) position: usize,
    pub(crate) dialect: Dialect,
}

/// `"name"`, quoted for both dialects (the SDK's rule).
pub use sluice_guest::sql::quoted as quote;

impl Table {
    /// The table `name` of `columns`.
    ///
    /// # Errors
    /// [`Error::Fatal`]: no column is `position_column`.
    pub fn new(
        dialect: Dialect,
        name: &str,
        columns: Vec<Column>,
        position_column: &str,
    ) -> Result<Table, Error> {
        let position = columns
            .iter()
            .position(|c| c.name == position_column)
            .ok_or_else(|| {
                Error::fatal(format!(
                    "table {name} has no column {position_column}, where the cdc plugin keeps each row's source position: ALTER TABLE {name} ADD COLUMN {position_column} TEXT"
                ))
            })?;
        Ok(Table {
            name: name.to_string(),
            sql_name: quote(name),
            columns,
            position,
            dialect,
        })
    }

    /// The error for a destination table `name` that does not exist.
    pub fn missing(dialect: Dialect, name: &str) -> Error {
        Error::fatal(format!(
            "destination table {name} does not exist{}: create it (the cdc plugin fills tables, it does not create them; --config create=print logs the CREATE TABLE it would need)",
            if dialect == Dialect::Postgres {
                " in the connection's current schema"
            } else {
                ""
            }
        ))
    }

    /// Read `name`'s columns from the database; `None` when it has no
    /// table of that name.
    ///
    /// # Errors
    /// [`Error::Fatal`]: the table has no `position_column`; the
    /// database's error.
    pub fn load(
        dialect: Dialect,
        name: &str,
        position_column: &str,
    ) -> Result<Option<Table>, Error> {
        // PostgreSQL: the table as created — `name`, else the one table
        // whose name equals it ignoring case (an unquoted `Mixed` was
        // created as `mixed`; a quoted one kept its case).
        let actual = match dialect {
            Dialect::Sqlite => name.to_string(),
            Dialect::Postgres => {
                let found = sql::query(
                    "SELECT table_name::text FROM information_schema.tables \
                     WHERE table_schema = current_schema() AND lower(table_name) = lower($1)",
                    &[Value::from(name)],
                )?;
                let names: Vec<String> = found
                    .rows
                    .into_iter()
                    .filter_map(|r| match r.into_iter().next() {
                        Some(Value::Text(t)) => Some(t),
                        _ => None,
                    })
                    .collect();
                match names.iter().find(|n| *n == name) {
                    Some(n) => n.clone(),
                    None if names.len() == 1 => names[0].clone(),
                    None => name.to_string(),
                }
            }
        };
        let rows = match dialect {
            Dialect::Sqlite => sql::query(
                "SELECT name, type, \"notnull\", dflt_value IS NOT NULL, NULL, NULL, NULL FROM pragma_table_info($1)",
                &[Value::from(name)],
            )?,
            Dialect::Postgres => sql::query(
                "SELECT column_name, CASE WHEN udt_schema = 'pg_catalog' THEN udt_name \
                 ELSE '\"' || udt_schema || '\".\"' || udt_name || '\"' END, \
                 CASE WHEN is_nullable = 'NO' THEN 1 ELSE 0 END, \
                 CASE WHEN column_default IS NOT NULL OR is_identity = 'YES' OR is_generated = 'ALWAYS' THEN 1 ELSE 0 END, \
                 character_maximum_length, numeric_precision, numeric_scale \
                 FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
                &[Value::from(actual.as_str())],
            )?,
        };
        let mut columns = Vec::new();
        for row in rows.rows {
            let [
                Value::Text(col),
                ty,
                not_null,
                has_default,
                max_chars,
                precision,
                scale,
            ] = row.as_slice()
            else {
                return Err(Error::fatal(format!(
                    "table {name}: unexpected column description {row:?}"
                )));
            };
            let ty = match ty {
                Value::Text(t) => t.clone(),
                _ => String::new(),
            };
            let money = dialect == Dialect::Postgres && ty == "money";
            columns.push(Column {
                name: col.clone(),
                kind: kind(dialect, &ty),
                not_null: truthy(not_null),
                has_default: truthy(has_default),
                cast: ty,
                max_chars: count(max_chars).and_then(|n| usize::try_from(n).ok()),
                // PostgreSQL's money keeps 2 decimals (lc_monetary's, in
                // the usual locales) and rounds the rest: checked as a
                // numeric(19,2).
                numeric: if money {
                    Some((19, 2))
                } else {
                    integer(precision).zip(integer(scale))
                },
            });
        }
        if columns.is_empty() {
            return Ok(None);
        }
        let mut table = Table::new(dialect, name, columns, position_column)?;
        table.sql_name = quote(&actual);
        Ok(Some(table))
    }

    /// The index of column `name`: exact, else the one column whose name
    /// equals it ignoring ASCII case (MySQL's column names ignore case,
    /// and PostgreSQL folds unquoted names to lower case); two that
    /// differ only in case are ambiguous and match neither (the same rule
    /// as [`crate::change::find`]).
    pub fn find(&self, name: &str) -> Option<usize> {
        crate::change::find_name(self.columns.iter().map(|c| c.name.as_str()), name)
    }

    /// The position column.
    pub fn position_column(&self) -> &Column {
        &self.columns[self.position]
    }
}

/// A non-negative count from the catalog (an integer, or its text).
fn count(v: &Value) -> Option<u64> {
    integer(v).and_then(|n| u64::try_from(n).ok())
}

/// An integer from the catalog (an integer, or its text).
fn integer(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(n) => Some(*n),
        Value::Text(t) => t.parse().ok(),
        _ => None,
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Integer(n) => *n != 0,
        Value::Text(t) => t == "1" || t.eq_ignore_ascii_case("true"),
        _ => false,
    }
}

/// The binding of a column of declared type `ty`.
pub fn kind(dialect: Dialect, ty: &str) -> Kind {
    let t = ty.to_ascii_lowercase();
    match dialect {
        Dialect::Postgres => match t.as_str() {
            "bytea" => Kind::Binary,
            "int2" => Kind::Integer(i64::from(i16::MAX)),
            "int4" => Kind::Integer(i64::from(i32::MAX)),
            "int8" => Kind::Integer(i64::MAX),
            "numeric" | "money" => Kind::Number,
            "float4" => Kind::Float(24),
            "float8" => Kind::Float(53),
            "bit" | "varbit" => Kind::Bits,
            "text" | "varchar" | "bpchar" | "name" | "citext" => Kind::Text,
            "date" | "timestamp" | "timestamptz" | "time" | "timetz" => Kind::Temporal,
            "bool" => Kind::Boolean,
            _ => Kind::Other,
        },
        // SQLite's affinity rules (https://sqlite.org/datatype3.html §3.1),
        // with dates and booleans told apart for the conversions above.
        Dialect::Sqlite => {
            if t.trim().is_empty() {
                // No declared type: BLOB affinity keeps the bound text as
                // it is, like a TEXT column.
                Kind::Text
            } else if t.contains("blob") || t.contains("bytea") || t.contains("binary") {
                Kind::Binary
            } else if t.contains("date") || t.contains("time") {
                Kind::Temporal
            } else if t.contains("bool") {
                Kind::Boolean
            } else if t.contains("int") {
                Kind::Integer(i64::MAX)
            } else if t.contains("char") || t.contains("clob") || t.contains("text") {
                Kind::Text
            } else if ["real", "floa", "doub"].iter().any(|w| t.contains(w)) {
                Kind::Float(53)
            } else if t.contains("numeric") || t.contains("decimal") {
                Kind::Number
            } else {
                Kind::Other
            }
        }
    }
}

/// A nullable column `name` of declared type `ty`, for unit tests.
#[cfg(test)]
pub(crate) fn column(dialect: Dialect, name: &str, ty: &str) -> Column {
    Column {
        name: name.into(),
        kind: kind(dialect, ty),
        not_null: false,
        has_default: false,
        cast: ty.into(),
        max_chars: None,
        numeric: None,
    }
}

/// A sample table (id int8, name text, revenue numeric, logo bytea,
/// founded date, the position column) for unit tests.
#[cfg(test)]
pub(crate) fn sample(dialect: Dialect) -> Table {
    let col = |name: &str, ty: &str| column(dialect, name, ty);
    Table {
        name: "company".into(),
        sql_name: quote("company"),
        columns: vec![
            col("id", "int8"),
            col("name", "text"),
            col("revenue", "numeric"),
            col("logo", "bytea"),
            col("founded", "date"),
            col("_sluice_position", "text"),
        ],
        position: 5,
        dialect,
    }
}
