//! `credbroker upstream check NAME` against the real org AS
//! (`tests/peers/org-as.mjs`) and, for identity chaining, the IdP and the
//! resource AS of `id_jag.rs`: each failure (a wrong client secret, an IdP
//! not advertising the id-jag token type) with its passing control.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use super::exchange::{broker_config, Org};
use super::id_jag::{self, Chain};
use crate::support::*;

/// Runs the command: its exit code and its standard output.
fn check(config: &Path, name: &str) -> (Option<i32>, String) {
    let out = std::process::Command::new(bin())
        .env("RUST_LOG", "off")
        .args(["upstream", "check", "--config"])
        .arg(config)
        .arg(name)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The line of check `name` in `out`.
fn check_line<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(name))
        .unwrap_or_else(|| panic!("no {name} line in:\n{out}"))
}

#[tokio::test]
async fn a_wrong_client_secret_fails_client_auth_and_the_right_one_passes() {
    let mut org = Org::start();
    let b = broker_config(&org, &org.issuer.clone(), "");
    let sent = org.exchanges();
    let (code, out) = check(&b.config, "org");
    assert_eq!(code, Some(0), "{out}");
    assert!(check_line(&out, "metadata").contains("ok"), "{out}");
    assert!(check_line(&out, "metadata").contains(&org.issuer), "{out}");
    assert!(
        check_line(&out, "grant").trim_start().starts_with("ok"),
        "{out}"
    );
    let auth = check_line(&out, "client_auth");
    assert!(auth.trim_start().starts_with("ok"), "{out}");
    assert!(auth.contains("invalid_grant"), "{out}");
    assert!(out.ends_with("upstream org: ok\n"), "{out}");
    // One token request, and the secret is printed nowhere.
    assert_eq!(org.exchanges(), sent + 1);
    assert!(!out.contains(super::exchange::SECRET), "{out}");

    // The wrong secret: the AS answers invalid_client.
    let secret = b.dir.path().join("org-secret");
    std::fs::write(&secret, "not-the-secret").unwrap();
    let (code, out) = check(&b.config, "org");
    assert_eq!(code, Some(1), "{out}");
    let auth = check_line(&out, "client_auth");
    assert!(auth.trim_start().starts_with("FAIL"), "{out}");
    assert!(auth.contains("invalid_client"), "{out}");
    assert!(out.ends_with("upstream org: FAILED\n"), "{out}");
    assert!(!out.contains("not-the-secret"), "{out}");

    // An upstream the config does not have.
    let (code, _) = check(&b.config, "nowhere");
    assert_eq!(code, Some(1));
}

#[tokio::test]
async fn an_idp_not_advertising_id_jag_fails_the_grant_check() {
    let mut c = Chain::start_advertising(false);
    let b = id_jag::broker(&c);
    let (code, out) = check(&b.config, "org");
    assert_eq!(code, Some(1), "{out}");
    let grant = check_line(&out, "grant");
    assert!(grant.trim_start().starts_with("FAIL"), "{out}");
    assert!(grant.contains("id-jag"), "{out}");
    drop(b);
    drop(c);

    // The control: an IdP that advertises it, and its resource AS checked
    // for the jwt-bearer grant (leg 2), its client authenticated.
    c = Chain::start();
    let b = id_jag::broker(&c);
    let (code, out) = check(&b.config, "org");
    assert_eq!(code, Some(0), "{out}");
    let grant = check_line(&out, "grant");
    assert!(grant.trim_start().starts_with("ok"), "{out}");
    assert!(grant.contains("lists id-jag"), "{out}");
    let (code, out) = check(&b.config, "crm");
    assert_eq!(code, Some(0), "{out}");
    let grant = check_line(&out, "grant");
    assert!(grant.trim_start().starts_with("ok"), "{out}");
    assert!(grant.contains("lists jwt-bearer"), "{out}");
    assert!(
        check_line(&out, "client_auth").contains("invalid_grant"),
        "{out}"
    );
    let _ = c.counts();
}

#[tokio::test]
async fn private_key_jwt_is_checked_with_the_running_brokers_key_or_the_one_in_its_store() {
    use super::client_auth::{broker, get_json, kids, Org, PKJWT};
    let mut org = Org::start("private_key_jwt");
    // Two brokers, each its own store and so its own client key; the AS
    // knows `ours` only (a copy of its client JWKS, served by the AS peer
    // itself so that it stays when the broker stops).
    let mut ours = broker(&org, PKJWT, None);
    let mut other = broker(&org, PKJWT, None);
    let (status, jwks) = get_json(&format!("{}/.well-known/client-jwks.json", ours.public)).await;
    assert_eq!(status, 200);
    let kid = kids(&jwks)[0].clone();
    let r = org
        .peer
        .call(&serde_json::json!({"cmd": "client_jwks", "jwks": jwks}));
    assert_eq!(r["ok"], true);
    let last_assertion = |org: &mut Org| {
        org.peer.call(&serde_json::json!({"cmd": "last"}))["form"]["client_assertion"][0]
            .as_str()
            .expect("a client assertion was sent")
            .to_owned()
    };

    // Running: the other broker signs with a key the AS does not know.
    let (code, out) = check(&other.config, "org");
    assert_eq!(code, Some(1), "{out}");
    let auth = check_line(&out, "client_auth");
    assert!(auth.trim_start().starts_with("FAIL"), "{out}");
    assert!(auth.contains("invalid_client"), "{out}");
    assert!(auth.contains("by the running instance"), "{out}");
    assert!(!out.contains(&last_assertion(&mut org)), "{out}");
    assert_eq!(org.assertions()["verified"], 0);
    // The control: the broker whose key the AS has passes.
    let (code, out) = check(&ours.config, "org");
    assert_eq!(code, Some(0), "{out}");
    let auth = check_line(&out, "client_auth");
    assert!(auth.trim_start().starts_with("ok"), "{out}");
    assert!(auth.contains("invalid_grant"), "{out}");
    assert!(auth.contains(&format!("client key {kid}")), "{out}");
    assert!(auth.contains("by the running instance"), "{out}");
    assert_eq!(org.assertions()["verified"], 1);
    let sent = last_assertion(&mut org);
    assert!(!out.contains(&sent), "{out}");
    assert!(!ours.log_text().contains(&sent));
    // A file that differs from what the running instance was started with
    // (another client id, same admin socket): its answer is not taken.
    let edited = ours.config.with_file_name("edited.toml");
    let text = std::fs::read_to_string(&ours.config).unwrap();
    let changed = text.replace(
        "client_id = \"credbroker\"\nclient_auth",
        "client_id = \"someone-else\"\nclient_auth",
    );
    assert_ne!(changed, text);
    std::fs::write(&edited, changed).unwrap();
    let count =
        |org: &mut Org| org.peer.call(&serde_json::json!({"cmd": "count"}))["exchanges"].clone();
    let before = count(&mut org);
    let (code, out) = check(&edited, "org");
    assert_eq!(code, Some(1), "{out}");
    let auth = check_line(&out, "client_auth");
    assert!(
        auth.contains("differs") && auth.contains("client_id"),
        "{out}"
    );
    assert!(auth.contains("nothing was sent"), "{out}");
    assert_eq!(count(&mut org), before, "the instance sent nothing");

    // No instance runs: the key is read from each store.
    other.stop();
    ours.stop();
    let (code, out) = check(&other.config, "org");
    assert_eq!(code, Some(1), "{out}");
    let auth = check_line(&out, "client_auth");
    assert!(auth.trim_start().starts_with("FAIL"), "{out}");
    assert!(auth.contains("invalid_client"), "{out}");
    assert!(auth.contains("read from the store"), "{out}");
    assert_eq!(org.assertions()["verified"], 1);
    let (code, out) = check(&ours.config, "org");
    assert_eq!(code, Some(0), "{out}");
    let auth = check_line(&out, "client_auth");
    assert!(auth.trim_start().starts_with("ok"), "{out}");
    assert!(auth.contains(&format!("client key {kid}")), "{out}");
    assert!(auth.contains("read from the store"), "{out}");
    assert_eq!(org.assertions()["verified"], 2);
    assert!(!out.contains(&last_assertion(&mut org)), "{out}");
}
