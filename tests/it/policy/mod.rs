//! The policy: its CLI, hot reload, and its JSON schema.
mod cli;
mod reload;
mod schema;
