//! Replicas on one PostgreSQL database under a steady stream of requests,
//! with the real binary, while something fails: one replica killed with
//! SIGKILL, or PostgreSQL itself stopped. The stream mixes `self` derives
//! (no store) with approval refusals, each of which writes a link to the
//! store before it is answered, so every refusal that came back is an
//! acknowledged write that must still be there afterwards.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use credbroker::client::{Answer, DeriveParams};
use credbroker::internals::jose::Es256Key;

use crate::support::postgres::{
    cluster_or_not_shown, database, replicas, replicas_with, OUTLASTS_OUTAGES,
};
use crate::support::*;

/// What one request of the stream got.
// The refusal's fields and the transport error are read only by the
// failure messages (`Debug`).
#[allow(dead_code)]
#[derive(Debug, Clone)]
enum Got {
    /// A `self` derive issued a token.
    Issued,
    /// An approval refusal with its link (an acknowledged write).
    Link(String),
    /// A refusal of another kind: (status, error, reason).
    Refused(u16, String, Option<String>),
    /// No answer at all (the connection failed).
    Transport(String),
}

/// One request of the stream, as sent to `replica`, and how long it took.
#[derive(Debug, Clone)]
struct Sample {
    replica: usize,
    /// Whose call it was (the person of an approval call).
    person: String,
    approval: bool,
    sent: Instant,
    took: Duration,
    got: Got,
}

/// The quick start's `notes.delete` needs an approval for each call, of
/// the notes it names: a refusal that makes (or finds) the person's link
/// in the store.
async fn approval_call(b: &TestBroker, key: &Es256Key, person: &str) -> Result<Answer, String> {
    b.client()
        .derive_for_details(
            &DeriveParams {
                subject_token: &b.subject_token(person),
                step: "cleanup_confirmed",
                tool: "notes.delete",
                resource: RESOURCE,
                scope: None,
            },
            Some(&serde_json::json!([{"type": "notes", "which": "all"}])),
            key,
        )
        .await
        .map_err(|e| e.to_string())
}

async fn self_call(b: &TestBroker, key: &Es256Key) -> Result<Answer, String> {
    b.client()
        .derive(
            &DeriveParams {
                subject_token: &b.subject_token("alice"),
                step: "summarize",
                tool: "notes.read",
                resource: RESOURCE,
                scope: None,
            },
            key,
        )
        .await
        .map_err(|e| e.to_string())
}

fn classify(r: Result<Answer, String>) -> Got {
    match r {
        Ok(Answer::Issued(_)) => Got::Issued,
        Ok(Answer::Refused(r)) if r.reason.as_deref() == Some("approval_required") => {
            match r.connect_id {
                Some(id) => Got::Link(id),
                None => Got::Refused(r.status, r.error, r.reason),
            }
        }
        Ok(Answer::Refused(r)) => Got::Refused(r.status, r.error, r.reason),
        Err(e) => Got::Transport(e),
    }
}

/// The link of `person`'s approval call, asked of `b`.
async fn link_of(b: &TestBroker, key: &Es256Key, person: &str) -> String {
    match classify(approval_call(b, key, person).await) {
        Got::Link(id) => id,
        other => panic!("{person}'s approval call on {}: {other:?}", b.public),
    }
}

/// How far a stream has got, read while it runs: answers, and links.
#[derive(Default)]
struct Progress {
    answers: AtomicUsize,
    links: AtomicUsize,
}

impl Progress {
    fn answers(&self) -> usize {
        self.answers.load(Ordering::SeqCst)
    }

    fn links(&self) -> usize {
        self.links.load(Ordering::SeqCst)
    }
}

/// Waits (polling, at most 60 s) until `done` holds.
async fn until_progress(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the streams did not get {what} in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends, until `stop`, alternately a `self` derive and an approval call
/// for a new person (`{tag}-{n}`) to `b`, one at a time, with proofs of
/// `key` (an approval is for one call of one DPoP key); returns what each
/// got, counting them in `progress` as they come. A replica that stops
/// answering ends its stream.
async fn stream(
    b: &TestBroker,
    key: &Es256Key,
    replica: usize,
    tag: &str,
    stop: &AtomicBool,
    progress: &Progress,
) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let approval = n % 2 == 1;
        let person = if approval {
            format!("{tag}-{n}")
        } else {
            "alice".to_string()
        };
        let sent = Instant::now();
        let got = if approval {
            classify(approval_call(b, key, &person).await)
        } else {
            classify(self_call(b, key).await)
        };
        let transport = matches!(got, Got::Transport(_));
        if !transport {
            progress.answers.fetch_add(1, Ordering::SeqCst);
        }
        if matches!(got, Got::Link(_)) {
            progress.links.fetch_add(1, Ordering::SeqCst);
        }
        out.push(Sample {
            replica,
            person,
            approval,
            sent,
            took: sent.elapsed(),
            got,
        });
        if transport {
            break;
        }
        n += 1;
        // Let the other streams of this task run.
        tokio::task::yield_now().await;
    }
    out
}

/// The approval calls among `samples` that came back with a link.
fn acknowledged(samples: &[Sample]) -> Vec<(usize, String, String)> {
    samples
        .iter()
        .filter_map(|s| match &s.got {
            Got::Link(id) => Some((s.replica, s.person.clone(), id.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn replica_killed_during_load_loses_no_acknowledged_write() {
    let Some(cluster) = cluster_or_not_shown("a replica killed with SIGKILL during load") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "kill9");
    let mut r = replicas(&db, 3);
    let key = Es256Key::generate().unwrap().0;
    for b in &r {
        b.derive_ok(&key).await;
    }
    let stop = AtomicBool::new(false);
    let killed_at: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    let victim_pid = r[2].pid();
    let (a, b, c) = (&r[0], &r[1], &r[2]);
    // The streams run on all three; once each has got far enough (counted,
    // not a fixed time: on a loaded machine 1.5 s gave C only 2 links), C
    // is killed mid-stream, the others go on until each has answered six
    // more, then everything stops.
    let (pa, pb, pc) = (
        Progress::default(),
        Progress::default(),
        Progress::default(),
    );
    let killer = async {
        until_progress("5 answers on A and B and 3 links on C", || {
            pa.answers() >= 5 && pb.answers() >= 5 && pc.links() >= 3
        })
        .await;
        let status = std::process::Command::new("kill")
            .args(["-KILL", &victim_pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -KILL {victim_pid}");
        *killed_at.lock().unwrap() = Some(Instant::now());
        let (na, nb) = (pa.answers(), pb.answers());
        until_progress("6 more answers on A and B after the kill", || {
            pa.answers() >= na + 6 && pb.answers() >= nb + 6
        })
        .await;
        stop.store(true, Ordering::Relaxed);
    };
    let (sa, sb, sc, ()) = tokio::join!(
        stream(a, &key, 0, "a", &stop, &pa),
        stream(b, &key, 1, "b", &stop, &pb),
        stream(c, &key, 2, "c", &stop, &pc),
        killer
    );
    let killed_at = killed_at.lock().unwrap().unwrap();
    r[2].kill9(); // reaps it
    let (a, b) = (&r[0], &r[1]);

    // The survivors answered every request, before and after the kill,
    // with what each request deserves.
    for (name, samples) in [("A", &sa), ("B", &sb)] {
        let before = samples.iter().filter(|s| s.sent < killed_at).count();
        let after = samples.iter().filter(|s| s.sent > killed_at).count();
        let slowest = samples.iter().map(|s| s.took).max().unwrap();
        eprintln!(
            "replica {name}: {before} answers before the kill, {after} after, the slowest in {slowest:?}"
        );
        // Nothing waits on the dead replica (no lock, no lease of its).
        assert!(
            slowest < slack(Duration::from_secs(2)),
            "{name}: {slowest:?}"
        );
        assert!(
            before > 4 && after > 4,
            "{name}: the stream did not span the kill"
        );
        for s in samples.iter() {
            let right = if s.approval {
                matches!(s.got, Got::Link(_))
            } else {
                matches!(s.got, Got::Issued)
            };
            assert!(right, "replica {name} during the kill: {s:?}");
        }
    }
    // C answered until it died; its stream ends in a failed connection
    // (the kill landed while it was being spoken to, or right before).
    assert!(acknowledged(&sc).len() > 2, "C made links before it died");
    assert!(
        matches!(sc.last().map(|s| &s.got), Some(Got::Transport(_))),
        "C's stream ends at the kill: {:?}",
        sc.last()
    );

    // Every acknowledged write is in the store: the same call asked of
    // another replica finds the same link (a lost one would be made anew,
    // with another id).
    let all: Vec<_> = [&sa, &sb, &sc]
        .into_iter()
        .flat_map(|s| acknowledged(s))
        .collect();
    for (replica, person, id) in &all {
        let other = if *replica == 0 { b } else { a };
        assert_eq!(
            &link_of(other, &key, person).await,
            id,
            "{person}'s link, acknowledged by replica {replica}, read on another"
        );
    }
    eprintln!("{} acknowledged links read back", all.len());
    // Positive control for the read-back: a person who never asked gets a
    // fresh link, not one of the above.
    let fresh = link_of(a, &key, "never-asked").await;
    assert!(all.iter().all(|(_, _, id)| *id != fresh));

    // The killed replica starts again on its directory and serves: tokens,
    // and the links its peers made.
    r[2].restart();
    let c = &r[2];
    c.derive_ok(&key).await;
    let (_, person, id) = all.iter().find(|(rep, _, _)| *rep == 0).unwrap();
    assert_eq!(&link_of(c, &key, person).await, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn postgres_stopped_during_load_refuses_within_the_timeout_then_recovers() {
    let Some(cluster) = cluster_or_not_shown("PostgreSQL stopped during load") else {
        return;
    };
    let _exclusive = cluster.exclusive();
    let db = database(cluster, "pg_stop_load");
    // The replicas' statement timeout (support::postgres: 2 s).
    let timeout = db.settings().statement_timeout;
    // The outage stays within the person stop list's watch bound, so the
    // self derives are served throughout (past it they are refused, as
    // store::person_stop shows; a loaded machine took 6.5 s to stop
    // PostgreSQL, and the default bound, 10 s, was passed).
    let opts = Opts {
        extra_config: OUTLASTS_OUTAGES.into(),
        ..Opts::default()
    };
    let r = replicas_with(&db, 2, &opts, &|t| t);
    let (a, b) = (&r[0], &r[1]);
    let key = Es256Key::generate().unwrap().0;
    let before_outage = link_of(a, &key, "before-outage").await;

    let stop = AtomicBool::new(false);
    let window: std::sync::Mutex<Option<(Instant, Instant)>> = std::sync::Mutex::new(None);
    let operator = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let down = Instant::now();
        // pg_ctl blocks until the server is gone: off the runtime's
        // workers, so the streams keep going meanwhile.
        tokio::task::spawn_blocking(|| cluster.stop())
            .await
            .unwrap();
        let stopped = Instant::now();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let up = Instant::now();
        tokio::task::spawn_blocking(|| cluster.start_again())
            .await
            .unwrap();
        *window.lock().unwrap() = Some((down, up));
        eprintln!("PostgreSQL stopped after {:?}", stopped - down);
        // The streams run on a while after the server is back.
        tokio::time::sleep(Duration::from_millis(3000)).await;
        stop.store(true, Ordering::Relaxed);
    };
    let (pa, pb) = (Progress::default(), Progress::default());
    let (sa, sb, ()) = tokio::join!(
        stream(a, &key, 0, "a", &stop, &pa),
        stream(b, &key, 1, "b", &stop, &pb),
        operator
    );
    let (down, up) = window.lock().unwrap().unwrap();
    let samples: Vec<&Sample> = sa.iter().chain(sb.iter()).collect();

    // Throughout: every `self` derive issued (that path needs no store),
    // and no approval call was ever answered with a token.
    let selfs = samples.iter().filter(|s| !s.approval).count();
    for s in &samples {
        if s.approval {
            assert!(
                !matches!(s.got, Got::Issued),
                "a token for an unapproved call: {s:?}"
            );
        } else {
            assert!(matches!(s.got, Got::Issued), "a self derive: {s:?}");
        }
        assert!(!matches!(s.got, Got::Transport(_)), "no answer: {s:?}");
    }
    // While the server was away, the calls that need it were refused with
    // 503 temporarily_unavailable, none later than the statement timeout
    // plus slack; the others got their link.
    let mut unavailable = 0;
    let mut slowest = Duration::ZERO;
    for s in samples.iter().filter(|s| s.approval) {
        match &s.got {
            Got::Link(_) => {}
            Got::Refused(503, e, _) if e == "temporarily_unavailable" => {
                assert!(
                    s.sent + s.took > down && s.sent < up + Duration::from_secs(10),
                    "a 503 outside the outage: {s:?}"
                );
                unavailable += 1;
                slowest = slowest.max(s.took);
            }
            other => panic!("an approval call during the outage: {other:?} ({s:?})"),
        }
    }
    eprintln!(
        "{} requests ({selfs} self derives), {unavailable} refused 503, the slowest 503 after {slowest:?}",
        samples.len()
    );
    assert!(unavailable > 0, "the outage was seen by the stream");
    assert!(
        slowest <= timeout + slack(Duration::from_millis(500)),
        "a 503 took {slowest:?}, the statement timeout is {timeout:?}"
    );
    // Recovered without a restart: approval calls get links again from the
    // same processes (polled, since on a loaded machine the pools may still
    // be replacing the connections the restart broke when the streams
    // stop), and what was written before the outage is still there.
    for (name, rep) in [("A", a), ("B", b)] {
        let since = Instant::now();
        let mut n = 0;
        loop {
            n += 1;
            let got = classify(approval_call(rep, &key, &format!("after-{name}-{n}")).await);
            if matches!(got, Got::Link(_)) {
                eprintln!(
                    "{name} served a link {:?} after the streams stopped",
                    since.elapsed()
                );
                break;
            }
            assert!(
                matches!(got, Got::Refused(503, _, _)) && since.elapsed() < Duration::from_secs(20),
                "{name} did not recover: {got:?} after {:?}",
                since.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(link_of(b, &key, "before-outage").await, before_outage);
    let mut r = r;
    for x in r.iter_mut() {
        assert!(x.is_running(), "a replica exited during the outage");
    }
}
