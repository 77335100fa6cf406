//! `docs/OPERATIONS.md`'s troubleshooting table against real runs: each
//! message the table quotes is produced here by the release's own binary
//! (a refused `serve`, or `status`), from the quick-start files with one
//! thing broken, and must be what the binary prints: the quoted text, with
//! the page's example paths and addresses replaced by this run's, and each
//! `...` or `…` standing for a part that varies. A row that needs what one
//! process cannot set up here (a second user, an older install) is named
//! below with the test that covers it; a new row must be one or the other.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{read_doc, table_rows};
use crate::support::*;

/// The first code span of a cell (single or double backticks).
fn first_span(cell: &str) -> Option<&str> {
    let fence = if cell.starts_with("``") { "``" } else { "`" };
    let rest = cell.strip_prefix(fence)?;
    let end = rest.find(fence)?;
    Some(rest[..end].trim())
}

/// The messages the table quotes, in its order.
fn doc_messages(text: &str) -> Vec<String> {
    table_rows(text, &["Message", "Cause", "Fix"])
        .iter()
        .map(|r| {
            first_span(&r[0])
                .unwrap_or_else(|| panic!("a message cell must start with a code span: {r:?}"))
                .to_string()
        })
        .collect()
}

/// Whether `output` says `quoted`, once the page's example values are
/// replaced by this run's (`subs`): the parts between elisions appear in
/// order.
fn says(output: &str, quoted: &str, subs: &[(&str, String)]) -> Result<(), String> {
    let mut want = quoted.to_string();
    for (example, actual) in subs {
        if !want.contains(example) {
            return Err(format!(
                "the example value {example:?} is not in {quoted:?}"
            ));
        }
        want = want.replace(example, actual);
    }
    let mut at = 0;
    for part in want.split("...").flat_map(|p| p.split('…')) {
        match output[at..].find(part) {
            Some(i) => at += i + part.len(),
            None => {
                return Err(format!(
                    "{part:?} (of {quoted:?}) is not in what the binary printed:\n{output}"
                ))
            }
        }
    }
    Ok(())
}

/// A fresh quick-start directory (no demo service) and its config.
fn fresh() -> (tempfile::TempDir, PathBuf) {
    prepare(&Opts::default())
}

fn edit(file: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains(from), "{from} not in {}", file.display());
    std::fs::write(file, text.replacen(from, to, 1)).unwrap();
}

/// The 1-based line of `file` that starts with `start`.
fn line_of(file: &Path, start: &str) -> usize {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .position(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting {start} in {}", file.display()))
        + 1
}

/// What a refused `serve` printed.
fn refused(config: &Path) -> String {
    let (status, stderr) = serve_expect_exit(config, Duration::from_secs(20));
    assert!(!status.success(), "the start was not refused: {stderr}");
    stderr
}

/// One row reproduced: what the binary printed, and the example values
/// the page uses in its place.
struct Run {
    output: String,
    subs: Vec<(&'static str, String)>,
}

fn run(row: &str) -> Option<Run> {
    let (dir, config) = fresh();
    let d = dir.path();
    let path = |p: &str| d.join(p).display().to_string();
    let out = |output: String, subs: Vec<(&'static str, String)>| Some(Run { output, subs });
    match row {
        "credbroker.toml:5:1: agnet: unknown key" => {
            // Line 5, column 1, as on the page.
            edit(&config, "issuer = ", "agnet = \"repo-helper\"\nissuer = ");
            assert_eq!(line_of(&config, "agnet"), 5);
            out(refused(&config), vec![])
        }
        "credbroker.toml:11:19: socket.max_connections: invalid value: integer `…`, expected usize" => {
            edit(&config, "path = \"credbroker.sock\"", "path = \"credbroker.sock\"\nmax_connections = -5");
            let line = line_of(&config, "max_connections");
            out(refused(&config), vec![("credbroker.toml:11:19", format!("credbroker.toml:{line}:19"))])
        }
        "trusted_issuers[0].sign_in: every trusted issuer must be paired with a sign-in source (kind = \"oidc\" or \"local\")" => {
            edit(&config, "sign_in = { kind = \"local\" }\n", "");
            out(refused(&config), vec![])
        }
        "trusted_issuers[0].sign_in: local sign-in pairs only with the broker's own issuer" => {
            let text = std::fs::read_to_string(&config).unwrap();
            let at = text.find("[[trusted_issuers]]").unwrap();
            let (head, tail) = text.split_at(at);
            let tail = tail.replacen("issuer = \"http://", "issuer = \"https://idp.example.com/x\"\n# was \"http://", 1);
            std::fs::write(&config, format!("{head}{tail}")).unwrap();
            out(refused(&config), vec![])
        }
        "public.listen: plain HTTP is allowed only on loopback; set tls_cert and tls_key" => {
            edit(&config, "listen = \"127.0.0.1:0\"", "listen = \"0.0.0.0:8440\"");
            out(refused(&config), vec![])
        }
        "issuer: must be an https URL (http only on loopback), without query or fragment" => {
            edit(&config, "issuer = \"http://127.0.0.1:0\"", "issuer = \"http://broker.example.com\"");
            out(refused(&config), vec![])
        }
        "keys.master_key_file: /etc/credbroker/keys/master.key has mode 0440, which lets its group or others in; a secret file must have mode 0600 or stricter: chmod 600 it (...)" => {
            let key = d.join("keys/master.key");
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o440)).unwrap();
            out(refused(&config), vec![("/etc/credbroker/keys/master.key", path("keys/master.key"))])
        }
        "keys.master_key_file: No such file or directory (os error 2)" => {
            std::fs::remove_file(d.join("keys/master.key")).unwrap();
            out(refused(&config), vec![])
        }
        "credbroker.toml: keys.master_key_file: /etc/credbroker/keys/master.key: an encryption key must be exactly 32 bytes (it holds 16 bytes; make one with `head -c 32 /dev/urandom`)" => {
            let key = d.join("keys/master.key");
            std::fs::remove_file(&key).unwrap();
            credbroker::internals::config::write_secret_file(&key, &[7u8; 16]).unwrap();
            out(refused(&config), vec![("/etc/credbroker/keys/master.key", path("keys/master.key"))])
        }
        "socket.path: group nosuchgroup does not exist" => {
            edit(&config, "path = \"credbroker.sock\"", "path = \"credbroker.sock\"\ngroup = \"nosuchgroup\"");
            out(refused(&config), vec![])
        }
        "socket.path: /run/x, where the socket directory would be created, does not exist; refusing to create it there" => {
            edit(&config, "path = \"credbroker.sock\"", "path = \"x/run/credbroker.sock\"");
            out(refused(&config), vec![("/run/x", path("x"))])
        }
        "public.listen: cannot listen on 127.0.0.1:8440: Address already in use (os error 98)" => {
            let busy = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = busy.local_addr().unwrap().to_string();
            edit(&config, "listen = \"127.0.0.1:0\"", &format!("listen = \"{addr}\""));
            out(refused(&config), vec![("127.0.0.1:8440", addr)])
        }
        "/etc/credbroker/policy.toml:3:8: agent: the policy is written for agent \"repo-helper\", but /etc/credbroker/credbroker.toml `agent` is \"other-agent\"" => {
            edit(&config, "agent = \"repo-helper\"", "agent = \"other-agent\"");
            let policy = d.join("policy.toml");
            let line = line_of(&policy, "agent");
            out(
                refused(&config),
                vec![
                    ("/etc/credbroker/policy.toml:3:8", format!("{}:{line}:8", policy.display())),
                    ("/etc/credbroker/credbroker.toml", config.display().to_string()),
                ],
            )
        }
        "trusted_issuers[0].jwks_file: /etc/credbroker/idp-jwks.json: No such file or directory (os error 2) (trusted issuer https://idp.example.com)" => {
            std::fs::remove_file(d.join("dev-issuer-jwks.json")).unwrap();
            let issuer = std::fs::read_to_string(&config)
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("issuer = \""))
                .unwrap()
                .trim_end_matches('"')
                .to_string();
            out(
                refused(&config),
                vec![
                    ("/etc/credbroker/idp-jwks.json", path("dev-issuer-jwks.json")),
                    ("https://idp.example.com", issuer),
                ],
            )
        }
        "signing keys: signing key record (store tree signing_keys): the record was sealed with key ..., which is not loaded; keys.master_key_file is not the master key this store was made with (every replica needs the same one)" => {
            // A store made under one master key, started with another.
            let mut b = TestBroker::spawn(dir, config.clone(), None);
            b.stop();
            let key = b.path("keys/master.key");
            std::fs::remove_file(&key).unwrap();
            credbroker::internals::config::write_secret_file(&key, &[9u8; 32]).unwrap();
            let output = refused(&config);
            drop(b);
            out(output, vec![])
        }
        "socket.path: /run/credbroker/credbroker.sock is in use by a running instance" => {
            let running = TestBroker::spawn(dir, config.clone(), None);
            let output = refused(&config);
            let socket = running.socket.display().to_string();
            drop(running);
            out(output, vec![("/run/credbroker/credbroker.sock", socket)])
        }
        "the policy's service resources name \"github\", which has no [providers.github] table in the config" => {
            // The GitHub example policy, in a broker with no GitHub table.
            let example = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("policy/examples/repo-helper-github.toml");
            std::fs::copy(example, d.join("policy.toml")).unwrap();
            out(refused(&config), vec![])
        }
        "{\"running\":false}" => {
            let o = Command::new(bin())
                .args(["status", "--config"])
                .arg(&config)
                .env("RUST_LOG", "off")
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(3), "status exits 3 when nothing runs");
            out(String::from_utf8_lossy(&o.stdout).into_owned(), vec![])
        }
        _ => None,
    }
}

/// Rows this file does not reproduce, each with why and what covers it.
const ELSEWHERE: &[(&str, &str)] = &[
    ("keys.master_key_file: /etc/credbroker/keys/master.key: permission denied: the file belongs to uid 0", "needs a second user: tests/it/operations/startup.rs::master_key_mounted_as_a_kubernetes_secret_names_mode_owner_and_fix"),
    ("credbroker.toml: socket.path: /run/credbroker: cannot give it to the socket group", "needs a second user: tests/it/operations/startup.rs::socket_group_the_broker_user_is_not_in_names_the_cause_and_the_fix"),
    ("socket.path: socket directory /run/credbroker is owned by uid 0", "needs a second user: tests/it/operations/startup.rs::socket_directory_of_another_user_names_its_owner_and_the_fix"),
    ("importing the vault keys:", "needs an install of an earlier release: tests/it/store/vault_keys.rs"),
    ("the store at /var/lib/credbroker/store is in use by another process", "needs a second process on one store"),
    ("cannot read /etc/credbroker/credbroker.toml: Permission denied", "needs a second user (root reads every file)"),
    ("this command runs as USER", "needs a second user: tests/it/operations/messages.rs"),
    ("{\"error\":\"invalid_dpop_proof\"", "an answer of the socket, not of a start: tests/it/security/dpop.rs"),
    ("connection refused: peer uid not in the allow-list", "a log line: tests/it/reference/operations.rs checks it against the code"),
];

#[test]
fn every_troubleshooting_message_is_what_the_binary_prints() {
    let text = read_doc("OPERATIONS.md");
    let messages = doc_messages(&text);
    assert!(messages.len() >= 20, "{messages:#?}");
    let mut reproduced = 0;
    let mut problems = Vec::new();
    for m in &messages {
        if let Some(r) = run(m) {
            reproduced += 1;
            if let Err(e) = says(&r.output, m, &r.subs) {
                problems.push(e);
            }
        } else if !ELSEWHERE.iter().any(|(start, _)| m.starts_with(start)) {
            problems.push(format!(
                "{m:?}: neither reproduced here nor listed in ELSEWHERE"
            ));
        }
    }
    for (start, _) in ELSEWHERE {
        if !messages.iter().any(|m| m.starts_with(start)) {
            problems.push(format!("ELSEWHERE names {start:?}, which no row quotes"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
    assert!(reproduced >= 15, "{reproduced} rows reproduced");

    // The comparison can fail: a message the binary does not print that
    // way, and an elided part in the wrong place.
    let printed = "credbroker.toml:5:1: agnet: unknown key";
    assert!(says(printed, printed, &[]).is_ok());
    assert!(says(printed, "credbroker.toml:5:1: agent: unknown key", &[]).is_err());
    assert!(says(printed, "unknown key ... agnet", &[]).is_err());
    assert!(says(printed, "credbroker.toml:5:1: ...: unknown key", &[]).is_ok());
}
