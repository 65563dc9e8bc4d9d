//! Read JSON without number round-trips.
//!
//! CDC payloads carry decimals such as `999999999999.999998` and MySQL zero
//! dates such as `"0000-00-00 00:00:00"`. Parsing them into `f64` or a date
//! type and printing them again changes them. [`Object`] keeps every field
//! value as the exact source text ([`RawValue`]), so a plugin can copy
//! values into its output byte for byte and only decode what it inspects.
//!
//! ```
//! use sluice_guest::json::Object;
//!
//! let row = Object::parse(br#"{"id":7,"price":999999999999.999998}"#).unwrap();
//! assert_eq!(row.get("price").unwrap().get(), "999999999999.999998");
//! let mut out = Vec::new();
//! sluice_guest::json::write_str(&mut out, "a \"quoted\" name");
//! assert_eq!(out, br#""a \"quoted\" name""#);
//! ```

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
pub use serde_json::value::RawValue;

/// A JSON object whose values are kept as raw source text, in source order.
#[derive(Debug)]
pub struct Object<'a> {
    fields: Vec<(Cow<'a, str>, &'a RawValue)>,
}

struct Key<'a>(Cow<'a, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> de::Deserialize<'de> for Object<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Object<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
                    let v: &'de RawValue = map.next_value()?;
                    fields.push((k, v));
                }
                Ok(Object { fields })
            }
        }
        d.deserialize_map(V)
    }
}

impl<'a> Object<'a> {
    /// Parse `bytes` as one JSON object.
    ///
    /// # Errors
    /// `invalid UTF-8 at byte N` when `bytes` is not UTF-8, else
    /// serde_json's message (with line and column) when it is not a JSON
    /// object.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, String> {
        // Validate UTF-8 once for the whole input; parsing from `&str` then
        // skips serde_json's per-string and per-raw-value re-validation
        // (measured: the largest single cost of this parser in Wasm, where
        // the word-at-a-time checks run on 32-bit words).
        let text = std::str::from_utf8(bytes)
            .map_err(|e| format!("invalid UTF-8 at byte {}", e.valid_up_to()))?;
        Self::parse_str(text)
    }

    /// Parse `text` as one JSON object.
    ///
    /// # Errors
    /// serde_json's message (with line and column) when `text` is not a
    /// JSON object.
    pub fn parse_str(text: &'a str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// Parse a raw value (for nested objects).
    ///
    /// # Errors
    /// As [`Object::parse_str`].
    pub fn from_raw(raw: &'a RawValue) -> Result<Self, String> {
        Self::parse_str(raw.get())
    }

    /// The raw value of `key` (the last one if the key repeats).
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.fields
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
    }

    /// The string value of `key`; `Ok(None)` when absent or `null`.
    ///
    /// # Errors
    /// When the value is present but not a string.
    pub fn get_str(&self, key: &str) -> Result<Option<Cow<'a, str>>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(raw) if is_null(raw) => Ok(None),
            Some(raw) => str_value(raw)
                .map(Some)
                .map_err(|_| format!("field `{key}` is not a string: {}", raw.get())),
        }
    }

    /// Fields in source order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &'a RawValue)> {
        self.fields.iter().map(|(k, v)| (k.as_ref(), *v))
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// True for `{}`.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }
}

/// Decode a raw JSON string value (borrowing when it has no escapes).
///
/// # Errors
/// When `raw` is not a JSON string.
pub fn str_value(raw: &RawValue) -> Result<Cow<'_, str>, String> {
    // A raw value is valid JSON, so a quoted text without a backslash is a
    // string whose content is exactly the text between the quotes.
    let text = raw.get();
    if let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"'))
        && !inner.contains('\\')
    {
        return Ok(Cow::Borrowed(inner));
    }
    struct S<'a>(Cow<'a, str>);
    impl<'de> de::Deserialize<'de> for S<'de> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            Key::deserialize(d).map(|k| S(k.0))
        }
    }
    serde_json::from_str::<S<'_>>(raw.get())
        .map(|s| s.0)
        .map_err(|e| e.to_string())
}

/// True when the raw value is JSON `null`.
pub fn is_null(raw: &RawValue) -> bool {
    raw.get() == "null"
}

/// Append `s` as a JSON string literal (quoted and escaped per RFC 8259).
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    if !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    // serde_json's escaper is the reference; writing into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, s).is_err() {
        out.extend_from_slice(b"\"\"");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_keep_their_exact_text() {
        let o = Object::parse(
            br#"{"d":999999999999.999998,"z":"0000-00-00 00:00:00","e":1E+2,"n":null}"#,
        )
        .unwrap();
        assert_eq!(o.get("d").unwrap().get(), "999999999999.999998");
        assert_eq!(o.get("z").unwrap().get(), r#""0000-00-00 00:00:00""#);
        assert_eq!(o.get("e").unwrap().get(), "1E+2");
        assert!(is_null(o.get("n").unwrap()));
        assert_eq!(o.get_str("n").unwrap(), None);
    }

    #[test]
    fn escaped_keys_and_strings_decode() {
        let o = Object::parse(br#"{"a\u0062":"x\ny"}"#).unwrap();
        assert_eq!(o.get_str("ab").unwrap().as_deref(), Some("x\ny"));
    }

    #[test]
    fn write_str_escapes_only_when_needed() {
        for (s, want) in [
            ("plain é", r#""plain é""#),
            ("tab\there", r#""tab\there""#),
            ("q\"b\\", r#""q\"b\\""#),
            ("", "\"\""),
        ] {
            let mut out = Vec::new();
            write_str(&mut out, s);
            assert_eq!(std::str::from_utf8(&out).unwrap(), want, "{s:?}");
        }
    }

    #[test]
    fn str_values_borrow_unless_escaped() {
        let o = Object::parse(br#"{"a":"plain","b":"x\"y","c":""}"#).unwrap();
        assert!(matches!(
            o.get_str("a").unwrap(),
            Some(Cow::Borrowed("plain"))
        ));
        assert_eq!(o.get_str("b").unwrap().as_deref(), Some("x\"y"));
        assert_eq!(o.get_str("c").unwrap().as_deref(), Some(""));
    }

    #[test]
    fn non_objects_and_bad_bytes_are_errors() {
        assert!(Object::parse(b"[1]").is_err());
        assert!(Object::parse(b"{\"a\":").is_err());
        assert_eq!(
            Object::parse(b"{\"a\":\"\xff\"}").unwrap_err(),
            "invalid UTF-8 at byte 6"
        );
        assert!(Object::parse(br#"{"a":1}"#).unwrap().get_str("a").is_err());
    }
}
