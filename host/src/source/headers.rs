//! A consumed record's headers, read without trusting their names.
//!
//! Kafka's record format (KIP-82, "Add Record Headers") defines a header
//! key as a UTF-8 string, but brokers do not check it: any client that
//! writes the protocol directly (librdkafka's C API among them) can send
//! other bytes. rust-rdkafka 0.39's `BorrowedHeaders` panics on such a name
//! (`CStr::to_str().unwrap()` in its `try_get`), which would stop the host
//! on the same record at every restart. This module reads the headers
//! through librdkafka's `rd_kafka_header_get_all` itself and decodes each
//! name the way Kafka's Java client does (`Utils.utf8`, i.e.
//! `new String(bytes, UTF_8)`): invalid sequences become U+FFFD. Values
//! are bytes and pass unchanged. Each record with such a name is logged
//! once at WARN with its topic, partition, offset and the name's bytes in
//! hex, so nothing changes silently.
//!
//! With `describe` and `group::member_id`, this is the host's only
//! `unsafe` code; each block says what it relies on.

#![allow(unsafe_code)]

use std::ffi::{CStr, c_void};

use rdkafka::bindings as rd;
use rdkafka::message::{BorrowedMessage, Message};
use sluice_guest::wire::OwnedHeaders;

/// The headers of `m` in order (empty when it has none). A name that is not
/// UTF-8 is decoded lossily and logged (see the module doc); a name cut
/// short by a NUL byte is read up to it, as librdkafka hands it out.
pub(super) fn record_headers(m: &BorrowedMessage<'_>) -> OwnedHeaders {
    let mut list: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `m.ptr()` is the live message `m` borrows; librdkafka writes
    // a pointer to the headers the message owns (valid while it lives) or
    // returns an error and leaves `list` null.
    let err = unsafe { rd::rd_kafka_message_headers(m.ptr(), &mut list) };
    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || list.is_null() {
        return Vec::new();
    }
    // SAFETY: `list` is the non-null header list of the live message `m`.
    let count = unsafe { rd::rd_kafka_header_cnt(list) };
    let mut headers = Vec::with_capacity(count);
    let mut bad_names = Vec::new();
    for idx in 0..count {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        let mut value: *const c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: `idx` < the count librdkafka reported for `list`; on
        // success it points `name` at a NUL-terminated copy of the name and
        // `value` at `size` bytes (or null for a null value), all owned by
        // the message and valid while `m` is borrowed here.
        let err =
            unsafe { rd::rd_kafka_header_get_all(list, idx, &mut name, &mut value, &mut size) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: as above; both are copied before the next call.
        let raw = unsafe { CStr::from_ptr(name) }.to_bytes();
        let key = match std::str::from_utf8(raw) {
            Ok(k) => k.to_string(),
            Err(_) => {
                bad_names.push(hex(raw));
                String::from_utf8_lossy(raw).into_owned()
            }
        };
        let value = (!value.is_null())
            // SAFETY: librdkafka's `size` bytes at the non-null `value`.
            .then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec());
        headers.push((key, value));
    }
    if !bad_names.is_empty() {
        tracing::warn!(
            topic = %m.topic(),
            partition = m.partition(),
            offset = m.offset(),
            names = %bad_names.join(","),
            "a header name is not UTF-8 (hex bytes in `names`); the plugin sees it with U+FFFD in place of each invalid sequence, as Kafka's Java client decodes it; its value is unchanged"
        );
    }
    headers
}

/// `bytes` as lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseProducer, Producer};

    use super::*;

    /// Produce one record on `topic` with the headers `(name, value)`,
    /// names as raw bytes (what `OwnedHeaders` cannot express).
    fn produce_raw(p: &BaseProducer, topic: &str, headers: &[(&[u8], Option<&[u8]>)]) {
        let topic = std::ffi::CString::new(topic).expect("topic");
        let names: Vec<std::ffi::CString> = headers
            .iter()
            .map(|(n, _)| std::ffi::CString::new(*n).expect("name without NUL"))
            .collect();
        let mut vus = vec![rd::rd_kafka_vu_t {
            vtype: rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_TOPIC,
            u: rd::rd_kafka_vu_s__bindgen_ty_1 {
                cstr: topic.as_ptr(),
            },
        }];
        vus.push(rd::rd_kafka_vu_t {
            vtype: rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_VALUE,
            u: rd::rd_kafka_vu_s__bindgen_ty_1 {
                mem: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                    ptr: b"v".as_ptr().cast_mut().cast(),
                    size: 1,
                },
            },
        });
        for ((_, value), name) in headers.iter().zip(&names) {
            vus.push(rd::rd_kafka_vu_t {
                vtype: rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_HEADER,
                u: rd::rd_kafka_vu_s__bindgen_ty_1 {
                    header: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_2 {
                        name: name.as_ptr(),
                        val: value.map_or(std::ptr::null(), |v| v.as_ptr().cast()),
                        size: value.map_or(0, |v| v.len() as isize),
                    },
                },
            });
        }
        // SAFETY: the producer's live handle; every pointer in `vus` points
        // into `topic`, `names` or `headers`, which outlive the call
        // (librdkafka copies the value: no RD_KAFKA_MSG_F_FREE).
        let e = unsafe { rd::rd_kafka_produceva(p.client().native_ptr(), vus.as_ptr(), vus.len()) };
        assert!(e.is_null(), "produceva failed");
        p.flush(Duration::from_secs(10)).expect("flush");
    }

    #[test]
    fn a_header_name_that_is_not_utf8_is_decoded_lossily_and_the_rest_pass_unchanged() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("t", 1, 1).expect("topic");
        let p: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .create()
            .expect("producer");
        produce_raw(
            &p,
            "t",
            &[
                (b"ok", Some(b"1")),
                (b"bad\xff\xfe", Some(b"\x00\xff")),
                (b"null", None),
            ],
        );
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("group.id", "g")
            .set("auto.offset.reset", "earliest")
            .create()
            .expect("consumer");
        c.subscribe(&["t"]).expect("subscribe");
        let started = std::time::Instant::now();
        let headers = loop {
            assert!(started.elapsed() < Duration::from_secs(30), "no record");
            if let Some(m) = c.poll(Duration::from_millis(200)) {
                let m = m.expect("message");
                // The reason for this module: rust-rdkafka's own reader
                // panics on this record (if it stops, the module can go).
                let crate_reader = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    use rdkafka::message::Headers;
                    m.headers().map(|h| h.iter().count())
                }));
                assert!(
                    crate_reader.is_err(),
                    "rust-rdkafka read a non-UTF-8 header name"
                );
                break record_headers(&m);
            }
        };
        assert_eq!(
            headers,
            vec![
                ("ok".to_string(), Some(b"1".to_vec())),
                (
                    "bad\u{fffd}\u{fffd}".to_string(),
                    Some(b"\x00\xff".to_vec())
                ),
                ("null".to_string(), None),
            ]
        );
    }

    #[test]
    fn hex_is_lowercase_two_digits_a_byte() {
        assert_eq!(hex(b"\x00\xffa"), "00ff61");
    }
}
