//! Running an instance: `serve` and `quickstart`.

use std::path::Path;
use std::sync::Arc;

use crate::infra::config::Config;

use super::exit::Exit;
use super::Res;

/// `credbroker serve`: serves with a config file until SIGTERM or Ctrl-C.
/// Refuses a config that names the quick start's demo service.
pub(super) async fn serve(config: &Path) -> Res {
    let cfg = Config::load(config)?;
    if let Some(name) = &cfg.quickstart_demo {
        return Err(format!(
            "{}: providers.{name}: preset = \"{}\" is the quick start's built-in demo \
             service, which only `credbroker quickstart` runs (it is a stand-in, not a real \
             provider); remove [providers.{name}] and the policy's resources with \
             service = \"{name}\" to serve this config",
            config.display(),
            crate::infra::config::QUICKSTART_DEMO
        )
        .into());
    }
    let (inst, listeners) = start(&cfg).await?;
    crate::app::server::run(inst, listeners, crate::app::server::shutdown_signal()).await?;
    Ok(Exit::Ok)
}

/// Builds the instance and binds its listeners.
async fn start(
    cfg: &Config,
) -> Result<(crate::app::Instance, crate::app::server::Listeners), crate::app::StartError> {
    let clock = crate::infra::failpoint::clock(Arc::new(crate::base::clock::SystemClock));
    // Bind first: a busy port or an unusable socket path fails before the
    // store and the keys exist, and a later failure removes the sockets.
    let listeners = crate::app::bind::bind(cfg).await?;
    let inst = match crate::app::build(cfg.clone(), clock).await {
        Ok(i) => i,
        Err(e) => {
            listeners.abandon();
            return Err(e);
        }
    };
    if let Some(addr) = listeners.public.as_ref().and_then(|l| l.local_addr().ok()) {
        tracing::info!(%addr, "public listener bound");
        inst.public_addr.set(addr).ok();
    }
    Ok((inst, listeners))
}

/// `credbroker quickstart`: makes the quick-start directory (or reuses
/// it), adds local accounts alice and bob the first time, starts the demo
/// service, prints the next steps, and serves from it.
pub(super) async fn quickstart(dir: &Path, listen: Option<&str>, demo_listen: Option<&str>) -> Res {
    use super::quickstart as qs;
    let prepared = qs::prepare(dir, listen, demo_listen)?;
    let config = prepared.config;
    let cfg = Config::load(&config)?;
    // The demo service binds first: a busy port fails before the broker's
    // own listeners and store are opened.
    let demo = match (&cfg.quickstart_demo, qs::demo_addr(&cfg)) {
        (Some(name), Some(addr)) => Some(demo_service(dir, &cfg, name, addr).await?),
        _ => None,
    };
    let (inst, listeners) = start(&cfg).await?;
    let accounts = local_accounts(&inst)?;
    let d = dir.display();
    let sock = cfg.socket.path.display();
    let issuer = &cfg.issuer;
    let me =
        std::env::current_exe().map_or_else(|_| "credbroker".into(), |p| p.display().to_string());
    let mut out = format!(
        r#"
credbroker quick start (development only: plain HTTP on loopback, dev issuer)
  config   {config}{made}
  socket   {sock}
  issuer   {issuer}   (metadata: {issuer}/.well-known/oauth-authorization-server)
"#,
        config = config.display(),
        made = if prepared.fresh {
            "   (made now)"
        } else {
            "   (reused)"
        },
    );
    if let Some((_, demo)) = &demo {
        out.push_str(&format!(
            "  demo     {}   (the built-in demo service: a stand-in provider, quick start only)\n",
            demo.issuer()
        ));
    }
    out.push_str("\nLocal accounts for the pages (sign in at ");
    out.push_str(issuer);
    out.push_str("/account):\n");
    for (name, password) in &accounts {
        match password {
            Some(p) => out.push_str(&format!(
                "  {name:<6} password {}   (printed once: note it now)\n",
                p.expose()
            )),
            None => out.push_str(&format!(
                "  {name:<6} exists (a new password: credbroker users add {name} --replace --config {})\n",
                config.display()
            )),
        }
    }
    out.push_str(&format!(
        r#"
Next steps, in another terminal (the README's walkthrough):
  alias credbroker="{me}"
  TOKEN=$(credbroker subject-token --dir {d} --sub alice)
  credbroker derive --socket {sock} \
    --issuer {issuer} --subject-token "$TOKEN" \
    --step summarize --tool notes.read --resource http://127.0.0.1:9090/notes \
    --dpop-key tool-key.pem
  # a sensitive tool outside its step is denied:
  credbroker derive --socket {sock} \
    --issuer {issuer} --subject-token "$TOKEN" \
    --step summarize --tool notes.delete --resource http://127.0.0.1:9090/notes \
    --dpop-key tool-key.pem
"#
    ));
    let demo_resource = cfg
        .quickstart_demo
        .as_deref()
        .and_then(|name| demo_resource(&inst.broker.policy.load(), name));
    out.push_str(&demo_steps(&cfg, &config, demo.is_some(), demo_resource));
    out.push_str(
        r#"
(plain HTTP on loopback: the session cookie is the development cookie
"credbroker-dev" instead of "__Host-credbroker", which needs https)
"#,
    );
    eprintln!("{out}");
    // The banner held the passwords: gone from memory once printed.
    zeroize::Zeroize::zeroize(&mut out);
    drop(accounts);
    let demo_task = demo.map(|(listener, d)| tokio::spawn(crate::demo::serve(listener, d)));
    let res = crate::app::server::run(inst, listeners, crate::app::server::shutdown_signal()).await;
    if let Some(t) = demo_task {
        t.abort();
    }
    res?;
    Ok(Exit::Ok)
}

/// The quick start banner's walkthrough of the demo tool: a connect link,
/// then (through the proxy) the call; a directory made by an older version
/// says what differs instead.
fn demo_steps(
    cfg: &Config,
    config: &Path,
    has_demo: bool,
    demo_resource: Option<(String, crate::derive::policy::Delivery)>,
) -> String {
    use super::quickstart as qs;
    let sock = cfg.socket.path.display();
    let issuer = &cfg.issuer;
    let mut out = String::new();
    match (has_demo, demo_resource) {
        (true, Some((resource, crate::derive::policy::Delivery::Proxy))) => {
            out.push_str(&format!(
                r#"  # the demo tool needs alice's demo account: the answer is a connect link
  credbroker derive --socket {sock} \
    --issuer {issuer} --subject-token "$TOKEN" \
    --step summarize --tool demo.notes --resource {resource} \
    --dpop-key tool-key.pem --print connect_uri
  # open it in a browser, sign in as alice, Connect, pick her demo account,
  # Allow; (bob opening it changes nothing). Then the same call is issued: a
  # token for the broker's proxy, bound to the tool's key (the demo
  # service's own token stays in the broker), and the call goes through it:
  DEMO_AT=$(credbroker derive --socket {sock} \
    --issuer {issuer} --subject-token "$TOKEN" \
    --step summarize --tool demo.notes --resource {resource} \
    --dpop-key tool-key.pem --print access_token)
  URL={resource}{notes}
  PROOF=$(credbroker proof --key tool-key.pem --method GET --url "$URL" --access-token "$DEMO_AT")
  curl -H "Authorization: DPoP $DEMO_AT" -H "DPoP: $PROOF" "$URL"
  # alice disconnects: revoked at the demo service (RFC 7009), then deleted
  credbroker accounts disconnect -c {config} \
    --person alice --service demo
"#,
                notes = qs::DEMO_NOTES_PATH,
                config = config.display(),
            ));
        }
        (true, Some((resource, crate::derive::policy::Delivery::ProviderToken))) => {
            // A directory made before the demo went through the proxy: it
            // still serves as it was written (its connected accounts and
            // policy are the person's), and the banner says what differs.
            out.push_str(&format!(
                r#"  # the demo tool needs alice's demo account: the answer is a connect link
  credbroker derive --socket {sock} \
    --issuer {issuer} --subject-token "$TOKEN" \
    --step summarize --tool demo.notes --resource {resource} \
    --dpop-key tool-key.pem --print connect_uri

(this directory was made by an older version: its demo tool hands the demo
service's own token to the tool, delivery = "provider_token" in {policy};
the walkthrough now calls the demo service through the broker's proxy, where
that token stays in the broker: give a new --dir to follow it)
"#,
                policy = cfg.policy.display()
            ));
        }
        _ => out.push_str(
            "\n(this directory was made without the demo service, by an older version: \
             the connect-link walkthrough needs a new --dir)\n",
        ),
    }
    out
}

/// The resource of the demo tool in `policy` (the first `service`
/// resource of the demo provider `name`) and how it is delivered.
fn demo_resource(
    policy: &crate::derive::policy::Policy,
    name: &str,
) -> Option<(String, crate::derive::policy::Delivery)> {
    policy.resources.values().find_map(|r| match &r.source {
        crate::derive::policy::Source::Service { service, delivery } if service == name => {
            Some((r.id.clone(), *delivery))
        }
        _ => None,
    })
}

/// Each quick-start person's name, and the password made for them by this
/// run (to be printed once), `None` when the account already existed.
type Accounts = Vec<(&'static str, Option<crate::base::secret::SecretString>)>;

/// The quick start's two people, as local accounts: made (with a
/// generated password) when missing.
fn local_accounts(inst: &crate::app::Instance) -> Result<Accounts, Box<dyn std::error::Error>> {
    let store = inst.broker.store.as_ref();
    let mut out = Vec::new();
    for name in ["alice", "bob"] {
        if crate::accounts::users::exists(store, &inst.sealer, name)? {
            out.push((name, None));
            continue;
        }
        let mut r = [0u8; 12];
        aws_lc_rs::rand::fill(&mut r).map_err(|_| "no randomness for a password")?;
        let password = crate::base::secret::SecretString::new(crate::base::jose::b64e(&r));
        zeroize::Zeroize::zeroize(&mut r);
        // Replaced: a record there that does not open (an earlier
        // release's, in clear) is no account.
        crate::derive::ops::add_user(
            store,
            &inst.sealer,
            name,
            &password,
            true,
            crate::derive::ops::Recorder::of(&inst.broker),
        )?;
        out.push((name, Some(password)));
    }
    Ok(out)
}

/// Binds the demo service at `addr` and sets it up from the quick-start
/// directory (its key) and the config (its client and redirect URI).
async fn demo_service(
    dir: &Path,
    cfg: &Config,
    name: &str,
    addr: std::net::SocketAddr,
) -> Result<(tokio::net::TcpListener, Arc<crate::demo::Demo>), Box<dyn std::error::Error>> {
    use super::quickstart as qs;
    let provider = cfg
        .providers
        .get(name)
        .ok_or("the demo provider is missing")?;
    let key = super::keyfile::load_pem_key(&dir.join(qs::DEMO_KEY))?;
    let issuer = format!("http://{addr}");
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        format!(
            "the demo service cannot listen on {addr} ({e}); a directory keeps the address it was \
             made for: stop what uses it, or give another --dir with a free --demo-listen"
        )
    })?;
    let demo = crate::demo::Demo::new(
        crate::demo::DemoOptions {
            api_base: format!("{issuer}{}", qs::DEMO_API_PATH),
            issuer,
            client_id: provider.client_id.clone(),
            redirect_uri: provider.redirect_uri.clone(),
            key,
            revoked_file: Some(dir.join(qs::DEMO_REVOKED)),
        },
        Arc::new(crate::base::clock::SystemClock),
    )?;
    Ok((listener, demo))
}
