//! The demo service's own checks: PKCE, single-use codes, only its own
//! tokens, refresh, and what `/authorize` refuses.
use super::*;
use crate::clock::ManualClock;
use http_body_util::BodyExt;

const REDIRECT: &str = "http://127.0.0.1:8440/callback/demo";
const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";

fn demo() -> (Arc<Demo>, Arc<ManualClock>) {
    let clock = ManualClock::new(1_800_000_000);
    let d = Demo::new(
        DemoOptions {
            issuer: "http://127.0.0.1:8441".into(),
            api_base: "http://127.0.0.1:8441/api".into(),
            client_id: "cq".into(),
            redirect_uri: REDIRECT.into(),
            key: Es256Key::generate().unwrap().0,
        },
        clock.clone(),
    )
    .unwrap();
    (d, clock)
}

async fn call(
    d: &Demo,
    method: &str,
    uri: &str,
    form: &[(&str, &str)],
    bearer: Option<&str>,
) -> (StatusCode, HeaderMap, String) {
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form.iter())
        .finish();
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header("sec-fetch-site", "same-origin");
    if let Some(t) = bearer {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let r = d
        .handle(req.body(Full::new(Bytes::from(body))).unwrap())
        .await;
    let status = r.status();
    let headers = r.headers().clone();
    let text =
        String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    (status, headers, text)
}

/// Allows as `account` and returns the code from the redirect.
async fn code(d: &Demo, account: &str) -> String {
    let challenge = crate::jose::sha256_b64(VERIFIER.as_bytes());
    let (status, h, _) = call(
        d,
        "POST",
        "/authorize",
        &[
            ("response_type", "code"),
            ("code_challenge_method", "S256"),
            ("client_id", "cq"),
            ("redirect_uri", REDIRECT),
            ("state", "st"),
            ("code_challenge", &challenge),
            ("scope", NOTES_SCOPE),
            ("account", account),
            ("decision", "allow"),
        ],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let to = url::Url::parse(h[header::LOCATION].to_str().unwrap()).unwrap();
    assert!(to.as_str().starts_with(REDIRECT));
    let q: HashMap<_, _> = to.query_pairs().into_owned().collect();
    assert_eq!(q["state"], "st");
    assert_eq!(q["iss"], "http://127.0.0.1:8441");
    q["code"].clone()
}

fn exchange<'a>(code: &'a str, verifier: &'a str) -> Vec<(&'static str, &'a str)> {
    vec![
        ("grant_type", "authorization_code"),
        ("client_id", "cq"),
        ("code", code),
        ("redirect_uri", REDIRECT),
        ("code_verifier", verifier),
    ]
}

#[tokio::test]
async fn token_endpoint_checks_pkce_and_uses_a_code_once() {
    let (d, _) = demo();
    // A wrong verifier: refused, and the code is spent.
    let c = code(&d, "alice.demo").await;
    let wrong = "x".repeat(43);
    let (s, _, b) = call(&d, "POST", "/token", &exchange(&c, &wrong), None).await;
    assert_eq!(
        (s, b.as_str()),
        (StatusCode::BAD_REQUEST, r#"{"error":"invalid_grant"}"#)
    );
    let (s, _, _) = call(&d, "POST", "/token", &exchange(&c, VERIFIER), None).await;
    assert_eq!(
        s,
        StatusCode::BAD_REQUEST,
        "a code is used once, right or wrong"
    );
    // Positive control: a fresh code with the right verifier.
    let c = code(&d, "alice.demo").await;
    let (s, _, b) = call(&d, "POST", "/token", &exchange(&c, VERIFIER), None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let t: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(t["scope"], NOTES_SCOPE);
    let (s, _, b) = call(&d, "POST", "/token", &exchange(&c, VERIFIER), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "replayed code: {b}");
    // The API takes the access token; not the refresh token.
    let at = t["access_token"].as_str().unwrap();
    let rt = t["refresh_token"].as_str().unwrap();
    let (s, _, b) = call(&d, "GET", "/api/notes", &[], Some(rt)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{b}");
    let (s, _, b) = call(&d, "GET", "/api/notes", &[], Some(at)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(b.contains("alice.demo"), "{b}");
}

#[tokio::test]
async fn api_refuses_expired_and_foreign_tokens_and_refresh_renews() {
    let (d, clock) = demo();
    let c = code(&d, "bob.demo").await;
    let (_, _, b) = call(&d, "POST", "/token", &exchange(&c, VERIFIER), None).await;
    let t: Value = serde_json::from_str(&b).unwrap();
    let at = t["access_token"].as_str().unwrap().to_string();
    let rt = t["refresh_token"].as_str().unwrap().to_string();
    // Another demo's token (another key) is not its own.
    let (other, _) = demo();
    let c2 = code(&other, "bob.demo").await;
    let (_, _, b2) = call(&other, "POST", "/token", &exchange(&c2, VERIFIER), None).await;
    let foreign: Value = serde_json::from_str(&b2).unwrap();
    let (s, _, _) = call(&d, "GET", "/api/me", &[], foreign["access_token"].as_str()).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _, b) = call(&d, "GET", "/api/me", &[], Some(&at)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(b.contains(r#""login":"bob.demo""#), "{b}");
    clock.advance(ACCESS_TTL);
    let (s, _, _) = call(&d, "GET", "/api/me", &[], Some(&at)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "expired");
    // A refresh gives a new access token that works; a wider scope is refused.
    let rt = rt.as_str();
    let refresh = |scope: &'static str| {
        vec![
            ("grant_type", "refresh_token"),
            ("client_id", "cq"),
            ("refresh_token", rt),
            ("scope", scope),
        ]
    };
    let (s, _, _) = call(&d, "POST", "/token", &refresh("notes:read admin"), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _, b) = call(&d, "POST", "/token", &refresh(""), None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let t: Value = serde_json::from_str(&b).unwrap();
    let (s, _, _) = call(&d, "GET", "/api/notes", &[], t["access_token"].as_str()).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn authorize_refuses_another_client_or_redirect_and_cross_site_posts() {
    let (d, _) = demo();
    let challenge = crate::jose::sha256_b64(VERIFIER.as_bytes());
    let q = |client: &str, redirect: &str| {
        format!(
            "/authorize?response_type=code&code_challenge_method=S256&state=s&client_id={client}&redirect_uri={}&code_challenge={challenge}",
            form_urlencoded::byte_serialize(redirect.as_bytes()).collect::<String>()
        )
    };
    let (s, h, b) = call(&d, "GET", &q("cq", "http://127.0.0.1:9999/cb"), &[], None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(
        h.get(header::LOCATION).is_none(),
        "never redirects to an unknown URI"
    );
    assert!(b.contains("Demo service"));
    let (s, _, _) = call(&d, "GET", &q("other", REDIRECT), &[], None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // A form posted from another site is refused.
    let r = d
        .handle(
            Request::builder()
                .method("POST")
                .uri("/authorize")
                .header("sec-fetch-site", "cross-site")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Positive control: the page for the right client, marked a demo,
    // letting its form be redirected to the broker's callback only.
    let (s, h, b) = call(&d, "GET", &q("cq", REDIRECT), &[], None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(b.contains("Not a real provider") && b.contains("Alice's demo account"));
    let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(
        csp.contains("form-action 'self' http://127.0.0.1:8440;"),
        "{csp}"
    );
}
