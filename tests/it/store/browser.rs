//! Three replicas behind a load balancer, end to end in Chromium (issue 13):
//! the real binary three times on one PostgreSQL database with one issuer
//! URL, the forwarder of `support/replicas.rs` in front of their pages,
//! panva's `oidc-provider` as the organisation's IdP (sign-in on the pages)
//! and as the service `acme`. A refusal on replica A's socket hands out a
//! link; the person opens it through the forwarder directed at B, signs in
//! at the IdP and gets the offer there; the provider's answer lands on C;
//! the next derive on A is issued, and its token verifies with npm `jose`
//! against the JWKS fetched through the forwarder. A freeze set on B then
//! holds on A and C on the `service` path (`replicas.rs` shows it on the
//! `self` path).
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use credbroker::client::{Answer, Refusal};
use credbroker::internals::jose::Es256Key;
use serde_json::json;

use crate::support::browser::{idp_sign_in, local_sign_in, Browsers};
use crate::support::oidc::OrgIdp;
use crate::support::postgres::{cluster_or_not_shown, database};
use crate::support::replicas::{Forwarder, Pick, ReplicaSet};
use crate::support::services::{issued, refused, ProviderOpts, SERVICE};
use crate::support::{holds_by, jose, key, slack, TestBroker};

const ALICE_PW: &str = "alice's own password";

/// The `acme` tool whose tokens are the broker's own (the egress proxy's
/// audience), so a resource server verifies them against the JWKS.
fn proxy_policy(issuer: &str) -> String {
    format!(
        r#"
[resources."{issuer}/proxy/acme"]
source = "service"
service = "acme"
delivery = "proxy"

[tools."acme.read"]
resource = "{issuer}/proxy/acme"
scopes = ["repo"]
steps = ["triage"]
routes = ["GET /user"]
"#
    )
}

async fn derive(b: &TestBroker, k: &Es256Key, subject: &str, tool: &str, resource: &str) -> Answer {
    b.derive(k, subject, "triage", tool, resource, None).await
}

fn connect_id(r: &Refusal) -> String {
    assert_eq!(r.reason.as_deref(), Some("connect_required"), "{r:?}");
    r.connect_id.clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn link_refused_on_a_opened_on_b_called_back_on_c_then_issued_on_a() {
    let Some(cluster) = cluster_or_not_shown("three replicas behind a load balancer") else {
        return;
    };
    let _shared = cluster.shared();
    let lb = Forwarder::start();
    let issuer = lb.url();
    let org = OrgIdp::start(&issuer, &[("alice", ALICE_PW)]);
    let set = ReplicaSet::start(
        lb,
        database(cluster, "replicas_browser"),
        3,
        ProviderOpts {
            // `api_base` lands in [providers.acme]; the proxy is never
            // called here (its tokens are what is checked), so the port is
            // a closed one.
            extra_config: format!(
                "api_base = \"http://127.0.0.1:9\"\n\n[proxy]\n{}",
                org.config
            ),
            extra_policy: proxy_policy(&issuer),
            ..ProviderOpts::default()
        },
    );
    let (a, b, c) = (&set.brokers[0], &set.brokers[1], &set.brokers[2]);
    let proxy = format!("{issuer}/proxy/acme");
    let alice = &org.tokens["alice"];
    let k = key();

    // A refusal on A's socket: a link under the one issuer URL.
    let r = refused(derive(a, &k, alice, "acme.read", &proxy).await);
    let id = connect_id(&r);
    let link = r.connect_uri.clone().unwrap();
    assert!(link.starts_with(&format!("{issuer}/connect/")), "{link}");
    let made = set.events(0, "connect.link_issued");
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0]["connect_id"], id.as_str());
    // Refused on C too (nothing connected yet), with the same open link:
    // one open link per person, agent and service across the replicas.
    let on_c = refused(derive(c, &k, alice, "acme.read", &proxy).await);
    assert_eq!(connect_id(&on_c), id);

    // Chromium opens the link through the forwarder directed at B: the
    // sign-in at the IdP and the offer are B's pages.
    set.provider.peer.set_browser_account("octo-alice").await;
    set.lb.pick(Pick::To(1));
    let mut browsers = Browsers::start().await;
    let mut steps = vec![
        json!({"goto": link}),
        json!({"expect_url": format!("{issuer}/signin?return_to=")}),
    ];
    steps.extend(idp_sign_in(&org.issuer, "alice", ALICE_PW));
    steps.extend([
        json!({"expect_url": link}),
        json!({"expect_text": "Connect Acme for repo-helper"}),
        json!({"expect_text": "The agent repo-helper asks to use your Acme account"}),
    ]);
    browsers.steps("alice", json!(steps)).await;
    for prefix in ["/connect/", "/signin"] {
        let served = set.lb.served(prefix);
        assert!(
            !served.is_empty() && served.iter().all(|&i| i == 1),
            "{prefix} served by {served:?}, not only by B"
        );
    }
    // Not connected yet: A still refuses, with the same link.
    assert_eq!(
        connect_id(&refused(derive(a, &k, alice, "acme.read", &proxy).await)),
        id
    );

    // The button on B's offer; the provider's answer lands on C.
    set.lb.route_prefix("/callback/", 2);
    browsers
        .steps(
            "alice",
            json!([
                {"click": "button[value=connect]"},
                {"expect_url": format!("{issuer}/done/connected")},
                {"expect_text": "Go back to your agent"},
            ]),
        )
        .await;
    set.lb.clear_prefixes();
    assert_eq!(set.lb.served("/callback/"), [2], "the callback landed on C");
    assert_eq!(set.lb.served("/connect/").last(), Some(&1), "pressed on B");
    let completed = set.events(2, "connect.completed");
    assert_eq!(completed.len(), 1, "{completed:?}");
    assert_eq!(completed[0]["connect_id"], id.as_str());
    for i in [0, 1] {
        assert!(set.events(i, "connect.completed").is_empty(), "replica {i}");
    }

    // The next derive on A is issued: the account C stored, read on A.
    let t = issued(derive(a, &k, alice, "acme.read", &proxy).await);
    // A resource server verifies it with jose, finding the keys through
    // the issuer's metadata and JWKS, fetched through the forwarder in
    // turn from the replicas.
    set.lb.pick(Pick::RoundRobin);
    let before = set.lb.log().len();
    let v = jose(
        "verify-token",
        json!({"token": t.access_token.expose(), "issuer": issuer, "audience": proxy}),
    )
    .await
    .unwrap_or_else(|e| panic!("jose refused the token A issued: {e}"));
    assert_eq!(v["jwks_uri"], format!("{issuer}/.well-known/jwks.json"));
    assert_eq!(v["claims"]["sub"], "alice");
    let fetched: Vec<usize> = set.lb.log()[before..]
        .iter()
        .filter(|f| f.path.starts_with("/.well-known/"))
        .map(|f| f.replica)
        .collect();
    assert_eq!(fetched.len(), 2, "metadata and JWKS: {fetched:?}");
    assert_ne!(fetched[0], fetched[1], "from two replicas");
    // jose's check is not vacuous: the same token for another audience is
    // refused, and the right one again verifies.
    let e = jose(
        "verify-token",
        json!({"token": t.access_token.expose(), "issuer": issuer, "audience": SERVICE}),
    )
    .await
    .unwrap_err();
    assert_eq!(e, "ERR_JWT_CLAIM_VALIDATION_FAILED");
    let again = jose(
        "verify-token",
        json!({"token": t.access_token.expose(), "issuer": issuer, "audience": proxy}),
    )
    .await
    .unwrap();
    assert_eq!(again["claims"], v["claims"]);
    // And the provider's own token, for the provider_token tool, is live at
    // the provider: A decrypted what C sealed.
    let acme = issued(derive(a, &k, alice, "acme.issues", SERVICE).await);
    assert!(
        set.provider
            .peer
            .access_token_live(acme.access_token.expose())
            .await
    );
    assert_eq!(
        set.provider.peer.stats().await["authorization_code"],
        1,
        "one authorization, on C"
    );

    // A freeze set on B holds on A and C within a second (or four times
    // what B took to write it, on a loaded machine: support::slack): their
    // derives sent after that refuse, and a refusal while frozen hands out
    // no link.
    let start = Instant::now();
    assert_eq!(b.admin_post("/freeze", "on").unwrap().0, 200);
    let bound = slack(start.elapsed());
    for (name, x) in [("A", a), ("C", c)] {
        holds_by(
            start,
            bound,
            &format!("the freeze reaching {name}"),
            || async {
                matches!(
                    derive(x, &k, alice, "acme.read", &proxy).await,
                    Answer::Refused(_)
                )
            },
        )
        .await;
    }
    let frozen = refused(derive(a, &k, alice, "acme.issues", SERVICE).await);
    assert!(
        frozen.connect_uri.is_none(),
        "no link while frozen: {frozen:?}"
    );
    // Lifted on B: A and C issue again (the positive control).
    let start = Instant::now();
    assert_eq!(b.admin_post("/freeze", "off").unwrap().0, 200);
    let bound = slack(start.elapsed());
    for (name, x) in [("A", a), ("C", c)] {
        holds_by(
            start,
            bound,
            &format!("the lift reaching {name}"),
            || async {
                matches!(
                    derive(x, &k, alice, "acme.read", &proxy).await,
                    Answer::Issued(_)
                )
            },
        )
        .await;
    }
    browsers.finish().await;
}

/// What a page must never show: the parts of a Rust error or panic, the
/// database's name and address, and the secrets this broker holds.
fn assert_plain(text: &str, secrets: &[&str], what: &str) {
    for s in secrets {
        assert!(!text.contains(s), "{what}: a secret on the page:\n{text}");
    }
    for s in [
        "panicked",
        "backtrace",
        ".rs:",
        "postgres",
        "Postgres",
        "deadpool",
        "error connecting",
        "Connection refused",
        "statement",
    ] {
        assert!(!text.contains(s), "{what}: {s:?} on the page:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn pages_of_a_replica_without_postgres_show_a_plain_error_and_recover() {
    let Some(cluster) = cluster_or_not_shown("the pages while PostgreSQL is down") else {
        return;
    };
    let _exclusive = cluster.exclusive();
    let db = database(cluster, "pages_pg_down");
    let db_name = db.name.clone();
    let set = ReplicaSet::start(Forwarder::start(), db, 1, ProviderOpts::default());
    let a = &set.brokers[0];
    let issuer = set.issuer.clone();
    let (status, body) = a
        .admin_post(
            "/users",
            &json!({"name": "alice", "password": ALICE_PW}).to_string(),
        )
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let k = key();
    let alice = a.subject_token("alice");
    let r = refused(derive(a, &k, &alice, "acme.issues", SERVICE).await);
    let link = r.connect_uri.clone().unwrap();
    connect_id(&r);

    // Alice signs in and sees the offer while the database is there.
    let mut browsers = Browsers::start().await;
    let mut steps = vec![json!({"goto": link})];
    steps.extend(local_sign_in("alice", ALICE_PW));
    steps.extend([
        json!({"expect_url": link}),
        json!({"expect_text": "Connect Acme for repo-helper"}),
    ]);
    browsers.steps("alice", json!(steps)).await;

    let pg_password = std::fs::read_to_string(&cluster.password_file).unwrap();
    let pg_password = pg_password.trim();
    let address = format!("127.0.0.1:{}", cluster.port);
    let secrets = [
        pg_password,
        set.provider.client_secret.as_str(),
        db_name.as_str(),
        address.as_str(),
    ];
    cluster.stop();
    // Every page that needs the store: a plain error page, at once (the
    // server refuses connections; a slow one is bounded by the statement
    // timeout), for the signed-in person and for a browser without a
    // session alike.
    let pages = [
        ("alice", link.clone()),
        ("alice", format!("{issuer}/account")),
        ("alice", format!("{issuer}/signin?return_to=%2Faccount")),
        ("mallory", link.clone()),
    ];
    for (who, url) in &pages {
        let start = Instant::now();
        let r = browsers
            .steps(who, json!([{"goto": url}, {"dom": "body"}]))
            .await;
        let took = start.elapsed();
        let status = r[0]["status"].as_u64().unwrap();
        let text = r[1].to_string();
        eprintln!("{who} at {url} with the database down: {status} after {took:?}");
        // 503, as for any outage to wait out: never the 500 of an
        // internal error (which would also be logged as one).
        assert_eq!(status, 503, "{who} at {url}\n{text}");
        assert!(text.contains("try again"), "{who} at {url}: {text}");
        assert_plain(&text, &secrets, url);
        assert!(
            took < Duration::from_secs(10),
            "{who} at {url}: the error page took {took:?}"
        );
    }
    // Nothing secret in what the broker logged meanwhile either, and no
    // page failure logged as an internal error.
    let log = a.log_text();
    assert!(
        !log.contains("pages: internal error"),
        "the outage was logged as an internal error"
    );
    for s in [pg_password, set.provider.client_secret.as_str()] {
        assert!(!log.contains(s), "a secret in the broker's log");
    }

    // The database returns: the same pages work again without a restart,
    // with the session made before the outage, and the link finishes.
    cluster.start_again();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let start = Instant::now();
    loop {
        let r = http.get(format!("{issuer}/signin")).send().await.unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the pages did not recover within 10 s of the database's return"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("pages back {:?} after the database", start.elapsed());
    set.provider.peer.set_browser_account("octo-alice").await;
    browsers
        .steps(
            "alice",
            json!([
                {"goto": link},
                {"expect_status": 200},
                {"expect_text": "Connect Acme for repo-helper"},
                {"click": "button[value=connect]"},
                {"expect_url": format!("{issuer}/done/connected")},
            ]),
        )
        .await;
    let t = issued(derive(a, &k, &alice, "acme.issues", SERVICE).await);
    assert!(
        set.provider
            .peer
            .access_token_live(t.access_token.expose())
            .await
    );
    browsers.finish().await;
}
