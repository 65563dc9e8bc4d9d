//! The plugin role on PostgreSQL (`--sink-plugin-role`): checked once at
//! start, so that `SET LOCAL ROLE` in each plugin window really keeps
//! plugin statements off the host's tables. The rules are PostgreSQL's
//! (`SET ROLE` needs membership of the session user; a member role
//! inherits its privileges; a superuser passes every check).

use super::{DbError, SqlGrant, SqlValue};
use sluice_guest::sql::quoted;

impl SqlGrant {
    /// Check that `role` can serve as the plugin role: it exists, is not a
    /// superuser and does not bypass row security, the host's login role
    /// may `SET ROLE` to it, it is not itself a member of the host's role
    /// (it would inherit the host's privileges), and it holds no privilege
    /// on any of `tables` (schema-qualified).
    ///
    /// # Errors
    /// What is wrong and the SQL that fixes it.
    pub fn check_plugin_role(&self, role: &str, tables: &[&str]) -> Result<(), DbError> {
        let mut s = self.lock();
        let b = s.backend();
        let refuse = |why: String| DbError::host(format!("--sink-plugin-role {role}: {why}"));
        let q = quoted(role);
        let found = b.query(
            // SET, not MEMBER, from PostgreSQL 16 (`GRANT … WITH SET FALSE`).
            "SELECT r.rolsuper, r.rolbypassrls, \
                    CASE WHEN current_setting('server_version_num')::int >= 160000 \
                      THEN pg_has_role(session_user, r.oid, 'SET') \
                      ELSE pg_has_role(session_user, r.oid, 'MEMBER') END, \
                    pg_has_role(r.oid, session_user, 'MEMBER'), session_user::text \
             FROM pg_roles r WHERE r.rolname = $1",
            &[SqlValue::Text(role.to_string())],
        )?;
        let Some(row) = found.rows.first() else {
            return Err(refuse(format!(
                "no such role; create it with `CREATE ROLE {q} NOLOGIN`, grant it what the plugin's tables need and `GRANT {q} TO` the host's login role (docs/plugins.md, \"A plugin role\")"
            )));
        };
        let flag = |i: usize| matches!(row.get(i), Some(SqlValue::Integer(1)));
        let login = match row.get(4) {
            Some(SqlValue::Text(t)) => t.clone(),
            _ => "the host's login role".to_string(),
        };
        if flag(0) || flag(1) {
            return Err(refuse(
                "the role is a superuser or bypasses row security, so it would pass every privilege check; use a plain role".into(),
            ));
        }
        if !flag(2) {
            return Err(refuse(format!(
                "the host's login role {login} cannot SET ROLE to it; run `GRANT {q} TO {}`",
                quoted(&login)
            )));
        }
        if flag(3) && role != login {
            return Err(refuse(format!(
                "the role is a member of the host's login role {login}, so it has the host's privileges; revoke that membership"
            )));
        }
        if role == login {
            return Err(refuse(
                "the plugin role must not be the host's own login role".into(),
            ));
        }
        for table in tables {
            // Column privileges too: `GRANT UPDATE (end_offset)` leaves
            // has_table_privilege false.
            let held = b.query(
                "SELECT has_table_privilege($1, $2, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER') \
                     OR has_any_column_privilege($1, $2, 'SELECT, INSERT, UPDATE, REFERENCES')",
                &[
                    SqlValue::Text(role.to_string()),
                    SqlValue::Text(table.to_string()),
                ],
            )?;
            if matches!(
                held.rows.first().and_then(|r| r.first()),
                Some(SqlValue::Integer(1))
            ) {
                return Err(refuse(format!(
                    "the role has privileges on the host's table {table}; run `REVOKE ALL ON {table} FROM {q}, PUBLIC`"
                )));
            }
        }
        Ok(())
    }
}

impl SqlGrant {
    /// On PostgreSQL without a plugin role: the login role's name when it
    /// is a superuser, so that plugin SQL runs as one (`None` otherwise,
    /// and on SQLite). The statement checks cannot confine a superuser
    /// fully (server files, settings, other databases), so the host warns.
    ///
    /// # Errors
    /// The database's error.
    pub fn unconfined_superuser(&self) -> Result<Option<String>, DbError> {
        if self.dialect() != super::Dialect::Postgres || self.plugin_role().is_some() {
            return Ok(None);
        }
        let mut s = self.lock();
        let found = s.backend().query(
            "SELECT session_user::text FROM pg_roles WHERE rolname = session_user AND rolsuper",
            &[],
        )?;
        Ok(match found.rows.first().and_then(|r| r.first()) {
            Some(SqlValue::Text(user)) => Some(user.clone()),
            _ => None,
        })
    }
}
