//! The text checks on plugin statements, on both backends: the first
//! keyword against the statements a plugin may not run, and (on
//! PostgreSQL, where no authorizer exists) the host's table names.

/// The first keyword of a statement, upper-cased (comments and empty
/// statements before it skipped).
pub(super) fn first_keyword(sql: &str) -> String {
    let mut s = sql.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
    loop {
        if let Some(rest) = s.strip_prefix("--") {
            s = rest.split_once('\n').map_or("", |(_, r)| r);
        } else if let Some(rest) = s.strip_prefix("/*") {
            s = rest.split_once("*/").map_or("", |(_, r)| r);
        } else {
            break;
        }
        s = s.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
    }
    s.chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect::<String>()
        .to_ascii_uppercase()
}

/// Statements a plugin may not run: they would end or escape the host's
/// transaction, or reach beyond the granted database. Checked on the
/// statement's text on both backends; on SQLite the authorizer
/// ([`sqlite_verdict`]) refuses the same actions again on the compiled
/// statement, except `VACUUM` (which SQLite does not pass to it, and whose
/// `VACUUM INTO` would write a file).
pub(super) const REFUSED: &[&str] = &[
    "BEGIN",
    "START",
    "COMMIT",
    "END",
    "ROLLBACK",
    "ABORT",
    "SAVEPOINT",
    "RELEASE",
    "ATTACH",
    "DETACH",
    "PRAGMA",
    "VACUUM",
    "COPY",
    "PREPARE",
    "LISTEN",
    "NOTIFY",
    "SET",
    "RESET",
    "DISCARD",
    "LOCK",
    "DO",
    "CALL",
];

/// Tables the host owns; plugin SQL may not use them. On SQLite the
/// authorizer enforces this on the tables a compiled statement touches
/// (triggers and views included); on PostgreSQL the host can only look
/// for the names in the statement's text.
pub(super) const HOST_TABLES: &[&str] = &["sluice_progress", "sluice_dead_letters"];
