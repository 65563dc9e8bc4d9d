//! The checkpoint of a pipeline group (DESIGN.md, "Scale beyond one
//! machine: pipeline groups"): ownership and write-ahead of each partition
//! in the sink database, so that any member on any machine can take a
//! partition over.
//!
//! ```text
//! sluice_groups         group_name → fingerprint (topics, contract), the
//!                       plugins new members start with
//! sluice_group_plugins  digest → component bytes (content-addressed)
//! sluice_partitions     (group, topic, partition) → owner epoch, owner,
//!                       member id, claimed at, and the planned range of
//!                       the batch in flight (write-ahead; NULL when none)
//! sluice_group_members  (group, member) → the plugins it runs, the last
//!                       swap it acted on and why it could not install
//!                       it, when it was last seen (status only: Kafka's
//!                       coordinator decides membership)
//! sluice_group_swaps    (group, swap id) → the plugins asked for, when,
//!                       by whom (`host group swap`; an audit trail)
//! sluice_group_resets   one row per `host group reset`: when, by whom,
//!                       `--to`, each partition's move (an audit trail)
//! ```
//!
//! What was applied stays in the sink's `sluice_progress` rows (query id =
//! group name), written in the same transaction as the records.
//!
//! Rules:
//! - **Claim**: one transaction raises the partition's owner epoch by one
//!   and records the owner; it returns the planned range left by the
//!   previous owner, which the claimer must re-run with the same bounds.
//! - **Fencing**: the owner epoch is the token. Planning, finishing and
//!   every part's sink transaction require `owner_epoch = mine` (equality:
//!   a newer claim by anyone fences the older owner), checked on the row
//!   locked inside the writing transaction ([`fence`]).
//! - The store uses a connection of its own: claims come from the
//!   consumer's rebalance while a part's transaction may be open on the
//!   sink's connection.
//!
//! Files: this one holds the errors and row types; `tables` the table
//! names and their creation, `fence` claim and fencing on a partition's
//! row inside the caller's transaction, `store` the [`GroupStore`],
//! `members` the members' rows and the swaps, `moves` a pipeline moving
//! between a checkpoint directory and a group, `db_store` the group's
//! store behind the checkpoint seam.

mod db_store;
mod fence;
mod members;
mod moves;
mod store;
mod tables;

use serde::{Deserialize, Serialize};

use super::{Epoch, PluginRef};
use crate::capability::sql::DbError;

pub use db_store::DbStore;
pub use fence::{
    RESET_OWNER, abandon_planned, claim_on, fence, hand_over_on, moved_to, record_reset,
    set_planned_on,
};
pub use members::{GONE_AFTER_MS, MemberRow, Swap};
pub use moves::{ADOPT_OWNER, Adopted, DISBAND_OWNER, adopt_on, disband_on};
pub use store::GroupStore;
pub use tables::GroupTables;

/// Why a group operation failed.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The database failed.
    #[error("group {group}: sink database error while {during}: {error}")]
    Db {
        /// The group.
        group: String,
        /// What the store was doing.
        during: &'static str,
        /// The database's error.
        error: DbError,
    },
    /// Another member claimed the partition since we did.
    #[error(
        "fenced on {topic}/{partition}: owner epoch {now} is now held by {holder} (ours was {ours}); this member drops the partition"
    )]
    Fenced {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Our epoch.
        ours: Epoch,
        /// The epoch in the row.
        now: Epoch,
        /// Who holds it.
        holder: String,
    },
    /// The group exists with other topics or another contract.
    #[error(
        "group {group} runs another pipeline than this member:\n{diff}\nrun the member with the group's topics and a host of the same contract, or pick another --group name"
    )]
    Mismatch {
        /// The group.
        group: String,
        /// What differs.
        diff: String,
    },
    /// The group's plugins changed while a swap was prepared from them.
    #[error(
        "group {group}: its plugins changed while this swap was prepared (another host group swap, or a member that joined with its own --plugin); they are now {now}: run the swap again"
    )]
    SwapRace {
        /// The group.
        group: String,
        /// The plugins now (JSON).
        now: String,
    },
    /// The group's pipeline runs from a checkpoint directory now.
    #[error(
        "group {group}: its pipeline moved to {to} (`host group disband`), which holds its progress now; run it there (`host run --checkpoint DIR`), or make it a group again with `host group adopt`"
    )]
    Moved {
        /// The group.
        group: String,
        /// Where it went (the checkpoint directory).
        to: String,
    },
    /// `host group adopt` into a group that exists and runs.
    #[error(
        "group {group} exists already and runs its own pipeline: adopt the checkpoint under another --group name (or disband that group first)"
    )]
    Exists {
        /// The group.
        group: String,
    },
    /// A stored row cannot be read.
    #[error(
        "group {group}: unreadable row in {table}: {why}; was it changed by hand? `host group reset` rewrites a partition's row"
    )]
    BadRow {
        /// The group.
        group: String,
        /// The table.
        table: String,
        /// What is wrong.
        why: String,
    },
}

impl GroupError {
    /// Whether another member holds the partition now ([`GroupError::Fenced`]).
    pub fn is_fenced(&self) -> bool {
        matches!(self, GroupError::Fenced { .. })
    }

    /// The partition another member holds now, when this is
    /// [`GroupError::Fenced`].
    pub fn fenced(&self) -> Option<super::Fenced> {
        match self {
            GroupError::Fenced {
                topic,
                partition,
                ours,
                now,
                holder,
            } => Some(super::Fenced {
                partition: (topic.clone(), *partition),
                ours: *ours,
                now: *now,
                holder: holder.clone(),
            }),
            _ => None,
        }
    }
}

/// A planned range (the write-ahead of one partition's share of a batch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Planned {
    /// The batch id of the member that planned it.
    pub batch: u64,
    /// First offset.
    pub start: i64,
    /// End offset (exclusive).
    pub end: i64,
    /// The plugins it runs with.
    pub plugins: Vec<PluginRef>,
}

/// What a claim returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// Our owner epoch for the partition (the fencing token).
    pub epoch: Epoch,
    /// Who held it before (empty for a partition never claimed).
    pub previous_owner: String,
    /// A range planned and not finished: re-run it with these bounds.
    pub planned: Option<Planned>,
}

/// One partition's row, for status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionRow {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Owner epoch.
    pub owner_epoch: Epoch,
    /// Owner (pid, host).
    pub owner: String,
    /// Kafka member id of the owner.
    pub member_id: String,
    /// When it was claimed, ms since the Unix epoch.
    pub claimed_at_ms: i64,
    /// The range in flight.
    pub planned: Option<Planned>,
    /// Why the stored range in flight cannot be read (the row was changed
    /// by hand); `planned` is then `None`. A member refuses to claim the
    /// partition until the row is mended (`host group reset`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planned_unreadable: Option<String>,
}

#[cfg(test)]
mod tests;
