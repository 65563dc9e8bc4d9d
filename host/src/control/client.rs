//! The client side of the control socket, used by `host status`, `host
//! swap` and `host run --takeover`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::SOCKET;
use super::protocol::Command;

/// Errors of a control client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody listens: no owner is running.
    #[error("no running owner answers on {}: {source}", .path.display())]
    NotRunning {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The owner did not answer in time.
    #[error("the owner did not answer on {} within {} s", .path.display(), .timeout.as_secs())]
    Timeout {
        /// The socket path.
        path: PathBuf,
        /// The wait.
        timeout: Duration,
    },
    /// The owner refused.
    #[error("{0}")]
    Refused(String),
    /// I/O or protocol error.
    #[error("control socket {}: {detail}", .path.display())]
    Protocol {
        /// The socket path.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

/// A connection to a running owner.
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    timeout: Duration,
}

impl Client {
    /// Connect to the owner of checkpoint `dir`.
    ///
    /// # Errors
    /// [`ClientError::NotRunning`].
    pub fn connect(dir: &Path, timeout: Duration) -> Result<Self, ClientError> {
        let path = dir.join(SOCKET);
        let stream = UnixStream::connect(&path).map_err(|source| ClientError::NotRunning {
            path: path.clone(),
            source,
        })?;
        let proto = |e: std::io::Error| ClientError::Protocol {
            path: path.clone(),
            detail: e.to_string(),
        };
        stream.set_read_timeout(Some(timeout)).map_err(proto)?;
        let writer = stream.try_clone().map_err(proto)?;
        Ok(Client {
            path: path.clone(),
            reader: BufReader::new(stream),
            writer,
            timeout,
        })
    }

    /// Send one request line and read one answer line, as `T` (one of the
    /// answer types of [`super::protocol`]).
    ///
    /// # Errors
    /// [`ClientError::Timeout`], [`ClientError::Refused`] (an `ok: false`
    /// answer), [`ClientError::Protocol`].
    pub fn request<T: DeserializeOwned>(&mut self, req: &Command) -> Result<T, ClientError> {
        self.send(req)?;
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(ClientError::Protocol {
                path: self.path.clone(),
                detail: "the owner closed the connection".into(),
            }),
            Ok(_) => {
                let v: Value = serde_json::from_str(&line).map_err(|e| ClientError::Protocol {
                    path: self.path.clone(),
                    detail: e.to_string(),
                })?;
                if v["ok"] == true {
                    serde_json::from_value(v).map_err(|e| ClientError::Protocol {
                        path: self.path.clone(),
                        detail: format!("unexpected answer: {e}"),
                    })
                } else {
                    Err(ClientError::Refused(
                        v["error"].as_str().unwrap_or("refused").to_string(),
                    ))
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(ClientError::Timeout {
                    path: self.path.clone(),
                    timeout: self.timeout,
                })
            }
            Err(e) => Err(ClientError::Protocol {
                path: self.path.clone(),
                detail: e.to_string(),
            }),
        }
    }

    /// Send one line without waiting for an answer.
    ///
    /// # Errors
    /// [`ClientError::Protocol`].
    pub fn send(&mut self, command: &Command) -> Result<(), ClientError> {
        let mut line = serde_json::to_string(command).map_err(|e| ClientError::Protocol {
            path: self.path.clone(),
            detail: e.to_string(),
        })?;
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .and_then(|()| self.writer.flush())
            .map_err(|e| ClientError::Protocol {
                path: self.path.clone(),
                detail: e.to_string(),
            })
    }
}
