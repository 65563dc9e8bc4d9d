//! Capabilities the host grants to plugins, below both [`crate::plugin`]
//! (which exposes them to guests through the WIT imports) and
//! [`crate::sink`] (which brackets the plugin's work in them).
//!
//! - [`sql`]: one database connection (SQLite or PostgreSQL) shared by
//!   the sink driver and the plugin's `sql` imports.
//! - [`kafka`]: the topics a sink may produce to, and what a range sent.
//!
//! The WIT `Host` impls stay in `plugin/imports.rs`, next to the
//! `bindgen!` output they implement (the bindings are private to
//! `plugin`); they only convert WIT values to this module's types.

pub mod kafka;
pub mod sql;
