//! The sink stage: applies change records to their destination tables
//! inside the host's transaction for the part (so together with the
//! progress row: exactly once).
//!
//! Changes are checked and bound as they arrive (`write`): a value the
//! column cannot take is a bad record there, naming the column. They are
//! kept per destination table, folded into one per primary key so that
//! applying it ends where applying each change in turn would (the newest
//! source position wins, the later one on equal positions; columns only
//! an earlier upsert set keep its values; a delete before an upsert still
//! runs first), and applied at the part's `close` — or when `batch_rows`
//! keys are kept — per table as one call of the host's bulk path for
//! the deletes and one per column set for the upserts
//! (`sql.apply-versioned`, guarded by the ordering rule: multi-row
//! upserts and one-row deletes sent together, or `COPY` and a merge on
//! PostgreSQL).
//! With `batch_rows=1` each change is its own call, run at once, so even
//! an error only the database finds is a bad record of that change.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use sluice_guest::json::{self, Object};
use sluice_guest::sql::{self, SqlError, Value};
use sluice_guest::{Config, Error, OpenAnswer, PartitionContext, Sink, SinkRecord, log};

use crate::Settings;
use crate::bound::{Bound, apply_chunk, chunks, key_bytes};
use crate::change::{ChangeIn, Op, Val};
use crate::order::{self, Report};
use crate::position;
use crate::table::{Dialect, Table};

/// The changes of one destination table kept for the flush.
#[derive(Debug, Default)]
struct Kept {
    /// A truncate came first: delete every row before the rest.
    truncate: bool,
    /// Primary key columns (indexes), from the first change.
    key: Vec<usize>,
    /// Key values ([`key_bytes`]) → the change kept for that key.
    by_key: HashMap<Vec<u8>, Bound>,
    /// Keys in first-seen order (so statements are reproducible).
    order: Vec<Vec<u8>>,
}

/// The cdc sink stage.
pub struct CdcSink {
    settings: Settings,
    /// Destination tables read so far (once per instance).
    tables: HashMap<String, Table>,
    /// (table, source column) pairs already reported as ignored.
    ignored: HashSet<(String, String)>,
    dialect: Option<Dialect>,
    /// Changes kept for the flush, per destination table.
    kept: HashMap<String, Kept>,
    /// Keys kept over all tables.
    kept_rows: usize,
    /// The part being written, for messages.
    part: String,
    /// What the ordering rule held back or applied in stream order since
    /// the last flush, for its log line.
    report: Report,
}

impl Sink for CdcSink {
    fn new(config: &Config) -> Result<Self, Error> {
        Ok(CdcSink {
            settings: Settings::parse(config)?,
            tables: HashMap::new(),
            ignored: HashSet::new(),
            dialect: None,
            kept: HashMap::new(),
            kept_rows: 0,
            part: String::new(),
            report: Report::default(),
        })
    }

    fn init(&mut self) -> Result<(), Error> {
        self.dialect = Some(match sql::dialect().as_deref() {
            Some("sqlite") => Dialect::Sqlite,
            Some("postgres") => Dialect::Postgres,
            Some(other) => {
                return Err(Error::fatal(format!(
                    "the cdc sink does not know SQL dialect {other}"
                )));
            }
            None => {
                return Err(Error::fatal(
                    "the cdc sink writes SQL tables: run it with --sink-db sqlite:PATH or postgres://…",
                ));
            }
        });
        Ok(())
    }

    fn open(&mut self, ctx: &PartitionContext) -> Result<OpenAnswer, Error> {
        self.kept.clear();
        self.kept_rows = 0;
        // A part tried again (after a rejected record or a retry) reports
        // what its last attempt did, not the earlier ones.
        self.report = Report::default();
        self.part = format!(
            "{}/{} offsets [{}, {})",
            ctx.topic, ctx.partition, ctx.start_offset, ctx.end_offset
        );
        Ok(OpenAnswer::Proceed)
    }

    fn write(&mut self, r: &SinkRecord<'_>) -> Result<(), Error> {
        let value = r.record.value.ok_or_else(|| {
            Error::bad_record("tombstone: the cdc sink expects the change records of its map stage")
        })?;
        let c: ChangeIn<'_> = json::from_slice(value)?;
        let dialect = self
            .dialect
            .ok_or_else(|| Error::fatal("sink used before init"))?;
        let key = Object::from_raw(c.key).map_err(|e| Error::bad_record(format!("`key`: {e}")))?;
        if !self.tables.contains_key(&*c.table) {
            let name = sql::identifier("destination table", &c.table)?;
            let t = match Table::load(dialect, name, &self.settings.position_column)? {
                Some(t) => t,
                None if self.settings.print_create => self.guess_table(dialect, name, &c, &key)?,
                None => return Err(Table::missing(dialect, name)),
            };
            self.tables.insert(name.to_string(), t);
        }
        let Some(table) = self.tables.get(&*c.table) else {
            return Err(Error::fatal("destination table vanished from the cache"));
        };
        // An upsert that changed its key first removes the old key's row,
        // at the same position, so the pair applies as one change.
        let moved_from = match (c.op, c.old_key) {
            (Op::Upsert, Some(old)) => {
                let old = Object::from_raw(old)
                    .map_err(|e| Error::bad_record(format!("`old_key`: {e}")))?;
                match self.bind_key(table, &old) {
                    Ok((idx, params)) => {
                        // The map writes the old key with the new key's
                        // columns, in order ([`crate::old_key`]).
                        debug_assert_eq!(
                            Some(&idx),
                            self.bind_key(table, &key).ok().map(|k| k.0).as_ref()
                        );
                        Some(Bound::delete(&c.pos, params))
                    }
                    // The change itself is fine: apply it, and say that
                    // the old key's row is left to its own delete.
                    Err(e) => {
                        log::warn(format!(
                            "table {}: the old key {} of a key change of {} at {} does not fit the key columns ({e}); the change is applied, the old key's row is left to its own delete event",
                            c.table,
                            old_key_text(&old),
                            c.source,
                            c.pos
                        ));
                        None
                    }
                }
            }
            _ => None,
        };
        let (key_idx, bound) = match c.op {
            Op::Truncate => (Vec::new(), None),
            Op::Delete => {
                let (idx, params) = self.bind_key(table, &key)?;
                (idx, Some(Bound::delete(&c.pos, params)))
            }
            Op::Upsert => {
                let row = c
                    .row
                    .ok_or_else(|| Error::bad_record("upsert without `row`"))?;
                let row =
                    Object::from_raw(row).map_err(|e| Error::bad_record(format!("`row`: {e}")))?;
                let (key_idx, b, ignored) = self.upsert(table, &key, &row, &c.pos)?;
                for column in ignored {
                    if self.ignored.insert((c.table.to_string(), column.clone())) {
                        log::warn(format!(
                            "table {}: source column {column} of {} has no destination column; ignored (strict=true makes it a bad record)",
                            c.table, c.source
                        ));
                    }
                }
                (key_idx, Some(b))
            }
        };
        if self.settings.batch_rows <= 1 {
            for b in moved_from.iter().chain(bound.iter()) {
                let n = apply_one(table, &key_idx, Some(b))
                    .map_err(|e| classify(e, &c, table, &key_idx))?;
                order::resolve(
                    table,
                    &key_idx,
                    std::slice::from_ref(b),
                    n,
                    &mut self.report,
                )
                .map_err(|e| classify(e, &c, table, &key_idx))?;
            }
            if bound.is_none() {
                apply_one(table, &key_idx, None).map_err(|e| classify(e, &c, table, &key_idx))?;
            }
            return Ok(());
        }
        let name = table.name.clone();
        // Kept changes of a table share one key column list: a change
        // with another (the key struct changed) applies what is kept first.
        if bound.is_some()
            && self
                .kept
                .get(&name)
                .is_some_and(|k| !k.order.is_empty() && k.key != key_idx)
        {
            self.flush()?;
        }
        for change in moved_from.map(Some).into_iter().chain([bound]) {
            // A change whose position cannot be compared with the one
            // kept for its key goes to the database in stream order:
            // what is kept is applied first, then the change meets the
            // guard there (as with batch_rows=1).
            if let Some(unordered) = self.keep(&name, key_idx.clone(), change) {
                self.flush()?;
                self.keep(&name, key_idx.clone(), Some(unordered));
            }
        }
        if self.kept_rows >= self.settings.batch_rows {
            self.flush()?;
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), Error> {
        self.flush()
    }
}

/// Run one change as its own call (`batch_rows=1`); `None` is a
/// truncate.
fn apply_one(table: &Table, key: &[usize], change: Option<&Bound>) -> Result<u64, SqlError> {
    let Some(b) = change else {
        return sql::execute(&format!("DELETE FROM {}", table.sql_name), &[]);
    };
    apply_chunk(table, key, std::slice::from_ref(b), true).map_err(|e| e.error)
}

impl CdcSink {
    /// `create=print`: log the DDL `name` needs, guessed from change `c`
    /// (its first), and the table it describes.
    fn guess_table(
        &self,
        dialect: Dialect,
        name: &str,
        c: &ChangeIn<'_>,
        key: &Object<'_>,
    ) -> Result<Table, Error> {
        let row = match c.row {
            Some(r) if c.op == Op::Upsert => {
                Some(Object::from_raw(r).map_err(|e| Error::bad_record(format!("`row`: {e}")))?)
            }
            _ => None,
        };
        let (ddl, table) = crate::ddl::guess(
            dialect,
            name,
            key,
            row.as_ref(),
            &self.settings.position_column,
        )?;
        log::warn(format!(
            "destination table {name} does not exist; create=print: it needs (types guessed from its first change, of {} at {}: check them): {ddl};",
            c.source, c.pos
        ));
        Ok(table)
    }

    /// Keep `change` (`None`: a truncate) of `table` for the flush: the
    /// newest change per key, so that applying what is kept ends where
    /// applying every change in turn would. A change older than the one
    /// kept for its key is reported and dropped; one whose position
    /// cannot be compared with it is handed back (nothing kept changes):
    /// the caller flushes, then keeps it.
    fn keep(&mut self, table: &str, key: Vec<usize>, change: Option<Bound>) -> Option<Bound> {
        let kept = self.kept.entry(table.to_string()).or_default();
        let Some(b) = change else {
            // Nothing kept before a truncate matters any more.
            self.kept_rows -= kept.order.len();
            *kept = Kept {
                truncate: true,
                ..Kept::default()
            };
            return None;
        };
        if kept.order.is_empty() {
            kept.key = key;
        }
        let Some(t) = self.tables.get(table) else {
            return Some(b); // not reached: a change's table is loaded first
        };
        let rendered = match b.op {
            Op::Delete => key_bytes(t, &kept.key, b.params.iter()),
            _ => key_bytes(
                t,
                &kept.key,
                kept.key
                    .iter()
                    .filter_map(|k| b.set.iter().position(|s| s == k).map(|n| &b.params[n])),
            ),
        };
        match kept.by_key.get_mut(&rendered) {
            Some(old) => {
                // The ordering rule, within the part.
                match position::compare(&old.pos, &b.pos) {
                    None => return Some(b),
                    Some(Ordering::Greater) => {
                        self.report
                            .stale(table, b.key_text(t, &kept.key), &b.pos, &old.pos);
                        return None;
                    }
                    Some(_) => {}
                }
                let mut b = b;
                match (old.op, b.op) {
                    // An upsert after an upsert: the columns only the
                    // earlier one set keep its values, as when both are
                    // applied; a delete before the earlier one stays.
                    (Op::Upsert, Op::Upsert) => {
                        for (n, &i) in old.set.iter().enumerate() {
                            if !b.set.contains(&i) {
                                b.set.push(i);
                                b.params.push(old.params[n].clone());
                            }
                        }
                        b.after_delete = old.after_delete.take();
                    }
                    // An upsert after a delete: the delete runs first.
                    (Op::Delete, Op::Upsert) => {
                        let delete = std::mem::replace(old, b);
                        old.after_delete = Some(Box::new(delete));
                        return None;
                    }
                    _ => {}
                }
                *old = b;
            }
            None => {
                kept.by_key.insert(rendered.clone(), b);
                kept.order.push(rendered);
                self.kept_rows += 1;
            }
        }
        None
    }

    /// Apply every kept change: per table the truncate, then the deletes
    /// and the upserts of each column set, each in one call of the
    /// host's bulk path per position domain ([`apply_chunk`]).
    ///
    /// # Errors
    /// [`Error::Fatal`] naming the table and the part when the database
    /// refuses a statement: which change it was is not known here (run
    /// with `batch_rows=1` to find it as a bad record).
    fn flush(&mut self) -> Result<(), Error> {
        let mut names: Vec<String> = self.kept.keys().cloned().collect();
        names.sort();
        for name in names {
            let Some(mut kept) = self.kept.remove(&name) else {
                continue;
            };
            let Some(table) = self.tables.get(&name) else {
                return Err(Error::fatal("destination table vanished from the cache"));
            };
            let fail = |e: SqlError| {
                if is_missing_table(&e) {
                    return missing_after_print(&name);
                }
                if is_missing_unique_key(&e) {
                    return missing_unique_key(table, &kept.key);
                }
                if !is_data_error(&e) {
                    return Error::from(e);
                }
                // The host reports the database's error itself (it wins
                // over the stage's): the log line carries what to do.
                let why = format!(
                    "table {name}: the database refused a change of {}: {e}. One call carries many changes, so which one is not known: restart with --config batch_rows=1 to apply them one by one, and the bad one goes to --on-error",
                    self.part
                );
                log::error(&why);
                Error::fatal(why)
            };
            if kept.truncate {
                sql::execute(&format!("DELETE FROM {}", table.sql_name), &[]).map_err(fail)?;
            }
            let mut deletes: Vec<Bound> = Vec::new();
            let mut upserts: Vec<Bound> = Vec::new();
            for k in &kept.order {
                if let Some(mut b) = kept.by_key.remove(k) {
                    // Deletes run before upserts.
                    if let Some(d) = b.after_delete.take() {
                        deletes.push(*d);
                    }
                    match b.op {
                        Op::Delete => deletes.push(b),
                        _ => upserts.push(b),
                    }
                }
            }
            // Upserts of one call set the same columns: a call per column
            // set (and position domain).
            for (changes, by_set) in [(deletes, false), (upserts, true)] {
                for chunk in chunks(changes, by_set) {
                    let n =
                        apply_chunk(table, &kept.key, &chunk, true).map_err(|e| fail(e.error))?;
                    order::resolve(table, &kept.key, &chunk, n, &mut self.report).map_err(fail)?;
                }
            }
        }
        self.kept_rows = 0;
        self.report.log(&self.part);
        Ok(())
    }

    /// The key columns' indexes in `table` and their values.
    fn bind_key(&self, table: &Table, key: &Object<'_>) -> Result<(Vec<usize>, Vec<Value>), Error> {
        if key.is_empty() {
            return Err(Error::bad_record(format!(
                "change for {} without a primary key",
                table.name
            )));
        }
        let mut idx = Vec::new();
        let mut params = Vec::new();
        for (name, raw) in key.iter() {
            let i = table.find(name).ok_or_else(|| {
                Error::bad_record(format!("table {} has no key column {name}", table.name))
            })?;
            let v = table.bind(&table.columns[i], &Val::Raw(raw), self.settings.zero_dates)?;
            if v == Value::Null {
                return Err(Error::bad_record(format!(
                    "key column {}.{name} is null",
                    table.name
                )));
            }
            idx.push(i);
            params.push(v);
        }
        Ok((idx, params))
    }

    /// The upsert of `row` (key columns from `key` where the row lacks
    /// them) at source position `pos`: key column indexes, the bound
    /// change and the source columns the table lacks.
    fn upsert(
        &self,
        table: &Table,
        key: &Object<'_>,
        row: &Object<'_>,
        pos: &str,
    ) -> Result<(Vec<usize>, Bound, Vec<String>), Error> {
        let (key_idx, key_values) = self.bind_key(table, key)?;
        let zero = self.settings.zero_dates;
        let position = &table.position_column().name;
        let mut set: Vec<usize> = Vec::new();
        let mut params = Vec::new();
        let mut ignored = Vec::new();
        // Columns a non-null value became NULL in (a zero date under
        // zero_dates=null), with the value, for the NOT NULL message.
        let mut zeroed: Vec<(usize, &str)> = Vec::new();
        for (name, raw) in row.iter() {
            match table.find(name) {
                Some(i) if table.columns[i].name == *position => {
                    return Err(Error::bad_record(format!(
                        "source column {name} has the name of the position column; set position_column to another name"
                    )));
                }
                Some(i) if !set.contains(&i) => {
                    set.push(i);
                    let v = table.bind(&table.columns[i], &Val::Raw(raw), zero)?;
                    if v == Value::Null && !json::is_null(raw) {
                        zeroed.push((i, raw.get()));
                    }
                    params.push(v);
                }
                Some(_) => {}
                None if self.settings.strict => {
                    return Err(Error::bad_record(format!(
                        "table {} has no column {name} (strict=true)",
                        table.name
                    )));
                }
                None => ignored.push(name.to_string()),
            }
        }
        // Key columns the row lacks come from the key.
        for (&i, v) in key_idx.iter().zip(key_values) {
            if !set.contains(&i) {
                set.push(i);
                params.push(v);
            }
        }
        for (i, c) in table.columns.iter().enumerate() {
            if !c.not_null || c.name == *position {
                continue;
            }
            let given = set.iter().position(|&s| s == i);
            let null = given.is_some_and(|g| params[g] == Value::Null);
            if let Some((_, value)) = zeroed.iter().find(|(z, _)| *z == i).filter(|_| null) {
                return Err(Error::bad_record(format!(
                    "column {t}.{c} is NOT NULL and the change's value {value} is a MySQL zero date, which zero_dates=null (the default) writes as NULL: let the column take NULL (ALTER TABLE {qt} ALTER COLUMN {qc} DROP NOT NULL on PostgreSQL; on SQLite, a table made again without NOT NULL), or give it a TEXT type to keep MySQL's zero date as written (zero_dates=error makes such changes bad records on purpose)",
                    t = table.name,
                    c = c.name,
                    qt = crate::table::quote(&table.name),
                    qc = crate::table::quote(&c.name),
                )));
            }
            if null || (given.is_none() && !c.has_default) {
                return Err(Error::bad_record(format!(
                    "column {}.{} is NOT NULL and the change has no value for it",
                    table.name, c.name
                )));
            }
        }
        let b = Bound {
            op: Op::Upsert,
            pos: pos.to_string(),
            set,
            params,
            after_delete: None,
        };
        Ok((key_idx, b, ignored))
    }
}

/// A key object's text for messages, at most 200 characters.
fn old_key_text(key: &Object<'_>) -> String {
    let text: String = key
        .iter()
        .map(|(k, v)| format!("{k}={}", v.get()))
        .collect::<Vec<_>>()
        .join(", ");
    text.chars().take(200).collect()
}

/// The table does not exist (PostgreSQL 42P01, SQLite's "no such
/// table"): under `create=print`, a table the sink guessed.
fn is_missing_table(e: &SqlError) -> bool {
    e.code == "42P01"
        || (e.code.starts_with("SQLITE_ERROR") && e.message.starts_with("no such table"))
}

/// The database has no unique index for an upsert's `ON CONFLICT`
/// columns (PostgreSQL 42P10; SQLite's "ON CONFLICT clause does not match
/// any PRIMARY KEY or UNIQUE constraint").
fn is_missing_unique_key(e: &SqlError) -> bool {
    e.code == "42P10" || e.message.contains("ON CONFLICT clause does not match")
}

/// The error for a destination table without a primary key or unique
/// index on the changes' key columns `key` (indexes), with the index to
/// create (logged too: the host reports the database's own error first).
fn missing_unique_key(table: &Table, key: &[usize]) -> Error {
    let names: Vec<String> = key
        .iter()
        .map(|&i| crate::table::quote(&table.columns[i].name))
        .collect();
    let why = format!(
        "table {t} has no PRIMARY KEY or UNIQUE index on the changes' key columns ({cols}): the cdc sink writes each row by its key; CREATE UNIQUE INDEX {t}_sluice_key ON {t} ({cols}) (or make them the primary key), then run again",
        t = table.name,
        cols = names.join(", ")
    );
    log::error(&why);
    Error::fatal(why)
}

/// The error for a statement on a table that does not exist (one
/// `create=print` guessed, or one dropped while the sink ran; logged too:
/// the host reports the database's own error first).
fn missing_after_print(table: &str) -> Error {
    let why = format!(
        "destination table {table} does not exist: create it (under create=print the log above has the CREATE TABLE it needs), then run again"
    );
    log::error(&why);
    Error::fatal(why)
}

/// A database error on a change: a value the column cannot take (a data
/// exception, a constraint) is a bad record; anything else stops the
/// range (the host retries or fails it).
fn classify(e: SqlError, c: &ChangeIn<'_>, table: &Table, key: &[usize]) -> Error {
    if is_missing_table(&e) {
        return missing_after_print(&c.table);
    }
    if is_missing_unique_key(&e) {
        return missing_unique_key(table, key);
    }
    if is_data_error(&e) {
        Error::bad_record(format!(
            "table {}: {e} (change of {} at {})",
            c.table, c.source, c.pos
        ))
    } else {
        Error::from(e)
    }
}

/// A value the column cannot take: a data exception (SQLSTATE class 22),
/// a constraint (class 23), SQLite's constraint and type mismatch codes.
fn is_data_error(e: &SqlError) -> bool {
    e.code.starts_with("22")
        || e.code.starts_with("23")
        || e.code.starts_with("SQLITE_CONSTRAINT")
        || e.code == "SQLITE_MISMATCH"
}
