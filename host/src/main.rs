//! `host`: the Sluice command-line entry point. Parses flags, sets up
//! logging, runs the subcommand and maps its outcome to an exit code
//! (see [`sluice_host::cli::ExitCode`]).

/// mimalloc for every allocation of the process: Rust's (this) and, with
/// the crate's `override` feature, librdkafka's and SQLite's `malloc`.
/// Records are allocated on the fetch thread and freed on the map or sink
/// thread, and librdkafka allocates and frees a buffer per record to read
/// its headers; under glibc's allocator that churn (arena locks, chunk
/// consolidation, heap growth by `mprotect`) was about a quarter of
/// passthrough's CPU time. `no_thp` keeps mimalloc from asking for
/// transparent huge pages, which raised peak RSS by ~60 MiB.
/// Measured in docs/benchmarks.md, session 16.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sluice_host::cli::main()
}
