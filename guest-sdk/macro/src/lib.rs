//! `sluice_guest::export!`: turn plain [`Mapper`]/[`Sink`] impls into the
//! exports of a `sluice:plugin` component.
//!
//! The macro expands into a private module that runs `wit_bindgen::generate!`
//! against the WIT vendored here (`wit/plugin.wit`, embedded at build time),
//! picks the world from the stages named (`map-plugin`, `sink-plugin` or
//! `map-sink-plugin`) and forwards every export to the SDK's drivers.
//! Authors never depend on wit-bindgen themselves.
//!
//! [`Mapper`]: https://docs.rs/sluice-guest/latest/sluice_guest/trait.Mapper.html
//! [`Sink`]: https://docs.rs/sluice-guest/latest/sluice_guest/trait.Sink.html

use proc_macro::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Ident, Token, Type, parse_macro_input};

/// The contract, embedded so plugin crates need no WIT files of their own.
const WIT: &str = include_str!("../../../wit/plugin.wit");

struct Entry {
    stage: Ident,
    ty: Type,
}

impl Parse for Entry {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let stage: Ident = input.parse()?;
        input.parse::<Token![:]>()?;
        let ty: Type = input.parse()?;
        Ok(Entry { stage, ty })
    }
}

struct Args(Punctuated<Entry, Token![,]>);

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        Punctuated::parse_terminated(input).map(Args)
    }
}

/// Export stages from a plugin crate built for `wasm32-wasip2`.
///
/// ```ignore
/// sluice_guest::export!(map: MyMapper);
/// sluice_guest::export!(sink: MySink);
/// sluice_guest::export!(map: MyMapper, sink: MySink);
/// ```
///
/// `MyMapper` implements `sluice_guest::Mapper`, `MySink` implements
/// `sluice_guest::Sink`. Each stage may be named once.
#[proc_macro]
pub fn export(input: TokenStream) -> TokenStream {
    let args = parse_macro_input!(input as Args);
    match expand(args) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand(args: Args) -> syn::Result<proc_macro2::TokenStream> {
    let mut map: Option<Type> = None;
    let mut sink: Option<Type> = None;
    for e in args.0 {
        let slot = match e.stage.to_string().as_str() {
            "map" => &mut map,
            "sink" => &mut sink,
            other => {
                return Err(syn::Error::new_spanned(
                    &e.stage,
                    format!("unknown stage `{other}`: expected `map` or `sink`"),
                ));
            }
        };
        if slot.is_some() {
            return Err(syn::Error::new_spanned(
                &e.stage,
                "each stage can be exported once",
            ));
        }
        *slot = Some(e.ty);
    }
    let world = match (&map, &sink) {
        (Some(_), None) => "map-plugin",
        (None, Some(_)) => "sink-plugin",
        (Some(_), Some(_)) => "map-sink-plugin",
        (None, None) => {
            return Err(syn::Error::new(
                proc_macro2::Span::call_site(),
                "name at least one stage: `export!(map: MyMapper)` or `export!(sink: MySink)`",
            ));
        }
    };

    // Sink worlds import `sql` and `kafka`: route the SDK's calls to them.
    let sql_impl = sink.is_some().then(|| {
        quote! {
            fn sql_dialect(&self) -> ::std::option::Option<::std::string::String> {
                ::std::option::Option::Some(sluice::plugin::sql::dialect())
            }
            fn sql_execute(
                &self,
                statement: &str,
                params: &[::sluice_guest::sql::Value],
            ) -> ::std::result::Result<u64, ::sluice_guest::sql::SqlError> {
                let params: ::std::vec::Vec<_> = params.iter().map(to_wit).collect();
                sluice::plugin::sql::execute(statement, &params).map_err(from_wit_error)
            }
            fn sql_execute_batch(
                &self,
                statement: &str,
                rows: &[&[::sluice_guest::sql::Value]],
            ) -> ::std::result::Result<u64, ::sluice_guest::sql::BatchError> {
                let rows: ::std::vec::Vec<::std::vec::Vec<_>> =
                    rows.iter().map(|r| r.iter().map(to_wit).collect()).collect();
                sluice::plugin::sql::execute_batch(statement, &rows).map_err(|e| {
                    ::sluice_guest::sql::BatchError {
                        row: e.row as usize,
                        error: from_wit_error(e.error),
                    }
                })
            }
            fn sql_apply(
                &self,
                table: &str,
                columns: &[::std::string::String],
                key: &[::std::string::String],
                version: ::std::option::Option<(&str, ::sluice_guest::sql::Value)>,
                changes: ::std::vec::Vec<::sluice_guest::sql::Change>,
            ) -> ::std::result::Result<u64, ::sluice_guest::sql::BatchError> {
                use ::sluice_guest::sql::Change as C;
                use sluice::plugin::sql::Change as W;
                let target = sluice::plugin::sql::Target {
                    table: table.to_string(),
                    columns: columns.to_vec(),
                    key: key.to_vec(),
                };
                let changes: ::std::vec::Vec<W> = changes
                    .into_iter()
                    .map(|c| match c {
                        C::Upsert(v) => W::Upsert(v.into_iter().map(into_wit).collect()),
                        C::Delete(v) => W::Delete(v.into_iter().map(into_wit).collect()),
                    })
                    .collect();
                let applied = match version {
                    ::std::option::Option::Some((column, low)) => {
                        let guard = sluice::plugin::sql::VersionGuard {
                            column: column.to_string(),
                            low: into_wit(low),
                        };
                        sluice::plugin::sql::apply_versioned(&target, &guard, &changes)
                    }
                    ::std::option::Option::None => sluice::plugin::sql::apply(&target, &changes),
                };
                applied.map_err(|e| {
                    ::sluice_guest::sql::BatchError {
                        row: e.row as usize,
                        error: from_wit_error(e.error),
                    }
                })
            }
            fn kafka_send(
                &self,
                records: ::std::vec::Vec<::sluice_guest::kafka::OutputRecord>,
            ) -> ::std::result::Result<(), ::std::string::String> {
                let records: ::std::vec::Vec<sluice::plugin::kafka::OutputRecord> = records
                    .into_iter()
                    .map(|r| sluice::plugin::kafka::OutputRecord {
                        topic: r.topic,
                        partition: r.partition,
                        key: r.key,
                        value: r.value,
                        headers: r
                            .headers
                            .into_iter()
                            .map(|(key, value)| t::Header { key, value })
                            .collect(),
                        idempotency_key: r.idempotency_key,
                    })
                    .collect();
                sluice::plugin::kafka::send(&records)
            }
            fn sql_query(
                &self,
                statement: &str,
                params: &[::sluice_guest::sql::Value],
            ) -> ::std::result::Result<::sluice_guest::sql::Rows, ::sluice_guest::sql::SqlError> {
                let params: ::std::vec::Vec<_> = params.iter().map(to_wit).collect();
                let rows = sluice::plugin::sql::query(statement, &params).map_err(from_wit_error)?;
                Ok(::sluice_guest::sql::Rows {
                    columns: rows.columns,
                    rows: rows
                        .rows
                        .into_iter()
                        .map(|r| r.into_iter().map(from_wit).collect())
                        .collect(),
                })
            }
        }
    });
    let sql_helpers = sink.is_some().then(|| {
        quote! {
            fn to_wit(v: &::sluice_guest::sql::Value) -> sluice::plugin::sql::Value {
                use ::sluice_guest::sql::Value as V;
                use sluice::plugin::sql::Value as W;
                match v {
                    V::Null => W::Null,
                    V::Integer(i) => W::Integer(*i),
                    V::Real(r) => W::Real(*r),
                    V::Text(t) => W::Text(t.clone()),
                    V::Blob(b) => W::Blob(b.clone()),
                }
            }
            fn into_wit(v: ::sluice_guest::sql::Value) -> sluice::plugin::sql::Value {
                use ::sluice_guest::sql::Value as V;
                use sluice::plugin::sql::Value as W;
                match v {
                    V::Null => W::Null,
                    V::Integer(i) => W::Integer(i),
                    V::Real(r) => W::Real(r),
                    V::Text(t) => W::Text(t),
                    V::Blob(b) => W::Blob(b),
                }
            }
            fn from_wit(v: sluice::plugin::sql::Value) -> ::sluice_guest::sql::Value {
                use ::sluice_guest::sql::Value as V;
                use sluice::plugin::sql::Value as W;
                match v {
                    W::Null => V::Null,
                    W::Integer(i) => V::Integer(i),
                    W::Real(r) => V::Real(r),
                    W::Text(t) => V::Text(t),
                    W::Blob(b) => V::Blob(b),
                }
            }
            fn from_wit_error(e: sluice::plugin::sql::SqlError) -> ::sluice_guest::sql::SqlError {
                ::sluice_guest::sql::SqlError { message: e.message, code: e.code }
            }
        }
    });

    let map_impl = map.map(|ty| {
        quote! {
            static MAPPER: ::sluice_guest::__private::Slot<#ty> = ::sluice_guest::__private::Slot::new();
            impl exports::sluice::plugin::mapper::Guest for Component {
                fn map(
                    _ctx: t::BatchContext,
                    records: ::std::vec::Vec<u8>,
                ) -> ::std::result::Result<exports::sluice::plugin::mapper::MapResult, t::StageError> {
                    install();
                    let out = ::sluice_guest::__private::map_packed(&MAPPER, &records)
                        .map_err(stage_error)?;
                    Ok(exports::sluice::plugin::mapper::MapResult {
                        outputs: out.outputs,
                        rejected: out
                            .rejected
                            .into_iter()
                            .map(|(index, message)| t::BadRecord { index, message })
                            .collect(),
                    })
                }
            }
        }
    });

    let sink_impl = sink.map(|ty| {
        quote! {
            static SINK: ::sluice_guest::__private::Slot<::sluice_guest::__private::Initialised<#ty>> = ::sluice_guest::__private::Slot::new();
            impl exports::sluice::plugin::sink::Guest for Component {
                fn open(
                    ctx: exports::sluice::plugin::sink::PartitionContext,
                ) -> ::std::result::Result<exports::sluice::plugin::sink::OpenAnswer, t::StageError> {
                    install();
                    let ctx = ::sluice_guest::PartitionContext {
                        query_id: ctx.batch.query_id,
                        batch_id: ctx.batch.batch_id,
                        epoch: ctx.batch.epoch,
                        topic: ctx.topic,
                        partition: ctx.partition,
                        start_offset: ctx.start_offset,
                        end_offset: ctx.end_offset,
                    };
                    match ::sluice_guest::__private::sink_open(&SINK, &ctx).map_err(stage_error)? {
                        ::sluice_guest::OpenAnswer::Proceed => {
                            Ok(exports::sluice::plugin::sink::OpenAnswer::Proceed)
                        }
                        ::sluice_guest::OpenAnswer::AlreadyApplied => {
                            Ok(exports::sluice::plugin::sink::OpenAnswer::AlreadyApplied)
                        }
                    }
                }
                fn write(records: ::std::vec::Vec<u8>) -> ::std::result::Result<(), t::StageError> {
                    install();
                    ::sluice_guest::__private::sink_write_packed(&SINK, &records).map_err(stage_error)
                }
                fn close() -> ::std::result::Result<(), t::StageError> {
                    install();
                    ::sluice_guest::__private::sink_close(&SINK).map_err(stage_error)
                }
            }
        }
    });

    // `cfg(not(doctest))`: wit-bindgen documents the export macro it
    // generates with a ```rust example, which rustdoc would collect as a
    // doc-test of the plugin's crate (`cargo test` listed a test named
    // after this private module). rustdoc sets `doctest` only while it
    // collects doc-tests; the crate itself is built without it.
    Ok(quote! {
        #[doc(hidden)]
        #[cfg(not(doctest))]
        #[allow(missing_docs, unsafe_code, dead_code, unused_imports, clippy::all)]
        mod __sluice_export {
            use super::*;

            ::sluice_guest::__private::wit_bindgen::generate!({
                inline: #WIT,
                world: #world,
                runtime_path: "::sluice_guest::__private::wit_bindgen::rt",
            });

            use sluice::plugin::types as t;

            struct Host;

            impl ::sluice_guest::__private::HostApi for Host {
                fn log(&self, level: ::sluice_guest::__private::LogLevel, message: &str) {
                    use ::sluice_guest::__private::LogLevel as L;
                    use sluice::plugin::log::Level;
                    let level = match level {
                        L::Trace => Level::Trace,
                        L::Debug => Level::Debug,
                        L::Info => Level::Info,
                        L::Warn => Level::Warn,
                        L::Error => Level::Error,
                    };
                    sluice::plugin::log::log(level, message);
                }
                fn config_all(&self) -> ::std::vec::Vec<(::std::string::String, ::std::string::String)> {
                    sluice::plugin::config::get_all()
                }
                #sql_impl
            }

            #sql_helpers

            fn install() {
                ::sluice_guest::__private::set_host(::std::boxed::Box::new(Host));
            }

            fn stage_error(e: ::sluice_guest::StageError) -> t::StageError {
                match e {
                    ::sluice_guest::StageError::BadRecord { index, message } => {
                        t::StageError::BadRecord(t::BadRecord { index, message })
                    }
                    ::sluice_guest::StageError::Retryable(m) => t::StageError::Retryable(m),
                    ::sluice_guest::StageError::Fatal(m) => t::StageError::Fatal(m),
                }
            }

            struct Component;

            #map_impl
            #sink_impl

            // The exported symbol names (`sluice:plugin/mapper@…#map`) only
            // make sense in a component; natively the crate is a library
            // whose stages are unit-tested through `sluice_guest::testing`.
            #[cfg(target_arch = "wasm32")]
            export!(Component);
        }
    })
}
