//! An MCP server that lists the person's repositories, getting its token for
//! each call from the credbroker sidecar and relaying the broker's connect
//! link as a URL elicitation in the protocol version the client negotiated.
//!
//! It calls the service through the broker's egress proxy (docs/PROXY.md):
//! the policy gives its tool a `service` resource with `delivery = "proxy"`,
//! whose URI is the proxy's address `{issuer}/proxy/{service}`, and a route
//! for the one call it makes:
//!
//! ```toml
//! [resources."https://broker.example/proxy/github"]
//! source = "service"
//! service = "github"
//! delivery = "proxy"
//!
//! [tools."github.repos"]
//! resource = "https://broker.example/proxy/github"
//! scopes = ["repo"]
//! steps = ["list_repos"]
//! routes = ["GET /user/repos"]
//! ```
//!
//! ```text
//! cargo run --example mcp_repo_server -- \
//!     --listen 127.0.0.1:0 \
//!     --broker-socket /run/credbroker/credbroker.sock --broker-issuer https://broker.example \
//!     --trusted-issuer https://idp.example --jwks-uri https://idp.example/jwks --audience repo-helper \
//!     --step list_repos --tool github.repos --resource https://broker.example/proxy/github \
//!     --api-url https://broker.example/proxy/github/user/repos --service github
//! ```
//!
//! The derive gives this server a credbroker token for the proxy, bound to
//! this server's own DPoP key and good for at most five minutes; each API
//! call carries it with a fresh proof for exactly that method and URL. The
//! person's GitHub token stays in the broker, which adds it upstream. An
//! answer carrying a provider's own bearer token (a policy that still says
//! `delivery = "provider_token"`) is refused and the token dropped unused:
//! this server never holds one.
//!
//! It prints one JSON line `{"url": "http://127.0.0.1:PORT/mcp",
//! "protocol_versions": [...]}` once it listens, then serves MCP over
//! streamable HTTP at `/mcp` (loopback only).
//!
//! A sensitive tool (with `--approval-tool`): `publish_repository` publishes
//! a branch of a repository. Its broker tool needs the person's approval of
//! each call (`approval = "each_call"`, docs/APPROVALS.md), so the derive
//! says what the call does as RFC 9396 `authorization_details`
//! (`[{"type": "repo_publish", "repository": ..., "branch": ...}]`). Until
//! the person approved exactly that call, the broker answers
//! `approval_required` with a link, which this server relays as it relays a
//! connect link (below), under the input key `approve_publish`; the
//! approved token (a `self` resource's, single-use, at most 60 s) goes with
//! one `POST` to `--approval-api-url`.
//!
//! ```toml
//! [tools."github.publish"]
//! resource = "https://publish.example/api"
//! scopes = ["repo.publish"]
//! steps = ["list_repos"]
//! approval = "each_call"
//! require_authorization_details = true
//!
//! [tools."github.publish".authorization_details.repo_publish]
//! repository = { kind = "string", required = true, label = "Repository", log_in_clear = true }
//! branch = { kind = "string", required = true, label = "Branch", log_in_clear = true }
//! ```
//!
//! Protocol versions: exactly the three of [`PROTOCOL_VERSIONS`], the list the
//! start-up line prints and `server/discover` answers. A request that names
//! another version (its `MCP-Protocol-Version` header, or its `_meta` in the
//! 2026-07-28 style) is refused with `-32022` and that list; an `initialize`
//! asking for another version is answered with 2025-11-25, as MCP's version
//! negotiation prescribes, and a client that cannot speak it disconnects.
//!
//! Logs: a link code is a bearer secret until the link is used, and rmcp logs
//! every error it sends (the `-32042` one carries the link) at `warn`, and
//! every result at `debug`. The log writer therefore blanks the code of every
//! `/connect/` link in every line, at every level, whatever `RUST_LOG` says.
//!
//! Transport: streamable HTTP, because the person's access token then comes
//! with every request (MCP authorization), so one server serves many people
//! and each call is for whoever its token names. Over stdio there is no
//! per-request credential: the token would have to come from the process's
//! environment at start, and that process would serve that one person only.
//! This example does not offer stdio.
//!
//! Who the person is: the MCP client sends the person's access token as
//! `Authorization: Bearer` on every HTTP request (MCP authorization). The
//! server verifies it with `credbroker::internals::subject` (issuer, keys, `alg`,
//! `typ` `at+jwt`, audience = the agent, lifetime; ID tokens and
//! sender-constrained tokens refused) and takes (`iss`, `sub`) from it, never
//! from tool arguments. The same token is the subject token of the derive:
//! the sidecar checks it again. It never goes anywhere else: the proxy gets
//! only the token the broker derived, and that token never goes back to the
//! MCP client (only the API's answer does).
//!
//! Refusals with a link:
//! - protocol 2025-06-18 (still spoken by many deployed clients; it has no
//!   URL elicitation): a tool error whose text carries the link, as for a
//!   form-only client below, whatever elicitation the client declared;
//! - protocol 2025-11-25: JSON-RPC error `-32042` with the link in
//!   `data.elicitations[]`; the client opens it and retries by hand;
//! - protocol 2026-07-28: `input_required` with one URL `elicitation/create`
//!   and a `requestState` sealed under this server's key
//!   (`credbroker::client::mcp::StateKey`), bound to this server, the person,
//!   the OAuth client and the exact call, for ten minutes. On the retry the
//!   state is opened first (any failure: `-32602`, nothing else done), then
//!   the server asks the broker again: `accept` only means the person agreed
//!   to open the page, so another `input_required` comes back until the
//!   broker issues a token; `decline`/`cancel` ends the call with a tool error.
//! - a client that did not declare URL elicitation gets a tool error whose
//!   text carries the link.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use credbroker::client::mcp::{self, Binding, RequestState, StateKey};
use credbroker::client::{Answer, Client, DeriveParams, Refusal, Token};
use credbroker::internals::config::{IssuerConfig, JwksSource, SignIn};
use credbroker::internals::jose::{self, Alg, Es256Key};
use credbroker::internals::secret::{SecretBytes, SecretString};
use credbroker::internals::subject::{Person, Validator};
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorCode, ErrorData,
    Implementation, InputRequiredResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServerHandler;

/// The tool that lists repositories.
const TOOL: &str = "list_repositories";
/// The sensitive tool, offered with `--approval-tool`.
const PUBLISH: &str = "publish_repository";
/// The RFC 9396 type of its `authorization_details`.
const PUBLISH_DETAILS: &str = "repo_publish";
/// The input key of its approval link in an `input_required` result.
const APPROVE_KEY: &str = "approve_publish";
/// Answers from the third-party API larger than this are refused.
const MAX_API_BODY: usize = 1024 * 1024;
/// Access tokens larger than this are refused before verification.
const MAX_BEARER: usize = 16 * 1024;
/// JSON answers larger than this are passed on as they are, unread (only
/// `input_required` results are rewritten, and they are small).
const MAX_REWRITE: usize = 64 * 1024;

/// The protocol versions this server serves: printed at start-up, answered
/// by `server/discover`, and the only ones accepted.
const PROTOCOL_VERSIONS: &[ProtocolVersion] = &[
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

#[derive(Debug, Parser)]
#[command(about = "Example MCP server on the credbroker sidecar")]
struct Args {
    /// Address to listen on (loopback).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The broker's orchestrator socket.
    #[arg(long)]
    broker_socket: PathBuf,
    /// The broker's public issuer URL (base of the DPoP `htu`).
    #[arg(long)]
    broker_issuer: String,
    /// The issuer of the people's access tokens (`iss`).
    #[arg(long)]
    trusted_issuer: String,
    /// Its JWKS URI.
    #[arg(long, conflicts_with = "jwks_file")]
    jwks_uri: Option<String>,
    /// Or a pinned JWKS file.
    #[arg(long)]
    jwks_file: Option<PathBuf>,
    /// Accepted `alg`s of the access tokens.
    #[arg(long, value_delimiter = ',', default_value = "ES256,RS256")]
    algs: Vec<String>,
    /// The audience the access tokens must carry: the agent's name.
    #[arg(long)]
    audience: String,
    /// The step declared to the broker.
    #[arg(long)]
    step: String,
    /// The tool name declared to the broker.
    #[arg(long)]
    tool: String,
    /// The resource to derive a token for: the proxy's address for the
    /// service, `{broker issuer}/proxy/{service}`.
    #[arg(long)]
    resource: String,
    /// Scope to ask for (space-separated); the policy's when absent.
    #[arg(long)]
    scope: Option<String>,
    /// The URL that lists the person's repositories (GET): the proxy's
    /// address followed by the API's path; defaults to the resource.
    #[arg(long)]
    api_url: Option<String>,
    /// The service's short name, used in the input request's key (`connect_<service>`).
    #[arg(long, default_value = "service")]
    service: String,
    /// Lifetime of a `requestState` in seconds, from 1 to 600 (anything
    /// else is refused at start-up).
    #[arg(long, default_value_t = mcp::STATE_TTL)]
    state_ttl: i64,
    /// A file (0600) with at least 32 secret bytes for `requestState`; a random
    /// process-local key when absent.
    #[arg(long)]
    state_key_file: Option<PathBuf>,
    /// The broker tool of the sensitive `publish_repository` (one that needs
    /// approval); the MCP tool is offered only with it.
    #[arg(long, requires = "approval_resource")]
    approval_tool: Option<String>,
    /// Its resource (a `self` resource of the broker).
    #[arg(long, requires = "approval_tool")]
    approval_resource: Option<String>,
    /// The URL the approved call is POSTed to; defaults to its resource.
    #[arg(long, requires = "approval_tool")]
    approval_api_url: Option<String>,
}

/// The sensitive tool's broker side.
struct Sensitive {
    tool: String,
    resource: String,
    api_url: String,
}

/// The verified caller of one HTTP request, put into the request's
/// extensions by the HTTP front and read by the tool.
#[derive(Clone)]
struct Caller {
    person: Person,
    /// `client_id` (or `azp`) of the access token, when present.
    client: Option<String>,
    /// The access token itself: the subject token of the derive, nothing else.
    token: Arc<SecretString>,
}

struct Inner {
    broker: Client,
    dpop_key: Es256Key,
    state_key: StateKey,
    http: reqwest::Client,
    /// This server's identity (its MCP URL): the `aud` of its states.
    me: String,
    step: String,
    tool: String,
    resource: String,
    scope: Option<String>,
    api_url: String,
    input_key: String,
    state_ttl: i64,
    sensitive: Option<Sensitive>,
    /// The last DPoP nonce the broker's proxy handed out, sent with the
    /// next calls until it asks for another (RFC 9449 section 8).
    proxy_nonce: std::sync::Mutex<Option<String>>,
}

#[derive(Clone)]
struct RepoServer(Arc<Inner>);

fn now() -> i64 {
    credbroker::internals::clock::Clock::now(&credbroker::internals::clock::SystemClock)
}

fn tool_def() -> Tool {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "limit": {"type": "integer", "minimum": 1, "maximum": 100,
                      "description": "Return at most this many repositories."}
        },
        "additionalProperties": false
    });
    let schema = match schema {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    Tool::new(
        TOOL,
        "Lists the repositories of the signed-in person at the connected service.",
        Arc::new(schema),
    )
}

fn publish_def() -> Tool {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "repository": {"type": "string", "minLength": 1, "maxLength": 200,
                           "description": "owner/name of the repository."},
            "branch": {"type": "string", "minLength": 1, "maxLength": 200,
                       "description": "The branch to publish."}
        },
        "required": ["repository", "branch"],
        "additionalProperties": false
    });
    let schema = match schema {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    Tool::new(
        PUBLISH,
        "Publishes a branch of a repository. The person approves each call on the broker's pages first.",
        Arc::new(schema),
    )
}

fn text_error(msg: impl Into<String>) -> CallToolResponse {
    CallToolResult::error(vec![ContentBlock::text(msg.into())]).into()
}

/// The library's one answer to a refused `requestState`, as rmcp's error.
fn rejected_state() -> ErrorData {
    let e = mcp::state_rejected_error();
    let message = e["message"].as_str().unwrap_or_default().to_owned();
    ErrorData::new(
        ErrorCode(mcp::INVALID_PARAMS as i32),
        message,
        e.get("data").cloned(),
    )
}

/// What every call starts from: who asks, in which protocol, and whether a
/// retry's `requestState` said the person declined.
struct Start {
    caller: Caller,
    modern: bool,
    url_capable: bool,
    call: String,
    declined: bool,
}

impl Start {
    fn binding<'a>(&'a self, me: &'a str) -> Binding<'a> {
        Binding {
            aud: me,
            iss: &self.caller.person.iss,
            sub: &self.caller.person.sub,
            client: self.caller.client.as_deref(),
            call: &self.call,
        }
    }
}

impl RepoServer {
    /// The caller, the protocol, and a retry's state opened (any failure:
    /// `-32602`, nothing else done), for a call whose input key is `key`.
    fn start(
        &self,
        request: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
        key: &str,
    ) -> Result<Start, ErrorData> {
        let me = &self.0;
        // Identity: only from the access token the HTTP front verified.
        let caller = ctx
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<Caller>())
            .cloned()
            .ok_or_else(|| ErrorData::internal_error("no verified caller", None))?;
        let modern = ctx
            .protocol_version()
            .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
        // URL elicitation exists from 2025-11-25 on: a 2025-06-18 session
        // is form-only whatever its client declared.
        let url_capable = ctx
            .protocol_version()
            .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2025_11_25.as_str())
            && ctx
                .client_capabilities()
                .and_then(|c| c.elicitation)
                .is_some_and(|e| e.url.is_some());

        let args = request.arguments.clone().map(serde_json::Value::Object);
        let call = mcp::call_hash("tools/call", &request.name, args.as_ref());
        let mut start = Start {
            caller,
            modern,
            url_capable,
            call,
            declined: false,
        };

        // A retry: the state must be ours, for this person and this call,
        // and fresh, before anything else happens.
        match (&request.request_state, &request.input_responses) {
            (Some(state), responses) => {
                if !modern {
                    return Err(rejected_state());
                }
                if let Err(e) = me.state_key.open(state, &start.binding(&me.me), now()) {
                    tracing::warn!(reason = %e, "requestState refused");
                    return Err(rejected_state());
                }
                let action = responses
                    .as_ref()
                    .and_then(|r| r.get(key))
                    .and_then(|r| r.get("action"))
                    .and_then(|a| a.as_str());
                start.declined = matches!(action, Some("decline" | "cancel"));
            }
            (None, Some(_)) => return Err(rejected_state()),
            (None, None) => {}
        }
        Ok(start)
    }

    async fn list(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let me = &self.0;
        let start = self.start(&request, &ctx, &me.input_key)?;
        let args = request.arguments.clone().map(serde_json::Value::Object);

        // The only argument is `limit`: anything else (a user name, an
        // account) is refused, so that nobody mistakes an argument for the
        // identity, which comes from the token alone.
        if let Some(unknown) = request
            .arguments
            .as_ref()
            .and_then(|a| a.keys().find(|k| *k != "limit"))
        {
            return Err(ErrorData::invalid_params(
                format!("unknown argument {unknown}"),
                None,
            ));
        }
        let limit = match args.as_ref().and_then(|a| a.get("limit")) {
            None => None,
            Some(v) => match v.as_u64() {
                Some(n @ 1..=100) => Some(n as usize),
                _ => {
                    return Err(ErrorData::invalid_params(
                        "limit must be an integer from 1 to 100",
                        None,
                    ))
                }
            },
        };

        let answer = me
            .broker
            .derive(
                &DeriveParams {
                    subject_token: start.caller.token.expose(),
                    step: &me.step,
                    tool: &me.tool,
                    resource: &me.resource,
                    scope: me.scope.as_deref(),
                },
                &me.dpop_key,
            )
            .await;
        match answer {
            Ok(Answer::Issued(token)) => Ok(self.call_api(&token, limit).await),
            Ok(Answer::Refused(refusal)) => self.relay(&refusal, &start, &me.input_key),
            Err(e) => {
                tracing::warn!(error = %e, "broker unreachable");
                Ok(text_error(
                    "The credential broker is unavailable; try again later.",
                ))
            }
        }
    }

    /// Turns a refusal into what the negotiated protocol expects; a link
    /// (connect or approval) goes under the input key `key`.
    fn relay(
        &self,
        refusal: &Refusal,
        start: &Start,
        key: &str,
    ) -> Result<CallToolResponse, ErrorData> {
        let (modern, url_capable, declined) = (start.modern, start.url_capable, start.declined);
        let binding = start.binding(&self.0.me);
        let Some(link) = refusal.link() else {
            // A policy denial or a bad request: nothing the person can fix
            // from here. Only the codes, never anything token-derived.
            return Ok(text_error(format!(
                "The credential broker refused: {} ({}).",
                refusal.error,
                refusal.reason.as_deref().unwrap_or("no reason given")
            )));
        };
        if declined {
            return Ok(text_error(format!(
                "Not done: the request to open the link was declined. {}",
                mcp::message_with_link(&link)
            )));
        }
        if !url_capable {
            // Form-only clients: the link as plain text.
            return Ok(text_error(mcp::message_with_link(&link)));
        }
        if modern {
            let state = RequestState::with_ttl(&binding, link.id, now(), self.0.state_ttl);
            let sealed = self.0.state_key.seal(&state);
            let value = mcp::input_required_result(&link, key, &sealed);
            let result: InputRequiredResult = serde_json::from_value(value)
                .map_err(|_| ErrorData::internal_error("could not build input_required", None))?;
            Ok(result.into())
        } else {
            let e = mcp::url_elicitation_error(&link);
            let message = e["message"].as_str().unwrap_or(link.message).to_owned();
            Err(ErrorData::new(
                ErrorCode(mcp::URL_ELICITATION_REQUIRED as i32),
                message,
                e.get("data").cloned(),
            ))
        }
    }

    /// `publish_repository`: the derive describes the call, so the person
    /// approves exactly it; the approved token goes with one POST.
    async fn publish(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let me = &self.0;
        let Some(sensitive) = &me.sensitive else {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {PUBLISH}"),
                None,
            ));
        };
        let start = self.start(&request, &ctx, APPROVE_KEY)?;
        let args = request.arguments.clone().unwrap_or_default();
        if let Some(unknown) = args.keys().find(|k| *k != "repository" && *k != "branch") {
            return Err(ErrorData::invalid_params(
                format!("unknown argument {unknown}"),
                None,
            ));
        }
        let field = |k: &str| {
            args.get(k)
                .and_then(|v| v.as_str())
                .filter(|v| !v.is_empty() && v.len() <= 200)
                .map(str::to_owned)
        };
        let (Some(repository), Some(branch)) = (field("repository"), field("branch")) else {
            return Err(ErrorData::invalid_params(
                "repository and branch are required strings of 1 to 200 characters",
                None,
            ));
        };
        // What the person sees and approves: exactly the call's arguments.
        let details = serde_json::json!([{
            "type": PUBLISH_DETAILS, "repository": repository, "branch": branch,
        }]);
        // A fresh proof, and the broker's nonce followed when it asks for
        // one, as for the other tool.
        let answer = me
            .broker
            .derive_for_details(
                &DeriveParams {
                    subject_token: start.caller.token.expose(),
                    step: &me.step,
                    tool: &sensitive.tool,
                    resource: &sensitive.resource,
                    scope: None,
                },
                Some(&details),
                &me.dpop_key,
            )
            .await;
        match answer {
            Ok(Answer::Issued(token)) => {
                let body = serde_json::json!({"repository": repository, "branch": branch});
                Ok(self
                    .send(&token, "POST", &sensitive.api_url, Some(body))
                    .await
                    .map_or_else(text_error, |answer| {
                        let out = serde_json::json!({ "published": answer });
                        let mut r =
                            CallToolResult::success(vec![ContentBlock::text(out.to_string())]);
                        r.structured_content = Some(out);
                        r.into()
                    }))
            }
            Ok(Answer::Refused(refusal)) => self.relay(&refusal, &start, APPROVE_KEY),
            Err(e) => {
                tracing::warn!(error = %e, "broker unreachable");
                Ok(text_error(
                    "The credential broker is unavailable; try again later.",
                ))
            }
        }
    }

    /// One call with a DPoP-bound token and a fresh proof: the API's JSON
    /// answer, or what to tell the MCP client. The token is never in it.
    async fn send(
        &self,
        token: &Token,
        method: &str,
        url: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, String> {
        let me = &self.0;
        if !token.token_type.eq_ignore_ascii_case("dpop") || token.sender_constrained == Some(false)
        {
            // The policy hands the provider's own token to this tool: it is
            // not sent anywhere (the struct holding it is dropped with the
            // answer), and the message says what to change.
            tracing::warn!("the broker handed over a provider token; refused unused");
            return Err(
                "The credential broker handed this server the service's own token; \
                 this server calls the service only through the broker's proxy (policy: \
                 delivery = \"proxy\" for its resource)."
                    .into(),
            );
        }
        let at = token.access_token.expose();
        let htu = url.split(['?', '#']).next().unwrap_or(url);
        let m =
            http::Method::from_bytes(method.as_bytes()).map_err(|_| "bad method".to_string())?;
        // A fresh proof, with the proxy's last nonce when it requires DPoP
        // nonces; when it asks for a new one (`use_dpop_nonce`, before
        // anything goes upstream), the call is made once more with it.
        let mut nonce = me
            .proxy_nonce
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut attempt = 0;
        let mut resp = loop {
            attempt += 1;
            let proof = credbroker::client::proof_with_nonce(
                &me.dpop_key,
                method,
                htu,
                Some(at),
                nonce.as_deref(),
            )
            .map_err(|_| "Could not make a DPoP proof.".to_string())?;
            let mut req = me
                .http
                .request(m.clone(), url)
                .header("authorization", format!("DPoP {at}"))
                .header("dpop", proof)
                .header("accept", "application/json");
            if let Some(b) = &body {
                req = req.json(b);
            }
            let resp = req
                .send()
                .await
                .map_err(|_| "The API is unreachable.".to_string())?;
            match nonce_challenge(&resp) {
                Some(n) if attempt == 1 => {
                    *me.proxy_nonce.lock().unwrap_or_else(|p| p.into_inner()) = Some(n.clone());
                    nonce = Some(n);
                }
                _ => break resp,
            }
        };
        let status = resp.status();
        if !status.is_success() {
            return Err(format!("The API answered HTTP {}.", status.as_u16()));
        }
        // Read at most MAX_API_BODY, whatever the headers claim.
        let mut bytes = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(c)) if bytes.len() + c.len() <= MAX_API_BODY => bytes.extend_from_slice(&c),
                Ok(None) => break,
                _ => return Err("The API answered too much, or broke off.".into()),
            }
        }
        // Whatever goes back to the MCP client must not carry the token,
        // even if the API echoed it.
        if at.is_empty() || bytes.windows(at.len()).any(|w| w == at.as_bytes()) {
            tracing::warn!("the API echoed the token; its answer is withheld");
            return Err("The API's answer was withheld.".into());
        }
        serde_json::from_slice(&bytes).map_err(|_| "The API did not answer JSON.".to_string())
    }

    /// Calls the API through the proxy with the derived token and a fresh
    /// proof from this server's key, and returns the API's answer, never the
    /// token.
    async fn call_api(&self, token: &Token, limit: Option<usize>) -> CallToolResponse {
        let parsed = match self.send(token, "GET", &self.0.api_url, None).await {
            Ok(v) => v,
            Err(why) => return text_error(why),
        };
        // Accept a bare list or {"repositories": [...]}.
        let mut repos = match parsed {
            serde_json::Value::Array(a) => a,
            serde_json::Value::Object(mut o) => match o.remove("repositories") {
                Some(serde_json::Value::Array(a)) => a,
                _ => return text_error("The API answered an unexpected shape."),
            },
            _ => return text_error("The API answered an unexpected shape."),
        };
        if let Some(n) = limit {
            repos.truncate(n);
        }
        let out = serde_json::json!({ "repositories": repos });
        let mut result = CallToolResult::success(vec![ContentBlock::text(out.to_string())]);
        result.structured_content = Some(out);
        result.into()
    }
}

impl ServerHandler for RepoServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_protocol_version(ProtocolVersion::V_2026_07_28)
            .with_server_info(Implementation::new(
                "credbroker-mcp-repo-server",
                env!("CARGO_PKG_VERSION"),
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools = vec![tool_def()];
        if self.0.sensitive.is_some() {
            tools.push(publish_def());
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(PROTOCOL_VERSIONS)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        match name {
            TOOL => Some(tool_def()),
            PUBLISH if self.0.sensitive.is_some() => Some(publish_def()),
            _ => None,
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match request.name.as_ref() {
            TOOL => self.list(request, ctx).await,
            PUBLISH if self.0.sensitive.is_some() => self.publish(request, ctx).await,
            _ => Err(ErrorData::invalid_params(
                format!("unknown tool {}", request.name),
                None,
            )),
        }
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn plain(
    status: StatusCode,
    headers: &[(&str, String)],
    body: serde_json::Value,
) -> Response<Body> {
    let mut r = Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("cache-control", "no-store");
    for (k, v) in headers {
        r = r.header(*k, v.as_str());
    }
    r.body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// The HTTP front: protected-resource metadata (RFC 9728), and a verified
/// bearer token on every MCP request.
struct Front {
    validator: Validator,
    mcp: TowerToHyperService<StreamableHttpService<RepoServer, LocalSessionManager>>,
    me: String,
    metadata_url: String,
    trusted_issuer: String,
}

impl Front {
    async fn handle(
        self: Arc<Self>,
        mut req: Request<Incoming>,
    ) -> Result<Response<Body>, Infallible> {
        if req
            .uri()
            .path()
            .starts_with("/.well-known/oauth-protected-resource")
        {
            return Ok(plain(
                StatusCode::OK,
                &[],
                serde_json::json!({
                    "resource": self.me,
                    "authorization_servers": [self.trusted_issuer],
                    "bearer_methods_supported": ["header"],
                }),
            ));
        }
        if req.uri().path() != "/mcp" {
            return Ok(plain(
                StatusCode::NOT_FOUND,
                &[],
                serde_json::json!({"error": "not_found"}),
            ));
        }
        let challenge = |error: &str| {
            plain(
                StatusCode::UNAUTHORIZED,
                &[(
                    "www-authenticate",
                    format!(
                        r#"Bearer error="{error}", resource_metadata="{}""#,
                        self.metadata_url
                    ),
                )],
                serde_json::json!({"error": error}),
            )
        };
        let token = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim().to_owned());
        let Some(token) = token.filter(|t| !t.is_empty() && t.len() <= MAX_BEARER) else {
            return Ok(challenge("invalid_request"));
        };
        let subject = match self.validator.validate(&token, now()).await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::info!(reason = %e, "access token refused");
                return Ok(challenge("invalid_token"));
            }
        };
        // The token verified: its claims can be read for the OAuth client.
        let client = token
            .split('.')
            .nth(1)
            .and_then(|p| jose::b64d(p, "payload").ok())
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|c| {
                c.get("client_id")
                    .or_else(|| c.get("azp"))
                    .and_then(|v| v.as_str())
                    .map(str::to_owned)
            });
        req.extensions_mut().insert(Caller {
            person: subject.person,
            client,
            token: Arc::new(SecretString::new(token)),
        });
        // rmcp checks this header only against every version it knows.
        if let Some(v) = req.headers().get("mcp-protocol-version") {
            let v = v.to_str().unwrap_or_default();
            if !PROTOCOL_VERSIONS.iter().any(|p| p.as_str() == v) {
                return Ok(unsupported_version(v));
            }
        }
        let resp = hyper::service::Service::call(&self.mcp, req).await?;
        Ok(without_elicitation_id(resp).await)
    }
}

/// The answer to a request naming a protocol version this server does not
/// serve: rmcp's own `-32022` error, with this server's list.
fn unsupported_version(requested: &str) -> Response<Body> {
    let supported: Vec<&str> = PROTOCOL_VERSIONS.iter().map(|v| v.as_str()).collect();
    let e = ErrorData::new(
        ErrorCode::UNSUPPORTED_PROTOCOL_VERSION,
        "Unsupported protocol version",
        Some(serde_json::json!({"requested": requested, "supported": supported})),
    );
    plain(
        StatusCode::BAD_REQUEST,
        &[],
        serde_json::json!({"jsonrpc": "2.0", "id": null, "error": e}),
    )
}

/// Protocol 2026-07-28 removed `elicitationId` from URL elicitation
/// requests, but rmcp 3.11 always writes one (`""`) into every
/// `input_required` result. Such results are plain JSON answers (never SSE
/// in 2026-07-28), so the field is taken out here; every other answer
/// passes unchanged.
async fn without_elicitation_id(resp: Response<Body>) -> Response<Body> {
    let json = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let small = hyper::body::Body::size_hint(resp.body())
        .upper()
        .is_some_and(|n| n <= MAX_REWRITE as u64);
    if !json || !small {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = body.collect().await.map(|c| c.to_bytes());
    let mut v: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(_) => return Response::from_parts(parts, Full::new(bytes).boxed()),
    };
    let result = &mut v["result"];
    if result["resultType"] != "input_required" {
        return Response::from_parts(parts, Full::new(bytes).boxed());
    }
    if let Some(requests) = result
        .get_mut("inputRequests")
        .and_then(|r| r.as_object_mut())
    {
        for r in requests.values_mut() {
            if let Some(params) = r.get_mut("params").and_then(|p| p.as_object_mut()) {
                if params.get("mode").is_some_and(|m| m == "url") {
                    params.remove("elicitationId");
                }
            }
        }
    }
    parts.headers.remove("content-length");
    Response::from_parts(parts, Full::new(Bytes::from(v.to_string())).boxed())
}

/// Blanks the code of every `/connect/` link in `line`: the code is the
/// run of base64url characters after the prefix.
fn redact_links(line: &str) -> std::borrow::Cow<'_, str> {
    const PREFIX: &str = "/connect/";
    if !line.contains(PREFIX) {
        return std::borrow::Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(i) = rest.find(PREFIX) {
        let (head, tail) = rest.split_at(i + PREFIX.len());
        out.push_str(head);
        let code_len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(tail.len());
        if code_len > 0 {
            out.push_str("[REDACTED]");
        }
        rest = &tail[code_len..];
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// The log's writer: each event is formatted into one buffer, and written
/// to stderr with its link codes blanked when the buffer is dropped.
struct RedactingStderr;

/// One event's bytes.
struct EventBuffer(Vec<u8>);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RedactingStderr {
    type Writer = EventBuffer;
    fn make_writer(&'a self) -> EventBuffer {
        EventBuffer(Vec::new())
    }
}

impl std::io::Write for EventBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventBuffer {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.0);
        let _ = std::io::Write::write_all(
            &mut std::io::stderr().lock(),
            redact_links(&text).as_bytes(),
        );
    }
}

fn read_state_key(path: &std::path::Path) -> Result<StateKey, Box<dyn std::error::Error>> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{}: must not be readable by group or others (chmod 600)",
            path.display()
        )
        .into());
    }
    let bytes = SecretBytes::new(std::fs::read(path)?);
    Ok(StateKey::new(&bytes)?)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(RedactingStderr)
        .init();
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    // Refused rather than shortened: a lifetime other than the one asked
    // for would surprise whoever set it.
    if !(1..=mcp::STATE_TTL).contains(&args.state_ttl) {
        return Err(format!(
            "--state-ttl {}: a requestState lives from 1 to {} seconds (ten minutes at most); give a value in that range",
            args.state_ttl,
            mcp::STATE_TTL
        )
        .into());
    }

    let jwks = match (&args.jwks_uri, &args.jwks_file) {
        (Some(u), None) => JwksSource::Uri(u.clone()),
        (None, Some(f)) => JwksSource::File(f.clone()),
        _ => return Err("give exactly one of --jwks-uri and --jwks-file".into()),
    };
    let algs = args
        .algs
        .iter()
        .map(|a| Alg::parse(a).map_err(|_| format!("unknown alg {a}")))
        .collect::<Result<Vec<_>, _>>()?;
    let issuer_cfg = IssuerConfig {
        issuer: args.trusted_issuer.clone(),
        audience: args.audience.clone(),
        jwks,
        algs,
        token_types: vec!["at+jwt".into()],
        required_claims: vec![],
        // Not used here: the pages of the broker sign people in.
        sign_in: SignIn::Local,
        display_name: String::new(),
        // The example checks subject tokens by their signature only.
        introspection: None,
    };
    let validator = Validator::new(std::slice::from_ref(&issuer_cfg), Box::new(|_| false)).await?;

    let state_key = match &args.state_key_file {
        Some(p) => read_state_key(p)?,
        None => StateKey::generate()?,
    };
    let (dpop_key, _pkcs8) = Es256Key::generate()?;

    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    let me = format!("http://{addr}/mcp");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(3))
        // A redirect would carry the token to an address nobody chose.
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let inner = Arc::new(Inner {
        broker: Client::new(&args.broker_socket, &args.broker_issuer),
        sensitive: match (args.approval_tool, args.approval_resource) {
            (Some(tool), Some(resource)) => Some(Sensitive {
                api_url: args.approval_api_url.unwrap_or_else(|| resource.clone()),
                tool,
                resource,
            }),
            _ => None,
        },
        dpop_key,
        state_key,
        http,
        me: me.clone(),
        step: args.step,
        tool: args.tool,
        api_url: args.api_url.unwrap_or_else(|| args.resource.clone()),
        resource: args.resource,
        scope: args.scope,
        input_key: format!("connect_{}", args.service),
        state_ttl: args.state_ttl,
        proxy_nonce: std::sync::Mutex::new(None),
    });
    let server = RepoServer(inner);
    let mcp = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default()
            .with_sse_keep_alive(None)
            // Plain JSON answers where no notification precedes them (always
            // stateless in 2026-07-28; legacy sessions keep SSE).
            .with_json_response(true),
    );
    let front = Arc::new(Front {
        validator,
        mcp: TowerToHyperService::new(mcp),
        metadata_url: format!("http://{addr}/.well-known/oauth-protected-resource/mcp"),
        me: me.clone(),
        trusted_issuer: args.trusted_issuer,
    });
    let versions: Vec<&str> = PROTOCOL_VERSIONS.iter().map(|v| v.as_str()).collect();
    println!(
        "{}",
        serde_json::json!({ "url": me, "protocol_versions": versions })
    );

    loop {
        let (stream, _) = listener.accept().await?;
        let front = front.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| front.clone().handle(req));
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
}

/// The nonce of a `use_dpop_nonce` challenge (RFC 9449 section 9: 401,
/// `WWW-Authenticate: DPoP error="use_dpop_nonce"`, `DPoP-Nonce`), if
/// `resp` is one.
fn nonce_challenge(resp: &reqwest::Response) -> Option<String> {
    let challenged = resp.status() == reqwest::StatusCode::UNAUTHORIZED
        && resp
            .headers()
            .get_all("www-authenticate")
            .iter()
            .any(|v| v.to_str().is_ok_and(|v| v.contains("use_dpop_nonce")));
    challenged
        .then(|| {
            resp.headers()
                .get("dpop-nonce")?
                .to_str()
                .ok()
                .map(str::to_owned)
        })
        .flatten()
}
