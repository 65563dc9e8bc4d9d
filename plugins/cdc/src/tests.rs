//! The map stage on Maxwell and Debezium events (natively, through the
//! SDK's packed encoding as in the component).

use sluice_guest::testing;
use sluice_guest::{Config, Record};

use crate::CdcMap;

fn config(extra: &[(&str, &str)]) -> Config {
    let mut pairs = vec![("route", "shop.*=*")];
    pairs.extend_from_slice(extra);
    Config::from_pairs(pairs)
}

/// Map (key, value) records; returns (outputs as "key => value", rejections).
fn run(cfg: &Config, records: &[(Option<&str>, Option<&str>)]) -> (Vec<String>, Vec<String>) {
    let records: Vec<Record<'_>> = records
        .iter()
        .enumerate()
        .map(|(i, (k, v))| Record {
            key: k.map(str::as_bytes),
            value: v.map(str::as_bytes),
            ..Record::with_value("cdc", 3, 40 + i as i64, b"")
        })
        .collect();
    let m = testing::map::<CdcMap>(cfg, &records).unwrap();
    let outputs = m
        .outputs
        .iter()
        .map(|o| {
            format!(
                "{} => {}",
                String::from_utf8_lossy(o.key.as_deref().unwrap_or(b"")),
                String::from_utf8_lossy(o.value.as_deref().unwrap_or(b""))
            )
        })
        .collect();
    (
        outputs,
        m.rejected
            .into_iter()
            .map(|(i, m)| format!("{i}: {m}"))
            .collect(),
    )
}

#[test]
fn maxwell_rows_become_changes_with_their_binlog_position() {
    let (out, rejected) = run(
        &config(&[]),
        &[
            (
                Some(r#"{"database":"shop","table":"company","pk.id":1}"#),
                Some(
                    r#"{"database":"shop","table":"company","type":"insert","xoffset":2,"position":"mysql-bin.000003:1234","data":{"id":1,"revenue":999999999999.999998,"founded":"0000-00-00"}}"#,
                ),
            ),
            (
                Some(r#"{"database":"shop","table":"company","pk.id":1}"#),
                Some(r#"{"database":"shop","table":"company","type":"delete","data":{"id":1}}"#),
            ),
            (
                None,
                Some(r#"{"database":"shop","table":"company","type":"bootstrap-start","data":{}}"#),
            ),
            (
                None,
                Some(
                    r#"{"database":"shop","type":"table-alter","sql":"ALTER TABLE company ADD x INT"}"#,
                ),
            ),
            (
                None,
                Some(r#"{"database":"hr","table":"emp","type":"insert","data":{"id":1}}"#),
            ),
        ],
    );
    assert_eq!(
        out,
        [
            r#"{"table":"company","key":{"id":1}} => {"op":"upsert","source":"shop.company","table":"company","pos":"mysql:0000000003:00000000000000001234:0000000002","key":{"id":1},"row":{"id":1,"revenue":999999999999.999998,"founded":"0000-00-00"}}"#,
            r#"{"table":"company","key":{"id":1}} => {"op":"delete","source":"shop.company","table":"company","pos":"kafka:0000000003:00000000000000000041","key":{"id":1}}"#,
        ]
    );
    assert!(rejected.is_empty(), "{rejected:?}");
}

const PRODUCT_SCHEMA: &str = r#"{"type":"struct","fields":[
 {"type":"struct","optional":true,"field":"before","fields":[{"type":"int32","field":"id"}]},
 {"type":"struct","optional":true,"field":"after","fields":[
   {"type":"int32","field":"id"},
   {"type":"bytes","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"6"},"field":"revenue"},
   {"type":"int32","name":"io.debezium.time.Date","field":"founded"}]},
 {"type":"struct","field":"source","fields":[]}]}"#;

/// A logical type the plugin does not know passes through as the
/// source's JSON (the destination column's checks then decide); a known
/// one whose value does not decode is a bad record naming the column.
#[test]
fn debezium_unknown_logical_types_pass_raw_and_undecodable_known_ones_are_bad_records() {
    let schema = r#"{"type":"struct","fields":[
 {"type":"struct","optional":true,"field":"after","fields":[
   {"type":"int32","field":"id"},
   {"type":"struct","name":"io.debezium.data.geometry.Point","field":"spot","fields":[]},
   {"type":"int32","name":"io.debezium.time.Date","field":"founded"}]}]}"#;
    let event = |after: &str| {
        format!(
            r#"{{"schema":{schema},"payload":{{"before":null,"after":{after},"source":{{"connector":"postgresql","db":"d","schema":"shop","table":"t","lsn":5}},"op":"c"}}}}"#
        )
    };
    let ok = event(r#"{"id":1,"spot":{"wkb":"AQE=","srid":4326},"founded":0}"#);
    let bad = event(r#"{"id":2,"spot":null,"founded":"soon"}"#);
    let (out, rejected) = run(
        &config(&[("format", "debezium")]),
        &[
            (Some(r#"{"id":1}"#), Some(&ok)),
            (Some(r#"{"id":2}"#), Some(&bad)),
        ],
    );
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(
        out[0].contains(r#""spot":{"wkb":"AQE=","srid":4326},"founded":"1970-01-01""#),
        "{}",
        out[0]
    );
    assert_eq!(
        rejected,
        ["1: column `founded`: io.debezium.time.Date value \"soon\" is not an integer"]
    );
}

#[test]
fn debezium_with_the_schema_decodes_precise_decimals_and_dates() {
    // 999999999999.999998 at scale 6 = unscaled 0x0DE0B6B3A763FFFE.
    let value = format!(
        r#"{{"schema":{PRODUCT_SCHEMA},"payload":{{"before":null,"after":{{"id":7,"revenue":"DeC2s6dj//4=","founded":19000}},"source":{{"connector":"postgresql","db":"inventory","schema":"shop","table":"company","lsn":24023128}},"op":"r","ts_ms":1}}}}"#
    );
    let key = r#"{"schema":{"type":"struct","fields":[{"type":"int32","field":"id"}]},"payload":{"id":7}}"#;
    let (out, rejected) = run(
        &config(&[("format", "debezium")]),
        &[(Some(key), Some(&value))],
    );
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(
        out,
        [
            r#"{"table":"company","key":{"id":7}} => {"op":"upsert","source":"shop.company","table":"company","pos":"pg:00000000000024023128","key":{"id":7},"row":{"id":7,"revenue":"999999999999.999998","founded":"2022-01-08"}}"#
        ]
    );
}

#[test]
fn debezium_deletes_tombstones_and_truncates() {
    let mysql = |op: &str, before: &str, after: &str| {
        format!(
            r#"{{"before":{before},"after":{after},"source":{{"connector":"mysql","db":"shop","table":"company","file":"mysql-bin.000004","pos":99,"row":1}},"op":"{op}"}}"#
        )
    };
    let del = mysql("d", r#"{"id":5,"name":"x"}"#, "null");
    let upd = mysql("u", r#"{"id":5}"#, r#"{"id":5,"name":"y"}"#);
    let trunc = mysql("t", "null", "null");
    let records = [
        (Some(r#"{"id":5}"#), Some(upd.as_str())),
        (Some(r#"{"id":5}"#), Some(del.as_str())),
        (Some(r#"{"id":5}"#), None),
        (None, Some(trunc.as_str())),
    ];
    let (out, rejected) = run(&config(&[]), &records);
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(
        out[0].contains(r#""op":"upsert""#)
            && out[0].contains(r#""pos":"mysql:0000000004:00000000000000000099:0000000001""#)
    );
    assert!(out[1].ends_with(r#""op":"delete","source":"shop.company","table":"company","pos":"mysql:0000000004:00000000000000000099:0000000001","key":{"id":5}}"#), "{}", out[1]);
    let (out, _) = run(&config(&[("truncate", "apply")]), &records);
    assert_eq!(out.len(), 3);
    assert!(
        out[2].contains(r#""op":"truncate""#) && out[2].contains(r#""key":{}"#),
        "{}",
        out[2]
    );
}

#[test]
fn key_columns_name_the_key_when_the_kafka_key_does_not() {
    let v = r#"{"database":"shop","table":"lines","type":"insert","data":{"order_id":3,"line":2,"qty":1}}"#;
    let (out, rejected) = run(
        &config(&[("key_columns", "lines=order_id+line")]),
        &[(None, Some(v))],
    );
    assert!(rejected.is_empty(), "{rejected:?}");
    assert!(
        out[0].starts_with(r#"{"table":"lines","key":{"order_id":3,"line":2}}"#),
        "{}",
        out[0]
    );
    let (out, rejected) = run(&config(&[]), &[(None, Some(v))]);
    assert!(out.is_empty());
    assert!(
        rejected[0].contains("set key_columns=lines=col1+col2"),
        "{rejected:?}"
    );
}

#[test]
fn malformed_events_are_bad_records_naming_what_is_wrong() {
    let (out, rejected) = run(
        &config(&[]),
        &[
            (None, Some("{not json")),
            (None, Some(r#"{"hello":1}"#)),
            (
                None,
                Some(r#"{"database":"shop","table":"t","type":"insert","data":[1]}"#),
            ),
            (
                None,
                Some(
                    r#"{"database":"shop","table":"t","type":"insert","position":"nowhere","data":{"id":1}}"#,
                ),
            ),
            (
                Some(r#"{"id":1}"#),
                Some(r#"{"op":"x","source":{"db":"shop","table":"t"}}"#),
            ),
            (
                Some(r#"{"id":1}"#),
                Some(r#"{"op":"c","after":null,"source":{"db":"shop","table":"t"}}"#),
            ),
            (
                Some("[1]"),
                Some(r#"{"op":"c","after":{"id":1},"source":{"db":"shop","table":"t"}}"#),
            ),
        ],
    );
    assert!(out.is_empty(), "{out:?}");
    let want = [
        "0: not a JSON object",
        "1: neither a Maxwell event",
        "2: `data` is an array, not an object",
        "3: Maxwell position `nowhere` is not FILE:POS",
        "4: unknown Debezium op `x`",
        "5: Debezium upsert without `after`",
        "6: the Kafka key is not a JSON object",
    ];
    assert_eq!(rejected.len(), want.len(), "{rejected:?}");
    for (got, want) in rejected.iter().zip(want) {
        assert!(got.starts_with(want), "{got} vs {want}");
    }
}

#[test]
fn settings_are_checked_at_start() {
    for (pairs, says) in [
        (vec![], "needs `route`"),
        (
            vec![("route", "shop.*"), ("format", "canal")],
            "format=canal: expected one of auto, maxwell, debezium",
        ),
        (
            vec![("route", "shop.*"), ("truncate", "yes")],
            "truncate=yes",
        ),
        (
            vec![("route", "shop.*"), ("key_columns", "t")],
            "expected DEST=col1+col2",
        ),
        (
            vec![("route", "shop.*"), ("position_column", "a-b")],
            "position_column",
        ),
    ] {
        let e = crate::Settings::parse(&Config::from_pairs(pairs.clone()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{pairs:?}: {e}");
    }
}

/// `key_columns` finds its columns in the row ignoring case, as MySQL
/// column names do (Maxwell writes `id` for a column declared `ID`).
#[test]
fn key_columns_match_row_columns_ignoring_case() {
    let v = r#"{"database":"shop","table":"lines","type":"insert","data":{"id":3,"qty":1}}"#;
    let (out, rejected) = run(&config(&[("key_columns", "lines=ID")]), &[(None, Some(v))]);
    assert!(rejected.is_empty(), "{rejected:?}");
    assert!(
        out[0].starts_with(r#"{"table":"lines","key":{"ID":3}}"#),
        "{}",
        out[0]
    );
    // Two row columns that differ only in case: ambiguous, so neither.
    let v = r#"{"database":"shop","table":"lines","type":"insert","data":{"id":3,"Id":4}}"#;
    let (_, rejected) = run(&config(&[("key_columns", "lines=ID")]), &[(None, Some(v))]);
    assert!(
        rejected[0].contains("key column ID has no value"),
        "{rejected:?}"
    );
}

/// An update that changes the primary key carries the old key, from
/// Maxwell's `old` (changed columns only) or Debezium's `before`; an
/// update that keeps its key, or whose `before` lacks the key, does not.
#[test]
fn updates_that_change_the_key_carry_the_old_key() {
    let maxwell = |key: &str, data: &str, old: &str| {
        (
            Some(format!(
                r#"{{"database":"shop","table":"t","pk.id":{key}}}"#
            )),
            format!(
                r#"{{"database":"shop","table":"t","type":"update","position":"b.000001:10","data":{data},"old":{old}}}"#
            ),
        )
    };
    let debezium = |before: &str, after: &str| {
        format!(
            r#"{{"before":{before},"after":{after},"source":{{"connector":"mysql","db":"shop","table":"t","file":"b.000001","pos":20}},"op":"u"}}"#
        )
    };
    let events = [
        maxwell("11", r#"{"id":11,"n":"a"}"#, r#"{"id":10}"#),
        maxwell("11", r#"{"id":11,"n":"b"}"#, r#"{"n":"a"}"#),
        (
            Some(r#"{"id":21}"#.to_string()),
            debezium(r#"{"id":20,"n":"a"}"#, r#"{"id":21,"n":"a"}"#),
        ),
        (
            Some(r#"{"id":21}"#.to_string()),
            debezium(r#"{"id":21,"n":"a"}"#, r#"{"id":21,"n":"b"}"#),
        ),
        (
            Some(r#"{"id":21}"#.to_string()),
            debezium("null", r#"{"id":21,"n":"c"}"#),
        ),
    ];
    let records: Vec<(Option<&str>, Option<&str>)> = events
        .iter()
        .map(|(k, v)| (k.as_deref(), Some(v.as_str())))
        .collect();
    let (out, rejected) = run(&config(&[]), &records);
    assert!(rejected.is_empty(), "{rejected:?}");
    let old_keys: Vec<Option<&str>> = out
        .iter()
        .map(|o| {
            o.split_once(r#""old_key":"#)
                .map(|(_, k)| k.trim_end_matches('}'))
        })
        .collect();
    assert_eq!(
        old_keys,
        [Some(r#"{"id":10"#), None, Some(r#"{"id":20"#), None, None],
        "{out:#?}"
    );
}

/// Maxwell's `kafka_key_format=array` key (`["db","table",[{"id":1}]]`,
/// zendesk/maxwell `RowIdentity.toKeyJson`) carries the key as the hash
/// format's `pk.*` does.
#[test]
fn maxwell_array_keys_carry_the_primary_key() {
    let v = r#"{"database":"shop","table":"lines","type":"insert","data":{"order_id":3,"line":2,"qty":1}}"#;
    let (out, rejected) = run(
        &config(&[]),
        &[(
            Some(r#"["shop","lines",[{"order_id":3},{"line":2}]]"#),
            Some(v),
        )],
    );
    assert!(rejected.is_empty(), "{rejected:?}");
    assert!(
        out[0].starts_with(r#"{"table":"lines","key":{"order_id":3,"line":2}}"#),
        "{}",
        out[0]
    );
}

/// Debezium events without a row change are filtered, as Maxwell's DDL
/// and heartbeats are: heartbeats (with and without the schema wrapper),
/// the schema change topic's events and transaction boundaries; any other
/// event without `op` is still a bad record.
#[test]
fn debezium_heartbeats_schema_changes_and_transaction_boundaries_are_skipped() {
    let skipped = [
        r#"{"schema":{"type":"struct","name":"io.debezium.connector.common.Heartbeat","fields":[{"type":"int64","field":"ts_ms"}]},"payload":{"ts_ms":1700000000000}}"#,
        r#"{"ts_ms":1700000000000}"#,
        r#"{"source":{"connector":"mysql","db":"inventory","table":"customers","file":"mysql-bin.000003","pos":154},"databaseName":"inventory","ddl":"ALTER TABLE customers ADD COLUMN x INT","tableChanges":[]}"#,
        r#"{"status":"BEGIN","id":"571:53195829","event_count":null,"data_collections":null}"#,
    ];
    for format in ["auto", "debezium"] {
        let records: Vec<(Option<&str>, Option<&str>)> =
            skipped.iter().map(|v| (None, Some(*v))).collect();
        let cfg = config(&[("format", format)]);
        let (out, rejected) = run(&cfg, &records);
        if format == "debezium" {
            assert!(
                out.is_empty() && rejected.is_empty(),
                "{format}: {out:?} {rejected:?}"
            );
        } else {
            // A transaction boundary has neither Debezium's nor Maxwell's
            // shape: under format=auto it is a bad record that says so.
            assert!(out.is_empty(), "{out:?}");
            assert_eq!(rejected.len(), 1, "{rejected:?}");
            assert!(
                rejected[0].starts_with("3: neither a Maxwell event"),
                "{rejected:?}"
            );
        }
    }
    let (_, rejected) = run(
        &config(&[("format", "debezium")]),
        &[(
            None,
            Some(r#"{"source":{"table":"t","db":"d"},"after":{}}"#),
        )],
    );
    assert!(
        rejected[0].contains("Debezium event without `op`"),
        "{rejected:?}"
    );
}
