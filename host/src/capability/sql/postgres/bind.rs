//! How a [`SqlValue`] reaches a PostgreSQL parameter (or a binary `COPY`
//! field) of the type the server inferred for it.
//!
//! Integers, floats, booleans, `bytea`, `jsonb` and the text types are
//! encoded in PostgreSQL's binary format, checked here (text "12" into an
//! `int8` is parsed by the host). A parameter of any other type —
//! `numeric`, dates and times, `uuid`, `inet`, bit strings, arrays, enums,
//! domains — is sent in the text format (the extended protocol's
//! per-parameter format code, `Bind` message), so the server reads the
//! value with the type's own input function, exactly as if the statement
//! had cast text to it: `"12.50"` into a `numeric(10,2)`, `"2024-03-01
//! 10:00:00.123456"` into a `timestamp`. Integers and reals go there as
//! their decimal text; a blob is refused (it has no text form).
//!
//! The bulk path's `COPY` form stages columns of those types as `text`
//! ([`binds_in_binary`] decides which) and writes their values as
//! [`Field`]s, so the statements and `COPY` take and refuse the same
//! values.

use std::borrow::Cow;
use std::error::Error as StdError;

use tokio_postgres::types::private::BytesMut;
use tokio_postgres::types::{Format, IsNull, ToSql, Type, to_sql_checked};

use super::super::SqlValue;

type BoxError = Box<dyn StdError + Sync + Send>;

/// A value the host cannot bind to its parameter's type: a data
/// exception (SQLSTATE class 22: `22P02` text that does not read as the
/// type, `22003` a number out of its range, `42804` a value of a kind
/// the type never takes), as the server would report it, so it is never
/// taken for a lost connection.
#[derive(Debug)]
pub struct Refused {
    /// The SQLSTATE the host reports.
    pub code: &'static str,
    /// What was refused, for people.
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for Refused {}

fn invalid(t: &str, ty: &Type) -> BoxError {
    Box::new(Refused {
        code: "22P02",
        message: format!("invalid input syntax for type {ty}: \"{t}\""),
    })
}

fn out_of_range(n: impl std::fmt::Display, ty: &Type) -> BoxError {
    Box::new(Refused {
        code: "22003",
        message: format!("value {n} is out of range for type {ty}"),
    })
}

/// Whether the host encodes values for a parameter of type `ty` in
/// PostgreSQL's binary format; any other type gets the text format.
pub fn binds_in_binary(ty: &Type) -> bool {
    text_like(ty)
        || matches!(
            *ty,
            Type::INT2
                | Type::INT4
                | Type::INT8
                | Type::FLOAT4
                | Type::FLOAT8
                | Type::BOOL
                | Type::BYTEA
                | Type::JSONB
        )
}

/// Types whose binary format is their text (UTF-8 bytes).
fn text_like(ty: &Type) -> bool {
    matches!(
        *ty,
        Type::TEXT
            | Type::VARCHAR
            | Type::BPCHAR
            | Type::NAME
            | Type::UNKNOWN
            | Type::JSON
            | Type::XML
    )
}

/// The text `v` is sent as to a parameter of a type without a binary
/// encoder here: `None` for NULL, decimal text for numbers.
///
/// # Errors
/// A blob, which has no text form, naming the parameter's type `ty`.
pub fn text_form<'a>(v: &'a SqlValue, ty: &str) -> Result<Option<Cow<'a, str>>, String> {
    Ok(Some(match v {
        SqlValue::Null => return Ok(None),
        SqlValue::Integer(n) => Cow::Owned(n.to_string()),
        SqlValue::Real(r) => Cow::Owned(r.to_string()),
        SqlValue::Text(t) => Cow::Borrowed(t.as_str()),
        SqlValue::Blob(_) => {
            return Err(format!(
                "the sql capability cannot bind a blob to a parameter of type {ty}; bind it as text, or to a bytea column"
            ));
        }
    }))
}

fn refuse(what: &str, ty: &Type) -> BoxError {
    Box::new(Refused {
        code: "42804",
        message: format!(
            "the sql capability cannot bind {what} to a parameter of type {ty}; bind it as text, or write the placeholder as `CAST($n AS TEXT)` and convert in SQL"
        ),
    })
}

/// [`text_form`]'s refusal as a [`Refused`].
fn text_of<'a>(v: &'a SqlValue, ty: &str) -> Result<Option<Cow<'a, str>>, BoxError> {
    text_form(v, ty).map_err(|message| -> BoxError {
        Box::new(Refused {
            code: "42804",
            message,
        })
    })
}

/// `t` as an integer of type `I`: out of its range (digits only) or not
/// an integer, refused as the server would.
fn integer<I: std::str::FromStr>(t: &str, ty: &Type) -> Result<I, BoxError> {
    t.parse::<I>().map_err(|_| {
        let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
        match !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            true => out_of_range(t, ty),
            false => invalid(t, ty),
        }
    })
}

/// `t` as PostgreSQL's `boolin` reads it: `t`, `true`, `yes`, `on`, `1`
/// and their opposites, in any case, with blanks around.
fn boolean(t: &str) -> Result<bool, BoxError> {
    match t.trim().to_ascii_lowercase().as_str() {
        "t" | "true" | "y" | "yes" | "on" | "1" => Ok(true),
        "f" | "false" | "n" | "no" | "off" | "0" => Ok(false),
        _ => Err(invalid(t, &Type::BOOL)),
    }
}

/// `bytes` with jsonb's binary format version byte (1) before them.
fn jsonb(bytes: &[u8], out: &mut BytesMut) -> IsNull {
    out.extend_from_slice(&[1]);
    out.extend_from_slice(bytes);
    IsNull::No
}

fn raw(bytes: &[u8], out: &mut BytesMut) -> IsNull {
    out.extend_from_slice(bytes);
    IsNull::No
}

/// Binds a [`SqlValue`] to whatever type the server inferred for the
/// placeholder (see the module's rules).
impl ToSql for SqlValue {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        if !binds_in_binary(ty) {
            return Ok(match text_of(self, &ty.to_string())? {
                Some(text) => raw(text.as_bytes(), out),
                None => IsNull::Yes,
            });
        }
        match self {
            SqlValue::Null => Ok(IsNull::Yes),
            SqlValue::Integer(n) => match *ty {
                Type::INT2 => i16::try_from(*n)
                    .map_err(|_| out_of_range(n, ty))?
                    .to_sql(ty, out),
                Type::INT4 => i32::try_from(*n)
                    .map_err(|_| out_of_range(n, ty))?
                    .to_sql(ty, out),
                Type::INT8 => n.to_sql(ty, out),
                Type::FLOAT4 => (*n as f32).to_sql(ty, out),
                Type::FLOAT8 => (*n as f64).to_sql(ty, out),
                Type::BOOL => (*n != 0).to_sql(ty, out),
                Type::JSONB => Ok(jsonb(n.to_string().as_bytes(), out)),
                _ if text_like(ty) => Ok(raw(n.to_string().as_bytes(), out)),
                _ => Err(refuse("an integer", ty)),
            },
            SqlValue::Real(r) => match *ty {
                Type::FLOAT4 => (*r as f32).to_sql(ty, out),
                Type::FLOAT8 => r.to_sql(ty, out),
                _ if text_like(ty) => Ok(raw(r.to_string().as_bytes(), out)),
                _ => Err(refuse("a real", ty)),
            },
            SqlValue::Text(t) => match *ty {
                Type::INT2 => integer::<i16>(t, ty)?.to_sql(ty, out),
                Type::INT4 => integer::<i32>(t, ty)?.to_sql(ty, out),
                Type::INT8 => integer::<i64>(t, ty)?.to_sql(ty, out),
                Type::FLOAT4 => t
                    .parse::<f32>()
                    .map_err(|_| invalid(t, ty))?
                    .to_sql(ty, out),
                Type::FLOAT8 => t
                    .parse::<f64>()
                    .map_err(|_| invalid(t, ty))?
                    .to_sql(ty, out),
                Type::BOOL => boolean(t)?.to_sql(ty, out),
                Type::BYTEA => t.as_bytes().to_sql(ty, out),
                Type::JSONB => Ok(jsonb(t.as_bytes(), out)),
                _ => Ok(raw(t.as_bytes(), out)),
            },
            SqlValue::Blob(b) => match *ty {
                Type::BYTEA => b.as_slice().to_sql(ty, out),
                Type::JSONB => Ok(jsonb(b, out)),
                _ if text_like(ty) => Ok(raw(b, out)),
                _ => Err(refuse("a blob", ty)),
            },
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, ty: &Type) -> Format {
        if binds_in_binary(ty) {
            Format::Binary
        } else {
            Format::Text
        }
    }

    to_sql_checked!();
}

/// One field of a binary `COPY` row: a value encoded for its column's
/// type as a parameter of that type, or, in a `text` staging column that
/// stands in for a target column of type `stand_in` (a type
/// [`binds_in_binary`] does not take), its [`text_form`], so `COPY`
/// refuses what a parameter of that type would.
#[derive(Debug)]
pub struct Field<'a> {
    /// The value.
    pub value: &'a SqlValue,
    /// The target column's type when the staging column is its `text`
    /// stand-in (as `format_type` names it).
    pub stand_in: Option<&'a str>,
}

impl ToSql for Field<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        let Some(stand_in) = self.stand_in else {
            return self.value.to_sql(ty, out);
        };
        Ok(match text_of(self.value, stand_in)? {
            Some(text) => raw(text.as_bytes(), out),
            None => IsNull::Yes,
        })
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(v: &SqlValue, ty: &Type) -> Result<(Format, Option<Vec<u8>>), String> {
        let mut out = BytesMut::new();
        match v.to_sql(ty, &mut out).map_err(|e| e.to_string())? {
            IsNull::Yes => Ok((v.encode_format(ty), None)),
            IsNull::No => Ok((v.encode_format(ty), Some(out.to_vec()))),
        }
    }

    #[test]
    fn types_without_a_binary_encoder_get_the_value_as_text() {
        for ty in [
            Type::NUMERIC,
            Type::TIMESTAMP,
            Type::UUID,
            Type::BIT,
            Type::DATE,
        ] {
            let (format, bytes) = bind(&SqlValue::Text("12.50".into()), &ty).unwrap();
            assert!(matches!(format, Format::Text), "{ty}");
            assert_eq!(bytes.as_deref(), Some(&b"12.50"[..]));
            let (_, bytes) = bind(&SqlValue::Integer(-7), &ty).unwrap();
            assert_eq!(bytes.as_deref(), Some(&b"-7"[..]));
            let (_, bytes) = bind(&SqlValue::Real(0.25), &ty).unwrap();
            assert_eq!(bytes.as_deref(), Some(&b"0.25"[..]));
            assert_eq!(bind(&SqlValue::Null, &ty).unwrap().1, None);
            let err = bind(&SqlValue::Blob(vec![1]), &ty).unwrap_err();
            assert!(err.contains("cannot bind a blob"), "{err}");
        }
    }

    #[test]
    fn binary_types_are_checked_by_the_host() {
        let (format, bytes) = bind(&SqlValue::Text("12".into()), &Type::INT8).unwrap();
        assert!(matches!(format, Format::Binary));
        assert_eq!(bytes.unwrap(), 12i64.to_be_bytes());
        assert!(bind(&SqlValue::Text("12.5".into()), &Type::INT8).is_err());
        let yes = bind(&SqlValue::Text(" Yes".into()), &Type::BOOL).unwrap().1;
        assert_eq!(yes.unwrap(), [1]);
        assert!(bind(&SqlValue::Text("maybe".into()), &Type::BOOL).is_err());
        assert!(bind(&SqlValue::Real(1.5), &Type::INT4).is_err());
        assert!(bind(&SqlValue::Blob(vec![0; 8]), &Type::INT8).is_err());
        assert_eq!(
            bind(&SqlValue::Integer(5), &Type::JSONB)
                .unwrap()
                .1
                .unwrap(),
            b"\x015"
        );
        assert_eq!(
            bind(&SqlValue::Blob(b"ab".to_vec()), &Type::TEXT)
                .unwrap()
                .1
                .unwrap(),
            b"ab"
        );
    }

    #[test]
    fn a_staged_text_column_takes_what_its_target_type_would() {
        let mut out = BytesMut::new();
        let v = SqlValue::Integer(3);
        let t = Field {
            value: &v,
            stand_in: Some("numeric"),
        };
        assert!(matches!(t.to_sql(&Type::TEXT, &mut out), Ok(IsNull::No)));
        assert_eq!(&out[..], b"3");
        let blob = SqlValue::Blob(vec![1]);
        let t = Field {
            value: &blob,
            stand_in: Some("numeric"),
        };
        let err = match t.to_sql(&Type::TEXT, &mut out) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a blob went into a numeric stand-in"),
        };
        assert!(err.contains("type numeric"), "{err}");
    }
}
