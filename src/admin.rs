//! The admin socket (its own Unix socket, mode 0600, the broker's user only:
//! containers in a pod share TCP loopback, so loopback is no boundary).
//!
//! `GET /metrics`, `GET /readyz`, `GET /status`, `POST /freeze` (`on` or
//! `off` in the body), `POST /keys/rotate`, `POST /users` (a local account
//! for the pages: `{"name", "password", "replace"}`), `POST /vault/rotate`
//! (optional body: the most records to re-wrap in this call), `GET /accounts`
//! (optional query `person_iss`, `person_sub`), `POST /accounts/disconnect`
//! (JSON `person_iss`, `person_sub`, `service`, optional `force`).

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};

use crate::app::Instance;
use crate::http::{json_response, Body};

fn text(status: StatusCode, body: String, ctype: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Reads a body of at most 64 bytes (the admin commands' arguments).
async fn small_body(req: Request<hyper::body::Incoming>) -> Result<Bytes, Response<Body>> {
    match Limited::new(req.into_body(), 64).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(_) => Err(json_response(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({"error": "body"}),
        )),
    }
}

/// Readiness: store answers, keys loaded, policy loaded.
pub fn readiness(inst: &Instance) -> serde_json::Value {
    let b = &inst.broker;
    let store = b.store.is_healthy();
    let keys = !b.minter.ring().active.kid.is_empty();
    let policy = !b.policy.load().hash.is_empty();
    serde_json::json!({
        "ready": store && keys && policy,
        "store": store,
        "keys": keys,
        "policy": policy,
    })
}

/// Status for `credbroker status`.
pub fn status(inst: &Instance) -> serde_json::Value {
    let b = &inst.broker;
    let p = b.policy.load();
    serde_json::json!({
        "agent": b.config.agent,
        "issuer": b.config.issuer,
        "frozen": b.is_frozen(),
        "policy_hash": p.hash,
        "policy_tools": p.tools.len(),
        "active_kid": b.minter.ring().active.kid,
        "published_keys": b.minter.ring().published.len(),
        "replay_cache_entries": b.proofs.replay_cache().len(),
        "subject_cache_entries": b.subjects.cache_len(),
        "ready": readiness(inst)["ready"],
        "public_addr": inst.public_addr.get().map(|a| a.to_string()),
    })
}

/// The connected accounts (one person's, or all) with their allowances,
/// and the records that do not open (reported, never served). No token.
pub fn accounts_json(
    vault: &crate::vault::Vault,
    person: Option<&crate::subject::Person>,
) -> Result<serde_json::Value, crate::vault::VaultError> {
    let mut list = Vec::new();
    for a in vault.accounts(person)? {
        let p = crate::subject::Person {
            iss: a.person_iss.clone(),
            sub: a.person_sub.clone(),
        };
        let allowances = vault.allowances(&p, &a.service)?;
        let mut v = serde_json::to_value(&a).unwrap_or_default();
        v["allowances"] = serde_json::to_value(allowances).unwrap_or_default();
        list.push(v);
    }
    let unreadable: Vec<serde_json::Value> = vault
        .verify_all()?
        .into_iter()
        .filter(|(iss, sub, _, _)| person.is_none_or(|p| p.iss == *iss && p.sub == *sub))
        .map(|(iss, sub, service, problem)| {
            serde_json::json!({"person_iss": iss, "person_sub": sub, "service": service, "problem": problem})
        })
        .collect();
    Ok(serde_json::json!({"accounts": list, "unreadable": unreadable}))
}

/// The body of `POST /accounts/disconnect`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisconnectRequest {
    /// The person's issuer.
    pub person_iss: String,
    /// The person's subject.
    pub person_sub: String,
    /// The service.
    pub service: String,
    /// Delete even if revocation at the provider failed.
    #[serde(default)]
    pub force: bool,
}

fn person_from_query(query: Option<&str>) -> Option<crate::subject::Person> {
    let mut iss = None;
    let mut sub = None;
    for (k, v) in form_urlencoded::parse(query?.as_bytes()) {
        match k.as_ref() {
            "person_iss" => iss = Some(v.into_owned()),
            "person_sub" => sub = Some(v.into_owned()),
            _ => {}
        }
    }
    Some(crate::subject::Person {
        iss: iss?,
        sub: sub?,
    })
}

/// Handles one admin request.
pub async fn handle(inst: Instance, req: Request<hyper::body::Incoming>) -> Response<Body> {
    let b = &inst.broker;
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/metrics") => {
            b.metrics
                .replay_cache_entries
                .set(b.proofs.replay_cache().len() as i64);
            text(
                StatusCode::OK,
                b.metrics.render(),
                "text/plain; version=0.0.4",
            )
        }
        (Method::GET, "/readyz") => {
            let r = readiness(&inst);
            let code = if r["ready"] == true {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            json_response(code, &r)
        }
        (Method::GET, "/status") => json_response(StatusCode::OK, &status(&inst)),
        (Method::POST, "/freeze") => {
            let body = match small_body(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let on = match body.as_ref() {
                b"on" => true,
                b"off" => false,
                _ => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        &serde_json::json!({"error": "body must be on or off"}),
                    )
                }
            };
            match b.set_frozen(on) {
                Ok(()) => {
                    tracing::warn!(frozen = on, "emergency freeze changed by the admin socket");
                    let mut e = crate::events::Event::new(
                        b.clock.now(),
                        if on { "admin.frozen" } else { "admin.unfrozen" },
                        &b.config.agent,
                    );
                    e.outcome = Some(if on { "frozen" } else { "unfrozen" });
                    let _ = b.audit.record(&e);
                    json_response(
                        StatusCode::OK,
                        &serde_json::json!({"frozen": b.is_frozen()}),
                    )
                }
                Err(e) => json_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &serde_json::json!({"error": e.to_string(), "frozen": b.is_frozen()}),
                ),
            }
        }
        (Method::POST, "/keys/rotate") => match b.rotate_keys(&inst.sealer) {
            Ok(kid) => {
                let mut e =
                    crate::events::Event::new(b.clock.now(), "keys.rotated", &b.config.agent);
                e.outcome = Some("rotated");
                let _ = b.audit.record(&e);
                json_response(StatusCode::OK, &serde_json::json!({"active_kid": kid}))
            }
            Err(e) => json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &serde_json::json!({"error": e.to_string()}),
            ),
        },
        (Method::POST, "/vault/rotate") => {
            let body = match small_body(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let limit = match std::str::from_utf8(&body).map(str::trim) {
                Ok("") => None,
                Ok(n) => match n.parse::<usize>() {
                    Ok(n) => Some(n),
                    Err(_) => {
                        return json_response(
                            StatusCode::BAD_REQUEST,
                            &serde_json::json!({"error": "the body must be empty or a number of records"}),
                        )
                    }
                },
                Err(_) => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        &serde_json::json!({"error": "body"}),
                    )
                }
            };
            let vault = inst.vault.clone();
            // Re-wrapping does store I/O; keep it off the async workers.
            match tokio::task::spawn_blocking(move || vault.rotate(limit)).await {
                Ok(Ok(report)) => {
                    let mut e =
                        crate::events::Event::new(b.clock.now(), "vault.rotated", &b.config.agent);
                    e.outcome = Some(if report.done { "done" } else { "in_progress" });
                    let _ = b.audit.record(&e);
                    json_response(StatusCode::OK, &serde_json::json!(report))
                }
                Ok(Err(e)) => json_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &serde_json::json!({"error": e.to_string()}),
                ),
                Err(_) => json_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &serde_json::json!({"error": "the rotation task failed"}),
                ),
            }
        }
        (Method::GET, "/accounts") => {
            let person = person_from_query(req.uri().query());
            match accounts_json(&inst.vault, person.as_ref()) {
                Ok(v) => json_response(StatusCode::OK, &v),
                Err(e) => json_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &serde_json::json!({"error": e.to_string()}),
                ),
            }
        }
        (Method::POST, "/accounts/disconnect") => {
            let body = match Limited::new(req.into_body(), 16 * 1024).collect().await {
                Ok(c) => c.to_bytes(),
                Err(_) => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        &serde_json::json!({"error": "body"}),
                    )
                }
            };
            let Ok(d) = serde_json::from_slice::<DisconnectRequest>(&body) else {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    &serde_json::json!({"error": "the body must be JSON with person_iss, person_sub, service and optional force"}),
                );
            };
            let person = crate::subject::Person {
                iss: d.person_iss,
                sub: d.person_sub,
            };
            let provider = inst.providers.get(&d.service).map(|p| p.as_ref());
            match crate::connect::disconnect_account(
                &inst.vault,
                provider,
                &person,
                &d.service,
                d.force,
            )
            .await
            {
                Ok(report) => {
                    let mut e = crate::events::Event::new(
                        b.clock.now(),
                        "account.disconnected",
                        &b.config.agent,
                    );
                    e.person_iss = Some(&person.iss);
                    e.person_sub = Some(&person.sub);
                    e.service = Some(&d.service);
                    e.outcome = Some(if report.deleted { "deleted" } else { "kept" });
                    e.reason = Some(report.revocation);
                    let _ = b.audit.record(&e);
                    json_response(StatusCode::OK, &serde_json::json!(report))
                }
                Err(e) => json_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &serde_json::json!({"error": e.to_string()}),
                ),
            }
        }
        (Method::POST, "/users") => add_user(&inst, req.into_body()).await,
        _ => json_response(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"error": "not_found"}),
        ),
    }
}

/// `POST /users`: adds a local account while the instance holds the store.
async fn add_user(inst: &Instance, body: hyper::body::Incoming) -> Response<Body> {
    #[derive(serde::Deserialize)]
    struct AddUser {
        name: String,
        password: String,
        #[serde(default)]
        replace: bool,
    }
    let bad = |m: &str| json_response(StatusCode::BAD_REQUEST, &serde_json::json!({"error": m}));
    let Ok(bytes) = Limited::new(body, 4096)
        .collect()
        .await
        .map(|c| c.to_bytes())
    else {
        return bad("body");
    };
    let Ok(req) = serde_json::from_slice::<AddUser>(&bytes) else {
        return bad("expected {\"name\", \"password\", \"replace\"}");
    };
    let password = crate::secret::SecretString::new(req.password);
    let store = inst.broker.store.clone();
    let now = inst.broker.clock.now();
    let (name, replace) = (req.name, req.replace);
    let n = name.clone();
    let result = tokio::task::spawn_blocking(move || {
        crate::pages::users::add(store.as_ref(), &n, &password, replace, now)
    })
    .await;
    match result {
        Ok(Ok(())) => {
            let mut e = crate::events::Event::new(now, "users.added", &inst.broker.config.agent);
            e.person_sub = Some(&name);
            e.outcome = Some(if replace { "replaced" } else { "added" });
            let _ = inst.broker.audit.record(&e);
            json_response(
                StatusCode::OK,
                &serde_json::json!({"user": name, "running": true}),
            )
        }
        Ok(Err(e @ crate::pages::users::UserError::Exists(_))) => json_response(
            StatusCode::CONFLICT,
            &serde_json::json!({"error": e.to_string()}),
        ),
        Ok(Err(e)) => bad(&e.to_string()),
        Err(_) => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &serde_json::json!({"error": "internal"}),
        ),
    }
}
