//! Log lines into the host's log stream (tagged there with the plugin's
//! digest). Natively they go to stderr.

use crate::host::{LogLevel, host};

/// Log at trace level.
pub fn trace(message: impl AsRef<str>) {
    host().log(LogLevel::Trace, message.as_ref());
}

/// Log at debug level.
pub fn debug(message: impl AsRef<str>) {
    host().log(LogLevel::Debug, message.as_ref());
}

/// Log at info level.
pub fn info(message: impl AsRef<str>) {
    host().log(LogLevel::Info, message.as_ref());
}

/// Log at warn level.
pub fn warn(message: impl AsRef<str>) {
    host().log(LogLevel::Warn, message.as_ref());
}

/// Log at error level.
pub fn error(message: impl AsRef<str>) {
    host().log(LogLevel::Error, message.as_ref());
}
