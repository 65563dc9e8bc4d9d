//! What librdkafka says about its broker connections, said once.
//!
//! A broker that is down or a host name that does not resolve makes
//! librdkafka report the same failure many times a second, as log lines
//! (facility `FAIL`) and as global errors (`BrokerTransportFailure`,
//! `Resolve`, `AllBrokersDown`, …), while the request that waits for the
//! broker only ends, after the broker timeout, with a generic
//! "BrokerTransportFailure". [`ClientErrors`] keeps the first and the last
//! connection failure and how many were not shown: the first is logged
//! at once (WARN), repeats only at DEBUG, and the error the host stops
//! with names the real cause (see [`ClientErrors::cause`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Connection failures reported by the clients of one source.
#[derive(Debug, Default)]
pub struct ClientErrors {
    seen: Mutex<Seen>,
    /// Failures logged only at DEBUG.
    repeats: AtomicU64,
}

#[derive(Debug, Default)]
struct Seen {
    first: Option<String>,
    last: Option<String>,
}

impl ClientErrors {
    /// Record a connection failure `reason` (librdkafka's text, e.g.
    /// `127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed:
    /// Connection refused (after 0ms in state CONNECT)`); log it at WARN
    /// when it is the first one or says something new.
    fn failed(&self, reason: &str) {
        let reason = trim(reason);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let new = seen.last.as_deref() != Some(reason.as_str());
        if seen.first.is_none() {
            seen.first = Some(reason.clone());
        }
        seen.last = Some(reason.clone());
        drop(seen);
        if new {
            tracing::warn!(
                target: "librdkafka",
                "kafka: {reason} (retrying; repeats of this are not shown)"
            );
        } else {
            self.repeats.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(target: "librdkafka", "kafka: {reason}");
        }
    }

    /// A request went through: the failures recorded are history (a new
    /// one is logged at WARN again).
    pub fn recovered(&self) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.last.take().is_some() {
            self.repeats.store(0, Ordering::Relaxed);
        }
    }

    /// What to report for a request that failed with `generic` (its own
    /// error, such as "BrokerTransportFailure"): the last connection
    /// failure recorded since the clients last got through, with a hint
    /// of what to check, instead of a generic transport error, or after
    /// any other; `generic` alone when none was recorded.
    pub fn cause(&self, generic: &str) -> String {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let Some(last) = seen.last.clone() else {
            return generic.to_string();
        };
        let repeats = self.repeats.load(Ordering::Relaxed);
        let mut cause = format!("{last}{}", hint(&last));
        if repeats > 0 {
            cause.push_str(&format!("; {repeats} more client errors like it"));
        }
        let transport = ["Transport", "AllBrokersDown", "Resolve"];
        if transport.iter().any(|t| generic.contains(t)) {
            cause
        } else {
            format!("{generic}; last connection failure: {cause}")
        }
    }
}

/// librdkafka's reason without its "(after Nms in state S…)" tail.
fn trim(reason: &str) -> String {
    match reason.find(" (after ") {
        Some(i) => reason[..i].to_string(),
        None => reason.to_string(),
    }
}

/// What to check for a failure whose text is `reason`.
fn hint(reason: &str) -> &'static str {
    let r = reason.to_ascii_lowercase();
    if r.contains("resolve") {
        " (check the host name in --brokers)"
    } else if r.contains("connection refused") {
        " (nothing listens there: is the broker running, on that port?)"
    } else if r.contains("ssl") || r.contains("tls") || r.contains("certificate") {
        " (check kafka.security.protocol and the kafka.ssl.* settings)"
    } else if r.contains("sasl") || r.contains("authentication") {
        " (check kafka.sasl.* settings and the credentials)"
    } else {
        ""
    }
}

/// Whether a global client error is a connection failure.
fn is_connection(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::Resolve
            | RDKafkaErrorCode::SSL
            | RDKafkaErrorCode::Authentication
    )
}

/// `ClientContext::error` of the source's clients: connection failures go
/// to `errors` (all brokers down says nothing the failure before it did
/// not), anything else is logged as rust-rdkafka would.
pub(super) fn client_error(errors: &ClientErrors, error: KafkaError, reason: &str) {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::AllBrokersDown) => {
            errors.repeats.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(target: "librdkafka", "kafka: {reason}");
        }
        Some(code) if is_connection(code) => errors.failed(reason),
        _ => tracing::error!(target: "librdkafka", "librdkafka: {error}: {reason}"),
    }
}

/// `ClientContext::log` of the source's clients: librdkafka's lines as
/// tracing events (target `librdkafka`, its level), except a connection
/// failure (`FAIL`), which goes to `errors`.
pub(super) fn client_log(errors: &ClientErrors, level: RDKafkaLogLevel, fac: &str, line: &str) {
    use RDKafkaLogLevel as L;
    match level {
        L::Emerg | L::Alert | L::Critical | L::Error | L::Warning if fac == "FAIL" => {
            // librdkafka prints `[thrd:NAME]: ` before the reason.
            let reason = line.split_once("]: ").map_or(line, |(_, r)| r);
            errors.failed(reason);
        }
        L::Emerg | L::Alert | L::Critical | L::Error => {
            tracing::error!(target: "librdkafka", "librdkafka: {fac} {line}")
        }
        L::Warning => tracing::warn!(target: "librdkafka", "librdkafka: {fac} {line}"),
        L::Notice | L::Info => tracing::info!(target: "librdkafka", "librdkafka: {fac} {line}"),
        L::Debug => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {line}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_names_the_last_failure_without_its_tail_and_counts_repeats() {
        let e = ClientErrors::default();
        assert_eq!(e.cause("BrokerTransportFailure"), "BrokerTransportFailure");
        let refused = "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)";
        e.failed(refused);
        e.failed(refused);
        client_error(
            &e,
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        );
        assert_eq!(
            e.cause("BrokerTransportFailure"),
            "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused \
             (nothing listens there: is the broker running, on that port?); 2 more client errors like it"
        );
        assert!(
            e.cause("Operation timed out")
                .starts_with("Operation timed out; last connection failure: 127.0.0.1:1/bootstrap")
        );
        e.recovered();
        assert_eq!(e.cause("BrokerTransportFailure"), "BrokerTransportFailure");
    }

    #[test]
    fn a_fail_line_is_a_failure_and_its_thread_prefix_is_dropped() {
        let e = ClientErrors::default();
        client_log(
            &e,
            RDKafkaLogLevel::Error,
            "FAIL",
            "[thrd:kafka.invalid:9092/bootstrap]: kafka.invalid:9092/bootstrap: Failed to resolve 'kafka.invalid:9092': Name or service not known (after 1ms in state CONNECT)",
        );
        assert_eq!(
            e.cause("Resolve"),
            "kafka.invalid:9092/bootstrap: Failed to resolve 'kafka.invalid:9092': Name or service not known (check the host name in --brokers)"
        );
    }
}
