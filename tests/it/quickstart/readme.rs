//! The README's two-minute walkthrough, run as written: its `sh` blocks
//! (up to "Calling a resource server", which builds and runs a cargo
//! example on a fixed port) go to one bash, in a fresh directory, against
//! the real `credbroker quickstart`; the browser part in between is played
//! in Chromium. The quick start's printed next steps are the same lines.
//!
//! What the test changes in the text, and why: the addresses (the test
//! picks free ports, so `127.0.0.1:8440` and `:8441` become those), and
//! `$PWD/target/release/credbroker` becomes the binary under test (the
//! README's set-up builds a release binary; the test has its own).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::support::browser::Browsers;
use crate::support::quickstart::{alice_connects_steps, bob_opens_steps, Quickstart};
use crate::support::*;

const README_BIN: &str = "$PWD/target/release/credbroker";

/// The `sh` blocks of the README's walkthrough, in order.
fn walkthrough_blocks() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = readme
        .find("## A two-minute walkthrough")
        .expect("README has the walkthrough");
    let end = start
        + readme[start..]
            .find("### Calling a resource server")
            .expect("README has its resource-server part");
    let mut blocks = Vec::new();
    let mut rest = &readme[start..end];
    while let Some(i) = rest.find("```sh\n") {
        let body = &rest[i + 6..];
        let j = body.find("```").unwrap();
        blocks.push(body[..j].to_string());
        rest = &body[j + 3..];
    }
    blocks
}

/// The command lines of a text: trimmed, without comments and blank lines.
fn commands(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_walkthrough_runs_as_written_from_a_fresh_directory() {
    let blocks = walkthrough_blocks();
    assert_eq!(blocks.len(), 3, "the walkthrough's blocks: {blocks:#?}");
    let q = Quickstart::start().await;
    let bin = bin().display().to_string();

    // The printed next steps are the README's lines, with the default
    // addresses and the README's binary path.
    let printed = q.printed();
    let steps = &printed[printed.find("Next steps").unwrap()..];
    let steps = &steps[steps.find('\n').unwrap()..steps.find("\n\n").unwrap()];
    let as_in_readme = steps
        .replace(&q.listen, "127.0.0.1:8440")
        .replace(&q.demo_listen, "127.0.0.1:8441")
        .replace(&bin, README_BIN);
    assert_eq!(
        commands(&as_in_readme),
        commands(&blocks.concat()),
        "the quick start's next steps differ from the README's walkthrough"
    );

    let script = |block: &str| {
        block
            .replace("127.0.0.1:8440", &q.listen)
            .replace("127.0.0.1:8441", &q.demo_listen)
            .replace(README_BIN, &bin)
    };
    let mut bash = tokio::process::Command::new("bash")
        .current_dir(q.cwd.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = bash.stdin.take().unwrap();
    let mut out = BufReader::new(bash.stdout.take().unwrap()).lines();
    // Aliases expand in a script only when asked; then the blocks of the
    // README before the browser, and a marker once they are done.
    let first = format!(
        "shopt -s expand_aliases\n{}\n{}\necho '@@ browser'\n",
        script(&blocks[0]),
        script(&blocks[1])
    );
    stdin.write_all(first.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    loop {
        let line = tokio::time::timeout(Duration::from_secs(60), out.next_line())
            .await
            .expect("the README's commands answered in time")
            .unwrap()
            .unwrap_or_else(|| panic!("bash ended early; it printed {seen:#?}"));
        if line == "@@ browser" {
            break;
        }
        seen.push(line);
    }
    assert_eq!(seen.len(), 3, "{seen:#?}");
    let issued: serde_json::Value = serde_json::from_str(&seen[0]).unwrap();
    assert_eq!(issued["token_type"], "DPoP", "step 2: {}", seen[0]);
    assert_eq!(issued["scope"], "notes.read");
    let denied: serde_json::Value = serde_json::from_str(&seen[1]).unwrap();
    assert_eq!(denied["reason"], "step_not_allowed", "step 3: {}", seen[1]);
    let link = seen[2].clone();
    assert!(
        link.starts_with(&format!("{}/connect/", q.issuer)),
        "step 4 prints the link: {link}"
    );
    assert!(q.cwd.path().join("tool-key.pem").exists());

    // The browser, as the README says: Bob first, then Alice connects.
    let mut b = Browsers::start().await;
    b.steps("bob", json!(bob_opens_steps(&q, &link, &q.password("bob"))))
        .await;
    b.steps(
        "alice",
        json!(alice_connects_steps(&q, &link, &q.password("alice"))),
    )
    .await;
    b.finish().await;

    stdin
        .write_all(format!("{}\nexit\n", script(&blocks[2])).as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let mut rest = Vec::new();
    while let Some(line) = tokio::time::timeout(Duration::from_secs(60), out.next_line())
        .await
        .expect("the retry answered in time")
        .unwrap()
    {
        rest.push(line);
    }
    let status = bash.wait().await.unwrap();
    let mut err = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut bash.stderr.take().unwrap(), &mut err)
        .await
        .unwrap();
    assert!(status.success(), "bash: {status}\n{err}");
    // curl prints the API's answer without a line break, so the two
    // answers may share a line: read them as a stream of JSON values.
    let printed = rest.concat();
    let answers: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&printed)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("steps 5 and 6 printed {printed}: {e}\n{err}"));
    let [notes, gone] = &answers[..] else {
        panic!("steps 5 and 6 printed {printed}\n{err}");
    };
    assert_eq!(notes["account"], "alice.demo", "step 5: {notes}");
    assert_eq!(notes["demo"], true);
    assert_eq!(gone["revocation"], "revoked", "step 6: {gone}");
    assert_eq!(gone["deleted"], true, "step 6: {gone}");
    assert!(
        gone["message"].as_str().unwrap_or_default().starts_with(
            "revoked at Demo service: the refresh token and the access token (RFC 7009)"
        ),
        "step 6: {gone}"
    );
}
