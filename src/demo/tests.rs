//! The demo service's own checks: PKCE, single-use codes, only its own
//! tokens, refresh, revocation of a grant (kept across a restart), and
//! what `/authorize` refuses.
use super::*;
use crate::base::clock::ManualClock;
use http_body_util::BodyExt;
use std::path::PathBuf;

const REDIRECT: &str = "http://127.0.0.1:8440/callback/demo";
const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";

fn demo() -> (Arc<Demo>, Arc<ManualClock>) {
    demo_with(Es256Key::generate().unwrap().0, None)
}

fn demo_with(key: Es256Key, revoked_file: Option<PathBuf>) -> (Arc<Demo>, Arc<ManualClock>) {
    let clock = ManualClock::new(1_800_000_000);
    let d = Demo::new(
        DemoOptions {
            issuer: "http://127.0.0.1:8441".into(),
            api_base: "http://127.0.0.1:8441/api".into(),
            client_id: "cq".into(),
            redirect_uri: REDIRECT.into(),
            key,
            revoked_file,
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
    let challenge = crate::base::jose::sha256_b64(VERIFIER.as_bytes());
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

/// Two grants of one account: (access, refresh) tokens of each.
async fn two_grants(d: &Demo) -> [(String, String); 2] {
    let mut out = Vec::new();
    for _ in 0..2 {
        let c = code(d, "alice.demo").await;
        let (_, _, b) = call(d, "POST", "/token", &exchange(&c, VERIFIER), None).await;
        let t: Value = serde_json::from_str(&b).unwrap();
        out.push((
            t["access_token"].as_str().unwrap().to_string(),
            t["refresh_token"].as_str().unwrap().to_string(),
        ));
    }
    out.try_into().unwrap()
}

async fn refreshes(d: &Demo, rt: &str) -> StatusCode {
    let form = [
        ("grant_type", "refresh_token"),
        ("client_id", "cq"),
        ("refresh_token", rt),
    ];
    call(d, "POST", "/token", &form, None).await.0
}

async fn serves(d: &Demo, at: &str) -> StatusCode {
    call(d, "GET", "/api/notes", &[], Some(at)).await.0
}

#[tokio::test]
async fn revoking_a_refresh_token_ends_its_whole_grant_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("revoked");
    let (key, pkcs8) = Es256Key::generate().unwrap();
    let (d, _) = demo_with(key, Some(file.clone()));
    let [(at1, rt1), (at2, rt2)] = two_grants(&d).await;
    // Another client may not revoke; a token the demo does not know is
    // answered 200 (RFC 7009 section 2.2) and changes nothing.
    let other = [("client_id", "other"), ("token", rt1.as_str())];
    assert_eq!(
        call(&d, "POST", "/revoke", &other, None).await.0,
        StatusCode::UNAUTHORIZED
    );
    let unknown = [("client_id", "cq"), ("token", "not-a-token")];
    assert_eq!(
        call(&d, "POST", "/revoke", &unknown, None).await.0,
        StatusCode::OK
    );
    assert_eq!(serves(&d, &at1).await, StatusCode::OK);

    // The refresh token of grant 1: its access token stops too.
    let revoke = [
        ("client_id", "cq"),
        ("token", rt1.as_str()),
        ("token_type_hint", "refresh_token"),
    ];
    assert_eq!(
        call(&d, "POST", "/revoke", &revoke, None).await.0,
        StatusCode::OK
    );
    assert_eq!(serves(&d, &at1).await, StatusCode::UNAUTHORIZED);
    assert_eq!(refreshes(&d, &rt1).await, StatusCode::BAD_REQUEST);
    // Positive control: grant 2 is untouched.
    assert_eq!(serves(&d, &at2).await, StatusCode::OK);
    assert_eq!(refreshes(&d, &rt2).await, StatusCode::OK);

    // The same demo started again (same key, same file) still refuses
    // grant 1, and serves grant 2.
    let (again, _) = demo_with(Es256Key::from_pkcs8(pkcs8.expose()).unwrap(), Some(file));
    assert_eq!(serves(&again, &at1).await, StatusCode::UNAUTHORIZED);
    assert_eq!(refreshes(&again, &rt1).await, StatusCode::BAD_REQUEST);
    assert_eq!(serves(&again, &at2).await, StatusCode::OK);
}

#[tokio::test]
async fn revoking_an_access_token_ends_its_grant_and_a_refreshed_token_stays_in_it() {
    let (d, _) = demo();
    let [(at1, rt1), (at2, _)] = two_grants(&d).await;
    // A refresh keeps the grant: revoking the refreshed access token ends
    // the original refresh token too.
    let form = [
        ("grant_type", "refresh_token"),
        ("client_id", "cq"),
        ("refresh_token", rt1.as_str()),
    ];
    let (s, _, b) = call(&d, "POST", "/token", &form, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let refreshed: Value = serde_json::from_str(&b).unwrap();
    let at1b = refreshed["access_token"].as_str().unwrap();
    let revoke = [("client_id", "cq"), ("token", at1b)];
    assert_eq!(
        call(&d, "POST", "/revoke", &revoke, None).await.0,
        StatusCode::OK
    );
    assert_eq!(serves(&d, at1b).await, StatusCode::UNAUTHORIZED);
    assert_eq!(serves(&d, &at1).await, StatusCode::UNAUTHORIZED);
    assert_eq!(refreshes(&d, &rt1).await, StatusCode::BAD_REQUEST);
    assert_eq!(serves(&d, &at2).await, StatusCode::OK);
}

#[tokio::test]
async fn a_token_of_an_earlier_demo_without_a_grant_is_revoked_by_itself() {
    let (key, pkcs8) = Es256Key::generate().unwrap();
    let (d, _) = demo_with(key, None);
    // Refresh tokens as an earlier demo signed them: no `grant` claim.
    let signer = Es256Key::from_pkcs8(pkcs8.expose()).unwrap();
    let old = |jti: &str| {
        let mut header = serde_json::Map::new();
        header.insert("typ".into(), REFRESH_TYP.into());
        header.insert("kid".into(), signer.kid.clone().into());
        let claims = json!({
            "iss": "http://127.0.0.1:8441", "aud": "http://127.0.0.1:8441", "sub": "1001",
            "client_id": "cq", "scope": NOTES_SCOPE, "iat": 1_800_000_000,
            "exp": 1_800_000_000 + REFRESH_TTL, "jti": jti, "demo": true,
        });
        signer.sign_jws(header, &claims).unwrap()
    };
    let (first, second) = (old("jti-1"), old("jti-2"));
    assert_eq!(refreshes(&d, &first).await, StatusCode::OK);
    let revoke = [("client_id", "cq"), ("token", first.as_str())];
    assert_eq!(
        call(&d, "POST", "/revoke", &revoke, None).await.0,
        StatusCode::OK
    );
    assert_eq!(refreshes(&d, &first).await, StatusCode::BAD_REQUEST);
    // Positive control: another token of that kind is not touched.
    assert_eq!(refreshes(&d, &second).await, StatusCode::OK);
}

#[tokio::test]
async fn a_revocation_that_cannot_be_kept_is_503_and_revokes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // At start, a file that cannot be read is refused, named.
    let not_a_file = dir.path().join("a-directory");
    std::fs::create_dir(&not_a_file).unwrap();
    let e = Demo::new(
        DemoOptions {
            issuer: "http://127.0.0.1:8441".into(),
            api_base: "http://127.0.0.1:8441/api".into(),
            client_id: "cq".into(),
            redirect_uri: REDIRECT.into(),
            key: Es256Key::generate().unwrap().0,
            revoked_file: Some(not_a_file.clone()),
        },
        ManualClock::new(1_800_000_000),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains(&not_a_file.display().to_string()), "{e}");
    // Its directory removed once the demo runs: the revocation cannot be
    // written down.
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let (d, _) = demo_with(Es256Key::generate().unwrap().0, Some(sub.join("revoked")));
    std::fs::remove_dir(&sub).unwrap();
    let [(at1, rt1), _] = two_grants(&d).await;
    let revoke = [("client_id", "cq"), ("token", rt1.as_str())];
    let (s, _, b) = call(&d, "POST", "/revoke", &revoke, None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    // Not half done: the grant still works, as the 503 says.
    assert_eq!(serves(&d, &at1).await, StatusCode::OK);
}

#[tokio::test]
async fn authorize_refuses_another_client_or_redirect_and_cross_site_posts() {
    let (d, _) = demo();
    let challenge = crate::base::jose::sha256_b64(VERIFIER.as_bytes());
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
