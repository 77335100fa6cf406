//! The echo guard, the last check of a call (docs/PROXY.md, "The echo
//! guard"): the provider's answer is scanned for the provider's own access
//! and refresh tokens, headers and body, so that a prompt-injected tool
//! cannot make the provider echo the person's token back to it.

use bytes::Bytes;

/// Scans an answer for the provider's tokens across chunk boundaries: it
/// holds back the last (longest token - 1) bytes, so a token split between
/// two chunks is still seen whole before any of it is released.
///
/// Each chunk is scanned once (SIMD substring search) and copied once; only
/// the held-back tail and the few bytes across the boundary are scanned
/// again, so a large answer costs about one pass per token. A long chunk
/// is searched in blocks of [`SCAN_BLOCK`] bytes, every token in one block
/// before the next, so that only the first search reads a block from
/// memory farther than the L1 cache.
///
/// The SIMD searchers cost more to build than a short answer costs to
/// scan (about 70 000 instructions for two tokens, counted with
/// `proxy_bench --callgrind`: most of the guard's cost on a small call),
/// so they are built on the first scan of more than
/// [`SHORT_SCAN`] bytes; shorter scans compare at each place the token's
/// first byte occurs, at most `SHORT_SCAN` times the token's length.
pub(crate) struct EchoGuard {
    /// The provider's tokens: wiped when the guard goes, never printed.
    secrets: Vec<zeroize::Zeroizing<Vec<u8>>>,
    finders: std::cell::OnceCell<Vec<memchr::memmem::Finder<'static>>>,
    hold: usize,
    /// The held-back tail: at most `hold` bytes, already scanned.
    pending: Vec<u8>,
    /// Scratch for the seam between the tail and the next chunk.
    edge: Vec<u8>,
}

impl std::fmt::Debug for EchoGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EchoGuard")
            .field("secrets", &self.secrets.len())
            .field("hold", &self.hold)
            .finish_non_exhaustive()
    }
}

/// The longest scan the echo guard makes without its SIMD searchers.
const SHORT_SCAN: usize = 1024;

/// The bytes of a long chunk that the echo guard searches for every token
/// before it moves on (plus the overlap): well inside a 48 KiB L1 cache.
const SCAN_BLOCK: usize = 16 * 1024;

/// Whether `needle` (not empty) occurs in the short `hay`: a comparison at
/// each place its first byte occurs.
fn short_find(hay: &[u8], needle: &[u8]) -> bool {
    let (Some(&first), Some(last)) = (needle.first(), hay.len().checked_sub(needle.len())) else {
        return false;
    };
    memchr::memchr_iter(first, &hay[..=last]).any(|i| hay[i..].starts_with(needle))
}

/// A provider token was found in the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Echo;

impl EchoGuard {
    /// A guard for these secrets (empty ones are ignored).
    pub(crate) fn new(secrets: &[&str]) -> EchoGuard {
        let secrets: Vec<zeroize::Zeroizing<Vec<u8>>> = secrets
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| zeroize::Zeroizing::new(s.as_bytes().to_vec()))
            .collect();
        let hold = secrets.iter().map(|s| s.len()).max().unwrap_or(1) - 1;
        EchoGuard {
            secrets,
            finders: std::cell::OnceCell::new(),
            hold,
            pending: Vec::new(),
            edge: Vec::new(),
        }
    }

    /// Whether `bytes` holds one of the secrets.
    pub(crate) fn contains(&self, bytes: &[u8]) -> bool {
        if bytes.len() <= SHORT_SCAN {
            return self.secrets.iter().any(|s| short_find(bytes, s));
        }
        let finders = self.finders.get_or_init(|| {
            self.secrets
                .iter()
                .map(|s| memchr::memmem::Finder::new(&s[..]).into_owned())
                .collect()
        });
        // Block by block, every token's search on a block before the next
        // block: the second search reads the block from the L1 cache, not
        // the whole chunk (up to about 400 KiB, hyper's largest read) again
        // from L2. A block overlaps the next by `hold` bytes, so a token
        // that starts in a block (at most `hold + 1` long) ends in it.
        let mut start = 0;
        while start < bytes.len() {
            let block = &bytes[start..(start + SCAN_BLOCK + self.hold).min(bytes.len())];
            if finders.iter().any(|n| n.find(block).is_some()) {
                return true;
            }
            start += SCAN_BLOCK;
        }
        false
    }

    /// Takes the next chunk; returns what can be released, in order: the
    /// bulk of a long chunk is released as a slice of it, not copied.
    pub(crate) fn push(&mut self, chunk: Bytes) -> Result<[Bytes; 2], Echo> {
        if chunk.len() <= self.hold {
            // A short chunk: join it to the tail and scan the (short) whole.
            self.pending.extend_from_slice(&chunk);
            if self.contains(&self.pending) {
                return Err(Echo);
            }
            let cut = self.pending.len().saturating_sub(self.hold);
            let out = Bytes::copy_from_slice(&self.pending[..cut]);
            self.pending.drain(..cut);
            return Ok([out, Bytes::new()]);
        }
        // A token in `pending ++ chunk` lies in `chunk`, or starts in the
        // tail (at most `hold` bytes, each token at most `hold + 1` long)
        // and so ends within the chunk's first `hold` bytes; one wholly in
        // the tail was refused when the tail was scanned.
        if self.contains(&chunk) {
            return Err(Echo);
        }
        let tail = Bytes::from(std::mem::take(&mut self.pending));
        if !tail.is_empty() {
            self.edge.clear();
            self.edge.extend_from_slice(&tail);
            self.edge.extend_from_slice(&chunk[..self.hold]);
            if self.contains(&self.edge) {
                return Err(Echo);
            }
        }
        let keep = chunk.len() - self.hold;
        self.pending.extend_from_slice(&chunk[keep..]);
        Ok([tail, chunk.slice(..keep)])
    }

    /// The end of the answer: the bytes held back.
    pub(crate) fn finish(self) -> Bytes {
        Bytes::from(self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_guard_sees_a_token_split_across_chunks() {
        let mut g = EchoGuard::new(&["SECRET-TOKEN", "REFRESH"]);
        let a = g.push(Bytes::from_static(b"hello SECRE")).unwrap();
        // The held-back tail could start a token: it is not released.
        assert!(a.iter().all(Bytes::is_empty), "{a:?}");
        assert_eq!(g.push(Bytes::from_static(b"T-TOKEN and more")), Err(Echo));
        // Positive control: the same bytes without the token pass whole.
        let mut g = EchoGuard::new(&["SECRET-TOKEN"]);
        let mut out = Vec::new();
        for c in [&b"hello SECRE"[..], b"T-TOKEX and more", b"!"] {
            for b in g.push(Bytes::copy_from_slice(c)).unwrap() {
                out.extend_from_slice(&b);
            }
        }
        out.extend_from_slice(&g.finish());
        assert_eq!(out, b"hello SECRET-TOKEX and more!");
    }

    #[test]
    fn echo_guard_never_prints_its_secrets() {
        let mut g = EchoGuard::new(&["gho_SECRETTOKEN", "ghr_REFRESH"]);
        // Built both ways: the short scan, and the SIMD searchers.
        assert!(g.contains(b"...gho_SECRETTOKEN..."));
        assert!(g.contains(&[b"x".repeat(2000), b"ghr_REFRESH".to_vec()].concat()));
        let _ = g.push(Bytes::from_static(b"an answer"));
        // Only how many secrets it holds and how much it holds back, not
        // their bytes in any form (a derived Debug would list them).
        assert_eq!(format!("{g:?}"), "EchoGuard { secrets: 2, hold: 14, .. }");
    }

    /// Every split of an answer into chunks: the guard refuses exactly the
    /// answers that hold a token, and otherwise releases them unchanged.
    /// Short chunks and answers take the guard's short scan only.
    #[test]
    fn echo_guard_agrees_with_a_whole_answer_search_for_every_split() {
        agrees_with_a_whole_answer_search(40, 15, 3000, 0x9e37_79b9_7f4a_7c15);
    }

    /// The same with answers of up to 12 KiB in chunks of up to 3 KiB: scans
    /// on both sides of `SHORT_SCAN`, so the SIMD searchers take part.
    #[test]
    fn echo_guard_agrees_with_a_whole_answer_search_across_its_two_scans() {
        agrees_with_a_whole_answer_search(3000, 3000, 400, 0x2545_f491_4f6c_dd1d);
    }

    /// A token at every place around the blocks of a long scan, and the
    /// same scan without it: found exactly when it is there.
    #[test]
    fn echo_guard_finds_a_token_across_its_scan_blocks() {
        let secrets = ["tok-ABCDEFG", "rf-XYZ"];
        let g = EchoGuard::new(&secrets);
        let clean = vec![b'x'; 3 * SCAN_BLOCK + 100];
        assert!(!g.contains(&clean), "a scan without a token finds none");
        for secret in secrets {
            let s = secret.as_bytes();
            for seam in [SCAN_BLOCK, 2 * SCAN_BLOCK, 3 * SCAN_BLOCK] {
                for at in seam - s.len() - 2..=seam + 2 {
                    let mut hay = clean.clone();
                    hay[at..at + s.len()].copy_from_slice(s);
                    assert!(g.contains(&hay), "{secret} at {at} (seam {seam})");
                    // The token's last byte changed: no longer there.
                    hay[at + s.len() - 1] = b'x';
                    assert!(!g.contains(&hay), "{secret} cut at {at}");
                }
            }
        }
    }

    /// Answers of up to about 200 KiB in chunks of up to 80 KiB: chunks
    /// searched in several blocks.
    #[test]
    fn echo_guard_agrees_with_a_whole_answer_search_over_long_chunks() {
        agrees_with_a_whole_answer_search(50_000, 80_000, 40, 0x6a09_e667_f3bc_c908);
    }

    fn agrees_with_a_whole_answer_search(pieces: u64, chunk: u64, cases: usize, seed: u64) {
        let secrets = ["tok-ABCDEFG", "rf-XYZ"];
        let naive = |hay: &[u8]| {
            secrets
                .iter()
                .any(|s| hay.windows(s.len()).any(|w| w == s.as_bytes()))
        };
        // A small xorshift: the same cases on every run.
        let mut x: u64 = seed;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let alphabet = b"tok-ABCDEFGrf-XYZ ";
        let (mut found, mut clean) = (0, 0);
        let mut long_scans = 0;
        for _ in 0..cases {
            // Random bytes of the tokens' alphabet, with now and then a
            // token, or a token's beginning, planted whole.
            let mut answer: Vec<u8> = Vec::new();
            for _ in 0..(next() % pieces) {
                match next() % (30 * pieces / 40).max(30) {
                    0 => answer.extend_from_slice(secrets[(next() % 2) as usize].as_bytes()),
                    1 => {
                        let s = secrets[(next() % 2) as usize].as_bytes();
                        answer.extend_from_slice(&s[..(next() as usize % s.len())]);
                    }
                    _ => answer.push(alphabet[(next() % alphabet.len() as u64) as usize]),
                }
            }
            let mut g = EchoGuard::new(&secrets);
            let mut out = Vec::new();
            let mut refused = false;
            let mut rest = &answer[..];
            while !rest.is_empty() {
                let n = 1 + (next() % chunk) as usize;
                let (c, r) = rest.split_at(n.min(rest.len()));
                rest = r;
                match g.push(Bytes::copy_from_slice(c)) {
                    Ok(released) => {
                        for b in released {
                            out.extend_from_slice(&b);
                        }
                    }
                    Err(Echo) => {
                        refused = true;
                        break;
                    }
                }
            }
            long_scans += usize::from(g.finders.get().is_some());
            if !refused {
                out.extend_from_slice(&g.finish());
            }
            assert_eq!(
                refused,
                naive(&answer),
                "{:?}",
                String::from_utf8_lossy(&answer)
            );
            if refused {
                found += 1;
            } else {
                assert_eq!(out, answer, "released unchanged");
                clean += 1;
            }
        }
        // Both kinds of answer were drawn, and the SIMD searchers were
        // built exactly when chunks could be longer than the short scan.
        assert!(found > cases / 30 && clean > cases / 30, "{found} {clean}");
        assert_eq!(
            long_scans > cases / 4,
            chunk > SHORT_SCAN as u64,
            "{long_scans}"
        );
    }
}
