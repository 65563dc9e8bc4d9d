//! Where the producer puts a keyed output: librdkafka's `murmur2`
//! partitioner, the hash Java clients use (KIP-none: Kafka's
//! `Utils.murmur2(key) & 0x7fffffff % partitions`), so `host test` shows
//! the partition `host run` will write.
//!
//! The one `unsafe` call of the output: librdkafka's own function, which
//! reads only the key bytes (its topic and opaque arguments are unused:
//! `rdkafka_msg.c`, `rd_kafka_msg_partitioner_murmur2`).
#![allow(unsafe_code)]

/// The partition, of `partitions`, of an output with key `key` under
/// `partitioner=murmur2_random` (the host's setting): Java's murmur2 hash
/// of the key; `None` for an output without a key (a random partition)
/// or `partitions` below 1.
pub fn partition_of_key(key: Option<&[u8]>, partitions: i32) -> Option<i32> {
    let key = key?;
    if partitions < 1 {
        return None;
    }
    // SAFETY: `key` is valid for `key.len()` bytes for the call; the
    // function does not keep the pointer, and its other arguments are
    // never dereferenced (see the module doc).
    let p = unsafe {
        rdkafka::bindings::rd_kafka_msg_partitioner_murmur2(
            std::ptr::null(),
            key.as_ptr().cast(),
            key.len(),
            partitions,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_land_where_a_java_client_puts_them() {
        // Java's DefaultPartitioner (Utils.toPositive(Utils.murmur2(key))
        // % n), values from Kafka's UtilsTest.testMurmur2 hashes:
        // murmur2("21") = -973932308, murmur2("foobar") = -790332482,
        // murmur2("a-little-bit-long-string") = -985981536.
        let positive = |h: i32| (h & 0x7fff_ffff) as i64;
        for (key, hash) in [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
        ] {
            for n in [1, 2, 3, 64] {
                assert_eq!(
                    partition_of_key(Some(key.as_bytes()), n),
                    Some((positive(hash) % i64::from(n)) as i32),
                    "{key} of {n}"
                );
            }
        }
        assert_eq!(partition_of_key(None, 3), None);
        assert_eq!(partition_of_key(Some(b"k"), 0), None);
    }
}
