//! The Rust client (`credbroker::client`) and `credbroker derive` make the
//! relayed proof for an `exchange` resource by themselves (issue 41 item
//! 4): the htu from `GET /v1/info`, byte for byte, and one retry on
//! `upstream_proof_required` with the htu and nonce it names. Against the
//! real org AS, which checks the proof and binds its token to that key,
//! and, for an ID-JAG resource (one proof per leg), against the IdP and the
//! resource's AS of `id_jag.rs`.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use credbroker::client::{Answer, DeriveParams};
use credbroker::internals::jose::Es256Key;
use serde_json::json;

use super::exchange::{broker_config, claims, derive, Org, ORG_RESOURCE};
use super::id_jag::{self, Chain, CRM};
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
    // A client whose info is older than the nonce: the same one retry,
    // and its first proof (without the nonce the broker now knows) is
    // refused by the broker before anything is sent: one exchange.
    bound(
        client.derive(&params(&subject), &k).await.unwrap(),
        &org,
        &k,
    );
    assert_eq!(org.exchanges(), sent + 5);
}

/// Issued by the resource AS of `c`, bound to `k`, and accepted by a
/// resource server trusting only that AS's keys.
async fn chained(answer: Answer, c: &Chain, k: &Es256Key) {
    let t = match answer {
        Answer::Issued(t) => t,
        Answer::Refused(r) => panic!("refused: {r:?}"),
    };
    let token = t.access_token.expose().clone();
    let c2 = claims(&token);
    assert_eq!(c2["iss"], c.ras_issuer.as_str());
    assert_eq!(c2["cnf"]["jkt"], k.thumbprint());
    assert_eq!(c2["scope"], "crm:read");
    id_jag::verified_by_the_resource_as(c, &token).await;
}

/// The `htu` and `nonce` of the relayed proof the AS `peer` last received.
fn last_proof(peer: &mut NodePeer) -> (String, serde_json::Value) {
    let last = peer.call(&json!({"cmd": "last"}));
    let c = claims(last["dpop"].as_str().unwrap());
    (c["htu"].as_str().unwrap().to_owned(), c["nonce"].clone())
}

#[tokio::test]
async fn the_rust_client_makes_one_proof_per_leg_for_an_id_jag_resource() {
    let mut c = Chain::start();
    let b = id_jag::broker(&c);
    let k = key();
    let subject = c.subject();
    let p = DeriveParams {
        subject_token: &subject,
        step: "summarize",
        tool: "crm.read",
        resource: CRM,
        scope: Some("crm:read"),
    };
    let (o, r) = c.counts();
    // The control: with leg 1's proof only, the broker refuses naming leg
    // 2's token endpoint, and nothing is sent to either AS.
    let only_leg1 = json!({
        "subject_token": subject, "step": "summarize", "tool": "crm.read",
        "resource": CRM, "scope": "crm:read",
        "upstream_proofs": {"org": credbroker::internals::dpop::make_proof(&k, "POST", &c.org_te, now(), None, None).unwrap()},
    });
    let a = b.post_derive(&only_leg1, Some(&b.proof(&k)));
    assert_eq!(a.json()["reason"], "upstream_proof_required", "{}", a.body);
    assert_eq!(a.json()["upstream_htu"], c.ras_te.as_str());
    assert_eq!(c.counts(), (o, r));

    // The client makes both proofs the first time: one request at each AS,
    // each proof for its own leg's token endpoint.
    let client = b.client();
    chained(client.derive(&p, &k).await.unwrap(), &c, &k).await;
    assert_eq!(
        c.counts(),
        (o + 1, r + 1),
        "both proofs right the first time"
    );
    assert_eq!(last_proof(&mut c.org).0, c.org_te);
    assert_eq!(last_proof(&mut c.ras).0, c.ras_te);

    // The resource AS requires its nonce: leg 2 is refused with
    // use_dpop_nonce, relayed as upstream_proof_required naming leg 2's
    // htu and the nonce; the client retries once with both legs' proofs
    // (leg 1 is sent again), and remembers the nonce.
    c.ras_mode("nonce");
    let fresh = b.client();
    chained(fresh.derive(&p, &k).await.unwrap(), &c, &k).await;
    assert_eq!(c.counts(), (o + 3, r + 3));
    let (htu, nonce) = last_proof(&mut c.ras);
    assert_eq!(htu, c.ras_te);
    assert!(nonce.is_string(), "leg 2's proof carries the AS's nonce");
    assert!(last_proof(&mut c.org).1.is_null(), "leg 1's carries none");
    chained(fresh.derive(&p, &k).await.unwrap(), &c, &k).await;
    assert_eq!(c.counts(), (o + 4, r + 4), "the nonce is remembered");
    c.ras_mode("ok");
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

#[tokio::test]
async fn credbroker_derive_makes_one_proof_per_leg_for_an_id_jag_resource() {
    let mut c = Chain::start();
    let b = id_jag::broker(&c);
    let subject = c.subject();
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("dpop.pem");
    let (k, pkcs8) = Es256Key::generate().unwrap();
    credbroker::internals::config::write_secret_file(
        &key_path,
        credbroker::internals::cli::pem_pkcs8(pkcs8.expose()).as_bytes(),
    )
    .unwrap();
    let run = |tool: &str| {
        let out = std::process::Command::new(bin())
            .env("RUST_LOG", "off")
            .arg("derive")
            .arg("--socket")
            .arg(&b.socket)
            .args(["--subject-token", &subject, "--step", "summarize"])
            .args(["--tool", tool, "--resource", CRM, "--scope", "crm:read"])
            .arg("--dpop-key")
            .arg(&key_path)
            .output()
            .unwrap();
        (
            out.status.code(),
            serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or(json!(null)),
        )
    };
    let (o, r) = c.counts();
    let (code, answer) = run("crm.read");
    assert_eq!(code, Some(0), "{answer}");
    let token = answer["access_token"].as_str().unwrap();
    assert_eq!(claims(token)["iss"], c.ras_issuer.as_str());
    assert_eq!(claims(token)["cnf"]["jkt"], k.thumbprint());
    id_jag::verified_by_the_resource_as(&c, token).await;
    assert_eq!(
        c.counts(),
        (o + 1, r + 1),
        "both proofs right the first time"
    );
    // Control: a tool the policy does not know is refused (exit 2), and
    // nothing more is sent to either AS.
    let (code, answer) = run("crm.unknown");
    assert_eq!(code, Some(2), "{answer}");
    assert_eq!(c.counts(), (o + 1, r + 1));
}
