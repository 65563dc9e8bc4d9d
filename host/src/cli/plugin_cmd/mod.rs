//! `host plugin inspect`: what a component is, before it runs anywhere;
//! `host plugin new`: a new plugin crate (`new`, with the SDK it ships:
//! `sdk`).

mod new;
mod scripted;
mod sdk;
mod spec;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Subcommand, ValueEnum};

use super::CliError;
use crate::plugin::{Limits, Runtime};

/// The language of a plugin `host plugin new` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// A Rust crate with the guest SDK (`cargo build --target wasm32-wasip2`).
    Rust,
    /// A Python module with the Python SDK, built by componentize-py.
    Python,
    /// A JavaScript (ES) module with the JavaScript SDK, built by
    /// ComponentizeJS.
    Js,
}

/// `host plugin …` subcommands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Show a plugin's digest, size, exported stages, contract version and
    /// imports. Fails (exit 1) with the reason when the file is not a
    /// usable plugin.
    Inspect {
        /// The component (.wasm).
        file: PathBuf,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Create a plugin NAME in the current directory (or --dir): a map
    /// stage, a sink stage or both, with unit tests, a `host test` input
    /// file and a README; in Rust (a crate), Python or JavaScript
    /// (--lang). It builds anywhere: the SDK is written into
    /// NAME/sluice-sdk/, and the build tools come from crates.io, PyPI or
    /// npm.
    New {
        /// Plugin name (lower-case letters, digits, - and _): also the
        /// component's file name (`-` becomes `_`).
        name: String,
        /// Export a map stage (the default when neither --map nor --sink
        /// is given).
        #[arg(long)]
        map: bool,
        /// Export a sink stage that writes each record into an SQL table
        /// through the host's transaction (with --map: both in one
        /// component).
        #[arg(long)]
        sink: bool,
        /// Directory to create NAME in (default: the current directory).
        #[arg(long, value_name = "PARENT", default_value = ".")]
        dir: PathBuf,
        /// The plugin's language: rust (a crate), python (app.py and a
        /// build.sh that installs the Python SDK and componentize-py into
        /// a .venv) or js (app.js and a package.json whose `npm run
        /// build` installs the SDK's tools and builds).
        #[arg(long, value_enum, default_value_t = Lang::Rust)]
        lang: Lang,
    },
}

/// Run `host plugin …`.
///
/// # Errors
/// Exit 1 when the plugin cannot be loaded (the message names the file)
/// or a new crate's file cannot be written; exit 2 for an unusable name
/// or a directory that is not empty.
pub fn run(cmd: PluginCommand) -> Result<(), CliError> {
    match cmd {
        PluginCommand::New {
            name,
            map,
            sink,
            dir,
            lang,
        } => {
            let made = new::generate(&spec::NewPlugin {
                name: &name,
                map: map || !sink,
                sink,
                parent: &dir,
                lang,
            })?;
            let lib = new::component_name(&name);
            let shown = made.display();
            outln!("created {shown}")?;
            outln!()?;
            let db = if sink { " --sink-db sqlite:try.db" } else { "" };
            match lang {
                Lang::Python => {
                    outln!("  cd {shown}")?;
                    outln!("  bash build.sh        # .venv, unit tests, {lib}.wasm")?;
                    outln!("  host test --plugin {lib}.wasm --input sample.txt{db}")?;
                    return Ok(());
                }
                Lang::Js => {
                    outln!("  cd {shown}")?;
                    outln!("  npm run build        # npm install, unit tests, {lib}.wasm")?;
                    outln!("  host test --plugin {lib}.wasm --input sample.txt{db}")?;
                    return Ok(());
                }
                Lang::Rust => {}
            }
            outln!("  cd {shown}")?;
            outln!("  cargo test                                     # unit tests, natively")?;
            outln!("  cargo build --release --target wasm32-wasip2   # the component")?;
            outln!(
                "  host test --plugin target/wasm32-wasip2/release/{lib}.wasm --input sample.txt{db}"
            )?;
            Ok(())
        }
        PluginCommand::Inspect { file, json } => {
            let runtime = Runtime::new(Limits::default()).map_err(anyhow::Error::msg)?;
            let plugin = runtime.load(&file, Arc::new(BTreeMap::new()))?;
            let version = plugin
                .exports()
                .iter()
                .filter_map(|e| e.strip_prefix("sluice:plugin/"))
                .filter_map(|e| e.split_once('@').map(|(_, v)| v.to_string()))
                .next()
                .unwrap_or_default();
            if json {
                let v = serde_json::json!({
                    "file": file.display().to_string(),
                    "digest": format!("sha256:{}", plugin.digest()),
                    "size_bytes": plugin.size(),
                    "stages": plugin.stages().names(),
                    "contract_version": version,
                    "imports": plugin.imports(),
                    "exports": plugin.exports(),
                });
                outln!("{v}")?;
            } else {
                outln!("file:      {}", file.display())?;
                outln!("digest:    sha256:{}", plugin.digest())?;
                outln!("size:      {} bytes", plugin.size())?;
                outln!("stages:    {}", plugin.stages().names().join(", "))?;
                outln!("contract:  sluice:plugin@{version}")?;
                outln!("imports:")?;
                for i in plugin.imports() {
                    outln!("  {i}")?;
                }
                outln!("exports:")?;
                for e in plugin.exports() {
                    outln!("  {e}")?;
                }
            }
            Ok(())
        }
    }
}
