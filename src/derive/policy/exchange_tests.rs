//! `source = "exchange"` resources (docs/UPSTREAM.md).
use super::*;

fn load(text: &str) -> Result<Policy, Vec<Problem>> {
    match Policy::parse(Path::new("p.toml"), text.as_bytes()) {
        Ok(p) => Ok(p),
        Err(PolicyError::Invalid(p)) => Err(p),
        Err(e) => panic!("{e}"),
    }
}

const GOOD: &str = r#"agent = "a"
[resources."https://crm.example.com/api"]
source = "exchange"
upstream = "okta"
[tools."crm.read"]
resource = "https://crm.example.com/api"
scopes = ["crm:read"]
steps = ["summarize"]
"#;

fn messages(p: &[Problem]) -> Vec<String> {
    p.iter().map(ToString::to_string).collect()
}

#[test]
fn exchange_resource_names_its_upstream() {
    let p = load(GOOD).unwrap();
    assert_eq!(
        p.resources["https://crm.example.com/api"].source,
        Source::Exchange {
            upstream: "okta".into()
        }
    );
    assert_eq!(p.upstreams().into_iter().collect::<Vec<_>>(), ["okta"]);
    assert!(p.services().is_empty());
    // Without its upstream: refused, naming the key.
    let e = load(&GOOD.replace("upstream = \"okta\"\n", "")).unwrap_err();
    assert!(
        messages(&e)
            .iter()
            .any(|m| m.contains("resources.\"https://crm.example.com/api\".upstream")),
        "{e:?}"
    );
}

#[test]
fn upstream_belongs_to_exchange_resources_only() {
    let on_self = GOOD.replace("source = \"exchange\"", "source = \"self\"");
    let e = load(&on_self).unwrap_err();
    assert!(
        messages(&e)
            .iter()
            .any(|m| m.contains("only a resource with source = \"exchange\" takes this key")),
        "{e:?}"
    );
    // Control: the same file as an exchange resource loads.
    load(GOOD).unwrap();
}

#[test]
fn approval_and_details_are_refused_on_an_exchange_resource() {
    let approval = format!("{GOOD}approval = \"each_call\"\n");
    let e = load(&approval).unwrap_err();
    assert!(
        messages(&e).iter().any(|m| m.contains(
            "tools.\"crm.read\".approval: cannot apply to a resource with source = \"exchange\""
        )),
        "{e:?}"
    );
    let details = format!(
        "{GOOD}[tools.\"crm.read\".authorization_details.lookup]\nid = {{ kind = \"string\", label = \"Record\" }}\n"
    );
    let e = load(&details).unwrap_err();
    assert!(
        messages(&e).iter().any(|m| m.contains(
            "tools.\"crm.read\".authorization_details: cannot apply to a resource with source = \"exchange\""
        )),
        "{e:?}"
    );
    let required = format!("{GOOD}require_authorization_details = true\n");
    assert!(load(&required).is_err());
    // Control: the tool without them loads.
    load(GOOD).unwrap();
}
