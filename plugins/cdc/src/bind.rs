//! How a change's values become the parameters of a destination column:
//! checked where the database would not check (SQLite keeps text in a
//! number column), would round without a word (a decimal beyond a
//! PostgreSQL `numeric(p,s)` scale, beyond SQLite's 15 digits), or would
//! only say so at the end of a multi-row statement; each refusal is a
//! bad record naming the column and the way out. Values keep their exact
//! text (no floating point on the way) and the database converts them:
//! on PostgreSQL by the column type's input function (the host sends
//! text to a type it has no binary form for, docs/plugins.md), on SQLite
//! by the column's type affinity (<https://sqlite.org/datatype3.html>).

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
    t.eq_ignore_ascii_case("nan")
        || t.eq_ignore_ascii_case("infinity")
        || Decimal::parse(t).is_some()
}

#[cfg(test)]
#[path = "bind_tests.rs"]
mod tests;
