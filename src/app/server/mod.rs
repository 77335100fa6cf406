//! Running an instance that `app` built on the listeners `app::bind`
//! bound: the accept loops of the three listeners (and the opt-in metrics
//! listener's), and graceful shutdown (the background work
//! is `app::housekeeping`'s).
//!
//! [`run`] takes listeners that are already bound, so tests can bind a temp
//! socket and port 0 and call it in-process.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioTimer;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

use crate::app::{Instance, StartError};

pub use super::bind::Listeners;

mod conns;

use conns::{Admit, Admitted, Conns, InFlight};

fn http1(header_timeout: Duration) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    // hyper's header-read timeout does nothing without a timer (see
    // `http1::Builder::header_read_timeout`); A1 in docs/SECURITY-CASES.md
    // checks that it fires.
    b.timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(16 * 1024)
        .max_headers(64)
        .keep_alive(true);
    b
}

/// One WARN line per `every` for refused peers, with the count of the
/// refusals it stands for; the `connections_refused_total` metric counts
/// each one. A refused uid can open thousands of connections a second.
struct RefusalLog {
    every: Duration,
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl RefusalLog {
    fn new(every: Duration) -> RefusalLog {
        RefusalLog {
            every,
            state: std::sync::Mutex::new((None, 0)),
        }
    }

    /// Counts one refusal; returns `Some(n)` when a line should be logged
    /// now, `n` being the refusals not yet logged (this one included).
    fn note(&self, now: std::time::Instant) -> Option<u64> {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        g.1 += 1;
        match g.0 {
            Some(last) if now.duration_since(last) < self.every => None,
            _ => {
                let n = g.1;
                *g = (Some(now), 0);
                Some(n)
            }
        }
    }
}

/// What the accept loops of one Unix listener share: with one runtime per
/// core every thread accepts on its own copy of the socket, and the
/// connection cap, the shedding and the refusal counters must still hold
/// for the socket as a whole, so they live here behind one lock each.
struct Gate {
    conns: Conns,
    /// Refused peers are answered for a moment each; this caps how many at
    /// once so a flood from a refused uid cannot pile up tasks and
    /// descriptors.
    refusals: Arc<Semaphore>,
    refusal_log: RefusalLog,
    cap_log: RefusalLog,
}

impl Gate {
    fn new() -> Gate {
        Gate {
            conns: Conns::default(),
            refusals: Arc::new(Semaphore::new(64)),
            refusal_log: RefusalLog::new(Duration::from_secs(10)),
            cap_log: RefusalLog::new(Duration::from_secs(10)),
        }
    }
}

/// How the API threads of the `per_core` shape share the connections.
///
/// The threads race for each connection on the shared socket, and the one
/// that is awake wins: without this, a burst of connections (an
/// orchestrator's pool opening) all land on one thread while the others
/// idle. The accepting thread checks, admits and then keeps a connection
/// only when it serves no more than the least loaded thread; otherwise it
/// hands the connection to that thread (one wake-up a connection, none a
/// request: the connection then lives there).
struct Spread {
    /// Connections each thread serves or has been handed.
    loads: Vec<std::sync::atomic::AtomicUsize>,
    inboxes: Vec<tokio::sync::mpsc::UnboundedSender<Handed>>,
}

impl Spread {
    /// The thread that takes the next connection accepted by `me`; its load
    /// counts the connection until the returned guard is dropped.
    fn pick(self: &Arc<Self>, me: usize) -> Load {
        let load = |i: usize| self.loads[i].load(Ordering::Relaxed);
        let least = (0..self.loads.len()).min_by_key(|&i| load(i)).unwrap_or(me);
        let to = if load(me) <= load(least) { me } else { least };
        self.loads[to].fetch_add(1, Ordering::Relaxed);
        Load {
            spread: self.clone(),
            thread: to,
        }
    }
}

/// One connection counted in a thread's load ([`Spread`]).
struct Load {
    spread: Arc<Spread>,
    thread: usize,
}

impl Drop for Load {
    fn drop(&mut self) {
        self.spread.loads[self.thread].fetch_sub(1, Ordering::Relaxed);
    }
}

/// A checked and admitted connection on its way to the thread that serves
/// it.
struct Handed {
    stream: std::os::unix::net::UnixStream,
    uid: u32,
    admitted: Admitted,
    load: Load,
}

/// One API thread's part in a [`Spread`].
struct Share {
    spread: Arc<Spread>,
    me: usize,
    inbox: tokio::sync::mpsc::UnboundedReceiver<Handed>,
}

/// How one Unix listener is served.
#[derive(Clone)]
struct UnixServe {
    /// `api` or `admin`: the metric label and the log field.
    name: &'static str,
    allowed: Arc<Vec<u32>>,
    max_conn: usize,
    header_timeout: Duration,
    metrics: crate::infra::metrics::Metrics,
}

/// Serves one Unix listener: checks each peer's uid before reading a byte,
/// caps connections (shedding idle ones at the cap), and hands requests to
/// `handler`.
async fn serve_unix<H, F, B>(
    listener: UnixListener,
    opts: UnixServe,
    gate: Arc<Gate>,
    share: Option<Share>,
    handler: H,
    shutdown: tokio::sync::watch::Receiver<bool>,
) where
    H: Fn(u32, hyper::Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = hyper::Response<B>> + Send + 'static,
    // The admin socket's event stream is a body that is never whole.
    B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let UnixServe {
        name,
        allowed,
        max_conn,
        header_timeout,
        metrics,
    } = opts;
    // Connection tasks still running, awaited (bounded) at shutdown.
    let mut tasks = tokio::task::JoinSet::new();
    let own_uid = crate::base::unix::current_uid();
    let builder = http1(header_timeout);
    let stopping = shutdown.clone();
    let mut shutdown = shutdown;
    let mut share = share;
    // Serves one admitted connection on this thread until it closes.
    let serve = |tasks: &mut tokio::task::JoinSet<()>,
                 stream: crate::base::unix::ReadOnlyStream,
                 uid: u32,
                 admitted: Admitted,
                 load: Option<Load>| {
        let Admitted {
            id,
            shed,
            in_flight,
        } = admitted;
        let handler = handler.clone();
        let n = in_flight.clone();
        let svc = service_fn(move |req| {
            let handler = handler.clone();
            let busy = InFlight::new(n.clone());
            async move {
                let _busy = busy;
                Ok::<_, std::convert::Infallible>(handler(uid, req).await)
            }
        });
        let c = gate.clone();
        let mut stop = stopping.clone();
        let conn = builder.serve_connection(stream, svc);
        tasks.spawn(async move {
            drive(conn, &shed, &in_flight, &mut stop).await;
            c.conns.remove(id);
            drop(load);
        });
    };
    loop {
        // Reap finished connection tasks so the set stays small.
        while tasks.try_join_next().is_some() {}
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            Some(h) = async {
                match share.as_mut() {
                    Some(s) => s.inbox.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                // Another thread accepted, checked and admitted it.
                match crate::base::unix::ReadOnlyStream::from_std(h.stream) {
                    Ok(stream) => serve(&mut tasks, stream, h.uid, h.admitted, Some(h.load)),
                    Err(e) => {
                        tracing::warn!(socket = name, error = %e, "cannot register a handed connection; it is closed");
                        gate.conns.remove(h.admitted.id);
                    }
                }
                continue;
            }
            _ = shutdown.changed() => break,
        };
        let uid = match stream.peer_cred() {
            Ok(c) => c.uid(),
            Err(_) => continue,
        };
        if !allowed.contains(&uid) {
            refuse_uid(name, uid, own_uid, &gate, &metrics, stream);
            continue;
        }
        let Some(admitted) = admit(name, uid, max_conn, &gate, &metrics) else {
            continue;
        };
        let (stream, admitted, load) = match &share {
            Some(sh) => match hand_off(sh, &gate, stream, uid, admitted) {
                Kept::Here(stream, admitted, load) => (stream, admitted, Some(load)),
                Kept::HandedOn => continue,
            },
            None => (stream, admitted, None),
        };
        match crate::base::unix::ReadOnlyStream::new(stream) {
            Ok(stream) => serve(&mut tasks, stream, uid, admitted, load),
            Err(e) => {
                tracing::warn!(socket = name, error = %e, "cannot register an accepted connection; it is closed");
                gate.conns.remove(admitted.id);
            }
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tracing::debug!(socket = name, left = gate.conns.len(), "listener stopped");
}

/// Serves one admitted connection until it closes, is shed, or the
/// listener stops: an idle connection closes at once, one with a request in
/// flight after its answer (hyper's graceful close).
async fn drive<C: hyper_util::server::graceful::GracefulConnection>(
    conn: C,
    shed: &tokio::sync::Notify,
    in_flight: &std::sync::atomic::AtomicUsize,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) {
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = shed.notified() => {
            // hyper closes an idle connection at once but lets one
            // halfway through a request head run to the header timeout: a
            // head that has not reached the handler in a moment is dropped
            // unanswered, a request in the handler gets its answer first.
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {
                    if in_flight.load(Ordering::SeqCst) > 0 {
                        let _ = conn.as_mut().await;
                    }
                }
            }
        }
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.as_mut().await;
        }
    }
}

/// A peer whose uid is not allowed: counted, logged (at a bounded rate),
/// and, if a refusal slot is free, given a fixed 403; nothing it sends is
/// parsed, and the connection is closed.
fn refuse_uid(
    name: &'static str,
    uid: u32,
    own_uid: u32,
    gate: &Gate,
    metrics: &crate::infra::metrics::Metrics,
    stream: tokio::net::UnixStream,
) {
    metrics
        .connections_refused
        .with_label_values(&[name, "uid"])
        .inc();
    if let Some(n) = gate.refusal_log.note(std::time::Instant::now()) {
        if uid == own_uid {
            tracing::warn!(
                socket = name,
                peer_uid = uid,
                refused_since_last_line = n,
                "connection refused: peer uid not in the allow-list (it is the broker's own uid: a socket.allowed_uids list that is set must name it to allow it)"
            );
        } else {
            tracing::warn!(
                socket = name,
                peer_uid = uid,
                refused_since_last_line = n,
                "connection refused: peer uid not in the allow-list"
            );
        }
    }
    let Ok(refusal) = gate.refusals.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let _refusal = refusal;
        answer_refused(stream).await;
    });
}

/// Writes the fixed 403 of a refused peer and closes. An HTTP client
/// answered before it has sent its request drops the answer as
/// unsolicited, and one still writing when the socket closes gets EPIPE:
/// so wait (briefly) for the request to start, answer, then drain a little
/// before closing. Whatever the peer sends is discarded unparsed.
async fn answer_refused(mut s: tokio::net::UnixStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = br#"{"error":"access_denied","error_description":"peer uid is not allowed on this socket"}"#;
    let head = format!(
        "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncache-control: no-store\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(500), s.read(&mut sink)).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = s.write_all(head.as_bytes()).await;
        let _ = s.write_all(body).await;
        let _ = s.shutdown().await;
        let mut left = 64 * 1024usize;
        while left > 0 {
            match s.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Admits an allowed peer's connection under the cap (shedding an idle one
/// at it); `None` when every slot holds a request in flight (counted, and
/// logged at a bounded rate).
fn admit(
    name: &'static str,
    uid: u32,
    max_conn: usize,
    gate: &Gate,
    metrics: &crate::infra::metrics::Metrics,
) -> Option<Admitted> {
    match gate.conns.admit(uid, max_conn) {
        Admit::Yes { conn, shed_one } => {
            if shed_one {
                metrics.connections_shed.with_label_values(&[name]).inc();
            }
            Some(conn)
        }
        Admit::Full => {
            metrics
                .connections_refused
                .with_label_values(&[name, "cap"])
                .inc();
            if let Some(n) = gate.cap_log.note(std::time::Instant::now()) {
                tracing::warn!(
                    socket = name,
                    max_connections = max_conn,
                    refused_since_last_line = n,
                    "connection refused: every connection slot holds a request in flight"
                );
            }
            None
        }
    }
}

/// Where an admitted connection is served.
enum Kept {
    /// On this thread, counted in its load.
    Here(tokio::net::UnixStream, Admitted, Load),
    /// Handed to the least loaded thread (or closed, when that thread has
    /// stopped or the socket could not be taken from this runtime).
    HandedOn,
}

/// With several accept threads: keeps the connection when this thread
/// serves no more connections than the least loaded one, else hands it to
/// that one over its channel.
fn hand_off(
    sh: &Share,
    gate: &Gate,
    stream: tokio::net::UnixStream,
    uid: u32,
    admitted: Admitted,
) -> Kept {
    let load = sh.spread.pick(sh.me);
    if load.thread == sh.me {
        return Kept::Here(stream, admitted, load);
    }
    let to = load.thread;
    let id = admitted.id;
    let sent = stream.into_std().map(|stream| Handed {
        stream,
        uid,
        admitted,
        load,
    });
    match sent.map(|h| sh.spread.inboxes[to].send(h)) {
        Ok(Ok(())) => {}
        // That thread has stopped (shutdown) or the socket could not be
        // taken from this runtime.
        Ok(Err(_)) | Err(_) => gate.conns.remove(id),
    }
    Kept::HandedOn
}

/// Starts serving the orchestrator socket in the configured runtime shape
/// (`socket.runtime`, docs/PERFORMANCE.md "Runtime shape"); the returned
/// future resolves once every accept loop has stopped and drained.
///
/// `PerCore` runs one OS thread per core, each with its own current-thread
/// runtime and its own copy (a `dup`) of the bound socket, accepting on it
/// itself: a connection then lives on one thread, and a request is read,
/// handled and answered without waking another thread.
/// A Unix socket has no `SO_REUSEPORT` balancing, so the threads race for
/// each connection, and the winner hands it on when another thread serves
/// fewer ([`Spread`]); the cap, the shedding and the refusal counters are
/// shared ([`Gate`]), so they hold for the socket as a whole.
fn serve_api<H, F>(
    file: &str,
    listener: UnixListener,
    shape: crate::infra::config::ApiRuntime,
    opts: UnixServe,
    handler: H,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<impl Future<Output = ()> + Send, StartError>
where
    H: Fn(u32, hyper::Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = hyper::Response<crate::base::http::Body>> + Send + 'static,
{
    let gate = Arc::new(Gate::new());
    let mut done = Vec::new();
    match shape {
        crate::infra::config::ApiRuntime::Shared => {
            let task = tokio::spawn(serve_unix(listener, opts, gate, None, handler, shutdown));
            done.push(Box::pin(async move {
                let _ = task.await;
            })
                as std::pin::Pin<Box<dyn Future<Output = ()> + Send>>);
        }
        crate::infra::config::ApiRuntime::PerCore => {
            let threads =
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
            let io = |what: String| StartError::Io(format!("{file}: socket.runtime: {what}"));
            let std_listener = listener
                .into_std()
                .map_err(|e| io(format!("cannot take over the socket: {e}")))?;
            // Every copy and runtime first, so that a failure starts no thread.
            let mut parts = Vec::with_capacity(threads);
            let mut inboxes = Vec::with_capacity(threads);
            for i in 0..threads {
                let copy = std_listener.try_clone().map_err(|e| {
                    io(format!(
                        "cannot duplicate the socket for API thread {i}: {e}"
                    ))
                })?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| io(format!("cannot start the runtime of API thread {i}: {e}")))?;
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                inboxes.push(tx);
                parts.push((copy, rt, rx));
            }
            drop(std_listener);
            let spread = Arc::new(Spread {
                loads: (0..threads)
                    .map(|_| std::sync::atomic::AtomicUsize::new(0))
                    .collect(),
                inboxes,
            });
            for (i, (copy, rt, inbox)) in parts.into_iter().enumerate() {
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                let (opts, gate, handler, shutdown) = (
                    opts.clone(),
                    gate.clone(),
                    handler.clone(),
                    shutdown.clone(),
                );
                let share = Share {
                    spread: spread.clone(),
                    me: i,
                    inbox,
                };
                std::thread::Builder::new()
                    .name(format!("credbroker-api-{i}"))
                    .spawn(move || {
                        rt.block_on(async move {
                            // The copy shares the original's open file, which
                            // tokio left non-blocking.
                            match UnixListener::from_std(copy) {
                                Ok(l) => {
                                    serve_unix(l, opts, gate, Some(share), handler, shutdown).await;
                                }
                                Err(e) => {
                                    // Never the least loaded: it takes nothing.
                                    share.spread.loads[i].store(usize::MAX / 2, Ordering::Relaxed);
                                    tracing::error!(
                                        error = %e,
                                        thread = i,
                                        "an API thread cannot register the socket; it does not accept"
                                    );
                                }
                            }
                        });
                        let _ = tx.send(());
                    })
                    .map_err(|e| io(format!("cannot start API thread {i}: {e}")))?;
                done.push(Box::pin(async move {
                    let _ = rx.await;
                }));
            }
        }
    }
    Ok(async move {
        for d in done {
            d.await;
        }
    })
}

/// Runs an instance on bound listeners until `shutdown` resolves.
pub async fn run(
    instance: Instance,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), StartError> {
    let broker = instance.broker.clone();
    // Checked before anything is served: the public listener serves the
    // proxy the instance was built with (`app::build` builds one whenever
    // the config names a public listener).
    let proxy = match (&listeners.public, &instance.proxy) {
        (Some(_), None) => {
            return Err(StartError::Io(format!(
                "{}: public.listen: the public listener was bound, but the instance was built without its proxy",
                broker.config.file.display()
            )))
        }
        (_, proxy) => proxy.clone(),
    };
    let (tx, rx) = tokio::sync::watch::channel(false);
    let cfg = broker.config.clone();
    let allowed = Arc::new(cfg.socket.allowed_uids.clone());
    // Before the sockets answer: installs the SIGHUP handler (see reload).
    let reload = crate::app::reload::spawn(broker.clone(), rx.clone());

    let b = broker.clone();
    let api = serve_api(
        &cfg.file.display().to_string(),
        listeners.api,
        cfg.socket.runtime,
        UnixServe {
            name: "api",
            allowed,
            max_conn: cfg.socket.max_connections,
            header_timeout: cfg.socket.header_timeout,
            metrics: broker.metrics.clone(),
        },
        move |uid, req| crate::edge::api::handle(b.clone(), uid, req),
        rx.clone(),
    )?;
    let admin = spawn_admin(&instance, listeners.admin, &rx);
    let public = match (listeners.public, proxy) {
        (Some(l), Some(proxy)) => Some(spawn_public(&instance, l, proxy, &rx)?),
        _ => None,
    };
    let metrics = listeners.metrics.map(|l| {
        tokio::spawn(crate::edge::metrics::serve(
            l,
            broker.clone(),
            cfg.socket.header_timeout,
            rx.clone(),
        ))
    });
    let house = crate::app::housekeeping::spawn(&instance, rx.clone());
    let deliveries = instance.events.spawn(rx.clone());
    let changes = crate::app::housekeeping::watch_store(&instance, rx.clone());
    let polls = instance
        .ssf
        .as_ref()
        .map(|r| crate::app::ssf::spawn_polls(r, &instance.holder, &rx))
        .unwrap_or_default();
    tracing::info!(
        agent = %cfg.agent,
        socket = %cfg.socket.path.display(),
        admin = %cfg.admin_socket.display(),
        public = ?cfg.public.as_ref().map(|p| p.listen),
        metrics = ?cfg.metrics.as_ref().map(|m| m.listen),
        policy_hash = %broker.policy.load().hash,
        "credbroker is serving"
    );
    shutdown.await;
    tracing::info!("shutting down");
    let _ = tx.send(true);
    api.await;
    let _ = admin.await;
    if let Some(p) = public {
        let _ = p.await;
    }
    if let Some(m) = metrics {
        let _ = m.await;
    }
    let _ = house.await;
    for d in deliveries {
        let _ = d.await;
    }
    let _ = changes.await;
    for p in polls {
        let _ = p.await;
    }
    let _ = reload.await;
    let _ = std::fs::remove_file(&cfg.socket.path);
    let _ = std::fs::remove_file(&cfg.admin_socket);
    Ok(())
}

/// Serves the admin socket: only the broker's own user may use it, at
/// most 16 connections.
fn spawn_admin(
    instance: &Instance,
    listener: UnixListener,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let mut handles = instance.admin_handles();
    handles.stop = Some(stop.clone());
    tokio::spawn(serve_unix(
        listener,
        UnixServe {
            name: "admin",
            allowed: Arc::new(vec![crate::base::unix::current_uid()]),
            max_conn: 16,
            header_timeout: instance.broker.config.socket.header_timeout,
            metrics: instance.broker.metrics.clone(),
        },
        Arc::new(Gate::new()),
        None,
        move |_uid, req| crate::edge::admin::handle(handles.clone(), req),
        stop.clone(),
    ))
}

/// Serves the public listener (with TLS when the config names a
/// certificate): the pages, the proxy and the Shared Signals receiver.
fn spawn_public(
    instance: &Instance,
    listener: tokio::net::TcpListener,
    proxy: Arc<crate::edge::proxy::Proxy>,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>, StartError> {
    let broker = &instance.broker;
    let tls = match &broker.config.public.as_ref().and_then(|p| p.tls.clone()) {
        Some((cert, key)) => Some(crate::edge::public::tls_acceptor(cert, key)?),
        None => None,
    };
    Ok(tokio::spawn(crate::edge::public::serve(
        listener,
        tls,
        broker.clone(),
        instance.pages.clone(),
        proxy,
        instance.ssf.clone(),
        stop.clone(),
    )))
}

/// Resolves on SIGTERM or Ctrl-C.
pub(crate) async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// Sends one request on `stream` and returns the answer's body.
    async fn ask(stream: &mut tokio::net::UnixStream) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(b"GET /thread HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some((_, body)) = text.split_once("\r\n\r\n") {
                if body.ends_with('.') {
                    return body.trim_end_matches('.').to_string();
                }
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn per_core_threads_share_the_connections_even_when_one_thread_accepts_them_all() {
        let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let (stop, rx) = tokio::sync::watch::channel(false);
        let opts = super::UnixServe {
            name: "api",
            allowed: std::sync::Arc::new(vec![crate::base::unix::current_uid()]),
            max_conn: 64,
            header_timeout: Duration::from_secs(5),
            metrics: crate::infra::metrics::Metrics::new(),
        };
        let done = super::serve_api(
            "test.toml",
            listener,
            crate::infra::config::ApiRuntime::PerCore,
            opts,
            |_uid, _req| async {
                // The serving thread's name, ended by a dot.
                let name = std::thread::current().name().unwrap_or("?").to_string();
                hyper::Response::new(crate::base::http::Body::from(format!("{name}.")))
            },
            rx,
        )
        .unwrap();
        // Each connection is opened and used before the next, so the thread
        // that won the last one is awake and the likeliest to win the next.
        let mut conns = Vec::new();
        let mut served = std::collections::BTreeMap::<String, usize>::new();
        for _ in 0..4 * threads {
            let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
            *served.entry(ask(&mut c).await).or_default() += 1;
            conns.push(c);
        }
        assert_eq!(served.len(), threads, "{served:?}");
        assert!(served.values().all(|&n| n == 4), "{served:?}");
        // A connection stays on its thread: each answers from the same one.
        let mut again = std::collections::BTreeMap::<String, usize>::new();
        for c in &mut conns {
            *again.entry(ask(c).await).or_default() += 1;
        }
        assert_eq!(again, served);
        // A closed connection frees its thread's share: the next one goes
        // to the thread it left.
        let mut first = conns.remove(0);
        let left = ask(&mut first).await;
        drop(first);
        // (Until the broker has read the close, a new one may go elsewhere.)
        let mut landed = false;
        for _ in 0..100 {
            let mut next = tokio::net::UnixStream::connect(&path).await.unwrap();
            let thread = ask(&mut next).await;
            conns.push(next);
            if thread == left {
                landed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(landed, "no new connection went to {left}");
        let _ = stop.send(true);
        drop(conns);
        tokio::time::timeout(Duration::from_secs(15), done)
            .await
            .unwrap();
    }
}
