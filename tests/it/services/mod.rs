//! Connected third-party services: the provider client, the vault, the
//! accounts CLI, and the whole connect loop.
mod accounts_cli;
mod connected;
mod github_grant;
mod pages;
mod person_stop;
mod refresh_replicas;
mod upstream_client;
mod vault_refresh;
