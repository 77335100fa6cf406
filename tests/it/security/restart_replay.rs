//! A derive replayed after a restart (issue 40 item 3): the replay cache
//! of derive proofs is in memory, so the process after a crash starts with
//! an empty one. A derive proof dated before the process start (less the
//! allowed skew, 5 s) is refused, on every backend; with nonces, derive
//! nonces are bound to a random boot id, so a nonce of the process before
//! is refused even when the instance name `<host>/<pid>` repeats (PID 1 in
//! a container: here, `unshare --pid --fork`).
// Test code panics loudly on a broken fixture.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::support::*;
use credbroker::internals::dpop::make_proof;

/// The boot ids of the derive events (issued and denied) in `b`'s audit
/// file, in order.
fn boot_ids(b: &TestBroker) -> Vec<String> {
    b.audit_lines()
        .iter()
        .filter(|e| e["event"] == "derive.issued" || e["event"] == "derive.denied")
        .map(|e| {
            e["boot_id"]
                .as_str()
                .expect("every event has a boot_id")
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn a_derive_accepted_before_a_kill_9_is_refused_after_the_restart_on_sled() {
    // sled, no nonces: the default.
    let mut b = TestBroker::start();
    let k = key();
    let body = b.good_body(&b.subject_token("alice"));
    let proof = b.proof(&k);
    b.post_derive(&body, Some(&proof))
        .assert_issued("the proof, first use");
    b.post_derive(&body, Some(&proof)).assert_refused(
        400,
        "invalid_dpop_proof",
        "the proof again: a replay",
    );
    // Past the allowed skew, then a crash and a restart: the replay cache
    // is gone, the proof is still within its 60 s `iat` window.
    std::thread::sleep(Duration::from_secs(7));
    b.kill9();
    b.restart();
    b.post_derive(&body, Some(&proof)).assert_refused(
        400,
        "invalid_dpop_proof",
        "the proof accepted before the kill -9, after the restart",
    );
    // Positive control: a fresh proof is served by the new process.
    b.post_derive(&body, Some(&b.proof(&k)))
        .assert_issued("a fresh proof after the restart");
    // Issued and replayed before; refused and issued after.
    let ids = boot_ids(&b);
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert_eq!(ids[0], ids[1], "one process, one boot id");
    assert_eq!(ids[2], ids[3], "one process, one boot id");
    assert_ne!(ids[1], ids[2], "a restart, a new boot id");
}

/// Whether this machine lets us make a PID namespace (root, or user
/// namespaces allowed).
fn pid_namespaces_work() -> bool {
    std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "true"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test]
async fn a_derive_nonce_from_before_a_kill_9_is_refused_when_the_pid_repeats() {
    if !pid_namespaces_work() {
        eprintln!("not shown: `unshare --pid --fork` does not work here (needs root)");
        return;
    }
    let (dir, config) = prepare(&Opts {
        extra_config: "\n[dpop]\nrequire_nonce = true\n".into(),
        ..Opts::default()
    });
    // PID 1 in its own namespace, every start: the instance name
    // `<host>/1` repeats, as under a container runtime.
    let launcher = ["unshare", "--pid", "--fork", "--kill-child"].map(String::from);
    let mut b = TestBroker::spawn_launched(dir, config, None, &[], launcher.to_vec());
    let k = key();
    let body = b.good_body(&b.subject_token("alice"));
    let first = b.post_derive(&body, Some(&b.proof(&k)));
    first.assert_refused(400, "use_dpop_nonce", "a proof without a nonce");
    let nonce = first.header("dpop-nonce").expect("a nonce").to_owned();
    let proof = make_proof(&k, "POST", &b.htu(), now(), None, Some(&nonce)).unwrap();
    b.post_derive(&body, Some(&proof))
        .assert_issued("a proof with the nonce");
    // Restarted at once: the proof is within the skew of the new start,
    // so only its nonce can tell it from a fresh one. The broker dies of
    // `unshare`'s death (--kill-child), a moment after it: wait until its
    // socket stops answering.
    b.kill9();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&b.socket).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the killed broker still answers"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    b.restart();
    let again = b.post_derive(&body, Some(&proof));
    again.assert_refused(
        400,
        "use_dpop_nonce",
        "the proof accepted before the kill -9, after the restart as PID 1 again",
    );
    let fresh = make_proof(&k, "POST", &b.htu(), now(), None, Some(&nonce)).unwrap();
    b.post_derive(&body, Some(&fresh)).assert_refused(
        400,
        "use_dpop_nonce",
        "a new proof with the nonce of the process before",
    );
    // Positive control: the new process's nonce is served.
    let new_nonce = again.header("dpop-nonce").expect("a new nonce").to_owned();
    assert_ne!(new_nonce, nonce);
    let p = make_proof(&k, "POST", &b.htu(), now(), None, Some(&new_nonce)).unwrap();
    b.post_derive(&body, Some(&p))
        .assert_issued("a proof with the new process's nonce");
}
