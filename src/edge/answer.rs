//! The one error answer of the three HTTP surfaces: the orchestrator's
//! socket ([`crate::edge::api`]), the egress proxy ([`crate::edge::proxy`])
//! and the admin socket ([`crate::edge::admin`]). Each surface maps its own
//! typed errors to an [`Answer`] in one function; the answer becomes HTTP
//! here and nowhere else: the JSON body (`error`, `reason` when there is
//! one, `error_description`, and a connect link's members), `Retry-After`,
//! `DPoP-Nonce`, and the DPoP `WWW-Authenticate` challenge (RFC 9449
//! section 7.1), written once ([`dpop_challenge`]) and naming the
//! algorithms the config accepts (`dpop.algs`).

use std::borrow::Cow;

use http::{header, HeaderValue, Response, StatusCode};

use crate::base::http::{json_response, Body};
use crate::base::jose::Alg;
use crate::derive::exchange::LinkRefusal;

/// An error answer: status, OAuth `error`, `reason`, description,
/// `Retry-After` and the DPoP challenge.
#[derive(Debug)]
#[must_use]
pub(crate) struct Answer {
    status: StatusCode,
    error: &'static str,
    reason: Option<&'static str>,
    description: Cow<'static, str>,
    retry_after: Option<u64>,
    /// The `WWW-Authenticate` value, made by [`dpop_challenge`].
    challenge: Option<String>,
    /// A nonce to sign the next proof with (`DPoP-Nonce`).
    nonce: Option<String>,
    /// The members of a refusal that carries a connect link.
    link: Option<Link>,
    /// Other members the refusal's reason declares (`upstream_htu`,
    /// `upstream_nonce`, `upstream_error`: proto/refusal.schema.json).
    members: Vec<(&'static str, String)>,
}

/// A connect link in a refusal (`connect_uri`, `connect_id`,
/// `connect_expires_in`, `connect_message`): the person opens it, then the
/// call is made again.
#[derive(Debug)]
pub(crate) struct Link {
    /// The URL the person opens.
    pub(crate) uri: String,
    /// The link's id (also the MCP elicitation id).
    pub(crate) id: String,
    /// Seconds the link stays open.
    pub(crate) expires_in: i64,
    /// A sentence for the person.
    pub(crate) message: String,
}

/// The DPoP `WWW-Authenticate` challenge (RFC 9449 section 7.1): the
/// `error` code, when there is one, and `algs`, the space-separated
/// algorithms a proof may use. The only place it is written.
pub(crate) fn dpop_challenge(error: Option<&str>, algs: &[Alg]) -> String {
    let algs: Vec<&str> = algs.iter().map(|a| a.as_str()).collect();
    let algs = algs.join(" ");
    match error {
        Some(e) => format!("DPoP error=\"{e}\", algs=\"{algs}\""),
        None => format!("DPoP algs=\"{algs}\""),
    }
}

impl Answer {
    /// An answer with its status, OAuth `error` and sentence.
    pub(crate) fn new(
        status: StatusCode,
        error: &'static str,
        description: impl Into<Cow<'static, str>>,
    ) -> Answer {
        Answer {
            status,
            error,
            reason: None,
            description: description.into(),
            retry_after: None,
            challenge: None,
            nonce: None,
            link: None,
            members: Vec::new(),
        }
    }

    /// With the broker's own `reason` code.
    pub(crate) fn reason(mut self, reason: &'static str) -> Answer {
        self.reason = Some(reason);
        self
    }

    /// With `Retry-After` (seconds).
    pub(crate) fn retry_after(mut self, seconds: u64) -> Answer {
        self.retry_after = Some(seconds);
        self
    }

    /// With a DPoP challenge naming `algs` (the config's `dpop.algs`).
    pub(crate) fn challenge(mut self, error: Option<&str>, algs: &[Alg]) -> Answer {
        self.challenge = Some(dpop_challenge(error, algs));
        self
    }

    /// With a nonce to sign the next proof with (`DPoP-Nonce`).
    pub(crate) fn nonce(mut self, nonce: Option<&str>) -> Answer {
        self.nonce = nonce.map(str::to_owned);
        self
    }

    /// With one more member, declared in the schema with its reason.
    pub(crate) fn member(mut self, name: &'static str, value: impl Into<String>) -> Answer {
        self.members.push((name, value.into()));
        self
    }

    /// With a connect link's members.
    pub(crate) fn link(mut self, link: Link) -> Answer {
        self.link = Some(link);
        self
    }

    /// A refusal with a connect link (connect, allow, reconnect), the same
    /// on the socket and from the proxy, so an orchestrator relays either
    /// the same way.
    pub(crate) fn connect_link(l: &LinkRefusal) -> Answer {
        Answer::new(StatusCode::BAD_REQUEST, "invalid_grant", l.message.clone())
            .reason(l.kind.reason())
            .link(Link {
                uri: l.uri.expose().to_string(),
                id: l.id.clone(),
                expires_in: l.expires_in,
                message: l.message.clone(),
            })
    }

    /// The HTTP answer.
    pub(crate) fn response(&self) -> Response<Body> {
        let mut body = serde_json::Map::new();
        body.insert("error".into(), self.error.into());
        if let Some(r) = self.reason {
            body.insert("reason".into(), r.into());
        }
        body.insert("error_description".into(), self.description.as_ref().into());
        if let Some(l) = &self.link {
            body.insert("connect_uri".into(), l.uri.as_str().into());
            body.insert("connect_id".into(), l.id.as_str().into());
            body.insert("connect_expires_in".into(), l.expires_in.into());
            body.insert("connect_message".into(), l.message.as_str().into());
        }
        for (k, v) in &self.members {
            body.insert((*k).into(), v.as_str().into());
        }
        let mut r = json_response(self.status, &body);
        let h = r.headers_mut();
        if let Some(s) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if let Some(v) = self
            .challenge
            .as_deref()
            .and_then(|c| HeaderValue::from_str(c).ok())
        {
            h.insert(header::WWW_AUTHENTICATE, v);
        }
        if let Some(v) = self
            .nonce
            .as_deref()
            .and_then(|n| HeaderValue::from_str(n).ok())
        {
            h.insert("dpop-nonce", v);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_challenge_names_exactly_the_algorithms_given() {
        assert_eq!(
            dpop_challenge(Some("invalid_token"), &[Alg::ES256]),
            "DPoP error=\"invalid_token\", algs=\"ES256\""
        );
        assert_eq!(
            dpop_challenge(None, &[Alg::ES256, Alg::PS256]),
            "DPoP algs=\"ES256 PS256\""
        );
    }
}
