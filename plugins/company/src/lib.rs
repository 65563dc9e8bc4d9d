//! `company`: Maxwell CDC events of one table → change records.
//!
//! Input: Maxwell's daemon JSON (<https://maxwells-daemon.io/dataformat/>),
//! one event per Kafka record, e.g.
//! `{"database":"shop","table":"company","type":"update","ts":1449786310,
//! "xid":940752,"commit":true,"data":{"id":1,"name":"Acme"},"old":{"name":"Acm"}}`
//! with Maxwell's default hash key `{"database":"shop","table":"company","pk.id":1}`.
//!
//! Map stage:
//! - keeps events whose `table` equals config `table` (default `company`)
//!   and, when config `database` is set, whose `database` equals it;
//! - `insert`, `update`, `bootstrap-insert` → an `upsert` change;
//!   `delete` → a `delete` change;
//! - `bootstrap-start`, `bootstrap-complete`, DDL events (`table-alter`,
//!   `database-create`, …, which carry no `data`), other tables and
//!   tombstones produce nothing (the host counts them as filtered);
//! - malformed JSON, a DML event without a `data` object or without a
//!   primary key is a bad record for that record only.
//!
//! Output value, one per kept event:
//! `{"op":"upsert","database":"shop","table":"company","pk":{"id":1},"data":{…},"ts":1449786310}`
//! where `pk` comes from the key's `pk.*` fields when present, else
//! `data.id`, and `data` and every `pk` value are the source bytes, unchanged
//! (`999999999999.999998` and `"0000-00-00 00:00:00"` survive exactly).
//! Output key: the `pk` object, so a compacted output topic keeps one row
//! per primary key.
//!
//! Sink stage (uses the host's `sql` capability): keeps table `companies`
//! (config `sink_table`) current — one row per primary key with the row
//! JSON, the idempotency key and source offset of the last applied change
//! and its Kafka timestamp as `updated_at_ms`. `upsert` inserts or
//! replaces, `delete` removes.

use sluice_guest::json::{self, Object, RawValue};
use sluice_guest::sql::{self, Value};
use sluice_guest::{Config, Emit, Error, Mapper, Record, Sink, SinkRecord};

/// What a Maxwell `type` means for the `companies` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Insert or replace the row.
    Upsert,
    /// Remove the row.
    Delete,
}

impl Op {
    /// The `op` field value.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Upsert => "upsert",
            Op::Delete => "delete",
        }
    }
}

/// Classify a Maxwell event type: `Some(op)` for row changes, `None` for
/// events that carry no row change (bootstrap markers, DDL, heartbeats).
pub fn classify(event_type: &str) -> Option<Op> {
    match event_type {
        "insert" | "update" | "bootstrap-insert" => Some(Op::Upsert),
        "delete" => Some(Op::Delete),
        _ => None,
    }
}

/// The company map stage.
pub struct Company {
    table: String,
    database: Option<String>,
    out: Vec<u8>,
    pk: Vec<u8>,
}

impl Mapper for Company {
    fn new(config: &Config) -> Result<Self, String> {
        Ok(Company {
            table: config.get_or("table", "company").to_string(),
            database: config.get("database").map(str::to_string),
            out: Vec::with_capacity(512),
            pk: Vec::with_capacity(64),
        })
    }

    fn map(&mut self, record: &Record<'_>, out: &mut Emit<'_>) -> Result<(), Error> {
        let Some(value) = record.value else {
            return Ok(()); // Maxwell never writes tombstones: nothing to apply.
        };
        let event =
            Object::parse(value).map_err(|e| Error::bad_record(format!("not JSON: {e}")))?;
        let table = event.get_str("table").map_err(Error::bad_record)?;
        if table.as_deref() != Some(self.table.as_str()) {
            return Ok(());
        }
        let database = event.get_str("database").map_err(Error::bad_record)?;
        if let Some(want) = &self.database
            && database.as_deref() != Some(want.as_str())
        {
            return Ok(());
        }
        let event_type = event
            .get_str("type")
            .map_err(Error::bad_record)?
            .ok_or_else(|| Error::bad_record("Maxwell event without `type`"))?;
        let Some(op) = classify(&event_type) else {
            return Ok(());
        };
        let data = event
            .get("data")
            .filter(|d| !json::is_null(d))
            .ok_or_else(|| Error::bad_record(format!("`{event_type}` event without `data`")))?;
        // `data` is valid JSON already (the event parsed); it is only parsed
        // as an object when the key has no `pk.*` and `data.id` is needed.
        if !data.get().starts_with('{') {
            let kind = match data.get().as_bytes().first() {
                Some(b'[') => "an array",
                Some(b'"') => "a string",
                Some(b't' | b'f') => "a boolean",
                _ => "a number",
            };
            return Err(Error::bad_record(format!(
                "`data` is {kind}, not an object"
            )));
        }

        self.pk.clear();
        primary_key(record.key, data, &mut self.pk)?;

        let o = &mut self.out;
        o.clear();
        o.extend_from_slice(br#"{"op":""#);
        o.extend_from_slice(op.as_str().as_bytes());
        o.extend_from_slice(br#"","database":"#);
        match &database {
            Some(d) => json::write_str(o, d),
            None => o.extend_from_slice(b"null"),
        }
        o.extend_from_slice(br#","table":"#);
        json::write_str(o, &self.table);
        o.extend_from_slice(br#","pk":"#);
        o.extend_from_slice(&self.pk);
        o.extend_from_slice(br#","data":"#);
        o.extend_from_slice(data.get().as_bytes());
        if let Some(ts) = event.get("ts") {
            o.extend_from_slice(br#","ts":"#);
            o.extend_from_slice(ts.get().as_bytes());
        }
        o.push(b'}');
        out.emit(Some(&self.pk), Some(&self.out));
        Ok(())
    }
}

/// Write the primary key object into `pk`: the Kafka key's `pk.*` fields
/// (Maxwell's hash key format) with the prefix removed, else `{"id":…}`
/// from the row (`data`, a JSON object). Values are copied byte for byte.
fn primary_key(key: Option<&[u8]>, data: &RawValue, pk: &mut Vec<u8>) -> Result<(), Error> {
    pk.push(b'{');
    if let Some(key) = key
        && let Ok(k) = Object::parse(key)
    {
        for (name, value) in k.iter() {
            if let Some(col) = name.strip_prefix("pk.") {
                if pk.len() > 1 {
                    pk.push(b',');
                }
                json::write_str(pk, col);
                pk.push(b':');
                pk.extend_from_slice(value.get().as_bytes());
            }
        }
    }
    if pk.len() == 1 {
        let row = Object::from_raw(data)
            .map_err(|e| Error::bad_record(format!("`data` is not an object: {e}")))?;
        let id = row.get("id").filter(|v| !json::is_null(v)).ok_or_else(|| {
            Error::bad_record("no primary key: no `pk.*` in the key and no `data.id`")
        })?;
        pk.extend_from_slice(br#""id":"#);
        pk.extend_from_slice(id.get().as_bytes());
    }
    pk.push(b'}');
    Ok(())
}

/// The company sink stage: applies change records to a SQL table.
pub struct CompanySink {
    table: String,
    create: String,
    upsert: String,
    delete: String,
}

fn valid_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 63
}

impl Sink for CompanySink {
    fn new(config: &Config) -> Result<Self, String> {
        let table = config.get_or("sink_table", "companies").to_string();
        if !valid_identifier(&table) {
            return Err(format!(
                "sink_table `{table}` is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*)"
            ));
        }
        Ok(CompanySink {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                 pk TEXT PRIMARY KEY, \
                 row_json TEXT NOT NULL, \
                 idempotency_key TEXT NOT NULL, \
                 source_topic TEXT NOT NULL, \
                 source_partition INTEGER NOT NULL, \
                 source_offset BIGINT NOT NULL, \
                 updated_at_ms BIGINT NOT NULL)"
            ),
            upsert: format!(
                "INSERT INTO {table} (pk, row_json, idempotency_key, source_topic, source_partition, source_offset, updated_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (pk) DO UPDATE SET row_json = excluded.row_json, \
                 idempotency_key = excluded.idempotency_key, source_topic = excluded.source_topic, \
                 source_partition = excluded.source_partition, source_offset = excluded.source_offset, \
                 updated_at_ms = excluded.updated_at_ms"
            ),
            delete: format!("DELETE FROM {table} WHERE pk = $1"),
            table,
        })
    }

    fn open(
        &mut self,
        _ctx: &sluice_guest::PartitionContext,
    ) -> Result<sluice_guest::OpenAnswer, Error> {
        sql::execute(&self.create, &[])?;
        Ok(sluice_guest::OpenAnswer::Proceed)
    }

    fn write(&mut self, r: &SinkRecord<'_>) -> Result<(), Error> {
        let Some(value) = r.record.value else {
            return Err(Error::bad_record(
                "tombstone: the company sink expects change records",
            ));
        };
        let change = Object::parse(value)
            .map_err(|e| Error::bad_record(format!("not a change record: {e}")))?;
        let op = change
            .get_str("op")
            .map_err(Error::bad_record)?
            .ok_or_else(|| Error::bad_record("change record without `op`"))?;
        let pk = change
            .get("pk")
            .ok_or_else(|| Error::bad_record("change record without `pk`"))?
            .get()
            .to_string();
        match op.as_ref() {
            "upsert" => {
                let data = change
                    .get("data")
                    .ok_or_else(|| Error::bad_record("upsert without `data`"))?;
                sql::execute(
                    &self.upsert,
                    &[
                        Value::Text(pk),
                        Value::from(data.get()),
                        Value::from(r.idempotency_key),
                        Value::from(r.record.topic),
                        Value::from(r.record.partition),
                        Value::Integer(r.record.offset),
                        Value::Integer(r.record.timestamp),
                    ],
                )?;
            }
            "delete" => {
                sql::execute(&self.delete, &[Value::Text(pk)])?;
            }
            other => {
                return Err(Error::bad_record(format!(
                    "unknown op `{other}` for table {}",
                    self.table
                )));
            }
        }
        Ok(())
    }
}

sluice_guest::export!(map: Company, sink: CompanySink);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_guest::testing;

    fn run(values: &[&[u8]]) -> testing::Mapped {
        testing::map_values::<Company>(&Config::default(), values).unwrap()
    }

    fn value(m: &testing::Mapped, i: usize) -> String {
        String::from_utf8(m.outputs[i].value.clone().unwrap()).unwrap()
    }

    #[test]
    fn insert_becomes_upsert_with_exact_data() {
        let m = run(&[
            br#"{"database":"shop","table":"company","type":"insert","ts":1,"data":{"id":1,"v":999999999999.999998,"d":"0000-00-00 00:00:00"}}"#,
        ]);
        assert_eq!(
            value(&m, 0),
            r#"{"op":"upsert","database":"shop","table":"company","pk":{"id":1},"data":{"id":1,"v":999999999999.999998,"d":"0000-00-00 00:00:00"},"ts":1}"#
        );
        assert_eq!(m.outputs[0].key.as_deref(), Some(&br#"{"id":1}"#[..]));
    }

    #[test]
    fn data_that_is_not_an_object_is_a_bad_record_with_or_without_a_key() {
        for key in [None, Some(&br#"{"pk.id":1}"#[..])] {
            let records: Vec<Record<'_>> = [
                &br#"{"table":"company","type":"insert","data":[1,2]}"#[..],
                br#"{"table":"company","type":"insert","data":"x"}"#,
                br#"{"table":"company","type":"insert","data":7}"#,
                br#"{"table":"company","type":"insert","data":{"id":1}}"#,
            ]
            .iter()
            .enumerate()
            .map(|(i, v)| Record {
                key,
                ..Record::with_value("t", 0, i as i64, v)
            })
            .collect();
            let m = testing::map::<Company>(&Config::default(), &records).unwrap();
            let messages: Vec<&str> = m.rejected.iter().map(|r| r.1.as_str()).collect();
            assert_eq!(
                messages,
                [
                    "`data` is an array, not an object",
                    "`data` is a string, not an object",
                    "`data` is a number, not an object",
                ],
                "key {key:?}"
            );
            assert_eq!(m.outputs.len(), 1);
        }
    }

    #[test]
    fn key_pk_fields_win_over_data_id() {
        let mut r = Record::with_value(
            "t",
            0,
            0,
            br#"{"database":"shop","table":"company","type":"delete","data":{"id":9,"code":"A"}}"#,
        );
        r.key = Some(br#"{"database":"shop","table":"company","pk.code":"A","pk.region":2}"#);
        let m = testing::map::<Company>(&Config::default(), &[r]).unwrap();
        assert_eq!(
            m.outputs[0].key.as_deref(),
            Some(&br#"{"code":"A","region":2}"#[..])
        );
        assert!(value(&m, 0).starts_with(r#"{"op":"delete""#));
    }

    #[test]
    fn skips_and_rejections() {
        let m = run(&[
            br#"{"database":"shop","table":"company","type":"bootstrap-start","data":{}}"#,
            br#"{"database":"shop","table":"company","type":"table-alter","ts":1450557744000,"sql":"alter"}"#,
            br#"{"database":"shop","table":"orders","type":"insert","data":{"id":1}}"#,
            br#"{"database":"shop","table":"company","type":"insert"}"#,
            b"{not json",
            b"\xff\xfe",
        ]);
        assert!(m.outputs.is_empty());
        let idx: Vec<u32> = m.rejected.iter().map(|r| r.0).collect();
        assert_eq!(idx, vec![3, 4, 5]);
        assert!(m.rejected[0].1.contains("without `data`"));
    }

    #[test]
    fn table_is_configurable() {
        let cfg = Config::from_pairs([("table", "orders")]);
        let m = testing::map_values::<Company>(
            &cfg,
            &[br#"{"database":"shop","table":"orders","type":"insert","data":{"id":1}}"#],
        )
        .unwrap();
        assert_eq!(m.outputs.len(), 1);
    }
}
