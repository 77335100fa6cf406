//! `GET /events` on the admin socket: the instance's audit events live, as
//! Server-Sent Events (each `id` is the event's place in the audit file,
//! `event` its type, `data` the same envelope a webhook receives).
//!
//! A client that reconnects with `Last-Event-ID` gets what was written
//! after that event (when the file it names is still the one written to;
//! otherwise it gets what comes next). Streams have their own small cap
//! (`admin.event_stream_max_connections`, at most 8 of the socket's 16
//! connection slots): a stream is a request that never ends, and a socket
//! whose every slot held one could not take `freeze`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use hyper::body::Frame;

use crate::infra::webhooks::{envelope, tail::Tail, Hub};

/// How often the stream looks for new events.
const POLL: Duration = Duration::from_millis(200);
/// A comment line sent when nothing else was, so a client gone away is
/// noticed (the write fails) and proxies keep the stream open.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// The body of a stream: what the reader task sends, frame by frame.
#[derive(Debug)]
pub(crate) struct EventBody {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for EventBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// A taken stream slot: given back (and the gauge lowered) when dropped.
struct Slot {
    used: Arc<AtomicUsize>,
    hub: Arc<Hub>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.used.fetch_sub(1, Ordering::SeqCst);
        self.hub.metrics().streams.dec();
    }
}

/// Takes a slot under `cap`, or `None` when every one is taken.
fn take(used: &Arc<AtomicUsize>, cap: usize, hub: &Arc<Hub>) -> Option<Slot> {
    let mut n = used.load(Ordering::SeqCst);
    loop {
        if n >= cap {
            return None;
        }
        match used.compare_exchange(n, n + 1, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => {
                hub.metrics().streams.inc();
                return Some(Slot {
                    used: used.clone(),
                    hub: hub.clone(),
                });
            }
            Err(now) => n = now,
        }
    }
}

/// `ino-offset`, as the stream's ids are written.
fn parse_id(v: &str) -> Option<(u64, u64)> {
    let (a, b) = v.trim().split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Starts a stream; `None` when the cap is reached.
pub(crate) fn stream(
    hub: &Arc<Hub>,
    used: &Arc<AtomicUsize>,
    cap: usize,
    last_event_id: Option<&str>,
    stop: Option<tokio::sync::watch::Receiver<bool>>,
) -> Option<Response<EventBody>> {
    let slot = take(used, cap, hub)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let at = last_event_id.and_then(parse_id);
    let path = hub.audit_path().to_owned();
    tokio::spawn(async move {
        let _slot = slot;
        let tail = tokio::task::spawn_blocking(move || Tail::resume(&path, at)).await;
        let Ok(Ok(mut tail)) = tail else {
            return;
        };
        let mut stop = stop;
        // A first comment, so the client sees the stream open at once.
        if tx
            .send(Bytes::from_static(b": credbroker events\n\n"))
            .await
            .is_err()
        {
            return;
        }
        let mut quiet = Duration::ZERO;
        loop {
            if stop.as_ref().is_some_and(|s| *s.borrow()) {
                return;
            }
            let (t, read) = match tokio::task::spawn_blocking(move || {
                let mut t = tail;
                let r = t.read(256);
                (t, r)
            })
            .await
            {
                Ok(v) => v,
                Err(_) => return,
            };
            tail = t;
            let lines = read.unwrap_or_default();
            for line in &lines {
                let Some((kind, body)) = envelope(&line.text) else {
                    continue;
                };
                let mut msg = Vec::with_capacity(body.len() + 64);
                msg.extend_from_slice(
                    format!(
                        "id: {}-{}\nevent: {kind}\ndata: ",
                        line.after.ino, line.after.offset
                    )
                    .as_bytes(),
                );
                msg.extend_from_slice(&body);
                msg.extend_from_slice(b"\n\n");
                if tx.send(Bytes::from(msg)).await.is_err() {
                    return;
                }
            }
            if !lines.is_empty() {
                quiet = Duration::ZERO;
                continue;
            }
            if quiet >= KEEPALIVE {
                quiet = Duration::ZERO;
                if tx
                    .send(Bytes::from_static(b": keep-alive\n\n"))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            let changed = async {
                match stop.as_mut() {
                    Some(s) => {
                        let _ = s.changed().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(POLL) => quiet += POLL,
                _ = changed => return,
            }
        }
    });
    let mut r = Response::new(EventBody { rx });
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Some(r)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_parse_as_written_and_nothing_else() {
        assert_eq!(super::parse_id("12-345"), Some((12, 345)));
        assert_eq!(super::parse_id(" 12-345 "), Some((12, 345)));
        for bad in ["", "12", "a-1", "1-", "-1", "1-2-3"] {
            assert_eq!(super::parse_id(bad), None, "{bad}");
        }
    }
}
