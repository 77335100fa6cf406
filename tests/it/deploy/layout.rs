//! The layout harness: deploy/kubernetes.yaml reproduced on this machine as
//! the kubelet lays it out (no kubelet or container runtime runs here), then
//! the real binary started in it as the manifest's non-root uid and one
//! derive made as the orchestrator's uid, so that a manifest whose layout the
//! broker refuses fails CI. Reproduced: emptyDir roots root-owned 0777 with
//! the fsGroup's setgid, the Secret's `..data` symlinks with `defaultMode`
//! and the fsGroup, the ConfigMap's `..data` symlinks 0444, the init
//! container's copy (run as its uid with `setpriv`), the containers' uids,
//! gids and supplemental groups. Replaced: the absolute paths are moved under
//! a temp root, the public listener binds a free loopback port with a
//! throw-away certificate, and the organisation's IdP is the quick start's
//! dev issuer (the manifest's IdP is not reachable from CI).
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::kubelet::{block, containers, empty_dir, projected, relocate};
use crate::support::broker::{prepare, Opts};
use crate::support::layout::{install_binary, mode, run, throwaway_tls};

const MANIFEST: &str = include_str!("../../../deploy/kubernetes.yaml");

#[tokio::test]
async fn kubernetes_manifest_layout_starts_and_derives_as_non_root() {
    if !nix::unistd::Uid::effective().is_root() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the layout harness needs root (chown, setpriv) and CI runs as root"
        );
        eprintln!("SKIP kubernetes_manifest_layout_starts_and_derives_as_non_root: needs root to lay out other users' files");
        return;
    }
    // The ids the manifest names.
    for needle in [
        "fsGroup: 3000",
        "supplementalGroups: [2000]",
        "runAsUser: 1000\n            runAsGroup: 1000",
        "runAsUser: 1001\n            runAsGroup: 1001",
        "secretName: credbroker-keys   # master.key, tls.crt, tls.key, idp-client-secret\n            defaultMode: 0440",
    ] {
        assert!(MANIFEST.contains(needle), "deploy/kubernetes.yaml no longer has {needle:?}");
    }
    let addr = crate::support::free_loopback_addr();
    let (qs, _qs_config) = prepare(&Opts {
        public_listen: Some(addr.clone()),
        ..Opts::default()
    });
    let dev_issuer = format!("http://{addr}");
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    mode(r, 0o755);
    let at = |p: &str| r.join(p.trim_start_matches('/'));

    // The ConfigMap: the manifest's config with paths under the temp root.
    let mut config = block(MANIFEST, "credbroker.toml");
    for prefix in ["/run/", "/var/lib/credbroker", "/etc/credbroker"] {
        config = config.replace(
            &format!("\"{prefix}"),
            &format!("\"{}/{}", r.display(), prefix.trim_start_matches('/')),
        );
    }
    config = config.replace("listen = \"0.0.0.0:8443\"", &format!("listen = \"{addr}\""));
    // The metrics listener on a free loopback port (the manifest's 9464
    // may be taken on this machine); the sidecar's scrape is done below.
    let metrics_addr = crate::support::free_loopback_addr();
    assert!(config.contains("listen = \"127.0.0.1:9464\""), "{config}");
    config = config.replace(
        "listen = \"127.0.0.1:9464\"",
        &format!("listen = \"{metrics_addr}\""),
    );
    // The dev issuer pairs with local sign-in only as the broker's own.
    config = config.replace(
        "issuer = \"https://broker.example.com\"",
        &format!("issuer = \"{dev_issuer}\""),
    );
    let idp = config.find("[[trusted_issuers]]").unwrap();
    // The IdP is the config's last table.
    config.replace_range(
        idp..,
        &format!(
            "[[trusted_issuers]]\nissuer = \"{dev_issuer}\"\njwks_file = \"{}\"\nalgs = [\"ES256\"]\nsign_in = {{ kind = \"local\" }}\n\n",
            at("/etc/credbroker/dev-issuer-jwks.json").display()
        ),
    );
    let etc = at("/etc/credbroker");
    std::fs::create_dir_all(&etc).unwrap();
    projected(
        &etc,
        &[
            ("credbroker.toml".into(), config.into_bytes()),
            (
                "policy.toml".into(),
                std::fs::read(qs.path().join("policy.toml")).unwrap(),
            ),
            (
                "dev-issuer-jwks.json".into(),
                std::fs::read(qs.path().join("dev-issuer-jwks.json")).unwrap(),
            ),
        ],
        0o444,
        0,
    );

    // The Secret, 0440 with the fsGroup, and a throw-away certificate.
    let (cert, key) = throwaway_tls();
    let secrets_in = r.join("secrets-in");
    std::fs::create_dir_all(&secrets_in).unwrap();
    projected(
        &secrets_in,
        &[
            (
                "master.key".into(),
                std::fs::read(qs.path().join("keys/master.key")).unwrap(),
            ),
            ("tls.crt".into(), cert),
            ("tls.key".into(), key),
            ("idp-client-secret".into(), b"client-secret".to_vec()),
        ],
        0o440,
        3000,
    );
    for d in [
        "/run/credbroker",
        "/run/credbroker-admin",
        "/run/credbroker-secrets",
        "/var/lib/credbroker",
    ] {
        empty_dir(&at(d), 3000);
    }

    // The init container, as the manifest runs it (its shell script, with
    // each mount path moved to where this layout put that volume: the
    // broker's own mount of it, or the Secret's directory).
    let inits = containers(MANIFEST, "initContainers");
    let broker = containers(MANIFEST, "containers")
        .into_iter()
        .find(|c| c.name == "credbroker")
        .unwrap();
    let volume_dir = |v: &str| {
        if v == "secrets-in" {
            return secrets_in.clone();
        }
        let m = broker.mounts.iter().find(|m| m.volume == v).unwrap();
        at(&m.path)
    };
    assert_eq!(inits.len(), 1, "{inits:?}");
    let script = relocate(
        inits[0].script.as_deref().unwrap(),
        &inits[0].mounts,
        volume_dir,
    );
    run(Command::new("setpriv").args([
        "--reuid=1000",
        "--regid=1000",
        "--groups=2000,3000",
        "--",
        "sh",
        "-c",
        &script,
    ]));

    // The binary where the image puts it: a checkout under a 0700
    // directory (what `mktemp -d` makes) is out of reach of uids 1000/1001.
    let exe = install_binary(r);

    // The broker, as the manifest's container runs.
    let config_path = etc.join("credbroker.toml");
    let log = r.join("broker.log");
    let mut child = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--groups=2000,3000", "--"])
        .arg(&exe)
        .args(["serve", "--config"])
        .arg(&config_path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let sock = at("/run/credbroker/sock/credbroker.sock");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        if let Some(st) = child.try_wait().unwrap() {
            panic!(
                "the broker exited ({st}) in the manifest's layout: {}",
                std::fs::read_to_string(&log).unwrap()
            );
        }
        assert!(
            Instant::now() < deadline,
            "no socket: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Readiness, as the exec probe runs it (the broker's uid).
    let status = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--groups=2000,3000", "--"])
        .arg(&exe)
        .args(["status", "--config"])
        .arg(&config_path)
        .output()
        .unwrap();
    // One derive, as the orchestrator (uid 1001, gid 1001, socket group 2000).
    let subject = credbroker::internals::cli::dev_subject_token(qs.path(), "alice", 300).unwrap();
    let keydir = tempfile::tempdir().unwrap();
    mode(keydir.path(), 0o777);
    let derive = Command::new("setpriv")
        .args(["--reuid=1001", "--regid=1001", "--groups=2000,3000", "--"])
        .arg(&exe)
        .args(["derive", "--socket"])
        .arg(&sock)
        .args(["--issuer", &dev_issuer, "--subject-token", &subject])
        .args([
            "--step",
            "answer_question",
            "--tool",
            "notes.read",
            "--resource",
            "http://127.0.0.1:9090/notes",
        ])
        .arg("--dpop-key")
        .arg(keydir.path().join("tool.pem"))
        .output()
        .unwrap();
    // Negative: a uid outside the socket group cannot reach the socket.
    let other = Command::new("setpriv")
        .args(["--reuid=1002", "--regid=1002", "--clear-groups", "--"])
        .arg(&exe)
        .args(["derive", "--socket"])
        .arg(&sock)
        .args(["--issuer", &dev_issuer, "--subject-token", &subject])
        .args([
            "--step",
            "answer_question",
            "--tool",
            "notes.read",
            "--resource",
            "http://127.0.0.1:9090/notes",
        ])
        .arg("--dpop-key")
        .arg(keydir.path().join("other.pem"))
        .output()
        .unwrap();
    // The collector sidecar's scrape (GET /metrics on the pod's loopback).
    let scraped = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&metrics_addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nhost: {metrics_addr}\r\nconnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    let _ = child.kill();
    let _ = child.wait();
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(
        scraped.starts_with("HTTP/1.1 200 ") && scraped.contains("\ncredbroker_ready 1\n"),
        "the metrics listener in the manifest's layout: {scraped}\n{logs}"
    );
    assert!(
        status.status.success(),
        "credbroker status: {status:?}\n{logs}"
    );
    assert!(
        derive.status.success(),
        "derive as the orchestrator: {}{}\n{logs}",
        String::from_utf8_lossy(&derive.stdout),
        String::from_utf8_lossy(&derive.stderr)
    );
    assert!(
        String::from_utf8_lossy(&derive.stdout).contains("access_token"),
        "{derive:?}"
    );
    assert!(
        !other.status.success(),
        "uid 1002 outside the socket group derived: {other:?}"
    );
}
