//! The control socket's wire format: one JSON object per line each way.
//!
//! Requests are [`Command`]s, tagged by `op`: `{"op":"status"}`,
//! `{"op":"handover"}`, `{"op":"go"}`, `{"op":"swap","path":…,
//! "stage":"map"|"sink"|null,"index":N}`, `{"op":"took-over",
//! "first_write_ahead_ms":T,"epoch":E}`. Every answer is an object with
//! `"ok": true` and the fields of its answer type ([`StatusAnswer`],
//! [`HandoverOffer`], [`SwapAnswer`]), or `"ok": false` and `"error"`.
//! Unknown fields are ignored, so an older client can talk to a newer
//! owner.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{HandoverNote, LiveStatus};
use crate::checkpoint::{Epoch, StageKind};

/// A request line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Command {
    /// The owner's [`LiveStatus`].
    Status,
    /// Finish the batch in flight, commit, and offer the checkpoint
    /// (answered by a [`HandoverOffer`]).
    Handover,
    /// Confirm a handover: the owner releases the lock on this line only.
    Go,
    /// Install a plugin at the next batch boundary (answered by a
    /// [`SwapAnswer`]).
    Swap {
        /// The component file, as an absolute path (the owner reads it).
        path: PathBuf,
        /// Which stage to replace (`None`: what the plugin exports).
        #[serde(default)]
        stage: Option<StageKind>,
        /// Which map stage (0-based), when replacing a map stage.
        #[serde(default)]
        index: Option<usize>,
    },
    /// After a handover: the new owner's first write-ahead, so the old
    /// owner can log the gap.
    TookOver {
        /// When the new owner wrote its first write-ahead entry, ms since
        /// the Unix epoch.
        first_write_ahead_ms: i64,
        /// The new owner's epoch.
        epoch: Epoch,
    },
}

/// Answer to [`Command::Status`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusAnswer {
    /// What the owner publishes.
    pub status: LiveStatus,
}

/// Answer to [`Command::Handover`]: the owner is at a batch boundary and
/// still holds the lock, waiting for [`Command::Go`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandoverOffer {
    /// `ready`.
    pub phase: String,
    /// Where the owner stopped.
    pub note: HandoverNote,
}

/// Answer to [`Command::Swap`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SwapAnswer {
    /// SHA-256 of the installed component, hex.
    pub digest: String,
    /// The first batch that uses it.
    pub effective_batch: u64,
}

/// An answer line as written: `ok` plus the answer's fields, or the error.
#[derive(Debug, Serialize)]
pub(super) struct Answer<T> {
    pub(super) ok: bool,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub(super) body: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) error: Option<String>,
}

impl<T> Answer<T> {
    pub(super) fn ok(body: T) -> Self {
        Answer {
            ok: true,
            body: Some(body),
            error: None,
        }
    }
}

/// The refusal line: `{"ok":false,"error":…}`.
pub(super) fn refusal(e: impl std::fmt::Display) -> Answer<()> {
    Answer {
        ok: false,
        body: None,
        error: Some(e.to_string()),
    }
}

/// Write one answer line.
pub(super) fn answer(stream: &mut UnixStream, v: &impl Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_string(v).map_err(std::io::Error::other)?;
    line.push('\n');
    stream.write_all(line.as_bytes())?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_keep_their_wire_form() {
        let swap = Command::Swap {
            path: "/p/x.wasm".into(),
            stage: Some(StageKind::Sink),
            index: None,
        };
        assert_eq!(
            serde_json::to_string(&swap).unwrap(),
            r#"{"op":"swap","path":"/p/x.wasm","stage":"sink","index":null}"#
        );
        let took: Command =
            serde_json::from_str(r#"{"op":"took-over","first_write_ahead_ms":5,"epoch":2}"#)
                .unwrap();
        assert_eq!(
            took,
            Command::TookOver {
                first_write_ahead_ms: 5,
                epoch: Epoch::new(2)
            }
        );
        let bare: Command = serde_json::from_str(r#"{"op":"swap","path":"/a"}"#).unwrap();
        assert!(matches!(
            bare,
            Command::Swap {
                stage: None,
                index: None,
                ..
            }
        ));
        assert!(serde_json::from_str::<Command>(r#"{"op":"reboot"}"#).is_err());
    }

    #[test]
    fn answers_are_flat_objects() {
        let a = Answer::ok(SwapAnswer {
            digest: "ab".into(),
            effective_batch: 7,
        });
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"ok":true,"digest":"ab","effective_batch":7}"#
        );
        assert_eq!(
            serde_json::to_string(&refusal("no")).unwrap(),
            r#"{"ok":false,"error":"no"}"#
        );
    }
}
