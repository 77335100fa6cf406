//! `[providers.<name>]`: the third-party services people can connect,
//! and the GitHub preset.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::raw::{RawAccountLookup, RawProvider};
use super::{parse_duration, Check};
use crate::base::grammar::{secure_or_loopback, valid_scope_token};

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
    /// GitHub's application grant API, used on disconnect instead of RFC
    /// 7009 (GitHub has no revocation endpoint): `DELETE` with basic auth
    /// of client id and secret and `{"access_token": ...}`, which deletes
    /// the grant and every token issued under it. The preset's default is
    /// `https://api.github.com/applications/{client_id}/grant`
    /// (`grant_endpoint` overrides it, e.g. for GitHub Enterprise Server).
    pub grant_endpoint: Option<String>,
    /// How long a provider token without a lifetime (no `expires_in`) is
    /// served before a fresh check with the provider
    /// (`recheck_unexpiring_token_after`, default 1 hour, 1 minute to 24
    /// hours): a refresh when there is a refresh token, else a look-up of
    /// the account with the token (a refused token means reconnect).
    pub recheck_unexpiring_token_after: Duration,
    /// The origin the egress proxy sends this service's calls to
    /// (`api_base`, scheme, host and port only, https except on loopback;
    /// the GitHub preset's is `https://api.github.com`). `None`: the
    /// service cannot be used with `delivery = "proxy"`.
    pub api_base: Option<String>,
}

/// Validates an `api_base`: an origin (no path other than `/`, no query,
/// fragment or credentials), https except on loopback. Returns it without a
/// trailing slash.
pub(crate) fn parse_api_base(u: &str) -> Result<String, &'static str> {
    const MSG: &str = "must be an origin such as \"https://api.example.com\": https (http only on loopback), no path, query, fragment or credentials";
    let parsed = url::Url::parse(u).map_err(|_| MSG)?;
    if !secure_or_loopback(&parsed)
        || parsed.path() != "/"
        || parsed.query().is_some()
        || parsed.fragment().is_some()
        || parsed.host().is_none()
    {
        return Err(MSG);
    }
    Ok(parsed.as_str().trim_end_matches('/').to_string())
}

/// The GitHub preset: GitHub's OAuth app endpoints. GitHub accepts PKCE
/// S256 without enforcing it, so `state` is always sent and checked; it has
/// no RFC 7009 revocation endpoint and does not narrow on refresh.
pub(super) const GITHUB_AUTHORIZE: &str = "https://github.com/login/oauth/authorize";
/// GitHub's token endpoint.
pub(super) const GITHUB_TOKEN: &str = "https://github.com/login/oauth/access_token";
/// GitHub's user API (account id `id`, name `login`).
pub(super) const GITHUB_USER_API: &str = "https://api.github.com/user";
/// GitHub's API base: the application grant API is under it.
pub(crate) const GITHUB_API: &str = "https://api.github.com";

/// The preset of the quick start's built-in demo service (see
/// `crate::demo`): its endpoints and account look-up sit under its
/// `issuer`. Only `credbroker quickstart` runs that service; `serve`
/// refuses a config with a provider of this preset.
pub(crate) const QUICKSTART_DEMO: &str = "quickstart-demo";

/// Validates `[providers.<name>]`: the providers that validate, by name.
pub(super) fn providers(
    raw: BTreeMap<String, RawProvider>,
    own_issuer: &str,
    check: &mut Check<'_>,
) -> BTreeMap<String, ProviderConfig> {
    let mut providers = BTreeMap::new();
    for (name, rp) in raw {
        if let Some(p) = provider(&name, rp, own_issuer, check) {
            providers.insert(name, p);
        }
    }
    providers
}

/// Reports problems of one provider's table, each under its full key.
struct Fail<'c, 'a> {
    name: &'c str,
    check: &'c mut Check<'a>,
}

impl Fail<'_, '_> {
    fn at(&mut self, k: &str, m: &str) {
        let key = format!("providers.{}.{k}", self.name);
        self.check.bad(&key, m);
    }
}

/// An https URL (http only on loopback) without fragment.
fn url_ok(u: &str) -> bool {
    url::Url::parse(u).is_ok_and(|u| secure_or_loopback(&u) && u.fragment().is_none())
}

/// The preset a provider's table names, and for the demo service the base
/// its endpoints are under.
struct Preset {
    github: bool,
    demo: bool,
    /// The demo service's issuer, without a trailing `/`.
    demo_base: Option<String>,
}

/// Validates one `[providers.<name>]` table; `None` if it has a problem
/// (each one reported through `check`).
fn provider(
    name: &str,
    rp: RawProvider,
    own_issuer: &str,
    check: &mut Check<'_>,
) -> Option<ProviderConfig> {
    let before = check.problems.len();
    let mut f = Fail { name, check };
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        f.at(
            "name",
            "a provider name is letters, digits, - and _ (it appears in URLs and the policy)",
        );
    }
    let preset = preset(rp.preset.as_deref(), rp.issuer.as_deref(), &mut f);
    let endpoints = endpoints(&rp, &preset, &mut f);
    let client_auth = client_auth(&rp, preset.github, &mut f);
    let redirect_uri = match rp.redirect_uri {
        Some(u) => {
            if !url_ok(&u) || u.contains('?') {
                f.at(
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
        if !valid_scope_token(&s) {
            f.at(
                "scopes",
                "a scope must be a non-empty token without spaces or quotes",
            );
        } else if !scopes.contains(&s) {
            scopes.push(s);
        }
    }
    let account = account(rp.account, &preset, &mut f);
    if matches!(account, AccountLookup::Userinfo { .. })
        && endpoints.as_ref().is_some_and(|e| e.userinfo.is_none())
    {
        f.at("userinfo_endpoint", "the account's name is read from userinfo: give userinfo_endpoint, or account.url for an API");
    }
    let timeout = duration(
        rp.timeout.as_deref(),
        Duration::from_secs(10),
        |d| !d.is_zero() && d <= Duration::from_secs(60),
        (
            "timeout",
            "must be a duration between 1ms and 60s, such as \"10s\"",
        ),
        &mut f,
    );
    let recheck_unexpiring_token_after = duration(
        rp.recheck_unexpiring_token_after.as_deref(),
        Duration::from_secs(3600),
        |d| d >= Duration::from_secs(60) && d <= Duration::from_secs(86_400),
        (
            "recheck_unexpiring_token_after",
            "must be a duration between 1m and 24h, such as \"1h\"",
        ),
        &mut f,
    );
    let grant_endpoint = grant_endpoint(rp.grant_endpoint, preset.github, &rp.client_id, &mut f);
    let api_base = api_base(rp.api_base.as_deref(), &preset, &mut f);
    if check.problems.len() > before {
        return None;
    }
    Some(ProviderConfig {
        api_base,
        grant_endpoint,
        recheck_unexpiring_token_after,
        name: name.to_string(),
        display_name: rp.display_name.unwrap_or_else(|| {
            if preset.github {
                "GitHub".into()
            } else if preset.demo {
                "Demo service".into()
            } else {
                name.to_string()
            }
        }),
        issuer: rp.issuer,
        endpoints,
        client_id: rp.client_id,
        client_secret_file: rp.client_secret_file.map(|p| check.rel(&p)),
        client_auth,
        redirect_uri,
        scopes,
        narrow_on_refresh: rp.narrow_on_refresh.unwrap_or(false),
        account,
        timeout,
    })
}

/// The preset (`github`, the quick start's demo service, or none); the
/// demo service's endpoints are under its issuer.
fn preset(preset: Option<&str>, issuer: Option<&str>, f: &mut Fail<'_, '_>) -> Preset {
    let (github, demo) = match preset {
        None => (false, false),
        Some("github") => (true, false),
        Some(QUICKSTART_DEMO) => (false, true),
        Some(_) => {
            f.at(
                "preset",
                "the presets are \"github\" and \"quickstart-demo\" (the quick start's demo service)",
            );
            (false, false)
        }
    };
    let demo_base = if demo {
        match issuer {
            Some(i)
                if url::Url::parse(i).is_ok_and(|u| {
                    u.scheme() == "http" && secure_or_loopback(&u) && u.path() == "/"
                }) =>
            {
                Some(i.trim_end_matches('/').to_string())
            }
            _ => {
                f.at(
                    "issuer",
                    "the quickstart-demo preset needs issuer = \"http://127.0.0.1:PORT\" (where the quick start serves its demo service)",
                );
                None
            }
        }
    } else {
        None
    };
    Preset {
        github,
        demo,
        demo_base,
    }
}

/// The endpoints: given, or the preset's; `None` with only an issuer (found
/// by discovery).
fn endpoints(rp: &RawProvider, preset: &Preset, f: &mut Fail<'_, '_>) -> Option<Endpoints> {
    for (k, v) in [
        ("issuer", &rp.issuer),
        ("authorization_endpoint", &rp.authorization_endpoint),
        ("token_endpoint", &rp.token_endpoint),
        ("revocation_endpoint", &rp.revocation_endpoint),
        ("userinfo_endpoint", &rp.userinfo_endpoint),
    ] {
        if v.as_deref().is_some_and(|u| !url_ok(u)) {
            f.at(
                k,
                "must be an https URL (http only on loopback), without fragment",
            );
        }
    }
    let demo_base = &preset.demo_base;
    let (auth_default, token_default) = if preset.github {
        (
            Some(GITHUB_AUTHORIZE.to_string()),
            Some(GITHUB_TOKEN.to_string()),
        )
    } else if let Some(b) = demo_base {
        (Some(format!("{b}/authorize")), Some(format!("{b}/token")))
    } else {
        (None, None)
    };
    let authorization = rp.authorization_endpoint.clone().or(auth_default);
    let token = rp.token_endpoint.clone().or(token_default);
    match (authorization, token) {
        (Some(authorization), Some(token)) => Some(Endpoints {
            authorization,
            token,
            revocation: rp
                .revocation_endpoint
                .clone()
                .or_else(|| demo_base.as_ref().map(|b| format!("{b}/revoke"))),
            userinfo: rp.userinfo_endpoint.clone(),
            // Explicit endpoints: `iss` is checked when sent, not required.
            sends_iss: false,
        }),
        (None, None) if rp.issuer.is_some() => None,
        _ => {
            f.at(
                "token_endpoint",
                "give authorization_endpoint and token_endpoint, or only issuer (for RFC 8414 / OpenID Connect discovery)",
            );
            None
        }
    }
}

/// How the client authenticates at the token endpoint, and what that
/// needs: a secret file for a confidential client, a client id.
fn client_auth(rp: &RawProvider, github: bool, f: &mut Fail<'_, '_>) -> ClientAuth {
    let client_auth = match rp.token_endpoint_auth.as_deref() {
        None if github => ClientAuth::Post,
        None if rp.client_secret_file.is_none() => ClientAuth::None,
        None | Some("client_secret_basic") => ClientAuth::Basic,
        Some("client_secret_post") => ClientAuth::Post,
        Some("none") => ClientAuth::None,
        Some(_) => {
            f.at(
                "token_endpoint_auth",
                "must be client_secret_basic, client_secret_post or none",
            );
            ClientAuth::Basic
        }
    };
    if client_auth != ClientAuth::None && rp.client_secret_file.is_none() {
        f.at(
            "client_secret_file",
            "a confidential client needs its secret in a file (mode 0600)",
        );
    }
    if rp.client_id.is_empty() || rp.client_id.chars().any(char::is_control) {
        f.at("client_id", "must be non-empty, without control characters");
    }
    client_auth
}

/// Where the account's id and name are read: an API, or userinfo.
fn account(raw: Option<RawAccountLookup>, preset: &Preset, f: &mut Fail<'_, '_>) -> AccountLookup {
    match raw {
        Some(RawAccountLookup {
            url: Some(u),
            id_field,
            name_field,
            userinfo_id_claim: None,
            userinfo_name_claim: None,
        }) => {
            if !url_ok(&u) {
                f.at(
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
            f.at("account", "give either url (with id_field, name_field) or userinfo_id_claim / userinfo_name_claim");
            AccountLookup::Userinfo {
                id_claim: "sub".into(),
                name_claim: "preferred_username".into(),
            }
        }
        None if preset.github => AccountLookup::Api {
            url: GITHUB_USER_API.into(),
            id_field: "id".into(),
            name_field: "login".into(),
        },
        None if preset.demo => AccountLookup::Api {
            url: format!("{}/api/me", preset.demo_base.as_deref().unwrap_or_default()),
            id_field: "id".into(),
            name_field: "login".into(),
        },
        None => AccountLookup::Userinfo {
            id_claim: "sub".into(),
            name_claim: "preferred_username".into(),
        },
    }
}

/// A duration setting: `default` when absent; one outside `ok` is reported
/// (`problem`: the key and the message) and the default used.
fn duration(
    raw: Option<&str>,
    default: Duration,
    ok: impl Fn(Duration) -> bool,
    problem: (&str, &str),
    f: &mut Fail<'_, '_>,
) -> Duration {
    let Some(t) = raw else {
        return default;
    };
    match parse_duration(t) {
        Some(d) if ok(d) => d,
        _ => {
            f.at(problem.0, problem.1);
            default
        }
    }
}

/// GitHub's application grant API (revocation on disconnect); only the
/// github preset has one.
fn grant_endpoint(
    raw: Option<String>,
    github: bool,
    client_id: &str,
    f: &mut Fail<'_, '_>,
) -> Option<String> {
    match raw {
        Some(u) if github => {
            if !url::Url::parse(&u).is_ok_and(|x| secure_or_loopback(&x)) {
                f.at(
                    "grant_endpoint",
                    "must be an https URL (http only on loopback)",
                );
            }
            Some(u)
        }
        Some(_) => {
            f.at(
                "grant_endpoint",
                "only the github preset has an application grant API (others revoke with revocation_endpoint, RFC 7009)",
            );
            None
        }
        None if github => Some(format!(
            "{GITHUB_API}/applications/{}/grant",
            url::form_urlencoded::byte_serialize(client_id.as_bytes()).collect::<String>()
        )),
        None => None,
    }
}

/// The API the egress proxy forwards to: given, or the preset's.
fn api_base(raw: Option<&str>, preset: &Preset, f: &mut Fail<'_, '_>) -> Option<String> {
    match raw {
        Some(u) => match parse_api_base(u) {
            Ok(b) => Some(b),
            Err(m) => {
                f.at("api_base", m);
                None
            }
        },
        None if preset.github => Some(GITHUB_API.to_string()),
        // The demo service's API is under its own origin (`/api`).
        None if preset.demo => preset.demo_base.clone(),
        None => None,
    }
}
