//! The change record: what the map stage writes and the sink stage reads.
//!
//! One JSON object per source row change, e.g.
//! `{"op":"upsert","source":"shop.customers","table":"customers",
//! "pos":"mysql:0000000003:00000000000000001234:0000000000",
//! "key":{"id":1},"row":{"id":1,"name":"Acme","revenue":"12.50"}}`.
//! `op` is `upsert`, `delete` or `truncate`; `table` the destination;
//! `pos` the source position ([`crate::position`]); `key` the primary key
//! columns; `row` the columns after the change (`upsert` only);
//! `old_key` the primary key before the change, only on an upsert that
//! changed it (Maxwell's `old`, Debezium's `before`): the sink removes
//! that row in the same transaction. Values
//! are the source's JSON text, byte for byte, except Debezium values the
//! schema says are encoded (decimals, dates), which are written as their
//! SQL text (a JSON string).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use sluice_guest::json::{self, RawValue, Text};

/// What a change does to the destination table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Insert the row, or update it when its key exists.
    Upsert,
    /// Remove the row with this key.
    Delete,
    /// Remove every row of the table (Debezium `t`, with `truncate=apply`).
    Truncate,
}

/// A column value of a decoded change.
#[derive(Debug, Clone)]
pub enum Val<'a> {
    /// The source's JSON text.
    Raw(&'a RawValue),
    /// A value decoded from its wire encoding, as SQL text.
    Text(String),
}

/// Named column values, in source order.
pub type Columns<'a> = Vec<(Cow<'a, str>, Val<'a>)>;

/// A change decoded from a Maxwell or Debezium event.
#[derive(Debug, Clone)]
pub struct Decoded<'a> {
    /// What it does.
    pub op: Op,
    /// Source database (Maxwell, Debezium MySQL) or schema (Debezium
    /// PostgreSQL, SQL Server).
    pub database: Cow<'a, str>,
    /// Source table.
    pub table: Cow<'a, str>,
    /// Source position ([`crate::position`]); `None`: the event has none.
    pub pos: Option<String>,
    /// Primary key columns from the Kafka key (may be empty).
    pub key: Columns<'a>,
    /// The row after the change (`upsert`), or before it (`delete`, where
    /// it only serves to find the key).
    pub row: Columns<'a>,
    /// Of an update, the values before it where the event carries them
    /// (Maxwell's `old`: the changed columns only; Debezium's `before`:
    /// the whole row, or the key only, or nothing, by the source's
    /// replica identity); empty otherwise.
    pub before: Columns<'a>,
}

impl Decoded<'_> {
    /// `database.table`.
    pub fn source(&self) -> String {
        format!("{}.{}", self.database, self.table)
    }
}

/// Write the change record of `d` for destination `table` at `pos` with
/// primary key `key` (and `old_key`, the key before an upsert that
/// changed it) into `out` (cleared first).
pub fn write(
    out: &mut Vec<u8>,
    d: &Decoded<'_>,
    table: &str,
    pos: &str,
    key: &Columns<'_>,
    old_key: Option<&Columns<'_>>,
) {
    out.clear();
    out.extend_from_slice(b"{\"op\":");
    json::write(out, &d.op);
    out.extend_from_slice(b",\"source\":");
    json::write_str(out, &d.source());
    out.extend_from_slice(b",\"table\":");
    json::write_str(out, table);
    out.extend_from_slice(b",\"pos\":");
    json::write_str(out, pos);
    out.extend_from_slice(b",\"key\":");
    write_columns(out, key);
    if d.op == Op::Upsert {
        out.extend_from_slice(b",\"row\":");
        write_columns(out, &d.row);
        if let Some(old) = old_key {
            out.extend_from_slice(b",\"old_key\":");
            write_columns(out, old);
        }
    }
    out.push(b'}');
}

/// The JSON text of `v`, as [`write_columns`] writes it (so two values
/// compare by what the sink would bind).
pub fn text_of(v: &Val<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    match v {
        Val::Raw(raw) => out.extend_from_slice(raw.get().as_bytes()),
        Val::Text(t) => json::write_str(&mut out, t),
    }
    out
}

/// `a` and `b` are the same value: two JSON numbers by their exact value
/// (`1` and `1.0`, MySQL's DECIMAL printed with and without its scale),
/// anything else by its JSON text.
pub fn same(a: &Val<'_>, b: &Val<'_>) -> bool {
    let number = |v: &Val<'_>| match v {
        Val::Raw(r)
            if r.get()
                .starts_with(|c: char| c == '-' || c.is_ascii_digit()) =>
        {
            crate::number::Decimal::parse(r.get())
        }
        _ => None,
    };
    match (number(a), number(b)) {
        (Some(x), Some(y)) => x == y,
        _ => text_of(a) == text_of(b),
    }
}

/// The value of column `name` in `columns`: the exact name, else the one
/// name equal to it ignoring ASCII case (MySQL's column names ignore
/// case; two names that differ only in case are ambiguous and match
/// neither).
pub fn find<'c, 'a>(columns: &'c Columns<'a>, name: &str) -> Option<&'c Val<'a>> {
    find_name(columns.iter().map(|(c, _)| c.as_ref()), name).map(|i| &columns[i].1)
}

/// The index of `name` among `names` by the rule of [`find`]: the exact
/// name, else the one name equal to it ignoring ASCII case.
pub fn find_name<'n>(names: impl Iterator<Item = &'n str> + Clone, name: &str) -> Option<usize> {
    if let Some(i) = names.clone().position(|n| n == name) {
        return Some(i);
    }
    let mut folded = names
        .enumerate()
        .filter(|(_, n)| n.eq_ignore_ascii_case(name));
    match (folded.next(), folded.next()) {
        (Some((i, _)), None) => Some(i),
        _ => None,
    }
}

/// Write columns as a JSON object.
pub fn write_columns(out: &mut Vec<u8>, columns: &Columns<'_>) {
    out.push(b'{');
    for (i, (name, value)) in columns.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json::write_str(out, name);
        out.push(b':');
        match value {
            Val::Raw(raw) => out.extend_from_slice(raw.get().as_bytes()),
            Val::Text(t) => json::write_str(out, t),
        }
    }
    out.push(b'}');
}

/// The fields of a change record the sink reads.
#[derive(Debug, Deserialize)]
pub struct ChangeIn<'a> {
    /// What it does.
    pub op: Op,
    /// `database.table` it came from.
    #[serde(borrow)]
    pub source: Text<'a>,
    /// Destination table.
    #[serde(borrow)]
    pub table: Text<'a>,
    /// Source position.
    #[serde(borrow)]
    pub pos: Text<'a>,
    /// Primary key columns (an object).
    #[serde(borrow)]
    pub key: &'a RawValue,
    /// Row after the change (an object; `upsert` only).
    #[serde(borrow, default)]
    pub row: Option<&'a RawValue>,
    /// Primary key before the change (an object; an upsert that changed
    /// its key only).
    #[serde(borrow, default)]
    pub old_key: Option<&'a RawValue>,
}
