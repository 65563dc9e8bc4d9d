//! The form of a bootstrap server list, checked before librdkafka sees it.
//!
//! librdkafka takes `bootstrap.servers` as a comma-separated list of
//! `[PROTOCOL://]HOST[:PORT]` (`rd_kafka_broker_name_parse` in
//! rdkafka_broker.c): PROTOCOL is one of `PLAINTEXT`, `SSL`,
//! `SASL_PLAINTEXT`, `SASL_SSL` (any case) and must equal
//! `security.protocol`; the port defaults to 9092; an IPv6 address with a
//! port is bracketed (`[::1]:9092`). An entry it cannot parse is only a
//! WARN log line, and the client then waits for a broker it will never
//! reach (33 s before "unavailable" for `tcp://…`, the form Tansu's own
//! CLI takes). So the host checks the same grammar first and fails at
//! once with the entry and the reason. kcat's `-b` list is the same.

/// The security protocols librdkafka accepts as a URL scheme.
pub const PROTOCOLS: [&str; 4] = ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"];

/// Check a bootstrap server list. `security_protocol` is the client's
/// `security.protocol` (librdkafka's default is `plaintext`): an entry
/// with a scheme must name the same one; `None` skips that comparison
/// (a flag parsed before the client's settings are known).
///
/// # Errors
/// A sentence naming the first bad entry and what is wrong with it, with
/// the accepted form.
pub fn check_brokers(list: &str, security_protocol: Option<&str>) -> Result<(), String> {
    const FORM: &str = "the form is HOST:PORT[,HOST:PORT…], e.g. 127.0.0.1:9092 (an optional scheme is one of plaintext://, ssl://, sasl_plaintext://, sasl_ssl://)";
    if list.trim().is_empty() {
        return Err(format!("no broker address given; {FORM}"));
    }
    for entry in list.split(',') {
        let entry = entry.trim();
        let bad = |why: String| Err(format!("`{entry}`: {why}; {FORM}"));
        if entry.is_empty() {
            return bad("empty entry in the list".to_string());
        }
        let rest = match entry.split_once("://") {
            Some((scheme, rest)) => {
                if !PROTOCOLS.iter().any(|p| p.eq_ignore_ascii_case(scheme)) {
                    return bad(format!("`{scheme}://` is not a Kafka protocol"));
                }
                if let Some(protocol) = security_protocol
                    && !scheme.eq_ignore_ascii_case(protocol)
                {
                    return bad(format!(
                        "the scheme `{scheme}://` does not match security.protocol={} (set --config kafka.security.protocol={} or drop the scheme)",
                        protocol.to_ascii_lowercase(),
                        scheme.to_ascii_lowercase()
                    ));
                }
                // librdkafka ignores a URL path.
                rest.split('/').next().unwrap_or(rest)
            }
            None => entry,
        };
        let (host, port) = split_host_port(rest);
        if host.is_empty() && port.is_none() {
            return bad("no host".to_string());
        }
        if let Some(c) = host
            .chars()
            .find(|c| c.is_whitespace() || c.is_control() || "/?#@".contains(*c))
        {
            return bad(format!("{c:?} cannot be in a host name"));
        }
        if let Some(port) = port {
            match port.parse::<u16>() {
                Ok(p) if p > 0 => {}
                _ => return bad(format!("`{port}` is not a port (1 to 65535)")),
            }
        }
    }
    Ok(())
}

/// `HOST[:PORT]` as librdkafka splits it: the port is after the last `:`
/// when that is the only one, or when it follows `]` (a bracketed IPv6
/// address); an unbracketed IPv6 address has no port.
fn split_host_port(s: &str) -> (&str, Option<&str>) {
    match (s.find(':'), s.rfind(':')) {
        (Some(first), Some(last)) if first == last || s[..last].ends_with(']') => {
            (&s[..last], Some(&s[last + 1..]))
        }
        _ => (s, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_kcat_and_librdkafka_accept_passes() {
        for ok in [
            "127.0.0.1:9092",
            "localhost",
            "b1:9092,b2:9093",
            "b1:9092, b2:9093",
            "PLAINTEXT://b1:9092",
            "plaintext://b1:9092/ignored",
            "[::1]:9092",
            "::1",
            "kafka-0.kafka.svc.cluster.local:9094",
        ] {
            assert_eq!(check_brokers(ok, Some("plaintext")), Ok(()), "{ok}");
        }
        assert_eq!(check_brokers("ssl://b:9093", None), Ok(()));
        assert_eq!(check_brokers("SSL://b:9093", Some("ssl")), Ok(()));
    }

    #[test]
    fn bad_lists_name_the_entry_and_the_reason() {
        let cases = [
            ("tcp://127.0.0.1:9092", "`tcp://` is not a Kafka protocol"),
            ("http://b:80", "`http://` is not a Kafka protocol"),
            ("ssl://b:9093", "does not match security.protocol=plaintext"),
            ("b:90x2", "`90x2` is not a port"),
            ("b:0", "`0` is not a port"),
            ("b:70000", "`70000` is not a port"),
            ("b1:9092,,b2", "empty entry"),
            ("b 1:9092", "cannot be in a host name"),
            ("", "no broker address"),
        ];
        for (list, why) in cases {
            let e = check_brokers(list, Some("PLAINTEXT")).unwrap_err();
            assert!(e.contains(why), "{list}: {e}");
            assert!(e.contains("HOST:PORT"), "{list}: {e}");
        }
    }
}
