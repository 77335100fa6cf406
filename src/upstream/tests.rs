use super::*;

#[test]
fn pkce_s256_matches_rfc7636_appendix_b() {
    assert_eq!(
        pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
        "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    );
}

#[test]
fn token_answers_are_classified() {
    let ok = br#"{"access_token":"at-canary","token_type":"Bearer","expires_in":"3600","refresh_token":"rt-canary","scope":"repo read:org"}"#;
    let t = parse_token_answer(200, ok).unwrap();
    assert_eq!(t.expires_in, Some(3600));
    assert_eq!(t.scope.as_deref().unwrap(), ["repo", "read:org"]);
    let dbg = format!("{t:?}");
    assert!(!dbg.contains("canary"), "{dbg}");

    // GitHub reports errors with HTTP 200.
    let gh = br#"{"error":"bad_verification_code","error_description":"The code passed is incorrect or expired."}"#;
    assert_eq!(
        parse_token_answer(200, gh).unwrap_err(),
        UpstreamError::Rejected {
            error: "bad_verification_code".into()
        }
    );
    let ig = parse_token_answer(400, br#"{"error":"invalid_grant"}"#).unwrap_err();
    assert!(ig.is_invalid_grant());
    for (status, body) in [
        (500, &br#"{"error":"server_error"}"#[..]),
        (502, b"<html>bad gateway</html>"),
        (200, b"not json"),
        (200, br#"{"token_type":"Bearer"}"#),
        (200, br#"{"access_token":"x"}"#),
        (
            200,
            br#"{"access_token":"x","token_type":"Bearer","expires_in":-5}"#,
        ),
    ] {
        let e = parse_token_answer(status, body).unwrap_err();
        assert!(matches!(e, UpstreamError::Unavailable(_)), "{status} {e:?}");
        assert!(!e.is_invalid_grant());
    }
    // An error code is sanitised before it reaches a log.
    let weird = parse_token_answer(400, br#"{"error":"invalid_grant\n<script>"}"#).unwrap_err();
    assert_eq!(
        weird,
        UpstreamError::Rejected {
            error: "invalid_grantscript".into()
        }
    );
}

#[test]
fn discovery_urls_follow_rfc8414_and_oidc() {
    assert_eq!(
        discovery_urls("https://id.example").unwrap(),
        [
            "https://id.example/.well-known/oauth-authorization-server",
            "https://id.example/.well-known/openid-configuration"
        ]
    );
    assert_eq!(
        discovery_urls("https://id.example/tenant/1").unwrap()[0],
        "https://id.example/.well-known/oauth-authorization-server/tenant/1"
    );
}

#[test]
fn discovery_document_must_name_the_same_issuer_and_https_endpoints() {
    let doc = |iss: &str, token: &str| {
        format!(
            r#"{{"issuer":"{iss}","authorization_endpoint":"https://id.example/auth","token_endpoint":"{token}"}}"#
        )
    };
    assert!(matches!(
        parse_metadata(
            "https://id.example",
            doc("https://evil.example", "https://id.example/token").as_bytes()
        ),
        Err(UpstreamError::Config(_))
    ));
    assert!(parse_metadata(
        "https://id.example",
        doc("https://id.example", "http://id.example/token").as_bytes()
    )
    .is_err());
    let e = parse_metadata(
        "https://id.example",
        doc("https://id.example", "https://id.example/token").as_bytes(),
    )
    .unwrap();
    assert_eq!(e.token, "https://id.example/token");
    assert_eq!(e.revocation, None);
}
