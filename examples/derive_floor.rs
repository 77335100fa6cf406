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
//! With `--pg-host` it is the **store floor** of a service derive on
//! PostgreSQL (the egress proxy's delivery: the account and the allowance
//! read, then a token minted as for `self`): between steps 4 and 5 it
//! issues the very statements the broker's service path issues, and no
//! other, through the same driver and pool crate with the broker's
//! settings (tokio-postgres under deadpool-postgres, statements through
//! the connection's statement cache, the broker's session options and
//! pool timeouts):
//! - `SELECT value FROM records WHERE tree = $1 AND key = $2` for the
//!   person's account at the service (tree `accounts`, key
//!   `tuple_key([iss, sub, service])`), then the same for their allowance
//!   for the agent (tree `allowances`, key `tuple_key([iss, sub, service,
//!   agent])`): `Vault::account_read` and `Vault::allowance`, each one
//!   `Store::get`;
//! - each row's bytes compared with those read at start, whose meaning is
//!   kept (the broker keeps what it worked out from a record's bytes and
//!   serves it again for the same bytes; the floor keeps the account's
//!   status, provider and scopes, checked on every request, and takes the
//!   sealed allowance's bytes as allowing the tool's scopes, which the
//!   benchmark's connect step made true). Other bytes are refused (503):
//!   the floor cannot open sealed records. The stored provider token's
//!   expiry is sealed too, so the floor does not check it (the broker's
//!   check is a comparison of kept numbers);
//! - and, as the broker on PostgreSQL requires by default, a DPoP nonce in
//!   the proof (HMAC-SHA-256, `use_dpop_nonce` with a fresh one otherwise).
//!
//! Its pool: one per thread, each `pool_size / threads` connections
//! (rounded up), made on that thread's runtime, so that a request's
//! statements are written and answered on the thread that serves it: no
//! hand-off to another thread, which is the point of a floor.
//!
//! Runtime settings as the broker's default `socket.runtime = "per_core"`:
//! one current-thread tokio runtime per CPU this process may use, each
//! accepting on its own copy of the socket, hyper's HTTP/1.1 server with the
//! broker's settings, and each connection registered for reading only
//! (`ReadOnlyStream`, as the broker registers them).
//!
//!     target/release/examples/derive_floor --socket S --issuer URL --subject-token T --audit FILE
//!         [--pg-host H --pg-port P --pg-database D --pg-user U --pg-password-file F
//!          --service demo --agent NAME --tool demo.notes --resource URL --scope 'notes:read']
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
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use tokio_postgres::NoTls;

// Benchmarks' allocation counts (the `alloc-count` feature; see
// src/main.rs): the floor counts as the broker does.
#[cfg(feature = "alloc-count")]
#[global_allocator]
static ALLOC: credbroker_alloc_count::Counting = credbroker_alloc_count::Counting;

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
    /// The tool's scopes, space-separated.
    #[arg(long, default_value = "notes.read")]
    scope: String,
    /// The audit file (appended to).
    #[arg(long)]
    audit: PathBuf,
    /// The store floor: the PostgreSQL server's host (loopback, no TLS, as
    /// scripts/bench-store runs it).
    #[arg(long, requires_all = ["pg_port", "pg_database", "pg_user", "service", "agent"])]
    pg_host: Option<String>,
    #[arg(long)]
    pg_port: Option<u16>,
    #[arg(long)]
    pg_database: Option<String>,
    #[arg(long)]
    pg_user: Option<String>,
    /// A file holding the password (one trailing newline is dropped).
    #[arg(long)]
    pg_password_file: Option<PathBuf>,
    /// The broker's `[postgres] pool_size`, shared out over the threads.
    #[arg(long, default_value_t = 32)]
    pool_size: usize,
    /// The broker's `[postgres] statement_timeout`, milliseconds.
    #[arg(long, default_value_t = 2000)]
    statement_timeout_ms: u64,
    /// The broker's `[postgres] connect_timeout`, milliseconds.
    #[arg(long, default_value_t = 2000)]
    connect_timeout_ms: u64,
    /// The connected service whose account and allowance are read.
    #[arg(long)]
    service: Option<String>,
    /// The broker's `agent` (the allowance's key).
    #[arg(long)]
    agent: Option<String>,
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
    /// The store floor's records and nonces (`--pg-host`).
    store: Option<StoreFloor>,
}

/// The SQL of `Store::get` on PostgreSQL (src/infra/store/postgres).
const GET: &str = "SELECT value FROM records WHERE tree = $1 AND key = $2";

/// What the store floor reads and checks.
struct StoreFloor {
    account_key: Vec<u8>,
    allowance_key: Vec<u8>,
    /// The rows' bytes as read at start, and what the account's say.
    account: Vec<u8>,
    allowance: Vec<u8>,
    account_ok: bool,
    nonces: credbroker::internals::dpop::Nonces,
}

/// The account record's fields the service path checks (the rest, the
/// sealed tokens included, is not read).
#[derive(serde::Deserialize)]
struct AccountFields {
    status: String,
    provider: String,
    scopes: Vec<String>,
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
    nonce: Option<&'a str>,
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
    /// One derive, straight through: the floor's whole per-request work
    /// (`pool`: this thread's, for the store floor).
    async fn derive(
        &self,
        pool: Option<&Pool>,
        dpop: Option<&[u8]>,
        body: &[u8],
    ) -> Result<Vec<u8>, Refusal> {
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
        if let Some(st) = &self.store {
            if !claims.nonce.is_some_and(|n| st.nonces.check(n, now)) {
                return Err((StatusCode::UNAUTHORIZED, "use_dpop_nonce"));
            }
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
        // 4b. The store floor: the account, then the allowance.
        if let (Some(st), Some(pool)) = (&self.store, pool) {
            st.check(pool).await?;
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

impl StoreFloor {
    /// The service path's two statements on one pooled connection, and
    /// the checks on their rows.
    async fn check(&self, pool: &Pool) -> Result<(), Refusal> {
        let down = (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable");
        let c = pool.get().await.map_err(|_| down)?;
        let st = c.prepare_cached(GET).await.map_err(|_| down)?;
        let rows = c
            .query(&st, &[&"accounts", &self.account_key])
            .await
            .map_err(|_| down)?;
        let account: Option<Vec<u8>> = rows.first().map(|r| r.get(0));
        if account.as_deref() != Some(self.account.as_slice()) || !self.account_ok {
            return Err(down);
        }
        let rows = c
            .query(&st, &[&"allowances", &self.allowance_key])
            .await
            .map_err(|_| down)?;
        let allowance: Option<Vec<u8>> = rows.first().map(|r| r.get(0));
        if allowance.as_deref() != Some(self.allowance.as_slice()) {
            return Err(down);
        }
        Ok(())
    }
}

/// The client settings of the broker's `[postgres]` table
/// (src/infra/store/postgres/connect.rs), without TLS.
fn pg_config(args: &Args) -> tokio_postgres::Config {
    let mut c = tokio_postgres::Config::new();
    c.host(args.pg_host.as_deref().unwrap())
        .port(args.pg_port.unwrap())
        .dbname(args.pg_database.as_deref().unwrap())
        .user(args.pg_user.as_deref().unwrap())
        .application_name("credbroker-floor")
        .connect_timeout(Duration::from_millis(args.connect_timeout_ms))
        .keepalives_idle(Duration::from_secs(30))
        .options(format!(
            "-c synchronous_commit=on -c statement_timeout={}",
            args.statement_timeout_ms
        ));
    if let Some(p) = &args.pg_password_file {
        let pw = std::fs::read(p).expect("the password file");
        c.password(pw.strip_suffix(b"\n").unwrap_or(&pw));
    }
    c
}

/// A pool with the broker's settings (src/infra/store/postgres/mod.rs),
/// `size` connections at most.
fn pg_pool(args: &Args, size: usize) -> Pool {
    let mc = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let timeout = Duration::from_millis(args.statement_timeout_ms);
    Pool::builder(Manager::from_config(pg_config(args), NoTls, mc))
        .max_size(size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(timeout / 2))
        .create_timeout(Some(Duration::from_millis(args.connect_timeout_ms)))
        .recycle_timeout(Some(timeout))
        .build()
        .unwrap()
}

/// The store floor's records, read once at start (on a runtime of its
/// own, on one connection closed after).
fn store_floor(args: &Args, person: &Person) -> StoreFloor {
    let service = args.service.as_deref().unwrap();
    let tuple = credbroker::internals::store::tuple_key;
    let account_key = tuple(&[&person.iss, &person.sub, service]);
    let allowance_key = tuple(&[
        &person.iss,
        &person.sub,
        service,
        args.agent.as_deref().unwrap(),
    ]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (account, allowance) = rt.block_on(async {
        let (c, conn) = pg_config(args)
            .connect(NoTls)
            .await
            .expect("connect to PostgreSQL");
        let task = tokio::spawn(conn);
        let read = |tree: &'static str, key: Vec<u8>| {
            let c = &c;
            async move {
                let rows = c.query(GET, &[&tree, &key]).await.expect("read a record");
                let v: Vec<u8> = rows
                    .first()
                    .unwrap_or_else(|| panic!("no {tree} record: is the account connected?"))
                    .get(0);
                v
            }
        };
        let r = (
            read("accounts", account_key.clone()).await,
            read("allowances", allowance_key.clone()).await,
        );
        drop(c);
        let _ = task.await;
        r
    });
    let fields: AccountFields = serde_json::from_slice(&account).expect("an account record (JSON)");
    let scopes: Vec<&str> = args.scope.split_whitespace().collect();
    let mut key = vec![0u8; 32];
    aws_lc_rs::rand::fill(&mut key).unwrap();
    StoreFloor {
        account_key,
        allowance_key,
        account_ok: fields.status == "active"
            && !fields.provider.is_empty()
            && scopes.iter().all(|s| fields.scopes.iter().any(|h| h == s)),
        account,
        allowance,
        nonces: credbroker::internals::dpop::Nonces::new(
            &credbroker::internals::secret::SecretBytes::new(key),
            "floor",
        ),
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

async fn handle(
    floor: Arc<Floor>,
    pool: Option<Pool>,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    if req.method() != http::Method::POST || req.uri().path() != "/v1/derive" {
        return answer(StatusCode::NOT_FOUND, b"{}".to_vec());
    }
    let dpop = req.headers().get("dpop").map(|v| v.as_bytes().to_vec());
    let Ok(body) = req.into_body().collect().await else {
        return answer(StatusCode::BAD_REQUEST, b"{}".to_vec());
    };
    match floor
        .derive(pool.as_ref(), dpop.as_deref(), &body.to_bytes())
        .await
    {
        Ok(b) => answer(StatusCode::OK, b),
        Err((status, error)) => {
            let mut a = answer(
                status,
                serde_json::to_vec(&serde_json::json!({ "error": error })).unwrap(),
            );
            if let (Some(st), "use_dpop_nonce") = (&floor.store, error) {
                let n = st.nonces.issue(now());
                a.headers_mut()
                    .insert("dpop-nonce", http::HeaderValue::from_str(&n).unwrap());
            }
            a
        }
    }
}

/// One thread's accept loop, on its own current-thread runtime.
async fn serve(listener: std::os::unix::net::UnixListener, floor: Arc<Floor>, pool: Option<Pool>) {
    let listener = tokio::net::UnixListener::from_std(listener).unwrap();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let Ok(stream) = credbroker::internals::unix::ReadOnlyStream::new(stream) else {
            continue;
        };
        let floor = floor.clone();
        let pool = pool.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let (floor, pool) = (floor.clone(), pool.clone());
                async move { Ok::<_, std::convert::Infallible>(handle(floor, pool, req).await) }
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
    #[cfg(feature = "alloc-count")]
    credbroker_alloc_count::report_on_signal();
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
    let person = person_of(&args.subject_token);
    let store = args.pg_host.is_some().then(|| store_floor(&args, &person));
    let floor = Arc::new(Floor {
        htu: format!("{}/v1/derive", args.issuer.trim_end_matches('/')),
        issuer: args.issuer.trim_end_matches('/').to_string(),
        signer,
        kid: "floor".into(),
        rng,
        subjects: HashMap::from([(args.subject_token.clone(), person)]),
        policy: HashMap::from([(
            args.tool.clone(),
            Tool {
                steps: vec![args.step.clone()],
                resource: args.resource.clone(),
                scope: args.scope.clone(),
                ttl: 300,
            },
        )]),
        replay: Mutex::new(HashMap::new()),
        proof_key: Mutex::new(None),
        audit,
        store,
    });
    let _ = std::fs::remove_file(&args.socket);
    let listener = std::os::unix::net::UnixListener::bind(&args.socket).expect("bind the socket");
    listener.set_nonblocking(true).unwrap();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let args = Arc::new(args);
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let l = listener.try_clone().unwrap();
            let floor = floor.clone();
            let args = args.clone();
            std::thread::Builder::new()
                .name(format!("floor-{i}"))
                .spawn(move || {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                        .block_on(async move {
                            // This thread's pool: its connections' tasks
                            // run on this runtime.
                            let pool = floor
                                .store
                                .is_some()
                                .then(|| pg_pool(&args, args.pool_size.div_ceil(threads)));
                            serve(l, floor, pool).await
                        });
                })
                .unwrap()
        })
        .collect();
    println!(
        "{} on {}, {threads} threads",
        if floor.store.is_some() {
            "store floor"
        } else {
            "derive floor"
        },
        args.socket.display()
    );
    for h in handles {
        let _ = h.join();
    }
}
