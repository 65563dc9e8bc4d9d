//! A backend with no database behind it, for `host test`'s dry run: the
//! statements a sink sends are checked and recorded ([`super::Ran`]) but
//! not run; every statement changes no rows and every query returns none.

use super::{Backend, DbError, Dialect, QueryRows, SqlValue};

/// No database: see the module docs.
pub(super) struct Dry(pub(super) Dialect);

impl Backend for Dry {
    fn dialect(&self) -> Dialect {
        self.0
    }

    fn batch(&mut self, _sql: &str) -> Result<(), DbError> {
        Ok(())
    }

    fn execute(&mut self, _sql: &str, _params: &[SqlValue]) -> Result<u64, DbError> {
        Ok(0)
    }

    fn query(&mut self, _sql: &str, _params: &[SqlValue]) -> Result<QueryRows, DbError> {
        Ok(QueryRows::default())
    }

    fn in_autocommit(&self) -> Option<bool> {
        None
    }

    fn blob_type(&self) -> &'static str {
        match self.0 {
            Dialect::Sqlite => "BLOB",
            Dialect::Postgres => "BYTEA",
        }
    }

    fn enter_plugin_window(
        &mut self,
        _limit: Option<std::time::Duration>,
        _role: Option<&str>,
    ) -> Result<(), DbError> {
        Ok(())
    }

    fn leave_plugin_window(&mut self) -> Result<(), DbError> {
        Ok(())
    }
}
