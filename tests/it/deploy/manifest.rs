//! deploy/kubernetes.yaml read as the kubelet would lay it out: its
//! ConfigMap's config parses with the real parser, and every path the config
//! names lies in a volume the broker container mounts (writable where the
//! broker writes, the copied secrets where it reads keys). The schema itself
//! is checked by kubernetes-validate in scripts/check-deploy.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::path::Path;

use credbroker::internals::config::Config;

const MANIFEST: &str = include_str!("../../../deploy/kubernetes.yaml");

/// The block scalar under `key: |` (indented deeper than the key).
fn block(text: &str, key: &str) -> String {
    let mut lines = text.lines().skip_while(|l| l.trim() != format!("{key}: |"));
    let head = lines.next().expect("key present");
    let indent = head.len() - head.trim_start().len();
    lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
        .map(|l| l.get(indent + 2..).unwrap_or("").to_string() + "\n")
        .collect()
}

/// The `mountPath`s of the container named `name` (up to the next `- name:`
/// at the containers' indentation).
fn mounts(name: &str) -> Vec<(String, bool)> {
    let start = MANIFEST
        .find(&format!("        - name: {name}\n          image:"))
        .expect("container present");
    let rest = &MANIFEST[start + 10..];
    let end = rest.find("\n        - name: ").unwrap_or(rest.len());
    let body = &rest[..end];
    let lines: Vec<&str> = body.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if let Some(p) = l.trim().strip_prefix("mountPath: ") {
            let ro = lines
                .get(i + 1)
                .is_some_and(|n| n.trim() == "readOnly: true");
            out.push((p.to_string(), ro));
        }
    }
    out
}

fn mount_of(path: &Path, mounts: &[(String, bool)]) -> Option<(String, bool)> {
    mounts
        .iter()
        .filter(|(m, _)| path.starts_with(m))
        .max_by_key(|(m, _)| m.len())
        .cloned()
}

/// The metrics wiring of a manifest (issue 39 item 5): the broker's
/// metrics listener on loopback, not the public port; the collector
/// sidecar scrapes exactly that address, from its own projection of the
/// ConfigMap, and mounts nothing of the broker's.
fn metrics_wired(manifest: &str, cfg: &Config) {
    let listen = cfg.metrics.as_ref().expect("[metrics] listen").listen;
    assert!(listen.ip().is_loopback(), "{listen}");
    assert_ne!(
        Some(listen.port()),
        cfg.public.as_ref().map(|p| p.listen.port())
    );
    let collector = block(manifest, "collector.yml");
    let targets: Vec<&str> = collector
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- targets: "))
        .collect();
    assert_eq!(targets, [format!("[\"{listen}\"]")], "{collector}");
    assert!(manifest
        .contains("              - key: collector.yml\n                path: prometheus.yml\n"));
    let start = manifest
        .find("        - name: metrics-collector\n")
        .expect("the collector sidecar");
    let sidecar = &manifest[start..];
    let end = sidecar[10..]
        .find("\n        - name: ")
        .map_or(sidecar.len(), |e| e + 10);
    let sidecar = &sidecar[..end];
    let mounts: Vec<&str> = sidecar
        .lines()
        .filter_map(|l| l.trim().strip_prefix("mountPath: "))
        .collect();
    assert_eq!(mounts, ["/etc/collector", "/collector"], "{sidecar}");
    assert!(sidecar.contains("--config.file=/etc/collector/prometheus.yml"));
}

#[test]
fn kubernetes_manifest_config_parses_and_every_path_is_mounted_as_needed() {
    assert!(MANIFEST.contains("  replicas: 1\n  strategy:\n    type: Recreate\n"));
    assert!(MANIFEST.contains("seccompProfile:\n          type: RuntimeDefault"));
    let text = block(MANIFEST, "credbroker.toml");
    let cfg = Config::parse(Path::new("/etc/credbroker/credbroker.toml"), &text)
        .unwrap_or_else(|e| panic!("deploy/kubernetes.yaml credbroker.toml: {e}"));
    assert_eq!(cfg.socket.group.as_deref(), Some("2000"));
    assert!(MANIFEST.contains("supplementalGroups: [2000]"));
    let broker = mounts("credbroker");
    let orchestrator = mounts("orchestrator");
    // Written by the broker: on a writable mount, never the root filesystem.
    let sled_dir = cfg.store.sled_dir().unwrap().to_path_buf();
    for p in [&sled_dir, &cfg.socket.path] {
        let (m, ro) =
            mount_of(p, &broker).unwrap_or_else(|| panic!("{} is in no volume", p.display()));
        assert!(!ro, "{} is on the read-only mount {m}", p.display());
    }
    // The socket's own directory is the broker's, inside the shared emptyDir,
    // not the emptyDir's (root-owned) root.
    let sock_dir = cfg.socket.path.parent().unwrap();
    assert!(orchestrator
        .iter()
        .any(|(m, _)| sock_dir.parent() == Some(Path::new(m))));
    // Keys are read from the init container's 0600 copies, not the Secret.
    let (m, _) = mount_of(&cfg.master_key_file, &broker).unwrap();
    assert_eq!(m, "/run/credbroker-secrets");
    assert!(
        !orchestrator.iter().any(|(o, _)| o == &m),
        "the orchestrator mounts the secrets"
    );
    assert!(mount_of(&cfg.master_key_file, &orchestrator).is_none());
    // An older install's vault key files, read once and never written, are
    // among those copies (tests/it/deploy/init_scripts.rs runs the copy).
    assert_eq!(
        mount_of(&cfg.vault_key_dir, &broker).unwrap().0,
        "/run/credbroker-secrets"
    );
    // No deprecated key in a new install's config.
    assert!(!text.contains("[vault]") && !text.contains("key_dir"));
    metrics_wired(MANIFEST, &cfg);
}

const REPLICATED: &str = include_str!("../../../deploy/kubernetes-replicated.yaml");

#[test]
fn replicated_manifest_config_parses_on_postgres_with_a_volume_per_pod() {
    assert!(REPLICATED.contains("kind: StatefulSet\n"));
    assert!(REPLICATED.contains("  replicas: 3\n"));
    assert!(REPLICATED.contains("  volumeClaimTemplates:\n"));
    let text = block(REPLICATED, "credbroker.toml");
    let cfg = Config::parse(Path::new("/etc/credbroker/credbroker.toml"), &text)
        .unwrap_or_else(|e| panic!("deploy/kubernetes-replicated.yaml credbroker.toml: {e}"));
    let credbroker::internals::store::Backend::Postgres(pg) = &cfg.store else {
        panic!("the replicated example is not on PostgreSQL");
    };
    // The database secrets are read from the broker-only copy of the
    // Secret; the audit log is on the pod's own volume.
    for p in [
        pg.password_file.as_ref().unwrap(),
        pg.ca_file.as_ref().unwrap(),
    ] {
        assert!(p.starts_with("/run/credbroker-secrets/"), "{}", p.display());
    }
    assert!(cfg.vault_key_dir.starts_with("/run/credbroker-secrets/"));
    assert!(!text.contains("[vault]") && !text.contains("key_dir"));
    // A headless Service governs the StatefulSet; a ClusterIP one fronts
    // the public listeners, without client affinity (the proxy's nonces
    // are valid at every replica: docs/STORE.md).
    assert!(REPLICATED.contains("  serviceName: credbroker-pods\n"));
    assert!(REPLICATED.contains("  name: credbroker-pods\nspec:\n  clusterIP: None\n"));
    assert!(REPLICATED.contains("  type: ClusterIP\n"));
    assert!(!REPLICATED.contains("sessionAffinity"));
    assert!(cfg.audit_log.starts_with("/var/lib/credbroker/"));
    assert!(REPLICATED
        .contains("            - name: state\n              mountPath: /var/lib/credbroker\n"));
    metrics_wired(REPLICATED, &cfg);
}
