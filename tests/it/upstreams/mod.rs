//! Upstream authorization servers: `source = "exchange"` resources, one
//! RFC 8693 exchange per derive at the organisation's AS.
mod check;
mod client_auth;
mod clients;
mod exchange;
mod id_jag;
mod introspect;
mod mcp;
mod reuse;
