//! What a derive takes and gives: the parsed request and the issued token.

use crate::base::secret::SecretString;

/// The endpoint a request came in on (it is part of `htu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/derive` (JSON).
    Derive,
    /// `POST /token` (RFC 8693 form).
    Token,
}

impl Endpoint {
    /// The request path.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Derive => "/v1/derive",
            Endpoint::Token => "/token",
        }
    }
}

/// What the subject token is (RFC 8693 `subject_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SubjectTokenType {
    /// An access token (`...:access_token` or `...:jwt`): the default.
    #[default]
    Access,
    /// An ID token (`...:id_token`): accepted only for an `exchange`
    /// resource, validated as an ID token for its upstream.
    Id,
}

/// One derive request, after parsing.
#[derive(Debug)]
pub struct DeriveRequest {
    /// The subject token.
    pub subject_token: SecretString,
    /// What it is.
    pub subject_token_type: SubjectTokenType,
    /// The step the orchestrator's code is in.
    pub step: String,
    /// The tool the token is for.
    pub tool: String,
    /// The resource (raw; canonicalised here).
    pub resource: String,
    /// Requested scope (space-separated), if any.
    pub scope: Option<String>,
    /// The DPoP proof.
    pub dpop: Option<SecretString>,
    /// RFC 9396 `authorization_details` describing the call, as sent
    /// (checked against the tool's declarations in the pipeline).
    pub authorization_details: Option<serde_json::Value>,
    /// The tool's DPoP proofs for upstream token endpoints, by upstream
    /// name (`upstream_proofs`; an `exchange` resource's leg).
    pub upstream_proofs: std::collections::BTreeMap<String, SecretString>,
    /// The whole request the token is for (`request`), bound to the token
    /// by its digest (docs/APPROVALS.md, "The request, bound").
    pub request: Option<IntendedRequest>,
    /// Where it came in.
    pub endpoint: Endpoint,
    /// The peer uid.
    pub peer_uid: u32,
}

/// The request a derive says the token is for: what the approval page
/// shows and the token's `req_sha256` binds.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntendedRequest {
    /// The method (`POST`).
    pub method: String,
    /// The raw path from `/`: under the proxy address for a proxied
    /// service (the path `api_base` is followed by), the path at the
    /// resource server for a `self` resource.
    pub path: String,
    /// The raw query, without `?` (empty: none).
    #[serde(default)]
    pub query: String,
    /// The `Content-Type` as it will be sent (empty: none).
    #[serde(default)]
    pub content_type: String,
    /// The body as it will be sent, as text (empty: none).
    #[serde(default)]
    pub body: String,
}

impl IntendedRequest {
    /// The request as the digest reads it.
    pub fn bound(&self) -> credbroker_verify::request::BoundRequest<'_> {
        credbroker_verify::request::BoundRequest {
            method: &self.method,
            path: &self.path,
            query: &self.query,
            content_type: &self.content_type,
            body: self.body.as_bytes(),
        }
    }
}

/// A successful derive.
#[derive(Debug)]
pub struct Issued {
    /// The token.
    pub access_token: SecretString,
    /// Seconds until it expires (for a provider token whose provider gave
    /// no lifetime: `None`).
    pub expires_in: Option<i64>,
    /// Granted scopes, space-separated.
    pub scope: String,
    /// `DPoP` for minted tokens; the provider's `token_type` for provider
    /// tokens.
    pub token_type: std::borrow::Cow<'static, str>,
    /// Whether the token is bound to the tool's DPoP key. Provider tokens
    /// are bearer tokens: `false`.
    pub sender_constrained: bool,
    /// The details the token carries (RFC 9396 section 7: the answer
    /// repeats them).
    pub authorization_details: Option<serde_json::Value>,
}
