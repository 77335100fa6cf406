//! The egress proxy end to end (issue 11): the real broker binary, the
//! `oidc-provider` peer as the service's authorization server, and a
//! stand-in for the service's API that accepts only the provider's real
//! tokens (introspection) and records every request. A tool derives a
//! proxy token and calls the service through `{issuer}/proxy/acme/...`.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub(crate) mod approvals;
mod audience;
mod audit;
mod bound;
mod challenge;
mod check_order;
mod cli_proof;
mod env_proxy;
mod expiry;
mod framing;
mod limits;
mod refusals;
mod retry;
pub(crate) mod rotation;
mod shutdown;

use credbroker::internals::jose::Es256Key;

use crate::support::api_standin::{pattern, ApiStandin};
use crate::support::oidc::CLIENT_ID;
use crate::support::services::{issued, refused, ProviderOpts, ServiceEnv};
use crate::support::*;

/// The proxy address of `acme` under the test brokers' issuer.
pub(crate) const PROXY: &str = "http://127.0.0.1:0/proxy/acme";

/// The quick-start policy plus `acme` through the proxy: a reading tool and
/// a writing one whose one route is limited to step `open_pr`.
pub(crate) fn proxy_policy(read_routes: &str) -> String {
    format!(
        r#"{}
[resources."{PROXY}"]
source = "service"
service = "acme"
delivery = "proxy"

[tools."acme.read"]
resource = "{PROXY}"
scopes = ["repo"]
steps = ["triage"]
routes = [{read_routes}]

[tools."acme.write"]
resource = "{PROXY}"
scopes = ["repo"]
steps = ["triage", "open_pr"]
routes = [{{ route = "POST /repos/{{owner}}/{{repo}}/pulls", steps = ["open_pr"] }}]
"#,
        credbroker::internals::cli::QUICKSTART_POLICY
    )
}

pub(crate) const READ_ROUTES: &str = r#""GET /user", "GET /repos/{owner}/{repo}/issues", "GET /download/{mib}", "GET /stream", "GET /echo/{kind}", "GET /redirect", "GET /hang""#;

/// Broker, provider, the API stand-in, and a host the stand-in redirects
/// to (a second stand-in, which must never be called).
pub(crate) struct ProxyEnv {
    pub env: ServiceEnv,
    pub api: ApiStandin,
    pub other: ApiStandin,
    pub key: Es256Key,
    pub http: reqwest::Client,
}

impl ProxyEnv {
    /// Starts everything (`proxy_keys` go in the `[proxy]` table) and connects alice's `octo-alice` account through
    /// the real pages, so derives for the proxy are issued.
    pub(crate) async fn start(proxy_keys: &str) -> ProxyEnv {
        ProxyEnv::start_with(proxy_keys, ProviderOpts::default()).await
    }

    /// [`ProxyEnv::start`] with more of the service's options (`extra_config`
    /// is set here; `policy` defaults to [`proxy_policy`] with [`READ_ROUTES`]).
    pub(crate) async fn start_with(proxy_keys: &str, opts: ProviderOpts) -> ProxyEnv {
        let api_listener = ApiStandin::bind();
        let other_listener = ApiStandin::bind();
        let api_base = format!("http://{}", api_listener.local_addr().unwrap());
        let other_base = format!("http://{}", other_listener.local_addr().unwrap());
        let mut env = ServiceEnv::start_with(ProviderOpts {
            policy: Some(
                opts.policy
                    .clone()
                    .unwrap_or_else(|| proxy_policy(READ_ROUTES)),
            ),
            // Leading keys land in [providers.acme]; then the proxy's table.
            extra_config: format!("api_base = \"{api_base}\"\n\n[proxy]\n{proxy_keys}\n"),
            // Other services call the same stand-in.
            more_services_keys: format!("api_base = \"{api_base}\"\n"),
            ..opts
        });
        let http = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let introspection = ApiStandin::introspection_of(&env.peer.issuer).await;
        let api = ApiStandin::start(
            api_listener,
            introspection.clone(),
            CLIENT_ID.into(),
            env.client_secret.clone(),
            format!("{other_base}/steal"),
        )
        .await;
        let other = ApiStandin::start(
            other_listener,
            introspection,
            CLIENT_ID.into(),
            env.client_secret.clone(),
            String::new(),
        )
        .await;
        let key = key();
        let r = refused(
            env.broker
                .derive(
                    &key,
                    &env.broker.subject_token("alice"),
                    "triage",
                    "acme.read",
                    PROXY,
                    None,
                )
                .await,
        );
        assert_eq!(r.reason.as_deref(), Some("connect_required"), "{r:?}");
        env.play_pages(&r.connect_uri.unwrap(), "alice", "octo-alice")
            .await;
        ProxyEnv {
            env,
            api,
            other,
            key,
            http,
        }
    }

    /// A proxy token for `tool` in `step`.
    pub(crate) async fn token(&self, tool: &str, step: &str) -> String {
        let b = &self.env.broker;
        let t = issued(
            b.derive(
                &self.key,
                &b.subject_token("alice"),
                step,
                tool,
                PROXY,
                None,
            )
            .await,
        );
        assert_eq!(t.token_type, "DPoP");
        t.access_token.expose().clone()
    }

    /// A proof for `method` on `path` (no query) under the issuer, made
    /// by the embedding client's proof builder, as a tool would.
    pub(crate) fn proof(&self, token: &str, method: &str, path: &str) -> String {
        let htu = format!("{}{path}", self.env.broker.issuer);
        credbroker::client::proof(&self.key, method, &htu, Some(token)).unwrap()
    }

    /// The tool's call: `path_and_query` under `/proxy/acme`, with the
    /// token and a fresh proof.
    pub(crate) async fn call(
        &self,
        token: &str,
        method: &str,
        path_and_query: &str,
        body: Option<Vec<u8>>,
    ) -> reqwest::Response {
        let full = format!("/proxy/acme{path_and_query}");
        let path = full.split('?').next().unwrap();
        let proof = self.proof(token, method, path);
        self.send(method, &full, &format!("DPoP {token}"), &proof, body)
            .await
    }

    /// A request as given.
    pub(crate) async fn send(
        &self,
        method: &str,
        path_and_query: &str,
        authorization: &str,
        proof: &str,
        body: Option<Vec<u8>>,
    ) -> reqwest::Response {
        let mut rb = self
            .http
            .request(
                method.parse().unwrap(),
                format!("{}{path_and_query}", self.env.broker.public),
            )
            .header("authorization", authorization)
            .header("dpop", proof)
            .header("user-agent", "acme-tool/1.0")
            .header("cookie", "pages_session=must-not-travel");
        if let Some(b) = body {
            rb = rb.header("content-type", "application/json").body(b);
        }
        rb.send().await.unwrap()
    }

    /// The provider's access and refresh tokens issued so far.
    pub(crate) async fn provider_tokens(&self) -> Vec<String> {
        self.env.peer.issued_tokens().await
    }
}

/// The JSON body of a refusal, with its status.
/// The broker's own refusals are held to proto/refusal.schema.json.
pub(crate) async fn refusal(r: reqwest::Response) -> (u16, serde_json::Value) {
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    crate::support::contract::check_answer(
        status,
        |name| headers.get(name).and_then(|v| v.to_str().ok()),
        &text,
        "a proxied call",
    );
    (status, serde_json::from_str(&text).unwrap())
}

#[tokio::test]
async fn allowed_calls_are_served_and_the_provider_token_never_leaves_the_broker() {
    let p = ProxyEnv::start("").await;
    let read = p.token("acme.read", "triage").await;
    let claims = claims_of(&read);
    assert_eq!(claims["aud"], PROXY, "aud is the proxy address");
    assert_eq!(claims["act"]["step"], "triage");
    assert_eq!(claims["act"]["tool"], "acme.read");
    assert!(claims["cnf"]["jkt"].is_string());
    let life = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert!(life > 0 && life <= 300, "{life}");

    let mut answers: Vec<String> = Vec::new();

    // GET with a query.
    let r = p
        .call(
            &read,
            "GET",
            "/repos/octo/hello/issues?state=open&page=2",
            None,
        )
        .await;
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-security-policy"], "sandbox; default-src 'none'");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert!(
        h.get("set-cookie").is_none(),
        "the provider's cookie stays out"
    );
    answers.push(format!("{h:?}"));
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["repo"], "octo/hello");
    assert_eq!(v["query"], "state=open&page=2");

    // GET /user: the stand-in saw the provider's own token for octo-alice.
    let r = p.call(&read, "GET", "/user", None).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("login"), "{text}");
    answers.push(text);

    // POST with a body, by the writing tool in its step.
    let write = p.token("acme.write", "open_pr").await;
    let body = serde_json::json!({"title": "x".repeat(4000), "head": "f", "base": "main"})
        .to_string()
        .into_bytes();
    let r = p
        .call(
            &write,
            "POST",
            "/repos/octo/hello/pulls",
            Some(body.clone()),
        )
        .await;
    assert_eq!(r.status(), 201);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["received"], body.len());
    answers.push(v.to_string());

    // A 10 MiB download, whole and in order.
    let r = p.call(&read, "GET", "/download/10", None).await;
    assert_eq!(r.status(), 200);
    let bytes = r.bytes().await.unwrap();
    assert_eq!(bytes.len(), 10 * 1024 * 1024);
    assert!(
        bytes[..] == pattern(10 * 1024 * 1024)[..],
        "the download arrived intact"
    );

    // A streamed answer (chunked, no length).
    let r = p.call(&read, "GET", "/stream", None).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert_eq!(text, "chunk 0\nchunk 1\nchunk 2\nchunk 3\nchunk 4\n");

    // What the stand-in received: only calls with a live provider token,
    // never the credbroker token, the proof, or the tool's cookie.
    let records = p.api.records();
    assert_eq!(records.len(), 5, "{records:?}");
    for rec in &records {
        assert!(rec.authorized, "{rec:?}");
        assert!(rec.header("authorization").unwrap().starts_with("Bearer "));
        assert_eq!(rec.header("accept-encoding"), Some("identity"));
        assert_eq!(rec.header("user-agent"), Some("acme-tool/1.0"));
        assert!(
            rec.header("dpop").is_none() && rec.header("cookie").is_none(),
            "{rec:?}"
        );
        for (k, v) in &rec.headers {
            assert!(
                !v.contains(&read) && !v.contains(&write),
                "credbroker token in {k}"
            );
        }
    }
    assert_eq!(records[4].path, "/stream");
    assert_eq!(records[0].query.as_deref(), Some("state=open&page=2"));
    // Nothing but the allowlist and what the proxy adds: no header of the
    // HTTP client's own. A GET carries no length, the POST its body's.
    const SENT: [&str; 8] = [
        "host",
        "content-length",
        "content-type",
        "accept",
        "user-agent",
        "x-github-api-version",
        "authorization",
        "accept-encoding",
    ];
    for rec in &records {
        for (k, _) in &rec.headers {
            assert!(SENT.contains(&k.as_str()), "{k} sent upstream: {rec:?}");
        }
        assert!(rec.header("host").is_some(), "{rec:?}");
    }
    assert_eq!(records[0].header("content-length"), None);
    let post = &records[2];
    assert_eq!(post.path, "/repos/octo/hello/pulls");
    assert_eq!(
        post.header("content-length"),
        Some(body.len().to_string().as_str())
    );

    // The audit: one proxy.request before each call, one proxy.completed
    // after (it follows the answer's last byte, so it is waited for), with
    // the route template and a hash of the path, no query.
    let done =
        |e: &serde_json::Value| e["event"] == "proxy.completed" && e["outcome"] == "completed";
    let audit = p
        .env
        .broker
        .audit_lines_until(|es| es.iter().filter(|e| done(e)).count() >= 5)
        .await;
    let requests: Vec<_> = audit
        .iter()
        .filter(|e| e["event"] == "proxy.request")
        .collect();
    let completed: Vec<_> = audit.iter().filter(|e| done(e)).collect();
    assert_eq!((requests.len(), completed.len()), (5, 5), "{audit:?}");
    assert_eq!(
        requests[0]["proxy"]["route"],
        "GET /repos/{owner}/{repo}/issues"
    );
    assert_eq!(requests[0]["step"], "triage");
    assert_eq!(requests[0]["tool"], "acme.read");
    let download = completed
        .iter()
        .find(|e| e["proxy"]["route"] == "GET /download/{mib}")
        .unwrap();
    assert_eq!(download["proxy"]["bytes_down"], 10 * 1024 * 1024);
    assert_eq!(download["proxy"]["upstream_status"], 200);
    let audit_text = serde_json::to_string(&audit).unwrap();
    assert!(!audit_text.contains("state=open"), "no query in the audit");

    // The canary: the provider's access and refresh tokens appear in no
    // answer, log line, event or metric.
    let tokens = p.provider_tokens().await;
    assert!(
        tokens.len() >= 2,
        "an access and a refresh token were issued"
    );
    let log = p.env.broker.log_text();
    let metrics = p.env.broker.metrics();
    for t in &tokens {
        for (what, text) in [("log", &log), ("audit", &audit_text), ("metrics", &metrics)] {
            assert!(!text.contains(t.as_str()), "a provider token in the {what}");
        }
        assert!(
            answers.iter().all(|a| !a.contains(t.as_str())),
            "a provider token in an answer"
        );
    }
    let counted = metrics.lines().find(|l| {
        l.starts_with("credbroker_proxy_requests_total{")
            && [
                "outcome=\"completed\"",
                "service=\"acme\"",
                "tool=\"acme.read\"",
            ]
            .iter()
            .all(|x| l.contains(x))
    });
    assert_eq!(
        counted.and_then(|l| l.rsplit(' ').next()),
        Some("4"),
        "{metrics}"
    );
    assert!(p.other.records().is_empty());
}

#[tokio::test]
async fn nonce_is_asked_for_when_the_broker_requires_nonces() {
    // `[dpop] require_nonce` holds on the proxy as on the socket.
    let p = ProxyEnv::start("\n[dpop]\nrequire_nonce = true").await;
    let read = p.token("acme.read", "triage").await;
    let r = p.call(&read, "GET", "/user", None).await;
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("error=\"use_dpop_nonce\""));
    let nonce = r.headers()["dpop-nonce"].to_str().unwrap().to_string();
    assert_eq!(refusal(r).await.1["reason"], "use_dpop_nonce");
    assert!(p.api.records().is_empty(), "nothing went upstream");
    // Positive control: a new proof with the nonce is served.
    let htu = format!("{}/proxy/acme/user", p.env.broker.issuer);
    let proof = credbroker::internals::dpop::make_proof(
        &p.key,
        "GET",
        &htu,
        now(),
        Some(&read),
        Some(&nonce),
    )
    .unwrap();
    let r = p
        .send(
            "GET",
            "/proxy/acme/user",
            &format!("DPoP {read}"),
            &proof,
            None,
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(p.api.records().len(), 1);
}
