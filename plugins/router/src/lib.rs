//! `router`: a sink stage that produces each record to a Kafka topic
//! chosen from its JSON value, through the host's `kafka` capability
//! (`kafka.send`, contract 0.2.4): `{"table": "orders", …}` goes to topic
//! `<route.prefix>orders`. Key, value and headers go out unchanged, so a
//! change stream is split into a topic per table (Maxwell's events carry
//! `table`; a Debezium envelope's is `source.table`, reached with
//! `route.field=source.table`).
//!
//! Settings (`--config`):
//! - `route.field`: the field that names the table, dotted for a nested
//!   one (default `table`);
//! - `route.prefix`: put before the field's value to make the topic name
//!   (default empty);
//! - `route.topic`: the topic of records the field cannot route (a
//!   tombstone, a value without the field); without it they are bad
//!   records, for the pipeline's error policy.
//!
//! Every topic must be named with `host run --output-topic` (once per
//! topic): the host refuses the others.

use serde::Deserialize;
use sluice_guest::json::{self, Object};
use sluice_guest::kafka::{self, OutputRecord};
use sluice_guest::{Config, Error, Sink, SinkRecord};

/// `--config route.*`.
#[derive(Deserialize)]
struct Settings {
    #[serde(rename = "route.field", default = "default_field")]
    field: String,
    #[serde(rename = "route.prefix", default)]
    prefix: String,
    #[serde(rename = "route.topic", default)]
    topic: Option<String>,
}

fn default_field() -> String {
    "table".into()
}

/// The routing sink stage.
pub struct Router {
    /// `route.field` split at the dots.
    path: Vec<String>,
    prefix: String,
    fallback: Option<String>,
}

impl Router {
    /// The topic of `record`.
    fn topic(&self, record: &SinkRecord<'_>) -> Result<String, Error> {
        let routed = match record.record.value {
            Some(v) => self.field(v)?,
            None => None,
        };
        match (routed, &self.fallback) {
            (Some(name), _) => Ok(format!("{}{name}", self.prefix)),
            (None, Some(t)) => Ok(t.clone()),
            (None, None) if record.record.value.is_none() => Err(Error::bad_record(
                "a tombstone has no field to route by (set route.topic for them)",
            )),
            (None, None) => Err(Error::bad_record(format!(
                "no string field {:?} to route by (set route.topic for such records)",
                self.path.join(".")
            ))),
        }
    }

    /// The routing field's string value in `value`, if it has one.
    fn field(&self, value: &[u8]) -> Result<Option<String>, Error> {
        let mut object: Object<'_> = json::from_slice(value)?;
        let Some((last, parents)) = self.path.split_last() else {
            return Ok(None);
        };
        for p in parents {
            match object.get(p) {
                Some(raw) if !json::is_null(raw) => {
                    object = json::from_slice(raw.get().as_bytes())?
                }
                _ => return Ok(None),
            }
        }
        Ok(object
            .get(last)
            .and_then(|raw| json::str_value(raw).ok())
            .map(|s| s.into_owned()))
    }
}

impl Sink for Router {
    fn new(config: &Config) -> Result<Self, Error> {
        let s: Settings = config.parse()?;
        if s.field.split('.').any(str::is_empty) {
            return Err(Error::fatal(format!(
                "route.field {:?} is not a dotted field name",
                s.field
            )));
        }
        Ok(Router {
            path: s.field.split('.').map(String::from).collect(),
            prefix: s.prefix,
            fallback: s.topic,
        })
    }

    fn write(&mut self, record: &SinkRecord<'_>) -> Result<(), Error> {
        self.write_chunk(std::slice::from_ref(record))
            .map_err(|(_, e)| e)
    }

    fn write_chunk(&mut self, records: &[SinkRecord<'_>]) -> Result<(), (usize, Error)> {
        let mut out = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            let topic = self.topic(r).map_err(|e| (i, e))?;
            let mut o = OutputRecord::new(topic, r.idempotency_key)
                .key(r.record.key)
                .value(r.record.value);
            for h in &r.record.headers {
                o = o.header(h.key, h.value);
            }
            out.push(o);
        }
        // A refusal (a topic the pipeline does not name) concerns the
        // whole call, not one record: it stops the pipeline.
        kafka::send(out).map_err(|e| (0, e))
    }
}

sluice_guest::export!(sink: Router);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_guest::Record;

    fn router(pairs: &[(&str, &str)]) -> Router {
        Router::new(&Config::from_pairs(pairs.iter().copied())).unwrap()
    }

    fn topic_of(r: &Router, value: Option<&[u8]>) -> Result<String, Error> {
        let mut rec = Record::with_value("in", 0, 7, b"");
        rec.value = value;
        r.topic(&SinkRecord {
            idempotency_key: "in/0/7",
            record: rec,
        })
    }

    #[test]
    fn routes_by_a_top_level_or_nested_field_with_the_prefix() {
        let r = router(&[("route.prefix", "cdc.")]);
        assert_eq!(
            topic_of(&r, Some(br#"{"database":"shop","table":"orders"}"#)).unwrap(),
            "cdc.orders"
        );
        let r = router(&[("route.field", "source.table")]);
        assert_eq!(
            topic_of(
                &r,
                Some(
                    br#"{"before":null,"source":{"db":"inventory","table":"customers"},"op":"c"}"#
                )
            )
            .unwrap(),
            "customers"
        );
    }

    #[test]
    fn unroutable_records_go_to_the_fallback_or_are_bad_records() {
        let r = router(&[]);
        for v in [
            Some(&br#"{"type":"insert"}"#[..]),
            Some(br#"{"table":7}"#),
            None,
        ] {
            assert!(matches!(topic_of(&r, v), Err(Error::BadRecord(_))), "{v:?}");
        }
        assert!(matches!(
            topic_of(&r, Some(b"not json")),
            Err(Error::BadRecord(_))
        ));
        let r = router(&[("route.topic", "other")]);
        assert_eq!(topic_of(&r, None).unwrap(), "other");
        assert_eq!(topic_of(&r, Some(br#"{"table":null}"#)).unwrap(), "other");
        assert!(Router::new(&Config::from_pairs([("route.field", "a..b")])).is_err());
    }
}
