//! Subject tokens: who the derive is for.
//!
//! A subject token is a JWT from a trusted issuer, checked in order: size ->
//! parts -> base64url -> header (`typ` among the issuer's access-token types,
//! never `dpop+jwt`; `alg` in the issuer's allow-list and bound to the key;
//! no `crit`) -> key (pinned JWKS or JWKS URI only; `jku`/`x5u`/`x5c`/`jwk`
//! headers are ignored) -> signature -> typed claims -> `iss`, `aud`, `exp`,
//! `nbf` -> lifetime (`exp - iat`, or `exp - now` without `iat`, at most
//! `revocation.max_subject_token_lifetime`: a person stop is kept that long
//! plus margins, so it outlives every token it stops). ID tokens (`nonce`,
//! `at_hash`, `c_hash`), sender-constrained tokens (`cnf`) and credbroker's
//! own tokens are refused.
//!
//! An ID token is a subject token only where the derive says so
//! (`subject_token_type` id_token) and only for an `exchange` resource:
//! [`Validator::validate_id_token`] checks it as an ID token (OpenID
//! Connect Core section 3.1.3.7) for that resource's upstream: its issuer
//! is the upstream's, its `aud` names the broker's client there. It is
//! never cached, so it never reaches a `self` derive through the cache.
//!
//! The person is the pair (`iss`, `sub`). A verified token may be cached by
//! its SHA-256 for at most 60 s (an issuer with introspection:
//! `introspection_cache_ttl`) and never past its `exp`.
//!
//! Where the issuer's entry names an `introspection_endpoint`
//! ([`super::status`]), an opaque subject token is accepted through RFC
//! 7662 introspection there, when that issuer is the only one with an
//! endpoint (an opaque token names no issuer: it is never sent to another),
//! and with the same facts a JWT must carry; with `introspect_jwts` a JWT
//! that passed every check is asked about too. Inactive refuses; no answer
//! refuses (fail closed).

use std::collections::HashMap;
use std::sync::Arc;

use dashmap::DashMap;
use serde::Deserialize;

use super::status::{Failure, Status};
use crate::base::jose::{self, Audience, JoseError, JwkSet};
use crate::base::keyset::{self, Refetch, RemoteKeySet};
use crate::base::oauth::introspect::Introspection;
use crate::infra::config::{IssuerConfig, JwksSource, RevocationConfig};

/// The longest email kept (RFC 5321's path limit).
pub(crate) const MAX_EMAIL: usize = 254;

/// Subject tokens larger than this are refused before parsing.
pub(crate) const MAX_SUBJECT_LEN: usize = 16 * 1024;
/// Clock skew allowed on `exp` and `nbf`.
pub(crate) const SKEW: i64 = 30;
/// The longest a verified subject token stays cached.
pub(crate) const CACHE_TTL: i64 = 60;
const CACHE_MAX: usize = 50_000;

/// The person a request is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Person {
    /// The issuer.
    pub iss: String,
    /// The subject at that issuer.
    pub sub: String,
}

/// A verified subject token.
#[derive(Debug, Clone)]
pub struct Subject {
    /// Who.
    pub person: Person,
    /// The token's `exp`.
    pub exp: i64,
    /// The token's `auth_time` (OpenID Connect: when the person signed
    /// in), if it has one: only this lifts a sign-in stop
    /// (`derive::persons`); `iat` does not.
    pub auth_time: Option<i64>,
    /// The token's `email`, only when its `email_verified` is `true`:
    /// recorded so that a Shared Signals `email` subject can name the
    /// person (`accounts::emails`).
    pub email: Option<String>,
}

/// Why a subject token was refused. Carries no token bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubjectError {
    /// JWS-level problem.
    #[error("subject token: {0}")]
    Jose(#[from] JoseError),
    /// `iss` is not a trusted issuer.
    #[error("subject token issuer is not trusted")]
    UntrustedIssuer,
    /// `typ` is not an access-token type of that issuer.
    #[error("subject token typ is not an access token type of its issuer")]
    Typ,
    /// `alg` not allowed for the issuer.
    #[error("subject token alg is not allowed for its issuer")]
    Alg,
    /// No key for the `kid`.
    #[error("no key of the issuer matches the subject token")]
    UnknownKey,
    /// Claims missing or of the wrong type.
    #[error("subject token claims are missing or malformed")]
    Claims,
    /// `aud` does not name this agent.
    #[error("subject token audience is not this agent")]
    Audience,
    /// Expired or not yet valid.
    #[error("subject token is expired or not yet valid")]
    Expired,
    /// Lives longer than `revocation.max_subject_token_lifetime` (the
    /// bound, in seconds): a person stop is kept only that long.
    #[error("subject token lives longer than this broker accepts (exp - iat, or exp - now without iat, is over revocation.max_subject_token_lifetime, {0} s): a person stop must outlive every subject token; get a shorter-lived token from the issuer")]
    Lifetime(i64),
    /// An ID token, a DPoP-bound token, or one of ours.
    #[error("this is not an access token for this agent ({0})")]
    WrongKind(&'static str),
    /// An ID token (by `subject_token_type`) where none is accepted, or
    /// one that is not an ID token for the resource's upstream.
    #[error("an ID token is a subject token only for an exchange resource, issued by its upstream for the broker's client there ({0})")]
    IdToken(&'static str),
    /// The issuer's keys could not be fetched.
    #[error("the issuer's keys are unavailable")]
    KeysUnavailable,
    /// The issuer's introspection says the token is not active (revoked,
    /// expired there, or unknown to it).
    #[error("the subject token is not active at its issuer (RFC 7662 introspection): get a fresh token for the person")]
    Inactive,
    /// The issuer's introspection gave no usable answer: refused, fail
    /// closed.
    #[error("the subject token's status could not be asked of its issuer (introspection unavailable); nothing was issued; retry later")]
    IntrospectionUnavailable,
}

#[derive(Debug, Deserialize)]
struct PeekIss {
    iss: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct SubjectClaims {
    iss: String,
    sub: String,
    aud: Audience,
    #[serde(deserialize_with = "jose::numeric_date")]
    exp: i64,
    #[serde(default, deserialize_with = "jose::opt_numeric_date")]
    nbf: Option<i64>,
    #[serde(default)]
    nonce: Option<serde_json::Value>,
    #[serde(default)]
    at_hash: Option<serde_json::Value>,
    #[serde(default)]
    c_hash: Option<serde_json::Value>,
    #[serde(default)]
    cnf: Option<serde_json::Value>,
    #[serde(flatten)]
    rest: HashMap<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct IdTokenClaims {
    iss: String,
    sub: String,
    aud: Audience,
    #[serde(default)]
    azp: Option<String>,
    #[serde(deserialize_with = "jose::numeric_date")]
    exp: i64,
    #[serde(deserialize_with = "jose::numeric_date")]
    iat: i64,
    #[serde(default, deserialize_with = "jose::opt_numeric_date")]
    nbf: Option<i64>,
    #[serde(default)]
    cnf: Option<serde_json::Value>,
    #[serde(flatten)]
    rest: HashMap<String, serde_json::Value>,
}

struct Issuer {
    cfg: IssuerConfig,
    keys: Arc<RemoteKeySet>,
    /// Its introspection, when configured.
    status: Option<Status>,
}

impl From<Failure> for SubjectError {
    fn from(f: Failure) -> SubjectError {
        match f {
            Failure::Inactive => SubjectError::Inactive,
            Failure::Unavailable => SubjectError::IntrospectionUnavailable,
        }
    }
}

/// Validates subject tokens against the trusted issuers.
pub struct Validator {
    issuers: HashMap<String, Issuer>,
    /// The one issuer with an introspection endpoint, to which an opaque
    /// subject token goes (none, or several: opaque tokens are refused).
    opaque_issuer: Option<String>,
    cache: DashMap<[u8; 32], (Subject, i64)>,
    own_kid: Box<dyn Fn(&str) -> bool + Send + Sync>,
    /// The longest lifetime accepted, in seconds
    /// (`revocation.max_subject_token_lifetime`).
    max_lifetime: i64,
}

impl std::fmt::Debug for Validator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("subject::Validator")
            .field("issuers", &self.issuers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Errors building the validator (at start-up).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A pinned JWKS file could not be read or parsed.
    #[error("trusted_issuers[{index}].jwks_file: {path}: {reason} (trusted issuer {issuer})")]
    JwksFile {
        /// The issuer's place in the config's `trusted_issuers` list, so the
        /// message names the key.
        index: usize,
        /// Issuer.
        issuer: String,
        /// File.
        path: String,
        /// Why.
        reason: String,
    },
    /// The introspection client could not be set up (its secret file).
    #[error("trusted_issuers[{index}].introspection_client_secret_file: {reason} (trusted issuer {issuer})")]
    Introspection {
        /// The issuer's place in `trusted_issuers`.
        index: usize,
        /// Issuer.
        issuer: String,
        /// Why.
        reason: String,
    },
}

impl Validator {
    /// Builds the validator; pinned JWKS files are read now, JWKS URIs on
    /// first use. `own_kid` tells credbroker's own signing keys.
    pub async fn new(
        issuers: &[IssuerConfig],
        own_kid: Box<dyn Fn(&str) -> bool + Send + Sync>,
    ) -> Result<Validator, SetupError> {
        let http = keyset::http_client();
        let mut map = HashMap::new();
        for (index, cfg) in issuers.iter().enumerate() {
            let keys = match &cfg.jwks {
                JwksSource::File(p) => {
                    let bytes = std::fs::read(p).map_err(|e| SetupError::JwksFile {
                        index,
                        issuer: cfg.issuer.clone(),
                        path: p.display().to_string(),
                        reason: e.to_string(),
                    })?;
                    RemoteKeySet::pinned(JwkSet::from_json(&bytes).map_err(|e| {
                        SetupError::JwksFile {
                            index,
                            issuer: cfg.issuer.clone(),
                            path: p.display().to_string(),
                            reason: e.to_string(),
                        }
                    })?)
                }
                JwksSource::Uri(u) => {
                    let set = RemoteKeySet::remote(u, keyset::MAX_ISSUER_JWKS, http.clone());
                    if set.fetch().await.is_err() {
                        tracing::warn!(issuer = %cfg.issuer, "JWKS not reachable at start-up; will retry on first use");
                    }
                    set
                }
            };
            let status = match &cfg.introspection {
                Some(i) => Some(Status::new(&cfg.issuer, i).map_err(|reason| {
                    SetupError::Introspection {
                        index,
                        issuer: cfg.issuer.clone(),
                        reason,
                    }
                })?),
                None => None,
            };
            map.insert(
                cfg.issuer.clone(),
                Issuer {
                    cfg: cfg.clone(),
                    keys: Arc::new(keys),
                    status,
                },
            );
        }
        let with_status: Vec<&String> = map
            .iter()
            .filter(|(_, i)| i.status.is_some())
            .map(|(k, _)| k)
            .collect();
        if with_status.len() > 1 {
            tracing::warn!(issuers = ?with_status, "several trusted issuers have an introspection_endpoint: opaque subject tokens are refused (one names no issuer, and is never sent to one that may not have issued it); JWTs are introspected by their own issuer");
        }
        let opaque_issuer = match with_status.as_slice() {
            [one] => Some((*one).clone()),
            _ => None,
        };
        Ok(Validator {
            opaque_issuer,
            issuers: map,
            cache: DashMap::new(),
            own_kid,
            max_lifetime: lifetime_secs(RevocationConfig::default().max_subject_token_lifetime),
        })
    }

    /// The validator refusing subject tokens that live longer than `max`
    /// (`revocation.max_subject_token_lifetime`; without it, that key's
    /// default).
    pub fn with_max_lifetime(mut self, max: std::time::Duration) -> Validator {
        self.max_lifetime = lifetime_secs(max);
        self
    }

    /// Refuses a token living longer than the bound: `exp - iat`, or
    /// `exp - now` for a token without `iat` (then the bound holds from
    /// now on only; docs/REVOCATION.md says so).
    fn check_lifetime(&self, exp: i64, iat: Option<i64>, now: i64) -> Result<(), SubjectError> {
        if exp.saturating_sub(iat.unwrap_or(now)) > self.max_lifetime {
            return Err(SubjectError::Lifetime(self.max_lifetime));
        }
        Ok(())
    }

    /// Every issuer's key set, by issuer. The wiring hands these to the
    /// pages, so that an IdP that is both a subject-token issuer and a
    /// sign-in source has one cache, not two.
    pub fn key_sets(&self) -> HashMap<String, Arc<RemoteKeySet>> {
        self.issuers
            .iter()
            .map(|(iss, i)| (iss.clone(), i.keys.clone()))
            .collect()
    }

    /// Drops every cached subject (trust configuration changed).
    pub fn flush_cache(&self) {
        self.cache.clear();
    }

    /// Drops the cached subjects of `person` (a person stopped); returns
    /// how many.
    pub fn drop_person(&self, person: &Person) -> usize {
        let before = self.cache.len();
        self.cache.retain(|_, (s, _)| s.person != *person);
        before.saturating_sub(self.cache.len())
    }

    /// Number of cached subjects.
    pub fn cache_len(&self) -> usize {
        self.cache.len()
    }

    /// The issuer config for `iss`.
    pub fn issuer(&self, iss: &str) -> Option<&IssuerConfig> {
        self.issuers.get(iss).map(|i| &i.cfg)
    }

    /// Validates a subject token at `now`. The bool says whether it came from
    /// the cache.
    pub async fn validate(&self, token: &str, now: i64) -> Result<(Subject, bool), SubjectError> {
        if token.len() > MAX_SUBJECT_LEN {
            return Err(SubjectError::Jose(JoseError::TooLarge(MAX_SUBJECT_LEN)));
        }
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        if let Some(hit) = self.cache.get(&key) {
            let (subject, until) = hit.value();
            if now < *until && now < subject.exp + SKEW {
                return Ok((subject.clone(), true));
            }
        }
        let subject = self.validate_uncached(token, now).await?;
        // An issuer's introspection answer stands no longer than its
        // `introspection_cache_ttl`.
        let ttl = self
            .issuers
            .get(&subject.person.iss)
            .and_then(|i| i.status.as_ref())
            .map_or(CACHE_TTL, |s| {
                (s.cfg.cache_ttl.as_secs() as i64).min(CACHE_TTL)
            });
        let until = (now + ttl).min(subject.exp);
        if until > now {
            if self.cache.len() >= CACHE_MAX {
                self.cache.retain(|_, (_, u)| *u > now);
                if self.cache.len() >= CACHE_MAX {
                    self.cache.clear();
                }
            }
            self.cache.insert(key, (subject.clone(), until));
        }
        Ok((subject, false))
    }

    async fn validate_uncached(&self, token: &str, now: i64) -> Result<Subject, SubjectError> {
        let jws = match jose::parse(token, MAX_SUBJECT_LEN) {
            Ok(jws) => jws,
            Err(e) => {
                return match self
                    .opaque_issuer
                    .as_ref()
                    .and_then(|i| self.issuers.get(i))
                {
                    Some(issuer) => self.validate_opaque(issuer, token, now).await,
                    None => Err(e.into()),
                }
            }
        };
        // Which issuer: read `iss` (unverified) only to pick the keys.
        let peek: PeekIss =
            serde_json::from_slice(&jws.payload).map_err(|_| SubjectError::Claims)?;
        let iss = match peek.iss {
            Some(serde_json::Value::String(s)) => s,
            _ => return Err(SubjectError::Claims),
        };
        let issuer = self
            .issuers
            .get(&iss)
            .ok_or(SubjectError::UntrustedIssuer)?;
        // A DPoP proof gets its own reason, before the issuer's list is
        // consulted (an issuer's list could never make one a subject token).
        if jws
            .header
            .typ
            .as_deref()
            .map(jose::normalize_typ)
            .as_deref()
            == Some("dpop+jwt")
        {
            return Err(SubjectError::WrongKind("a DPoP proof"));
        }
        let types: Vec<&str> = issuer.cfg.token_types.iter().map(String::as_str).collect();
        let alg = jose::check_header(
            &jws.header,
            &jose::HeaderRule {
                typ: jose::TypRule::MediaTypes {
                    allowed: &types,
                    absent_ok: false,
                },
                algs: &issuer.cfg.algs,
            },
        )
        .map_err(|e| match e {
            jose::HeaderError::Typ => SubjectError::Typ,
            jose::HeaderError::Alg => SubjectError::Alg,
        })?;
        if let Some(kid) = &jws.header.kid {
            if (self.own_kid)(kid) {
                return Err(SubjectError::WrongKind("a token minted by credbroker"));
            }
        }
        self.verify(issuer, &jws, alg, now).await?;
        let claims: SubjectClaims =
            serde_json::from_slice(&jws.payload).map_err(|_| SubjectError::Claims)?;
        if claims.iss != issuer.cfg.issuer || claims.sub.is_empty() {
            return Err(SubjectError::Claims);
        }
        if !claims.aud.contains(&issuer.cfg.audience) {
            return Err(SubjectError::Audience);
        }
        if claims.exp + SKEW <= now || claims.nbf.is_some_and(|n| n - SKEW > now) {
            return Err(SubjectError::Expired);
        }
        self.check_lifetime(claims.exp, numeric_claim(&claims.rest, "iat")?, now)?;
        if claims.nonce.is_some() || claims.at_hash.is_some() || claims.c_hash.is_some() {
            return Err(SubjectError::WrongKind("an ID token"));
        }
        if claims.cnf.is_some() {
            return Err(SubjectError::WrongKind("a sender-constrained token"));
        }
        // A Security Event Token says something about a person; it is
        // never a credential for them.
        if claims.rest.contains_key("events") {
            return Err(SubjectError::WrongKind("a Security Event Token"));
        }
        for c in &issuer.cfg.required_claims {
            if !claims.rest.contains_key(c) {
                return Err(SubjectError::Claims);
            }
        }
        if let Some(status) = issuer.status.as_ref().filter(|s| s.cfg.jwts) {
            let a = status.ask(token).await.map_err(SubjectError::from)?;
            // The issuer's answer is about this token's person, or none.
            if a.sub.as_ref().is_some_and(|s| *s != claims.sub)
                || a.iss.as_ref().is_some_and(|i| *i != claims.iss)
            {
                return Err(SubjectError::Claims);
            }
        }
        Ok(Subject {
            person: Person {
                iss: claims.iss,
                sub: claims.sub,
            },
            exp: claims.exp,
            // A malformed `auth_time` counts as none: it never lifts a stop.
            auth_time: claims
                .rest
                .get("auth_time")
                .and_then(serde_json::Value::as_i64)
                .filter(|t| *t > 0),
            email: verified_email(&claims.rest),
        })
    }

    /// An opaque subject token, through `issuer`'s introspection: active,
    /// with the facts a JWT must carry (`iss` the issuer where given,
    /// `sub`, `aud` naming this agent, `exp` and `nbf`, no `cnf` or DPoP
    /// `token_type`, the issuer's required claims).
    async fn validate_opaque(
        &self,
        issuer: &Issuer,
        token: &str,
        now: i64,
    ) -> Result<Subject, SubjectError> {
        let Some(status) = &issuer.status else {
            return Err(SubjectError::UntrustedIssuer);
        };
        let a: Introspection = status.ask(token).await.map_err(SubjectError::from)?;
        let sub = a.sub.clone().filter(|s| !s.is_empty());
        let (Some(sub), Some(exp)) = (sub, a.exp) else {
            return Err(SubjectError::Claims);
        };
        if a.iss.as_ref().is_some_and(|i| *i != issuer.cfg.issuer) {
            return Err(SubjectError::Claims);
        }
        if !a
            .aud
            .as_ref()
            .is_some_and(|aud| aud.contains(&issuer.cfg.audience))
        {
            return Err(SubjectError::Audience);
        }
        if exp + SKEW <= now || a.nbf.is_some_and(|n| n - SKEW > now) {
            return Err(SubjectError::Expired);
        }
        self.check_lifetime(exp, a.iat, now)?;
        let dpop = a
            .token_type
            .as_deref()
            .is_some_and(|t| t.eq_ignore_ascii_case("DPoP"));
        if a.cnf.is_some() || dpop {
            return Err(SubjectError::WrongKind("a sender-constrained token"));
        }
        let typed = |c: &str| match c {
            "iss" => a.iss.is_some(),
            "scope" => a.scope.is_some(),
            "iat" => a.iat.is_some(),
            "jti" => a.jti.is_some(),
            "sub" | "aud" | "exp" => true,
            other => a.rest.contains_key(other),
        };
        if !issuer.cfg.required_claims.iter().all(|c| typed(c)) {
            return Err(SubjectError::Claims);
        }
        Ok(Subject {
            person: Person {
                iss: issuer.cfg.issuer.clone(),
                sub,
            },
            exp,
            auth_time: a
                .rest
                .get("auth_time")
                .and_then(serde_json::Value::as_i64)
                .filter(|t| *t > 0),
            email: verified_email(&a.rest),
        })
    }

    /// The signature of `jws` by a key of `issuer` (its key set, refetched
    /// on an unknown `kid` at most once a minute).
    async fn verify(
        &self,
        issuer: &Issuer,
        jws: &jose::Jws<'_>,
        alg: jose::Alg,
        now: i64,
    ) -> Result<(), SubjectError> {
        let kid = jws.header.kid.as_deref();
        let keys = issuer.keys.keys();
        let jwk = match keys.select(kid, alg) {
            Some(k) => k.clone(),
            None => {
                let fresh = self
                    .refetch(issuer, now)
                    .await
                    .ok_or(SubjectError::UnknownKey)?;
                fresh
                    .select(kid, alg)
                    .cloned()
                    .ok_or(SubjectError::UnknownKey)?
            }
        };
        jwk.verify(alg, jws).map_err(|e| match e {
            JoseError::Alg => SubjectError::Alg,
            e => SubjectError::Jose(e),
        })
    }

    /// Validates an ID token as a subject token for an `exchange`
    /// resource whose upstream has issuer `issuer` and knows the broker as
    /// `client_id` (OpenID Connect Core section 3.1.3.7): size, a typed
    /// header (`typ` absent or `JWT`; never an access token's, a DPoP
    /// proof's or a token of ours), `alg` in the issuer's list, the
    /// issuer's keys, the signature, `iss` = `issuer` (a trusted issuer),
    /// `sub`, `aud` naming `client_id` (with several audiences, `azp` =
    /// `client_id`; `azp`, when present, always), `iat` and `exp` (30 s
    /// skew), `nbf`, no `cnf`, the issuer's required claims. Never cached.
    pub async fn validate_id_token(
        &self,
        token: &str,
        now: i64,
        issuer: &str,
        client_id: &str,
    ) -> Result<Subject, SubjectError> {
        let jws = jose::parse(token, MAX_SUBJECT_LEN)?;
        let peek: PeekIss =
            serde_json::from_slice(&jws.payload).map_err(|_| SubjectError::Claims)?;
        if peek.iss.as_ref().and_then(|v| v.as_str()) != Some(issuer) {
            return Err(SubjectError::IdToken(
                "its iss is not the upstream's issuer",
            ));
        }
        let trusted = self
            .issuers
            .get(issuer)
            .ok_or(SubjectError::UntrustedIssuer)?;
        let alg = jose::check_header(
            &jws.header,
            &jose::HeaderRule {
                typ: jose::TypRule::MediaTypes {
                    allowed: &["JWT"],
                    absent_ok: true,
                },
                algs: &trusted.cfg.algs,
            },
        )
        .map_err(|e| match e {
            jose::HeaderError::Typ => SubjectError::IdToken("its typ is not an ID token's"),
            jose::HeaderError::Alg => SubjectError::Alg,
        })?;
        if jws.header.kid.as_deref().is_some_and(|k| (self.own_kid)(k)) {
            return Err(SubjectError::WrongKind("a token minted by credbroker"));
        }
        self.verify(trusted, &jws, alg, now).await?;
        let c: IdTokenClaims =
            serde_json::from_slice(&jws.payload).map_err(|_| SubjectError::Claims)?;
        if c.iss != issuer || c.sub.is_empty() {
            return Err(SubjectError::Claims);
        }
        let several = matches!(&c.aud, Audience::Many(v) if v.len() > 1);
        if !c.aud.contains(client_id)
            || c.azp.as_deref().is_some_and(|a| a != client_id)
            || (several && c.azp.is_none())
        {
            return Err(SubjectError::Audience);
        }
        if c.exp + SKEW <= now || c.iat - SKEW > now || c.nbf.is_some_and(|n| n - SKEW > now) {
            return Err(SubjectError::Expired);
        }
        self.check_lifetime(c.exp, Some(c.iat), now)?;
        if c.cnf.is_some() {
            return Err(SubjectError::WrongKind("a sender-constrained token"));
        }
        if trusted
            .cfg
            .required_claims
            .iter()
            .any(|k| !c.rest.contains_key(k))
        {
            return Err(SubjectError::Claims);
        }
        Ok(Subject {
            person: Person {
                iss: c.iss,
                sub: c.sub,
            },
            exp: c.exp,
            email: verified_email(&c.rest),
            // As for access tokens: a malformed one counts as none.
            auth_time: c
                .rest
                .get("auth_time")
                .and_then(serde_json::Value::as_i64)
                .filter(|t| *t > 0),
        })
    }

    /// Refetches a JWKS URI, at most once a minute per issuer.
    async fn refetch(&self, issuer: &Issuer, now: i64) -> Option<Arc<JwkSet>> {
        match issuer.keys.refetch(now).await {
            Ok(Refetch::Fetched(set) | Refetch::Throttled(set)) => Some(set),
            Ok(Refetch::Pinned) => None,
            Err(_) => {
                tracing::warn!(issuer = %issuer.cfg.issuer, "JWKS refetch failed");
                None
            }
        }
    }
}

/// The bound in seconds, as the checks compare it.
fn lifetime_secs(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// A NumericDate claim among the others, if present; present and not a
/// NumericDate refuses the token (fail closed).
fn numeric_claim(
    rest: &HashMap<String, serde_json::Value>,
    name: &str,
) -> Result<Option<i64>, SubjectError> {
    rest.get(name)
        .map(|v| jose::numeric_date(v).map_err(|_| SubjectError::Claims))
        .transpose()
}

/// The `email` claim when `email_verified` is `true` (the boolean, not a
/// string), and it is short enough to be an address.
fn verified_email(rest: &HashMap<String, serde_json::Value>) -> Option<String> {
    if rest.get("email_verified") != Some(&serde_json::Value::Bool(true)) {
        return None;
    }
    rest.get("email")
        .and_then(serde_json::Value::as_str)
        .filter(|e| e.len() <= MAX_EMAIL)
        .map(str::to_owned)
}
