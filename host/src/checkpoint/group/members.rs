//! What each member of a pipeline group reports about itself, and the
//! swaps asked of the group (`host group swap`). Status only: who is in
//! the group is the Kafka coordinator's business; these rows say which
//! plugins each member runs, whether it installed the last swap, and when
//! it was last seen.

use serde::Serialize;

use super::{GroupError, GroupStore};
use crate::capability::sql::SqlValue;
use crate::checkpoint::PluginRef;

/// A member's row in `sluice_group_members`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberRow {
    /// Who it is (pid, host).
    pub member: String,
    /// The plugins it runs now.
    pub plugins: Vec<PluginRef>,
    /// The last swap it acted on (0: none).
    pub swap_id: u64,
    /// Why it could not install that swap (it kept its plugins).
    pub swap_error: Option<String>,
    /// When it joined, ms since the Unix epoch.
    pub started_at_ms: i64,
    /// When it last reported, ms since the Unix epoch.
    pub seen_at_ms: i64,
    /// Its own view, as of `seen_at_ms` (refreshed every 5 s): pid, host,
    /// the batch in flight, the last committed batch and its progress
    /// event (the fields of `host status` for a single host). `None` from
    /// a host before 0.3.
    pub live: Option<serde_json::Value>,
}

/// A member not seen for this long (ms) counts as gone: a live member's
/// heartbeat writes its row every 5 s.
pub const GONE_AFTER_MS: i64 = 30_000;

impl MemberRow {
    /// How long ago (ms) the member last reported, as of `now_ms`.
    pub fn seen_ago_ms(&self, now_ms: i64) -> i64 {
        now_ms.saturating_sub(self.seen_at_ms)
    }

    /// Whether the member reported within [`GONE_AFTER_MS`] of `now_ms`.
    pub fn live(&self, now_ms: i64) -> bool {
        self.seen_ago_ms(now_ms) <= GONE_AFTER_MS
    }
}

/// A swap asked of the group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Swap {
    /// Its number in the group (1, 2, …).
    pub id: u64,
    /// The plugins every member is to run.
    pub plugins: Vec<PluginRef>,
    /// When it was asked, ms since the Unix epoch.
    pub requested_at_ms: i64,
    /// Who asked (pid, host).
    pub requested_by: String,
}

impl GroupStore {
    /// Record what `member` runs now: `plugins`, the last swap it acted on
    /// and why it could not install it; `seen_at_ms` becomes now.
    ///
    /// # Errors
    /// [`GroupError::Db`].
    pub fn report(
        &self,
        member: &str,
        plugins: &[PluginRef],
        swap_id: u64,
        swap_error: Option<&str>,
    ) -> Result<(), GroupError> {
        let now = crate::util::now_ms();
        let params = [
            SqlValue::Text(self.group.clone()),
            SqlValue::Text(member.to_string()),
            SqlValue::Text(serde_json::to_string(plugins).unwrap_or_default()),
            SqlValue::Integer(swap_id as i64),
            swap_error.map_or(SqlValue::Null, |e| SqlValue::Text(e.to_string())),
            SqlValue::Integer(now),
        ];
        self.tx(|b| {
            b.execute(
                &format!(
                    "INSERT INTO {} (group_name, member, plugins, swap_id, swap_error, started_at_ms, seen_at_ms) \
                     VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (group_name, member) DO UPDATE SET \
                       plugins = excluded.plugins, swap_id = excluded.swap_id, \
                       swap_error = excluded.swap_error, seen_at_ms = excluded.seen_at_ms",
                    self.tables.members
                ),
                &params,
            )
            .map(drop)
            .map_err(self.err("recording this member"))
        })
    }

    /// `member` is alive: its `seen_at_ms` becomes now (a heartbeat), and
    /// its own view `live` (JSON) is recorded. False when it has no row
    /// (never reported, or deleted by hand): the caller reports again.
    ///
    /// # Errors
    /// [`GroupError::Db`].
    pub fn touch(&self, member: &str, live: &str) -> Result<bool, GroupError> {
        self.tx(|b| {
            b.execute(
                &format!(
                    "UPDATE {} SET seen_at_ms = $3, live = $4 WHERE group_name = $1 AND member = $2",
                    self.tables.members
                ),
                &[
                    SqlValue::Text(self.group.clone()),
                    SqlValue::Text(member.to_string()),
                    SqlValue::Integer(crate::util::now_ms()),
                    SqlValue::Text(live.to_string()),
                ],
            )
            .map(|n| n > 0)
            .map_err(self.err("recording this member"))
        })
    }

    /// `member` left the group: its row goes.
    ///
    /// # Errors
    /// [`GroupError::Db`].
    pub fn leave(&self, member: &str) -> Result<(), GroupError> {
        self.tx(|b| {
            b.execute(
                &format!(
                    "DELETE FROM {} WHERE group_name = $1 AND member = $2",
                    self.tables.members
                ),
                &[
                    SqlValue::Text(self.group.clone()),
                    SqlValue::Text(member.to_string()),
                ],
            )
            .map(drop)
            .map_err(self.err("removing this member"))
        })
    }

    /// Every member row, by member.
    ///
    /// # Errors
    /// [`GroupError::Db`]; [`GroupError::BadRow`].
    pub fn members(&self) -> Result<Vec<MemberRow>, GroupError> {
        let select = |live: &str| {
            format!(
                "SELECT member, plugins, swap_id, swap_error, started_at_ms, seen_at_ms, {live} FROM {} \
                 WHERE group_name = $1 ORDER BY member",
                self.tables.members
            )
        };
        let query = |sql: String| {
            self.read(|b| {
                b.query(&sql, &[SqlValue::Text(self.group.clone())])
                    .map_err(self.err("reading the group's members"))
            })
        };
        let rows = match query(select("live")) {
            Ok(rows) => rows,
            // Tables of an older host, read by `host group status`: no
            // `live` column yet, or no tables at all.
            Err(GroupError::Db { error, .. })
                if error.code == "42703" || error.message.contains("no such column") =>
            {
                query(select("NULL"))?
            }
            Err(GroupError::Db { error, .. }) if error.is_missing_table() => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        rows.rows
            .iter()
            .map(|row| match row.as_slice() {
                [
                    SqlValue::Text(member),
                    SqlValue::Text(plugins),
                    SqlValue::Integer(swap_id),
                    swap_error,
                    SqlValue::Integer(started_at_ms),
                    SqlValue::Integer(seen_at_ms),
                    live,
                ] => Ok(MemberRow {
                    member: member.clone(),
                    plugins: serde_json::from_str(plugins)
                        .map_err(|e| self.bad_row(&self.tables.members, e.to_string()))?,
                    swap_id: *swap_id as u64,
                    swap_error: match swap_error {
                        SqlValue::Text(e) => Some(e.clone()),
                        _ => None,
                    },
                    started_at_ms: *started_at_ms,
                    seen_at_ms: *seen_at_ms,
                    live: match live {
                        SqlValue::Text(l) => serde_json::from_str(l).ok(),
                        _ => None,
                    },
                }),
                other => {
                    Err(self.bad_row(&self.tables.members, format!("unexpected row {other:?}")))
                }
            })
            .collect()
    }

    /// The members that reported within [`GONE_AFTER_MS`] of `now_ms`.
    ///
    /// # Errors
    /// As [`GroupStore::members`].
    pub fn live_members(&self, now_ms: i64) -> Result<Vec<MemberRow>, GroupError> {
        Ok(self
            .members()?
            .into_iter()
            .filter(|m| m.live(now_ms))
            .collect())
    }

    /// Ask every member to run `plugins` (stored already with
    /// [`GroupStore::store_plugin`]) in place of `base`, the group's
    /// plugins the swap was computed from: a new swap, numbered after the
    /// last, and the group's current plugins, in one transaction that
    /// locks the group's row (two swaps at once are serialized). Returns
    /// it.
    ///
    /// # Errors
    /// [`GroupError::SwapRace`] when the group's plugins are no longer
    /// `base`; [`GroupError::Db`].
    pub fn request_swap(
        &self,
        base: &[PluginRef],
        plugins: &[PluginRef],
        by: &str,
    ) -> Result<Swap, GroupError> {
        let json = serde_json::to_string(plugins).unwrap_or_default();
        self.tx(|b| {
            let now = crate::util::now_ms();
            let current = b
                .query(
                    &format!(
                        "SELECT plugins FROM {} WHERE group_name = $1{}",
                        self.tables.groups,
                        super::fence::for_update(b)
                    ),
                    &[SqlValue::Text(self.group.clone())],
                )
                .map_err(self.err("reading the group's plugins"))?;
            let current: Vec<PluginRef> = match current.rows.first().and_then(|r| r.first()) {
                Some(SqlValue::Text(p)) => serde_json::from_str(p)
                    .map_err(|e| self.bad_row(&self.tables.groups, e.to_string()))?,
                _ => return Err(self.bad_row(&self.tables.groups, "no group row")),
            };
            if current != base {
                return Err(GroupError::SwapRace {
                    group: self.group.clone(),
                    now: serde_json::to_string(&current).unwrap_or_default(),
                });
            }
            let last = b
                .query(
                    &format!(
                        "SELECT COALESCE(MAX(swap_id), 0) FROM {} WHERE group_name = $1",
                        self.tables.swaps
                    ),
                    &[SqlValue::Text(self.group.clone())],
                )
                .map_err(self.err("numbering a swap"))?;
            let id = match last.rows.first().and_then(|r| r.first()) {
                Some(SqlValue::Integer(n)) => *n as u64 + 1,
                _ => 1,
            };
            b.execute(
                &format!(
                    "INSERT INTO {} (group_name, swap_id, plugins, requested_at_ms, requested_by) \
                     VALUES ($1, $2, $3, $4, $5)",
                    self.tables.swaps
                ),
                &[
                    SqlValue::Text(self.group.clone()),
                    SqlValue::Integer(id as i64),
                    SqlValue::Text(json.clone()),
                    SqlValue::Integer(now),
                    SqlValue::Text(by.to_string()),
                ],
            )
            .map_err(self.err("recording a swap"))?;
            b.execute(
                &format!(
                    "UPDATE {} SET plugins = $2, updated_at_ms = $3 WHERE group_name = $1",
                    self.tables.groups
                ),
                &[
                    SqlValue::Text(self.group.clone()),
                    SqlValue::Text(json.clone()),
                    SqlValue::Integer(now),
                ],
            )
            .map_err(self.err("recording a swap"))?;
            Ok(Swap {
                id,
                plugins: plugins.to_vec(),
                requested_at_ms: now,
                requested_by: by.to_string(),
            })
        })
    }

    /// The last swap asked of the group, if any.
    ///
    /// # Errors
    /// [`GroupError::Db`]; [`GroupError::BadRow`].
    pub fn latest_swap(&self) -> Result<Option<Swap>, GroupError> {
        let rows = self.read(|b| {
            b.query(
                &format!(
                    "SELECT swap_id, plugins, requested_at_ms, requested_by FROM {} \
                     WHERE group_name = $1 ORDER BY swap_id DESC LIMIT 1",
                    self.tables.swaps
                ),
                &[SqlValue::Text(self.group.clone())],
            )
            .map_err(self.err("reading the last swap"))
        })?;
        match rows.rows.first().map(Vec::as_slice) {
            None => Ok(None),
            Some(
                [
                    SqlValue::Integer(id),
                    SqlValue::Text(plugins),
                    SqlValue::Integer(at),
                    SqlValue::Text(by),
                ],
            ) => Ok(Some(Swap {
                id: *id as u64,
                plugins: serde_json::from_str(plugins)
                    .map_err(|e| self.bad_row(&self.tables.swaps, e.to_string()))?,
                requested_at_ms: *at,
                requested_by: by.clone(),
            })),
            Some(other) => {
                Err(self.bad_row(&self.tables.swaps, format!("unexpected row {other:?}")))
            }
        }
    }
}
