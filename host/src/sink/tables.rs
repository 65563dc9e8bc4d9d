//! The host's tables in the sink database, written only by the driver,
//! inside the part's transaction: `sluice_progress` (per query id and
//! partition: the end offset applied, the holes below it, the batch and
//! epoch that wrote it) and `sluice_dead_letters` (bad records under
//! `--on-error dlq`, keyed by their source coordinates).

use super::applied::AppliedSet;
use super::{DeadLetter, SinkError, site};
use crate::capability::sql::{self, DbError, SqlValue};
use crate::plugin::PartitionContext;

/// Refuse to create the host's tables in `schema` while the connection's
/// current schema, not `schema`, holds a `sluice_progress` (a pipeline
/// started by a host that looked its tables up through `search_path`):
/// starting over there would apply every record again.
fn older_home(b: &mut dyn sql::Backend, schema: &str) -> Result<(), DbError> {
    let found = b.query(
        "SELECT current_schema()::text, to_regclass(format('%I.sluice_progress', $1::text)) IS NOT NULL, \
           current_schema() IS NOT NULL AND to_regclass(format('%I.sluice_progress', current_schema())) IS NOT NULL",
        &[SqlValue::Text(schema.to_string())],
    )?;
    if let Some(
        [
            SqlValue::Text(current),
            SqlValue::Integer(0),
            SqlValue::Integer(1),
        ],
    ) = found.rows.first().map(Vec::as_slice)
        && current != schema
    {
        return Err(DbError {
            message: format!(
                "the host keeps its tables in schema `{schema}` (--sink-schema), but `{current}`.sluice_progress exists and `{schema}`.sluice_progress does not: it was made by an older host, which used the connection's current schema. Pass --sink-schema {current} to keep using it (or move the tables: ALTER TABLE \"{current}\".sluice_progress SET SCHEMA \"{schema}\", the same for sluice_dead_letters)"
            ),
            code: "sluice".into(),
        });
    }
    Ok(())
}

/// A `sluice_progress` row as read, for the conditional update and for
/// messages.
pub(super) struct StoredRow {
    pub(super) end: i64,
    /// The `holes` text exactly as stored (compared as text on update).
    pub(super) holes: String,
    pub(super) batch_id: i64,
}

/// The host's table names, qualified with their schema (`main` on SQLite;
/// on PostgreSQL the one `--sink-schema` names, `public` by default, never
/// looked up through `search_path`, which a plugin could change for later
/// connections). Both databases look up an unqualified name in the
/// session's temporary schema first, where a plugin may create (or
/// rename) a table of the same name; qualified names never resolve there.
#[derive(Debug, Clone, Default)]
pub(super) struct HostTables {
    pub(super) progress: String,
    pub(super) dead_letters: String,
}

impl HostTables {
    /// Create the tables in `schema` if they are missing, and add the
    /// `holes` column to a `sluice_progress` made by host 0.2.0.
    ///
    /// # Errors
    /// The database's error; on PostgreSQL, a `sluice_progress` that is
    /// missing from `schema` but present in the connection's current
    /// schema (where hosts before 0.3 kept it): the message says to pass
    /// that schema, instead of starting over with an empty table.
    pub(super) fn create(b: &mut dyn sql::Backend, schema: &str) -> Result<HostTables, DbError> {
        if b.dialect() == sql::Dialect::Postgres {
            older_home(b, schema)?;
        }
        let schema = sluice_guest::sql::quoted(schema);
        let tables = HostTables {
            progress: format!("{schema}.sluice_progress"),
            dead_letters: format!("{schema}.sluice_dead_letters"),
        };
        let blob = b.blob_type();
        let HostTables {
            progress,
            dead_letters,
        } = &tables;
        sql::create_tables(
            b,
            &format!(
                "CREATE TABLE IF NOT EXISTS {progress} (\
           query_id TEXT NOT NULL, topic TEXT NOT NULL, \"partition\" INTEGER NOT NULL, \
           end_offset BIGINT NOT NULL, batch_id BIGINT NOT NULL, epoch BIGINT NOT NULL, \
           updated_at_ms BIGINT NOT NULL, holes TEXT NOT NULL DEFAULT '[]', \
           owner TEXT NOT NULL DEFAULT '', \
           PRIMARY KEY (query_id, topic, \"partition\"));\
         CREATE TABLE IF NOT EXISTS {dead_letters} (\
           query_id TEXT NOT NULL, topic TEXT NOT NULL, \"partition\" INTEGER NOT NULL, \
           \"offset\" BIGINT NOT NULL, timestamp_ms BIGINT NOT NULL, \
           record_key {blob}, record_value {blob}, headers_json TEXT NOT NULL, \
           error TEXT NOT NULL, plugin_digest TEXT NOT NULL, stage INTEGER NOT NULL, \
           batch_id BIGINT NOT NULL, epoch BIGINT NOT NULL, \
           PRIMARY KEY (query_id, topic, \"partition\", \"offset\"));"
            ),
        )
        .map_err(|e| match e.code.as_str() {
            "3F000" => DbError {
                message: format!(
                    "{} (--sink-schema {schema}): create it (CREATE SCHEMA {schema}) or name an existing one; schema names are exact, upper and lower case differ",
                    e.message
                ),
                code: e.code,
            },
            _ => e,
        })?;
        // Tables made before holes (0.2.0) or owners were recorded get the
        // columns; their rows have no holes and no known owner.
        for (column, ddl) in [
            ("holes", "holes TEXT NOT NULL DEFAULT '[]'"),
            ("owner", "owner TEXT NOT NULL DEFAULT ''"),
        ] {
            sql::add_column(b, progress, column, ddl)?;
        }
        Ok(tables)
    }

    /// The progress row of `r`'s partition: what it shows applied, and the
    /// row as read (`None` without a row). A row of a newer epoch is
    /// [`SinkError::Fenced`].
    pub(super) fn read_progress(
        &self,
        b: &mut dyn sql::Backend,
        r: &PartitionContext,
        epoch: crate::checkpoint::Epoch,
    ) -> Result<(AppliedSet, Option<StoredRow>), SinkError> {
        let bad_row = |message: String| SinkError::Sql {
            during: "reading sluice_progress",
            site: site(r),
            error: DbError {
                message,
                code: "sluice".into(),
            },
        };
        let stored = b
            .query(
                &format!(
                    "SELECT end_offset, epoch, batch_id, holes FROM {} WHERE query_id = $1 AND topic = $2 AND \"partition\" = $3",
                    self.progress
                ),
                &[
                    SqlValue::Text(r.batch.query_id.clone()),
                    SqlValue::Text(r.topic.clone()),
                    SqlValue::Integer(r.partition.into()),
                ],
            )
            .map_err(|error| SinkError::Sql {
                during: "reading sluice_progress",
                site: site(r),
                error,
            })?;
        let Some(row) = stored.rows.first() else {
            return Ok((AppliedSet::empty(), None));
        };
        let (end, stored_epoch, batch_id, holes) =
            match (row.first(), row.get(1), row.get(2), row.get(3)) {
                (
                    Some(SqlValue::Integer(e)),
                    Some(SqlValue::Integer(p)),
                    Some(SqlValue::Integer(b)),
                    Some(SqlValue::Text(h)),
                ) => (*e, *p as u64, *b, h.clone()),
                _ => return Err(bad_row(format!("unexpected row {row:?}"))),
            };
        if crate::checkpoint::Epoch::new(stored_epoch) > epoch {
            return Err(SinkError::Fenced {
                site: site(r),
                stored: stored_epoch,
                ours: epoch.get(),
            });
        }
        let applied = AppliedSet::from_row(end, &holes).map_err(|e| {
            bad_row(format!(
                "{e}; the row for query id {} was changed by hand? Fix or delete it",
                r.batch.query_id
            ))
        })?;
        Ok((
            applied,
            Some(StoredRow {
                end,
                holes,
                batch_id,
            }),
        ))
    }

    /// Store one dead letter (an upsert on its source coordinates, so a
    /// re-applied range does not fail on it).
    ///
    /// # Errors
    /// The database's error.
    pub(super) fn insert_dead_letter(
        &self,
        b: &mut dyn sql::Backend,
        r: &PartitionContext,
        d: &DeadLetter,
    ) -> Result<(), DbError> {
        let headers: Vec<serde_json::Value> = d
            .headers
            .iter()
            .map(|(k, v)| {
                serde_json::json!({
                    "key": k,
                    "value_b64": v.as_ref().map(|v| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, v)),
                })
            })
            .collect();
        b.execute(
            &format!(
                "INSERT INTO {} (query_id, topic, \"partition\", \"offset\", timestamp_ms, record_key, record_value, headers_json, error, plugin_digest, stage, batch_id, epoch) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
                 ON CONFLICT (query_id, topic, \"partition\", \"offset\") DO UPDATE SET \
                   timestamp_ms = excluded.timestamp_ms, record_key = excluded.record_key, \
                   record_value = excluded.record_value, headers_json = excluded.headers_json, \
                   error = excluded.error, plugin_digest = excluded.plugin_digest, \
                   stage = excluded.stage, batch_id = excluded.batch_id, epoch = excluded.epoch",
                self.dead_letters
            ),
            &[
                SqlValue::Text(r.batch.query_id.clone()),
                SqlValue::Text(d.topic.clone()),
                SqlValue::Integer(d.partition.into()),
                SqlValue::Integer(d.offset),
                SqlValue::Integer(d.timestamp_ms),
                d.key.clone().map_or(SqlValue::Null, SqlValue::Blob),
                d.value.clone().map_or(SqlValue::Null, SqlValue::Blob),
                SqlValue::Text(serde_json::Value::Array(headers).to_string()),
                SqlValue::Text(d.error.clone()),
                SqlValue::Text(d.plugin_digest.clone()),
                SqlValue::Integer(d.stage as i64),
                SqlValue::Integer(r.batch.batch_id as i64),
                SqlValue::Integer(r.batch.epoch as i64),
            ],
        )
        .map(drop)
    }

    /// Write `r`'s progress row as `applied`, conditional on it still
    /// being `read` (none: no row at all) and never over a newer epoch.
    /// Returns the rows changed: 0 when the condition failed.
    ///
    /// # Errors
    /// The database's error.
    pub(super) fn write_progress(
        &self,
        b: &mut dyn sql::Backend,
        (r, epoch): (&PartitionContext, crate::checkpoint::Epoch),
        applied: &AppliedSet,
        read: Option<StoredRow>,
        owner: &str,
    ) -> Result<u64, DbError> {
        let new_end = applied.end().unwrap_or(r.end_offset);
        let (read_end, holes_read) = read.map_or((-1, String::new()), |row| (row.end, row.holes));
        b.execute(
                &format!(
                    "INSERT INTO {} AS p (query_id, topic, \"partition\", end_offset, batch_id, epoch, updated_at_ms, holes, owner) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $11) \
                     ON CONFLICT (query_id, topic, \"partition\") DO UPDATE SET \
                       end_offset = excluded.end_offset, batch_id = excluded.batch_id, \
                       epoch = excluded.epoch, updated_at_ms = excluded.updated_at_ms, \
                       holes = excluded.holes, owner = excluded.owner \
                     WHERE p.epoch <= excluded.epoch AND p.end_offset = $9 AND p.holes = $10",
                    self.progress
                ),
                &[
                    SqlValue::Text(r.batch.query_id.clone()),
                    SqlValue::Text(r.topic.clone()),
                    SqlValue::Integer(r.partition.into()),
                    SqlValue::Integer(new_end),
                    SqlValue::Integer(r.batch.batch_id as i64),
                    SqlValue::Integer(epoch.get() as i64),
                    SqlValue::Integer(crate::util::now_ms()),
                    SqlValue::Text(applied.holes_text()),
                    // -1 matches no row: a row that appeared since the read
                    // fails the update.
                    SqlValue::Integer(read_end),
                    SqlValue::Text(holes_read),
                    SqlValue::Text(owner.to_string()),
                ],
            )
    }
}

/// Another pipeline's progress rows on one topic
/// ([`HostTables::other_pipelines`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherPipeline {
    /// Its query id (the checkpoint's).
    pub query_id: String,
    /// The topic.
    pub topic: String,
    /// Partitions it has rows for.
    pub partitions: i64,
    /// Its newest row's update, ms since the Unix epoch.
    pub updated_at_ms: i64,
    /// Who wrote its newest row (pid, host, checkpoint; empty for rows of
    /// hosts that did not record it).
    pub owner: String,
}

impl HostTables {
    /// Progress rows of query ids other than `query_id` on `topics`.
    ///
    /// # Errors
    /// The database's error.
    pub(super) fn other_pipelines(
        &self,
        b: &mut dyn sql::Backend,
        query_id: &str,
        topics: &[String],
    ) -> Result<Vec<OtherPipeline>, DbError> {
        let mut out = Vec::new();
        for topic in topics {
            let rows = b.query(
                &format!(
                    "SELECT query_id, count(*), max(updated_at_ms), \
                       (SELECT o.owner FROM {p} o WHERE o.query_id = p.query_id AND o.topic = $1 \
                        ORDER BY o.updated_at_ms DESC LIMIT 1) \
                     FROM {p} p WHERE topic = $1 AND query_id <> $2 GROUP BY query_id ORDER BY query_id",
                    p = self.progress
                ),
                &[
                    SqlValue::Text(topic.clone()),
                    SqlValue::Text(query_id.to_string()),
                ],
            )?;
            for row in rows.rows {
                if let [
                    SqlValue::Text(q),
                    SqlValue::Integer(n),
                    SqlValue::Integer(at),
                    owner,
                ] = row.as_slice()
                {
                    out.push(OtherPipeline {
                        query_id: q.clone(),
                        topic: topic.clone(),
                        partitions: *n,
                        updated_at_ms: *at,
                        owner: match owner {
                            SqlValue::Text(o) => o.clone(),
                            _ => String::new(),
                        },
                    });
                }
            }
        }
        Ok(out)
    }
}
