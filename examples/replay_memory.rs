//! Memory of the DPoP replay cache, measured (docs/PERFORMANCE.md,
//! "Memory"): the process's resident set (VmRSS) before the cache is made,
//! after, and after filling it at the highest rate the global derive limit
//! allows for three `jti` lifetimes (simulated time, so it takes seconds).
//!
//! `cargo run --release --example replay_memory [BYTES]` (default: the
//! default `dpop.replay_cache_bytes`). It counts resident pages rather than
//! allocator calls: the crate forbids `unsafe`, which a counting global
//! allocator needs. The cache allocates its slots once, in one block, so
//! the two agree up to a page.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use credbroker::internals::config::{max_derive_rate, DEFAULT_REPLAY_CACHE_BYTES};
use credbroker::internals::dpop::{ReplayCache, MAX_JTI_LIFETIME, REPLAY_SLOT_BYTES};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap()
}

fn main() {
    let bytes: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("BYTES must be a number"))
        .unwrap_or(DEFAULT_REPLAY_CACHE_BYTES);
    let before = rss_kib();
    let cache = ReplayCache::with_bytes(bytes);
    let made = rss_kib();
    let rate = max_derive_rate(cache.capacity()) as usize;
    let now0: i64 = 1_700_000_000;
    let mut key = [0u8; 16];
    let mut refused = 0usize;
    let mut peak_len = 0;
    for second in 0..3 * MAX_JTI_LIFETIME {
        let now = now0 + second;
        for _ in 0..rate {
            aws_lc_rs::rand::fill(&mut key).unwrap();
            // Every entry kept its longest: the worst case for memory.
            if cache.insert(key, now + MAX_JTI_LIFETIME, now).is_err() {
                refused += 1;
            }
        }
        peak_len = peak_len.max(cache.len());
    }
    let after = rss_kib();
    println!(
        "budget {bytes} bytes; {} entries; slots {} bytes ({REPLAY_SLOT_BYTES} bytes each)",
        cache.capacity(),
        cache.slot_bytes()
    );
    println!("global derive limit it implies: {rate}/s (a jti kept up to {MAX_JTI_LIFETIME} s)");
    println!(
        "VmRSS: {before} KiB before, {made} KiB with the cache made (+{} KiB), {after} KiB after {} inserts over {} simulated s (+{} KiB more); at most {peak_len} entries live; {refused} refused",
        made - before,
        rate as i64 * 3 * MAX_JTI_LIFETIME,
        3 * MAX_JTI_LIFETIME,
        after.saturating_sub(made)
    );
    println!(
        "resident bytes per entry of capacity: {:.1}",
        (after - before) as f64 * 1024.0 / cache.capacity() as f64
    );
}
