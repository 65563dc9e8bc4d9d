//! Debezium change events in the JSON converter's form
//! (<https://debezium.io/documentation/reference/stable/connectors/>,
//! "data change events"), with the `schema`/`payload` wrapper
//! (`schemas.enable=true`) or without it.
//!
//! `op` `c`, `u`, `r` (snapshot read) upsert from `after`; `d` deletes
//! the row `before` or the key names; `t` truncates the table; `m`
//! (logical decoding message), heartbeats, schema changes and
//! transaction boundaries are skipped. The source table is
//! `source.db`.`source.table` for the MySQL and MariaDB connectors and
//! `source.schema`.`source.table` for the others. The position is
//! `source.lsn` (PostgreSQL), `source.file`/`pos`/`row` (MySQL),
//! `source.commit_lsn`/`change_lsn` (SQL Server), else the Kafka offset.
//! With the schema, values of encoded logical types (precise decimals,
//! dates, timestamps) are decoded ([`crate::convert`]).

use std::borrow::Cow;

use serde::Deserialize;
use sluice_guest::Error;
use sluice_guest::json::{self, Object, RawValue, Text};

use crate::change::{Columns, Decoded, Op, Val};
use crate::{convert, position};

/// True when `event` looks like a Debezium event: a `payload` wrapper,
/// `op` and `source` (a change), `source` and `ddl` or `tableChanges` (a
/// schema change), or a lone `ts_ms` (a heartbeat).
pub fn looks_like(event: &Object<'_>) -> bool {
    (event.get("payload").is_some() && event.get("schema").is_some())
        || (event.get("source").is_some()
            && ["op", "ddl", "tableChanges"]
                .iter()
                .any(|f| event.get(f).is_some()))
        || is_heartbeat(event)
}

/// A heartbeat's value (`heartbeat.interval.ms`): `ts_ms` alone.
fn is_heartbeat(payload: &Object<'_>) -> bool {
    payload.len() == 1 && payload.get("ts_ms").is_some()
}

/// An event with no row change: a heartbeat, a schema change (the
/// connector's schema change topic: `ddl`, `tableChanges`) or a
/// transaction boundary (`provide.transaction.metadata`: `status`
/// BEGIN/END with `id`).
fn carries_no_change(payload: &Object<'_>) -> bool {
    is_heartbeat(payload)
        || payload.get("ddl").is_some()
        || payload.get("tableChanges").is_some()
        || (payload.get("id").is_some()
            && matches!(
                payload.get_str("status").ok().flatten().as_deref(),
                Some("BEGIN" | "END")
            ))
}

/// A field of a Kafka Connect schema, as the JSON converter writes it.
#[derive(Deserialize)]
struct FieldSchema<'a> {
    #[serde(borrow, default)]
    field: Option<Text<'a>>,
    #[serde(borrow, default)]
    name: Option<Text<'a>>,
    #[serde(borrow, default)]
    fields: Vec<FieldSchema<'a>>,
    #[serde(borrow, default)]
    parameters: Option<&'a RawValue>,
}

/// The header Debezium puts on the create of a primary-key change (the
/// old key; the delete of the old key carries `__debezium.newkey`), its
/// value the key struct as the worker's header converter writes it:
/// JSON-like `{"id":1001}` by Kafka Connect's `SimpleHeaderConverter`,
/// or the JSON converter's form (with or without `schema`/`payload`).
pub const OLD_KEY_HEADER: &str = "__debezium.oldkey";

/// Decode one event; `Ok(None)` for events without a row change.
/// `old_key` is the [`OLD_KEY_HEADER`] value when the record has one:
/// its columns go into the change's `before`, so that the create of a
/// key change removes the old key's row in its own transaction (the
/// delete of the old key usually travels in another partition).
///
/// # Errors
/// [`Error::BadRecord`]: no `op` or `source`, an unknown `op`, a row that
/// is not an object, an encoded value that does not decode.
pub fn decode<'a>(
    event: &Object<'a>,
    key: Option<&'a [u8]>,
    old_key: Option<&'a [u8]>,
) -> Result<Option<Decoded<'a>>, Error> {
    fn bad(m: impl std::fmt::Display) -> Error {
        Error::bad_record(m)
    }
    let wrapped = match (event.get("payload"), event.get("schema")) {
        (Some(p), Some(s)) => {
            if json::is_null(p) {
                return Ok(None);
            }
            let payload = Object::from_raw(p)
                .map_err(|_| bad(format!("`payload` is {}, not an object", json::kind(p))))?;
            Some((payload, s))
        }
        _ => None,
    };
    let (payload, schema) = match &wrapped {
        Some((p, s)) => (p, Some(*s)),
        None => (event, None),
    };
    let Some(op) = payload.get_str("op").map_err(bad)? else {
        if carries_no_change(payload) {
            return Ok(None);
        }
        return Err(bad(
            "Debezium event without `op` (nor a heartbeat, schema change or transaction boundary)",
        ));
    };
    let op = match op.as_ref() {
        "c" | "u" | "r" => Op::Upsert,
        "d" => Op::Delete,
        "t" => Op::Truncate,
        "m" => return Ok(None),
        other => return Err(bad(format!("unknown Debezium op `{other}`"))),
    };
    let source = payload
        .get("source")
        .ok_or_else(|| bad("Debezium event without `source`"))?;
    let source = Object::from_raw(source).map_err(|e| bad(format!("`source`: {e}")))?;
    let text = |name: &str| source.get_str(name).map_err(bad);
    let table = text("table")?.ok_or_else(|| bad("Debezium `source` without `table`"))?;
    let connector = text("connector")?;
    let mysql = matches!(connector.as_deref(), Some("mysql" | "mariadb"));
    let database = match (mysql, text("schema")?, text("db")?) {
        (false, Some(schema), _) => schema,
        (_, _, Some(db)) => db,
        (true, Some(schema), None) => schema,
        (_, None, None) => return Err(bad("Debezium `source` without `db` or `schema`")),
    };
    // A position field that is there must be a non-negative integer: a
    // silent fallback to the Kafka offset would order the row otherwise.
    let int = |name: &str| -> Result<Option<u64>, Error> {
        match source.get(name) {
            None => Ok(None),
            Some(v) if json::is_null(v) => Ok(None),
            Some(v) => v.get().parse::<u64>().map(Some).map_err(|_| {
                bad(format!(
                    "`source.{name}` is {}, not a non-negative integer",
                    v.get().chars().take(40).collect::<String>()
                ))
            }),
        }
    };
    let pos = if let Some(lsn) = int("lsn")? {
        Some(position::pg(lsn))
    } else if let (Some(file), Some(p)) = (text("file")?, int("pos")?) {
        Some(position::mysql(&file, p, int("row")?.unwrap_or(0)).map_err(bad)?)
    } else if let (Some(commit), Some(change)) = (text("commit_lsn")?, text("change_lsn")?) {
        Some(position::mssql(&commit, &change))
    } else {
        None
    };
    let which = if op == Op::Upsert { "after" } else { "before" };
    let row = match payload.get(which).filter(|v| !json::is_null(v)) {
        Some(raw) => {
            let row = Object::from_raw(raw)
                .map_err(|_| bad(format!("`{which}` is {}, not an object", json::kind(raw))))?;
            let types = match schema {
                Some(s) => logical_types(s, which)?,
                None => Vec::new(),
            };
            columns(&row, &types)?
        }
        None if op == Op::Upsert => return Err(bad("Debezium upsert without `after`")),
        None => Vec::new(),
    };
    // An update's `before` (the whole row with PostgreSQL's `REPLICA
    // IDENTITY FULL` or MySQL, the key alone or null otherwise) shows a
    // changed key.
    let before = match payload.get("before").filter(|v| !json::is_null(v)) {
        Some(raw) if op == Op::Upsert => {
            let row = Object::from_raw(raw)
                .map_err(|_| bad(format!("`before` is {}, not an object", json::kind(raw))))?;
            let types = match schema {
                Some(s) => logical_types(s, "before")?,
                None => Vec::new(),
            };
            columns(&row, &types)?
        }
        _ => Vec::new(),
    };
    let mut before = before;
    if op == Op::Upsert
        && let Some(header) = old_key
    {
        // A header that is not a key struct is not the change's to refuse
        // (the record itself is fine): it is left out, with a warning.
        match key_columns(Some(header)) {
            Ok(columns) => {
                for (name, v) in columns {
                    if !before.iter().any(|(c, _)| c == &name) {
                        before.push((name, v));
                    }
                }
            }
            Err(_) => sluice_guest::log::warn(format!(
                "{OLD_KEY_HEADER} header {:?} is not a JSON key struct: the old key's row of this key change is removed by its delete event alone",
                String::from_utf8_lossy(header)
            )),
        }
    }
    Ok(Some(Decoded {
        op,
        database,
        table,
        pos,
        key: key_columns(key)?,
        row,
        before,
    }))
}

/// A column's logical type: (column, type name, decimal scale).
type Logical = (String, String, Option<u32>);

/// The logical types of the fields of struct `which` (`after`, `before`)
/// in the event's schema.
fn logical_types(schema: &RawValue, which: &str) -> Result<Vec<Logical>, Error> {
    let schema: FieldSchema<'_> = json::from_slice(schema.get().as_bytes())
        .map_err(|e| Error::bad_record(format!("`schema` is not a Kafka Connect schema: {e}")))?;
    let Some(row) = schema
        .fields
        .iter()
        .find(|f| f.field.as_deref() == Some(which))
    else {
        return Ok(Vec::new());
    };
    Ok(field_types(&row.fields))
}

/// The logical types of a struct's `fields`.
fn field_types(fields: &[FieldSchema<'_>]) -> Vec<Logical> {
    let mut out = Vec::new();
    for f in fields {
        let (Some(field), Some(name)) = (&f.field, &f.name) else {
            continue;
        };
        let scale = match f.parameters.map(Object::from_raw) {
            Some(Ok(p)) => p
                .get_str("scale")
                .ok()
                .flatten()
                .and_then(|s| s.parse::<u32>().ok()),
            _ => None,
        };
        out.push((field.to_string(), name.to_string(), scale));
    }
    out
}

/// The row's columns, values of encoded logical types decoded.
fn columns<'a>(row: &Object<'a>, types: &[Logical]) -> Result<Columns<'a>, Error> {
    row.iter()
        .map(|(name, raw)| {
            let logical = types.iter().find(|(c, _, _)| c == name);
            let value = match logical {
                Some((_, t, scale)) => match convert::decode(t, *scale, raw)
                    .map_err(|e| Error::bad_record(format!("column `{name}`: {e}")))?
                {
                    Some(text) => Val::Text(text),
                    None => Val::Raw(raw),
                },
                None => Val::Raw(raw),
            };
            Ok((Cow::Owned(name.to_string()), value))
        })
        .collect()
}

/// The key struct's fields (with or without the schema wrapper); empty
/// without a key.
fn key_columns(key: Option<&[u8]>) -> Result<Columns<'_>, Error> {
    let Some(key) = key else {
        return Ok(Vec::new());
    };
    let Ok(top) = Object::parse(key) else {
        return Err(Error::bad_record(
            "the Kafka key is not a JSON object (Debezium's key struct)",
        ));
    };
    let (inner, types) = match (top.get("payload"), top.get("schema")) {
        (Some(p), Some(s)) => {
            let inner = Object::from_raw(p).map_err(|_| {
                Error::bad_record(format!(
                    "the key's `payload` is {}, not an object",
                    json::kind(p)
                ))
            })?;
            // Encoded key columns (a precise decimal key) are decoded as
            // the row's are.
            let types = json::from_slice::<FieldSchema<'_>>(s.get().as_bytes())
                .map(|schema| field_types(&schema.fields))
                .unwrap_or_default();
            (inner, types)
        }
        _ => (top, Vec::new()),
    };
    columns(&inner, &types)
}
