//! Commands for tools, scripts and development: `derive`, `proof`,
//! `subject-token`.

use std::path::{Path, PathBuf};

use super::exit::Exit;
use super::keyfile::{dpop_key, load_pem_key};
use super::Res;

/// `credbroker subject-token`: a subject token from the quick start's dev
/// issuer (development only).
pub(super) fn subject_token(dir: &Path, sub: &str, ttl: &str) -> Res {
    let ttl = crate::config::parse_duration(ttl).ok_or("--ttl must be a duration such as 1h")?;
    let token = super::quickstart::dev_subject_token(dir, sub, ttl.as_secs() as i64)?;
    eprintln!("(development only: a subject token from the quick start's dev issuer)");
    println!("{token}");
    Ok(Exit::Ok)
}

/// `credbroker derive`: asks a running broker for a token, with a DPoP proof.
pub(super) async fn derive(
    socket: PathBuf,
    issuer: &str,
    subject_token: &str,
    call: &crate::policy::cli::CallArgs,
    key: Option<PathBuf>,
) -> Res {
    let key = dpop_key(key)?;
    let client = crate::client::Client::new(socket, issuer);
    let answer = client
        .derive(
            &crate::client::DeriveParams {
                subject_token,
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
            Ok(Exit::Ok)
        }
        crate::client::Answer::Refused(r) => {
            println!("{}", serde_json::to_string(&r)?);
            Ok(Exit::Refused)
        }
    }
}

/// `credbroker proof`: a DPoP proof made with a key file.
pub(super) fn proof(key: &Path, method: &str, url: &str, access_token: Option<&str>) -> Res {
    let key = load_pem_key(key)?;
    let now = crate::clock::Clock::now(&crate::clock::SystemClock);
    println!(
        "{}",
        crate::dpop::make_proof(&key, method, url, now, access_token, None)?
    );
    Ok(Exit::Ok)
}
