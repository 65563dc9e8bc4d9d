//! `host plugin inspect`: what a component is, before it runs anywhere.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Subcommand;

use super::CliError;
use crate::plugin::{Limits, Runtime};

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
}

/// Run `host plugin …`.
///
/// # Errors
/// Exit 1 when the plugin cannot be loaded (the message names the file).
pub fn run(cmd: PluginCommand) -> Result<(), CliError> {
    match cmd {
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
