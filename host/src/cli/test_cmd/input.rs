//! The input of `host test`: a file of record values (`--format lines`)
//! or of record objects (`--format records`).

use anyhow::{Context, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;
use serde_json::value::RawValue;
use sluice_guest::wire::TimestampType;

use super::InputFormat;
use crate::source::SourceRecord;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputHeader {
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    value_b64: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputRecord {
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    partition: Option<i32>,
    #[serde(default)]
    offset: Option<i64>,
    #[serde(default)]
    timestamp: Option<i64>,
    #[serde(default)]
    timestamp_type: Option<String>,
    #[serde(default)]
    key: Option<Box<RawValue>>,
    #[serde(default)]
    key_b64: Option<String>,
    #[serde(default)]
    value: Option<Box<RawValue>>,
    #[serde(default)]
    value_b64: Option<String>,
    #[serde(default)]
    headers: Vec<InputHeader>,
}

/// An input record, owned, with its topic and partition.
pub(super) struct Owned {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) record: SourceRecord,
}

/// A JSON string is taken as its text; any other JSON value as its exact
/// source text (so `"value": {"a":1}` is the bytes `{"a":1}`).
fn raw_bytes(
    raw: Option<Box<RawValue>>,
    b64: Option<String>,
    field: &str,
) -> anyhow::Result<Option<Vec<u8>>> {
    match (raw, b64) {
        (Some(_), Some(_)) => bail!("both `{field}` and `{field}_b64` given"),
        (None, Some(b)) => Ok(Some(
            B64.decode(b.as_bytes())
                .with_context(|| format!("`{field}_b64` is not base64"))?,
        )),
        (Some(r), None) => match serde_json::from_str::<String>(r.get()) {
            Ok(s) => Ok(Some(s.into_bytes())),
            Err(_) => Ok(Some(r.get().as_bytes().to_vec())),
        },
        (None, None) => Ok(None),
    }
}

/// The records of `input`.
///
/// # Errors
/// A line that is not a record object (`records`), naming the line.
pub(super) fn parse_records(input: &[u8], format: InputFormat) -> anyhow::Result<Vec<Owned>> {
    let mut lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.into_iter().enumerate() {
        match format {
            InputFormat::Lines => out.push(Owned {
                topic: "test".into(),
                partition: 0,
                record: SourceRecord {
                    offset: i as i64,
                    timestamp: 0,
                    timestamp_type: TimestampType::NotAvailable,
                    key: None,
                    value: Some(line.to_vec()),
                    headers: Vec::new(),
                },
            }),
            InputFormat::Records if line.iter().all(u8::is_ascii_whitespace) => continue,
            InputFormat::Records => {
                let line = line.strip_prefix(b"\xef\xbb\xbf").unwrap_or(line);
                let r: InputRecord = serde_json::from_slice(line)
                    .with_context(|| format!("input line {}: not a record object", i + 1))?;
                let ctx = || format!("input line {}", i + 1);
                let timestamp_type = match r.timestamp_type.as_deref() {
                    None if r.timestamp.is_some() => TimestampType::CreateTime,
                    None | Some("not-available") => TimestampType::NotAvailable,
                    Some("create-time") => TimestampType::CreateTime,
                    Some("log-append-time") => TimestampType::LogAppendTime,
                    Some(other) => bail!(
                        "{}: timestamp_type `{other}` (use create-time, log-append-time or not-available)",
                        ctx()
                    ),
                };
                let mut headers = Vec::new();
                for h in r.headers {
                    let v = match (h.value, h.value_b64) {
                        (Some(_), Some(_)) => {
                            bail!("{}: header `{}` has value and value_b64", ctx(), h.key)
                        }
                        (Some(v), None) => Some(v.into_bytes()),
                        (None, Some(b)) => {
                            Some(B64.decode(b.as_bytes()).with_context(|| {
                                format!("{}: header `{}` value_b64", ctx(), h.key)
                            })?)
                        }
                        (None, None) => None,
                    };
                    headers.push((h.key, v));
                }
                let (timestamp, timestamp_type) =
                    crate::source::timestamp(r.timestamp.unwrap_or(-1), timestamp_type);
                out.push(Owned {
                    topic: r.topic.unwrap_or_else(|| "test".into()),
                    partition: r.partition.unwrap_or(0),
                    record: SourceRecord {
                        offset: r.offset.unwrap_or(i as i64),
                        timestamp,
                        timestamp_type,
                        key: raw_bytes(r.key, r.key_b64, "key").with_context(ctx)?,
                        value: raw_bytes(r.value, r.value_b64, "value").with_context(ctx)?,
                        headers,
                    },
                });
            }
        }
    }
    Ok(out)
}
