//! Policy keys reserved for this wave's features (issue 38), refused by
//! [`super::Policy::parse`] with "reserved: not yet implemented (issue N)"
//! until their feature lands: it then takes the key out of this list, adds
//! it to `load.rs` (and `proto/policy.schema.json`, which refuses it until
//! then), and drops the mark from its row in `policy/README.md`.

use crate::infra::reserved::ReservedKey;

/// Every reserved policy key, in the order of `policy/README.md`.
pub const RESERVED_KEYS: &[ReservedKey] = &[
    // Issue 41: the upstream authorization server of an exchange
    // resource, and its documented higher lifetime ceiling.
    ReservedKey {
        key: "resources.<uri>.max_ttl",
        doc_type: "duration",
        issue: 41,
    },
];

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{Policy, PolicyError};
    use super::*;

    const FILE: &str = "/etc/credbroker/policy.toml";

    const BASE: &str = r#"agent = "repo-helper"

[resources."https://api.example/notes"]
source = "self"

[tools."notes.read"]
resource = "https://api.example/notes"
scopes = ["notes:read"]
steps = ["summarize"]
"#;

    fn parse(text: &str) -> Result<Policy, PolicyError> {
        Policy::parse(Path::new(FILE), text.as_bytes())
    }

    #[test]
    fn every_reserved_policy_key_is_refused_as_reserved_and_documented() {
        // The control: the policy without them loads.
        parse(BASE).expect("the base policy loads");
        let readme =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/README.md"))
                .unwrap();
        for r in RESERVED_KEYS {
            let (text, key) = match r.key {
                "resources.<uri>.max_ttl" => (
                    BASE.replace(
                        "source = \"self\"\n",
                        "source = \"self\"\nmax_ttl = \"600s\"\n",
                    ),
                    "resources.\"https://api.example/notes\".max_ttl",
                ),
                other => panic!("{other}: add a case for the new reserved key"),
            };
            let Err(PolicyError::Invalid(p)) = parse(&text) else {
                panic!("{}: accepted", r.key);
            };
            assert_eq!(p.len(), 1, "{p:?}");
            assert_eq!(p[0].key.as_deref(), Some(key));
            let shown = p[0].to_string();
            assert!(
                shown.starts_with(FILE)
                    && shown.ends_with(&format!(
                        "{key}: reserved: not yet implemented (issue {})",
                        r.issue
                    )),
                "{shown}"
            );
            // policy/README.md marks it in its table.
            let leaf = r.key.rsplit('.').next().unwrap();
            assert!(
                readme
                    .lines()
                    .any(|l| l.starts_with(&format!("| `{leaf}` |"))
                        && l.contains(&format!(
                            "reserved: not yet implemented (issue {})",
                            r.issue
                        ))),
                "policy/README.md has no row for {} marked reserved",
                r.key
            );
        }
    }
}
