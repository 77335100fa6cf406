//! Connecting Alice's demo account at a running quick start, through the
//! pages' real forms over HTTP (sign in, Connect, the demo service's
//! Allow), as her browser would post them: shared by the benchmarks that
//! need a connected account before their load (examples/proxy_bench.rs,
//! examples/connect_demo.rs). Included with `#[path]`: an example cannot
//! use another example's code, and this is not the library's business.

/// The value of the hidden input `name` in a page, HTML entities undone.
pub(crate) fn hidden(html: &str, name: &str) -> Option<String> {
    let marker = format!("name=\"{name}\" value=\"");
    let i = html.find(&marker)? + marker.len();
    let j = html[i..].find('"')? + i;
    Some(
        html[i..j]
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("&#x27;", "'")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&"),
    )
}

/// Alice's password, from the banner `credbroker quickstart` printed when
/// it made her account (its standard error).
pub(crate) fn alice_password(banner: &str) -> Option<String> {
    banner
        .lines()
        .find(|l| l.trim_start().starts_with("alice ") && l.contains("password"))
        .and_then(|l| l.split_whitespace().skip_while(|w| *w != "password").nth(1))
        .map(str::to_string)
}

/// Alice opens her connect `link`, signs in, presses Connect and allows at
/// the demo service: the pages' real forms, over HTTP, as a browser posts
/// them (cookies kept, redirects followed).
pub(crate) async fn connect_over_http(issuer: &str, demo: &str, link: &str, password: &str) {
    let c = reqwest::Client::builder()
        .cookie_store(true)
        .no_proxy()
        .build()
        .unwrap();
    let page = c.get(link).send().await.unwrap();
    let return_to = page
        .url()
        .query_pairs()
        .find(|(k, _)| k == "return_to")
        .map(|(_, v)| v.into_owned())
        .expect("the link asks to sign in first");
    let html = page.text().await.unwrap();
    let csrf = hidden(&html, "csrf").expect("the sign-in form has a CSRF token");
    let page = c
        .post(format!("{issuer}/signin"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("return_to", return_to.as_str()),
            ("username", "alice"),
            ("password", password),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(page.url().as_str(), link, "signed in, back on the link");
    let html = page.text().await.unwrap();
    let csrf = hidden(&html, "csrf").expect("the connect form has a CSRF token");
    let action = link.strip_prefix(issuer).unwrap();
    let page = c
        .post(format!("{issuer}{action}"))
        .form(&[("csrf", csrf.as_str()), ("action", "connect")])
        .send()
        .await
        .unwrap();
    assert!(
        page.url()
            .as_str()
            .starts_with(&format!("{demo}/authorize?")),
        "Connect leads to the demo service, not {}",
        page.url()
    );
    let html = page.text().await.unwrap();
    let mut form: Vec<(String, String)> = [
        "response_type",
        "code_challenge_method",
        "client_id",
        "redirect_uri",
        "state",
        "code_challenge",
        "scope",
    ]
    .iter()
    .map(|k| (k.to_string(), hidden(&html, k).unwrap_or_default()))
    .collect();
    form.push(("account".into(), "alice.demo".into()));
    form.push(("decision".into(), "allow".into()));
    let done = c
        .post(format!("{demo}/authorize"))
        .form(&form)
        .send()
        .await
        .unwrap();
    assert!(
        done.url()
            .as_str()
            .starts_with(&format!("{issuer}/done/connected/")),
        "the connect flow ends on the done page: {}",
        done.url()
    );
}
