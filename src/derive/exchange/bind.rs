//! Step 4b of the pipeline ([`super`]): the request a derive says its
//! token is for (`request`; docs/APPROVALS.md, "The request, bound"),
//! checked and hashed here, in memory (no store call), before any approval
//! link exists: its `req_sha256` is part of the approved call, the page
//! shows it, and the token carries it.

use credbroker_verify::request::{self, jcs, RequestError};

use crate::derive::approve::{ShownField, ShownRequest};
use crate::derive::policy::{self, Grant, Policy, Tool};

use super::{Broker, DeriveError, DeriveRequest, IntendedRequest};

/// The longest method, query and content type a bound request may have.
const MAX_METHOD: usize = 16;
const MAX_QUERY: usize = 4096;
const MAX_CONTENT_TYPE: usize = 256;

/// A checked, hashed request.
#[derive(Debug)]
pub(super) struct BoundCall {
    /// `req_sha256`.
    pub(super) sha256: String,
    /// What the approval page shows of it.
    pub(super) shown: ShownRequest,
}

fn bad(msg: impl Into<String>) -> DeriveError {
    DeriveError::BadRequest(msg.into())
}

/// The request's parts, each within the grammar the proxy sends.
fn check_parts(r: &IntendedRequest) -> Result<(), DeriveError> {
    if r.method.is_empty()
        || r.method.len() > MAX_METHOD
        || !r.method.bytes().all(|b| b.is_ascii_uppercase())
    {
        return Err(bad(
            "request.method must be an upper-case method such as POST",
        ));
    }
    crate::base::grammar::check_raw_path(&r.path)
        .map_err(|e| bad(format!("request.path: {}", e.message())))?;
    if r.query.len() > MAX_QUERY || !r.query.bytes().all(|b| b.is_ascii_graphic() && b != b'#') {
        return Err(bad(
            "request.query must be the raw query without '?': visible ASCII, no '#', at most 4096 bytes",
        ));
    }
    if r.content_type.len() > MAX_CONTENT_TYPE
        || !r
            .content_type
            .bytes()
            .all(|b| b == b' ' || b.is_ascii_graphic())
    {
        return Err(bad(
            "request.content_type must be the Content-Type as sent: visible ASCII and spaces, at most 256 bytes",
        ));
    }
    Ok(())
}

/// A value as the page shows it: a string as it is, a list of strings as
/// its strings, anything else in its canonical JSON form.
fn values(v: &jcs::Json) -> Vec<String> {
    match v {
        jcs::Json::String(s) => vec![s.clone()],
        jcs::Json::Array(a) if a.iter().all(|x| matches!(x, jcs::Json::String(_))) => a
            .iter()
            .map(|x| match x {
                jcs::Json::String(s) => s.clone(),
                _ => String::new(),
            })
            .collect(),
        other => vec![other.canonical()],
    }
}

/// What the page shows of a bound request whose hashed body is `body`.
fn shown(tool: &Tool, r: &IntendedRequest, url: String, body: &[u8]) -> ShownRequest {
    let mut out = ShownRequest {
        method: r.method.clone(),
        url,
        content_type: r.content_type.clone(),
        ..ShownRequest::default()
    };
    if body.is_empty() {
        return out;
    }
    let json = request::json_media_type(&r.content_type).is_some();
    let members = match json.then(|| jcs::parse(body)) {
        Some(Ok(jcs::Json::Object(m))) => m,
        _ => {
            // The body was bound as UTF-8 text (the derive carries a
            // string), so it is shown as it is.
            out.text = Some(String::from_utf8_lossy(body).into_owned());
            return out;
        }
    };
    // The tool's declared detail fields name the body's members the
    // policy labels, in the policy's order; the first declaration of a
    // name gives its label.
    let mut labelled = std::collections::BTreeSet::new();
    for declared in tool.details.values() {
        for (name, f) in declared.ordered() {
            if labelled.contains(name.as_str()) {
                continue;
            }
            if let Some((_, v)) = members.iter().find(|(k, _)| k == name) {
                labelled.insert(name.as_str());
                out.fields.push(ShownField {
                    label: f.label.clone(),
                    values: values(v),
                });
            }
        }
    }
    for (k, v) in &members {
        if !labelled.contains(k.as_str()) {
            out.other_fields.push(ShownField {
                label: k.clone(),
                values: values(v),
            });
        }
    }
    out
}

/// The origin of a `self` resource (`https://mail.example`), where its
/// requests go.
fn origin(resource: &str) -> String {
    match url::Url::parse(resource) {
        Ok(u) => u.origin().ascii_serialization(),
        Err(_) => resource.to_string(),
    }
}

impl Broker {
    /// The derive's `request`, checked against the policy and hashed: on a
    /// `delivery = "proxy"` resource one of the tool's routes with
    /// `bind_request` must match its method and path in this step; on a
    /// `self` resource any request binds; no other resource takes one.
    pub(super) fn bind_step(
        &self,
        req: &DeriveRequest,
        policy: &Policy,
        tool: &Tool,
        grant: &Grant,
    ) -> Result<Option<BoundCall>, DeriveError> {
        let Some(r) = req.request.as_ref() else {
            return Ok(None);
        };
        check_parts(r)?;
        let bound = request::bind(&r.bound()).map_err(|e| match e {
            RequestError::TooLarge => bad(format!(
                "request.body is over the largest bindable body ({} bytes)",
                request::MAX_BOUND_BODY
            )),
            e => bad(format!("request.body cannot be bound: {e}")),
        })?;
        let target = format!(
            "{}{}",
            r.path,
            if r.query.is_empty() {
                String::new()
            } else {
                format!("?{}", r.query)
            }
        );
        let url = match &grant.resource.source {
            policy::Source::SelfIssued => format!("{}{target}", origin(&grant.resource.id)),
            policy::Source::Service {
                service,
                delivery: policy::Delivery::Proxy,
            } => {
                let route = policy
                    .proxy_route(&tool.name, &req.step, &grant.resource.id, &r.method, &r.path)
                    .ok()
                    .filter(|route| route.bind_request)
                    .ok_or_else(|| {
                        bad("no route of the tool with bind_request = true allows the request's method and path in this step")
                    })?;
                let _ = route;
                let api_base = self
                    .connected_services()
                    .and_then(|c| c.providers.get(service))
                    .and_then(|p| p.config().api_base.clone())
                    .ok_or(DeriveError::Unavailable(
                        "the service of this proxy resource has no api_base on this instance",
                    ))?;
                format!("{api_base}{target}")
            }
            _ => return Err(bad(
                "a request binds only to a self resource or a proxy route with bind_request = true",
            )),
        };
        let shown = shown(tool, r, url, &bound.body);
        Ok(Some(BoundCall {
            sha256: bound.sha256,
            shown,
        }))
    }
}
