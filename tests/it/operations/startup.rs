//! Refused starts: each message names the file and the key (line:col where
//! it applies), and a failed start leaves nothing it created behind. The
//! socket-directory rule: the broker creates its own socket directories and
//! refuses an unsafe parent (docs/ARCHITECTURE.md, "Start-up").
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::support::*;

fn set_key(config: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(config).unwrap();
    assert!(text.contains(from), "{from} not in {text}");
    std::fs::write(config, text.replacen(from, to, 1)).unwrap();
}

fn refused(config: &Path) -> String {
    let (status, stderr) = serve_expect_exit(config, Duration::from_secs(20));
    assert!(!status.success(), "the start was not refused: {stderr}");
    stderr
}

#[test]
fn busy_public_port_refused_by_key_and_leaves_no_socket_files() {
    // A port outside the ephemeral range: the positive control below frees
    // it for the broker, and a port from `bind(0)` could meanwhile be taken
    // by a concurrent test's `listen(0)` or outgoing connection.
    let (busy, addr) = (0..20)
        .find_map(|_| {
            let addr = free_loopback_addr();
            let l = std::net::TcpListener::bind(&addr).ok()?;
            Some((l, addr))
        })
        .expect("a free loopback port");
    let (dir, config) = prepare(&Opts {
        public_listen: Some(addr.clone()),
        ..Opts::default()
    });
    set_key(
        &config,
        "path = \"credbroker.sock\"",
        "path = \"run/credbroker.sock\"",
    );
    let err = refused(&config);
    assert!(
        err.contains(&config.display().to_string())
            && err.contains("public.listen")
            && err.contains(&addr),
        "{err}"
    );
    for left in ["run/credbroker.sock", "run", "admin.sock", "data"] {
        assert!(
            !dir.path().join(left).exists(),
            "the refused start left {left} behind: {err}"
        );
    }
    // Positive control: with the port free, the same files serve.
    drop(busy);
    let mut b = TestBroker::spawn(dir, config, None);
    assert!(b.socket.exists() && b.is_running());
}

#[test]
fn socket_directory_created_by_the_broker_and_unsafe_parent_refused() {
    let (dir, config) = prepare(&Opts::default());
    set_key(
        &config,
        "path = \"credbroker.sock\"",
        "path = \"run/api/credbroker.sock\"",
    );
    set_key(
        &config,
        "socket = \"admin.sock\"",
        "socket = \"run/admin/admin.sock\"",
    );
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    // A parent anyone may write to (no sticky bit): refused, naming the key.
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = refused(&config);
    assert!(
        err.contains(&config.display().to_string())
            && err.contains("socket.path")
            && err.contains("writable by others without the sticky bit"),
        "{err}"
    );
    assert!(
        !run.join("api").exists() && !dir.path().join("data").exists(),
        "{err}"
    );
    // A symlinked parent: refused too.
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::remove_dir(&run).unwrap();
    std::os::unix::fs::symlink(&real, &run).unwrap();
    let err = refused(&config);
    assert!(
        err.contains("socket.path") && err.contains("is a symlink"),
        "{err}"
    );
    // Positive control: a safe parent; the broker makes both directories.
    std::fs::remove_file(&run).unwrap();
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
    let b = TestBroker::spawn(dir, config, None);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&run.join("api")), 0o750);
    assert_eq!(mode(&run.join("admin")), 0o700);
    assert!(b.log_text().contains("created the socket directory"));
}

#[test]
fn socket_path_on_a_read_only_file_system_names_file_key_and_cause() {
    let (dir, config) = prepare(&Opts::default());
    // Outside the broker's directory, so the broker's files are removed
    // before the file system is unmounted.
    let mnt = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::mount_with(&mnt.path().join("ro"), "size=64k,mode=0755") else {
        not_shown(
            "a socket path on a read-only file system",
            "cannot mount a tmpfs here (needs root)",
        );
        return;
    };
    std::fs::create_dir(fs.0.join("run")).unwrap();
    std::fs::set_permissions(fs.0.join("run"), std::fs::Permissions::from_mode(0o750)).unwrap();
    fs.set_read_only(true);
    // The socket's directory exists on the read-only file system (binding
    // fails), and one that does not yet (creating it fails).
    for sock in [
        fs.0.join("run/credbroker.sock"),
        fs.0.join("new/credbroker.sock"),
    ] {
        let sock = sock.display();
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(
            &config,
            text.replacen(
                "path = \"credbroker.sock\"",
                &format!("path = \"{sock}\""),
                1,
            ),
        )
        .unwrap();
        let err = refused(&config);
        assert!(
            err.contains(&config.display().to_string())
                && err.contains("socket.path")
                && err.contains("Read-only file system"),
            "{sock}: {err}"
        );
        assert!(!dir.path().join("data").exists(), "{sock}: {err}");
        assert!(!fs.0.join("new").exists());
        std::fs::write(&config, text).unwrap();
    }
    // Positive control: the same path, writable again, serves.
    fs.set_read_only(false);
    set_key(
        &config,
        "path = \"credbroker.sock\"",
        &format!("path = \"{}\"", fs.0.join("run/credbroker.sock").display()),
    );
    let mut b = TestBroker::spawn(dir, config, None);
    assert!(b.socket.starts_with(&fs.0) && b.socket.exists() && b.is_running());
    b.stop();
}

#[test]
fn master_key_of_the_wrong_length_names_file_and_key() {
    let (dir, config) = prepare(&Opts::default());
    let key = dir.path().join("keys/master.key");
    std::fs::remove_file(&key).unwrap();
    credbroker::internals::config::write_secret_file(&key, &[7u8; 31]).unwrap();
    let err = refused(&config);
    assert!(
        err.contains(&config.display().to_string())
            && err.contains("keys.master_key_file")
            && err.contains("32 bytes")
            && err.contains("31 bytes"),
        "{err}"
    );
    assert!(!dir.path().join("data").exists(), "{err}");
}

#[test]
fn missing_jwks_file_names_the_config_file_and_the_key() {
    let (dir, config) = prepare(&Opts::default());
    let jwks = dir.path().join("dev-issuer-jwks.json");
    let kept = std::fs::read(&jwks).unwrap();
    std::fs::remove_file(&jwks).unwrap();
    let err = refused(&config);
    assert!(
        err.contains(&config.display().to_string())
            && err.contains("trusted_issuers[0].jwks_file")
            && err.contains(&jwks.display().to_string()),
        "{err}"
    );
    // Refused before the store is opened: no store directory, so no key
    // ring was created for a start that could not serve.
    assert!(!dir.path().join("data").exists(), "{err}");
    // Positive control: with the file back, the same config serves, and
    // now the store and its key ring exist.
    std::fs::write(&jwks, kept).unwrap();
    let mut b = TestBroker::spawn(dir, config, None);
    assert!(b.socket.exists() && b.is_running());
    assert!(b.path("data").is_dir());
}

#[test]
fn policy_for_another_agent_names_both_files_and_line_col() {
    let (dir, config) = prepare(&Opts::default());
    let policy = dir.path().join("policy.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    let line = text
        .lines()
        .position(|l| l.trim_start().starts_with("agent"))
        .unwrap()
        + 1;
    std::fs::write(
        &policy,
        text.replacen("agent = \"repo-helper\"", "agent = \"other-agent\"", 1),
    )
    .unwrap();
    let err = refused(&config);
    assert!(
        err.contains(&format!("{}:{line}:", policy.display()))
            && err.contains("agent")
            && err.contains("other-agent")
            && err.contains(&config.display().to_string()),
        "{err}"
    );
}

#[test]
fn store_path_that_is_a_file_names_the_key() {
    let (dir, config) = prepare(&Opts::default());
    std::fs::write(dir.path().join("data"), b"not a directory").unwrap();
    let err = refused(&config);
    assert!(
        err.contains(&config.display().to_string())
            && err.contains("store")
            && err.contains("not a directory")
            && !err.contains("os error 17"),
        "{err}"
    );
    assert!(!dir.path().join("credbroker.sock").exists(), "{err}");
}

/// Gives everything under `dir` (and `dir`) to `uid`:`gid`.
fn chown_tree(dir: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(dir, Some(uid), Some(gid)).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            chown_tree(&path, uid, gid);
        } else {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid)).unwrap();
        }
    }
}

/// Starts `serve --config config` as `other` and waits until it logs that
/// it serves (`Ok`, the running child; kill it) or exits (`Err`, its
/// stderr); 20 s at most. (The socket's existence proves nothing: a start
/// binds first and removes the sockets again when a later check fails.)
fn start_as(
    other: &OtherUser,
    config: &Path,
) -> Result<(tempfile::TempDir, std::process::Child), String> {
    use std::io::BufRead;
    let args = [
        std::ffi::OsStr::new("serve"),
        std::ffi::OsStr::new("--config"),
        config.as_os_str(),
    ];
    let (cwd, mut child) = other.spawn(&args);
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let log = log.clone();
        let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in stderr.lines() {
                let line = line.unwrap_or_default();
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            reader.join().unwrap();
            let err = log.lock().unwrap().clone();
            assert!(!status.success(), "exited 0 without serving: {err}");
            return Err(err);
        }
        if log.lock().unwrap().contains("credbroker is serving") {
            return Ok((cwd, child));
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "as uid {}: neither serving nor refused after 20 s: {}",
                other.uid,
                log.lock().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(mut child: std::process::Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `socket.group` names a group the broker's user is not a member of (the
/// shipped systemd unit once had no `SupplementaryGroups=`): the refusal
/// names the group and says what to do, instead of `/run/credbroker:
/// Operation not permitted (os error 1)`, and the socket directory that
/// start made is removed again.
#[test]
fn socket_group_the_broker_user_is_not_in_names_the_cause_and_the_fix() {
    let Some(other) = other_user("a socket group the broker's user is not a member of") else {
        return;
    };
    let (dir, config) = prepare(&Opts::default());
    set_key(
        &config,
        "path = \"credbroker.sock\"",
        "path = \"run/credbroker.sock\"",
    );
    // root's group, which `nobody` is not in.
    set_key(&config, "[socket]\n", "[socket]\ngroup = \"root\"\n");
    chown_tree(dir.path(), other.uid, other.gid);
    let Err(err) = start_as(&other, &config) else {
        panic!("served with a socket group its user is not in");
    };
    for part in [
        config.display().to_string(),
        "socket.path".into(),
        "socket group root (gid 0)".into(),
        format!("uid {}", other.uid),
        "is not a member of that group".into(),
        "SupplementaryGroups=".into(),
    ] {
        assert!(err.contains(&part), "{part:?} not in: {err}");
    }
    assert!(!err.contains("os error 1"), "{err}");
    assert!(
        !dir.path().join("run").exists(),
        "the refused start left its socket directory behind: {err}"
    );
    // Positive control: with the user's own group the same files serve, and
    // the socket directory gets that group.
    set_key(
        &config,
        "group = \"root\"",
        &format!("group = \"{}\"", other.group),
    );
    let (_cwd, child) = start_as(&other, &config).unwrap_or_else(|e| panic!("{e}"));
    use std::os::unix::fs::MetadataExt;
    let gid = std::fs::metadata(dir.path().join("run")).unwrap().gid();
    stop(child);
    assert_eq!(gid, other.gid, "the socket directory's group");
}

/// The socket directory exists and belongs to another user (a root-owned
/// directory made by hand, or an emptyDir used as the socket directory
/// itself): the refusal says whose it is and what to do, not only "is a
/// symlink or owned by another user".
#[test]
fn socket_directory_of_another_user_names_its_owner_and_the_fix() {
    let Some(other) = other_user("a socket directory owned by another user") else {
        return;
    };
    let (dir, config) = prepare(&Opts::default());
    set_key(
        &config,
        "path = \"credbroker.sock\"",
        "path = \"run/credbroker.sock\"",
    );
    chown_tree(dir.path(), other.uid, other.gid);
    // root's, made before the broker starts (this process runs as root).
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
    let Err(err) = start_as(&other, &config) else {
        panic!("served in a socket directory owned by root");
    };
    for part in [
        config.display().to_string(),
        "socket.path".into(),
        format!("socket directory {} is owned by uid 0", run.display()),
        format!("not the broker's uid {}", other.uid),
        "does not exist yet".into(),
    ] {
        assert!(err.contains(&part), "{part:?} not in: {err}");
    }
    assert!(run.exists(), "not the broker's to remove");
    // Positive control: without it, the broker makes its own and serves.
    std::fs::remove_dir(&run).unwrap();
    let (_cwd, child) = start_as(&other, &config).unwrap_or_else(|e| panic!("{e}"));
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(&run).unwrap().uid();
    stop(child);
    assert_eq!(owner, other.uid, "the broker's own socket directory");
}

/// The master key as the kubelet mounts a Secret: with `fsGroup` it is
/// 0440 (group-readable), without it root's and 0400 (unreadable by the
/// broker's uid). Each refusal names the key, the mode or the owner, and
/// the fix, instead of "readable by others" (untrue of a 0440 file) or a
/// bare "Permission denied".
#[test]
fn master_key_mounted_as_a_kubernetes_secret_names_mode_owner_and_fix() {
    let Some(other) = other_user("a master key the broker's uid cannot read") else {
        return;
    };
    let (dir, config) = prepare(&Opts::default());
    chown_tree(dir.path(), other.uid, other.gid);
    let key = dir.path().join("keys/master.key");
    // With fsGroup: 0440, the broker's own.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o440)).unwrap();
    let Err(err) = start_as(&other, &config) else {
        panic!("served with a 0440 master key");
    };
    for part in [
        "keys.master_key_file",
        "has mode 0440",
        "chmod 600",
        "fsGroup",
    ] {
        assert!(err.contains(part), "{part:?} not in: {err}");
    }
    assert!(!err.contains("readable by others"), "{err}");
    // Without fsGroup: root's, 0400.
    std::os::unix::fs::chown(&key, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
    let Err(err) = start_as(&other, &config) else {
        panic!("served with a master key it cannot read");
    };
    for part in [
        "keys.master_key_file".to_string(),
        "belongs to uid 0".to_string(),
        format!("runs as uid {}", other.uid),
        "its owner, with mode 0600".to_string(),
    ] {
        assert!(err.contains(&part), "{part:?} not in: {err}");
    }
    assert!(!dir.path().join("data").exists(), "{err}");
    // Positive control: the broker's own 0600 file serves.
    std::os::unix::fs::chown(&key, Some(other.uid), Some(other.gid)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (_cwd, child) = start_as(&other, &config).unwrap_or_else(|e| panic!("{e}"));
    stop(child);
}

/// The egress proxy is built with the instance (issue 37): a proxy that
/// cannot start stops the start, with a message naming the cause, instead
/// of a broker whose public listener is never served. Here its HTTPS client
/// finds no certificate authority (SSL_CERT_FILE and SSL_CERT_DIR name
/// none). Before, the proxy was built inside the public listener's task,
/// which logged a line and served nothing on the public port; here the
/// start failed later, on another client, without naming the proxy.
#[test]
fn a_proxy_that_cannot_start_stops_the_start_naming_the_cause() {
    let (dir, config) = prepare(&Opts::default());
    let no_file = dir.path().join("no-certificates.pem");
    let no_dir = dir.path().join("no-certificates");
    let (status, err) = serve_expect_exit_with_env(
        &config,
        &[("SSL_CERT_FILE", &no_file), ("SSL_CERT_DIR", &no_dir)],
        Duration::from_secs(20),
    );
    assert_eq!(
        status.code(),
        Some(1),
        "a refused start, not a crash: {err}"
    );
    assert!(
        err.contains("the egress proxy cannot start")
            && err.contains("No CA certificates were loaded")
            && err.contains(&config.display().to_string()),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(!dir.path().join("credbroker.sock").exists(), "{err}");
    // Positive control: the platform's certificate authorities, and the
    // same files serve.
    let mut b = TestBroker::spawn(dir, config, None);
    assert!(b.socket.exists() && b.is_running());
}
