//! `host plugin new`: write a plugin crate that builds outside this
//! repository — `Cargo.toml`, `src/lib.rs` with the chosen stages and
//! their native unit tests, a `host test` input file, a README of three
//! commands, and the guest SDK under `sluice-sdk/` ([`super::sdk`]); a
//! Python or JavaScript plugin is written by [`super::scripted`].

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::spec::{NewPlugin, readme_flags, stages};
use super::{Lang, scripted, sdk};
use crate::cli::{CliError, ExitCode, WithCode};

const CARGO_TOML: &str = include_str!("template/Cargo.toml.txt");
const README: &str = include_str!("template/README.md.txt");
const HEAD: &str = include_str!("template/head.rs.txt");
const MAP: &str = include_str!("template/map.rs.txt");
const SINK: &str = include_str!("template/sink.rs.txt");
const SAMPLE: &str = include_str!("template/sample.txt");

/// Check a crate name: lower-case ASCII letters, digits, `-` and `_`,
/// starting with a letter, at most 48 characters (what cargo accepts,
/// narrowed so the name is also the component's file name, and the sink's
/// default table `NAME_records` an SQL identifier of at most 63 bytes,
/// once `-` becomes `_`).
///
/// # Errors
/// The rule, naming the value.
pub(super) fn check_name(name: &str) -> Result<(), String> {
    let ok = name.len() <= 48
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a plugin name: use lower-case letters, digits, - and _, starting with a letter (at most 48)"
        ))
    }
}

/// The component's file stem for crate `name`: cargo names a cdylib
/// after the crate with `-` as `_`.
pub(super) fn component_name(name: &str) -> String {
    name.replace('-', "_")
}

/// Write the crate; returns its directory.
///
/// # Errors
/// Exit 2 when the name is not usable or the directory exists and is not
/// empty (nothing is overwritten); exit 1 when a file cannot be written.
pub(super) fn generate(p: &NewPlugin<'_>) -> Result<PathBuf, CliError> {
    check_name(p.name)
        .map_err(anyhow::Error::msg)
        .code(ExitCode::Usage)?;
    let dir = p.parent.join(p.name);
    if let Ok(mut entries) = std::fs::read_dir(&dir)
        && entries.next().is_some()
    {
        return Err(CliError {
            code: ExitCode::Usage,
            error: anyhow::anyhow!(
                "{} exists and is not empty: choose another name or --dir (nothing was written)",
                dir.display()
            ),
        });
    }
    let lib = component_name(p.name);
    match p.lang {
        Lang::Python => return write_all(&dir, scripted::python_files(p, &lib)),
        Lang::Js => return write_all(&dir, scripted::js_files(p, &lib)),
        Lang::Rust => {}
    }
    let stages = stages(p.map, p.sink);
    let fill = |t: &str| {
        t.replace("{{name}}", p.name)
            .replace("{{lib}}", &lib)
            .replace("{{stages}}", stages)
            .replace("{{version}}", env!("CARGO_PKG_VERSION"))
            .replace("{{contract}}", sluice_guest::CONTRACT_VERSION)
    };
    let mut lib_rs = fill(HEAD);
    if p.map {
        lib_rs.push_str(&fill(MAP));
    }
    if p.sink {
        lib_rs.push_str(&fill(SINK));
    }
    lib_rs.push_str(match (p.map, p.sink) {
        (true, true) => "\nsluice_guest::export!(map: Keep, sink: Store);\n",
        (false, true) => "\nsluice_guest::export!(sink: Store);\n",
        _ => "\nsluice_guest::export!(map: Keep);\n",
    });
    let (test_flags, sink_note, run_flags) = readme_flags(p.sink, &lib);
    let readme = fill(README)
        .replace("{{test_flags}}", test_flags)
        .replace("{{sink_note}}", &sink_note)
        .replace("{{run_flags}}", run_flags);
    let mut files: Vec<(PathBuf, String)> = vec![
        (dir.join("Cargo.toml"), fill(CARGO_TOML)),
        (dir.join("src/lib.rs"), lib_rs),
        (dir.join("sample.txt"), SAMPLE.to_string()),
        (dir.join("README.md"), readme),
        (dir.join(".gitignore"), "/target\n".to_string()),
    ];
    for (path, text) in sdk::FILES {
        // Only the manifests are templates (Rust sources use `{{` too).
        let text = if path.ends_with("Cargo.toml") {
            fill(text)
        } else {
            text.to_string()
        };
        files.push((dir.join("sluice-sdk").join(path), text));
    }
    write_all(&dir, files)
}

/// Write `files` (paths under `dir`); returns `dir`.
fn write_all(dir: &Path, files: Vec<(PathBuf, String)>) -> Result<PathBuf, CliError> {
    for (path, text) in &files {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_crate_names_that_are_also_file_and_table_names() {
        for ok in ["keep", "my-plugin", "a1_b"] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "Keep", "1x", "-x", "a b", "a/b", "ä", &"x".repeat(49)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn nothing_is_overwritten() {
        let parent = tempfile::tempdir().unwrap();
        std::fs::create_dir(parent.path().join("p")).unwrap();
        std::fs::write(parent.path().join("p/keep.txt"), "mine").unwrap();
        let e = generate(&NewPlugin {
            name: "p",
            map: true,
            sink: false,
            parent: parent.path(),
            lang: Lang::Rust,
        })
        .unwrap_err();
        assert_eq!(e.code, ExitCode::Usage);
        assert!(e.error.to_string().contains("not empty"), "{}", e.error);
        assert_eq!(
            std::fs::read_to_string(parent.path().join("p/keep.txt")).unwrap(),
            "mine"
        );
    }
}
