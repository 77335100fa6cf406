//! The audit log under faults: a disk that fills in the middle of a line, a
//! file whose tail was torn before the broker started, and readiness while
//! the log cannot be written. A line-by-line reader must find every event
//! that let a token out, each on its own line, and nothing else that looks
//! like one.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;

use crate::support::*;
use credbroker::client::Answer;

/// Parses every line; panics on a torn tail or a line that is not one
/// JSON object.
fn parse_lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "the audit log ends in a partial line: ...{:?}",
        &text[text.len().saturating_sub(120)..]
    );
    text.lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .filter(|v| v.is_object())
                .unwrap_or_else(|| panic!("a line a reader cannot parse: {l:?}"))
        })
        .collect()
}

async fn derive(b: &TestBroker, k: &credbroker::internals::jose::Es256Key) -> Answer {
    b.derive(
        k,
        &b.subject_token("alice"),
        "summarize",
        "notes.read",
        RESOURCE,
        None,
    )
    .await
}

fn readyz(b: &TestBroker) -> (u16, serde_json::Value) {
    let (code, body) = b.admin_get("/readyz").unwrap();
    (code, serde_json::from_str(&body).unwrap())
}

/// `credbroker status` on `b`: its exit code and stdout.
fn status(b: &TestBroker) -> (i32, String) {
    let out = std::process::Command::new(bin())
        .args(["status", "--config"])
        .arg(&b.config)
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Fills the file system holding `path` until a write fails.
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 4096];
    while f.write_all(&block).is_ok() {}
    // The last, partial block may have left a few bytes.
    while f.write_all(&[0]).is_ok() {}
}

#[tokio::test]
async fn disk_full_in_the_middle_of_a_line_leaves_no_partial_line_and_readyz_follows() {
    let (dir, config) = prepare(&Opts {
        edit_config: Some(|c| {
            c.replacen(
                "store = \"data\"",
                "store = \"data\"\naudit_log = \"auditfs/audit.jsonl\"",
                1,
            )
        }),
        ..Opts::default()
    });
    let Some(fs) = Tmpfs::mount(&dir.path().join("auditfs"), "256k") else {
        not_shown(
            "a disk that fills in the middle of an audit line",
            "cannot mount a tmpfs here (needs root)",
        );
        return;
    };
    let audit = fs.0.join("audit.jsonl");
    let b = TestBroker::spawn(dir, config, None);
    let k = key();
    assert!(matches!(derive(&b, &k).await, Answer::Issued(_)));
    assert_eq!(readyz(&b).0, 200);

    // Leave 40 bytes in the file's last page, then fill the file system:
    // the next event's line (hundreds of bytes) is written in part, then
    // the write fails with ENOSPC.
    let len = std::fs::metadata(&audit).unwrap().len() as usize;
    let mut pad_to = (len / 4096 + 1) * 4096 - 40;
    if pad_to - len < 64 {
        pad_to += 4096;
    }
    let mut pad = std::fs::OpenOptions::new()
        .append(true)
        .open(&audit)
        .unwrap();
    let filler = pad_to - len;
    let mut line = format!(
        "{{\"event\":\"test.padding\",\"pad\":\"{}",
        "p".repeat(filler)
    );
    line.truncate(filler - 3);
    line.push_str("\"}\n");
    assert_eq!(line.len(), filler);
    pad.write_all(line.as_bytes()).unwrap();
    drop(pad);
    fill(&fs.0.join("filler"));
    let before = parse_lines(&audit).len();

    match derive(&b, &k).await {
        Answer::Refused(r) => assert_eq!(r.status, 500, "{r:?}"),
        Answer::Issued(_) => panic!("a token was released although its event was not written"),
    }
    let size = std::fs::metadata(&audit).unwrap().len() as usize;
    assert_eq!(
        size, pad_to,
        "the short write was cut back to the last whole line"
    );
    assert_eq!(parse_lines(&audit).len(), before);
    let (code, body) = readyz(&b);
    assert_eq!(
        code, 503,
        "not ready while the audit log cannot be written: {body}"
    );
    assert_eq!(body["audit"], false, "{body}");
    // `credbroker status` says so with the exit code --help gives for
    // "running but not ready".
    let (code, out) = status(&b);
    assert_eq!(code, 1, "status while not ready: {out}");
    assert!(out.contains("\"ready\":false"), "{out}");

    // Room again: ready again, and the next token's event is a line of its own.
    std::fs::remove_file(fs.0.join("filler")).unwrap();
    let (code, body) = readyz(&b);
    assert_eq!(code, 200, "ready again once the log can be written: {body}");
    assert_eq!(body["audit"], true, "{body}");
    let (code, out) = status(&b);
    assert_eq!(code, 0, "status once ready again: {out}");
    assert!(matches!(derive(&b, &k).await, Answer::Issued(_)));
    let lines = parse_lines(&audit);
    let tail: Vec<&str> = lines[before..]
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(tail, ["audit.recovered", "derive.issued"], "{lines:?}");
    drop(b);
}

#[tokio::test]
async fn torn_tail_at_start_is_cut_before_the_first_event() {
    let (dir, config) = prepare(&Opts::default());
    let audit = dir.path().join("data/audit.jsonl");
    std::fs::create_dir_all(audit.parent().unwrap()).unwrap();
    let whole = "{\"time\":1,\"event\":\"derive.denied\",\"agent\":\"repo-helper\"}\n";
    let torn = "{\"time\":2,\"event\":\"derive.issued\",\"agent\":\"repo-he";
    std::fs::write(&audit, format!("{whole}{torn}")).unwrap();
    let b = TestBroker::spawn(dir, config, None);
    let k = key();
    assert!(matches!(derive(&b, &k).await, Answer::Issued(_)));
    let lines = parse_lines(&audit);
    let kinds: Vec<&str> = lines.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["derive.denied", "audit.repaired", "derive.issued"]);
    assert_eq!(lines[1]["removed_bytes"], torn.len() as u64);
    assert!(
        b.log_text().contains("torn line"),
        "the repair is logged: {}",
        b.log_text()
    );
    // Positive control: a whole file is left as it is on the next start.
    let mut b = b;
    b.restart();
    assert!(matches!(derive(&b, &k).await, Answer::Issued(_)));
    let again = parse_lines(&audit);
    assert_eq!(again.len(), 4);
    assert_eq!(again[3]["event"], "derive.issued");
}
