//! What `deploy/` relies on: the broker starts in the layouts the shipped
//! systemd unit and Kubernetes manifest give it.
mod init_scripts;
mod kubelet;
mod layout;
mod manifest;
mod observability;
mod systemd;
mod systemd_layout;
mod vault_keys;
