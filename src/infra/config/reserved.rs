//! Config keys reserved for this wave's features (issue 38), refused by
//! [`super::Config::parse`] with "reserved: not yet implemented (issue N)"
//! until their feature lands: it then takes the key out of this list, adds
//! it to `raw.rs`, and moves its row in `docs/CONFIGURATION.md` from
//! "Reserved keys" to its section's table.

use crate::infra::reserved::ReservedKey;

const fn key(key: &'static str, doc_type: &'static str, issue: u32) -> ReservedKey {
    ReservedKey {
        key,
        doc_type,
        issue,
    }
}

/// Every reserved config key, in the order of `docs/CONFIGURATION.md`.
pub const RESERVED_KEYS: &[ReservedKey] = &[
    // Issue 41: upstream authorization servers (token exchange, ID-JAG).
    key("upstreams.<name>.send_authorization_details", "boolean", 41),
];
