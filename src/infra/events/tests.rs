use std::sync::{Arc, Mutex as StdMutex};

use super::*;

/// A sink that accepts `budget` more bytes, then fails as a full disk
/// does: the write that crosses the budget is short, the next one fails.
#[derive(Clone, Default)]
struct Disk {
    bytes: Arc<StdMutex<Vec<u8>>>,
    budget: Arc<StdMutex<usize>>,
    truncate_fails: Arc<AtomicBool>,
}

impl Disk {
    fn text(&self) -> String {
        String::from_utf8(self.bytes.lock().unwrap().clone()).unwrap()
    }
    fn set_budget(&self, n: usize) {
        *self.budget.lock().unwrap() = n;
    }
}

impl Sink for Disk {
    fn end(&mut self) -> std::io::Result<u64> {
        Ok(self.bytes.lock().unwrap().len() as u64)
    }
    fn append(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut budget = self.budget.lock().unwrap();
        if *budget == 0 {
            return Err(std::io::Error::from_raw_os_error(28)); // ENOSPC
        }
        let n = buf.len().min(*budget);
        *budget -= n;
        self.bytes.lock().unwrap().extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        if self.truncate_fails.load(Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(5)); // EIO
        }
        self.bytes.lock().unwrap().truncate(len as usize);
        Ok(())
    }
}

fn event(tool: &str) -> Event<'_> {
    let mut e = Event::new(1, Kind::DeriveIssued, "agent");
    e.tool = Some(tool);
    e
}

/// Every line parses as a JSON object.
fn lines(text: &str) -> Vec<serde_json::Value> {
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "torn tail: {text:?}"
    );
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

#[test]
fn short_write_on_a_full_disk_leaves_no_partial_line() {
    let disk = Disk::default();
    disk.set_budget(usize::MAX);
    let audit = Audit::with_sink(Path::new("audit.jsonl"), Box::new(disk.clone()));
    audit.record(&event("first")).unwrap();
    let before = disk.text();
    // Room for 10 more bytes: the line is written in part, then ENOSPC.
    disk.set_budget(10);
    let err = audit.record(&event("refused")).unwrap_err();
    assert!(err.to_string().contains("audit.jsonl"), "{err}");
    assert_eq!(disk.text(), before, "the partial line was cut away");
    assert!(!audit.is_writable());
    // Positive control: with room again, the next event is a line of its own.
    disk.set_budget(usize::MAX);
    audit.record(&event("released")).unwrap();
    assert!(audit.is_writable());
    let got = lines(&disk.text());
    assert_eq!(got.len(), 2);
    assert_eq!(got[1]["tool"], "released");
}

#[test]
fn a_partial_line_that_cannot_be_cut_blocks_every_later_event_until_it_is() {
    let disk = Disk::default();
    disk.set_budget(usize::MAX);
    let audit = Audit::with_sink(Path::new("audit.jsonl"), Box::new(disk.clone()));
    audit.record(&event("first")).unwrap();
    disk.set_budget(10);
    disk.truncate_fails.store(true, Ordering::SeqCst);
    audit.record(&event("refused")).unwrap_err();
    // Room again, but the partial line is still there: refuse, don't glue.
    disk.set_budget(usize::MAX);
    let err = audit.record(&event("glued")).unwrap_err();
    assert!(err.to_string().contains("partial line"), "{err}");
    assert!(!disk.text().contains("glued"));
    // Positive control: once it can be cut, it is, before the next line.
    disk.truncate_fails.store(false, Ordering::SeqCst);
    assert!(audit.probe(2, "agent"));
    let got = lines(&disk.text());
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[1]["event"], "audit.recovered");
}

#[test]
fn a_torn_tail_is_cut_at_open_and_the_repair_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let good = "{\"time\":1,\"event\":\"derive.issued\",\"agent\":\"a\"}\n";
    let torn = "{\"time\":2,\"event\":\"derive.issued\",\"ag";
    std::fs::write(&path, format!("{good}{torn}")).unwrap();
    let audit = Audit::open(&path).unwrap();
    assert_eq!(audit.repaired(), Some(torn.len() as u64));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), good);
    audit.record_repair(3, "a").unwrap();
    audit.record(&event("next")).unwrap();
    let got = lines(&std::fs::read_to_string(&path).unwrap());
    assert_eq!(got.len(), 3);
    assert_eq!(got[1]["event"], "audit.repaired");
    assert_eq!(got[1]["removed_bytes"], torn.len() as u64);
    assert_eq!(got[2]["tool"], "next");
    // A file with no newline at all is cut to empty; a whole file is kept.
    std::fs::write(&path, torn).unwrap();
    assert_eq!(
        Audit::open(&path).unwrap().repaired(),
        Some(torn.len() as u64)
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"");
    std::fs::write(&path, good).unwrap();
    assert_eq!(Audit::open(&path).unwrap().repaired(), None);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), good);
}

#[test]
fn a_torn_tail_longer_than_the_scan_buffer_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let mut text = b"{\"a\":1}\n".to_vec();
    text.extend(std::iter::repeat_n(0u8, 200_000)); // a power loss's zeros
    std::fs::write(&path, &text).unwrap();
    assert_eq!(Audit::open(&path).unwrap().repaired(), Some(200_000));
    assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":1}\n");
}

#[test]
fn unicode_line_breaks_are_escaped_and_the_line_still_parses() {
    let disk = Disk::default();
    disk.set_budget(usize::MAX);
    let audit = Audit::with_sink(Path::new("audit.jsonl"), Box::new(disk.clone()));
    let forged = "a\u{2028}{\"event\":\"derive.issued\"}\u{2029}b\u{85}c\u{202e}d\u{7f}\u{9f}e";
    audit.record(&event(forged)).unwrap();
    let text = disk.text();
    for c in [
        '\u{2028}', '\u{2029}', '\u{85}', '\u{202e}', '\u{7f}', '\u{9f}',
    ] {
        assert!(!text.contains(c), "{c:?} written raw: {text:?}");
    }
    assert!(
        text.contains("\\u2028") && text.contains("\\u0085"),
        "{text}"
    );
    let got = lines(&text);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["tool"], forged, "the escape means the same text");
    // Positive control: ordinary non-ASCII is written as it is.
    audit.record(&event("café ünïcode")).unwrap();
    assert!(disk.text().contains("café ünïcode"));
}

#[test]
fn opaque_values_are_keyed_and_carry_only_a_length() {
    let a = Audit::with_sink(Path::new("x"), Box::new(Disk::default()))
        .with_value_key(&Audit::derive_key(&SecretBytes::new(vec![1; 32])));
    let b = Audit::with_sink(Path::new("x"), Box::new(Disk::default()))
        .with_value_key(&Audit::derive_key(&SecretBytes::new(vec![2; 32])));
    let secret = "https://rs.example/?token=ghp_secret";
    let o = a.opaque(secret);
    assert_eq!(o.len, secret.len());
    assert_eq!(o.hmac_sha256.len(), 64);
    assert_eq!(o, a.opaque(secret), "stable within an instance");
    assert_ne!(o, b.opaque(secret), "keyed per instance");
    assert_ne!(o, a.opaque("https://rs.example/?token=ghp_secreT"));
    // Not the unkeyed hash of the value.
    assert_ne!(
        o.hmac_sha256,
        crate::base::jose::sha256_hex(secret.as_bytes())
    );
}
