//! Where a PostgreSQL password comes from when the `--sink-db` URL has
//! none, in libpq's order (PostgreSQL docs, "Environment Variables" and
//! "The Password File"): a file named by `--sink-db-password-file` (its
//! first line), then `PGPASSWORD`, then the password file `PGPASSFILE` or
//! `~/.pgpass`, whose lines are `hostname:port:database:username:password`
//! with `*` matching anything and `\:`/`\\` escaping. Like libpq, a
//! password file readable by group or others is ignored, with a warning.
//! A password never appears in a message.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::DbError;

/// Read the first line of `path` as the password.
///
/// # Errors
/// The file cannot be read, or is empty.
pub fn read_password_file(path: &Path) -> Result<String, DbError> {
    let text = crate::util::read_text_capped(path, 4096)
        .map_err(|e| DbError::host(format!("--sink-db-password-file {}: {e}", path.display())))?;
    let line = text.lines().next().unwrap_or_default().to_string();
    if line.is_empty() {
        return Err(DbError::host(format!(
            "--sink-db-password-file {}: the first line is empty",
            path.display()
        )));
    }
    Ok(line)
}

/// The fields of one `.pgpass` line, unescaped; `None` for a comment or a
/// line with fewer than five fields.
fn pgpass_fields(line: &str) -> Option<[String; 5]> {
    if line.starts_with('#') {
        return None;
    }
    let mut fields: Vec<String> = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut()?.push(chars.next().unwrap_or('\\')),
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut()?.push(c),
        }
    }
    fields.try_into().ok()
}

/// The password `pgpass` (a file's text) holds for the connection, the
/// first matching line winning.
pub fn pgpass_lookup(pgpass: &str, host: &str, port: u16, db: &str, user: &str) -> Option<String> {
    let port = port.to_string();
    pgpass
        .lines()
        .filter_map(pgpass_fields)
        .find_map(|[h, p, d, u, pw]| {
            let hit = |pattern: &str, value: &str| pattern == "*" || pattern == value;
            (hit(&h, host) && hit(&p, &port) && hit(&d, db) && hit(&u, user)).then_some(pw)
        })
}

fn pgpass_path() -> Option<PathBuf> {
    std::env::var_os("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pgpass")))
}

/// The password for a connection without one in its URL, or `None`.
///
/// # Errors
/// `password_file` cannot be read.
pub fn find(
    password_file: Option<&Path>,
    host: &str,
    port: u16,
    db: &str,
    user: &str,
) -> Result<Option<String>, DbError> {
    if let Some(f) = password_file {
        return read_password_file(f).map(Some);
    }
    if let Ok(pw) = std::env::var("PGPASSWORD") {
        return Ok(Some(pw));
    }
    let Some(path) = pgpass_path() else {
        return Ok(None);
    };
    let Ok(meta) = std::fs::metadata(&path) else {
        return Ok(None);
    };
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(file = %path.display(), "password file has group or world access; ignored (chmod 0600 it)");
        return Ok(None);
    }
    Ok(crate::util::read_text_capped(&path, 1 << 20)
        .ok()
        .and_then(|text| pgpass_lookup(&text, host, port, db, user)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgpass_lines_match_with_wildcards_and_escapes_first_line_wins() {
        let text = "# comment\nother:5432:db:u:nope\n*:5433:*:u:first\n*:*:*:u:second\nh\\:x:*:*:*:p\\:w\\\\\n";
        assert_eq!(
            pgpass_lookup(text, "db1", 5433, "x", "u").as_deref(),
            Some("first")
        );
        assert_eq!(
            pgpass_lookup(text, "db1", 5432, "x", "u").as_deref(),
            Some("second")
        );
        assert_eq!(
            pgpass_lookup(text, "h:x", 1, "d", "v").as_deref(),
            Some("p:w\\")
        );
        assert_eq!(pgpass_lookup(text, "db1", 5432, "x", "nobody"), None);
    }

    #[test]
    fn a_password_file_gives_its_first_line() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("pw");
        std::fs::write(&f, "s3cret\nignored\n").unwrap();
        assert_eq!(read_password_file(&f).unwrap(), "s3cret");
        std::fs::write(&f, "\n").unwrap();
        assert!(read_password_file(&f).is_err());
        let e = read_password_file(&d.path().join("missing")).unwrap_err();
        assert!(e.message.contains("--sink-db-password-file"), "{e}");
    }
}
