//! The command line: `credbroker quickstart | serve | subject-token | derive
//! | proof | status | freeze | events | keys | accounts | persons | users | store |
//! policy | ssf`. `main.rs`
//! only calls [`main`].
//!
//! - `args`: the command definitions (clap).
//! - `exit`: the exit codes, by name, as `--help` lists them.
//! - `instance`: `serve` and `quickstart` (running an instance).
//! - `operator`: `status`, `freeze`, `events`, `keys`, `accounts`, `users`; each
//!   through the admin socket, or on the store when no instance runs
//!   (`online`: that pattern, written once), calling [`crate::derive::ops`].
//! - `persons`: `persons revoke|restore|list`, the same way.
//! - `store`: `store migrate` and `store copy` (the store itself, not an
//!   instance).
//! - `ssf`: `ssf stream create|verify`, at the transmitter.
//! - `tools`: `derive`, `proof`, `subject-token`.
//! - `quickstart`: the quick start's templates, the checks of its
//!   addresses, and dev subject tokens.
//! - `keyfile`: PKCS#8 PEM key files.

mod args;
mod exit;
mod instance;
mod keyfile;
mod online;
mod operator;
mod persons;
mod quickstart;
mod ssf;
mod store;
mod tools;
mod upstream;

use std::process::ExitCode;

use clap::Parser;

pub(crate) use args::Cli;
pub(crate) use exit::Exit;
pub use keyfile::{load_pem_key, pem_pkcs8};
pub use quickstart::{
    demo_policy, demo_proxy, dev_subject_token, quickstart_files, QUICKSTART_POLICY,
};

use args::{
    AccountsAction, Command, EventsAction, KeysAction, PersonsAction, SsfAction, StoreAction,
    UpstreamAction, UsersAction,
};

/// What a command returns: its exit code, or an error printed as
/// `error: ...` with [`Exit::Failed`].
type Res = Result<Exit, Box<dyn std::error::Error>>;

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
            return Exit::Failed.into();
        }
    };
    match rt.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            Exit::Failed.into()
        }
    }
}

/// `policy check --config`: the broker config, read with the broker's own
/// loader (so a config the broker would refuse is refused there too, with
/// the same message).
fn policy_broker(path: &std::path::Path) -> Result<crate::derive::policy::cli::Broker, String> {
    let cfg = crate::infra::config::Config::load(path).map_err(|e| e.to_string())?;
    Ok(crate::derive::policy::cli::Broker {
        file: Some(path.to_path_buf()),
        agent: cfg.agent,
        services: Some(cfg.providers.into_keys().collect()),
        upstreams: Some(cfg.upstreams.into_keys().collect()),
    })
}

/// Hands each command to its function.
async fn run(cmd: Command) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let exit = match cmd {
        // `policy` has its own exit codes (see policy/README.md).
        Command::Policy { command } => {
            return Ok(crate::derive::policy::cli::run(command, &policy_broker));
        }
        Command::Quickstart {
            dir,
            listen,
            demo_listen,
        } => instance::quickstart(&dir, listen.as_deref(), demo_listen.as_deref()).await,
        Command::Serve { config } => instance::serve(&config).await,
        Command::SubjectToken { dir, sub, ttl } => tools::subject_token(&dir, &sub, &ttl),
        Command::Derive {
            socket,
            issuer,
            subject_token,
            call,
            dpop_key,
            print,
        } => {
            tools::derive(
                socket,
                issuer,
                &subject_token,
                &call,
                dpop_key,
                print.as_deref(),
            )
            .await
        }
        Command::Proof {
            key,
            method,
            url,
            access_token,
            nonce,
        } => tools::proof(
            &key,
            &method,
            &url,
            access_token.as_deref(),
            nonce.as_deref(),
        ),
        Command::Status { config } => operator::status(&config).await,
        Command::Freeze { state, config } => operator::freeze(&config, &state).await,
        Command::Upstream {
            action: UpstreamAction::Check { config, name },
        } => upstream::check(&config, &name).await,
        Command::Ssf {
            action: SsfAction::Stream { action },
        } => ssf::stream(action).await,
        Command::Events { action } => match action {
            EventsAction::Redeliver {
                config,
                subscription,
            } => operator::redeliver(&config, subscription.as_deref()).await,
        },
        Command::Keys { action } => match action {
            KeysAction::Rotate { config, emergency } => {
                operator::rotate_keys(&config, emergency).await
            }
            KeysAction::RotateClient { config, emergency } => {
                operator::rotate_client_keys(&config, emergency).await
            }
            KeysAction::RotateVault { config, limit } => {
                operator::rotate_vault(&config, limit).await
            }
        },
        Command::Accounts { action } => match action {
            AccountsAction::List {
                config,
                person,
                issuer,
            } => operator::list_accounts(&config, person, issuer).await,
            AccountsAction::Disconnect {
                config,
                person,
                issuer,
                service,
                force,
            } => operator::disconnect(&config, person, issuer, &service, force).await,
        },
        Command::Persons { action } => match action {
            PersonsAction::Revoke {
                config,
                person,
                reason,
                revoke_at_providers,
            } => persons::revoke(&config, &person, reason, revoke_at_providers).await,
            PersonsAction::Restore { config, person } => persons::restore(&config, &person).await,
            PersonsAction::List { config } => persons::list(&config).await,
        },
        Command::Store { action } => match action {
            StoreAction::Migrate { config } => store::migrate(&config),
            StoreAction::Copy { from, to, force } => store::copy(&from, &to, force),
        },
        Command::Users { action } => match action {
            UsersAction::Add {
                name,
                config,
                password_stdin,
                replace,
            } => operator::add_user(&name, &config, password_stdin, replace).await,
            UsersAction::List { config } => operator::list_users(&config).await,
            UsersAction::Remove { name, config } => operator::remove_user(&name, &config).await,
        },
    }?;
    Ok(exit.into())
}
