//! The organisation's authorization servers (`[upstreams.<name>]`), where a
//! `source = "exchange"` resource's token comes from: one RFC 8693 token
//! exchange per derive, bound to the tool's key by the tool's own DPoP proof
//! for that AS's token endpoint, relayed in the derive (docs/UPSTREAM.md).
//! Not to be confused with `accounts::upstream`, the third-party providers
//! people connect.
//!
//! [`Upstreams::exchange`] runs, in order, and refuses at the first that
//! fails, sending nothing before the last:
//! 1. the subject token's issuer is one the upstream lists
//!    (`subject_issuers`): no subject token ever goes to an AS that is not
//!    listed for it;
//! 2. the upstream's endpoints are known (explicit, or its metadata with its
//!    `issuer` identical);
//! 3. the relayed proof ([`proof`]): present, `htu` byte-equal to the token
//!    endpoint, no `ath`, `htm` POST, fresh, signed by the derive proof's key,
//!    its `jti` unused in this module's own replay cache;
//! 4. the call ([`call`]): no redirects, bounded body, timeouts, the AS's
//!    errors mapped to what the orchestrator can act on;
//! 5. the answer ([`answer`]): every check, before the tool sees the token.
//!
//! An upstream with `grant = "id_jag"` is the person's IdP, and its
//! derive has two legs ([`id_jag`]): an exchange there for an ID-JAG, and
//! an RFC 7523 `jwt-bearer` grant with it at the resource's AS (its
//! `resource_upstream`), each with its own relayed proof, both checked
//! before the first is sent.

pub(crate) use check::{CheckLine, Outcome};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::base::dpop;
use crate::base::jose::Alg;
use crate::base::keyset::{self, RemoteKeySet};
use crate::base::secret::SecretString;
use crate::derive::client_keys::ClientKeys;
use crate::derive::policy::canonical_resource;
use crate::infra::config::{
    AudienceParam, ScopeClaim, UpstreamConfig, UpstreamGrant, UpstreamResource,
};

mod answer;
mod call;
mod check;
mod id_jag;
mod introspect;
mod proof;
mod reuse;

pub(crate) use reuse::{Cache as ReuseCache, ReuseKey};

/// The RFC 8693 token type of access tokens.
pub(crate) const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
/// The RFC 8693 token type of ID tokens (a subject token for an `exchange`
/// resource only).
pub(crate) const ID_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:id_token";
/// The longest lifetime an exchanged token may have (seconds), as for the
/// broker's own tokens.
pub(crate) const MAX_LIFETIME: i64 = 300;

/// Why an exchange was refused. Texts name no token, secret or proof.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// The policy names an upstream the config does not define (start-up
    /// and reload check this; fail closed anyway).
    #[error("the upstream is not configured")]
    NotConfigured,
    /// The subject token's issuer is not in the upstream's `subject_issuers`.
    #[error("the subject token's issuer is not listed for this resource's upstream authorization server (upstreams.<name>.subject_issuers); nothing was sent")]
    SubjectIssuerNotListed,
    /// The subject token's `aud` lacks the upstream's `subject_audience`.
    #[error("the subject token's aud does not name the audience this resource's upstream authorization server requires (upstreams.<name>.subject_audience); nothing was sent")]
    SubjectAudience,
    /// No relayed proof for the upstream's token endpoint, or the AS asked
    /// for its nonce.
    #[error("a DPoP proof for the upstream's token endpoint is required")]
    ProofRequired {
        /// The token endpoint the proof must name.
        htu: String,
        /// The AS's current nonce, when it uses nonces.
        nonce: Option<String>,
    },
    /// The relayed proof failed a check.
    #[error("the relayed DPoP proof {0}")]
    ProofInvalid(&'static str),
    /// The relayed proofs' replay cache is full.
    #[error("the relayed proofs' replay cache is full")]
    ProofCacheFull,
    /// The AS refused the subject token (`invalid_grant`).
    #[error("the upstream authorization server refused the subject token (invalid_grant); get a fresh token for the person")]
    SubjectRejected,
    /// The AS refused the request: one of the allow-listed codes.
    #[error("the upstream authorization server refused the exchange ({0})")]
    Denied(&'static str),
    /// The AS refused our client, or the grant: the operator's to fix.
    #[error("the upstream authorization server refused this broker's client or grant; the operator must fix its registration")]
    Misconfigured,
    /// Unreachable, timed out, or a 5xx (or no usable metadata).
    #[error("the upstream authorization server is unavailable")]
    Unavailable,
    /// A malformed, oversized or redirecting answer.
    #[error("the upstream authorization server's answer is unusable: {0}")]
    BadAnswer(&'static str),
    /// The token failed a check.
    #[error("the upstream's token was refused: {0}")]
    TokenRejected(&'static str),
    /// Between the legs of an ID-JAG derive the policy or the freeze
    /// changed so that this derive is no longer allowed; the caller
    /// answers with the refusal it found.
    #[error("the derive was withdrawn between the legs")]
    Withdrawn,
}

/// A refused exchange, with the upstream whose leg refused (for an
/// ID-JAG derive: the IdP's or the resource AS's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegError {
    /// The upstream of the leg that refused.
    pub upstream: String,
    /// Why.
    pub error: UpstreamError,
}

/// What one exchange needs from the derive.
#[derive(Debug, Clone, Copy)]
pub struct ExchangeInput<'a> {
    /// The upstream's name (the policy's `upstream`).
    pub upstream: &'a str,
    /// The resource, canonical.
    pub resource: &'a str,
    /// The person's subject token, as validated.
    pub subject_token: &'a str,
    /// Its RFC 8693 type: [`ACCESS_TOKEN_TYPE`] or [`ID_TOKEN_TYPE`].
    pub subject_token_type: &'a str,
    /// Its issuer.
    pub subject_iss: &'a str,
    /// Its subject (the person at that issuer).
    pub subject_sub: &'a str,
    /// Its `exp`.
    pub subject_exp: i64,
    /// The scopes the policy grants for this derive.
    pub scopes: &'a [String],
    /// The thumbprint of the derive proof's key.
    pub jkt: &'a str,
    /// The tool (named by an actor token).
    pub tool: &'a str,
    /// The orchestrator's step (named by an actor token).
    pub step: &'a str,
    /// The relayed proofs, by upstream name (one per leg).
    pub proofs: &'a BTreeMap<String, SecretString>,
    /// Now.
    pub now: i64,
}

/// A token the upstream issued that passed every check.
#[derive(Debug)]
pub struct Exchanged {
    /// The token.
    pub access_token: SecretString,
    /// Its `exp`.
    pub exp: i64,
    /// Its `jti` (or, without one, a hash of the token), for the event.
    pub id: String,
}

/// Endpoints known for one upstream.
#[derive(Debug)]
struct Resolved {
    /// The token endpoint exactly as configured or advertised.
    token_endpoint: String,
    /// The same, normalised for the DPoP validator.
    htu: String,
    /// Its keys (shared with the subject validator when the AS is also a
    /// trusted issuer with the same JWKS URI: one key-set cache).
    keys: Arc<RemoteKeySet>,
    /// What its metadata advertises (`None`: not advertised, or no
    /// metadata): checked where advertised.
    advertised: call::Advertised,
}

/// What signs this broker's client assertions and actor tokens: the client
/// key, in memory (no store call), and the names actor tokens carry.
#[derive(Debug)]
struct ClientSigner {
    keys: Arc<ClientKeys>,
    /// The broker's issuer (an actor token's `iss`).
    issuer: String,
    /// The agent it serves (an actor token's `sub`).
    agent: String,
}

/// One upstream authorization server.
#[derive(Debug)]
struct Upstream {
    cfg: UpstreamConfig,
    /// The client secret (`client_secret_basic` / `_post`).
    secret: Option<SecretString>,
    /// The client key (set at start, [`Upstreams::set_client_keys`]).
    client: Option<Arc<ClientSigner>>,
    /// Per canonical resource URI.
    resources: BTreeMap<String, UpstreamResource>,
    http: reqwest::Client,
    resolved: tokio::sync::OnceCell<Resolved>,
    /// The AS's last DPoP nonce (RFC 9449 section 8), published in
    /// `/v1/info` and in `upstream_proof_required`.
    nonce: Mutex<Option<String>>,
    /// The subject validator's key set for this issuer, if it is one.
    shared_keys: Option<Arc<RemoteKeySet>>,
}

/// Every upstream, and the relayed proofs' own replay cache.
#[derive(Debug)]
pub struct Upstreams {
    by_name: BTreeMap<String, Upstream>,
    proofs: dpop::Validator,
    /// Exchanged tokens kept for reuse (`reuse_margin`).
    reuse: ReuseCache,
}

/// Why the upstreams could not be set up (names the key, never a secret).
#[derive(Debug, thiserror::Error)]
#[error("upstreams.{name}.{key}: {detail}")]
pub struct SetupError {
    /// The upstream.
    pub name: String,
    /// The key.
    pub key: &'static str,
    /// What is wrong.
    pub detail: String,
}

impl Upstreams {
    /// Builds the upstreams of `configs`, reading each client secret file
    /// now (mode 0600). `key_sets` are the subject validator's, by issuer.
    /// `algs` and `replay_capacity` size the relayed proofs' validator.
    pub fn new(
        configs: &BTreeMap<String, UpstreamConfig>,
        key_sets: &std::collections::HashMap<String, Arc<RemoteKeySet>>,
        algs: Vec<Alg>,
        replay_capacity: usize,
    ) -> Result<Upstreams, SetupError> {
        let mut by_name = BTreeMap::new();
        for (name, cfg) in configs {
            let bad = |key: &'static str, detail: String| SetupError {
                name: name.clone(),
                key,
                detail,
            };
            let secret = match &cfg.client_secret_file {
                Some(f) => Some(read_client_secret(f).map_err(|e| bad("client_secret_file", e))?),
                None => None,
            };
            let mut resources = BTreeMap::new();
            for (uri, r) in &cfg.resources {
                let c = canonical_resource(uri)
                    .map_err(|e| bad("resources", format!("{uri:?}: {e}")))?;
                resources.insert(c, r.clone());
            }
            let http = crate::base::http::outbound_client()
                .connect_timeout(cfg.connect_timeout)
                .timeout(cfg.timeout)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| bad("issuer", format!("the HTTPS client: {e}")))?;
            by_name.insert(
                name.clone(),
                Upstream {
                    shared_keys: key_sets.get(&cfg.issuer).cloned(),
                    cfg: cfg.clone(),
                    secret,
                    client: None,
                    resources,
                    http,
                    resolved: tokio::sync::OnceCell::new(),
                    nonce: Mutex::new(None),
                },
            );
        }
        Ok(Upstreams {
            by_name,
            proofs: dpop::Validator::new(algs, replay_capacity, None),
            reuse: ReuseCache::default(),
        })
    }

    /// Gives every upstream the client key (in memory: an assertion or
    /// actor token makes no store call). `issuer` and `agent` are what an
    /// actor token names as its issuer and subject.
    pub fn set_client_keys(&mut self, keys: Arc<ClientKeys>, issuer: &str, agent: &str) {
        let signer = Arc::new(ClientSigner {
            keys,
            issuer: issuer.to_owned(),
            agent: agent.to_owned(),
        });
        for u in self.by_name.values_mut() {
            u.client = Some(signer.clone());
        }
    }

    /// Whether `name` is configured.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The exchanged tokens kept for reuse.
    pub(crate) fn reuse(&self) -> &ReuseCache {
        &self.reuse
    }

    /// How long (seconds) a token of `name` must still live to be given
    /// again (`reuse_margin`); `None`: its tokens are never reused.
    pub fn reuse_margin(&self, name: &str) -> Option<i64> {
        let u = self.by_name.get(name)?;
        u.cfg.reuse_margin.map(|d| d.as_secs() as i64)
    }

    /// Learns every upstream's endpoints now (start-up); a failure is
    /// logged and retried on the first derive that needs it.
    pub async fn resolve_all(&self) {
        for (name, u) in &self.by_name {
            if let Err(e) = u.resolve().await {
                tracing::warn!(upstream = %name, error = %e, "upstream metadata not available at start-up; will retry on first use");
            }
        }
    }

    /// What `/v1/info` publishes per upstream: its issuer, its token
    /// endpoint once known (the `htu` of the relayed proof) and its current
    /// DPoP nonce, if any.
    pub fn info(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        for (name, u) in &self.by_name {
            let mut v = serde_json::Map::new();
            v.insert("issuer".into(), u.cfg.issuer.clone().into());
            if let Some(r) = u.resolved.get() {
                v.insert("token_endpoint".into(), r.token_endpoint.clone().into());
            }
            if let Some(n) = u.current_nonce() {
                v.insert("dpop_nonce".into(), n.into());
            }
            match &u.cfg.grant {
                UpstreamGrant::TokenExchange => {
                    v.insert("grant".into(), "token_exchange".into());
                }
                UpstreamGrant::IdJag { resource_upstream } => {
                    v.insert("grant".into(), "id_jag".into());
                    v.insert("resource_upstream".into(), resource_upstream.clone().into());
                }
            }
            out.insert(name.clone(), v.into());
        }
        out.into()
    }

    /// The upstream configuration named `name`.
    pub fn config(&self, name: &str) -> Option<&UpstreamConfig> {
        self.by_name.get(name).map(|u| &u.cfg)
    }

    /// One token exchange at the upstream, every check of the module doc
    /// in its order (for an `id_jag` upstream, both legs: [`id_jag`];
    /// `between` is asked, after the first leg and before the second is
    /// sent, whether the derive is still allowed). `observe` is told the
    /// outcome and the time of an exchange that was sent (`issued`,
    /// `refused`, `unavailable`, `bad_answer`); nothing is observed for a
    /// derive refused before.
    pub async fn exchange(
        &self,
        input: &ExchangeInput<'_>,
        between: impl FnOnce() -> bool,
        observe: impl FnOnce(&'static str, std::time::Duration),
    ) -> Result<Exchanged, LegError> {
        let leg = |u: &str| {
            let upstream = u.to_owned();
            move |error| LegError { upstream, error }
        };
        let u = self
            .by_name
            .get(input.upstream)
            .ok_or(UpstreamError::NotConfigured)
            .map_err(leg(input.upstream))?;
        if !u.cfg.subject_issuers.iter().any(|i| i == input.subject_iss) {
            return Err(leg(input.upstream)(UpstreamError::SubjectIssuerNotListed));
        }
        if let Some(want) = &u.cfg.subject_audience {
            if !audience_names(input.subject_token, want) {
                return Err(leg(input.upstream)(UpstreamError::SubjectAudience));
            }
        }
        if let UpstreamGrant::IdJag { resource_upstream } = &u.cfg.grant {
            let r = self
                .by_name
                .get(resource_upstream)
                .ok_or(UpstreamError::NotConfigured)
                .map_err(leg(resource_upstream))?;
            return id_jag::chain(self, [u, r], input, between, observe).await;
        }
        let resolved = u
            .ready(call::Leg::Exchange)
            .await
            .map_err(leg(input.upstream))?;
        let proof = self
            .relayed(u, resolved, input)
            .map_err(leg(input.upstream))?;
        let shape = u.shape(input.resource);
        let started = std::time::Instant::now();
        let grant = call::Grant::Exchange {
            requested: ACCESS_TOKEN_TYPE,
            audience: None,
        };
        let result = match call::post(u, resolved, input, &shape, proof, grant).await {
            Ok(answer) => answer::check(u, resolved, input, &shape, answer, true).await,
            Err(e) => Err(e),
        };
        observe(outcome(&result), started.elapsed());
        result.map_err(leg(input.upstream))
    }

    /// The relayed proof for `u` in `input`, checked ([`proof`]).
    fn relayed<'i>(
        &self,
        u: &Upstream,
        resolved: &Resolved,
        input: &'i ExchangeInput<'_>,
    ) -> Result<&'i str, UpstreamError> {
        let proof = present(u, resolved, input)?;
        proof::check(
            &self.proofs,
            proof,
            &resolved.token_endpoint,
            &resolved.htu,
            input.jkt,
            input.now,
        )?;
        Ok(proof)
    }
}

/// The relayed proof for `u` in `input`, present and, when this instance
/// knows the AS's current DPoP nonce, carrying it; otherwise
/// `upstream_proof_required` naming the `htu` and that nonce, before the
/// proof is recorded as used and before anything is sent. The AS's nonces
/// are a domain of their own (docs/UPSTREAM.md, "The AS's nonce"): learnt
/// by each instance from the AS's `DPoP-Nonce`, kept in memory, never one
/// of the broker's own.
fn present<'i>(
    u: &Upstream,
    resolved: &Resolved,
    input: &'i ExchangeInput<'_>,
) -> Result<&'i str, UpstreamError> {
    let current = u.current_nonce();
    let proof = input.proofs.get(&u.cfg.name).map(|p| p.expose().as_str());
    match (proof, current) {
        (Some(p), Some(n)) if proof::stale_nonce(p, &n) => Err(UpstreamError::ProofRequired {
            htu: resolved.token_endpoint.clone(),
            nonce: Some(n),
        }),
        (Some(p), _) => Ok(p),
        (None, nonce) => Err(UpstreamError::ProofRequired {
            htu: resolved.token_endpoint.clone(),
            nonce,
        }),
    }
}

/// The metric outcome of an exchange that was sent.
pub(super) fn outcome<T>(result: &Result<T, UpstreamError>) -> &'static str {
    match result {
        Ok(_) => "issued",
        Err(UpstreamError::Unavailable) => "unavailable",
        Err(UpstreamError::BadAnswer(_) | UpstreamError::TokenRejected(_)) => "bad_answer",
        Err(_) => "refused",
    }
}

/// Whether the (validated) subject token's `aud`, a string or an array,
/// names `want`. The token's signature was checked by the subject
/// validator: this reads the same payload again, only on the exchange
/// path.
fn audience_names(token: &str, want: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Aud {
        #[serde(default)]
        aud: Option<crate::base::jose::Audience>,
    }
    token
        .split('.')
        .nth(1)
        .and_then(|p| crate::base::jose::b64d(p, "payload").ok())
        .and_then(|b| serde_json::from_slice::<Aud>(&b).ok())
        .and_then(|a| a.aud)
        .is_some_and(|a| a.contains(want))
}

/// A client secret file's text (mode 0600), without its line end.
fn read_client_secret(f: &std::path::Path) -> Result<SecretString, String> {
    let bytes = crate::base::secret::read_secret_file(f).map_err(|e| e.to_string())?;
    std::str::from_utf8(bytes.expose())
        .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .map(SecretString::new)
        .ok_or_else(|| format!("{}: empty or not UTF-8", f.display()))
}

impl Upstream {
    /// The endpoints, known, and the grant `leg` needs advertised by the
    /// metadata where it advertises grant and token types (otherwise the
    /// operator's to fix: nothing is sent).
    async fn ready(&self, leg: call::Leg) -> Result<&Resolved, UpstreamError> {
        let resolved = self.resolve().await.map_err(|e| {
            tracing::warn!(upstream = %self.cfg.name, error = %e, "upstream metadata unavailable");
            UpstreamError::Unavailable
        })?;
        if let Err(missing) = resolved.advertised.supports(leg) {
            tracing::error!(upstream = %self.cfg.name, missing, "the upstream's metadata does not advertise what this grant needs; check upstreams.{}.grant and the registration there", self.cfg.name);
            return Err(UpstreamError::Misconfigured);
        }
        Ok(resolved)
    }

    /// The AS's last nonce.
    fn current_nonce(&self) -> Option<String> {
        self.nonce
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records the AS's nonce from a `DPoP-Nonce` header: only a short
    /// token of visible ASCII (RFC 9449 section 8.1: NQCHAR), or nothing.
    fn remember_nonce(&self, headers: &reqwest::header::HeaderMap) {
        let Some(n) = headers
            .get("dpop-nonce")
            .and_then(|v| v.to_str().ok())
            .filter(|n| !n.is_empty() && n.len() <= 256)
            .filter(|n| {
                n.bytes()
                    .all(|b| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'\\')
            })
        else {
            return;
        };
        *self.nonce.lock().unwrap_or_else(PoisonError::into_inner) = Some(n.to_owned());
    }

    /// What the AS's tokens for `resource` look like (the config's entry,
    /// or: audience = the resource URI, named by `resource`, `scope`).
    fn shape(&self, resource: &str) -> UpstreamResource {
        self.resources
            .get(resource)
            .cloned()
            .unwrap_or_else(|| UpstreamResource {
                audience: vec![resource.to_owned()],
                audience_param: AudienceParam::Resource,
                scope_claim: ScopeClaim::Scope,
            })
    }

    /// The endpoints: the configured ones, or the metadata's (fetched once;
    /// a failure is retried by the next caller).
    async fn resolve(&self) -> Result<&Resolved, String> {
        self.resolved
            .get_or_try_init(|| async {
                let (token_endpoint, jwks_uri, advertised) = match (
                    self.cfg.discovery,
                    &self.cfg.token_endpoint,
                    &self.cfg.jwks_uri,
                ) {
                    (false, Some(t), Some(j)) => (t.clone(), j.clone(), Default::default()),
                    _ => call::discover(self).await?,
                };
                let htu = dpop::normalize_htu(&token_endpoint)
                    .ok_or_else(|| "the token endpoint is not a URL".to_string())?;
                let keys = match &self.shared_keys {
                    Some(k) if k.uri() == Some(jwks_uri.as_str()) => k.clone(),
                    _ => {
                        let set = RemoteKeySet::remote(
                            &jwks_uri,
                            keyset::MAX_ISSUER_JWKS,
                            keyset::http_client(),
                        );
                        // Learnt with the metadata, as the subject
                        // validator learns its issuers' keys at start: the
                        // first unknown `kid` (a rotation) then gets its
                        // refetch at once. A failure is retried on use.
                        if set.fetch().await.is_err() {
                            tracing::warn!(upstream = %self.cfg.name, "the upstream's JWKS could not be fetched; will retry on use");
                        }
                        Arc::new(set)
                    }
                };
                Ok(Resolved {
                    token_endpoint,
                    htu,
                    keys,
                    advertised,
                })
            })
            .await
    }
}
