//! Command-line interface: flag definitions (clap), logging setup, and the
//! mapping from outcomes to exit codes. Subcommands live one per file.
//!
//! Exit codes: 0 success; 1 the job or command failed (a trap, a fatal
//! stage error, a corrupt checkpoint…); 2 bad usage or unreadable input
//! (clap's own code for flag errors); 3 the checkpoint is owned by another
//! process; 141 command output went to a closed pipe (128 + SIGPIPE).

/// `println!` for command output, used with `?` in functions returning
/// `Result<_, CliError>`: a write error ends the command through the normal
/// error path (so temp dirs and locks are released), and a closed pipe
/// (`host checkpoint show ck | head -1` on a long listing) becomes exit code
/// 141, as for a C tool killed by SIGPIPE, instead of a panic.
macro_rules! outln {
    () => {
        $crate::cli::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::cli::write_line(format_args!($($arg)*))
    };
}

mod checkpoint_cmd;
mod demo_cmd;
#[cfg(test)]
mod docs_check;
pub(crate) mod group_cmd;
mod plugin_cmd;
mod reset;
pub mod run_cmd;
pub mod settings;
mod status_cmd;
pub(crate) mod swap_cmd;
mod test_cmd;

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::plugin::Limits;

/// What `main` returns to the OS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    /// Success.
    Ok = 0,
    /// The command ran and failed.
    Failed = 1,
    /// Bad usage or input.
    Usage = 2,
    /// The checkpoint is owned by another live process.
    Owned = 3,
}

/// An error with the exit code it should produce.
#[derive(Debug)]
pub struct CliError {
    /// Exit code.
    pub code: ExitCode,
    /// The error and its causes.
    pub error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError {
            code: ExitCode::Failed,
            error: e.into(),
        }
    }
}

/// Attach an exit code to a result.
pub(crate) trait WithCode<T> {
    fn code(self, code: ExitCode) -> Result<T, CliError>;
}

impl<T, E: Into<anyhow::Error>> WithCode<T> for Result<T, E> {
    fn code(self, code: ExitCode) -> Result<T, CliError> {
        self.map_err(|e| CliError {
            code,
            error: e.into(),
        })
    }
}

/// Sluice: exactly-once Kafka stream processing with sandboxed WebAssembly
/// plugins.
#[derive(Debug, Parser)]
#[command(name = "host", version, about, long_about = None, max_term_width = 100)]
pub struct Cli {
    /// Log format on stderr. The level comes from RUST_LOG (default: info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Try Sluice in one command: the company pipeline on an embedded Kafka
    /// broker and SQLite, with a restart, and a summary.
    Demo(demo_cmd::DemoArgs),
    /// Run a pipeline: read Kafka, map, sink, checkpoint — exactly once
    /// across restarts and crashes.
    Run(Box<run_cmd::RunArgs>),
    /// Replace a running pipeline's plugin between two batches (asks the
    /// owner over its control socket; prints the batch id where it took
    /// effect).
    Swap(swap_cmd::SwapArgs),
    /// Show a pipeline: a single host's owner, epoch, batch in flight,
    /// plugins and last progress (`--checkpoint`), or each member's own
    /// view and the group's (`--group`).
    Status(status_cmd::StatusArgs),
    /// Run a plugin's map stage(s) over records from a file and print the
    /// outputs as JSON lines (no Kafka, no checkpoint).
    Test(test_cmd::TestArgs),
    /// Create a plugin (Rust, Python or JavaScript) or inspect a component.
    #[command(subcommand)]
    Plugin(plugin_cmd::PluginCommand),
    /// Inspect checkpoint directories, or move a stopped pipeline's offsets (reset).
    #[command(subcommand)]
    Checkpoint(checkpoint_cmd::CheckpointCommand),
    /// Inspect a pipeline group (`host run --group`) in its sink database.
    #[command(subcommand)]
    Group(group_cmd::GroupCommand),
}

/// Sandbox limits shared by every command that runs plugins.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Deadline of one plugin call (e.g. 500ms, 10s). A call that runs
    /// longer is interrupted and the instance discarded.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_plugin_timeout)]
    pub plugin_timeout: Duration,

    /// Memory cap of each plugin instance, bytes (suffixes KiB, MiB, GiB).
    #[arg(long, value_name = "BYTES", default_value = "256MiB", value_parser = parse_plugin_memory)]
    pub plugin_memory: u64,
}

impl LimitArgs {
    /// The sandbox limits.
    pub fn limits(&self) -> Limits {
        Limits {
            call_timeout: self.plugin_timeout,
            memory_bytes: self.plugin_memory,
        }
    }
}

/// Parse `10s`, `500ms`, `2m` (humantime syntax).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 10s, 2m)"))
}

/// Shortest plugin call deadline accepted: deadlines are checked every
/// 5 ms (the epoch tick), so shorter ones are meaningless.
pub const MIN_PLUGIN_TIMEOUT: Duration = Duration::from_millis(10);

/// Parse a `--plugin-timeout` (as [`parse_duration`], within
/// [`settings::PLUGIN_TIMEOUT`]).
pub fn parse_plugin_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    settings::within(
        "--plugin-timeout",
        d,
        settings::PLUGIN_TIMEOUT,
        settings::show_duration,
    )
    .map_err(|e| format!("{} (deadlines are checked every 5 ms)", e.error))
}

/// Parse a `--plugin-memory` (as [`parse_bytes`], within
/// [`settings::PLUGIN_MEMORY`]).
pub fn parse_plugin_memory(s: &str) -> Result<u64, String> {
    let n = parse_bytes(s)?;
    settings::within(
        "--plugin-memory",
        n,
        settings::PLUGIN_MEMORY,
        settings::show_mib,
    )
    .map_err(|e| format!("{} (a Wasm32 memory holds at most 4 GiB)", e.error))
}

/// The `--sink-db` value parser: checks the URL's form
/// ([`crate::capability::sql::check_url`]) so that another scheme is a
/// usage error (exit 2) before anything starts. Unlike a plain
/// `value_parser` function it does not echo the raw value, which may hold
/// a password.
#[derive(Clone, Debug)]
pub struct SinkDbUrl;

impl clap::builder::TypedValueParser for SinkDbUrl {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let flag = arg.map_or_else(|| "--sink-db".to_string(), |a| a.to_string());
        let fail = |why: String| {
            clap::Error::raw(
                clap::error::ErrorKind::InvalidValue,
                format!("invalid value for {flag}: {why}\n"),
            )
            .with_cmd(cmd)
        };
        let url = value
            .to_str()
            .ok_or_else(|| fail("not UTF-8".to_string()))?;
        crate::capability::sql::check_url(url).map_err(fail)
    }
}

/// The `--brokers` value parser: the list's form
/// ([`crate::source::check_brokers`]), so that `tcp://…` or a bad port
/// is a usage error (exit 2) at once instead of a 30 s wait for a broker.
///
/// # Errors
/// The bad entry and the accepted form.
pub fn parse_brokers(s: &str) -> Result<String, String> {
    crate::source::check_brokers(s, None)?;
    Ok(s.to_string())
}

/// Parse a byte count: `1048576`, `64KiB`, `256MiB`, `1GiB` (also KB/MB/GB
/// as powers of 1000).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a byte count (examples: 1048576, 64KiB, 256MiB)"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown unit `{other}` (use B, KiB, MiB, GiB, KB, MB, GB)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// Parse `key=value`.
pub fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("`{s}` is not key=value")),
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // PostgreSQL's NOTICEs ("relation … already exists, skipping" at
        // every start) only with RUST_LOG asking for them.
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("info,tokio_postgres::connection=warn")
        });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(|| crate::status_line::Writer);
    let _ = match format {
        LogFormat::Text => tracing::subscriber::set_global_default(builder.finish()),
        LogFormat::Json => tracing::subscriber::set_global_default(builder.json().finish()),
    };
    // `log` records (rdkafka's) become tracing events, up to the level the
    // subscriber wants (set after it, as tracing-subscriber's own `init`
    // does).
    use tracing_log::AsLog;
    if log::set_boxed_logger(Box::new(QuietClose(tracing_log::LogTracer::new()))).is_ok() {
        log::set_max_level(tracing::level_filters::LevelFilter::current().as_log());
    }
}

/// The `log` → tracing bridge, minus one message: rust-rdkafka's consumer
/// `Drop` reports "Failed to close consumer queue on drop: … Broker handle
/// destroyed" when the consumer is already closed, which is always the
/// case after `KafkaSource`'s own (faster) close. Every other record passes.
struct QuietClose(tracing_log::LogTracer);

impl log::Log for QuietClose {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        self.0.enabled(metadata)
    }

    fn log(&self, record: &log::Record<'_>) {
        if record.target() == crate::source::CONSUMER_LOG_TARGET {
            let text = record.args().to_string();
            if text.starts_with("Failed to close consumer queue on drop")
                && text.contains("destroyed")
            {
                return;
            }
        }
        self.0.log(record);
    }

    fn flush(&self) {
        self.0.flush();
    }
}

/// Exit code used when stdout is a closed pipe (128 + SIGPIPE).
const BROKEN_PIPE_EXIT: u8 = 141;

/// Command output could not be written because stdout is a closed pipe.
#[derive(Debug, thiserror::Error)]
#[error("stdout is a closed pipe")]
pub(crate) struct StdoutClosed;

/// Turn an error writing command output into [`StdoutClosed`] (closed
/// pipe) or a `writing to stdout` error.
pub(crate) fn stdout_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        anyhow::Error::new(StdoutClosed)
    } else {
        anyhow::Error::new(e).context("writing to stdout")
    }
}

/// Write one line of command output to stdout (see `outln!`).
///
/// # Errors
/// [`StdoutClosed`] for a closed pipe, else the I/O error.
pub(crate) fn write_line(args: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(stdout_error)
}

/// Entry point used by the `host` binary.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Demo(args) => demo_cmd::run(args),
        Command::Run(args) => run_cmd::run(*args),
        Command::Swap(args) => swap_cmd::swap(args),
        Command::Status(args) => status_cmd::status(args),
        Command::Test(args) => test_cmd::run(args),
        Command::Plugin(cmd) => plugin_cmd::run(cmd),
        Command::Checkpoint(cmd) => checkpoint_cmd::run(cmd),
        Command::Group(cmd) => group_cmd::run(cmd),
    };
    crate::status_line::clear();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(CliError { error, .. }) if error.downcast_ref::<StdoutClosed>().is_some() => {
            std::process::ExitCode::from(BROKEN_PIPE_EXIT)
        }
        Err(CliError { code, error }) => {
            eprintln!("host: {error:#}");
            std::process::ExitCode::from(code as u8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("256MiB").unwrap(), 256 << 20);
        assert_eq!(parse_bytes("10").unwrap(), 10);
        assert!(parse_bytes("ten").is_err());
        assert!(parse_bytes("1XB").is_err());
    }

    #[test]
    fn kv_pairs() {
        assert_eq!(parse_kv("a=b=c").unwrap(), ("a".into(), "b=c".into()));
        assert!(parse_kv("=x").is_err());
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
