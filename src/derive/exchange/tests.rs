//! The derive decides on one policy snapshot, and everything it
//! records names that snapshot, even when a reload lands meanwhile.
// reason: test code, where a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::*;
use crate::base::secret::SecretString;

const POLICY: &str = r#"agent = "repo-helper"

[resources."https://api.acme.example"]
source = "service"
service = "acme"
delivery = "provider_token"

[tools."acme.issues"]
resource = "https://api.acme.example"
scopes = ["repo"]
steps = ["triage"]
"#;

fn secret(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[tokio::test]
async fn link_event_names_the_policy_of_the_derive_not_a_later_reload() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    secret(&d.join("acme.secret"), b"client-secret");
    let (idp, config) = crate::infra::config::test_instance(
        d,
        POLICY,
        r#"
[providers.acme]
authorization_endpoint = "http://127.0.0.1:9/authorize"
token_endpoint = "http://127.0.0.1:9/token"
userinfo_endpoint = "http://127.0.0.1:9/userinfo"
client_id = "broker"
client_secret_file = "acme.secret"
"#,
    );
    let clock: crate::base::clock::SharedClock = Arc::new(crate::base::clock::SystemClock);
    let now = clock.now();
    let instance = crate::app::build(config.clone(), clock).await.unwrap();
    let broker = instance.broker.clone();

    // The derive's snapshot, and a different policy the reloader
    // stored after the derive took it.
    let snapshot = Policy::parse(Path::new("policy.toml"), POLICY.as_bytes()).unwrap();
    let reloaded = format!("{POLICY}\n# reloaded\n");
    let reloaded = Policy::parse(Path::new("policy.toml"), reloaded.as_bytes()).unwrap();
    assert_ne!(snapshot.hash, reloaded.hash);
    broker.policy.store(Arc::new(reloaded.clone()));

    let subject = idp
        .sign_jws(
            serde_json::Map::from_iter([("typ".to_string(), "at+jwt".into())]),
            &serde_json::json!({
                "iss": "https://idp.example", "sub": "alice", "aud": "repo-helper",
                "iat": now, "exp": now + 600, "jti": "subject-1",
            }),
        )
        .unwrap();
    let (tool_key, _) = crate::base::jose::Es256Key::generate().unwrap();
    let proof = crate::base::dpop::make_proof(
        &tool_key,
        "POST",
        broker.htu(Endpoint::Derive),
        now,
        None,
        None,
    )
    .unwrap();
    let req = DeriveRequest {
        subject_token_type: Default::default(),
        subject_token: SecretString::new(subject),
        step: "triage".into(),
        tool: "acme.issues".into(),
        resource: "https://api.acme.example".into(),
        scope: None,
        dpop: Some(SecretString::new(proof)),
        authorization_details: None,
        upstream_proofs: Default::default(),
        request: None,
        endpoint: Endpoint::Derive,
        peer_uid: 1000,
    };
    let refused = broker
        .run(&req, now, &snapshot, &mut Ctx::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, DeriveError::LinkRequired(l) if l.kind == crate::accounts::connect::LinkKind::Connect),
        "{refused:?}"
    );

    let audit = std::fs::read_to_string(&config.audit_log).unwrap();
    let link = audit
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["event"] == "connect.link_issued")
        .expect("a link event");
    assert_eq!(link["policy_hash"], snapshot.hash.as_str());
    assert_ne!(link["policy_hash"], reloaded.hash.as_str());
}
