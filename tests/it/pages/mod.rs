//! The connect-link pages: over HTTP in-process, with OIDC sign-in, from the
//! CLI, and in a real browser.
mod browser;
mod cli;
mod e2e;
mod http;
mod oidc;
mod provider_flow;
mod real_services;
