//! What the layout harnesses (layout.rs, init_scripts.rs) read from a
//! Kubernetes manifest of deploy/ and lay out as the kubelet would, without
//! a kubelet: the ConfigMap's files, the Secret's keys (from the
//! `kubectl create secret` command the manifest documents), each init
//! container's shell script with its uid, gid and mounts, and each
//! container's mounts. The manifests are read as text (no YAML parser among
//! the dependencies), in the shape deploy/ writes them; a manifest that
//! leaves that shape fails here, naming what is missing.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::support::layout::{chown, mode};

/// Every Kubernetes manifest in deploy/ (`*.yaml` directly in it), read from
/// the checkout when the test runs: a manifest added later is included
/// without editing the harness. Sorted by name.
pub(crate) fn manifests() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| {
            (
                format!("deploy/{}", p.file_name().unwrap().to_string_lossy()),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    assert!(
        out.iter().any(|(n, _)| n == "deploy/kubernetes.yaml"),
        "no manifests found in {}",
        dir.display()
    );
    out
}

/// The block scalar under `key: |` (indented deeper than the key).
pub(crate) fn block(text: &str, key: &str) -> String {
    let mut lines = text.lines().skip_while(|l| l.trim() != format!("{key}: |"));
    let head = lines.next().expect("key present");
    let indent = head.len() - head.trim_start().len();
    lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
        .map(|l| l.get(indent + 2..).unwrap_or("").to_string() + "\n")
        .collect()
}

/// An emptyDir as the kubelet makes it: root-owned 0777, with fsGroup the
/// group and setgid.
pub(crate) fn empty_dir(p: &Path, fs_group: u32) {
    std::fs::create_dir_all(p).unwrap();
    chown(p, 0, fs_group);
    mode(p, 0o2777);
}

/// A Secret or ConfigMap volume: files in a timestamped directory, `..data`
/// pointing at it, and each key a symlink through `..data`.
pub(crate) fn projected(p: &Path, files: &[(String, Vec<u8>)], file_mode: u32, gid: u32) {
    let ts = p.join("..2026_12_01_00_00_00.000000001");
    std::fs::create_dir_all(&ts).unwrap();
    for (name, bytes) in files {
        let f = ts.join(name);
        std::fs::write(&f, bytes).unwrap();
        chown(&f, 0, gid);
        mode(&f, file_mode);
        symlink(format!("..data/{name}"), p.join(name)).unwrap();
    }
    symlink(ts.file_name().unwrap(), p.join("..data")).unwrap();
    chown(p, 0, gid);
    mode(p, 0o1777);
}

/// The keys of the Secret `credbroker-keys` as the manifest's documented
/// command creates it (`kubectl create secret generic credbroker-keys` and
/// its `--from-file=KEY[=PATH]` continuation lines, in a comment).
pub(crate) fn secret_keys(manifest: &str) -> Vec<String> {
    let mut lines = manifest
        .lines()
        .map(|l| l.trim_start_matches('#').trim())
        .skip_while(|l| !l.starts_with("kubectl create secret generic credbroker-keys"));
    let mut keys = Vec::new();
    let mut more = lines
        .next()
        .expect("no `kubectl create secret generic credbroker-keys` command documented")
        .ends_with('\\');
    for l in lines {
        if !more {
            break;
        }
        more = l.ends_with('\\');
        let arg = l.trim_end_matches('\\').trim();
        let file = arg
            .strip_prefix("--from-file=")
            .unwrap_or_else(|| panic!("unexpected line in the secret command: {l}"));
        keys.push(file.split('=').next().unwrap().to_string());
    }
    keys
}

/// A number after `key: ` in `text` (the first occurrence).
fn number(text: &str, key: &str) -> Option<u32> {
    let at = text.find(&format!("{key}: "))? + key.len() + 2;
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The pod's `fsGroup` and first supplemental group.
pub(crate) fn pod_groups(manifest: &str) -> (u32, u32) {
    let supplemental = manifest
        .split("supplementalGroups: [")
        .nth(1)
        .expect("supplementalGroups")
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap();
    (number(manifest, "fsGroup").expect("fsGroup"), supplemental)
}

/// The volumes of the pod template: name and kind (`secret`, `emptyDir`,
/// `configMap`, `persistentVolumeClaim`).
fn volumes(manifest: &str) -> Vec<(String, String)> {
    let body = manifest.split("      volumes:\n").nth(1).expect("volumes");
    let mut out = Vec::new();
    let mut lines = body.lines().peekable();
    while let Some(l) = lines.next() {
        if !l.starts_with("        ") {
            break;
        }
        if let Some(name) = l.strip_prefix("        - name: ") {
            let kind = lines.peek().unwrap().trim().trim_end_matches(':');
            out.push((name.to_string(), kind.to_string()));
        }
    }
    out
}

/// One container (init or not): its name, script (init containers'
/// `sh -c` block), uid and gid, and mounts (volume, path, read-only).
#[derive(Debug)]
pub(crate) struct Container {
    pub name: String,
    pub script: Option<String>,
    pub uid: u32,
    pub gid: u32,
    pub mounts: Vec<Mount>,
}

#[derive(Debug, Clone)]
pub(crate) struct Mount {
    pub volume: String,
    /// The volume's kind in the pod (`secret`, `emptyDir`...).
    pub kind: String,
    pub path: String,
    pub read_only: bool,
}

/// The containers under `section` (`initContainers` or `containers`) of
/// the pod template.
pub(crate) fn containers(manifest: &str, section: &str) -> Vec<Container> {
    let Some(start) = manifest.find(&format!("\n      {section}:\n")) else {
        return Vec::new();
    };
    let vols = volumes(manifest);
    let body: String = manifest[start + 1..]
        .lines()
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("        "))
        .map(|l| format!("\n{l}"))
        .collect();
    body.split("\n        - name: ")
        .skip(1)
        .map(|c| {
            let name = c.lines().next().unwrap().to_string();
            let script = c.split("- >-\n").nth(1).map(|s| {
                s.split("\n          securityContext:")
                    .next()
                    .unwrap()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            });
            let lines: Vec<&str> = c.lines().collect();
            let mut mounts = Vec::new();
            for (i, l) in lines.iter().enumerate() {
                if let Some(p) = l.trim().strip_prefix("mountPath: ") {
                    let volume = lines[i - 1].trim().strip_prefix("- name: ").unwrap();
                    let kind = vols
                        .iter()
                        .find(|(n, _)| n == volume)
                        .map_or("volumeClaimTemplate", |(_, k)| k.as_str());
                    mounts.push(Mount {
                        volume: volume.to_string(),
                        kind: kind.to_string(),
                        path: p.to_string(),
                        read_only: lines
                            .get(i + 1)
                            .is_some_and(|n| n.trim() == "readOnly: true"),
                    });
                }
            }
            Container {
                uid: number(c, "runAsUser").unwrap_or_else(|| panic!("{name}: runAsUser")),
                gid: number(c, "runAsGroup").unwrap_or_else(|| panic!("{name}: runAsGroup")),
                name,
                script,
                mounts,
            }
        })
        .collect()
}

/// `script` with every mount path moved to its volume's directory (a path starting
/// after a quote, a space or a `#` and ending at `/`, a quote, `;`, a space
/// or the end). A path left as it was would be the machine's own, which
/// the unprivileged uid cannot create, and the harness's checks of the
/// laid-out files would fail.
pub(crate) fn relocate(
    script: &str,
    mounts: &[Mount],
    volume_dir: impl Fn(&str) -> PathBuf,
) -> String {
    let mut by_len: Vec<&Mount> = mounts.iter().collect();
    by_len.sort_by_key(|m| std::cmp::Reverse(m.path.len()));
    let mut out = script.to_string();
    for m in &by_len {
        let to = volume_dir(&m.volume);
        let mut done = String::new();
        let mut rest = out.as_str();
        while let Some(i) = rest.find(&m.path) {
            let before = rest[..i].chars().last();
            let after = rest[i + m.path.len()..].chars().next();
            let at_start = matches!(before, Some('"' | ' ' | '#') | None);
            let at_end = matches!(after, Some('/' | '"' | ';' | ' ') | None);
            done.push_str(&rest[..i]);
            if at_start && at_end {
                done.push_str(&to.display().to_string());
            } else {
                done.push_str(&m.path);
            }
            rest = &rest[i + m.path.len()..];
        }
        done.push_str(rest);
        out = done;
    }
    out
}

/// Where `path` (as a container sees it) lies on this machine, through the
/// container's mounts and the volume directories the harness made
/// (`volume_dir(volume name)`).
pub(crate) fn resolve(
    path: &Path,
    mounts: &[Mount],
    volume_dir: impl Fn(&str) -> PathBuf,
) -> Option<PathBuf> {
    let m = mounts
        .iter()
        .filter(|m| path.starts_with(&m.path))
        .max_by_key(|m| m.path.len())?;
    Some(volume_dir(&m.volume).join(path.strip_prefix(&m.path).unwrap()))
}
