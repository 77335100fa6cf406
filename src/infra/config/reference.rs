//! The keys the parser accepts, read from the parser itself: a
//! deserializer that answers every request of [`RawConfig`]'s derived
//! `Deserialize` impls with a placeholder value and records what was asked
//! for (each struct's field list, each value's type). `docs/CONFIGURATION.md`
//! is tested against this list (`tests/it/reference/`), so a key added to
//! `raw.rs` without its documentation, or documented but refused, fails CI.
//!
//! Whether a key is required is learnt the same way: the trace is run again
//! with that one key left out, and the derived impl's `missing field` error
//! says it is. Requirements that only stage two enforces (at least one
//! trusted issuer, a `sign_in` on each) are not visible here; the test
//! checks those against [`super::Config::parse`].

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};

use super::raw::RawConfig;

/// One key of the configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedKey {
    /// Its dotted path: `socket.path`, `trusted_issuers[].sign_in.kind`
    /// (`[]`: any element of an array of tables), `providers.<name>.timeout`
    /// (`<name>`: any key of a table of tables).
    pub key: String,
    /// Its TOML type: `string`, `integer`, `boolean`, `table`, `array of
    /// strings`, `array of integers`, `array of tables`, `table of tables`.
    pub toml_type: String,
    /// Whether the file is refused without it (when its table is present).
    pub required: bool,
}

/// Every key the parser accepts, in the order of the raw structs.
pub fn accepted_keys() -> Vec<AcceptedKey> {
    let Ok(found) = trace(None) else {
        // The placeholder values satisfy every derived impl (the unit test
        // below would fail otherwise); an empty list then fails the doc test.
        return Vec::new();
    };
    found
        .into_iter()
        .map(|(key, toml_type)| {
            let required = trace(Some(&key)).is_err_and(|e| e.0.starts_with("missing field"));
            AcceptedKey {
                key,
                toml_type,
                required,
            }
        })
        .collect()
}

/// Deserializes a [`RawConfig`] from the tracer, leaving out the key `skip`.
fn trace(skip: Option<&str>) -> Result<Vec<(String, String)>, TraceError> {
    let found = RefCell::new(Vec::new());
    let tracer = Tracer {
        path: String::new(),
        slot: Slot::Root,
        found: &found,
        skip,
    };
    let _: RawConfig = serde::Deserialize::deserialize(tracer)?;
    Ok(found.into_inner())
}

/// What the tracer failed on: a required key left out, or a type it does
/// not know (a new field type must be taught to it, not skipped).
#[derive(Debug)]
struct TraceError(String);

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TraceError {}

impl de::Error for TraceError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        TraceError(msg.to_string())
    }
}

/// Where the value being traced sits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// The document.
    Root,
    /// A key's value.
    Field,
    /// The element of an array (its type is the array's).
    Element,
    /// The value of a table of tables (`providers.<name>`).
    Entry,
}

struct Tracer<'a> {
    path: String,
    slot: Slot,
    found: &'a RefCell<Vec<(String, String)>>,
    skip: Option<&'a str>,
}

impl<'a> Tracer<'a> {
    fn record(&self, toml_type: &str) {
        let (path, ty) = match self.slot {
            Slot::Root => return,
            Slot::Field | Slot::Entry => (self.path.clone(), toml_type.to_string()),
            Slot::Element => (
                self.path.trim_end_matches("[]").to_string(),
                format!("array of {toml_type}s"),
            ),
        };
        let mut found = self.found.borrow_mut();
        if !found.iter().any(|(p, _)| *p == path) {
            found.push((path, ty));
        }
    }

    fn child(&self, path: String, slot: Slot) -> Tracer<'a> {
        Tracer {
            path,
            slot,
            found: self.found,
            skip: self.skip,
        }
    }
}

macro_rules! unsupported {
    ($($method:ident)*) => {
        $(fn $method<V: Visitor<'de>>(self, _: V) -> Result<V::Value, TraceError> {
            Err(TraceError(format!(
                "{}: the config reference does not know this type ({})",
                self.path,
                stringify!($method)
            )))
        })*
    };
}

impl<'de> de::Deserializer<'de> for Tracer<'_> {
    type Error = TraceError;

    unsupported! {
        deserialize_any deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_u8 deserialize_u16 deserialize_f32 deserialize_char
        deserialize_bytes deserialize_byte_buf deserialize_unit deserialize_identifier
        deserialize_ignored_any
    }

    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, TraceError> {
        self.record("boolean");
        v.visit_bool(false)
    }

    fn deserialize_u32<V: Visitor<'de>>(self, v: V) -> Result<V::Value, TraceError> {
        self.record("integer");
        v.visit_u32(1)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, TraceError> {
        self.record("integer");
        v.visit_u64(1)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, TraceError> {
        self.record("float");
        v.visit_f64(0.5)
    }

    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, TraceError> {
        self.record("string");
        v.visit_str("x")
    }

    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, TraceError> {
        self.record("string");
        v.visit_str("x")
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, TraceError> {
        v.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, TraceError> {
        self.deserialize_unit(v)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, TraceError> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, TraceError> {
        let element = self.child(format!("{}[]", self.path), Slot::Element);
        v.visit_seq(One(Some(element)))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, v: V) -> Result<V::Value, TraceError> {
        self.deserialize_any(v)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        v: V,
    ) -> Result<V::Value, TraceError> {
        self.deserialize_any(v)
    }

    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, TraceError> {
        self.record("table of tables");
        // A table of resources is keyed by resource URI, as the docs write it.
        let placeholder = if self.path.ends_with(".resources") {
            "<uri>"
        } else {
            "<name>"
        };
        let entry = self.child(format!("{}.{placeholder}", self.path), Slot::Entry);
        v.visit_map(Entries {
            entry: Some(entry),
            key: Some("name"),
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, TraceError> {
        self.record("table");
        v.visit_map(Fields {
            parent: self,
            fields,
            next: 0,
        })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, TraceError> {
        self.deserialize_any(v)
    }
}

/// A sequence of one element.
struct One<'a>(Option<Tracer<'a>>);

impl<'de> SeqAccess<'de> for One<'_> {
    type Error = TraceError;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, TraceError> {
        self.0.take().map(|t| seed.deserialize(t)).transpose()
    }
}

/// A table of tables with one entry.
struct Entries<'a> {
    entry: Option<Tracer<'a>>,
    key: Option<&'static str>,
}

impl<'de> MapAccess<'de> for Entries<'_> {
    type Error = TraceError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, TraceError> {
        self.key
            .take()
            .map(|k| seed.deserialize(k.into_deserializer()))
            .transpose()
    }
    fn next_value_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<T::Value, TraceError> {
        let entry = self
            .entry
            .take()
            .ok_or_else(|| TraceError("a value asked for twice".into()))?;
        seed.deserialize(entry)
    }
}

/// A struct's fields, each once, but the one being left out.
struct Fields<'a> {
    parent: Tracer<'a>,
    fields: &'static [&'static str],
    /// The index of the next key to hand out.
    next: usize,
}

impl Fields<'_> {
    fn path_of(&self, field: &str) -> String {
        match self.parent.slot {
            Slot::Root => field.to_string(),
            _ => format!("{}.{field}", self.parent.path),
        }
    }
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = TraceError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, TraceError> {
        while let Some(field) = self.fields.get(self.next).copied() {
            if Some(self.path_of(field).as_str()) == self.parent.skip {
                self.next += 1;
                continue;
            }
            return seed.deserialize(field.into_deserializer()).map(Some);
        }
        Ok(None)
    }
    fn next_value_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<T::Value, TraceError> {
        let field = self
            .fields
            .get(self.next)
            .copied()
            .ok_or_else(|| TraceError("a value without a key".into()))?;
        self.next += 1;
        seed.deserialize(self.parent.child(self.path_of(field), Slot::Field))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_the_raw_structs() {
        let keys = accepted_keys();
        let get = |k: &str| {
            keys.iter()
                .find(|a| a.key == k)
                .unwrap_or_else(|| panic!("{k} not traced: {keys:?}"))
        };
        assert_eq!(get("agent").toml_type, "string");
        assert!(get("agent").required);
        assert_eq!(get("socket").toml_type, "table");
        assert!(get("socket").required);
        assert!(!get("admin").required);
        assert!(!get("admin.socket").required);
        assert!(get("webhooks.<name>.url").required);
        assert!(!get("webhooks.<name>.max_concurrency").required);
        assert_eq!(get("socket.allowed_uids").toml_type, "array of integers");
        assert_eq!(get("dpop.require_nonce").toml_type, "boolean");
        assert!(!get("dpop.require_nonce").required);
        assert_eq!(get("trusted_issuers").toml_type, "array of tables");
        assert!(get("trusted_issuers[].issuer").required);
        assert!(get("trusted_issuers[].sign_in.kind").required);
        assert_eq!(get("providers").toml_type, "table of tables");
        assert_eq!(get("providers.<name>").toml_type, "table");
        assert!(get("providers.<name>.client_id").required);
        assert!(!get("providers.<name>.timeout").required);
        assert_eq!(get("providers.<name>.scopes").toml_type, "array of strings");
        // Every key once.
        let mut names: Vec<_> = keys.iter().map(|k| k.key.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), keys.len());
    }
}
