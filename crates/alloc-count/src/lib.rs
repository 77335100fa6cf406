//! A counting global allocator for credbroker's benchmarks
//! (docs/PERFORMANCE.md, "Allocations per derive"): the broker binary and
//! the floors (examples/derive_floor.rs, examples/proxy_bench.rs) install
//! it only when built with the `alloc-count` feature, which is off by
//! default and never on in a shipped build (scripts/release builds
//! without it).
//!
//! What it counts: every call that asks the system allocator for memory
//! (`alloc`, `alloc_zeroed` and `realloc`, a growing `Vec` included), and
//! the bytes asked for. Frees are not counted. Two relaxed atomic adds per
//! call: the CPU figures of a run with it on are not the broker's (a few
//! nanoseconds a call), so the benchmarks take CPU from runs without it.
//!
//! How the counts are read ([`report_on_signal`]): with
//! `CREDBROKER_ALLOC_COUNTS=DIR` in its environment, a process writes
//! `DIR/PID` (one line: a sequence number, the calls, the bytes) each time
//! it receives `SIGUSR2`, from a thread of its own that waits for the
//! signal. examples/loadgen.rs (`--alloc-counts DIR`) signals the broker
//! or the floor before and after each window and divides the difference
//! by the derives it answered.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

static CALLS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

/// The system allocator, counting (see the crate docs). Install it with
/// `#[global_allocator] static A: Counting = Counting;`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counting;

fn count(size: usize) {
    CALLS.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(size as u64, Ordering::Relaxed);
}

// Safety: every method passes its arguments unchanged to `System`, whose
// `GlobalAlloc` contract is the one the caller upholds and the one we
// promise; the counting before it touches only two atomics and never
// allocates, so it cannot re-enter the allocator.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // Safety: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // Safety: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Safety: `ptr` came from this allocator, that is from `System`,
        // with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // Safety: as `dealloc`, and `new_size` as the caller gave it.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// The calls counted so far and the bytes they asked for.
pub fn counts() -> (u64, u64) {
    (CALLS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed))
}

/// The environment variable naming the directory the counts are written
/// to.
pub const ENV: &str = "CREDBROKER_ALLOC_COUNTS";

/// With [`ENV`] set: blocks `SIGUSR2` in the calling thread (so in every
/// thread it starts afterwards: call it first in `main`, before any other
/// thread exists) and starts a thread that, on each `SIGUSR2`, writes
/// `DIR/PID` anew (written aside and renamed, so a reader never sees half
/// a line): `SEQ CALLS BYTES`, SEQ counting the reports from 1. Without
/// it, nothing. Returns whether it started.
pub fn report_on_signal() -> bool {
    use nix::sys::signal::{SigSet, Signal};
    let Some(dir) = std::env::var_os(ENV) else {
        return false;
    };
    let mut set = SigSet::empty();
    set.add(Signal::SIGUSR2);
    if set.thread_block().is_err() {
        return false;
    }
    let dir = std::path::PathBuf::from(dir);
    let pid = std::process::id();
    let spawned = std::thread::Builder::new()
        .name("alloc-counts".into())
        .spawn(move || {
            let (path, aside) = (dir.join(pid.to_string()), dir.join(format!(".{pid}")));
            let mut seq = 0u64;
            while set.wait().is_ok() {
                seq += 1;
                let (calls, bytes) = counts();
                let line = format!("{seq} {calls} {bytes}\n");
                if std::fs::write(&aside, line).is_ok() {
                    let _ = std::fs::rename(&aside, &path);
                }
            }
        });
    spawned.is_ok()
}
