//! A live status line on stderr that log lines do not garble: every log
//! write clears the line first and redraws it after (see [`Writer`]).

use std::io::{self, IsTerminal, Write};
use std::sync::Mutex;

static LINE: Mutex<Option<String>> = Mutex::new(None);

/// Show `text` as the status line (redrawn under each log line).
pub fn set(text: String) {
    let mut g = LINE.lock().unwrap_or_else(|p| p.into_inner());
    let stderr = io::stderr();
    let mut e = stderr.lock();
    let _ = write!(e, "\r\x1b[2K{text}");
    let _ = e.flush();
    *g = Some(text);
}

/// Remove the status line (at exit).
pub fn clear() {
    let mut g = LINE.lock().unwrap_or_else(|p| p.into_inner());
    if g.take().is_some() {
        let _ = write!(io::stderr(), "\r\x1b[2K");
    }
}

/// A stderr writer for the log: clears the status line, writes the log
/// bytes, redraws the status line.
pub struct Writer;

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let g = LINE.lock().unwrap_or_else(|p| p.into_inner());
        let stderr = io::stderr();
        let mut e = stderr.lock();
        match g.as_deref() {
            Some(line) if stderr.is_terminal() => {
                e.write_all(b"\r\x1b[2K")?;
                e.write_all(buf)?;
                e.write_all(line.as_bytes())?;
            }
            _ => e.write_all(buf)?,
        }
        e.flush()?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}
