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

/// The stop the receiver calls: `ops::revoke_person`, as the admin socket's
/// `persons revoke` runs it (durable when it returns, then applied here and
/// recorded), with the SET's event type and time. The receiver calls it on
/// a blocking thread, so it waits for the action there. When the stop asks
/// for revocation at the providers, that runs afterwards on its own task
/// (network calls to each provider), not before the SET is acknowledged.
fn stopper(broker: &Arc<Broker>) -> Stopper {
    use crate::derive::ops::{Recorder, Target};
    use crate::derive::persons::{Lift, Source, StopRequest};
    let b = broker.clone();
    Arc::new(move |ask| {
        let req = StopRequest {
            person: ask.person.clone(),
            reason: ask.event_type.to_owned(),
            source: Source::Ssf,
            ssf_event_type: Some(ask.event_type.to_owned()),
            event_time: ask.event_time,
            lift: if ask.until_restore {
                Lift::Restore
            } else {
                Lift::SignIn
            },
            revoke_at_providers: ask.revoke_at_providers,
        };
        let rt = tokio::runtime::Handle::current();
        let done = rt
            .block_on(crate::derive::ops::revoke_person(
                Target::Running(&b),
                Recorder::of(&b),
                req,
            ))
            .map_err(|e| e.to_string())?;
        if done.stop.revoke_at_providers {
            let (b, person) = (b.clone(), done.stop.person());
            rt.spawn(async move {
                if let Err(e) =
                    crate::derive::ops::revoke_person_at_providers(&b, Recorder::of(&b), &person)
                        .await
                {
                    tracing::warn!(error = %e, "revoking a stopped person's accounts at their providers failed");
                }
            });
        }
        Ok(())
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
        max_age: i64::try_from(config.revocation.max_event_age.as_secs()).unwrap_or(i64::MAX),
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
