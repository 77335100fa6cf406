//! The quick start's own checks: addresses before anything is written, a
//! reused directory keeps its address, and `serve` refuses the demo
//! service, which only `quickstart` runs.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::time::{Duration, Instant};

use crate::support::quickstart::{run_expect_exit, Quickstart};
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_listen_on_all_interfaces_is_refused_before_writing() {
    let cwd = tempfile::tempdir().unwrap();
    let port = free_loopback_addr().rsplit(':').next().unwrap().to_string();
    for (flag, value, says) in [
        ("--listen", format!("0.0.0.0:{port}"), "loopback only"),
        ("--listen", format!("[::]:{port}"), "loopback only"),
        (
            "--listen",
            format!("localhost:{port}"),
            "an IP address and a port",
        ),
        ("--listen", "127.0.0.1:0".to_string(), "choose a port"),
        ("--demo-listen", format!("0.0.0.0:{port}"), "loopback only"),
    ] {
        let (code, err) = run_expect_exit(cwd.path(), &["quickstart", flag, &value]);
        assert_eq!(code, 1, "{flag} {value}: {err}");
        assert!(
            err.contains(&format!("{flag} {value}")) && err.contains(says),
            "{flag} {value}: {err}"
        );
        assert!(
            !cwd.path().join("credbroker-quickstart").exists(),
            "{flag} {value} wrote the directory"
        );
    }
    // A directory an older version wrote for 0.0.0.0 (a config that does
    // not load) is not reused silently: the message says what to do.
    let old = tempfile::tempdir().unwrap();
    credbroker::internals::cli::quickstart_files(
        &old.path().join("credbroker-quickstart"),
        &format!("0.0.0.0:{port}"),
    )
    .unwrap();
    let (code, err) = run_expect_exit(old.path(), &["quickstart"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("public.listen")
            && err.contains("cannot be reused as it is: remove credbroker-quickstart"),
        "{err}"
    );
    // Positive control: a loopback address with a port starts.
    let q = Quickstart::start_in(cwd, &free_loopback_addr(), &free_loopback_addr()).await;
    assert!(q.config().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_reused_directory_with_another_listen_is_refused() {
    let q = Quickstart::start().await;
    let (listen, demo) = (q.listen.clone(), q.demo_listen.clone());
    let alice_pw = q.password("alice");
    let cwd = q.stop();
    let other = free_loopback_addr();
    let (code, err) = run_expect_exit(cwd.path(), &["quickstart", "--listen", &other]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("was made for --listen {listen}"))
            && err.contains(&format!("run it with --listen {listen}"))
            && err.contains("credbroker.toml"),
        "{err}"
    );
    let (code, err) = run_expect_exit(
        cwd.path(),
        &["quickstart", "--listen", &listen, "--demo-listen", &other],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("run it with --demo-listen {demo}")),
        "{err}"
    );
    let text =
        std::fs::read_to_string(cwd.path().join("credbroker-quickstart/credbroker.toml")).unwrap();
    assert!(!text.contains(&other), "a refused run changed the config");
    // Positive control: the addresses it was made for are honoured, and the
    // accounts are kept (no new passwords printed).
    let q = Quickstart::start_in(cwd, &listen, &demo).await;
    let printed = q.printed();
    assert!(printed.contains("(reused)"), "{printed}");
    assert!(!printed.contains(&alice_pw), "{printed}");
    assert!(printed.contains("alice  exists"), "{printed}");
}

/// Issue 39: two quick starts, each given only its own `--listen`, both
/// run: the demo service takes the port after `--listen` (it kept 8441
/// whatever `--listen` said, so the second one could not bind it), and the
/// banner, the config and the demo tool's links name that address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_quickstarts_given_only_listen_each_get_their_own_demo_port() {
    let mut running = Vec::new();
    for _ in 0..2 {
        let port = free_loopback_port_pair();
        let listen = format!("127.0.0.1:{port}");
        let demo = format!("127.0.0.1:{}", port + 1);
        let cwd = tempfile::tempdir().unwrap();
        let q = Quickstart::start_with(cwd, &["--listen", &listen], &listen, &demo).await;
        let printed = q.printed();
        assert!(
            printed.contains(&format!("demo     http://{demo}")),
            "{printed}"
        );
        let config = std::fs::read_to_string(q.config()).unwrap();
        assert!(
            config.contains(&format!("issuer = \"http://{demo}\"")),
            "{config}"
        );
        assert!(!config.contains(":8441"), "{config}");
        running.push(q);
    }
    // Both demo services answer, each on its own port.
    for q in &running {
        let r = reqwest::get(format!("{}/", q.demo)).await.unwrap();
        assert!(r.status().is_success(), "{}: {}", q.demo, r.status());
    }
    // --demo-listen still names the demo's address when given: one equal
    // to --listen is refused.
    let cwd = tempfile::tempdir().unwrap();
    let listen = free_loopback_addr();
    let (code, err) = run_expect_exit(
        cwd.path(),
        &["quickstart", "--listen", &listen, "--demo-listen", &listen],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("needs an address of its own"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_the_quickstart_demo_service() {
    let q = Quickstart::start().await;
    let listen = q.listen.clone();
    let cwd = q.stop();
    let dir = cwd.path().join("credbroker-quickstart");
    let config = dir.join("credbroker.toml");
    // The killed quick start left its socket file; a start would replace it.
    let socket = || {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(dir.join("credbroker.sock"))
            .map(|m| m.ino())
            .ok()
    };
    let before = socket();
    let (code, err) = run_expect_exit(cwd.path(), &["serve", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&config.display().to_string())
            && err.contains("providers.demo")
            && err.contains("preset = \"quickstart-demo\"")
            && err.contains("only `credbroker quickstart` runs"),
        "{err}"
    );
    assert_eq!(socket(), before, "serve bound its socket");
    // Positive control: without the demo provider and its tool, the same
    // config serves.
    let text = std::fs::read_to_string(&config).unwrap();
    let cut = text.find("# The built-in demo service").unwrap();
    std::fs::write(&config, &text[..cut]).unwrap();
    std::fs::write(
        dir.join("policy.toml"),
        credbroker::internals::cli::QUICKSTART_POLICY,
    )
    .unwrap();
    let mut child = std::process::Command::new(bin())
        .args(["serve", "--config"])
        .arg(&config)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while reqwest::get(format!("http://{listen}/healthz"))
        .await
        .is_err()
    {
        assert!(child.try_wait().unwrap().is_none(), "serve exited");
        assert!(Instant::now() < deadline, "serve did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `derive` without `--issuer` takes the issuer from the socket's `GET
/// /v1/info` (the quick start here listens on a port of its own, not the
/// old default 8440); a given `--issuer` is still the one used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derive_without_issuer_reads_it_from_the_socket() {
    let q = Quickstart::start().await;
    assert!(!q.issuer.ends_with(":8440"), "{}", q.issuer);
    let token = q.subject_token("alice");
    let socket = q.socket();
    let derive = |issuer: Option<&str>| {
        let mut args = vec!["derive", "--socket", socket.to_str().unwrap()];
        if let Some(i) = issuer {
            args.extend(["--issuer", i]);
        }
        args.extend([
            "--subject-token",
            &token,
            "--step",
            "summarize",
            "--tool",
            "notes.read",
            "--resource",
            RESOURCE,
            "--dpop-key",
            "tool-key.pem",
            "--print",
            "token_type",
        ]);
        q.cli(&args)
    };
    let (code, out, err) = derive(None);
    assert_eq!((code, out.trim()), (0, "DPoP"), "{err}");
    // A wrong --issuer is used as given: the proof's htu does not match.
    let (code, out, err) = derive(Some("http://127.0.0.1:1"));
    assert_eq!(code, 2, "{out}{err}");
    assert!(format!("{out}{err}").contains("htu"), "{out}{err}");
    // Positive control: the right one.
    let (code, out, err) = derive(Some(&q.issuer));
    assert_eq!((code, out.trim()), (0, "DPoP"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derive_print_prints_one_member_raw_or_names_the_members() {
    let q = Quickstart::start().await;
    let token = q.subject_token("alice");
    let socket = q.socket();
    let derive = |tool: &str, resource: &str, member: &str| {
        q.cli(&[
            "derive",
            "--socket",
            socket.to_str().unwrap(),
            "--issuer",
            &q.issuer,
            "--subject-token",
            &token,
            "--step",
            "summarize",
            "--tool",
            tool,
            "--resource",
            resource,
            "--dpop-key",
            "tool-key.pem",
            "--print",
            member,
        ])
    };
    // A member the answer lacks: exit 1, only the names on stderr, no token.
    let (code, out, err) = derive("notes.read", RESOURCE, "refresh_token");
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(out, "");
    assert!(
        err.contains("--print refresh_token") && err.contains("access_token, "),
        "{err}"
    );
    assert!(!err.contains("eyJ"), "a token was printed: {err}");
    // Positive control: the member, raw (no quotes, one line).
    let (code, out, err) = derive("notes.read", RESOURCE, "access_token");
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("eyJ") && out.trim_end().split('.').count() == 3,
        "{out}"
    );
    let (code, out, _) = derive("notes.read", RESOURCE, "expires_in");
    assert_eq!(code, 0);
    assert!(out.trim().parse::<u64>().unwrap() <= 300, "{out}");
    // A refusal keeps its exit code 2 while printing the member.
    let (code, out, err) = derive("demo.notes", &q.demo_proxy(), "connect_uri");
    assert_eq!(code, 2, "{err}");
    assert!(
        out.trim().starts_with(&format!("{}/connect/", q.issuer)),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_made_by_an_older_version_still_serves_and_says_what_differs() {
    let q = Quickstart::start().await;
    let (listen, demo) = (q.listen.clone(), q.demo_listen.clone());
    let printed = q.printed();
    assert!(printed.contains("/proxy/demo/api/notes"), "{printed}");
    assert!(!printed.contains("older version"), "{printed}");
    let cwd = q.stop();
    // The demo tool as an older binary wrote it: the demo API's own
    // address, delivering the demo service's token.
    let policy = cwd.path().join("credbroker-quickstart/policy.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    let cut = text
        .find("\n# The quick start's built-in demo service")
        .unwrap();
    let api = format!("http://{demo}/api");
    std::fs::write(
        &policy,
        format!(
            "{}\n[resources.\"{api}\"]\nsource = \"service\"\nservice = \"demo\"\n\
             delivery = \"provider_token\"\n\n[tools.\"demo.notes\"]\nresource = \"{api}\"\n\
             scopes = [\"notes:read\"]\nsteps = [\"answer_question\", \"summarize\"]\n",
            &text[..cut]
        ),
    )
    .unwrap();
    let q = Quickstart::start_in(cwd, &listen, &demo).await;
    let printed = q.printed();
    assert!(
        printed.contains("made by an older version")
            && printed.contains("delivery = \"provider_token\"")
            && printed.contains("give a new --dir"),
        "{printed}"
    );
    assert!(!printed.contains("/proxy/demo/api/notes"), "{printed}");
    // It still serves: the old demo tool answers with a connect link.
    let (code, out, err) = q.cli(&[
        "derive",
        "--socket",
        q.socket().to_str().unwrap(),
        "--issuer",
        &q.issuer,
        "--subject-token",
        &q.subject_token("alice"),
        "--step",
        "summarize",
        "--tool",
        "demo.notes",
        "--resource",
        &api,
        "--dpop-key",
        "tool-key.pem",
        "--print",
        "connect_uri",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.starts_with(&format!("{}/connect/", q.issuer)), "{out}");
}
