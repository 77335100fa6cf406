//! `[upstreams.<name>]`: the organisation's authorization servers, where a
//! `source = "exchange"` resource's token comes from (RFC 8693 token
//! exchange; docs/UPSTREAM.md). Each is one AS with its own client
//! registration here.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::raw::{RawUpstream, RawUpstreamResource};
use super::{valid_name, Check, IssuerConfig};

/// The longest an exchanged token lives (seconds): a `reuse_margin` must be
/// below it, or no token could ever be given again.
const MAX_TOKEN_SECS: u64 = 300;

/// How credbroker authenticates to an upstream's token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamClientAuth {
    /// `client_secret_basic` (RFC 6749 section 2.3.1).
    SecretBasic,
    /// `client_secret_post`.
    SecretPost,
    /// `private_key_jwt` (RFC 7523 section 2.2): a client assertion signed
    /// with the broker's client key (`derive::client_keys`).
    PrivateKeyJwt,
}

/// How a derive gets its token from this upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamGrant {
    /// One RFC 8693 token exchange here, for an access token.
    TokenExchange,
    /// Identity chaining (the Identity Assertion JWT Authorization Grant):
    /// an RFC 8693 exchange here (the organisation's IdP) for an ID-JAG,
    /// then an RFC 7523 `jwt-bearer` grant with it at the resource's AS,
    /// the upstream named here.
    IdJag {
        /// The resource's AS: another `[upstreams.<name>]`, whose grant is
        /// `token_exchange`.
        resource_upstream: String,
    },
}

/// Which parameter names the resource in the exchange request (RFC 8693
/// section 2.1: `resource` is a URI, `audience` a logical name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AudienceParam {
    /// `resource` = the resource URI.
    Resource,
    /// `audience` = each configured audience.
    Audience,
    /// Both.
    Both,
}

/// Where the AS puts the granted scopes in its JWT access tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeClaim {
    /// `scope`: one space-separated string (RFC 9068, RFC 8693 section 4.2).
    Scope,
    /// `scp`: an array of strings (Okta, Entra ID).
    Scp,
}

/// What the AS's tokens for one resource look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamResource {
    /// The token's `aud`, exactly this set (default: the resource URI).
    pub audience: Vec<String>,
    /// Which parameter the request names the resource with.
    pub audience_param: AudienceParam,
    /// Where the token carries its scopes.
    pub scope_claim: ScopeClaim,
}

/// One upstream authorization server.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// Its name (the policy's `upstream`).
    pub name: String,
    /// Its issuer identifier: the tokens' `iss`, and the metadata's
    /// `issuer` (compared exactly).
    pub issuer: String,
    /// Whether its endpoints come from its metadata (RFC 8414 / OIDC
    /// discovery); otherwise both below are given.
    pub discovery: bool,
    /// The token endpoint given in the config (`discovery = false`).
    pub token_endpoint: Option<String>,
    /// The JWKS URI given in the config (`discovery = false`).
    pub jwks_uri: Option<String>,
    /// Our client id there.
    pub client_id: String,
    /// How we authenticate there.
    pub client_auth: UpstreamClientAuth,
    /// The file holding the client secret (mode 0600); none with
    /// `private_key_jwt`.
    pub client_secret_file: Option<PathBuf>,
    /// The trusted issuers whose subject tokens may be sent to it; no other
    /// subject token ever is. Empty only for an upstream that is another's
    /// `resource_upstream` (it then only redeems ID-JAGs).
    pub subject_issuers: Vec<String>,
    /// The audience a subject token must name (`aud`) to be sent to this
    /// server; none: any the subject validator accepted.
    pub subject_audience: Option<String>,
    /// Whether each exchange sends an actor token naming the agent, tool
    /// and step (signed with the client key, `actor_token_type` jwt).
    pub actor_token: bool,
    /// How a derive gets its token here.
    pub grant: UpstreamGrant,
    /// Bound on connecting.
    pub connect_timeout: Duration,
    /// Bound on a whole call, the answer read.
    pub timeout: Duration,
    /// How long a token must still live to be given again to the same
    /// derive (docs/UPSTREAM.md, "Reuse"); `None`: never reused.
    pub reuse_margin: Option<Duration>,
    /// Its RFC 7662 introspection endpoint: an opaque (non-JWT) access
    /// token it issues is accepted only if introspection there shows every
    /// fact a JWT must carry; `None`: opaque tokens are refused.
    pub introspection_endpoint: Option<String>,
    /// Per resource URI (as written; the policy's resource is matched after
    /// normalisation where the policy is known).
    pub resources: BTreeMap<String, UpstreamResource>,
}

/// Validates `[upstreams.<name>]`; `trusted` are the validated
/// `[[trusted_issuers]]`.
pub(super) fn upstreams(
    raw: BTreeMap<String, RawUpstream>,
    trusted: &[IssuerConfig],
    check: &mut Check<'_>,
) -> BTreeMap<String, UpstreamConfig> {
    // The resource ASes of `id_jag` upstreams, read before validation so
    // that one problem is reported once.
    let targets: std::collections::BTreeSet<String> = raw
        .values()
        .filter(|u| u.grant.as_deref() == Some("id_jag"))
        .filter_map(|u| u.resource_upstream.clone())
        .collect();
    let mut out = BTreeMap::new();
    for (name, u) in raw {
        let key = format!("upstreams.{name}");
        if !valid_name(&name) {
            check.bad(
                &key,
                "an upstream's name is letters, digits, '-' and '_' (at most 64)",
            );
            continue;
        }
        if let Some(c) = upstream(&name, u, trusted, &key, check) {
            out.insert(name, c);
        }
    }
    chains(&out, &targets, check);
    out
}

/// The upstreams' links to each other: an `id_jag` upstream's
/// `resource_upstream` is another upstream whose grant is
/// `token_exchange`; an upstream without `subject_issuers` is some
/// `id_jag` upstream's `resource_upstream` (it only redeems ID-JAGs).
fn chains(
    out: &BTreeMap<String, UpstreamConfig>,
    targets: &std::collections::BTreeSet<String>,
    check: &mut Check<'_>,
) {
    for (name, u) in out {
        let UpstreamGrant::IdJag { resource_upstream } = &u.grant else {
            continue;
        };
        let key = format!("upstreams.{name}.resource_upstream");
        match out.get(resource_upstream) {
            None => check.bad(&key, "names no [upstreams.<name>] table of this config"),
            Some(r) if r.grant != UpstreamGrant::TokenExchange => check.bad(
                &key,
                "names an upstream whose grant is id_jag: the resource's AS redeems the ID-JAG itself",
            ),
            Some(_) if resource_upstream == name => {
                check.bad(&key, "names this upstream itself")
            }
            Some(_) => {}
        }
    }
    for (name, u) in out {
        if u.subject_issuers.is_empty() && !targets.contains(name) {
            check.bad(&format!("upstreams.{name}.subject_issuers"), "must list at least one trusted issuer whose subject tokens may be sent to this authorization server");
        }
    }
}

fn upstream(
    name: &str,
    u: RawUpstream,
    trusted: &[IssuerConfig],
    key: &str,
    check: &mut Check<'_>,
) -> Option<UpstreamConfig> {
    let before = check.problems.len();
    check.url(&format!("{key}.issuer"), &u.issuer);
    let discovery = u.discovery.unwrap_or(true);
    for (k, v) in [
        ("token_endpoint", &u.token_endpoint),
        ("jwks_uri", &u.jwks_uri),
    ] {
        match (discovery, v) {
            (true, Some(_)) => check.bad(
                &format!("{key}.{k}"),
                "is learnt from the issuer's metadata while discovery is on: remove it, or set discovery = false and give both token_endpoint and jwks_uri",
            ),
            (false, None) => check.bad(
                &format!("{key}.{k}"),
                "is required with discovery = false",
            ),
            (false, Some(v)) => check.url(&format!("{key}.{k}"), v),
            (true, None) => {}
        }
    }
    if u.client_id.is_empty() || u.client_id.chars().any(char::is_control) {
        check.bad(
            &format!("{key}.client_id"),
            "must be a non-empty id without control characters",
        );
    }
    let (client_auth, client_secret_file) = client_auth(&u, key, check);
    for s in &u.subject_issuers {
        if !trusted.iter().any(|t| &t.issuer == s) {
            check.bad(
                &format!("{key}.subject_issuers"),
                "names an issuer that is not a [[trusted_issuers]] entry's issuer",
            );
        }
    }
    if u.subject_audience
        .as_ref()
        .is_some_and(|a| a.is_empty() || a.chars().any(char::is_control))
    {
        check.bad(
            &format!("{key}.subject_audience"),
            "must be a non-empty audience without control characters",
        );
    }
    let grant = grant(&u, key, check);
    let mut timeout = |k: &str, v: &Option<String>, default: u64| {
        v.as_deref()
            .and_then(|t| {
                check.duration_in(
                    &format!("{key}.{k}"),
                    t,
                    Duration::from_millis(1)..=Duration::from_secs(60),
                    "must be a duration between 1ms and 60s, such as \"3s\"",
                )
            })
            .unwrap_or(Duration::from_secs(default))
    };
    let connect_timeout = timeout("connect_timeout", &u.connect_timeout, 3);
    let total = timeout("timeout", &u.timeout, 10);
    let reuse_margin = u.reuse_margin.as_deref().and_then(|m| {
        check.duration_in(
            &format!("{key}.reuse_margin"),
            m,
            Duration::from_secs(1)..Duration::from_secs(MAX_TOKEN_SECS),
            "must be a duration from 1s to under 300s, such as \"60s\": the least a token must still live to be given again",
        )
    });
    if let Some(e) = &u.introspection_endpoint {
        check.url(&format!("{key}.introspection_endpoint"), e);
    }
    let mut resources = BTreeMap::new();
    for (uri, r) in u.resources {
        if let Some(r) = resource(&uri, r, &format!("{key}.resources.{uri:?}"), check) {
            resources.insert(uri, r);
        }
    }
    (check.problems.len() == before).then(|| UpstreamConfig {
        name: name.to_owned(),
        issuer: u.issuer,
        discovery,
        token_endpoint: u.token_endpoint,
        jwks_uri: u.jwks_uri,
        client_id: u.client_id,
        client_auth,
        client_secret_file,
        subject_issuers: u.subject_issuers,
        actor_token: u.actor_token.unwrap_or(false),
        subject_audience: u.subject_audience,
        grant,
        connect_timeout,
        timeout: total,
        reuse_margin,
        introspection_endpoint: u.introspection_endpoint,
        resources,
    })
}

/// `client_auth` and the client secret file it needs (none with
/// `private_key_jwt`: the client key signs instead).
fn client_auth(
    u: &RawUpstream,
    key: &str,
    check: &mut Check<'_>,
) -> (UpstreamClientAuth, Option<PathBuf>) {
    let client_auth = match u.client_auth.as_deref() {
        None | Some("client_secret_basic") => UpstreamClientAuth::SecretBasic,
        Some("client_secret_post") => UpstreamClientAuth::SecretPost,
        Some("private_key_jwt") => UpstreamClientAuth::PrivateKeyJwt,
        Some(_) => {
            check.bad(
                &format!("{key}.client_auth"),
                "must be \"client_secret_basic\", \"client_secret_post\" or \"private_key_jwt\"",
            );
            UpstreamClientAuth::SecretBasic
        }
    };
    let client_secret_file = match (&u.client_secret_file, client_auth) {
        (Some(_), UpstreamClientAuth::PrivateKeyJwt) => {
            check.bad(
                &format!("{key}.client_secret_file"),
                "is not used with client_auth = \"private_key_jwt\" (the client key signs instead): remove it",
            );
            None
        }
        (Some(p), _) => Some(check.rel(p)),
        (None, UpstreamClientAuth::PrivateKeyJwt) => None,
        (None, _) => {
            check.bad(
                &format!("{key}.client_secret_file"),
                "is required: the file (mode 0600) holding the client secret",
            );
            None
        }
    };
    (client_auth, client_secret_file)
}

/// `grant` and `resource_upstream`. An `id_jag` upstream is the person's
/// IdP: the ID-JAG names the person as the subject token does, so its
/// `subject_issuers` is its own issuer only.
fn grant(u: &RawUpstream, key: &str, check: &mut Check<'_>) -> UpstreamGrant {
    match (u.grant.as_deref(), &u.resource_upstream) {
        (None | Some("token_exchange"), None) => UpstreamGrant::TokenExchange,
        (None | Some("token_exchange"), Some(_)) => {
            check.bad(
                &format!("{key}.resource_upstream"),
                "is only for grant = \"id_jag\"",
            );
            UpstreamGrant::TokenExchange
        }
        (Some("id_jag"), None) => {
            check.bad(&format!("{key}.resource_upstream"), "is required with grant = \"id_jag\": the upstream (the resource's AS) where the ID-JAG is redeemed");
            UpstreamGrant::TokenExchange
        }
        (Some("id_jag"), Some(r)) => {
            if u.subject_issuers != [u.issuer.clone()] {
                check.bad(&format!("{key}.subject_issuers"), "must be exactly [issuer] with grant = \"id_jag\": the IdP asserts the identity of its own subject tokens");
            }
            UpstreamGrant::IdJag {
                resource_upstream: r.clone(),
            }
        }
        (Some(_), _) => {
            check.bad(
                &format!("{key}.grant"),
                "must be \"token_exchange\" or \"id_jag\"",
            );
            UpstreamGrant::TokenExchange
        }
    }
}

fn resource(
    uri: &str,
    r: RawUpstreamResource,
    key: &str,
    check: &mut Check<'_>,
) -> Option<UpstreamResource> {
    let before = check.problems.len();
    if url::Url::parse(uri).is_err() {
        check.bad(key, "is not a resource URI");
    }
    let audience = r.audience.unwrap_or_else(|| vec![uri.to_owned()]);
    if audience.is_empty()
        || audience
            .iter()
            .any(|a| a.is_empty() || a.chars().any(char::is_control))
    {
        check.bad(
            &format!("{key}.audience"),
            "must list at least one audience, each a non-empty string",
        );
    }
    let audience_param = match r.audience_param.as_deref() {
        None | Some("resource") => AudienceParam::Resource,
        Some("audience") => AudienceParam::Audience,
        Some("both") => AudienceParam::Both,
        Some(_) => {
            check.bad(
                &format!("{key}.audience_param"),
                "must be \"resource\", \"audience\" or \"both\"",
            );
            AudienceParam::Resource
        }
    };
    let scope_claim = match r.scope_claim.as_deref() {
        None | Some("scope") => ScopeClaim::Scope,
        Some("scp") => ScopeClaim::Scp,
        Some(_) => {
            check.bad(
                &format!("{key}.scope_claim"),
                "must be \"scope\" or \"scp\"",
            );
            ScopeClaim::Scope
        }
    };
    (check.problems.len() == before).then_some(UpstreamResource {
        audience,
        audience_param,
        scope_claim,
    })
}
