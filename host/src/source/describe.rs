//! Topic identity: a topic's id and partitions, from librdkafka's
//! `DescribeTopics` admin call (a Metadata request, v10+ carries the id).
//!
//! Topic ids come from KIP-516 ("Topic Identifiers"): the broker gives each
//! topic a UUID when it is created, so a topic that was deleted and created
//! again under the same name has a new id. rust-rdkafka 0.39 has no safe
//! wrapper for `rd_kafka_DescribeTopics` (librdkafka ≥ 2.3), so this module
//! calls it through `rdkafka::bindings` on the client's own handle: the
//! request then uses the same bootstrap servers, security settings and
//! connections as every other request of that client. This,
//! `group::member_id` and `headers` are the only `unsafe` code in the
//! host; each block says what it relies on.
//!
//! Brokers older than Kafka 2.8 (Metadata below v10) return an all-zero id,
//! which is reported as `None`.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char};
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// What the broker says of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Described {
    /// The topic exists.
    Topic {
        /// Its KIP-516 id in Kafka's base64 form (as `kafka-topics.sh
        /// --describe` prints it), `None` when the broker returns none.
        id: Option<String>,
        /// Partition ids, sorted.
        partitions: Vec<i32>,
    },
    /// The broker answered that it does not exist.
    Unknown,
}

/// Owns a pointer returned by librdkafka and frees it with `free` on drop.
struct Owned<T> {
    ptr: *mut T,
    free: unsafe extern "C" fn(*mut T),
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: `ptr` was returned by the librdkafka constructor that
            // `free` is the destructor of, and is freed only here.
            unsafe { (self.free)(self.ptr) }
        }
    }
}

fn owned<T>(ptr: *mut T, free: unsafe extern "C" fn(*mut T)) -> Result<Owned<T>, String> {
    if ptr.is_null() {
        Err("librdkafka returned no object (out of memory?)".into())
    } else {
        Ok(Owned { ptr, free })
    }
}

fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: librdkafka returns NUL-terminated strings that live at least
    // as long as the object they were read from, which the caller holds.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Describe `topic` through `client`'s connections, asking broker
/// `broker` (an id from a Metadata answer), waiting at most `timeout`.
///
/// librdkafka sends admin requests to the controller by default, and
/// learns the controller from Metadata answers; librdkafka's mock cluster
/// names none, so the request would wait for one forever. Any broker
/// answers a Metadata request, so the caller names one.
///
/// # Errors
/// A message (librdkafka's error text) when the request fails or times
/// out; the caller retries.
pub fn describe(
    client: &BaseConsumer<super::SourceContext>,
    broker: i32,
    topic: &str,
    timeout: Duration,
) -> Result<Described, String> {
    let name = CString::new(topic).map_err(|_| format!("topic name `{topic}` holds a NUL byte"))?;
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let rk = client.client().native_ptr();
    // SAFETY (every call in this block): `rk` is the live handle of
    // `client`, borrowed for the whole call. Each object created here is
    // owned by an `Owned` guard and destroyed once; pointers read from the
    // result event are used only while `event` is alive. librdkafka copies
    // the topic names and options when the request is enqueued.
    unsafe {
        let queue = owned(rd::rd_kafka_queue_new(rk), rd::rd_kafka_queue_destroy)?;
        let options = owned(
            rd::rd_kafka_AdminOptions_new(
                rk,
                rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
            ),
            rd::rd_kafka_AdminOptions_destroy,
        )?;
        let mut errbuf = [0 as c_char; 256];
        let err = rd::rd_kafka_AdminOptions_set_request_timeout(
            options.ptr,
            timeout_ms,
            errbuf.as_mut_ptr(),
            errbuf.len(),
        );
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(text(errbuf.as_ptr()));
        }
        let err = rd::rd_kafka_AdminOptions_set_broker(
            options.ptr,
            broker,
            errbuf.as_mut_ptr(),
            errbuf.len(),
        );
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(text(errbuf.as_ptr()));
        }
        let mut names = [name.as_ptr()];
        let topics = owned(
            rd::rd_kafka_TopicCollection_of_topic_names(names.as_mut_ptr(), names.len()),
            rd::rd_kafka_TopicCollection_destroy,
        )?;
        rd::rd_kafka_DescribeTopics(rk, topics.ptr, options.ptr, queue.ptr);
        // The request timeout makes librdkafka post a (failed) result by
        // then; the extra second only covers the hand-off.
        let event = rd::rd_kafka_queue_poll(queue.ptr, timeout_ms.saturating_add(1000));
        let event = owned(event, rd::rd_kafka_event_destroy)
            .map_err(|_| format!("no answer to DescribeTopics within {} ms", timeout_ms))?;
        let err = rd::rd_kafka_event_error(event.ptr);
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(text(rd::rd_kafka_event_error_string(event.ptr)));
        }
        let result = rd::rd_kafka_event_DescribeTopics_result(event.ptr);
        if result.is_null() {
            return Err("DescribeTopics answered with another kind of event".into());
        }
        let mut count = 0usize;
        let descs = rd::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        for i in 0..count {
            let d = *descs.add(i);
            if d.is_null() || text(rd::rd_kafka_TopicDescription_name(d)) != topic {
                continue;
            }
            let e = rd::rd_kafka_TopicDescription_error(d);
            if !e.is_null() {
                let code = rd::rd_kafka_error_code(e);
                return match code {
                    rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART
                    | rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC => {
                        Ok(Described::Unknown)
                    }
                    _ => Err(text(rd::rd_kafka_error_string(e))),
                };
            }
            let uuid = rd::rd_kafka_TopicDescription_topic_id(d);
            let id = if uuid.is_null()
                || (rd::rd_kafka_Uuid_most_significant_bits(uuid) == 0
                    && rd::rd_kafka_Uuid_least_significant_bits(uuid) == 0)
            {
                None
            } else {
                // NULL when librdkafka could not allocate the text: no id
                // rather than an empty one that would compare as changed.
                let b64 = rd::rd_kafka_Uuid_base64str(uuid);
                (!b64.is_null()).then(|| text(b64))
            };
            let mut pcount = 0usize;
            let parts = rd::rd_kafka_TopicDescription_partitions(d, &mut pcount);
            let mut partitions: Vec<i32> = (0..pcount)
                .map(|j| rd::rd_kafka_TopicPartitionInfo_partition(*parts.add(j)))
                .collect();
            partitions.sort_unstable();
            return Ok(Described::Topic { id, partitions });
        }
        Ok(Described::Unknown)
    }
}
