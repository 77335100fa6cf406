//! Poll delivery (RFC 8936) for `delivery = "poll"` transmitters: one
//! replica at a time polls each stream, under a lease in the store
//! (`ssf/poll/<name>` in the `leases` tree, held for three poll intervals
//! and renewed every round). Each SET is stored and acted on before its
//! `jti` is acknowledged in the next request; one refused gets its RFC
//! 8935 code in `setErrs`; one that could not be taken now (the store or
//! the keys unavailable) is neither, so the transmitter sends it again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::{ReceiveError, Receiver, Transmitter};
use crate::infra::config::SsfDelivery;
use crate::infra::store::Tree;

/// The most SETs asked for in one poll.
const MAX_EVENTS: usize = 100;

/// The lease's key for transmitter `name`.
fn lease_key(name: &str) -> Vec<u8> {
    format!("ssf/poll/{name}").into_bytes()
}

/// Takes or renews the poll lease of `name` for `holder`; whether it is
/// held now.
fn hold_lease(r: &Receiver, name: &str, holder: &[u8], ttl: Duration) -> bool {
    let key = lease_key(name);
    match r.store.insert_expiring(Tree::Leases, &key, holder, ttl) {
        Ok(true) => true,
        Ok(false) => r
            .store
            .replace_expiring(Tree::Leases, &key, holder, Some((holder, ttl)))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// What one poll round sends back next: the `jti`s to acknowledge and the
/// errors to report.
#[derive(Debug, Default)]
struct Pending {
    ack: Vec<String>,
    errs: BTreeMap<String, serde_json::Value>,
}

/// One poll request (acknowledging `pending`); whether to poll again at
/// once (SETs came, or more are available).
async fn round(
    r: &Arc<Receiver>,
    t: &Transmitter,
    url: &str,
    pending: &mut Pending,
) -> Result<bool, String> {
    let body = serde_json::json!({
        "ack": pending.ack,
        "setErrs": pending.errs,
        "maxEvents": MAX_EVENTS,
        "returnImmediately": true,
    });
    let (status, answer) =
        super::stream::call(t, reqwest::Method::POST, url, Some(&body), true).await?;
    if status != 200 {
        return Err(format!("the poll endpoint answered {status}"));
    }
    // Acknowledged now: the transmitter will not send them again.
    pending.ack.clear();
    pending.errs.clear();
    let v: serde_json::Value =
        serde_json::from_slice(&answer).map_err(|_| "the poll answer is not JSON".to_string())?;
    let Some(sets) = v["sets"].as_object() else {
        return Err("the poll answer has no sets object".into());
    };
    for (jti, set) in sets {
        let Some(token) = set.as_str() else {
            continue;
        };
        match r.receive(t, token).await {
            Ok(_) => pending.ack.push(jti.clone()),
            Err(ReceiveError::Set(e)) => {
                pending.errs.insert(
                    jti.clone(),
                    serde_json::json!({"err": e.code(), "description": e.to_string()}),
                );
            }
            Err(ReceiveError::Unavailable(_)) => {}
        }
    }
    Ok(!sets.is_empty() || v["moreAvailable"] == true)
}

/// Polls transmitter `name` while this process runs: every
/// `poll_interval`, when it holds the lease. `holder` names this process
/// (instance and boot) in the lease.
pub(crate) async fn run(
    r: Arc<Receiver>,
    name: String,
    holder: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let Some(t) = r.transmitters.get(&name) else {
        return;
    };
    if t.cfg.delivery != SsfDelivery::Poll {
        return;
    }
    let interval = t.cfg.poll_interval;
    let ttl = interval * 3 + Duration::from_secs(5);
    let mut pending = Pending::default();
    let mut warned = false;
    loop {
        let (rc, n, h) = (r.clone(), name.clone(), holder.clone());
        let held = tokio::task::spawn_blocking(move || {
            if !hold_lease(&rc, &n, h.as_bytes(), ttl) {
                return Ok(None);
            }
            super::stream::load(rc.store.as_ref(), &n).map(Some)
        })
        .await;
        let again = match held {
            Ok(Ok(Some(Some(stream)))) => match stream.poll_url.as_deref() {
                Some(url) => match round(&r, t, url, &mut pending).await {
                    Ok(again) => again,
                    Err(e) => {
                        tracing::warn!(transmitter = %name, error = %e, "SSF poll failed; retried next interval");
                        false
                    }
                },
                None => false,
            },
            Ok(Ok(Some(None))) => {
                if !warned {
                    warned = true;
                    tracing::warn!(transmitter = %name, "no SSF stream is stored for this transmitter: run `credbroker ssf stream create`");
                }
                false
            }
            // Another replica holds the lease: what this one had not
            // acknowledged is sent again to the holder, which finds it
            // stored (a repeat) or acts on it.
            Ok(Ok(None)) => {
                pending = Pending::default();
                false
            }
            _ => false,
        };
        if again {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.changed() => break,
        }
    }
}
