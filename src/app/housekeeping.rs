//! A running instance's background work: the housekeeping tick (rate-limit
//! buckets, vault refresh locks, provider discovery retries, expired links
//! and approvals, the pages' state), the key ring's tick, and the reactions
//! to changes other instances make in a shared store. [`super::server::run`]
//! starts both tasks and awaits them at shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::app::Instance;
use crate::derive::exchange::Broker;
use crate::infra::seal::Sealer;
use crate::infra::store::Tree;

/// How often housekeeping runs (rate-limit buckets, vault refresh, expired
/// links, provider discovery retries).
const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(30);

/// How often the key ring is reloaded, so a scheduled rotation activates
/// (and one made by another process is picked up): a quarter of
/// `[keys] activation_delay`, between 1 s and the housekeeping period. The
/// default delay (120 s) gives 30 s, so a key activates at most 30 s late;
/// a short delay (tests) is not stretched by a long tick.
pub(super) fn key_refresh_period(activation_delay: i64) -> Duration {
    let quarter = u64::try_from(activation_delay.max(0) / 4).unwrap_or(0);
    Duration::from_secs(quarter).clamp(Duration::from_secs(1), HOUSEKEEPING_PERIOD)
}

/// Reloads the key ring (store I/O and decryption, so on a blocking
/// thread); a failure keeps the current keys.
async fn refresh_keys(b: &Arc<Broker>, sealer: &Arc<Sealer>) {
    let (kb, ks) = (b.clone(), sealer.clone());
    let reloaded = tokio::task::spawn_blocking(move || {
        // The database's time: a due activation is written for everyone.
        kb.minter.refresh(kb.store.as_ref(), &ks, kb.shared_now())
    })
    .await;
    if let Ok(Err(e)) = reloaded {
        tracing::warn!(error = %e, "reloading the signing key ring failed; the current keys stay in use");
    }
    refresh_client_keys(b, sealer).await;
}

/// Reloads the client key ring, when loaded (as [`refresh_keys`]).
async fn refresh_client_keys(b: &Arc<Broker>, sealer: &Arc<Sealer>) {
    let Some(keys) = b.client_keys().cloned() else {
        return;
    };
    let (kb, ks) = (b.clone(), sealer.clone());
    let reloaded =
        tokio::task::spawn_blocking(move || keys.refresh(kb.store.as_ref(), &ks, kb.shared_now()))
            .await;
    if let Ok(Err(e)) = reloaded {
        tracing::warn!(error = %e, "reloading the client key ring failed; the current keys stay in use");
    }
}

/// Measures this instance's offset from the shared store's clock
/// (`infra::skew`; PostgreSQL only): one query on a blocking thread. A
/// failed measurement leaves the offset unknown, which refuses nothing.
pub(super) async fn measure_clock(b: &Arc<Broker>) {
    let (store, clock, skew) = (b.store.clone(), b.clock.clone(), b.skew.clone());
    let measured = tokio::task::spawn_blocking(move || {
        crate::infra::skew::measure(store.as_ref(), &clock, &skew)
    })
    .await;
    match measured {
        Ok(Some((sample, offset))) => {
            b.metrics.clock_offset.set(offset as f64 / 1000.0);
            b.metrics
                .clock_offset_checked
                .set(sample.received_ms as f64 / 1000.0);
        }
        Ok(None) => {}
        Err(_) => b.skew.lost(),
    }
}

/// One housekeeping tick.
async fn tick(instance: &Instance) {
    let b = &instance.broker;
    b.limits.housekeeping();
    if let Some(c) = b.connected_services() {
        c.vault.housekeeping();
        for name in c.providers.names() {
            if let Some(p) = c
                .providers
                .get(name)
                .filter(|p| p.cached_endpoints().is_none())
            {
                let p = p.clone();
                tokio::spawn(async move {
                    let _ = p.endpoints().await;
                });
            }
        }
    }
    let (links, now) = (instance.links.clone(), b.shared_now());
    // Sweeping expired connect links is store I/O.
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || links.sweep(now)).await {
        tracing::warn!(error = %e, "sweeping expired connect links failed");
    }
    if let Some(a) = b.approvals().cloned() {
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || a.sweep(now)).await {
            tracing::warn!(error = %e, "sweeping ended approvals failed");
        }
    }
    if let Some(r) = instance.ssf.clone() {
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || r.sweep()).await {
            tracing::warn!(error = %e, "sweeping old SSF event records failed");
        }
    }
    instance.pages.housekeeping();
    // Sign-in stops past their retention (docs/REVOCATION.md).
    let (store, now) = (b.store.clone(), b.shared_now());
    let retention = crate::derive::persons::stop_retention(&b.config.revocation);
    match tokio::task::spawn_blocking(move || {
        crate::derive::persons::sweep(store.as_ref(), now, retention)
    })
    .await
    {
        Ok(Err(e)) => tracing::warn!(error = %e, "sweeping expired person stops failed"),
        Ok(Ok(n)) if n > 0 => tracing::info!(swept = n, "expired person stops deleted"),
        _ => {}
    }
}

/// Starts the housekeeping tick and the key ring's tick (a scheduled key
/// rotation activates there once due); they stop when `stop` changes.
pub(super) fn spawn(instance: &Instance, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    let instance = instance.clone();
    let key_period = key_refresh_period(instance.broker.config.key_activation_delay);
    // Only a shared store has a clock of its own to measure against.
    let measure = instance.broker.store.is_shared();
    let clock_period = instance.broker.config.clock.check_interval;
    tokio::spawn(async move {
        let mut house = tokio::time::interval(HOUSEKEEPING_PERIOD);
        let mut keys = tokio::time::interval(key_period);
        let mut clock = tokio::time::interval(clock_period);
        loop {
            tokio::select! {
                // First: the key ring's activation goes by the database's
                // time, corrected by the offset measured here.
                _ = clock.tick(), if measure => measure_clock(&instance.broker).await,
                _ = keys.tick() => refresh_keys(&instance.broker, &instance.sealer).await,
                _ = house.tick() => tick(&instance).await,
                _ = stop.changed() => break,
            }
        }
    })
}

/// Re-reads the person stop list on a blocking thread (store I/O).
async fn reload_stops(b: &Arc<Broker>) {
    let b = b.clone();
    let _ = tokio::task::spawn_blocking(move || b.reload_stops()).await;
}

/// Follows the changes other instances sharing the store make (replicas on
/// PostgreSQL): the freeze, the key ring and the person stop list are
/// re-read as soon as their tree moves, instead of at the next tick (which
/// stays the backstop for the key ring); the stop list is also polled at
/// half of `revocation.watch_bound`.
pub(super) fn watch_store(instance: &Instance, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    let b = instance.broker.clone();
    let sealer = instance.sealer.clone();
    let mut state = b.store.watch(Tree::State);
    let mut keys = b.store.watch(Tree::SigningKeys);
    let mut stops = b.store.watch(Tree::PersonStops);
    // The stop list's backstop: polled at half its bound, so a lost
    // notification (or a listener reconnecting) delays a stop by at most
    // the bound (docs/REVOCATION.md).
    let mut poll = tokio::time::interval(b.config.revocation.watch_bound / 2);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client_keys = b.store.watch(Tree::ClientKeys);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                Ok(()) = stops.changed() => reload_stops(&b).await,
                _ = poll.tick() => reload_stops(&b).await,
                Ok(()) = state.changed() => {
                    let b = b.clone();
                    let _ = tokio::task::spawn_blocking(move || b.reload_frozen()).await;
                }
                Ok(()) = keys.changed() => refresh_keys(&b, &sealer).await,
                Ok(()) = client_keys.changed() => refresh_client_keys(&b, &sealer).await,
                _ = stop.changed() => break,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::key_refresh_period;
    use std::time::Duration;

    #[test]
    fn key_refresh_period_is_30_s_for_the_default_delay_and_follows_a_short_one() {
        let s = Duration::from_secs;
        assert_eq!(
            key_refresh_period(crate::infra::config::ACTIVATION_DELAY),
            s(30)
        );
        assert_eq!(key_refresh_period(86_400), s(30));
        assert_eq!(key_refresh_period(8), s(2));
        assert_eq!(key_refresh_period(2), s(1));
        assert_eq!(key_refresh_period(0), s(1));
        assert_eq!(key_refresh_period(-5), s(1));
    }
}
