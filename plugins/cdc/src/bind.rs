//! How a change's values become the parameters of a destination column:
//! checked where the database would not check (SQLite keeps text in a
//! number column), would round without a word (a decimal beyond a
//! PostgreSQL `numeric(p,s)` scale, beyond SQLite's 15 digits), or would
//! only say so at the end of a multi-row statement; each refusal is a
//! bad record naming the column and the way out. Values keep their exact
//! text (no floating point on the way) and the database converts them:
//! on PostgreSQL through the placeholder's cast
//! ([`crate::statements`]), on SQLite by the column's type affinity
//! (<https://sqlite.org/datatype3.html>).

use base64::Engine as _;
use sluice_guest::Error;
use sluice_guest::json::{self, RawValue};
use sluice_guest::sql::Value;

use crate::change::Val;
use crate::number::Decimal;
use crate::table::{Column, Dialect, Kind, Table, ZeroDates};

impl Table {
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
            Kind::Number | Kind::Float(_) if !is_number(&text) => {
                return Err(self.misfit(c, &text));
            }
            // SQLite has no NaN or Infinity: it would keep the text.
            Kind::Number | Kind::Float(_)
                if self.dialect == Dialect::Sqlite && Decimal::parse(&text).is_none() =>
            {
                return Err(Error::bad_record(format!(
                    "column {}.{} ({}) cannot take {}: SQLite has no NaN or Infinity in a number column; declare it TEXT to keep it",
                    self.name,
                    c.name,
                    c.cast,
                    shown(&text)
                )));
            }
            Kind::Number if self.dialect == Dialect::Postgres => self.fits_numeric(c, &text)?,
            Kind::Float(bits) => self.fits_float(c, &text, bits)?,
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
            && !matches!(c.kind, Kind::Text | Kind::Binary | Kind::Float(_))
        {
            return match sqlite_numeric(&text) {
                Ok(None) => Ok(Value::Text(text)),
                Ok(Some(digits)) => Ok(Value::Text(digits)),
                Err(why) => Err(Error::bad_record(format!(
                    "column {}.{} ({}) cannot hold {} exactly: SQLite keeps a number in a column of NUMERIC affinity as a 64-bit integer or a float of 15 significant digits, and {why}; declare the column TEXT to keep every digit{}",
                    self.name,
                    c.name,
                    c.cast,
                    shown(&text),
                    if text.contains(['.', 'e', 'E']) {
                        " (or REAL to accept rounding)"
                    } else {
                        ""
                    }
                ))),
            };
        }
        Ok(Value::Text(text))
    }

    /// Check number `text` against a floating-point column of `bits`
    /// mantissa bits (24: `real`/`float4`; 53: `double precision`, SQLite
    /// REAL): a fraction rounds as the type does (the column's choice), but
    /// a whole number the type cannot hold exactly — MySQL's `BIGINT
    /// UNSIGNED` 2⁶⁴−1 into a double — is refused rather than rounded.
    fn fits_float(&self, c: &Column, text: &str, bits: u32) -> Result<(), Error> {
        let Some(d) = Decimal::parse(text) else {
            return Ok(()); // NaN, Infinity: the float types have them
        };
        let why = if d.digits.is_empty() {
            return Ok(());
        } else if let Some(why) = float_range(&d, bits) {
            why
        } else if !text.contains(['.', 'e', 'E']) {
            // An integer literal (MySQL's BIGINT UNSIGNED): the round
            // trip is exact exactly when the type holds it. A number
            // written as a float rounds as floats do (the column's choice).
            #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
            let held = d.integer().is_some_and(|n| {
                if bits <= 24 {
                    (n as f32) as i128 == n
                } else {
                    (n as f64) as i128 == n
                }
            });
            if held {
                return Ok(());
            }
            format!("a floating-point type keeps {bits} bits of an integer")
        } else {
            return Ok(());
        };
        Err(Error::bad_record(format!(
            "column {}.{} ({}) cannot hold {} exactly: {why}; declare it {} to keep every digit",
            self.name,
            c.name,
            c.cast,
            shown(text),
            match self.dialect {
                Dialect::Postgres => "numeric",
                Dialect::Sqlite => "TEXT",
            }
        )))
    }

    /// The error for integer `text` outside `min..=max`, with where a
    /// wider value goes.
    fn out_of_range(&self, c: &Column, text: &str, min: i128, max: i128) -> Error {
        let wider = match self.dialect {
            Dialect::Postgres => "numeric(20) or wider",
            Dialect::Sqlite => "TEXT",
        };
        Error::bad_record(format!(
            "column {}.{} ({}) holds integers {min}..={max}, not {}; a MySQL BIGINT UNSIGNED or BIT(64) value beyond that needs a {wider} column",
            self.name,
            c.name,
            c.cast,
            shown(text)
        ))
    }

    /// Check decimal `text` against a PostgreSQL `numeric(p,s)` column:
    /// PostgreSQL would round digits beyond the scale without a word (a
    /// negative scale, PostgreSQL 15+, rounds to tens, hundreds…), and
    /// refuse a value of `p - s` or more integer digits only at the
    /// statement.
    fn fits_numeric(&self, c: &Column, text: &str) -> Result<(), Error> {
        let (Some((precision, scale)), Some(d)) = (c.numeric, Decimal::parse(text)) else {
            return Ok(());
        };
        if d.digits.is_empty() {
            return Ok(()); // zero fits every numeric
        }
        let shown = if scale >= 0 {
            format!("numeric({precision},{scale})")
        } else {
            format!("numeric({precision},{scale}), rounded to 10^{}", -scale)
        };
        // The power of ten of the last digit it keeps, and the number of
        // digits before the point (negative: zeros after the point).
        let magnitude = d.digits.len() as i64 + d.exponent;
        let why = if d.exponent < -scale {
            if scale >= 0 {
                format!(
                    "has {} digits after the point and the column keeps {scale}: PostgreSQL would round it",
                    -d.exponent
                )
            } else {
                "has digits below the column's rounding unit: PostgreSQL would round it".to_string()
            }
        } else if magnitude > precision - scale && precision > scale {
            format!(
                "has {} digits before the point and the column holds {}",
                magnitude.max(0),
                precision - scale
            )
        } else if magnitude > precision - scale {
            format!(
                "is not below 10^{}, the most the column holds",
                precision - scale
            )
        } else {
            return Ok(());
        };
        Err(Error::bad_record(format!(
            "column {}.{} ({shown}) cannot hold {} exactly: it {why}; widen the column to keep every digit",
            self.name,
            c.name,
            self::shown(text)
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

/// What SQLite does with number `text` in a column of NUMERIC (or
/// INTEGER) affinity (<https://sqlite.org/datatype3.html> §3.0): a
/// well-formed number becomes a 64-bit integer when it is a whole one that
/// fits — but it is read as a float first when written with a fraction
/// or an exponent (`9007199254740993.00` would become …992) —, else a
/// float of 15 significant digits. `Ok(None)`: bind it as it is (plain
/// digits that fit, few enough digits, or not a number: kept as text);
/// `Ok(Some(digits))`: bind these plain digits instead (the same whole
/// number); `Err(n)`: it has `n` significant digits and would be rounded.
fn sqlite_numeric(text: &str) -> Result<Option<String>, String> {
    if text.parse::<i64>().is_ok() {
        return Ok(None);
    }
    let Some(d) = Decimal::parse(text) else {
        return Ok(None);
    };
    if let Some(n) = d.integer().and_then(|n| i64::try_from(n).ok()) {
        return Ok(Some(n.to_string()));
    }
    if let Some(why) = float_range(&d, 53) {
        return Err(why);
    }
    if d.digits.len() > 15 {
        return Err(format!(
            "this one has {} significant digits",
            d.digits.len()
        ));
    }
    Ok(None)
}

/// Why a float of `bits` mantissa bits (24 or 53) cannot hold `d` at all:
/// beyond its range (it would be infinite) or below its normal range (it
/// would keep fewer digits, or become 0). `None` within the range.
fn float_range(d: &Decimal, bits: u32) -> Option<String> {
    if d.digits.is_empty() {
        return None;
    }
    // `d` lies in [10^(m-1), 10^m).
    let m = d.digits.len() as i64 + d.exponent;
    let (max, min) = if bits <= 24 { (38, -37) } else { (308, -307) };
    if m > max {
        Some(format!(
            "it is beyond a {}-bit float's range (about 1e{max})",
            if bits <= 24 { 32 } else { 64 }
        ))
    } else if m < min {
        Some(format!(
            "it is below a {}-bit float's normal range (about 1e{min})",
            if bits <= 24 { 32 } else { 64 }
        ))
    } else {
        None
    }
}

/// `text` for a message: at most 60 characters, with `…` when cut.
fn shown(text: &str) -> String {
    let cut: String = text.chars().take(60).collect();
    if cut.len() < text.len() {
        format!("{cut}…")
    } else {
        cut
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{kind, sample};

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
                && e.contains("this one has 18 significant digits; declare the column TEXT"),
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

#[cfg(test)]
mod exactness {
    use super::*;
    use crate::table::{kind, sample};

    /// `table` with one more column `v` of declared type `ty`.
    fn with(dialect: Dialect, ty: &str, numeric: Option<(i64, i64)>) -> Table {
        let mut t = sample(dialect);
        t.columns.push(Column {
            name: "v".into(),
            kind: kind(dialect, ty),
            not_null: false,
            has_default: false,
            cast: ty.into(),
            max_chars: None,
            numeric,
        });
        t
    }

    fn bind(t: &Table, v: &str) -> Result<Value, String> {
        let raw = RawValue::from_string(v.to_string()).unwrap();
        let c = t.columns.last().unwrap();
        t.bind(c, &Val::Raw(&raw), ZeroDates::Null)
            .map_err(|e| e.to_string())
    }

    /// SQLite reads a number with a fraction or an exponent as a float
    /// before it makes it an integer: whole ones go as plain digits.
    #[test]
    fn sqlite_whole_numbers_with_a_fraction_go_as_plain_digits() {
        let t = with(Dialect::Sqlite, "NUMERIC", None);
        assert_eq!(
            bind(&t, "9007199254740993.00"),
            Ok(Value::from("9007199254740993"))
        );
        assert_eq!(
            bind(&t, "9123456789123e5"),
            Ok(Value::from("912345678912300000"))
        );
        assert_eq!(
            bind(&t, "9223372036854775807.0"),
            Ok(Value::from("9223372036854775807"))
        );
        assert_eq!(bind(&t, "12.50"), Ok(Value::from("12.50")));
        let e = bind(&t, "12345678901234567.5").unwrap_err();
        assert!(e.contains("this one has 18"), "{e}");
        // No declared type: BLOB affinity keeps the text.
        let t = with(Dialect::Sqlite, "", None);
        assert_eq!(
            bind(&t, "18446744073709551615"),
            Ok(Value::from("18446744073709551615"))
        );
    }

    /// A double holds a fraction approximately (the column's choice) but
    /// refuses a whole number it cannot hold exactly.
    #[test]
    fn float_columns_refuse_integers_they_would_round() {
        for dialect in [Dialect::Sqlite, Dialect::Postgres] {
            let ty = if dialect == Dialect::Sqlite {
                "REAL"
            } else {
                "float8"
            };
            let t = with(dialect, ty, None);
            assert!(bind(&t, "0.1").is_ok());
            assert!(bind(&t, "1152921504606846976").is_ok(), "2^60 is held");
            let e = bind(&t, "18446744073709551615").unwrap_err();
            assert!(
                e.contains(
                    "cannot hold 18446744073709551615 exactly: a floating-point type keeps 53 bits"
                ),
                "{e}"
            );
        }
        let t = with(Dialect::Postgres, "float4", None);
        assert!(bind(&t, "16777216").is_ok());
        assert!(bind(&t, "16777217").unwrap_err().contains("keeps 24 bits"));
    }

    /// PostgreSQL 15's scales beyond the precision and below zero.
    #[test]
    fn postgres_numeric_with_a_negative_or_large_scale() {
        let t = with(Dialect::Postgres, "numeric", Some((5, -2)));
        assert!(bind(&t, "1234500").is_ok());
        let e = bind(&t, "123").unwrap_err();
        assert!(
            e.contains("numeric(5,-2), rounded to 10^2")
                && e.contains("below the column's rounding unit"),
            "{e}"
        );
        assert!(
            bind(&t, "123456700")
                .unwrap_err()
                .contains("has 9 digits before the point and the column holds 7")
        );
        let t = with(Dialect::Postgres, "numeric", Some((3, 5)));
        assert!(bind(&t, "0.00123").is_ok());
        assert!(bind(&t, "0").is_ok());
        let e = bind(&t, "0.0123").unwrap_err();
        assert!(
            e.contains("is not below 10^-2, the most the column holds"),
            "{e}"
        );
        assert!(bind(&t, "-0.00123").is_ok());
    }
}

#[cfg(test)]
mod ranges {
    use super::*;
    use crate::bound::key_bytes;
    use crate::table::{kind, sample};

    fn with(dialect: Dialect, ty: &str) -> Table {
        let mut t = sample(dialect);
        t.columns.push(Column {
            name: "v".into(),
            kind: kind(dialect, ty),
            not_null: false,
            has_default: false,
            cast: ty.into(),
            max_chars: None,
            numeric: None,
        });
        t
    }

    fn bind(t: &Table, v: &str) -> Result<Value, String> {
        let raw = RawValue::from_string(v.to_string()).unwrap();
        t.bind(t.columns.last().unwrap(), &Val::Raw(&raw), ZeroDates::Null)
            .map_err(|e| e.to_string())
    }

    /// Numbers beyond a double's range, or below its normal range, are
    /// refused where SQLite would store Inf or 0, and so are NaN and
    /// Infinity, which SQLite keeps as text in a number column.
    #[test]
    fn sqlite_and_float_columns_refuse_what_a_double_cannot_hold() {
        for (dialect, ty) in [
            (Dialect::Sqlite, "NUMERIC"),
            (Dialect::Sqlite, "REAL"),
            (Dialect::Postgres, "float8"),
        ] {
            let t = with(dialect, ty);
            for v in [
                "1e400",
                "1e999999999999999999",
                "1e-400",
                "123456789012345e-324",
            ] {
                assert!(bind(&t, v).unwrap_err().contains("float's"), "{ty} {v}");
            }
            assert!(bind(&t, "1e300").is_ok(), "{ty}");
            if ty != "NUMERIC" {
                // An integer literal a double cannot hold exactly; the
                // same number written as a float rounds as floats do.
                let big = format!("1{}1", "0".repeat(39));
                assert!(
                    bind(&t, &big).unwrap_err().contains("keeps 53 bits"),
                    "{ty}"
                );
                assert!(bind(&t, "1.0e40").is_ok(), "{ty}");
            }
        }
        let long = format!("1{}", "0".repeat(10_000));
        let e = bind(&with(Dialect::Sqlite, "NUMERIC"), &long).unwrap_err();
        assert!(
            e.len() < 600,
            "the value is cut in the message: {} bytes",
            e.len()
        );
        for v in [r#""NaN""#, r#""Infinity""#] {
            let e = bind(&with(Dialect::Sqlite, "NUMERIC"), v).unwrap_err();
            assert!(e.contains("SQLite has no NaN or Infinity"), "{e}");
        }
        assert!(bind(&with(Dialect::Postgres, "float8"), r#""NaN""#).is_ok());
    }

    /// Keys fold by the value the database compares: one number however
    /// it is spelled, text by its bytes.
    #[test]
    fn key_bytes_fold_numbers_by_value_and_text_by_bytes() {
        let t = sample(Dialect::Sqlite);
        let k = |col: usize, v: Value| key_bytes(&t, &[col], [v].iter());
        // Column 0 is int8, 1 text, 2 numeric.
        assert_eq!(k(0, Value::from("01")), k(0, Value::from("1")));
        assert_eq!(k(0, Value::from("+1")), k(0, Value::Integer(1)));
        assert_eq!(k(2, Value::from("1.5")), k(2, Value::from("1.50")));
        assert_ne!(k(2, Value::from("1.5")), k(2, Value::from("15")));
        assert_ne!(k(1, Value::from("01")), k(1, Value::from("1")));
    }
}
