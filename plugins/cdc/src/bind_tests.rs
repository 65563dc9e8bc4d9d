//! Unit tests of [`crate::bind`]: what each column takes, refuses and
//! rounds, per dialect.

use crate::table::{Dialect, Table, column, sample};

/// The sample table with one more column `v` of declared type `ty`
/// (and PostgreSQL's `numeric(p,s)` limits).
fn with(dialect: Dialect, ty: &str, numeric: Option<(i64, i64)>) -> Table {
    let mut t = sample(dialect);
    let mut v = column(dialect, "v", ty);
    v.numeric = numeric;
    t.columns.push(v);
    t
}

mod values {
    use super::super::*;
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

mod exactness {
    use super::super::*;

    fn with(dialect: Dialect, ty: &str, numeric: Option<(i64, i64)>) -> Table {
        super::with(dialect, ty, numeric)
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

mod ranges {
    use super::super::*;
    use crate::bound::key_bytes;
    use crate::table::sample;

    fn with(dialect: Dialect, ty: &str) -> Table {
        super::with(dialect, ty, None)
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
