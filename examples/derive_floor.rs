//! The derive floor (docs/PERFORMANCE.md, "Floors"; issue 45): a server
//! that answers the orchestrator socket's `POST /v1/derive` doing, in one
//! straight-line function per request, only the work the contract requires
//! of a `self` derive, on the broker's runtime settings. A benchmark, not a
//! test: examples/loadgen.rs measures it (`--floor-socket`,
//! `--floor-pid`) in windows alternating with the broker's, and prints
//! the broker's figures as ratios to this one's.
//!
//! Per request ([`Floor::derive`]), nothing more:
//! 1. parse the request: hyper's HTTP/1.1, then the JSON body;
//! 2. verify the DPoP proof: its three parts, header (`typ`, `alg`, the
//!    `jwk`, whose parsed key and thumbprint are kept while a tool signs
//!    with one key, as the broker keeps them), claims (`htm`, `htu`, `iat`
//!    within 60 s, `jti`), the ES256 signature, and the `jti` entered in a
//!    replay set shared by the threads;
//! 3. check the subject token from a warm cache: a map from the token to its
//!    person, filled at start (the broker verifies a subject token once and
//!    then finds it in its cache), and its expiry;
//! 4. look the policy up: the tool, its steps and its resource;
//! 5. sign the access token (ES256, `cnf.jkt` the proof key's thumbprint);
//! 6. write one audit line (one `write` to an append-only file);
//! 7. answer the token as JSON.
//!
//! Runtime settings as the broker's default `socket.runtime = "per_core"`:
//! one current-thread tokio runtime per CPU this process may use, each
//! accepting on its own copy of the socket, hyper's HTTP/1.1 server with the
//! broker's settings, and each connection registered for reading only
//! (`ReadOnlyStream`, as the broker registers them).
//!
//!     target/release/examples/derive_floor --socket S --issuer URL --subject-token T --audit FILE
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, ParsedPublicKey};
use bytes::Bytes;
use clap::Parser;
use credbroker::internals::jose::{b64d, b64e};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

#[derive(Parser, Debug)]
#[command(about = "The derive floor: a straight-line server for POST /v1/derive")]
struct Args {
    /// The Unix socket to serve (created; removed first if it exists).
    #[arg(long)]
    socket: PathBuf,
    /// The issuer URL the proofs' `htu` is built on (the broker's).
    #[arg(long)]
    issuer: String,
    /// The subject token the load generator sends: its person fills the
    /// warm cache at start.
    #[arg(long)]
    subject_token: String,
    #[arg(long, default_value = "summarize")]
    step: String,
    #[arg(long, default_value = "notes.read")]
    tool: String,
    #[arg(long, default_value = "http://127.0.0.1:9090/notes")]
    resource: String,
    /// The audit file (appended to).
    #[arg(long)]
    audit: PathBuf,
}

/// A subject token's person, as the warm cache holds it.
struct Person {
    iss: String,
    sub: String,
    exp: i64,
}

/// The policy's entry for one tool.
struct Tool {
    steps: Vec<String>,
    resource: String,
    scope: String,
    ttl: i64,
}

/// The proof key a tool signs with: its JWK's coordinates, the parsed key
/// and its thumbprint.
struct ProofKey {
    x: String,
    y: String,
    key: ParsedPublicKey,
    jkt: String,
}

struct Floor {
    issuer: String,
    htu: String,
    signer: EcdsaKeyPair,
    kid: String,
    rng: SystemRandom,
    subjects: HashMap<String, Person>,
    policy: HashMap<String, Tool>,
    /// Proof `jti`s seen, with when each may be forgotten.
    replay: Mutex<HashMap<String, i64>>,
    proof_key: Mutex<Option<Arc<ProofKey>>>,
    audit: std::fs::File,
}

#[derive(serde::Deserialize)]
struct DeriveBody<'a> {
    #[serde(borrow)]
    subject_token: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    step: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    tool: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    resource: std::borrow::Cow<'a, str>,
}

#[derive(serde::Deserialize)]
struct ProofHeader<'a> {
    typ: &'a str,
    alg: &'a str,
    jwk: ProofJwk<'a>,
}

#[derive(serde::Deserialize)]
struct ProofJwk<'a> {
    kty: &'a str,
    crv: &'a str,
    x: &'a str,
    y: &'a str,
}

#[derive(serde::Deserialize)]
struct ProofClaims<'a> {
    jti: &'a str,
    htm: &'a str,
    htu: &'a str,
    iat: i64,
}

type Refusal = (StatusCode, &'static str);

fn bad(what: &'static str) -> Refusal {
    (StatusCode::BAD_REQUEST, what)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

impl Floor {
    /// One derive, straight through: the floor's whole per-request work.
    fn derive(&self, dpop: Option<&[u8]>, body: &[u8]) -> Result<Vec<u8>, Refusal> {
        let now = now();
        // 1. The request.
        let req: DeriveBody<'_> =
            serde_json::from_slice(body).map_err(|_| bad("invalid_request"))?;
        // 2. The proof.
        let proof = dpop
            .and_then(|p| std::str::from_utf8(p).ok())
            .ok_or(bad("invalid_dpop_proof"))?;
        let mut parts = proof.split('.');
        let (Some(h), Some(c), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("invalid_dpop_proof"));
        };
        let header_bytes = b64d(h, "header").map_err(|_| bad("invalid_dpop_proof"))?;
        let header: ProofHeader<'_> =
            serde_json::from_slice(&header_bytes).map_err(|_| bad("invalid_dpop_proof"))?;
        if header.typ != "dpop+jwt"
            || header.alg != "ES256"
            || header.jwk.kty != "EC"
            || header.jwk.crv != "P-256"
        {
            return Err(bad("invalid_dpop_proof"));
        }
        let key = self.proof_key(&header.jwk)?;
        let claim_bytes = b64d(c, "claims").map_err(|_| bad("invalid_dpop_proof"))?;
        let claims: ProofClaims<'_> =
            serde_json::from_slice(&claim_bytes).map_err(|_| bad("invalid_dpop_proof"))?;
        if claims.htm != "POST"
            || claims.htu != self.htu
            || (claims.iat - now).abs() > 60
            || claims.jti.is_empty()
            || claims.jti.len() > 64
        {
            return Err(bad("invalid_dpop_proof"));
        }
        let sig = b64d(s, "signature").map_err(|_| bad("invalid_dpop_proof"))?;
        key.key
            .verify_sig(&proof.as_bytes()[..h.len() + 1 + c.len()], &sig)
            .map_err(|_| bad("invalid_dpop_proof"))?;
        {
            let mut seen = self.replay.lock().unwrap();
            if seen.len() >= 1 << 20 {
                seen.retain(|_, until| *until > now);
            }
            if seen.insert(claims.jti.to_string(), now + 121).is_some() {
                return Err(bad("invalid_dpop_proof"));
            }
        }
        // 3. The subject, from the warm cache.
        let person = self
            .subjects
            .get(req.subject_token.as_ref())
            .filter(|p| p.exp > now)
            .ok_or(bad("invalid_request"))?;
        // 4. The policy.
        let tool = self
            .policy
            .get(req.tool.as_ref())
            .filter(|t| t.steps.iter().any(|s| *s == req.step))
            .ok_or((StatusCode::FORBIDDEN, "access_denied"))?;
        if tool.resource != req.resource {
            return Err((StatusCode::FORBIDDEN, "access_denied"));
        }
        // 5. The token.
        let mut jti = [0u8; 16];
        aws_lc_rs::rand::fill(&mut jti).unwrap();
        let jti = b64e(&jti);
        let head = serde_json::json!({"alg": "ES256", "typ": "at+jwt", "kid": self.kid});
        let body = serde_json::json!({
            "iss": self.issuer, "sub": person.sub, "aud": tool.resource,
            "iat": now, "exp": now + tool.ttl, "jti": jti, "scope": tool.scope,
            "client_id": req.tool, "step": req.step, "person_iss": person.iss,
            "cnf": {"jkt": key.jkt},
        });
        let input = format!(
            "{}.{}",
            b64e(&serde_json::to_vec(&head).unwrap()),
            b64e(&serde_json::to_vec(&body).unwrap())
        );
        let sig = self
            .signer
            .sign(&self.rng, input.as_bytes())
            .map_err(|_| (StatusCode::INTERNAL_SERVER_ERROR, "server_error"))?;
        let token = format!("{input}.{}", b64e(sig.as_ref()));
        // 6. The audit line, one write.
        let mut line = serde_json::to_vec(&serde_json::json!({
            "ts": now, "kind": "derive.issued", "person_iss": person.iss,
            "person_sub": person.sub, "tool": req.tool, "step": req.step,
            "resource": tool.resource, "scope": tool.scope, "jti": jti, "jkt": key.jkt,
        }))
        .unwrap();
        line.push(b'\n');
        (&self.audit)
            .write_all(&line)
            .map_err(|_| (StatusCode::SERVICE_UNAVAILABLE, "audit_unavailable"))?;
        // 7. The answer.
        Ok(serde_json::to_vec(&serde_json::json!({
            "access_token": token, "token_type": "DPoP", "expires_in": tool.ttl,
            "scope": tool.scope,
        }))
        .unwrap())
    }

    /// The proof's key: the kept one when the JWK is the same, else parsed
    /// (and its thumbprint computed) and kept.
    fn proof_key(&self, jwk: &ProofJwk<'_>) -> Result<Arc<ProofKey>, Refusal> {
        if let Some(k) = self.proof_key.lock().unwrap().as_ref() {
            if k.x == jwk.x && k.y == jwk.y {
                return Ok(k.clone());
            }
        }
        let (x, y) = (
            b64d(jwk.x, "x").map_err(|_| bad("invalid_dpop_proof"))?,
            b64d(jwk.y, "y").map_err(|_| bad("invalid_dpop_proof"))?,
        );
        let mut point = vec![4u8];
        point.extend_from_slice(&x);
        point.extend_from_slice(&y);
        let key = ParsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, &point)
            .map_err(|_| bad("invalid_dpop_proof"))?;
        let canonical = format!(
            r#"{{"crv":"P-256","kty":"EC","x":"{}","y":"{}"}}"#,
            jwk.x, jwk.y
        );
        let jkt = b64e(
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, canonical.as_bytes()).as_ref(),
        );
        let k = Arc::new(ProofKey {
            x: jwk.x.to_string(),
            y: jwk.y.to_string(),
            key,
            jkt,
        });
        *self.proof_key.lock().unwrap() = Some(k.clone());
        Ok(k)
    }
}

/// The subject token's person and expiry, read from its claims (the warm
/// cache is filled once, as the broker's is by its first verify).
fn person_of(token: &str) -> Person {
    let claims = token.split('.').nth(1).expect("a JWT subject token");
    let v: serde_json::Value = serde_json::from_slice(&b64d(claims, "claims").unwrap()).unwrap();
    Person {
        iss: v["iss"].as_str().unwrap_or_default().to_string(),
        sub: v["sub"].as_str().unwrap_or_default().to_string(),
        exp: v["exp"].as_i64().unwrap_or(i64::MAX),
    }
}

fn answer(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    r
}

async fn handle(floor: Arc<Floor>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != http::Method::POST || req.uri().path() != "/v1/derive" {
        return answer(StatusCode::NOT_FOUND, b"{}".to_vec());
    }
    let dpop = req.headers().get("dpop").map(|v| v.as_bytes().to_vec());
    let Ok(body) = req.into_body().collect().await else {
        return answer(StatusCode::BAD_REQUEST, b"{}".to_vec());
    };
    match floor.derive(dpop.as_deref(), &body.to_bytes()) {
        Ok(b) => answer(StatusCode::OK, b),
        Err((status, error)) => answer(
            status,
            serde_json::to_vec(&serde_json::json!({ "error": error })).unwrap(),
        ),
    }
}

/// One thread's accept loop, on its own current-thread runtime.
async fn serve(listener: std::os::unix::net::UnixListener, floor: Arc<Floor>) {
    let listener = tokio::net::UnixListener::from_std(listener).unwrap();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let Ok(stream) = credbroker::internals::unix::ReadOnlyStream::new(stream) else {
            continue;
        };
        let floor = floor.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let floor = floor.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(floor, req).await) }
            });
            // The broker's settings (app::server::http1).
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .max_buf_size(16 * 1024)
                .max_headers(64)
                .keep_alive(true);
            let _ = b.serve_connection(stream, svc).await;
        });
    }
}

fn main() {
    let args = Args::parse();
    let rng = SystemRandom::new();
    let doc =
        EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let signer =
        EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref())
            .unwrap();
    let audit = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.audit)
        .expect("the audit file");
    let floor = Arc::new(Floor {
        htu: format!("{}/v1/derive", args.issuer.trim_end_matches('/')),
        issuer: args.issuer.trim_end_matches('/').to_string(),
        signer,
        kid: "floor".into(),
        rng,
        subjects: HashMap::from([(args.subject_token.clone(), person_of(&args.subject_token))]),
        policy: HashMap::from([(
            args.tool.clone(),
            Tool {
                steps: vec![args.step.clone()],
                resource: args.resource.clone(),
                scope: "notes.read".into(),
                ttl: 300,
            },
        )]),
        replay: Mutex::new(HashMap::new()),
        proof_key: Mutex::new(None),
        audit,
    });
    let _ = std::fs::remove_file(&args.socket);
    let listener = std::os::unix::net::UnixListener::bind(&args.socket).expect("bind the socket");
    listener.set_nonblocking(true).unwrap();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let l = listener.try_clone().unwrap();
            let floor = floor.clone();
            std::thread::Builder::new()
                .name(format!("floor-{i}"))
                .spawn(move || {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                        .block_on(serve(l, floor));
                })
                .unwrap()
        })
        .collect();
    println!(
        "derive floor on {}, {threads} threads",
        args.socket.display()
    );
    for h in handles {
        let _ = h.join();
    }
}
