//! A broker with a connected service (`acme`, played by the oidc-provider
//! peer), and a stand-in for the pages: finishing a link the way the
//! browser routes will, through the library (`connect::resolve`,
//! `upstream`, `connect::complete_connect`), while the broker is stopped
//! (sled is single-process).

use std::path::PathBuf;
use std::sync::Arc;

use credbroker::client::Answer;
use credbroker::jose::Es256Key;

use super::oidc::{secret_file, OidcPeer, CLIENT_ID};
use super::{Opts, TestBroker};

/// The redirect URI the pages use for `acme`: `{issuer}/callback/acme`
/// (test brokers have the issuer `http://127.0.0.1:0`; the tests call the
/// real address themselves).
pub const REDIRECT: &str = "http://127.0.0.1:0/callback/acme";
pub const SERVICE: &str = "https://api.acme.example";

/// The quick-start policy plus the `acme` service resource and two tools.
pub fn policy() -> String {
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
        credbroker::cli::QUICKSTART_POLICY
    )
}

/// Broker + provider.
pub struct ServiceEnv {
    pub peer: OidcPeer,
    pub broker: TestBroker,
    pub client_secret: String,
    secrets: tempfile::TempDir,
}

/// Options of the `acme` provider table.
#[derive(Clone)]
pub struct ProviderOpts {
    pub narrow_on_refresh: bool,
    pub timeout: &'static str,
    pub log: Option<String>,
    /// Where the pages listen (`127.0.0.1:PORT`): then the provider's
    /// redirect URI is the pages' real callback, so a browser can finish
    /// the flow. Default: port 0 and the [`REDIRECT`] placeholder.
    pub public_listen: Option<String>,
    /// More config (e.g. a trusted issuer with OIDC sign-in).
    pub extra_config: String,
}

impl Default for ProviderOpts {
    fn default() -> Self {
        ProviderOpts {
            narrow_on_refresh: false,
            timeout: "1500ms",
            log: None,
            public_listen: None,
            extra_config: String::new(),
        }
    }
}

impl ServiceEnv {
    pub fn start() -> ServiceEnv {
        ServiceEnv::start_with(ProviderOpts::default())
    }

    pub fn start_with(p: ProviderOpts) -> ServiceEnv {
        let mut r = [0u8; 12];
        aws_lc_rs::rand::fill(&mut r).unwrap();
        let client_secret = format!("client-secret-canary-{}", hex::encode(r));
        let redirect = p.public_listen.as_ref().map_or_else(
            || REDIRECT.to_string(),
            |a| format!("http://{a}/callback/acme"),
        );
        let peer = OidcPeer::start(&client_secret, &redirect);
        let secrets = tempfile::tempdir().unwrap();
        let file = secret_file(secrets.path(), "acme.secret", &client_secret);
        let extra = format!(
            r#"
[providers.acme]
display_name = "Acme"
issuer = "{issuer}"
client_id = "{CLIENT_ID}"
client_secret_file = "{file}"
scopes = ["openid", "profile", "read:org"]
narrow_on_refresh = {narrow}
timeout = "{timeout}"
"#,
            issuer = peer.issuer,
            file = file.display(),
            narrow = p.narrow_on_refresh,
            timeout = p.timeout,
        ) + &p.extra_config;
        let broker = TestBroker::start_with(Opts {
            policy: Some(policy()),
            extra_config: extra,
            log: p.log.clone(),
            public_listen: p.public_listen.clone(),
            ..Opts::default()
        });
        ServiceEnv {
            peer,
            broker,
            client_secret,
            secrets,
        }
    }

    pub fn secret_path(&self) -> PathBuf {
        self.secrets.path().join("acme.secret")
    }

    /// A derive for a service tool in step `triage`.
    pub async fn derive(&self, key: &Es256Key, sub: &str, tool: &str) -> Answer {
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

    /// Opens the store the way the pages' handlers will reach it (the
    /// broker must be stopped).
    pub fn open_parts(&self) -> Parts {
        let cfg = credbroker::config::Config::load(&self.broker.config).unwrap();
        let store: Arc<dyn credbroker::store::Store> =
            Arc::new(credbroker::store::SledStore::open(&cfg.store).unwrap());
        let vault = credbroker::vault::Vault::open(store.clone(), &cfg.vault_key_dir).unwrap();
        let master = credbroker::config::read_secret_file(&cfg.master_key_file).unwrap();
        let links = credbroker::connect::Links::new(
            store,
            &credbroker::connect::Links::derive_key(&master),
            &cfg.issuer,
        );
        let providers = credbroker::upstream::Providers::from_config(&cfg).unwrap();
        Parts {
            vault,
            links,
            provider: providers.get("acme").unwrap().clone(),
        }
    }

    /// Plays the pages for the link in `connect_uri`: the person `sub`
    /// opens it, signs in at the provider as `account`, and the broker
    /// stores the account and the allowance. Restarts the broker.
    pub async fn play_pages(&mut self, connect_uri: &str, sub: &str, account: &str) {
        self.broker.stop();
        {
            let parts = self.open_parts();
            let code = connect_uri.rsplit('/').next().unwrap();
            let now = super::now();
            let link = parts
                .links
                .resolve(code, now)
                .unwrap()
                .expect("the link resolves");
            assert_eq!(link.person_sub, sub, "check 3: same person as the link's");
            match link.kind {
                credbroker::connect::LinkKind::Allow => {
                    credbroker::connect::complete_allow(&parts.vault, &parts.links, &link, now)
                        .unwrap();
                }
                _ => {
                    let scopes = credbroker::connect::scopes_to_request(&parts.provider, &link);
                    let req = parts
                        .provider
                        .authorization_request(&scopes, &[])
                        .await
                        .unwrap();
                    let back = self.peer.authorize(&req.url, account).await;
                    assert_eq!(back["state"], *req.state.expose());
                    // The RFC 9207 check the pages run on the callback.
                    let sends_iss = parts
                        .provider
                        .cached_endpoints()
                        .is_some_and(|e| e.sends_iss);
                    credbroker::oauth::check_callback_iss(
                        parts.provider.config().issuer.as_deref(),
                        sends_iss,
                        back.get("iss").map(String::as_str),
                    )
                    .unwrap();
                    credbroker::connect::complete_connect(
                        &parts.vault,
                        &parts.links,
                        &parts.provider,
                        &link,
                        &back["code"],
                        req.verifier.expose(),
                        now,
                    )
                    .await
                    .unwrap();
                }
            }
            assert!(
                parts.links.resolve(code, now).unwrap().is_none(),
                "a finished link is closed"
            );
        }
        self.broker.restart();
    }
}

/// The store-level parts the pages use.
pub struct Parts {
    pub vault: credbroker::vault::Vault,
    pub links: credbroker::connect::Links,
    pub provider: Arc<credbroker::upstream::Provider>,
}

/// The refusal, or a panic naming what was issued.
pub fn refused(a: Answer) -> credbroker::client::Refusal {
    match a {
        Answer::Refused(r) => r,
        Answer::Issued(t) => panic!("expected a refusal, got a token of type {}", t.token_type),
    }
}

/// The token, or a panic with the refusal.
pub fn issued(a: Answer) -> credbroker::client::Token {
    match a {
        Answer::Issued(t) => t,
        Answer::Refused(r) => panic!("expected a token, got {r:?}"),
    }
}
