//! RFC 9396 `authorization_details` checked against a tool's declared
//! types: every entry names a declared `type`, every member is a declared
//! field of the declared kind, every required field is there. Nothing the
//! policy does not declare is accepted, so nothing reaches a token (or an
//! approval page) unseen: a hidden `bcc` is refused, not dropped.

use serde_json::Value;

use super::{FieldKind, Tool};

/// At most this many entries in one request.
pub(crate) const MAX_ENTRIES: usize = 16;
/// At most this many strings in one list field.
pub(crate) const MAX_LIST: usize = 100;
/// The largest integer every JSON reader represents exactly (2^53 - 1).
pub(crate) const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// Why details were refused (`invalid_authorization_details`, RFC 9396
/// section 5). The messages name the entry, the declared type and the
/// declared field, never a value or an undeclared name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DetailsError {
    /// Not a JSON array of 1 to [`MAX_ENTRIES`] objects.
    #[error("authorization_details must be a JSON array of 1 to {MAX_ENTRIES} objects")]
    Shape,
    /// The tool declares no `authorization_details` type.
    #[error("the policy declares no authorization_details type for this tool")]
    NotAccepted,
    /// The tool requires details and the request has none.
    #[error("the policy requires authorization_details for this tool")]
    Missing,
    /// An entry's `type` is missing, not a string, or not declared.
    #[error("entry {0}: its type is missing or not one the policy declares for this tool")]
    Type(usize),
    /// An entry carries a member the type does not declare.
    #[error("entry {index}: it carries a field the policy does not declare for type {ty:?}")]
    Undeclared {
        /// The entry.
        index: usize,
        /// Its (declared) type.
        ty: String,
    },
    /// A declared field holds the wrong kind of value.
    #[error("entry {index}: field {field:?} of type {ty:?} must be {expected}")]
    Kind {
        /// The entry.
        index: usize,
        /// Its type.
        ty: String,
        /// The field.
        field: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A required field is missing.
    #[error("entry {index}: required field {field:?} of type {ty:?} is missing")]
    Required {
        /// The entry.
        index: usize,
        /// Its type.
        ty: String,
        /// The field.
        field: String,
    },
}

fn expected(kind: FieldKind) -> &'static str {
    match kind {
        FieldKind::String => "a string",
        FieldKind::Strings => "a list of at most 100 strings",
        FieldKind::Integer => "an integer within ±(2^53 - 1)",
    }
}

fn kind_ok(kind: FieldKind, v: &Value) -> bool {
    match (kind, v) {
        (FieldKind::String, Value::String(_)) => true,
        (FieldKind::Strings, Value::Array(a)) => {
            a.len() <= MAX_LIST && a.iter().all(Value::is_string)
        }
        (FieldKind::Integer, Value::Number(n)) => n
            .as_i64()
            .is_some_and(|i| (-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).contains(&i)),
        _ => false,
    }
}

/// Checks `details` (the request's, if any) against `tool`'s declarations.
/// `Ok(None)`: no details, and none required.
pub(crate) fn check(tool: &Tool, details: Option<&Value>) -> Result<Option<Value>, DetailsError> {
    let Some(details) = details else {
        return if tool.require_details {
            Err(DetailsError::Missing)
        } else {
            Ok(None)
        };
    };
    if tool.details.is_empty() {
        return Err(DetailsError::NotAccepted);
    }
    let Value::Array(entries) = details else {
        return Err(DetailsError::Shape);
    };
    if entries.is_empty() || entries.len() > MAX_ENTRIES {
        return Err(DetailsError::Shape);
    }
    for (index, e) in entries.iter().enumerate() {
        let Value::Object(members) = e else {
            return Err(DetailsError::Shape);
        };
        let Some((ty, declared)) = members
            .get("type")
            .and_then(Value::as_str)
            .and_then(|t| tool.details.get_key_value(t))
        else {
            return Err(DetailsError::Type(index));
        };
        for (name, value) in members {
            if name == "type" {
                continue;
            }
            let Some(field) = declared.fields.get(name) else {
                return Err(DetailsError::Undeclared {
                    index,
                    ty: ty.clone(),
                });
            };
            if !kind_ok(field.kind, value) {
                return Err(DetailsError::Kind {
                    index,
                    ty: ty.clone(),
                    field: name.clone(),
                    expected: expected(field.kind),
                });
            }
        }
        if let Some((name, _)) = declared
            .fields
            .iter()
            .find(|(n, f)| f.required && !members.contains_key(n.as_str()))
        {
            return Err(DetailsError::Required {
                index,
                ty: ty.clone(),
                field: name.clone(),
            });
        }
    }
    Ok(Some(details.clone()))
}

/// The fields of `details` whose values the policy lets the audit log
/// carry in clear, as `{type}.{field}` -> value (the rest is recorded by
/// the hash of all details only). `details` must have passed [`check`].
pub(crate) fn loggable(tool: &Tool, details: &Value) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    for (i, e) in details.as_array().into_iter().flatten().enumerate() {
        let Some(ty) = e.get("type").and_then(Value::as_str) else {
            continue;
        };
        let Some(declared) = tool.details.get(ty) else {
            continue;
        };
        for (name, f) in &declared.fields {
            if let (true, Some(v)) = (f.log_in_clear, e.get(name)) {
                out.insert(format!("{i}.{ty}.{name}"), v.clone());
            }
        }
    }
    out
}
