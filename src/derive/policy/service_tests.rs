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

const PROXY: &str = r#"agent = "a"
steps = ["triage", "open_pr"]
[resources."https://broker.example/proxy/github"]
source = "service"
service = "github"
delivery = "proxy"
[tools."github.read"]
resource = "https://broker.example/proxy/github"
scopes = ["repo"]
steps = ["triage", "open_pr"]
routes = [
  "GET /repos/{owner}/{repo}/contents/{path...}",
  "GET /user",
  { route = "POST /repos/{owner}/{repo}/pulls", steps = ["open_pr"] },
]
"#;

fn keys(e: &[Problem]) -> Vec<&str> {
    e.iter().filter_map(|p| p.key.as_deref()).collect()
}

#[test]
fn proxy_resource_with_routes_loads_and_decides_per_route_and_step() {
    let p = load(PROXY).unwrap();
    let res = "https://broker.example/proxy/github";
    let r = &p.resources[res];
    assert_eq!(
        r.source,
        Source::Service {
            service: "github".into(),
            delivery: Delivery::Proxy
        }
    );
    let t = &p.tools["github.read"];
    assert_eq!(t.routes.len(), 3);
    assert_eq!(p.check_proxy_addresses("https://broker.example"), Ok(()));
    let call = |step, method, path| {
        p.proxy_route("github.read", step, res, method, path)
            .map(|r| r.text.as_str())
    };
    assert_eq!(call("triage", "GET", "/user"), Ok("GET /user"));
    assert_eq!(
        call("triage", "GET", "/repos/o/r/contents/a/b.md"),
        Ok("GET /repos/{owner}/{repo}/contents/{path...}")
    );
    // The route's own steps, then the tool's.
    assert_eq!(
        call("triage", "POST", "/repos/o/r/pulls"),
        Err(RouteDenial::StepNotAllowed)
    );
    assert_eq!(
        call("open_pr", "POST", "/repos/o/r/pulls"),
        Ok("POST /repos/{owner}/{repo}/pulls")
    );
    assert_eq!(
        call("deploy", "GET", "/user"),
        Err(RouteDenial::StepNotAllowed)
    );
    // The right path with the wrong method; GET does not imply HEAD.
    assert_eq!(
        call("triage", "DELETE", "/user"),
        Err(RouteDenial::RouteNotAllowed)
    );
    assert_eq!(
        call("triage", "HEAD", "/user"),
        Err(RouteDenial::RouteNotAllowed)
    );
    assert_eq!(
        call("triage", "GET", "/user/x"),
        Err(RouteDenial::RouteNotAllowed)
    );
    assert_eq!(
        p.proxy_route("other", "triage", res, "GET", "/user"),
        Err(RouteDenial::ToolNotAllowed)
    );
    assert_eq!(
        p.proxy_route(
            "github.read",
            "triage",
            "https://broker.example/proxy/gitlab",
            "GET",
            "/user"
        ),
        Err(RouteDenial::ResourceMismatch)
    );
}

#[test]
fn proxy_address_rule() {
    // The path is the file's: /proxy/{service} exactly.
    let wrong_path = PROXY.replace("/proxy/github\"]", "/proxy/gh\"]").replace(
        "resource = \"https://broker.example/proxy/github\"",
        "resource = \"https://broker.example/proxy/gh\"",
    );
    let e = load(&wrong_path).unwrap_err();
    assert!(
        keys(&e).contains(&"resources.\"https://broker.example/proxy/gh\""),
        "{e:?}"
    );
    // The origin is the issuer's, checked where the config is known.
    let p = load(PROXY).unwrap();
    let m = p
        .check_proxy_addresses("https://other.example")
        .unwrap_err();
    assert!(m.contains("https://other.example/proxy/github"), "{m}");
    // Nothing else may live under {issuer}/proxy/.
    let squatter =
        format!("{PROXY}[resources.\"https://broker.example/proxy/notes\"]\nsource = \"self\"\n");
    let p = load(&squatter).unwrap();
    let m = p
        .check_proxy_addresses("https://broker.example")
        .unwrap_err();
    assert!(m.contains("proxy/notes"), "{m}");
    // Positive control.
    let p = load(PROXY).unwrap();
    assert_eq!(p.check_proxy_addresses("https://broker.example/"), Ok(()));
}

#[test]
fn route_mistakes_are_refused_with_their_index() {
    let with_routes = |routes: &str| {
        let text = PROXY.replace(
            "  \"GET /user\",\n",
            &format!("  \"GET /user\",\n  {routes},\n"),
        );
        load(&text)
    };
    for bad in [
        "\"GET /{path...}\"",
        "\"GET /a%2Fb\"",
        "\"GET /a/../b\"",
        "\"TRACE /a\"",
        "\"GET /{p...}/x\"",
        "{ route = \"GET /x\", steps = [\"deploy\"] }",
        "{ route = \"GET /x\", steps = [] }",
        "{ route = \"GET /x\", method = \"GET\" }",
        "\"GET /user\"",
        "3",
    ] {
        let e = with_routes(bad).unwrap_err();
        assert!(
            keys(&e).contains(&"tools.\"github.read\".routes[2]"),
            "{bad}: {e:?}"
        );
    }
    // The all-paths route loads once the tool opts in by name.
    let opted = PROXY
        .replace(
            "  \"GET /user\",\n",
            "  \"GET /user\",\n  \"GET /{path...}\",\n",
        )
        .replace(
            "routes = [",
            "allow_every_path_for_this_tool = true\nroutes = [",
        );
    assert!(load(&opted).is_ok());
    // A proxy tool without routes, and routes on a tool of another resource.
    let no_routes = PROXY.split("routes = [").next().unwrap().to_string();
    let e = load(&no_routes).unwrap_err();
    assert!(keys(&e).contains(&"tools.\"github.read\".routes"), "{e:?}");
    let other = format!(
        "{PROXY}[resources.\"https://notes.example\"]\nsource = \"self\"\n[tools.notes]\nresource = \"https://notes.example\"\nsteps = [\"triage\"]\nroutes = [\"GET /x\"]\n"
    );
    let e = load(&other).unwrap_err();
    assert!(keys(&e).contains(&"tools.\"notes\".routes"), "{e:?}");
    // Positive control.
    assert!(with_routes("\"GET /orgs/{org}\"").is_ok());
}

#[test]
fn overlapping_routes_of_two_tools_are_warned_with_an_example() {
    let text = format!(
        "{PROXY}[tools.\"github.write\"]\nresource = \"https://broker.example/proxy/github\"\nscopes = [\"repo\"]\nsteps = [\"open_pr\"]\nroutes = [\"GET /repos/acme/{{repo}}/{{rest...}}\", \"PUT /user\"]\n"
    );
    let p = load(&text).unwrap();
    let w = lint::lint(Path::new("p.toml"), &text, &p);
    let overlap: Vec<_> = w
        .iter()
        .filter(|w| w.message.contains("overlaps"))
        .collect();
    assert_eq!(overlap.len(), 1, "{w:?}");
    assert!(
        overlap[0].message.contains("GET /repos/acme/x/contents/x"),
        "{}",
        overlap[0].message
    );
    // Positive control: the proxy itself is not warned about like
    // provider_token is.
    let w = lint::lint(Path::new("p.toml"), PROXY, &load(PROXY).unwrap());
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn diff_reports_routes_added_and_removed() {
    let old = load(PROXY).unwrap();
    let new_text = PROXY.replace("  \"GET /user\",\n", "  \"GET /orgs/{org}\",\n");
    let new = load(&new_text).unwrap();
    let r = diff::diff(&old, &new);
    assert!(
        r.gained
            .iter()
            .any(|g| g.contains("routes added") && g.contains("GET /orgs/{org}")),
        "{r:?}"
    );
    assert!(
        r.lost
            .iter()
            .any(|l| l.contains("routes removed") && l.contains("GET /user")),
        "{r:?}"
    );
    // Positive control: the same policy diffs to no change of access.
    assert!(diff::diff(&old, &load(PROXY).unwrap()).access_unchanged());
    // explain says what the proxy does, not what provider_token does.
    assert!(
        explain::describe_source(&old.resources["https://broker.example/proxy/github"].source)
            .contains("stays in the broker")
    );
}
