//! `credbroker accounts list|disconnect` and `credbroker keys rotate-vault`,
//! through the admin socket and, with no instance running, on the store.
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
async fn list_and_disconnect_revoke_at_the_provider_then_delete() {
    let mut env = ServiceEnv::start();
    connect(&mut env, "alice", "octo-alice").await;
    connect(&mut env, "bob", "octo-bob").await;

    let (code, v, _) = cli(&env, &["accounts", "list"]);
    assert_eq!(code, 0, "{v}");
    let accounts = v["accounts"].as_array().unwrap();
    assert_eq!(accounts.len(), 2);
    assert!(
        v.get("running").is_none(),
        "answered by the running instance"
    );
    let (_, v, _) = cli(&env, &["accounts", "list", "--person", "alice"]);
    let a = &v["accounts"][0];
    assert_eq!(v["accounts"].as_array().unwrap().len(), 1);
    assert_eq!(a["account_name"], "octo-alice");
    assert_eq!(a["status"], "active");
    assert_eq!(a["allowances"][0]["agent"], "repo-helper");
    assert_eq!(a["allowances"][0]["scopes"], serde_json::json!(["repo"]));
    assert!(!v.to_string().contains("access_token") && !v.to_string().contains("sealed"));

    assert_eq!(env.peer.live_refresh_tokens("octo-alice").await, 1);
    let (code, v, stderr) = cli(
        &env,
        &[
            "accounts",
            "disconnect",
            "--person",
            "alice",
            "--service",
            "acme",
        ],
    );
    assert_eq!(code, 0, "{v} {stderr}");
    assert_eq!(v["revocation"], "revoked");
    assert_eq!(v["deleted"], true);
    // It says exactly what was revoked at the provider.
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("revoked at Acme: the refresh token and the access token (RFC 7009)"),
        "{v}"
    );
    assert_eq!(
        env.peer.live_refresh_tokens("octo-alice").await,
        0,
        "revoked at the provider (RFC 7009)"
    );
    assert!(env
        .broker
        .audit_lines()
        .iter()
        .any(|e| e["event"] == "account.disconnected" && e["reason"] == "revoked"));
    let r = refused(env.derive(&key(), "alice", "acme.issues").await);
    assert_eq!(r.reason.as_deref(), Some("connect_required"));
    // Positive control: bob is untouched.
    issued(env.derive(&key(), "bob", "acme.issues").await);
    assert_eq!(env.peer.live_refresh_tokens("octo-bob").await, 1);

    // Provider down: revocation fails, the account is kept unless forced.
    env.peer.kill();
    let (code, v, _) = cli(
        &env,
        &[
            "accounts",
            "disconnect",
            "--person",
            "bob",
            "--service",
            "acme",
        ],
    );
    assert_eq!(code, 1);
    assert_eq!(
        (v["revocation"].as_str(), v["deleted"].as_bool()),
        (Some("failed"), Some(false))
    );
    let (code, v, _) = cli(
        &env,
        &[
            "accounts",
            "disconnect",
            "--person",
            "bob",
            "--service",
            "acme",
            "--force",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(v["deleted"], true);
}

#[tokio::test]
async fn ciphertext_copied_into_another_record_is_reported_and_not_served() {
    let mut env = ServiceEnv::start();
    connect(&mut env, "alice", "octo-alice").await;
    connect(&mut env, "mallory", "octo-mallory").await;
    env.broker.stop();
    {
        // Someone with write access to the store copies alice's sealed
        // tokens into mallory's record.
        let parts = env.open_parts();
        let store = parts.vault.store().clone();
        let recs = store
            .scan_prefix(credbroker::internals::store::Tree::Accounts, b"")
            .unwrap();
        let find = |sub: &str| {
            recs.iter()
                .find(|(k, _)| k.windows(sub.len()).any(|w| w == sub.as_bytes()))
                .unwrap()
                .clone()
        };
        let (_, alice) = find("alice");
        let (mk, mallory) = find("mallory");
        let a: serde_json::Value = serde_json::from_slice(&alice).unwrap();
        let mut m: serde_json::Value = serde_json::from_slice(&mallory).unwrap();
        m["sealed"] = a["sealed"].clone();
        store
            .put(
                credbroker::internals::store::Tree::Accounts,
                &mk,
                &serde_json::to_vec(&m).unwrap(),
            )
            .unwrap();
    }
    // Reported offline, with a distinct exit code.
    let (code, v, _) = cli(&env, &["accounts", "list"]);
    assert_eq!(code, 5, "{v}");
    assert_eq!(v["running"], false);
    assert_eq!(v["unreadable"][0]["person_sub"], "mallory");
    env.broker.restart();

    // Not served: a 500 with a correlation id, reason vault_error.
    env.peer.set_access_ttl(3600).await;
    let r = refused(env.derive(&key(), "mallory", "acme.issues").await);
    assert_eq!(
        (r.status, r.error.as_str(), r.reason.as_deref()),
        (500, "server_error", Some("vault_error"))
    );
    assert!(
        env.broker.log_text().contains("cannot be opened"),
        "reported in the log"
    );
    let (code, v, _) = cli(&env, &["accounts", "list"]);
    assert_eq!(code, 5);
    assert!(v["unreadable"][0]["problem"]
        .as_str()
        .unwrap()
        .contains("copied from another record"));
    // Positive control: alice's own record still serves her.
    issued(env.derive(&key(), "alice", "acme.issues").await);
}

#[tokio::test]
async fn rotate_vault_interrupted_then_resumed_offline_and_through_the_admin_socket() {
    let mut env = ServiceEnv::start();
    connect(&mut env, "alice", "octo-alice").await;
    connect(&mut env, "bob", "octo-bob").await;
    // The keys are in the store's key record: no key file is written.
    let key_dir = env.broker.path("keys/vault");
    assert!(!key_dir.exists(), "{} was made", key_dir.display());

    // Through the running instance, stopped after one record (of four:
    // each person's account and their allowance for the agent).
    let (code, v, _) = cli(&env, &["keys", "rotate-vault", "--limit", "1"]);
    assert_eq!(code, 4, "not finished: {v}");
    assert_eq!(
        (
            v["rewrapped"].as_u64(),
            v["remaining"].as_u64(),
            v["done"].as_bool()
        ),
        (Some(1), Some(3), Some(false))
    );
    let new_key = v["current_key"].as_str().unwrap().to_string();
    // Both accounts are served meanwhile (old key still decrypts).
    env.peer.set_access_ttl(3600).await;
    issued(env.derive(&key(), "alice", "acme.issues").await);
    issued(env.derive(&key(), "bob", "acme.issues").await);

    // Resumed offline (no instance): no new key, the rest is re-wrapped.
    env.broker.stop();
    let (code, v, stderr) = cli(&env, &["keys", "rotate-vault"]);
    assert_eq!(code, 0, "{v} {stderr}");
    assert_eq!(v["current_key"], new_key);
    assert_eq!(v["done"], true);
    assert_eq!(v["running"], serde_json::Value::Null);
    let retired = v["retired_keys"][0].as_str().unwrap().to_string();
    assert!(
        env.broker
            .audit_lines()
            .iter()
            .any(|e| e["event"] == "vault.rotated" && e["outcome"] == "done"),
        "the offline run is audited too"
    );
    let (_, list, _) = cli(&env, &["accounts", "list"]);
    assert!(list["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a["key_id"] == new_key.as_str()));

    assert_ne!(retired, new_key);
    assert!(!key_dir.exists(), "{} was made", key_dir.display());
    env.broker.restart();
    issued(env.derive(&key(), "alice", "acme.issues").await);

    // A full rotation through the admin socket.
    let (code, v, _) = cli(&env, &["keys", "rotate-vault"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["rewrapped"], 4);
    assert_eq!(v["dropped_allowances"], 0);
    issued(env.derive(&key(), "bob", "acme.issues").await);
}
