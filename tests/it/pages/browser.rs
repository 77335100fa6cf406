//! The pages in a real browser: Debian's chromium driven by npm
//! `playwright-core` (tests/peers/pages_browser.mjs), no downloaded browser.
//!
//! Needs `/usr/bin/chromium` and the npm peers, both installed by
//! `scripts/install-test-deps`; without them these tests fail (they are not
//! skipped). Screenshots go to
//! `$CREDBROKER_SCREENSHOTS` when set (the ones in docs/screenshots were
//! made so), else to a temp dir.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::pages::*;
use credbroker::internals::pages::links::LinkKind;
use serde_json::json;

const PW: &str = "correct horse battery";

/// `tests/peers`, with node and its npm packages (checked in one place).
fn peers() -> PathBuf {
    crate::support::prereq::node_peers()
}

/// Chromium and the npm peers (checked in one place).
fn require_browser() {
    crate::support::prereq::chromium();
}

fn screenshot_dir(tmp: &Path) -> PathBuf {
    std::env::var_os("CREDBROKER_SCREENSHOTS")
        .map_or_else(|| tmp.join("screenshots"), PathBuf::from)
}

/// Runs the steps in a fresh chromium profile; panics with the transcript
/// when a step fails.
async fn browse(steps: serde_json::Value, shots: &Path) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("steps.json");
    std::fs::write(
        &spec,
        serde_json::to_vec(&json!({
            "userDataDir": tmp.path().join("profile"),
            "screenshotDir": shots,
            "steps": steps,
        }))
        .unwrap(),
    )
    .unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new("node")
            .arg(peers().join("pages_browser.mjs"))
            .arg(&spec)
            .current_dir(peers())
            .output(),
    )
    .await
    .expect("browser run timed out")
    .expect("node runs");
    let transcript = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "browser steps failed:\n{transcript}");
    transcript
}

/// Kills the child it holds on drop (the quick start we started).
struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The quick start as a person uses it: `credbroker quickstart`, then
/// `credbroker users add alice --replace`, then sign in with the keyboard in chromium
/// and see the account page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_start_sign_in_as_local_user_in_chromium() {
    require_browser();
    let dir = tempfile::tempdir().unwrap();
    let qs = dir.path().join("qs");
    let listen = crate::support::free_loopback_addr();
    let base = format!("http://{listen}");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_credbroker"));
    let log = std::fs::File::create(dir.path().join("qs.log")).unwrap();
    let _server = Child(
        std::process::Command::new(&bin)
            .args(["quickstart", "--dir"])
            .arg(&qs)
            .args(["--listen", &listen])
            .args(["--demo-listen", &crate::support::free_loopback_addr()])
            .stderr(log)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while reqwest::get(format!("{base}/signin")).await.is_err() {
        assert!(Instant::now() < deadline, "quick start did not come up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The quick start made alice (and bob), printing a generated password.
    let printed = std::fs::read_to_string(dir.path().join("qs.log")).unwrap();
    assert!(printed.contains("alice  password "), "{printed}");
    // While it runs, `users add` goes through the admin socket (here to
    // set a password of the test's choosing).
    let mut add = std::process::Command::new(&bin)
        .args([
            "users",
            "add",
            "alice",
            "--replace",
            "--password-stdin",
            "--config",
        ])
        .arg(qs.join("credbroker.toml"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    writeln!(add.stdin.take().unwrap(), "{PW}").unwrap();
    let out = add.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"running\":true"));

    let shots = screenshot_dir(dir.path());
    browse(
        json!([
            {"goto": format!("{base}/account")},
            {"expect_url": format!("{base}/signin?return_to=%2Faccount")},
            {"expect_text": "Sign in"},
            // Keyboard only: the name field has focus, Tab reaches the
            // password and then the button, Enter submits.
            {"expect_focus": "#username"},
            {"press": "Tab"},
            {"expect_focus": "#password"},
            {"press": "Tab"},
            {"expect_focus": "button[type=submit]"},
            {"focus": "#username"},
            {"fill": "#username", "value": "alice"},
            {"fill": "#password", "value": "not her password"},
            {"press": "Enter", "nav": true},
            {"expect_status": 403},
            {"expect_text": "The user name or password is not right"},
            {"screenshot": "signin-failed"},
            {"fill": "#username", "value": "alice"},
            {"fill": "#password", "value": PW},
            {"press": "Enter", "nav": true},
            {"expect_url": format!("{base}/account")},
            {"expect_text": "Your connected accounts"},
            {"expect_text": "Signed in as alice"},
            {"expect_text": "You have no connected accounts"},
            {"screenshot": "quickstart-account"},
            {"click": "form[action='/signout'] button"},
            {"expect_text": "You are signed out"},
            {"goto": format!("{base}/account")},
            {"expect_url": format!("{base}/signin")},
        ]),
        &shots,
    )
    .await;
    assert!(shots.join("quickstart-account.png").exists());
}

/// The connect pages as Alice and Bob see them, through the fake provider;
/// also checks that Chrome follows the connect button's redirect to the
/// provider under the CSP's `form-action`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_pages_in_chromium() {
    require_browser();
    let s = PagesServer::start().await;
    s.add_user("alice", PW);
    s.add_user("bob", PW);
    let alice = s.person("alice");
    let t0 = now();
    s.clock.set(t0);
    let (code, id) = s.fake.issue(
        &alice,
        "github",
        LinkKind::Connect,
        &["repo", "read:user"],
        t0,
    );
    s.fake.add_account(
        &alice,
        "gitlab",
        "77",
        "alice.gitlab",
        &[("triage-bot", &["read_api"])],
    );
    let (allow_code, _) = s.fake.issue(
        &alice,
        "gitlab",
        LinkKind::Allow,
        &["read_api", "read_repository"],
        t0,
    );
    s.fake.set_next_account("583231", "octo-alice");
    let link = s.url(&format!("/connect/{code}"));
    let allow_link = s.url(&format!("/connect/{allow_code}"));
    let shots = screenshot_dir(s.dir.path());
    let sign_in_steps = |name: &str| {
        json!([
            {"fill": "#username", "value": name},
            {"fill": "#password", "value": PW},
            {"click": "form[action='/signin'] button[type=submit]"},
        ])
    };
    let mut steps = vec![
        // Bob opens Alice's forwarded link.
        json!({"goto": link}),
        json!({"expect_url": s.url("/signin?return_to=")}),
        json!({"screenshot": "signin"}),
    ];
    steps.extend(sign_in_steps("bob").as_array().unwrap().clone());
    steps.extend([
        json!({"expect_status": 403}),
        json!({"expect_text": "This link was made for another account"}),
        json!({"expect_no_text": "alice"}),
        json!({"screenshot": "other-person"}),
        json!({"click": "form[action='/signout'] button"}),
        // Any unknown code.
        json!({"goto": s.url("/connect/8Wq3bGkM2nYx7Tj4vLp0sRcD9eFhA1uIoKzQwErTyUi")}),
        json!({"expect_status": 404}),
        json!({"screenshot": "not-found"}),
        // Alice.
        json!({"goto": link}),
    ]);
    steps.extend(sign_in_steps("alice").as_array().unwrap().clone());
    steps.extend([
        json!({"expect_url": link}),
        json!({"expect_text": "Connect GitHub for repo-helper"}),
        json!({"expect_text": "alice"}),
        json!({"screenshot": "connect"}),
        json!({"viewport": [390, 844]}),
        json!({"screenshot": "connect-phone"}),
        json!({"viewport": [1100, 800]}),
        json!({"goto": allow_link}),
        json!({"expect_text": "alice.gitlab"}),
        json!({"screenshot": "allow"}),
        json!({"goto": link}),
        // The button posts to us; our answer redirects to the provider,
        // which redirects back to the callback, which ends on a page.
        json!({"click": "button[value=connect]"}),
        json!({"expect_url": s.url("/done/connected")}),
        json!({"expect_text": "Go back to your agent"}),
        json!({"screenshot": "done"}),
        json!({"goto": s.url("/account")}),
        json!({"expect_text": "GitHub: octo-alice"}),
        json!({"expect_text": "GitLab: alice.gitlab"}),
        json!({"screenshot": "account"}),
        json!({"viewport": [390, 844]}),
        json!({"screenshot": "account-phone"}),
    ]);
    browse(json!(steps), &shots).await;
    assert_eq!(s.fake.link_state(&id), LinkState::Closed);
    assert_eq!(
        s.fake
            .accounts_of(&alice)
            .iter()
            .find(|a| a.service == "github")
            .unwrap()
            .display_name,
        "octo-alice"
    );

    // A reconnect link; sixteen minutes after her sign-in she is asked to
    // sign in again first (the test moves the clock mid-run).
    let (code2, _) = s
        .fake
        .issue(&alice, "github", LinkKind::Reconnect, &["repo"], t0);
    let link2 = s.url(&format!("/connect/{code2}"));
    let ready = s.dir.path().join("ready");
    let go = s.dir.path().join("go");
    let mut steps = vec![json!({"goto": link2})];
    steps.extend(sign_in_steps("alice").as_array().unwrap().clone());
    steps.extend([
        json!({"expect_url": link2}),
        json!({"expect_text": "Reconnect GitHub for repo-helper"}),
        json!({"screenshot": "reconnect"}),
        json!({"touch": ready}),
        json!({"wait_file": go}),
        json!({"goto": link2}),
        json!({"expect_url": s.url("/signin?return_to=")}),
        json!({"expect_text": "Sign in again"}),
        json!({"expect_focus": "#password"}),
        json!({"screenshot": "signin-again"}),
        json!({"fill": "#password", "value": PW}),
        json!({"press": "Enter", "nav": true}),
        json!({"expect_url": link2}),
        json!({"expect_text": "Reconnect GitHub"}),
    ]);
    let clock = s.clock.clone();
    let mover = tokio::spawn(async move {
        while !ready.exists() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        clock.advance(16 * 60);
        std::fs::write(go, b"").unwrap();
    });
    browse(json!(steps), &shots).await;
    mover.await.unwrap();
}

/// Sign-in at a real OIDC IdP (panva's oidc-provider, tests/peers/oidc-provider.mjs)
/// in chromium: the link sends the person to sign in, the IdP signs her in
/// (code + PKCE, RFC 9207 `iss`) once: the sign-in leads to a link, so it
/// asks for `max_age=900`, and oidc-provider (which leaves `auth_time` out
/// unless asked) says when she signed in; the page is offered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_sign_in_at_oidc_provider_in_chromium() {
    require_browser();
    let tmp = tempfile::tempdir().unwrap();
    let port = crate::support::free_loopback_port();
    let base = format!("http://127.0.0.1:{port}");
    let secret = "pages-client-secret-canary";
    let cfg = tmp.path().join("idp.json");
    std::fs::write(
        &cfg,
        json!({"clients": [{
            "client_id": "credbroker-pages",
            "client_secret": secret,
            "redirect_uris": [format!("{base}/signin/callback")],
            "grant_types": ["authorization_code"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "client_secret_basic",
        }]})
        .to_string(),
    )
    .unwrap();
    let mut idp = tokio::process::Command::new("node")
        .arg(peers().join("oidc-provider.mjs"))
        .arg(&cfg)
        .current_dir(peers())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(idp.stdout.take().unwrap()));
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let issuer = serde_json::from_str::<serde_json::Value>(&first).unwrap()["issuer"]
        .as_str()
        .unwrap()
        .to_string();
    let iss = issuer.clone();
    let s = PagesServer::start_with(Setup {
        listen: Some(format!("127.0.0.1:{port}").parse().unwrap()),
        edit_config: Some(std::sync::Arc::new(move |mut text: String| {
            text.push_str(&format!(
                "\n[[trusted_issuers]]\nissuer = \"{iss}\"\njwks_uri = \"{iss}/jwks\"\nalgs = [\"RS256\", \"ES256\"]\nsign_in = {{ kind = \"oidc\", client_id = \"credbroker-pages\", client_secret_file = \"idp-secret\" }}\n"
            ));
            text
        })),
        ..Setup::default()
    })
    .await;
    credbroker::internals::config::write_secret_file(
        &s.dir.path().join("idp-secret"),
        secret.as_bytes(),
    )
    .unwrap();
    let person = credbroker::internals::subject::Person {
        iss: issuer.clone(),
        sub: "alice".into(),
    };
    let (code, _) = s
        .fake
        .issue(&person, "github", LinkKind::Connect, &["repo"], now());
    let link = s.url(&format!("/connect/{code}"));
    let shots = screenshot_dir(s.dir.path());
    let idp_login = json!([
        {"fill": "input[name=login]", "value": "alice"},
        {"fill": "input[name=password]", "value": "any"},
        {"click": "button[type=submit]"},
        {"click_if": "input[name=prompt][value=consent] ~ button[type=submit]"},
    ]);
    let mut steps = vec![
        json!({"goto": link}),
        json!({"expect_url": s.url("/signin?return_to=")}),
        json!({"expect_text": "Sign in at 127.0.0.1"}),
        json!({"click": "a.button[href^='/signin/oidc']"}),
        json!({"expect_url": format!("{issuer}/interaction/")}),
    ];
    steps.extend(idp_login.as_array().unwrap().clone());
    steps.extend([
        json!({"expect_url": link}),
        json!({"expect_text": "Connect GitHub for repo-helper"}),
        json!({"expect_text": "alice"}),
        json!({"screenshot": "oidc-connect"}),
    ]);
    browse(json!(steps), &shots).await;
    let signins = s.events("signin.succeeded");
    assert_eq!(signins.len(), 1, "one sign-in, not two");
    assert!(signins
        .iter()
        .all(|e| e["person_iss"] == issuer.as_str() && e["person_sub"] == "alice"));
    drop(idp.stdin.take());
    let _ = idp.wait().await;
}
