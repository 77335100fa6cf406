//! Every init container of every Kubernetes manifest in deploy/, run as the
//! manifest runs it (its `sh -c` script, as its uid and gid with the pod's
//! groups, `setpriv`) over volumes laid out as the kubelet would (kubelet.rs),
//! on a new install and on an upgrade:
//!
//! - new install: the Secret holds exactly the keys of the `kubectl create
//!   secret` command the manifest documents, and every emptyDir is empty;
//! - upgrade: the Secret also holds an older install's vault key files
//!   (`vault-<id>.key`), and the script runs twice over the same emptyDirs
//!   (a pod restart keeps them; the second run meets the first's files).
//!
//! After each, every key file the broker's config names is where the
//! broker container reads it (through its own mounts), a regular file of
//! the broker's uid, mode 0600, with the Secret's bytes; the vault key
//! directory the config resolves to (the default, beside the master key)
//! holds exactly the upgrade's keys, as `<id>.key`, 0600. The broker itself
//! is started in deploy/kubernetes.yaml's layout by layout.rs; the
//! replicated manifest's broker needs its PostgreSQL server, which the
//! store tests start with another layout (tests/it/store/).
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use credbroker::internals::config::Config;

use super::kubelet::{
    block, containers, empty_dir, manifests, pod_groups, projected, relocate, resolve, secret_keys,
    Container,
};
use crate::support::layout::mode;

/// The two vault key files of the upgrade: (id, bytes).
fn older_install_keys() -> Vec<(String, Vec<u8>)> {
    ["3fcb6d8d9dc2ea8d", "a0b1c2d3e4f50617"]
        .iter()
        .enumerate()
        .map(|(i, id)| (id.to_string(), vec![i as u8 + 1; 32]))
        .collect()
}

/// Lays out the pod's volumes under `root` and runs every init container's
/// script (`runs` times); the output of the last failing run, if one fails.
fn run_inits(
    manifest: &str,
    inits: &[Container],
    secret: &[(String, Vec<u8>)],
    root: &Path,
    runs: usize,
    edit: impl Fn(&str) -> String,
) -> Result<(), String> {
    let (fs_group, socket_group) = pod_groups(manifest);
    let vdir = |v: &str| root.join("volumes").join(v);
    for init in inits {
        for m in &init.mounts {
            let d = vdir(&m.volume);
            if d.exists() {
                continue;
            }
            match m.kind.as_str() {
                // defaultMode 0440 with the fsGroup (asserted below),
                // mounted read-only.
                "secret" => {
                    assert!(m.read_only, "{}: the Secret is mounted writable", init.name);
                    projected(&d, secret, 0o440, fs_group)
                }
                "emptyDir" | "persistentVolumeClaim" | "volumeClaimTemplate" => {
                    empty_dir(&d, fs_group)
                }
                other => panic!("{}: a {other} volume is not laid out here", init.name),
            }
        }
    }
    for _ in 0..runs {
        for init in inits {
            let script = edit(&relocate(
                init.script
                    .as_deref()
                    .unwrap_or_else(|| panic!("{}: no `sh -c` script", init.name)),
                &init.mounts,
                vdir,
            ));
            let out = Command::new("setpriv")
                .arg(format!("--reuid={}", init.uid))
                .arg(format!("--regid={}", init.gid))
                .arg(format!("--groups={socket_group},{fs_group}"))
                .args(["--", "sh", "-c", &script])
                .output()
                .unwrap();
            if !out.status.success() {
                return Err(format!(
                    "{}: {}{}\nscript: {script}",
                    init.name,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    Ok(())
}

/// Checks what the broker container finds after the init containers ran.
fn check_broker_view(
    name: &str,
    manifest: &str,
    root: &Path,
    secret: &[(String, Vec<u8>)],
    vault_keys: &[(String, Vec<u8>)],
) {
    let broker = containers(manifest, "containers")
        .into_iter()
        .find(|c| c.name == "credbroker")
        .unwrap_or_else(|| panic!("{name}: no container named credbroker"));
    let vdir = |v: &str| root.join("volumes").join(v);
    let text = block(manifest, "credbroker.toml");
    let cfg = Config::parse(Path::new("/etc/credbroker/credbroker.toml"), &text)
        .unwrap_or_else(|e| panic!("{name}: credbroker.toml: {e}"));
    // Every Secret key is a file the config names, copied for the broker.
    for (key, bytes) in secret.iter().filter(|(k, _)| !k.starts_with("vault-")) {
        let named: Vec<&str> = text
            .split('"')
            .filter(|s| s.starts_with('/') && s.ends_with(&format!("/{key}")))
            .collect();
        assert_eq!(
            named.len(),
            1,
            "{name}: the config names the Secret's {key} {} times",
            named.len()
        );
        let at = resolve(Path::new(named[0]), &broker.mounts, vdir)
            .unwrap_or_else(|| panic!("{name}: {} is in none of the broker's mounts", named[0]));
        let meta = std::fs::symlink_metadata(&at)
            .unwrap_or_else(|e| panic!("{name}: {} ({}): {e}", named[0], at.display()));
        assert!(meta.is_file(), "{name}: {} is not a regular file", named[0]);
        assert_eq!(
            (meta.uid(), meta.mode() & 0o7777),
            (broker.uid, 0o600),
            "{name}: {}",
            named[0]
        );
        assert_eq!(&std::fs::read(&at).unwrap(), bytes, "{name}: {}", named[0]);
    }
    // The vault key directory the broker reads for an older install's keys.
    let dir = resolve(&cfg.vault_key_dir, &broker.mounts, vdir).unwrap_or_else(|| {
        panic!(
            "{name}: {} is in none of the broker's mounts",
            cfg.vault_key_dir.display()
        )
    });
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    let want: Vec<String> = vault_keys
        .iter()
        .map(|(id, _)| format!("{id}.key"))
        .collect();
    assert_eq!(found, want, "{name}: {}", cfg.vault_key_dir.display());
    for (id, bytes) in vault_keys {
        let f = dir.join(format!("{id}.key"));
        let meta = std::fs::symlink_metadata(&f).unwrap();
        assert!(meta.is_file());
        assert_eq!(
            (meta.uid(), meta.mode() & 0o7777),
            (broker.uid, 0o600),
            "{}",
            f.display()
        );
        assert_eq!(&std::fs::read(&f).unwrap(), bytes);
    }
}

#[test]
fn every_manifests_init_scripts_run_on_a_new_install_and_on_an_upgrade() {
    if !nix::unistd::Uid::effective().is_root() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the layout harness needs root (chown, setpriv) and CI runs as root"
        );
        eprintln!("SKIP every_manifests_init_scripts_run_on_a_new_install_and_on_an_upgrade: needs root to lay out other users' files");
        return;
    }
    let mut ran = Vec::new();
    for (name, manifest) in manifests() {
        let inits = containers(&manifest, "initContainers");
        if !manifest.contains("\nkind: StatefulSet\n") && !manifest.contains("\nkind: Deployment\n")
        {
            assert!(inits.is_empty());
            continue;
        }
        assert!(
            !inits.is_empty(),
            "{name}: a pod without the init container that copies its keys"
        );
        assert!(
            manifest.contains("secretName: credbroker-keys")
                && manifest.contains("defaultMode: 0440"),
            "{name}: the Secret is not credbroker-keys with defaultMode 0440"
        );
        let secret: Vec<(String, Vec<u8>)> = secret_keys(&manifest)
            .into_iter()
            .enumerate()
            .map(|(i, k)| (k, vec![0x40 + i as u8; 32]))
            .collect();
        assert!(
            secret.iter().any(|(k, _)| k == "master.key"),
            "{name}: {secret:?}"
        );

        // A new install: nothing but the documented keys.
        let root = tempfile::tempdir().unwrap();
        mode(root.path(), 0o755);
        if let Err(e) = run_inits(&manifest, &inits, &secret, root.path(), 1, str::to_string) {
            panic!("{name}: the init containers fail on a new install: {e}");
        }
        check_broker_view(&name, &manifest, root.path(), &secret, &[]);

        // The harness sees a script that fails on a new install: the
        // vault loop without its guard for an unmatched glob (the loop
        // deploy/kubernetes-replicated.yaml shipped with) fails here...
        let unguarded = |s: &str| s.replace("do [ -e \"$f\" ] || continue;", "do");
        assert!(inits
            .iter()
            .any(|c| c.script.as_deref().unwrap_or("").contains("vault-*.key")));
        let root = tempfile::tempdir().unwrap();
        mode(root.path(), 0o755);
        assert!(
            run_inits(&manifest, &inits, &secret, root.path(), 1, unguarded).is_err(),
            "{name}: the unguarded vault loop passed on a new install"
        );
        // ... and passes on a populated mount, as it always did.
        let mut upgrade = secret.clone();
        let keys = older_install_keys();
        upgrade.extend(
            keys.iter()
                .map(|(id, b)| (format!("vault-{id}.key"), b.clone())),
        );
        let root = tempfile::tempdir().unwrap();
        mode(root.path(), 0o755);
        run_inits(&manifest, &inits, &upgrade, root.path(), 1, unguarded).unwrap();

        // An upgrade: the older install's vault keys in the Secret, and the
        // script run twice over the same emptyDirs (a pod restart).
        let root = tempfile::tempdir().unwrap();
        mode(root.path(), 0o755);
        if let Err(e) = run_inits(&manifest, &inits, &upgrade, root.path(), 2, str::to_string) {
            panic!("{name}: the init containers fail on an upgrade: {e}");
        }
        check_broker_view(&name, &manifest, root.path(), &upgrade, &keys);
        ran.push(name);
    }
    assert_eq!(
        ran,
        [
            "deploy/kubernetes-replicated.yaml",
            "deploy/kubernetes.yaml"
        ],
        "the pods the harness ran"
    );
}
