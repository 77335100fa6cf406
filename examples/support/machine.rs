//! What a wake-up costs on this machine: the benchmarks print it beside
//! their ratios (examples/loadgen.rs, examples/proxy_bench.rs), since a
//! served request that finds its thread asleep pays one, and what it costs
//! is the machine's, not the code's (docs/PERFORMANCE.md, "Wake-ups of the
//! machine"). Included with `#[path]`, like `connect.rs`.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// The CPUs this thread may run on.
fn allowed() -> Vec<usize> {
    let Ok(set) = sched_getaffinity(Pid::from_raw(0)) else {
        return Vec::new();
    };
    (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect()
}

/// Pins the calling thread to `cpu` (best effort: unpinned on failure).
fn pin(cpu: usize) {
    let mut set = CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = sched_setaffinity(Pid::from_raw(0), &set);
    }
}

/// Microseconds per round trip of one byte between two threads over a
/// Unix socket pair, `n` round trips, the threads pinned to `cpus` (the
/// same CPU twice: no wake-up crosses CPUs; two CPUs: each round trip
/// wakes a thread on the other CPU twice, as `perf bench sched pipe`
/// does). The calling thread's affinity is restored at the end.
fn round_trip_us(cpus: (usize, usize), n: usize) -> Option<f64> {
    let before = sched_getaffinity(Pid::from_raw(0)).ok()?;
    let (mut a, mut b) = UnixStream::pair().ok()?;
    let echo = std::thread::spawn(move || {
        pin(cpus.1);
        let mut byte = [0u8; 1];
        for _ in 0..n {
            if b.read_exact(&mut byte).is_err() || b.write_all(&byte).is_err() {
                return;
            }
        }
    });
    pin(cpus.0);
    let mut byte = [7u8; 1];
    let start = Instant::now();
    let mut ok = true;
    for _ in 0..n {
        if a.write_all(&byte).is_err() || a.read_exact(&mut byte).is_err() {
            ok = false;
            break;
        }
    }
    let took = start.elapsed();
    let _ = sched_setaffinity(Pid::from_raw(0), &before);
    let _ = echo.join();
    ok.then(|| took.as_secs_f64() * 1e6 / n as f64)
}

/// One line on the machine's wake-ups: a round trip between two threads
/// on two CPUs and on one, from the CPUs this process may use (when it
/// is pinned to one CPU, the first and the second CPU of the machine).
pub(crate) fn wakeup_line() -> String {
    let mut cpus = allowed();
    if cpus.len() < 2 {
        cpus = vec![0, 1];
    }
    let (x, y) = (cpus[0], cpus[1]);
    // Short warm-up, then the counted runs.
    let _ = round_trip_us((x, y), 200);
    match (round_trip_us((x, y), 5_000), round_trip_us((x, x), 20_000)) {
        (Some(two), Some(one)) => format!(
            "machine: a thread woken on another CPU and back {two:.1} us a round trip (CPUs {x} and {y}), on one CPU {one:.1} us ({:.1} x)",
            two / one
        ),
        _ => "machine: the wake-up round trip could not be measured".to_string(),
    }
}
