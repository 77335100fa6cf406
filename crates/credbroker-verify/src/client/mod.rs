//! A small client for the broker's orchestrator socket (and the admin
//! socket). (Feature `client`.)
//!
//! ```no_run
//! # async fn f() -> Result<(), credbroker_verify::client::ClientError> {
//! use credbroker_verify::client::{Client, DeriveParams};
//! let key = credbroker_verify::client::Es256Key::generate().map_err(|e| credbroker_verify::client::ClientError::Proof(e.to_string()))?.0;
//! let client = Client::new("/run/credbroker/credbroker.sock", "https://broker.example");
//! let answer = client.derive(&DeriveParams {
//!     subject_token: "eyJ...", step: "summarize_inbox", tool: "mail.read",
//!     resource: "https://mail.internal.example", scope: None,
//! }, &key).await?;
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};

pub mod mcp;
mod relay;

// What the client's public signatures mention, re-exported so that an
// embedder needs nothing but this module (the modules they live in are
// internal).
pub use crate::jose::{Es256Key, JoseError};
pub use crate::secret::{SecretBytes, SecretString};

/// Client errors (transport, not refusals: a refusal is an [`Answer`]).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Could not connect or talk to the socket.
    #[error("socket {path}: {detail}")]
    Transport {
        /// Socket path.
        path: String,
        /// What failed.
        detail: String,
    },
    /// The answer was not JSON of the expected shape.
    #[error("unexpected answer (HTTP {0})")]
    Unexpected(u16),
    /// A proof could not be made.
    #[error("DPoP proof: {0}")]
    Proof(String),
}

/// What to ask for.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DeriveParams<'a> {
    /// The person's subject token.
    pub subject_token: &'a str,
    /// The step.
    pub step: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// The resource.
    pub resource: &'a str,
    /// Scope, space-separated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<&'a str>,
}

/// A token issued by the broker.
#[derive(Debug, Deserialize)]
pub struct Token {
    /// The token (a secret).
    #[serde(deserialize_with = "secret_string")]
    pub access_token: SecretString,
    /// `DPoP`.
    pub token_type: String,
    /// RFC 8693 issued token type.
    pub issued_token_type: String,
    /// Seconds (0 when a provider token's provider gave no lifetime).
    #[serde(default)]
    pub expires_in: i64,
    /// `false` for a provider's bearer token, which is not bound to the
    /// tool's DPoP key; absent (`None`) for DPoP-bound tokens.
    #[serde(default)]
    pub sender_constrained: Option<bool>,
    /// Scopes.
    pub scope: String,
    /// The RFC 9396 details the token is for, when the request carried
    /// them (RFC 9396 section 7).
    #[serde(default)]
    pub authorization_details: Option<serde_json::Value>,
}

fn secret_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SecretString, D::Error> {
    String::deserialize(d).map(SecretString::new)
}

/// A refusal, typed.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status.
    #[serde(skip)]
    pub status: u16,
    /// OAuth error code.
    pub error: String,
    /// Policy reason, when denied.
    // Members the server did not send are not printed as `null` (the CLI
    // prints a refusal as this struct's JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_description: Option<String>,
    /// `DPoP-Nonce` to retry with, for `use_dpop_nonce`.
    #[serde(skip)]
    pub dpop_nonce: Option<String>,
    /// `Retry-After`, for 429 and 503.
    #[serde(skip)]
    pub retry_after: Option<u64>,
    /// The connect link a person must open (`invalid_grant` refusals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_uri: Option<String>,
    /// The link's id (the MCP `elicitationId`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_id: Option<String>,
    /// Seconds until the link expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_expires_in: Option<i64>,
    /// A sentence for the person, naming the agent and the service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_message: Option<String>,
    /// With `upstream_proof_required`: the upstream token endpoint the
    /// relayed proof must name (its `htu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_htu: Option<String>,
    /// With `upstream_proof_required`: that authorization server's DPoP
    /// nonce, when it uses one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_nonce: Option<String>,
}

impl Refusal {
    /// The connect link of a refusal that carries one: only `invalid_grant`
    /// refusals (`connect_required`, `allow_required`, `reconnect_required`)
    /// do, so connect fields on any other answer are not relayed.
    pub fn link(&self) -> Option<mcp::Link<'_>> {
        if self.error != "invalid_grant" {
            return None;
        }
        Some(mcp::Link {
            id: self.connect_id.as_deref()?,
            url: self.connect_uri.as_deref()?,
            message: self
                .connect_message
                .as_deref()
                .unwrap_or("Open this link to continue."),
        })
    }
}

/// The answer to a derive.
#[derive(Debug)]
pub enum Answer {
    /// Issued.
    Issued(Token),
    /// Refused.
    Refused(Refusal),
}

/// A client for one broker socket.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    issuer: String,
    /// The last DPoP nonce the broker handed out (`[dpop] require_nonce`),
    /// sent with every derive until the broker asks for another (RFC 9449
    /// section 8), so that a derive costs one request and one proof, not
    /// two. Shared by the clones of this client. A nonce is public.
    nonce: Arc<Mutex<Option<String>>>,
    /// What `GET /v1/info` says about upstreams (read on the first derive,
    /// again after an `upstream_proof_required`), and the upstream nonces
    /// learnt from refusals since, by upstream name.
    upstreams: Arc<Mutex<Upstreams>>,
    /// The caller's trace context sent with each derive
    /// ([`Client::with_trace`]).
    trace: Option<Arc<mcp::TraceContext>>,
}

#[derive(Debug, Default)]
struct Upstreams {
    info: Option<Arc<relay::UpstreamInfo>>,
    nonces: std::collections::BTreeMap<String, String>,
}

/// A raw HTTP answer.
#[derive(Debug)]
pub struct RawAnswer {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: http::HeaderMap,
    /// Body.
    pub body: Bytes,
}

/// Sends one HTTP/1.1 request over a Unix socket.
pub async fn send(socket: &Path, req: Request<Full<Bytes>>) -> Result<RawAnswer, ClientError> {
    let err = |d: String| ClientError::Transport {
        path: socket.display().to_string(),
        detail: d,
    };
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| err(e.to_string()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| err(e.to_string()))?;
    let driver = tokio::spawn(conn);
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| err(e.to_string()))?;
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| err(e.to_string()))?
        .to_bytes();
    driver.abort();
    Ok(RawAnswer {
        status,
        headers,
        body,
    })
}

impl Client {
    /// A client for `socket`; `issuer` is the broker's public issuer URL (the
    /// base of the proof's `htu`).
    pub fn new(socket: impl Into<PathBuf>, issuer: &str) -> Client {
        Client {
            socket: socket.into(),
            issuer: issuer.trim_end_matches('/').to_owned(),
            nonce: Arc::default(),
            upstreams: Arc::default(),
            trace: None,
        }
    }

    /// A clone of this client (sharing its nonce and upstream state) whose
    /// derives carry `trace` as their `traceparent` and `tracestate`: an
    /// MCP request's trace context ([`mcp::trace_from_meta`]), so that the
    /// derive's span joins the caller's trace where the broker trusts the
    /// socket's `traceparent` (`[telemetry] trust_socket_traceparent`).
    pub fn with_trace(&self, trace: Option<mcp::TraceContext>) -> Client {
        Client {
            trace: trace.map(Arc::new),
            ..self.clone()
        }
    }

    /// The upstream part of the broker's info: kept, or read now (when
    /// `fresh`, or the first time). A broker that does not answer it has
    /// no upstreams as far as this client knows.
    async fn upstream_info(&self, fresh: bool) -> Arc<relay::UpstreamInfo> {
        if !fresh {
            if let Some(i) = &self
                .upstreams
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .info
            {
                return i.clone();
            }
        }
        let req = Request::get("/v1/info")
            .header("host", "credbroker")
            .body(Full::new(Bytes::new()));
        let info = match req {
            Ok(req) => match send(&self.socket, req).await {
                Ok(raw) if raw.status == StatusCode::OK => serde_json::from_slice(&raw.body)
                    .map(|v| relay::UpstreamInfo::parse(&v))
                    .unwrap_or_default(),
                _ => relay::UpstreamInfo::default(),
            },
            Err(_) => relay::UpstreamInfo::default(),
        };
        let info = Arc::new(info);
        self.upstreams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .info = Some(info.clone());
        info
    }

    /// The legs of a derive for `resource`, each with the latest nonce
    /// known for its upstream.
    async fn legs(&self, resource: &str) -> std::collections::BTreeMap<String, relay::Leg> {
        let mut legs = self.upstream_info(false).await.legs(resource);
        let ups = self.upstreams.lock().unwrap_or_else(|p| p.into_inner());
        for (name, leg) in &mut legs {
            if let Some(n) = ups.nonces.get(name) {
                leg.nonce = Some(n.clone());
            }
        }
        legs
    }

    /// Derives a token, making a fresh DPoP proof with `key`. Retries once
    /// with the server's nonce if it asks for one. For an `exchange`
    /// resource it makes the relayed proof too (see
    /// [`Client::derive_for_details`]).
    pub async fn derive(
        &self,
        p: &DeriveParams<'_>,
        key: &Es256Key,
    ) -> Result<Answer, ClientError> {
        self.derive_for_details(p, None, key).await
    }

    /// [`Client::derive`] for a call described by RFC 9396
    /// `authorization_details` (see [`Client::derive_with_details`]):
    /// a fresh proof with `key` and the last nonce the broker handed out,
    /// and one retry with a new nonce if it asks for one (`[dpop]
    /// require_nonce`).
    ///
    /// For an `exchange` resource it also makes the relayed proof(s) with
    /// `key` (htm POST, htu = the upstream's token endpoint from `GET
    /// /v1/info`, byte for byte, with the AS's nonce when it has one) and
    /// sends them as `upstream_proofs`; on `upstream_proof_required` it
    /// retries once with the `htu` and nonce the refusal names.
    pub async fn derive_for_details(
        &self,
        p: &DeriveParams<'_>,
        authorization_details: Option<&serde_json::Value>,
        key: &Es256Key,
    ) -> Result<Answer, ClientError> {
        let mut nonce = self.nonce.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut legs = self.legs(p.resource).await;
        let (mut nonce_retry, mut upstream_retry) = (true, true);
        loop {
            let now = crate::clock::Clock::now(&crate::clock::SystemClock);
            let make = |htu: &str, nonce: Option<&str>| {
                crate::dpop::make_proof(key, "POST", htu, now, None, nonce)
                    .map_err(|e| ClientError::Proof(e.to_string()))
            };
            let proof = make(&format!("{}/v1/derive", self.issuer), nonce.as_deref())?;
            let mut relayed = std::collections::BTreeMap::new();
            for (name, leg) in &legs {
                relayed.insert(name.as_str(), make(&leg.htu, leg.nonce.as_deref())?);
            }
            let answer = self
                .send_derive(p, authorization_details, &proof, &relayed, None)
                .await?;
            match answer {
                Answer::Refused(Refusal {
                    ref error,
                    dpop_nonce: Some(ref n),
                    ..
                }) if error == "use_dpop_nonce" && nonce_retry => {
                    nonce_retry = false;
                    *self.nonce.lock().unwrap_or_else(|p| p.into_inner()) = Some(n.clone());
                    nonce = Some(n.clone());
                }
                Answer::Refused(Refusal {
                    ref reason,
                    upstream_htu: Some(ref htu),
                    ref upstream_nonce,
                    ..
                }) if reason.as_deref() == Some("upstream_proof_required") && upstream_retry => {
                    upstream_retry = false;
                    let Some(name) = self.upstream_info(true).await.name_for(htu, p.resource)
                    else {
                        return Ok(answer);
                    };
                    if let Some(n) = upstream_nonce {
                        self.upstreams
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .nonces
                            .insert(name.clone(), n.clone());
                    }
                    legs.insert(
                        name,
                        relay::Leg {
                            htu: htu.clone(),
                            nonce: upstream_nonce.clone(),
                        },
                    );
                }
                a => return Ok(a),
            }
        }
    }

    /// Derives with a proof made by the caller.
    pub async fn derive_with_proof(
        &self,
        p: &DeriveParams<'_>,
        proof: &str,
    ) -> Result<Answer, ClientError> {
        self.derive_with_details(p, None, proof).await
    }

    /// [`Client::derive_with_proof`] for a call described by RFC 9396
    /// `authorization_details` (a JSON array), as a tool that needs the
    /// person's approval sends them (docs/APPROVALS.md). An
    /// `approval_required` refusal carries its link like a connect refusal
    /// ([`Refusal::link`]).
    pub async fn derive_with_details(
        &self,
        p: &DeriveParams<'_>,
        authorization_details: Option<&serde_json::Value>,
        proof: &str,
    ) -> Result<Answer, ClientError> {
        self.send_derive(p, authorization_details, proof, &Default::default(), None)
            .await
    }

    /// [`Client::derive_with_details`] carrying the whole request the
    /// token is for (docs/APPROVALS.md, "The request, bound"): the broker
    /// hashes it, the approval page shows it, and the token carries its
    /// digest (`req_sha256`). The body must be UTF-8 text.
    pub async fn derive_with_request(
        &self,
        p: &DeriveParams<'_>,
        authorization_details: Option<&serde_json::Value>,
        request: &crate::request::BoundRequest<'_>,
        proof: &str,
    ) -> Result<Answer, ClientError> {
        let body = std::str::from_utf8(request.body)
            .map_err(|_| ClientError::Proof("a bound request's body must be UTF-8 text".into()))?;
        let request = serde_json::json!({
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "content_type": request.content_type,
            "body": body,
        });
        self.send_derive(
            p,
            authorization_details,
            proof,
            &Default::default(),
            Some(request),
        )
        .await
    }

    /// One `POST /v1/derive`, with `relayed` as `upstream_proofs` when
    /// there are any.
    async fn send_derive(
        &self,
        p: &DeriveParams<'_>,
        authorization_details: Option<&serde_json::Value>,
        proof: &str,
        relayed: &std::collections::BTreeMap<&str, String>,
        request: Option<serde_json::Value>,
    ) -> Result<Answer, ClientError> {
        let mut body = serde_json::to_value(p).map_err(|_| ClientError::Unexpected(0))?;
        if let (Some(d), Some(obj)) = (authorization_details, body.as_object_mut()) {
            obj.insert("authorization_details".into(), d.clone());
        }
        if let (false, Some(obj)) = (relayed.is_empty(), body.as_object_mut()) {
            let proofs = serde_json::to_value(relayed).map_err(|_| ClientError::Unexpected(0))?;
            obj.insert("upstream_proofs".into(), proofs);
        }
        if let (Some(r), Some(obj)) = (request, body.as_object_mut()) {
            obj.insert("request".into(), r);
        }
        let body = serde_json::to_vec(&body).map_err(|_| ClientError::Unexpected(0))?;
        let mut req = Request::post("/v1/derive")
            .header("host", "credbroker")
            .header("content-type", "application/json")
            .header("dpop", proof);
        if let Some(t) = &self.trace {
            req = req.header("traceparent", t.traceparent.as_str());
            if let Some(state) = &t.tracestate {
                req = req.header("tracestate", state.as_str());
            }
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| ClientError::Proof("proof is not a valid header value".into()))?;
        let raw = send(&self.socket, req).await?;
        parse_answer(raw)
    }
}

/// A DPoP proof by `key` for one call to a resource server or to the
/// broker's egress proxy (docs/PROXY.md): `method`, and `url` without its
/// query (it becomes `htu`); `access_token` is the token the call carries
/// (its hash becomes `ath`). Make a new one for every request.
pub fn proof(
    key: &Es256Key,
    method: &str,
    url: &str,
    access_token: Option<&str>,
) -> Result<String, ClientError> {
    proof_with_nonce(key, method, url, access_token, None)
}

/// [`proof`] carrying the server's `nonce`: what to retry with when a call
/// was refused with `use_dpop_nonce` (401 from the egress proxy, with the
/// nonce in its `DPoP-Nonce` header; RFC 9449 section 9). Nothing went
/// upstream with the refused call, so a retry is safe for any method.
pub fn proof_with_nonce(
    key: &Es256Key,
    method: &str,
    url: &str,
    access_token: Option<&str>,
    nonce: Option<&str>,
) -> Result<String, ClientError> {
    let now = crate::clock::Clock::now(&crate::clock::SystemClock);
    crate::dpop::make_proof(key, method, url, now, access_token, nonce)
        .map_err(|e| ClientError::Proof(e.to_string()))
}

/// Turns a raw derive answer into an [`Answer`].
pub fn parse_answer(raw: RawAnswer) -> Result<Answer, ClientError> {
    if raw.status == StatusCode::OK {
        return serde_json::from_slice(&raw.body)
            .map(Answer::Issued)
            .map_err(|_| ClientError::Unexpected(200));
    }
    let mut r: Refusal = serde_json::from_slice(&raw.body)
        .map_err(|_| ClientError::Unexpected(raw.status.as_u16()))?;
    r.status = raw.status.as_u16();
    r.dpop_nonce = raw
        .headers
        .get("dpop-nonce")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    r.retry_after = raw
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    Ok(Answer::Refused(r))
}

#[cfg(test)]
mod refusal_tests {
    #![allow(clippy::unwrap_used)] // tests may panic
    use super::Refusal;

    #[test]
    fn refusal_prints_only_the_members_the_server_sent() {
        let r: Refusal = serde_json::from_str(r#"{"error":"invalid_request"}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"error":"invalid_request"}"#
        );
        // Positive control: members that were sent are printed.
        let r: Refusal = serde_json::from_str(
            r#"{"error":"access_denied","reason":"frozen","error_description":"d"}"#,
        )
        .unwrap();
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["reason"], "frozen");
        assert_eq!(v["error_description"], "d");
    }
}
