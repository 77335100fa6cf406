//! Load generator for a running broker's orchestrator socket
//! (docs/PERFORMANCE.md; `scripts/bench-socket` starts a broker and runs it).
//!
//! It starts nothing itself. Every request carries a fresh DPoP proof made
//! during the run, with `iat` at the time the request is due (open loop) or
//! sent (closed loop): a window of a minute outlives any proof made before
//! it. The signing is the generator's CPU, not the broker's; in the open
//! loop it is done before the due time, off the measured path.
//!
//! What it reports, all measured in the same run:
//! - the crypto floor: one ES256 verify (key parsed beforehand: the broker
//!   keeps a tool's key after its first proof) plus one ES256 sign, on
//!   aws-lc-rs, timed here before and after the load;
//! - peak derives/s: closed loop, concurrency raised until throughput stops
//!   growing (or `--concurrency` fixed);
//! - the broker's CPU per derive (utime + stime from `/proc/PID/stat`, so
//!   all its threads and its kernel time), and that divided by the floor,
//!   at peak and in the open loop;
//! - the broker's context switches per derive (voluntary + nonvoluntary,
//!   summed over its threads in `/proc/PID/task/*/status`);
//! - p50/p99/p999 latency in an open loop at `--rate` (default: half the
//!   peak), from the send time and from the due time, with the generator's
//!   own send lag beside them. Requests are due on a fixed schedule; the
//!   due-time figure counts queueing a stalled broker would cause (no
//!   coordinated omission), the send-time figure is the broker's answer
//!   time alone;
//! - the broker's RSS (VmRSS, VmHWM from `/proc/PID/status`) right after
//!   the peak window (`--peak-duration`, 60 s for the memory target);
//! - for each window, whether it is valid: other processes (the machine's
//!   busy time from `/proc/stat` minus the broker's and this process's)
//!   used under 10 % of one core (issue 45). Figures from an invalid window
//!   are printed, marked so;
//! - with `--floor-socket` and `--floor-pid`, the derive floor
//!   (examples/derive_floor.rs: the same request answered by one
//!   straight-line function doing only the work the contract requires, on
//!   the broker's runtime settings) in windows alternating with the
//!   broker's, at the peak's concurrency and at the open loop's rate: the
//!   broker's CPU per derive, context switches and p99 as ratios to the
//!   floor's, round by round and over the valid rounds (the store floor,
//!   derive_floor with `--pg-host`, likewise, with `--floor-name "store
//!   floor"`: its DPoP nonces are its own, and PostgreSQL's CPU is
//!   reported in its windows as in the broker's);
//! - with `--alloc-counts DIR` (the broker and the floor built with the
//!   `alloc-count` feature, started with `CREDBROKER_ALLOC_COUNTS=DIR`),
//!   allocations per derive beside the CPU, from the counts each reports
//!   on SIGUSR2 before and after each window;
//! - with `--db-pid` (a PostgreSQL postmaster), the CPU of that server's
//!   own processes (the postmaster and every child: backends, checkpointer,
//!   WAL writer...) per derive, beside the broker's, and not counted among
//!   the other processes.
//!
//! `--socket` and `--pid` may be repeated, for replicas: the connections
//! are spread over the sockets in turn, and the broker's CPU is the sum
//! over the pids.
//!
//! Plain blocking threads and hand-written HTTP/1.1 on keep-alive
//! connections keep the generator's own cost small: it shares the machine.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair, ParsedPublicKey};
use clap::Parser;
use credbroker::internals::jose::Es256Key;

#[path = "support/machine.rs"]
mod machine;

#[derive(Parser, Debug)]
#[command(about = "Load generator for a credbroker orchestrator socket")]
struct Args {
    /// The broker's orchestrator socket; repeated for replicas (the
    /// connections are spread over them in turn).
    #[arg(long, required = true)]
    socket: Vec<PathBuf>,
    /// The broker's issuer URL (base of the proofs' htu).
    #[arg(long)]
    issuer: String,
    /// A subject token (reused: the broker caches it after the first derive).
    #[arg(long)]
    subject_token: String,
    #[arg(long, default_value = "summarize")]
    step: String,
    #[arg(long, default_value = "notes.read")]
    tool: String,
    #[arg(long, default_value = "http://127.0.0.1:9090/notes")]
    resource: String,
    /// Seconds of the open-loop window (and of the peak window unless
    /// `--peak-duration` is given).
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Seconds of the full peak window (60 for the RSS-after-a-minute
    /// figure). Default: `--duration`.
    #[arg(long)]
    peak_duration: Option<f64>,
    /// Open-loop rate (derives/s). Default: half the measured peak.
    #[arg(long)]
    rate: Option<f64>,
    /// Closed-loop concurrency for the peak. Default: search 1, 2, 4, ...
    #[arg(long)]
    concurrency: Option<usize>,
    /// Connections (threads) of the open loop; enough that a request never
    /// waits for one at half of peak.
    #[arg(long, default_value_t = 32)]
    open_connections: usize,
    /// The broker's pid, for CPU and RSS; repeated for replicas (CPU is
    /// summed). Without it those are not reported.
    #[arg(long)]
    pid: Vec<u32>,
    /// A PostgreSQL postmaster's pid: the CPU of it and its children is
    /// reported per derive beside the broker's.
    #[arg(long)]
    db_pid: Option<u32>,
    /// A name for this run, printed with its figures (and in the JSON).
    #[arg(long, default_value = "")]
    label: String,
    /// Print one JSON line with the figures at the end.
    #[arg(long)]
    json: bool,
    /// Count the broker's syscalls per derive in an extra open-loop window
    /// at the open loop's rate: `perf` (the `syscalls:sys_enter_*`
    /// tracepoints; needs tracefs mounted), `strace` (`strace -c -f`),
    /// `auto` (perf where the tracepoints exist, else strace) or `off`.
    /// Only the counts of that window are reported: a tracer slows the
    /// broker, so its CPU and latency there are not the broker's.
    #[arg(long, default_value = "off")]
    syscalls: String,
    /// Seconds of the syscall window.
    #[arg(long, default_value_t = 3.0)]
    syscall_duration: f64,
    /// An `oidc-provider` token endpoint (tests/peers/bench-oidc-dpop.mjs)
    /// to measure side by side: closed-loop windows alternate between the
    /// broker and it, the same length and concurrency, each request with a
    /// fresh ES256 DPoP proof made here.
    #[arg(long)]
    compare_url: Option<String>,
    /// The pid of the process serving `--compare-url` (its CPU, all
    /// threads, from `/proc`).
    #[arg(long)]
    compare_pid: Option<u32>,
    #[arg(long, default_value = "bench")]
    compare_client_id: String,
    #[arg(long, default_value = "")]
    compare_client_secret: String,
    /// Rounds of the side-by-side (each: one broker window, one provider
    /// window).
    #[arg(long, default_value_t = 2)]
    compare_rounds: usize,
    /// Connections of the side-by-side windows, for both servers.
    #[arg(long, default_value_t = 32)]
    compare_concurrency: usize,
    /// Seconds of each side-by-side window. Default: `--duration`.
    #[arg(long)]
    compare_duration: Option<f64>,
    /// The derive floor's socket (examples/derive_floor.rs, started on the
    /// same issuer and subject token): measured in windows alternating with
    /// the broker's, and the broker's figures given as ratios to its.
    #[arg(long, requires = "floor_pid")]
    floor_socket: Option<PathBuf>,
    /// The derive floor's pid (its CPU and context switches).
    #[arg(long, requires = "floor_socket")]
    floor_pid: Option<u32>,
    /// Rounds against the floor, each a closed-loop and an open-loop
    /// window for the broker and for the floor (the order turns each round).
    #[arg(long, default_value_t = 2)]
    floor_rounds: usize,
    /// The directory the broker and the floor write their allocation
    /// counts to (both built with the `alloc-count` feature and started
    /// with `CREDBROKER_ALLOC_COUNTS` naming it): each is signalled
    /// (SIGUSR2) before and after each window, and its allocations per
    /// derive printed beside its CPU.
    #[arg(long)]
    alloc_counts: Option<PathBuf>,
    /// The floor's name in what is printed (`store floor` for
    /// derive_floor's store mode).
    #[arg(long, default_value = "derive floor")]
    floor_name: String,
    /// Only the peak window and the memory after it (for a broker with
    /// other limits, e.g. the default replay cache): no open loop.
    #[arg(long)]
    peak_only: bool,
}

// ------------------------------------------------------------ crypto floor

/// Microseconds of one sign and of one verify (public key parsed once, as
/// the broker keeps the key of a tool's proofs), averaged over `n` of each. Timed in this thread's CPU
/// time (`/proc/thread-self/schedstat`), like the broker's CPU, so other
/// processes on the machine do not inflate the floor; wall time where that
/// file is missing.
fn crypto_floor_us(n: usize) -> (f64, f64) {
    let rng = SystemRandom::new();
    let doc =
        EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref())
        .unwrap();
    let public = pair.public_key().as_ref().to_vec();
    let msg = [b'a'; 600];
    let sig = pair.sign(&rng, &msg).unwrap();
    let timed = |f: &mut dyn FnMut()| -> f64 {
        let (c0, t0) = (thread_cpu_ns(), Instant::now());
        for _ in 0..n {
            f();
        }
        let ns = match (c0, thread_cpu_ns()) {
            (Some(a), Some(b)) => (b - a) as f64,
            _ => t0.elapsed().as_nanos() as f64,
        };
        ns / 1e3 / n as f64
    };
    // One long batch each: the CPU clock may tick coarsely (4 ms was seen
    // in a VM), so the batch must be long for the figure to be precise.
    let sign = timed(&mut || {
        std::hint::black_box(pair.sign(&rng, std::hint::black_box(&msg)).unwrap());
    });
    let key = ParsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, &public).unwrap();
    let verify = timed(&mut || {
        key.verify_sig(std::hint::black_box(&msg), sig.as_ref())
            .unwrap();
    });
    (sign, verify)
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

// ---------------------------------------------------------------- /proc

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32, hz: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the `(comm)`, which may itself hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / hz)
}

/// (busy CPU seconds, seconds) of the whole machine so far
/// (`/proc/stat`): the second is the total over the CPUs divided by their
/// number, so that busy time over it is in cores.
fn machine_seconds(hz: f64) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpus = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count()
        .max(1) as f64;
    let f: Vec<f64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|x| x.parse().ok())
        .collect();
    if f.len() < 8 {
        return None;
    }
    let total: f64 = f.iter().sum();
    let idle = f[3] + f[4];
    Some(((total - idle) / hz, total / hz / cpus))
}

/// CPU seconds of the PostgreSQL server whose postmaster is `pid`: its own
/// and its children's (backends, background workers), by pid, so that a
/// window can subtract per process. A backend that exits inside a window
/// takes its CPU with it; the broker's pooled connections live for the run.
fn db_processes(pid: u32, hz: f64) -> Option<Vec<(u32, f64)>> {
    let mut out = vec![(pid, cpu_seconds(pid, hz)?)];
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 2..].split(' ').nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            if let Some(c) = cpu_seconds(child, hz) {
                out.push((child, c));
            }
        }
    }
    Some(out)
}

/// Samples taken around a window, to tell how much of the machine other
/// processes used meanwhile (a shared machine disturbs latency).
struct Around {
    broker: Option<f64>,
    switches: Option<u64>,
    /// Allocations so far (`--alloc-counts`), summed over the pids.
    allocs: Option<u64>,
    db: Option<Vec<(u32, f64)>>,
    /// The compared server's (`--compare-pid`) CPU seconds.
    peer: Option<f64>,
    me: Option<f64>,
    machine: Option<(f64, f64)>,
}

/// What a window's samples say: CPU seconds of the broker (all pids) and
/// of the database's processes, the broker's context switches, and the
/// share of the machine's CPU time that someone else used.
struct Used {
    broker: Option<f64>,
    switches: Option<u64>,
    allocs: Option<u64>,
    db: Option<f64>,
    peer: Option<f64>,
    others: Option<f64>,
}

fn sum<T: std::iter::Sum<T>>(v: impl IntoIterator<Item = Option<T>>) -> Option<T> {
    v.into_iter()
        .collect::<Option<Vec<T>>>()
        .map(|v| v.into_iter().sum())
}

impl Around {
    fn take(
        pids: &[u32],
        db_pid: Option<u32>,
        peer_pid: Option<u32>,
        allocs: Option<&std::path::Path>,
        hz: f64,
    ) -> Around {
        let any = !pids.is_empty();
        Around {
            // First: signalling takes a few milliseconds.
            allocs: allocs
                .and_then(|dir| sum(pids.iter().map(|p| alloc_calls(dir, *p))))
                .filter(|_| any),
            broker: sum(pids.iter().map(|p| cpu_seconds(*p, hz))).filter(|_| any),
            switches: sum(pids.iter().map(|p| ctx_switches(*p))).filter(|_| any),
            db: db_pid.and_then(|p| db_processes(p, hz)),
            peer: peer_pid.and_then(|p| cpu_seconds(p, hz)),
            me: cpu_seconds(std::process::id(), hz),
            machine: machine_seconds(hz),
        }
    }

    fn since(&self, before: &Around) -> Used {
        let broker = self.broker.zip(before.broker).map(|(b, a)| b - a);
        let switches = self
            .switches
            .zip(before.switches)
            .map(|(b, a)| b.saturating_sub(a));
        // Per process: one that started meanwhile counts from zero.
        let db = self.db.as_ref().zip(before.db.as_ref()).map(|(now, then)| {
            now.iter()
                .map(|(pid, c)| {
                    c - then
                        .iter()
                        .find(|(p, _)| p == pid)
                        .map_or(0.0, |(_, c0)| *c0)
                })
                .sum::<f64>()
        });
        let allocs = self
            .allocs
            .zip(before.allocs)
            .map(|(b, a)| b.saturating_sub(a));
        let me = self.me.zip(before.me).map(|(b, a)| b - a);
        let peer = self.peer.zip(before.peer).map(|(b, a)| b - a);
        let ours = broker.unwrap_or(0.0) + db.unwrap_or(0.0) + peer.unwrap_or(0.0);
        let others = match (self.machine, before.machine, me) {
            (Some((b1, t1)), Some((b0, t0)), Some(me)) if t1 > t0 => {
                Some(((b1 - b0) - me - ours).max(0.0) / (t1 - t0))
            }
            _ => None,
        };
        Used {
            broker,
            switches,
            allocs,
            db,
            peer,
            others,
        }
    }
}

/// The allocations `pid` has made so far, as it reports them on SIGUSR2
/// (crates/alloc-count) to `dir/PID`: signals it and waits (at most 2 s)
/// for a report newer than the one there.
fn alloc_calls(dir: &std::path::Path, pid: u32) -> Option<u64> {
    let path = dir.join(pid.to_string());
    let read = || -> Option<(u64, u64)> {
        let text = std::fs::read_to_string(&path).ok()?;
        let mut f = text.split_whitespace().map(|x| x.parse::<u64>().ok());
        Some((f.next()??, f.next()??))
    };
    let seq0 = read().map_or(0, |r| r.0);
    // kill(1), as for the syscall counter: outside the measured window.
    let sent = std::process::Command::new("kill")
        .args(["-USR2", &pid.to_string()])
        .status()
        .ok()?;
    if !sent.success() {
        return None;
    }
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        match read() {
            Some((seq, calls)) if seq > seq0 => return Some(calls),
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    eprintln!("alloc counts: pid {pid} did not report in 2 s (built with --features alloc-count, started with CREDBROKER_ALLOC_COUNTS?)");
    None
}

/// Context switches (voluntary + nonvoluntary) of every thread of `pid`.
/// `/proc/PID/status` has the main thread's only; the tasks have each.
fn ctx_switches(pid: u32) -> Option<u64> {
    let mut total = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(status) = std::fs::read_to_string(t.ok()?.path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        total += status
            .lines()
            .filter(|l| {
                l.starts_with("voluntary_ctxt_switches:")
                    || l.starts_with("nonvoluntary_ctxt_switches:")
            })
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Some(total)
}

/// A window counts only when other processes used under this share of one
/// core (issue 45; issue 17 said of the machine).
const VALID_OTHERS: f64 = 0.10;

fn validity(others: Option<f64>) -> &'static str {
    match others {
        Some(x) if x < VALID_OTHERS => "valid",
        Some(_) => "INVALID (other processes used 10 % or more of a core)",
        None => "INVALID (the machine's CPU time could not be read)",
    }
}

/// (VmRSS, VmHWM) of `pid` in KiB.
fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

// ------------------------------------------------------------ requests

struct Load {
    args: Args,
    key: Es256Key,
    htu: String,
    body: String,
    /// The last `DPoP-Nonce` each socket gave (`[dpop] require_nonce`, on
    /// by default with PostgreSQL; a nonce is bound to the replica).
    nonces: Vec<Mutex<Option<String>>>,
    /// The last `DPoP-Nonce` the floor gave (the store floor requires
    /// nonces of its own, as the broker on PostgreSQL does).
    floor_nonce: Mutex<Option<String>>,
    /// The compared token endpoint (`--compare-url`), if any.
    provider: Option<Provider>,
}

/// Which server a connection talks to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    /// The broker's orchestrator socket: `POST /v1/derive`.
    Broker,
    /// The compared `oidc-provider`: a client_credentials token request.
    Provider,
    /// The derive floor (`--floor-socket`): the broker's request.
    Floor,
}

/// `oidc-provider`'s token endpoint, split for hand-written HTTP/1.1.
struct Provider {
    /// `host:port`, for the TCP connection and the `host` header.
    addr: String,
    path: String,
    /// The whole URL: the proofs' `htu`.
    url: String,
    /// The form body: the grant and the client's credentials.
    body: String,
}

impl Provider {
    fn new(url: &str, client_id: &str, secret: &str) -> Provider {
        let rest = url
            .strip_prefix("http://")
            .expect("--compare-url must be an http:// URL");
        let (addr, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let form = |v: &str| -> String {
            v.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect()
        };
        Provider {
            addr: addr.to_string(),
            path: if path.is_empty() {
                "/".into()
            } else {
                path.into()
            },
            url: url.to_string(),
            body: format!(
                "grant_type=client_credentials&client_id={}&client_secret={}",
                form(client_id),
                form(secret)
            ),
        }
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

impl Load {
    /// This moment's samples for a window's figures.
    fn around(&self, hz: f64) -> Around {
        Around::take(
            &self.args.pid,
            self.args.db_pid,
            self.args.compare_pid,
            self.args.alloc_counts.as_deref(),
            hz,
        )
    }

    /// The samples for a window of `target`: a floor window's "broker" is
    /// the floor.
    fn around_for(&self, target: Target, hz: f64) -> Around {
        match (target, self.args.floor_pid) {
            // The database serves the store floor as it serves the broker:
            // its CPU is reported, not counted among the others.
            (Target::Floor, Some(p)) => Around::take(
                &[p],
                self.args.db_pid,
                None,
                self.args.alloc_counts.as_deref(),
                hz,
            ),
            _ => self.around(hz),
        }
    }

    /// One request to `target` with a fresh proof dated `iat`.
    fn request_to(&self, target: Target, iat: i64, sock: usize) -> Vec<u8> {
        match (target, &self.provider) {
            (Target::Provider, Some(p)) => p.request(&self.key, iat, true),
            (Target::Floor, _) => {
                let nonce = self.floor_nonce.lock().unwrap().clone();
                self.request_with(iat, nonce.as_deref())
            }
            _ => self.request(iat, sock),
        }
    }

    /// Keeps the `DPoP-Nonce` an answer of `target` carried.
    fn take_nonce_of(&self, target: Target, sock: usize, nonce: Option<String>) {
        match (target, nonce) {
            (Target::Floor, Some(n)) => *self.floor_nonce.lock().unwrap() = Some(n),
            (_, nonce) => self.take_nonce(sock, nonce),
        }
    }

    /// The socket of connection `i` (the sockets in turn).
    fn socket(&self, i: usize) -> &PathBuf {
        &self.args.socket[i % self.args.socket.len()]
    }

    /// One complete request to socket `sock` with a fresh proof dated
    /// `iat` (with the socket's last nonce, if it gave one).
    fn request(&self, iat: i64, sock: usize) -> Vec<u8> {
        let nonce = self.nonces[sock % self.nonces.len()]
            .lock()
            .unwrap()
            .clone();
        self.request_with(iat, nonce.as_deref())
    }

    /// One complete request with a fresh proof dated `iat` carrying
    /// `nonce`, if any.
    fn request_with(&self, iat: i64, nonce: Option<&str>) -> Vec<u8> {
        let proof =
            credbroker::internals::dpop::make_proof(&self.key, "POST", &self.htu, iat, None, nonce)
                .unwrap();
        format!(
            "POST /v1/derive HTTP/1.1\r\nhost: credbroker\r\ncontent-type: application/json\r\n\
             dpop: {proof}\r\ncontent-length: {}\r\n\r\n{}",
            self.body.len(),
            self.body
        )
        .into_bytes()
    }

    /// Keeps the `DPoP-Nonce` an answer of socket `sock` carried.
    fn take_nonce(&self, sock: usize, nonce: Option<String>) {
        if let Some(n) = nonce {
            *self.nonces[sock % self.nonces.len()].lock().unwrap() = Some(n);
        }
    }
}

impl Provider {
    /// A token request, with a fresh proof dated `iat` when `dpop`.
    fn request(&self, key: &Es256Key, iat: i64, dpop: bool) -> Vec<u8> {
        let proof = if dpop {
            let p =
                credbroker::internals::dpop::make_proof(key, "POST", &self.url, iat, None, None)
                    .unwrap();
            format!("dpop: {p}\r\n")
        } else {
            String::new()
        };
        format!(
            "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/x-www-form-urlencoded\r\n\
             {proof}content-length: {}\r\n\r\n{}",
            self.path,
            self.addr,
            self.body.len(),
            self.body
        )
        .into_bytes()
    }
}

/// A connection to the broker's Unix socket or to a TCP server.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

/// One keep-alive connection speaking just enough HTTP/1.1.
struct Conn {
    s: Stream,
    buf: Vec<u8>,
    /// The index of its socket (for its nonces).
    sock: usize,
    /// The `DPoP-Nonce` of the last answer, if any.
    nonce: Option<String>,
}

impl Conn {
    fn open(load: &Load, i: usize) -> Conn {
        Conn::open_to(load, Target::Broker, i)
    }

    fn open_to(load: &Load, target: Target, i: usize) -> Conn {
        let s = match (target, &load.provider) {
            (Target::Provider, Some(p)) => {
                let s = TcpStream::connect(&p.addr).expect("connect to --compare-url");
                s.set_nodelay(true).unwrap();
                Stream::Tcp(s)
            }
            (Target::Floor, _) => Stream::Unix(
                UnixStream::connect(load.args.floor_socket.as_ref().unwrap())
                    .expect("connect to the floor socket"),
            ),
            _ => Stream::Unix(
                UnixStream::connect(load.socket(i)).expect("connect to the broker socket"),
            ),
        };
        Conn {
            s,
            buf: Vec::with_capacity(4096),
            sock: i % load.args.socket.len(),
            nonce: None,
        }
    }

    /// Sends one request and reads the whole answer; returns the status and
    /// the body.
    fn call(&mut self, req: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        self.s.write_all(req)?;
        self.buf.clear();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            let n = self.s.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = std::str::from_utf8(&self.buf[..head_end]).unwrap_or("");
        let status: u16 = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        self.nonce = head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("dpop-nonce")
                .then(|| v.trim().to_string())
        });
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        while self.buf.len() < head_end + len {
            let n = self.s.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        Ok((status, self.buf[head_end..head_end + len].to_vec()))
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Outcome counts of a window, and the first refusal seen.
#[derive(Default)]
struct Outcomes {
    ok: usize,
    refused: usize,
    first_refusal: Option<String>,
}

impl Outcomes {
    fn add(&mut self, status: u16, body: &[u8]) {
        if status == 200 {
            self.ok += 1;
        } else {
            self.refused += 1;
            if self.first_refusal.is_none() {
                self.first_refusal =
                    Some(format!("HTTP {status}: {}", String::from_utf8_lossy(body)));
            }
        }
    }
    fn merge(&mut self, o: Outcomes) {
        self.ok += o.ok;
        self.refused += o.refused;
        if self.first_refusal.is_none() {
            self.first_refusal = o.first_refusal;
        }
    }
}

struct Window {
    outcomes: Outcomes,
    elapsed: f64,
    cpu: Option<f64>,
    /// The database server's CPU seconds in the window (`--db-pid`).
    db_cpu: Option<f64>,
    /// The compared server's CPU seconds in the window (`--compare-pid`).
    peer_cpu: Option<f64>,
    /// The broker's context switches in the window.
    switches: Option<u64>,
    /// The broker's allocations in the window (`--alloc-counts`).
    allocs: Option<u64>,
    /// Cores used by other processes meanwhile (0.1: a tenth of one).
    others: Option<f64>,
    /// Latency from when each request was due, microseconds (open loop).
    latencies_us: Vec<f64>,
    /// Latency from when each request was sent, microseconds (open loop).
    sent_us: Vec<f64>,
    /// How late each request left (timer slack, busy connections), us.
    lag_us: Vec<f64>,
}

impl Window {
    fn rate(&self) -> f64 {
        self.outcomes.ok as f64 / self.elapsed
    }
    fn cpu_per_derive_us(&self) -> Option<f64> {
        self.cpu.map(|c| c * 1e6 / self.outcomes.ok.max(1) as f64)
    }
    fn db_per_derive_us(&self) -> Option<f64> {
        self.db_cpu
            .map(|c| c * 1e6 / self.outcomes.ok.max(1) as f64)
    }
    fn allocs_per_derive(&self) -> Option<f64> {
        self.allocs
            .map(|n| n as f64 / self.outcomes.ok.max(1) as f64)
    }
    fn switches_per_derive(&self) -> Option<f64> {
        self.switches
            .map(|n| n as f64 / self.outcomes.ok.max(1) as f64)
    }
}

/// Closed loop: `conc` connections, each sending its next request (a proof
/// made just before, dated now) as soon as the answer to the last one is
/// in, until `duration` passes.
fn closed_loop(load: &Arc<Load>, conc: usize, duration: f64, hz: f64) -> Window {
    closed_loop_to(load, Target::Broker, conc, duration, hz)
}

fn closed_loop_to(load: &Arc<Load>, target: Target, conc: usize, duration: f64, hz: f64) -> Window {
    let stop = Arc::new(AtomicBool::new(false));
    let conns: Vec<Conn> = (0..conc).map(|i| Conn::open_to(load, target, i)).collect();
    let before = load.around_for(target, hz);
    let start = Instant::now();
    let handles: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            let (load, stop) = (load.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut o = Outcomes::default();
                while !stop.load(Ordering::Relaxed) {
                    let r = load.request_to(target, unix_now() as i64, c.sock);
                    match c.call(&r) {
                        Ok((s, b)) => {
                            load.take_nonce_of(target, c.sock, c.nonce.take());
                            o.add(s, &b)
                        }
                        Err(e) => {
                            o.add(0, e.to_string().as_bytes());
                            break;
                        }
                    }
                }
                (o, Instant::now())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(duration));
    stop.store(true, Ordering::Relaxed);
    let mut outcomes = Outcomes::default();
    let mut end = start;
    for h in handles {
        let (o, t) = h.join().unwrap();
        outcomes.merge(o);
        end = end.max(t);
    }
    let used = load.around_for(target, hz).since(&before);
    Window {
        outcomes,
        elapsed: (end - start).as_secs_f64(),
        cpu: used.broker,
        db_cpu: used.db,
        peer_cpu: used.peer,
        switches: used.switches,
        allocs: used.allocs,
        others: used.others,
        latencies_us: Vec::new(),
        sent_us: Vec::new(),
        lag_us: Vec::new(),
    }
}

/// Open loop: request `i` is due at `start + i / rate`, whatever happened to
/// the others; `conns` threads take the requests in order. Each thread
/// makes the proof (dated the due time) before sleeping until it is due.
fn open_loop(load: &Arc<Load>, rate: f64, duration: f64, conns: usize, hz: f64) -> Window {
    open_loop_to(load, Target::Broker, rate, duration, conns, hz)
}

fn open_loop_to(
    load: &Arc<Load>,
    target: Target,
    rate: f64,
    duration: f64,
    conns: usize,
    hz: f64,
) -> Window {
    let n = (rate * duration).ceil() as usize;
    let next = Arc::new(AtomicUsize::new(0));
    type Record = (Vec<f64>, Vec<f64>, Vec<f64>);
    let record: Arc<Mutex<Record>> = Arc::new(Mutex::new(Default::default()));
    let pool: Vec<Conn> = (0..conns).map(|i| Conn::open_to(load, target, i)).collect();
    let before = load.around_for(target, hz);
    // A short lead so every thread is asleep waiting when the first is due.
    let start = Instant::now() + Duration::from_millis(20);
    let start_unix = unix_now() + 0.020;
    let handles: Vec<_> = pool
        .into_iter()
        .map(|mut c| {
            let (load, next, record) = (load.clone(), next.clone(), record.clone());
            std::thread::spawn(move || {
                let mut o = Outcomes::default();
                let mut lat = Vec::new();
                let mut from_send = Vec::new();
                let mut lag = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let offset = i as f64 / rate;
                    let due = start + Duration::from_secs_f64(offset);
                    let r = load.request_to(target, (start_unix + offset) as i64, c.sock);
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    let sent = Instant::now();
                    match c.call(&r) {
                        Ok((s, b)) => {
                            load.take_nonce_of(target, c.sock, c.nonce.take());
                            o.add(s, &b)
                        }
                        Err(e) => {
                            o.add(0, e.to_string().as_bytes());
                            break;
                        }
                    }
                    let done = Instant::now();
                    lat.push(done.saturating_duration_since(due).as_secs_f64() * 1e6);
                    from_send.push((done - sent).as_secs_f64() * 1e6);
                    lag.push(sent.saturating_duration_since(due).as_secs_f64() * 1e6);
                }
                let mut rec = record.lock().unwrap();
                rec.0.extend(lat);
                rec.1.extend(from_send);
                rec.2.extend(lag);
                (o, Instant::now())
            })
        })
        .collect();
    let mut outcomes = Outcomes::default();
    let mut end = start;
    for h in handles {
        let (o, t) = h.join().unwrap();
        outcomes.merge(o);
        end = end.max(t);
    }
    let used = load.around_for(target, hz).since(&before);
    let (lat, sent, lag) = std::mem::take(&mut *record.lock().unwrap());
    Window {
        outcomes,
        elapsed: (end - start).as_secs_f64(),
        cpu: used.broker,
        db_cpu: used.db,
        peer_cpu: used.peer,
        switches: used.switches,
        allocs: used.allocs,
        others: used.others,
        latencies_us: lat,
        sent_us: sent,
        lag_us: lag,
    }
}

// ------------------------------------------------------------ syscalls

/// What the syscall window counted: the tool, the derives, and the calls
/// per syscall name, most frequent first.
type Syscalls = (&'static str, usize, Vec<(String, u64)>);

/// A syscall counter attached to the broker for one window.
struct Tracer {
    child: std::process::Child,
    tool: &'static str,
    out: PathBuf,
}

/// Where the per-syscall tracepoints are, when tracefs is mounted.
fn tracepoints_mounted() -> bool {
    [
        "/sys/kernel/tracing/events/syscalls",
        "/sys/kernel/debug/tracing/events/syscalls",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).is_dir())
}

impl Tracer {
    /// Attaches `perf stat` (the `syscalls:sys_enter_*` tracepoints) or
    /// `strace -c -f` to every thread of `pid`.
    fn attach(mode: &str, pid: u32) -> Option<Tracer> {
        let perf = match mode {
            "perf" => true,
            "strace" => false,
            "auto" => tracepoints_mounted(),
            _ => return None,
        };
        let out = std::env::temp_dir().join(format!("loadgen-syscalls-{}.txt", std::process::id()));
        let pid = pid.to_string();
        let o = out.to_str()?;
        let (tool, argv): (&'static str, Vec<&str>) = if perf {
            (
                "perf",
                vec![
                    "stat",
                    "-x,",
                    "-e",
                    "syscalls:sys_enter_*",
                    "-p",
                    &pid,
                    "-o",
                    o,
                ],
            )
        } else {
            ("strace", vec!["-c", "-f", "-p", &pid, "-o", o])
        };
        let child = std::process::Command::new(tool)
            .args(&argv)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| eprintln!("syscalls: cannot start {tool}: {e}"))
            .ok()?;
        // Neither tool says when it is attached to every thread; a second
        // is ample for a few dozen threads. The broker is idle meanwhile,
        // so what it counts then is a few timer wake-ups.
        std::thread::sleep(Duration::from_secs(1));
        Some(Tracer { child, tool, out })
    }

    /// Stops the counter (SIGINT makes both print their table) and returns
    /// the calls per syscall name, most frequent first.
    fn finish(mut self) -> Option<Vec<(String, u64)>> {
        std::process::Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .ok()?;
        self.child.wait().ok()?;
        let text = std::fs::read_to_string(&self.out).ok()?;
        let _ = std::fs::remove_file(&self.out);
        let mut counts: Vec<(String, u64)> = if self.tool == "perf" {
            // count,unit,event,...: one line per tracepoint.
            text.lines()
                .filter_map(|l| {
                    let mut f = l.split(',');
                    let n = f.next()?.parse::<u64>().ok()?;
                    let name = f.nth(1)?.strip_prefix("syscalls:sys_enter_")?;
                    Some((name.to_string(), n))
                })
                .collect()
        } else {
            // % time, seconds, usecs/call, calls, [errors,] syscall.
            text.lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    if f.len() < 5 || f[0].parse::<f64>().is_err() {
                        return None;
                    }
                    let name = *f.last()?;
                    (name != "total").then(|| Some((name.to_string(), f[3].parse().ok()?)))?
                })
                .collect()
        };
        counts.retain(|(_, n)| *n > 0);
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Some(counts)
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn share(x: Option<f64>) -> String {
    x.map_or_else(|| "?".into(), |x| format!("{:.0} %", x * 100.0))
}

fn check(w: &Window, what: &str) {
    if w.outcomes.refused > 0 {
        eprintln!(
            "{what}: {} of {} requests refused; first: {}",
            w.outcomes.refused,
            w.outcomes.ok + w.outcomes.refused,
            w.outcomes.first_refusal.as_deref().unwrap_or("?")
        );
    }
    if w.outcomes.ok == 0 {
        eprintln!("{what}: no derive succeeded; stopping");
        std::process::exit(1);
    }
}

/// Before measuring `oidc-provider`: a token request without a proof must
/// not get a DPoP token (the client's tokens are all DPoP-bound), and one
/// with a proof must get a real one (`token_type` "DPoP"). Exits otherwise.
fn check_provider(load: &Load) {
    let p = load.provider.as_ref().unwrap();
    let mut c = Conn::open_to(load, Target::Provider, 0);
    let answer = |c: &mut Conn, dpop: bool| -> (u16, serde_json::Value) {
        let (status, body) = c
            .call(&p.request(&load.key, unix_now() as i64, dpop))
            .expect("a token request to --compare-url");
        (status, serde_json::from_slice(&body).unwrap_or_default())
    };
    let (s0, b0) = answer(&mut c, false);
    if s0 == 200 || b0["token_type"] == "DPoP" {
        eprintln!(
            "oidc-provider: a request without a proof got HTTP {s0} {b0}; not a DPoP-only client"
        );
        std::process::exit(1);
    }
    let (s1, b1) = answer(&mut c, true);
    let is_token = b1["access_token"].as_str().is_some_and(|t| !t.is_empty());
    if s1 != 200 || b1["token_type"] != "DPoP" || !is_token {
        eprintln!(
            "oidc-provider: a request with a proof got HTTP {s1}, error {}; not a DPoP token",
            b1["error"]
        );
        std::process::exit(1);
    }
    // A JWT access token has three parts; an opaque one is one string.
    let parts = b1["access_token"]
        .as_str()
        .map_or(0, |t| t.split('.').count());
    println!(
        "oidc-provider check: without a proof HTTP {s0} ({}); with one HTTP 200, token_type DPoP, access token {}",
        b0["error"].as_str().unwrap_or("?"),
        if parts == 3 { "a JWT" } else { "opaque" }
    );
}

// ------------------------------------------------------------ the floor

/// One round against the derive floor: the broker's and the floor's
/// closed-loop window (the peak's concurrency) and open-loop window (the
/// open loop's rate).
struct FloorRound {
    broker_peak: Window,
    floor_peak: Window,
    broker_open: Window,
    floor_open: Window,
}

fn valid_window(w: &Window) -> bool {
    w.others.is_some_and(|x| x < VALID_OTHERS)
}

fn p99_from_send(w: &Window) -> f64 {
    let mut v = w.sent_us.clone();
    v.sort_by(|a, b| a.total_cmp(b));
    pct(&v, 0.99)
}

/// Windows alternating between the broker and the derive floor, the order
/// turning each round; prints each window and each round's ratios.
fn against_the_floor(load: &Arc<Load>, conc: usize, rate: f64, hz: f64) -> Vec<FloorRound> {
    let d = load.args.duration;
    let conns = load.args.open_connections;
    // The floor's warm-up: its proof key parsed, connections and
    // allocators warm (the broker had its own).
    // Its nonce first, where it requires one: one request, whose refusal
    // (`use_dpop_nonce`) carries it.
    let mut c = Conn::open_to(load, Target::Floor, 0);
    if c.call(&load.request_to(Target::Floor, unix_now() as i64, 0))
        .is_ok()
    {
        load.take_nonce_of(Target::Floor, 0, c.nonce.take());
    }
    let warm = closed_loop_to(load, Target::Floor, 4, 1.0, hz);
    check(&warm, "floor warm-up");
    let mut rounds = Vec::new();
    for r in 1..=load.args.floor_rounds {
        let order = if r % 2 == 1 {
            [Target::Broker, Target::Floor]
        } else {
            [Target::Floor, Target::Broker]
        };
        let mut peak: Vec<(Target, Window)> = Vec::new();
        let mut open: Vec<(Target, Window)> = Vec::new();
        for t in order {
            let w = closed_loop_to(load, t, conc, d, hz);
            check(&w, "against the floor, closed loop");
            peak.push((t, w));
        }
        for t in order {
            let w = open_loop_to(load, t, rate, d, conns, hz);
            check(&w, "against the floor, open loop");
            open.push((t, w));
        }
        let take = |v: &mut Vec<(Target, Window)>, t: Target| {
            let i = v.iter().position(|(x, _)| *x == t).unwrap();
            v.remove(i).1
        };
        let round = FloorRound {
            broker_peak: take(&mut peak, Target::Broker),
            floor_peak: take(&mut peak, Target::Floor),
            broker_open: take(&mut open, Target::Broker),
            floor_open: take(&mut open, Target::Floor),
        };
        for (name, w, open) in [
            ("credbroker, closed loop", &round.broker_peak, false),
            ("floor,      closed loop", &round.floor_peak, false),
            ("credbroker, open loop  ", &round.broker_open, true),
            ("floor,      open loop  ", &round.floor_open, true),
        ] {
            println!(
                "  floor round {r}, {name}: {:.0} derives/s, CPU {} us a derive, {} context switches a derive{}{} ({})",
                w.rate(),
                w.cpu_per_derive_us().map_or("?".into(), |c| format!("{c:.1}")),
                w.switches_per_derive().map_or("?".into(), |c| format!("{c:.2}")),
                w.allocs_per_derive().map_or(String::new(), |a| format!(", {a:.1} allocations a derive")),
                if open { format!(", p99 from send {:.0} us", p99_from_send(w)) } else { String::new() },
                validity(w.others)
            );
        }
        let ratio = |a: Option<f64>, b: Option<f64>| {
            a.zip(b)
                .map_or("?".into(), |(a, b)| format!("{:.2}", a / b))
        };
        println!(
            "  floor round {r}: CPU a derive {} x the floor's at peak ({conc} connections), {} x at {rate:.0}/s; p99 from send {:.2} x ({})",
            ratio(round.broker_peak.cpu_per_derive_us(), round.floor_peak.cpu_per_derive_us()),
            ratio(round.broker_open.cpu_per_derive_us(), round.floor_open.cpu_per_derive_us()),
            p99_from_send(&round.broker_open) / p99_from_send(&round.floor_open),
            if [&round.broker_peak, &round.floor_peak, &round.broker_open, &round.floor_open]
                .into_iter()
                .all(valid_window)
            {
                "every window valid"
            } else {
                "INVALID: a window of this round is"
            }
        );
        rounds.push(round);
    }
    rounds
}

/// The ratios over the rounds (only those whose four windows were valid,
/// with `only_valid`): CPU per derive at peak and in the open loop, the
/// p99 from send time (the median round's), and each side's context
/// switches per derive.
fn floor_summary(rounds: &[FloorRound], only_valid: bool) -> Option<serde_json::Value> {
    let chosen: Vec<&FloorRound> = rounds
        .iter()
        .filter(|r| {
            !only_valid
                || [&r.broker_peak, &r.floor_peak, &r.broker_open, &r.floor_open]
                    .into_iter()
                    .all(valid_window)
        })
        .collect();
    if chosen.is_empty() {
        return None;
    }
    // (CPU us, context switches, allocations) per derive; allocations
    // only when every window counted them.
    let per = |f: &dyn Fn(&FloorRound) -> &Window| -> Option<(f64, f64, Option<f64>)> {
        let (mut ok, mut cpu, mut sw, mut al) = (0.0, 0.0, 0.0, Some(0.0));
        for r in &chosen {
            let w = f(r);
            ok += w.outcomes.ok as f64;
            cpu += w.cpu?;
            sw += w.switches? as f64;
            al = al.zip(w.allocs).map(|(a, n)| a + n as f64);
        }
        let ok = ok.max(1.0);
        Some((cpu * 1e6 / ok, sw / ok, al.map(|a| a / ok)))
    };
    let (bp, fp) = (per(&|r| &r.broker_peak)?, per(&|r| &r.floor_peak)?);
    let (bo, fo) = (per(&|r| &r.broker_open)?, per(&|r| &r.floor_open)?);
    let mut p99: Vec<f64> = chosen
        .iter()
        .map(|r| p99_from_send(&r.broker_open) / p99_from_send(&r.floor_open))
        .collect();
    p99.sort_by(|a, b| a.total_cmp(b));
    Some(serde_json::json!({
        "rounds": chosen.len(),
        "broker_cpu_us_peak": bp.0, "floor_cpu_us_peak": fp.0, "ratio_peak": bp.0 / fp.0,
        "broker_cpu_us_open": bo.0, "floor_cpu_us_open": fo.0, "ratio_open": bo.0 / fo.0,
        "broker_switches_peak": bp.1, "floor_switches_peak": fp.1,
        "broker_switches_open": bo.1, "floor_switches_open": fo.1,
        "broker_allocs_peak": bp.2, "floor_allocs_peak": fp.2,
        "broker_allocs_open": bo.2, "floor_allocs_open": fo.2,
        "p99_ratio_median": p99[p99.len() / 2],
    }))
}

fn main() {
    let args = Args::parse();
    let peak_duration = args.peak_duration.unwrap_or(args.duration);
    if !(0.5..=600.0).contains(&args.duration) || !(0.5..=600.0).contains(&peak_duration) {
        eprintln!("--duration and --peak-duration must be between 0.5 and 600 seconds");
        std::process::exit(2);
    }
    let hz = clock_ticks();
    let body = serde_json::json!({
        "subject_token": args.subject_token, "step": args.step,
        "tool": args.tool, "resource": args.resource,
    })
    .to_string();
    let load = Arc::new(Load {
        htu: format!("{}/v1/derive", args.issuer.trim_end_matches('/')),
        key: Es256Key::generate().unwrap().0,
        body,
        nonces: args.socket.iter().map(|_| Mutex::new(None)).collect(),
        floor_nonce: Mutex::new(None),
        provider: args
            .compare_url
            .as_deref()
            .map(|u| Provider::new(u, &args.compare_client_id, &args.compare_client_secret)),
        args,
    });
    // Nonces first, where required: one request per socket, whose refusal
    // (`use_dpop_nonce`) carries that replica's nonce.
    for i in 0..load.args.socket.len() {
        let mut c = Conn::open(&load, i);
        if c.call(&load.request(unix_now() as i64, i)).is_ok() {
            load.take_nonce(i, c.nonce.take());
        }
    }
    // RSS is the first broker's (replicas are alike).
    let pid = load.args.pid.first().copied();
    if !load.args.label.is_empty() {
        println!("==== {}", load.args.label);
    }

    let (sign0, verify0) = crypto_floor_us(10_000);
    println!(
        "crypto floor (before): sign {sign0:.1} us + verify {verify0:.1} us = {:.1} us",
        sign0 + verify0
    );
    println!("{}", machine::wakeup_line());

    // Warm-up: the subject token gets cached, connections and allocators warm.
    let warm = closed_loop(&load, 4, 1.0, hz);
    check(&warm, "warm-up");
    println!("warm-up: {:.0} derives/s", warm.rate());

    // Peak: closed loop; raise concurrency while throughput grows > 5 %.
    let (best_c, peak) = match load.args.concurrency {
        Some(c) => {
            let w = closed_loop(&load, c, peak_duration, hz);
            check(&w, "peak");
            (c, w)
        }
        None => {
            let mut best: Option<(usize, Window)> = None;
            let mut c = 1;
            while c <= 64 {
                let w = closed_loop(&load, c, (load.args.duration / 2.0).max(1.0), hz);
                check(&w, "peak search");
                println!(
                    "  closed loop, {c:>2} connections: {:.0} derives/s ({})",
                    w.rate(),
                    validity(w.others)
                );
                let better = best
                    .as_ref()
                    .is_none_or(|(_, b)| w.rate() > b.rate() * 1.05);
                if !better {
                    break;
                }
                best = Some((c, w));
                c *= 2;
            }
            let (c, _) = best.unwrap();
            // The figure is a full-length window at the best concurrency.
            let w = closed_loop(&load, c, peak_duration, hz);
            check(&w, "peak");
            (c, w)
        }
    };
    // Memory right after the longest, fastest window.
    let rss_peak = pid.and_then(rss_kib);
    let peak_rate = peak.rate();
    println!(
        "peak: {peak_rate:.0} derives/s (closed loop, {best_c} connections, {:.1} s; other processes used {} of a core: {})",
        peak.elapsed,
        share(peak.others),
        validity(peak.others)
    );
    if let Some((now, hwm)) = rss_peak {
        println!(
            "broker RSS after the peak window: {:.1} MiB (VmRSS), {:.1} MiB (VmHWM)",
            now as f64 / 1024.0,
            hwm as f64 / 1024.0
        );
    }
    if load.args.peak_only {
        println!(
            "peak window: {} derives, {} refused{}",
            peak.outcomes.ok,
            peak.outcomes.refused,
            peak.outcomes
                .first_refusal
                .as_deref()
                .map_or(String::new(), |r| format!(" (first: {r})"))
        );
        println!("run: {}", validity(peak.others));
        if load.args.json {
            let j = serde_json::json!({
                "label": load.args.label,
                "valid": peak.others.is_some_and(|x| x < VALID_OTHERS),
                "peak_per_s": peak_rate,
                "peak_connections": best_c,
                "peak_seconds": peak.elapsed,
                "refused": peak.outcomes.refused,
                "others_busy_peak": peak.others,
                "rss_kib_after_peak": rss_peak.map(|r| r.0),
                "hwm_kib_after_peak": rss_peak.map(|r| r.1),
            });
            println!("{j}");
        }
        return;
    }

    let rate = load.args.rate.unwrap_or(peak_rate / 2.0);
    let open = open_loop(
        &load,
        rate,
        load.args.duration,
        load.args.open_connections,
        hz,
    );
    check(&open, "open loop");
    let sorted = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        v
    };
    let (lat, sent, lag) = (
        sorted(&open.latencies_us),
        sorted(&open.sent_us),
        sorted(&open.lag_us),
    );
    println!(
        "open loop at {rate:.0}/s for {:.1} s: {} derives ({:.0}/s achieved; other processes used {} of a core: {})",
        open.elapsed,
        open.outcomes.ok,
        open.rate(),
        share(open.others),
        validity(open.others)
    );
    let line = |what: &str, v: &[f64]| {
        println!(
            "  {what}: p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us, max {:.0} us",
            pct(v, 0.50),
            pct(v, 0.99),
            pct(v, 0.999),
            v.last().copied().unwrap_or(f64::NAN)
        );
    };
    line("latency from send time", &sent);
    line("latency from due time ", &lat);
    line("generator's send lag  ", &lag);

    // Syscalls per derive: one more open-loop window at the same rate with
    // a counter attached. Only its counts are reported.
    let mut syscalls: Option<Syscalls> = None;
    if let (Some(p), true) = (pid, load.args.syscalls != "off") {
        if load.args.pid.len() > 1 {
            eprintln!("syscalls: counted for the first broker only");
        }
        match Tracer::attach(&load.args.syscalls, p) {
            Some(t) => {
                let tool = t.tool;
                let w = open_loop(
                    &load,
                    rate,
                    load.args.syscall_duration,
                    load.args.open_connections,
                    hz,
                );
                check(&w, "syscall window");
                match t.finish() {
                    Some(counts) if !counts.is_empty() => {
                        let n = w.outcomes.ok;
                        let total: u64 = counts.iter().map(|c| c.1).sum();
                        let top: Vec<String> = counts
                            .iter()
                            .take(6)
                            .map(|(name, c)| format!("{name} {:.2}", *c as f64 / n as f64))
                            .collect();
                        println!(
                            "broker syscalls per derive at {rate:.0}/s ({tool}, {n} derives in {:.1} s; counts only): {:.2}: {}",
                            w.elapsed,
                            total as f64 / n as f64,
                            top.join(", ")
                        );
                        syscalls = Some((tool, n, counts));
                    }
                    _ => {
                        eprintln!("syscalls: {tool} gave no counts (root, or ptrace/perf allowed?)")
                    }
                }
            }
            None => eprintln!("syscalls: no counter (--syscalls {})", load.args.syscalls),
        }
    }

    // Side by side with oidc-provider's DPoP token endpoint: windows
    // alternate A/B/A/B, the same length and concurrency.
    let mut rounds: Vec<(Window, Window)> = Vec::new();
    if load.provider.is_some() {
        check_provider(&load);
        let d = load.args.compare_duration.unwrap_or(load.args.duration);
        let c = load.args.compare_concurrency;
        let per_cpu = |ok: usize, cpu: Option<f64>| cpu.map(|c| ok as f64 / c.max(1e-9));
        // Node compiles hot code as it runs: its first window cost 38 %
        // more CPU per request than its second in a trial run (967 against
        // 1 335 requests per CPU second). The broker had its warm-up; this
        // is the provider's, not counted.
        let warm = closed_loop_to(&load, Target::Provider, c, d.max(2.0), hz);
        check(&warm, "oidc-provider warm-up");
        println!(
            "oidc-provider warm-up: {:.0} requests/s, {} per server CPU second (not counted)",
            warm.rate(),
            per_cpu(warm.outcomes.ok, warm.peer_cpu).map_or("?".into(), |x| format!("{x:.0}"))
        );
        for r in 1..=load.args.compare_rounds {
            let a = closed_loop_to(&load, Target::Broker, c, d, hz);
            check(&a, "side by side, credbroker");
            let b = closed_loop_to(&load, Target::Provider, c, d, hz);
            check(&b, "side by side, oidc-provider");
            for (name, w, cpu) in [
                ("credbroker   ", &a, a.cpu),
                ("oidc-provider", &b, b.peer_cpu),
            ] {
                println!(
                    "  side by side round {r}, {name}: {:.0} requests/s, {} per server CPU second, {} refused ({c} connections, {:.1} s; {})",
                    w.rate(),
                    per_cpu(w.outcomes.ok, cpu).map_or("?".into(), |x| format!("{x:.0}")),
                    w.outcomes.refused,
                    w.elapsed,
                    validity(w.others)
                );
            }
            rounds.push((a, b));
        }
    }

    // Against the derive floor: windows alternating with it.
    let mut floor_all = None;
    let mut floor_valid = None;
    if load.args.floor_socket.is_some() {
        let rounds = against_the_floor(&load, best_c, rate, hz);
        floor_all = floor_summary(&rounds, false);
        floor_valid = floor_summary(&rounds, true);
        for (what, s) in [
            ("every round", &floor_all),
            ("the valid rounds only", &floor_valid),
        ] {
            match s {
                Some(s) => println!(
                    "against the {}, {what} ({}): CPU a derive {:.1} us = {:.2} x the floor's {:.1} us at peak, {:.1} us = {:.2} x the floor's {:.1} us at {rate:.0}/s; context switches a derive {:.2} (floor {:.2}) at peak, {:.2} (floor {:.2}) at {rate:.0}/s; p99 from send {:.2} x the floor's (median round)",
                    load.args.floor_name, s["rounds"], s["broker_cpu_us_peak"].as_f64().unwrap_or(f64::NAN), s["ratio_peak"].as_f64().unwrap_or(f64::NAN),
                    s["floor_cpu_us_peak"].as_f64().unwrap_or(f64::NAN), s["broker_cpu_us_open"].as_f64().unwrap_or(f64::NAN),
                    s["ratio_open"].as_f64().unwrap_or(f64::NAN), s["floor_cpu_us_open"].as_f64().unwrap_or(f64::NAN),
                    s["broker_switches_peak"].as_f64().unwrap_or(f64::NAN), s["floor_switches_peak"].as_f64().unwrap_or(f64::NAN),
                    s["broker_switches_open"].as_f64().unwrap_or(f64::NAN), s["floor_switches_open"].as_f64().unwrap_or(f64::NAN),
                    s["p99_ratio_median"].as_f64().unwrap_or(f64::NAN),
                ),
                None => println!("against the {}, {what}: none", load.args.floor_name),
            }
            if let Some(s) = s.as_ref().filter(|s| s["broker_allocs_peak"].is_number()) {
                println!(
                    "  allocations a derive, {what}: {:.1} (floor {:.1}) at peak, {:.1} (floor {:.1}) at {rate:.0}/s",
                    s["broker_allocs_peak"].as_f64().unwrap_or(f64::NAN), s["floor_allocs_peak"].as_f64().unwrap_or(f64::NAN),
                    s["broker_allocs_open"].as_f64().unwrap_or(f64::NAN), s["floor_allocs_open"].as_f64().unwrap_or(f64::NAN),
                );
            }
        }
    }

    let (sign1, verify1) = crypto_floor_us(10_000);
    println!(
        "crypto floor (after): sign {sign1:.1} us + verify {verify1:.1} us = {:.1} us",
        sign1 + verify1
    );
    let floor = (sign0 + verify0 + sign1 + verify1) / 2.0;

    let cpu_peak = peak.cpu_per_derive_us();
    let cpu_open = open.cpu_per_derive_us();
    if let (Some(p), Some(o)) = (cpu_peak, cpu_open) {
        println!(
            "broker CPU per derive: {p:.1} us at peak = {:.2} x floor; {o:.1} us at {rate:.0}/s = {:.2} x floor (floor {floor:.1} us)",
            p / floor,
            o / floor
        );
    }
    let (db_peak, db_open) = (peak.db_per_derive_us(), open.db_per_derive_us());
    if let (Some(p), Some(o)) = (db_peak, db_open) {
        println!(
            "PostgreSQL CPU per derive (postmaster and children): {p:.1} us at peak; {o:.1} us at {rate:.0}/s"
        );
    }
    let (sw_peak, sw_open) = (peak.switches_per_derive(), open.switches_per_derive());
    if let (Some(p), Some(o)) = (sw_peak, sw_open) {
        println!("broker context switches per derive: {p:.2} at peak, {o:.2} at {rate:.0}/s");
    }
    let (al_peak, al_open) = (peak.allocs_per_derive(), open.allocs_per_derive());
    if let (Some(p), Some(o)) = (al_peak, al_open) {
        println!("broker allocations per derive: {p:.1} at peak, {o:.1} at {rate:.0}/s (a build with --features alloc-count: take CPU figures from a run without it)");
    }
    // The side-by-side ratio over all rounds, and over the rounds whose
    // two windows were both valid.
    let side = |only_valid: bool| -> Option<(f64, f64, usize)> {
        let ok = |w: &Window| w.others.is_some_and(|x| x < VALID_OTHERS);
        let chosen: Vec<&(Window, Window)> = rounds
            .iter()
            .filter(|(a, b)| !only_valid || (ok(a) && ok(b)))
            .collect();
        if chosen.is_empty() {
            return None;
        }
        let (mut na, mut ca, mut nb, mut cb) = (0.0, 0.0, 0.0, 0.0);
        for (a, b) in &chosen {
            na += a.outcomes.ok as f64;
            ca += a.cpu?;
            nb += b.outcomes.ok as f64;
            cb += b.peer_cpu?;
        }
        Some((na / ca, nb / cb, chosen.len()))
    };
    let (side_all, side_valid) = (side(false), side(true));
    if let Some((a, b, n)) = side_all {
        println!(
            "requests per server CPU second: credbroker {a:.0}, oidc-provider {b:.0}: {:.1} x ({n} rounds)",
            a / b
        );
        match side_valid {
            Some((a, b, n)) => println!("  over the {n} valid rounds only: {:.1} x", a / b),
            None => println!("  no round had both windows valid"),
        }
    }
    let rss_end = pid.and_then(rss_kib);
    if let Some((now, hwm)) = rss_end {
        println!(
            "broker RSS at the end: {:.1} MiB (VmRSS), {:.1} MiB (VmHWM)",
            now as f64 / 1024.0,
            hwm as f64 / 1024.0
        );
    }
    let valid = peak.others.is_some_and(|x| x < VALID_OTHERS)
        && open.others.is_some_and(|x| x < VALID_OTHERS);
    println!(
        "run: {}",
        if valid {
            "valid (other processes used under 10 % of a core in both windows)"
        } else {
            "INVALID: other processes used 10 % or more of a core in a window; do not quote these figures as the broker's"
        }
    );
    if load.args.json {
        let syscalls_per_derive = syscalls
            .as_ref()
            .map(|(_, n, c)| c.iter().map(|(_, k)| *k).sum::<u64>() as f64 / *n as f64);
        let syscalls_top = syscalls.as_ref().map(|(_, n, c)| {
            c.iter()
                .take(8)
                .map(|(name, k)| (name.clone(), serde_json::json!(*k as f64 / *n as f64)))
                .collect::<serde_json::Map<_, _>>()
        });
        let valid_window = |w: &Window| w.others.is_some_and(|x| x < VALID_OTHERS);
        let side_rounds: Vec<serde_json::Value> = rounds
            .iter()
            .map(|(a, b)| {
                let broker = a.cpu.map(|c| a.outcomes.ok as f64 / c);
                let provider = b.peer_cpu.map(|c| b.outcomes.ok as f64 / c);
                let refused = a.outcomes.refused + b.outcomes.refused;
                let valid = valid_window(a) && valid_window(b);
                serde_json::json!({
                    "credbroker_per_cpu_s": broker,
                    "oidc_provider_per_cpu_s": provider,
                    "refused": refused,
                    "valid": valid,
                })
            })
            .collect();
        let j = serde_json::json!({
            "label": load.args.label,
            "brokers": load.args.pid.len(),
            "valid": valid,
            "db_cpu_per_derive_us_peak": db_peak,
            "db_cpu_per_derive_us_open": db_open,
            "floor_us": floor,
            "floor_sign_us": (sign0 + sign1) / 2.0,
            "floor_verify_us": (verify0 + verify1) / 2.0,
            "peak_per_s": peak_rate,
            "peak_connections": best_c,
            "peak_seconds": peak.elapsed,
            "cpu_per_derive_us_peak": cpu_peak,
            "ratio_peak": cpu_peak.map(|c| c / floor),
            "switches_per_derive_peak": sw_peak,
            "open_rate": rate,
            "cpu_per_derive_us_open": cpu_open,
            "ratio_open": cpu_open.map(|c| c / floor),
            "switches_per_derive_open": sw_open,
            "p50_us_from_send": pct(&sent, 0.50),
            "p99_us_from_send": pct(&sent, 0.99),
            "p999_us_from_send": pct(&sent, 0.999),
            "p50_us": pct(&lat, 0.50),
            "p99_us": pct(&lat, 0.99),
            "p999_us": pct(&lat, 0.999),
            "lag_p50_us": pct(&lag, 0.50),
            "lag_p99_us": pct(&lag, 0.99),
            "lag_p999_us": pct(&lag, 0.999),
            "refused": peak.outcomes.refused + open.outcomes.refused,
            "others_busy_peak": peak.others,
            "others_busy_open": open.others,
            "rss_kib_after_peak": rss_peak.map(|r| r.0),
            "hwm_kib_after_peak": rss_peak.map(|r| r.1),
            "rss_kib": rss_end.map(|r| r.0),
            "hwm_kib": rss_end.map(|r| r.1),
            "syscalls_tool": syscalls.as_ref().map(|s| s.0),
            "syscalls_per_derive": syscalls_per_derive,
            "syscalls_top": syscalls_top,
            "side_by_side_rounds": side_rounds,
            "side_by_side_ratio": side_all.map(|(a, b, _)| a / b),
            "side_by_side_ratio_valid": side_valid.map(|(a, b, _)| a / b),
        });
        let mut j = j;
        // Apart: one more key in the macro above passes its recursion limit.
        j["allocs_per_derive_peak"] = al_peak.into();
        j["allocs_per_derive_open"] = al_open.into();
        j["floor_name"] = load.args.floor_name.clone().into();
        j["derive_floor"] = floor_all.unwrap_or_default();
        j["derive_floor_valid"] = floor_valid.unwrap_or_default();
        println!("{j}");
    }
}
