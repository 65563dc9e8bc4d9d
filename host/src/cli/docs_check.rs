//! Every `host …` command shown in the docs parses with the current CLI.
//!
//! The pages are README.md, every `docs/*.md` and every
//! `plugins/*/README.md`. A command is a line of a fenced code block
//! (`sh`, `bash`, `console` or no language) that starts with `host `, or
//! with a path ending in `/host ` (`./target/release/host`); a trailing
//! `\` joins the next line, `#` starts a comment, and the words are split
//! as a POSIX shell would (the `shlex` crate). Commands in inline code are
//! synopses with `[…]` and `|`, and are not checked; `docs/cli.md` is the
//! reference those follow, generated from `--help`.

use std::path::{Path, PathBuf};

use clap::Parser;
use clap::error::ErrorKind;

use super::Cli;

/// The pages to check, from the repository root.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![root.join("README.md")];
    for dir in ["docs", "plugins"] {
        let Ok(rd) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "md") {
                pages.push(p);
            } else if p.join("README.md").exists() {
                pages.push(p.join("README.md"));
            }
        }
    }
    pages.sort();
    pages
}

/// The `host` commands of `text`'s shell blocks: (line number, words
/// after `host`).
fn commands(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut shell = None::<bool>;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(lang) = trimmed.strip_prefix("```") {
            shell = match shell {
                Some(_) => None,
                None => Some(matches!(lang.trim(), "" | "sh" | "bash" | "console")),
            };
            continue;
        }
        if shell != Some(true) {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        joined.push_str(line.trim());
        if let Some(head) = joined.strip_suffix('\\') {
            pending = Some((start, format!("{head} ")));
            continue;
        }
        found.push((start, joined));
    }
    found
        .into_iter()
        .filter_map(|(n, line)| {
            let line = line.trim_start_matches("$ ");
            let rest = line.strip_prefix("host ").or_else(|| {
                line.split_once("/host ")
                    .and_then(|(p, r)| (!p.contains(' ')).then_some(r))
            })?;
            Some((n, rest.to_string()))
        })
        .collect()
}

/// Cut a shell comment off `words`, keeping `#` inside quotes.
fn words(command: &str) -> Option<Vec<String>> {
    let mut all = shlex::split(command)?;
    if let Some(i) = all.iter().position(|w| w.starts_with('#')) {
        all.truncate(i);
    }
    Some(all)
}

#[test]
fn every_host_command_in_the_docs_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    let mut failures = Vec::new();
    for page in pages(&root) {
        let text = std::fs::read_to_string(&page).unwrap_or_default();
        for (line, command) in commands(&text) {
            let place = format!("{}:{line}", page.display());
            let Some(args) = words(&command) else {
                failures.push(format!("{place}: unbalanced quotes in `host {command}`"));
                continue;
            };
            let argv = std::iter::once("host".to_string()).chain(args);
            match Cli::try_parse_from(argv) {
                Ok(_) => {}
                Err(e)
                    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {}
                Err(e) => failures.push(format!("{place}: `host {command}`: {}", e.render())),
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The README alone shows several; a parser that found none is broken.
    assert!(checked >= 15, "only {checked} commands found in the docs");
}

#[test]
fn the_command_finder_joins_lines_and_skips_other_blocks() {
    let text = "```sh\nhost run --brokers b \\\n  --topic t   # a comment\n```\n```toml\nhost = 1\n```\n```\n./target/release/host plugin inspect x.wasm\ncargo build\n```\nhost status\n";
    let found = commands(text);
    assert_eq!(
        found,
        [
            (2, "run --brokers b  --topic t   # a comment".to_string()),
            (9, "plugin inspect x.wasm".to_string()),
        ]
    );
    assert_eq!(
        words("run --topic t # note").unwrap(),
        ["run", "--topic", "t"]
    );
}
