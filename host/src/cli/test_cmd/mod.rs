//! `host test`: run map stages over records from a file, print outputs and
//! bad records as JSON lines. No Kafka, no checkpoint: the quickest way to
//! see what a plugin does with real input.

use std::collections::BTreeMap;
use std::io::{BufWriter, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use clap::{Args, ValueEnum};
use serde::Deserialize;
use serde_json::value::RawValue;
use sluice_guest::wire::{Record, TimestampType};

use super::{CliError, ExitCode, LimitArgs, WithCode, parse_kv};
use crate::plugin::chain::{
    DEFAULT_ISOLATION_TRAPS, Rejection, TrapBudget, isolate_traps, run_chain,
};
use crate::plugin::{CallContext, PluginError, Runtime};
use crate::source::SourceRecord;

/// Flags of `host test`.
#[derive(Debug, Args)]
pub struct TestArgs {
    /// Plugin component with a map stage. Repeat to chain stages in order.
    #[arg(long = "plugin", value_name = "FILE", required = true)]
    pub plugins: Vec<PathBuf>,

    /// Input file, or `-` for stdin.
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,

    /// How to read the input.
    #[arg(long, value_enum, default_value_t = InputFormat::Lines)]
    pub format: InputFormat,

    /// Plugin configuration pair (what the plugin's `config` import
    /// returns). Repeatable.
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub config: Vec<(String, String)>,

    /// Sandbox limits.
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// Input formats of `host test`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InputFormat {
    /// Each line is one record value (topic `test`, partition 0, offsets
    /// from 0, no key, no headers).
    Lines,
    /// Each line is a JSON object: topic, partition, offset, timestamp,
    /// timestamp_type, key / key_b64, value / value_b64 (null = absent),
    /// headers: [{key, value / value_b64}].
    Records,
}

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
struct Owned {
    topic: String,
    partition: i32,
    record: SourceRecord,
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

fn parse_records(input: &[u8], format: InputFormat) -> anyhow::Result<Vec<Owned>> {
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

/// Put bytes into a JSON object as `name` (UTF-8 text), `name_b64`
/// (other bytes) or `name: null` (absent).
fn put_bytes(
    obj: &mut serde_json::Map<String, serde_json::Value>,
    name: &str,
    bytes: Option<&[u8]>,
) {
    match bytes {
        None => {
            obj.insert(name.into(), serde_json::Value::Null);
        }
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => {
                obj.insert(name.into(), s.into());
            }
            Err(_) => {
                obj.insert(format!("{name}_b64"), B64.encode(b).into());
            }
        },
    }
}

/// Run `host test`.
///
/// # Errors
/// Exit 2 for unreadable input, exit 1 for an unloadable plugin, a trap or
/// a fatal stage error.
pub fn run(args: TestArgs) -> Result<(), CliError> {
    let mut input = Vec::new();
    if args.input.as_os_str() == "-" {
        std::io::stdin()
            .read_to_end(&mut input)
            .context("reading stdin")
            .code(ExitCode::Usage)?;
    } else {
        input = std::fs::read(&args.input)
            .with_context(|| format!("cannot read input {}", args.input.display()))
            .code(ExitCode::Usage)?;
    }
    let owned = parse_records(&input, args.format).code(ExitCode::Usage)?;

    let runtime = Runtime::new(args.limits.limits()).map_err(anyhow::Error::msg)?;
    let config: Arc<BTreeMap<String, String>> = Arc::new(args.config.into_iter().collect());
    let mut stages = Vec::new();
    for path in &args.plugins {
        let plugin = runtime.load(path, config.clone())?;
        if !plugin.stages().map {
            return Err(CliError {
                code: ExitCode::Failed,
                error: anyhow::anyhow!(
                    "plugin {} (sha256:{}) has no map stage (it exports: {}); `host test` runs map stages",
                    path.display(),
                    plugin.digest(),
                    plugin.stages().names().join(", ")
                ),
            });
        }
        tracing::info!(plugin = %path.display(), digest = plugin.digest(), "loaded");
        stages.push(plugin.instance());
    }

    let records: Vec<Record<'_>> = owned
        .iter()
        .map(|o| o.record.view(&o.topic, o.partition))
        .collect();
    let ctx = CallContext {
        query_id: "host-test".into(),
        batch_id: 0,
        epoch: 0,
    };
    // A trap is narrowed down to the records that cause it (as under
    // `host run --on-error dlq`), so the author sees which input it is and
    // the outputs of all the others; the command still fails.
    let result = match run_chain(&mut stages, &ctx, &records) {
        Err(PluginError::Trap(t)) => {
            let never = std::sync::atomic::AtomicBool::new(false);
            let mut budget = TrapBudget {
                stop: &never,
                traps_left: DEFAULT_ISOLATION_TRAPS,
                attempts: 1,
            };
            isolate_traps(&mut stages, &ctx, &records, t, &mut budget)?
        }
        other => other?,
    };

    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut outputs = result.outputs.iter().peekable();
    let mut rejected = result.rejected.iter().peekable();
    let mut filtered = 0usize;
    for (i, r) in records.iter().enumerate() {
        let mut any = false;
        while let Some(o) = outputs.next_if(|o| o.source_index == i) {
            any = true;
            let mut obj = serde_json::Map::new();
            obj.insert("type".into(), "output".into());
            obj.insert("idempotency_key".into(), o.idempotency_key.clone().into());
            obj.insert("topic".into(), r.topic.into());
            obj.insert("partition".into(), r.partition.into());
            obj.insert("offset".into(), r.offset.into());
            put_bytes(&mut obj, "key", o.key.as_deref());
            put_bytes(&mut obj, "value", o.value.as_deref());
            let headers: Vec<serde_json::Value> = o
                .headers
                .iter()
                .map(|(k, v)| {
                    let mut h = serde_json::Map::new();
                    h.insert("key".into(), k.clone().into());
                    put_bytes(&mut h, "value", v.as_deref());
                    serde_json::Value::Object(h)
                })
                .collect();
            obj.insert("headers".into(), headers.into());
            writeln!(out, "{}", serde_json::Value::Object(obj)).map_err(super::stdout_error)?;
        }
        while let Some(b) = rejected.next_if(|b| b.source_index == i) {
            any = true;
            let line = serde_json::json!({
                "type": "bad_record",
                "topic": r.topic,
                "partition": r.partition,
                "offset": r.offset,
                "stage": b.stage,
                "plugin_digest": b.plugin_digest,
                "error": b.message,
            });
            writeln!(out, "{line}").map_err(super::stdout_error)?;
        }
        if !any {
            filtered += 1;
        }
    }
    out.flush().map_err(super::stdout_error)?;
    let trapped: Vec<&Rejection> = result.rejected.iter().filter(|r| r.trapped).collect();
    if let Some(first) = trapped.first() {
        return Err(CliError {
            code: ExitCode::Failed,
            error: anyhow::anyhow!(
                "{} record(s) made the plugin trap (their lines above are bad_record); the first: {}",
                trapped.len(),
                first.message
            ),
        });
    }
    tracing::info!(
        records = records.len(),
        outputs = result.outputs.len(),
        bad_records = result.rejected.len(),
        filtered,
        "done"
    );
    Ok(())
}
