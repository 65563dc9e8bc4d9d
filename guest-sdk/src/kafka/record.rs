//! The record a sink sends (the WIT `output-record`), apart from the
//! call that sends it, so the host imports can name it.

/// One record to produce (the WIT `output-record`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRecord {
    /// One of the pipeline's `--output-topic` topics.
    pub topic: String,
    /// `None`: the partition of the key (murmur2, as Kafka's Java client
    /// picks it), any for a null key.
    pub partition: Option<i32>,
    /// `None`: a null key.
    pub key: Option<Vec<u8>>,
    /// `None`: a tombstone.
    pub value: Option<Vec<u8>>,
    /// Headers in order; a `None` value is a header without one.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The idempotency key of the input this record comes from; add `#n`
    /// for its n-th further record, so each record's key is its own.
    pub idempotency_key: String,
}

impl OutputRecord {
    /// A record to `topic` with a null key and a null value (a tombstone)
    /// and no headers, identified by `idempotency_key`.
    pub fn new(topic: impl Into<String>, idempotency_key: impl Into<String>) -> Self {
        OutputRecord {
            topic: topic.into(),
            partition: None,
            key: None,
            value: None,
            headers: Vec::new(),
            idempotency_key: idempotency_key.into(),
        }
    }

    /// Set the key (`None`: a null key).
    pub fn key(mut self, key: Option<&[u8]>) -> Self {
        self.key = key.map(<[u8]>::to_vec);
        self
    }

    /// Set the value (`None`: a tombstone).
    pub fn value(mut self, value: Option<&[u8]>) -> Self {
        self.value = value.map(<[u8]>::to_vec);
        self
    }

    /// Add a header.
    pub fn header(mut self, key: impl Into<String>, value: Option<&[u8]>) -> Self {
        self.headers.push((key.into(), value.map(<[u8]>::to_vec)));
        self
    }

    /// Produce to `partition` rather than by key.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }
}
