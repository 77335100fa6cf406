//! The example resource server (`examples/resource_server.rs`), included as
//! a module and served in-process: an example is not a binary Cargo hands
//! to integration tests, and building it from inside a test would fight the
//! running `cargo test` for the build directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use clap::Parser;

#[allow(dead_code)]
#[path = "../../../examples/resource_server.rs"]
pub(crate) mod example;

/// Serves `examples/resource_server.rs` in-process, as its command line
/// would configure it (on a free port unless `cli` has `--listen`).
/// Returns its base URL.
pub(crate) async fn start_resource_server(cli: &[&str]) -> String {
    let listen: &[&str] = if cli.contains(&"--listen") {
        &[]
    } else {
        &["--listen", "127.0.0.1:0"]
    };
    let args =
        example::Args::try_parse_from(["resource_server"].iter().chain(listen).chain(cli)).unwrap();
    let app = Arc::new(example::App::new(&args).await.unwrap());
    let listener = tokio::net::TcpListener::bind(args.listen).await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(example::serve(listener, app));
    base
}
