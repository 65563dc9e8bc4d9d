//! The set of offsets of one partition that a sink has applied, as its
//! `sluice_progress` row records it: every offset below `end_offset`
//! except the `holes`.
//!
//! A hole is a range the pipeline jumped over without applying it: a
//! `host checkpoint reset` forward, records that retention deleted before
//! they were read, or the offsets below a partition's first write (a
//! pipeline that started at `latest`). Moving back into a hole later
//! applies it (once); moving back into what was applied skips it as
//! already applied.
//!
//! `holes` is stored as JSON text, `[[start, end], …]` (half-open, sorted,
//! disjoint, every hole ending below `end_offset`); `[]` when there are
//! none, which is the column's default for rows written before holes were
//! recorded.

use std::ops::Range;

/// What a progress row says of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AppliedSet {
    /// `None` when the partition has no row yet: nothing applied.
    end: Option<i64>,
    /// Ranges below `end` that were not applied.
    holes: Vec<Range<i64>>,
}

impl AppliedSet {
    /// Nothing applied (no progress row).
    pub fn empty() -> Self {
        Self::default()
    }

    /// Read a row's `end_offset` and `holes` text.
    ///
    /// # Errors
    /// `holes` is not a JSON list of `[start, end]` pairs, sorted, disjoint,
    /// non-empty and below `end`.
    pub fn from_row(end: i64, holes: &str) -> Result<Self, String> {
        let pairs: Vec<(i64, i64)> = serde_json::from_str(holes)
            .map_err(|e| format!("holes `{holes}` is not a list of [start, end] pairs: {e}"))?;
        let mut prev = i64::MIN;
        let mut out = Vec::with_capacity(pairs.len());
        for (s, e) in pairs {
            if s < prev || s >= e || e > end {
                return Err(format!(
                    "holes `{holes}` are not sorted, disjoint, non-empty ranges below end offset {end}"
                ));
            }
            prev = e;
            out.push(s..e);
        }
        Ok(AppliedSet {
            end: Some(end),
            holes: out,
        })
    }

    /// A row from parts already known to be valid (sorted, disjoint,
    /// non-empty holes below `end`).
    pub(crate) fn from_parts(end: i64, holes: Vec<Range<i64>>) -> Self {
        AppliedSet {
            end: Some(end),
            holes,
        }
    }

    /// The row's `end_offset` (`None`: no row).
    pub fn end(&self) -> Option<i64> {
        self.end
    }

    /// The `holes` column's text.
    pub fn holes_text(&self) -> String {
        let pairs: Vec<[i64; 2]> = self.holes.iter().map(|h| [h.start, h.end]).collect();
        serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".into())
    }

    /// The ranges below the end that were not applied.
    pub fn holes(&self) -> &[Range<i64>] {
        &self.holes
    }

    fn hole_at(&self, o: i64) -> Option<&Range<i64>> {
        let i = self.holes.partition_point(|h| h.end <= o);
        self.holes.get(i).filter(|h| h.start <= o)
    }

    /// Is offset `o` applied?
    pub fn contains(&self, o: i64) -> bool {
        matches!(self.end, Some(end) if o < end) && self.hole_at(o).is_none()
    }

    /// The offsets of `range` not applied, as sorted, disjoint, non-empty
    /// ranges (empty: all of `range` is applied).
    pub fn missing(&self, range: &Range<i64>) -> Vec<Range<i64>> {
        let mut out: Vec<Range<i64>> = Vec::new();
        let Some(end) = self.end else {
            if !range.is_empty() {
                out.push(range.clone());
            }
            return out;
        };
        let first = self.holes.partition_point(|h| h.end <= range.start);
        for h in &self.holes[first..] {
            if h.start >= range.end {
                break;
            }
            let piece = h.start.max(range.start)..h.end.min(range.end);
            if !piece.is_empty() {
                out.push(piece);
            }
        }
        // Past the end: its own piece even when a hole ends at `end`, so
        // each piece can be recorded on its own.
        let past = end.max(range.start)..range.end;
        if !past.is_empty() {
            out.push(past);
        }
        out
    }

    /// Mark `written` applied. Offsets skipped between the old end and
    /// `written.start` become a hole.
    ///
    /// # Errors
    /// Part of `written` is already applied (a caller bug: record only
    /// ranges [`AppliedSet::missing`] returned).
    pub fn record(&mut self, written: Range<i64>) -> Result<(), String> {
        if written.is_empty() {
            return Ok(());
        }
        let Some(end) = self.end else {
            // The first write of a partition: what lies below it (offsets
            // start at 0) was not applied either.
            if written.start > 0 {
                self.holes.push(0..written.start);
            }
            self.end = Some(written.end);
            return Ok(());
        };
        if written.start >= end {
            if written.start > end {
                match self.holes.last_mut() {
                    // A hole that reaches the end (possible in a stored row)
                    // grows rather than getting a neighbour.
                    Some(last) if last.end == end => last.end = written.start,
                    _ => self.holes.push(end..written.start),
                }
            }
            self.end = Some(written.end);
            return Ok(());
        }
        let i = self.holes.partition_point(|h| h.end <= written.start);
        match self.holes.get(i).cloned() {
            Some(h) if h.start <= written.start && written.end <= h.end => {
                let mut pieces = Vec::with_capacity(2);
                if h.start < written.start {
                    pieces.push(h.start..written.start);
                }
                if written.end < h.end {
                    pieces.push(written.end..h.end);
                }
                self.holes.splice(i..=i, pieces);
                Ok(())
            }
            _ => Err(format!(
                "offsets [{}, {}) are already applied in part (applied below {end} except {:?})",
                written.start, written.end, self.holes
            )),
        }
    }
}

/// The group store reads what was applied through the driver, which
/// owns `sluice_progress` (the store stays below the sink).
impl crate::checkpoint::AppliedProgress for super::SinkDriver {
    fn applied_on(
        &self,
        b: &mut dyn crate::capability::sql::Backend,
        query_id: &str,
        topic: &str,
        partition: i32,
    ) -> Result<Option<(i64, crate::checkpoint::Epoch)>, crate::capability::sql::DbError> {
        self.applied_end_and_epoch_on(b, query_id, topic, partition)
    }

    fn start_at(
        &self,
        query_id: &str,
        topic: &str,
        partition: i32,
        epoch: crate::checkpoint::Epoch,
        at: i64,
    ) -> Result<(), crate::checkpoint::group::GroupError> {
        super::SinkDriver::start_at(self, query_id, topic, partition, epoch, at).map_err(
            |e| match e {
                super::SinkError::Group(e) => e,
                other => crate::checkpoint::group::GroupError::Db {
                    group: query_id.to_string(),
                    during: "recording where a partition starts",
                    error: crate::capability::sql::DbError {
                        message: other.to_string(),
                        code: "sluice".into(),
                    },
                },
            },
        )
    }

    fn record_applied_on(
        &self,
        b: &mut dyn crate::capability::sql::Backend,
        at: (&str, &str, i32),
        epoch: crate::checkpoint::Epoch,
        range: Range<i64>,
        batch: u64,
    ) -> Result<bool, crate::capability::sql::DbError> {
        super::SinkDriver::record_applied_on(self, b, at, epoch, range, batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(end: i64, holes: &[(i64, i64)]) -> AppliedSet {
        AppliedSet {
            end: Some(end),
            holes: holes.iter().map(|&(s, e)| s..e).collect(),
        }
    }

    #[test]
    fn rows_round_trip_and_bad_holes_are_refused() {
        let s = set(100, &[(10, 20), (30, 40)]);
        assert_eq!(s.holes_text(), "[[10,20],[30,40]]");
        assert_eq!(AppliedSet::from_row(100, &s.holes_text()).unwrap(), s);
        assert_eq!(AppliedSet::from_row(5, "[]").unwrap(), set(5, &[]));
        for bad in ["x", "[[3,1]]", "[[1,5],[4,8]]", "[[1,200]]", "[[5,5]]"] {
            assert!(AppliedSet::from_row(100, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn missing_offsets_of_ranges_around_holes() {
        let none = AppliedSet::empty();
        assert_eq!(none.missing(&(0..10)), vec![0..10]);
        assert_eq!(none.missing(&(5..5)), vec![]);
        // Applied: [0, 10), [20, 30), [40, 50).
        let s = set(50, &[(10, 20), (30, 40)]);
        assert_eq!(s.missing(&(0..10)), vec![]);
        assert_eq!(s.missing(&(0..30)), vec![10..20]);
        assert_eq!(s.missing(&(10..20)), vec![10..20]);
        assert_eq!(s.missing(&(12..18)), vec![12..18]);
        assert_eq!(s.missing(&(5..20)), vec![10..20]);
        assert_eq!(s.missing(&(15..25)), vec![15..20]);
        assert_eq!(s.missing(&(0..60)), vec![10..20, 30..40, 50..60]);
        assert_eq!(s.missing(&(40..50)), vec![]);
        assert_eq!(s.missing(&(45..60)), vec![50..60]);
        assert_eq!(s.missing(&(70..80)), vec![70..80]);
        // A hole that ends at the end stays its own piece, and each piece
        // can be recorded.
        let mut t = AppliedSet::from_row(50, "[[40,50]]").unwrap();
        assert_eq!(t.missing(&(30..60)), vec![40..50, 50..60]);
        for piece in t.missing(&(30..60)) {
            t.record(piece).unwrap();
        }
        assert_eq!(t, set(60, &[]));
        assert!(s.contains(0) && !s.contains(10) && s.contains(20) && !s.contains(50));
    }

    #[test]
    fn recording_forward_jumps_and_filling_holes() {
        let mut first = AppliedSet::empty();
        first.record(40..50).unwrap();
        assert_eq!(first, set(50, &[(0, 40)]));
        // A stored hole reaching the end grows instead of a neighbour.
        let mut grown = AppliedSet::from_row(50, "[[40,50]]").unwrap();
        grown.record(55..60).unwrap();
        assert_eq!(grown, set(60, &[(40, 55)]));
        let mut s = AppliedSet::empty();
        s.record(0..100).unwrap();
        // A reset forward to 500: [100, 500) becomes a hole.
        s.record(500..600).unwrap();
        assert_eq!(s, set(600, &[(100, 500)]));
        // Back to 100: filled in parts.
        s.record(100..200).unwrap();
        assert_eq!(s, set(600, &[(200, 500)]));
        s.record(300..400).unwrap();
        assert_eq!(s, set(600, &[(200, 300), (400, 500)]));
        s.record(200..300).unwrap();
        s.record(400..500).unwrap();
        assert_eq!(s, set(600, &[]));
        assert!(s.record(550..650).is_err());
        assert!(s.record(150..160).is_err());
        assert_eq!(s, set(600, &[]));
        s.record(600..600).unwrap();
        assert_eq!(s, set(600, &[]));
    }
}
