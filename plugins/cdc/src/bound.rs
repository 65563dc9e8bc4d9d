//! A change checked and bound to its table's columns ([`Bound`]), as the
//! sink keeps it until a flush, and the shapes statements take it in.

use sluice_guest::sql::Value;

use crate::change::Op;
use crate::table::Table;

/// One change, checked and bound, waiting for the flush.
#[derive(Debug)]
pub struct Bound {
    /// What it does (upsert or delete).
    pub op: Op,
    /// Source position (the row's `position_column` after it).
    pub pos: String,
    /// Column indexes the upsert sets (key columns included); empty for
    /// a delete.
    pub set: Vec<usize>,
    /// The values: of `set` for an upsert, of the key for a delete.
    pub params: Vec<Value>,
    /// An upsert kept in place of a delete of its key: that delete, run
    /// before it (so columns the upsert leaves out do not keep the old
    /// row's values).
    pub after_delete: Option<Box<Bound>>,
}

impl Bound {
    /// Its key values, in the order of `key` (column indexes): a
    /// delete's parameters are its key; an upsert's are found in `set`.
    pub fn key_values(&self, key: &[usize]) -> Vec<Value> {
        match self.op {
            Op::Delete => self.params.clone(),
            _ => key
                .iter()
                .filter_map(|k| self.set.iter().position(|s| s == k))
                .map(|n| self.params[n].clone())
                .collect(),
        }
    }

    /// Its key as `col=value, …`, for messages.
    pub fn key_text(&self, table: &Table, key: &[usize]) -> String {
        key.iter()
            .zip(self.key_values(key))
            .map(|(&i, v)| {
                let v = match v {
                    Value::Null => "NULL".to_string(),
                    Value::Integer(n) => n.to_string(),
                    Value::Real(r) => r.to_string(),
                    Value::Text(t) => t,
                    Value::Blob(b) => format!("{} bytes", b.len()),
                };
                format!("{}={v}", table.columns[i].name)
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The parameters of `changes` as rows of one statement: each change's
/// values, then its position.
pub fn row_params(changes: &[Bound]) -> Vec<Value> {
    let mut params = Vec::with_capacity(changes.iter().map(|b| b.params.len() + 1).sum());
    for b in changes {
        params.extend(b.params.iter().cloned());
        params.push(Value::from(b.pos.as_str()));
    }
    params
}

/// Key values as bytes that are equal exactly when the values are: per
/// value its type, then its bytes (text and bytes after their length).
pub fn key_bytes<'a>(values: impl Iterator<Item = &'a Value>) -> Vec<u8> {
    let mut k = Vec::with_capacity(16);
    for v in values {
        let bytes: &[u8] = match v {
            Value::Null => {
                k.push(0);
                continue;
            }
            Value::Integer(n) => {
                k.push(1);
                k.extend_from_slice(&n.to_le_bytes());
                continue;
            }
            Value::Real(r) => {
                k.push(2);
                k.extend_from_slice(&r.to_bits().to_le_bytes());
                continue;
            }
            Value::Text(t) => {
                k.push(3);
                t.as_bytes()
            }
            Value::Blob(b) => {
                k.push(4);
                b
            }
        };
        k.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        k.extend_from_slice(bytes);
    }
    k
}

/// `changes` in statements of at most `rows` changes each, in order.
pub fn chunks(changes: Vec<Bound>, rows: usize) -> impl Iterator<Item = Vec<Bound>> {
    let mut it = changes.into_iter().peekable();
    std::iter::from_fn(move || {
        it.peek()?;
        Some(it.by_ref().take(rows.max(1)).collect())
    })
}
