//! A broker with a connected service (`acme`, played by the oidc-provider
//! peer), and a person's browser on its pages: links are finished over
//! HTTP through the real pages (sign-in with a local account, the link's
//! button, the provider, the pages' callback), the path production takes.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use credbroker::client::Answer;
use credbroker::internals::jose::Es256Key;

use super::oidc::{secret_file, OidcPeer, CLIENT_ID};
use super::{Opts, TestBroker};

/// The redirect URI the pages use for `acme`: `{issuer}/callback/acme`
/// (test brokers have the issuer `http://127.0.0.1:0`; the tests call the
/// real address themselves).
pub(crate) const REDIRECT: &str = "http://127.0.0.1:0/callback/acme";
pub(crate) const SERVICE: &str = "https://api.acme.example";

/// The quick-start policy plus the `acme` service resource and two tools.
pub(crate) fn policy() -> String {
    format!(
        r#"{}
[resources."{SERVICE}"]
source = "service"
service = "acme"
delivery = "provider_token"

[tools."acme.issues"]
resource = "{SERVICE}"
scopes = ["repo"]
steps = ["triage"]

[tools."acme.org"]
resource = "{SERVICE}"
scopes = ["read:org"]
steps = ["triage"]
"#,
        credbroker::internals::cli::QUICKSTART_POLICY
    )
}

/// The `acme` provider (the oidc-provider peer) with a client whose
/// secret sits in a 0600 file, for one broker or for several replicas.
pub(crate) struct Provider {
    pub peer: OidcPeer,
    pub client_secret: String,
    /// Holds `acme.secret`.
    pub secrets: tempfile::TempDir,
}

impl Provider {
    /// Starts the provider with a fresh client secret (a canary, so a test
    /// can look for it where it must not be) and `redirect` as the client's
    /// only redirect URI.
    pub(crate) fn start(redirect: &str) -> Provider {
        Provider::start_with_redirects(&[redirect])
    }

    /// [`Provider::start`] with several redirect URIs, for service names
    /// that share the client (the first is `acme`'s).
    pub(crate) fn start_with_redirects(redirects: &[&str]) -> Provider {
        let client_secret = format!(
            "client-secret-canary-{}",
            hex::encode(super::random_bytes(12))
        );
        let peer = OidcPeer::start_with_redirects(&client_secret, redirects);
        let secrets = tempfile::tempdir().unwrap();
        secret_file(secrets.path(), "acme.secret", &client_secret);
        Provider {
            peer,
            client_secret,
            secrets,
        }
    }
}

/// The broker options of `p` for the provider `peer` (its client secret
/// in `secrets`): the `[providers.acme]` table followed by
/// `p.extra_config`, then a table like acme's for each of
/// `p.more_services` (with `p.more_services_keys`), and the policy with the
/// `acme` tools.
pub(crate) fn broker_opts(p: &ProviderOpts, peer: &OidcPeer, secrets: &tempfile::TempDir) -> Opts {
    let table = |name: &str, display: &str| {
        format!(
            r#"
[providers.{name}]
display_name = "{display}"
issuer = "{issuer}"
client_id = "{CLIENT_ID}"
client_secret_file = "{file}"
scopes = ["openid", "profile", "read:org"]
narrow_on_refresh = {narrow}
timeout = "{timeout}"
"#,
            issuer = peer.issuer,
            file = secrets.path().join("acme.secret").display(),
            narrow = p.narrow_on_refresh,
            timeout = p.timeout,
        )
    };
    let mut extra = table("acme", "Acme") + &p.extra_config;
    for name in &p.more_services {
        extra += &table(name, name);
        extra += &p.more_services_keys;
    }
    Opts {
        policy: Some(p.policy.clone().unwrap_or_else(policy) + &p.extra_policy),
        extra_config: extra,
        log: p.log.clone(),
        public_listen: p.public_listen.clone(),
        audit_log: p.audit_log.clone(),
        edit_config: p.edit_config,
    }
}

/// Broker + provider.
pub(crate) struct ServiceEnv {
    pub peer: OidcPeer,
    pub broker: TestBroker,
    pub client_secret: String,
    secrets: tempfile::TempDir,
    /// One browser (cookie jar) per person.
    browsers: HashMap<String, reqwest::Client>,
    /// The local accounts made on the pages.
    users: HashSet<String>,
}

/// Options of the `acme` provider table.
#[derive(Clone)]
pub(crate) struct ProviderOpts {
    pub narrow_on_refresh: bool,
    pub timeout: &'static str,
    pub log: Option<String>,
    /// Where the pages listen (`127.0.0.1:PORT`): then the provider's
    /// redirect URI is the pages' real callback, so a browser can finish
    /// the flow. Default: port 0 and the [`REDIRECT`] placeholder.
    pub public_listen: Option<String>,
    /// More config (e.g. a trusted issuer with OIDC sign-in). Appended
    /// right after the `[providers.acme]` table, so leading keys land in it
    /// (`api_base = ...`).
    pub extra_config: String,
    /// More policy (resources and tools) after the `acme` ones.
    pub extra_policy: String,
    /// Replaces [`policy()`].
    pub policy: Option<String>,
    /// The broker's `audit_log`, when not the default.
    pub audit_log: Option<PathBuf>,
    /// More service names whose providers share the `acme` client: each
    /// gets a `[providers.<name>]` table like `acme`'s (after
    /// `extra_config`, plus `more_services_keys`), and the provider also
    /// accepts its pages' callback (`/callback/<name>`).
    pub more_services: Vec<&'static str>,
    /// Keys added to each table of `more_services`.
    pub more_services_keys: String,
    /// Edits the whole config text last (e.g. keys in `[keys]`).
    pub edit_config: Option<fn(String) -> String>,
}

impl Default for ProviderOpts {
    fn default() -> Self {
        ProviderOpts {
            narrow_on_refresh: false,
            // Generous: a browser test's connect, refresh or revocation
            // must not fail because two loaded cores stalled the peer for
            // a second. The tests of the timeout itself set a short one.
            timeout: "10s",
            log: None,
            public_listen: None,
            extra_config: String::new(),
            extra_policy: String::new(),
            policy: None,
            audit_log: None,
            more_services: Vec::new(),
            more_services_keys: String::new(),
            edit_config: None,
        }
    }
}

impl ServiceEnv {
    pub(crate) fn start() -> ServiceEnv {
        ServiceEnv::start_with(ProviderOpts::default())
    }

    pub(crate) fn start_with(p: ProviderOpts) -> ServiceEnv {
        let redirect = p.public_listen.as_ref().map_or_else(
            || REDIRECT.to_string(),
            |a| format!("http://{a}/callback/acme"),
        );
        let mut redirects = vec![redirect.clone()];
        redirects.extend(
            p.more_services
                .iter()
                .map(|s| redirect.replace("/callback/acme", &format!("/callback/{s}"))),
        );
        let redirects: Vec<&str> = redirects.iter().map(String::as_str).collect();
        let Provider {
            peer,
            client_secret,
            secrets,
        } = Provider::start_with_redirects(&redirects);
        let broker = TestBroker::start_with(broker_opts(&p, &peer, &secrets));
        ServiceEnv {
            peer,
            broker,
            client_secret,
            secrets,
            browsers: HashMap::new(),
            users: HashSet::new(),
        }
    }

    pub(crate) fn secret_path(&self) -> PathBuf {
        self.secrets.path().join("acme.secret")
    }

    /// A derive for a service tool in step `triage`.
    pub(crate) async fn derive(&self, key: &Es256Key, sub: &str, tool: &str) -> Answer {
        self.broker
            .derive(
                key,
                &self.broker.subject_token(sub),
                "triage",
                tool,
                SERVICE,
                None,
            )
            .await
    }

    /// Opens the store offline, as an operator (or someone with write
    /// access to the store) would: the broker must be stopped (sled is
    /// single-process).
    pub(crate) fn open_parts(&self) -> Parts {
        let cfg = credbroker::internals::config::Config::load(&self.broker.config).unwrap();
        let store: Arc<dyn credbroker::internals::store::Store> = Arc::new(
            credbroker::internals::store::SledStore::open(cfg.store.sled_dir().unwrap()).unwrap(),
        );
        let vault = credbroker::internals::vault::Vault::open(
            store,
            super::config_master(&cfg),
            &cfg.vault_key_dir,
        )
        .unwrap();
        Parts { vault }
    }

    /// The browser of person `sub`: an HTTP client with its own cookie jar
    /// that does not follow redirects (kept across calls, as a browser
    /// keeps its session).
    pub(crate) fn browser(&mut self, sub: &str) -> reqwest::Client {
        self.browsers
            .entry(sub.to_string())
            .or_insert_with(|| {
                reqwest::Client::builder()
                    .cookie_store(true)
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .unwrap()
            })
            .clone()
    }

    /// The local account of person `sub` on the pages, made through the
    /// admin socket the first time (a local account's person is the dev
    /// issuer's `sub`, the person of the subject tokens of [`Self::derive`]).
    pub(crate) fn local_user(&mut self, sub: &str) -> String {
        let password = format!("{sub}'s own test password");
        if self.users.insert(sub.to_string()) {
            let body = serde_json::json!({"name": sub, "password": password}).to_string();
            let (status, answer) = self.broker.admin_post("/users", &body).unwrap();
            assert_eq!(status, 200, "adding the local account {sub}: {answer}");
        }
        password
    }

    /// The browser of `sub` opens `path` on the pages, signing in with its
    /// local account when the pages ask; returns the page.
    pub(crate) async fn open_signed_in(&mut self, path: &str, sub: &str) -> String {
        let password = self.local_user(sub);
        let c = self.browser(sub);
        open_signed_in(&c, &self.broker.public, path, sub, &password).await
    }

    /// Finishes the link in `connect_uri` through the real pages over HTTP,
    /// as the person's browser would: `sub` opens it (signing in with a
    /// local account), presses the button of the link's kind, signs in at
    /// the provider as `account` (for connect and reconnect links), and
    /// the provider's answer goes to the pages' callback. The pages and the
    /// broker's own checks decide; the broker keeps running.
    pub(crate) async fn play_pages(&mut self, connect_uri: &str, sub: &str, account: &str) {
        let password = self.local_user(sub);
        let c = self.browser(sub);
        play_pages_at(
            &c,
            &self.broker.public,
            &self.peer,
            connect_uri,
            (sub, &password),
            account,
        )
        .await;
    }
}

/// [`ServiceEnv::play_pages`] with the pieces given: the browser `c`, the
/// pages at `base` (a broker's, or a load balancer's in front of replicas),
/// the provider `peer`, and the local account `(name, password)` of the
/// person, who already exists.
pub(crate) async fn play_pages_at(
    c: &reqwest::Client,
    base: &str,
    peer: &OidcPeer,
    connect_uri: &str,
    (sub, password): (&str, &str),
    account: &str,
) {
    let path = &connect_uri[connect_uri.find("/connect/").expect("a connect URI")..];
    let html = open_signed_in(c, base, path, sub, password).await;
    let csrf = hidden(&html, "csrf");
    let mut form = vec![("csrf", csrf.as_str())];
    // The page offers the action of the link's kind; an allow link
    // lists the person's connected accounts (the first is checked).
    let chosen;
    if html.contains("name=\"action\" value=\"approve\"") {
        // A step-up approval (docs/APPROVALS.md): the call is approved.
        form.push(("action", "approve"));
    } else if html.contains("name=\"action\" value=\"allow\"") {
        chosen = hidden(&html, "account");
        form.extend([("action", "allow"), ("account", chosen.as_str())]);
    } else if html.contains("name=\"action\" value=\"reconnect\"") {
        form.push(("action", "reconnect"));
    } else {
        form.push(("action", "connect"));
    }
    let go = c
        .post(format!("{base}{path}"))
        .header("sec-fetch-site", "same-origin")
        .form(&form)
        .send()
        .await
        .unwrap();
    assert!(
        go.status().is_redirection(),
        "the link's button: {} {}",
        go.status(),
        go.text().await.unwrap()
    );
    let mut next = location(&go);
    if next.starts_with(&peer.issuer) {
        // To the provider and back to the pages' callback, with
        // whatever the provider put in the answer.
        let back = peer.authorize(&next, account).await;
        let query = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(back.iter())
            .finish();
        // The callback of the link's service: the redirect URI the pages
        // asked the provider for.
        let redirect = url::Url::parse(&next)
            .unwrap()
            .query_pairs()
            .find(|(k, _)| k == "redirect_uri")
            .map(|(_, v)| url::Url::parse(&v).unwrap().path().to_string())
            .unwrap();
        let done = c
            .get(format!("{base}{redirect}?{query}"))
            .send()
            .await
            .unwrap();
        assert!(
            done.status().is_redirection(),
            "the provider callback: {} {}",
            done.status(),
            done.text().await.unwrap()
        );
        next = location(&done);
    }
    assert!(
        ["/done/connected/", "/done/reconnected/", "/done/allowed/"]
            .iter()
            .any(|p| next.starts_with(p))
            || next == "/done/approved",
        "the link was not finished: {next}"
    );
}

/// The value of the first `name="{name}" value="..."` in a page.
pub(crate) fn hidden(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let i = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} in {html}"))
        + marker.len();
    let j = html[i..].find('"').unwrap() + i;
    html[i..j].to_string()
}

/// The `Location` of a redirect (empty when there is none).
pub(crate) fn location(r: &reqwest::Response) -> String {
    r.headers()
        .get("location")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// The browser `c` opens `path` on the pages at `base`, signing in as
/// `name` through the local sign-in form when asked; returns the page.
pub(crate) async fn open_signed_in(
    c: &reqwest::Client,
    base: &str,
    path: &str,
    name: &str,
    password: &str,
) -> String {
    let first = c.get(format!("{base}{path}")).send().await.unwrap();
    if first.status() == 200 {
        return first.text().await.unwrap();
    }
    assert!(
        first.status().is_redirection(),
        "{path}: {} {}",
        first.status(),
        first.text().await.unwrap()
    );
    let page = c
        .get(format!(
            "{base}/signin?return_to={}",
            url::form_urlencoded::byte_serialize(path.as_bytes()).collect::<String>()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    let r = c
        .post(format!("{base}/signin"))
        .header("sec-fetch-site", "same-origin")
        .form(&[
            ("csrf", hidden(&html, "csrf").as_str()),
            ("return_to", path),
            ("username", name),
            ("password", password),
        ])
        .send()
        .await
        .unwrap();
    assert!(
        r.status().is_redirection(),
        "sign-in: {} {}",
        r.status(),
        r.text().await.unwrap()
    );
    let page = c.get(format!("{base}{path}")).send().await.unwrap();
    assert_eq!(page.status(), 200, "{path} after sign-in");
    page.text().await.unwrap()
}

/// The store-level parts an operator reaches offline.
pub(crate) struct Parts {
    pub vault: credbroker::internals::vault::Vault,
}

/// The refusal, or a panic naming what was issued.
pub(crate) fn refused(a: Answer) -> credbroker::client::Refusal {
    match a {
        Answer::Refused(r) => r,
        Answer::Issued(t) => panic!("expected a refusal, got a token of type {}", t.token_type),
    }
}

/// The token, or a panic with the refusal.
pub(crate) fn issued(a: Answer) -> credbroker::client::Token {
    match a {
        Answer::Issued(t) => t,
        Answer::Refused(r) => panic!("expected a token, got {r:?}"),
    }
}
