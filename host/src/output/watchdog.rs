//! A bound on a librdkafka call that can block past its own timeout.
//!
//! librdkafka 2.12.1 (and releases up to at least 2.14) can block in
//! `rd_kafka_send_offsets_to_transaction` forever when the group
//! coordinator moved or went away: its coordinator requests never check
//! their timeout (librdkafka issues #5456 and #5511). Seen here in a
//! rolling restart of a three-broker Apache Kafka 4.4 cluster: a
//! pipeline group member hung inside a part's database transaction,
//! holding SQLite's write lock, and the other member waited on it.
//!
//! The call cannot be cancelled, so when it overstays its timeout by
//! [`GRACE`] the host stops the process (exit 1), as a kill -9 would:
//! nothing of the batch or part was committed, its database transaction
//! rolls back with the connection, the next producer of the
//! transactional id aborts the open Kafka transaction, and the next start
//! (or the partition's next owner) runs it again.

use std::sync::mpsc;
use std::time::Duration;

/// How long past its own timeout a call may run before the host stops.
pub(super) const GRACE: Duration = Duration::from_secs(15);

/// Run `f`, which promises to return within `timeout`; if it has not
/// returned `GRACE` after that, log why and stop the process with exit
/// code 1. `what` names the call for the message.
pub(super) fn bounded<T>(what: &str, timeout: Duration, f: impl FnOnce() -> T) -> T {
    bounded_or(what, timeout + GRACE, f, |message| {
        tracing::error!("{message}");
        std::process::exit(1);
    })
}

/// [`bounded`] with the limit `limit` and `overstayed` called (on a
/// watchdog thread, with the message) when `f` runs past it.
fn bounded_or<T>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T,
    overstayed: impl FnOnce(String) + Send + 'static,
) -> T {
    let (done, watched) = mpsc::channel::<()>();
    let message = format!(
        "{what} did not return within {} s although its own timeout had passed: librdkafka waits for a consumer-group or transaction coordinator that moved or went away (librdkafka issues #5456 and #5511; seen in broker restarts). The call cannot be cancelled, so the host stops here: nothing of the batch or part in flight was committed, its database transaction rolls back, and the next start (in a pipeline group, the partition's next owner) runs it again. Restart the host (a service manager does), and check the brokers",
        limit.as_secs()
    );
    let watchdog = std::thread::Builder::new()
        .name("sluice-watchdog".into())
        .spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = watched.recv_timeout(limit) {
                overstayed(message);
            }
        });
    if let Err(e) = &watchdog {
        tracing::warn!("no watchdog thread for {what} ({e}): it runs unbounded");
    }
    let out = f();
    let _ = done.send(());
    if let Ok(w) = watchdog {
        let _ = w.join();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_call_that_overstays_is_reported_and_one_that_returns_is_not() {
        let said = Arc::new(Mutex::new(Vec::<String>::new()));
        let record = |said: &Arc<Mutex<Vec<String>>>| {
            let said = said.clone();
            move |m: String| said.lock().unwrap().push(m)
        };
        let v = bounded_or("quick", Duration::from_secs(5), || 7, record(&said));
        assert_eq!(v, 7);
        assert!(said.lock().unwrap().is_empty());
        bounded_or(
            "send_offsets_to_transaction",
            Duration::from_millis(20),
            || std::thread::sleep(Duration::from_millis(200)),
            record(&said),
        );
        let said = said.lock().unwrap();
        assert_eq!(said.len(), 1);
        assert!(said[0].starts_with("send_offsets_to_transaction did not return"));
        assert!(said[0].contains("#5456"));
    }
}
