//! `cdc`: replicate Maxwell and Debezium change streams into typed SQL
//! tables, in source order, exactly once.
//!
//! One component with both stages: the map stage decodes each event
//! ([`maxwell`], [`debezium`]), routes it to a destination table
//! ([`route`]) and writes a change record ([`change`]); the sink stage
//! applies change records to the tables through the host's SQL capability
//! ([`sink`], [`table`]), inside the host's transaction for the range, so
//! together with the host's progress row each change is applied once.
//!
//! `--config` keys:
//! - `route` (required): `SOURCE=DEST`, comma-separated ([`route`]);
//! - `format`: `auto` (default, decided per record), `maxwell`, `debezium`;
//! - `key_columns`: `DEST=col1+col2`, comma-separated, for tables whose
//!   Kafka key does not carry the primary key;
//! - `truncate`: `ignore` (default) or `apply` (Debezium `op=t` deletes
//!   every row of the destination table);
//! - `zero_dates`: `null` (default) or `error`, for MySQL's
//!   `0000-00-00…` in date and time columns;
//! - `strict`: `true` makes a source column the table lacks a bad record
//!   (default: ignored, logged once per table and column);
//! - `batch_rows`: at most this many primary keys are kept before the
//!   sink applies them as multi-row statements (default 1000, the fastest
//!   on SQLite and PostgreSQL in `bash bench/cdc.sh`: docs/benchmarks.md;
//!   `1`: each change its own statement at once, so that even an error
//!   only the database finds is a bad record of that change, [`sink`]);
//! - `position_column`: the TEXT column each destination table must have
//!   for the source position of its last change (default
//!   `_sluice_position`, [`position`]);
//! - `create`: `no` (default: a destination table that does not exist
//!   stops the sink) or `print` (it is logged with the `CREATE TABLE` it
//!   needs, guessed from its first change, [`ddl`], and the sink goes on
//!   as if it existed: for `host test`, which prints the statements).
//!
//! Order: each destination row keeps its last change's source position;
//! the rule for comparing positions, and what happens when two cannot be
//! compared, is in [`position`]; [`order`] reports every change it held
//! back or applied in stream order.
//!
//! Skipped without a word (the host counts them as filtered): tombstones
//! (Debezium writes one after each delete), Maxwell bootstrap markers,
//! DDL and heartbeats, Debezium `m` messages, truncates with
//! `truncate=ignore`, events of tables no route names.

pub mod bind;
pub mod bound;
pub mod change;
pub mod convert;
pub mod ddl;
pub mod debezium;
pub mod maxwell;
pub mod number;
pub mod order;
pub mod position;
pub mod route;
pub mod sink;
pub mod table;

use std::borrow::Cow;

use serde::Deserialize;
use sluice_guest::json::{self, Object};
use sluice_guest::{Config, Emit, Error, Mapper, Record, sql};

use change::{Columns, Decoded, Op, Val};
use route::Routes;
use table::ZeroDates;

/// `batch_rows` by default: primary keys kept per flush.
pub const DEFAULT_BATCH_ROWS: usize = 1000;

/// Which producer wrote the events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Decided per record.
    Auto,
    /// Maxwell's daemon.
    Maxwell,
    /// Debezium's JSON converter.
    Debezium,
}

/// The `--config` keys of both stages.
#[derive(Debug, Clone)]
pub struct Settings {
    format: Format,
    routes: Routes,
    /// Destination table → key columns.
    key_columns: Vec<(String, Vec<String>)>,
    apply_truncate: bool,
    zero_dates: ZeroDates,
    strict: bool,
    position_column: String,
    /// Most primary keys kept before the sink applies them (1: each
    /// change its own statement, at once).
    batch_rows: usize,
    /// `create=print`: a missing destination table is logged with the
    /// DDL it needs ([`ddl`]) instead of stopping the sink.
    print_create: bool,
}

/// The raw `--config` pairs.
#[derive(Deserialize)]
struct RawSettings {
    #[serde(default)]
    format: Option<String>,
    #[serde(default)]
    route: Vec<String>,
    #[serde(default)]
    key_columns: Vec<String>,
    #[serde(default)]
    truncate: Option<String>,
    #[serde(default)]
    zero_dates: Option<String>,
    #[serde(default)]
    strict: bool,
    #[serde(default)]
    position_column: Option<String>,
    #[serde(default)]
    batch_rows: Option<usize>,
    #[serde(default)]
    create: Option<String>,
}

impl Settings {
    /// Read and check the settings.
    ///
    /// # Errors
    /// [`Error::Fatal`] naming the key and the values it takes.
    pub fn parse(config: &Config) -> Result<Settings, Error> {
        let raw: RawSettings = config.parse()?;
        let one_of = |key: &str, v: Option<&str>, allowed: &[&str]| -> Result<usize, Error> {
            match v {
                None => Ok(0),
                Some(v) => allowed.iter().position(|a| *a == v).ok_or_else(|| {
                    Error::fatal(format!("{key}={v}: expected one of {}", allowed.join(", ")))
                }),
            }
        };
        let format = [Format::Auto, Format::Maxwell, Format::Debezium][one_of(
            "format",
            raw.format.as_deref(),
            &["auto", "maxwell", "debezium"],
        )?];
        let apply_truncate =
            one_of("truncate", raw.truncate.as_deref(), &["ignore", "apply"])? == 1;
        let zero_dates = [ZeroDates::Null, ZeroDates::Error]
            [one_of("zero_dates", raw.zero_dates.as_deref(), &["null", "error"])?];
        let mut key_columns = Vec::new();
        for entry in raw.key_columns.iter().filter(|e| !e.trim().is_empty()) {
            let (table, cols) = entry.split_once('=').ok_or_else(|| {
                Error::fatal(format!("key_columns `{entry}`: expected DEST=col1+col2"))
            })?;
            let cols: Vec<String> = cols.split('+').map(|c| c.trim().to_string()).collect();
            if cols.iter().any(String::is_empty) {
                return Err(Error::fatal(format!(
                    "key_columns `{entry}`: an empty column name"
                )));
            }
            key_columns.push((table.trim().to_string(), cols));
        }
        let position_column = raw
            .position_column
            .unwrap_or_else(|| "_sluice_position".into());
        sql::identifier("position_column", &position_column)?;
        Ok(Settings {
            format,
            routes: Routes::parse(&raw.route)?,
            key_columns,
            apply_truncate,
            zero_dates,
            strict: raw.strict,
            position_column,
            print_create: one_of("create", raw.create.as_deref(), &["no", "print"])? == 1,
            batch_rows: match raw.batch_rows {
                None => DEFAULT_BATCH_ROWS,
                Some(0) => return Err(Error::fatal("batch_rows=0: give at least 1")),
                Some(n) => n,
            },
        })
    }
}

/// The `--config` keys cdc reads.
pub const SETTINGS: &[&str] = &[
    "route",
    "format",
    "key_columns",
    "truncate",
    "zero_dates",
    "strict",
    "position_column",
    "batch_rows",
    "create",
];

/// The cdc map stage.
pub struct CdcMap {
    settings: Settings,
    out: Vec<u8>,
    key: Vec<u8>,
    /// Source tables (`database.table`) no route names, already logged.
    unrouted: std::collections::HashSet<String>,
}

impl Mapper for CdcMap {
    fn new(config: &Config) -> Result<Self, Error> {
        // Keys of other plugins reach every stage, so an unknown key is
        // only worth a word (once per instance, from the map stage).
        for (key, _) in config.iter().filter(|(k, _)| !SETTINGS.contains(k)) {
            sluice_guest::log::warn(format!(
                "--config {key} is not a cdc setting ({}); ignored (another plugin of the pipeline may read it)",
                SETTINGS.join(", ")
            ));
        }
        Ok(CdcMap {
            settings: Settings::parse(config)?,
            out: Vec::with_capacity(512),
            key: Vec::with_capacity(64),
            unrouted: std::collections::HashSet::new(),
        })
    }

    fn map(&mut self, record: &Record<'_>, out: &mut Emit<'_>) -> Result<(), Error> {
        let Some(value) = record.value else {
            return Ok(());
        };
        let event = Object::parse(value)
            .map_err(|e| Error::bad_record(format!("not a JSON object: {e}")))?;
        let debezium = match self.settings.format {
            Format::Maxwell => false,
            Format::Debezium => true,
            Format::Auto if debezium::looks_like(&event) => true,
            Format::Auto if maxwell::looks_like(&event) => false,
            Format::Auto => {
                return Err(Error::bad_record(
                    "neither a Maxwell event (`type`, `database`) nor a Debezium one (`op`, `source`, or a `schema`/`payload` wrapper)",
                ));
            }
        };
        let decoded = if debezium {
            let old_key = record
                .headers
                .iter()
                .find(|h| h.key == debezium::OLD_KEY_HEADER)
                .and_then(|h| h.value);
            debezium::decode(&event, record.key, old_key)?
        } else {
            maxwell::decode(&event, record.key)?
        };
        let Some(d) = decoded else {
            return Ok(());
        };
        let Some(dest) = self.settings.routes.destination(&d.database, &d.table) else {
            let source = d.source();
            if !self.unrouted.contains(&source) {
                sluice_guest::log::warn(format!(
                    "events of {source} match no route and are skipped (counted as filtered); if they should be applied, add route={source}=DEST"
                ));
                self.unrouted.insert(source);
            }
            return Ok(());
        };
        if d.op == Op::Truncate && !self.settings.apply_truncate {
            return Ok(());
        }
        let dest = sql::identifier("destination table", dest)
            .map_err(|e| Error::bad_record(format!("{}: {e}", d.source())))?
            .to_string();
        let key = match d.op {
            Op::Truncate => Vec::new(),
            _ => self.primary_key(&d, &dest)?,
        };
        let pos = d
            .pos
            .clone()
            .unwrap_or_else(|| position::kafka(record.partition, record.offset));
        let old_key = match d.op {
            Op::Upsert => old_key(&d, &key),
            _ => None,
        };
        change::write(&mut self.out, &d, &dest, &pos, &key, old_key.as_ref());
        self.key.clear();
        self.key.extend_from_slice(b"{\"table\":");
        json::write_str(&mut self.key, &dest);
        self.key.extend_from_slice(b",\"key\":");
        change::write_columns(&mut self.key, &key);
        self.key.push(b'}');
        out.emit(Some(&self.key), Some(&self.out));
        Ok(())
    }
}

impl CdcMap {
    /// The primary key: the Kafka key's columns (Maxwell `pk.*`, the
    /// Debezium key struct), else `key_columns` of `dest`; each value taken
    /// from the row when it has the column (decoded there), else from the
    /// key.
    fn primary_key<'a>(&self, d: &Decoded<'a>, dest: &str) -> Result<Columns<'a>, Error> {
        let from_row = |name: &str| change::find(&d.row, name).cloned();
        if !d.key.is_empty() {
            return Ok(d
                .key
                .iter()
                .map(|(name, v)| (name.clone(), from_row(name).unwrap_or_else(|| v.clone())))
                .collect());
        }
        let Some((_, cols)) = self.settings.key_columns.iter().find(|(t, _)| t == dest) else {
            return Err(Error::bad_record(format!(
                "{}: no primary key: the Kafka key has none; set key_columns={dest}=col1+col2",
                d.source()
            )));
        };
        cols.iter()
            .map(|c| {
                let v = from_row(c).filter(|v| !matches!(v, Val::Raw(r) if json::is_null(r)));
                let v = v.ok_or_else(|| {
                    Error::bad_record(format!(
                        "{}: key column {c} has no value in the row",
                        d.source()
                    ))
                })?;
                Ok((Cow::Owned(c.clone()), v))
            })
            .collect()
    }
}

/// The primary key before upsert `d` when the update changed it: `key`
/// with each column's value from `d.before` where it has one (Maxwell's
/// `old` lists only the changed columns, Debezium's `before` may be the
/// whole row); `None` when no key column changed, or one was null before
/// (no destination row can have a null key).
fn old_key<'a>(d: &Decoded<'a>, key: &Columns<'a>) -> Option<Columns<'a>> {
    if d.before.is_empty() {
        return None;
    }
    let mut changed = false;
    let mut old = Vec::with_capacity(key.len());
    for (name, now) in key {
        let was = match change::find(&d.before, name) {
            Some(was) => was,
            None => now,
        };
        if matches!(was, Val::Raw(r) if json::is_null(r)) {
            return None;
        }
        changed |= !change::same(was, now);
        old.push((name.clone(), was.clone()));
    }
    changed.then_some(old)
}

sluice_guest::export!(map: CdcMap, sink: sink::CdcSink);

#[cfg(test)]
mod tests;
