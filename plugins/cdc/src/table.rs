//! A destination table as the sink sees it: its columns (read once per
//! sink instance), how each column's values are bound, and the upsert
//! and delete statements.
//!
//! Columns come from SQLite's `pragma_table_info` or PostgreSQL's
//! `information_schema.columns` (the table in the connection's current
//! schema). Values keep their exact text and the database converts them:
//! on PostgreSQL a placeholder of a column that is neither text nor bytea
//! is written `CAST(CAST($n AS TEXT) AS type)`, on SQLite the column's
//! type affinity applies (so a `NUMERIC` column keeps 15 significant
//! digits there: give SQLite exact decimals a `TEXT` column).

use base64::Engine as _;
use sluice_guest::Error;
use sluice_guest::json::{self, RawValue};
use sluice_guest::sql::{self, Value};

use crate::change::Val;

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
    /// Integers: a JSON integer (or a string of one) within the type's
    /// range, the most it may be (`i64::MAX` for SQLite's INTEGER).
    Integer(i64),
    /// Other numbers (`numeric`, `real`, `double precision`): a JSON
    /// number, or a string of one (`NaN` and `Infinity` too).
    Number,
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
    /// PostgreSQL `varchar(n)` / `char(n)`: at most this many characters.
    pub max_chars: Option<usize>,
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
    /// The position column's index.
    position: usize,
    dialect: Dialect,
}

/// `"name"`, quoted for both dialects.
pub fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

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
        let rows = match dialect {
            Dialect::Sqlite => sql::query(
                "SELECT name, type, \"notnull\", dflt_value IS NOT NULL, NULL FROM pragma_table_info($1)",
                &[Value::from(name)],
            )?,
            Dialect::Postgres => sql::query(
                "SELECT column_name, CASE WHEN udt_schema = 'pg_catalog' THEN udt_name \
                 ELSE '\"' || udt_schema || '\".\"' || udt_name || '\"' END, \
                 CASE WHEN is_nullable = 'NO' THEN 1 ELSE 0 END, \
                 CASE WHEN column_default IS NOT NULL OR is_identity = 'YES' OR is_generated = 'ALWAYS' THEN 1 ELSE 0 END, \
                 character_maximum_length \
                 FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
                &[Value::from(name)],
            )?,
        };
        let mut columns = Vec::new();
        for row in rows.rows {
            let [Value::Text(col), ty, not_null, has_default, max_chars] = row.as_slice() else {
                return Err(Error::fatal(format!(
                    "table {name}: unexpected column description {row:?}"
                )));
            };
            let ty = match ty {
                Value::Text(t) => t.clone(),
                _ => String::new(),
            };
            columns.push(Column {
                name: col.clone(),
                kind: kind(dialect, &ty),
                not_null: truthy(not_null),
                has_default: truthy(has_default),
                cast: ty,
                max_chars: match max_chars {
                    Value::Integer(n) => usize::try_from(*n).ok(),
                    Value::Text(t) => t.parse().ok(),
                    _ => None,
                },
            });
        }
        if columns.is_empty() {
            return Ok(None);
        }
        Table::new(dialect, name, columns, position_column).map(Some)
    }

    /// The index of column `name` (exact, else ASCII case-insensitive:
    /// MySQL's column names are, and PostgreSQL folds unquoted names to
    /// lower case).
    pub fn find(&self, name: &str) -> Option<usize> {
        self.columns
            .iter()
            .position(|c| c.name == name)
            .or_else(|| {
                self.columns
                    .iter()
                    .position(|c| c.name.eq_ignore_ascii_case(name))
            })
    }

    /// The position column.
    pub fn position_column(&self) -> &Column {
        &self.columns[self.position]
    }

    /// Placeholder `$n` for column `c`, cast where the dialect needs it.
    fn placeholder(&self, c: &Column, n: usize) -> String {
        match (self.dialect, c.kind) {
            (Dialect::Sqlite, _) | (_, Kind::Binary | Kind::Text) => format!("${n}"),
            (Dialect::Postgres, _) => format!("CAST(CAST(${n} AS TEXT) AS {})", c.cast),
        }
    }

    /// `INSERT … ON CONFLICT (key) DO UPDATE … WHERE` the row's position
    /// is not newer, of `rows` rows (≥ 1) for columns `set` (indexes; the
    /// position column is added last in each row) and key columns `key`
    /// (indexes into `columns`). Placeholders run `$1…` row after row,
    /// `set.len() + 1` per row. The rows must have distinct keys
    /// (PostgreSQL refuses to update one row twice in one statement).
    pub fn upsert(&self, set: &[usize], key: &[usize], rows: usize) -> String {
        let t = &self.name;
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
            "INSERT INTO {t} ({}, {pos}) VALUES {} ON CONFLICT ({}) DO UPDATE SET {updates}{pos} = excluded.{pos} \
             WHERE {t}.{pos} IS NULL OR {t}.{pos} <= excluded.{pos}",
            names.join(", "),
            values.join(", "),
            conflict.join(", "),
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

    /// `DELETE` of the rows with key columns `key` (indexes), `rows` of
    /// them (≥ 1), each unless its stored position is newer than the
    /// change's. Placeholders per row: the key values, then the position.
    /// One row: a plain `WHERE`; more: a `WITH … (VALUES …)` list, which
    /// both SQLite (≥ 3.8.3) and PostgreSQL take.
    pub fn delete(&self, key: &[usize], rows: usize) -> String {
        let t = &self.name;
        let pos = quote(&self.position_column().name);
        let width = key.len() + 1;
        if rows <= 1 {
            let conditions: Vec<String> = key
                .iter()
                .enumerate()
                .map(|(n, &i)| {
                    let c = &self.columns[i];
                    format!("{} = {}", quote(&c.name), self.placeholder(c, n + 1))
                })
                .collect();
            return format!(
                "DELETE FROM {t} WHERE {} AND ({pos} IS NULL OR {pos} <= ${width})",
                conditions.join(" AND "),
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
             AND EXISTS (SELECT 1 FROM v WHERE {} AND ({t}.{pos} IS NULL OR {t}.{pos} <= v.pos))",
            names.join(", "),
            values.join(", "),
            matches.join(" AND "),
        )
    }

    /// The parameter for `value` in column `c`.
    ///
    /// # Errors
    /// [`Error::BadRecord`] naming the column: a binary value that is not
    /// base64, a zero date with `zero_dates=error`.
    pub fn bind(&self, c: &Column, value: &Val<'_>, zero_dates: ZeroDates) -> Result<Value, Error> {
        let raw: &RawValue = match value {
            Val::Text(t) => return self.bind_text(c, t.clone(), zero_dates),
            Val::Raw(raw) => raw,
        };
        match raw.get().as_bytes().first() {
            Some(b'n') => Ok(Value::Null),
            Some(b'"') => {
                let s = json::str_value(raw).map_err(Error::bad_record)?;
                if c.kind == Kind::Binary {
                    return base64::engine::general_purpose::STANDARD
                        .decode(s.as_bytes())
                        .map(Value::Blob)
                        .map_err(|e| {
                            Error::bad_record(format!(
                                "column {}.{}: binary value is not base64 ({e})",
                                self.name, c.name
                            ))
                        });
                }
                self.bind_text(c, s.into_owned(), zero_dates)
            }
            Some(b't' | b'f') => {
                let b = raw.get() == "true";
                if !matches!(
                    c.kind,
                    Kind::Boolean | Kind::Integer(_) | Kind::Text | Kind::Other
                ) {
                    return Err(self.misfit(c, raw.get()));
                }
                Ok(match self.dialect {
                    Dialect::Sqlite => Value::Integer(i64::from(b)),
                    Dialect::Postgres => Value::from(if b { "true" } else { "false" }),
                })
            }
            Some(b'{' | b'[')
                if matches!(
                    c.kind,
                    Kind::Integer(_) | Kind::Number | Kind::Boolean | Kind::Binary | Kind::Temporal
                ) =>
            {
                Err(self.misfit(c, raw.get()))
            }
            _ => self.checked(c, raw.get().to_string()),
        }
    }

    /// A bad record: `value` does not fit column `c`.
    fn misfit(&self, c: &Column, value: &str) -> Error {
        let shown: String = value.chars().take(60).collect();
        let ty = if c.cast.is_empty() {
            "untyped"
        } else {
            &c.cast
        };
        Error::bad_record(format!(
            "column {}.{} ({ty}) cannot take {shown}{}",
            self.name,
            c.name,
            if shown.len() < value.len() { "…" } else { "" }
        ))
    }

    /// `text` as the value of `c`, checked where the database would not
    /// (SQLite keeps text in a number column) or would only say so at
    /// the end of the part: integers in range, numbers, string lengths.
    fn checked(&self, c: &Column, text: String) -> Result<Value, Error> {
        match c.kind {
            Kind::Integer(max) => match parse_integer(&text) {
                Some(n) if n <= max && n >= -max - 1 => {}
                _ => return Err(self.misfit(c, &text)),
            },
            Kind::Number if !is_number(&text) => return Err(self.misfit(c, &text)),
            Kind::Text => {
                if let Some(max) = c.max_chars
                    && text.chars().count() > max
                {
                    return Err(Error::bad_record(format!(
                        "column {}.{} ({}) holds at most {max} characters, the value has {}",
                        self.name,
                        c.name,
                        c.cast,
                        text.chars().count()
                    )));
                }
            }
            _ => {}
        }
        Ok(Value::Text(text))
    }

    fn bind_text(&self, c: &Column, text: String, zero_dates: ZeroDates) -> Result<Value, Error> {
        if c.kind == Kind::Temporal && text.starts_with("0000-00-00") {
            return match zero_dates {
                ZeroDates::Null => Ok(Value::Null),
                ZeroDates::Error => Err(Error::bad_record(format!(
                    "column {}.{}: zero date {text:?} (zero_dates=error; zero_dates=null writes NULL)",
                    self.name, c.name
                ))),
            };
        }
        self.checked(c, text)
    }
}

/// `text` as an integer: optional sign and digits, or a number whose
/// fraction is zero (`5.0`, `5e2`) as JSON writers sometimes give.
fn parse_integer(text: &str) -> Option<i64> {
    let t = text.trim();
    if let Ok(n) = t.parse::<i64>() {
        return Some(n);
    }
    if !is_number(t) {
        return None;
    }
    let f: f64 = t.parse().ok()?;
    // Beyond 2^53 an f64 is not exact: only whole, exactly held values.
    (f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15).then_some(f as i64)
}

/// `text` is a number: JSON's grammar (sign, digits, fraction,
/// exponent; a leading `+` allowed), or `NaN` / `Infinity`.
fn is_number(text: &str) -> bool {
    let t = text.trim();
    let t = t.strip_prefix(['-', '+']).unwrap_or(t);
    if t.eq_ignore_ascii_case("nan") || t.eq_ignore_ascii_case("infinity") {
        return true;
    }
    let (mantissa, exponent) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (mantissa, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(int) || (int.is_empty() && frac.is_some_and(digits)))
        && frac.is_none_or(|f| f.is_empty() || digits(f))
        && exponent.is_none_or(|e| digits(e.strip_prefix(['-', '+']).unwrap_or(e)))
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
            "numeric" | "float4" | "float8" => Kind::Number,
            "text" | "varchar" | "bpchar" | "name" | "citext" => Kind::Text,
            "date" | "timestamp" | "timestamptz" | "time" | "timetz" => Kind::Temporal,
            "bool" => Kind::Boolean,
            _ => Kind::Other,
        },
        // SQLite's affinity rules (https://sqlite.org/datatype3.html §3.1),
        // with dates and booleans told apart for the conversions above.
        Dialect::Sqlite => {
            if t.contains("blob") || t.contains("bytea") || t.contains("binary") {
                Kind::Binary
            } else if t.contains("date") || t.contains("time") {
                Kind::Temporal
            } else if t.contains("bool") {
                Kind::Boolean
            } else if t.contains("int") {
                Kind::Integer(i64::MAX)
            } else if t.contains("char") || t.contains("clob") || t.contains("text") {
                Kind::Text
            } else if ["real", "floa", "doub", "numeric", "decimal"]
                .iter()
                .any(|w| t.contains(w))
            {
                Kind::Number
            } else {
                Kind::Other
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(dialect: Dialect) -> Table {
        let col = |name: &str, ty: &str| Column {
            name: name.into(),
            kind: kind(dialect, ty),
            not_null: false,
            has_default: false,
            cast: ty.into(),
            max_chars: None,
        };
        Table {
            name: "company".into(),
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

    #[test]
    fn postgres_statements_cast_what_is_not_text() {
        let t = table(Dialect::Postgres);
        assert_eq!(
            t.upsert(&[0, 1, 2, 3], &[0], 1),
            "INSERT INTO company (\"id\", \"name\", \"revenue\", \"logo\", \"_sluice_position\") VALUES \
             (CAST(CAST($1 AS TEXT) AS int8), $2, CAST(CAST($3 AS TEXT) AS numeric), $4, $5) \
             ON CONFLICT (\"id\") DO UPDATE SET \"name\" = excluded.\"name\", \"revenue\" = excluded.\"revenue\", \
             \"logo\" = excluded.\"logo\", \"_sluice_position\" = excluded.\"_sluice_position\" \
             WHERE company.\"_sluice_position\" IS NULL OR company.\"_sluice_position\" <= excluded.\"_sluice_position\""
        );
        assert_eq!(
            t.delete(&[0], 1),
            "DELETE FROM company WHERE \"id\" = CAST(CAST($1 AS TEXT) AS int8) AND (\"_sluice_position\" IS NULL OR \"_sluice_position\" <= $2)"
        );
    }

    #[test]
    fn many_rows_go_in_one_statement() {
        let t = table(Dialect::Sqlite);
        assert_eq!(
            t.upsert(&[0, 1], &[0], 2),
            "INSERT INTO company (\"id\", \"name\", \"_sluice_position\") VALUES ($1, $2, $3), ($4, $5, $6) \
             ON CONFLICT (\"id\") DO UPDATE SET \"name\" = excluded.\"name\", \"_sluice_position\" = excluded.\"_sluice_position\" \
             WHERE company.\"_sluice_position\" IS NULL OR company.\"_sluice_position\" <= excluded.\"_sluice_position\""
        );
        assert_eq!(
            t.delete(&[0], 2),
            "WITH v (k0, pos) AS (VALUES ($1, $2), ($3, $4)) DELETE FROM company WHERE company.\"id\" IN (SELECT k0 FROM v) \
             AND EXISTS (SELECT 1 FROM v WHERE company.\"id\" = v.k0 AND (company.\"_sluice_position\" IS NULL OR company.\"_sluice_position\" <= v.pos))"
        );
    }

    #[test]
    fn values_that_do_not_fit_their_column_are_bad_records_naming_it() {
        let mut t = table(Dialect::Postgres);
        t.columns[1].max_chars = Some(3);
        t.columns.push(Column {
            name: "small".into(),
            kind: kind(Dialect::Postgres, "int2"),
            not_null: false,
            has_default: false,
            cast: "int2".into(),
            max_chars: None,
        });
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        let b = |c: usize, v: &str| t.bind(&t.columns[c], &Val::Raw(&raw(v)), ZeroDates::Null);
        let e = b(0, r#""abc""#).unwrap_err().to_string();
        assert!(e.contains("company.id (int8) cannot take abc"), "{e}");
        assert!(b(0, "1.5").is_err());
        assert!(b(0, "[1]").is_err());
        assert_eq!(b(0, "5.0").unwrap(), Value::from("5.0"));
        assert_eq!(b(0, r#""-42""#).unwrap(), Value::from("-42"));
        assert!(b(6, "32767").is_ok() && b(6, "-32768").is_ok());
        assert!(b(6, "32768").is_err());
        assert!(b(2, r#""12.5e3""#).is_ok() && b(2, r#""NaN""#).is_ok());
        assert!(b(2, r#""12,5""#).is_err() && b(2, r#""""#).is_err());
        let e = b(1, r#""abcd""#).unwrap_err().to_string();
        assert!(
            e.contains("company.name (text) holds at most 3 characters, the value has 4"),
            "{e}"
        );
        assert!(b(1, r#""abc""#).is_ok());
        assert!(b(4, "true").is_err());
        // A boolean into a text column is its text, as before the checks.
        assert_eq!(b(1, "true").unwrap(), Value::from("true"));
    }

    #[test]
    fn values_keep_their_text_and_binary_is_decoded() {
        let t = table(Dialect::Sqlite);
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        let b = |c: usize, v: &str, z| t.bind(&t.columns[c], &Val::Raw(&raw(v)), z);
        assert_eq!(
            b(2, "999999999999.999998", ZeroDates::Null).unwrap(),
            Value::from("999999999999.999998")
        );
        assert_eq!(
            b(1, r#""a \"b\"""#, ZeroDates::Null).unwrap(),
            Value::from("a \"b\"")
        );
        assert_eq!(
            b(3, r#""AAEC""#, ZeroDates::Null).unwrap(),
            Value::Blob(vec![0, 1, 2])
        );
        assert!(
            b(3, r#""!!""#, ZeroDates::Null)
                .unwrap_err()
                .to_string()
                .contains("company.logo")
        );
        assert_eq!(
            b(4, r#""0000-00-00""#, ZeroDates::Null).unwrap(),
            Value::Null
        );
        assert!(b(4, r#""0000-00-00 00:00:00""#, ZeroDates::Error).is_err());
        assert_eq!(
            b(1, r#""0000-00-00""#, ZeroDates::Error).unwrap(),
            Value::from("0000-00-00")
        );
        assert_eq!(b(0, "true", ZeroDates::Null).unwrap(), Value::Integer(1));
        assert_eq!(
            b(1, r#"{"a":[1]}"#, ZeroDates::Null).unwrap(),
            Value::from(r#"{"a":[1]}"#)
        );
        assert_eq!(b(1, "null", ZeroDates::Null).unwrap(), Value::Null);
    }
}
