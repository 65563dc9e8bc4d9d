//! The checks on plugin statements before they run.
//!
//! SQLite: the first keyword against the statements a plugin may not run
//! ([`first_keyword`], [`REFUSED`]); the authorizer then checks the
//! compiled statement (see `sqlite`).
//!
//! PostgreSQL has no authorizer, so [`check_postgres`] parses the statement
//! with a maintained parser (`sqlparser`, PostgreSQL dialect) and lets
//! through only the statement kinds a sink needs (an allow-list: anything
//! it cannot parse or does not know is refused), then looks at the text
//! for names no plugin may use ([`HOST_TABLES`], [`DENIED_NAMES`]). The
//! text look is deliberately cruder than the parser: it holds even where
//! the parser and PostgreSQL's own grammar read a statement differently.
//! What neither can see (a function of the database's that changes the
//! role) is caught after the statement by the session's transaction
//! check (`Session::watch`).

use std::ops::ControlFlow;

use sqlparser::ast::{Expr, ObjectType, Statement, TableFactor, Visit, Visitor};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

/// The first keyword of a statement, upper-cased (comments and empty
/// statements before it skipped; a block comment ends at the first `*/`,
/// as on SQLite, where block comments do not nest).
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
    let end = s
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(s.len());
    s[..end].to_ascii_uppercase()
}

/// Statements a plugin may not run on SQLite: they would end or escape the
/// host's transaction, or reach beyond the granted database. Checked on
/// the statement's text; the authorizer
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
/// (triggers and views included); on PostgreSQL [`check_postgres`] refuses
/// the names in the statement's text, and a plugin role
/// (`--sink-plugin-role`) has no privilege on them.
pub(super) const HOST_TABLES: &[&str] = &[
    "sluice_progress",
    "sluice_dead_letters",
    "sluice_groups",
    "sluice_group_plugins",
    "sluice_partitions",
    "sluice_group_members",
    "sluice_group_swaps",
    "sluice_group_resets",
];

/// Names no plugin statement may hold as a word anywhere in its text
/// (checked on the lower-cased words of the raw text, string literals
/// included, so that neither quoting, case nor a parser that reads the
/// statement differently from PostgreSQL hides them): functions and views
/// that change the session's role or settings (`set_config`,
/// `pg_settings`), run SQL given as text where no check sees it
/// (`ts_stat`, `ts_rewrite`), signal other sessions (`pg_notify`), or reach
/// the server's files, configuration and processes (most need a superuser).
pub(super) const DENIED_NAMES: &[&str] = &[
    "set_config",
    "pg_settings",
    "ts_stat",
    "ts_rewrite",
    "pg_notify",
    "pg_file_settings",
    "pg_hba_file_rules",
    "pg_ident_file_mappings",
    "pg_switch_wal",
    "pg_promote",
    "pg_read_file",
    "pg_read_binary_file",
    "pg_stat_file",
    "lo_import",
    "lo_export",
    "pg_terminate_backend",
    "pg_cancel_backend",
    "pg_reload_conf",
    "pg_rotate_logfile",
];

/// Beginnings of words denied like [`DENIED_NAMES`]: other connections
/// (`dblink…`), locks that outlive the transaction (`pg_advisory_lock`,
/// `pg_try_advisory_lock` …), directory listings, statistics resets,
/// backups, replication slots and logical decoding.
pub(super) const DENIED_PREFIXES: &[&str] = &[
    "dblink",
    "pg_advisory",
    "pg_try_advisory",
    "pg_ls_",
    "pg_stat_reset",
    "pg_backup",
    "pg_create_",
    "pg_drop_replication",
    "pg_replication_",
    "pg_logical_",
];

/// The lower-cased words of `sql` (runs of letters, digits, `_` and `$`).
fn words(lower: &str) -> impl Iterator<Item = &str> {
    lower
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
        .filter(|w| !w.is_empty())
}

/// The first word of `lower` that [`DENIED_NAMES`] or [`DENIED_PREFIXES`]
/// deny, or that names one of the `…_to_xml` functions (which run SQL
/// given as text or read tables named by a string).
fn denied_word(lower: &str) -> Option<&str> {
    words(lower).find(|w| {
        DENIED_NAMES.contains(w)
            || DENIED_PREFIXES.iter().any(|p| w.starts_with(p))
            || w.contains("_to_xml")
    })
}

/// A PostgreSQL statement that passed [`check_postgres`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Approved {
    /// The statement may run code the check cannot see (a function call,
    /// DDL): the session checks its transaction and role right after it
    /// runs, not only at the end of the plugin's window.
    pub(super) watch: bool,
}

/// Check one plugin statement for PostgreSQL.
///
/// Allowed: one `SELECT`/`VALUES`/`WITH` query, `INSERT`, `UPDATE`,
/// `DELETE`, `MERGE`, `TRUNCATE`, `CREATE TABLE`/`INDEX`/`VIEW`/`SEQUENCE`,
/// `ALTER TABLE`/`INDEX`, and `DROP` of tables, views, indexes and
/// sequences. Everything else (transaction control, `SET`, `COPY`, `DO`,
/// `CALL`, roles, functions, triggers, rules, `GRANT` …) is refused, as is
/// any statement holding a name of [`HOST_TABLES`] or [`DENIED_NAMES`] or
/// a Unicode-escaped identifier (`U&"…"`, which the name check could not
/// read).
///
/// # Errors
/// Why the statement is refused, for the plugin's `sql-error`.
pub(super) fn check_postgres(sql: &str) -> Result<Approved, String> {
    let lower = sql.to_ascii_lowercase();
    if lower.contains("u&\"") {
        return Err("Unicode-escaped identifiers (U&\"…\") are not allowed: the host checks names by their text".into());
    }
    if let Some(t) = words(&lower).find(|w| HOST_TABLES.contains(w)) {
        return Err(format!(
            "table {t} belongs to the host; plugins may not use it"
        ));
    }
    if let Some(n) = denied_word(&lower) {
        return Err(format!(
            "`{n}` is not allowed in plugin SQL: it reaches beyond the host's transaction (the role, settings, other sessions or the server's files)"
        ));
    }
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).map_err(|e| {
        format!(
            "the host's SQL parser (sqlparser, PostgreSQL dialect) cannot read this statement ({e}); the host runs only plugin statements it can check, so write it in a plainer form"
        )
    })?;
    let [statement] = statements.as_slice() else {
        return Err(format!(
            "one statement per call ({} given)",
            statements.len()
        ));
    };
    let ddl = match statement {
        Statement::Query(_)
        | Statement::Insert(_)
        | Statement::Update(_)
        | Statement::Delete(_)
        | Statement::Merge(_) => false,
        Statement::Truncate(_)
        | Statement::CreateTable(_)
        | Statement::CreateIndex(_)
        | Statement::CreateView(_)
        | Statement::CreateSequence { .. }
        | Statement::AlterTable(_)
        | Statement::AlterIndex { .. } => true,
        Statement::Drop {
            object_type:
                ObjectType::Table | ObjectType::View | ObjectType::Index | ObjectType::Sequence,
            ..
        } => true,
        other => {
            let kind = other.to_string();
            let kind: Vec<&str> = kind.split_whitespace().take(2).collect();
            return Err(format!(
                "`{}` statements are not allowed: plugins may query and change tables (SELECT, INSERT, UPDATE, DELETE, MERGE, TRUNCATE, CREATE/ALTER/DROP TABLE, INDEX, VIEW, SEQUENCE); the host owns the transaction, the connection and the roles",
                kind.join(" ")
            ));
        }
    };
    let mut calls = Calls::default();
    let _ = statement.visit(&mut calls);
    // A statement that changes anything (DDL, DML, or a query with a
    // data-modifying WITH) may not name the system catalogs: a superuser
    // could rename the host's tables or set later connections' settings by
    // writing them.
    let mut writes = Writes(ddl);
    let _ = statement.visit(&mut writes);
    if writes.0
        && let Some(name) = catalog_name(&lower)
    {
        return Err(format!(
            "a statement that changes data may not name `{name}`: the system catalogs are the server's, not the plugin's"
        ));
    }
    Ok(Approved {
        watch: ddl || calls.found,
    })
}

/// The first word of `lower` that names a system catalog or view: one
/// starting with `pg_`, or `information_schema`. `pg_temp` is not one:
/// it names the session's own temporary schema (the bulk path stages
/// there), never another session's (`pg_temp_3` is refused).
fn catalog_name(lower: &str) -> Option<&str> {
    words(lower).find(|w| (w.starts_with("pg_") && *w != "pg_temp") || *w == "information_schema")
}

/// Finds whether a statement, or one nested in it (a data-modifying
/// `WITH`), is anything but a query.
struct Writes(bool);

impl Visitor for Writes {
    type Break = ();

    fn pre_visit_statement(&mut self, s: &Statement) -> ControlFlow<()> {
        if !matches!(s, Statement::Query(_)) {
            self.0 = true;
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }
}

/// Finds whether a statement calls a function anywhere (in an expression
/// or as a table in `FROM`).
#[derive(Default)]
struct Calls {
    found: bool,
}

impl Visitor for Calls {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        if matches!(expr, Expr::Function(_)) {
            self.found = true;
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, t: &TableFactor) -> ControlFlow<()> {
        let plain = match t {
            TableFactor::Table { args, .. } => args.is_none(),
            TableFactor::Derived { .. } | TableFactor::NestedJoin { .. } => true,
            _ => false,
        };
        if !plain {
            self.found = true;
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }
}
