//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` and `tracestate` headers as untrusted input, the ids this
//! broker makes, and the ratio sampler.
//!
//! Parsing is strict: version `00` exactly 55 characters (a later version
//! is read by its first four fields, as the spec asks), lowercase hex, no
//! all-zero id. Anything else is no context at all.

/// A span's place in a trace: what a `traceparent` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpanContext {
    /// The trace id (16 bytes, never all zero).
    pub(crate) trace_id: [u8; 16],
    /// The span id (8 bytes, never all zero).
    pub(crate) span_id: [u8; 8],
    /// The `sampled` flag.
    pub(crate) sampled: bool,
}

impl SpanContext {
    /// The `traceparent` header value for this span.
    pub(crate) fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            if self.sampled { "01" } else { "00" }
        )
    }

    /// The trace id as 32 lowercase hex digits (the audit's `trace_id`).
    pub(crate) fn trace_hex(&self) -> String {
        hex::encode(self.trace_id)
    }
}

fn hex_exact<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).ok()?;
    (out != [0u8; N]).then_some(out)
}

/// Parses a `traceparent` value; `None` when it is not one.
pub(crate) fn parse_traceparent(value: &str) -> Option<SpanContext> {
    let mut parts = value.split('-');
    let version = parts.next()?;
    let trace = parts.next()?;
    let span = parts.next()?;
    let flags = parts.next()?;
    let rest = parts.next();
    let version_ok = version.len() == 2
        && version
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && version != "ff";
    if !version_ok {
        return None;
    }
    // Version 00 has exactly four fields; a later version may add some.
    if version == "00" && rest.is_some() {
        return None;
    }
    let flags = if flags.len() == 2 && flags.bytes().all(|b| b.is_ascii_hexdigit()) {
        u8::from_str_radix(flags, 16).ok()?
    } else {
        return None;
    };
    Some(SpanContext {
        trace_id: hex_exact(trace)?,
        span_id: hex_exact(span)?,
        sampled: flags & 1 == 1,
    })
}

/// The `tracestate` value kept for a trusted parent: its list members in
/// order, as many whole members as fit in `max` bytes (joined by `,`), each
/// of the spec's form `key=value` with printable ASCII only. `None` when
/// nothing is kept.
pub(crate) fn cap_tracestate(value: &str, max: usize) -> Option<String> {
    let mut out = String::new();
    for member in value.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let (key, val) = member.split_once('=')?;
        let key_ok = !key.is_empty()
            && key.len() <= 256
            && key
                .bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/' | b'@'));
        let val_ok = !val.is_empty()
            && val.len() <= 256
            && val
                .bytes()
                .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=');
        if !key_ok || !val_ok {
            return None;
        }
        let extra = member.len() + usize::from(!out.is_empty());
        if out.len() + extra > max {
            break;
        }
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(member);
    }
    (!out.is_empty()).then_some(out)
}

/// The random bytes a thread keeps for ids: aws-lc's generator is asked
/// for this many at once (each call sets its key up again and takes its
/// locks: about 2,400 instructions under callgrind, for 8 bytes or for
/// 256), so a span's ids cost a copy, not a call.
const POOL: usize = 256;

thread_local! {
    /// Unused bytes from the last fill, from the index it holds on.
    static IDS: std::cell::RefCell<(usize, [u8; POOL])> =
        const { std::cell::RefCell::new((POOL, [0u8; POOL])) };
}

/// Fresh random bytes for an id (never all zero: a failed or zero fill is
/// replaced by a counter, so ids stay distinct), from this thread's pool.
pub(crate) fn random_id<const N: usize>() -> [u8; N] {
    use std::sync::atomic::{AtomicU64, Ordering};
    static FALLBACK: AtomicU64 = AtomicU64::new(1);
    let mut out = [0u8; N];
    let filled = IDS
        .try_with(|pool| {
            let mut pool = pool.borrow_mut();
            let (next, bytes) = &mut *pool;
            if *next + N > POOL {
                aws_lc_rs::rand::fill(bytes).ok()?;
                *next = 0;
            }
            out.copy_from_slice(&bytes[*next..*next + N]);
            *next += N;
            Some(())
        })
        .ok()
        .flatten()
        .is_some();
    if !filled || out == [0u8; N] {
        let n = FALLBACK.fetch_add(1, Ordering::Relaxed).to_be_bytes();
        let k = n.len().min(N);
        out[N - k..].copy_from_slice(&n[n.len() - k..]);
    }
    out
}

/// The ratio sampler of a new trace (OpenTelemetry's `TraceIdRatioBased`):
/// sampled when the trace id's last 8 bytes, read as a big-endian number,
/// fall under `ratio` of the range, so every service with the same ratio
/// decides alike for one trace.
pub(crate) fn sample(trace_id: &[u8; 16], ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    let bound = (ratio * (1u64 << 63) as f64) as u64;
    (u64::from_be_bytes(low) >> 1) < bound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_parses_strictly() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = parse_traceparent(ok).unwrap();
        assert!(c.sampled);
        assert_eq!(c.traceparent(), ok);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
        // A later version: its first four fields are read.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what";
        assert!(!parse_traceparent(later).unwrap().sampled);
    }

    #[test]
    fn tracestate_keeps_whole_members_under_the_cap() {
        assert_eq!(cap_tracestate("a=1,b=2,c=3", 7).as_deref(), Some("a=1,b=2"));
        assert_eq!(cap_tracestate("a=1,b=2", 100).as_deref(), Some("a=1,b=2"));
        assert_eq!(cap_tracestate("a=1", 0), None);
        assert_eq!(cap_tracestate("A=1", 100), None);
        assert_eq!(cap_tracestate("a=\u{7f}", 100), None);
        assert_eq!(cap_tracestate("novalue", 100), None);
    }

    #[test]
    fn ids_from_the_pool_are_distinct_across_refills() {
        let mut seen = std::collections::HashSet::new();
        // Several refills of the pool, ids of both sizes interleaved (a
        // 16-byte id never straddles the end of a fill: it takes a new one).
        for _ in 0..3 * POOL / 8 {
            assert!(seen.insert(random_id::<8>().to_vec()));
            let t = random_id::<16>();
            assert_ne!(t, [0u8; 16]);
            assert!(seen.insert(t.to_vec()));
        }
    }

    #[test]
    fn ratio_sampler_bounds() {
        let id = random_id::<16>();
        assert!(sample(&id, 1.0));
        assert!(!sample(&id, 0.0));
        let n = (0..2000)
            .filter(|_| sample(&random_id::<16>(), 0.25))
            .count();
        assert!((300..700).contains(&n), "{n}");
    }
}
