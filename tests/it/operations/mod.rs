//! What an operator sees and does: audit, metrics, the admin socket, and the
//! README walkthrough.
mod admin;
mod audit;
mod cli_errors;
mod contract;
mod key_rotation;
mod messages;
mod metrics_listener;
mod startup;
mod version;
mod walkthrough;
pub(crate) mod webhooks;
