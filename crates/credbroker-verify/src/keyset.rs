//! One key set (a JWKS) per issuer, shared by everything that checks that
//! issuer's signatures: in the broker, subject tokens and the pages' ID
//! tokens; here, the resource-server verifier.
//!
//! A leaf: it depends only on [`crate::jose`] and, with the `fetch`
//! feature, HTTP (callers pass `now` from their injected clock).
//!
//! The keys are either pinned (a document the caller read: nothing is ever
//! fetched) or, with the `fetch` feature, fetched from a JWKS URI. An
//! unknown `kid` may trigger a refetch, at most once per
//! [`MIN_REFETCH_INTERVAL`] per key set, so that tokens with made-up `kid`s
//! cannot turn a validator into a request flood against the issuer. The
//! size cap is set per use: each caller documents its own
//! ([`crate::MAX_KEYS_DOCUMENT`] for resource servers).

use std::sync::Arc;
#[cfg(feature = "fetch")]
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::jose::JwkSet;

/// The shortest time (seconds) between two refetches of one key set.
pub const MIN_REFETCH_INTERVAL: i64 = 60;

/// Why keys could not be fetched. Carries no response bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeySetError {
    /// The request failed, or the answer was not a success.
    #[error("the key document could not be fetched")]
    Unreachable,
    /// The answer is larger than the cap.
    #[error("the key document is too large")]
    TooLarge,
    /// The answer is not a JWKS with a usable signing key.
    #[error("the key document is not a usable JWKS")]
    Invalid,
}

/// How long an idle connection to an issuer is kept for reuse: below the
/// keep-alive timeouts servers commonly use (5 s), so a request is not
/// written on a connection the server is closing at that moment.
#[cfg(feature = "fetch")]
pub const POOL_IDLE: Duration = Duration::from_secs(4);

/// The HTTP client for key and metadata documents ([`http_client_from`]
/// over a default builder with [`POOL_IDLE`]). (Feature `fetch`.)
#[cfg(feature = "fetch")]
pub fn http_client() -> reqwest::Client {
    http_client_from(reqwest::Client::builder().pool_idle_timeout(POOL_IDLE))
}

/// Finishes `builder` as a client for key and metadata documents: rustls,
/// bounded timeouts, no redirects (a redirect could move a pinned URI to a
/// host the operator never named). (Feature `fetch`.)
#[cfg(feature = "fetch")]
pub fn http_client_from(builder: reqwest::ClientBuilder) -> reqwest::Client {
    builder
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(3))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        // Building fails only when the TLS backend cannot initialise; a
        // default client then fails every request, which callers already
        // treat as "keys unavailable".
        .unwrap_or_default()
}

/// GET `uri`: a success status and a body of at most `cap` bytes, read in
/// chunks so that an oversized answer is dropped as soon as it passes the
/// cap, whatever its `Content-Length` said. (Feature `fetch`.)
#[cfg(feature = "fetch")]
pub async fn get_capped(
    http: &reqwest::Client,
    uri: &str,
    cap: usize,
) -> Result<Vec<u8>, KeySetError> {
    let mut resp = http
        .get(uri)
        .send()
        .await
        .map_err(|_| KeySetError::Unreachable)?;
    if !resp.status().is_success() {
        return Err(KeySetError::Unreachable);
    }
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Err(KeySetError::TooLarge);
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|_| KeySetError::Unreachable)? {
        if out.len() + chunk.len() > cap {
            return Err(KeySetError::TooLarge);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// What a refetch did.
#[derive(Debug, Clone)]
pub enum Refetch {
    /// New keys were fetched and stored.
    Fetched(Arc<JwkSet>),
    /// The last fetch was less than [`MIN_REFETCH_INTERVAL`] ago: the keys
    /// held now, unchanged.
    Throttled(Arc<JwkSet>),
    /// The keys are pinned: nothing is ever fetched.
    Pinned,
}

/// Where fetched keys come from.
#[cfg(feature = "fetch")]
#[derive(Debug)]
struct Source {
    uri: String,
    cap: usize,
    /// When the keys were last refetched (Unix seconds of the caller's
    /// clock). Held across the fetch: concurrent requests with unknown
    /// kids wait for the one fetch and then see its keys, instead of each
    /// starting their own or failing on the old keys meanwhile.
    last_fetch: tokio::sync::Mutex<Option<i64>>,
    http: reqwest::Client,
}

/// A key set, pinned or (feature `fetch`) fetched from a JWKS URI.
#[derive(Debug)]
pub struct RemoteKeySet {
    keys: ArcSwap<JwkSet>,
    /// `None`: pinned.
    #[cfg(feature = "fetch")]
    source: Option<Source>,
}

impl RemoteKeySet {
    /// Keys that are never refetched.
    pub fn pinned(keys: JwkSet) -> RemoteKeySet {
        RemoteKeySet {
            keys: ArcSwap::from_pointee(keys),
            #[cfg(feature = "fetch")]
            source: None,
        }
    }

    /// Keys fetched from `uri`, refusing documents larger than `cap`. Holds
    /// no key until the first [`RemoteKeySet::fetch`] or refetch. (Feature
    /// `fetch`.)
    #[cfg(feature = "fetch")]
    pub fn remote(uri: &str, cap: usize, http: reqwest::Client) -> RemoteKeySet {
        RemoteKeySet {
            keys: ArcSwap::from_pointee(JwkSet::default()),
            source: Some(Source {
                uri: uri.to_owned(),
                cap,
                last_fetch: tokio::sync::Mutex::new(None),
                http,
            }),
        }
    }

    /// The JWKS URI, unless pinned.
    pub fn uri(&self) -> Option<&str> {
        #[cfg(feature = "fetch")]
        return self.source.as_ref().map(|s| s.uri.as_str());
        #[cfg(not(feature = "fetch"))]
        None
    }

    /// Whether the keys are pinned.
    pub fn is_pinned(&self) -> bool {
        self.uri().is_none()
    }

    /// The keys held now.
    pub fn keys(&self) -> Arc<JwkSet> {
        self.keys.load_full()
    }

    /// Replaces the keys (an embedder that fetched a rotated JWKS itself).
    pub fn set(&self, keys: JwkSet) {
        self.keys.store(Arc::new(keys));
    }

    /// Fetches the keys now, outside the refetch interval (start-up). A
    /// pinned set is left as it is. (Feature `fetch`.)
    #[cfg(feature = "fetch")]
    pub async fn fetch(&self) -> Result<Arc<JwkSet>, KeySetError> {
        let Some(src) = &self.source else {
            return Ok(self.keys());
        };
        let body = get_capped(&src.http, &src.uri, src.cap).await?;
        let set = JwkSet::from_json(&body).map_err(|_| KeySetError::Invalid)?;
        self.set(set);
        Ok(self.keys())
    }

    /// Refetches on an unknown `kid`, at most once per
    /// [`MIN_REFETCH_INTERVAL`] as measured by `now`. (Feature `fetch`.)
    #[cfg(feature = "fetch")]
    pub async fn refetch(&self, now: i64) -> Result<Refetch, KeySetError> {
        let Some(src) = &self.source else {
            return Ok(Refetch::Pinned);
        };
        let mut last = src.last_fetch.lock().await;
        if last.is_some_and(|t| now - t < MIN_REFETCH_INTERVAL) {
            return Ok(Refetch::Throttled(self.keys()));
        }
        // A failed fetch keeps the slot too, so an unreachable issuer is
        // not hammered either.
        *last = Some(now);
        self.fetch().await.map(Refetch::Fetched)
    }
}

#[cfg(all(test, feature = "fetch"))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pinned_keys_are_never_fetched_and_refetch_is_throttled() {
        let pinned = RemoteKeySet::pinned(JwkSet::default());
        assert!(matches!(pinned.refetch(0).await, Ok(Refetch::Pinned)));
        assert!(pinned.is_pinned());

        // Nothing listens on port 9 of loopback: the first refetch fails,
        // and a second one within the interval does not even try.
        let remote = RemoteKeySet::remote("http://127.0.0.1:9/jwks", 1024, http_client());
        assert!(remote.refetch(1_000).await.is_err());
        assert!(matches!(
            remote.refetch(1_000 + MIN_REFETCH_INTERVAL - 1).await,
            Ok(Refetch::Throttled(_))
        ));
        // Positive control: once the interval has passed, it tries again.
        assert!(remote.refetch(1_000 + MIN_REFETCH_INTERVAL).await.is_err());
    }
}
