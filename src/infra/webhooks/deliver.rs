//! One subscription's delivery loop.
//!
//! It reads the audit file from the stored cursor in batches, sends the
//! events the subscription wants in windows of `max_concurrency` (each
//! event with its own retries), and stores the cursor after each window:
//! an event is sent again only if the process stopped between its answer
//! and that write (at least once on the wire, under the same
//! `webhook-id`).
//!
//! Retries: exponential backoff from 1 s, doubling to at most 5 minutes,
//! with full jitter over its upper half; `Retry-After` (seconds) on 429 and
//! 503 is waited for at least, cut to `max_retry_after`. A receiver that
//! answers with a redirect or a 4xx other than 408 and 429 three times has
//! the event dead-lettered (kept in the store for `credbroker events
//! redeliver`); an unreachable or failing receiver is retried until the
//! event passes the backlog cap (`max_backlog_age`, or more than
//! `max_backlog_bytes` of the audit file behind it), when it is dropped,
//! counted, and one `webhook.events_dropped` event records each run of
//! drops.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::sign::Signer;
use super::tail::{Line, Position, Tail};
use super::{envelope, DeadLetter, Hub, Sub};
use crate::infra::events::{Event, Kind};

/// How often an idle loop looks for new lines.
const POLL: Duration = Duration::from_millis(200);
/// The most bytes of a receiver's answer read (the rest is not).
const ANSWER_CAP: usize = 4096;
/// Answers that refuse an event before it is dead-lettered.
const PERMANENT_TRIES: u32 = 3;
/// Retries of one dead letter per redelivery request.
const REDELIVER_TRIES: u32 = 5;

/// An event on its way.
#[derive(Debug, Clone)]
struct Item {
    id: String,
    time: i64,
    body: Arc<Vec<u8>>,
    line: String,
    /// Where its line starts, and in which file (for the bytes behind it).
    ino: u64,
    start: u64,
}

/// How one event's delivery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Delivered,
    Dropped,
    DeadLettered,
    Stopped,
}

/// What a receiver's answer means.
#[derive(Debug)]
enum Answer {
    Delivered,
    /// A redirect or a 4xx other than 408 and 429.
    Permanent(String),
    /// 429 or 503 with `Retry-After`.
    RetryAfter(Duration, String),
    /// No answer in time, no connection, a 5xx, 408, a 429 without
    /// `Retry-After`.
    Transient(String),
}

/// What the window's tasks share.
#[derive(Clone)]
struct Ctx {
    hub: Arc<Hub>,
    sub: Arc<Sub>,
    client: reqwest::Client,
    signer: Arc<Signer>,
    stop: watch::Receiver<bool>,
}

/// Runs the loop until `stop` changes.
pub(super) async fn run(hub: Arc<Hub>, sub: Arc<Sub>, mut stop: watch::Receiver<bool>) {
    let name = sub.cfg.name.clone();
    let Some(mut tail) = start(&hub, &sub, &mut stop).await else {
        return;
    };
    let client = match crate::base::http::outbound_client()
        .timeout(sub.cfg.timeout)
        .connect_timeout(sub.cfg.timeout.min(Duration::from_secs(5)))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("credbroker/", env!("CARGO_PKG_VERSION")))
        .build()
    {
        Ok(c) => c,
        Err(_) => {
            tracing::error!(subscription = %name, "the webhook client cannot be built; nothing is delivered");
            return;
        }
    };
    let mut drops = Drops::default();
    loop {
        if *stop.borrow() {
            break;
        }
        let (t, read) = blocking(move || {
            let mut t = tail;
            let r = t.read(256);
            (t, r)
        })
        .await;
        tail = t;
        let lines = match read {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(subscription = %name, error = %e, "cannot read the audit file for delivery; trying again");
                Vec::new()
            }
        };
        if tail.lost() {
            tracing::warn!(subscription = %name, "a rotated audit file holding undelivered events is gone (deleted or compressed); its events are lost to this subscription");
        }
        if lines.is_empty() {
            drops.flush(&hub, &sub);
            gauges(&hub, &sub, &mut tail);
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = sub.redeliver.notified() => {
                    if let Some(signer) = signer(&sub).await {
                        let ctx = Ctx { hub: hub.clone(), sub: sub.clone(), client: client.clone(), signer, stop: stop.clone() };
                        redeliver(&ctx).await;
                    }
                }
                _ = stop.changed() => break,
            }
            continue;
        }
        let Some(signer) = signer(&sub).await else {
            // The keys cannot be read: nothing is sent unsigned; the same
            // lines are read again after a pause.
            tail = reopen(&hub, &sub, tail).await;
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = stop.changed() => break,
            }
            continue;
        };
        let ctx = Ctx {
            hub: hub.clone(),
            sub: sub.clone(),
            client: client.clone(),
            signer,
            stop: stop.clone(),
        };
        if !batch(&ctx, &tail, lines, &mut drops).await {
            break;
        }
    }
    drops.flush(&hub, &sub);
}

/// Loads (or starts) the cursor and opens the file at it; `None` when
/// stopped first.
async fn start(hub: &Arc<Hub>, sub: &Arc<Sub>, stop: &mut watch::Receiver<bool>) -> Option<Tail> {
    loop {
        let (h, s) = (hub.clone(), sub.clone());
        let opened = blocking(move || -> Result<Tail, String> {
            let pos = h.load_cursor(&s.cfg.name).map_err(|e| e.to_string())?;
            let fresh = pos.is_none();
            let t = Tail::open(h.audit_path(), pos).map_err(|e| e.to_string())?;
            if fresh {
                h.save_cursor(&s.cfg.name, t.position())
                    .map_err(|e| e.to_string())?;
            }
            Ok(t)
        })
        .await;
        match opened {
            Ok(t) => {
                let dead = hub
                    .dead_letters(&sub.cfg.name)
                    .map_or(0, |d| d.len() as u64);
                hub.metrics
                    .dead_letters
                    .with_label_values(&[&sub.cfg.name])
                    .set(i64::try_from(dead).unwrap_or(i64::MAX));
                sub.status
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .dead_letters = dead;
                return Some(t);
            }
            Err(e) => {
                tracing::warn!(subscription = %sub.cfg.name, error = %e, "cannot start webhook delivery (the store or the audit file); trying again");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                    _ = stop.changed() => return None,
                }
            }
        }
    }
}

/// Opens the file again at the stored cursor (lines read but not sent are
/// read again).
async fn reopen(hub: &Arc<Hub>, sub: &Arc<Sub>, tail: Tail) -> Tail {
    let (h, s) = (hub.clone(), sub.clone());
    blocking(move || {
        match h
            .load_cursor(&s.cfg.name)
            .ok()
            .flatten()
            .map(|p| Tail::open(h.audit_path(), Some(p)))
        {
            Some(Ok(t)) => t,
            _ => tail,
        }
    })
    .await
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    // The closure only does file and store I/O; a panic there is a bug,
    // and re-raising it keeps it visible.
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// The subscription's keys, read now (a rotation needs no restart).
async fn signer(sub: &Arc<Sub>) -> Option<Arc<Signer>> {
    let s = sub.clone();
    match blocking(move || Signer::load(&s.cfg)).await {
        Ok(signer) => {
            sub.status
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .public_key = signer.public_key();
            Some(Arc::new(signer))
        }
        Err(e) => {
            tracing::error!(subscription = %sub.cfg.name, error = %e, "the webhook's signing key cannot be used; nothing is delivered until it can");
            sub.status
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .last_failure = Some("signing key unusable".into());
            None
        }
    }
}

fn gauges(hub: &Hub, sub: &Sub, tail: &mut Tail) {
    let lines = tail.pending_lines().unwrap_or(0);
    hub.metrics
        .backlog
        .with_label_values(&[&sub.cfg.name])
        .set(i64::try_from(lines).unwrap_or(i64::MAX));
    sub.status
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .backlog_bytes = tail.backlog_bytes();
}

/// Sends one batch of lines in windows, storing the cursor after each;
/// `false` when stopped.
async fn batch(ctx: &Ctx, tail: &Tail, lines: Vec<Line>, drops: &mut Drops) -> bool {
    let mut window: Vec<Item> = Vec::new();
    let mut through: Option<Position>;
    let n = lines.len();
    for (i, line) in lines.into_iter().enumerate() {
        if let Some(item) = item(&ctx.hub, &ctx.sub, &line) {
            window.push(item);
        }
        through = Some(line.after.clone());
        let full = window.len() >= ctx.sub.cfg.max_concurrency;
        if full || i + 1 == n {
            if !send_window(ctx, tail, std::mem::take(&mut window), drops).await {
                return false;
            }
            if let Some(pos) = through.take() {
                let (h, name) = (ctx.hub.clone(), ctx.sub.cfg.name.clone());
                if let Err(e) = blocking(move || h.save_cursor(&name, &pos)).await {
                    // Not fatal: the events go again after a restart.
                    tracing::warn!(subscription = %ctx.sub.cfg.name, error = %e, "cannot store the delivery cursor");
                }
            }
        }
    }
    true
}

/// The item of a line the subscription wants.
fn item(hub: &Hub, sub: &Sub, line: &Line) -> Option<Item> {
    let event: serde_json::Value = serde_json::from_slice(&line.text).ok()?;
    if !sub.cfg.wants(event["event"].as_str()?) {
        return None;
    }
    let (_, body) = envelope(&line.text)?;
    Some(Item {
        id: hub.webhook_id(line, &event),
        time: event["time"].as_i64()?,
        body: Arc::new(body),
        line: String::from_utf8_lossy(&line.text).into_owned(),
        ino: line.after.ino,
        start: line.start,
    })
}

/// Bytes of the audit file behind `item` (written after it).
fn behind(hub: &Hub, item: &Item) -> u64 {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(hub.audit_path()) {
        Ok(m) if m.ino() == item.ino => m.len().saturating_sub(item.start),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

/// Whether `item` is past the backlog cap.
fn overdue(ctx: &Ctx, item: &Item) -> bool {
    let age = ctx.hub.clock.now().saturating_sub(item.time);
    u64::try_from(age).unwrap_or(0) > ctx.sub.cfg.max_backlog_age.as_secs()
        || behind(&ctx.hub, item) > ctx.sub.cfg.max_backlog_bytes
}

async fn send_window(ctx: &Ctx, _tail: &Tail, window: Vec<Item>, drops: &mut Drops) -> bool {
    let name = ctx.sub.cfg.name.as_str();
    // Those already past the cap are dropped unsent.
    let (late, sent): (Vec<Item>, Vec<Item>) = window.into_iter().partition(|i| overdue(ctx, i));
    for i in &late {
        ctx.hub.metrics.dropped.with_label_values(&[name]).inc();
        drops.add(i.time);
    }
    // A run of drops ends where something is sent again: recorded now, not
    // after this window, which may retry for long. A long run is recorded
    // every minute.
    if !sent.is_empty() || drops.older_than(60) {
        drops.flush(&ctx.hub, &ctx.sub);
    }
    let mut set = tokio::task::JoinSet::new();
    for item in sent {
        let c = ctx.clone();
        set.spawn(async move {
            let time = item.time;
            (deliver_one(&c, &item, false).await, time)
        });
    }
    let mut stopped = false;
    while let Some(r) = set.join_next().await {
        match r {
            Ok((Outcome::Stopped, _)) | Err(_) => stopped = true,
            Ok((Outcome::Dropped, time)) => drops.add(time),
            Ok(_) => {}
        }
    }
    !stopped
}

/// Delivers one event with retries.
async fn deliver_one(ctx: &Ctx, item: &Item, redelivery: bool) -> Outcome {
    let name = ctx.sub.cfg.name.as_str();
    let count = |outcome: &str| {
        ctx.hub
            .metrics
            .deliveries
            .with_label_values(&[name, outcome])
            .inc();
    };
    let mut attempt = 0u32;
    let mut refused = 0u32;
    let mut stop = ctx.stop.clone();
    loop {
        if !redelivery && overdue(ctx, item) {
            ctx.hub.metrics.dropped.with_label_values(&[name]).inc();
            return Outcome::Dropped;
        }
        attempt += 1;
        let ts = ctx.hub.clock.now();
        let sig = ctx.signer.sign(&item.id, ts, &item.body);
        let wait = match send(ctx, item, ts, &sig).await {
            Answer::Delivered => {
                count("delivered");
                let mut st = ctx.sub.status.lock().unwrap_or_else(|p| p.into_inner());
                st.last_delivered_at = Some(ts);
                st.last_failure = None;
                return Outcome::Delivered;
            }
            Answer::Permanent(why) => {
                count("refused");
                refused += 1;
                set_failure(ctx, why);
                if refused >= PERMANENT_TRIES {
                    dead_letter(ctx, item, attempt).await;
                    return Outcome::DeadLettered;
                }
                backoff(attempt)
            }
            Answer::RetryAfter(after, why) => {
                count("retry_after");
                set_failure(ctx, why);
                backoff(attempt).max(after.min(ctx.sub.cfg.max_retry_after))
            }
            Answer::Transient(why) => {
                count("failed");
                set_failure(ctx, why);
                backoff(attempt)
            }
        };
        if redelivery && attempt >= REDELIVER_TRIES {
            dead_letter(ctx, item, attempt).await;
            return Outcome::DeadLettered;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return Outcome::Stopped,
        }
    }
}

fn set_failure(ctx: &Ctx, why: String) {
    ctx.sub
        .status
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .last_failure = Some(why);
}

/// The wait before attempt `n + 1`: 1 s doubling to 5 minutes, a random
/// point of its upper half.
fn backoff(n: u32) -> Duration {
    let full = 1000u64
        .saturating_mul(1 << n.saturating_sub(1).min(9))
        .min(300_000);
    let mut r = [0u8; 8];
    let _ = aws_lc_rs::rand::fill(&mut r);
    let half = full / 2;
    Duration::from_millis(half + u64::from_le_bytes(r) % (full - half + 1))
}

/// One attempt.
async fn send(ctx: &Ctx, item: &Item, ts: i64, sig: &str) -> Answer {
    let req = ctx
        .client
        .post(ctx.sub.cfg.url.clone())
        .header("content-type", "application/json")
        .header("webhook-id", &item.id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", sig)
        .body(item.body.as_ref().clone());
    // reqwest's errors name the URL, which may hold a token: never shown.
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) if e.is_timeout() => return Answer::Transient("no answer in time".into()),
        Err(_) => return Answer::Transient("no connection".into()),
    };
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(|v| match v.trim().parse::<u64>() {
            Ok(s) => Duration::from_secs(s),
            // An HTTP-date is not read: the longest wait allowed is taken.
            Err(_) => ctx.sub.cfg.max_retry_after,
        });
    // A bounded part of the answer, within the attempt's timeout.
    let mut read = 0usize;
    while read < ANSWER_CAP {
        match resp.chunk().await {
            Ok(Some(c)) => read += c.len(),
            Ok(None) => break,
            Err(e) if e.is_timeout() => return Answer::Transient("no answer in time".into()),
            Err(_) => break,
        }
    }
    let code = status.as_u16();
    let why = format!("status {code}");
    match (status, retry_after) {
        (s, _) if s.is_success() => Answer::Delivered,
        (s, Some(after)) if code == 429 || code == 503 => {
            let _ = s;
            Answer::RetryAfter(after, why)
        }
        (s, _) if s.is_redirection() => {
            Answer::Permanent(format!("{why} (redirects are not followed)"))
        }
        (s, _) if s.is_server_error() || code == 408 || code == 429 => Answer::Transient(why),
        _ => Answer::Permanent(why),
    }
}

/// Keeps `item` as a dead letter and records it.
async fn dead_letter(ctx: &Ctx, item: &Item, attempts: u32) {
    let now = ctx.hub.clock.now();
    let d = DeadLetter {
        line: item.line.clone(),
        id: item.id.clone(),
        attempts,
        time: now,
    };
    let (h, name) = (ctx.hub.clone(), ctx.sub.cfg.name.clone());
    let kept = blocking(move || {
        h.put_dead(&name, &d)?;
        h.dead_letters(&name).map(|l| l.len() as u64)
    })
    .await;
    match kept {
        Ok(n) => {
            ctx.hub
                .metrics
                .dead_letters
                .with_label_values(&[&ctx.sub.cfg.name])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
            ctx.sub
                .status
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .dead_letters = n;
        }
        Err(e) => {
            tracing::error!(subscription = %ctx.sub.cfg.name, error = %e, "cannot keep a dead letter in the store; the event is given up");
        }
    }
    let mut e = Event::new(now, Kind::WebhookDeadLettered, &ctx.hub.agent);
    e.subscription = Some(&ctx.sub.cfg.name);
    e.webhook_id = Some(&item.id);
    e.attempts = Some(attempts);
    if let Err(err) = ctx.hub.audit.record(&e) {
        tracing::error!(error = %err, "audit write failed for webhook.dead_lettered");
    }
}

/// Sends the dead letters again, each under its own `webhook-id`; a
/// delivered one leaves the store.
async fn redeliver(ctx: &Ctx) {
    let (h, name) = (ctx.hub.clone(), ctx.sub.cfg.name.clone());
    let letters = match blocking(move || h.dead_letters(&name)).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(subscription = %ctx.sub.cfg.name, error = %e, "cannot read the dead letters");
            return;
        }
    };
    for d in letters {
        let Some((_, body)) = envelope(d.line.as_bytes()) else {
            continue;
        };
        let item = Item {
            id: d.id.clone(),
            time: d.time,
            body: Arc::new(body),
            line: d.line.clone(),
            ino: 0,
            start: 0,
        };
        if deliver_one(ctx, &item, true).await == Outcome::Delivered {
            let (h, name, id) = (ctx.hub.clone(), ctx.sub.cfg.name.clone(), d.id.clone());
            let left = blocking(move || {
                h.remove_dead(&name, &id)?;
                h.dead_letters(&name).map(|l| l.len() as u64)
            })
            .await;
            if let Ok(n) = left {
                ctx.hub
                    .metrics
                    .dead_letters
                    .with_label_values(&[&ctx.sub.cfg.name])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
                ctx.sub
                    .status
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .dead_letters = n;
            }
        }
    }
}

/// A run of dropped events, recorded as one `webhook.events_dropped`.
#[derive(Debug, Default)]
struct Drops {
    count: u64,
    oldest: Option<i64>,
    since: Option<std::time::Instant>,
}

impl Drops {
    fn add(&mut self, time: i64) {
        self.count += 1;
        self.oldest = Some(self.oldest.map_or(time, |o| o.min(time)));
        self.since.get_or_insert_with(std::time::Instant::now);
    }

    /// Whether the run began more than `secs` ago.
    fn older_than(&self, secs: u64) -> bool {
        self.since
            .is_some_and(|s| s.elapsed() > Duration::from_secs(secs))
    }

    fn flush(&mut self, hub: &Hub, sub: &Sub) {
        if self.count == 0 {
            return;
        }
        let mut e = Event::new(hub.clock.now(), Kind::WebhookEventsDropped, &hub.agent);
        e.subscription = Some(&sub.cfg.name);
        e.count = Some(self.count);
        e.oldest_time = self.oldest;
        tracing::warn!(
            subscription = %sub.cfg.name,
            count = self.count,
            "webhook events dropped past the backlog cap"
        );
        if let Err(err) = hub.audit.record(&e) {
            tracing::error!(error = %err, "audit write failed for webhook.events_dropped");
        }
        sub.status.lock().unwrap_or_else(|p| p.into_inner()).dropped += self.count;
        *self = Drops::default();
    }
}

#[cfg(test)]
mod tests {
    use super::backoff;
    use std::time::Duration;

    #[test]
    fn backoff_doubles_within_its_upper_half_and_stops_at_five_minutes() {
        for n in 1..=12u32 {
            let full = (1000u64 << (n - 1).min(9)).min(300_000);
            for _ in 0..50 {
                let d = backoff(n);
                assert!(d >= Duration::from_millis(full / 2), "{n}: {d:?}");
                assert!(d <= Duration::from_millis(full), "{n}: {d:?}");
            }
        }
    }
}
