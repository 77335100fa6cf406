//! Connects Alice's demo account at a running quick start, so that a
//! benchmark can then load the `service` path (scripts/bench-store; see
//! docs/PERFORMANCE.md, "Replicated store"). A set-up step, not a test: it
//! stops with a message at the first thing that is not as a person would
//! find it.
//!
//!     cargo build --release --example connect_demo
//!     target/release/examples/connect_demo --socket DIR/credbroker.sock \
//!         --issuer URL --demo URL --subject-token T --banner QUICKSTART.LOG \
//!         [--check TOOL=RESOURCE]...
//!
//! What it does, against a `credbroker quickstart --dir DIR` that runs on
//! whatever store its config names (sled or `[postgres]`):
//! 1. the quick start's demo tool (`--tool`, `--resource`) derives over the
//!    orchestrator socket and must be refused `connect_required`, with a
//!    connect link;
//! 2. Alice opens the link, signs in with the password the quick start
//!    printed when it made her account (read from `--banner`, its standard
//!    error, so the password is on no command line), presses Connect and
//!    allows at the demo service: the pages' real forms over HTTP
//!    (examples/support/connect.rs, shared with examples/proxy_bench.rs);
//! 3. the same derive, and one per `--check`, must now be issued.
//!
//! Nothing secret is printed: the tokens it gets are dropped unshown.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use clap::Parser;
use credbroker::client::{Answer, Client, DeriveParams};
use credbroker::internals::jose::Es256Key;

#[path = "support/connect.rs"]
mod connect;

#[derive(Parser, Debug)]
#[command(about = "Connects Alice's demo account at a running quick start, through its pages")]
struct Args {
    /// The quick start's orchestrator socket.
    #[arg(long)]
    socket: PathBuf,
    /// The broker's issuer URL (its pages are there).
    #[arg(long)]
    issuer: String,
    /// The demo service's base URL (`http://127.0.0.1:PORT`).
    #[arg(long)]
    demo: String,
    /// Alice's subject token.
    #[arg(long)]
    subject_token: String,
    /// The quick start's standard error, which holds the banner with
    /// Alice's password.
    #[arg(long)]
    banner: PathBuf,
    #[arg(long, default_value = "summarize")]
    step: String,
    /// The tool whose refusal carries the connect link.
    #[arg(long, default_value = "demo.notes")]
    tool: String,
    /// Its resource. Default: the quick start's demo proxy, `{issuer}/proxy/demo`.
    #[arg(long)]
    resource: Option<String>,
    /// `TOOL=RESOURCE`: another tool of the demo service that must be issued
    /// once the account is connected (repeatable).
    #[arg(long)]
    check: Vec<String>,
}

fn main() {
    let args = Args::parse();
    let issuer = args.issuer.trim_end_matches('/').to_string();
    let demo = args.demo.trim_end_matches('/').to_string();
    let resource = args
        .resource
        .clone()
        .unwrap_or_else(|| format!("{issuer}/proxy/demo"));
    let mut checks = vec![(args.tool.clone(), resource.clone())];
    for c in &args.check {
        let (t, r) = c
            .split_once('=')
            .unwrap_or_else(|| panic!("--check {c}: give TOOL=RESOURCE"));
        checks.push((t.to_string(), r.to_string()));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let key = Es256Key::generate().unwrap().0;
    let client = Client::new(&args.socket, &issuer);
    let derive = |tool: &str, resource: &str| {
        rt.block_on(client.derive(
            &DeriveParams {
                subject_token: &args.subject_token,
                step: &args.step,
                tool,
                resource,
                scope: None,
            },
            &key,
        ))
        .unwrap_or_else(|e| panic!("{}: {e}", args.socket.display()))
    };

    let link = match derive(&args.tool, &resource) {
        Answer::Refused(r) if r.reason.as_deref() == Some("connect_required") => r
            .connect_uri
            .expect("a connect_required refusal carries its link"),
        Answer::Refused(r) => panic!(
            "{} for {resource}: refused {:?} ({:?}), not connect_required",
            args.tool, r.reason, r.error_description
        ),
        Answer::Issued(_) => panic!(
            "{} for {resource}: issued before any account was connected (is this a fresh store?)",
            args.tool
        ),
    };
    let banner = std::fs::read_to_string(&args.banner)
        .unwrap_or_else(|e| panic!("{}: {e}", args.banner.display()));
    let password = connect::alice_password(&banner).unwrap_or_else(|| {
        panic!(
            "{}: no password for alice in the quick start's banner (it prints one only when it makes her account)",
            args.banner.display()
        )
    });
    rt.block_on(connect::connect_over_http(&issuer, &demo, &link, &password));
    for (tool, resource) in &checks {
        match derive(tool, resource) {
            Answer::Issued(_) => println!("connected: {tool} for {resource} is issued"),
            Answer::Refused(r) => panic!(
                "{tool} for {resource}: refused {:?} ({:?}) after the account was connected",
                r.reason, r.error_description
            ),
        }
    }
}
