//! What a guest printed before it trapped, as the trap's message: a Rust
//! panic, a Python traceback (componentize-py) or a JavaScript SDK's
//! uncaught error (ComponentizeJS), each with its innermost place in the
//! plugin's own source.

/// Extract a Rust panic message from guest stderr:
/// `thread '…' panicked at src/lib.rs:1:2:\nmessage\nnote: …`. A Python
/// plugin (componentize-py) traps with the panic "Python function threw
/// an unexpected exception"; when a traceback precedes it (the Python
/// SDK prints one), its exception line and innermost place are the
/// message instead ([`python_exception`]). A JavaScript plugin
/// (ComponentizeJS) has no panic; the JavaScript SDK prints an uncaught
/// error before the trap ([`js_exception`]).
pub(super) fn panic_message(stderr: &str) -> Option<String> {
    let Some(start) = stderr.find("panicked at ") else {
        return js_exception(stderr);
    };
    let rest = &stderr[start + "panicked at ".len()..];
    let mut lines = rest.lines();
    let location = lines.next()?.trim_end_matches(':');
    let message: Vec<&str> = lines.take_while(|l| !l.starts_with("note: ")).collect();
    let message = message.join("\n");
    if message.trim() == "Python function threw an unexpected exception"
        && let Some(python) = python_exception(&stderr[..start])
    {
        return Some(python);
    }
    Some(format!("{} (at {location})", message.trim()))
}

/// The last Python traceback in `stderr`, as `ValueError: boom (at
/// app.py:15, in map)`: the exception line and the innermost frame
/// (`File "/0/app.py", line 15, in map`; componentize-py mounts each
/// Python path entry as `/N/`, which is dropped).
fn python_exception(stderr: &str) -> Option<String> {
    let start = stderr.rfind("Traceback (most recent call last):")?;
    let lines: Vec<&str> = stderr[start..].lines().skip(1).collect();
    let exception = lines
        .iter()
        .rev()
        .find(|l| !l.is_empty() && !l.starts_with(' ') && !l.starts_with("thread '"))?;
    let frame = lines
        .iter()
        .rev()
        .find_map(|l| l.trim_start().strip_prefix("File \""))
        .and_then(|f| {
            let (path, rest) = f.split_once("\", line ")?;
            let path = path
                .strip_prefix('/')
                .and_then(|p| p.split_once('/'))
                .filter(|(n, _)| n.bytes().all(|b| b.is_ascii_digit()))
                .map_or(path, |(_, p)| p);
            let (line, func) = rest.split_once(", in ").unwrap_or((rest, ""));
            Some(format!(" (at {path}:{line}, in {func})"))
        })
        .unwrap_or_default();
    Some(format!("{}{frame}", exception.trim()))
}

/// The last uncaught error the JavaScript SDK (`guest-sdk-js`) printed,
/// as `TypeError: boom (at app.js:27, in raise)`: its line
/// `sluice-guest: uncaught TypeError: boom (in map)` without the SDK's
/// prefix and suffix, and the innermost frame outside the SDK (`    at
/// raise (app.js:27)`; the SDK maps the bundle's lines back to the
/// sources).
fn js_exception(stderr: &str) -> Option<String> {
    const MARK: &str = "sluice-guest: uncaught ";
    let start = stderr.rfind(MARK)? + MARK.len();
    let mut lines = stderr[start..].lines();
    let head = lines.next()?;
    let head = head.rsplit_once(" (in ").map_or(head, |(h, _)| h);
    let frame = lines
        .map_while(|l| l.strip_prefix("    at "))
        .find(|f| !f.contains("(sluice-guest/"))
        .and_then(|f| {
            let (func, place) = f.strip_suffix(')')?.split_once(" (")?;
            Some(format!(" (at {place}, in {func})"))
        })
        .unwrap_or_default();
    Some(format!("{}{frame}", head.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn javascript_errors_name_the_error_and_the_innermost_frame_outside_the_sdk() {
        let s = "sluice-guest: uncaught TypeError: boom at 2 (in map)\n    at emit (sluice-guest/wire.js:9)\n    at raise (app.js:59)\n    at map (app.js:25)\n    at mapCall (sluice-guest/index.js:186)\ninvalid variant tag value `undefined` (received `TypeError: boom at 2`) specified for `StageError`\nRedirecting call to abort() to mozalloc_abort\n";
        assert_eq!(
            panic_message(s).as_deref(),
            Some("TypeError: boom at 2 (at app.js:59, in raise)")
        );
        // A frame-less error (thrown from top-level code) keeps its line.
        assert_eq!(
            panic_message("sluice-guest: uncaught string thrown: x (in open)\n").as_deref(),
            Some("string thrown: x")
        );
        assert_eq!(panic_message("Redirecting call to abort()\n"), None);
    }

    #[test]
    fn panic_messages_are_extracted() {
        let s = "thread '<unnamed>' panicked at src/lib.rs:47:24:\nboom at 3\nnote: run with `RUST_BACKTRACE=1`\n";
        assert_eq!(
            panic_message(s).as_deref(),
            Some("boom at 3 (at src/lib.rs:47:24)")
        );
        assert_eq!(panic_message("nothing"), None);
    }

    #[test]
    fn python_exceptions_name_the_exception_and_the_innermost_frame() {
        let s = "Traceback (most recent call last):\n  File \"/1/sluice_guest/__init__.py\", line 311, in open\n  File \"/0/app.py\", line 15, in init\n    raise ValueError(\"stop\")\nValueError: stop at 3\nthread '<unnamed>' (1) panicked at runtime/src/lib.rs:1293:29:\nPython function threw an unexpected exception\nnote: run with `RUST_BACKTRACE=1`\n";
        assert_eq!(
            panic_message(s).as_deref(),
            Some("ValueError: stop at 3 (at app.py:15, in init)")
        );
        // Without a traceback: componentize-py's own message.
        let bare = "thread '<unnamed>' (1) panicked at runtime/src/lib.rs:1293:29:\nPython function threw an unexpected exception\n";
        assert_eq!(
            panic_message(bare).as_deref(),
            Some("Python function threw an unexpected exception (at runtime/src/lib.rs:1293:29)")
        );
    }
}
