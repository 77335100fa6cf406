//! No event, no call: when the audit log cannot be written, a proxied call
//! is refused with 503 and nothing reaches the provider's API.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;

use super::{refusal, ProxyEnv};
use crate::support::services::ProviderOpts;
use crate::support::*;

/// Writes zeros to `path` until the file system is full.
fn fill(path: &std::path::Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 4096];
    while f.write_all(&block).is_ok() {}
    while f.write_all(&[0]).is_ok() {}
}

#[tokio::test]
async fn full_audit_disk_gives_503_and_nothing_reaches_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::mount(&dir.path().join("auditfs"), "1m") else {
        not_shown(
            "a proxied call refused on a full audit disk",
            "cannot mount a tmpfs here (needs root)",
        );
        return;
    };
    let audit = fs.0.join("audit.jsonl");
    let p = ProxyEnv::start_with(
        "",
        ProviderOpts {
            audit_log: Some(audit.clone()),
            ..ProviderOpts::default()
        },
    )
    .await;
    // The token first: its derive needs the audit too.
    let read = p.token("acme.read", "triage").await;

    // Fill the log's last page with a padding line (tmpfs hands out whole
    // pages: a short line would still fit there), then the file system.
    let len = std::fs::metadata(&audit).unwrap().len() as usize;
    let mut pad = (len / 4096 + 1) * 4096 - len;
    if pad < 64 {
        pad += 4096;
    }
    let head = "{\"event\":\"test.padding\",\"pad\":\"";
    let line = format!("{head}{}\"}}\n", "p".repeat(pad - head.len() - 3));
    assert_eq!(line.len(), pad);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&audit)
        .unwrap()
        .write_all(line.as_bytes())
        .unwrap();
    fill(&fs.0.join("filler"));
    let r = p.call(&read, "GET", "/user", None).await;
    let (status, v) = refusal(r).await;
    assert_eq!(
        (status, v["reason"].as_str()),
        (503, Some("audit_unavailable")),
        "{v}"
    );
    assert!(p.api.records().is_empty(), "nothing went upstream");
    assert!(
        !read_audit(&audit)
            .iter()
            .any(|e| e["event"] == "proxy.request"),
        "no event was written"
    );

    // Room again: the same token is served, with its event before the call.
    std::fs::remove_file(fs.0.join("filler")).unwrap();
    let r = p.call(&read, "GET", "/user", None).await;
    let status = r.status();
    assert_eq!(status, 200, "{}", r.text().await.unwrap_or_default());
    assert_eq!(p.api.records().len(), 1);
    // `proxy.completed` follows the answer's last byte.
    let events = read_audit_until(&audit, |es| {
        es.iter().any(|e| e["event"] == "proxy.completed")
    })
    .await;
    assert!(events.iter().any(|e| e["event"] == "proxy.request"));
    assert!(
        events.iter().any(|e| e["event"] == "proxy.completed"),
        "{events:?}"
    );
}
