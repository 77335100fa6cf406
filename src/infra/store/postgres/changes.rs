//! The change listener: a connection of its own (not from the pool) that
//! listens for the `records` trigger's notifications and moves the named
//! tree's [`Store::watch`](crate::infra::store::Store::watch) counter (the
//! module doc of [`super`], "Changes").

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{AsyncMessage, NoTls};

use super::Tls;
use crate::infra::store::{Tree, Watchers, ALL_TREES};

/// The channel of change notifications.
const CHANNEL: &str = "credbroker_changes";

/// The tree a notification names.
pub(super) fn tree_named(name: &str) -> Option<Tree> {
    ALL_TREES.iter().copied().find(|t| t.name() == name)
}

/// Listens for change notifications on a connection of its own, for as
/// long as the store's runtime runs, reconnecting after a failure.
pub(super) async fn listener(config: tokio_postgres::Config, tls: Tls, watchers: Arc<Watchers>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let (ntx, mut nrx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let connected = match &tls {
            Tls::None => match config.connect(NoTls).await {
                Ok((client, conn)) => Some((client, tokio::spawn(drive(conn, ntx)))),
                Err(_) => None,
            },
            Tls::Rustls(t) => match config.connect(t.clone()).await {
                Ok((client, conn)) => Some((client, tokio::spawn(drive(conn, ntx)))),
                Err(_) => None,
            },
        };
        if let Some((client, driver)) = connected {
            if client
                .batch_execute(&format!("LISTEN {CHANNEL}"))
                .await
                .is_ok()
            {
                backoff = Duration::from_millis(100);
                // What changed while no one listened is unknown.
                for t in ALL_TREES {
                    watchers.bump(t);
                }
                while let Some(name) = nrx.recv().await {
                    if let Some(t) = tree_named(&name) {
                        watchers.bump(t);
                    }
                }
            }
            driver.abort();
            tracing::warn!("lost the store's change notifications; reconnecting");
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Drives a listening connection, forwarding each notification's payload;
/// returns (dropping the sender) when the connection ends.
async fn drive<S, T>(
    mut conn: tokio_postgres::Connection<S, T>,
    tx: tokio::sync::mpsc::UnboundedSender<String>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    while let Some(m) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
        match m {
            Ok(AsyncMessage::Notification(n)) => {
                if tx.send(n.payload().to_string()).is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(_) => return,
        }
    }
}
