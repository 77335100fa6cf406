//! The operator's commands: `status`, `freeze`, `keys`, `accounts`,
//! `users`. Each goes to the running instance or, when none runs, calls the
//! same [`crate::derive::ops`] action on the store ([`super::online::reach`]).

use std::path::Path;

use crate::accounts::subject::Person;
use crate::base::secret::SecretString;
use crate::derive::ops;
use crate::infra::config::Config;

use super::exit::Exit;
use super::online::{admin_call, check_user, listening, reach, Reached};
use super::Res;

/// `credbroker status`: the running instance's status; never opens the
/// store. Every failure to find out is [`Exit::Unknown`], never
/// [`Exit::Failed`] (running but not ready) nor [`Exit::NotRunning`]: a
/// probe must not read "I could not tell" as either.
pub(super) async fn status(config: &Path) -> Res {
    match status_of(config).await {
        Ok(e) => Ok(e),
        Err(e) => {
            eprintln!("error: {e}");
            Ok(Exit::Unknown)
        }
    }
}

async fn status_of(config: &Path) -> Res {
    let cfg = Config::load(config)?;
    check_user(&cfg)?;
    if !listening(&cfg) {
        println!("{}", serde_json::json!({"running": false}));
        return Ok(Exit::NotRunning);
    }
    let (_, body) = admin_call(&cfg.admin_socket, "GET", "/status", "")
        .await
        .map_err(|e| format!("admin socket {}: {e}", cfg.admin_socket.display()))?;
    println!("{body}");
    let ready = serde_json::from_str::<serde_json::Value>(&body).is_ok_and(|v| v["ready"] == true);
    Ok(Exit::ok_if(ready, Exit::Failed))
}

/// `credbroker freeze on|off`.
pub(super) async fn freeze(config: &Path, state: &str) -> Res {
    let cfg = Config::load(config)?;
    match reach(&cfg, "POST", "/freeze", state).await? {
        Reached::Instance { status: 200, body } => {
            println!("{body}");
            Ok(Exit::Ok)
        }
        Reached::Instance { status, body } => refused(status, &body),
        Reached::Stopped(off) => {
            let key = off.freeze_key(&cfg)?;
            let frozen = ops::freeze(off.target(), Some(&key), off.recorder(), state == "on")?;
            println!(
                "{}",
                serde_json::json!({"frozen": frozen, "running": false})
            );
            Ok(Exit::Ok)
        }
    }
}

/// `credbroker events redeliver [--subscription NAME]`: only a running
/// instance delivers, so with none there is nothing to do (exit 3).
pub(super) async fn redeliver(config: &Path, subscription: Option<&str>) -> Res {
    let cfg = Config::load(config)?;
    super::online::check_user(&cfg)?;
    if !super::online::listening(&cfg) {
        eprintln!("error: no instance runs: dead letters are sent again by the running instance; start it and run this again");
        return Ok(Exit::NotRunning);
    }
    let body = serde_json::json!({ "subscription": subscription }).to_string();
    match super::online::admin_call(&cfg.admin_socket, "POST", "/events/redeliver", &body).await {
        Ok((200, body)) => {
            println!("{body}");
            Ok(Exit::Ok)
        }
        Ok((status, body)) => refused(status, &body),
        Err(e) => Err(format!("admin socket {}: {e}", cfg.admin_socket.display()).into()),
    }
}

/// `credbroker keys rotate [--emergency]`.
pub(super) async fn rotate_keys(config: &Path, emergency: bool) -> Res {
    let cfg = Config::load(config)?;
    let body = if emergency { "emergency" } else { "" };
    match reach(&cfg, "POST", "/keys/rotate", body).await? {
        Reached::Instance { status: 200, body } => {
            println!("{body}");
            Ok(Exit::Ok)
        }
        Reached::Instance { status, body } => refused(status, &body),
        Reached::Stopped(off) => {
            let sealer = off.sealer(&cfg)?;
            let kind = crate::derive::mint::RotationKind::new(emergency, cfg.key_activation_delay);
            let r = ops::rotate_keys(off.target(), &sealer, off.recorder(), kind)?;
            println!("{}", crate::edge::admin::rotation_json(&r, false));
            Ok(Exit::Ok)
        }
    }
}

/// `credbroker keys rotate-client [--emergency]`.
pub(super) async fn rotate_client_keys(config: &Path, emergency: bool) -> Res {
    let cfg = Config::load(config)?;
    let body = if emergency { "emergency" } else { "" };
    match reach(&cfg, "POST", "/client-keys/rotate", body).await? {
        Reached::Instance { status: 200, body } => {
            println!("{body}");
            Ok(Exit::Ok)
        }
        Reached::Instance { status, body } => refused(status, &body),
        Reached::Stopped(off) => {
            let sealer = off.sealer(&cfg)?;
            let kind = crate::derive::mint::RotationKind::new(emergency, cfg.key_activation_delay);
            let r = ops::rotate_client_keys(off.target(), &sealer, off.recorder(), kind)?;
            println!("{}", crate::edge::admin::rotation_json(&r, false));
            Ok(Exit::Ok)
        }
    }
}

/// `credbroker keys rotate-vault`: resumable; exits [`Exit::Unfinished`]
/// until every record is under the current key.
pub(super) async fn rotate_vault(config: &Path, limit: Option<usize>) -> Res {
    let cfg = Config::load(config)?;
    let body = limit.map(|l| l.to_string()).unwrap_or_default();
    let report = match reach(&cfg, "POST", "/vault/rotate", &body).await? {
        Reached::Instance { status: 200, body } => {
            println!("{body}");
            serde_json::from_str::<serde_json::Value>(&body)?
        }
        Reached::Instance { status, body } => return refused(status, &body),
        Reached::Stopped(off) => {
            let report = ops::rotate_vault(&off.vault(&cfg)?, limit, off.recorder())?;
            let report = serde_json::to_value(report)?;
            println!("{report}");
            report
        }
    };
    if report["done"] == true {
        eprintln!(
            "vault rotation done; the keys of retired_keys seal nothing now (they stay in the store's vault key record; any copy of them in {} from before the record is no longer read)",
            cfg.vault_key_dir.display()
        );
        Ok(Exit::Ok)
    } else {
        eprintln!(
            "vault rotation not finished; run the command again to resume (old keys still decrypt)"
        );
        Ok(Exit::Unfinished)
    }
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

/// `credbroker accounts list`: exits [`Exit::Unreadable`] when some
/// records do not decrypt.
pub(super) async fn list_accounts(
    config: &Path,
    person: Option<String>,
    issuer: Option<String>,
) -> Res {
    let cfg = Config::load(config)?;
    let person = match person {
        Some(sub) => Some(Person {
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
    let v = match reach(&cfg, "GET", &path, "").await? {
        Reached::Instance { status: 200, body } => {
            serde_json::from_str::<serde_json::Value>(&body)?
        }
        Reached::Instance { status, body } => return refused(status, &body),
        Reached::Stopped(off) => {
            let mut v = ops::list_accounts(&off.vault(&cfg)?, person.as_ref())?;
            v["running"] = false.into();
            v
        }
    };
    println!("{}", serde_json::to_string_pretty(&v)?);
    let unreadable = v["unreadable"].as_array().is_some_and(|u| !u.is_empty());
    Ok(Exit::ok_if(!unreadable, Exit::Unreadable))
}

/// `credbroker accounts disconnect`: exits [`Exit::Failed`] when nothing
/// was deleted.
pub(super) async fn disconnect(
    config: &Path,
    person: String,
    issuer: Option<String>,
    service: &str,
    force: bool,
) -> Res {
    let cfg = Config::load(config)?;
    let person = Person {
        iss: person_issuer(&cfg, issuer)?,
        sub: person,
    };
    let body = serde_json::json!({
        "person_iss": person.iss,
        "person_sub": person.sub,
        "service": service,
        "force": force,
    });
    let report = match reach(&cfg, "POST", "/accounts/disconnect", &body.to_string()).await? {
        Reached::Instance { status: 200, body } => {
            serde_json::from_str::<serde_json::Value>(&body)?
        }
        Reached::Instance { status, body } => return refused(status, &body),
        Reached::Stopped(off) => {
            let providers = crate::accounts::upstream::Providers::from_config(&cfg)?;
            let vault = off.vault(&cfg)?;
            let r = ops::disconnect(&vault, &providers, &person, service, force, off.recorder())
                .await?;
            let mut v = serde_json::to_value(r)?;
            v["running"] = false.into();
            v
        }
    };
    println!("{report}");
    eprintln!("{}", report["message"].as_str().unwrap_or_default());
    Ok(Exit::ok_if(report["deleted"] == true, Exit::Failed))
}

/// The new password: from the first line of stdin, or prompted twice.
fn read_new_password(from_stdin: bool) -> Result<SecretString, Box<dyn std::error::Error>> {
    if from_stdin {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        let pw = SecretString::new(line.trim_end_matches(['\n', '\r']).to_string());
        zeroize::Zeroize::zeroize(&mut line);
        return Ok(pw);
    }
    // rpassword prompts on /dev/tty; without a controlling terminal it
    // fails with ENXIO ("os error 6"), which says nothing of the way out.
    if std::fs::File::open("/dev/tty").is_err() {
        return Err("no terminal to prompt for the password on: give it on the first line of \
             standard input with --password-stdin (e.g. `printf '%s\\n' \"$PASSWORD\" | credbroker users add NAME --config FILE --password-stdin`)"
            .into());
    }
    let first = SecretString::new(rpassword::prompt_password("Password: ")?);
    let second = SecretString::new(rpassword::prompt_password("Password again: ")?);
    if first.expose() != second.expose() {
        return Err("the passwords differ; nothing was changed".into());
    }
    Ok(first)
}

/// `credbroker users add`: a local account for the pages.
pub(super) async fn add_user(name: &str, config: &Path, from_stdin: bool, replace: bool) -> Res {
    use crate::accounts::users::{valid_name, UserError, MAX_PASSWORD, MIN_PASSWORD};
    let cfg = Config::load(config)?;
    if !cfg
        .trusted_issuers
        .iter()
        .any(|i| i.sign_in == crate::infra::config::SignIn::Local)
    {
        eprintln!("note: no trusted issuer is paired with local sign-in in {}; this account cannot sign in until one is", config.display());
    }
    // Checked before the prompt, so a bad name does not cost a password.
    if !valid_name(name) {
        return Err(UserError::BadName.into());
    }
    let password = read_new_password(from_stdin)?;
    if !(MIN_PASSWORD..=MAX_PASSWORD).contains(&password.expose().len()) {
        return Err(UserError::BadPassword.into());
    }
    let body = SecretString::new(
        serde_json::json!({"name": name, "password": password.expose(), "replace": replace})
            .to_string(),
    );
    match reach(&cfg, "POST", "/users", body.expose()).await? {
        Reached::Instance { status: 200, body } => {
            println!("{body}");
            Ok(Exit::Ok)
        }
        Reached::Instance { status, body } => refused(status, &body),
        Reached::Stopped(off) => {
            let sealer = off.sealer(&cfg)?;
            ops::add_user(
                off.store.as_ref(),
                &sealer,
                name,
                &password,
                replace,
                off.recorder(),
            )?;
            println!("{}", serde_json::json!({"user": name, "running": false}));
            Ok(Exit::Ok)
        }
    }
}

/// `credbroker users list`.
pub(super) async fn list_users(config: &Path) -> Res {
    let cfg = Config::load(config)?;
    let v = match reach(&cfg, "GET", "/users", "").await? {
        Reached::Instance { status: 200, body } => {
            serde_json::from_str::<serde_json::Value>(&body)?
        }
        Reached::Instance { status, body } => return refused(status, &body),
        Reached::Stopped(off) => {
            let sealer = off.sealer(&cfg)?;
            let now = crate::base::clock::Clock::now(&crate::base::clock::SystemClock);
            let mut v = ops::list_users(off.store.as_ref(), &sealer, now)?;
            v["running"] = false.into();
            v
        }
    };
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(Exit::Ok)
}

/// `credbroker users remove`: exits [`Exit::Failed`] when there was no
/// such account (its sessions are ended all the same).
pub(super) async fn remove_user(name: &str, config: &Path) -> Res {
    let cfg = Config::load(config)?;
    if !crate::accounts::users::valid_name(name) {
        return Err(crate::accounts::users::UserError::BadName.into());
    }
    let body = serde_json::json!({ "name": name }).to_string();
    let v = match reach(&cfg, "POST", "/users/remove", &body).await? {
        Reached::Instance { status: 200, body } => {
            serde_json::from_str::<serde_json::Value>(&body)?
        }
        Reached::Instance { status, body } => return refused(status, &body),
        Reached::Stopped(off) => {
            let r = ops::remove_user(
                off.store.as_ref(),
                name,
                crate::edge::pages::session::end_local_sessions,
                off.recorder(),
            )?;
            let mut v = serde_json::to_value(r)?;
            v["user"] = name.into();
            v["running"] = false.into();
            v
        }
    };
    println!("{v}");
    if v["removed"] == true {
        eprintln!(
            "removed the local account {name}; {} page session(s) signed in with it ended",
            v["sessions_ended"]
        );
        Ok(Exit::Ok)
    } else {
        eprintln!(
            "error: no local account {name}; {} page session(s) signed in with it ended",
            v["sessions_ended"]
        );
        Ok(Exit::Failed)
    }
}

/// An instance's refusal of an admin command, said in words on standard
/// error: its status, `error` and `error_description` (never the raw body).
fn refused(status: u16, body: &str) -> Res {
    eprintln!("error: {}", admin_refusal(status, body));
    Ok(Exit::Failed)
}

/// The sentence for an admin socket's refusal: `status error: description`
/// from its JSON, or the status alone when the body is not that JSON.
pub(super) fn admin_refusal(status: u16, body: &str) -> String {
    let v = serde_json::from_str::<serde_json::Value>(body).unwrap_or_default();
    match (v["error"].as_str(), v["error_description"].as_str()) {
        (Some(code), Some(text)) => format!("the instance refused ({status} {code}): {text}"),
        (Some(code), None) => format!("the instance refused ({status} {code})"),
        _ => format!("the instance answered {status}"),
    }
}
