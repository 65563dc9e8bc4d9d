//! Debezium's encoded values, decoded into SQL text by the field's logical
//! type (the `name` in the JSON converter's schema, `schemas.enable=true`).
//!
//! Sources: Kafka Connect's `org.apache.kafka.connect.data.Decimal` (the
//! unscaled value as big-endian two's-complement bytes, base64 in JSON,
//! the scale in the schema's `parameters.scale`), `…data.Date` and
//! `io.debezium.time.Date` (days since 1970-01-01), `…data.Timestamp` and
//! `io.debezium.time.Timestamp` (milliseconds since the epoch, no zone),
//! `io.debezium.time.MicroTimestamp`, `…NanoTimestamp`,
//! `io.debezium.time.Time` (ms past midnight), `…MicroTime`, `…NanoTime`,
//! `io.debezium.data.VariableScaleDecimal` (a struct of `scale` and the
//! unscaled `value`, for PostgreSQL `numeric` without a fixed scale)
//! (Debezium connector documentation, "temporal types" and "decimal
//! types").

use base64::Engine as _;
use chrono::{DateTime, NaiveDate, NaiveTime, TimeDelta};
use sluice_guest::json::{self, RawValue};

/// Decode `raw`, a field of logical type `name` (with the schema's
/// `scale` for decimals). `Ok(None)`: not an encoded type, keep the raw
/// value.
///
/// # Errors
/// A value that does not fit its type (not base64, not an integer, out
/// of range), with the type named.
pub fn decode(name: &str, scale: Option<u32>, raw: &RawValue) -> Result<Option<String>, String> {
    if json::is_null(raw) {
        return Ok(None);
    }
    let int = || {
        raw.get()
            .parse::<i64>()
            .map_err(|_| format!("{name} value {} is not an integer", raw.get()))
    };
    let out_of_range = || format!("{name} value {} is out of range", raw.get());
    let unscaled = |raw: &RawValue, scale: u32| {
        let text = json::str_value(raw).map_err(|_| {
            format!(
                "{name} value {} is not a base64 string (decimal.handling.mode=precise)",
                raw.get()
            )
        })?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(|e| format!("{name} value {text:?} is not base64: {e}"))?;
        Ok::<_, String>(decimal(&bytes, scale))
    };
    Ok(Some(match name {
        "org.apache.kafka.connect.data.Decimal" => unscaled(raw, scale.unwrap_or(0))?,
        "io.debezium.data.VariableScaleDecimal" => {
            let parts = json::Object::from_raw(raw)
                .map_err(|_| format!("{name} value {} is not a struct", raw.get()))?;
            let scale = parts
                .get("scale")
                .and_then(|s| s.get().parse::<u32>().ok())
                .ok_or_else(|| format!("{name} value {} has no integer `scale`", raw.get()))?;
            let value = parts
                .get("value")
                .ok_or_else(|| format!("{name} value {} has no `value`", raw.get()))?;
            unscaled(value, scale)?
        }
        "org.apache.kafka.connect.data.Date" | "io.debezium.time.Date" => {
            let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).ok_or_else(out_of_range)?;
            let date = TimeDelta::try_days(int()?)
                .and_then(|d| epoch.checked_add_signed(d))
                .ok_or_else(out_of_range)?;
            date.format("%Y-%m-%d").to_string()
        }
        "org.apache.kafka.connect.data.Timestamp" | "io.debezium.time.Timestamp" => {
            timestamp(DateTime::from_timestamp_millis(int()?)).ok_or_else(out_of_range)?
        }
        "io.debezium.time.MicroTimestamp" => {
            timestamp(DateTime::from_timestamp_micros(int()?)).ok_or_else(out_of_range)?
        }
        "io.debezium.time.NanoTimestamp" => {
            timestamp(Some(DateTime::from_timestamp_nanos(int()?))).ok_or_else(out_of_range)?
        }
        "io.debezium.time.Time" | "org.apache.kafka.connect.data.Time" => {
            time(TimeDelta::try_milliseconds(int()?)).ok_or_else(out_of_range)?
        }
        "io.debezium.time.MicroTime" => {
            time(Some(TimeDelta::microseconds(int()?))).ok_or_else(out_of_range)?
        }
        "io.debezium.time.NanoTime" => {
            time(Some(TimeDelta::nanoseconds(int()?))).ok_or_else(out_of_range)?
        }
        _ => return Ok(None),
    }))
}

/// The unscaled big-endian two's-complement `bytes` (any length: MySQL's
/// DECIMAL(65) takes 28) with `scale` digits after the point, as decimal
/// text.
fn decimal(bytes: &[u8], scale: u32) -> String {
    let n = num_bigint::BigInt::from_signed_bytes_be(bytes);
    let digits = n.magnitude().to_string();
    let scale = scale as usize;
    let sign = if n.sign() == num_bigint::Sign::Minus {
        "-"
    } else {
        ""
    };
    if scale == 0 {
        format!("{sign}{digits}")
    } else if digits.len() > scale {
        let (int, frac) = digits.split_at(digits.len() - scale);
        format!("{sign}{int}.{frac}")
    } else {
        format!("{sign}0.{digits:0>scale$}")
    }
}

fn timestamp<Tz: chrono::TimeZone>(t: Option<DateTime<Tz>>) -> Option<String>
where
    Tz::Offset: std::fmt::Display,
{
    Some(t?.naive_utc().format("%Y-%m-%d %H:%M:%S%.f").to_string())
}

fn time(d: Option<TimeDelta>) -> Option<String> {
    let midnight = NaiveTime::from_hms_opt(0, 0, 0)?;
    let d = d?;
    if d < TimeDelta::zero() || d >= TimeDelta::days(1) {
        return None;
    }
    Some((midnight + d).format("%H:%M:%S%.f").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    #[test]
    fn precise_decimals_keep_every_digit() {
        // 999999999999.999998 at scale 6: unscaled 999999999999999998.
        let unscaled = 999_999_999_999_999_998_i128.to_be_bytes();
        let trimmed = &unscaled[8..];
        let b64 = base64::engine::general_purpose::STANDARD.encode(trimmed);
        let d = decode(
            "org.apache.kafka.connect.data.Decimal",
            Some(6),
            &raw(&format!("\"{b64}\"")),
        );
        assert_eq!(d.unwrap().as_deref(), Some("999999999999.999998"));
        assert_eq!(decimal(&[0xff, 0x85], 2), "-1.23");
        assert_eq!(decimal(&[0x05], 3), "0.005");
        assert_eq!(decimal(&[0x01, 0x00], 0), "256");
        assert_eq!(decimal(&[], 2), "0.00");
        // DECIMAL(65,30), all nines: 28 bytes, beyond any fixed-width
        // integer.
        let nines = num_bigint::BigInt::parse_bytes(&[b'9'; 65], 10).unwrap();
        assert_eq!(
            decimal(&nines.to_signed_bytes_be(), 30),
            format!("{}.{}", "9".repeat(35), "9".repeat(30))
        );
        assert_eq!(
            decimal(&(-nines).to_signed_bytes_be(), 0),
            format!("-{}", "9".repeat(65))
        );
        let v = |s: &str| decode("io.debezium.data.VariableScaleDecimal", None, &raw(s));
        // 0x3039 = 12345 at scale 3.
        assert_eq!(
            v(r#"{"scale":3,"value":"MDk="}"#).unwrap().as_deref(),
            Some("12.345")
        );
        assert!(v(r#"{"value":"MDk="}"#).unwrap_err().contains("scale"));
        assert!(v(r#""MDk=""#).unwrap_err().contains("not a struct"));
    }

    /// Values from a real event: Debezium Server's documentation prints a
    /// SQL Server delete (tests/fixtures/cdc/real/README.md) with `sal`
    /// `"dzWUAA=="` and `comm` `"AYag"` at scale `"4"`.
    #[test]
    fn debezium_servers_documented_decimals_decode() {
        let d = |v: &str| decode("org.apache.kafka.connect.data.Decimal", Some(4), &raw(v));
        assert_eq!(d(r#""dzWUAA==""#).unwrap().as_deref(), Some("200000.0000"));
        assert_eq!(d(r#""AYag""#).unwrap().as_deref(), Some("10.0000"));
    }

    #[test]
    fn temporal_types_become_sql_text() {
        let d = |name: &str, v: &str| decode(name, None, &raw(v)).unwrap();
        assert_eq!(
            d("io.debezium.time.Date", "19000").as_deref(),
            Some("2022-01-08")
        );
        assert_eq!(
            d("io.debezium.time.Date", "-1").as_deref(),
            Some("1969-12-31")
        );
        assert_eq!(
            d("io.debezium.time.Timestamp", "1449786310123").as_deref(),
            Some("2015-12-10 22:25:10.123")
        );
        assert_eq!(
            d("io.debezium.time.MicroTimestamp", "1449786310123456").as_deref(),
            Some("2015-12-10 22:25:10.123456")
        );
        assert_eq!(
            d("io.debezium.time.MicroTime", "3723000001").as_deref(),
            Some("01:02:03.000001")
        );
        assert_eq!(
            d(
                "io.debezium.time.ZonedTimestamp",
                "\"2015-12-10T22:25:10Z\""
            ),
            None
        );
        assert_eq!(d("io.debezium.time.Date", "null"), None);
        let e = decode("io.debezium.time.Date", None, &raw("\"x\"")).unwrap_err();
        assert!(e.contains("not an integer"), "{e}");
        let e = decode("io.debezium.time.MicroTime", None, &raw("86400000000")).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
    }
}
