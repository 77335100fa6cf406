//! The Rust client (`credbroker::client`) and `credbroker derive` make the
//! relayed proof for an `exchange` resource by themselves (issue 41 item
//! 4): the htu from `GET /v1/info`, byte for byte, and one retry on
//! `upstream_proof_required` with the htu and nonce it names. Against the
//! real org AS, which checks the proof and binds its token to that key.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use credbroker::client::{Answer, DeriveParams};
use credbroker::internals::jose::Es256Key;
use serde_json::json;

use super::exchange::{broker_config, claims, derive, Org, ORG_RESOURCE};
use crate::support::*;

fn params(subject: &str) -> DeriveParams<'_> {
    DeriveParams {
        subject_token: subject,
        step: "summarize",
        tool: "org.notes",
        resource: ORG_RESOURCE,
        scope: Some("notes:read"),
    }
}

/// Issued, bound to `k`, by the org AS.
fn bound(answer: Answer, org: &Org, k: &Es256Key) -> String {
    let t = match answer {
        Answer::Issued(t) => t,
        Answer::Refused(r) => panic!("refused: {r:?}"),
    };
    let token = t.access_token.expose().clone();
    let c = claims(&token);
    assert_eq!(c["iss"], org.issuer.as_str());
    assert_eq!(c["cnf"]["jkt"], k.thumbprint());
    assert_eq!(c["scope"], "notes:read");
    token
}

#[tokio::test]
async fn the_rust_client_makes_the_relayed_proof_and_follows_the_as_nonce() {
    let mut org = Org::start();
    let b = broker_config(&org, &org.issuer.clone(), "");
    let k = key();
    let subject = org.subject(3600);
    let sent = org.exchanges();
    // Without a relayed proof the broker refuses (the control: what the
    // client adds is what makes the derive work).
    assert_eq!(
        derive(&b, &k, &subject, None).json()["reason"],
        "upstream_proof_required"
    );
    assert_eq!(org.exchanges(), sent);
    let client = b.client();
    bound(
        client.derive(&params(&subject), &k).await.unwrap(),
        &org,
        &k,
    );
    assert_eq!(
        org.exchanges(),
        sent + 1,
        "one exchange, proof right the first time"
    );
    // The same client for a `self` resource sends no relayed proof.
    let self_token = b.derive_ok(&k).await;
    assert_ne!(
        claims(self_token.access_token.expose())["iss"],
        org.issuer.as_str()
    );

    // An AS that requires its nonce: the first relayed proof has none, the
    // broker relays use_dpop_nonce as upstream_proof_required, and the
    // client retries once with the nonce it names.
    org.mode("nonce");
    let fresh = b.client();
    bound(fresh.derive(&params(&subject), &k).await.unwrap(), &org, &k);
    assert_eq!(org.exchanges(), sent + 3);
    // It remembers the nonce: the next derive needs one exchange.
    bound(fresh.derive(&params(&subject), &k).await.unwrap(), &org, &k);
    assert_eq!(org.exchanges(), sent + 4);
    // A client whose info is older than the nonce: the same one retry.
    bound(
        client.derive(&params(&subject), &k).await.unwrap(),
        &org,
        &k,
    );
    assert_eq!(org.exchanges(), sent + 6);
}

#[tokio::test]
async fn credbroker_derive_makes_the_relayed_proof() {
    let mut org = Org::start();
    let b = broker_config(&org, &org.issuer.clone(), "");
    let subject = org.subject(3600);
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("dpop.pem");
    let (k, pkcs8) = Es256Key::generate().unwrap();
    credbroker::internals::config::write_secret_file(
        &key_path,
        credbroker::internals::cli::pem_pkcs8(pkcs8.expose()).as_bytes(),
    )
    .unwrap();
    let run = |resource: &str, tool: &str| {
        let out = std::process::Command::new(bin())
            .env("RUST_LOG", "off")
            .arg("derive")
            .arg("--socket")
            .arg(&b.socket)
            .args(["--subject-token", &subject, "--step", "summarize"])
            .args([
                "--tool",
                tool,
                "--resource",
                resource,
                "--scope",
                "notes:read",
            ])
            .arg("--dpop-key")
            .arg(&key_path)
            .output()
            .unwrap();
        (
            out.status.code(),
            serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or(json!(null)),
        )
    };
    let (code, answer) = run(ORG_RESOURCE, "org.notes");
    assert_eq!(code, Some(0), "{answer}");
    let c = claims(answer["access_token"].as_str().unwrap());
    assert_eq!(c["iss"], org.issuer.as_str());
    assert_eq!(c["cnf"]["jkt"], k.thumbprint());
    // Control: the same command for a tool the policy does not know is
    // refused (exit 2), and nothing more is sent to the AS.
    let sent = org.exchanges();
    let (code, answer) = run(ORG_RESOURCE, "org.unknown");
    assert_eq!(code, Some(2), "{answer}");
    assert_eq!(org.exchanges(), sent);
}
