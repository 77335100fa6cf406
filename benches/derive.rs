//! In-process benchmarks of the derive path (docs/PERFORMANCE.md).
//!
//! - `es256/*`: raw ES256 on aws-lc-rs, the crypto floor: one sign (the
//!   minted token) and one verify (the proof; the key arrives in the proof,
//!   so the floor's verify parses the public key too).
//! - `dpop/validate`: a fresh proof per iteration (made outside the timing).
//! - `subject/*`: subject-token validation, cached (same token) and uncached
//!   (a fresh token per iteration).
//! - `broker/derive_*`: the whole pipeline (`Broker::derive`) on a quick-start
//!   instance built by `app::build`, with a fresh proof per iteration;
//!   the subject token cached or not.
//!
//! Run: `cargo bench --bench derive` (add `-- --quick` for a short run).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair, UnparsedPublicKey};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};

use credbroker::internals::cli::{load_pem_key, quickstart_files};
use credbroker::internals::clock::{Clock, SystemClock};
use credbroker::internals::config::Config;
use credbroker::internals::dpop::{self, Expect};
use credbroker::internals::exchange::{DeriveRequest, Endpoint};
use credbroker::internals::jose::Es256Key;
use credbroker::internals::secret::SecretString;

/// About the size of a minted token's signing input.
const MESSAGE: [u8; 600] = [b'a'; 600];

fn crypto_floor(c: &mut Criterion) {
    let rng = SystemRandom::new();
    let doc =
        EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref())
        .unwrap();
    let public = pair.public_key().as_ref().to_vec();
    let sig = pair.sign(&rng, &MESSAGE).unwrap();
    let mut g = c.benchmark_group("es256");
    g.bench_function("sign", |b| {
        b.iter(|| pair.sign(&rng, black_box(&MESSAGE)).unwrap())
    });
    g.bench_function("verify", |b| {
        b.iter(|| {
            UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, black_box(&public))
                .verify(black_box(&MESSAGE), sig.as_ref())
                .unwrap()
        })
    });
    let parsed =
        signature::ParsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, &public).unwrap();
    g.bench_function("verify_preparsed_key", |b| {
        b.iter(|| {
            parsed
                .verify_sig(black_box(&MESSAGE), sig.as_ref())
                .unwrap()
        })
    });
    g.finish();
}

fn dpop_validate(c: &mut Criterion) {
    let key = Es256Key::generate().unwrap().0;
    let htu = "http://127.0.0.1:8440/v1/derive";
    let now = SystemClock.now();
    // Large enough for every iteration criterion runs (a full cache
    // refuses), and no larger: the slots land uniformly, so most of the
    // 62 MiB they take becomes resident.
    let v = dpop::Validator::new(
        vec![credbroker::internals::jose::Alg::ES256],
        2_000_000,
        None,
    );
    let expect = Expect {
        method: "POST",
        htu,
        access_token: None,
        jkt: None,
        now,
    };
    c.bench_function("dpop/validate", |b| {
        b.iter_batched(
            || dpop::make_proof(&key, "POST", htu, now, None, None).unwrap(),
            |proof| v.validate(&proof, &expect).unwrap(),
            BatchSize::SmallInput,
        )
    });
}

/// A quick-start directory whose limits do not throttle a benchmark.
fn quickstart() -> (tempfile::TempDir, Config) {
    let dir = tempfile::tempdir().unwrap();
    let path = quickstart_files(dir.path(), "127.0.0.1:0").unwrap();
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(
        "\n[limits]\nper_peer_per_second = 1000000000\nper_person_tool_per_second = 1000000000\nburst = 1000000000\n\
         [dpop]\nreplay_cache_bytes = 67108864\n",
    );
    std::fs::write(&path, text).unwrap();
    let cfg = Config::load(&path).unwrap();
    (dir, cfg)
}

/// Mints subject tokens as the quick start's dev issuer, without touching
/// the disk per token.
struct DevIssuer {
    key: Es256Key,
    iss: String,
    aud: String,
    n: std::cell::Cell<u64>,
}

impl DevIssuer {
    fn new(dir: &std::path::Path, cfg: &Config) -> DevIssuer {
        DevIssuer {
            key: load_pem_key(&dir.join("keys/dev-issuer.pem")).unwrap(),
            iss: cfg.issuer.clone(),
            aud: cfg.agent.clone(),
            n: std::cell::Cell::new(0),
        }
    }

    fn token(&self) -> String {
        let n = self.n.get();
        self.n.set(n + 1);
        let now = SystemClock.now();
        let mut header = serde_json::Map::new();
        header.insert("typ".into(), "at+jwt".into());
        header.insert("kid".into(), self.key.kid.clone().into());
        let claims = serde_json::json!({
            "iss": self.iss, "sub": format!("alice{n}"), "aud": self.aud,
            "iat": now, "exp": now + 3600, "jti": format!("j{n}"),
            "client_id": "bench", "scope": "agent",
        });
        self.key.sign_jws(header, &claims).unwrap()
    }
}

fn subject_validate(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (dir, cfg) = quickstart();
    let issuer = DevIssuer::new(dir.path(), &cfg);
    let v = rt
        .block_on(credbroker::internals::subject::Validator::new(
            &cfg.trusted_issuers,
            Box::new(|_| false),
        ))
        .unwrap();
    let token = issuer.token();
    let mut g = c.benchmark_group("subject");
    g.bench_function("validate_cached", |b| {
        b.iter(|| {
            let (s, cached) = rt
                .block_on(v.validate(black_box(&token), SystemClock.now()))
                .unwrap();
            assert!(cached || s.person.sub == "alice0");
        })
    });
    g.bench_function("validate_uncached", |b| {
        b.iter_batched(
            || issuer.token(),
            |t| {
                let (_, cached) = rt.block_on(v.validate(&t, SystemClock.now())).unwrap();
                assert!(!cached);
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn broker_derive(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (dir, cfg) = quickstart();
    let issuer = DevIssuer::new(dir.path(), &cfg);
    let clock: credbroker::internals::clock::SharedClock = Arc::new(SystemClock);
    let inst = rt
        .block_on(credbroker::internals::app::build(cfg.clone(), clock))
        .unwrap();
    let broker = inst.broker.clone();
    let htu = broker.htu(Endpoint::Derive).to_owned();
    let key = Es256Key::generate().unwrap().0;
    let subject = issuer.token();
    let request = |subject_token: String| DeriveRequest {
        subject_token_type: Default::default(),
        subject_token: SecretString::new(subject_token),
        step: "summarize".into(),
        tool: "notes.read".into(),
        resource: "http://127.0.0.1:9090/notes".into(),
        scope: None,
        dpop: Some(SecretString::new(
            dpop::make_proof(&key, "POST", &htu, SystemClock.now(), None, None).unwrap(),
        )),
        authorization_details: None,
        upstream_proofs: Default::default(),
        request: None,
        endpoint: Endpoint::Derive,
        peer_uid: 1000,
    };
    // The positive control: the benchmarked request is one that succeeds.
    rt.block_on(broker.derive(request(subject.clone())))
        .expect("derive succeeds");
    let mut g = c.benchmark_group("broker");
    g.bench_function("derive_subject_cached", |b| {
        b.iter_batched(
            || request(subject.clone()),
            |r| rt.block_on(broker.derive(r)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("derive_subject_uncached", |b| {
        b.iter_batched(
            || request(issuer.token()),
            |r| rt.block_on(broker.derive(r)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.finish();
    drop(dir);
}

criterion_group!(
    benches,
    crypto_floor,
    dpop_validate,
    subject_validate,
    broker_derive
);
criterion_main!(benches);
