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

/// The lines of a config that set the deprecated `[vault] key_dir`: the
/// table or the key itself, comments aside.
fn deprecated_vault_lines(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter(|l| *l == "[vault]" || l.contains("key_dir"))
        .collect()
}

#[test]
fn example_config_of_a_new_install_has_no_deprecated_vault_key_dir() {
    assert_eq!(deprecated_vault_lines(CONFIG), Vec::<&str>::new());
    assert!(!CONFIG.contains("key_dir"), "not even in a comment");
    // Positive control: the lines the example carried before are found.
    let old = format!("{CONFIG}\n[vault]\nkey_dir = \"/var/lib/credbroker/vault-keys\"\n");
    assert_eq!(
        deprecated_vault_lines(&old),
        ["[vault]", "key_dir = \"/var/lib/credbroker/vault-keys\""]
    );
}

const SYSUSERS: &str = include_str!("../../../deploy/credbroker.sysusers");

/// The accounts a sysusers.d file declares: (users, groups); a `u` line
/// with `-` as its id also makes the user's own group.
fn sysusers(text: &str) -> (Vec<String>, Vec<String>) {
    let (mut users, mut groups) = (Vec::new(), Vec::new());
    for l in text.lines().map(str::trim) {
        let mut f = l.split_whitespace();
        match (f.next(), f.next(), f.next()) {
            (Some("u"), Some(name), Some(id)) => {
                users.push(name.to_string());
                if id == "-" {
                    groups.push(name.to_string());
                }
            }
            (Some("g"), Some(name), _) => groups.push(name.to_string()),
            _ => {}
        }
    }
    (users, groups)
}

// scripts/check-deploy applies the file with systemd-sysusers in an empty
// root; this reads it, so that a unit naming an account the file does not
// declare fails in `cargo test` too.
#[test]
fn sysusers_file_declares_every_account_the_unit_names() {
    let (users, groups) = sysusers(SYSUSERS);
    assert_eq!(values("User"), users, "deploy/credbroker.sysusers");
    let named: Vec<String> = values("Group")
        .into_iter()
        .chain(values("SupplementaryGroups"))
        .collect();
    assert_eq!(named, ["credbroker", "orchestrator"]);
    for g in &named {
        assert!(
            groups.contains(g),
            "deploy/credbroker.sysusers declares no group {g}"
        );
    }
    // Positive control of the reader: without its `g` line the socket
    // group is missing.
    let (_, fewer) = sysusers(&SYSUSERS.replace("g orchestrator", "# g orchestrator"));
    assert!(!fewer.contains(&"orchestrator".to_string()));
}
