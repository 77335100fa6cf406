// reason: test code, where a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use serde_json::json;

use super::*;

/// A store in a temp dir, and the approval key every instance on it uses.
fn shared() -> (tempfile::TempDir, Arc<dyn Store>, SecretBytes) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(crate::infra::store::SledStore::open(&dir.path().join("data")).unwrap());
    let key = Approvals::derive_key(&SecretBytes::new(vec![7u8; 32]));
    (dir, store, key)
}

/// An instance of the approvals on `store`.
fn instance(store: Arc<dyn Store>, key: &SecretBytes) -> Approvals {
    Approvals::new(store, key, "http://127.0.0.1:1").unwrap()
}

fn env() -> (tempfile::TempDir, Approvals) {
    let (dir, store, key) = shared();
    (dir, instance(store, &key))
}

fn alice() -> Person {
    Person {
        iss: "https://idp.example".into(),
        sub: "alice".into(),
    }
}

fn call<'a>(
    p: &'a Person,
    details: Option<&'a Value>,
    jkt: &'a str,
    scopes: &'a [String],
) -> Call<'a> {
    Call {
        person: p,
        agent: "mail-agent",
        step: "send_reply",
        tool: "mail.send",
        resource: "https://mail.example/api",
        scopes,
        jkt,
        details,
        request: None,
    }
}

fn pending(l: Lookup) -> Issued {
    match l {
        Lookup::Pending(i) => *i,
        other => panic!("expected a pending approval, got {other:?}"),
    }
}

#[test]
fn canonical_form_matches_rfc_8785_for_the_admitted_values() {
    // RFC 8785 section 3.2.2's string and literals (floats are not admitted
    // by the policy), with keys out of order; and integers at the limits.
    let v: Value = serde_json::from_str(
        r#"{"string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/", "literals": [null, true, false]}"#,
    )
    .unwrap();
    assert_eq!(
        String::from_utf8(canonical_details(Some(&v))).unwrap(),
        "{\"literals\":[null,true,false],\"string\":\"€$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}"
    );
    let v = json!([{"type": "t", "b": 9007199254740991i64, "a": -9007199254740991i64, "c": ["\u{2028}\u{7f}"]}]);
    assert_eq!(
        String::from_utf8(canonical_details(Some(&v))).unwrap(),
        "[{\"a\":-9007199254740991,\"b\":9007199254740991,\"c\":[\"\u{2028}\u{7f}\"],\"type\":\"t\"}]"
    );
    // Array order is significant; no details is `[]`.
    let x = json!([{"type": "t", "to": ["a", "b"]}]);
    let y = json!([{"type": "t", "to": ["b", "a"]}]);
    assert_ne!(details_sha256(Some(&x)), details_sha256(Some(&y)));
    assert_eq!(canonical_details(None), b"[]");
}

#[test]
fn same_call_same_link_other_call_other_link() {
    let (_d, a) = env();
    let p = alice();
    let scopes = vec!["mail.send".to_string()];
    let d1 = json!([{"type": "mail", "to": ["bob@example.com"]}]);
    let d2 = json!([{"type": "mail", "to": ["eve@example.com"]}]);
    let first = pending(
        a.lookup(
            &call(&p, Some(&d1), "k1", &scopes),
            Mode::EachCall,
            vec![],
            "h",
            1000,
        )
        .unwrap(),
    );
    assert!(first.fresh);
    let again = pending(
        a.lookup(
            &call(&p, Some(&d1), "k1", &scopes),
            Mode::EachCall,
            vec![],
            "h",
            1001,
        )
        .unwrap(),
    );
    assert!(!again.fresh);
    assert_eq!(again.approval.id, first.approval.id);
    assert_eq!(again.code.expose(), first.code.expose());
    let other = pending(
        a.lookup(
            &call(&p, Some(&d2), "k1", &scopes),
            Mode::EachCall,
            vec![],
            "h",
            1002,
        )
        .unwrap(),
    );
    assert_ne!(other.approval.id, first.approval.id);
    let other_key = pending(
        a.lookup(
            &call(&p, Some(&d1), "k2", &scopes),
            Mode::EachCall,
            vec![],
            "h",
            1003,
        )
        .unwrap(),
    );
    assert_ne!(other_key.approval.id, first.approval.id);
    // The code resolves to its own record only while pending.
    assert_eq!(
        a.resolve(first.code.expose(), 1004).unwrap().unwrap().id,
        first.approval.id
    );
    assert!(a
        .resolve(first.code.expose(), 1000 + PENDING_TTL)
        .unwrap()
        .is_none());
}

#[test]
fn each_call_grant_is_redeemed_once() {
    let (_d, a) = env();
    let p = alice();
    let scopes = vec![];
    let c = call(&p, None, "k1", &scopes);
    let i = pending(a.lookup(&c, Mode::EachCall, vec![], "h", 1000).unwrap());
    let granted = a.answer(&i.approval.id, true, 1010).unwrap().unwrap();
    assert_eq!(granted.expires, 1010 + REDEEM_TTL);
    // A second answer changes nothing; the code no longer resolves.
    assert!(a.answer(&i.approval.id, false, 1011).unwrap().is_none());
    assert!(a.resolve(i.code.expose(), 1011).unwrap().is_none());
    assert!(
        matches!(a.lookup(&c, Mode::EachCall, vec![], "h", 1012).unwrap(), Lookup::Granted(g) if g.id == i.approval.id)
    );
    // Redeemed: the next derive of the same call needs a new approval.
    let next = pending(a.lookup(&c, Mode::EachCall, vec![], "h", 1013).unwrap());
    assert!(next.fresh);
    assert_ne!(next.approval.id, i.approval.id);
}

#[test]
fn per_step_grant_covers_until_its_ttl_and_decline_holds() {
    let (_d, a) = env();
    let p = alice();
    let scopes = vec![];
    let c = call(&p, None, "k1", &scopes);
    let mode = Mode::PerStep {
        ttl: 120,
        unit: TtlUnit::Seconds,
    };
    let i = pending(a.lookup(&c, mode, vec![], "h", 1000).unwrap());
    a.answer(&i.approval.id, true, 1000).unwrap().unwrap();
    for t in [1001, 1050, 1119] {
        assert!(matches!(
            a.lookup(&c, mode, vec![], "h", t).unwrap(),
            Lookup::Granted(_)
        ));
    }
    assert!(pending(a.lookup(&c, mode, vec![], "h", 1120).unwrap()).fresh);
    // Another step is another call.
    let mut other = c;
    other.step = "triage";
    assert!(pending(a.lookup(&other, mode, vec![], "h", 1121).unwrap()).fresh);

    let d = json!([{"type": "mail", "to": ["eve@example.com"]}]);
    let c = call(&p, Some(&d), "k1", &scopes);
    let i = pending(a.lookup(&c, Mode::EachCall, vec![], "h", 2000).unwrap());
    a.answer(&i.approval.id, false, 2001).unwrap().unwrap();
    assert!(matches!(
        a.lookup(&c, Mode::EachCall, vec![], "h", 2002).unwrap(),
        Lookup::Declined(_)
    ));
    assert!(a.resolve(i.code.expose(), 2002).unwrap().is_none());
}

#[test]
fn open_approvals_are_capped_per_person_and_agent() {
    let (_d, a) = env();
    let p = alice();
    let scopes = vec![];
    let keys: Vec<String> = (0..=MAX_OPEN).map(|i| format!("k{i}")).collect();
    for k in &keys[..MAX_OPEN] {
        pending(
            a.lookup(
                &call(&p, None, k, &scopes),
                Mode::EachCall,
                vec![],
                "h",
                1000,
            )
            .unwrap(),
        );
    }
    assert!(matches!(
        a.lookup(
            &call(&p, None, &keys[MAX_OPEN], &scopes),
            Mode::EachCall,
            vec![],
            "h",
            1001
        ),
        Err(ApproveError::TooManyOpen)
    ));
    // Another person is not held back by Alice's.
    let bob = Person {
        iss: p.iss.clone(),
        sub: "bob".into(),
    };
    assert!(
        pending(
            a.lookup(
                &call(&bob, None, "k0", &scopes),
                Mode::EachCall,
                vec![],
                "h",
                1001
            )
            .unwrap()
        )
        .fresh
    );
    // Once hers expire, Alice can be asked again.
    assert!(
        pending(
            a.lookup(
                &call(&p, None, &keys[MAX_OPEN], &scopes),
                Mode::EachCall,
                vec![],
                "h",
                1000 + PENDING_TTL
            )
            .unwrap()
        )
        .fresh
    );
    assert!(a.sweep(1000 + PENDING_TTL).unwrap() >= MAX_OPEN);
}

#[test]
fn a_sweep_leaves_an_approval_answered_on_another_replica_after_its_read() {
    // Two replicas on one store, A's clock 30 s ahead of B's. A sweeps at
    // a time when, by its clock, Alice's pending approval has expired; B
    // is still showing it, and she grants it there between A's read of the
    // record and A's first write (the hook runs B's answer then).
    let (_dir, inner, key) = shared();
    let b = Arc::new(instance(inner.clone(), &key));
    let p = alice();
    let scopes = vec![];
    let c = call(&p, None, "k1", &scopes);
    let i = pending(b.lookup(&c, Mode::EachCall, vec![], "h", 1000).unwrap());
    let expiry = i.approval.expires;
    let (now_a, now_b) = (expiry + 10, expiry - 20);

    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answered = Arc::new(std::sync::Mutex::new(None));
    let hooked = crate::infra::store::Hooked::new(inner.clone(), {
        let (armed, answered, b) = (armed.clone(), answered.clone(), b.clone());
        let id = i.approval.id.clone();
        move |_| {
            if armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
                *answered.lock().unwrap() = Some(b.answer(&id, true, now_b).unwrap());
            }
            Ok(())
        }
    });
    let a = instance(Arc::new(hooked), &key);
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let swept = a.sweep(now_a).unwrap();

    let granted = answered.lock().unwrap().take().flatten();
    assert!(granted.is_some(), "B's answer ran and was taken");
    assert_eq!(swept, 0, "the record changed after the sweep read it");
    // B's grant stands: the call is granted there, not asked again.
    assert!(
        matches!(b.lookup(&c, Mode::EachCall, vec![], "h", now_b + 1).unwrap(), Lookup::Granted(g) if g.id == i.approval.id),
        "the grant was swept away"
    );
    // Positive control: once the grant has ended by A's clock too, the next
    // sweep removes it, and the call is asked again.
    let ended = now_b + REDEEM_TTL + 1;
    assert_eq!(a.sweep(ended).unwrap(), 1);
    assert!(pending(b.lookup(&c, Mode::EachCall, vec![], "h", ended).unwrap()).fresh);
}

#[test]
fn records_are_sealed_and_one_written_without_the_key_is_never_taken() {
    let (_dir, store, key) = shared();
    let a = instance(store.clone(), &key);
    let p = alice();
    let scopes = vec![];
    let d = json!([{"type": "mail", "to": ["eve@example.com"]}]);
    let c = call(&p, Some(&d), "k1", &scopes);
    let i = pending(a.lookup(&c, Mode::EachCall, vec![], "h", 1000).unwrap());

    // Neither the call's details nor the person are in the store in clear.
    let records = store.scan_prefix(Tree::Approvals, b"").unwrap();
    assert_eq!(records.len(), 1);
    let (at, stored) = &records[0];
    for clear in ["eve@example.com", "alice", "mail.send", &i.approval.id] {
        assert!(
            !stored.windows(clear.len()).any(|w| w == clear.as_bytes()),
            "{clear} is in the stored record"
        );
    }

    // Someone who can write the store but holds no key writes the record
    // as granted, in clear (as records were before they were sealed): it is
    // not taken, neither as a grant nor as a pending approval.
    let mut forged = i.approval.clone();
    forged.state = State::Granted;
    forged.expires = 1000 + REDEEM_TTL;
    store
        .put(Tree::Approvals, at, &serde_json::to_vec(&forged).unwrap())
        .unwrap();
    assert!(
        matches!(
            a.lookup(&c, Mode::EachCall, vec![], "h", 1001),
            Err(ApproveError::Corrupt)
        ),
        "a record written without the key was read"
    );
    assert!(matches!(
        a.resolve(i.code.expose(), 1001),
        Err(ApproveError::Corrupt)
    ));
    // ... and the sweep removes it.
    assert_eq!(a.sweep(1001).unwrap(), 1);

    // A sealed record moved under another approval's key does not open
    // there either.
    let other = pending(
        a.lookup(
            &call(&p, None, "k2", &scopes),
            Mode::EachCall,
            vec![],
            "h",
            1002,
        )
        .unwrap(),
    );
    let again = pending(a.lookup(&c, Mode::EachCall, vec![], "h", 1002).unwrap());
    let at_other = sha256(&a.code_bytes(&other.approval.id));
    let at_again = sha256(&a.code_bytes(&again.approval.id));
    let sealed = store.get(Tree::Approvals, &at_again).unwrap().unwrap();
    store.put(Tree::Approvals, &at_other, &sealed).unwrap();
    assert!(matches!(
        a.answer(&other.approval.id, true, 1003),
        Err(ApproveError::Corrupt)
    ));

    // Positive control: the untouched approval is answered and granted.
    a.answer(&again.approval.id, true, 1003).unwrap().unwrap();
    assert!(
        matches!(a.lookup(&c, Mode::EachCall, vec![], "h", 1004).unwrap(), Lookup::Granted(g) if g.id == again.approval.id)
    );
}
