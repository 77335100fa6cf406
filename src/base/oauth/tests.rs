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
        OAuthError::Rejected {
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
        assert!(matches!(e, OAuthError::Unavailable(_)), "{status} {e:?}");
        assert!(!e.is_invalid_grant());
    }
    // An error code is sanitised before it reaches a log.
    let weird = parse_token_answer(400, br#"{"error":"invalid_grant\n<script>"}"#).unwrap_err();
    assert_eq!(
        weird,
        OAuthError::Rejected {
            error: "invalid_grantscript".into()
        }
    );
}

#[test]
fn discovery_urls_follow_rfc8414_and_oidc() {
    assert_eq!(
        discovery_urls("https://id.example", Use::Provider).unwrap(),
        [
            "https://id.example/.well-known/oauth-authorization-server",
            "https://id.example/.well-known/openid-configuration"
        ]
    );
    assert_eq!(
        discovery_urls("https://id.example/tenant/1", Use::Provider).unwrap()[0],
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
        Err(OAuthError::Config(_))
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

#[test]
fn sign_in_discovery_is_openid_only() {
    assert_eq!(
        discovery_urls("https://id.example/", Use::SignIn { nonce: "n" }).unwrap(),
        ["https://id.example/.well-known/openid-configuration"]
    );
}

#[test]
fn callback_iss_is_checked_the_one_production_way() {
    let iss = Some("https://id.example");
    // Mix-up: another server's issuer, or any issuer for a server that has
    // none configured.
    assert!(check_callback_iss(iss, false, Some("https://other.example")).is_err());
    assert!(check_callback_iss(None, false, Some("https://id.example")).is_err());
    // A server that says it always sends iss must send it.
    assert!(check_callback_iss(iss, true, None).is_err());
    // Positive controls.
    assert!(check_callback_iss(iss, true, iss).is_ok());
    assert!(check_callback_iss(iss, false, None).is_ok());
    assert!(check_callback_iss(None, false, None).is_ok());
}

#[test]
fn only_a_sign_in_sends_a_nonce() {
    let p = AuthorizationParams {
        client_id: "c",
        redirect_uri: "https://b.example/cb",
        scope: "",
        state: "s",
        code_challenge: "ch",
        extra: &[],
    };
    let has_nonce = |how| {
        authorization_url("https://id.example/auth", how, &p)
            .unwrap()
            .query_pairs()
            .any(|(k, _)| k == "nonce")
    };
    assert!(!has_nonce(Use::Provider));
    assert!(has_nonce(Use::SignIn { nonce: "n0" }));
}

#[test]
fn a_provider_code_answer_does_not_complete_a_sign_in() {
    let provider_answer =
        br#"{"access_token":"at-canary","token_type":"Bearer","expires_in":3600}"#;
    let e = parse_code_answer(200, provider_answer, Use::SignIn { nonce: "n0" }).unwrap_err();
    assert!(matches!(e, OAuthError::Unavailable(_)), "{e:?}");
    // Positive control: the same answer completes a provider connection.
    assert!(matches!(
        parse_code_answer(200, provider_answer, Use::Provider),
        Ok(CodeAnswer::Tokens(_))
    ));
}

#[test]
fn a_sign_in_answer_does_not_complete_a_provider_connection() {
    let sign_in_answer = br#"{"id_token":"eyJ.eyJ.sig"}"#;
    let e = parse_code_answer(200, sign_in_answer, Use::Provider).unwrap_err();
    assert!(matches!(e, OAuthError::Unavailable(_)), "{e:?}");
    // Positive control: the same answer completes a sign-in (its ID token
    // is then validated, nonce included, by the pages).
    assert!(matches!(
        parse_code_answer(200, sign_in_answer, Use::SignIn { nonce: "n0" }),
        Ok(CodeAnswer::IdToken(_))
    ));
}
