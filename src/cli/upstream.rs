//! `credbroker upstream check NAME`: one upstream authorization server
//! checked against what the config needs (`derive::upstreams::check`),
//! each check on its own line; exit 1 when one fails.
//!
//! The metadata checks are read by this process, from the file. The client
//! authentication test of a `client_secret_basic`/`_post` client is sent
//! from here too (the secret file is read, mode 0600). A `private_key_jwt`
//! client's key is sealed in the store: when an instance runs, it signs and
//! sends the test itself (`POST /upstreams/check-client-auth` on its admin
//! socket; the key never leaves it), only when its upstream has this file's
//! issuer, client id, method and token endpoint (else it sends nothing); when
//! none runs, the key ring is read from the store (read only: nothing is
//! written, no ring is created) as the other store commands open it.

use std::path::Path;
use std::sync::Arc;

use crate::derive::upstreams::{CheckLine, Outcome, Upstreams};
use crate::infra::config::{Config, UpstreamClientAuth};

use super::exit::Exit;
use super::online::{reach, Reached};
use super::Res;

/// `upstream check`: builds the upstreams as the instance does (the client
/// secret files read, mode 0600), runs the checks, and for
/// `private_key_jwt` has the client authentication test run with the
/// client key (module doc).
pub(super) async fn check(config: &Path, name: &str) -> Res {
    let cfg = Config::load(config)?;
    let Some(up) = cfg.upstreams.get(name) else {
        eprintln!("error: {}: no [upstreams.{name}] table", cfg.file.display());
        return Ok(Exit::Failed);
    };
    let pkjwt = matches!(up.client_auth, UpstreamClientAuth::PrivateKeyJwt);
    let mut ups = Upstreams::new(
        &cfg.upstreams,
        &Default::default(),
        cfg.dpop.algs.clone(),
        16,
    )?;
    let now = crate::base::clock::Clock::now(&crate::base::clock::SystemClock);
    let mut lines = ups.check(name, now).await.unwrap_or_default();
    // Without the key, check() skipped the test (or stopped at metadata).
    let skipped = lines.iter().position(|l| l.name == "client_auth");
    if let (true, Some(at)) = (pkjwt, skipped) {
        lines[at] = with_client_key(&cfg, name, &mut ups, now).await?;
    }
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

/// The `client_auth` line of a `private_key_jwt` client: run by the
/// running instance, or here with the key ring read from the store.
async fn with_client_key(
    cfg: &Config,
    name: &str,
    ups: &mut Upstreams,
    now: i64,
) -> Result<CheckLine, Box<dyn std::error::Error>> {
    let up = &cfg.upstreams[name];
    let body = serde_json::json!({
        "upstream": name,
        "issuer": up.issuer,
        "client_id": up.client_id,
        "client_auth": "private_key_jwt",
        "token_endpoint": ups.resolved_token_endpoint(name).await,
    })
    .to_string();
    match reach(cfg, "POST", "/upstreams/check-client-auth", &body).await? {
        Reached::Instance { status: 200, body } => {
            let v: serde_json::Value = serde_json::from_str(&body)?;
            Ok(from_instance(cfg, &v))
        }
        Reached::Instance { status, body } => Ok(fail(format!(
            "not run: {} (admin socket {})",
            super::operator::admin_refusal(status, &body),
            cfg.admin_socket.display()
        ))),
        Reached::Stopped(off) => {
            let sealer = off.sealer(cfg)?;
            let Some(keys) =
                crate::derive::client_keys::ClientKeys::peek(off.store.as_ref(), &sealer, now)?
            else {
                return Ok(fail(
                    "no client key in the store yet: the broker creates it at its first start \
                     (then register its client JWKS URL at the AS)",
                ));
            };
            ups.set_client_keys(Arc::new(keys), &cfg.issuer, &cfg.agent);
            let mut l = ups
                .check_client_auth(name, now)
                .await
                .map(|c| c.line)
                .unwrap_or_else(|| fail("not configured"));
            l.detail
                .push_str("; the client key read from the store (no instance runs)");
            Ok(l)
        }
    }
}

/// The running instance's answer as a line (it ran the test only for an
/// upstream configured as in this file).
fn from_instance(cfg: &Config, v: &serde_json::Value) -> CheckLine {
    let detail = v["detail"].as_str().unwrap_or_default();
    let outcome = match v["outcome"].as_str() {
        Some("ok") => Outcome::Ok,
        Some("skip") => Outcome::Skip,
        _ => Outcome::Fail,
    };
    CheckLine {
        name: "client_auth",
        outcome,
        detail: format!(
            "{detail}; signed and sent by the running instance (admin socket {})",
            cfg.admin_socket.display()
        ),
    }
}

fn fail(detail: impl Into<String>) -> CheckLine {
    CheckLine {
        name: "client_auth",
        outcome: Outcome::Fail,
        detail: detail.into(),
    }
}
