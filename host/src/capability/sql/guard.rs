//! The text checks on plugin statements, on both backends: the first
//! keyword against the statements a plugin may not run, and (on
//! PostgreSQL, where no authorizer exists) the host's table names.

/// The first two keywords of a statement, upper-cased (`ALTER`, `ROLE`;
/// comments and empty statements before them skipped). `nested`: block
/// comments nest, as on PostgreSQL (`/* /* */ still a comment */`); SQLite
/// ends one at the first `*/`.
pub(super) fn first_keywords(sql: &str, nested: bool) -> (String, String) {
    let (first, rest) = keyword_at(sql, nested);
    (first, keyword_at(rest, nested).0)
}

/// The keyword at the start of `sql` (after comments, blanks and empty
/// statements), upper-cased, and what follows it.
fn keyword_at(sql: &str, nested: bool) -> (String, &str) {
    let mut s = sql.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
    loop {
        if let Some(rest) = s.strip_prefix("--") {
            s = rest.split_once('\n').map_or("", |(_, r)| r);
        } else if let Some(rest) = s.strip_prefix("/*") {
            s = skip_block_comment(rest, nested);
        } else {
            break;
        }
        s = s.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
    }
    let end = s
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(s.len());
    (s[..end].to_ascii_uppercase(), &s[end..])
}

/// What follows the block comment whose `/*` precedes `rest` (empty when
/// it never ends).
fn skip_block_comment(rest: &str, nested: bool) -> &str {
    let bytes = rest.as_bytes();
    let mut depth = 1usize;
    let mut i = 0;
    while i + 1 < bytes.len() {
        match (bytes[i], bytes[i + 1]) {
            (b'*', b'/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return &rest[i..];
                }
            }
            (b'/', b'*') if nested => {
                depth += 1;
                i += 2;
            }
            _ => i += 1,
        }
    }
    ""
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

/// `ALTER …` statements a plugin may not run on PostgreSQL: they change
/// settings beyond its transaction, for later connections (`ALTER ROLE
/// CURRENT_USER SET search_path = shadow` would make the host's next
/// connection look for its tables elsewhere).
pub(super) const REFUSED_ALTER: &[&str] = &["ROLE", "USER", "DATABASE", "SYSTEM", "GROUP"];

/// Tables the host owns; plugin SQL may not use them. On SQLite the
/// authorizer enforces this on the tables a compiled statement touches
/// (triggers and views included); on PostgreSQL the host can only look
/// for the names in the statement's text.
pub(super) const HOST_TABLES: &[&str] = &["sluice_progress", "sluice_dead_letters"];
