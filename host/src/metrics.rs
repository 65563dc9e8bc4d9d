//! Prometheus metrics (`--metrics-addr HOST:PORT`, path `/metrics`, text
//! exposition format 0.0.4) with the `prometheus-client` crate, served by
//! a small blocking HTTP server (`tiny_http`) on its own thread.
//!
//! Names follow Prometheus conventions: `sluice_` prefix, `_total` for
//! counters, base units (seconds).

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::checkpoint::{Counts, Timings};
use crate::source::TopicPartition;

/// Label of the phase histograms.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// plan, fetch, map, sink or commit.
    pub phase: &'static str,
}

/// Labels of per-partition series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabel {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: String,
}

/// Labels of `sluice_group_member_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabel {
    /// The pipeline group (`--group`).
    pub group: String,
    /// This member (pid, host), as the group's tables name it.
    pub member: String,
}

fn phase_histogram() -> Histogram {
    // 1 ms … ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every series Sluice exports.
pub struct Metrics {
    registry: Registry,
    batches: Counter,
    reruns: Counter,
    records_in: Counter,
    records_out: Counter,
    records_filtered: Counter,
    bad_records: Counter,
    dead_lettered: Counter,
    skipped: Counter,
    produced: Counter,
    swaps: Counter,
    traps: Counter,
    epoch: Gauge,
    phase: Family<PhaseLabel, Histogram, fn() -> Histogram>,
    lag: Family<PartitionLabel, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every series registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sluice");
        let m = Metrics {
            batches: Counter::default(),
            reruns: Counter::default(),
            records_in: Counter::default(),
            records_out: Counter::default(),
            records_filtered: Counter::default(),
            bad_records: Counter::default(),
            dead_lettered: Counter::default(),
            skipped: Counter::default(),
            produced: Counter::default(),
            swaps: Counter::default(),
            traps: Counter::default(),
            epoch: Gauge::default(),
            phase: Family::new_with_constructor(phase_histogram as fn() -> Histogram),
            lag: Family::default(),
            registry: Registry::default(),
        };
        registry.register("batches", "Batches committed", m.batches.clone());
        registry.register(
            "batch_reruns",
            "Uncommitted batches re-run after a restart",
            m.reruns.clone(),
        );
        registry.register(
            "records_in",
            "Records read from Kafka",
            m.records_in.clone(),
        );
        registry.register(
            "records_out",
            "Records handed to the sink",
            m.records_out.clone(),
        );
        registry.register(
            "records_filtered",
            "Records that produced no output",
            m.records_filtered.clone(),
        );
        registry.register(
            "bad_records",
            "Records rejected by a plugin",
            m.bad_records.clone(),
        );
        registry.register(
            "records_dead_lettered",
            "Bad records stored in sluice_dead_letters",
            m.dead_lettered.clone(),
        );
        registry.register(
            "records_skipped",
            "Bad records set aside by --on-error skip",
            m.skipped.clone(),
        );
        registry.register(
            "records_produced",
            "Outputs produced to the output topic (--output-topic) by committed batches",
            m.produced.clone(),
        );
        registry.register(
            "plugin_swaps",
            "Plugins swapped in between batches",
            m.swaps.clone(),
        );
        registry.register(
            "plugin_traps",
            "Plugin calls that trapped (timeout, memory, panic, ...)",
            m.traps.clone(),
        );
        registry.register("epoch", "Fencing epoch of this process", m.epoch.clone());
        registry.register(
            "phase_duration_seconds",
            "Duration of each batch phase",
            m.phase.clone(),
        );
        registry.register(
            "lag_records",
            "Records between the checkpoint and the high watermark",
            m.lag.clone(),
        );
        Metrics { registry, ..m }
    }

    /// [`Metrics::new`] for a member of pipeline group `group`: also
    /// `sluice_group_member_info{group, member} 1`, so every series of the
    /// process can be joined to the group and member.
    pub fn in_group(group: &str, member: &str) -> Self {
        let mut m = Self::new();
        let info: Family<MemberLabel, Gauge> = Family::default();
        info.get_or_create(&MemberLabel {
            group: group.to_string(),
            member: member.to_string(),
        })
        .set(1);
        m.registry.register(
            "group_member_info",
            "The pipeline group this process is a member of",
            info,
        );
        m
    }

    /// Drop the lag series of a partition this member no longer holds.
    pub fn forget_partition(&self, (topic, partition): &TopicPartition) {
        self.lag.remove(&PartitionLabel {
            topic: topic.clone(),
            partition: partition.to_string(),
        });
    }

    /// Record a committed batch.
    pub fn batch(
        &self,
        counts: &Counts,
        timings: &Timings,
        rerun: bool,
        lag: &std::collections::BTreeMap<TopicPartition, i64>,
    ) {
        self.batches.inc();
        if rerun {
            self.reruns.inc();
        }
        self.records_in.inc_by(counts.input);
        self.records_out.inc_by(counts.output);
        self.records_filtered.inc_by(counts.filtered);
        self.bad_records.inc_by(counts.bad_records);
        self.dead_lettered.inc_by(counts.dead_lettered);
        self.skipped.inc_by(counts.skipped);
        self.produced.inc_by(counts.produced);
        let transaction =
            (timings.transaction > 0.0).then_some(("transaction", timings.transaction));
        for (phase, ms) in [
            ("plan", timings.plan),
            ("fetch", timings.fetch),
            ("map", timings.map),
            ("sink", timings.sink),
            ("commit", timings.commit),
        ]
        .into_iter()
        .chain(transaction)
        {
            self.phase
                .get_or_create(&PhaseLabel { phase })
                .observe(ms / 1000.0);
        }
        for ((topic, partition), l) in lag {
            self.lag
                .get_or_create(&PartitionLabel {
                    topic: topic.clone(),
                    partition: partition.to_string(),
                })
                .set(*l);
        }
    }

    /// Set the epoch gauge.
    pub fn set_epoch(&self, epoch: crate::checkpoint::Epoch) {
        self.epoch
            .set(i64::try_from(epoch.get()).unwrap_or(i64::MAX));
    }

    /// Count a swap.
    pub fn swap(&self) {
        self.swaps.inc();
    }

    /// Count a trap.
    pub fn trap(&self) {
        self.traps.inc();
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// The HTTP endpoint. Dropping it stops the server thread.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

impl MetricsServer {
    /// Serve `metrics` on `addr` (`GET /metrics`).
    ///
    /// # Errors
    /// The bind error, as text.
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<Self, String> {
        let server = Arc::new(
            tiny_http::Server::http(addr).map_err(|e| format!("metrics endpoint {addr}: {e}"))?,
        );
        let bound = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| format!("metrics endpoint {addr}: not an IP listener"))?;
        let s = server.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-metrics".into())
            .spawn(move || {
                for req in s.incoming_requests() {
                    let resp = if req.url() == "/metrics" {
                        let ct = tiny_http::Header::from_bytes(
                            &b"Content-Type"[..],
                            &b"text/plain; version=0.0.4; charset=utf-8"[..],
                        );
                        let r = tiny_http::Response::from_string(metrics.encode());
                        match ct {
                            Ok(h) => r.with_header(h),
                            Err(()) => r,
                        }
                    } else {
                        tiny_http::Response::from_string("see /metrics\n").with_status_code(404)
                    };
                    let _ = req.respond(resp);
                }
            })
            .map_err(|e| format!("metrics thread: {e}"))?;
        tracing::info!("metrics on http://{bound}/metrics");
        Ok(MetricsServer {
            server,
            thread: Some(thread),
            addr: bound,
        })
    }

    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn produced_outputs_and_the_transaction_phase_are_exported_when_there() {
        let m = Metrics::new();
        let counts = Counts {
            produced: 5,
            ..Counts::default()
        };
        m.batch(&counts, &Timings::default(), false, &Default::default());
        let text = m.encode();
        assert!(text.contains("sluice_records_produced_total 5"), "{text}");
        assert!(!text.contains("phase=\"transaction\""), "{text}");
        let timings = Timings {
            transaction: 12.0,
            ..Timings::default()
        };
        m.batch(&counts, &timings, false, &Default::default());
        let text = m.encode();
        assert!(text.contains("sluice_records_produced_total 10"), "{text}");
        assert!(
            text.contains("sluice_phase_duration_seconds_count{phase=\"transaction\"} 1"),
            "{text}"
        );
    }
}
