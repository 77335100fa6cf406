//! `credbroker proof --nonce`: the `proof` + curl recipe answers a
//! `use_dpop_nonce` challenge, as replicas require (docs/PROXY.md).
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use super::{proxy_policy, refusal, ProxyEnv, PROXY, READ_ROUTES};
use crate::support::services::ProviderOpts;
use crate::support::*;

/// `credbroker proof` for a GET of `url` with `token`, and `--nonce` when
/// given.
fn cli_proof(key: &std::path::Path, url: &str, token: &str, nonce: Option<&str>) -> String {
    let mut c = Command::new(bin());
    c.args(["proof", "--key"]).arg(key).args([
        "--method",
        "GET",
        "--url",
        url,
        "--access-token",
        token,
    ]);
    if let Some(n) = nonce {
        c.args(["--nonce", n]);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The tool's GET of `/user` through the proxy, with `token` and `proof`.
async fn send(p: &ProxyEnv, token: &str, proof: &str) -> reqwest::Response {
    p.send(
        "GET",
        "/proxy/acme/user",
        &format!("DPoP {token}"),
        proof,
        None,
    )
    .await
}

#[tokio::test]
async fn a_proxied_call_retried_with_the_nonce_of_proof_dash_dash_nonce_is_served() {
    let p = ProxyEnv::start_with(
        "\n[dpop]\nrequire_nonce = true",
        ProviderOpts {
            policy: Some(proxy_policy(READ_ROUTES)),
            ..ProviderOpts::default()
        },
    )
    .await;
    // The tool's key as a file, as the recipe has it (tool-key.pem).
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("tool-key.pem");
    let (key, pkcs8) = credbroker::internals::jose::Es256Key::generate().unwrap();
    credbroker::internals::config::write_secret_file(
        &key_file,
        credbroker::internals::cli::pem_pkcs8(pkcs8.expose()).as_bytes(),
    )
    .unwrap();
    let b = &p.env.broker;
    let token = services::issued(
        b.derive(
            &key,
            &b.subject_token("alice"),
            "triage",
            "acme.read",
            PROXY,
            None,
        )
        .await,
    );
    let token = token.access_token.expose().clone();
    let url = format!("{}/proxy/acme/user", b.issuer);

    // Without a nonce: challenged, with the nonce to use.
    let r = send(&p, &token, &cli_proof(&key_file, &url, &token, None)).await;
    let nonce = r
        .headers()
        .get("dpop-nonce")
        .expect("a DPoP-Nonce header")
        .to_str()
        .unwrap()
        .to_owned();
    let (status, body) = refusal(r).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("use_dpop_nonce"))
    );
    // A wrong nonce is challenged again.
    let r = send(
        &p,
        &token,
        &cli_proof(&key_file, &url, &token, Some("not-the-nonce")),
    )
    .await;
    assert_eq!(r.status(), 401);
    // Retried with the nonce: served.
    let r = send(
        &p,
        &token,
        &cli_proof(&key_file, &url, &token, Some(&nonce)),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}
