//! A real third-party OAuth provider for tests: panva's `oidc-provider`
//! (tests/peers/oauth-service.mjs) on a loopback port. Needs
//! `scripts/install-test-deps` once (CI runs it).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub(crate) const CLIENT_ID: &str = "credbroker-test";

/// A running provider.
pub(crate) struct OidcPeer {
    child: Child,
    pub issuer: String,
    pub client_secret: String,
    pub redirect_uri: String,
    /// Every redirect URI of the client (the first is `redirect_uri`).
    redirect_uris: Vec<String>,
    http: reqwest::Client,
}

fn peers_dir() -> PathBuf {
    super::prereq::node_peers()
}

impl OidcPeer {
    /// Starts the provider with one confidential client.
    pub(crate) fn start(client_secret: &str, redirect_uri: &str) -> OidcPeer {
        OidcPeer::start_with_redirects(client_secret, &[redirect_uri])
    }

    /// [`OidcPeer::start`] with a client that has several redirect URIs
    /// (one per service name that shares it); the first is
    /// [`OidcPeer::redirect_uri`].
    pub(crate) fn start_with_redirects(client_secret: &str, redirect_uris: &[&str]) -> OidcPeer {
        let redirect_uri = redirect_uris[0];
        let dir = peers_dir();
        let mut child = Command::new("node")
            .arg(dir.join("oauth-service.mjs"))
            .args(["--client-id", CLIENT_ID, "--client-secret", client_secret])
            .args(redirect_uris.iter().flat_map(|u| ["--redirect-uri", u]))
            .current_dir(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node runs (checked by peers_dir)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|_| panic!("provider peer did not start: {line:?}"));
        OidcPeer {
            child,
            issuer: v["issuer"].as_str().unwrap().to_string(),
            client_secret: client_secret.to_string(),
            redirect_uri: redirect_uri.to_string(),
            redirect_uris: redirect_uris.iter().map(|u| u.to_string()).collect(),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
        }
    }

    /// Calls a `/test/...` control route. A route the peer does not know
    /// answers 404, and a control that did nothing must fail the test, not
    /// leave the provider as it was.
    async fn control(&self, path: &str) -> serde_json::Value {
        let r = self
            .http
            .get(format!("{}{path}", self.issuer))
            .send()
            .await
            .unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, 200, "provider control {path}: {text}");
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("provider control {path} answered non-JSON ({e}): {text}"))
    }

    /// Lifetime of access tokens issued from now on.
    pub(crate) async fn set_access_ttl(&self, secs: i64) {
        let v = self.control(&format!("/test/ttl?seconds={secs}")).await;
        assert_eq!(v["access_token_ttl"], secs, "the provider took the ttl");
    }

    /// Token endpoint behaviour: ok, hang, 500, badjson.
    pub(crate) async fn set_token_mode(&self, mode: &str) {
        let v = self.control(&format!("/test/mode?token={mode}")).await;
        assert_eq!(v["token"], mode, "the provider took the mode");
    }

    /// Counters: authorization_code, refresh_token (successful grants),
    /// revocations, token_requests.
    pub(crate) async fn stats(&self) -> serde_json::Value {
        self.control("/test/stats").await
    }

    pub(crate) async fn refreshes(&self) -> u64 {
        self.stats().await["refresh_token"].as_u64().unwrap()
    }

    /// The `traceparent` and `tracestate` of each token request so far
    /// (`None` when absent), in order.
    pub(crate) async fn token_trace(&self) -> Vec<(Option<String>, Option<String>)> {
        let v = self.control("/test/token-trace").await;
        v["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let s = |k: &str| r[k].as_str().map(str::to_string);
                (s("traceparent"), s("tracestate"))
            })
            .collect()
    }

    /// Every access and refresh token value issued so far.
    pub(crate) async fn issued_tokens(&self) -> Vec<String> {
        let v = self.control("/test/issued").await;
        let mut out = Vec::new();
        for k in ["access_tokens", "refresh_tokens"] {
            out.extend(
                v[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_str().unwrap().to_string()),
            );
        }
        out
    }

    /// Revokes every grant of `account` at the provider (as a person would
    /// on the provider's settings page).
    pub(crate) async fn revoke_account(&self, account: &str) {
        self.control(&format!("/test/revoke-account?account={account}"))
            .await;
    }

    /// Refresh tokens of `account` that still work.
    pub(crate) async fn live_refresh_tokens(&self, account: &str) -> u64 {
        self.control(&format!("/test/live?account={account}")).await["live_refresh_tokens"]
            .as_u64()
            .unwrap()
    }

    /// The account a browser is signed in as at the provider from now on
    /// (a browser sends no `login_hint`).
    pub(crate) async fn set_browser_account(&self, account: &str) {
        self.control(&format!("/test/browser-account?account={account}"))
            .await;
    }

    /// Whether `token` is an access token the provider would still accept
    /// (not revoked, not expired).
    pub(crate) async fn access_token_live(&self, token: &str) -> bool {
        let mut u = url::Url::parse(&format!("{}/test/access-token-live", self.issuer)).unwrap();
        u.query_pairs_mut().append_pair("token", token);
        let v: serde_json::Value = self.http.get(u).send().await.unwrap().json().await.unwrap();
        v["live"].as_bool().unwrap()
    }

    /// Whether `token` is a refresh token the provider would still accept.
    pub(crate) async fn refresh_token_live(&self, token: &str) -> bool {
        let url = format!("{}/test/refresh-token-live?token={}", self.issuer, token);
        let v: serde_json::Value = self
            .http
            .get(url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["live"].as_bool().unwrap()
    }

    /// Plays the browser: opens `auth_url` signed in as `account`, lets the
    /// provider's interaction grant what is asked, and returns the query of
    /// the final redirect to the redirect URI (code, state, iss).
    pub(crate) async fn authorize(
        &self,
        auth_url: &str,
        account: &str,
    ) -> BTreeMap<String, String> {
        let mut url = url::Url::parse(auth_url).unwrap();
        url.query_pairs_mut().append_pair("login_hint", account);
        let mut jar: BTreeMap<String, String> = BTreeMap::new();
        for _ in 0..10 {
            let cookie = jar
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("; ");
            let resp = self
                .http
                .get(url.as_str())
                .header("cookie", cookie)
                .send()
                .await
                .unwrap();
            for sc in resp.headers().get_all("set-cookie") {
                let first = sc.to_str().unwrap().split(';').next().unwrap();
                if let Some((k, v)) = first.split_once('=') {
                    if v.is_empty() {
                        jar.remove(k);
                    } else {
                        jar.insert(k.to_string(), v.to_string());
                    }
                }
            }
            let loc = resp
                .headers()
                .get("location")
                .unwrap_or_else(|| panic!("provider answered {} without a redirect", resp.status()))
                .to_str()
                .unwrap()
                .to_string();
            let next = url.join(&loc).unwrap();
            if self
                .redirect_uris
                .iter()
                .any(|r| next.as_str().starts_with(r.as_str()))
            {
                return next
                    .query_pairs()
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect();
            }
            url = next;
        }
        panic!("the provider never redirected back");
    }

    /// Stops the provider (its port then refuses connections).
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OidcPeer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writes a 0600 secret file (replacing one of the same name).
pub(crate) fn secret_file(dir: &Path, name: &str, content: &str) -> PathBuf {
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    credbroker::internals::config::write_secret_file(&p, content.as_bytes()).unwrap();
    p
}

/// The organisation's IdP: panva's `oidc-provider` (tests/peers/oidc-provider.mjs)
/// with two people, an orchestrator client whose access tokens (for the
/// agent's resource) are the agent's subject tokens, and the pages' client,
/// whose ID tokens always say when the person signed in.
pub(crate) struct OrgIdp {
    pub peer: super::NodePeer,
    pub issuer: String,
    /// The `[[trusted_issuers]]` table that trusts it and signs people in there.
    pub config: String,
    /// Subject tokens by person.
    pub tokens: std::collections::HashMap<String, String>,
    _cfg: tempfile::NamedTempFile,
    _secrets: tempfile::TempDir,
}

/// The agent's resource at the IdP (its access tokens' audience is the agent).
pub(crate) const AGENT_RESOURCE: &str = "urn:credbroker:agent:repo-helper";
const ORCHESTRATOR_SECRET: &str = "orchestrator-secret-not-a-canary";

impl OrgIdp {
    /// Starts the IdP for pages served at `base`, with `users` (name,
    /// password) who each get a subject token.
    pub(crate) fn start(base: &str, users: &[(&str, &str)]) -> OrgIdp {
        let mut r = [0u8; 12];
        aws_lc_rs::rand::fill(&mut r).unwrap();
        let pages_secret = format!("pages-client-secret-canary-{}", hex::encode(r));
        let users_json: serde_json::Map<String, serde_json::Value> = users
            .iter()
            .map(|(n, p)| (n.to_string(), serde_json::Value::from(*p)))
            .collect();
        let (mut peer, cfg) = super::oidc_provider(&serde_json::json!({
            "clients": [
                {
                    "client_id": "orchestrator", "client_secret": ORCHESTRATOR_SECRET,
                    "redirect_uris": ["http://127.0.0.1:1/cb"],
                    "grant_types": ["authorization_code"], "response_types": ["code"],
                },
                {
                    "client_id": "credbroker-pages", "client_secret": pages_secret,
                    "redirect_uris": [format!("{base}/signin/callback")],
                    "grant_types": ["authorization_code"], "response_types": ["code"],
                    "token_endpoint_auth_method": "client_secret_basic",
                    "require_auth_time": true,
                },
            ],
            "resources": { AGENT_RESOURCE: {"audience": "repo-helper", "scope": "agent"} },
            "users": users_json,
        }));
        let issuer = peer.hello["issuer"].as_str().unwrap().to_string();
        let secrets = tempfile::tempdir().unwrap();
        let file = secret_file(secrets.path(), "pages.secret", &pages_secret);
        let config = format!(
            r#"
[[trusted_issuers]]
issuer = "{issuer}"
jwks_uri = "{issuer}/jwks"
algs = ["ES256", "RS256"]
sign_in = {{ kind = "oidc", client_id = "credbroker-pages", client_secret_file = "{}" }}
"#,
            file.display()
        );
        let mut tokens = std::collections::HashMap::new();
        for (name, pw) in users {
            let t = peer.call(&serde_json::json!({
                "cmd": "login", "user": name, "password": pw, "client_id": "orchestrator",
                "client_secret": ORCHESTRATOR_SECRET, "redirect_uri": "http://127.0.0.1:1/cb",
                "scope": "openid agent", "resource": AGENT_RESOURCE,
            }));
            assert!(t.get("error").is_none(), "IdP login failed: {t}");
            tokens.insert(
                name.to_string(),
                t["tokens"]["access_token"].as_str().unwrap().to_string(),
            );
        }
        OrgIdp {
            peer,
            issuer,
            config,
            tokens,
            _cfg: cfg,
            _secrets: secrets,
        }
    }
}
