//! The quick start's templates: its directory (config, policy, keys, the
//! dev issuer, the demo service's key), the checks of its addresses, and
//! the dev issuer's subject tokens.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::base::jose::Es256Key;
use crate::infra::config::{write_secret_file, Config};

use super::keyfile::{load_pem_key, pem_pkcs8};

/// The quick start's config file name, inside its directory.
pub(super) const QS_CONFIG: &str = "credbroker.toml";
/// The public listener when `--listen` is not given.
pub(super) const DEFAULT_LISTEN: &str = "127.0.0.1:8440";
/// The demo service when neither `--listen` nor `--demo-listen` is
/// given (with `--listen`, the demo service takes the port after it:
/// [`demo_after`]).
pub(super) const DEFAULT_DEMO_LISTEN: &str = "127.0.0.1:8441";
/// The demo service's signing key, inside the directory.
pub(super) const DEMO_KEY: &str = "keys/demo-service.pem";
/// The demo service's revoked grants, one id a line.
pub(super) const DEMO_REVOKED: &str = "data/demo-revoked-grants";
/// The demo provider's name (the policy's `service`).
pub(super) const DEMO_SERVICE: &str = "demo";
/// The demo API's path on the demo service (its base URL is the audience
/// of the demo's access tokens; the proxy forwards `{issuer}/proxy/demo`
/// + path to the demo's origin, so the tool's calls name this path too).
pub(super) const DEMO_API_PATH: &str = "/api";
/// The one call the demo tool may make through the proxy.
pub(super) const DEMO_NOTES_PATH: &str = "/api/notes";

/// Checks an address flag before anything is written: an IP address and
/// a port, on loopback (the quick start serves plain HTTP with a dev
/// issuer), and not port 0 (the issuer URL names the port).
pub(super) fn loopback_addr(flag: &str, value: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = value.parse().map_err(|_| {
        format!("{flag} {value}: give an IP address and a port, such as {DEFAULT_LISTEN}")
    })?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{flag} {value}: the quick start serves plain HTTP with a development issuer, \
             so it listens on loopback only (127.0.0.1 or [::1]); to serve on another \
             address, write a config with [public] tls_cert and tls_key and run \
             `credbroker serve` (see deploy/credbroker.example.toml)"
        ));
    }
    if addr.port() == 0 {
        return Err(format!(
            "{flag} {value}: choose a port (the issuer URL, the links and the redirect \
             URIs name it, so it cannot be picked at random)"
        ));
    }
    Ok(addr)
}

/// A quick-start directory ready to serve.
#[derive(Debug)]
pub(super) struct Prepared {
    /// Its config file.
    pub(super) config: PathBuf,
    /// Whether it was made by this run (else reused).
    pub(super) fresh: bool,
}

/// Makes the quick-start directory, or checks that the existing one fits
/// the flags: a directory made for another address is refused, since its
/// issuer URL (in every token, link, session and redirect URI it made)
/// names that address. Flags are checked before anything is written.
pub(super) fn prepare(
    dir: &Path,
    listen: Option<&str>,
    demo_listen: Option<&str>,
) -> Result<Prepared, Box<dyn std::error::Error>> {
    let listen = listen.map(|l| loopback_addr("--listen", l)).transpose()?;
    let demo = demo_listen
        .map(|l| loopback_addr("--demo-listen", l))
        .transpose()?;
    let config = dir.join(QS_CONFIG);
    if config.exists() {
        let cfg = Config::load(&config).map_err(|e| {
            format!(
                "{e}\nthis quick-start directory cannot be reused as it is: remove {} to \
                 start afresh, or give another --dir",
                dir.display()
            )
        })?;
        let made_for = cfg.public.as_ref().map(|p| p.listen);
        if let (Some(want), Some(have)) = (listen, made_for) {
            if want != have {
                return Err(format!(
                    "{} was made for --listen {have} (its issuer is {}, which every token, \
                     link and session it made names); run it with --listen {have}, or give \
                     another --dir for {want}",
                    config.display(),
                    cfg.issuer
                )
                .into());
            }
        }
        let demo_made_for = demo_addr(&cfg);
        if let (Some(want), Some(have)) = (demo, demo_made_for) {
            if want != have {
                return Err(format!(
                    "{} was made with its demo service on {have} (the demo tool's resource \
                     and the connected demo accounts name it); run it with --demo-listen \
                     {have}, or give another --dir for {want}",
                    config.display()
                )
                .into());
            }
        }
        return Ok(Prepared {
            config,
            fresh: false,
        });
    }
    let demo = match (demo, listen) {
        (Some(d), _) => d,
        // A second quick start given only its own --listen must not reach
        // for the first one's demo port.
        (None, Some(l)) => demo_after(l)?,
        (None, None) => loopback_addr("--demo-listen", DEFAULT_DEMO_LISTEN)?,
    };
    let listen = match listen {
        Some(l) => l,
        None => loopback_addr("--listen", DEFAULT_LISTEN)?,
    };
    if demo == listen {
        return Err(format!(
            "--listen and --demo-listen are both {listen}: the demo service needs an address of its own"
        )
        .into());
    }
    write_files(dir, &listen.to_string(), Some(&demo.to_string()))?;
    Ok(Prepared {
        config,
        fresh: true,
    })
}

/// The demo service's address when only `--listen` is given: the same IP
/// address, the next port (8440 gives 8441, as without flags).
pub(super) fn demo_after(listen: SocketAddr) -> Result<SocketAddr, String> {
    let port = listen.port().checked_add(1).ok_or_else(|| {
        format!(
            "--listen {listen}: the demo service takes the next port unless --demo-listen \
             names one, and there is no port after {}: give --demo-listen",
            listen.port()
        )
    })?;
    Ok(SocketAddr::new(listen.ip(), port))
}

/// Where the config's demo service listens, if it has one.
pub(super) fn demo_addr(cfg: &Config) -> Option<SocketAddr> {
    let p = cfg.providers.get(cfg.quickstart_demo.as_deref()?)?;
    let u = url::Url::parse(p.issuer.as_deref()?).ok()?;
    u.socket_addrs(|| None).ok()?.into_iter().next()
}

/// Writes the quick-start files into `dir` unless they exist, without the
/// demo service (the base every test broker starts from). Returns the
/// config path.
pub fn quickstart_files(dir: &Path, listen: &str) -> Result<PathBuf, Box<dyn std::error::Error>> {
    write_files(dir, listen, None)
}

/// Writes the quick-start files into `dir` unless they exist; with
/// `demo` (its address), also the demo service: its key, its provider
/// table and the demo tool in the policy.
fn write_files(
    dir: &Path,
    listen: &str,
    demo: Option<&str>,
) -> Result<PathBuf, Box<dyn std::error::Error>> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))?;
    let config = dir.join(QS_CONFIG);
    if config.exists() {
        return Ok(config);
    }
    let issuer = format!("http://{listen}");
    std::fs::create_dir_all(dir.join("keys"))?;
    std::fs::set_permissions(dir.join("keys"), std::fs::Permissions::from_mode(0o700))?;
    let mut master = vec![0u8; 32];
    aws_lc_rs::rand::fill(&mut master).map_err(|_| "random")?;
    write_secret_file(&dir.join("keys/master.key"), &master)?;
    zeroize::Zeroize::zeroize(&mut master);
    let (dev, pkcs8) = Es256Key::generate()?;
    write_secret_file(
        &dir.join("keys/dev-issuer.pem"),
        pem_pkcs8(pkcs8.expose()).as_bytes(),
    )?;
    std::fs::write(
        dir.join("dev-issuer-jwks.json"),
        serde_json::to_vec_pretty(&serde_json::json!({"keys": [dev.public_jwk]}))?,
    )?;
    let mut policy = QUICKSTART_POLICY.to_string();
    let mut demo_table = String::new();
    if let Some(d) = demo {
        let (_, pkcs8) = Es256Key::generate()?;
        write_secret_file(&dir.join(DEMO_KEY), pem_pkcs8(pkcs8.expose()).as_bytes())?;
        policy.push_str(&demo_policy(&issuer));
        demo_table = format!(
            r#"
# The built-in demo service: a stand-in for a provider such as GitHub (its
# own two demo accounts, a token endpoint, a tiny API), served on loopback
# by `credbroker quickstart` only; `credbroker serve` refuses this preset.
[providers.{DEMO_SERVICE}]
preset = "quickstart-demo"
issuer = "http://{d}"
client_id = "credbroker-quickstart"
"#
        );
    }
    std::fs::write(dir.join("policy.toml"), policy)?;
    std::fs::write(
        &config,
        format!(
            r#"# credbroker quick start: generated by `credbroker quickstart`.
# Development only: plain HTTP on loopback, and a dev subject-token issuer
# whose key sits in keys/dev-issuer.pem.
agent = "repo-helper"
issuer = "{issuer}"
policy = "policy.toml"
store = "data"

[socket]
path = "credbroker.sock"

[admin]
socket = "admin.sock"

[public]
listen = "{listen}"

[keys]
master_key_file = "keys/master.key"

# The dev issuer is the broker's own issuer, paired with local accounts:
# local account `alice` is the same person as subject tokens with sub alice.
[[trusted_issuers]]
issuer = "{issuer}"
jwks_file = "dev-issuer-jwks.json"
algs = ["ES256"]
sign_in = {{ kind = "local" }}
{demo_table}"#
        ),
    )?;
    Ok(config)
}

/// The demo tool's resource for a broker whose issuer is `issuer`: the
/// egress proxy's address for the demo service.
pub fn demo_proxy(issuer: &str) -> String {
    format!("{issuer}/proxy/{DEMO_SERVICE}")
}

/// The demo tool's part of the quick-start policy, for a broker whose
/// issuer is `issuer`: the demo service is used through the egress proxy,
/// so its token never leaves the broker.
pub fn demo_policy(issuer: &str) -> String {
    format!(
        r#"
# The quick start's built-in demo service (a stand-in provider, not a real
# one), used through the broker's egress proxy (docs/PROXY.md): the demo
# service's token for the person's connected account stays in the broker;
# the tool gets a credbroker token bound to its key, for this address, and
# may make only the calls its routes list. Until the person has connected
# a demo account, a derive answers with a connect link.
[resources."{proxy}"]
source = "service"
service = "{DEMO_SERVICE}"
delivery = "proxy"

[tools."demo.notes"]
resource = "{proxy}"
scopes = ["{scope}"]
steps = ["answer_question", "summarize"]
routes = ["GET {DEMO_NOTES_PATH}"]
"#,
        proxy = demo_proxy(issuer),
        scope = crate::demo::NOTES_SCOPE
    )
}

/// The quick start's policy.
pub const QUICKSTART_POLICY: &str = r#"# Quick-start policy for the agent "repo-helper".
# Deny by default: only what is written here can be derived.
agent = "repo-helper"

# The example resource server (`cargo run --example resource_server`).
[resources."http://127.0.0.1:9090/notes"]
source = "self"
ttl = "300s"

# Reading notes: allowed while the agent answers a question or summarises.
[tools."notes.read"]
resource = "http://127.0.0.1:9090/notes"
scopes = ["notes.read"]
steps = ["answer_question", "summarize"]

# Deleting notes is sensitive: only in the step the orchestrator enters after
# the person asked for a cleanup, never while the model is free-running, and
# even there each delete waits for her approval of that very call on the
# pages (docs/APPROVALS.md). The call says which notes it deletes
# (authorization_details, RFC 9396), and the approval page shows her that.
[tools."notes.delete"]
resource = "http://127.0.0.1:9090/notes"
scopes = ["notes.delete"]
steps = ["cleanup_confirmed"]
ttl = "60s"
approval = "each_call"
require_authorization_details = true

[tools."notes.delete".authorization_details.notes]
which = { kind = "string", required = true, label = "Notes to delete", log_in_clear = true }
"#;

/// Mints a dev subject token from a quick-start directory.
pub fn dev_subject_token(
    dir: &Path,
    sub: &str,
    ttl: i64,
) -> Result<String, Box<dyn std::error::Error>> {
    let cfg = Config::load(&dir.join(QS_CONFIG))?;
    let key = load_pem_key(&dir.join("keys/dev-issuer.pem"))?;
    let now = crate::base::clock::Clock::now(&crate::base::clock::SystemClock);
    let mut jti = [0u8; 12];
    aws_lc_rs::rand::fill(&mut jti).map_err(|_| "random")?;
    let mut header = serde_json::Map::new();
    header.insert("typ".into(), "at+jwt".into());
    header.insert("kid".into(), key.kid.clone().into());
    let claims = serde_json::json!({
        "iss": cfg.issuer, "sub": sub, "aud": cfg.agent, "iat": now, "exp": now + ttl,
        "jti": crate::base::jose::b64e(&jti), "client_id": "quickstart-orchestrator", "scope": "agent",
    });
    Ok(key.sign_jws(header, &claims)?)
}
