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
use crate::number::Decimal;

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
    /// Floating point (`real`, `double precision`, `float`): a number,
    /// rounded to the type as the database does (the column's choice).
    Float,
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
    /// PostgreSQL `numeric(p,s)`: (precision, scale) in decimal digits.
    pub numeric: Option<(u64, u64)>,
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
    pub(crate) position: usize,
    pub(crate) dialect: Dialect,
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
                &[Value::from(name)],
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
            columns.push(Column {
                name: col.clone(),
                kind: kind(dialect, &ty),
                not_null: truthy(not_null),
                has_default: truthy(has_default),
                cast: ty,
                max_chars: count(max_chars).and_then(|n| usize::try_from(n).ok()),
                numeric: count(precision).zip(count(scale)),
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
                    Kind::Boolean | Kind::Integer(_) | Kind::Text | Kind::Other | Kind::Bits
                ) {
                    return Err(self.misfit(c, raw.get()));
                }
                Ok(match (self.dialect, c.kind) {
                    (Dialect::Sqlite, _) => Value::Integer(i64::from(b)),
                    (Dialect::Postgres, Kind::Bits) => Value::from(if b { "1" } else { "0" }),
                    (Dialect::Postgres, _) => Value::from(if b { "true" } else { "false" }),
                })
            }
            Some(b'{' | b'[') if !matches!(c.kind, Kind::Text | Kind::Other) => {
                Err(self.misfit(c, raw.get()))
            }
            _ if c.kind == Kind::Bits => self.bits(c, raw.get()),
            _ => self.checked(c, raw.get().to_string()),
        }
    }

    /// A JSON integer into a PostgreSQL `bit(n)` / `varbit(n)` column: its
    /// binary digits, padded to `n` (MySQL's `BIT(n)` as Maxwell prints it).
    fn bits(&self, c: &Column, text: &str) -> Result<Value, Error> {
        let n = Decimal::parse(text)
            .and_then(|d| d.integer())
            .and_then(|n| u128::try_from(n).ok())
            .ok_or_else(|| self.misfit(c, text))?;
        let width = c.max_chars.unwrap_or(0);
        let binary = format!("{n:0width$b}");
        if c.max_chars.is_some_and(|max| binary.len() > max) {
            return Err(Error::bad_record(format!(
                "column {}.{} ({}) holds {width} bits, {text} needs {}",
                self.name,
                c.name,
                c.cast,
                binary.len()
            )));
        }
        Ok(Value::Text(binary))
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
    /// (SQLite keeps text in a number column), would round (a decimal
    /// beyond the column's scale or SQLite's 15 digits) or would only
    /// say so at the end of the part: integers in range (bound as their
    /// plain digits: PostgreSQL's integer input takes no `5.0`), numbers,
    /// string lengths.
    fn checked(&self, c: &Column, text: String) -> Result<Value, Error> {
        match c.kind {
            Kind::Integer(max) => {
                // The common case, plain digits, without building a Decimal.
                if let Ok(n) = text.parse::<i64>()
                    && n <= max
                    && n >= -max - 1
                {
                    return Ok(Value::Text(text));
                }
                let (max, min) = (i128::from(max), -i128::from(max) - 1);
                return match Decimal::parse(&text).and_then(|d| d.integer()) {
                    Some(n) if (min..=max).contains(&n) => Ok(Value::Text(n.to_string())),
                    Some(_) => Err(self.out_of_range(c, &text, min, max)),
                    None => Err(self.misfit(c, &text)),
                };
            }
            Kind::Number | Kind::Float if !is_number(&text) => return Err(self.misfit(c, &text)),
            Kind::Number if self.dialect == Dialect::Postgres => self.fits_numeric(c, &text)?,
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
        if self.dialect == Dialect::Sqlite
            && !matches!(c.kind, Kind::Text | Kind::Binary | Kind::Float)
            && let Some(digits) = sqlite_would_round(&text)
        {
            return Err(Error::bad_record(format!(
                "column {}.{} ({}) cannot hold {text} exactly: SQLite keeps a number in a column of NUMERIC affinity as a 64-bit integer or a float of 15 significant digits, and this one has {digits}; declare the column TEXT to keep every digit (or REAL to accept rounding)",
                self.name, c.name, c.cast
            )));
        }
        Ok(Value::Text(text))
    }

    /// The error for integer `text` outside `min..=max`, with where a
    /// wider value goes.
    fn out_of_range(&self, c: &Column, text: &str, min: i128, max: i128) -> Error {
        let wider = match self.dialect {
            Dialect::Postgres => "numeric(20) or wider",
            Dialect::Sqlite => "TEXT",
        };
        Error::bad_record(format!(
            "column {}.{} ({}) holds integers {min}..={max}, not {text}; a MySQL BIGINT UNSIGNED or BIT(64) value beyond that needs a {wider} column",
            self.name, c.name, c.cast
        ))
    }

    /// Check decimal `text` against a PostgreSQL `numeric(p,s)` column:
    /// PostgreSQL would round digits beyond the scale without a word, and
    /// refuse more integer digits than `p - s` only at the statement.
    fn fits_numeric(&self, c: &Column, text: &str) -> Result<(), Error> {
        let (Some((precision, scale)), Some(d)) = (c.numeric, Decimal::parse(text)) else {
            return Ok(());
        };
        let why = if d.fraction_digits() > scale {
            format!(
                "has {} digits after the point and the column keeps {scale}: PostgreSQL would round it",
                d.fraction_digits()
            )
        } else if d.integer_digits() > precision.saturating_sub(scale) {
            format!(
                "has {} digits before the point and the column holds {}",
                d.integer_digits(),
                precision.saturating_sub(scale)
            )
        } else {
            return Ok(());
        };
        Err(Error::bad_record(format!(
            "column {}.{} (numeric({precision},{scale})) cannot hold {text} exactly: it {why}; widen the column to keep every digit",
            self.name, c.name
        )))
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

/// The significant digits of number `text` when SQLite would round it
/// in a column of NUMERIC (or INTEGER) affinity: a number literal becomes
/// a 64-bit integer when it is a whole one that fits, else a float that
/// keeps 15 significant digits (<https://sqlite.org/datatype3.html> §3).
/// `None`: it is kept exactly, or is not a number (then stored as text).
fn sqlite_would_round(text: &str) -> Option<usize> {
    if text.len() <= 15 {
        return None; // at most 15 digits
    }
    let d = Decimal::parse(text)?;
    let whole = d.integer().is_some_and(|n| i64::try_from(n).is_ok());
    (!whole && d.digits.len() > 15).then_some(d.digits.len())
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

/// A non-negative count from the catalog (an integer, or its text).
fn count(v: &Value) -> Option<u64> {
    match v {
        Value::Integer(n) => u64::try_from(*n).ok(),
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
            "numeric" => Kind::Number,
            "float4" | "float8" => Kind::Float,
            "bit" | "varbit" => Kind::Bits,
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
            } else if ["real", "floa", "doub"].iter().any(|w| t.contains(w)) {
                Kind::Float
            } else if t.contains("numeric") || t.contains("decimal") {
                Kind::Number
            } else {
                Kind::Other
            }
        }
    }
}

/// A sample table (id int8, name text, revenue numeric, logo bytea,
/// founded date, the position column) for unit tests.
#[cfg(test)]
pub(crate) fn sample(dialect: Dialect) -> Table {
    let col = |name: &str, ty: &str| Column {
        name: name.into(),
        kind: kind(dialect, ty),
        not_null: false,
        has_default: false,
        cast: ty.into(),
        max_chars: None,
        numeric: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn table(dialect: Dialect) -> Table {
        sample(dialect)
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
            numeric: None,
        });
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        let b = |c: usize, v: &str| t.bind(&t.columns[c], &Val::Raw(&raw(v)), ZeroDates::Null);
        let e = b(0, r#""abc""#).unwrap_err().to_string();
        assert!(e.contains("company.id (int8) cannot take abc"), "{e}");
        assert!(b(0, "1.5").is_err());
        assert!(b(0, "[1]").is_err());
        // Whole numbers go as their digits (PostgreSQL's int8 input
        // refuses `5.0`); no float on the way, so 2^53 + 1 stays exact.
        assert_eq!(b(0, "5.0").unwrap(), Value::from("5"));
        assert_eq!(b(0, "5e2").unwrap(), Value::from("500"));
        assert_eq!(
            b(0, "9007199254740993").unwrap(),
            Value::from("9007199254740993")
        );
        let e = b(0, "18446744073709551615").unwrap_err().to_string();
        assert!(
            e.contains("holds integers -9223372036854775808..=9223372036854775807, not 18446744073709551615")
                && e.contains("needs a numeric(20) or wider column"),
            "{e}"
        );
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

    /// PostgreSQL `numeric(p,s)` takes every digit it can hold and a
    /// value it would round is refused; `bit(n)` gets an integer's bits.
    #[test]
    fn postgres_numeric_scale_and_bits_are_kept_exactly() {
        let mut t = table(Dialect::Postgres);
        t.columns[2].numeric = Some((20, 6));
        t.columns.push(Column {
            name: "flags".into(),
            kind: kind(Dialect::Postgres, "bit"),
            not_null: false,
            has_default: false,
            cast: "bit".into(),
            max_chars: Some(64),
            numeric: None,
        });
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        let b = |c: usize, v: &str| t.bind(&t.columns[c], &Val::Raw(&raw(v)), ZeroDates::Null);
        assert_eq!(
            b(2, "99999999999999.999998").unwrap(),
            Value::from("99999999999999.999998")
        );
        let e = b(2, "1.0000001").unwrap_err().to_string();
        assert!(
            e.contains("(numeric(20,6)) cannot hold 1.0000001 exactly: it has 7 digits after the point and the column keeps 6"),
            "{e}"
        );
        let e = b(2, "123456789012345").unwrap_err().to_string();
        assert!(
            e.contains("has 15 digits before the point and the column holds 14"),
            "{e}"
        );
        assert!(b(2, "1.500000000").is_ok(), "trailing zeros are not digits");
        assert_eq!(
            b(6, "18446744073709551615").unwrap(),
            Value::from("1".repeat(64))
        );
        assert_eq!(
            b(6, "5").unwrap(),
            Value::from(format!("{}101", "0".repeat(61)))
        );
        assert_eq!(b(6, r#""0101""#).unwrap(), Value::from("0101"));
        assert_eq!(b(6, "true").unwrap(), Value::from("1"));
        assert!(b(6, "-1").is_err() && b(6, "36893488147419103232").is_err());
    }

    #[test]
    fn values_keep_their_text_and_binary_is_decoded() {
        let t = table(Dialect::Sqlite);
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        let b = |c: usize, v: &str, z| t.bind(&t.columns[c], &Val::Raw(&raw(v)), z);
        // SQLite's NUMERIC affinity would keep 15 digits: refused, naming
        // the way out; 15 digits and whole 64-bit integers are kept.
        let e = b(2, "999999999999.999998", ZeroDates::Null)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot hold 999999999999.999998 exactly")
                && e.contains("this one has 18; declare the column TEXT"),
            "{e}"
        );
        assert!(b(2, "99999999999.9999", ZeroDates::Null).is_ok());
        assert!(b(2, "9223372036854775807", ZeroDates::Null).is_ok());
        assert!(b(2, "9223372036854775808", ZeroDates::Null).is_err());
        assert!(b(1, "9223372036854775808", ZeroDates::Null).is_ok());
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
