//! The host's side of the plugin contract's types (`wit/plugin.wit`,
//! `sluice:plugin@0.2.3`), free of the generated bindings: what a call is
//! given ([`CallContext`], [`PartitionContext`]) and what it answers
//! ([`OpenAnswer`], [`MapResult`] with its [`BadRecord`]s).

/// The batch a call belongs to (the WIT `batch-context`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallContext {
    /// Checkpoint query id.
    pub query_id: String,
    /// Batch id.
    pub batch_id: u64,
    /// Fencing epoch.
    pub epoch: u64,
}

/// One partition's range of a batch, or a consecutive part of it, as a
/// sink sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionContext {
    /// The batch.
    pub batch: CallContext,
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// First offset (inclusive).
    pub start_offset: i64,
    /// End offset (exclusive).
    pub end_offset: i64,
}

/// A sink's answer to `open`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenAnswer {
    /// Write the range.
    Proceed,
    /// Already applied; skip it.
    AlreadyApplied,
}

/// An input the stage rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    /// Index in the call's batch.
    pub index: u32,
    /// Why.
    pub message: String,
}

/// What one map call produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MapResult {
    /// `packed-outputs` (decode with [`sluice_guest::wire::decode_outputs`]).
    pub outputs: Vec<u8>,
    /// Rejected inputs.
    pub rejected: Vec<BadRecord>,
}
