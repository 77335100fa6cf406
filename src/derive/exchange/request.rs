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

/// One derive request, after parsing.
#[derive(Debug)]
pub struct DeriveRequest {
    /// The subject token.
    pub subject_token: SecretString,
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
    /// Where it came in.
    pub endpoint: Endpoint,
    /// The peer uid.
    pub peer_uid: u32,
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
