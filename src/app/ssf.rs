//! The Shared Signals receiver's wiring (`[ssf.transmitters.<name>]`):
//! the recorded emails on the broker, the receiver with its stop, and the
//! poll tasks.

use std::collections::HashMap;
use std::sync::Arc;

use crate::accounts::emails::Emails;
use crate::base::keyset::RemoteKeySet;
use crate::derive::exchange::Broker;
use crate::derive::ssf::{Parts, Receiver, Stopper};
use crate::infra::config::Config;
use crate::infra::store::Store;

use super::StartError;

/// The default of `revocation.max_event_age` (seconds) until the
/// person-level stop's config is read here.
const MAX_EVENT_AGE: i64 = 600;

/// The recorded emails, when some transmitter maps `email` subjects (none
/// are kept otherwise); their writer task is spawned here.
pub(super) fn emails(config: &Config, store: &Arc<dyn Store>) -> Option<Arc<Emails>> {
    if !config.ssf.values().any(|t| t.map_email) {
        return None;
    }
    let (emails, writer) = Emails::new(store.clone());
    tokio::spawn(writer);
    Some(emails)
}

/// The stop the receiver calls. Until the person-level stop is wired in,
/// it refuses (fail closed): a SET that would stop someone is answered
/// 503, so its transmitter keeps it and sends it again.
fn stopper(_broker: &Arc<Broker>) -> Stopper {
    Arc::new(|ask| {
        tracing::error!(
            event_type = ask.event_type,
            until_restore = ask.until_restore,
            event_time = ?ask.event_time,
            revoke_at_providers = ask.revoke_at_providers,
            person_iss = %ask.person.iss,
            "a Shared Signals event asks for a stop, and this build cannot store one"
        );
        Err("the person-level stop is not available in this build".into())
    })
}

/// The receiver, when transmitters are configured; their secret files are
/// read now, their metadata and keys fetched (a failure is retried on
/// first use).
pub(super) async fn receiver(
    broker: &Arc<Broker>,
    key_sets: &HashMap<String, Arc<RemoteKeySet>>,
) -> Result<Option<Arc<Receiver>>, StartError> {
    let config = &broker.config;
    if config.ssf.is_empty() {
        return Ok(None);
    }
    let parts = Parts {
        store: broker.store.clone(),
        audit: broker.audit.clone(),
        metrics: broker.metrics.clone(),
        clock: broker.shared_clock.clone(),
        agent: config.agent.clone(),
        max_age: MAX_EVENT_AGE,
        revoke_at_providers: false,
        emails: broker.emails().cloned(),
        stop: stopper(broker),
    };
    let r = Receiver::new(&config.ssf, key_sets, parts).map_err(|source| StartError::Ssf {
        file: config.file.display().to_string(),
        source,
    })?;
    r.resolve_all().await;
    Ok(Some(Arc::new(r)))
}

/// Starts one poll task per `delivery = "poll"` transmitter; they stop
/// when `stop` changes.
pub(super) fn spawn_polls(
    receiver: &Arc<Receiver>,
    holder: &str,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    receiver
        .transmitters()
        .iter()
        .filter(|(_, t)| t.cfg.delivery == crate::infra::config::SsfDelivery::Poll)
        .map(|(name, _)| {
            tokio::spawn(crate::derive::ssf::poll::run(
                receiver.clone(),
                name.clone(),
                holder.to_owned(),
                stop.clone(),
            ))
        })
        .collect()
}
