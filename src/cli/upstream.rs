//! `credbroker upstream check NAME`: one upstream authorization server
//! checked against what the config needs (`derive::upstreams::check`),
//! each check on its own line; exit 1 when one fails.

use std::path::Path;

use crate::derive::upstreams::{Outcome, Upstreams};
use crate::infra::config::Config;

use super::exit::Exit;
use super::Res;

/// `upstream check`: builds the upstreams as the instance does (the client
/// secret files read, mode 0600), without the store: `private_key_jwt`'s
/// client key is not loaded, so its `client_auth` check is skipped.
pub(super) async fn check(config: &Path, name: &str) -> Res {
    let cfg = Config::load(config)?;
    if !cfg.upstreams.contains_key(name) {
        eprintln!("error: {}: no [upstreams.{name}] table", cfg.file.display());
        return Ok(Exit::Failed);
    }
    let ups = Upstreams::new(
        &cfg.upstreams,
        &Default::default(),
        cfg.dpop.algs.clone(),
        16,
    )?;
    let now = crate::base::clock::Clock::now(&crate::base::clock::SystemClock);
    let lines = ups.check(name, now).await.unwrap_or_default();
    let mut failed = false;
    println!("upstream {name}:");
    for l in &lines {
        let mark = match l.outcome {
            Outcome::Ok => "ok  ",
            Outcome::Fail => {
                failed = true;
                "FAIL"
            }
            Outcome::Skip => "skip",
        };
        println!("  {mark} {:<18} {}", l.name, l.detail);
    }
    if failed {
        println!("upstream {name}: FAILED");
        Ok(Exit::Failed)
    } else {
        println!("upstream {name}: ok");
        Ok(Exit::Ok)
    }
}
