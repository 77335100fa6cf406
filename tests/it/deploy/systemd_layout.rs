//! The layout harness of deploy/credbroker.service: the unit's text is read
//! (`User=`, `Group=`, `SupplementaryGroups=`, the `*Directory=` keys with
//! their modes, `UMask=`, `ExecStart=`) and reproduced on this machine
//! without systemd as PID 1, then the real binary is started in it with
//! deploy/credbroker.example.toml as that non-root user (`setpriv`, no
//! capabilities, no new privileges) and one derive is made over the socket
//! by a process in the socket's group. The unit's users and groups are
//! created with `groupadd`/`useradd` when missing and deleted again at the
//! end. Reproduced: the directories' owners and modes; `ProtectSystem=strict`
//! only as far as ownership goes (the configuration directory and its files
//! are root's, so the broker's user cannot write them; no read-only mount).
//! Replaced: every absolute path of the unit's directories and of
//! `ExecStart=` moves under a temp root, the public listener binds a free
//! loopback port with a throw-away certificate, and the organisation's IdP
//! is the quick start's dev issuer (the example's IdP is not reachable from
//! CI). Taking the unit text as input lets the same test show that a unit
//! without `SupplementaryGroups=` fails as issue 15 saw it.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::broker::{prepare, Opts};
use crate::support::layout::{chown, install_binary, mode, run, throwaway_tls};

const UNIT: &str = include_str!("../../../deploy/credbroker.service");
const CONFIG: &str = include_str!("../../../deploy/credbroker.example.toml");

/// Every value of `key=` in the unit's `[Service]` section, split on
/// whitespace; an empty assignment resets the list, as systemd reads it.
fn values(unit: &str, key: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_service = false;
    for l in unit.lines().map(str::trim) {
        if l.starts_with('[') {
            in_service = l == "[Service]";
        } else if let Some(v) = l.strip_prefix(&format!("{key}=")).filter(|_| in_service) {
            if v.trim().is_empty() {
                out.clear();
            }
            out.extend(v.split_whitespace().map(str::to_string));
        }
    }
    out
}

fn one(unit: &str, key: &str) -> Option<String> {
    values(unit, key).pop()
}

fn octal(unit: &str, key: &str, default: u32) -> u32 {
    one(unit, key).map_or(default, |m| u32::from_str_radix(&m, 8).unwrap())
}

/// The id of a user or group from the account database, if it exists.
fn getent(db: &str, name: &str) -> Option<u32> {
    let out = Command::new("getent").args([db, name]).output().unwrap();
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .split(':')
            .nth(2)
            .unwrap()
            .parse()
            .unwrap()
    })
}

/// The unit's accounts, created where missing and deleted on drop (only
/// those this test created).
#[derive(Default)]
struct Accounts(Vec<[&'static str; 2]>, Vec<String>);

impl Accounts {
    fn group(&mut self, name: &str) -> u32 {
        if let Some(gid) = getent("group", name) {
            return gid;
        }
        run(Command::new("groupadd").args(["--system", name]));
        self.0.push(["groupdel", ""]);
        self.1.push(name.to_string());
        getent("group", name).unwrap()
    }

    fn user(&mut self, name: &str, group: &str) -> u32 {
        if let Some(uid) = getent("passwd", name) {
            return uid;
        }
        run(Command::new("useradd").args([
            "--system",
            "--gid",
            group,
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ]));
        self.0.push(["userdel", ""]);
        self.1.push(name.to_string());
        getent("passwd", name).unwrap()
    }
}

impl Drop for Accounts {
    fn drop(&mut self) {
        // Users before their groups.
        for (cmd, name) in self.0.iter().zip(&self.1).rev() {
            // userdel may already have removed a primary group of the
            // same name (USERGROUPS_ENAB).
            let _ = Command::new(cmd[0])
                .arg(name)
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The `setpriv` arguments that run a process as the unit's user.
fn as_unit_user(uid: u32, gid: u32, groups: &[u32]) -> Vec<String> {
    let mut a = vec![format!("--reuid={uid}"), format!("--regid={gid}")];
    if groups.is_empty() {
        a.push("--clear-groups".into());
    } else {
        let g: Vec<String> = groups.iter().map(u32::to_string).collect();
        a.push(format!("--groups={}", g.join(",")));
    }
    a.extend(
        [
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
        .map(String::from),
    );
    a
}

struct Started {
    child: Child,
    log: PathBuf,
    exe: PathBuf,
    sock: PathBuf,
}

/// Lays out `unit` under `root` and starts its `ExecStart=`; the running
/// broker once its socket exists, or what it wrote to stderr when it exits
/// first.
fn start_unit(
    unit: &str,
    root: &Path,
    accounts: &mut Accounts,
    qs: &Path,
    addr: &str,
) -> Result<Started, String> {
    let at = |p: &str| root.join(p.trim_start_matches('/'));
    let user = one(unit, "User").expect("User=");
    let group = one(unit, "Group").expect("Group=");
    let gid = accounts.group(&group);
    let uid = accounts.user(&user, &group);
    let supplementary: Vec<u32> = values(unit, "SupplementaryGroups")
        .iter()
        .map(|g| accounts.group(g))
        .collect();
    assert!(
        values(unit, "ReadWritePaths").is_empty() && values(unit, "ReadOnlyPaths").is_empty(),
        "the harness does not reproduce ReadWritePaths=/ReadOnlyPaths= yet"
    );
    let umask = octal(unit, "UMask", 0o022);

    // The unit's directories, with the owner and mode systemd gives them
    // (the configuration directory stays root's).
    let mut moved: Vec<String> = Vec::new();
    for (key, base, owned) in [
        ("RuntimeDirectory", "/run", true),
        ("StateDirectory", "/var/lib", true),
        ("LogsDirectory", "/var/log", true),
        ("ConfigurationDirectory", "/etc", false),
    ] {
        let m = octal(unit, &format!("{key}Mode"), 0o755);
        for d in values(unit, key) {
            let p = at(&format!("{base}/{d}"));
            std::fs::create_dir_all(&p).unwrap();
            if owned {
                chown(&p, uid, gid);
            }
            mode(&p, m);
            moved.push(format!("{base}/{d}"));
        }
    }

    // ExecStart=, its absolute paths under the root; the config directory
    // it names is read-only for the broker (root's, 0755).
    let exec = values(unit, "ExecStart");
    assert_eq!(exec[0], "/usr/local/bin/credbroker", "ExecStart=");
    let config_at = exec.iter().position(|a| a == "--config").expect("--config") + 1;
    let config_dir = Path::new(&exec[config_at]).parent().unwrap();
    moved.push(config_dir.display().to_string());
    let etc = at(&config_dir.display().to_string());
    for d in [etc.clone(), etc.join("keys"), etc.join("tls")] {
        std::fs::create_dir_all(&d).unwrap();
        mode(&d, 0o755);
    }

    // The example config, paths moved only where the unit's directories are.
    let mut config = CONFIG.to_string();
    for prefix in &moved {
        config = config.replace(
            &format!("\"{prefix}"),
            &format!("\"{}", at(prefix).display()),
        );
    }
    config = config.replace("listen = \"0.0.0.0:8443\"", &format!("listen = \"{addr}\""));
    let dev_issuer = format!("http://{addr}");
    // The dev issuer pairs with local sign-in only as the broker's own.
    config = config.replace(
        "issuer = \"https://broker.example.com\"",
        &format!("issuer = \"{dev_issuer}\""),
    );
    let idp = config.find("[[trusted_issuers]]").unwrap();
    // The IdP's table ends where the providers begin.
    let end = config.find("[providers.").unwrap();
    config.replace_range(
        idp..end,
        &format!(
            "[[trusted_issuers]]\nissuer = \"{dev_issuer}\"\njwks_file = \"{}\"\nalgs = [\"ES256\"]\nsign_in = {{ kind = \"local\" }}\n\n",
            etc.join("dev-issuer-jwks.json").display()
        ),
    );
    let (cert, key) = throwaway_tls();
    for (name, bytes, secret) in [
        ("credbroker.toml", config.into_bytes(), false),
        (
            "policy.toml",
            std::fs::read(qs.join("policy.toml")).unwrap(),
            false,
        ),
        (
            "dev-issuer-jwks.json",
            std::fs::read(qs.join("dev-issuer-jwks.json")).unwrap(),
            false,
        ),
        ("tls/cert.pem", cert, false),
        ("tls/key.pem", key, true),
        (
            "keys/master.key",
            std::fs::read(qs.join("keys/master.key")).unwrap(),
            true,
        ),
        ("keys/github-client-secret", b"client-secret".to_vec(), true),
    ] {
        let f = etc.join(name);
        std::fs::write(&f, bytes).unwrap();
        if secret {
            chown(&f, uid, gid);
            mode(&f, 0o600);
        } else {
            mode(&f, 0o644);
        }
    }

    let exe = install_binary(root);
    let mut args: Vec<String> = exec[1..].to_vec();
    args[config_at - 1] = etc.join("credbroker.toml").display().to_string();
    let log = root.join(format!("broker-{}.log", supplementary.len()));
    let mut child = Command::new("setpriv")
        .args(as_unit_user(uid, gid, &supplementary))
        .args([
            "sh",
            "-c",
            &format!("umask {umask:04o} && exec \"$0\" \"$@\""),
        ])
        .arg(&exe)
        .args(&args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let sock = Path::new(
        CONFIG
            .lines()
            .find_map(|l| l.strip_prefix("path = \""))
            .unwrap()
            .trim_end_matches('"'),
    );
    let sock = at(&sock.display().to_string());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        if child.try_wait().unwrap().is_some() {
            return Err(std::fs::read_to_string(&log).unwrap());
        }
        assert!(
            Instant::now() < deadline,
            "no socket: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Started {
        child,
        log,
        exe,
        sock,
    })
}

#[tokio::test]
async fn systemd_unit_layout_starts_and_derives_as_non_root() {
    if !nix::unistd::Uid::effective().is_root() {
        crate::support::not_shown(
            "deploy/credbroker.service reproduced and started as its non-root user",
            "needs root to create the unit's users and run setpriv",
        );
        return;
    }
    assert!(
        CONFIG.contains("allowed_uids = [1001]"),
        "the example's orchestrator uid changed; update the derive below"
    );
    let addr = crate::support::free_loopback_addr();
    let (qs, _qs_config) = prepare(&Opts {
        public_listen: Some(addr.clone()),
        ..Opts::default()
    });
    let mut accounts = Accounts::default();
    // The orchestrator's group, which the config's `[socket] group` names:
    // it exists on the host whatever the broker's unit says.
    let orchestrator = accounts.group("orchestrator");

    // Negative: the unit without SupplementaryGroups= (the regression of
    // issue 15): the broker cannot give the socket directory its group.
    let without: String = UNIT
        .lines()
        .filter(|l| !l.starts_with("SupplementaryGroups="))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(values(&without, "SupplementaryGroups").is_empty());
    let root = tempfile::tempdir().unwrap();
    mode(root.path(), 0o755);
    let refused = match start_unit(&without, root.path(), &mut accounts, qs.path(), &addr) {
        Ok(mut s) => {
            let _ = s.child.kill();
            let _ = s.child.wait();
            panic!("the broker started without SupplementaryGroups=");
        }
        Err(log) => log,
    };
    eprintln!("without SupplementaryGroups= (expected): {refused}");
    assert!(
        refused.contains("is not a member of that group")
            && refused.contains("SupplementaryGroups=")
            && refused.contains(&root.path().join("run/credbroker").display().to_string()),
        "{refused}"
    );

    // Positive: the shipped unit, in a fresh layout.
    let root = tempfile::tempdir().unwrap();
    mode(root.path(), 0o755);
    let mut b = start_unit(UNIT, root.path(), &mut accounts, qs.path(), &addr)
        .unwrap_or_else(|log| panic!("the broker refused the shipped unit's layout: {log}"));
    let subject = credbroker::internals::cli::dev_subject_token(qs.path(), "alice", 300).unwrap();
    let keydir = tempfile::tempdir().unwrap();
    mode(keydir.path(), 0o777);
    let derive = Command::new("setpriv")
        .args(as_unit_user(1001, orchestrator, &[orchestrator]))
        .arg(&b.exe)
        .args(["derive", "--socket"])
        .arg(&b.sock)
        .args([
            "--issuer",
            &format!("http://{addr}"),
            "--subject-token",
            &subject,
        ])
        .args([
            "--step",
            "answer_question",
            "--tool",
            "notes.read",
            "--resource",
            "http://127.0.0.1:9090/notes",
        ])
        .arg("--dpop-key")
        .arg(keydir.path().join("tool.pem"))
        .output()
        .unwrap();
    let _ = b.child.kill();
    let _ = b.child.wait();
    let logs = std::fs::read_to_string(&b.log).unwrap();
    assert!(
        derive.status.success() && String::from_utf8_lossy(&derive.stdout).contains("access_token"),
        "derive as the orchestrator: {}{}\n{logs}",
        String::from_utf8_lossy(&derive.stdout),
        String::from_utf8_lossy(&derive.stderr)
    );
}
