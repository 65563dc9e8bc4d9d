//! Crash-safe file writes.
//!
//! [`write_new`]: temp file in the same directory → write → fsync → hard
//! link to the final name (fails if it exists: never replaces) → remove
//! temp → fsync the directory. After a crash the final name either does not
//! exist or holds the complete, fsynced content.
//!
//! [`write_replace`]: the same with `rename` (replaces), for files that are
//! rewritten in place (`epoch`, `metadata`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::util::failpoint;

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

fn temp_path(dir: &Path, name: &str) -> PathBuf {
    let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".{name}.tmp-{}-{seq}", std::process::id()))
}

/// True for names [`write_new`]/[`write_replace`] use for temp files.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(".tmp-")
}

/// fsync a directory so a new or renamed entry in it is durable.
///
/// # Errors
/// The OS error.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn write_temp(dir: &Path, name: &str, bytes: &[u8], fp: &str) -> io::Result<PathBuf> {
    let tmp = temp_path(dir, name);
    // 0600 whatever the umask; create_new never follows a symlink.
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    failpoint(&format!("{fp}:before-write"));
    f.write_all(bytes)?;
    failpoint(&format!("{fp}:after-write"));
    f.sync_all()?;
    failpoint(&format!("{fp}:after-fsync"));
    Ok(tmp)
}

/// Atomically create `dir/name` with `bytes`; fails with
/// [`io::ErrorKind::AlreadyExists`] if it exists. `fp` prefixes the
/// failpoint names (`<fp>:before-write`, `:after-write`, `:after-fsync`,
/// `:after-link`).
///
/// # Errors
/// The OS error; the temp file is removed on failure.
pub fn write_new(dir: &Path, name: &str, bytes: &[u8], fp: &str) -> io::Result<()> {
    let tmp = write_temp(dir, name, bytes, fp)?;
    let result = fs::hard_link(&tmp, dir.join(name));
    let _ = fs::remove_file(&tmp);
    result?;
    failpoint(&format!("{fp}:after-link"));
    sync_dir(dir)
}

/// Atomically replace `dir/name` with `bytes`.
///
/// # Errors
/// The OS error; the temp file is removed on failure.
pub fn write_replace(dir: &Path, name: &str, bytes: &[u8], fp: &str) -> io::Result<()> {
    let tmp = write_temp(dir, name, bytes, fp)?;
    if let Err(e) = fs::rename(&tmp, dir.join(name)) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    failpoint(&format!("{fp}:after-rename"));
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_new_never_replaces() {
        let d = tempfile::tempdir().unwrap();
        write_new(d.path(), "a", b"one", "t").unwrap();
        let e = write_new(d.path(), "a", b"two", "t").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(d.path().join("a")).unwrap(), b"one");
        let leftovers: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| is_temp_name(&e.file_name().to_string_lossy()))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn write_replace_replaces() {
        let d = tempfile::tempdir().unwrap();
        write_replace(d.path(), "e", b"1", "t").unwrap();
        write_replace(d.path(), "e", b"2", "t").unwrap();
        assert_eq!(fs::read(d.path().join("e")).unwrap(), b"2");
    }
}
