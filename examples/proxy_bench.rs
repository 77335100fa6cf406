//! Benchmark of the egress proxy (docs/PERFORMANCE.md, "Egress proxy";
//! issue 11). A benchmark, not a test: it measures and prints, it asserts
//! nothing about the figures.
//!
//!     cargo build --release --bin credbroker --example proxy_bench
//!     target/release/examples/proxy_bench [--rounds 6] [--calls 500] [--downloads 4] [--concurrency 1]
//!
//! In one run it starts four processes of its own beside the load it
//! makes, so that each one's CPU can be read from `/proc`:
//! - an **upstream API** (this binary, `upstream`): `GET /small` (a short
//!   JSON answer) and `GET /blob/{mib}` (that many MiB, streamed), served
//!   only to `Authorization: Bearer` with the provider's real token, which
//!   this process hands it on its standard input once the account is
//!   connected (anything else gets 401);
//! - a **plain proxy** (this binary, `plain-proxy`): hyper server and hyper
//!   client, one upstream connection per downstream connection, bodies
//!   streamed through untouched. No check, no copy: the floor of any HTTP
//!   proxy on these cores;
//! - a **floor proxy** (this binary, `plain-proxy --verify`): the plain
//!   proxy doing, for each request, the work the contract requires of a
//!   proxied call and nothing else (issue 45): the proof's and the token's
//!   verifies, the proof's replay entry (in a replay set in memory, and in
//!   a sled `replay` tree written in batches every 100 ms, as the broker on
//!   sled writes it after its first 130 s), the two audit lines (one
//!   `write` each to an append-only file, before the call is sent and when
//!   its answer's head is in), and the echo guard's scan of the answer's
//!   header values and body for the provider's token (a needle of a
//!   provider token's length: the scan costs the same whatever it looks
//!   for); what any proxy that does the required checks pays on these
//!   cores, its wake-ups and cold caches included;
//! - **credbroker** itself: the release binary's `quickstart` in a temp dir,
//!   restarted once with the upstream as the demo provider's `api_base`, a
//!   proxy resource `{issuer}/proxy/demo` with routes for this tool, and the
//!   rate limits raised. Alice's demo account is connected by driving the
//!   real pages over HTTP (sign in, Connect, the demo service's Allow), as a
//!   person would; then the tool derives a proxy token over the socket and
//!   signs a fresh DPoP proof for every call.
//!
//! Then, window by window, alternating the paths (the order turns
//! each round): small GETs on one keep-alive connection (latency of each
//! call, and the CPU of every process; `--concurrency N`: on N connections
//! at once, each driven by its own thread, so that the CPUs stay busy
//! between the hops of a call, as a loaded broker's do), then 10 MiB
//! downloads, one at a time. Reported:
//! added latency p50/p99 over direct; the broker's CPU per proxied call as
//! a multiple of the crypto floor (two ES256 verifies on aws-lc-rs timed
//! in this run, keys parsed beforehand: the proof's, since the broker keeps
//! a tool's key after its first proof, and the token's, since the verifier
//! does not cache tokens), and the floor proxy's beside it (small
//! calls only: its verifies are once a request); throughput and CPU per MiB of the
//! download on each path; the broker's VmRSS/VmHWM before and after the
//! downloads. Each window says whether it counts: other processes used
//! under 10 % of one core while it ran.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair, UnparsedPublicKey};
use bytes::Bytes;
use clap::Parser;
use credbroker::client::{Answer, Client, DeriveParams};
use credbroker::internals::jose::Es256Key;
use http_body_util::{Either, Full};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

#[path = "support/connect.rs"]
mod connect;
#[path = "support/machine.rs"]
mod machine;

#[derive(Parser, Debug)]
#[command(about = "Egress proxy benchmark: direct, plain proxy, credbroker, in one run")]
struct Args {
    /// The credbroker release binary.
    #[arg(long, default_value = "target/release/credbroker")]
    bin: PathBuf,
    /// Rounds; each has one window per path, of small calls and then of downloads.
    #[arg(long, default_value_t = 6)]
    rounds: usize,
    /// Small GETs per window.
    #[arg(long, default_value_t = 500)]
    calls: usize,
    /// Downloads per large-body window.
    #[arg(long, default_value_t = 4)]
    downloads: usize,
    /// Size of a download, MiB.
    #[arg(long, default_value_t = 10)]
    mib: usize,
    /// Small calls in flight at once, each on its own connection and
    /// thread (1: one call at a time, which leaves the CPUs idle between
    /// the hops of a call; more keeps them busy, as a loaded broker's are).
    /// Downloads are always one at a time.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Seconds to wait once the measured broker serves, before anything
    /// else: for its first 130 s the proxy writes each proof's replay entry
    /// on the call, then in batches (docs/PROXY.md, "A crash and the replay
    /// check"); 135 measures the batched, steady state.
    #[arg(long, default_value_t = 0)]
    settle: u64,
    /// Print one JSON line with the figures at the end.
    #[arg(long)]
    json: bool,
    /// Instead of timing windows, run the broker under valgrind's callgrind
    /// and count its instructions over this many small calls and then one
    /// window of downloads (user space only; unlike CPU time it does not
    /// move with the machine's load).
    #[arg(long, value_name = "CALLS")]
    callgrind: Option<usize>,
}

fn main() {
    let mut argv = std::env::args().skip(1);
    match argv.next().as_deref() {
        Some("upstream") => return serve(upstream_role()),
        Some("plain-proxy") => {
            let to: SocketAddr = argv.next().expect("plain-proxy UPSTREAM").parse().unwrap();
            let work = (argv.next().as_deref() == Some("--verify"))
                .then(|| Arc::new(FloorWork::for_proxy()));
            return serve(plain_proxy_role(to, work));
        }
        _ => {}
    }
    bench(Args::parse());
}

fn serve(f: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f);
}

// ------------------------------------------------------------ upstream

/// A body of `left` bytes, sent as clones of one shared chunk.
struct Blob {
    chunk: Bytes,
    left: usize,
}

impl hyper::body::Body for Blob {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        let n = self.left.min(self.chunk.len());
        self.left -= n;
        std::task::Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n)))))
    }
    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left as u64)
    }
}

type UpBody = Either<Full<Bytes>, Blob>;

fn up_answer(status: StatusCode, body: UpBody) -> Response<UpBody> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// The upstream API: accepts only the tokens read from standard input.
async fn upstream_role() {
    let accepted: Arc<RwLock<Vec<String>>> = Arc::default();
    let feed = accepted.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(t) = line else { break };
            feed.write().unwrap().push(t.trim().to_string());
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("{}", listener.local_addr().unwrap());
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    loop {
        let Ok((s, _)) = listener.accept().await else {
            continue;
        };
        let _ = s.set_nodelay(true);
        let (accepted, chunk) = (accepted.clone(), chunk.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let ok = req
                    .headers()
                    .get(hyper::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .is_some_and(|t| accepted.read().unwrap().iter().any(|a| a == t));
                let path = req.uri().path();
                let r = if !ok {
                    up_answer(
                        StatusCode::UNAUTHORIZED,
                        Either::Left(Full::new(Bytes::from_static(b"{\"error\":\"bad token\"}"))),
                    )
                } else if path == "/small" {
                    up_answer(
                        StatusCode::OK,
                        Either::Left(Full::new(Bytes::from_static(
                            b"{\"id\":1001,\"login\":\"alice.demo\",\"notes\":[\"a short answer, as most API calls get\"]}",
                        ))),
                    )
                } else if let Some(mib) = path
                    .strip_prefix("/blob/")
                    .and_then(|m| m.parse::<usize>().ok())
                    .filter(|m| *m <= 1024)
                {
                    up_answer(
                        StatusCode::OK,
                        Either::Right(Blob {
                            chunk: chunk.clone(),
                            left: mib << 20,
                        }),
                    )
                } else {
                    up_answer(StatusCode::NOT_FOUND, Either::Left(Full::new(Bytes::new())))
                };
                async move { Ok::<_, Infallible>(r) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(s), svc)
                .await;
        });
    }
}

// ------------------------------------------------------------ plain proxy

/// The plain proxy: forwards each request to `to` on one upstream
/// connection per downstream connection, bodies streamed as they come.
/// With `work` (the **floor proxy**), it also does the work the contract
/// requires of a call ([`FloorWork`]), and nothing more: what any proxy
/// that does the required checks pays on these cores, wake-ups included.
async fn plain_proxy_role(to: SocketAddr, work: Option<Arc<FloorWork>>) {
    if let Some(w) = &work {
        w.clone().start_replay_writer();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("{}", listener.local_addr().unwrap());
    loop {
        let Ok((s, _)) = listener.accept().await else {
            continue;
        };
        let _ = s.set_nodelay(true);
        let work = work.clone();
        tokio::spawn(async move {
            let up = tokio::net::TcpStream::connect(to).await.unwrap();
            let _ = up.set_nodelay(true);
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(up))
                .await
                .unwrap();
            tokio::spawn(conn);
            let sender = Arc::new(tokio::sync::Mutex::new(sender));
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let sender = sender.clone();
                let work = work.clone();
                if let Some(w) = &work {
                    w.run();
                    w.before_call(&req);
                }
                async move {
                    let mut s = sender.lock().await;
                    s.ready().await?;
                    let res = s.send_request(req).await?;
                    Ok::<_, hyper::Error>(match work {
                        Some(w) => {
                            w.after_call(&res);
                            res.map(|b| Either::Right(Scanned { inner: b, work: w }))
                        }
                        None => res.map(Either::Left),
                    })
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(s), svc)
                .await;
        });
    }
}

// ------------------------------------------------------------ /proc

/// On-CPU nanoseconds of every live thread of `pid` (user and kernel),
/// from `/proc/PID/task/*/schedstat`: nanosecond resolution, where
/// `/proc/PID/stat` counts in clock ticks (10 ms), too coarse for short
/// windows.
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// On-CPU nanoseconds of this process, its exited threads included (a
/// window's callers end before its last sample).
fn own_cpu_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID).unwrap();
    u64::try_from(t.tv_sec()).unwrap() * 1_000_000_000 + u64::try_from(t.tv_nsec()).unwrap()
}

/// (busy CPU nanoseconds, nanoseconds) of the whole machine so far
/// (`/proc/stat`): the second is the total over the CPUs divided by their
/// number, so that busy time over it is in cores.
fn machine_ns(hz: f64) -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let cpus = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count()
        .max(1) as f64;
    let f: Vec<f64> = stat
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: f64 = f.iter().sum();
    ((total - f[3] - f[4]) / hz * 1e9, total / hz * 1e9 / cpus)
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// (VmRSS, VmHWM) of `pid` in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU of the processes taking part, sampled around a window.
#[derive(Clone, Copy)]
struct Sample {
    broker: u64,
    plain: u64,
    floor: u64,
    upstream: u64,
    me: u64,
    machine: (f64, f64),
}

struct Pids {
    broker: u32,
    plain: u32,
    floor: u32,
    upstream: u32,
    hz: f64,
}

impl Pids {
    fn sample(&self) -> Sample {
        Sample {
            broker: cpu_ns(self.broker),
            plain: cpu_ns(self.plain),
            floor: cpu_ns(self.floor),
            upstream: cpu_ns(self.upstream),
            me: own_cpu_ns(),
            machine: machine_ns(self.hz),
        }
    }
}

/// What a window cost, per process, and the cores the others used.
#[derive(Default, Clone, Copy)]
struct Cost {
    broker_ns: f64,
    plain_ns: f64,
    floor_ns: f64,
    upstream_ns: f64,
    others: f64,
}

fn cost(a: &Sample, b: &Sample) -> Cost {
    let d = |x: u64, y: u64| y.saturating_sub(x) as f64;
    let ours = d(a.broker, b.broker)
        + d(a.plain, b.plain)
        + d(a.floor, b.floor)
        + d(a.upstream, b.upstream)
        + d(a.me, b.me);
    let (busy, total) = (b.machine.0 - a.machine.0, b.machine.1 - a.machine.1);
    Cost {
        broker_ns: d(a.broker, b.broker),
        plain_ns: d(a.plain, b.plain),
        floor_ns: d(a.floor, b.floor),
        upstream_ns: d(a.upstream, b.upstream),
        others: if total > 0.0 {
            ((busy - ours) / total).max(0.0)
        } else {
            1.0
        },
    }
}

/// A window counts only when other processes used under this share of one
/// core (issue 45; as in examples/loadgen.rs).
const VALID_OTHERS: f64 = 0.10;

// ------------------------------------------------------------ crypto floor

/// Microseconds of one ES256 verify with the public key parsed (a proof's
/// key arrives with the proof) and of one with the key parsed once (the
/// broker's own key, for the token), averaged over `n` each, in this
/// thread's CPU time.
fn crypto_floor_us(n: usize) -> (f64, f64) {
    let work = FloorWork::new();
    let thread_ns = || -> u64 {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let timed = |f: &mut dyn FnMut()| -> f64 {
        let c0 = thread_ns();
        for _ in 0..n {
            f();
        }
        (thread_ns() - c0) as f64 / 1e3 / n as f64
    };
    let parsed = timed(&mut || work.verify_key_parsed());
    let preparsed = timed(&mut || work.verify_key_preparsed());
    (parsed, preparsed)
}

/// The floor proxy's work a call: the crypto floor's two verifies, on
/// one signature of a 600-byte message (about a proof's or a token's
/// signing input), and (`before_call`, `after_call`, [`Scanned`]) the
/// replay entry, the two audit lines and the echo guard's scan.
struct FloorWork {
    public: Vec<u8>,
    key: aws_lc_rs::signature::ParsedPublicKey,
    msg: [u8; 600],
    sig: Vec<u8>,
    /// Proof `jti`s accepted, kept in memory (the verifier's replay check).
    seen: std::sync::Mutex<std::collections::HashMap<u64, i64>>,
    /// Entries waiting for the batch writer of the shared `replay` tree.
    queue: std::sync::Mutex<Vec<u64>>,
    next_jti: std::sync::atomic::AtomicU64,
    /// The audit file (`for_proxy`; none for the crypto floor's timing).
    audit: Option<std::fs::File>,
    /// What the echo guard looks for: a provider token's length of bytes.
    needle: memchr::memmem::Finder<'static>,
    /// Whether the scan ever found it (it never does; kept so the scan is
    /// not optimised away).
    echoed: std::sync::atomic::AtomicBool,
}

/// A proxied answer's body, each data frame scanned by the echo guard.
struct Scanned {
    inner: Incoming,
    work: Arc<FloorWork>,
}

impl hyper::body::Body for Scanned {
    type Data = Bytes;
    type Error = hyper::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(f))) = &polled {
            if let Some(d) = f.data_ref() {
                self.work.scan(d);
            }
        }
        polled
    }
    fn is_end_stream(&self) -> bool {
        hyper::body::Body::is_end_stream(&self.inner)
    }
    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::Body::size_hint(&self.inner)
    }
}

impl FloorWork {
    fn new() -> FloorWork {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap();
        let pair =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref())
                .unwrap();
        let public = pair.public_key().as_ref().to_vec();
        let msg = [b'a'; 600];
        let sig = pair.sign(&rng, &msg).unwrap().as_ref().to_vec();
        let key = aws_lc_rs::signature::ParsedPublicKey::new(
            &signature::ECDSA_P256_SHA256_FIXED,
            &public,
        )
        .unwrap();
        FloorWork {
            public,
            key,
            msg,
            sig,
            seen: Default::default(),
            queue: Default::default(),
            next_jti: Default::default(),
            audit: None,
            needle: memchr::memmem::Finder::new(b"gho_0123456789abcdefghijklmnopqrstuvwxyzAB")
                .into_owned(),
            echoed: Default::default(),
        }
    }

    /// The floor proxy's: with its audit file, in its directory.
    fn for_proxy() -> FloorWork {
        let dir = floor_dir(std::process::id());
        std::fs::create_dir_all(&dir).unwrap();
        let audit = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("audit.jsonl"))
            .unwrap();
        FloorWork {
            audit: Some(audit),
            ..FloorWork::new()
        }
    }

    /// The shared replay tree's writer: a sled tree in a temp directory,
    /// written in one batch and flushed every 100 ms.
    fn start_replay_writer(self: Arc<Self>) {
        let dir = floor_dir(std::process::id());
        let db = sled::open(dir.join("store")).unwrap();
        let tree = db.open_tree("replay").unwrap();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(100));
            let batch: Vec<u64> = std::mem::take(&mut *self.queue.lock().unwrap());
            if batch.is_empty() {
                continue;
            }
            let mut b = sled::Batch::default();
            for jti in batch {
                b.insert(&jti.to_be_bytes(), &(now_secs() + 121).to_be_bytes());
            }
            tree.apply_batch(b).unwrap();
            let _ = tree.flush();
        });
    }

    /// Before the call is sent: the replay entry (the verifier's set and
    /// the shared tree's queue) and the first audit line.
    fn before_call(&self, req: &Request<Incoming>) {
        let jti = self
            .next_jti
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = now_secs();
        {
            let mut seen = self.seen.lock().unwrap();
            if seen.len() >= 1 << 20 {
                seen.retain(|_, until| *until > now);
            }
            assert!(seen.insert(jti, now + 121).is_none());
        }
        self.queue.lock().unwrap().push(jti);
        self.audit_line(&serde_json::json!({
            "ts": now, "kind": "proxy.call", "service": "demo", "tool": "bench.proxy",
            "method": req.method().as_str(), "path": req.uri().path(), "jti": jti,
        }));
    }

    /// When the answer's head is in: the echo guard's scan of its header
    /// values, and the second audit line.
    fn after_call(&self, res: &Response<Incoming>) {
        for v in res.headers().values() {
            self.scan(v.as_bytes());
        }
        self.audit_line(&serde_json::json!({
            "ts": now_secs(), "kind": "proxy.answered", "service": "demo", "tool": "bench.proxy",
            "status": res.status().as_u16(),
        }));
    }

    fn audit_line(&self, v: &serde_json::Value) {
        let mut line = serde_json::to_vec(v).unwrap();
        line.push(b'\n');
        if let Some(mut f) = self.audit.as_ref() {
            f.write_all(&line).unwrap();
        }
    }

    fn scan(&self, bytes: &[u8]) {
        if self.needle.find(bytes).is_some() {
            self.echoed
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// A proof's verify: its key arrives with it and is parsed first.
    fn verify_key_parsed(&self) {
        UnparsedPublicKey::new(
            &signature::ECDSA_P256_SHA256_FIXED,
            std::hint::black_box(&self.public),
        )
        .verify(&self.msg, &self.sig)
        .unwrap();
    }

    /// A token's verify: the broker's key, parsed once.
    fn verify_key_preparsed(&self) {
        self.key
            .verify_sig(std::hint::black_box(&self.msg), &self.sig)
            .unwrap();
    }

    /// Both: the floor of one proxied call (the proof's key is one the
    /// broker has seen: a tool signs every proof with one key).
    fn run(&self) {
        self.verify_key_preparsed();
        self.verify_key_preparsed();
    }
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

// ------------------------------------------------------------ callgrind

/// `--callgrind`: the broker's instructions over `n` small calls, then over
/// two downloads, each counted between a `callgrind_control` switch-on and
/// a dump, after a warm-up with counting off.
fn count_instructions(t: &Target, pids: &Pids, n: usize, mib: usize, out: &Path) {
    let control = |args: &[&str]| {
        let ok = Command::new("callgrind_control")
            .args(args)
            .arg(pids.broker.to_string())
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "callgrind_control {args:?} failed");
    };
    let blob = format!("/blob/{mib}");
    window(t, pids, Via::Broker, "/small", 50, 1);
    window(t, pids, Via::Broker, &blob, 1, 1);
    control(&["-i", "on"]);
    let small = window(t, pids, Via::Broker, "/small", n, 1);
    control(&["-d"]);
    let large = window(t, pids, Via::Broker, &blob, 2, 1);
    control(&["-d"]);
    control(&["-i", "off"]);
    for w in [&small, &large] {
        assert_eq!(w.refused, 0, "{:?}", w.first_refusal);
    }
    // callgrind_annotate's listing of dump `k`, by inclusive or by own
    // instructions, without source annotation.
    let annotate = |k: usize, inclusive: bool| -> String {
        let o = Command::new("callgrind_annotate")
            .arg(format!(
                "--inclusive={}",
                if inclusive { "yes" } else { "no" }
            ))
            .arg("--auto=no")
            .arg(format!("{}.{k}", out.display()))
            .output()
            .expect("callgrind_annotate runs");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let (a_small, a_large) = (annotate(1, true), annotate(2, true));
    if let Some(keep) = std::env::var_os("CALLGRIND_KEEP") {
        // The dumps themselves, for callgrind_annotate or kcachegrind.
        for k in [1, 2] {
            let from = format!("{}.{k}", out.display());
            let to = format!("{}.{k}", Path::new(&keep).display());
            std::fs::copy(&from, &to).unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
        }
    }
    let total = |a: &str| -> f64 {
        a.lines()
            .find(|l| l.contains("PROGRAM TOTALS"))
            .and_then(first_count)
            .unwrap_or(f64::NAN)
    };
    // The first (largest) inclusive count of the function whose name ends
    // a field of the line (callgrind_annotate prints file:function).
    let inclusive = |a: &str, name: &str| -> f64 {
        a.lines()
            .filter(|l| !l.contains("=>"))
            .find(|l| l.split_whitespace().any(|f| f.ends_with(name)))
            .and_then(first_count)
            .unwrap_or(0.0)
    };
    let calls = small.calls as f64;
    let (all, verifies) = (total(&a_small), inclusive(&a_small, "_EVP_DigestVerify"));
    println!(
        "callgrind: {} small calls, then {} MiB in 2 downloads",
        small.calls,
        large.bytes >> 20
    );
    println!(
        "instructions per proxied call: {:.0} (the broker's user space, all threads)",
        all / calls
    );
    println!(
        "  the two ES256 verifies (EVP_DigestVerify, hashing included): {:.0}",
        verifies / calls
    );
    println!("  everything else: {:.0}", (all - verifies) / calls);
    println!("ratio to the two verifies: {:.3}", all / verifies);
    // The function listing, by own instructions: after the second header
    // line (the first is the totals').
    let own = |k: usize| -> Vec<String> {
        let mut headers = 0;
        annotate(k, false)
            .lines()
            .filter(|l| {
                headers += usize::from(l.starts_with("Ir"));
                headers >= 2 && first_count(l).is_some()
            })
            .map(str::to_string)
            .collect()
    };
    let mibs = large.bytes as f64 / (1 << 20) as f64;
    // memchr's functions call nothing else: their own counts are the
    // whole of the echo guard's substring search.
    let search: f64 = own(2)
        .iter()
        .filter(|l| l.contains("/memchr-"))
        .filter_map(|l| first_count(l))
        .sum();
    println!(
        "instructions per MiB downloaded: {:.0}, of which the echo guard's substring search {:.0}",
        total(&a_large) / mibs,
        search / mibs
    );
    println!("top functions of the small calls, by own instructions:");
    for l in own(1).iter().take(16) {
        println!("  {}", l.chars().take(150).collect::<String>());
    }
}

/// The count at the start of a callgrind_annotate line (`1,234 (5.6%) ...`).
fn first_count(line: &str) -> Option<f64> {
    line.split_whitespace()
        .next()?
        .replace(',', "")
        .parse()
        .ok()
}

// ------------------------------------------------------------ processes

/// Children started by this run; stopped (SIGTERM, then waited for) when
/// it ends, however it ends.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            terminate(c);
            // The floor proxy's audit file and replay tree.
            let _ = std::fs::remove_dir_all(floor_dir(c.id()));
        }
    }
}

/// The floor proxy's directory (its audit file and its replay tree).
fn floor_dir(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("credbroker-floor-proxy-{pid}"))
}

fn terminate(c: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &c.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if c.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// Starts this binary in `role`; returns it and the address it printed.
fn start_role(role: &[&str]) -> (Child, SocketAddr) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().parse().unwrap();
    (c, addr)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within 180 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn quickstart(
    bin: &Path,
    dir: &Path,
    listen: &str,
    demo: &str,
    log: &Path,
    callgrind: Option<&Path>,
) -> Child {
    let mut cmd = match callgrind {
        // valgrind runs the broker in its own process: the pid is the
        // broker's, for /proc and for callgrind_control.
        Some(out) => {
            let mut c = Command::new("valgrind");
            c.args(["--tool=callgrind", "--instr-atstart=no"])
                .arg(format!("--callgrind-out-file={}", out.display()))
                .arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.args(["quickstart", "--dir"])
        .arg(dir)
        .args(["--listen", listen, "--demo-listen", demo])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

// ------------------------------------------------------------ the client

/// One keep-alive HTTP/1.1 connection, hand-written so that the client's
/// own cost is small and the same on every path.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            s,
            buf: Vec::with_capacity(256 * 1024),
        }
    }

    /// Sends `req`, reads the whole answer (Content-Length framed) and
    /// returns the status and the body's length; the body is discarded
    /// as it comes, the first 512 bytes kept in `head` for a refusal.
    fn call(&mut self, req: &[u8], head: &mut Vec<u8>) -> std::io::Result<(u16, usize)> {
        self.s.write_all(req)?;
        self.buf.clear();
        head.clear();
        let mut chunk = vec![0u8; 256 * 1024];
        let end = loop {
            if let Some(p) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            let n = self.s.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        };
        let text = String::from_utf8_lossy(&self.buf[..end]).to_ascii_lowercase();
        let status: u16 = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        let len: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| std::io::Error::other("an answer without Content-Length"))?;
        let mut got = self.buf.len() - end;
        head.extend_from_slice(&self.buf[end..self.buf.len().min(end + 512)]);
        while got < len {
            let n = self.s.read(&mut chunk[..(len - got).min(256 * 1024)])?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if head.len() < 512 {
                head.extend_from_slice(&chunk[..n.min(512 - head.len())]);
            }
            got += n;
        }
        Ok((status, len))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Direct,
    Plain,
    Floor,
    Broker,
}

/// The paths of the small calls, and of the downloads (the floor proxy's
/// verifies are once a request: a download through it is the plain
/// proxy's).
const SMALL_PATHS: [Via; 4] = [Via::Direct, Via::Plain, Via::Floor, Via::Broker];
const LARGE_PATHS: [Via; 3] = [Via::Direct, Via::Plain, Via::Broker];

impl Via {
    fn name(self) -> &'static str {
        match self {
            Via::Direct => "direct",
            Via::Plain => "plain proxy",
            Via::Floor => "floor proxy",
            Via::Broker => "credbroker",
        }
    }
}

/// What a call needs on each path.
struct Target {
    upstream: SocketAddr,
    plain: SocketAddr,
    floor: SocketAddr,
    broker: SocketAddr,
    issuer: String,
    provider_token: String,
    proxy_token: String,
    key: Es256Key,
}

impl Target {
    fn addr(&self, p: Via) -> SocketAddr {
        match p {
            Via::Direct => self.upstream,
            Via::Plain => self.plain,
            Via::Floor => self.floor,
            Via::Broker => self.broker,
        }
    }

    /// The request for `path` on `p`: the provider token on the first
    /// three, the proxy token and a proof made now on the broker.
    fn request(&self, p: Via, path: &str) -> Vec<u8> {
        match p {
            Via::Direct | Via::Plain | Via::Floor => format!(
                "GET {path} HTTP/1.1\r\nhost: api\r\nauthorization: Bearer {}\r\n\r\n",
                self.provider_token
            ),
            Via::Broker => {
                let htu = format!("{}/proxy/demo{path}", self.issuer);
                let proof = credbroker::client::proof(&self.key, "GET", &htu, Some(&self.proxy_token))
                    .unwrap();
                format!(
                    "GET /proxy/demo{path} HTTP/1.1\r\nhost: broker\r\nauthorization: DPoP {}\r\ndpop: {proof}\r\n\r\n",
                    self.proxy_token
                )
            }
        }
        .into_bytes()
    }
}

struct Window {
    path: Via,
    calls: usize,
    bytes: usize,
    wall: f64,
    latencies_us: Vec<f64>,
    cost: Cost,
    refused: usize,
    first_refusal: Option<String>,
}

/// `n` GETs of `path`, sequential on each of `conns` connections (one
/// thread each), the requests (and the broker's proofs) made before the
/// clock starts for each.
fn window(t: &Target, pids: &Pids, p: Via, path: &str, n: usize, conns: usize) -> Window {
    let conns = conns.clamp(1, n.max(1));
    let mut w = Window {
        path: p,
        calls: 0,
        bytes: 0,
        wall: 0.0,
        latencies_us: Vec::with_capacity(n),
        cost: Cost::default(),
        refused: 0,
        first_refusal: None,
    };
    // Connected before the window's clock and counters start.
    let opened: Vec<Conn> = (0..conns).map(|_| Conn::open(t.addr(p))).collect();
    let before = pids.sample();
    let start = Instant::now();
    let parts: Vec<Part> = std::thread::scope(|s| {
        let running: Vec<_> = opened
            .into_iter()
            .enumerate()
            .map(|(i, conn)| {
                // The first `n % conns` connections make one call more.
                let mine = n / conns + usize::from(i < n % conns);
                s.spawn(move || calls(t, p, path, conn, mine))
            })
            .collect();
        running.into_iter().map(|h| h.join().unwrap()).collect()
    });
    w.wall = start.elapsed().as_secs_f64();
    w.cost = cost(&before, &pids.sample());
    for part in parts {
        w.calls += part.served;
        w.bytes += part.bytes;
        w.refused += part.refused;
        w.latencies_us.extend(part.latencies_us);
        if w.first_refusal.is_none() {
            w.first_refusal = part.first_refusal;
        }
    }
    w
}

/// What one connection of a window saw.
#[derive(Default)]
struct Part {
    served: usize,
    bytes: usize,
    refused: usize,
    latencies_us: Vec<f64>,
    first_refusal: Option<String>,
}

fn calls(t: &Target, p: Via, path: &str, mut conn: Conn, n: usize) -> Part {
    let mut head = Vec::new();
    let mut part = Part {
        latencies_us: Vec::with_capacity(n),
        ..Part::default()
    };
    for _ in 0..n {
        let req = t.request(p, path);
        let sent = Instant::now();
        let (status, len) = conn.call(&req, &mut head).expect("the connection failed");
        part.latencies_us.push(sent.elapsed().as_secs_f64() * 1e6);
        if status == 200 {
            part.served += 1;
            part.bytes += len;
        } else {
            part.refused += 1;
            part.first_refusal.get_or_insert_with(|| {
                format!("HTTP {status}: {}", String::from_utf8_lossy(&head))
            });
        }
    }
    part
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn verdict(c: &Cost) -> &'static str {
    if c.others < VALID_OTHERS {
        "valid"
    } else {
        "INVALID (others >= 10 % of a core)"
    }
}

async fn derive(
    t_socket: &Path,
    issuer: &str,
    subject: &str,
    tool: &str,
    resource: &str,
    key: &Es256Key,
) -> Answer {
    Client::new(t_socket, issuer)
        .derive(
            &DeriveParams {
                subject_token: subject,
                step: "summarize",
                tool,
                resource,
                scope: None,
            },
            key,
        )
        .await
        .unwrap()
}

fn issued(a: Answer, what: &str) -> String {
    match a {
        Answer::Issued(t) => t.access_token.expose().clone(),
        Answer::Refused(r) => panic!("{what} refused: {:?} {:?}", r.reason, r.error_description),
    }
}

fn bench(args: Args) {
    let hz = clock_ticks();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut children = Children(Vec::new());

    let (up, upstream) = start_role(&["upstream"]);
    let mut up_stdin = None;
    children.0.push(up);
    std::mem::swap(&mut up_stdin, &mut children.0[0].stdin);
    let mut up_stdin = up_stdin.unwrap();
    let (plain_child, plain) = start_role(&["plain-proxy", &upstream.to_string()]);
    children.0.push(plain_child);
    let (floor_child, floor_proxy) =
        start_role(&["plain-proxy", &upstream.to_string(), "--verify"]);
    children.0.push(floor_child);

    // The quick start, once to write its files (and print the passwords),
    // then again with the benchmark's additions.
    let qs = tmp.path().join("qs");
    let (port, demo_port) = (free_port(), free_port());
    let (listen, demo_listen) = (
        format!("127.0.0.1:{port}"),
        format!("127.0.0.1:{demo_port}"),
    );
    let (issuer, demo) = (format!("http://{listen}"), format!("http://{demo_listen}"));
    let log = tmp.path().join("first.log");
    let mut first = quickstart(&args.bin, &qs, &listen, &demo_listen, &log, None);
    wait_for("the first quick start's banner", || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("Next steps")
    });
    let password = connect::alice_password(&std::fs::read_to_string(&log).unwrap())
        .expect("the banner prints alice's password");
    terminate(&mut first);
    let config = qs.join("credbroker.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let last_table = text.lines().rfind(|l| l.starts_with('[')).unwrap_or("");
    assert_eq!(
        last_table, "[providers.demo]",
        "the demo provider's table ends the config"
    );
    let proxy = format!("{issuer}/proxy/demo");
    std::fs::write(
        &config,
        format!(
            "{text}api_base = \"http://{upstream}\"\n\n\
             # Raised for the benchmark (examples/proxy_bench.rs).\n[limits]\n\
             per_peer_per_second = 1000000000\nper_person_tool_per_second = 1000000000\nburst = 1000000000\n"
        ),
    )
    .unwrap();
    let policy = qs.join("policy.toml");
    let mut p = std::fs::read_to_string(&policy).unwrap();
    p.push_str(&format!(
        r#"
# Added by examples/proxy_bench.rs: the demo service's own token, for the
# direct path (the way the proxy ends; only the benchmark uses it here).
[resources."{demo}/api"]
source = "service"
service = "demo"
delivery = "provider_token"

[tools."bench.direct"]
resource = "{demo}/api"
scopes = ["notes:read"]
steps = ["summarize"]

# A tool of the quick start's proxy resource for the demo service, on the
# benchmark's routes.
[tools."bench.proxy"]
resource = "{proxy}"
scopes = ["notes:read"]
steps = ["summarize"]
routes = ["GET /small", "GET /blob/{{mib}}"]
"#
    ));
    std::fs::write(&policy, p).unwrap();
    let serve_log = tmp.path().join("serve.log");
    let cg_out = tmp.path().join("callgrind.out");
    let broker = quickstart(
        &args.bin,
        &qs,
        &listen,
        &demo_listen,
        &serve_log,
        args.callgrind.map(|_| cg_out.as_path()),
    );
    let broker_pid = broker.id();
    children.0.push(broker);
    let socket = qs.join("credbroker.sock");
    wait_for("the broker's socket", || {
        socket.exists() && TcpStream::connect(&listen).is_ok()
    });
    if args.settle > 0 {
        println!("waiting {} s for the broker to settle", args.settle);
        std::thread::sleep(Duration::from_secs(args.settle));
    }
    let subject = String::from_utf8(
        Command::new(&args.bin)
            .args(["subject-token", "--dir"])
            .arg(&qs)
            .args(["--sub", "alice", "--ttl", "1h"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    let key = Es256Key::generate().unwrap().0;

    // Connect Alice's demo account through the pages, as she would.
    let link = match rt.block_on(derive(
        &socket,
        &issuer,
        &subject,
        "bench.proxy",
        &proxy,
        &key,
    )) {
        Answer::Refused(r) if r.reason.as_deref() == Some("connect_required") => {
            r.connect_uri.expect("a connect link")
        }
        Answer::Refused(r) => panic!(
            "unexpected refusal {:?}: {:?}",
            r.reason, r.error_description
        ),
        Answer::Issued(_) => panic!("issued before any account was connected"),
    };
    rt.block_on(connect::connect_over_http(&issuer, &demo, &link, &password));
    let demo_api = format!("{demo}/api");
    let tokens = |rt: &tokio::runtime::Runtime, key: &Es256Key| {
        let provider = issued(
            rt.block_on(derive(
                &socket,
                &issuer,
                &subject,
                "bench.direct",
                &demo_api,
                key,
            )),
            "the provider token (bench.direct)",
        );
        let proxied = issued(
            rt.block_on(derive(
                &socket,
                &issuer,
                &subject,
                "bench.proxy",
                &proxy,
                key,
            )),
            "the proxy token (bench.proxy)",
        );
        (provider, proxied)
    };
    let (provider_token, proxy_token) = tokens(&rt, &key);
    writeln!(up_stdin, "{provider_token}").unwrap();
    let mut t = Target {
        upstream,
        plain,
        floor: floor_proxy,
        broker: listen.parse().unwrap(),
        issuer: issuer.clone(),
        provider_token,
        proxy_token,
        key,
    };
    let pids = Pids {
        broker: broker_pid,
        plain: children.0[1].id(),
        floor: children.0[2].id(),
        upstream: children.0[0].id(),
        hz,
    };
    // The upstream refuses anything but the provider token (checked here
    // once, then its control: the same call with the token is served).
    {
        let mut c = Conn::open(upstream);
        let mut head = Vec::new();
        let wrong =
            b"GET /small HTTP/1.1\r\nhost: api\r\nauthorization: Bearer not-the-token\r\n\r\n";
        assert_eq!(c.call(wrong, &mut head).unwrap().0, 401);
        assert_eq!(
            c.call(&t.request(Via::Direct, "/small"), &mut head)
                .unwrap()
                .0,
            200
        );
    }

    // For a profile of the broker alone while the run goes on
    // (`perf record -e cpu-clock -g -p PID`, docs/PERFORMANCE.md).
    println!(
        "pids: broker {broker_pid}, plain proxy {}, floor proxy {}, upstream {}",
        pids.plain, pids.floor, pids.upstream
    );
    println!(
        "machine: {} cores, {}; load {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("model name\t: "))
            .unwrap_or("?"),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    if let Some(n) = args.callgrind {
        count_instructions(&t, &pids, n, args.mib, &cg_out);
        return;
    }
    let (fp0, fq0) = crypto_floor_us(5_000);
    println!(
        "crypto floor (before): verify, key parsed {fp0:.1} us; verify, key preparsed {fq0:.1} us"
    );
    println!("{}", machine::wakeup_line());

    // Warm-up: connections, allocators, the broker's caches.
    for p in SMALL_PATHS {
        window(&t, &pids, p, "/small", 50, args.concurrency);
    }
    for p in LARGE_PATHS {
        window(&t, &pids, p, &format!("/blob/{}", args.mib), 1, 1);
    }

    let refresh = |t: &mut Target, up_stdin: &mut std::process::ChildStdin| {
        let (provider, proxied) = tokens(&rt, &t.key);
        if provider != t.provider_token {
            writeln!(up_stdin, "{provider}").unwrap();
            t.provider_token = provider;
        }
        t.proxy_token = proxied;
    };
    // The order turns each round.
    let order = |paths: &[Via], round: usize| -> Vec<Via> {
        (0..paths.len())
            .map(|i| paths[(round + i) % paths.len()])
            .collect()
    };

    let mut small: Vec<Window> = Vec::new();
    println!(
        "small GETs ({} per window, {} at a time):",
        args.calls, args.concurrency
    );
    for round in 0..args.rounds {
        // A proxy token lives at most 300 s: a fresh one each round.
        refresh(&mut t, &mut up_stdin);
        for p in order(&SMALL_PATHS, round) {
            let w = window(&t, &pids, p, "/small", args.calls, args.concurrency);
            let mut l = w.latencies_us.clone();
            l.sort_by(f64::total_cmp);
            println!(
                "  round {round} {:<11} p50 {:>6.0} us  p99 {:>6.0} us  broker {:>6.1} us/call  plain {:>5.1} us/call  floor {:>6.1} us/call  others {:>3.0} %  {}",
                p.name(),
                pct(&l, 0.5),
                pct(&l, 0.99),
                w.cost.broker_ns / 1e3 / w.latencies_us.len() as f64,
                w.cost.plain_ns / 1e3 / w.latencies_us.len() as f64,
                w.cost.floor_ns / 1e3 / w.latencies_us.len() as f64,
                w.cost.others * 100.0,
                verdict(&w.cost)
            );
            small.push(w);
        }
    }
    let rss_before = rss_kib(broker_pid);
    println!(
        "broker before the downloads: VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        rss_before.0 as f64 / 1024.0,
        rss_before.1 as f64 / 1024.0
    );
    let blob = format!("/blob/{}", args.mib);
    let mut large: Vec<Window> = Vec::new();
    println!(
        "downloads of {} MiB ({} per window):",
        args.mib, args.downloads
    );
    for round in (0..args.rounds).filter(|_| args.downloads > 0) {
        refresh(&mut t, &mut up_stdin);
        for p in order(&LARGE_PATHS, round) {
            let w = window(&t, &pids, p, &blob, args.downloads, 1);
            let mib = w.bytes as f64 / (1 << 20) as f64;
            println!(
                "  round {round} {:<11} {:>7.0} MiB/s  broker {:>6.0} us/MiB  plain {:>6.0} us/MiB  upstream {:>5.0} us/MiB  others {:>3.0} %  {}",
                p.name(),
                mib / w.wall,
                w.cost.broker_ns / 1e3 / mib.max(1e-9),
                w.cost.plain_ns / 1e3 / mib.max(1e-9),
                w.cost.upstream_ns / 1e3 / mib.max(1e-9),
                w.cost.others * 100.0,
                verdict(&w.cost)
            );
            large.push(w);
        }
    }
    let rss_after = rss_kib(broker_pid);
    println!(
        "broker after the downloads: VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        rss_after.0 as f64 / 1024.0,
        rss_after.1 as f64 / 1024.0
    );
    let (fp1, fq1) = crypto_floor_us(5_000);
    println!(
        "crypto floor (after): verify, key parsed {fp1:.1} us; verify, key preparsed {fq1:.1} us"
    );
    let floor = fq0 + fq1;

    for w in small.iter().chain(&large) {
        if w.refused > 0 {
            eprintln!(
                "{} window: {} of {} calls refused; first: {}",
                w.path.name(),
                w.refused,
                w.refused + w.calls,
                w.first_refusal.as_deref().unwrap_or("?")
            );
        }
    }

    // Summaries, over every window and over the valid ones only.
    let summary = |only_valid: bool| -> serde_json::Value {
        fn pick(ws: &[Window], p: Via, only_valid: bool) -> Vec<&Window> {
            ws.iter()
                .filter(|w| w.path == p && (!only_valid || w.cost.others < VALID_OTHERS))
                .collect()
        }
        let mut out = serde_json::Map::new();
        let lat = |p: Via| {
            let mut l: Vec<f64> = pick(&small, p, only_valid)
                .iter()
                .flat_map(|w| w.latencies_us.iter().copied())
                .collect();
            l.sort_by(f64::total_cmp);
            (pct(&l, 0.5), pct(&l, 0.99), l.len())
        };
        let (d50, d99, _) = lat(Via::Direct);
        for p in SMALL_PATHS {
            let (p50, p99, n) = lat(p);
            let ws = pick(&small, p, only_valid);
            let calls: usize = ws.iter().map(|w| w.calls).sum();
            let broker_us =
                ws.iter().map(|w| w.cost.broker_ns).sum::<f64>() / 1e3 / calls.max(1) as f64;
            let plain_us =
                ws.iter().map(|w| w.cost.plain_ns).sum::<f64>() / 1e3 / calls.max(1) as f64;
            let floor_us =
                ws.iter().map(|w| w.cost.floor_ns).sum::<f64>() / 1e3 / calls.max(1) as f64;
            let lw = pick(&large, p, only_valid);
            let bytes: usize = lw.iter().map(|w| w.bytes).sum();
            let mib = bytes as f64 / (1 << 20) as f64;
            let wall: f64 = lw.iter().map(|w| w.wall).sum();
            let per_mib = |f: fn(&Cost) -> f64| {
                lw.iter().map(|w| f(&w.cost)).sum::<f64>() / 1e3 / mib.max(1e-9)
            };
            out.insert(
                p.name().replace(' ', "_"),
                serde_json::json!({
                    "small_windows": ws.len(), "small_calls": n, "concurrency": args.concurrency,
                    "p50_us": p50, "p99_us": p99,
                    "added_p50_us": p50 - d50, "added_p99_us": p99 - d99,
                    "broker_cpu_us_per_call": broker_us, "plain_cpu_us_per_call": plain_us,
                    "floor_cpu_us_per_call": floor_us,
                    "large_windows": lw.len(),
                    "mib_per_s": mib / wall,
                    "broker_cpu_us_per_mib": per_mib(|c| c.broker_ns),
                    "plain_cpu_us_per_mib": per_mib(|c| c.plain_ns),
                    "upstream_cpu_us_per_mib": per_mib(|c| c.upstream_ns),
                }),
            );
        }
        serde_json::Value::Object(out)
    };
    let all = summary(false);
    let valid = summary(true);
    let windows = small.len() + large.len();
    let valid_windows = small
        .iter()
        .chain(&large)
        .filter(|w| w.cost.others < VALID_OTHERS)
        .count();
    println!(
        "crypto floor per proxied call: verify (proof; the broker keeps a tool's parsed key) + verify (token; the verifier caches no token), keys preparsed = {floor:.1} us"
    );
    println!(
        "windows: {valid_windows} of {windows} valid (other processes used under 10 % of a core)"
    );
    for (label, s) in [("all windows", &all), ("valid windows only", &valid)] {
        println!("---- {label}");
        let g = |p: &str, k: &str| s[p][k].as_f64().unwrap_or(f64::NAN);
        for p in ["direct", "plain_proxy", "floor_proxy", "credbroker"] {
            let large = if p == "floor_proxy" {
                String::new()
            } else {
                format!(
                    " | {} MiB: {:>6.0} MiB/s over {} windows",
                    args.mib,
                    g(p, "mib_per_s"),
                    s[p]["large_windows"]
                )
            };
            println!(
                "  {p:<11} small: p50 {:>6.0} us (+{:>5.0}), p99 {:>6.0} us (+{:>5.0}) over {} windows{large}",
                g(p, "p50_us"),
                g(p, "added_p50_us"),
                g(p, "p99_us"),
                g(p, "added_p99_us"),
                s[p]["small_windows"],
            );
        }
        let b = g("credbroker", "broker_cpu_us_per_call");
        let f = g("floor_proxy", "floor_cpu_us_per_call");
        println!(
            "  broker CPU per proxied call: {b:.1} us = {:.2} x floor; plain proxy CPU per call: {:.1} us",
            b / floor,
            g("plain_proxy", "plain_cpu_us_per_call")
        );
        println!(
            "  floor proxy (the plain proxy plus the two verifies, the replay entry, the two audit lines and the echo scan) CPU per call: {f:.1} us = {:.2} x the crypto floor; credbroker / floor proxy: {:.2} (target 1.25)",
            f / floor,
            b / f
        );
        println!(
            "  CPU per MiB: credbroker {:.0} us (upstream {:.0}); plain proxy {:.0} us (upstream {:.0}); direct: upstream {:.0} us",
            g("credbroker", "broker_cpu_us_per_mib"),
            g("credbroker", "upstream_cpu_us_per_mib"),
            g("plain_proxy", "plain_cpu_us_per_mib"),
            g("plain_proxy", "upstream_cpu_us_per_mib"),
            g("direct", "upstream_cpu_us_per_mib"),
        );
        println!(
            "  throughput credbroker / plain proxy: {:.0} %; credbroker / direct: {:.0} %",
            g("credbroker", "mib_per_s") / g("plain_proxy", "mib_per_s") * 100.0,
            g("credbroker", "mib_per_s") / g("direct", "mib_per_s") * 100.0,
        );
    }
    println!(
        "broker memory: VmRSS {:.1} -> {:.1} MiB, VmHWM {:.1} -> {:.1} MiB across {} downloads of {} MiB",
        rss_before.0 as f64 / 1024.0,
        rss_after.0 as f64 / 1024.0,
        rss_before.1 as f64 / 1024.0,
        rss_after.1 as f64 / 1024.0,
        args.rounds * args.downloads,
        args.mib
    );
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "floor_us": floor, "floor_verify_parsed_us": (fp0 + fp1) / 2.0,
                "floor_verify_preparsed_us": (fq0 + fq1) / 2.0,
                "windows": windows, "valid_windows": valid_windows,
                "all": all, "valid": valid,
                "rss_kib_before": rss_before.0, "hwm_kib_before": rss_before.1,
                "rss_kib_after": rss_after.0, "hwm_kib_after": rss_after.1,
            })
        );
    }
    drop(children);
}
