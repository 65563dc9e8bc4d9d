//! Sink database URLs: `sqlite:PATH` and `postgres://…` (or libpq's
//! `key=value` form), their redaction for messages, the identity recorded
//! in checkpoints, and connecting.

use std::path::Path;

use super::postgres::Postgres;
use super::sqlite::Sqlite;
use super::{Backend, DbError};

/// `url` with its passwords replaced by `***`, for messages, logs and the
/// checkpoint: the user-info password (`scheme://user:PASSWORD@…`), query
/// parameters whose name holds `password` (`?password=…`,
/// `sslpassword=…`), and the same keys in libpq's `key=value` form.
pub fn redact(url: &str) -> String {
    let secret = |k: &str| k.to_ascii_lowercase().contains("password");
    let Some((scheme, rest)) = url.split_once("://") else {
        // libpq's key=value form (`host=db password=x`), or sqlite:PATH.
        if !url.contains('=') || url.starts_with("sqlite:") {
            return url.to_string();
        }
        return url
            .split(' ')
            .map(|w| match w.split_once('=') {
                Some((k, _)) if secret(k) => format!("{k}=***"),
                _ => w.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" ");
    };
    // The user-info ends at the last `@`, unless that one is in the query
    // (`?user=a@b`); a password may hold `?` or `/` unencoded.
    let at = rest.rfind('@').and_then(|at| match rest[..at].find('?') {
        Some(q) if rest[q..at].contains('=') => rest[..q].rfind('@'),
        _ => Some(at),
    });
    let (userinfo, rest) = match at {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let mut out = match userinfo {
        Some(u) => match u.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{rest}"),
            None => format!("{scheme}://{u}@{rest}"),
        },
        None => format!("{scheme}://{rest}"),
    };
    if let Some(q) = query {
        let params: Vec<String> = q
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if secret(k) => format!("{k}=***"),
                _ => p.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// How the checkpoint records a `--sink-db` URL: [`redact`]ed, and for
/// SQLite with an absolute path, so that a later command run from another
/// directory names the same file.
///
/// # Errors
/// The current directory cannot be read.
pub fn sink_identity(url: &str) -> std::io::Result<String> {
    match url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    {
        Some(path) if !path.is_empty() && path != ":memory:" => {
            let p = std::path::Path::new(path);
            let abs = if p.is_absolute() {
                p.to_path_buf()
            } else {
                std::env::current_dir()?.join(p)
            };
            Ok(format!("sqlite:{}", abs.display()))
        }
        _ => Ok(redact(url)),
    }
}

/// [`sink_identity`] of a sink whose host tables are in `schema`
/// (`--sink-schema`): `#schema=NAME` is appended unless it is the default
/// (`public`), so identities recorded before the setting existed still
/// match.
///
/// # Errors
/// As [`sink_identity`].
pub fn sink_identity_in(url: &str, schema: Option<&str>) -> std::io::Result<String> {
    let id = sink_identity(url)?;
    Ok(match schema {
        Some(s) if s != "public" && !id.starts_with("sqlite:") => format!("{id}#schema={s}"),
        _ => id,
    })
}

/// Open a backend from a `--sink-db` URL: `sqlite:PATH` (also
/// `sqlite://PATH`) or `postgres://…` / `postgresql://…`.
///
/// # Errors
/// An unknown scheme, or the database's connection error.
pub fn connect(url: &str) -> Result<Box<dyn Backend>, DbError> {
    connect_with(url, None)
}

/// The database a `--sink-db` URL names.
enum SinkUrl<'a> {
    /// `sqlite:PATH` or `sqlite://PATH`: the path.
    Sqlite(&'a str),
    /// `postgres://…` or `postgresql://…`.
    Postgres,
}

/// Read the form of a `--sink-db` URL: `sqlite:PATH` (also
/// `sqlite://PATH`, a non-empty path) or `postgres://…` /
/// `postgresql://…`.
fn parse_url(url: &str) -> Result<SinkUrl<'_>, String> {
    match url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    {
        Some("") => Err("sqlite: needs a path, e.g. sqlite:./sink.db".into()),
        Some(path) => Ok(SinkUrl::Sqlite(path)),
        None if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            Ok(SinkUrl::Postgres)
        }
        None => Err(format!(
            "unsupported sink database `{}`: use sqlite:PATH or postgres://USER@HOST:PORT/DB (also postgresql://)",
            redact(url)
        )),
    }
}

/// Whether `url` names a PostgreSQL database (`postgres://…` or
/// `postgresql://…`), for settings that only PostgreSQL takes.
pub fn is_postgres_url(url: &str) -> bool {
    matches!(parse_url(url), Ok(SinkUrl::Postgres))
}

/// Check the form of a `--sink-db` URL without connecting (see
/// [`connect`] for the forms). For the command line, so that another
/// scheme (`mysql://…`) is a usage error (exit 2) before anything starts.
///
/// # Errors
/// What is wrong with `url`, with the password hidden.
pub fn check_url(url: &str) -> Result<String, String> {
    parse_url(url).map(|_| url.to_string())
}

/// [`connect`], with a PostgreSQL password read from `password_file`
/// when the URL has none (see `password`).
///
/// # Errors
/// As [`connect`]; the password file cannot be read.
pub fn connect_with(url: &str, password_file: Option<&Path>) -> Result<Box<dyn Backend>, DbError> {
    match parse_url(url).map_err(DbError::host)? {
        SinkUrl::Sqlite(path) => Ok(Box::new(Sqlite::open(path)?)),
        SinkUrl::Postgres => Ok(Box::new(Postgres::connect(url, password_file)?)),
    }
}
