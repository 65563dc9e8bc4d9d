//! The guest SDK's sources, shipped inside the `host` binary so that
//! `host plugin new` can write a plugin crate that builds anywhere with
//! nothing but crates.io: the SDK is not published, and a path into this
//! repository would tie every plugin to a checkout. The files keep their
//! places relative to each other (`guest-sdk/macro/src/lib.rs` embeds
//! `../../../wit/plugin.wit`); the two `Cargo.toml`s are written from
//! templates with the workspace's inherited fields filled in.

/// `(path under sluice-sdk/, contents)` of every SDK source file.
pub(super) const FILES: &[(&str, &str)] = &[
    ("wit/plugin.wit", include_str!("../../../../wit/plugin.wit")),
    (
        "guest-sdk/src/lib.rs",
        include_str!("../../../../guest-sdk/src/lib.rs"),
    ),
    (
        "guest-sdk/src/host.rs",
        include_str!("../../../../guest-sdk/src/host.rs"),
    ),
    (
        "guest-sdk/src/json.rs",
        include_str!("../../../../guest-sdk/src/json.rs"),
    ),
    (
        "guest-sdk/src/kafka/mod.rs",
        include_str!("../../../../guest-sdk/src/kafka/mod.rs"),
    ),
    (
        "guest-sdk/src/kafka/record.rs",
        include_str!("../../../../guest-sdk/src/kafka/record.rs"),
    ),
    (
        "guest-sdk/src/log.rs",
        include_str!("../../../../guest-sdk/src/log.rs"),
    ),
    (
        "guest-sdk/src/run.rs",
        include_str!("../../../../guest-sdk/src/run.rs"),
    ),
    (
        "guest-sdk/src/sql/mod.rs",
        include_str!("../../../../guest-sdk/src/sql/mod.rs"),
    ),
    (
        "guest-sdk/src/sql/table.rs",
        include_str!("../../../../guest-sdk/src/sql/table.rs"),
    ),
    (
        "guest-sdk/src/sql/types.rs",
        include_str!("../../../../guest-sdk/src/sql/types.rs"),
    ),
    (
        "guest-sdk/src/testing.rs",
        include_str!("../../../../guest-sdk/src/testing.rs"),
    ),
    (
        "guest-sdk/src/wire.rs",
        include_str!("../../../../guest-sdk/src/wire.rs"),
    ),
    (
        "guest-sdk/macro/src/lib.rs",
        include_str!("../../../../guest-sdk/macro/src/lib.rs"),
    ),
    (
        "guest-sdk/Cargo.toml",
        include_str!("template/sdk.Cargo.toml.txt"),
    ),
    (
        "guest-sdk/macro/Cargo.toml",
        include_str!("template/sdk.macro.Cargo.toml.txt"),
    ),
];

/// `(path under sluice-sdk/, contents)` of the Python SDK, for `host plugin
/// new --lang python`: the package with the contract inside it (its
/// `setup.py` takes `sluice_guest/wit/plugin.wit` when there is no
/// repository around).
pub(super) const PY_FILES: &[(&str, &str)] = &[
    (
        "pyproject.toml",
        include_str!("../../../../guest-sdk-python/pyproject.toml"),
    ),
    (
        "setup.py",
        include_str!("../../../../guest-sdk-python/setup.py"),
    ),
    (
        "README.md",
        include_str!("../../../../guest-sdk-python/README.md"),
    ),
    (
        "sluice_guest/__init__.py",
        include_str!("../../../../guest-sdk-python/sluice_guest/__init__.py"),
    ),
    (
        "sluice_guest/_host.py",
        include_str!("../../../../guest-sdk-python/sluice_guest/_host.py"),
    ),
    (
        "sluice_guest/build.py",
        include_str!("../../../../guest-sdk-python/sluice_guest/build.py"),
    ),
    (
        "sluice_guest/json.py",
        include_str!("../../../../guest-sdk-python/sluice_guest/json.py"),
    ),
    (
        "sluice_guest/kafka.py",
        include_str!("../../../../guest-sdk-python/sluice_guest/kafka.py"),
    ),
    (
        "sluice_guest/log.py",
        include_str!("../../../../guest-sdk-python/sluice_guest/log.py"),
    ),
    (
        "sluice_guest/_sqlcore.py",
        include_str!("../../../../guest-sdk-python/sluice_guest/_sqlcore.py"),
    ),
    (
        "sluice_guest/sql.py",
        include_str!("../../../../guest-sdk-python/sluice_guest/sql.py"),
    ),
    (
        "sluice_guest/table.py",
        include_str!("../../../../guest-sdk-python/sluice_guest/table.py"),
    ),
    (
        "sluice_guest/testing.py",
        include_str!("../../../../guest-sdk-python/sluice_guest/testing.py"),
    ),
    (
        "sluice_guest/wire.py",
        include_str!("../../../../guest-sdk-python/sluice_guest/wire.py"),
    ),
    (
        "sluice_guest/wit/plugin.wit",
        include_str!("../../../../wit/plugin.wit"),
    ),
];

/// `(path under sluice-sdk/, contents)` of the JavaScript SDK, for `host
/// plugin new --lang js`: the package with the contract inside it
/// (`wit/plugin.wit`, where its build looks first).
pub(super) const JS_FILES: &[(&str, &str)] = &[
    (
        "package.json",
        include_str!("../../../../guest-sdk-js/package.json"),
    ),
    (
        "README.md",
        include_str!("../../../../guest-sdk-js/README.md"),
    ),
    (
        "src/build.js",
        include_str!("../../../../guest-sdk-js/src/build.js"),
    ),
    (
        "src/errors.js",
        include_str!("../../../../guest-sdk-js/src/errors.js"),
    ),
    (
        "src/host.js",
        include_str!("../../../../guest-sdk-js/src/host.js"),
    ),
    (
        "src/index.js",
        include_str!("../../../../guest-sdk-js/src/index.js"),
    ),
    (
        "src/json.js",
        include_str!("../../../../guest-sdk-js/src/json.js"),
    ),
    (
        "src/kafka.js",
        include_str!("../../../../guest-sdk-js/src/kafka.js"),
    ),
    (
        "src/log.js",
        include_str!("../../../../guest-sdk-js/src/log.js"),
    ),
    (
        "src/sql.js",
        include_str!("../../../../guest-sdk-js/src/sql.js"),
    ),
    (
        "src/sqlcore.js",
        include_str!("../../../../guest-sdk-js/src/sqlcore.js"),
    ),
    (
        "src/table.js",
        include_str!("../../../../guest-sdk-js/src/table.js"),
    ),
    (
        "src/testing.js",
        include_str!("../../../../guest-sdk-js/src/testing.js"),
    ),
    (
        "src/wire.js",
        include_str!("../../../../guest-sdk-js/src/wire.js"),
    ),
    ("wit/plugin.wit", include_str!("../../../../wit/plugin.wit")),
];

#[cfg(test)]
mod tests {
    use super::FILES;
    use std::path::Path;

    /// The shipped text of `path` (relative to the repository root).
    fn shipped(path: &str) -> &'static str {
        FILES
            .iter()
            .find(|(p, _)| *p == path)
            .unwrap_or_else(|| panic!("{path} is not shipped"))
            .1
    }

    /// Every `.rs` file of the SDK is shipped (a new module would otherwise
    /// be missing from generated plugins, which then fail to build).
    #[test]
    fn every_sdk_source_file_is_shipped() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut on_disk = Vec::new();
        let mut dirs = vec![root.join("guest-sdk/src"), root.join("guest-sdk/macro/src")];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let rel = p
                        .strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned();
                    on_disk.push(rel);
                }
            }
        }
        on_disk.sort();
        let mut shipped: Vec<String> = FILES
            .iter()
            .filter(|(p, _)| p.ends_with(".rs"))
            .map(|(p, _)| p.to_string())
            .collect();
        shipped.sort();
        assert_eq!(shipped, on_disk);
    }

    /// The files of the SDK in `dir` (under the repository root): the
    /// `fixed` ones and every `*.ext` in `sources`, as paths under the SDK,
    /// equal the non-WIT entries of `shipped`.
    fn assert_all_shipped(
        dir: &str,
        fixed: &[&str],
        sources: &str,
        ext: &str,
        shipped: &[(&str, &str)],
    ) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
        let mut on_disk: Vec<String> = fixed.iter().map(|s| s.to_string()).collect();
        for e in std::fs::read_dir(root.join(sources)).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            if name.ends_with(ext) {
                on_disk.push(format!("{sources}/{name}"));
            }
        }
        on_disk.sort();
        let mut listed: Vec<String> = shipped
            .iter()
            .filter(|(p, _)| !p.ends_with(".wit"))
            .map(|(p, _)| p.to_string())
            .collect();
        listed.sort();
        assert_eq!(listed, on_disk);
    }

    #[test]
    fn every_python_sdk_file_is_shipped() {
        assert_all_shipped(
            "guest-sdk-python",
            &["pyproject.toml", "setup.py", "README.md"],
            "sluice_guest",
            ".py",
            super::PY_FILES,
        );
    }

    /// The SDK templates name the dependency versions the workspace builds
    /// the SDK with.
    #[test]
    fn sdk_manifests_use_the_workspace_versions() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let workspace = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let sdk = shipped("guest-sdk/Cargo.toml");
        for line in [
            "wit-bindgen = \"0.63\"",
            "serde = { version = \"1\", features = [\"derive\"] }",
            "serde_json = { version = \"1\", features = [\"raw_value\"] }",
            "envy = \"0.4\"",
        ] {
            assert!(workspace.contains(line), "workspace: {line}");
        }
        assert!(sdk.contains("wit-bindgen = { version = \"0.63\""));
        assert!(sdk.contains("envy = \"0.4\""));
        // Every dependency of the SDK in the repository is in the shipped
        // manifest (a missing one breaks the first build of a new plugin).
        let deps = |text: &str| -> Vec<String> {
            let manifest: toml::Table = toml::from_str(text).unwrap();
            let mut names: Vec<String> = manifest["dependencies"]
                .as_table()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            names.sort();
            names
        };
        let in_repo = std::fs::read_to_string(root.join("guest-sdk/Cargo.toml")).unwrap();
        let shipped_text = sdk.replace("{{version}}", "0.0.0");
        assert_eq!(deps(&in_repo), deps(&shipped_text));
        let macro_in_repo =
            std::fs::read_to_string(root.join("guest-sdk/macro/Cargo.toml")).unwrap();
        let macro_shipped = shipped("guest-sdk/macro/Cargo.toml");
        for dep in [
            "proc-macro2 = \"1\"",
            "quote = \"1\"",
            "syn = { version = \"2\", features = [\"full\"] }",
        ] {
            assert!(
                macro_in_repo.contains(dep) && macro_shipped.contains(dep),
                "{dep}"
            );
        }
    }

    #[test]
    fn every_js_sdk_file_is_shipped() {
        assert_all_shipped(
            "guest-sdk-js",
            &["package.json", "README.md"],
            "src",
            ".js",
            super::JS_FILES,
        );
    }
}
