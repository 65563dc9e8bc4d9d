//! Whether a checkpoint directory can be trusted: only when no other local
//! user can change what is in it. A directory owned by another user, or
//! writable by group or others, or a symlink where the checkpoint expects
//! its own files, could let that user plant a `lock` symlink (truncating a
//! file of ours when we lock it), point `offsets/` elsewhere, or edit the
//! entries. So [`check`] refuses such a directory, and the checkpoint's
//! directories are created 0700 and its files 0600 whatever the umask, the
//! lock file without following a symlink.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::CheckpointError;

/// Entries of a checkpoint directory that must be what they seem (never a
/// symlink).
const ENTRIES: [&str; 8] = [
    "lock",
    "epoch",
    "metadata",
    "handover",
    "offsets",
    "commits",
    "plugins",
    "control.sock",
];

fn unsafe_dir(path: &Path, reason: String) -> CheckpointError {
    CheckpointError::Unsafe {
        path: path.to_path_buf(),
        reason,
    }
}

/// Refuse `dir` unless it is a real directory of the user running this
/// process, not writable by group or others, and none of its checkpoint
/// entries is a symlink.
///
/// # Errors
/// [`CheckpointError::Unsafe`] saying what and how to fix it;
/// [`CheckpointError::Io`] when it cannot be examined.
pub(super) fn check(dir: &Path) -> Result<(), CheckpointError> {
    let io = |e: io::Error| CheckpointError::Io {
        path: dir.to_path_buf(),
        op: "examine directory",
        source: e,
    };
    let meta = std::fs::symlink_metadata(dir).map_err(io)?;
    if meta.file_type().is_symlink() {
        return Err(unsafe_dir(
            dir,
            "is a symlink; give the real directory (another user could repoint the link)".into(),
        ));
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(unsafe_dir(
            dir,
            format!(
                "is owned by uid {}, not by the user running the pipeline (uid {me}); use a directory of your own, or chown it",
                meta.uid()
            ),
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(unsafe_dir(
            dir,
            format!(
                "is writable by group or others (mode {mode:o}): another user could plant files in it; `chmod 700 {}`",
                dir.display()
            ),
        ));
    }
    for name in ENTRIES {
        let path = dir.join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(unsafe_dir(
                    &path,
                    "is a symlink, which a checkpoint never makes; remove it (and find out who made it)"
                        .into(),
                ));
            }
            Ok(m) if !(m.is_file() || m.is_dir() || m.file_type().is_socket()) => {
                return Err(unsafe_dir(
                    &path,
                    "is neither a file nor a directory (a FIFO or a device, say), which a checkpoint never makes; remove it".into(),
                ));
            }
            Ok(m) if m.uid() != me => {
                return Err(unsafe_dir(
                    &path,
                    format!("is owned by uid {}, not by uid {me}", m.uid()),
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
    }
    Ok(())
}

/// Open `path` for reading without following a symlink or blocking on a
/// FIFO, and only if it is a regular file.
///
/// # Errors
/// The OS error; `InvalidInput` for anything but a regular file.
pub(super) fn open_regular(path: &Path) -> io::Result<File> {
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok(f)
}

/// Read a checkpoint file ([`open_regular`]).
///
/// # Errors
/// As [`open_regular`], or the read's error.
pub(super) fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut open_regular(path)?, &mut bytes)?;
    Ok(bytes)
}

/// Create `dir` (its parents as the umask says) and make it 0700.
///
/// # Errors
/// The OS error.
pub(super) fn create_dir(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Open (creating it 0600 if missing) the file `path` for reading and
/// writing, refusing to follow a symlink there.
///
/// # Errors
/// The OS error (`ELOOP` for a symlink).
pub(super) fn open_own_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
}
