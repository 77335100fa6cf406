//! `credbroker ssf stream create|verify`: the transmitter's stream for this
//! receiver, made or checked with its management credentials
//! (`ssf.transmitters.<name>.management_credentials_file`), its id kept in
//! the store (through the admin socket, or the store itself when no
//! instance runs).

use std::path::Path;

use crate::derive::ssf::stream::{self, StreamRecord};
use crate::derive::ssf::Transmitter;
use crate::infra::config::Config;

use super::exit::Exit;
use super::online::{reach, Reached};
use super::operator::admin_refusal;
use super::Res;

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
pub(super) async fn create(config: &Path, name: &str) -> Res {
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

/// `ssf stream verify`: reads the kept stream back from the transmitter,
/// checks it against the config, and asks for a verification event.
pub(super) async fn verify(config: &Path, name: &str) -> Res {
    let cfg = Config::load(config)?;
    let t = transmitter(&cfg, name)?;
    let path = format!("/ssf/stream?transmitter={name}");
    let stored: Option<StreamRecord> = match reach(&cfg, "GET", &path, "").await? {
        Reached::Instance { status: 200, body } => serde_json::from_value(
            serde_json::from_str::<serde_json::Value>(&body)?["stream"].clone(),
        )?,
        Reached::Instance { status, body } => {
            eprintln!("error: {}", admin_refusal(status, &body));
            return Ok(Exit::Failed);
        }
        Reached::Stopped(off) => stream::load(off.store.as_ref(), name)?,
    };
    let Some(stored) = stored else {
        eprintln!("error: no stream is kept for transmitter {name}: run `credbroker ssf stream create --config {} --transmitter {name}`", config.display());
        return Ok(Exit::Failed);
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
