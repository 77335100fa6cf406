//! The command line: `credbroker quickstart | serve | subject-token | derive
//! | status | freeze | keys`. `main.rs` only calls [`main`].

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::Full;

use crate::config::{read_secret_file, write_secret_file, Config};
use crate::jose::Es256Key;

/// credbroker: a credential broker sidecar for AI agents.
#[derive(Debug, Parser)]
#[command(name = "credbroker", version, about, long_about = None)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create (or reuse) a quick-start directory and serve from it.
    Quickstart {
        /// The directory.
        #[arg(long, default_value = "./credbroker-quickstart")]
        dir: PathBuf,
        /// Public listener address.
        #[arg(long, default_value = "127.0.0.1:8440")]
        listen: String,
    },
    /// Serve with a configuration file.
    Serve {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Print a subject token from the quick start's dev issuer (development only).
    SubjectToken {
        /// The quick-start directory.
        #[arg(long, default_value = "./credbroker-quickstart")]
        dir: PathBuf,
        /// The person's name (`sub`).
        #[arg(long)]
        sub: String,
        /// Lifetime, e.g. 1h, 15m.
        #[arg(long, default_value = "1h")]
        ttl: String,
    },
    /// Ask a running broker for a token, with a DPoP proof.
    Derive {
        /// The broker's socket.
        #[arg(long)]
        socket: PathBuf,
        /// The broker's public issuer URL (base of the proof's htu).
        #[arg(long, default_value = "http://127.0.0.1:8440")]
        issuer: String,
        /// The person's subject token.
        #[arg(long)]
        subject_token: String,
        /// The tool call.
        #[command(flatten)]
        call: crate::policy::cli::CallArgs,
        /// The tool's DPoP key (PKCS#8 PEM, 0600); created there if it does
        /// not exist. Without it a new key is made and saved to a new file
        /// whose path is printed.
        #[arg(long)]
        dpop_key: Option<PathBuf>,
    },
    /// Show a running instance's status (through the admin socket). Exits 0
    /// when ready, 1 when running but not ready, 3 when not running.
    Status {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Emergency freeze: deny every derive until lifted.
    Freeze {
        /// on or off.
        #[arg(value_parser = ["on", "off"])]
        state: String,
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Signing keys.
    Keys {
        #[command(subcommand)]
        action: KeysAction,
    },
    /// Connected accounts (through the admin socket; the store directly
    /// when no instance runs).
    Accounts {
        #[command(subcommand)]
        action: AccountsAction,
    },
    /// Policy files: check, test, explain, diff (see policy/README.md).
    Policy {
        #[command(subcommand)]
        command: crate::policy::cli::PolicyCommand,
    },
    /// Local accounts for the pages (sign-in paired with the broker's own
    /// issuer, as in the quick start).
    Users {
        #[command(subcommand)]
        action: UsersAction,
    },
    /// Make a DPoP proof with a key (for scripts and tests).
    Proof {
        /// The key (PKCS#8 PEM).
        #[arg(long)]
        key: PathBuf,
        /// HTTP method.
        #[arg(long, default_value = "GET")]
        method: String,
        /// Request URL.
        #[arg(long)]
        url: String,
        /// The access token, for `ath`.
        #[arg(long)]
        access_token: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum AccountsAction {
    /// List connected accounts with the agents allowed to use them, and
    /// report records that do not decrypt.
    List {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Only this person (`sub`).
        #[arg(long)]
        person: Option<String>,
        /// The person's issuer (default: the only trusted issuer).
        #[arg(long)]
        issuer: Option<String>,
    },
    /// Revoke an account's tokens at the provider (RFC 7009, where it can)
    /// and delete it with its allowances.
    Disconnect {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// The person (`sub`).
        #[arg(long)]
        person: String,
        /// The person's issuer (default: the only trusted issuer).
        #[arg(long)]
        issuer: Option<String>,
        /// The service.
        #[arg(long)]
        service: String,
        /// Delete even if revocation at the provider fails.
        #[arg(long)]
        force: bool,
    },
}

/// The person's issuer: given, or the config's only trusted issuer.
fn person_issuer(
    cfg: &Config,
    given: Option<String>,
) -> Result<String, Box<dyn std::error::Error>> {
    match given {
        Some(i) => Ok(i),
        None if cfg.trusted_issuers.len() == 1 => Ok(cfg.trusted_issuers[0].issuer.clone()),
        None => Err("several trusted issuers: name the person's with --issuer".into()),
    }
}

/// Records an audit event for a command run with no instance (the
/// instance records its own through the admin socket).
fn offline_event<'a>(cfg: &'a Config, fill: impl FnOnce(&mut crate::events::Event<'a>)) {
    let now = crate::clock::Clock::now(&crate::clock::SystemClock);
    let mut e = crate::events::Event::new(now, "", &cfg.agent);
    fill(&mut e);
    match crate::events::Audit::open(&cfg.audit_log) {
        Ok(a) => {
            if let Err(err) = a.record(&e) {
                eprintln!("warning: the audit event was not written: {err}");
            }
        }
        Err(err) => eprintln!("warning: the audit log cannot be opened: {err}"),
    }
}

/// Opens the store and the vault directly (no instance runs).
fn open_vault(cfg: &Config) -> Result<crate::vault::Vault, Box<dyn std::error::Error>> {
    let store: Arc<dyn crate::store::Store> = Arc::new(crate::store::SledStore::open(&cfg.store)?);
    Ok(crate::vault::Vault::open(store, &cfg.vault_key_dir)?)
}

async fn accounts(action: AccountsAction) -> Res {
    match action {
        AccountsAction::List {
            config,
            person,
            issuer,
        } => {
            let cfg = Config::load(&config)?;
            let person = match person {
                Some(sub) => Some(crate::subject::Person {
                    iss: person_issuer(&cfg, issuer)?,
                    sub,
                }),
                None => None,
            };
            let path = match &person {
                Some(p) => format!(
                    "/accounts?{}",
                    form_urlencoded::Serializer::new(String::new())
                        .append_pair("person_iss", &p.iss)
                        .append_pair("person_sub", &p.sub)
                        .finish()
                ),
                None => "/accounts".to_string(),
            };
            let v = match admin_call(&cfg.admin_socket, "GET", &path, "").await {
                Ok((200, body)) => serde_json::from_str::<serde_json::Value>(&body)?,
                Ok((_, body)) => {
                    println!("{body}");
                    return Ok(ExitCode::from(1));
                }
                Err(_) => {
                    let vault = open_vault(&cfg)?;
                    let mut v = crate::admin::accounts_json(&vault, person.as_ref())?;
                    v["running"] = false.into();
                    v
                }
            };
            println!("{}", serde_json::to_string_pretty(&v)?);
            let unreadable = v["unreadable"].as_array().is_some_and(|u| !u.is_empty());
            Ok(if unreadable {
                ExitCode::from(5)
            } else {
                ExitCode::SUCCESS
            })
        }
        AccountsAction::Disconnect {
            config,
            person,
            issuer,
            service,
            force,
        } => {
            let cfg = Config::load(&config)?;
            let body = serde_json::json!({
                "person_iss": person_issuer(&cfg, issuer)?,
                "person_sub": person,
                "service": service,
                "force": force,
            });
            let report = match admin_call(
                &cfg.admin_socket,
                "POST",
                "/accounts/disconnect",
                &body.to_string(),
            )
            .await
            {
                Ok((200, body)) => serde_json::from_str::<serde_json::Value>(&body)?,
                Ok((_, body)) => {
                    println!("{body}");
                    return Ok(ExitCode::from(1));
                }
                Err(_) => {
                    let vault = open_vault(&cfg)?;
                    let providers = crate::upstream::Providers::from_config(&cfg)?;
                    let p = crate::subject::Person {
                        iss: body["person_iss"].as_str().unwrap_or_default().to_string(),
                        sub: body["person_sub"].as_str().unwrap_or_default().to_string(),
                    };
                    let service = body["service"].as_str().unwrap_or_default();
                    let r = crate::connect::disconnect_account(
                        &vault,
                        providers.get(service).map(|p| p.as_ref()),
                        &p,
                        service,
                        force,
                    )
                    .await?;
                    offline_event(&cfg, |e| {
                        e.event = "account.disconnected";
                        e.person_iss = Some(&p.iss);
                        e.person_sub = Some(&p.sub);
                        e.service = Some(service);
                        e.outcome = Some(if r.deleted { "deleted" } else { "kept" });
                        e.reason = Some(r.revocation);
                    });
                    let mut v = serde_json::to_value(r)?;
                    v["running"] = false.into();
                    v
                }
            };
            println!("{report}");
            eprintln!("{}", report["message"].as_str().unwrap_or_default());
            Ok(if report["deleted"] == true {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

#[derive(Debug, Subcommand)]
enum KeysAction {
    /// Add a new signing key and make it active; the old one stays in the JWKS
    /// until its tokens have expired.
    Rotate {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Re-encrypt the vault under a new key. Resumable: an interrupted run
    /// (or one stopped by --limit) continues where it stopped, and old keys
    /// keep decrypting until it reports `done`.
    RotateVault {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Re-wrap at most this many records in this run.
        #[arg(long)]
        limit: Option<usize>,
    },
}

#[derive(Debug, Subcommand)]
enum UsersAction {
    /// Add a local account. Prompts for the password twice (not echoed).
    /// Local account NAME is the person (broker issuer, NAME): in the quick
    /// start, the same person as subject tokens with `sub` NAME.
    Add {
        /// The account name.
        name: String,
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Read the password from the first line of standard input (for
        /// scripts and tests) instead of prompting.
        #[arg(long)]
        password_stdin: bool,
        /// Set a new password for an existing account (and clear its lockout).
        #[arg(long)]
        replace: bool,
    },
}

fn read_new_password(
    from_stdin: bool,
) -> Result<crate::secret::SecretString, Box<dyn std::error::Error>> {
    use crate::secret::SecretString;
    if from_stdin {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        let pw = SecretString::new(line.trim_end_matches(['\n', '\r']).to_string());
        zeroize::Zeroize::zeroize(&mut line);
        return Ok(pw);
    }
    let first = SecretString::new(rpassword::prompt_password("Password: ")?);
    let second = SecretString::new(rpassword::prompt_password("Password again: ")?);
    if first.expose() != second.expose() {
        return Err("the passwords differ; nothing was changed".into());
    }
    Ok(first)
}

async fn users_add(name: &str, config: &Path, from_stdin: bool, replace: bool) -> Res {
    let cfg = Config::load(config)?;
    if !cfg
        .trusted_issuers
        .iter()
        .any(|i| i.sign_in == crate::config::SignIn::Local)
    {
        eprintln!("note: no trusted issuer is paired with local sign-in in {}; this account cannot sign in until one is", config.display());
    }
    if !crate::pages::users::valid_name(name) {
        return Err(crate::pages::users::UserError::BadName.into());
    }
    let password = read_new_password(from_stdin)?;
    let len = password.expose().len();
    if !(crate::pages::users::MIN_PASSWORD..=crate::pages::users::MAX_PASSWORD).contains(&len) {
        return Err(crate::pages::users::UserError::BadPassword.into());
    }
    let body = crate::secret::SecretString::new(
        serde_json::json!({"name": name, "password": password.expose(), "replace": replace})
            .to_string(),
    );
    match admin_call(&cfg.admin_socket, "POST", "/users", body.expose()).await {
        Ok((200, out)) => {
            println!("{out}");
            Ok(ExitCode::SUCCESS)
        }
        Ok((_, out)) => {
            eprintln!("error: {out}");
            Ok(ExitCode::from(1))
        }
        Err(_) => {
            // No instance runs: write to the store directly.
            let store = crate::store::SledStore::open(&cfg.store)?;
            let now = crate::clock::Clock::now(&crate::clock::SystemClock);
            crate::pages::users::add(&store, name, &password, replace, now)?;
            println!("{}", serde_json::json!({"user": name, "running": false}));
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour codes only for a terminal, never into log files or journald.
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if format == "json" {
        b.json().init();
    } else {
        b.init();
    }
}

/// Runs the command line.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log_format);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

type Res = Result<ExitCode, Box<dyn std::error::Error>>;

async fn run(cmd: Command) -> Res {
    match cmd {
        Command::Quickstart { dir, listen } => quickstart(&dir, &listen).await,
        Command::Serve { config } => serve(&config).await,
        Command::SubjectToken { dir, sub, ttl } => {
            let ttl =
                crate::config::parse_duration(&ttl).ok_or("--ttl must be a duration such as 1h")?;
            let token = dev_subject_token(&dir, &sub, ttl.as_secs() as i64)?;
            eprintln!("(development only: a subject token from the quick start's dev issuer)");
            println!("{token}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Derive {
            socket,
            issuer,
            subject_token,
            call,
            dpop_key,
        } => {
            let key = match dpop_key {
                Some(p) if p.exists() => load_pem_key(&p)?,
                Some(p) => {
                    let (key, pkcs8) = Es256Key::generate()?;
                    write_secret_file(&p, pem_pkcs8(pkcs8.expose()).as_bytes())?;
                    eprintln!("new DPoP key saved to {} (mode 0600)", p.display());
                    key
                }
                None => {
                    let (key, pkcs8) = Es256Key::generate()?;
                    let path = new_key_path()?;
                    write_secret_file(&path, pem_pkcs8(pkcs8.expose()).as_bytes())?;
                    eprintln!(
                        "new DPoP key saved to {} (pass it to the tool with the token)",
                        path.display()
                    );
                    key
                }
            };
            let client = crate::client::Client::new(socket, &issuer);
            let answer = client
                .derive(
                    &crate::client::DeriveParams {
                        subject_token: &subject_token,
                        step: &call.step,
                        tool: &call.tool,
                        resource: &call.resource,
                        scope: call.scope.as_deref(),
                    },
                    &key,
                )
                .await?;
            match answer {
                crate::client::Answer::Issued(t) => {
                    println!(
                        "{}",
                        serde_json::json!({
                            "access_token": t.access_token.expose(),
                            "token_type": t.token_type,
                            "issued_token_type": t.issued_token_type,
                            "expires_in": t.expires_in,
                            "scope": t.scope,
                        })
                    );
                    Ok(ExitCode::SUCCESS)
                }
                crate::client::Answer::Refused(r) => {
                    println!("{}", serde_json::to_string(&r)?);
                    Ok(ExitCode::from(2))
                }
            }
        }
        Command::Status { config } => {
            let cfg = Config::load(&config)?;
            match admin_call(&cfg.admin_socket, "GET", "/status", "").await {
                Ok((_, body)) => {
                    println!("{body}");
                    let ready = serde_json::from_str::<serde_json::Value>(&body)
                        .is_ok_and(|v| v["ready"] == true);
                    Ok(if ready {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    })
                }
                Err(_) => {
                    println!("{}", serde_json::json!({"running": false}));
                    Ok(ExitCode::from(3))
                }
            }
        }
        Command::Freeze { state, config } => {
            let cfg = Config::load(&config)?;
            match admin_call(&cfg.admin_socket, "POST", "/freeze", &state).await {
                Ok((code, body)) => {
                    println!("{body}");
                    Ok(if code == 200 {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    })
                }
                Err(_) => {
                    // No instance runs: set the flag in the store directly.
                    let store = crate::store::SledStore::open(&cfg.store)?;
                    crate::store::Store::put(
                        &store,
                        crate::store::Tree::State,
                        b"frozen",
                        if state == "on" { b"1" } else { b"0" },
                    )?;
                    println!(
                        "{}",
                        serde_json::json!({"frozen": state == "on", "running": false})
                    );
                    Ok(ExitCode::SUCCESS)
                }
            }
        }
        Command::Keys {
            action: KeysAction::Rotate { config },
        } => {
            let cfg = Config::load(&config)?;
            match admin_call(&cfg.admin_socket, "POST", "/keys/rotate", "").await {
                Ok((code, body)) => {
                    println!("{body}");
                    Ok(if code == 200 {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    })
                }
                Err(_) => {
                    let master = read_secret_file(&cfg.master_key_file)?;
                    let sealer = crate::seal::Sealer::new(&master, &[])?;
                    let store = crate::store::SledStore::open(&cfg.store)?;
                    let now = crate::clock::Clock::now(&crate::clock::SystemClock);
                    let ring = crate::mint::rotate(&store, &sealer, now)?;
                    println!(
                        "{}",
                        serde_json::json!({"active_kid": ring.active.kid, "running": false})
                    );
                    Ok(ExitCode::SUCCESS)
                }
            }
        }
        Command::Keys {
            action: KeysAction::RotateVault { config, limit },
        } => {
            let cfg = Config::load(&config)?;
            let body = limit.map(|l| l.to_string()).unwrap_or_default();
            let report = match admin_call(&cfg.admin_socket, "POST", "/vault/rotate", &body).await {
                Ok((code, body)) => {
                    println!("{body}");
                    if code != 200 {
                        return Ok(ExitCode::from(1));
                    }
                    serde_json::from_str::<serde_json::Value>(&body)?
                }
                Err(_) => {
                    // No instance runs: open the store directly.
                    let store: Arc<dyn crate::store::Store> =
                        Arc::new(crate::store::SledStore::open(&cfg.store)?);
                    let vault = crate::vault::Vault::open(store, &cfg.vault_key_dir)?;
                    let report = vault.rotate(limit)?;
                    offline_event(&cfg, |e| {
                        e.event = "vault.rotated";
                        e.outcome = Some(if report.done { "done" } else { "in_progress" });
                    });
                    let report = serde_json::to_value(report)?;
                    println!("{report}");
                    report
                }
            };
            if report["done"] == true {
                eprintln!(
                    "vault rotation done; the key files of retired_keys in {} may now be removed",
                    cfg.vault_key_dir.display()
                );
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("vault rotation not finished; run the command again to resume (old keys still decrypt)");
                Ok(ExitCode::from(4))
            }
        }
        Command::Accounts { action } => accounts(action).await,
        Command::Policy { command } => Ok(crate::policy::cli::run(command)),
        Command::Users {
            action:
                UsersAction::Add {
                    name,
                    config,
                    password_stdin,
                    replace,
                },
        } => users_add(&name, &config, password_stdin, replace).await,
        Command::Proof {
            key,
            method,
            url,
            access_token,
        } => {
            let key = load_pem_key(&key)?;
            let now = crate::clock::Clock::now(&crate::clock::SystemClock);
            println!(
                "{}",
                crate::dpop::make_proof(&key, &method, &url, now, access_token.as_deref(), None)?
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn admin_call(
    socket: &Path,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), crate::client::ClientError> {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "credbroker-admin")
        .body(Full::new(Bytes::from(body.to_owned())))
        .map_err(|_| crate::client::ClientError::Unexpected(0))?;
    let a = crate::client::send(socket, req).await?;
    Ok((
        a.status.as_u16(),
        String::from_utf8_lossy(&a.body).into_owned(),
    ))
}

async fn serve(config: &Path) -> Res {
    let cfg = Config::load(config)?;
    let (inst, listeners) = start(&cfg).await?;
    crate::server::run(inst, listeners, crate::server::shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

async fn start(
    cfg: &Config,
) -> Result<(crate::app::Instance, crate::server::Listeners), crate::app::StartError> {
    let clock: crate::clock::SharedClock = Arc::new(crate::clock::SystemClock);
    let inst = crate::app::build(cfg.clone(), clock).await?;
    let listeners = crate::server::bind(cfg).await?;
    if let Some(addr) = listeners.public.as_ref().and_then(|l| l.local_addr().ok()) {
        tracing::info!(%addr, "public listener bound");
        inst.public_addr.set(addr).ok();
    }
    Ok((inst, listeners))
}

/// PKCS#8 DER as PEM.
pub fn pem_pkcs8(der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut s = String::from("-----BEGIN PRIVATE KEY-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        s.push('\n');
    }
    s.push_str("-----END PRIVATE KEY-----\n");
    s
}

/// Loads an ES256 key from a PKCS#8 PEM file of mode 0600.
pub fn load_pem_key(path: &Path) -> Result<Es256Key, Box<dyn std::error::Error>> {
    use rustls_pki_types::pem::PemObject;
    let pem = read_secret_file(path)?;
    let der = rustls_pki_types::PrivatePkcs8KeyDer::from_pem_slice(pem.expose())
        .map_err(|_| format!("{}: not a PKCS#8 PEM private key", path.display()))?;
    Ok(Es256Key::from_pkcs8(der.secret_pkcs8_der())?)
}

fn new_key_path() -> std::io::Result<PathBuf> {
    let mut r = [0u8; 6];
    aws_lc_rs::rand::fill(&mut r).map_err(|_| std::io::Error::other("random"))?;
    let dir = std::env::current_dir()?;
    Ok(dir.join(format!("dpop-key-{}.pem", hex::encode(r))))
}

const QS_CONFIG: &str = "credbroker.toml";

/// Writes the quick-start files into `dir` unless they exist. Returns the
/// config path.
pub fn quickstart_files(dir: &Path, listen: &str) -> Result<PathBuf, Box<dyn std::error::Error>> {
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
    std::fs::write(dir.join("policy.toml"), QUICKSTART_POLICY)?;
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
"#
        ),
    )?;
    Ok(config)
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
# the person confirmed, never while the model is free-running.
[tools."notes.delete"]
resource = "http://127.0.0.1:9090/notes"
scopes = ["notes.delete"]
steps = ["cleanup_confirmed"]
ttl = "60s"
"#;

/// Mints a dev subject token from a quick-start directory.
pub fn dev_subject_token(
    dir: &Path,
    sub: &str,
    ttl: i64,
) -> Result<String, Box<dyn std::error::Error>> {
    let cfg = Config::load(&dir.join(QS_CONFIG))?;
    let key = load_pem_key(&dir.join("keys/dev-issuer.pem"))?;
    let now = crate::clock::Clock::now(&crate::clock::SystemClock);
    let mut jti = [0u8; 12];
    aws_lc_rs::rand::fill(&mut jti).map_err(|_| "random")?;
    let mut header = serde_json::Map::new();
    header.insert("typ".into(), "at+jwt".into());
    header.insert("kid".into(), key.kid.clone().into());
    let claims = serde_json::json!({
        "iss": cfg.issuer, "sub": sub, "aud": cfg.agent, "iat": now, "exp": now + ttl,
        "jti": crate::jose::b64e(&jti), "client_id": "quickstart-orchestrator", "scope": "agent",
    });
    Ok(key.sign_jws(header, &claims)?)
}

async fn quickstart(dir: &Path, listen: &str) -> Res {
    let config = quickstart_files(dir, listen)?;
    let cfg = Config::load(&config)?;
    let (inst, listeners) = start(&cfg).await?;
    let d = dir.display();
    let sock = cfg.socket.path.display();
    eprintln!(
        r#"
credbroker quick start (development only: plain HTTP on loopback, dev issuer)
  config   {config}
  socket   {sock}
  issuer   {issuer}   (metadata: {issuer}/.well-known/oauth-authorization-server)

Next steps, in another terminal:
  TOKEN=$(credbroker subject-token --dir {d} --sub alice)
  credbroker derive --socket {sock} --issuer {issuer} --subject-token "$TOKEN" \
      --step summarize --tool notes.read --resource http://127.0.0.1:9090/notes
  # a sensitive tool outside its step is denied:
  credbroker derive --socket {sock} --issuer {issuer} --subject-token "$TOKEN" \
      --step summarize --tool notes.delete --resource http://127.0.0.1:9090/notes

Pages (connect links, your accounts): {issuer}/account
  # a local account alice is the same person as subject tokens with sub alice:
  credbroker users add alice --config {config}
  (plain HTTP on loopback: the session cookie is the development cookie
  "credbroker-dev" instead of "__Host-credbroker", which needs https)
"#,
        config = config.display(),
        issuer = cfg.issuer,
    );
    crate::server::run(inst, listeners, crate::server::shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}
