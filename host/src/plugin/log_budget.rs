//! The log allowance of a plugin instance: how many lines of the host's
//! log its `log` import may still write, per call and per second, and the
//! one line that reports what was dropped.

use std::time::{Duration, Instant};

use super::{LOG_LINE_BYTES, LOG_LINES_PER_CALL, LOG_LINES_PER_SECOND};

/// What a plugin instance may still write into the host's log: in the
/// current call [`LOG_LINES_PER_CALL`] lines, and in the current second
/// [`LOG_LINES_PER_SECOND`], of at most [`LOG_LINE_BYTES`] bytes each; the
/// rest are counted and reported in one line at most once a second (and
/// when the instance goes). One budget per [`super::Instance`], kept over
/// the fresh stores that follow traps.
#[derive(Debug)]
pub(crate) struct LogBudget {
    plugin: String,
    used: u32,
    /// Start of the current second and the lines written in it.
    second: Option<(Instant, u32)>,
    /// Dropped since the last report, and when that was.
    dropped: u64,
    reported: Option<Instant>,
}

/// A [`LogBudget`] shared by an instance and its stores.
pub(crate) type SharedLogBudget = std::sync::Arc<std::sync::Mutex<LogBudget>>;

impl LogBudget {
    /// A fresh budget for `plugin` (its short digest, as logged).
    pub(crate) fn shared(plugin: &str) -> SharedLogBudget {
        std::sync::Arc::new(std::sync::Mutex::new(LogBudget {
            plugin: plugin.to_string(),
            used: 0,
            second: None,
            dropped: 0,
            reported: None,
        }))
    }

    /// `line` (cut to the length limit) if it may still be logged at `now`.
    pub(crate) fn admit<'a>(&mut self, line: &'a str, now: Instant) -> Option<&'a str> {
        let second = match self.second {
            Some((start, n)) if now.duration_since(start) < Duration::from_secs(1) => (start, n),
            _ => (now, 0),
        };
        if self.used >= LOG_LINES_PER_CALL || second.1 >= LOG_LINES_PER_SECOND {
            self.second = Some(second);
            self.dropped += 1;
            return None;
        }
        self.used += 1;
        self.second = Some((second.0, second.1 + 1));
        let mut end = line.len().min(LOG_LINE_BYTES);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        Some(&line[..end])
    }

    /// End of a call at `now`: the next call's count starts (the second's
    /// goes on); dropped lines are reported if a second has passed since
    /// the last report. Returns the count reported, if any.
    pub(crate) fn end_call(&mut self, now: Instant) -> Option<u64> {
        self.used = 0;
        let due = self
            .reported
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1));
        if self.dropped == 0 || !due {
            return None;
        }
        self.report();
        self.reported = Some(now);
        Some(std::mem::take(&mut self.dropped))
    }

    fn report(&self) {
        if self.dropped > 0 {
            tracing::warn!(
                plugin = self.plugin.as_str(),
                dropped = self.dropped,
                "{} plugin log lines dropped (at most {LOG_LINES_PER_CALL} lines per call and {LOG_LINES_PER_SECOND} per second, of {LOG_LINE_BYTES} bytes)",
                self.dropped
            );
        }
    }
}

impl Drop for LogBudget {
    fn drop(&mut self) {
        self.report();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_capped_per_call_and_per_second_and_drops_reported_once_a_second() {
        let shared = LogBudget::shared("p");
        let mut b = shared.lock().unwrap();
        let t0 = Instant::now();
        let kept = (0..300).filter(|_| b.admit("x", t0).is_some()).count();
        assert_eq!(kept, LOG_LINES_PER_CALL as usize);
        assert_eq!(b.end_call(t0), Some(100));
        // Many short calls in the same second share the per-second cap,
        // and their drops wait for the next report.
        let mut total = kept;
        for i in 0..20 {
            let at = t0 + Duration::from_millis(i * 10);
            total += (0..100).filter(|_| b.admit("x", at).is_some()).count();
            assert_eq!(b.end_call(at), None, "at most one report a second");
        }
        assert_eq!(total, LOG_LINES_PER_SECOND as usize);
        let later = t0 + Duration::from_millis(1500);
        assert_eq!(b.end_call(later), Some(1200));
        assert!(b.admit("x", later).is_some(), "a new second, a new budget");
        // Long lines are cut at a character boundary.
        let long = "é".repeat(LOG_LINE_BYTES);
        let cut = b.admit(&long, later).unwrap();
        assert!(cut.len() <= LOG_LINE_BYTES && cut.chars().all(|c| c == 'é'));
    }
}
