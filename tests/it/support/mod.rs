//! Shared helpers for the integration tests, one file per role:
//!
//! - `broker`: the real `credbroker` binary in a temp directory, its
//!   sockets, raw HTTP, subject tokens from its dev issuer, another user;
//! - `jose`: hand-made keys, JWS and DPoP proofs for forged tokens;
//! - `peers`: the Node.js peers (oidc-provider, npm `jose`);
//! - `oidc`: an OAuth provider (oidc-provider) for the provider client;
//! - `services`: a broker with a connected service and its provider;
//! - `pages`: the pages in-process, with a fake connected-services side;
//! - `browser`: Chromium (playwright-core), one profile per person;
//! - `mcp`: the example MCP server, the Python `mcp` client and fakes;
//! - `postgres`: one PostgreSQL cluster per run, a database per test;
//! - `replicas`: replicas on one database behind a forwarding proxy;
//! - `quickstart`: the real `credbroker quickstart`, as a newcomer runs it;
//! - `contract`: every refusal a test reads, held to proto/refusal.schema.json;
//! - `prereq`: what the tests need beyond Rust (node peers, chromium, .venv),
//!   each checked in one place, failing with one line naming the installer.
//!
//! This file keeps the few helpers every role uses.
// clippy's allow-unwrap-in-tests covers only #[test] functions, not the
// helpers they call; here too a failure should panic loudly.
#![allow(dead_code, missing_docs, clippy::unwrap_used, clippy::expect_used)]

pub(crate) mod api_standin;
pub(crate) mod broker;
pub(crate) mod browser;
pub(crate) mod contract;
pub(crate) mod jose;
pub(crate) mod layout;
pub(crate) mod mcp;
pub(crate) mod oidc;
pub(crate) mod pages;
pub(crate) mod peers;
pub(crate) mod postgres;
pub(crate) mod prereq;
pub(crate) mod quickstart;
pub(crate) mod replicas;
pub(crate) mod resource;
pub(crate) mod services;

// The common helpers are reached as `support::X` (and glob-imported) by most
// tests, whichever file they live in.
pub(crate) use broker::*;
pub(crate) use jose::*;
pub(crate) use peers::*;

use std::time::{Duration, Instant};

/// Polls `f` every 20 ms until it is true; panics naming `what` after `timeout`.
pub(crate) fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The slack a time bound gets on this machine: four times a baseline
/// measured in the same test (the same work without the wait the bound is
/// about, on the same broker), and at least 1 s. A loaded machine that
/// makes the baseline slow widens the bound with it; a regression that
/// waits for a timeout or never finishes still lands past it.
pub(crate) fn slack(baseline: Duration) -> Duration {
    std::cmp::max(Duration::from_secs(1), 4 * baseline)
}

/// Polls `check` (every 20 ms) until it holds, and fails only when a check
/// *begun* `bound` or more after `since` still does not hold: a bound on
/// when a change made elsewhere (another replica, a background task) takes
/// effect, not on how long a loaded machine takes to answer the check
/// itself. Returns how long after `since` the check that held began.
pub(crate) async fn holds_by<F, Fut>(
    since: Instant,
    bound: Duration,
    what: &str,
    mut check: F,
) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        let begun = since.elapsed();
        if check().await {
            return begun;
        }
        assert!(
            begun < bound,
            "{what}: a check begun {begun:?} after the change still failed (bound {bound:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether this run is CI's (`CI=true`), where nothing may be skipped.
pub(crate) fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A part of a test that cannot run on this machine (`why`): under `CI=true`
/// it fails the test, since a skip there would pass unseen; elsewhere it
/// prints what was not shown, so a local run says what it did not check.
#[track_caller]
pub(crate) fn not_shown(what: &str, why: &str) {
    assert!(
        !under_ci(),
        "CI=true and this cannot be shown here ({why}): {what}"
    );
    eprintln!("NOT SHOWN ({why}): {what}");
}

/// A size-limited tmpfs mounted at a directory (created), unmounted on
/// drop: a disk that fills up, or a file system that turns read-only.
pub(crate) struct Tmpfs(pub(crate) std::path::PathBuf);

impl Tmpfs {
    /// Mounts one of `size` (mode 0700) at `dir`, or `None` where mounting
    /// is not allowed (not root, or no mount namespace for it).
    pub(crate) fn mount(dir: &std::path::Path, size: &str) -> Option<Tmpfs> {
        Tmpfs::mount_with(dir, &format!("size={size},mode=0700"))
    }

    /// Mounts one with the `mount -o` options `opts`.
    pub(crate) fn mount_with(dir: &std::path::Path, opts: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_path_buf()))
    }

    /// Remounts it read-only, or writable again; panics if that fails.
    pub(crate) fn set_read_only(&self, read_only: bool) {
        let opts = if read_only {
            "remount,ro"
        } else {
            "remount,rw"
        };
        let status = std::process::Command::new("mount")
            .args(["-o", opts])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(status.success(), "mount -o {opts} {}", self.0.display());
    }
}

impl Tmpfs {
    /// Fills this file system so that not one more line fits after `log`,
    /// a file on it that a broker appends to: the log's last page is
    /// padded with a `test.padding` line first (tmpfs hands out whole
    /// pages, so a short line would still fit there), then a `filler` file
    /// takes the rest. [`Tmpfs::unfill`] makes room again.
    pub(crate) fn fill_after(&self, log: &std::path::Path) {
        use std::io::Write;
        let len = std::fs::metadata(log).unwrap().len() as usize;
        let mut pad = (len / 4096 + 1) * 4096 - len;
        if pad < 64 {
            pad += 4096;
        }
        let head = "{\"event\":\"test.padding\",\"pad\":\"";
        let line = format!("{head}{}\"}}\n", "p".repeat(pad - head.len() - 3));
        std::fs::OpenOptions::new()
            .append(true)
            .open(log)
            .unwrap()
            .write_all(line.as_bytes())
            .unwrap();
        let mut f = std::fs::File::create(self.0.join("filler")).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
        while f.write_all(&[0]).is_ok() {}
    }

    /// Removes what [`Tmpfs::fill_after`] wrote besides the log.
    pub(crate) fn unfill(&self) {
        std::fs::remove_file(self.0.join("filler")).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Runs the timing-sensitive tests one at a time within this binary:
/// tests that measure how long the broker takes, or hold hundreds of
/// connections, would otherwise measure each other on a 2-core machine.
/// Hold the guard for the whole test (`let _serial = serial().await;`); a
/// panicking test releases it (tokio's mutex does not poison).
pub(crate) async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// [`serial`] for a test that is not async.
pub(crate) fn serial_blocking() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.blocking_lock()
}

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub(crate) fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A loopback address with a port that was free a moment ago, for a server
/// the test starts a little later (a broker whose issuer URL must be in its
/// config before it runs). The check listener is closed before returning,
/// so the port is only reserved by being out of the way: it is taken below
/// the kernel's ephemeral range (`ip_local_port_range`), where no peer
/// started in between (an IdP or a service listening on port 0, or any
/// outgoing connection) can be handed it; a port taken from port 0 could
/// be given straight back to such a peer's own `listen(0)`, and the broker
/// would then fail with "address in use". No port is given twice in this
/// binary (another test may hold it soon); only another process's pick
/// can still collide. Falls back to port 0 when the
/// ephemeral range leaves no room below it.
pub(crate) fn free_loopback_addr() -> String {
    format!("127.0.0.1:{}", free_loopback_port())
}

/// The lowest port [`free_loopback_port`] takes.
const LOWEST_RESERVED: u16 = 10_000;

/// The kernel's range of ports for `bind(0)` and outgoing connections
/// (`ip_local_port_range`), or Linux's default when it cannot be read.
fn ephemeral_ports() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| {
            let mut it = t.split_whitespace().map(|p| p.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32_768, 60_999))
}

/// Whether the ephemeral range leaves room below it for reserved ports.
fn room_below(low: u16) -> bool {
    low > LOWEST_RESERVED + 1_000
}

/// The port of [`free_loopback_addr`].
pub(crate) fn free_loopback_port() -> u16 {
    // The check listener is dropped here, closing the port for the caller.
    reserve_loopback_port()
        .local_addr()
        .expect("local addr")
        .port()
}

/// A loopback port that was free a moment ago, as [`free_loopback_port`]
/// gives, whose next port was free too (and is handed to nobody else):
/// for a server that takes the port after the one it is given.
pub(crate) fn free_loopback_port_pair() -> u16 {
    loop {
        let held = reserve_loopback_port();
        let port = held.local_addr().expect("local addr").port();
        let Some(next) = port.checked_add(1) else {
            continue;
        };
        if HANDED_OUT.lock().unwrap().insert(next)
            && std::net::TcpListener::bind(("127.0.0.1", next)).is_ok()
        {
            return port;
        }
    }
}

/// The ports [`reserve_loopback_port`] has tried in this test binary.
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A listener holding the port [`free_loopback_port`] gives, for as long
/// as it is kept: below the ephemeral range when there is room, else from
/// port 0.
fn reserve_loopback_port() -> std::net::TcpListener {
    let (low, _) = ephemeral_ports();
    if room_below(low) {
        let span = low - LOWEST_RESERVED;
        for _ in 0..200 {
            let r = random_bytes(2);
            let port = LOWEST_RESERVED + u16::from_be_bytes([r[0], r[1]]) % span;
            // Never the same port twice in this binary: another test may
            // have been given it and not bound it yet.
            if !HANDED_OUT.lock().unwrap().insert(port) {
                continue;
            }
            if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                return l;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")
}

/// The harness's own promise, since every test with a real issuer URL
/// leans on it: a port [`free_loopback_port`] gives was free (its listener
/// bound it) and is below the kernel's ephemeral range, and a listener on
/// port 0 (what the IdP and service peers do) is given one inside that
/// range, so never the same. The listeners are held while checked: binding
/// a port again after letting it go would race other tests' picks, which
/// run in parallel in this binary.
#[test]
fn free_loopback_ports_are_free_and_out_of_the_ephemeral_range() {
    let (low, high) = ephemeral_ports();
    if !room_below(low) {
        // No room below the range: the helper falls back to port 0.
        eprintln!("the ephemeral range starts at {low}: ports come from port 0 here");
        let l = reserve_loopback_port();
        assert_ne!(l.local_addr().unwrap().port(), 0);
        return;
    }
    let held: Vec<_> = (0..50).map(|_| reserve_loopback_port()).collect();
    for l in &held {
        let port = l.local_addr().unwrap().port();
        assert!(
            (LOWEST_RESERVED..low).contains(&port),
            "{port} in {low}..={high}"
        );
    }
    // The control: what the peers (and this helper, before) get from port 0.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    assert!((low..=high).contains(&port), "{port} in {low}..={high}");
}

/// `application/x-www-form-urlencoded` from pairs.
pub(crate) fn form(pairs: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

/// [`read_audit`] again until `done` holds of the events, for at most ten
/// seconds; the events last read either way (the caller's assertion says
/// what was missing). For events written after an answer went out, such as
/// `proxy.completed`, which follows the last byte of a streamed body.
pub(crate) async fn read_audit_until(
    path: &std::path::Path,
    done: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let events = read_audit(path);
        if done(&events) || std::time::Instant::now() > deadline {
            return events;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A master key sealer for tests that open a vault directly (without a
/// broker's config): fixed, so a reopened vault finds its key record.
pub(crate) fn test_master() -> std::sync::Arc<credbroker::internals::seal::Sealer> {
    std::sync::Arc::new(
        credbroker::internals::seal::Sealer::new(
            &credbroker::internals::secret::SecretBytes::new(vec![0x4d; 32]),
            &[],
        )
        .unwrap(),
    )
}

/// The master key sealer of a broker's config (`keys.master_key_file`).
pub(crate) fn config_master(
    cfg: &credbroker::internals::config::Config,
) -> std::sync::Arc<credbroker::internals::seal::Sealer> {
    let key = credbroker::internals::config::read_secret_file(&cfg.master_key_file).unwrap();
    std::sync::Arc::new(credbroker::internals::seal::Sealer::new(&key, &[]).unwrap())
}

pub(crate) fn random_bytes(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    aws_lc_rs::rand::fill(&mut b).unwrap();
    b
}

/// The events of an audit log being written: every complete line must be
/// JSON (a torn line in the middle is a defect, and fails the test), while a
/// last line without its newline is still being written and is left out.
pub(crate) fn read_audit(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line is not JSON ({e}): {l}"))
        })
        .collect()
}
