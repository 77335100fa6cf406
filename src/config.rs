//! Configuration: raw TOML -> validated [`Config`], in two stages.
//!
//! Stage one deserializes into raw structs and collects *every* unknown key
//! with its path (through `serde_ignored`, so that one run reports them all,
//! where `deny_unknown_fields` would stop at the first). Stage two checks the
//! values and collects every problem. Messages name keys and positions, never
//! values: a secret pasted into the wrong key must not end up in a log.
//!
//! Secrets are never inline: the config names files (mode 0600) that hold
//! them. Relative paths are resolved against the config file's directory.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// One problem in a config or policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `file:line:column` when known, else the file.
    pub at: String,
    /// The key path (`dpop.replay_capacity`), when known.
    pub key: Option<String>,
    /// What is wrong, without the value.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(k) => write!(f, "{}: {}: {}", self.at, k, self.message),
            None => write!(f, "{}: {}", self.at, self.message),
        }
    }
}

/// Errors loading the config: all problems found, each with its place.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// One or more problems in the file.
    #[error("{}", format_problems(.0))]
    Invalid(Vec<Problem>),
}

fn format_problems(p: &[Problem]) -> String {
    let mut s = format!("{} problem(s) in the configuration:", p.len());
    for x in p {
        s.push_str("\n  ");
        s.push_str(&x.to_string());
    }
    s
}

/// Converts a byte offset into 1-based `line:column`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// Removes quoted values from a TOML/serde message, so that an error never
/// echoes what was written in the file. serde quotes values in backticks
/// too (``invalid type: integer `5` ``, ``unknown variant `x` ``); those are
/// removed as well, except in messages that name a key (``missing field
/// `agent` ``).
pub fn redact_values(msg: &str) -> String {
    let names_a_key = [
        "missing field",
        "duplicate field",
        "duplicate key",
        "unknown field",
    ]
    .iter()
    .any(|p| msg.starts_with(p));
    let mut out = String::with_capacity(msg.len());
    let mut in_quote = None;
    let mut chars = msg.chars();
    while let Some(c) = chars.next() {
        let quote = c == '"' || (c == '`' && !names_a_key);
        match in_quote {
            // serde shows strings with Debug escapes: `\"` does not close.
            Some('"') if c == '\\' => {
                chars.next();
            }
            None if quote => {
                out.push(c);
                out.push('…');
                out.push(c);
                in_quote = Some(c);
            }
            None => out.push(c),
            Some(q) if q == c => in_quote = None,
            Some(_) => {}
        }
    }
    // Keep only the first line: toml renders a snippet of the file after it.
    out.lines().next().unwrap_or_default().trim().to_string()
}

/// Parses TOML text into `T`, collecting unknown keys and type errors as
/// problems with positions.
pub fn parse_toml<T: serde::de::DeserializeOwned>(
    file: &Path,
    text: &str,
) -> Result<T, Vec<Problem>> {
    let de = match toml::de::Deserializer::parse(text) {
        Ok(d) => d,
        Err(e) => return Err(vec![toml_problem(file, text, &e)]),
    };
    let mut unknown = Vec::new();
    let parsed: Result<T, _> =
        serde_ignored::deserialize(de, |path| unknown.push(path.to_string()));
    let mut problems: Vec<Problem> = unknown
        .into_iter()
        .map(|k| Problem {
            at: locate_key(file, text, &k),
            key: Some(k),
            message: "unknown key".into(),
        })
        .collect();
    match parsed {
        Ok(v) if problems.is_empty() => Ok(v),
        Ok(_) => Err(problems),
        Err(e) => {
            problems.push(toml_problem(file, text, &e));
            Err(problems)
        }
    }
}

fn toml_problem(file: &Path, text: &str, e: &toml::de::Error) -> Problem {
    let at = match e.span() {
        Some(span) => {
            let (l, c) = line_col(text, span.start);
            format!("{}:{l}:{c}", file.display())
        }
        None => file.display().to_string(),
    };
    Problem {
        at,
        key: None,
        message: redact_values(e.message()),
    }
}

/// A TOML key as written (`a."b.c"`) -> its dotted path (`a.b.c`), the form
/// `serde_ignored` reports.
fn dotted(key: &str) -> String {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut quote = None;
    for c in key.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '.' => parts.push(std::mem::take(&mut cur).trim().to_string()),
            None => cur.push(c),
        }
    }
    parts.push(cur.trim().to_string());
    parts.join(".")
}

/// Best-effort position of a key path (`socket.path`,
/// `trusted_issuers[1].issuer`, `trusted_issuers.1.issuer`) in the text:
/// table headers and array-of-tables indexes are followed, so a key is not
/// confused with one of the same name in another table. Falls back to the
/// closest enclosing table or key, then to the file.
fn locate_key(file: &Path, text: &str, path: &str) -> String {
    let target = path.replace('[', ".").replace(']', "");
    let mut table = String::new();
    let mut arrays: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut best: Option<(usize, usize, usize)> = None;
    let join = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_string()
        } else {
            format!("{a}.{b}")
        }
    };
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let col = line.len() - t.len() + 1;
        let (found, rest) = if let Some(h) = t.strip_prefix("[[") {
            let name = dotted(h.split("]]").next().unwrap_or(""));
            let n = arrays.entry(name.clone()).or_insert(0);
            table = format!("{name}.{n}");
            *n += 1;
            (table.clone(), "")
        } else if let Some(h) = t.strip_prefix('[') {
            table = dotted(h.split(']').next().unwrap_or(""));
            (table.clone(), "")
        } else if let Some((k, rest)) = t.split_once('=').filter(|_| !t.starts_with('#')) {
            (join(&table, &dotted(k)), rest)
        } else {
            continue;
        };
        if found == target {
            return format!("{}:{}:{col}", file.display(), i + 1);
        }
        let Some(sub) = target.strip_prefix(&format!("{found}.")) else {
            continue;
        };
        // A key inside an inline table on this line: `sign_in = { kind = .. }`.
        let inner = sub.split('.').next().unwrap_or(sub);
        let in_line = rest.match_indices(inner).find(|(at, _)| {
            let before = rest[..*at].trim_end();
            let after = rest[at + inner.len()..].trim_start();
            (before.ends_with('{') || before.ends_with(',')) && after.starts_with('=')
        });
        if let Some((at, _)) = in_line {
            let c = line.len() - rest.len() + at + 1;
            return format!("{}:{}:{c}", file.display(), i + 1);
        }
        if best.is_none_or(|(len, _, _)| found.len() > len) {
            best = Some((found.len(), i + 1, col));
        }
    }
    match best {
        Some((_, l, c)) => format!("{}:{l}:{c}", file.display()),
        None => file.display().to_string(),
    }
}

/// Parses `"300s"`, `"5m"`, `"1h"`, `"250ms"`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = num.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        _ => None,
    }
}

// ---------------------------------------------------------------- raw stage

#[derive(Debug, Deserialize)]
struct RawConfig {
    agent: String,
    issuer: String,
    policy: PathBuf,
    store: PathBuf,
    #[serde(default)]
    audit_log: Option<PathBuf>,
    socket: RawSocket,
    #[serde(default)]
    admin: Option<RawAdmin>,
    #[serde(default)]
    public: Option<RawPublic>,
    keys: RawKeys,
    #[serde(default)]
    dpop: RawDpop,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    trusted_issuers: Vec<RawIssuer>,
    #[serde(default)]
    vault: Option<RawVault>,
    #[serde(default)]
    providers: std::collections::BTreeMap<String, RawProvider>,
}

#[derive(Debug, Deserialize)]
struct RawVault {
    key_dir: PathBuf,
}

#[derive(Debug, Deserialize)]
struct RawProvider {
    #[serde(default)]
    preset: Option<String>,
    #[serde(default)]
    display_name: Option<String>,
    #[serde(default)]
    issuer: Option<String>,
    #[serde(default)]
    authorization_endpoint: Option<String>,
    #[serde(default)]
    token_endpoint: Option<String>,
    #[serde(default)]
    revocation_endpoint: Option<String>,
    #[serde(default)]
    userinfo_endpoint: Option<String>,
    client_id: String,
    #[serde(default)]
    client_secret_file: Option<PathBuf>,
    #[serde(default)]
    token_endpoint_auth: Option<String>,
    #[serde(default)]
    redirect_uri: Option<String>,
    #[serde(default)]
    scopes: Option<Vec<String>>,
    #[serde(default)]
    narrow_on_refresh: Option<bool>,
    #[serde(default)]
    account: Option<RawAccountLookup>,
    #[serde(default)]
    timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawAccountLookup {
    #[serde(default)]
    userinfo_id_claim: Option<String>,
    #[serde(default)]
    userinfo_name_claim: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    id_field: Option<String>,
    #[serde(default)]
    name_field: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawSocket {
    path: PathBuf,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    allowed_uids: Option<Vec<u32>>,
    #[serde(default)]
    max_connections: Option<usize>,
    #[serde(default)]
    header_timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawAdmin {
    socket: PathBuf,
}

#[derive(Debug, Deserialize)]
struct RawPublic {
    listen: String,
    #[serde(default)]
    tls_cert: Option<PathBuf>,
    #[serde(default)]
    tls_key: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
struct RawKeys {
    master_key_file: PathBuf,
}

#[derive(Debug, Default, Deserialize)]
struct RawDpop {
    #[serde(default)]
    require_nonce: bool,
    #[serde(default)]
    algs: Option<Vec<String>>,
    #[serde(default)]
    replay_capacity: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
struct RawLimits {
    #[serde(default)]
    per_peer_per_second: Option<u32>,
    #[serde(default)]
    per_person_tool_per_second: Option<u32>,
    #[serde(default)]
    burst: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct RawIssuer {
    issuer: String,
    #[serde(default)]
    audience: Option<String>,
    #[serde(default)]
    jwks_file: Option<PathBuf>,
    #[serde(default)]
    jwks_uri: Option<String>,
    #[serde(default)]
    algs: Option<Vec<String>>,
    #[serde(default)]
    token_types: Option<Vec<String>>,
    #[serde(default)]
    required_claims: Option<Vec<String>>,
    #[serde(default)]
    sign_in: Option<RawSignIn>,
}

/// A plain struct rather than a tagged enum: serde buffers a tagged enum's
/// content, so `serde_ignored` would never see a misspelt key inside it, and
/// an unknown `kind` would be echoed in serde's message.
#[derive(Debug, Deserialize)]
struct RawSignIn {
    kind: String,
    #[serde(default)]
    client_id: Option<String>,
    #[serde(default)]
    client_secret_file: Option<PathBuf>,
}

// ---------------------------------------------------------- validated stage

/// The validated configuration of one instance.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this was read from.
    pub file: PathBuf,
    /// The one agent this instance serves (docs/DESIGN.md section 2).
    pub agent: String,
    /// The public issuer URL: `iss` of minted tokens, base of `htu`.
    pub issuer: String,
    /// The policy file.
    pub policy: PathBuf,
    /// The store directory.
    pub store: PathBuf,
    /// Audit events (JSON lines); `None` = `<store>/audit.jsonl`.
    pub audit_log: PathBuf,
    /// The orchestrator socket.
    pub socket: SocketConfig,
    /// The admin socket.
    pub admin_socket: PathBuf,
    /// The public listener, if any.
    pub public: Option<PublicConfig>,
    /// File holding the 32-byte key that encrypts keys at rest (0600).
    pub master_key_file: PathBuf,
    /// DPoP settings.
    pub dpop: DpopConfig,
    /// Rate limits.
    pub limits: LimitsConfig,
    /// Trusted subject-token issuers.
    pub trusted_issuers: Vec<IssuerConfig>,
    /// Directory of the vault's key files (each 32 bytes, mode 0600).
    pub vault_key_dir: PathBuf,
    /// Third-party services people can connect, by name.
    pub providers: std::collections::BTreeMap<String, ProviderConfig>,
}

/// How credbroker authenticates to a provider's token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// HTTP Basic with the client id and secret (RFC 6749 section 2.3.1).
    Basic,
    /// `client_id` and `client_secret` in the form body.
    Post,
    /// A public client: `client_id` only (PKCE carries the proof).
    None,
}

/// A provider's endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// Authorization endpoint (browser).
    pub authorization: String,
    /// Token endpoint.
    pub token: String,
    /// RFC 7009 revocation endpoint, if the provider has one.
    pub revocation: Option<String>,
    /// OIDC userinfo endpoint, if any.
    pub userinfo: Option<String>,
    /// Whether the provider always sends `iss` on its authorization
    /// response (RFC 9207 `authorization_response_iss_parameter_supported`).
    pub sends_iss: bool,
}

/// How to learn the name of the account at the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccountLookup {
    /// Claims of the OIDC userinfo answer.
    Userinfo {
        /// Claim holding the stable account id (default `sub`).
        id_claim: String,
        /// Claim holding the display name (default `preferred_username`).
        name_claim: String,
    },
    /// A JSON API called with the access token.
    Api {
        /// The URL.
        url: String,
        /// Field holding the stable account id.
        id_field: String,
        /// Field holding the display name.
        name_field: String,
    },
}

/// One third-party service (an OAuth 2.0 / OpenID Connect provider).
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// Its name (the policy's `service`).
    pub name: String,
    /// The name people know it by, for messages and pages.
    pub display_name: String,
    /// The provider's issuer: discovery (RFC 8414 / OIDC) when endpoints
    /// are not all given, and the RFC 9207 `iss` check.
    pub issuer: Option<String>,
    /// Endpoints given in the config; `None` = discover from `issuer`.
    pub endpoints: Option<Endpoints>,
    /// Our client id at the provider.
    pub client_id: String,
    /// File holding the client secret (mode 0600), if any.
    pub client_secret_file: Option<PathBuf>,
    /// Token endpoint authentication.
    pub client_auth: ClientAuth,
    /// The one redirect URI registered for this provider.
    pub redirect_uri: String,
    /// Scopes asked for when connecting, besides those a tool needs.
    pub scopes: Vec<String>,
    /// Whether the provider accepts a narrower `scope` on refresh.
    pub narrow_on_refresh: bool,
    /// How to read the account's id and name.
    pub account: AccountLookup,
    /// Bound on each call to the provider.
    pub timeout: Duration,
}

/// The GitHub preset: GitHub's OAuth app endpoints. GitHub accepts PKCE
/// S256 without enforcing it, so `state` is always sent and checked; it has
/// no RFC 7009 revocation endpoint and does not narrow on refresh.
pub const GITHUB_AUTHORIZE: &str = "https://github.com/login/oauth/authorize";
/// GitHub's token endpoint.
pub const GITHUB_TOKEN: &str = "https://github.com/login/oauth/access_token";
/// GitHub's user API (account id `id`, name `login`).
pub const GITHUB_USER_API: &str = "https://api.github.com/user";

/// The orchestrator socket.
#[derive(Debug, Clone)]
pub struct SocketConfig {
    /// Socket path; its directory is created 0750.
    pub path: PathBuf,
    /// Group owning the directory and the socket (the orchestrator's).
    pub group: Option<String>,
    /// Peer uids allowed to connect (`SO_PEERCRED`).
    pub allowed_uids: Vec<u32>,
    /// Open connections at most.
    pub max_connections: usize,
    /// Time allowed to send a request's headers, and then its body.
    pub header_timeout: Duration,
}

/// The public TCP listener.
#[derive(Debug, Clone)]
pub struct PublicConfig {
    /// Address to bind.
    pub listen: SocketAddr,
    /// Certificate chain and key (PEM); plain HTTP only on loopback.
    pub tls: Option<(PathBuf, PathBuf)>,
}

/// DPoP settings.
#[derive(Debug, Clone)]
pub struct DpopConfig {
    /// Require server nonces (RFC 9449 section 8).
    pub require_nonce: bool,
    /// Accepted proof algorithms.
    pub algs: Vec<crate::jose::Alg>,
    /// Capacity of the `jti` replay cache; full = refuse.
    pub replay_capacity: usize,
}

/// Rate limits (governor).
#[derive(Debug, Clone)]
pub struct LimitsConfig {
    /// Derives per second per peer uid.
    pub per_peer_per_second: u32,
    /// Derives per second per (person, tool).
    pub per_person_tool_per_second: u32,
    /// Burst size of both.
    pub burst: u32,
}

/// How the pages sign in the person that an issuer's `sub` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignIn {
    /// OIDC at the same issuer.
    Oidc {
        /// Our client id at the IdP.
        client_id: String,
        /// Its secret, in a 0600 file.
        client_secret_file: Option<PathBuf>,
    },
    /// Local accounts; only for the broker's own issuer.
    Local,
}

/// Where an issuer's keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// A pinned JWKS file.
    File(PathBuf),
    /// A JWKS URI (https, or http on loopback).
    Uri(String),
}

/// One trusted subject-token issuer.
#[derive(Debug, Clone)]
pub struct IssuerConfig {
    /// `iss`, compared exactly.
    pub issuer: String,
    /// Expected `aud` (default: the agent's name).
    pub audience: String,
    /// Its keys.
    pub jwks: JwksSource,
    /// Allowed `alg`s.
    pub algs: Vec<crate::jose::Alg>,
    /// Allowed `typ` header values (access tokens, not ID tokens).
    pub token_types: Vec<String>,
    /// Claims that must be present.
    pub required_claims: Vec<String>,
    /// The paired sign-in source.
    pub sign_in: SignIn,
}

fn is_loopback_url(u: &url::Url) -> bool {
    match u.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    }
}

/// Whether `u` is https, or http on a loopback host, and carries no
/// credentials (secrets are never inline; an issuer URL ends up in `iss`).
pub fn secure_or_loopback(u: &url::Url) -> bool {
    u.username().is_empty()
        && u.password().is_none()
        && (u.scheme() == "https" || (u.scheme() == "http" && is_loopback_url(u)))
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(path, &text)
    }

    /// Validates config text; `path` names it in messages and anchors
    /// relative paths.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = parse_toml(path, text).map_err(ConfigError::Invalid)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let rel = |p: &Path| -> PathBuf {
            if p.is_absolute() {
                p.to_owned()
            } else {
                base.join(p)
            }
        };
        let mut problems = Vec::new();
        let mut bad = |key: &str, message: &str| {
            problems.push(Problem {
                at: locate_key(path, text, key),
                key: Some(key.to_string()),
                message: message.to_string(),
            })
        };

        if raw.agent.is_empty() || raw.agent.chars().any(|c| c.is_control()) {
            bad(
                "agent",
                "must be a non-empty name without control characters",
            );
        }
        let issuer = match url::Url::parse(&raw.issuer) {
            Ok(u) if secure_or_loopback(&u) && u.query().is_none() && u.fragment().is_none() => {
                raw.issuer.trim_end_matches('/').to_string()
            }
            _ => {
                bad(
                    "issuer",
                    "must be an https URL (http only on loopback), without query or fragment",
                );
                String::new()
            }
        };

        let header_timeout = match raw.socket.header_timeout.as_deref() {
            None => Duration::from_secs(5),
            Some(s) => parse_duration(s)
                .filter(|d| !d.is_zero())
                .unwrap_or_else(|| {
                    bad("socket.header_timeout", "must be a duration such as \"5s\"");
                    Duration::from_secs(5)
                }),
        };
        // Default allow-list: only the broker's own uid (quick start, tests).
        let allowed_uids = raw
            .socket
            .allowed_uids
            .unwrap_or_else(|| vec![crate::api::peer::current_uid()]);
        if allowed_uids.is_empty() {
            bad("socket.allowed_uids", "must list at least one uid");
        }

        let public = match raw.public {
            None => None,
            Some(p) => match p.listen.parse::<SocketAddr>() {
                Err(_) => {
                    bad("public.listen", "must be an address such as 127.0.0.1:8440");
                    None
                }
                Ok(addr) => {
                    let tls = match (p.tls_cert, p.tls_key) {
                        (Some(c), Some(k)) => Some((rel(&c), rel(&k))),
                        (None, None) => None,
                        _ => {
                            bad("public.tls_cert", "tls_cert and tls_key go together");
                            None
                        }
                    };
                    if tls.is_none() && !addr.ip().is_loopback() {
                        bad(
                            "public.listen",
                            "plain HTTP is allowed only on loopback; set tls_cert and tls_key",
                        );
                    }
                    Some(PublicConfig { listen: addr, tls })
                }
            },
        };

        let parse_algs = |key: &str,
                          v: Option<Vec<String>>,
                          default: Vec<crate::jose::Alg>,
                          bad: &mut dyn FnMut(&str, &str)| {
            match v {
                None => default,
                Some(list) => {
                    let mut out = Vec::new();
                    for a in &list {
                        match crate::jose::Alg::parse(a) {
                            Ok(a) => out.push(a),
                            Err(_) => bad(key, "unsupported algorithm (ES256, RS256, PS256)"),
                        }
                    }
                    if out.is_empty() {
                        bad(key, "must list at least one algorithm");
                    }
                    out
                }
            }
        };
        let dpop_algs = parse_algs(
            "dpop.algs",
            raw.dpop.algs,
            vec![crate::jose::Alg::ES256],
            &mut bad,
        );
        let replay_capacity = raw.dpop.replay_capacity.unwrap_or(200_000);
        if replay_capacity < 16 {
            bad("dpop.replay_capacity", "must be at least 16");
        }

        let limits = LimitsConfig {
            per_peer_per_second: raw.limits.per_peer_per_second.unwrap_or(20_000),
            per_person_tool_per_second: raw.limits.per_person_tool_per_second.unwrap_or(1_000),
            burst: raw.limits.burst.unwrap_or(2_000),
        };
        if limits.per_peer_per_second == 0
            || limits.per_person_tool_per_second == 0
            || limits.burst == 0
        {
            bad("limits", "rates and burst must be positive");
        }

        let mut issuers = Vec::new();
        if raw.trusted_issuers.is_empty() {
            bad(
                "trusted_issuers",
                "at least one trusted subject-token issuer is needed",
            );
        }
        for (i, ti) in raw.trusted_issuers.into_iter().enumerate() {
            let key = |k: &str| format!("trusted_issuers[{i}].{k}");
            let iss_url = url::Url::parse(&ti.issuer).ok();
            if !iss_url.as_ref().is_some_and(secure_or_loopback) {
                bad(
                    &key("issuer"),
                    "must be an https URL (http only on loopback)",
                );
            }
            let jwks = match (ti.jwks_file, ti.jwks_uri) {
                (Some(f), None) => JwksSource::File(rel(&f)),
                (None, Some(u)) => {
                    if !url::Url::parse(&u).is_ok_and(|u| secure_or_loopback(&u)) {
                        bad(
                            &key("jwks_uri"),
                            "must be an https URL (http only on loopback)",
                        );
                    }
                    JwksSource::Uri(u)
                }
                _ => {
                    bad(
                        &key("jwks_file"),
                        "give exactly one of jwks_file or jwks_uri",
                    );
                    JwksSource::File(PathBuf::new())
                }
            };
            let algs = parse_algs(
                &key("algs"),
                ti.algs,
                vec![crate::jose::Alg::ES256, crate::jose::Alg::RS256],
                &mut bad,
            );
            let sign_in = match ti.sign_in {
                None => {
                    bad(&key("sign_in"), "every trusted issuer must be paired with a sign-in source (kind = \"oidc\" or \"local\")");
                    SignIn::Local
                }
                Some(s) => match (s.kind.as_str(), s.client_id, s.client_secret_file) {
                    ("local", None, None) => {
                        if ti.issuer.trim_end_matches('/') != issuer {
                            bad(
                                &key("sign_in"),
                                "local sign-in pairs only with the broker's own issuer",
                            );
                        }
                        SignIn::Local
                    }
                    ("local", _, _) => {
                        bad(
                            &key("sign_in"),
                            "local sign-in takes no client_id or client_secret_file",
                        );
                        SignIn::Local
                    }
                    ("oidc", Some(client_id), client_secret_file) => SignIn::Oidc {
                        client_id,
                        client_secret_file: client_secret_file.map(|p| rel(&p)),
                    },
                    ("oidc", None, _) => {
                        bad(&key("sign_in.client_id"), "OIDC sign-in needs a client_id");
                        SignIn::Local
                    }
                    _ => {
                        bad(&key("sign_in.kind"), "must be \"oidc\" or \"local\"");
                        SignIn::Local
                    }
                },
            };
            let token_types = ti.token_types.unwrap_or_else(|| vec!["at+jwt".into()]);
            if token_types
                .iter()
                .any(|t| t.eq_ignore_ascii_case("dpop+jwt"))
            {
                bad(&key("token_types"), "DPoP proofs are never subject tokens");
            }
            issuers.push(IssuerConfig {
                issuer: ti.issuer,
                audience: ti.audience.unwrap_or_else(|| raw.agent.clone()),
                jwks,
                algs,
                token_types,
                required_claims: ti.required_claims.unwrap_or_default(),
                sign_in,
            });
        }
        let mut seen = std::collections::HashSet::new();
        for (i, ti) in issuers.iter().enumerate() {
            if !seen.insert(ti.issuer.clone()) {
                bad(
                    &format!("trusted_issuers[{i}].issuer"),
                    "an issuer is listed twice",
                );
            }
        }

        let mut providers = std::collections::BTreeMap::new();
        for (name, rp) in raw.providers {
            if let Some(p) = validate_provider(&name, rp, &issuer, &rel, &mut bad) {
                providers.insert(name, p);
            }
        }

        if !problems.is_empty() {
            return Err(ConfigError::Invalid(problems));
        }
        let store = rel(&raw.store);
        Ok(Config {
            file: path.to_owned(),
            agent: raw.agent,
            issuer,
            policy: rel(&raw.policy),
            audit_log: raw
                .audit_log
                .map_or_else(|| store.join("audit.jsonl"), |p| rel(&p)),
            admin_socket: raw
                .admin
                .map_or_else(|| rel(Path::new("admin.sock")), |a| rel(&a.socket)),
            store,
            socket: SocketConfig {
                path: rel(&raw.socket.path),
                group: raw.socket.group,
                allowed_uids,
                max_connections: raw.socket.max_connections.unwrap_or(512),
                header_timeout,
            },
            public,
            master_key_file: rel(&raw.keys.master_key_file),
            dpop: DpopConfig {
                require_nonce: raw.dpop.require_nonce,
                algs: dpop_algs,
                replay_capacity,
            },
            limits,
            trusted_issuers: issuers,
            vault_key_dir: match raw.vault {
                Some(v) => rel(&v.key_dir),
                // Beside the master key, in its own directory.
                None => rel(&raw.keys.master_key_file)
                    .parent()
                    .map_or_else(|| rel(Path::new("vault-keys")), |d| d.join("vault")),
            },
            providers,
        })
    }
}

/// Validates one `[providers.<name>]` table; problems go to `bad`.
fn validate_provider(
    name: &str,
    rp: RawProvider,
    own_issuer: &str,
    rel: &dyn Fn(&Path) -> PathBuf,
    bad: &mut dyn FnMut(&str, &str),
) -> Option<ProviderConfig> {
    let key = |k: &str| format!("providers.{name}.{k}");
    let start = std::cell::Cell::new(true);
    let mut fail = |k: &str, m: &str| {
        start.set(false);
        bad(&key(k), m);
    };
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        fail(
            "name",
            "a provider name is letters, digits, - and _ (it appears in URLs and the policy)",
        );
    }
    let url_ok = |u: &str| {
        url::Url::parse(u).is_ok_and(|u| secure_or_loopback(&u) && u.fragment().is_none())
    };
    let github = match rp.preset.as_deref() {
        None => false,
        Some("github") => true,
        Some(_) => {
            fail("preset", "the only preset is \"github\"");
            false
        }
    };
    for (k, v) in [
        ("issuer", &rp.issuer),
        ("authorization_endpoint", &rp.authorization_endpoint),
        ("token_endpoint", &rp.token_endpoint),
        ("revocation_endpoint", &rp.revocation_endpoint),
        ("userinfo_endpoint", &rp.userinfo_endpoint),
    ] {
        if v.as_deref().is_some_and(|u| !url_ok(u)) {
            fail(
                k,
                "must be an https URL (http only on loopback), without fragment",
            );
        }
    }
    let (auth_default, token_default) = if github {
        (
            Some(GITHUB_AUTHORIZE.to_string()),
            Some(GITHUB_TOKEN.to_string()),
        )
    } else {
        (None, None)
    };
    let authorization = rp.authorization_endpoint.or(auth_default);
    let token = rp.token_endpoint.or(token_default);
    let endpoints = match (authorization, token) {
        (Some(authorization), Some(token)) => Some(Endpoints {
            authorization,
            token,
            revocation: rp.revocation_endpoint,
            userinfo: rp.userinfo_endpoint,
            // Explicit endpoints: `iss` is checked when sent, not required.
            sends_iss: false,
        }),
        (None, None) if rp.issuer.is_some() => None,
        _ => {
            fail(
                "token_endpoint",
                "give authorization_endpoint and token_endpoint, or only issuer (for RFC 8414 / OpenID Connect discovery)",
            );
            None
        }
    };
    let client_auth = match rp.token_endpoint_auth.as_deref() {
        None if github => ClientAuth::Post,
        None if rp.client_secret_file.is_none() => ClientAuth::None,
        None | Some("client_secret_basic") => ClientAuth::Basic,
        Some("client_secret_post") => ClientAuth::Post,
        Some("none") => ClientAuth::None,
        Some(_) => {
            fail(
                "token_endpoint_auth",
                "must be client_secret_basic, client_secret_post or none",
            );
            ClientAuth::Basic
        }
    };
    if client_auth != ClientAuth::None && rp.client_secret_file.is_none() {
        fail(
            "client_secret_file",
            "a confidential client needs its secret in a file (mode 0600)",
        );
    }
    if rp.client_id.is_empty() || rp.client_id.chars().any(char::is_control) {
        fail("client_id", "must be non-empty, without control characters");
    }
    let redirect_uri = match rp.redirect_uri {
        Some(u) => {
            if !url_ok(&u) || u.contains('?') {
                fail(
                    "redirect_uri",
                    "must be an https URL (http only on loopback) without query or fragment",
                );
            }
            u
        }
        // The pages serve the provider callback at `/callback/{name}`.
        None => format!("{own_issuer}/callback/{name}"),
    };
    let mut scopes = Vec::new();
    for s in rp.scopes.unwrap_or_default() {
        if !crate::policy::valid_scope_token(&s) {
            fail(
                "scopes",
                "a scope must be a non-empty token without spaces or quotes",
            );
        } else if !scopes.contains(&s) {
            scopes.push(s);
        }
    }
    let account = match rp.account {
        Some(RawAccountLookup {
            url: Some(u),
            id_field,
            name_field,
            userinfo_id_claim: None,
            userinfo_name_claim: None,
        }) => {
            if !url_ok(&u) {
                fail(
                    "account.url",
                    "must be an https URL (http only on loopback)",
                );
            }
            AccountLookup::Api {
                url: u,
                id_field: id_field.unwrap_or_else(|| "id".into()),
                name_field: name_field.unwrap_or_else(|| "login".into()),
            }
        }
        Some(RawAccountLookup {
            url: None,
            id_field: None,
            name_field: None,
            userinfo_id_claim,
            userinfo_name_claim,
        }) => AccountLookup::Userinfo {
            id_claim: userinfo_id_claim.unwrap_or_else(|| "sub".into()),
            name_claim: userinfo_name_claim.unwrap_or_else(|| "preferred_username".into()),
        },
        Some(_) => {
            fail("account", "give either url (with id_field, name_field) or userinfo_id_claim / userinfo_name_claim");
            AccountLookup::Userinfo {
                id_claim: "sub".into(),
                name_claim: "preferred_username".into(),
            }
        }
        None if github => AccountLookup::Api {
            url: GITHUB_USER_API.into(),
            id_field: "id".into(),
            name_field: "login".into(),
        },
        None => AccountLookup::Userinfo {
            id_claim: "sub".into(),
            name_claim: "preferred_username".into(),
        },
    };
    if matches!(account, AccountLookup::Userinfo { .. })
        && endpoints.as_ref().is_some_and(|e| e.userinfo.is_none())
    {
        fail("userinfo_endpoint", "the account's name is read from userinfo: give userinfo_endpoint, or account.url for an API");
    }
    let timeout = match rp.timeout.as_deref() {
        None => Duration::from_secs(10),
        Some(t) => match parse_duration(t) {
            Some(d) if !d.is_zero() && d <= Duration::from_secs(60) => d,
            _ => {
                fail(
                    "timeout",
                    "must be a duration between 1ms and 60s, such as \"10s\"",
                );
                Duration::from_secs(10)
            }
        },
    };
    if !start.get() {
        return None;
    }
    Some(ProviderConfig {
        name: name.to_string(),
        display_name: rp.display_name.unwrap_or_else(|| {
            if github {
                "GitHub".into()
            } else {
                name.to_string()
            }
        }),
        issuer: rp.issuer,
        endpoints,
        client_id: rp.client_id,
        client_secret_file: rp.client_secret_file.map(|p| rel(&p)),
        client_auth,
        redirect_uri,
        scopes,
        narrow_on_refresh: rp.narrow_on_refresh.unwrap_or(false),
        account,
        timeout,
    })
}

/// Reads a secret file, refusing one that group or others can read (mode
/// must be 0600 or stricter) or that is not a regular file. Symlinks are
/// followed and the target is checked: Kubernetes mounts secrets as links.
pub fn read_secret_file(path: &Path) -> Result<crate::secret::SecretBytes, std::io::Error> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} must have mode 0600 (it is readable by others)",
            path.display()
        )));
    }
    Ok(crate::secret::SecretBytes::new(std::fs::read(path)?))
}

/// Writes a new secret file with mode 0600, failing if it exists.
pub fn write_secret_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(data)?;
    f.sync_all()
}

#[cfg(test)]
mod provider_tests;
#[cfg(test)]
mod tests;
