//! Commands for tools, scripts and development: `derive`, `proof`,
//! `subject-token`.

use std::path::{Path, PathBuf};

use super::exit::Exit;
use super::keyfile::{dpop_key, load_pem_key};
use super::Res;

/// `credbroker subject-token`: a subject token from the quick start's dev
/// issuer (development only).
pub(super) fn subject_token(dir: &Path, sub: &str, ttl: &str) -> Res {
    let ttl =
        crate::infra::config::parse_duration(ttl).ok_or("--ttl must be a duration such as 1h")?;
    let token = super::quickstart::dev_subject_token(dir, sub, ttl.as_secs() as i64)?;
    eprintln!("(development only: a subject token from the quick start's dev issuer)");
    println!("{token}");
    Ok(Exit::Ok)
}

/// `credbroker derive`: asks a running broker for a token, with a DPoP
/// proof; prints the answer, or only its member `print`.
pub(super) async fn derive(
    socket: PathBuf,
    issuer: Option<String>,
    subject_token: &str,
    call: &crate::derive::policy::cli::CallArgs,
    key: Option<PathBuf>,
    print: Option<&str>,
) -> Res {
    let issuer = match issuer {
        Some(i) => i,
        None => issuer_of(&socket).await?,
    };
    let key = dpop_key(key)?;
    let client = crate::client::Client::new(socket, &issuer);
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
    let (body, exit) = match answer {
        crate::client::Answer::Issued(t) => (
            serde_json::json!({
                "access_token": t.access_token.expose(),
                "token_type": t.token_type,
                "issued_token_type": t.issued_token_type,
                "expires_in": t.expires_in,
                "scope": t.scope,
            }),
            Exit::Ok,
        ),
        crate::client::Answer::Refused(r) => (serde_json::to_value(&r)?, Exit::Refused),
    };
    let Some(member) = print else {
        println!("{body}");
        return Ok(exit);
    };
    match body.get(member) {
        Some(serde_json::Value::String(s)) => println!("{s}"),
        Some(v) => println!("{v}"),
        None => {
            // On standard error, and only the names: a script capturing the
            // member must not take anything else for it, and an issued
            // answer's token is not printed where it was not asked for.
            let names: Vec<&str> = body
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            let what = if exit == Exit::Ok {
                "issued"
            } else {
                "refused"
            };
            eprintln!(
                "error: --print {member}: the answer ({what}) has no member {member}; it has {}",
                names.join(", ")
            );
            if exit == Exit::Refused {
                eprintln!("{body}");
            }
            return Ok(if exit == Exit::Ok { Exit::Failed } else { exit });
        }
    }
    Ok(exit)
}

/// The issuer the broker on `socket` names in its `GET /v1/info` (so a
/// `derive` needs only the socket, whatever the broker's listen address).
async fn issuer_of(socket: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let req = http::Request::builder()
        .method("GET")
        .uri("/v1/info")
        .header("host", "credbroker")
        .body(http_body_util::Full::new(bytes::Bytes::new()))?;
    let a = crate::client::send(socket, req).await?;
    let info = serde_json::from_slice::<serde_json::Value>(&a.body).unwrap_or_default();
    match info["issuer"].as_str() {
        Some(i) if a.status == http::StatusCode::OK => Ok(i.to_owned()),
        _ => Err(format!(
            "{}: GET /v1/info answered {} without an issuer; give the broker's issuer URL with --issuer",
            socket.display(),
            a.status
        )
        .into()),
    }
}

/// `credbroker proof`: a DPoP proof made with a key file (with the
/// server's nonce when given, to answer `use_dpop_nonce`).
pub(super) fn proof(
    key: &Path,
    method: &str,
    url: &str,
    access_token: Option<&str>,
    nonce: Option<&str>,
) -> Res {
    let key = load_pem_key(key)?;
    let now = crate::base::clock::Clock::now(&crate::base::clock::SystemClock);
    println!(
        "{}",
        crate::base::dpop::make_proof(&key, method, url, now, access_token, nonce)?
    );
    Ok(Exit::Ok)
}
