use super::*;
use crate::infra::store::SledStore;

/// The person of these tests (shared with `app::backend`'s tests).
pub(crate) fn alice() -> Person {
    Person {
        iss: "https://idp.example".into(),
        sub: "alice".into(),
    }
}

/// A link store on a fresh sled store.
pub(crate) fn env() -> (tempfile::TempDir, Arc<dyn Store>, Links) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SledStore::open(&dir.path().join("data")).unwrap());
    let key = Links::derive_key(&SecretBytes::new(vec![7; 32]));
    let links = Links::new(store.clone(), &key, "https://broker.example/");
    (dir, store, links)
}

/// A link request of `kind` for `p`.
pub(crate) fn req<'a>(p: &'a Person, kind: LinkKind, scopes: &'a [String]) -> LinkRequest<'a> {
    LinkRequest {
        person: p,
        agent: "repo-helper",
        service: "github",
        kind,
        scopes,
        policy_hash: "ph",
    }
}

#[test]
fn same_link_while_open_then_replaced_on_kind_change() {
    let (_d, _s, links) = env();
    let p = alice();
    let repo = vec!["repo".to_string()];
    let a = links
        .open_link(&req(&p, LinkKind::Connect, &repo), 1000)
        .unwrap();
    assert_eq!(a.code.expose().len(), 43);
    assert_eq!(
        links.uri(&a.code),
        format!("https://broker.example/connect/{}", a.code.expose())
    );
    let b = links
        .open_link(&req(&p, LinkKind::Connect, &repo), 1500)
        .unwrap();
    assert_eq!(a.link.id, b.link.id, "asking again returns the same link");
    assert!(a.fresh && !b.fresh, "only the first ask makes the link");
    assert_eq!(a.code.expose(), b.code.expose());
    assert_eq!(
        b.link.expires,
        1000 + LINK_TTL,
        "asking again does not extend it"
    );
    assert_eq!(
        links.resolve(a.code.expose(), 1600).unwrap().unwrap().kind,
        LinkKind::Connect
    );

    // Kind change: a new link; the old code stops resolving.
    let c = links
        .open_link(&req(&p, LinkKind::Allow, &repo), 1700)
        .unwrap();
    assert_ne!(c.link.id, a.link.id);
    assert!(c.fresh);
    assert_eq!(links.resolve(a.code.expose(), 1701).unwrap(), None);
    assert_eq!(
        links.resolve(c.code.expose(), 1701).unwrap().unwrap().id,
        c.link.id
    );

    // More scope of the same kind: a new link asking for the union.
    let more = vec!["read:org".to_string()];
    let d = links
        .open_link(&req(&p, LinkKind::Allow, &more), 1800)
        .unwrap();
    assert_ne!(d.link.id, c.link.id);
    assert_eq!(d.link.scopes, ["read:org", "repo"]);
    assert_eq!(links.resolve(c.code.expose(), 1801).unwrap(), None);
    // Fewer scope: the same link.
    let e = links
        .open_link(&req(&p, LinkKind::Allow, &repo), 1900)
        .unwrap();
    assert_eq!(e.link.id, d.link.id);
    assert!(d.fresh && !e.fresh);
}

#[test]
fn expired_link_does_not_resolve_is_replaced_and_swept() {
    let (_d, store, links) = env();
    let p = alice();
    let a = links
        .open_link(&req(&p, LinkKind::Connect, &[]), 1000)
        .unwrap();
    let end = 1000 + LINK_TTL;
    assert!(links.resolve(a.code.expose(), end - 1).unwrap().is_some());
    assert_eq!(links.resolve(a.code.expose(), end).unwrap(), None);
    let b = links
        .open_link(&req(&p, LinkKind::Connect, &[]), end)
        .unwrap();
    assert_ne!(
        a.link.id, b.link.id,
        "an expired link is not handed out again"
    );
    // Another person's stale link is swept; the open one stays.
    let bob = Person {
        iss: p.iss.clone(),
        sub: "bob".into(),
    };
    links
        .open_link(&req(&bob, LinkKind::Connect, &[]), 1000)
        .unwrap();
    assert_eq!(links.sweep(end + 1).unwrap(), 1);
    assert_eq!(store.scan_prefix(Tree::Links, b"").unwrap().len(), 1);
    assert_eq!(store.scan_prefix(Tree::LinkIndex, b"").unwrap().len(), 1);
    assert!(links.resolve(b.code.expose(), end + 1).unwrap().is_some());
}

#[test]
fn close_makes_the_code_stop_resolving() {
    let (_d, _s, links) = env();
    let p = alice();
    let a = links
        .open_link(&req(&p, LinkKind::Connect, &[]), 1000)
        .unwrap();
    links.close(&a.link).unwrap();
    assert_eq!(links.resolve(a.code.expose(), 1001).unwrap(), None);
    let b = links
        .open_link(&req(&p, LinkKind::Connect, &[]), 1002)
        .unwrap();
    assert_ne!(a.link.id, b.link.id);
    assert!(links.resolve(b.code.expose(), 1003).unwrap().is_some());
}

#[test]
fn guessed_and_malformed_codes_do_not_resolve() {
    let (_d, _s, links) = env();
    let p = alice();
    let a = links
        .open_link(&req(&p, LinkKind::Connect, &[]), 1000)
        .unwrap();
    let mut near = a.code.expose().clone().into_bytes();
    near[5] = if near[5] == b'A' { b'B' } else { b'A' };
    let near = String::from_utf8(near).unwrap();
    for bad in [
        near.as_str(),
        "",
        "x",
        &"A".repeat(43),
        &format!("{}=", a.code.expose()),
        &a.code.expose()[..42],
        &a.link.id,
    ] {
        assert_eq!(links.resolve(bad, 1001).unwrap(), None, "{bad:?}");
    }
    // Codes from another link key do not resolve either.
    let other = Links::new(
        links.store.clone(),
        &SecretBytes::new(vec![9; 32]),
        "https://b",
    );
    assert_eq!(other.resolve(a.code.expose(), 1001).unwrap(), None);
    // Positive control.
    assert!(links.resolve(a.code.expose(), 1001).unwrap().is_some());
}

#[test]
fn concurrent_requests_make_one_link() {
    let (_d, store, links) = env();
    let links = Arc::new(links);
    let ids: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..16)
            .map(|_| {
                let links = links.clone();
                s.spawn(move || {
                    links
                        .open_link(&req(&alice(), LinkKind::Connect, &[]), 1000)
                        .unwrap()
                        .link
                        .id
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    assert_eq!(store.scan_prefix(Tree::Links, b"").unwrap().len(), 1);
}

#[test]
fn codes_are_never_stored_in_clear() {
    let (dir, store, links) = env();
    let mut codes = Vec::new();
    for sub in ["alice", "bob", "carol"] {
        let p = Person {
            iss: "https://idp.example".into(),
            sub: sub.into(),
        };
        let l = links
            .open_link(&req(&p, LinkKind::Connect, &[]), 1000)
            .unwrap();
        codes.push(l.code.expose().clone());
    }
    drop(links);
    drop(store);
    let mut all = Vec::new();
    for e in std::fs::read_dir(dir.path().join("data/db"))
        .unwrap()
        .flatten()
    {
        if e.path().is_file() {
            all.extend(std::fs::read(e.path()).unwrap());
        }
    }
    assert!(!all.is_empty());
    for c in &codes {
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(c)
            .unwrap();
        assert!(
            !contains(&all, c.as_bytes()),
            "a code is in the store file in base64url"
        );
        assert!(
            !contains(&all, &raw),
            "a code is in the store file as raw bytes"
        );
    }
    // Positive control: the hash the store is keyed by is there, so the
    // scan would see stored bytes.
    let h = sha256(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&codes[0])
            .unwrap(),
    );
    assert!(contains(&all, &h));
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// L2: the Debug forms of link-carrying types never show a code.
#[test]
fn debug_output_never_shows_a_link_code() {
    let (_d, _s, links) = env();
    let p = alice();
    let l = links
        .open_link(&req(&p, LinkKind::Connect, &[]), 1000)
        .unwrap();
    let code = l.code.expose().clone();
    assert!(!format!("{l:?}").contains(&code));
    let refusal = crate::derive::exchange::DeriveError::LinkRequired(Box::new(
        crate::derive::exchange::LinkRefusal {
            kind: LinkKind::Connect,
            uri: SecretString::new(links.uri(&l.code)),
            id: l.link.id.clone(),
            expires_in: 1800,
            message: "m".into(),
        },
    ));
    let dbg = format!("{refusal:?} {refusal}");
    assert!(!dbg.contains(&code), "{dbg}");
    // Positive control: the id (public) is shown.
    assert!(dbg.contains(&l.link.id));
}
