//! Sluice end-to-end tests: one test binary, one module per area.
//!
//! Prerequisites (the README test command does all of it): the `host`
//! binary and the plugins built for `wasm32-wasip2` in the shared target
//! directory (`target/debug/host`, `target/wasm32-wasip2/debug/*.wasm`).

#![allow(clippy::unwrap_used)]
// Tests move whole engine runs into threads; the error size does not matter.
#![allow(clippy::result_large_err)]

mod support;

mod cdc;
mod cdc_bulk;
mod cdc_files;
mod cdc_real;
mod checkpoint;
mod crashes;
mod demo;
mod engine_mock;
mod failover;
mod first_hour;
mod group_protocol;
mod group_source;
mod groups;
mod grow;
mod handover;
mod js;
mod long_part;
mod moves;
mod output;
mod output_group;
mod output_send;
mod output_sender;
mod output_txn;
mod pipeline;
mod plugin_cli;
mod plugin_runtime;
mod python;
mod recreate;
mod recreate_group;
mod sql_sink;
mod timestamps;
mod txn_view;
