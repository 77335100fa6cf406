//! The derives a proxied call continues: the span of each traced derive
//! by the SHA-256 of its token's `jti`, until the token expires, so that
//! the call made with the token joins the derive's trace (the tool's own
//! `traceparent` is only linked), with the derive's trusted `tracestate`
//! (already capped). Memory only, per instance: a call served
//! by another replica starts a trace of its own. Bounded: past
//! [`CAPACITY`] the oldest entry goes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::SpanContext;

/// A remembered span: its context and trace state.
pub(super) type Remembered = (SpanContext, Option<Arc<str>>);

/// The most derives remembered.
pub(super) const CAPACITY: usize = 4096;

#[derive(Debug, Default)]
pub(super) struct Recent {
    by_jti: HashMap<String, (Remembered, i64)>,
    order: VecDeque<String>,
}

impl Recent {
    pub(super) fn insert(&mut self, jti_sha256: &str, ctx: Remembered, until: i64) {
        while self.order.len() >= CAPACITY {
            if let Some(old) = self.order.pop_front() {
                self.by_jti.remove(&old);
            }
        }
        if self
            .by_jti
            .insert(jti_sha256.to_string(), (ctx, until))
            .is_none()
        {
            self.order.push_back(jti_sha256.to_string());
        }
    }

    pub(super) fn get(&self, jti_sha256: &str, now: i64) -> Option<Remembered> {
        match self.by_jti.get(jti_sha256) {
            Some((ctx, until)) if *until >= now => Some(ctx.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_expiring() {
        let ctx = SpanContext {
            trace_id: [1; 16],
            span_id: [2; 8],
            sampled: true,
        };
        let ctx = (ctx, Some(Arc::from("k=v")));
        let mut r = Recent::default();
        r.insert("a", ctx.clone(), 100);
        assert_eq!(r.get("a", 100), Some(ctx.clone()));
        assert_eq!(r.get("a", 101), None);
        for i in 0..CAPACITY {
            r.insert(&i.to_string(), ctx.clone(), 100);
        }
        assert_eq!(r.get("a", 0), None, "the oldest went");
        assert_eq!(r.by_jti.len(), CAPACITY);
        assert_eq!(r.get(&(CAPACITY - 1).to_string(), 0), Some(ctx));
    }
}
