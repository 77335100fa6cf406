//! Test support for the pages: an instance run in-process (so the clock can
//! be moved and the connected-services side replaced), a fake of that side
//! (link records, vault, provider) kept in memory, a fake provider that
//! approves at once over HTTP, and an HTTP client with a cookie store.
//!
//! The fake is for tests only: it stands in for the real connected-services
//! side (`connect::Backend` over the link store, the vault and the provider
//! clients) where a test sets link states and provider accounts directly.
//! What the fake shows is the pages' own behaviour; the cases the threat
//! model cites for the link store and the provider also run with the real
//! side (`Setup::real_services`, tests/it/pages/real_services.rs).
//!
//! Used as `crate::support::pages` (the pages tests glob-import it).
#![allow(dead_code, missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use credbroker::internals::clock::ManualClock;
use credbroker::internals::pages::links::{
    AccountVault, AccountView, AllowanceView, AuthorizationRequest, BackendError, BoxFuture,
    ConnectedServices, Disconnected, Link, LinkKind, LinkRecords, ProviderFlow, ProviderGrant,
    ProviderInfo,
};
use credbroker::internals::pages::{Options, PageLimits};
use credbroker::internals::secret::SecretString;
use credbroker::internals::subject::Person;
use credbroker::internals::vault::AccountStatus;

pub(crate) const AGENT: &str = "repo-helper";

pub(crate) fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn b64(b: &[u8]) -> String {
    credbroker::internals::jose::b64e(b)
}

fn sha(s: &str) -> String {
    credbroker::internals::jose::sha256_b64(s.as_bytes())
}

fn random_code() -> String {
    let mut b = [0u8; 32];
    aws_lc_rs::rand::fill(&mut b).unwrap();
    b64(&b)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkState {
    Open,
    Closed,
    Declined,
    Replaced,
}

#[derive(Debug, Default)]
struct State {
    /// id -> (hash of code, link, state)
    links: HashMap<String, (String, Link, LinkState)>,
    /// (person, account view)
    accounts: Vec<(Person, AccountView)>,
    /// state -> (challenge, redirect_uri) from authorization URLs
    pending: HashMap<String, (String, String)>,
    /// provider code -> (challenge, redirect_uri)
    codes: HashMap<String, (String, String)>,
    /// The account the fake provider signs in as next: (id, name).
    next_account: Option<(String, String)>,
    revoked_at_provider: Vec<String>,
    exchanges: usize,
}

/// The fake connected-services side.
#[derive(Debug)]
pub(crate) struct Fake {
    st: Mutex<State>,
    /// The fake provider's base URL (`http://127.0.0.1:PORT`).
    pub provider_base: String,
}

impl Fake {
    pub(crate) fn new(provider_base: &str) -> Arc<Fake> {
        Arc::new(Fake {
            st: Mutex::new(State::default()),
            provider_base: provider_base.to_string(),
        })
    }

    pub(crate) fn services(self: &Arc<Self>) -> ConnectedServices {
        ConnectedServices {
            links: self.clone(),
            vault: self.clone(),
            providers: self.clone(),
        }
    }

    /// Issues (or returns the open) link for (person, agent, service); a new
    /// kind replaces the open link. Returns (code, id).
    pub(crate) fn issue(
        &self,
        person: &Person,
        service: &str,
        kind: LinkKind,
        scopes: &[&str],
        now: i64,
    ) -> (String, String) {
        let mut st = self.st.lock().unwrap();
        for (_, (_, l, s)) in st.links.iter_mut() {
            if *s == LinkState::Open
                && l.person == *person
                && l.service == service
                && l.agent == AGENT
            {
                *s = LinkState::Replaced;
            }
        }
        let code = random_code();
        let id = format!("lnk_{}", &random_code()[..12]);
        let link = Link {
            id: id.clone(),
            person: person.clone(),
            agent: AGENT.into(),
            service: service.into(),
            kind,
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            expires: now + 1800,
        };
        st.links
            .insert(id.clone(), (sha(&code), link, LinkState::Open));
        (code, id)
    }

    pub(crate) fn link_state(&self, id: &str) -> LinkState {
        self.st.lock().unwrap().links[id].2
    }

    pub(crate) fn set_next_account(&self, id: &str, name: &str) {
        self.st.lock().unwrap().next_account = Some((id.into(), name.into()));
    }

    /// Adds a connected account directly (for allow links and the account page).
    pub(crate) fn add_account(
        &self,
        person: &Person,
        service: &str,
        id: &str,
        name: &str,
        allowed: &[(&str, &[&str])],
    ) {
        self.st.lock().unwrap().accounts.push((
            person.clone(),
            AccountView {
                service: service.into(),
                account_id: id.into(),
                display_name: name.into(),
                status: AccountStatus::Active,
                allowances: allowed
                    .iter()
                    .map(|(a, s)| AllowanceView {
                        agent: a.to_string(),
                        scopes: s.iter().map(|x| x.to_string()).collect(),
                    })
                    .collect(),
            },
        ));
    }

    pub(crate) fn accounts_of(&self, person: &Person) -> Vec<AccountView> {
        self.st
            .lock()
            .unwrap()
            .accounts
            .iter()
            .filter(|(p, _)| p == person)
            .map(|(_, a)| a.clone())
            .collect()
    }

    pub(crate) fn exchanges(&self) -> usize {
        self.st.lock().unwrap().exchanges
    }

    pub(crate) fn revoked_at_provider(&self) -> Vec<String> {
        self.st.lock().unwrap().revoked_at_provider.clone()
    }

    /// The provider's consent: returns an authorization code for `state`.
    pub(crate) fn approve(&self, state: &str) -> Option<String> {
        let mut st = self.st.lock().unwrap();
        let (challenge, redirect_uri) = st.pending.remove(state)?;
        let code = format!("pc_{}", random_code());
        st.codes.insert(code.clone(), (challenge, redirect_uri));
        Some(code)
    }
}

impl LinkRecords for Fake {
    fn resolve(&self, code: &SecretString, now: i64) -> Result<Option<Link>, BackendError> {
        let h = sha(code.expose());
        let st = self.st.lock().unwrap();
        Ok(st
            .links
            .values()
            .find(|(ch, l, s)| *ch == h && *s == LinkState::Open && l.expires > now)
            .map(|(_, l, _)| l.clone()))
    }
    fn get(&self, id: &str, now: i64) -> Result<Option<Link>, BackendError> {
        let st = self.st.lock().unwrap();
        Ok(st
            .links
            .get(id)
            .filter(|(_, l, s)| *s == LinkState::Open && l.expires > now)
            .map(|(_, l, _)| l.clone()))
    }
    fn close(&self, id: &str, _now: i64) -> Result<(), BackendError> {
        let mut st = self.st.lock().unwrap();
        let e = st.links.get_mut(id).ok_or(BackendError::NotFound)?;
        e.2 = LinkState::Closed;
        Ok(())
    }
    fn decline(&self, id: &str, _now: i64) -> Result<(), BackendError> {
        let mut st = self.st.lock().unwrap();
        let e = st.links.get_mut(id).ok_or(BackendError::NotFound)?;
        e.2 = LinkState::Declined;
        Ok(())
    }
}

impl AccountVault for Fake {
    fn accounts(&self, person: &Person) -> Result<Vec<AccountView>, BackendError> {
        Ok(self.accounts_of(person))
    }
    fn store_account(
        &self,
        person: &Person,
        service: &str,
        grant: ProviderGrant,
        _now: i64,
    ) -> Result<String, BackendError> {
        let mut st = self.st.lock().unwrap();
        let id = grant.account_id.clone();
        st.accounts
            .retain(|(p, a)| !(p == person && a.service == service && a.account_id == id));
        st.accounts.push((
            person.clone(),
            AccountView {
                service: service.into(),
                account_id: id.clone(),
                display_name: grant.display_name.clone(),
                status: AccountStatus::Active,
                allowances: vec![],
            },
        ));
        Ok(id)
    }
    fn allow(
        &self,
        person: &Person,
        service: &str,
        account_id: &str,
        agent: &str,
        scopes: &[String],
        _now: i64,
    ) -> Result<(), BackendError> {
        let mut st = self.st.lock().unwrap();
        let (_, a) = st
            .accounts
            .iter_mut()
            .find(|(p, a)| p == person && a.service == service && a.account_id == account_id)
            .ok_or(BackendError::NotFound)?;
        a.allowances.retain(|al| al.agent != agent);
        a.allowances.push(AllowanceView {
            agent: agent.into(),
            scopes: scopes.to_vec(),
        });
        Ok(())
    }
    fn revoke_allowance(
        &self,
        person: &Person,
        service: &str,
        account_id: &str,
        agent: &str,
    ) -> Result<(), BackendError> {
        let mut st = self.st.lock().unwrap();
        let (_, a) = st
            .accounts
            .iter_mut()
            .find(|(p, a)| p == person && a.service == service && a.account_id == account_id)
            .ok_or(BackendError::NotFound)?;
        a.allowances.retain(|al| al.agent != agent);
        Ok(())
    }
    fn disconnect<'a>(
        &'a self,
        person: &'a Person,
        service: &'a str,
        account_id: &'a str,
    ) -> BoxFuture<'a, Result<Disconnected, BackendError>> {
        Box::pin(async move {
            let mut st = self.st.lock().unwrap();
            let before = st.accounts.len();
            st.accounts.retain(|(p, a)| {
                !(p == person && a.service == service && a.account_id == account_id)
            });
            if st.accounts.len() == before {
                return Err(BackendError::NotFound);
            }
            st.revoked_at_provider.push(account_id.to_string());
            Ok(if service == "github" {
                Disconnected::Revoked
            } else {
                Disconnected::DeletedOnly
            })
        })
    }
}

impl ProviderFlow for Fake {
    fn provider(&self, service: &str) -> Option<ProviderInfo> {
        let (name, sends_iss) = match service {
            "github" => ("GitHub", true),
            "gitlab" => ("GitLab", false),
            _ => return None,
        };
        Some(ProviderInfo {
            display_name: name.into(),
            authorization_endpoint: url::Url::parse(&format!(
                "{}/{service}/authorize",
                self.provider_base
            ))
            .unwrap(),
            issuer: Some(format!("{}/{service}", self.provider_base)),
            sends_iss,
        })
    }
    fn authorization_url(&self, req: &AuthorizationRequest<'_>) -> Result<url::Url, BackendError> {
        let mut st = self.st.lock().unwrap();
        st.pending.insert(
            req.state.expose().clone(),
            (req.code_challenge.to_string(), req.redirect_uri.to_string()),
        );
        let mut u =
            url::Url::parse(&format!("{}/{}/authorize", self.provider_base, req.service)).unwrap();
        u.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", "credbroker-test")
            .append_pair("redirect_uri", req.redirect_uri)
            .append_pair("state", req.state.expose())
            .append_pair("code_challenge", req.code_challenge)
            .append_pair("code_challenge_method", "S256")
            .append_pair("scope", &req.scopes.join(" "));
        Ok(u)
    }
    fn exchange_code<'a>(
        &'a self,
        _service: &'a str,
        code: SecretString,
        verifier: SecretString,
        redirect_uri: &'a str,
    ) -> BoxFuture<'a, Result<ProviderGrant, BackendError>> {
        Box::pin(async move {
            let mut st = self.st.lock().unwrap();
            st.exchanges += 1;
            let (challenge, ru) = st
                .codes
                .remove(code.expose())
                .ok_or_else(|| BackendError::Refused("invalid_grant".into()))?;
            if sha(verifier.expose()) != challenge || ru != redirect_uri {
                return Err(BackendError::Refused(
                    "invalid_grant (PKCE or redirect_uri)".into(),
                ));
            }
            let (id, name) = st
                .next_account
                .clone()
                .unwrap_or(("1001".into(), "octo-alice".into()));
            Ok(ProviderGrant {
                account_id: id,
                display_name: name,
                scopes: vec!["repo".into()],
                access_token: SecretString::new("gho_canary_access".into()),
                token_type: "bearer".into(),
                refresh_token: Some(SecretString::new("ghr_canary_refresh".into())),
                expires_at: None,
            })
        })
    }
    fn revoke_grant<'a>(
        &'a self,
        _service: &'a str,
        grant: ProviderGrant,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            self.st
                .lock()
                .unwrap()
                .revoked_at_provider
                .push(grant.account_id);
            Ok(true)
        })
    }
}

/// Serves the fake provider's authorization endpoint: it approves at once
/// and redirects to the redirect URI with a code, the state and `iss`.
pub(crate) async fn serve_fake_provider(listener: tokio::net::TcpListener, fake: Arc<Fake>) {
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let fake = fake.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let fake = fake.clone();
                async move {
                    let q: HashMap<String, String> =
                        url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
                            .into_owned()
                            .collect();
                    let service = req
                        .uri()
                        .path()
                        .trim_start_matches('/')
                        .split('/')
                        .next()
                        .unwrap_or("")
                        .to_string();
                    let resp = match (q.get("state"), q.get("redirect_uri")) {
                        (Some(state), Some(ru)) => match fake.approve(state) {
                            Some(code) => {
                                let mut u = url::Url::parse(ru).unwrap();
                                u.query_pairs_mut()
                                    .append_pair("code", &code)
                                    .append_pair("state", state)
                                    .append_pair(
                                        "iss",
                                        &format!("{}/{service}", fake.provider_base),
                                    );
                                hyper::Response::builder()
                                    .status(302)
                                    .header("location", u.as_str())
                                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                                    .unwrap()
                            }
                            None => hyper::Response::builder()
                                .status(400)
                                .body(http_body_util::Full::new(bytes::Bytes::from(
                                    "unknown state",
                                )))
                                .unwrap(),
                        },
                        _ => hyper::Response::builder()
                            .status(400)
                            .body(http_body_util::Full::new(bytes::Bytes::from("bad request")))
                            .unwrap(),
                    };
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// How to start a test instance.
#[derive(Clone)]
pub(crate) struct Setup {
    pub limits: PageLimits,
    /// Serve https with a self-signed certificate (issuer https://...).
    pub tls: bool,
    /// Edit the config text (after the quick-start files are written).
    pub edit_config: Option<Arc<dyn Fn(String) -> String + Send + Sync>>,
    /// Listen here instead of an ephemeral port (when a peer must know the
    /// pages' URL before they start).
    pub listen: Option<SocketAddr>,
    /// Keep the connected-services side `app::build` made (the real
    /// link store, vault and provider clients, as configured) instead of
    /// the fake: for end-to-end tests that want the in-process clock.
    pub real_services: bool,
    /// Replace the quick-start policy with this text.
    pub policy: Option<String>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            // Generous: tests sign in many times from 127.0.0.1; the tests
            // of the limits set their own.
            limits: PageLimits {
                lookups_per_minute: 6000,
                lookup_burst: 2000,
                signins_per_minute: 6000,
                signin_burst: 2000,
            },
            tls: false,
            edit_config: None,
            listen: None,
            real_services: false,
            policy: None,
        }
    }
}

/// An in-process instance with its real connected-services side and one
/// provider, `acme`, played by oidc-provider (tests/peers/oauth-service.mjs,
/// which requires PKCE) on a loopback port the pages know before they
/// start; the policy is `services::policy()`.
pub(crate) struct RealServices {
    pub s: PagesServer,
    pub peer: crate::support::oidc::OidcPeer,
    /// The pages' base URL (`http://127.0.0.1:port`).
    pub base: String,
    /// The client secret and policy files, kept while the instance runs.
    pub _secrets: tempfile::TempDir,
}

/// Starts a [`RealServices`].
pub(crate) async fn real_services_world() -> RealServices {
    use crate::support::oidc::{secret_file, OidcPeer};
    let addr = crate::support::free_loopback_addr();
    let base = format!("http://{addr}");
    let client_secret = format!(
        "client-secret-canary-{}",
        hex::encode(crate::support::random_bytes(12))
    );
    let peer = OidcPeer::start(&client_secret, &format!("{base}/callback/acme"));
    let secrets = tempfile::tempdir().unwrap();
    let secret = secret_file(secrets.path(), "acme.secret", &client_secret);
    let policy = secrets.path().join("policy.toml");
    std::fs::write(&policy, crate::support::services::policy()).unwrap();
    let provider = format!(
        r#"
[providers.acme]
display_name = "Acme"
issuer = "{issuer}"
client_id = "{client}"
client_secret_file = "{secret}"
scopes = ["openid", "profile", "read:org"]
"#,
        issuer = peer.issuer,
        client = crate::support::oidc::CLIENT_ID,
        secret = secret.display(),
    );
    let policy_line = format!("policy = \"{}\"", policy.display());
    let s = PagesServer::start_with(Setup {
        listen: Some(addr.parse().unwrap()),
        real_services: true,
        edit_config: Some(Arc::new(move |text: String| {
            assert!(text.contains("policy = \"policy.toml\""));
            text.replace("policy = \"policy.toml\"", &policy_line) + &provider
        })),
        ..Setup::default()
    })
    .await;
    RealServices {
        s,
        peer,
        base,
        _secrets: secrets,
    }
}

/// An instance running in this process.
pub(crate) struct PagesServer {
    pub dir: tempfile::TempDir,
    pub base: String,
    pub addr: SocketAddr,
    pub clock: Arc<ManualClock>,
    pub fake: Arc<Fake>,
    pub inst: credbroker::internals::app::Instance,
    pub issuer: String,
    pub ca_pem: Option<PathBuf>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), String>>>,
}

impl PagesServer {
    pub(crate) async fn start() -> PagesServer {
        PagesServer::start_with(Setup::default()).await
    }

    pub(crate) async fn start_with(setup: Setup) -> PagesServer {
        let listener = tokio::net::TcpListener::bind(
            setup
                .listen
                .unwrap_or_else(|| "127.0.0.1:0".parse().unwrap()),
        )
        .await
        .unwrap();
        let addr = listener.local_addr().unwrap();
        let provider_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let provider_base = format!("http://{}", provider_listener.local_addr().unwrap());
        let dir = tempfile::tempdir().unwrap();
        let listen = addr.to_string();
        let config = credbroker::internals::cli::quickstart_files(dir.path(), &listen).unwrap();
        let mut text = std::fs::read_to_string(&config).unwrap();
        let mut ca_pem = None;
        if setup.tls {
            // A test CA and a leaf for 127.0.0.1 signed by it (webpki
            // refuses a CA certificate used as the server's own).
            let p = |n: &str| dir.path().join(n);
            let cert = p("tls-cert.pem");
            let key = p("tls-key.pem");
            let run = |args: &[&str]| {
                let ok = std::process::Command::new("openssl")
                    .args(args)
                    .current_dir(dir.path())
                    .stderr(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .status()
                    .unwrap()
                    .success();
                assert!(ok, "openssl {args:?}");
            };
            let ec = [
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
            ];
            run(&[
                &["req", "-x509"][..],
                &ec,
                &[
                    "-days",
                    "1",
                    "-subj",
                    "/CN=credbroker test CA",
                    "-keyout",
                    "ca-key.pem",
                    "-out",
                    "ca.pem",
                ],
            ]
            .concat());
            run(&[
                &["req"][..],
                &ec,
                &[
                    "-subj",
                    "/CN=127.0.0.1",
                    "-keyout",
                    "tls-key.pem",
                    "-out",
                    "leaf.csr",
                ],
            ]
            .concat());
            std::fs::write(p("leaf.ext"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n").unwrap();
            run(&[
                "x509",
                "-req",
                "-in",
                "leaf.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                "leaf.ext",
                "-out",
                "tls-cert.pem",
            ]);
            let _ = (&cert, &key);
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
            text = text.replace(&format!("http://{listen}"), &format!("https://{listen}"));
            text = text.replace(
                &format!("listen = \"{listen}\""),
                &format!(
                    "listen = \"{listen}\"\ntls_cert = \"tls-cert.pem\"\ntls_key = \"tls-key.pem\""
                ),
            );
            ca_pem = Some(p("ca.pem"));
        }
        if let Some(edit) = &setup.edit_config {
            text = edit(text);
        }
        if let Some(policy) = &setup.policy {
            std::fs::write(dir.path().join("policy.toml"), policy).unwrap();
        }
        std::fs::write(&config, text).unwrap();
        let cfg = credbroker::internals::config::Config::load(&config).unwrap();
        let clock = ManualClock::new(now());
        let mut inst = credbroker::internals::app::build(cfg.clone(), clock.clone())
            .await
            .unwrap();
        let fake = Fake::new(&provider_base);
        inst.pages = Arc::new(credbroker::internals::pages::Pages::new(
            inst.broker.clone(),
            inst.sealer.clone(),
            Options {
                limits: setup.limits,
                services: if setup.real_services {
                    inst.pages.services().clone()
                } else {
                    fake.services()
                },
                approvals: inst.pages.approvals().clone(),
                ..Options::default()
            },
        ));
        tokio::spawn(serve_fake_provider(provider_listener, fake.clone()));
        let mut created = credbroker::internals::unix::Created::default();
        let api =
            credbroker::internals::unix::bind(&cfg.socket.path, 0o750, 0o660, None, &mut created)
                .unwrap();
        let admin =
            credbroker::internals::unix::bind(&cfg.admin_socket, 0o700, 0o600, None, &mut created)
                .unwrap();
        let listeners = credbroker::internals::server::Listeners {
            api,
            admin,
            public: Some(listener),
            metrics: None,
            created,
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let i2 = inst.clone();
        let task = tokio::spawn(async move {
            credbroker::internals::server::run(i2, listeners, async {
                let _ = rx.await;
            })
            .await
            .map_err(|e| e.to_string())
        });
        PagesServer {
            dir,
            base: cfg.issuer.clone(),
            addr,
            clock,
            fake,
            inst,
            issuer: cfg.issuer.clone(),
            ca_pem,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    /// The broker's own issuer (local accounts' persons).
    pub(crate) fn person(&self, name: &str) -> Person {
        Person {
            iss: self.issuer.clone(),
            sub: name.to_string(),
        }
    }

    pub(crate) fn add_user(&self, name: &str, password: &str) {
        credbroker::internals::pages::users::add(
            self.inst.broker.store.as_ref(),
            &self.inst.sealer,
            name,
            &SecretString::new(password.into()),
            false,
            now(),
        )
        .unwrap();
    }

    /// A browser-like client: cookie store, no automatic redirects.
    pub(crate) fn client(&self) -> reqwest::Client {
        let mut b = reqwest::Client::builder()
            .cookie_store(true)
            .redirect(reqwest::redirect::Policy::none());
        if let Some(ca) = &self.ca_pem {
            let pem = std::fs::read(ca).unwrap();
            b = b.add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap());
        }
        b.build().unwrap()
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) fn audit_lines(&self) -> Vec<serde_json::Value> {
        super::read_audit(&self.dir.path().join("data/audit.jsonl"))
    }

    pub(crate) fn events(&self, name: &str) -> Vec<serde_json::Value> {
        self.audit_lines()
            .into_iter()
            .filter(|e| e["event"] == name)
            .collect()
    }

    /// Sends the shutdown signal and returns at once (tests of the drain;
    /// `stop` then waits for the end).
    pub(crate) fn signal_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Whether the server has ended (its task returned).
    pub(crate) fn has_ended(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }

    pub(crate) async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        // The server must end, and end cleanly: an error or a panic while
        // serving (or shutting down) fails the test that stopped it.
        if let Some(t) = self.task.take() {
            let r = tokio::time::timeout(std::time::Duration::from_secs(30), t)
                .await
                .expect("the in-process server stops within 30 s of the shutdown signal");
            r.expect("the in-process server task panicked")
                .expect("the in-process server ended with an error");
        }
    }
}

/// The value of `name="csrf"` in a page.
pub(crate) fn csrf_of(html: &str) -> String {
    hidden(html, "csrf").expect("page has a CSRF token")
}

/// The value of a hidden input.
pub(crate) fn hidden(html: &str, name: &str) -> Option<String> {
    let marker = format!("name=\"{name}\" value=\"");
    let i = html.find(&marker)? + marker.len();
    let j = html[i..].find('"')? + i;
    Some(html[i..j].to_string())
}

/// The `Location` of a redirect.
pub(crate) fn location(r: &reqwest::Response) -> String {
    r.headers()
        .get("location")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// Signs in with a local account through the form; returns the final
/// response after following the redirect once.
pub(crate) async fn sign_in(
    s: &PagesServer,
    c: &reqwest::Client,
    return_to: &str,
    name: &str,
    password: &str,
) -> reqwest::Response {
    let page = c
        .get(s.url(&format!("/signin?return_to={}", urlenc(return_to))))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200, "sign-in page");
    let html = page.text().await.unwrap();
    let csrf = csrf_of(&html);
    c.post(s.url("/signin"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("return_to", return_to),
            ("username", name),
            ("password", password),
        ])
        .send()
        .await
        .unwrap()
}

pub(crate) fn urlenc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}
