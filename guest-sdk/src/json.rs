//! Read and write JSON without number round-trips.
//!
//! CDC payloads carry decimals such as `999999999999.999998` and MySQL zero
//! dates such as `"0000-00-00 00:00:00"`. Parsing them into `f64` or a date
//! type and printing them again changes them. [`Object`] keeps every field
//! value as the exact source text ([`RawValue`]), so a plugin can copy
//! values into its output byte for byte and only decode what it inspects.
//!
//! With serde: [`from_slice`] reads into a borrowed `#[derive(Deserialize)]`
//! struct (fields typed `&RawValue` keep their text), [`write()`] writes a
//! borrowed `#[derive(Serialize)]` struct (a `&RawValue` field is written
//! as it came, an [`Object`] as its fields in order):
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use sluice_guest::json::{self, RawValue};
//!
//! #[derive(Deserialize)]
//! struct Event<'a> {
//!     table: &'a str,
//!     #[serde(borrow)]
//!     data: &'a RawValue,
//! }
//! #[derive(Serialize)]
//! struct Change<'a> {
//!     op: &'a str,
//!     data: &'a RawValue,
//! }
//! let e: Event<'_> = json::from_slice(br#"{"table":"t","data":{"v":1.10}}"#).unwrap();
//! let mut out = Vec::new();
//! json::write(&mut out, &Change { op: "upsert", data: e.data });
//! assert_eq!(out, br#"{"op":"upsert","data":{"v":1.10}}"#);
//! ```
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
use serde::ser::{Serialize, SerializeMap, Serializer};
pub use serde_json::value::RawValue;

/// Parse `bytes` as JSON into `T`, borrowing from them (`&str` fields
/// need the text to be free of escapes; use `Cow<str>` where it may not
/// be). `?` turns the error into a bad record ([`crate::Error`]'s
/// `From<serde_json::Error>`).
///
/// # Errors
/// serde_json's error, with line and column: syntax (not JSON, invalid
/// UTF-8) or data (valid JSON that does not fit `T`).
pub fn from_slice<'a, T: de::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, serde_json::Error> {
    // Validate UTF-8 once; parsing from `&str` then skips serde_json's
    // per-string re-validation (see `Object::parse`). Invalid UTF-8 goes
    // the slow way, for serde_json's own message and position.
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(bytes),
    }
}

/// A JSON string that borrows from the input when it has no escapes. Use
/// `Option<Text<'a>>` (with `#[serde(borrow)]`) for an optional string
/// field: serde borrows a `Cow<str>` only as a bare field, never inside an
/// `Option`, so `Option<Cow<str>>` allocates for every record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Text<'a>(#[serde(borrow)] pub Cow<'a, str>);

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// What kind of JSON value `raw` is, for messages: `an object`, `an
/// array`, `a string`, `a number`, `a boolean` or `null`.
pub fn kind(raw: &RawValue) -> &'static str {
    match raw.get().as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// Append `value` as compact JSON (`&RawValue` fields byte for byte).
pub fn write<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing into a Vec fails only for a `Serialize` impl that fails on
    // its own (a map with non-string keys); derived structs never do.
    if let Err(e) = serde_json::to_writer(&mut *out, value) {
        debug_assert!(false, "json::write: {e}");
    }
}

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

impl Serialize for Object<'_> {
    /// The fields in order, each value as its source text.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.fields.len()))?;
        for (k, v) in &self.fields {
            map.serialize_entry(k.as_ref(), v)?;
        }
        map.end()
    }
}

impl<'a> Object<'a> {
    /// An empty object, to build with [`Object::push`] (and write with
    /// [`write()`]).
    pub fn new() -> Self {
        Object { fields: Vec::new() }
    }

    /// Append a field (a repeated key is written twice; [`Object::get`]
    /// finds the last).
    pub fn push(&mut self, key: impl Into<Cow<'a, str>>, value: &'a RawValue) {
        self.fields.push((key.into(), value));
    }

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

impl Default for Object<'_> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_write_back_their_exact_text_in_order() {
        let o = Object::parse(br#"{"z":1.10,"a":"0000-00-00","n":null}"#).unwrap();
        let mut built = Object::new();
        for (k, v) in o.iter().filter(|(k, _)| *k != "n") {
            built.push(k.to_string(), v);
        }
        let mut out = Vec::new();
        write(&mut out, &built);
        assert_eq!(out, br#"{"z":1.10,"a":"0000-00-00"}"#);
        assert!(
            from_slice::<Vec<String>>(b"[\"\xff\"]")
                .unwrap_err()
                .is_syntax()
        );
        assert!(from_slice::<Vec<String>>(b"[1]").unwrap_err().is_data());
        let kinds: Vec<&str> = Object::parse(br#"{"a":{},"b":[],"c":"","d":true,"e":null,"f":-1}"#)
            .unwrap()
            .iter()
            .map(|(_, v)| kind(v))
            .collect();
        assert_eq!(
            kinds,
            [
                "an object",
                "an array",
                "a string",
                "a boolean",
                "null",
                "a number"
            ]
        );
    }

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
