//! `credbroker persons revoke --revoke-at-providers`, `persons list` and
//! `persons restore` against a running instance with the `acme` provider
//! (the oidc-provider peer): the stopped person's grant is revoked at the
//! provider (RFC 7009: no live refresh token left there) and the account is
//! marked for reconnection, while Bob's account and derives are untouched.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use crate::support::services::{issued, refused, ServiceEnv};
use crate::support::*;

fn cli(env: &ServiceEnv, args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = Command::new(bin())
        .args(args)
        .arg("--config")
        .arg(&env.broker.config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let v = serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null);
    (
        out.status.code().unwrap_or(-1),
        v,
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

async fn connect(env: &mut ServiceEnv, sub: &str, account: &str) {
    let r = refused(env.derive(&key(), sub, "acme.issues").await);
    env.play_pages(r.connect_uri.as_deref().unwrap(), sub, account)
        .await;
}

#[tokio::test]
async fn revoke_at_providers_revokes_the_grant_and_marks_the_account_and_restore_lifts_the_stop() {
    let mut env = ServiceEnv::start();
    connect(&mut env, "alice", "octo-alice").await;
    connect(&mut env, "bob", "octo-bob").await;
    issued(env.derive(&key(), "alice", "acme.issues").await);
    assert_eq!(env.peer.live_refresh_tokens("octo-alice").await, 1);
    let iss = env.broker.issuer.clone();

    let (code, v, stderr) = cli(
        &env,
        &[
            "persons",
            "revoke",
            "--person",
            &iss,
            "alice",
            "--reason",
            "laptop lost",
            "--revoke-at-providers",
        ],
    );
    assert_eq!(code, 0, "{v} {stderr}");
    assert_eq!(v["stop"]["person_sub"], "alice", "{v}");
    assert_eq!(v["stop"]["lift"], "restore");
    assert_eq!(v["providers"][0]["service"], "acme", "{v}");
    assert_eq!(v["providers"][0]["revocation"], "revoked", "{v}");
    assert_eq!(
        env.peer.live_refresh_tokens("octo-alice").await,
        0,
        "revoked at the provider (RFC 7009)"
    );
    let r = refused(env.derive(&key(), "alice", "acme.issues").await);
    assert_eq!(r.reason.as_deref(), Some("person_revoked"));
    assert_eq!((r.status, r.error.as_str()), (403, "access_denied"));
    // Bob: untouched at the provider, and served.
    assert_eq!(env.peer.live_refresh_tokens("octo-bob").await, 1);
    issued(env.derive(&key(), "bob", "acme.issues").await);

    let (code, v, _) = cli(&env, &["persons", "list"]);
    assert_eq!(code, 0);
    let persons = v["persons"].as_array().unwrap();
    assert_eq!(persons.len(), 1, "{v}");
    assert_eq!(persons[0]["reason"], "laptop lost");
    let events = env.broker.audit_lines();
    let revoked = events
        .iter()
        .find(|e| e["event"] == "person.revoked")
        .unwrap();
    assert_eq!(revoked["revoke_at_providers"], true, "{revoked}");
    assert!(events.iter().any(|e| e["event"] == "account.disconnected"
        && e["outcome"] == "kept"
        && e["reason"] == "revoked"));

    // Restored: the stop is gone, and her account asks to be connected again.
    let (code, v, _) = cli(&env, &["persons", "restore", "--person", &iss, "alice"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["restored"], true);
    let r = refused(env.derive(&key(), "alice", "acme.issues").await);
    assert_eq!(r.reason.as_deref(), Some("reconnect_required"), "{r:?}");
    // Restoring someone not stopped changes nothing.
    let (code, v, _) = cli(&env, &["persons", "restore", "--person", &iss, "alice"]);
    assert_eq!((code, &v["restored"]), (0, &serde_json::json!(false)));
}
