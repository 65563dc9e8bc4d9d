//! Claim and fencing on a partition's row in `sluice_partitions`, inside
//! a transaction the caller holds: [`claim_on`] raises the owner epoch,
//! [`fence`] requires it to be ours in every part's sink transaction, and
//! a `host group reset` abandons the range in flight and records itself.

use super::{Claim, GroupError, GroupTables, Planned};
use crate::capability::sql::{Backend, Dialect, SqlValue};
use crate::checkpoint::Epoch;

/// Run `f` in one transaction of `b`: one that only reads (`write`
/// false) takes no lock up front; one that writes takes SQLite's write
/// lock at once (so it never fails half-way on a busy database).
pub(super) fn in_tx<T>(
    b: &mut dyn Backend,
    group: &str,
    write: bool,
    f: &mut dyn FnMut(&mut dyn Backend) -> Result<T, GroupError>,
) -> Result<T, GroupError> {
    let db = |during| {
        move |error| GroupError::Db {
            group: group.to_string(),
            during,
            error,
        }
    };
    b.batch(match (b.dialect(), write) {
        (Dialect::Sqlite, true) => "BEGIN IMMEDIATE",
        (Dialect::Sqlite, false) => "BEGIN",
        (Dialect::Postgres, _) => "BEGIN ISOLATION LEVEL READ COMMITTED",
    })
    .map_err(db("beginning a transaction"))?;
    match f(b) {
        Ok(v) => {
            b.batch("COMMIT").map_err(db("committing"))?;
            Ok(v)
        }
        Err(e) => {
            if let Err(r) = b.batch("ROLLBACK") {
                tracing::warn!("rollback failed: {r}");
            }
            Err(e)
        }
    }
}

/// `FOR UPDATE` where the database has it (SQLite locks the whole
/// database for the writing transaction instead).
pub(super) fn for_update(b: &dyn Backend) -> &'static str {
    match b.dialect() {
        Dialect::Sqlite => "",
        Dialect::Postgres => " FOR UPDATE",
    }
}

/// The parameters `$1 … $3` that name a partition's row in
/// `sluice_partitions`.
pub(super) fn row_key(group: &str, topic: &str, partition: i32) -> Vec<SqlValue> {
    vec![
        SqlValue::Text(group.to_string()),
        SqlValue::Text(topic.to_string()),
        SqlValue::Integer(partition.into()),
    ]
}

/// Inside a part's sink transaction (on the sink's connection): lock
/// `topic/partition`'s row and require `owner_epoch = epoch`.
///
/// # Errors
/// [`GroupError::Fenced`] when another member claimed it since;
/// [`GroupError::Db`].
pub fn fence(
    b: &mut dyn Backend,
    tables: &GroupTables,
    group: &str,
    topic: &str,
    partition: i32,
    epoch: Epoch,
) -> Result<(), GroupError> {
    let db = |error| GroupError::Db {
        group: group.to_string(),
        during: "checking the owner epoch",
        error,
    };
    let rows = b
        .query(
            &format!(
                "SELECT owner_epoch, owner FROM {} WHERE group_name = $1 AND topic = $2 AND \"partition\" = $3{}",
                tables.partitions,
                for_update(b)
            ),
            &row_key(group, topic, partition),
        )
        .map_err(db)?;
    match rows.rows.first().map(Vec::as_slice) {
        Some([SqlValue::Integer(now), _]) if *now as u64 == epoch.get() => Ok(()),
        Some([SqlValue::Integer(now), SqlValue::Text(holder)]) => Err(GroupError::Fenced {
            topic: topic.to_string(),
            partition,
            ours: epoch,
            now: Epoch::new(*now as u64),
            holder: holder.clone(),
        }),
        _ => Err(GroupError::Fenced {
            topic: topic.to_string(),
            partition,
            ours: epoch,
            now: Epoch::default(),
            holder: "nobody (the row is gone)".into(),
        }),
    }
}

/// [`GroupStore::claim`] inside a transaction open on `b` (the caller's):
/// raise the partition's owner epoch, record `(owner, member_id)`, and
/// return the planned range the previous owner left. The new epoch is
/// above `floor` too: the epoch the partition's progress row was written
/// with, so that a partition row deleted by hand (or lost) does not start
/// the epochs again below it (that row would refuse every write).
///
/// # Errors
/// [`GroupError::Db`]; [`GroupError::BadRow`].
pub fn claim_on(
    b: &mut dyn Backend,
    tables: &GroupTables,
    group: &str,
    (topic, partition): (&str, i32),
    (owner, member_id): (&str, &str),
    floor: Epoch,
) -> Result<Claim, GroupError> {
    let db = |error| GroupError::Db {
        group: group.to_string(),
        during: "claiming a partition",
        error,
    };
    let bad_row = |why: String| GroupError::BadRow {
        group: group.to_string(),
        table: tables.partitions.clone(),
        why,
    };
    // A group whose pipeline moved to a checkpoint directory (`host group
    // disband`) is claimed by nobody: its progress rows are that
    // directory's now.
    if let Some(to) = moved_to(b, tables, group)? {
        return Err(GroupError::Moved {
            group: group.to_string(),
            to,
        });
    }
    let key = row_key(group, topic, partition);
    let before = b
        .query(
            &format!(
                "SELECT owner_epoch, owner, planned FROM {} WHERE group_name = $1 AND topic = $2 AND \"partition\" = $3{}",
                tables.partitions,
                for_update(b)
            ),
            &key,
        )
        .map_err(db)?;
    let (epoch, previous_owner, planned) = match before.rows.first().map(Vec::as_slice) {
        None => (floor.next(), String::new(), None),
        Some([SqlValue::Integer(e), SqlValue::Text(o), planned]) => (
            Epoch::new(*e as u64).max(floor).next(),
            o.clone(),
            match planned {
                SqlValue::Text(p) => {
                    Some(serde_json::from_str::<Planned>(p).map_err(|e| bad_row(e.to_string()))?)
                }
                _ => None,
            },
        ),
        Some(other) => return Err(bad_row(format!("unexpected row {other:?}"))),
    };
    let mut params = key;
    params.extend([
        SqlValue::Integer(epoch.get() as i64),
        SqlValue::Text(owner.to_string()),
        SqlValue::Text(member_id.to_string()),
        SqlValue::Integer(crate::util::now_ms()),
    ]);
    b.execute(
        &format!(
            "INSERT INTO {} (group_name, topic, \"partition\", owner_epoch, owner, member_id, claimed_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (group_name, topic, \"partition\") DO UPDATE SET \
               owner_epoch = excluded.owner_epoch, owner = excluded.owner, \
               member_id = excluded.member_id, claimed_at_ms = excluded.claimed_at_ms",
            tables.partitions
        ),
        &params,
    )
    .map_err(db)?;
    Ok(Claim {
        epoch,
        previous_owner,
        planned,
    })
}

/// Clear the planned range of `topic/partition`, inside the caller's
/// transaction on `b` (a `host group reset` abandons the batch in flight:
/// what it applied is in the progress row).
///
/// # Errors
/// [`GroupError::Db`].
pub fn abandon_planned(
    b: &mut dyn Backend,
    tables: &GroupTables,
    group: &str,
    (topic, partition): (&str, i32),
) -> Result<(), GroupError> {
    b.execute(
        &format!(
            "UPDATE {} SET planned = NULL WHERE group_name = $1 AND topic = $2 AND \"partition\" = $3",
            tables.partitions
        ),
        &row_key(group, topic, partition),
    )
    .map(drop)
    .map_err(|error| GroupError::Db {
        group: group.to_string(),
        during: "abandoning a planned range",
        error,
    })
}

/// Record a `host group reset` in `sluice_group_resets` (the audit
/// trail), inside the caller's transaction on `b`: who, when, `--to`, and
/// `moves` (JSON: each partition's position before and after).
///
/// # Errors
/// [`GroupError::Db`].
pub fn record_reset(
    b: &mut dyn Backend,
    tables: &GroupTables,
    group: &str,
    by: &str,
    target: &str,
    moves: &str,
) -> Result<(), GroupError> {
    b.execute(
        &format!(
            "INSERT INTO {} (group_name, reset_at_ms, requested_by, target, moves) VALUES ($1, $2, $3, $4, $5)",
            tables.resets
        ),
        &[
            SqlValue::Text(group.to_string()),
            SqlValue::Integer(crate::util::now_ms()),
            SqlValue::Text(by.to_string()),
            SqlValue::Text(target.to_string()),
            SqlValue::Text(moves.to_string()),
        ],
    )
    .map(drop)
    .map_err(|error| GroupError::Db {
        group: group.to_string(),
        during: "recording the reset",
        error,
    })
}

/// The owner a `host group reset` records in the partitions it moves; a
/// member fenced by it claims the partition again (it is still assigned
/// to it).
pub const RESET_OWNER: &str = "host group reset";

/// Make `planned` the range in flight of `topic/partition` (`None`: none),
/// inside the caller's transaction on `b`.
///
/// # Errors
/// [`GroupError::Db`].
pub fn set_planned_on(
    b: &mut dyn Backend,
    tables: &GroupTables,
    group: &str,
    (topic, partition): (&str, i32),
    planned: Option<&Planned>,
) -> Result<(), GroupError> {
    let mut params = row_key(group, topic, partition);
    params.push(match planned {
        Some(p) => SqlValue::Text(serde_json::to_string(p).unwrap_or_default()),
        None => SqlValue::Null,
    });
    b.execute(
        &format!(
            "UPDATE {} SET planned = $4 WHERE group_name = $1 AND topic = $2 AND \"partition\" = $3",
            tables.partitions
        ),
        &params,
    )
    .map(drop)
    .map_err(|error| GroupError::Db {
        group: group.to_string(),
        during: "writing a planned range",
        error,
    })
}

/// Where the group's pipeline moved (`host group disband`), if it did, read
/// on `b`.
///
/// # Errors
/// [`GroupError::Db`].
pub fn moved_to(
    b: &mut dyn Backend,
    tables: &GroupTables,
    group: &str,
) -> Result<Option<String>, GroupError> {
    let rows = b
        .query(
            &format!(
                "SELECT moved_to FROM {} WHERE group_name = $1",
                tables.groups
            ),
            &[SqlValue::Text(group.to_string())],
        )
        .map_err(|error| GroupError::Db {
            group: group.to_string(),
            during: "reading where the group's pipeline is",
            error,
        })?;
    Ok(match rows.rows.first().map(Vec::as_slice) {
        Some([SqlValue::Text(to)]) => Some(to.clone()),
        _ => None,
    })
}

/// Claim `topic/partition` for `owner` (its owner epoch goes above
/// `floor` too) and make `planned` its range in flight, inside the
/// caller's transaction on `b`: the member that claims it next runs that
/// range again with these bounds (`host group adopt`).
///
/// # Errors
/// As [`claim_on`] and [`set_planned_on`].
pub fn hand_over_on(
    b: &mut dyn Backend,
    tables: &GroupTables,
    group: &str,
    (topic, partition): (&str, i32),
    (owner, floor): (&str, Epoch),
    planned: &Planned,
) -> Result<(), GroupError> {
    claim_on(b, tables, group, (topic, partition), (owner, ""), floor)?;
    set_planned_on(b, tables, group, (topic, partition), Some(planned))
}
