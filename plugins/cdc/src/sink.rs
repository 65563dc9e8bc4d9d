//! The sink stage: applies change records to their destination tables,
//! one statement per change, inside the host's transaction (so together
//! with the progress row: exactly once).

use std::collections::{HashMap, HashSet};

use sluice_guest::json::{self, Object};
use sluice_guest::sql::{self, SqlError, Value};
use sluice_guest::{Config, Error, Sink, SinkRecord, log};

use crate::Settings;
use crate::change::{ChangeIn, Op, Val};
use crate::table::{Dialect, Table};

/// The cdc sink stage.
pub struct CdcSink {
    settings: Settings,
    /// Destination tables read so far (once per instance).
    tables: HashMap<String, Table>,
    /// (table, source column) pairs already reported as ignored.
    ignored: HashSet<(String, String)>,
    dialect: Option<Dialect>,
}

impl Sink for CdcSink {
    fn new(config: &Config) -> Result<Self, Error> {
        Ok(CdcSink {
            settings: Settings::parse(config)?,
            tables: HashMap::new(),
            ignored: HashSet::new(),
            dialect: None,
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

    fn write(&mut self, r: &SinkRecord<'_>) -> Result<(), Error> {
        let value = r.record.value.ok_or_else(|| {
            Error::bad_record("tombstone: the cdc sink expects the change records of its map stage")
        })?;
        let c: ChangeIn<'_> = json::from_slice(value)?;
        let dialect = self
            .dialect
            .ok_or_else(|| Error::fatal("sink used before init"))?;
        if !self.tables.contains_key(&*c.table) {
            let name = sql::identifier("destination table", &c.table)?;
            let t = Table::load(dialect, name, &self.settings.position_column)?;
            self.tables.insert(name.to_string(), t);
        }
        let Some(table) = self.tables.get(&*c.table) else {
            return Err(Error::fatal("destination table vanished from the cache"));
        };
        let key = Object::from_raw(c.key).map_err(|e| Error::bad_record(format!("`key`: {e}")))?;
        let result = match c.op {
            Op::Truncate => sql::execute(&format!("DELETE FROM {}", table.name), &[]),
            Op::Delete => {
                let (idx, mut params) = self.bind_key(table, &key)?;
                params.push(Value::from(&*c.pos));
                sql::execute(&table.delete(&idx), &params)
            }
            Op::Upsert => {
                let row = c
                    .row
                    .ok_or_else(|| Error::bad_record("upsert without `row`"))?;
                let row =
                    Object::from_raw(row).map_err(|e| Error::bad_record(format!("`row`: {e}")))?;
                let (sql, mut params, ignored) = self.upsert(table, &key, &row)?;
                params.push(Value::from(&*c.pos));
                for column in ignored {
                    if self.ignored.insert((c.table.to_string(), column.clone())) {
                        log::warn(format!(
                            "table {}: source column {column} of {} has no destination column; ignored (strict=true makes it a bad record)",
                            c.table, c.source
                        ));
                    }
                }
                sql::execute(&sql, &params)
            }
        };
        result.map(|_| ()).map_err(|e| classify(e, &c))
    }
}

impl CdcSink {
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
    /// them): statement, parameters (all but the position, which goes
    /// last) and the source columns the table lacks.
    fn upsert(
        &self,
        table: &Table,
        key: &Object<'_>,
        row: &Object<'_>,
    ) -> Result<(String, Vec<Value>, Vec<String>), Error> {
        let (key_idx, _) = self.bind_key(table, key)?;
        let zero = self.settings.zero_dates;
        let position = &table.position_column().name;
        let mut set: Vec<usize> = Vec::new();
        let mut params = Vec::new();
        let mut ignored = Vec::new();
        for (name, raw) in row.iter() {
            match table.find(name) {
                Some(i) if table.columns[i].name == *position => {
                    return Err(Error::bad_record(format!(
                        "source column {name} has the name of the position column; set position_column to another name"
                    )));
                }
                Some(i) if !set.contains(&i) => {
                    set.push(i);
                    params.push(table.bind(&table.columns[i], &Val::Raw(raw), zero)?);
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
        for (&i, (_, raw)) in key_idx.iter().zip(key.iter()) {
            if !set.contains(&i) {
                set.push(i);
                params.push(table.bind(&table.columns[i], &Val::Raw(raw), zero)?);
            }
        }
        for (i, c) in table.columns.iter().enumerate() {
            if !c.not_null || c.name == *position {
                continue;
            }
            let given = set.iter().position(|&s| s == i);
            let null = given.is_some_and(|g| params[g] == Value::Null);
            if null || (given.is_none() && !c.has_default) {
                return Err(Error::bad_record(format!(
                    "column {}.{} is NOT NULL and the change has no value for it",
                    table.name, c.name
                )));
            }
        }
        let sql = table.upsert(&set, &key_idx);
        Ok((sql, params, ignored))
    }
}

/// A database error on a change: a value the column cannot take (a data
/// exception, a constraint) is a bad record; anything else stops the
/// range (the host retries or fails it).
fn classify(e: SqlError, c: &ChangeIn<'_>) -> Error {
    let data = e.code.starts_with("22")
        || e.code.starts_with("23")
        || e.code.starts_with("SQLITE_CONSTRAINT")
        || e.code == "SQLITE_MISMATCH";
    if data {
        Error::bad_record(format!(
            "table {}: {e} (change of {} at {})",
            c.table, c.source, c.pos
        ))
    } else {
        Error::from(e)
    }
}
