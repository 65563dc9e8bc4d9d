//! A change checked and bound to its table's columns ([`Bound`]), as the
//! sink keeps it until a flush, and how a chunk of them reaches the
//! host's bulk path ([`apply_chunk`]).

use sluice_guest::sql::{self, BatchError, Change, SqlError, Value};

use crate::change::Op;
use crate::number::Decimal;
use crate::position;
use crate::table::{Kind, Table};

/// `v`'s exact value when it is a number (an integer, or text that reads
/// as one): a whole number of 64 bits as itself (the common key, without
/// an allocation), any other as `-digitsEexponent`.
enum Exact {
    Int(i64),
    Text(String),
}

fn exact_number(v: &Value) -> Option<Exact> {
    let text = match v {
        Value::Integer(n) => return Some(Exact::Int(*n)),
        Value::Text(t) => t,
        _ => return None,
    };
    if let Ok(n) = text.parse::<i64>() {
        return Some(Exact::Int(n));
    }
    let d = Decimal::parse(text)?;
    if let Some(n) = d.integer().and_then(|n| i64::try_from(n).ok()) {
        return Some(Exact::Int(n));
    }
    Some(Exact::Text(format!(
        "{}{}E{}",
        if d.negative { "-" } else { "" },
        d.digits,
        d.exponent
    )))
}

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
    /// A delete of the row whose key values are `params`, at `pos`.
    pub fn delete(pos: &str, params: Vec<Value>) -> Bound {
        Bound {
            op: Op::Delete,
            pos: pos.to_string(),
            set: Vec::new(),
            params,
            after_delete: None,
        }
    }

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

/// Apply `chunk` to `table` through the host's bulk path: all deletes,
/// or all upserts of one column set, with key columns `key` (indexes)
/// and one position domain ([`chunks`]). With `guarded`, by
/// `sql.apply-versioned` on the position column from the chunk's domain
/// on ([`crate::position`]'s rule: a change older than its row, or whose
/// row's position is of another domain, is held back and not counted);
/// without, by `sql.apply` (a change applied in stream order). An
/// upsert sets its columns and the position; a delete carries its key
/// values, then its position. The host folds nothing here (the sink
/// kept one change per key) and sends the chunk as multi-row statements,
/// or by `COPY` on PostgreSQL from 256 changes on. The values are
/// copied: the chunk stays for [`crate::order::resolve`].
///
/// # Errors
/// The database's error, and the index in `chunk` of the change the
/// failing statement began with.
pub fn apply_chunk(
    table: &Table,
    key: &[usize],
    chunk: &[Bound],
    guarded: bool,
) -> Result<u64, BatchError> {
    let Some(first) = chunk.first() else {
        return Ok(0);
    };
    let name = |i: &usize| crate::table::quote(&table.columns[*i].name);
    let position = crate::table::quote(&table.position_column().name);
    let delete = first.op == Op::Delete;
    let mut columns: Vec<String> = if delete { key } else { &first.set[..] }
        .iter()
        .map(name)
        .collect();
    columns.push(position.clone());
    let key: Vec<String> = key.iter().map(name).collect();
    let target =
        sql::Table::new(&table.sql_name, &as_strs(&columns), &as_strs(&key)).map_err(|e| {
            BatchError {
                row: 0,
                error: SqlError {
                    message: e.to_string(),
                    code: "sluice".into(),
                },
            }
        })?;
    let changes: Vec<Change> = chunk
        .iter()
        .map(|b| {
            let mut values = Vec::with_capacity(b.params.len() + 1);
            values.extend(b.params.iter().cloned());
            if delete && !guarded {
                return Change::Delete(values);
            }
            values.push(Value::from(b.pos.as_str()));
            match delete {
                true => Change::Delete(values),
                false => Change::Upsert(values),
            }
        })
        .collect();
    if guarded {
        let low = Value::from(position::domain(&first.pos));
        target.apply_versioned(&position, low, changes)
    } else {
        target.apply(changes)
    }
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Key values (of columns `key` of `table`, indexes) as bytes that are
/// equal exactly when the database takes the values as equal: a value of
/// a number column by its exact value (`01`, `+1`, `1.0`, SQLite's
/// integer 1 for `true` are all 1; `1.5` and `1.50` one decimal), any
/// other by its type, then its bytes (text and bytes after their length).
pub fn key_bytes<'a>(
    table: &Table,
    key: &[usize],
    values: impl Iterator<Item = &'a Value>,
) -> Vec<u8> {
    let mut k = Vec::with_capacity(16);
    for (&i, v) in key.iter().zip(values) {
        let numeric = matches!(
            table.columns[i].kind,
            Kind::Integer(_) | Kind::Number | Kind::Float(_) | Kind::Boolean
        );
        match numeric.then(|| exact_number(v)).flatten() {
            Some(Exact::Int(n)) => {
                k.push(1);
                k.extend_from_slice(&n.to_le_bytes());
                continue;
            }
            Some(Exact::Text(n)) => {
                k.push(5);
                k.extend_from_slice(&(n.len() as u64).to_le_bytes());
                k.extend_from_slice(n.as_bytes());
                continue;
            }
            None => {}
        }
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

/// `changes` in calls ([`apply_chunk`]) that share one position domain
/// ([`crate::position::domain`]: the guard's low version) and, with
/// `by_set`, one column set (an upsert call's columns): sorted by (set,
/// domain), stable.
pub fn chunks(mut changes: Vec<Bound>, by_set: bool) -> impl Iterator<Item = Vec<Bound>> {
    let set = move |b: &Bound| -> Vec<usize> { if by_set { b.set.clone() } else { Vec::new() } };
    changes.sort_by(|a, b| {
        let sets = if by_set {
            a.set.cmp(&b.set)
        } else {
            std::cmp::Ordering::Equal
        };
        sets.then_with(|| position::domain(&a.pos).cmp(position::domain(&b.pos)))
    });
    let mut it = changes.into_iter().peekable();
    std::iter::from_fn(move || {
        let first = it.next()?;
        let domain = position::domain(&first.pos).to_string();
        let columns = set(&first);
        let mut chunk = vec![first];
        while let Some(b) =
            it.next_if(|b| position::domain(&b.pos) == domain && (!by_set || b.set == columns))
        {
            chunk.push(b);
        }
        Some(chunk)
    })
}
