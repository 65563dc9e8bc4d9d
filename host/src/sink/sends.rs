//! What a part hands to the output stage (the engine's Kafka output) as
//! it commits: the records its sink sent with `kafka.send`, or, where a
//! map-only pipeline's outputs go with their part, its mapped records.
//! The sink module builds no Kafka record: the output stage does.

use sluice_guest::wire::SinkRecord;

use crate::capability::kafka::Sent;
use crate::plugin::{Instance, PartitionContext};

use super::{PartitionBatch, SinkError, site};

/// Takes what a part hands to the output stage (the engine's Kafka
/// output) once its `close` succeeded and before the range is recorded
/// applied: returns how many records it took, or why it could not.
#[derive(Clone, Copy)]
pub struct Deliver<'a> {
    /// The engine's function.
    pub to: &'a DeliverFn<'a>,
    /// A map-only pipeline whose outputs (the part's records) go with the
    /// part as it commits, in its database transaction: a pipeline group
    /// under exactly once, whose part's Kafka transaction commits after
    /// its progress row is written and before the database commits (the
    /// partition's row stays locked meanwhile, so no newer owner can
    /// claim it in between). `false`: only what a sink stage sends.
    pub with_part: bool,
}

/// What a part hands to [`Deliver`].
pub enum Outgoing<'p> {
    /// The records a sink stage sent with `kafka.send`.
    Sent(Vec<Sent>),
    /// The part's mapped records themselves, with their idempotency keys
    /// ([`Deliver::with_part`]).
    Mapped(Vec<&'p SinkRecord<'p>>),
}

/// The function behind [`Deliver`].
pub type DeliverFn<'a> = dyn Fn(&PartitionContext, Outgoing<'_>) -> Result<u64, String> + Sync + 'a;

impl std::fmt::Debug for Deliver<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deliver")
    }
}

/// What a part hands to the output stage: what its sink sent with
/// `kafka.send` (and which plugin sent it), or its mapped records.
#[derive(Default)]
pub(super) struct Sends<'p> {
    plugin: String,
    records: Vec<Sent>,
    mapped: Vec<&'p SinkRecord<'p>>,
}

impl<'p> Sends<'p> {
    /// Take what `instance` sent in the piece `r` it just closed.
    ///
    /// # Errors
    /// [`SinkError::Send`] when the host refused a send (the plugin may
    /// have ignored the refusal).
    pub(super) fn take(
        instance: &mut Instance,
        r: &PartitionContext,
    ) -> Result<Sends<'p>, SinkError> {
        let plugin = format!(
            "the sink plugin {} (sha256 {})",
            instance.path().display(),
            instance.digest().get(..12).unwrap_or_default()
        );
        let records = instance.take_sent().map_err(|message| SinkError::Send {
            what: format!("{plugin} called kafka.send, which the host refused"),
            site: site(r),
            message,
        })?;
        Ok(Sends {
            plugin,
            records,
            mapped: Vec::new(),
        })
    }

    /// The records of `pieces`, when their map outputs go with their part
    /// ([`Deliver::with_part`]); none otherwise.
    pub(super) fn of_map_outputs(pieces: &[PartitionBatch<'p>]) -> Sends<'p> {
        if !pieces
            .first()
            .and_then(|p| p.deliver)
            .is_some_and(|d| d.with_part)
        {
            return Sends::default();
        }
        Sends {
            plugin: "the map stage".into(),
            records: Vec::new(),
            mapped: pieces.iter().flat_map(|p| p.records.iter()).collect(),
        }
    }

    /// Add a later piece's.
    pub(super) fn extend(&mut self, later: Sends<'p>) {
        if self.plugin.is_empty() {
            self.plugin = later.plugin;
        }
        self.records.extend(later.records);
        self.mapped.extend(later.mapped);
    }

    /// Hand them to [`PartitionBatch::deliver`] (the output stage), the
    /// part's own effects being ready to commit.
    ///
    /// # Errors
    /// [`SinkError::Send`] when the output does not take them.
    pub(super) fn deliver(self, batch: &PartitionBatch<'_>) -> Result<(), SinkError> {
        if self.records.is_empty() && self.mapped.is_empty() {
            return Ok(());
        }
        let r = &batch.range;
        let plugin = self.plugin;
        let Some(d) = batch.deliver else {
            return Err(SinkError::Send {
                what: format!("{plugin} sent records"),
                site: site(r),
                message: "this pipeline has no output producer to take them".into(),
            });
        };
        let outgoing = if self.mapped.is_empty() {
            Outgoing::Sent(self.records)
        } else {
            Outgoing::Mapped(self.mapped)
        };
        (d.to)(r, outgoing).map_err(|message| SinkError::Send {
            what: format!("producing what {plugin} sent"),
            site: site(r),
            message,
        })?;
        Ok(())
    }
}
