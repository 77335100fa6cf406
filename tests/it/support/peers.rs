//! The Node.js peers in `tests/peers/` (oidc-provider, jose checks), each a
//! child process spoken to in JSON lines.
#![allow(dead_code, missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A Node.js peer from `tests/peers/` (oidc-provider, jose checks), talked to
/// with one JSON line per command on stdin/stdout.
pub(crate) struct NodePeer {
    child: Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    /// The first line the peer printed (e.g. its issuer URL).
    pub hello: serde_json::Value,
}

/// The directory of the Node.js peers; fails the test in one line when
/// they are not installed (the tests must never pass silently without
/// their peers).
pub(crate) fn peers_dir() -> PathBuf {
    super::prereq::node_peers()
}

impl NodePeer {
    /// Starts `node tests/peers/SCRIPT ARGS...` and reads its first line.
    pub(crate) fn start(script: &str, args: &[&str]) -> NodePeer {
        use std::io::BufRead;
        let dir = peers_dir();
        let mut child = Command::new("node")
            .arg(dir.join(script))
            .args(args)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node runs (checked by peers_dir)");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let hello =
            serde_json::from_str(&line).unwrap_or_else(|_| panic!("peer {script} said: {line}"));
        NodePeer {
            child,
            stdin,
            stdout,
            hello,
        }
    }

    /// Sends one command and reads one JSON answer.
    pub(crate) fn call(&mut self, cmd: &serde_json::Value) -> serde_json::Value {
        use std::io::BufRead;
        writeln!(self.stdin, "{cmd}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("peer answered: {line}"))
    }
}

impl Drop for NodePeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts oidc-provider with `config` (see tests/peers/oidc-provider.mjs).
pub(crate) fn oidc_provider(config: &serde_json::Value) -> (NodePeer, tempfile::NamedTempFile) {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), config.to_string()).unwrap();
    let p = NodePeer::start("oidc-provider.mjs", &[f.path().to_str().unwrap()]);
    (p, f)
}

/// Runs `tests/peers/jose/<script>.mjs` with `input` on stdin. `Ok` is the
/// script's answer, `Err` is jose's (or the script's) refusal code; node
/// itself failing fails the test.
pub(crate) async fn jose(
    script: &str,
    input: serde_json::Value,
) -> Result<serde_json::Value, String> {
    let mut child = tokio::process::Command::new("node")
        .arg(peers_dir().join("jose").join(format!("{script}.mjs")))
        .current_dir(peers_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn node");
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, input.to_string().as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("node timed out")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    match out.status.code() {
        Some(0) => Ok(serde_json::from_str(&stdout).expect("jose script prints JSON")),
        Some(2) => {
            let v: serde_json::Value = serde_json::from_str(&stdout).expect("jose refusal is JSON");
            Err(v["error"].as_str().unwrap().to_owned())
        }
        _ => panic!(
            "node {script}.mjs failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}
