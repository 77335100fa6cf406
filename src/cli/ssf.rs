//! `credbroker ssf stream create|verify|status`: the transmitter's stream
//! for this receiver, made, checked, or its status read or set with its
//! management credentials
//! (`ssf.transmitters.<name>.management_credentials_file`), its id kept in
//! the store (through the admin socket, or the store itself when no
//! instance runs).

use std::path::Path;

use crate::derive::ssf::stream::{self, Status, StreamRecord};
use crate::derive::ssf::Transmitter;
use crate::infra::config::Config;

use super::args::StreamAction;
use super::exit::Exit;
use super::online::{reach, Reached};
use super::operator::admin_refusal;
use super::Res;

/// `credbroker ssf stream ACTION`.
pub(super) async fn stream(action: StreamAction) -> Res {
    match action {
        StreamAction::Create {
            config,
            transmitter,
        } => create(&config, &transmitter).await,
        StreamAction::Verify {
            config,
            transmitter,
        } => verify(&config, &transmitter).await,
        StreamAction::Status {
            config,
            transmitter,
            set,
            reason,
        } => status(&config, &transmitter, set.as_deref(), reason.as_deref()).await,
    }
}

/// The named transmitter, built as the instance builds it.
fn transmitter(cfg: &Config, name: &str) -> Result<Transmitter, Box<dyn std::error::Error>> {
    let t = cfg
        .ssf
        .get(name)
        .ok_or_else(|| format!("{}: no [ssf.transmitters.{name}] table", cfg.file.display()))?;
    Ok(Transmitter::new(t, &Default::default())?)
}

/// Where this receiver takes pushed SETs.
fn push_url(cfg: &Config) -> String {
    format!("{}{}", cfg.issuer, crate::edge::ssf::PATH)
}

/// `ssf stream create`: asks the transmitter for a stream and keeps its id.
async fn create(config: &Path, name: &str) -> Res {
    let cfg = Config::load(config)?;
    let t = transmitter(&cfg, name)?;
    let record = stream::create(&t, &push_url(&cfg))
        .await
        .map_err(|e| format!("creating the stream at transmitter {name}: {e}"))?;
    let body = serde_json::json!({"transmitter": name, "stream": record}).to_string();
    match reach(&cfg, "POST", "/ssf/stream", &body).await? {
        Reached::Instance { status: 200, body } => println!("{body}"),
        Reached::Instance { status, body } => {
            eprintln!(
                "error: the stream {} was made, but not kept: {}",
                record.stream_id,
                admin_refusal(status, &body)
            );
            return Ok(Exit::Failed);
        }
        Reached::Stopped(off) => {
            stream::save(off.store.as_ref(), name, &record)?;
            println!(
                "{}",
                serde_json::json!({"transmitter": name, "stream": record, "running": false})
            );
        }
    }
    Ok(Exit::Ok)
}

/// The stream kept for transmitter `name` (through the running instance,
/// or the store when none runs); `Err(Exit::Failed)` once the reason is
/// printed.
async fn kept(
    cfg: &Config,
    config: &Path,
    name: &str,
) -> Result<Result<StreamRecord, Exit>, Box<dyn std::error::Error>> {
    let path = format!("/ssf/stream?transmitter={name}");
    let stored: Option<StreamRecord> = match reach(cfg, "GET", &path, "").await? {
        Reached::Instance { status: 200, body } => serde_json::from_value(
            serde_json::from_str::<serde_json::Value>(&body)?["stream"].clone(),
        )?,
        Reached::Instance { status, body } => {
            eprintln!("error: {}", admin_refusal(status, &body));
            return Ok(Err(Exit::Failed));
        }
        Reached::Stopped(off) => stream::load(off.store.as_ref(), name)?,
    };
    Ok(stored.ok_or_else(|| {
        eprintln!("error: no stream is kept for transmitter {name}: run `credbroker ssf stream create --config {} --transmitter {name}`", config.display());
        Exit::Failed
    }))
}

/// `ssf stream verify`: reads the kept stream back from the transmitter,
/// checks it against the config, and asks for a verification event.
async fn verify(config: &Path, name: &str) -> Res {
    let cfg = Config::load(config)?;
    let t = transmitter(&cfg, name)?;
    let stored = match kept(&cfg, config, name).await? {
        Ok(s) => s,
        Err(exit) => return Ok(exit),
    };
    match stream::verify(&t, &push_url(&cfg), &stored).await {
        Ok((found, asked)) => {
            println!(
                "{}",
                serde_json::json!({"transmitter": name, "stream": found, "verification_requested": asked})
            );
            Ok(Exit::Ok)
        }
        Err(e) => {
            eprintln!(
                "error: the stream {} of transmitter {name}: {e}",
                stored.stream_id
            );
            Ok(Exit::Failed)
        }
    }
}

/// `ssf stream status`: the kept stream's status at the transmitter, or
/// (with `set`) the one asked for; exit 1 unless it is `enabled` (or, with
/// `set`, the one asked for).
async fn status(config: &Path, name: &str, set: Option<&str>, reason: Option<&str>) -> Res {
    let cfg = Config::load(config)?;
    let t = transmitter(&cfg, name)?;
    let want = match set {
        Some(s) => Some(Status::parse(s).ok_or_else(|| format!("--set {s}: not a status"))?),
        None => None,
    };
    let stored = match kept(&cfg, config, name).await? {
        Ok(s) => s,
        Err(exit) => return Ok(exit),
    };
    let got = match stream::status(&t, &stored, want.map(|w| (w, reason))).await {
        Ok(got) => got,
        Err(e) => {
            eprintln!(
                "error: the status of stream {} of transmitter {name}: {e}",
                stored.stream_id
            );
            return Ok(Exit::Failed);
        }
    };
    println!(
        "{}",
        serde_json::json!({"transmitter": name, "stream_id": stored.stream_id, "status": got})
    );
    let expected = want.unwrap_or(Status::Enabled);
    if got.status != expected {
        eprintln!(
            "error: the stream {} of transmitter {name} is {}, not {}: {}",
            stored.stream_id,
            got.status.name(),
            expected.name(),
            got.status.meaning()
        );
    }
    Ok(Exit::ok_if(got.status == expected, Exit::Failed))
}
