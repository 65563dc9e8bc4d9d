//! The exact value of a number as Maxwell and Debezium print it (a JSON
//! number, or a string of one), read as decimal digits and a power of
//! ten: no floating point on the way, so a check of what a column can
//! hold never rounds first.
//!
//! Grammar: JSON's (RFC 8259 §6: sign, digits, fraction, exponent), plus a
//! leading `+`, leading zeros and surrounding whitespace, which MySQL's
//! and PostgreSQL's number input take too. `NaN` and `Infinity` are not
//! decimals (see [`crate::table`] for where they may go).

/// A decimal number: `digits × 10^exponent`, `digits` without leading or
/// trailing zeros (empty for zero).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decimal {
    /// The sign (`false` for zero).
    pub negative: bool,
    /// Significant digits, ASCII, no leading or trailing zeros.
    pub digits: String,
    /// The power of ten of the last digit.
    pub exponent: i64,
}

impl Decimal {
    /// Read `text`; `None` when it is not a number of the grammar above
    /// (or its exponent is beyond ±2^62).
    pub fn parse(text: &str) -> Option<Decimal> {
        let t = text.trim();
        let (negative, t) = match t.as_bytes().first()? {
            b'-' => (true, &t[1..]),
            b'+' => (false, &t[1..]),
            _ => (false, t),
        };
        let (mantissa, exp) = match t.find(['e', 'E']) {
            Some(i) => (&t[..i], Some(&t[i + 1..])),
            None => (t, None),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let digits_only = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if int.is_empty() && frac.is_empty() || !digits_only(int) || !digits_only(frac) {
            return None;
        }
        let exp: i64 = match exp {
            None => 0,
            Some(e) => {
                let body = e.strip_prefix(['-', '+']).unwrap_or(e);
                if body.is_empty() || !digits_only(body) || body.len() > 18 {
                    return None;
                }
                e.parse().ok()?
            }
        };
        let all = format!("{int}{frac}");
        let lead = all.len() - all.trim_start_matches('0').len();
        let significant = all[lead..].trim_end_matches('0');
        if significant.is_empty() {
            return Some(Decimal {
                negative: false,
                digits: String::new(),
                exponent: 0,
            });
        }
        let trailing = (all.len() - lead - significant.len()) as i64;
        Some(Decimal {
            negative,
            digits: significant.to_string(),
            exponent: exp - frac.len() as i64 + trailing,
        })
    }

    /// The value as an integer, when it is one and fits in an `i128`.
    pub fn integer(&self) -> Option<i128> {
        if self.exponent < 0 {
            return None;
        }
        let zeros = usize::try_from(self.exponent).ok()?;
        if self.digits.len() + zeros > 38 {
            return None;
        }
        let n: i128 = format!("{}{}", self.digits, "0".repeat(zeros))
            .parse()
            .unwrap_or(0);
        Some(if self.negative { -n } else { n })
    }

    /// Digits after the decimal point it needs (`12.50` → 1).
    pub fn fraction_digits(&self) -> u64 {
        u64::try_from(-self.exponent).unwrap_or(0)
    }

    /// Digits before the decimal point (`0.5` → 0, `120` → 3).
    pub fn integer_digits(&self) -> u64 {
        u64::try_from(self.digits.len() as i64 + self.exponent).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(text: &str) -> Option<(bool, String, i64)> {
        Decimal::parse(text).map(|d| (d.negative, d.digits, d.exponent))
    }

    #[test]
    fn digits_and_exponent_are_exact() {
        assert_eq!(
            d("999999999999.999998"),
            Some((false, "999999999999999998".into(), -6))
        );
        assert_eq!(
            d("18446744073709551615"),
            Some((false, "18446744073709551615".into(), 0))
        );
        assert_eq!(d("-12.500"), Some((true, "125".into(), -1)));
        assert_eq!(d("1200"), Some((false, "12".into(), 2)));
        assert_eq!(d("5e2"), Some((false, "5".into(), 2)));
        assert_eq!(d("1.5E-3"), Some((false, "15".into(), -4)));
        assert_eq!(d(" +007.0 "), Some((false, "7".into(), 0)));
        assert_eq!(d("-0.000"), Some((false, String::new(), 0)));
        assert_eq!(d(".5"), Some((false, "5".into(), -1)));
        for bad in [
            "",
            "-",
            "1.2.3",
            "1e",
            "e5",
            "12,5",
            "NaN",
            "Infinity",
            "0x10",
            "1e99999999999999999999",
            ".",
        ] {
            assert_eq!(d(bad), None, "{bad}");
        }
    }

    #[test]
    fn integers_fraction_and_integer_digits() {
        let p = |t: &str| Decimal::parse(t).unwrap();
        assert_eq!(p("5.0").integer(), Some(5));
        assert_eq!(p("-5e2").integer(), Some(-500));
        assert_eq!(p("1.5").integer(), None);
        assert_eq!(
            p("18446744073709551615").integer(),
            Some(18_446_744_073_709_551_615)
        );
        assert_eq!(p("1e40").integer(), None);
        assert_eq!(p("999999999999.999998").fraction_digits(), 6);
        assert_eq!(p("999999999999.999998").integer_digits(), 12);
        assert_eq!(p("12.50").fraction_digits(), 1);
        assert_eq!(p("0.05").integer_digits(), 0);
        assert_eq!(p("1200").integer_digits(), 4);
        assert_eq!(p("0").integer_digits(), 0);
    }
}
