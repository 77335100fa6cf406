//! `source = "service"` resources.
use super::*;

fn load(text: &str) -> Result<Policy, Vec<Problem>> {
    match Policy::parse(Path::new("p.toml"), text.as_bytes()) {
        Ok(p) => Ok(p),
        Err(PolicyError::Invalid(p)) => Err(p),
        Err(e) => panic!("{e}"),
    }
}

const GOOD: &str = r#"agent = "a"
[resources."https://api.github.com"]
source = "service"
service = "github"
delivery = "provider_token"
[tools."github.issues"]
resource = "https://api.github.com"
scopes = ["repo"]
steps = ["triage"]
"#;

#[test]
fn service_resource_with_explicit_delivery_loads() {
    let p = load(GOOD).unwrap();
    let r = &p.resources["https://api.github.com/"];
    assert_eq!(
        r.source,
        Source::Service {
            service: "github".into(),
            delivery: Delivery::ProviderToken
        }
    );
    assert_eq!(p.services().into_iter().collect::<Vec<_>>(), ["github"]);
}

#[test]
fn service_resource_without_delivery_or_service_is_refused() {
    let no_delivery = GOOD.replace("delivery = \"provider_token\"\n", "");
    let e = load(&no_delivery).unwrap_err();
    assert!(
        e.iter()
            .any(|p| p.key.as_deref() == Some("resources.\"https://api.github.com\".delivery")),
        "{e:?}"
    );
    let proxy = GOOD.replace("\"provider_token\"", "\"proxy\"");
    assert!(load(&proxy).is_err());
    let no_service = GOOD.replace("service = \"github\"\n", "");
    let e = load(&no_service).unwrap_err();
    assert!(
        e.iter()
            .any(|p| p.key.as_deref().is_some_and(|k| k.ends_with(".service"))),
        "{e:?}"
    );
    // A self resource may not carry service keys.
    let mixed = GOOD.replace("source = \"service\"", "source = \"self\"");
    assert!(load(&mixed).is_err());
    // Positive control.
    assert!(load(GOOD).is_ok());
}

#[test]
fn provider_token_delivery_is_warned_about_and_explained() {
    let p = load(GOOD).unwrap();
    let w = super::lint::lint(Path::new("p.toml"), GOOD, &p);
    assert!(
        w.iter()
            .any(|w| w.message == super::lint::PROVIDER_TOKEN_WARNING),
        "{w:?}"
    );
    let d = super::explain::describe_source(&p.resources["https://api.github.com/"].source);
    assert!(
        d.contains("service github") && d.contains("provider_token"),
        "{d}"
    );
    // Positive control: a self resource has no such warning.
    let selfish = "agent = \"a\"\n[resources.\"https://api.example\"]\nsource = \"self\"\n";
    let p = load(selfish).unwrap();
    assert!(super::lint::lint(Path::new("p.toml"), selfish, &p)
        .iter()
        .all(|w| w.message != super::lint::PROVIDER_TOKEN_WARNING));
}
