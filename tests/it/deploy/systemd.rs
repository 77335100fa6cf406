//! deploy/credbroker.service read together with deploy/credbroker.example.toml:
//! under `ProtectSystem=strict` the only writable paths are the unit's
//! `StateDirectory=` and `RuntimeDirectory=` (and `ReadWritePaths=`), so
//! every path the broker writes must lie in one of them; the socket group
//! must be among `SupplementaryGroups=` (chown to a group needs
//! membership). The regressions of issue 15: `key_dir` under /etc
//! (`Permission denied`) and no `SupplementaryGroups=` (then
//! `Operation not permitted`; the refusal now names the group and the fix).
//! `systemd-analyze` checks the unit's syntax
//! in scripts/check-deploy.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::path::{Path, PathBuf};

use credbroker::internals::config::Config;

const UNIT: &str = include_str!("../../../deploy/credbroker.service");
const CONFIG: &str = include_str!("../../../deploy/credbroker.example.toml");

/// Every value of `key=` in the unit, split on whitespace.
fn values(key: &str) -> Vec<String> {
    UNIT.lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .flat_map(|v| v.split_whitespace().map(str::to_string))
        .collect()
}

#[test]
fn systemd_unit_gives_the_example_config_every_path_and_group_it_needs() {
    assert_eq!(values("ProtectSystem"), ["strict"]);
    let cfg = Config::parse(Path::new("/etc/credbroker/credbroker.toml"), CONFIG).unwrap();
    let mut writable: Vec<PathBuf> = values("StateDirectory")
        .iter()
        .map(|d| Path::new("/var/lib").join(d))
        .collect();
    let runtime: Vec<PathBuf> = values("RuntimeDirectory")
        .iter()
        .map(|d| Path::new("/run").join(d))
        .collect();
    writable.extend(runtime.iter().cloned());
    writable.extend(values("ReadWritePaths").iter().map(PathBuf::from));
    let sled_dir = cfg.store.sled_dir().unwrap().to_path_buf();
    for (key, p) in [
        ("store", &sled_dir),
        ("audit_log", &cfg.audit_log),
        ("vault.key_dir", &cfg.vault_key_dir),
        ("socket.path", &cfg.socket.path),
        ("admin.socket", &cfg.admin_socket),
    ] {
        assert!(
            writable.iter().any(|w| p.starts_with(w)),
            "deploy/credbroker.example.toml {key} = {} is read-only under the unit's ProtectSystem=strict (writable: {writable:?})",
            p.display()
        );
    }
    // The admin socket is not in the orchestrator's socket directory.
    assert_ne!(cfg.admin_socket.parent(), cfg.socket.path.parent());
    let group = cfg
        .socket
        .group
        .as_deref()
        .expect("the example names a socket group");
    assert!(
        values("SupplementaryGroups").iter().any(|g| g == group),
        "socket.group {group} is not in the unit's SupplementaryGroups="
    );
    // Positive control of the check itself: a path under /etc is refused.
    assert!(!writable
        .iter()
        .any(|w| Path::new("/etc/credbroker/keys/vault").starts_with(w)));
}
