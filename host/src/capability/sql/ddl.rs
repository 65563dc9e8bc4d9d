//! Creating the host's tables: DDL that several hosts of one pipeline
//! group may run at the same moment, and columns added to tables that an
//! older host made.

use super::{Backend, DbError};

/// Run `ddl` (`CREATE TABLE IF NOT EXISTS …` statements) on `b`, again
/// when another host running the same at the same moment made it fail:
/// [`DbError::is_concurrent_create`] (up to 3 more times), or SQLite busy
/// (for up to 5 s). Hosts of one pipeline group start together.
///
/// # Errors
/// The database's error.
pub fn create_tables(b: &mut dyn Backend, ddl: &str) -> Result<(), DbError> {
    let (mut raced, mut busy) = (0, 0);
    loop {
        match b.batch(ddl) {
            Err(e) if e.is_concurrent_create() && raced < 3 => raced += 1,
            Err(e) if e.code == "SQLITE_BUSY" && busy < 50 => {
                busy += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

/// Add `column` (its definition `ddl`, e.g. `holes TEXT NOT NULL DEFAULT
/// '[]'`) to `table` unless it has it: a table made by an older host gets
/// the columns a newer one writes. Another host adding it at the same
/// moment is fine.
///
/// # Errors
/// The database's error.
pub fn add_column(
    b: &mut dyn Backend,
    table: &str,
    column: &str,
    ddl: &str,
) -> Result<(), DbError> {
    match b.query(&format!("SELECT {column} FROM {table} WHERE 1 = 0"), &[]) {
        Ok(_) => Ok(()),
        Err(e) if e.code == "42703" || e.message.contains("no such column") => {
            match b.batch(&format!("ALTER TABLE {table} ADD COLUMN {ddl}")) {
                // Another host upgrading at the same moment added it.
                Err(e) if e.code == "42701" || e.message.contains("duplicate column") => Ok(()),
                other => other,
            }
        }
        Err(e) => Err(e),
    }
}
