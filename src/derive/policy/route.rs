//! Routes of a `delivery = "proxy"` tool: the calls it may make through the
//! egress proxy, written `"METHOD /path/template"`.
//!
//! A template is a list of segments: exact text, a one-segment variable
//! `{name}`, or, as the last segment only, `{name...}`, which matches one or
//! more segments. There are no regular expressions and no prefixes; `GET`
//! does not imply `HEAD`; the query is not constrained. Literal segments obey
//! the same rules as request paths (`grammar::check_path_segment`), so a
//! route that no request could ever match is refused when the policy loads.

use std::collections::BTreeSet;

use crate::base::grammar::check_path_segment;

/// The methods a route may name. `CONNECT` and `TRACE` are refused by the
/// proxy whatever the policy says.
pub(crate) const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// One segment of a path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Exactly these bytes.
    Exact(String),
    /// `{name}`: any one segment.
    One(String),
    /// `{name...}` (last only): one or more segments.
    Rest(String),
}

/// A route as the policy declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// As written (`"GET /repos/{owner}/{repo}"`): what events and metrics
    /// name, never the concrete path.
    pub text: String,
    /// The method, exactly.
    pub method: String,
    /// The path template.
    pub segments: Vec<Segment>,
    /// The steps the route is limited to (`None` = every step of its tool).
    pub steps: Option<BTreeSet<String>>,
    /// Route variables bound to fields of the token's approved
    /// `authorization_details` (empty: the path is not tied to them).
    pub details: Vec<DetailBinding>,
    /// Whether an approval binds the whole request (`bind_request`,
    /// docs/APPROVALS.md, "The request, bound").
    pub bind_request: bool,
}

/// A route variable that must equal a field of the token's
/// `authorization_details` (written `var = "type.field"` in the route
/// table's `details`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetailBinding {
    /// The route variable.
    pub var: String,
    /// The `authorization_details` type.
    pub ty: String,
    /// The field of that type (a `string` or `integer` field).
    pub field: String,
}

/// Whether `b` is kept as it is in a path segment: RFC 3986 `pchar`
/// without percent-escapes (unreserved, sub-delims, `:` and `@`).
fn plain_pchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b)
}

/// `value` as a path carries it: every byte that is not a plain `pchar`
/// percent-encoded in uppercase hex (`/` kept when `keep_slash`, for a
/// multi-segment variable). The proxy never decodes a path, so a value is
/// compared in this one encoded form.
pub(crate) fn encode_value(value: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(value.len());
    for &b in value.as_bytes() {
        if plain_pchar(b) || (keep_slash && b == b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Why a route does not parse, or could never match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// Not `METHOD /path`.
    #[error("a route is \"METHOD /path\", such as \"GET /repos/{{owner}}/{{repo}}\"")]
    Shape,
    /// A method the proxy never forwards, or not in upper case.
    #[error("the method must be one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS (CONNECT and TRACE are never proxied)")]
    Method,
    /// A literal segment no request could have.
    #[error("segment {index} can never match a request: {cause}")]
    Literal {
        /// 1-based segment number.
        index: usize,
        /// Why.
        cause: &'static str,
    },
    /// `{...}` malformed, or mixed with text in one segment.
    #[error("segment {0} is not a variable of the form {{name}} or {{name...}} (a lower-case name; a variable is a whole segment)")]
    Variable(usize),
    /// `{name...}` before the last segment.
    #[error("only the last segment may be a multi-segment variable {{name...}}")]
    RestNotLast,
    /// The same variable twice.
    #[error("variable {0:?} appears twice")]
    Duplicate(String),
}

fn valid_var(name: &str) -> bool {
    let mut b = name.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == b'_')
        && b.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
}

impl Route {
    /// Parses `"METHOD /template"`, limited to `steps` when given.
    pub fn parse(text: &str, steps: Option<BTreeSet<String>>) -> Result<Route, RouteError> {
        let (method, path) = text.split_once(' ').ok_or(RouteError::Shape)?;
        if !METHODS.contains(&method) {
            return Err(RouteError::Method);
        }
        let rest = path.strip_prefix('/').ok_or(RouteError::Shape)?;
        let mut segments = Vec::new();
        let mut names = BTreeSet::new();
        if !rest.is_empty() {
            let parts: Vec<&str> = rest.split('/').collect();
            for (i, part) in parts.iter().enumerate() {
                let index = i + 1;
                let seg = if let Some(inner) = part.strip_prefix('{') {
                    let inner = inner.strip_suffix('}').ok_or(RouteError::Variable(index))?;
                    let (name, multi) = match inner.strip_suffix("...") {
                        Some(n) => (n, true),
                        None => (inner, false),
                    };
                    if !valid_var(name) {
                        return Err(RouteError::Variable(index));
                    }
                    if !names.insert(name.to_string()) {
                        return Err(RouteError::Duplicate(name.to_string()));
                    }
                    if multi {
                        if index != parts.len() {
                            return Err(RouteError::RestNotLast);
                        }
                        Segment::Rest(name.to_string())
                    } else {
                        Segment::One(name.to_string())
                    }
                } else {
                    if part.contains(['{', '}']) {
                        return Err(RouteError::Variable(index));
                    }
                    check_path_segment(part).map_err(|e| RouteError::Literal {
                        index,
                        cause: e.message(),
                    })?;
                    Segment::Exact(part.to_string())
                };
                segments.push(seg);
            }
        }
        Ok(Route {
            text: text.to_string(),
            method: method.to_string(),
            segments,
            steps,
            details: Vec::new(),
            bind_request: false,
        })
    }

    /// Whether the template has a variable `name` (one- or multi-segment).
    pub fn has_variable(&self, name: &str) -> bool {
        self.segments
            .iter()
            .any(|s| matches!(s, Segment::One(n) | Segment::Rest(n) if n == name))
    }

    /// The raw values of the template's variables in `path` (which must
    /// match the route): a multi-segment variable's value keeps its `/`.
    fn variables<'p>(&self, path: &'p str) -> Vec<(&str, &'p str)> {
        let rest = path.strip_prefix('/').unwrap_or(path);
        let mut out = Vec::new();
        let mut at = 0;
        for seg in &self.segments {
            let tail = rest.get(at..).unwrap_or_default();
            let end = match seg {
                Segment::Rest(_) => tail.len(),
                _ => tail.find('/').unwrap_or(tail.len()),
            };
            if let Segment::One(n) | Segment::Rest(n) = seg {
                out.push((n.as_str(), &tail[..end]));
            }
            at += end + 1;
        }
        out
    }

    /// Whether the raw `path` (matched by this route) agrees with the
    /// token's `details` on every bound variable: for each type the route
    /// binds, one entry of that type whose bound fields equal, in their
    /// encoded form ([`encode_value`]), the path's variables. A route
    /// without bindings holds for any details; a route with bindings never
    /// holds for a token without details.
    pub fn details_hold(&self, path: &str, details: Option<&serde_json::Value>) -> bool {
        if self.details.is_empty() {
            return true;
        }
        let Some(entries) = details.and_then(|d| d.as_array()) else {
            return false;
        };
        let vars = self.variables(path);
        let value_of = |var: &str| vars.iter().find(|(n, _)| *n == var).map(|(_, v)| *v);
        let types: BTreeSet<&str> = self.details.iter().map(|b| b.ty.as_str()).collect();
        types.into_iter().all(|ty| {
            entries.iter().any(|e| {
                e.get("type").and_then(|t| t.as_str()) == Some(ty)
                    && self.details.iter().filter(|b| b.ty == ty).all(|b| {
                        let multi = self
                            .segments
                            .iter()
                            .any(|s| matches!(s, Segment::Rest(n) if *n == b.var));
                        let want = match e.get(&b.field) {
                            Some(serde_json::Value::String(s)) => encode_value(s, multi),
                            Some(serde_json::Value::Number(n)) if n.is_i64() => n.to_string(),
                            _ => return false,
                        };
                        value_of(&b.var) == Some(want.as_str())
                    })
            })
        })
    }

    /// Whether the route allows every path (`/{path...}`), for its method.
    pub fn allows_every_path(&self) -> bool {
        matches!(self.segments.as_slice(), [Segment::Rest(_)])
    }

    /// Whether `method` and the raw `path` (already checked with
    /// `grammar::check_raw_path`) match this route. Byte for byte, no
    /// decoding.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        if method != self.method {
            return false;
        }
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let parts: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('/').collect()
        };
        let mut parts = parts.as_slice();
        for seg in &self.segments {
            match seg {
                Segment::Rest(_) => return !parts.is_empty(),
                Segment::One(_) => match parts.split_first() {
                    Some((_, tail)) => parts = tail,
                    None => return false,
                },
                Segment::Exact(e) => match parts.split_first() {
                    Some((p, tail)) if p == e => parts = tail,
                    _ => return false,
                },
            }
        }
        parts.is_empty()
    }

    /// Whether the route allows `step` (its own `steps`, when it has them).
    pub fn allows_step(&self, step: &str) -> bool {
        self.steps.as_ref().is_none_or(|s| s.contains(step))
    }

    /// A concrete path both routes match (same method), if there is one.
    pub fn overlap(&self, other: &Route) -> Option<String> {
        if self.method != other.method {
            return None;
        }
        let mut out = Vec::new();
        overlap(&self.segments, &other.segments, &mut out).then(|| format!("/{}", out.join("/")))
    }
}

/// Builds in `out` the segments of a path both templates match.
fn overlap(a: &[Segment], b: &[Segment], out: &mut Vec<String>) -> bool {
    match (a.split_first(), b.split_first()) {
        (None, None) => true,
        (Some((Segment::Rest(_), _)), None) | (None, Some((Segment::Rest(_), _))) => false,
        (None, Some(_)) | (Some(_), None) => false,
        (Some((Segment::Rest(_), _)), Some((Segment::Rest(_), _))) => {
            out.push("x".into());
            true
        }
        // A rest variable takes whatever the other template has left (at
        // least one segment, which the match above guarantees).
        (Some((Segment::Rest(_), _)), Some(_)) => fill(b, out),
        (Some(_), Some((Segment::Rest(_), _))) => fill(a, out),
        (Some((x, at)), Some((y, bt))) => {
            let seg = match (x, y) {
                (Segment::Exact(p), Segment::Exact(q)) if p == q => p.clone(),
                (Segment::Exact(_), Segment::Exact(_)) => return false,
                (Segment::Exact(p), _) | (_, Segment::Exact(p)) => p.clone(),
                _ => "x".into(),
            };
            out.push(seg);
            overlap(at, bt, out)
        }
    }
}

fn fill(rest: &[Segment], out: &mut Vec<String>) -> bool {
    for s in rest {
        out.push(match s {
            Segment::Exact(p) => p.clone(),
            _ => "x".into(),
        });
    }
    true
}

#[cfg(test)]
mod tests {
    // reason: test code, where a panic is the failure report.
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn r(t: &str) -> Route {
        Route::parse(t, None).unwrap()
    }

    #[test]
    fn templates_match_byte_for_byte() {
        let c = r("GET /repos/{owner}/{repo}/contents/{path...}");
        assert!(c.matches("GET", "/repos/a/b/contents/x"));
        assert!(c.matches("GET", "/repos/a/b/contents/x/y/z.md"));
        assert!(!c.matches("GET", "/repos/a/b/contents"));
        assert!(!c.matches("HEAD", "/repos/a/b/contents/x"));
        assert!(!c.matches("GET", "/repos/a/b/Contents/x"));
        let u = r("GET /user");
        assert!(u.matches("GET", "/user"));
        assert!(!u.matches("GET", "/user/x"));
        assert!(!u.matches("GET", "/"));
        assert!(r("GET /").matches("GET", "/"));
        assert!(!r("GET /").matches("GET", "/user"));
        assert!(r("GET /{all...}").allows_every_path());
        assert!(!c.allows_every_path());
    }

    #[test]
    fn bound_variables_must_equal_the_details() {
        let mut d = r("DELETE /repos/{owner}/{repo}/{path...}");
        let bind = |var: &str, field: &str| DetailBinding {
            var: var.into(),
            ty: "repository".into(),
            field: field.into(),
        };
        d.details = vec![
            bind("owner", "owner"),
            bind("repo", "name"),
            bind("path", "path"),
        ];
        let details = serde_json::json!([
            {"type": "other", "owner": "mallory"},
            {"type": "repository", "owner": "octo", "name": "hello world", "path": "a/b.md"}
        ]);
        let path = "/repos/octo/hello%20world/a/b.md";
        assert!(d.matches("DELETE", path));
        assert!(d.details_hold(path, Some(&details)));
        for other in [
            "/repos/mallory/hello%20world/a/b.md",
            "/repos/octo/hello%20world/a/c.md",
            "/repos/octo/hello world/a/b.md",
            "/repos/octo/hello%2520world/a/b.md",
        ] {
            assert!(!d.details_hold(other, Some(&details)), "{other}");
        }
        assert!(!d.details_hold(path, None), "no details, no match");
        assert!(!d.details_hold(path, Some(&serde_json::json!([{"type": "other"}]))));
        assert!(
            r("GET /user").details_hold("/user", None),
            "no binding, no constraint"
        );
        assert_eq!(encode_value("a/b c~é", false), "a%2Fb%20c~%C3%A9");
    }

    #[test]
    fn never_matching_routes_are_refused() {
        for bad in [
            "GET",
            "get /user",
            "TRACE /user",
            "GET user",
            "GET /a//b",
            "GET /a/",
            "GET /a/../b",
            "GET /a%2Fb",
            "GET /a%2fb",
            "GET /a b",
            "GET /{a...}/b",
            "GET /{a}/{a}",
            "GET /x{a}",
            "GET /{A}",
        ] {
            assert!(Route::parse(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn overlap_gives_an_example_path() {
        let a = r("GET /repos/{owner}/{repo}/contents/{path...}");
        let b = r("GET /repos/acme/{name}/{rest...}");
        assert_eq!(a.overlap(&b).as_deref(), Some("/repos/acme/x/contents/x"));
        assert!(a.matches("GET", "/repos/acme/x/contents/x"));
        assert!(b.matches("GET", "/repos/acme/x/contents/x"));
        assert_eq!(r("GET /user").overlap(&r("GET /users")), None);
        assert_eq!(r("GET /user").overlap(&r("POST /user")), None);
        assert_eq!(r("GET /a/{x...}").overlap(&r("GET /a")), None);
        assert_eq!(
            r("GET /a/{x}").overlap(&r("GET /a/b")).as_deref(),
            Some("/a/b")
        );
    }
}
