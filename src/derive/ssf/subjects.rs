//! A SET's subject (RFC 9493 subject identifiers, SSF 1.0 complex
//! subjects) and the people it maps to. A transmitter acts only for its
//! `trusted_issuers`:
//! - `iss_sub` maps directly when its `iss` is one of them (known or not:
//!   the broker has no person registry, and a person who never derived is
//!   stopped before their first derive);
//! - `email` (with `map_email = true`) maps to every person of those
//!   issuers whose verified email is recorded as it (`accounts::emails`);
//! - `aliases` maps to everyone any of its identifiers maps to;
//! - a complex subject maps through its `user` member.
//!
//! Anything else (phone numbers, opaque ids, accounts, URIs, DIDs, an
//! `iss_sub` of another issuer) is unmapped: recorded and ignored, with a
//! metric. A malformed identifier is refused (`invalid_request`).

use crate::accounts::emails::{self, Emails};
use crate::accounts::subject::Person;
use crate::infra::store::StoreError;

/// An identifier, as far as mapping needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SubjectId {
    /// `iss_sub`.
    IssSub(Person),
    /// `email`.
    Email(String),
    /// `aliases`: each of its identifiers.
    Aliases(Vec<SubjectId>),
    /// A format this receiver does not map (by name).
    Other,
}

/// The longest string member read from an identifier.
const MAX_MEMBER: usize = 1024;
/// The most identifiers an `aliases` subject may list.
const MAX_ALIASES: usize = 32;

fn member<'a>(
    v: &'a serde_json::Map<String, serde_json::Value>,
    name: &str,
) -> Result<&'a str, &'static str> {
    match v.get(name) {
        Some(serde_json::Value::String(s)) if !s.is_empty() && s.len() <= MAX_MEMBER => Ok(s),
        _ => Err("a subject identifier lacks a member its format requires, or it is not a non-empty string"),
    }
}

/// Parses a subject; `Err` names what is malformed.
pub(crate) fn parse(v: &serde_json::Value) -> Result<SubjectId, &'static str> {
    parse_at(v, 0)
}

fn parse_at(v: &serde_json::Value, depth: u8) -> Result<SubjectId, &'static str> {
    let serde_json::Value::Object(o) = v else {
        return Err("the subject is not a JSON object");
    };
    let Some(format) = o.get("format") else {
        // An SSF 1.0 complex subject: its members are identifiers; the
        // person is its `user`.
        if depth > 0 {
            return Err("a subject identifier has no format");
        }
        return match o.get("user") {
            Some(u) => parse_at(u, depth + 1),
            None if o.is_empty() => Err("the subject is empty"),
            None => Ok(SubjectId::Other),
        };
    };
    match format.as_str() {
        Some("iss_sub") => Ok(SubjectId::IssSub(Person {
            iss: member(o, "iss")?.to_owned(),
            sub: member(o, "sub")?.to_owned(),
        })),
        Some("email") => {
            let e = member(o, "email")?;
            emails::normalize(e)
                .map(SubjectId::Email)
                .ok_or("an email subject is not an email address")
        }
        Some("aliases") if depth == 0 => {
            let Some(serde_json::Value::Array(ids)) = o.get("identifiers") else {
                return Err("an aliases subject has no identifiers array");
            };
            if ids.is_empty() || ids.len() > MAX_ALIASES {
                return Err("an aliases subject must list 1 to 32 identifiers");
            }
            ids.iter()
                .map(|i| parse_at(i, depth + 1))
                .collect::<Result<Vec<_>, _>>()
                .map(SubjectId::Aliases)
        }
        Some("aliases") => Err("aliases cannot nest"),
        Some(f) if !f.is_empty() && f.len() <= 64 => Ok(SubjectId::Other),
        _ => Err("a subject identifier's format is not a short string"),
    }
}

/// The people `id` maps to for a transmitter with `trusted` issuers
/// (`emails`: set when it maps emails). Empty: unmapped.
pub(crate) fn people(
    id: &SubjectId,
    trusted: &[String],
    emails: Option<&Emails>,
) -> Result<Vec<Person>, StoreError> {
    let mut out: Vec<Person> = Vec::new();
    match id {
        SubjectId::IssSub(p) => {
            if trusted.contains(&p.iss) {
                out.push(p.clone());
            }
        }
        SubjectId::Email(e) => {
            if let Some(emails) = emails {
                for iss in trusted {
                    out.extend(emails.people(iss, e)?);
                }
            }
        }
        SubjectId::Aliases(ids) => {
            for i in ids {
                for p in people(i, trusted, emails)? {
                    if !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
        SubjectId::Other => {}
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn formats_parse_and_malformed_ones_are_refused() {
        let alice = Person {
            iss: "https://idp.example".into(),
            sub: "alice".into(),
        };
        assert_eq!(
            parse(&json!({"format": "iss_sub", "iss": "https://idp.example", "sub": "alice"})),
            Ok(SubjectId::IssSub(alice.clone()))
        );
        // SSF 1.0 complex subject: the user.
        assert_eq!(
            parse(
                &json!({"user": {"format": "iss_sub", "iss": "https://idp.example", "sub": "alice"},
                          "session": {"format": "opaque", "id": "s1"}})
            ),
            Ok(SubjectId::IssSub(alice))
        );
        assert_eq!(
            parse(&json!({"format": "email", "email": "a@Example.com"})),
            Ok(SubjectId::Email("a@example.com".into()))
        );
        assert_eq!(
            parse(&json!({"format": "phone_number", "phone_number": "+1"})),
            Ok(SubjectId::Other)
        );
        for bad in [
            json!("alice"),
            json!({}),
            json!({"format": "iss_sub", "iss": "https://idp.example"}),
            json!({"format": "iss_sub", "iss": "https://idp.example", "sub": 7}),
            json!({"format": "email", "email": "no-at-sign"}),
            json!({"format": "aliases", "identifiers": []}),
            json!({"format": "aliases", "identifiers": [{"format": "aliases", "identifiers": [{"format": "email", "email": "a@b"}]}]}),
            json!({"format": 5}),
        ] {
            assert!(parse(&bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn only_trusted_issuers_map() {
        let trusted = vec!["https://idp.example".to_owned()];
        let id = |iss: &str| {
            SubjectId::IssSub(Person {
                iss: iss.into(),
                sub: "alice".into(),
            })
        };
        assert!(people(&id("https://other.example"), &trusted, None)
            .unwrap_or_default()
            .is_empty());
        assert_eq!(
            people(&id("https://idp.example"), &trusted, None)
                .unwrap_or_default()
                .len(),
            1
        );
        // aliases: any mapping member maps; duplicates once.
        let a = SubjectId::Aliases(vec![
            id("https://other.example"),
            id("https://idp.example"),
            id("https://idp.example"),
        ]);
        assert_eq!(people(&a, &trusted, None).unwrap_or_default().len(), 1);
        // An email without map_email maps to no one.
        assert!(
            people(&SubjectId::Email("a@b.example".into()), &trusted, None)
                .unwrap_or_default()
                .is_empty()
        );
    }
}
