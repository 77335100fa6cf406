//! The policy: its CLI, hot reload, and its JSON schema.
mod ci_recipe;
mod cli;
mod reload;
mod schema;
