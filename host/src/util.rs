//! Small helpers every layer uses: the wall clock as milliseconds since
//! the Unix epoch, its RFC 3339 form, the host name, and the test
//! failpoints. Nothing here knows about batches or plugins.

use std::time::Duration;

/// Format milliseconds since the Unix epoch as RFC 3339 (UTC, whole
/// seconds: `2026-12-03T13:40:01Z`), for people.
pub fn rfc3339_ms(ms: i64) -> String {
    humantime::format_rfc3339_seconds(epoch_ms(ms)).to_string()
}

/// Format milliseconds since the Unix epoch as RFC 3339 with
/// milliseconds (`2026-12-03T13:40:01.123Z`), for machine-read output
/// such as progress events, where rates are computed from differences.
pub fn rfc3339_millis(ms: i64) -> String {
    humantime::format_rfc3339_millis(epoch_ms(ms)).to_string()
}

fn epoch_ms(ms: i64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Read `path` as UTF-8 text of at most `max` bytes (a config or password
/// file: a device or a huge file must not fill memory).
///
/// # Errors
/// The OS error; `InvalidData` past `max` bytes or for text that is not
/// UTF-8.
pub fn read_text_capped(path: &std::path::Path, max: u64) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}

/// The local host name (best effort).
pub fn hostname() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

/// Pause the process at a named failpoint (builds with the `failpoints`
/// feature only). `SLUICE_FAILPOINT=<name>` pauses at its first hit,
/// `<name>@<k>` at its k-th. The process prints `FAILPOINT <name>` on stderr
/// and sleeps until killed: the test then sends SIGKILL, which is exactly a
/// crash at that point. With `SLUICE_FAILPOINT_RESUME_FILE=<path>` it waits
/// until that file exists instead and goes on (a window, as long as the
/// test needs, to send a signal in). Without the feature this is a no-op.
#[inline]
pub fn failpoint(name: &str) {
    #[cfg(feature = "failpoints")]
    {
        use std::collections::HashMap;
        use std::sync::Mutex;
        static HITS: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);
        let Ok(spec) = std::env::var("SLUICE_FAILPOINT") else {
            return;
        };
        let (want, at) = match spec.rsplit_once('@') {
            Some((n, k)) => (n.to_string(), k.parse::<u64>().unwrap_or(1)),
            None => (spec, 1),
        };
        if want != name {
            return;
        }
        let hit = {
            let mut g = HITS.lock().unwrap_or_else(|p| p.into_inner());
            let c = g.get_or_insert_with(HashMap::new).entry(want).or_insert(0);
            *c += 1;
            *c
        };
        if hit == at {
            eprintln!("FAILPOINT {name}");
            let _ = std::io::Write::flush(&mut std::io::stderr());
            if let Some(resume) = std::env::var_os("SLUICE_FAILPOINT_RESUME_FILE") {
                while !std::path::Path::new(&resume).exists() {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                return;
            }
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_forms_keep_or_drop_the_milliseconds() {
        let ms = 1_764_769_201_123; // 2025-12-03T13:40:01.123Z
        assert_eq!(super::rfc3339_ms(ms), "2025-12-03T13:40:01Z");
        assert_eq!(super::rfc3339_millis(ms), "2025-12-03T13:40:01.123Z");
    }
}
