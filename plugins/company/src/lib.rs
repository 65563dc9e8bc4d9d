//! `company`: Maxwell CDC events of one table → upsert records.
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
//! Output, one record per kept event, in Kafka's upsert convention (the
//! one a compacted topic and Kafka Connect's JDBC sink with
//! `pk.mode=record_key` and `delete.enabled=true` use):
//! - key: the primary key object, e.g. `{"id":1}`, from the key's `pk.*`
//!   fields when present, else `data.id`;
//! - value: for an `upsert`, the row (`data`) itself; for a `delete`,
//!   none (a tombstone).
//!
//! `data` and every `pk` value are the source bytes, unchanged
//! (`999999999999.999998` and `"0000-00-00 00:00:00"` survive exactly).
//! Maxwell's `database`, `table` and `ts` are not carried: the table is
//! the configured one, and the sink stamps rows with the Kafka timestamp.
//! An `update` whose `old` (the previous values of the columns it changed)
//! holds a primary key column with another value moved its row: the map
//! emits a tombstone for the old key before the upsert of the new one, so
//! the sink removes the old row in the same transaction.
//!
//! Sink stage (uses the host's `sql` capability): keeps table `companies`
//! (config `sink_table`) current — one row per primary key with the row
//! JSON, the idempotency key and source offset of the last applied change
//! and its Kafka timestamp as `updated_at_ms`. A record with a value
//! inserts or replaces the row of its key, a tombstone removes it; the
//! sink takes both from the record as they are, without parsing them
//! again (the map stage wrote them). The SDK's `sql::Table` hands a
//! chunk's changes to the host's bulk path (`sql.apply`), which keeps
//! each key's last change and writes them in multi-row statements.

use serde::Deserialize;
use sluice_guest::json::{self, Object, RawValue, Text};
use sluice_guest::sql::{self, Change, Table, Value};
use sluice_guest::{Config, Emit, Error, Mapper, Record, Sink, SinkRecord};

/// What a Maxwell `type` means for the `companies` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Insert or replace the row.
    Upsert,
    /// Remove the row.
    Delete,
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

/// `--config` keys of both stages.
#[derive(Debug, Deserialize)]
struct Settings {
    /// Source table to keep (`table`, default `company`).
    #[serde(default = "default_table")]
    table: String,
    /// Source database to keep (`database`, default: any).
    database: Option<String>,
    /// Destination table (`sink_table`, default `companies`).
    #[serde(default = "default_sink_table")]
    sink_table: String,
}

fn default_table() -> String {
    "company".into()
}

fn default_sink_table() -> String {
    "companies".into()
}

/// The fields of a Maxwell event this plugin reads.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow)]
    database: Option<Text<'a>>,
    #[serde(borrow)]
    table: Option<Text<'a>>,
    #[serde(borrow, rename = "type")]
    kind: Option<Text<'a>>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
    #[serde(borrow)]
    old: Option<&'a RawValue>,
}

/// The company map stage.
pub struct Company {
    settings: Settings,
    pk: Vec<u8>,
}

impl Mapper for Company {
    fn new(config: &Config) -> Result<Self, Error> {
        let settings = config.parse()?;
        Ok(Company {
            settings,
            pk: Vec::with_capacity(64),
        })
    }

    fn map(&mut self, record: &Record<'_>, out: &mut Emit<'_>) -> Result<(), Error> {
        let Some(value) = record.value else {
            return Ok(()); // Maxwell never writes tombstones: nothing to apply.
        };
        let event: Event<'_> = json::from_slice(value)?;
        let s = &self.settings;
        let other_db = s
            .database
            .as_ref()
            .is_some_and(|d| event.database.as_deref() != Some(d));
        if event.table.as_deref() != Some(s.table.as_str()) || other_db {
            return Ok(());
        }
        let kind = event
            .kind
            .ok_or_else(|| Error::bad_record("Maxwell event without `type`"))?;
        let Some(op) = classify(&kind) else {
            return Ok(());
        };
        let data = event
            .data
            .ok_or_else(|| Error::bad_record(format!("`{kind}` event without `data`")))?;
        if json::kind(data) != "an object" {
            return Err(Error::bad_record(format!(
                "`data` is {}, not an object",
                json::kind(data)
            )));
        }
        let key = record.key.and_then(|k| Object::parse(k).ok());
        let pk = primary_key(key.as_ref(), data)?;
        if let (Op::Upsert, Some(old)) = (op, event.old)
            && let Some(old_pk) = old_key(&pk, old)
        {
            self.pk.clear();
            json::write(&mut self.pk, &old_pk);
            out.emit(Some(&self.pk), None);
        }
        self.pk.clear();
        json::write(&mut self.pk, &pk);
        let row = match op {
            Op::Upsert => Some(data.get().as_bytes()),
            Op::Delete => None,
        };
        out.emit(Some(&self.pk), row);
        Ok(())
    }
}

/// The primary key: the Kafka key's `pk.*` fields (Maxwell's hash key
/// format, `key` parsed) without the prefix, else `{"id":…}` from the row
/// (`data`, a JSON object, parsed only then). Values are kept byte for
/// byte.
fn primary_key<'a>(key: Option<&'a Object<'a>>, data: &'a RawValue) -> Result<Object<'a>, Error> {
    let mut pk = Object::new();
    for (name, value) in key.iter().flat_map(|k| k.iter()) {
        if let Some(column) = name.strip_prefix("pk.") {
            pk.push(column, value);
        }
    }
    if pk.is_empty() {
        let row = Object::from_raw(data)
            .map_err(|e| Error::bad_record(format!("`data` is not an object: {e}")))?;
        let id = row.get("id").filter(|v| !json::is_null(v));
        let none = || Error::bad_record("no primary key: no `pk.*` in the key and no `data.id`");
        pk.push("id", id.ok_or_else(none)?);
    }
    Ok(pk)
}

/// The primary key before an update, when its `old` (an object of the
/// changed columns' previous values) changes a column of `pk`; `None`
/// otherwise (also when `old` is not an object or a previous value is
/// null: no row can have a null key).
fn old_key<'a>(pk: &Object<'a>, old: &'a RawValue) -> Option<Object<'a>> {
    let old = Object::from_raw(old).ok()?;
    let mut was = Object::new();
    let mut changed = false;
    for (name, now) in pk.iter() {
        let value = old.get(name).unwrap_or(now);
        if json::is_null(value) {
            return None;
        }
        changed |= value.get() != now.get();
        was.push(name.to_string(), value);
    }
    changed.then_some(was)
}

/// The company sink stage: applies upsert records (key = primary key,
/// value = row, tombstone = delete) to a SQL table.
pub struct CompanySink {
    create: String,
    table: Table,
}

/// The sink table's columns, in the order of [`change_row`]'s values.
const COLUMNS: [&str; 7] = [
    "pk",
    "row_json",
    "idempotency_key",
    "source_topic",
    "source_partition",
    "source_offset",
    "updated_at_ms",
];

impl Sink for CompanySink {
    fn new(config: &Config) -> Result<Self, Error> {
        let settings: Settings = config.parse()?;
        let name = sql::identifier("sink_table", &settings.sink_table)?;
        Ok(CompanySink {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {name} (pk TEXT PRIMARY KEY, row_json TEXT NOT NULL, \
                 idempotency_key TEXT NOT NULL, source_topic TEXT NOT NULL, \
                 source_partition INTEGER NOT NULL, source_offset BIGINT NOT NULL, updated_at_ms BIGINT NOT NULL)"
            ),
            table: Table::new(name, &COLUMNS, &["pk"])?,
        })
    }

    fn init(&mut self) -> Result<(), Error> {
        sql::execute(&self.create, &[])?;
        Ok(())
    }

    fn write(&mut self, r: &SinkRecord<'_>) -> Result<(), Error> {
        self.write_chunk(std::slice::from_ref(r))
            .map_err(|(_, e)| e)
    }

    /// The chunk's changes, in order, through [`Table::apply`] (multi-row
    /// statements; an error names the record the failing statement
    /// carried first).
    fn write_chunk(&mut self, records: &[SinkRecord<'_>]) -> Result<(), (usize, Error)> {
        let changes = records
            .iter()
            .enumerate()
            .map(|(i, r)| change_row(r).map_err(|e| (i, e)))
            .collect::<Result<Vec<Change>, _>>()?;
        self.table
            .apply(changes)
            .map_err(|e| (e.row, Error::from(e.error)))?;
        Ok(())
    }
}

/// A record's change: a delete of `[pk]` for a tombstone, else an upsert
/// of [`COLUMNS`]. The key and value are the map stage's output, taken as
/// they are.
fn change_row(r: &SinkRecord<'_>) -> Result<Change, Error> {
    let rec = &r.record;
    let key = rec
        .key
        .ok_or_else(|| Error::bad_record("no key: the company sink keys rows by the record key"))?;
    let pk = Value::from(text("key", key)?);
    Ok(match rec.value {
        None => Change::Delete(vec![pk]),
        Some(row) => Change::Upsert(vec![
            pk,
            Value::from(text("value", row)?),
            Value::from(r.idempotency_key),
            Value::from(rec.topic),
            Value::from(rec.partition),
            Value::Integer(rec.offset),
            Value::Integer(rec.timestamp),
        ]),
    })
}

/// `bytes` as UTF-8 text (the map stage writes JSON), else a bad record
/// naming the field (`key` or `value`).
fn text<'a>(field: &str, bytes: &'a [u8]) -> Result<&'a str, Error> {
    std::str::from_utf8(bytes)
        .map_err(|e| Error::bad_record(format!("the record {field} is not UTF-8 text: {e}")))
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
            r#"{"id":1,"v":999999999999.999998,"d":"0000-00-00 00:00:00"}"#
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
        assert_eq!(m.outputs[0].value, None, "a delete is a tombstone");
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
    fn the_sink_takes_key_and_value_as_they_are() {
        let mut r = Record::with_value("maxwell", 3, 42, br#"{"id":1,"v":1.10}"#);
        r.key = Some(br#"{"id":1}"#);
        r.timestamp = 1_700_000_000_123;
        let rec = SinkRecord {
            idempotency_key: "maxwell/3/42",
            record: r.clone(),
        };
        assert_eq!(
            change_row(&rec).unwrap(),
            Change::Upsert(vec![
                Value::from(r#"{"id":1}"#),
                Value::from(r#"{"id":1,"v":1.10}"#),
                Value::from("maxwell/3/42"),
                Value::from("maxwell"),
                Value::Integer(3),
                Value::Integer(42),
                Value::Integer(1_700_000_000_123),
            ])
        );

        let tombstone = SinkRecord {
            record: Record {
                value: None,
                ..r.clone()
            },
            ..rec.clone()
        };
        assert_eq!(
            change_row(&tombstone).unwrap(),
            Change::Delete(vec![Value::from(r#"{"id":1}"#)])
        );

        let keyless = SinkRecord {
            record: Record {
                key: None,
                ..r.clone()
            },
            ..rec.clone()
        };
        let e = change_row(&keyless).unwrap_err().to_string();
        assert!(e.contains("no key"), "{e}");

        let binary = SinkRecord {
            record: Record {
                value: Some(b"\xff"),
                ..r
            },
            ..rec
        };
        let e = change_row(&binary).unwrap_err().to_string();
        assert!(e.contains("value is not UTF-8"), "{e}");
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
