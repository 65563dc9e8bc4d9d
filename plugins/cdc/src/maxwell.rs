//! Maxwell's daemon events (<https://maxwells-daemon.io/dataformat/>), e.g.
//! `{"database":"shop","table":"customers","type":"update","ts":1449786310,
//! "xid":940752,"xoffset":0,"position":"master.000006:800911",
//! "data":{"id":1,"name":"Acme"},"old":{"name":"Acm"}}` with the default
//! hash key `{"database":"shop","table":"customers","pk.id":1}`.
//!
//! `insert`, `update` and `bootstrap-insert` upsert from `data` (an
//! update's `old` holds the previous values of the columns it changed,
//! so a changed primary key shows there), `delete` deletes the row `data`
//! names; bootstrap markers, DDL (`table-create`,
//! `database-alter`, …) and heartbeats carry no row change and are
//! skipped. The position is `position` (`output_binlog_position=true`)
//! with `xoffset`; without it, the Kafka offset.

use std::borrow::Cow;

use sluice_guest::Error;
use sluice_guest::json::{self, Object, RawValue};

use crate::change::{Columns, Decoded, Op, Val};
use crate::position;

/// True when `event` looks like a Maxwell event (`type` and `database`).
pub fn looks_like(event: &Object<'_>) -> bool {
    event.get("type").is_some() && event.get("database").is_some()
}

/// Decode one event; `Ok(None)` for events without a row change.
///
/// # Errors
/// [`Error::BadRecord`]: no `type`, `database`, `table` or `data`, `data`
/// not an object, a malformed `position`.
pub fn decode<'a>(event: &Object<'a>, key: Option<&'a [u8]>) -> Result<Option<Decoded<'a>>, Error> {
    let field = |name: &str| -> Result<Cow<'a, str>, Error> {
        event
            .get_str(name)
            .map_err(Error::bad_record)?
            .ok_or_else(|| Error::bad_record(format!("Maxwell event without `{name}`")))
    };
    let op = match field("type")?.as_ref() {
        "insert" | "update" | "bootstrap-insert" => Op::Upsert,
        "delete" => Op::Delete,
        _ => return Ok(None),
    };
    let (database, table) = (field("database")?, field("table")?);
    let data = event
        .get("data")
        .ok_or_else(|| Error::bad_record("Maxwell row event without `data`"))?;
    let row = Object::from_raw(data)
        .map_err(|_| Error::bad_record(format!("`data` is {}, not an object", json::kind(data))))?;
    let before = match event.get("old").filter(|v| !json::is_null(v)) {
        Some(old) if op == Op::Upsert => Object::from_raw(old)
            .map_err(|_| Error::bad_record(format!("`old` is {}, not an object", json::kind(old))))?
            .iter()
            .map(|(k, v)| (Cow::Owned(k.to_string()), Val::Raw(v)))
            .collect(),
        _ => Vec::new(),
    };
    let xoffset = match event.get("xoffset") {
        None => 0,
        Some(v) if json::is_null(v) => 0,
        Some(v) => v.get().parse::<u64>().map_err(|_| {
            Error::bad_record(format!(
                "Maxwell `xoffset` is {}, not a non-negative integer",
                v.get().chars().take(40).collect::<String>()
            ))
        })?,
    };
    let pos = match event.get_str("position").map_err(Error::bad_record)? {
        Some(p) => Some(position::maxwell(&p, xoffset).map_err(Error::bad_record)?),
        None => None,
    };
    Ok(Some(Decoded {
        op,
        database,
        table,
        pos,
        key: key_columns(key),
        row: row
            .iter()
            .map(|(k, v)| (Cow::Owned(k.to_string()), Val::Raw(v)))
            .collect(),
        before,
    }))
}

/// The primary key columns of Maxwell's Kafka key, in either of its
/// formats (`kafka_key_format`; zendesk/maxwell `RowIdentity.toKeyJson`):
/// `hash` (the default), `{"database":…,"table":…,"pk.id":1}`, the
/// `pk.*` fields without the prefix; `array`, `["db","table",[{"id":1},
/// {"part2":"x"}]]`, the members of the third element's objects. Empty
/// for a table without a primary key (Maxwell then keys by a random
/// `_uuid`), another key format or no key.
fn key_columns(key: Option<&[u8]>) -> Columns<'_> {
    let Some(key) = key else {
        return Vec::new();
    };
    if let Ok((_, _, pks)) = json::from_slice::<(&RawValue, &RawValue, Vec<Object<'_>>)>(key) {
        return pks
            .iter()
            .flat_map(|pk| {
                pk.iter()
                    .map(|(k, v)| (Cow::Owned(k.to_string()), Val::Raw(v)))
                    .collect::<Vec<_>>()
            })
            .collect();
    }
    let Ok(key) = Object::parse(key) else {
        return Vec::new();
    };
    key.iter()
        .filter_map(|(k, v)| Some((Cow::Owned(k.strip_prefix("pk.")?.to_string()), Val::Raw(v))))
        .collect()
}
