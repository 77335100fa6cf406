//! `[providers.*]` and `[vault]` tables.
use super::providers::GITHUB_TOKEN;
use super::*;

const BASE: &str = r#"
agent = "a"
issuer = "http://127.0.0.1:8440"
policy = "p.toml"
store = "data"
[socket]
path = "s.sock"
[keys]
master_key_file = "keys/master.key"
[[trusted_issuers]]
issuer = "http://127.0.0.1:8440"
jwks_file = "j.json"
sign_in = { kind = "local" }
"#;

fn parse(extra: &str) -> Result<Config, Vec<Problem>> {
    match Config::parse(Path::new("/etc/cb/c.toml"), &format!("{BASE}{extra}")) {
        Ok(c) => Ok(c),
        Err(ConfigError::Invalid(p)) => Err(p),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn github_preset_fills_endpoints_account_api_and_post_auth() {
    let c = parse("[providers.github]\npreset = \"github\"\nclient_id = \"Iv1\"\nclient_secret_file = \"keys/gh\"\nscopes = [\"repo\"]\n").unwrap();
    let p = &c.providers["github"];
    assert_eq!(p.display_name, "GitHub");
    let e = p.endpoints.as_ref().unwrap();
    assert_eq!(e.token, GITHUB_TOKEN);
    assert_eq!(e.revocation, None, "GitHub has no RFC 7009 endpoint");
    assert_eq!(p.client_auth, ClientAuth::Post);
    assert!(matches!(&p.account, AccountLookup::Api { name_field, .. } if name_field == "login"));
    assert_eq!(p.redirect_uri, "http://127.0.0.1:8440/callback/github");
    assert_eq!(
        p.client_secret_file.as_deref(),
        Some(Path::new("/etc/cb/keys/gh"))
    );
    assert_eq!(c.vault_key_dir, Path::new("/etc/cb/keys/vault"));
}

#[test]
fn generic_provider_by_discovery_or_explicit_endpoints() {
    let c = parse("[vault]\nkey_dir = \"/var/lib/cb/vk\"\n[providers.acme]\nissuer = \"https://id.acme.example\"\nclient_id = \"c\"\nclient_secret_file = \"s\"\n").unwrap();
    let p = &c.providers["acme"];
    assert!(p.endpoints.is_none());
    assert_eq!(p.client_auth, ClientAuth::Basic);
    assert_eq!(c.vault_key_dir, Path::new("/var/lib/cb/vk"));

    // Only a token endpoint: neither discovery nor explicit.
    let err = parse(
        "[providers.acme]\ntoken_endpoint = \"https://t.example/token\"\nclient_id = \"c\"\n",
    )
    .unwrap_err();
    assert!(
        err.iter()
            .any(|p| p.key.as_deref() == Some("providers.acme.token_endpoint")),
        "{err:?}"
    );
}

#[test]
fn provider_mistakes_are_all_reported_without_values() {
    let err = parse(
        "[providers.\"bad name\"]\nissuer = \"http://id.example\"\nclient_id = \"c\"\ntoken_endpoint_auth = \"client_secret_basic\"\ntimeout = \"2h\"\nscopes = [\"a b\"]\n",
    )
    .unwrap_err();
    let keys: Vec<_> = err.iter().filter_map(|p| p.key.clone()).collect();
    for want in ["name", "issuer", "client_secret_file", "timeout", "scopes"] {
        assert!(
            keys.iter()
                .any(|k| k == &format!("providers.bad name.{want}")),
            "{want} missing from {keys:?}"
        );
    }
    // An unknown key is reported by its path, never with its value.
    let err = parse("[providers.good]\nissuer = \"https://id.example\"\nclient_id = \"c\"\nclient_secret = \"hunter2-secret\"\n").unwrap_err();
    assert!(
        err.iter()
            .any(|p| p.key.as_deref() == Some("providers.good.client_secret")),
        "{err:?}"
    );
    assert!(!format!("{err:?}").contains("hunter2"));
    // Positive control: the same table written correctly loads.
    parse("[providers.good]\nissuer = \"https://id.example\"\nclient_id = \"c\"\nclient_secret_file = \"s\"\ntimeout = \"2s\"\nscopes = [\"a\"]\n").unwrap();
}

#[test]
fn the_example_deployment_config_loads_with_its_providers() {
    let text = include_str!("../../../deploy/credbroker.example.toml");
    let c = Config::parse(Path::new("/etc/credbroker/credbroker.toml"), text).unwrap();
    assert_eq!(c.providers["github"].display_name, "GitHub");
    // No `[vault]` (deprecated): the key directory is the default, beside
    // the master key, only ever read to import an older install's keys.
    assert_eq!(
        c.master_key_file,
        Path::new("/etc/credbroker/keys/master.key")
    );
    assert_eq!(c.vault_key_dir, Path::new("/etc/credbroker/keys/vault"));
}

#[test]
fn quickstart_demo_preset_fills_its_endpoints_under_its_issuer_and_is_flagged() {
    let c = parse("[providers.demo]\npreset = \"quickstart-demo\"\nissuer = \"http://127.0.0.1:8441\"\nclient_id = \"cq\"\n").unwrap();
    assert_eq!(c.quickstart_demo.as_deref(), Some("demo"));
    let p = &c.providers["demo"];
    assert_eq!(p.display_name, "Demo service");
    let e = p.endpoints.as_ref().unwrap();
    assert_eq!(e.authorization, "http://127.0.0.1:8441/authorize");
    assert_eq!(e.token, "http://127.0.0.1:8441/token");
    assert_eq!(
        e.revocation.as_deref(),
        Some("http://127.0.0.1:8441/revoke")
    );
    assert_eq!(p.client_auth, ClientAuth::None, "a public client: PKCE");
    // Its API's origin, for the egress proxy.
    assert_eq!(p.api_base.as_deref(), Some("http://127.0.0.1:8441"));
    assert!(
        matches!(&p.account, AccountLookup::Api { url, .. } if url == "http://127.0.0.1:8441/api/me")
    );
    // The demo runs on loopback only, and needs its issuer.
    for bad in [
        "https://demo.example",
        "http://10.0.0.1:8441",
        "http://127.0.0.1:8441/x",
    ] {
        let e = parse(&format!(
            "[providers.demo]\npreset = \"quickstart-demo\"\nissuer = \"{bad}\"\nclient_id = \"cq\"\n"
        ))
        .unwrap_err();
        assert!(
            e.iter()
                .any(|p| p.key.as_deref() == Some("providers.demo.issuer")),
            "{bad}: {e:?}"
        );
    }
    // An ordinary provider is not the demo.
    let c = parse("[providers.github]\npreset = \"github\"\nclient_id = \"Iv1\"\nclient_secret_file = \"keys/gh\"\n").unwrap();
    assert_eq!(c.quickstart_demo, None);
}

#[test]
fn api_base_is_an_origin_and_the_github_preset_fills_it() {
    let c = parse("[providers.github]\npreset = \"github\"\nclient_id = \"Iv1\"\nclient_secret_file = \"keys/gh\"\n").unwrap();
    assert_eq!(
        c.providers["github"].api_base.as_deref(),
        Some("https://api.github.com")
    );
    let base = |b: &str| {
        parse(&format!(
            "[providers.acme]\nissuer = \"https://idp.acme.example\"\nclient_id = \"x\"\napi_base = \"{b}\"\n"
        ))
    };
    for bad in [
        "http://api.acme.example",
        "https://api.acme.example/v1",
        "https://api.acme.example/?a=1",
        "https://user@api.acme.example",
        "not a url",
    ] {
        let e = base(bad).unwrap_err();
        assert!(
            e.iter()
                .any(|p| p.key.as_deref() == Some("providers.acme.api_base")),
            "{bad}: {e:?}"
        );
        assert!(!e.iter().any(|p| p.message.contains(bad)), "echoes {bad}");
    }
    // Positive controls: https, and http on loopback.
    assert_eq!(
        base("https://api.acme.example/").unwrap().providers["acme"]
            .api_base
            .as_deref(),
        Some("https://api.acme.example")
    );
    assert_eq!(
        base("http://127.0.0.1:8080").unwrap().providers["acme"]
            .api_base
            .as_deref(),
        Some("http://127.0.0.1:8080")
    );
}
