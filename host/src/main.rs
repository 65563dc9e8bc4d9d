//! `host`: the Sluice command-line entry point. Parses flags, sets up
//! logging, runs the subcommand and maps its outcome to an exit code
//! (see [`sluice_host::cli::ExitCode`]).

fn main() -> std::process::ExitCode {
    sluice_host::cli::main()
}
