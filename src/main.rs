//! The `credbroker` binary: parses the command line and calls the library.

// Benchmarks only (the `alloc-count` feature, off by default and never in a
// shipped build): every allocation counted, reported on SIGUSR2
// (crates/alloc-count).
#[cfg(feature = "alloc-count")]
#[global_allocator]
static ALLOC: credbroker_alloc_count::Counting = credbroker_alloc_count::Counting;

fn main() -> std::process::ExitCode {
    // Before any thread starts: they inherit its blocked SIGUSR2.
    #[cfg(feature = "alloc-count")]
    credbroker_alloc_count::report_on_signal();
    credbroker::internals::cli::main()
}
