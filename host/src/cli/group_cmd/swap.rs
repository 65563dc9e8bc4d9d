//! `host group swap`: ask every member of a running pipeline group to run
//! a new plugin, and wait for their answers.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;

use super::{CliError, ExitCode, GroupDb, WithCode};
use crate::checkpoint::StageKind;
use crate::cli::parse_duration;
use crate::cli::swap_cmd::SwapStage;
use crate::engine::{swap_targets, swapped_refs};
use crate::plugin::{Limits, Runtime};
use crate::util::now_ms;

/// Flags of `host group swap`.
#[derive(Debug, Args)]
pub struct SwapArgs {
    #[command(flatten)]
    db: GroupDb,
    /// The new plugin component.
    #[arg(long, value_name = "FILE")]
    plugin: PathBuf,
    /// Which stage to replace (default: every stage the new plugin exports).
    #[arg(long, value_enum)]
    stage: Option<SwapStage>,
    /// Which map stage (0-based) when the pipeline has several.
    #[arg(long, value_name = "N")]
    index: Option<usize>,
    /// How long to wait for every live member's answer (each answers at
    /// its next batch boundary after the plugin compiled).
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_duration)]
    timeout: Duration,
    /// Store the swap and return without waiting for the members.
    #[arg(long)]
    no_wait: bool,
    /// Memory cap to check the component under before it is stored (the
    /// members load it under their own `host run --plugin-memory`; give
    /// the same value) [default: 256MiB].
    #[arg(long, value_name = "BYTES", value_parser = crate::cli::parse_bytes)]
    plugin_memory: Option<u64>,
}

/// Run `host group swap`.
///
/// # Errors
/// Exit 2 for a plugin that cannot be read, compiled, or cannot replace
/// the group's stages; 1 when a live member could not install it (it keeps
/// its plugins) or did not answer within `--timeout` (the swap stays
/// asked: members install it when they get to it).
pub(super) fn swap(a: SwapArgs) -> Result<(), CliError> {
    let group = a.db.group.clone();
    let o = a.db.open()?;
    let bytes = std::fs::read(&a.plugin)
        .map_err(|e| anyhow::anyhow!("plugin {}: {e}", a.plugin.display()))
        .code(ExitCode::Usage)?;
    // Compile it here first: a component that does not load is refused
    // before any member sees it.
    let limits = Limits {
        memory_bytes: a.plugin_memory.unwrap_or(Limits::default().memory_bytes),
        ..Limits::default()
    };
    let runtime = Runtime::new(limits).map_err(|e| anyhow::anyhow!("{e}"))?;
    let plugin = runtime
        .load_bytes(&a.plugin, &bytes, Default::default())
        .map_err(|e| anyhow::anyhow!("{e}"))
        .code(ExitCode::Usage)?;
    let stage = a.stage.map(|s| match s {
        SwapStage::Map => StageKind::Map,
        SwapStage::Sink => StageKind::Sink,
    });
    let targets = swap_targets(
        &o.plugins,
        (&a.plugin, plugin.digest()),
        plugin.stages(),
        stage,
        a.index,
    )
    .map_err(|e| anyhow::anyhow!("group {group}: {e}"))
    .code(ExitCode::Usage)?;
    let refs = swapped_refs(&o.plugins, plugin.digest(), targets);
    let maps: Vec<&str> = refs
        .iter()
        .filter(|r| r.stage == StageKind::Map)
        .map(|r| r.digest.as_str())
        .collect();
    if maps.iter().enumerate().any(|(i, d)| maps[..i].contains(d)) {
        return Err(anyhow::anyhow!(
            "group {group}: the swap would run sha256:{} as two map stages; one component is one map stage in a pipeline (swap the other --index, or build a second component)",
            plugin.digest()
        ))
        .code(ExitCode::Usage);
    }
    if refs == o.plugins {
        outln!(
            "group {group} runs sha256:{} already; nothing to swap",
            plugin.digest()
        )?;
        return Ok(());
    }
    o.store.store_plugin(&bytes)?;
    let by = format!(
        "host group swap, pid {} on {}",
        std::process::id(),
        crate::util::hostname()
    );
    let asked = o.store.request_swap(&o.plugins, &refs, &by)?;
    outln!(
        "swap {} asked of group {group}: sha256:{} ({}); members install it at their next batch boundary, members that join later start with it",
        asked.id,
        plugin.digest(),
        a.plugin.display()
    )?;
    if a.no_wait {
        return Ok(());
    }
    let until = Instant::now() + a.timeout;
    loop {
        let live: Vec<_> = o
            .store
            .members()?
            .into_iter()
            .filter(|m| m.live(now_ms()))
            .collect();
        let waiting: Vec<&str> = live
            .iter()
            .filter(|m| m.swap_id < asked.id)
            .map(|m| m.member.as_str())
            .collect();
        if waiting.is_empty() || Instant::now() >= until {
            let (mut installed, mut refused, mut other) = (0, 0, 0);
            for m in live.iter().filter(|m| m.swap_id >= asked.id) {
                if m.plugins == refs {
                    outln!("{}: installed", m.member)?;
                    installed += 1;
                } else if m.swap_id == asked.id
                    && let Some(e) = &m.swap_error
                {
                    outln!("{}: NOT installed, keeps its plugins: {e}", m.member)?;
                    refused += 1;
                } else {
                    outln!(
                        "{}: runs other plugins ({:?}): a later swap, or it joined with a --plugin of its own",
                        m.member,
                        m.plugins.iter().map(|p| &p.digest).collect::<Vec<_>>()
                    )?;
                    other += 1;
                }
            }
            if live.is_empty() {
                outln!("no member is running now; the next to join starts with it")?;
            }
            if refused > 0 && installed == 0 {
                // Nobody runs it: members that start later would fail on
                // it too, so they start with the previous plugins again.
                o.store.set_plugins(&o.plugins)?;
                outln!(
                    "no member installed it: members that join later start with the previous plugins again"
                )?;
            }
            if !waiting.is_empty() {
                return Err(anyhow::anyhow!(
                    "no answer within {} s from {}; the swap stays asked (see host group status)",
                    a.timeout.as_secs(),
                    waiting.join(", ")
                ))
                .code(ExitCode::Failed);
            }
            if refused + other > 0 {
                return Err(anyhow::anyhow!(
                    "{} of {} live member(s) do not run swap {}: fix the plugin (see each member's reason above) and swap again",
                    refused + other,
                    live.len(),
                    asked.id
                ))
                .code(ExitCode::Failed);
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}
