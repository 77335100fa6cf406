//! A transmitter's SSF metadata (SSF 1.0 section 7) and its stream
//! management API (section 8.1), for `credbroker ssf stream
//! create|verify|status`: the stream is made (or checked) with the
//! management credentials, and its id (with the poll URL, for polling) is
//! kept in the store (tree `state`, record `ssf/stream/<name>`); its status
//! is read or set at the transmitter's `status_endpoint`.

use serde::{Deserialize, Serialize};

use super::Transmitter;
use crate::base::grammar::secure_or_loopback;
use crate::infra::config::SsfDelivery;
use crate::infra::store::{Store, StoreError, Tree};

/// The most a metadata or stream answer may hold.
const MAX_ANSWER: usize = 64 * 1024;

/// What this receiver uses of a transmitter's metadata.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Metadata {
    /// Must be the configured issuer.
    pub(crate) issuer: String,
    /// Its signing keys.
    pub(crate) jwks_uri: String,
    /// Where streams are made and read.
    #[serde(default)]
    pub(crate) configuration_endpoint: Option<String>,
    /// Where a verification event is asked for.
    #[serde(default)]
    pub(crate) verification_endpoint: Option<String>,
    /// Where a stream's status is read and set.
    #[serde(default)]
    pub(crate) status_endpoint: Option<String>,
}

/// A stream's status at the transmitter (SSF 1.0 section 8.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    /// SETs are sent.
    Enabled,
    /// SETs are held by the transmitter and sent when enabled again.
    Paused,
    /// SETs are not sent, and not held.
    Disabled,
}

impl Status {
    /// The status named `s` (`enabled`, `paused`, `disabled`).
    pub(crate) fn parse(s: &str) -> Option<Status> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }

    /// Its name in SSF.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Status::Enabled => "enabled",
            Status::Paused => "paused",
            Status::Disabled => "disabled",
        }
    }

    /// What it means for the SETs of the stream.
    pub(crate) fn meaning(self) -> &'static str {
        match self {
            Status::Enabled => "the transmitter sends its SETs",
            Status::Paused => "the transmitter holds its SETs until it is enabled",
            Status::Disabled => "the transmitter sends no SETs and keeps none",
        }
    }
}

/// What the transmitter answered about a stream's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct StreamStatus {
    /// The stream's status.
    pub(crate) status: Status,
    /// The transmitter's reason, as given (at most 256 characters kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
}

/// The stream as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StreamRecord {
    /// The transmitter's stream id.
    pub(crate) stream_id: String,
    /// The delivery method URN.
    pub(crate) method: String,
    /// For poll: where to poll (the stream's `delivery.endpoint_url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) poll_url: Option<String>,
}

fn record_key(name: &str) -> Vec<u8> {
    format!("ssf/stream/{name}").into_bytes()
}

/// The stored stream of transmitter `name`, if any.
pub(crate) fn load(store: &dyn Store, name: &str) -> Result<Option<StreamRecord>, StoreError> {
    Ok(store
        .get(Tree::State, &record_key(name))?
        .and_then(|v| serde_json::from_slice(&v).ok()))
}

/// Keeps `r` as transmitter `name`'s stream.
pub(crate) fn save(store: &dyn Store, name: &str, r: &StreamRecord) -> Result<(), StoreError> {
    store.put(
        Tree::State,
        &record_key(name),
        &serde_json::to_vec(r).unwrap_or_default(),
    )
}

fn url_ok(s: &str) -> bool {
    url::Url::parse(s).is_ok_and(|u| secure_or_loopback(&u) && u.fragment().is_none())
}

/// A GET or POST of JSON, the answer read up to [`MAX_ANSWER`]. `auth`:
/// the management bearer token.
pub(crate) async fn call(
    t: &Transmitter,
    method: reqwest::Method,
    url: &str,
    body: Option<&serde_json::Value>,
    auth: bool,
) -> Result<(u16, Vec<u8>), String> {
    let mut req = t.http.request(method, url);
    if auth {
        let token = t
            .management
            .as_ref()
            .ok_or("no management_credentials_file is configured for this transmitter")?;
        req = req.bearer_auth(token.expose());
    }
    if let Some(b) = body {
        req = req.json(b);
    }
    let mut resp = req
        .send()
        .await
        .map_err(|e| format!("{url}: {}", e.without_url()))?;
    let status = resp.status().as_u16();
    if resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
        return Err(format!(
            "{url}: the answer is larger than {MAX_ANSWER} bytes"
        ));
    }
    let mut out = Vec::new();
    while let Some(c) = resp
        .chunk()
        .await
        .map_err(|e| format!("{url}: {}", e.without_url()))?
    {
        if out.len() + c.len() > MAX_ANSWER {
            return Err(format!(
                "{url}: the answer is larger than {MAX_ANSWER} bytes"
            ));
        }
        out.extend_from_slice(&c);
    }
    Ok((status, out))
}

/// Fetches and checks the transmitter's metadata: its `issuer` identical
/// to the configured one, its URLs https (http on loopback).
pub(crate) async fn discover(t: &Transmitter) -> Result<Metadata, String> {
    let (status, body) = call(t, reqwest::Method::GET, &t.cfg.metadata_url, None, false).await?;
    if status != 200 {
        return Err(format!("{}: answered {status}", t.cfg.metadata_url));
    }
    let m: Metadata = serde_json::from_slice(&body).map_err(|_| {
        format!(
            "{}: not SSF metadata (issuer, jwks_uri)",
            t.cfg.metadata_url
        )
    })?;
    if m.issuer != t.cfg.issuer {
        return Err(format!(
            "{}: its issuer is not the configured ssf.transmitters.{}.issuer",
            t.cfg.metadata_url, t.cfg.name
        ));
    }
    for u in [
        Some(&m.jwks_uri),
        m.configuration_endpoint.as_ref(),
        m.verification_endpoint.as_ref(),
        m.status_endpoint.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        if !url_ok(u) {
            return Err(format!(
                "{}: an endpoint is not an https URL",
                t.cfg.metadata_url
            ));
        }
    }
    Ok(m)
}

/// The stream configuration this receiver asks for: its delivery (push to
/// `push_url`, with the configured `Authorization` value; or poll) and
/// every event type it acts on.
fn requested(t: &Transmitter, push_url: &str) -> serde_json::Value {
    let mut delivery = serde_json::json!({"method": t.cfg.delivery.method()});
    if t.cfg.delivery == SsfDelivery::Push {
        delivery["endpoint_url"] = push_url.into();
        if let Some(a) = &t.push_auth {
            delivery["authorization_header"] = a.expose().as_str().into();
        }
    }
    let events: Vec<String> = super::types::TABLE
        .iter()
        .map(|(prefix, name, _)| format!("{prefix}{name}"))
        .collect();
    serde_json::json!({
        "delivery": delivery,
        "events_requested": events,
        "description": "credbroker: stops a person's agents when their session or account ends",
    })
}

/// Checks a stream configuration the transmitter answered; returns the
/// record to keep.
fn checked(t: &Transmitter, body: &[u8], push_url: &str) -> Result<StreamRecord, String> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|_| "the stream configuration is not JSON".to_string())?;
    let stream_id = v["stream_id"]
        .as_str()
        .filter(|s| !s.is_empty() && s.len() <= 256)
        .ok_or("the stream configuration has no stream_id")?;
    if v["iss"].as_str().is_some_and(|i| i != t.cfg.issuer) {
        return Err("the stream's iss is not the configured issuer".into());
    }
    let aud_ok = match &v["aud"] {
        serde_json::Value::String(a) => *a == t.cfg.audience,
        serde_json::Value::Array(a) => a.iter().any(|x| x.as_str() == Some(&t.cfg.audience)),
        serde_json::Value::Null => true,
        _ => false,
    };
    if !aud_ok {
        return Err(format!(
            "the stream's aud does not name ssf.transmitters.{}.audience",
            t.cfg.name
        ));
    }
    let method = v["delivery"]["method"].as_str().unwrap_or_default();
    if method != t.cfg.delivery.method() {
        return Err(format!(
            "the stream's delivery method is {method:?}, not the configured {:?}",
            t.cfg.delivery.method()
        ));
    }
    let endpoint = v["delivery"]["endpoint_url"].as_str();
    let poll_url = match t.cfg.delivery {
        SsfDelivery::Push => {
            if endpoint != Some(push_url) {
                return Err(format!(
                    "the stream pushes to another endpoint_url than {push_url}"
                ));
            }
            None
        }
        SsfDelivery::Poll => Some(
            endpoint
                .filter(|u| url_ok(u))
                .ok_or("the poll stream has no https endpoint_url to poll")?
                .to_owned(),
        ),
    };
    Ok(StreamRecord {
        stream_id: stream_id.to_owned(),
        method: method.to_owned(),
        poll_url,
    })
}

/// Creates the stream at the transmitter (`ssf stream create`); the caller
/// stores the record.
pub(crate) async fn create(t: &Transmitter, push_url: &str) -> Result<StreamRecord, String> {
    let meta = discover(t).await?;
    let endpoint = meta
        .configuration_endpoint
        .as_deref()
        .ok_or("the transmitter's metadata has no configuration_endpoint")?;
    let (status, body) = call(
        t,
        reqwest::Method::POST,
        endpoint,
        Some(&requested(t, push_url)),
        true,
    )
    .await?;
    if !(200..300).contains(&status) {
        return Err(format!(
            "{endpoint}: answered {status} to the stream creation"
        ));
    }
    checked(t, &body, push_url)
}

/// Reads the stream back and checks it against the config and the stored
/// record, then asks for a verification event (`ssf stream verify`).
/// Returns what the transmitter has for it, and whether a verification
/// event was asked for.
pub(crate) async fn verify(
    t: &Transmitter,
    push_url: &str,
    stored: &StreamRecord,
) -> Result<(StreamRecord, bool), String> {
    let meta = discover(t).await?;
    let endpoint = meta
        .configuration_endpoint
        .as_deref()
        .ok_or("the transmitter's metadata has no configuration_endpoint")?;
    let mut url = url::Url::parse(endpoint).map_err(|_| "configuration_endpoint is not a URL")?;
    url.query_pairs_mut()
        .append_pair("stream_id", &stored.stream_id);
    let (status, body) = call(t, reqwest::Method::GET, url.as_str(), None, true).await?;
    if status != 200 {
        return Err(format!(
            "{endpoint}: answered {status} for the stored stream id"
        ));
    }
    let found = checked(t, &body, push_url)?;
    if found.stream_id != stored.stream_id {
        return Err("the transmitter answered another stream".into());
    }
    let mut asked = false;
    if let Some(v) = &meta.verification_endpoint {
        let mut state = [0u8; 16];
        let _ = aws_lc_rs::rand::fill(&mut state);
        let body = serde_json::json!({"stream_id": stored.stream_id, "state": hex::encode(state)});
        let (status, _) = call(t, reqwest::Method::POST, v, Some(&body), true).await?;
        asked = (200..300).contains(&status);
    }
    Ok((found, asked))
}

/// The most of a transmitter's status `reason` that is kept.
const MAX_REASON: usize = 256;

/// Reads the stored stream's status at the transmitter, or, with `set`,
/// asks for that status (with an optional reason) and returns what the
/// transmitter answers (`ssf stream status`).
pub(crate) async fn status(
    t: &Transmitter,
    stored: &StreamRecord,
    set: Option<(Status, Option<&str>)>,
) -> Result<StreamStatus, String> {
    let meta = discover(t).await?;
    let endpoint = meta
        .status_endpoint
        .as_deref()
        .ok_or("the transmitter's metadata has no status_endpoint")?;
    let (status, body) = match set {
        None => {
            let mut url = url::Url::parse(endpoint).map_err(|_| "status_endpoint is not a URL")?;
            url.query_pairs_mut()
                .append_pair("stream_id", &stored.stream_id);
            call(t, reqwest::Method::GET, url.as_str(), None, true).await?
        }
        Some((want, reason)) => {
            let mut body = serde_json::json!({"stream_id": stored.stream_id, "status": want});
            if let Some(r) = reason {
                body["reason"] = r.into();
            }
            call(t, reqwest::Method::POST, endpoint, Some(&body), true).await?
        }
    };
    if status != 200 {
        return Err(format!(
            "{endpoint}: answered {status} for the stored stream id"
        ));
    }
    status_answer(&body, &stored.stream_id).map_err(|e| format!("{endpoint}: {e}"))
}

/// Checks a status answer: JSON with a known `status`, naming the stored
/// stream when it names one.
fn status_answer(body: &[u8], stream_id: &str) -> Result<StreamStatus, String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| "the status answer is not JSON".to_string())?;
    if v["stream_id"].as_str().is_some_and(|s| s != stream_id) {
        return Err("the status answer names another stream".into());
    }
    let status = serde_json::from_value(v["status"].clone())
        .map_err(|_| "the status answer has no status enabled, paused or disabled".to_string())?;
    let reason = v["reason"].as_str().map(|r| {
        r.chars()
            .filter(|c| !c.is_control())
            .take(MAX_REASON)
            .collect()
    });
    Ok(StreamStatus { status, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_answer_is_checked() {
        let ok = status_answer(
            br#"{"stream_id":"s1","status":"paused","reason":"maintenance"}"#,
            "s1",
        );
        assert_eq!(
            ok,
            Ok(StreamStatus {
                status: Status::Paused,
                reason: Some("maintenance".into())
            })
        );
        // Without stream_id (a transmitter may leave it out): accepted.
        assert_eq!(
            status_answer(br#"{"status":"enabled"}"#, "s1").map(|s| s.status),
            Ok(Status::Enabled)
        );
        for bad in [
            &br#"{"stream_id":"s2","status":"enabled"}"#[..],
            br#"{"stream_id":"s1","status":"on"}"#,
            br#"{"stream_id":"s1"}"#,
            b"not json",
        ] {
            assert!(
                status_answer(bad, "s1").is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // A reason is kept without control characters, and cut.
        let long = format!(
            r#"{{"status":"disabled","reason":"a\u001b[31m{}"}}"#,
            "x".repeat(400)
        );
        let r = status_answer(long.as_bytes(), "s1")
            .unwrap()
            .reason
            .unwrap();
        assert!(
            r.starts_with("a[31m") && r.chars().count() == MAX_REASON,
            "{r}"
        );
    }
}
