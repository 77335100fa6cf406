//! Event delivery (docs/OPERATIONS.md, "Webhooks" and "The live event
//! stream"): deliveries verified by the Standard Webhooks reference library
//! (Python `standardwebhooks`, in tests/peers/webhook_receiver.py), retries,
//! `Retry-After`, the backlog cap, dead letters and their redelivery,
//! `kill -9` with events undelivered, and the admin socket's event stream
//! under its own cap.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// The Python receiver.
pub(crate) struct Receiver {
    child: Child,
    pub(crate) port: u16,
    log: PathBuf,
}

impl Receiver {
    /// Starts on `port` (0: any) with the receiver's flags.
    pub(crate) fn start(dir: &Path, port: u16, flags: &[String]) -> Receiver {
        let py = prereq::venv_python(&["standardwebhooks", "cryptography"], "");
        let n = random_bytes(4);
        let port_file = dir.join(format!("port-{}", hex(&n)));
        let log = dir.join(format!("received-{}.jsonl", hex(&n)));
        let child = Command::new(py)
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/peers/webhook_receiver.py"
            ))
            .args(["--port", &port.to_string(), "--port-file"])
            .arg(&port_file)
            .arg("--log")
            .arg(&log)
            .args(flags)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                break p.trim().parse().unwrap();
            }
            assert!(Instant::now() < deadline, "the receiver did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        Receiver { child, port, log }
    }

    pub(crate) fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The requests once `done` holds (panics after `secs`).
    pub(crate) async fn until(
        &self,
        secs: u64,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let r = self.requests();
            if done(&r) {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver did not get what was expected; it got {} requests: {:?}",
                r.len(),
                r.iter()
                    .map(|x| (&x["id"], &x["status"]))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A `whsec_` secret in a 0600 file; returns the file and the secret.
pub(crate) fn secret_file(dir: &Path, name: &str) -> (PathBuf, String) {
    use base64::Engine;
    let s = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(random_bytes(32))
    );
    let p = dir.join(name);
    std::fs::write(&p, &s).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    (p, s)
}

/// A port nothing listens on now, where the receiver is started later:
/// below the ephemeral range (support::free_loopback_port), so no
/// `listen(0)` of another test and no outgoing connection (the broker's
/// own included) can be handed it meanwhile, as one bound on port 0 and
/// let go could be; the receiver would then fail to start on it.
fn closed_port() -> u16 {
    free_loopback_port()
}

/// `[webhooks.siem]` for `port`, with `secrets` and extra lines.
pub(crate) fn subscription(port: u16, events: &str, secrets: &[&Path], extra: &str) -> String {
    let files: Vec<String> = secrets
        .iter()
        .map(|p| format!("\"{}\"", p.display()))
        .collect();
    format!(
        "\n[webhooks.siem]\nurl = \"http://127.0.0.1:{port}/hook\"\nevents = {events}\nsecret_files = [{}]\n{extra}\n",
        files.join(", ")
    )
}

fn start(extra: String) -> TestBroker {
    TestBroker::start_with(Opts {
        extra_config: extra,
        ..Opts::default()
    })
}

/// The ids the audit log gives `kinds` (`msg_<boot_id>_<seq>`).
/// The seconds between the first two attempts the receiver recorded.
fn retry_gap(got: &[serde_json::Value]) -> f64 {
    got[1]["arrival"].as_f64().unwrap() - got[0]["arrival"].as_f64().unwrap()
}

/// `credbroker_webhook_deliveries_total` for subscription `siem` and `outcome`.
fn deliveries(b: &TestBroker, outcome: &str) -> Option<f64> {
    b.metric(&format!(
        "credbroker_webhook_deliveries_total{{outcome=\"{outcome}\",subscription=\"siem\"}}"
    ))
}

/// Waits (at most 10 s) until [`deliveries`] of `outcome` is `want`. The
/// receiver logs a request before it answers, and the broker counts a
/// delivery once it has read the answer: read as soon as the receiver has
/// the last event, the counter may not have moved yet. A count past
/// `want` never matches, and fails here with what it was.
pub(crate) async fn deliveries_reach(b: &TestBroker, outcome: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = deliveries(b, outcome);
        if got == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{outcome} deliveries: {got:?}, not {want} within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn audit_ids(b: &TestBroker, kinds: &[&str]) -> BTreeSet<String> {
    b.audit_lines()
        .iter()
        .filter(|e| kinds.contains(&e["event"].as_str().unwrap_or("")))
        .map(|e| format!("msg_{}_{}", e["boot_id"].as_str().unwrap(), e["seq"]))
        .collect()
}

#[tokio::test]
async fn deliveries_verify_with_the_reference_library_under_both_secrets_of_a_rotation() {
    let keys = tempfile::tempdir().unwrap();
    let (f1, s1) = secret_file(keys.path(), "old.whsec");
    let (f2, s2) = secret_file(keys.path(), "new.whsec");
    let r = Receiver::start(
        keys.path(),
        0,
        &["--secret".into(), s1, "--secret".into(), s2],
    );
    let b = start(subscription(
        r.port,
        r#"["derive.issued", "derive.denied"]"#,
        &[&f1, &f2],
        "",
    ));
    let k = key();
    let subject = b.subject_token("alice");
    let token = b.derive_ok(&k).await;
    let denied = b
        .derive(&k, &subject, "summarize", "notes.delete", RESOURCE, None)
        .await;
    assert!(matches!(denied, credbroker::client::Answer::Refused(_)));
    let want = audit_ids(&b, &["derive.issued", "derive.denied"]);
    assert_eq!(want.len(), 2);
    let got = r
        .until(20, |r| {
            r.iter()
                .map(|x| x["id"].as_str().unwrap().to_string())
                .collect::<BTreeSet<_>>()
                == want
        })
        .await;
    for req in &got {
        // Both signatures of the rotation verify with the reference
        // library; a body changed by one byte verifies under neither.
        assert_eq!(req["verified"], serde_json::json!([true, true]), "{req}");
        assert_eq!(req["tamper_rejected"], true, "{req}");
        let body: serde_json::Value = serde_json::from_str(req["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["version"], 1);
        assert_eq!(body["type"], body["data"]["event"]);
        // The canary: neither the token nor the subject token is in a body.
        let text = req["body"].as_str().unwrap();
        assert!(
            !text.contains(token.access_token.expose().as_str()),
            "a token in a webhook body"
        );
        assert!(
            !text.contains(&subject),
            "a subject token in a webhook body"
        );
    }
    // The event types not subscribed to are not sent.
    assert!(got.iter().all(|x| {
        let t = serde_json::from_str::<serde_json::Value>(x["body"].as_str().unwrap()).unwrap();
        t["type"] == "derive.issued" || t["type"] == "derive.denied"
    }));
    deliveries_reach(&b, "delivered", 2.0).await;
}

#[tokio::test]
async fn v1a_deliveries_verify_with_the_public_key_status_shows() {
    use base64::Engine;
    let keys = tempfile::tempdir().unwrap();
    let seed = random_bytes(32);
    let kf = keys.path().join("ed.whsk");
    std::fs::write(
        &kf,
        format!(
            "whsk_{}",
            base64::engine::general_purpose::STANDARD.encode(&seed)
        ),
    )
    .unwrap();
    std::fs::set_permissions(&kf, std::fs::Permissions::from_mode(0o600)).unwrap();
    let port = closed_port();
    let b = start(format!(
        "\n[webhooks.siem]\nurl = \"http://127.0.0.1:{port}/hook\"\nevents = [\"admin.frozen\"]\nsigning = \"v1a\"\ned25519_key_file = \"{}\"\n",
        kf.display()
    ));
    assert_eq!(b.admin_post("/freeze", "on").unwrap().0, 200);
    // The public key appears in /status once the loop has read the key.
    let deadline = Instant::now() + Duration::from_secs(20);
    let public = loop {
        let (_, s) = b.admin_get("/status").unwrap();
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        if let Some(k) = v["webhooks"][0]["public_key"].as_str() {
            break k.to_string();
        }
        assert!(Instant::now() < deadline, "no public key in /status: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!b
        .metrics()
        .contains(&base64::engine::general_purpose::STANDARD.encode(&seed)));
    let r = Receiver::start(keys.path(), port, &["--public-key".into(), public]);
    let got = r.until(30, |r| !r.is_empty()).await;
    assert_eq!(got[0]["verified"], serde_json::json!([true]), "{}", got[0]);
    assert_eq!(got[0]["tamper_rejected"], true);
    assert_eq!(b.admin_post("/freeze", "off").unwrap().0, 200);
}

#[tokio::test]
async fn a_receiver_answering_500_then_200_gets_the_event_after_backoff() {
    let keys = tempfile::tempdir().unwrap();
    let (f, s) = secret_file(keys.path(), "s.whsec");
    let r = Receiver::start(
        keys.path(),
        0,
        &["--secret".into(), s, "--answers".into(), "500,200".into()],
    );
    let b = start(subscription(r.port, r#"["admin.frozen"]"#, &[&f], ""));
    assert_eq!(b.admin_post("/freeze", "on").unwrap().0, 200);
    let got = r.until(20, |r| r.len() >= 2).await;
    assert_eq!(got.len(), 2, "one retry, then delivered: {got:?}");
    assert_eq!(got[0]["id"], got[1]["id"], "a retry keeps its webhook-id");
    assert_eq!(
        (got[0]["status"].as_u64(), got[1]["status"].as_u64()),
        (Some(500), Some(200))
    );
    let gap = retry_gap(&got);
    // The first wait is a random point of [0.5 s, 1 s].
    assert!((0.45..3.0).contains(&gap), "retried after {gap} s");
    assert_eq!(got[1]["verified"], serde_json::json!([true]));
    assert_eq!(deliveries(&b, "failed"), Some(1.0));
    assert_eq!(b.admin_post("/freeze", "off").unwrap().0, 200);
}

/// A slow-drip receiver (a 200 head, then a byte every 0.3 s for 30 s):
/// the total timeout per attempt (1 s here) cuts it, and the event is sent
/// again after backoff, and delivered by the receiver once it answers.
#[tokio::test]
async fn a_slow_drip_receiver_is_cut_by_the_attempts_timeout_then_retried() {
    let keys = tempfile::tempdir().unwrap();
    let (f, s) = secret_file(keys.path(), "s.whsec");
    let r = Receiver::start(
        keys.path(),
        0,
        &["--secret".into(), s, "--drip".into(), "1".into()],
    );
    let b = start(subscription(
        r.port,
        r#"["admin.frozen"]"#,
        &[&f],
        "timeout = \"1s\"",
    ));
    assert_eq!(b.admin_post("/freeze", "on").unwrap().0, 200);
    let got = r.until(20, |r| r.len() >= 2).await;
    assert_eq!(got[0]["status"], "drip");
    assert_eq!(got[1]["status"], 200);
    assert_eq!(got[0]["id"], got[1]["id"], "a retry keeps its webhook-id");
    assert_eq!(got[1]["verified"], serde_json::json!([true]));
    // Cut after its 1 s, then the first backoff (0.5 s to 1 s): well
    // before the 30 s the drip would take.
    let gap = retry_gap(&got);
    assert!((1.3..6.0).contains(&gap), "retried after {gap} s");
    let deadline = Instant::now() + Duration::from_secs(10);
    let metric = |o: &str| deliveries(&b, o);
    while metric("delivered") != Some(1.0) {
        assert!(Instant::now() < deadline, "not counted as delivered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric("failed"),
        Some(1.0),
        "the cut attempt counts as failed"
    );
    assert_eq!(b.admin_post("/freeze", "off").unwrap().0, 200);
}

#[tokio::test]
async fn a_429_with_retry_after_2_is_not_retried_sooner() {
    let keys = tempfile::tempdir().unwrap();
    let (f, s) = secret_file(keys.path(), "s.whsec");
    let r = Receiver::start(
        keys.path(),
        0,
        &[
            "--secret".into(),
            s,
            "--answers".into(),
            "429,200".into(),
            "--retry-after".into(),
            "2".into(),
        ],
    );
    let b = start(subscription(r.port, r#"["admin.frozen"]"#, &[&f], ""));
    assert_eq!(b.admin_post("/freeze", "on").unwrap().0, 200);
    let got = r.until(20, |r| r.len() >= 2).await;
    let gap = retry_gap(&got);
    assert!(gap >= 2.0, "retried {gap} s after a Retry-After of 2 s");
    assert!(gap < 4.0, "waited {gap} s for a Retry-After of 2 s");
    assert_eq!(got[1]["status"], 200);
    assert_eq!(deliveries(&b, "retry_after"), Some(1.0));
    assert_eq!(b.admin_post("/freeze", "off").unwrap().0, 200);
}

#[tokio::test]
async fn a_receiver_down_past_the_backlog_cap_drops_events_with_the_counter_and_event_and_derives_go_on(
) {
    let keys = tempfile::tempdir().unwrap();
    let (f, s) = secret_file(keys.path(), "s.whsec");
    let port = closed_port();
    let b = start(subscription(
        port,
        r#"["derive.issued"]"#,
        &[&f],
        "max_backlog_bytes = 4096",
    ));
    let k = key();
    // Derives are not held up by a receiver that is down.
    for _ in 0..20 {
        let started = Instant::now();
        b.derive_ok(&k).await;
        assert!(started.elapsed() < Duration::from_secs(2));
    }
    let events = b
        .audit_lines_until(|e| e.iter().any(|x| x["event"] == "webhook.events_dropped"))
        .await;
    let dropped = events
        .iter()
        .find(|x| x["event"] == "webhook.events_dropped")
        .unwrap();
    assert_eq!(dropped["subscription"], "siem");
    assert!(dropped["count"].as_u64().unwrap() >= 1, "{dropped}");
    assert!(dropped["oldest_time"].as_i64().is_some());
    let n = b
        .metric("credbroker_webhook_events_dropped_total{subscription=\"siem\"}")
        .unwrap();
    assert!(n >= 1.0);
    // The receiver comes back: what was not dropped, and what comes next,
    // is delivered.
    let r = Receiver::start(keys.path(), port, &["--secret".into(), s]);
    b.derive_ok(&k).await;
    let last = audit_ids(&b, &["derive.issued"])
        .into_iter()
        .max_by_key(|id| id.rsplit('_').next().unwrap().parse::<u64>().unwrap());
    let last = last.unwrap();
    let got = r
        .until(60, |r| r.iter().any(|x| x["id"] == last.as_str()))
        .await;
    assert!(got
        .iter()
        .all(|x| x["verified"] == serde_json::json!([true])));
    // Dropped events were not delivered, and none twice.
    let ids: Vec<&str> = got
        .iter()
        .filter(|x| x["status"] == 200)
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    let unique: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), unique.len());
    assert!(
        unique.len() < 21,
        "{} delivered, none dropped",
        unique.len()
    );
}

#[tokio::test]
async fn dead_letters_show_in_status_and_metrics_and_redeliver_keeps_the_webhook_id() {
    let keys = tempfile::tempdir().unwrap();
    let (f, s) = secret_file(keys.path(), "s.whsec");
    let r = Receiver::start(
        keys.path(),
        0,
        &[
            "--secret".into(),
            s,
            "--answers".into(),
            "400,400,400,200".into(),
        ],
    );
    let b = start(subscription(r.port, r#"["admin.frozen"]"#, &[&f], ""));
    assert_eq!(b.admin_post("/freeze", "on").unwrap().0, 200);
    let events = b
        .audit_lines_until(|e| e.iter().any(|x| x["event"] == "webhook.dead_lettered"))
        .await;
    let dead = events
        .iter()
        .find(|x| x["event"] == "webhook.dead_lettered")
        .unwrap();
    assert_eq!(dead["subscription"], "siem");
    assert_eq!(dead["attempts"], 3);
    let id = dead["webhook_id"].as_str().unwrap().to_string();
    assert_eq!(
        b.metric("credbroker_webhook_dead_letters{subscription=\"siem\"}"),
        Some(1.0)
    );
    let (_, st) = b.admin_get("/status").unwrap();
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st["webhooks"][0]["dead_letters"], 1, "{st}");
    assert_eq!(r.requests().len(), 3);
    // An unknown subscription is refused; the right one is sent again.
    let (code, _) = b
        .admin_post("/events/redeliver", r#"{"subscription":"nope"}"#)
        .unwrap();
    assert_eq!(code, 404);
    let out = Command::new(bin())
        .args(["events", "redeliver", "--subscription", "siem", "--config"])
        .arg(&b.config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = r.until(20, |r| r.len() >= 4).await;
    assert_eq!(got[3]["id"], id.as_str());
    assert_eq!(got[3]["status"], 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.metric("credbroker_webhook_dead_letters{subscription=\"siem\"}") != Some(0.0) {
        assert!(Instant::now() < deadline, "the dead letter stayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(b.admin_post("/freeze", "off").unwrap().0, 200);
}

#[tokio::test]
async fn kill_9_with_1000_events_undelivered_loses_none_after_restart() {
    let keys = tempfile::tempdir().unwrap();
    let (f, s) = secret_file(keys.path(), "s.whsec");
    let port = closed_port();
    let mut b = start(subscription(
        port,
        r#"["admin.frozen", "admin.unfrozen"]"#,
        &[&f],
        "max_concurrency = 32",
    ));
    for _ in 0..500 {
        assert_eq!(b.admin_post("/freeze", "on").unwrap().0, 200);
        assert_eq!(b.admin_post("/freeze", "off").unwrap().0, 200);
    }
    let want = audit_ids(&b, &["admin.frozen", "admin.unfrozen"]);
    assert_eq!(want.len(), 1000);
    b.kill9();
    let r = Receiver::start(keys.path(), port, &["--secret".into(), s]);
    b.restart();
    let got = r
        .until(120, |r| {
            let ids: BTreeSet<&str> = r.iter().map(|x| x["id"].as_str().unwrap()).collect();
            want.iter().all(|w| ids.contains(w.as_str()))
        })
        .await;
    assert!(got
        .iter()
        .all(|x| x["verified"] == serde_json::json!([true])));
    // After the restart nothing was sent twice (the cursor was stored
    // before any of them was sent).
    let ids: Vec<&str> = got.iter().map(|x| x["id"].as_str().unwrap()).collect();
    let unique: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), unique.len());
}

/// An event stream on the admin socket: the head, then what is read.
pub(crate) struct Stream {
    s: BufReader<std::os::unix::net::UnixStream>,
    pub(crate) status: u16,
}

pub(crate) fn open_stream(admin: &Path, last_event_id: Option<&str>) -> Stream {
    let mut s = std::os::unix::net::UnixStream::connect(admin).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let extra = last_event_id
        .map(|i| format!("last-event-id: {i}\r\n"))
        .unwrap_or_default();
    write!(s, "GET /events HTTP/1.1\r\nhost: x\r\n{extra}\r\n").unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line.split(' ').nth(1).unwrap().parse().unwrap();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
    }
    Stream { s: r, status }
}

impl Stream {
    /// The next event's (id, type, data), skipping comments (the body is
    /// chunked: chunk-size lines are skipped too).
    pub(crate) fn next_event(&mut self) -> (String, String, String) {
        let (mut id, mut kind) = (String::new(), String::new());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.s.read_line(&mut line).unwrap() > 0, "the stream ended");
            let l = line.trim_end();
            if let Some(v) = l.strip_prefix("id: ") {
                id = v.to_string();
            } else if let Some(v) = l.strip_prefix("event: ") {
                kind = v.to_string();
            } else if let Some(v) = l.strip_prefix("data: ") {
                return (id, kind, v.to_string());
            }
        }
    }
}

#[tokio::test]
async fn the_event_stream_resumes_and_its_cap_leaves_freeze_a_slot() {
    let b = TestBroker::start();
    let k = key();
    let subject = b.subject_token("alice");
    let mut first = open_stream(&b.admin, None);
    assert_eq!(first.status, 200);
    let token = b.derive_ok(&k).await;
    let (id1, kind, data) = first.next_event();
    assert_eq!(kind, "derive.issued");
    let v: serde_json::Value = serde_json::from_str(&data).unwrap();
    assert_eq!(v["version"], 1);
    assert!(!data.contains(token.access_token.expose().as_str()) && !data.contains(&subject));
    b.derive_ok(&k).await;
    let (id2, _, _) = first.next_event();
    // A client that reconnects with the first id gets the second next.
    let mut resumed = open_stream(&b.admin, Some(&id1));
    assert_eq!(resumed.status, 200);
    assert_eq!(resumed.next_event().0, id2);
    // Four streams (the default cap) are open: a fifth is refused.
    let _third = open_stream(&b.admin, None);
    let _fourth = open_stream(&b.admin, None);
    let mut fifth = open_stream(&b.admin, None);
    assert_eq!(fifth.status, 503);
    let mut body = String::new();
    let _ = fifth.s.read_to_string(&mut body);
    assert_eq!(b.metric("credbroker_event_stream_connections"), Some(4.0));
    // With every stream slot taken, freeze still gets through, and so do
    // the other commands.
    assert_eq!(b.admin_post("/freeze", "on").unwrap().0, 200);
    assert_eq!(b.admin_post("/freeze", "off").unwrap().0, 200);
    assert_eq!(b.admin_get("/status").unwrap().0, 200);
    // A stream closed gives its slot back.
    drop(resumed);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = open_stream(&b.admin, None);
        if s.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot of a closed stream was not given back"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
