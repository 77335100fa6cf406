//! A PostgreSQL server for the store tests: one cluster per run of the test
//! binary (started on first use, a `OnceLock`), made with Debian's
//! `postgresql` binaries (`initdb`, `pg_ctl`) in a temp directory outside
//! the clone, on a loopback port, with password (SCRAM) authentication and
//! no Unix socket. The server runs as an unprivileged user: as root (CI)
//! that is `nobody` (through `setpriv`), since PostgreSQL refuses to run as
//! root; otherwise the current user.
//!
//! Each test takes its own database ([`database`]). Tests that stop or
//! restart the server hold [`Cluster::exclusive`]; the others hold
//! [`Cluster::shared`] for as long as they use it, so a restart never
//! lands in the middle of another test.
//!
//! A small watchdog process stops the server and removes its directory
//! once this test binary exits (statics are never dropped).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use credbroker::internals::store::{Migrate, PgSettings};

/// The admin (superuser) of the test cluster; its password is in
/// [`Cluster::password_file`].
pub(crate) const ADMIN: &str = "credbroker_test";

/// `[revocation]` for a replica that serves through a PostgreSQL outage:
/// a `watch_bound` (5 minutes, the most allowed) far past any outage a
/// test makes. With the default 10 s, a replica that has not read the
/// person stop list for that long refuses every derive
/// (`revocation_watch_down`, as it should: tests/it/store/person_stop.rs
/// shows it), and on a loaded machine `pg_ctl stop` alone took 6.5 s,
/// after a last read up to 5 s (half the bound) before it.
pub(crate) const OUTLASTS_OUTAGES: &str = "\n[revocation]\nwatch_bound = \"5m\"\n";

/// The running test cluster.
#[derive(Debug)]
pub(crate) struct Cluster {
    /// Holds the data directory, the log and the password file.
    root: PathBuf,
    bin: PathBuf,
    /// The loopback port.
    pub(crate) port: u16,
    /// A 0600 file with the admin's password.
    pub(crate) password_file: PathBuf,
    /// The CA (PEM) that signed the server's certificate (for
    /// `127.0.0.1`): the server accepts TLS and plain TCP alike.
    pub(crate) ca_file: PathBuf,
    password: String,
    /// `Some((uid, gid))` when the server runs as another user than this
    /// process.
    run_as: Option<(u32, u32)>,
    gate: RwLock<()>,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// [`Cluster::exclusive`]'s hold. When it goes (the test's end, or its
/// panic) a server the test left stopped is started again, before the
/// next test gets the gate: a test failing between `stop` and
/// `start_again` would otherwise fail every later PostgreSQL test of the
/// run with "connection refused" (seen: one such failure took 7 others).
pub(crate) struct Exclusive<'a> {
    cluster: &'a Cluster,
    _gate: RwLockWriteGuard<'a, ()>,
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        if !self.cluster.try_pg_ctl(&["status"]) {
            eprintln!("the test left PostgreSQL stopped: starting it again");
            self.cluster.try_pg_ctl(&["start", "-w", "-t", "60"]);
        }
    }
}

/// The cluster, started on first use. `None` where the PostgreSQL binaries
/// are missing (the caller reports it with `not_shown`).
pub(crate) fn cluster() -> Option<&'static Cluster> {
    let bin = find_bin()?;
    Some(CLUSTER.get_or_init(|| Cluster::start(bin)))
}

/// Like [`cluster`], but a missing PostgreSQL is reported with
/// [`super::not_shown`] (a failure under CI) and `None` returned.
pub(crate) fn cluster_or_not_shown(what: &str) -> Option<&'static Cluster> {
    let c = cluster();
    if c.is_none() {
        super::not_shown(
            what,
            "PostgreSQL's binaries are not installed (scripts/install-test-deps installs them)",
        );
    }
    c
}

fn find_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").exists() && b.join("pg_ctl").exists())
        .collect();
    // The newest major version.
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
}

impl Cluster {
    fn start(bin: PathBuf) -> Cluster {
        let root = tempfile::Builder::new()
            .prefix("credbroker-pg-")
            .tempdir_in(std::env::temp_dir())
            .unwrap()
            .keep();
        let run_as = nix::unistd::geteuid().is_root().then(|| {
            let u = nix::unistd::User::from_name("nobody").unwrap().unwrap();
            (u.uid.as_raw(), u.gid.as_raw())
        });
        let password = hex::encode(super::random_bytes(16));
        let password_file = root.join("admin-password");
        std::fs::write(&password_file, format!("{password}\n")).unwrap();
        set_mode(&password_file, 0o600);
        let data = root.join("data");
        std::fs::create_dir(&data).unwrap();
        set_mode(&data, 0o700);
        if let Some((uid, gid)) = run_as {
            for p in [&root, &data, &password_file] {
                chown(p, uid, gid);
            }
        }
        let ca_file = make_tls_files(&root, run_as);
        let mut c = Cluster {
            root,
            bin,
            port: 0,
            password_file,
            ca_file,
            password,
            run_as,
            gate: RwLock::new(()),
        };
        // First: whatever fails below, the directory goes when we do.
        c.watchdog();
        c.run(
            "initdb",
            &[
                "-D",
                &c.data(),
                "-U",
                ADMIN,
                "--pwfile",
                &c.password_file.display().to_string(),
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
        );
        // Loopback only, no Unix socket, room for every test's pool.
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nunix_socket_directories = ''\nmax_connections = 300\nfsync = on\nsynchronous_commit = on\nssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
            c.root.join("server.crt").display(),
            c.root.join("server.key").display()
        );
        let conf_path = c.root.join("data").join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path).unwrap();
        text.push_str(&conf);
        std::fs::write(&conf_path, text).unwrap();
        // A port free a moment ago; another process may take it first, so
        // a failed start tries another.
        for _ in 0..5 {
            let port = super::free_loopback_port();
            std::fs::write(
                c.root.join("data").join("postgresql.auto.conf"),
                format!("port = {port}\n"),
            )
            .unwrap();
            if let Some((uid, gid)) = c.run_as {
                chown(&c.root.join("data").join("postgresql.auto.conf"), uid, gid);
            }
            c.port = port;
            if c.try_pg_ctl(&["start", "-w", "-t", "60"]) {
                return c;
            }
        }
        panic!(
            "the test PostgreSQL did not start; its log: {}",
            std::fs::read_to_string(c.log()).unwrap_or_default()
        );
    }

    fn data(&self) -> String {
        self.root.join("data").display().to_string()
    }

    fn log(&self) -> PathBuf {
        self.root.join("server.log")
    }

    fn command(&self, tool: &str) -> Command {
        let mut cmd = match &self.run_as {
            Some((uid, gid)) => {
                let mut c = Command::new("setpriv");
                c.args([
                    &format!("--reuid={uid}"),
                    &format!("--regid={gid}"),
                    "--clear-groups",
                    "--",
                ]);
                c.arg(self.bin.join(tool));
                c
            }
            None => Command::new(self.bin.join(tool)),
        };
        // `nobody`'s home does not exist; nothing needs it.
        cmd.current_dir(&self.root).env_remove("PGDATA");
        cmd
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let out = self.command(tool).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{tool} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn try_pg_ctl(&self, args: &[&str]) -> bool {
        let log = self.log().display().to_string();
        let data = self.data();
        let mut all = vec!["-D", data.as_str(), "-l", log.as_str()];
        all.extend_from_slice(args);
        self.command("pg_ctl")
            .args(&all)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn pg_ctl(&self, args: &[&str]) {
        assert!(
            self.try_pg_ctl(args),
            "pg_ctl {args:?} failed; the server's log: {}",
            std::fs::read_to_string(self.log()).unwrap_or_default()
        );
    }

    /// Stops the server and removes its directory when this process ends.
    // The watchdog is meant to outlive this process (it waits for our
    // exit): it is never waited for.
    #[allow(clippy::zombie_processes)]
    fn watchdog(&self) {
        let pg_ctl = match &self.run_as {
            Some((uid, gid)) => format!(
                "setpriv --reuid={uid} --regid={gid} --clear-groups -- {}",
                self.bin.join("pg_ctl").display()
            ),
            None => self.bin.join("pg_ctl").display().to_string(),
        };
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {pg_ctl} -D '{data}' stop -m immediate >/dev/null 2>&1; rm -rf '{root}'",
            pid = std::process::id(),
            data = self.data(),
            root = self.root.display(),
        );
        Command::new("sh")
            .args(["-c", &script])
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    }

    /// Holds off [`Cluster::exclusive`] tests while this one uses the server.
    pub(crate) fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|e| e.into_inner())
    }

    /// For a test that stops or restarts the server.
    pub(crate) fn exclusive(&self) -> Exclusive<'_> {
        Exclusive {
            cluster: self,
            _gate: self.gate.write().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Kills the server without a shutdown checkpoint (as a crash would)
    /// and starts it again.
    pub(crate) fn restart_immediate(&self) {
        self.pg_ctl(&["restart", "-m", "immediate", "-w", "-t", "60"]);
    }

    /// Stops the server (fast shutdown: clients are disconnected).
    pub(crate) fn stop(&self) {
        self.pg_ctl(&["stop", "-m", "fast", "-w", "-t", "60"]);
    }

    /// Starts the server again after [`Cluster::stop`].
    pub(crate) fn start_again(&self) {
        self.pg_ctl(&["start", "-w", "-t", "60"]);
    }

    /// Runs SQL as the admin in `database` with `psql`; returns its output
    /// (unaligned, tuples only). Panics if it fails.
    pub(crate) fn sql(&self, database: &str, sql: &str) -> String {
        let out = self
            .psql(database, sql)
            .output()
            .unwrap_or_else(|e| panic!("psql: {e}"));
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// A `psql` command for `sql` in `database` (to spawn, for a session
    /// that must stay open while the test runs).
    pub(crate) fn psql(&self, database: &str, sql: &str) -> Command {
        let mut cmd = Command::new(self.bin.join("psql"));
        cmd.args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            ADMIN,
            "-d",
            database,
            "-c",
            sql,
        ])
        .env("PGPASSWORD", &self.password)
        .env("PGCONNECT_TIMEOUT", "5");
        cmd
    }
}

/// A CA and a server certificate for `127.0.0.1` it signed, made with the
/// `openssl` command (a dependency of Debian's postgresql); returns the
/// CA's path. The server's key is the server user's, 0600, as PostgreSQL
/// demands.
fn make_tls_files(root: &Path, run_as: Option<(u32, u32)>) -> PathBuf {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=credbroker test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    ]);
    run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        root.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
    set_mode(&root.join("server.key"), 0o600);
    if let Some((uid, gid)) = run_as {
        for f in ["server.key", "server.crt"] {
            chown(&root.join(f), uid, gid);
        }
    }
    root.join("ca.crt")
}

fn chown(p: &Path, uid: u32, gid: u32) {
    nix::unistd::chown(
        p,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
    )
    .unwrap();
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A fresh, empty database of the cluster for one test.
#[derive(Debug)]
pub(crate) struct Database {
    pub(crate) cluster: &'static Cluster,
    pub(crate) name: String,
}

/// Creates a database named after the test (and a counter, so one test can
/// have several).
pub(crate) fn database(cluster: &'static Cluster, test: &str) -> Database {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let name = format!(
        "t_{}_{n}",
        test.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect::<String>()
    );
    cluster.sql("postgres", &format!("DROP DATABASE IF EXISTS {name}"));
    cluster.sql("postgres", &format!("CREATE DATABASE {name}"));
    Database { cluster, name }
}

impl Database {
    /// Store settings for this database; `migrate = "auto"`, a pool of 4
    /// and a 2 s statement timeout unless changed.
    pub(crate) fn settings(&self) -> PgSettings {
        PgSettings {
            config_file: PathBuf::from("test.toml"),
            host: "127.0.0.1".into(),
            port: self.cluster.port,
            database: self.name.clone(),
            user: ADMIN.into(),
            password_file: Some(self.cluster.password_file.clone()),
            ca_file: None,
            pool_size: 4,
            statement_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            migrate: Migrate::Auto,
        }
    }

    /// The `[postgres]` table of a config file for this database.
    pub(crate) fn config_toml(&self, migrate: &str) -> String {
        format!(
            "[postgres]\nhost = \"127.0.0.1\"\nport = {}\ndatabase = \"{}\"\nuser = \"{ADMIN}\"\npassword_file = \"{}\"\npool_size = 4\nstatement_timeout = \"2s\"\nconnect_timeout = \"2s\"\nmigrate = \"{migrate}\"\n",
            self.cluster.port,
            self.name,
            self.cluster.password_file.display()
        )
    }

    /// Passes this database to a worker process (a run of this test binary
    /// that calls [`settings_from_env`]).
    pub(crate) fn pass_to(&self, cmd: &mut Command) {
        cmd.env("CREDBROKER_TEST_PG_PORT", self.cluster.port.to_string())
            .env("CREDBROKER_TEST_PG_DB", &self.name)
            .env(
                "CREDBROKER_TEST_PG_PASSWORD_FILE",
                &self.cluster.password_file,
            );
    }

    /// Runs SQL in this database (see [`Cluster::sql`]).
    pub(crate) fn sql(&self, sql: &str) -> String {
        self.cluster.sql(&self.name, sql)
    }
}

/// In a worker process: the settings of the database its parent passed
/// with [`Database::pass_to`] (`migrate = "manual"`: the parent migrated).
pub(crate) fn settings_from_env() -> PgSettings {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    PgSettings {
        config_file: PathBuf::from("test.toml"),
        host: "127.0.0.1".into(),
        port: var("CREDBROKER_TEST_PG_PORT").parse().unwrap(),
        database: var("CREDBROKER_TEST_PG_DB"),
        user: ADMIN.into(),
        password_file: Some(var("CREDBROKER_TEST_PG_PASSWORD_FILE").into()),
        ca_file: None,
        pool_size: 2,
        statement_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        migrate: Migrate::Manual,
    }
}

/// `n` instances of one agent on `db` (replicas): each from its own
/// quick-start directory (its own sockets and audit file), all with the
/// first one's master key, dev issuer and policy, and one issuer URL.
pub(crate) fn replicas(db: &Database, n: usize) -> Vec<super::TestBroker> {
    replicas_with(db, n, &super::Opts::default(), &|text| text)
}

/// [`replicas`] from files written with `opts` (`opts.audit_log` must be
/// unset: each replica writes `audit.jsonl` in its own directory), each
/// config text passed through `edit` before the `[postgres]` table is added.
/// The replicas start one after the other, so whatever the first one
/// creates at its start (the key ring, the schema) the others find.
pub(crate) fn replicas_with(
    db: &Database,
    n: usize,
    opts: &super::Opts,
    // Sees the whole config, `[postgres]` table included.
    edit: &dyn Fn(String) -> String,
) -> Vec<super::TestBroker> {
    assert!(opts.audit_log.is_none(), "replicas write audit.jsonl each");
    let mut out: Vec<super::TestBroker> = Vec::new();
    for i in 0..n {
        let (dir, config) = super::prepare(opts);
        if let Some(first) = out.first() {
            for f in [
                "keys/master.key",
                "keys/dev-issuer.pem",
                "dev-issuer-jwks.json",
                "policy.toml",
            ] {
                std::fs::copy(first.path(f), dir.path().join(f)).unwrap();
            }
        }
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(text.contains("store = \"data\"\n"));
        let text = text.replace("store = \"data\"\n", "audit_log = \"audit.jsonl\"\n");
        let text = edit(format!("{text}\n{}", db.config_toml("auto")));
        std::fs::write(&config, text).unwrap();
        eprintln!("replica {i}: {}", dir.path().display());
        out.push(super::TestBroker::spawn(dir, config, opts.log.as_deref()));
    }
    out
}
