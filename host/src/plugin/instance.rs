//! One sandboxed plugin instance: a wasmtime store made from the plugin's
//! pre-instantiated template, with its limiter, epoch deadline, captured
//! stdio and the host imports (`log`, `config`).
//!
//! A trap poisons the store; the instance drops it and instantiates a new
//! one on the next call, so a failing guest never takes the host down and
//! never leaks its memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_guest::wire::{self, Record};
use wasmtime::component::{InstancePre, ResourceTable};
use wasmtime::{Engine, Store, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder};

use super::bindings::exports::sluice::plugin::{mapper, sink};
use super::bindings::sluice::plugin::types;
use super::contract::{BadRecord, CallContext, MapResult, OpenAnswer, PartitionContext};
use super::guest_stderr::panic_message;
use super::limiter::Limiter;
use super::log_budget::{LogBudget, SharedLogBudget};
use super::{EPOCH_TICK, Exports, Limits, PluginError, StageFailure, TrapKind, Trapped};
use crate::capability::kafka::{KafkaGrant, Outbox, Sent};
use crate::capability::sql::SqlGrant;

/// Capacity of each captured stdio pipe, bytes. An instance whose output
/// passes half of it is recycled between calls (stage state is a cache).
const STDIO_CAP: usize = 1 << 20;

/// How much of a call's stderr goes into a trap message, bytes.
const STDERR_IN_ERROR: usize = 2048;

/// Store data of one instance.
pub(crate) struct State {
    pub(super) wasi: WasiCtx,
    pub(super) table: ResourceTable,
    limiter: Limiter,
    pub(super) config: Arc<BTreeMap<String, String>>,
    pub(super) plugin: String,
    pub(super) sql: Option<SqlGrant>,
    /// The topics `kafka.send` may name (`None`: not granted).
    pub(super) kafka: Option<Arc<KafkaGrant>>,
    /// What the range being written sent.
    pub(super) outbox: Outbox,
    /// What the instance may still log (shared with the instance, so a
    /// fresh store after a trap does not start a fresh budget).
    pub(super) log: SharedLogBudget,
    /// When the current call's deadline passes (`None`: never), for the
    /// waits WASI serves ([`super::imports::DeadlineClock`]).
    pub(super) deadline: Option<std::time::Instant>,
}

/// Start a call's deadline: `ticks` epochs for running code, `limit` of
/// wall-clock time for the waits WASI serves.
fn arm(store: &mut Store<State>, ticks: u64, limit: std::time::Duration) {
    store.set_epoch_deadline(ticks);
    store.data_mut().deadline = std::time::Instant::now().checked_add(limit);
}

/// What every instance of one plugin is made from.
pub(crate) struct Template {
    pre: InstancePre<State>,
    mapper: Option<mapper::GuestIndices>,
    sink: Option<sink::GuestIndices>,
    path: PathBuf,
    digest: String,
    /// The component imports `sluice:plugin/kafka` (it may send records).
    sends: bool,
}

impl Template {
    /// Whether the component imports `sluice:plugin/kafka`.
    pub(crate) fn sends(&self) -> bool {
        self.sends
    }

    pub(crate) fn new(
        pre: InstancePre<State>,
        stages: Exports,
        path: &Path,
        digest: &str,
        sends: bool,
    ) -> Result<Self, PluginError> {
        let bad = |e: wasmtime::Error| PluginError::Instantiate {
            path: path.to_path_buf(),
            digest: digest.to_string(),
            reason: format!("{e:#}"),
        };
        let mapper = if stages.map {
            Some(mapper::GuestIndices::new(&pre).map_err(bad)?)
        } else {
            None
        };
        let sink = if stages.sink {
            Some(sink::GuestIndices::new(&pre).map_err(bad)?)
        } else {
            None
        };
        Ok(Template {
            pre,
            mapper,
            sink,
            path: path.to_path_buf(),
            digest: digest.to_string(),
            sends,
        })
    }
}

struct Live {
    store: Store<State>,
    mapper: Option<mapper::Guest>,
    sink: Option<sink::Guest>,
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
    stdout_seen: usize,
    stderr_seen: usize,
}

/// A sandboxed instance of a plugin. Not shared between threads; make one
/// per worker with [`super::Plugin::instance`].
pub struct Instance {
    engine: Engine,
    template: Arc<Template>,
    config: Arc<BTreeMap<String, String>>,
    limits: Limits,
    sql: Option<SqlGrant>,
    kafka: Option<Arc<KafkaGrant>>,
    live: Option<Live>,
    instantiations: u64,
    /// The log budget of every store this instance makes.
    log: SharedLogBudget,
}

/// Describe the input of a call for error messages:
/// `topic/partition offsets A..=B (N records)`, or `topic/partition
/// offset A` for one record.
pub fn describe_site(records: &[Record<'_>]) -> String {
    match (records.first(), records.last()) {
        (Some(a), _) if records.len() == 1 => {
            format!("{}/{} offset {}", a.topic, a.partition, a.offset)
        }
        (Some(a), Some(b)) if a.topic == b.topic && a.partition == b.partition => format!(
            "{}/{} offsets {}..={} ({} records)",
            a.topic,
            a.partition,
            a.offset,
            b.offset,
            records.len()
        ),
        (Some(a), Some(b)) => format!(
            "{}/{}@{} .. {}/{}@{} ({} records)",
            a.topic,
            a.partition,
            a.offset,
            b.topic,
            b.partition,
            b.offset,
            records.len()
        ),
        _ => "an empty batch".to_string(),
    }
}

impl Instance {
    pub(crate) fn new(
        engine: Engine,
        template: Arc<Template>,
        config: Arc<BTreeMap<String, String>>,
        limits: Limits,
        sql: Option<SqlGrant>,
    ) -> Self {
        let log = LogBudget::shared(template.digest.get(..12).unwrap_or(&template.digest));
        Instance {
            engine,
            template,
            config,
            limits,
            sql,
            kafka: None,
            live: None,
            instantiations: 0,
            log,
        }
    }

    /// Grant the `kafka` capability: `kafka.send` may name `grant`'s
    /// topics (sink stages of a pipeline with `--output-topic`).
    pub fn grant_kafka(&mut self, grant: Option<Arc<KafkaGrant>>) {
        self.kafka = grant;
        self.discard();
    }

    /// What the sink sent with `kafka.send` since the range began
    /// ([`Instance::sink_open`]), emptying the outbox.
    ///
    /// # Errors
    /// The first refused send's reason.
    pub fn take_sent(&mut self) -> Result<Vec<Sent>, String> {
        match self.live.as_mut() {
            Some(l) => l.store.data_mut().outbox.take(),
            None => Ok(Vec::new()),
        }
    }

    /// Whether the component imports `sluice:plugin/kafka` (contract
    /// 0.2.4): its sink may send records to the output topics.
    pub fn sends_records(&self) -> bool {
        self.template.sends
    }

    /// The plugin file.
    pub fn path(&self) -> &Path {
        &self.template.path
    }

    /// The plugin's sha256 digest (hex).
    pub fn digest(&self) -> &str {
        &self.template.digest
    }

    /// How many times a store was instantiated (1 + one per discarded
    /// instance); lets tests and metrics see recycling.
    pub fn instantiations(&self) -> u64 {
        self.instantiations
    }

    /// Start the deadline of a call (or of instantiation) on `store`.
    fn arm(&self, store: &mut Store<State>) {
        arm(store, self.deadline_ticks(), self.limits.call_timeout);
    }

    fn deadline_ticks(&self) -> u64 {
        // Saturating: a deadline beyond u64 ticks is no deadline at all, not
        // a wrap-around to a tiny one (the CLI bounds the timeout anyway).
        let tick = EPOCH_TICK.as_nanos().max(1);
        let ticks = self.limits.call_timeout.as_nanos().div_ceil(tick);
        u64::try_from(ticks)
            .unwrap_or(u64::MAX / 2)
            .clamp(1, u64::MAX / 2)
            .saturating_add(1)
    }

    /// Instantiate now if there is no live store (used to validate a plugin
    /// at load and swap time: a start function that traps is caught here).
    ///
    /// # Errors
    /// [`PluginError::Instantiate`].
    pub fn ensure_live(&mut self) -> Result<(), PluginError> {
        if self.live.is_some() {
            return Ok(());
        }
        let t = &self.template;
        let stdout = MemoryOutputPipe::new(STDIO_CAP);
        let stderr = MemoryOutputPipe::new(STDIO_CAP);
        // Sandbox: no preopens, no env, no args, no network (these are the
        // builder's defaults; the network calls make the intent explicit).
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let state = State {
            wasi,
            table: ResourceTable::new(),
            limiter: Limiter {
                max_memory: usize::try_from(self.limits.memory_bytes).unwrap_or(usize::MAX),
                refused: None,
            },
            config: self.config.clone(),
            plugin: t.digest.get(..12).unwrap_or(&t.digest).to_string(),
            sql: self.sql.clone(),
            kafka: self.kafka.clone(),
            outbox: Outbox::default(),
            log: self.log.clone(),
            deadline: None,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        store.epoch_deadline_trap();
        self.arm(&mut store);
        let fail = |e: wasmtime::Error| PluginError::Instantiate {
            path: t.path.clone(),
            digest: t.digest.clone(),
            reason: format!("{e:#}"),
        };
        let started = std::time::Instant::now();
        let instance = match t.pre.instantiate(&mut store) {
            Ok(i) => i,
            Err(e) => {
                let reason = match store.data().limiter.refused {
                    Some(wanted) => format!(
                        "needs {wanted} bytes of memory to instantiate, over the cap of {} bytes (raise it with --plugin-memory)",
                        self.limits.memory_bytes
                    ),
                    None => format!("{e:#}"),
                };
                return Err(PluginError::Instantiate {
                    path: t.path.clone(),
                    digest: t.digest.clone(),
                    reason,
                });
            }
        };
        let mapper = match &t.mapper {
            Some(i) => Some(i.load(&mut store, &instance).map_err(fail)?),
            None => None,
        };
        let sink = match &t.sink {
            Some(i) => Some(i.load(&mut store, &instance).map_err(fail)?),
            None => None,
        };
        self.instantiations += 1;
        tracing::debug!(
            plugin = store.data().plugin.as_str(),
            micros = started.elapsed().as_micros() as u64,
            "instantiated"
        );
        self.live = Some(Live {
            store,
            mapper,
            sink,
            stdout,
            stderr,
            stdout_seen: 0,
            stderr_seen: 0,
        });
        Ok(())
    }

    /// Forward new guest stdout/stderr to the log; return this call's
    /// stderr (tail) for error messages. Recycle a chatty instance.
    fn drain_stdio(&mut self) -> String {
        let Some(live) = self.live.as_mut() else {
            return String::new();
        };
        let plugin = live.store.data().plugin.clone();
        let out = live.stdout.contents();
        let err = live.stderr.contents();
        let new_out = out.get(live.stdout_seen..).unwrap_or_default();
        let new_err = err.get(live.stderr_seen..).unwrap_or_default();
        let now = std::time::Instant::now();
        let mut budget = self.log.lock().unwrap_or_else(|p| p.into_inner());
        for line in String::from_utf8_lossy(new_out)
            .lines()
            .filter(|l| !l.trim().is_empty())
        {
            if let Some(line) = budget.admit(line, now) {
                tracing::info!(plugin = plugin.as_str(), stream = "stdout", "{line}");
            }
        }
        let err_text = String::from_utf8_lossy(new_err).into_owned();
        for line in err_text.lines().filter(|l| !l.trim().is_empty()) {
            if let Some(line) = budget.admit(line, now) {
                tracing::warn!(plugin = plugin.as_str(), stream = "stderr", "{line}");
            }
        }
        budget.end_call(now);
        drop(budget);
        live.stdout_seen = out.len();
        live.stderr_seen = err.len();
        if out.len() > STDIO_CAP / 2 || err.len() > STDIO_CAP / 2 {
            self.live = None;
        }
        let start = err_text.len().saturating_sub(STDERR_IN_ERROR);
        let start = (start..err_text.len())
            .find(|&i| err_text.is_char_boundary(i))
            .unwrap_or(err_text.len());
        err_text[start..].to_string()
    }

    /// Drop the live instance and whatever state it holds; the next call
    /// starts a fresh one. The sink driver does this after a failed
    /// attempt at a range, so the range written again does not meet rows a
    /// sink buffered during the failed attempt.
    pub fn discard(&mut self) {
        if self.live.is_some() {
            self.drain_stdio();
            self.live = None;
        }
    }

    /// Turn a failed call into a [`PluginError::Trap`] and discard the store.
    fn trapped(&mut self, e: &wasmtime::Error, call: &'static str, site: String) -> PluginError {
        let refused = self
            .live
            .as_ref()
            .and_then(|l| l.store.data().limiter.refused);
        let guest_stderr = self.drain_stdio();
        self.live = None;
        let kind = if let Some(requested) = refused {
            TrapKind::OutOfMemory {
                limit: self.limits.memory_bytes,
                requested: requested as u64,
            }
        } else {
            let wait = e.downcast_ref::<super::error::WaitPastDeadline>();
            match e.downcast_ref::<Trap>() {
                _ if let Some(w) = wait => TrapKind::WaitPastDeadline {
                    limit: self.limits.call_timeout,
                    asked: w.asked,
                    left: w.left,
                },
                Some(Trap::Interrupt) => TrapKind::Timeout {
                    limit: self.limits.call_timeout,
                },
                Some(Trap::StackOverflow) => TrapKind::StackOverflow,
                Some(trap) => match panic_message(&guest_stderr) {
                    Some(message) => TrapKind::Panic { message },
                    // Rust and C guests keep their stack in linear memory
                    // (below the data); overflowing it shows up as an
                    // out-of-bounds access, not as wasm's stack overflow.
                    None if *trap == Trap::MemoryOutOfBounds => TrapKind::Other(format!(
                        "{trap} (in a Rust or C plugin usually a stack overflow: deep recursion or a large local)"
                    )),
                    None => TrapKind::Other(trap.to_string()),
                },
                None => match panic_message(&guest_stderr) {
                    Some(message) => TrapKind::Panic { message },
                    None => TrapKind::Other(format!("{e:#}")),
                },
            }
        };
        PluginError::Trap(Box::new(Trapped {
            path: self.template.path.clone(),
            digest: self.template.digest.clone(),
            call,
            site,
            kind,
            guest_stderr,
        }))
    }

    fn stage_error(&self, call: &'static str, site: String, e: types::StageError) -> PluginError {
        let failure = match e {
            types::StageError::BadRecord(b) => StageFailure::BadRecord {
                index: b.index,
                message: b.message,
            },
            types::StageError::Retryable(m) => StageFailure::Retryable(m),
            types::StageError::Fatal(m) => StageFailure::Fatal(m),
        };
        PluginError::Stage {
            path: self.template.path.clone(),
            digest: self.template.digest.clone(),
            call,
            site,
            failure,
        }
    }

    fn missing(&self, stage: &'static str) -> PluginError {
        PluginError::MissingStage {
            path: self.template.path.clone(),
            digest: self.template.digest.clone(),
            stage,
        }
    }

    /// Run the map stage over `records` (one call).
    ///
    /// # Errors
    /// [`PluginError::Trap`] (instance discarded), [`PluginError::Stage`]
    /// for a retryable/fatal/bad-record stage error,
    /// [`PluginError::MissingStage`] when the plugin has no map stage.
    pub fn map(
        &mut self,
        ctx: &CallContext,
        records: &[Record<'_>],
    ) -> Result<MapResult, PluginError> {
        let mut enc = wire::Encoder::with_capacity(
            records
                .iter()
                .map(|r| r.value.map_or(0, <[u8]>::len) + r.key.map_or(0, <[u8]>::len) + 48)
                .sum(),
        );
        for r in records {
            enc.push_record(r);
        }
        let packed = enc.finish();
        self.map_packed(ctx, packed, || describe_site(records))
    }

    /// Run the map stage over an already packed batch. `site` describes the
    /// input for error messages.
    ///
    /// # Errors
    /// As [`Instance::map`].
    pub fn map_packed(
        &mut self,
        ctx: &CallContext,
        packed: Vec<u8>,
        site: impl Fn() -> String,
    ) -> Result<MapResult, PluginError> {
        if self.template.mapper.is_none() {
            return Err(self.missing("map"));
        }
        self.ensure_live()?;
        let ticks = self.deadline_ticks();
        let wit_ctx = types::BatchContext {
            query_id: ctx.query_id.clone(),
            batch_id: ctx.batch_id,
            epoch: ctx.epoch,
        };
        let result = match self.live.as_mut() {
            Some(Live {
                store,
                mapper: Some(m),
                ..
            }) => {
                arm(store, ticks, self.limits.call_timeout);
                m.call_map(&mut *store, &wit_ctx, &packed)
            }
            _ => return Err(self.missing("map")),
        };
        match result {
            Err(e) => Err(self.trapped(&e, "map", site())),
            Ok(r) => {
                self.drain_stdio();
                match r {
                    Ok(m) => Ok(MapResult {
                        outputs: m.outputs,
                        rejected: m
                            .rejected
                            .into_iter()
                            .map(|b| BadRecord {
                                index: b.index,
                                message: b.message,
                            })
                            .collect(),
                    }),
                    Err(e) => Err(self.stage_error("map", site(), e)),
                }
            }
        }
    }

    fn sink_call<R>(
        &mut self,
        call: &'static str,
        site: impl Fn() -> String,
        f: impl FnOnce(
            &sink::Guest,
            &mut Store<State>,
        ) -> wasmtime::Result<Result<R, types::StageError>>,
    ) -> Result<R, PluginError> {
        if self.template.sink.is_none() {
            return Err(self.missing("sink"));
        }
        self.ensure_live()?;
        let ticks = self.deadline_ticks();
        let result = match self.live.as_mut() {
            Some(Live {
                store,
                sink: Some(s),
                ..
            }) => {
                arm(store, ticks, self.limits.call_timeout);
                f(s, store)
            }
            _ => return Err(self.missing("sink")),
        };
        match result {
            Err(e) => Err(self.trapped(&e, call, site())),
            Ok(Ok(r)) => {
                self.drain_stdio();
                Ok(r)
            }
            Ok(Err(e)) => {
                self.drain_stdio();
                Err(self.stage_error(call, site(), e))
            }
        }
    }

    /// Begin one partition's range or part of one (`sink.open`).
    ///
    /// # Errors
    /// As [`Instance::map`].
    pub fn sink_open(&mut self, range: &PartitionContext) -> Result<OpenAnswer, PluginError> {
        let ctx = sink::PartitionContext {
            batch: types::BatchContext {
                query_id: range.batch.query_id.clone(),
                batch_id: range.batch.batch_id,
                epoch: range.batch.epoch,
            },
            topic: range.topic.clone(),
            partition: range.partition,
            start_offset: range.start_offset,
            end_offset: range.end_offset,
        };
        let site = || {
            format!(
                "{}/{} offsets [{}, {})",
                range.topic, range.partition, range.start_offset, range.end_offset
            )
        };
        if let Some(l) = self.live.as_mut() {
            l.store.data_mut().outbox.clear();
        }
        self.sink_call("sink.open", site, |s, store| s.call_open(store, &ctx))
            .map(|a| match a {
                sink::OpenAnswer::Proceed => OpenAnswer::Proceed,
                sink::OpenAnswer::AlreadyApplied => OpenAnswer::AlreadyApplied,
            })
    }

    /// Write a chunk of `packed-sink-records` (`sink.write`).
    ///
    /// # Errors
    /// As [`Instance::map`].
    pub fn sink_write(
        &mut self,
        packed: Vec<u8>,
        site: impl Fn() -> String,
    ) -> Result<(), PluginError> {
        self.sink_call("sink.write", site, |s, store| s.call_write(store, &packed))
    }

    /// Finish the range (`sink.close`).
    ///
    /// # Errors
    /// As [`Instance::map`].
    pub fn sink_close(&mut self, site: impl Fn() -> String) -> Result<(), PluginError> {
        self.sink_call("sink.close", site, |s, store| s.call_close(store))
    }
}
