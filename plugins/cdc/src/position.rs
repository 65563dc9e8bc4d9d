//! The source position of a change, as text that sorts in source order.
//!
//! Each destination row keeps the position of the last change applied to
//! it (`position_column`); a change whose position sorts before the row's
//! is not applied, so a replay (a `checkpoint reset` back in time, a
//! re-snapshot, a change routed through two partitions) cannot make a row
//! older. Equal positions are changes of one transaction (Maxwell gives
//! every row of a transaction its position): they apply in stream order.
//!
//! Forms, fixed width so that text order is source order:
//! - `mysql:FFFFFFFFFF:PPPPPPPPPPPPPPPPPPPP:RRRRRRRRRR`: binlog file number
//!   (the digits after the file name's last `.`), position in the file,
//!   row within the event (Debezium `source.row`, Maxwell `xoffset`; 0
//!   when absent). From Maxwell's `position` (`output_binlog_position`,
//!   <https://maxwells-daemon.io/dataformat/>) or the Debezium MySQL
//!   connector's `source.file`/`source.pos`/`source.row`.
//! - `pg:LLLLLLLLLLLLLLLLLLLL`: the Debezium PostgreSQL connector's
//!   `source.lsn`.
//! - `mssql:COMMIT:CHANGE`: the Debezium SQL Server connector's
//!   `source.commit_lsn` and `source.change_lsn` (fixed-width hex already).
//! - `kafka:PPPPPPPPPP:OOOOOOOOOOOOOOOOOOOO`: the Kafka partition and
//!   offset, when the event carries no source position. Only changes of
//!   one partition compare meaningfully then.
//!
//! **The ordering rule** ([`compare`]): two positions of one form compare
//! in source order — the binlog file, position and row; the LSN; the
//! commit and change LSNs; for `kafka:` positions, the offsets of one
//! partition. A change older than its row's position is not applied and
//! is reported (the sink logs it with the table, key and both
//! positions); an equal one applies (one transaction, in stream order).
//! Two positions that cannot be compared — forms that differ (Maxwell's
//! `bootstrap-insert` rows carry no binlog position, so they fall back
//! to the Kafka offset while the live changes around them do not; an
//! event whose producer left out `output_binlog_position`), or Kafka
//! offsets of two partitions — leave the order to the stream: the later
//! change applies, and the sink logs a warning naming both positions.
//! No change is dropped without a line.

use std::cmp::Ordering;

/// A binlog position: `file` such as `mysql-bin.000003`, `pos` in it, and
/// the row within the event.
///
/// # Errors
/// When the file name has no number after its last `.`.
pub fn mysql(file: &str, pos: u64, row: u64) -> Result<String, String> {
    let number = file
        .rsplit_once('.')
        .and_then(|(_, n)| n.parse::<u64>().ok())
        .ok_or_else(|| format!("binlog file `{file}` has no number after its last `.`"))?;
    // Fixed widths keep text order source order; wider numbers would not.
    if number > WIDE_10 || row > WIDE_10 {
        return Err(format!(
            "binlog file `{file}` or row {row} has more than 10 digits: positions this wide cannot be ordered"
        ));
    }
    Ok(format!("mysql:{number:010}:{pos:020}:{row:010}"))
}

/// The largest number of 10 digits.
const WIDE_10: u64 = 9_999_999_999;

/// Maxwell's `position` field, `FILE:POS` (e.g. `master.000006:800911`),
/// with its `xoffset`.
///
/// # Errors
/// When `position` is not `FILE:POS`.
pub fn maxwell(position: &str, xoffset: u64) -> Result<String, String> {
    let (file, pos) = position
        .rsplit_once(':')
        .and_then(|(f, p)| Some((f, p.parse::<u64>().ok()?)))
        .ok_or_else(|| format!("Maxwell position `{position}` is not FILE:POS"))?;
    mysql(file, pos, xoffset)
}

/// A PostgreSQL log sequence number (Debezium `source.lsn`).
pub fn pg(lsn: u64) -> String {
    format!("pg:{lsn:020}")
}

/// SQL Server's commit and change LSNs (Debezium `source.commit_lsn`,
/// `source.change_lsn`, e.g. `00000027:00000758:0003`).
pub fn mssql(commit_lsn: &str, change_lsn: &str) -> String {
    format!("mssql:{commit_lsn}:{change_lsn}")
}

/// The Kafka coordinates, when the event has no source position.
pub fn kafka(partition: i32, offset: i64) -> String {
    format!("kafka:{partition:010}:{offset:020}")
}

/// The part of `pos` two positions must share to be compared: the form
/// (`mysql:`, `pg:`, `mssql:`), and for `kafka:` the partition too.
pub fn domain(pos: &str) -> &str {
    if pos.starts_with("kafka:") {
        return pos.get(..KAFKA_DOMAIN).unwrap_or(pos);
    }
    match pos.find(':') {
        Some(i) => &pos[..=i],
        None => pos,
    }
}

/// Length of `kafka:PPPPPPPPPP:`, the domain of a Kafka position.
pub const KAFKA_DOMAIN: usize = 17;

/// The order of two positions by [the rule above](self); `None` when
/// they cannot be compared.
pub fn compare(a: &str, b: &str) -> Option<Ordering> {
    (domain(a) == domain(b)).then(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_positions_of_one_domain_compare() {
        let (m1, m2) = (
            maxwell("b.000001:10", 0).unwrap(),
            maxwell("b.000002:4", 0).unwrap(),
        );
        assert_eq!(compare(&m1, &m2), Some(Ordering::Less));
        assert_eq!(compare(&m2, &m2), Some(Ordering::Equal));
        assert_eq!(compare(&pg(10), &pg(9)), Some(Ordering::Greater));
        assert_eq!(compare(&kafka(1, 5), &kafka(1, 50)), Some(Ordering::Less));
        assert_eq!(compare(&kafka(1, 5), &kafka(2, 50)), None);
        assert_eq!(compare(&m1, &kafka(0, 1)), None);
        assert_eq!(compare(&pg(1), &mssql("a", "b")), None);
        assert_eq!(domain(&kafka(7, 1)), "kafka:0000000007:");
        assert_eq!(domain(&pg(1)), "pg:");
    }

    #[test]
    fn text_order_is_source_order() {
        let ordered = [
            maxwell("mysql-bin.000009:999999", 0).unwrap(),
            maxwell("mysql-bin.000010:4", 0).unwrap(),
            maxwell("mysql-bin.000010:120", 0).unwrap(),
            maxwell("mysql-bin.000010:120", 1).unwrap(),
            mysql("mysql-bin.000010", 120, 2).unwrap(),
        ];
        assert!(ordered.windows(2).all(|w| w[0] < w[1]), "{ordered:?}");
        assert!(pg(99) < pg(100));
        assert!(kafka(0, 99) < kafka(0, 100));
    }

    #[test]
    fn malformed_positions_are_named() {
        assert!(
            maxwell("mysql-bin.000010", 0)
                .unwrap_err()
                .contains("FILE:POS")
        );
        assert!(mysql("binlog", 4, 0).unwrap_err().contains("`binlog`"));
    }
}
