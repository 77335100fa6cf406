//! Benchmarks of an `exchange` derive (issue 41, docs/UPSTREAM.md) in one
//! run against a loopback authorization server in this process (metadata,
//! JWKS and a token endpoint that signs one ES256 access token per request,
//! bound to the tool's key, answered over plain HTTP/1.1 on 127.0.0.1):
//!
//! - `exchange/derive`: the whole pipeline (`Broker::derive`) for an
//!   `exchange` resource, a fresh derive proof and relayed proof per
//!   iteration, one token exchange each (no reuse);
//! - `exchange/floor`: the same crypto and one loopback HTTP call, nothing
//!   else: the relayed proof's check (`dpop::Validator`), the AS's answer
//!   fetched with one POST to the same token endpoint (so the AS's own
//!   signing is in both), and its signature verified; the target is
//!   `derive` within 1.2x of it;
//! - `exchange/derive_reused`: the same derive with `reuse_margin` set, the
//!   kept token given again (no call to the AS), against `self/derive`, a
//!   `self` resource's derive on the same broker: the target is within
//!   1.2x.
//!
//! The client is `client_secret_basic` (no client assertion is signed: add
//! `private_key_jwt` to measure that signature too). Criterion measures
//! wall time per iteration on this process's threads, which include the
//! AS's (it runs on the same runtime), in both `derive` and `floor`.
//!
//! Run: `cargo bench --bench exchange` (add `-- --quick` for a short run).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use credbroker::internals::cli::{load_pem_key, quickstart_files};
use credbroker::internals::clock::{Clock, SystemClock};
use credbroker::internals::config::Config;
use credbroker::internals::dpop::{self, Expect};
use credbroker::internals::exchange::{DeriveRequest, Endpoint};
use credbroker::internals::jose::Es256Key;
use credbroker::internals::secret::SecretString;

const RESOURCE: &str = "https://org-api.example/notes";
const REUSED: &str = "https://org-api.example/reused";
const SECRET: &str = "bench-client-secret";

/// The loopback AS: its ES256 key and the thumbprint its tokens bind to
/// (one tool key for the whole run).
struct As {
    pair: EcdsaKeyPair,
    rng: SystemRandom,
    issuer: String,
    jwks: String,
    jkt: String,
}

impl As {
    fn new(issuer: String, jkt: String) -> As {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap();
        let pair =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref())
                .unwrap();
        let p = pair.public_key().as_ref();
        let (x, y) = (
            URL_SAFE_NO_PAD.encode(&p[1..33]),
            URL_SAFE_NO_PAD.encode(&p[33..65]),
        );
        let jwks = serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "x": x, "y": y, "kid": "as1", "alg": "ES256", "use": "sig"}]}).to_string();
        As {
            pair,
            rng,
            issuer,
            jwks,
            jkt,
        }
    }

    /// One token for the resource named in the form, as the broker checks it.
    fn token(&self, form: &str) -> String {
        let resource = form_get(form, "resource").unwrap_or_default();
        let scope = form_get(form, "scope").unwrap_or_default();
        let now = SystemClock.now();
        let h = URL_SAFE_NO_PAD.encode(br#"{"alg":"ES256","typ":"at+jwt","kid":"as1"}"#);
        let c = serde_json::json!({
            "iss": self.issuer, "sub": "alice", "aud": resource, "scope": scope,
            "iat": now, "exp": now + 300, "cnf": {"jkt": self.jkt},
            "jti": format!("{now}-{}", rand_u64()), "client_id": "bench",
        });
        let mut out = format!("{h}.{}", URL_SAFE_NO_PAD.encode(c.to_string()));
        let sig = self.pair.sign(&self.rng, out.as_bytes()).unwrap();
        out.push('.');
        out.push_str(&URL_SAFE_NO_PAD.encode(sig.as_ref()));
        serde_json::json!({
            "access_token": out, "token_type": "DPoP", "expires_in": 300, "scope": scope,
            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
        })
        .to_string()
    }

    /// The answer to one request (`path`, `body`).
    fn answer(&self, path: &str, body: &str) -> String {
        match path {
            "/.well-known/oauth-authorization-server" => serde_json::json!({
                "issuer": self.issuer, "token_endpoint": format!("{}/token", self.issuer),
                "jwks_uri": format!("{}/jwks", self.issuer),
                "grant_types_supported": ["urn:ietf:params:oauth:grant-type:token-exchange"],
            })
            .to_string(),
            "/jwks" => self.jwks.clone(),
            _ => self.token(body),
        }
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    aws_lc_rs::rand::fill(&mut b).unwrap();
    u64::from_le_bytes(b)
}

/// The first value of `name` in a form body.
fn form_get(form: &str, name: &str) -> Option<String> {
    form_urlencoded::parse(form.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// Serves `as_` on `listener`: HTTP/1.1, keep-alive, one request at a time
/// per connection.
async fn serve(listener: tokio::net::TcpListener, as_: Arc<As>) {
    loop {
        let (mut s, _) = listener.accept().await.unwrap();
        let as_ = as_.clone();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            loop {
                let mut chunk = [0u8; 8192];
                let Ok(n) = s.read(&mut chunk).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                    continue;
                };
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let len = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if buf.len() < end + 4 + len {
                    continue;
                }
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).to_string();
                buf.drain(..end + 4 + len);
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let answer = as_.answer(&path, &body);
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncache-control: no-store\r\ncontent-length: {}\r\n\r\n{answer}",
                    answer.len()
                );
                if s.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// A quick-start broker with `[upstreams.org]` at `issuer` (the loopback
/// AS), trusting the quick start's dev issuer's tokens as subjects there;
/// `RESOURCE` exchanged each time, `REUSED` kept for reuse (another
/// upstream table on the same AS, with `reuse_margin`).
fn broker_files(issuer: &str) -> (tempfile::TempDir, Config) {
    let dir = tempfile::tempdir().unwrap();
    let path = quickstart_files(dir.path(), "127.0.0.1:0").unwrap();
    let secret = dir.path().join("org-secret");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(
        &secret,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
    )
    .unwrap();
    let cfg0 = Config::load(&path).unwrap();
    let dev = cfg0.issuer.clone();
    let mut text = std::fs::read_to_string(&path).unwrap();
    for (name, reuse) in [("org", ""), ("kept", "reuse_margin = \"60s\"\n")] {
        text.push_str(&format!(
            "\n[upstreams.{name}]\nissuer = \"{issuer}\"\nclient_id = \"bench\"\nclient_secret_file = \"{}\"\nsubject_issuers = [\"{dev}\"]\n{reuse}",
            secret.display()
        ));
    }
    text.push_str(
        "\n[limits]\nper_peer_per_second = 1000000000\nper_person_tool_per_second = 1000000000\nburst = 1000000000\n\
         [dpop]\nreplay_cache_bytes = 67108864\n",
    );
    std::fs::write(&path, text).unwrap();
    let policy = dir.path().join("policy.toml");
    let mut p = std::fs::read_to_string(&policy).unwrap();
    for (uri, up, tool) in [
        (RESOURCE, "org", "org.notes"),
        (REUSED, "kept", "kept.notes"),
    ] {
        p.push_str(&format!(
            "\n[resources.\"{uri}\"]\nsource = \"exchange\"\nupstream = \"{up}\"\n\n[tools.\"{tool}\"]\nresource = \"{uri}\"\nscopes = [\"notes:read\"]\nsteps = [\"summarize\"]\n"
        ));
    }
    std::fs::write(&policy, p).unwrap();
    let cfg = Config::load(&path).unwrap();
    (dir, cfg)
}

fn subject_token(dir: &std::path::Path, cfg: &Config) -> String {
    let key = load_pem_key(&dir.join("keys/dev-issuer.pem")).unwrap();
    let now = SystemClock.now();
    let mut header = serde_json::Map::new();
    header.insert("typ".into(), "at+jwt".into());
    header.insert("kid".into(), key.kid.clone().into());
    let claims = serde_json::json!({
        "iss": cfg.issuer, "sub": "alice", "aud": cfg.agent,
        "iat": now, "exp": now + 3600, "jti": "bench-subject",
        "client_id": "bench", "scope": "agent",
    });
    key.sign_jws(header, &claims).unwrap()
}

fn exchange(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tool = Es256Key::generate().unwrap().0;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    let as_ = Arc::new(As::new(issuer.clone(), tool.thumbprint().to_owned()));
    rt.spawn(serve(listener, as_.clone()));
    let token_endpoint = format!("{issuer}/token");

    let (dir, cfg) = broker_files(&issuer);
    let subject = subject_token(dir.path(), &cfg);
    let clock: credbroker::internals::clock::SharedClock = Arc::new(SystemClock);
    let inst = rt
        .block_on(credbroker::internals::app::build(cfg.clone(), clock))
        .unwrap();
    let broker = inst.broker.clone();
    let htu = broker.htu(Endpoint::Derive).to_owned();
    let request = |tool_name: &str, resource: &str, upstream: Option<&str>| {
        let now = SystemClock.now();
        let mut proofs = std::collections::BTreeMap::new();
        if let Some(u) = upstream {
            proofs.insert(
                u.to_owned(),
                SecretString::new(
                    dpop::make_proof(&tool, "POST", &token_endpoint, now, None, None).unwrap(),
                ),
            );
        }
        DeriveRequest {
            subject_token_type: Default::default(),
            subject_token: SecretString::new(subject.clone()),
            step: "summarize".into(),
            tool: tool_name.into(),
            resource: resource.into(),
            scope: None,
            dpop: Some(SecretString::new(
                dpop::make_proof(&tool, "POST", &htu, now, None, None).unwrap(),
            )),
            authorization_details: None,
            upstream_proofs: proofs,
            request: None,
            endpoint: Endpoint::Derive,
            peer_uid: 1000,
        }
    };
    // The positive controls: each benchmarked request succeeds, and the
    // exchanged token is the AS's.
    let t = rt
        .block_on(broker.derive(request("org.notes", RESOURCE, Some("org"))))
        .expect("exchange derive succeeds");
    drop(t);
    rt.block_on(broker.derive(request("kept.notes", REUSED, Some("kept"))))
        .expect("reused derive succeeds");
    rt.block_on(broker.derive(request("notes.read", "http://127.0.0.1:9090/notes", None)))
        .expect("self derive succeeds");

    let mut g = c.benchmark_group("exchange");
    g.bench_function("derive", |b| {
        b.iter_batched(
            || request("org.notes", RESOURCE, Some("org")),
            |r| rt.block_on(broker.derive(r)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    // The floor: the relayed proof's check, one loopback POST to the same
    // token endpoint, the answer's signature verified with the AS's key.
    let validator = dpop::Validator::new(cfg.dpop.algs.clone(), 1 << 20, None);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let public = as_.pair.public_key().as_ref().to_vec();
    let form = format!("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Atoken-exchange&resource={}&scope=notes%3Aread", form_urlencoded::byte_serialize(RESOURCE.as_bytes()).collect::<String>());
    let relayed = || {
        dpop::make_proof(
            &tool,
            "POST",
            &token_endpoint,
            SystemClock.now(),
            None,
            None,
        )
        .unwrap()
    };
    // Already normal: lower-case scheme and host, no default port.
    let expect_htu = token_endpoint.clone();
    g.bench_function("floor", |b| {
        b.iter_batched(
            relayed,
            |p| {
                let expect = Expect {
                    method: "POST",
                    htu: &expect_htu,
                    access_token: None,
                    jkt: Some(tool.thumbprint()),
                    now: SystemClock.now(),
                };
                validator.validate(&p, &expect).unwrap();
                let body: serde_json::Value = rt.block_on(async {
                    http.post(&token_endpoint)
                        .header("content-type", "application/x-www-form-urlencoded")
                        .basic_auth("bench", Some(SECRET))
                        .header("dpop", &p)
                        .body(form.clone())
                        .send()
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap()
                });
                let t = body["access_token"].as_str().unwrap();
                let (input, sig) = t.rsplit_once('.').unwrap();
                signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, &public)
                    .verify(input.as_bytes(), &URL_SAFE_NO_PAD.decode(sig).unwrap())
                    .unwrap();
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("derive_reused", |b| {
        b.iter_batched(
            || request("kept.notes", REUSED, None),
            |r| rt.block_on(broker.derive(r)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("self_derive", |b| {
        b.iter_batched(
            || request("notes.read", "http://127.0.0.1:9090/notes", None),
            |r| rt.block_on(broker.derive(r)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.finish();
    drop(inst);
    drop(dir);
}

criterion_group!(benches, exchange);
criterion_main!(benches);
