//! The `credbroker` binary: parses the command line and calls the library.

fn main() -> std::process::ExitCode {
    credbroker::internals::cli::main()
}
