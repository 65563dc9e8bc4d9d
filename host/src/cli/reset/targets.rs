//! Where a reset moves the partitions: `--to` parsed ([`Target`]), the
//! current positions, what the broker says now (identities, watermarks),
//! and the positions after the reset.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, anyhow};

use crate::checkpoint::{self, TopicIdentity};
use crate::cli::{CliError, ExitCode, WithCode};
use crate::source::KafkaSource;

/// Where `--to` moves the partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::cli) enum Target {
    /// Each partition's log start.
    Earliest,
    /// Each partition's high watermark.
    Latest,
    /// The first offset at or after this time (ms since the Unix epoch).
    Timestamp(i64),
    /// Explicit offsets: the JSON text after `offsets:`.
    Offsets(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Earliest => f.write_str("earliest"),
            Target::Latest => f.write_str("latest"),
            Target::Timestamp(ms) => write!(f, "timestamp:{ms}"),
            Target::Offsets(json) => write!(f, "offsets:{json}"),
        }
    }
}

impl Target {
    /// Parse `--to`.
    pub(in crate::cli) fn parse(to: &str) -> Result<Self, CliError> {
        if let Some(json) = to.strip_prefix("offsets:") {
            return Ok(Target::Offsets(json.to_string()));
        }
        match to {
            "earliest" => Ok(Target::Earliest),
            "latest" => Ok(Target::Latest),
            _ => match to
                .strip_prefix("timestamp:")
                .and_then(|ms| ms.parse::<i64>().ok())
            {
                Some(ms) if ms >= 0 => Ok(Target::Timestamp(ms)),
                _ => Err(anyhow!(
                    "--to `{to}`: use earliest, latest, timestamp:MS (milliseconds since the Unix epoch, not negative) or offsets:JSON"
                ))
                .code(ExitCode::Usage),
            },
        }
    }
}

/// Current positions: the ends of the newest committed batch.
pub(super) fn positions(s: &checkpoint::Status) -> BTreeMap<(String, i32), i64> {
    match (&s.last_planned, &s.last_committed) {
        (Some(o), Some(c)) if o.batch_id == c.batch_id => o
            .ranges
            .iter()
            .map(|r| ((r.topic.clone(), r.partition), r.end))
            .collect(),
        (Some(o), _) => o
            .ranges
            .iter()
            .map(|r| ((r.topic.clone(), r.partition), r.start))
            .collect(),
        _ => BTreeMap::new(),
    }
}

/// What the broker says now, per topic.
pub(in crate::cli) struct Broker {
    pub(super) identity: BTreeMap<String, TopicIdentity>,
    /// `(log start, high watermark)` per partition.
    pub(super) watermarks: BTreeMap<(String, i32), (i64, i64)>,
    pub(super) source: KafkaSource,
}

pub(in crate::cli) fn ask_broker(
    brokers: &str,
    kafka: &BTreeMap<String, String>,
    topics: &[String],
) -> Result<Broker, CliError> {
    let source = KafkaSource::new(
        brokers,
        kafka,
        "sluice-reset",
        false,
        Duration::from_secs(30),
    )?;
    let mut identity = BTreeMap::new();
    let mut watermarks = BTreeMap::new();
    for topic in topics {
        let info = source.describe(topic)?;
        for p in &info.partitions {
            watermarks.insert((topic.clone(), *p), source.watermarks(topic, *p)?);
        }
        identity.insert(
            topic.clone(),
            TopicIdentity::new(info.id, info.partitions.len()),
        );
    }
    Ok(Broker {
        identity,
        watermarks,
        source,
    })
}

/// The positions after the reset: `to` for the partitions of `moving`
/// (every partition the broker reports for a recreated topic, which starts
/// at its log start unless `offsets:JSON` names it), the current position
/// for every other partition.
pub(in crate::cli) fn targets(
    to: &Target,
    broker: Option<&Broker>,
    moving: &[String],
    recreated: &BTreeMap<String, String>,
    current: &BTreeMap<(String, i32), i64>,
) -> Result<BTreeMap<(String, i32), i64>, CliError> {
    // Partitions of another topic, or of a topic that was not recreated
    // and is not moving, keep their position.
    let mut out: BTreeMap<(String, i32), i64> = current
        .iter()
        .filter(|((t, _), _)| !recreated.contains_key(t))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let partitions_of = |topic: &str| -> Vec<i32> {
        broker.map_or_else(Vec::new, |b| {
            b.watermarks
                .keys()
                .filter(|(t, _)| t == topic)
                .map(|(_, p)| *p)
                .collect()
        })
    };
    let low_of = |topic: &str, p: i32| -> i64 {
        broker
            .and_then(|b| b.watermarks.get(&(topic.to_string(), p)))
            .map_or(0, |(low, _)| *low)
    };
    for topic in recreated.keys() {
        for p in partitions_of(topic) {
            out.insert((topic.clone(), p), low_of(topic, p));
        }
    }
    if let Target::Offsets(json) = to {
        let parsed: BTreeMap<String, BTreeMap<String, i64>> = serde_json::from_str(json)
            .context("--to offsets:JSON expects {\"topic\":{\"partition\":offset}}")
            .code(ExitCode::Usage)?;
        for (topic, parts) in parsed {
            if !moving.contains(&topic) {
                return Err(anyhow!(
                    "topic `{topic}` is not among the topics this reset moves ({})",
                    moving.join(", ")
                ))
                .code(ExitCode::Usage);
            }
            for (p, o) in parts {
                let p: i32 = p
                    .parse()
                    .map_err(|_| anyhow!("partition `{p}` is not a number"))
                    .code(ExitCode::Usage)?;
                if !out.contains_key(&(topic.clone(), p)) {
                    let known: Vec<String> = out
                        .keys()
                        .filter(|(t, _)| *t == topic)
                        .map(|(_, p)| p.to_string())
                        .collect();
                    return Err(anyhow!(
                        "partition {p} of `{topic}` is not in this checkpoint (its partitions: {}); a partition the pipeline has not read yet starts at its earliest offset",
                        known.join(", ")
                    ))
                    .code(ExitCode::Usage);
                }
                if o < 0 {
                    return Err(anyhow!("offset {o} for {topic}/{p} is negative"))
                        .code(ExitCode::Usage);
                }
                if let Some((_, high)) = broker.and_then(|b| b.watermarks.get(&(topic.clone(), p)))
                    && o > *high
                {
                    return Err(anyhow!(
                        "offset {o} for {topic}/{p} is past its high watermark {high}: the pipeline would stop there (\"beyond the high watermark\")"
                    ))
                    .code(ExitCode::Usage);
                }
                out.insert((topic.clone(), p), o);
            }
        }
        return Ok(out);
    }
    let broker = broker
        .ok_or_else(|| anyhow!("--to {to} needs --brokers to look the offsets up"))
        .code(ExitCode::Usage)?;
    for topic in moving {
        let parts = partitions_of(topic);
        let found = match to {
            Target::Timestamp(ms) => Some(broker.source.offsets_for_timestamp(topic, &parts, *ms).map_err(|e| {
                anyhow!("{e}; this broker cannot answer timestamp lookups, reset with --to offsets:JSON instead")
            })?),
            _ => None,
        };
        for p in parts {
            let (low, high) = broker.watermarks[&(topic.clone(), p)];
            let o = match &found {
                Some(t) => t.get(&p).copied().unwrap_or(high),
                None if *to == Target::Earliest => low,
                None => high,
            };
            out.insert((topic.clone(), p), o);
        }
    }
    Ok(out)
}

/// The topics of `now` that are not the topics on record, each with why.
pub(super) fn recreated_topics(
    recorded: &BTreeMap<String, TopicIdentity>,
    now: &BTreeMap<String, TopicIdentity>,
) -> BTreeMap<String, String> {
    now.iter()
        .filter_map(|(t, now)| Some((t.clone(), recorded.get(t)?.changed(now)?)))
        .collect()
}
