//! The Shared Signals receiver against the tests' own transmitter
//! (`tests/peers/ssf-transmitter.mjs`: SETs built from the SSF, CAEP and
//! RISC examples, signed with jose): push at `{issuer}/ssf/events`, poll
//! under a lease, the stream commands. Each bad SET is followed by a good
//! one that works.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod poll;
mod push;
mod replicas;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use credbroker::internals::jose::Es256Key;
use serde_json::{json, Value};

use crate::support::*;

/// The `Authorization` value the transmitter pushes with.
const PUSH_AUTH: &str = "Bearer push-secret-not-a-canary";
/// The transmitter's management token.
const MANAGEMENT: &str = "management-secret-not-a-canary";

/// The tests' transmitter.
pub(super) struct Tx {
    peer: NodePeer,
    _cfg: tempfile::NamedTempFile,
    pub(super) issuer: String,
}

impl Tx {
    /// Starts one whose SETs name `audience` (the broker's issuer).
    pub(super) fn start(audience: &str) -> Tx {
        let f = tempfile::NamedTempFile::new().unwrap();
        let cfg = json!({"management_token": MANAGEMENT, "audience": audience});
        std::fs::write(f.path(), cfg.to_string()).unwrap();
        let peer = NodePeer::start("ssf-transmitter.mjs", &[f.path().to_str().unwrap()]);
        Tx {
            issuer: peer.hello["issuer"].as_str().unwrap().to_owned(),
            peer,
            _cfg: f,
        }
    }

    /// A SET of `typ` (a short name) for `subject`, with `opts` (see the
    /// script's header) merged in.
    pub(super) fn set(&mut self, typ: &str, subject: &Value, opts: Value) -> (String, String) {
        let mut cmd = json!({"cmd": "set", "type": typ, "subject": subject});
        for (k, v) in opts.as_object().unwrap() {
            cmd[k] = v.clone();
        }
        let r = self.peer.call(&cmd);
        (
            r["set"].as_str().unwrap().to_owned(),
            r["jti"].as_str().unwrap().to_owned(),
        )
    }

    pub(super) fn call(&mut self, cmd: &Value) -> Value {
        self.peer.call(cmd)
    }
}

/// An `iss_sub` subject at the broker's dev issuer.
pub(super) fn iss_sub(b: &TestBroker, sub: &str) -> Value {
    json!({"format": "iss_sub", "iss": b.issuer, "sub": sub})
}

/// Writes `text` to `path` with mode 0600.
pub(super) fn secret_file(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The `[ssf.transmitters.idp]` table for `tx`, trusting `trusted`.
pub(super) fn transmitter_toml(tx: &Tx, trusted: &str, delivery: &str, secrets: &Path) -> String {
    let push = if delivery == "push" {
        format!(
            "push_authorization_file = \"{}\"\n",
            secrets.join("ssf-push").display()
        )
    } else {
        String::new()
    };
    format!(
        r#"
[ssf.transmitters.idp]
issuer = "{}"
delivery = "{delivery}"
{push}management_credentials_file = "{}"
trusted_issuers = ["{trusted}"]
map_email = true
poll_interval = "200ms"
"#,
        tx.issuer,
        secrets.join("ssf-management").display(),
    )
}

/// A broker on a known address whose transmitter `idp` pushes, with the
/// transmitter started for it.
pub(super) fn push_broker() -> (TestBroker, Tx, tempfile::TempDir) {
    let addr = free_loopback_addr();
    let issuer = format!("http://{addr}");
    let tx = Tx::start(&issuer);
    let secrets = tempfile::tempdir().unwrap();
    secret_file(&secrets.path().join("ssf-push"), PUSH_AUTH);
    secret_file(&secrets.path().join("ssf-management"), MANAGEMENT);
    let opts = Opts {
        public_listen: Some(addr),
        extra_config: transmitter_toml(&tx, &issuer, "push", secrets.path()),
        ..Opts::default()
    };
    (TestBroker::start_with(opts), tx, secrets)
}

/// Pushes `set` with `auth` as the `Authorization` value; the status and
/// the body.
pub(super) async fn push_with(b: &TestBroker, auth: &str, set: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/ssf/events", b.public))
        .header("authorization", auth)
        .header("content-type", "application/secevent+jwt")
        .body(set.to_owned())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Pushes `set` as the transmitter does.
pub(super) async fn push(b: &TestBroker, set: &str) -> (u16, Value) {
    push_with(b, PUSH_AUTH, set).await
}

/// A derive for `sub` (a dev-issuer subject token): `Ok(())` when a token
/// came back, `Err(reason)` when refused.
pub(super) async fn derive_as(b: &TestBroker, sub: &str) -> Result<(), String> {
    derive_with(b, &b.subject_token(sub)).await
}

/// A derive with `subject`.
pub(super) async fn derive_with(b: &TestBroker, subject: &str) -> Result<(), String> {
    let (key, _) = Es256Key::generate().unwrap();
    match b
        .derive(&key, subject, "summarize", "notes.read", RESOURCE, None)
        .await
    {
        credbroker::client::Answer::Issued(_) => Ok(()),
        credbroker::client::Answer::Refused(r) => Err(format!(
            "{} {}",
            r.status,
            r.reason.as_deref().unwrap_or(r.error.as_str())
        )),
    }
}

/// The `ssf.event_received` events of `b`.
pub(super) fn ssf_events(b: &TestBroker) -> Vec<Value> {
    b.audit_lines()
        .into_iter()
        .filter(|e| e["event"] == "ssf.event_received")
        .collect()
}

/// The `ssf.event_received` events of a replica (its audit file is
/// `audit.jsonl` in its directory).
pub(super) fn ssf_events_at(b: &TestBroker) -> Vec<Value> {
    read_audit(&b.path("audit.jsonl"))
        .into_iter()
        .filter(|e| e["event"] == "ssf.event_received")
        .collect()
}

/// Two-or-more replicas on `db` whose transmitter `idp` pushes (every
/// replica's issuer is the quick start's default one), with `extra`
/// appended to each config; the transmitter started for them.
pub(super) fn push_replicas(
    db: &crate::support::postgres::Database,
    n: usize,
    extra: &str,
) -> (Vec<TestBroker>, Tx, tempfile::TempDir) {
    let issuer = "http://127.0.0.1:0".to_owned();
    let tx = Tx::start(&issuer);
    let secrets = tempfile::tempdir().unwrap();
    secret_file(&secrets.path().join("ssf-push"), PUSH_AUTH);
    secret_file(&secrets.path().join("ssf-management"), MANAGEMENT);
    let table = transmitter_toml(&tx, &issuer, "push", secrets.path());
    let replicas = crate::support::postgres::replicas_with(db, n, &Opts::default(), &|text| {
        format!("{text}\n{table}{extra}")
    });
    assert_eq!(replicas[0].issuer, issuer, "the replicas' issuer");
    (replicas, tx, secrets)
}
