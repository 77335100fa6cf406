//! Housekeeping run by every replica at once: three instances' sweeps of
//! expired page sessions, sign-in flows and connect links on one PostgreSQL
//! database, all
//! at the same moment and while new sessions keep arriving, never fail and
//! never delete anything live.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use credbroker::internals::connect::{LinkKind, LinkRequest, Links, LINK_TTL};
use credbroker::internals::pages::flows::{self, Flow};
use credbroker::internals::pages::session::{Lifetimes, Record, Session, Sessions};
use credbroker::internals::seal::Sealer;
use credbroker::internals::secret::SecretBytes;
use credbroker::internals::store::{PgStore, Store, Tree};
use credbroker::internals::subject::Person;

use crate::support::postgres::{cluster_or_not_shown, database};

const REPLICAS: usize = 3;
const EACH: usize = 20;

fn anonymous(created: i64) -> Record {
    Record {
        iss: None,
        sub: None,
        display: None,
        method: None,
        auth_time: None,
        created,
        last_seen: created,
    }
}

fn sign_in_flow() -> Flow {
    Flow::SignIn {
        issuer: "https://idp.example".into(),
        nonce: "n".into(),
        verifier: "v".into(),
        return_to: "/account".into(),
        reauth: false,
        max_age: false,
    }
}

fn link_of(links: &Links, alice: &Person, service: &str, now: i64) -> (String, bool) {
    let scopes = vec!["repo".to_string()];
    let l = links
        .open_link(
            &LinkRequest {
                person: alice,
                agent: "repo-helper",
                service,
                kind: LinkKind::Connect,
                scopes: &scopes,
                policy_hash: "ph",
            },
            now,
        )
        .unwrap();
    (l.link.id, l.fresh)
}

#[test]
fn housekeeping_on_every_replica_at_once_deletes_only_what_expired() {
    let Some(cluster) = cluster_or_not_shown("housekeeping on several replicas") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "housekeeping");
    let settings = db.settings();
    let stores: Vec<Arc<dyn Store>> = (0..REPLICAS)
        .map(|_| Arc::new(PgStore::open(&settings).unwrap()) as Arc<dyn Store>)
        .collect();
    let key = Links::derive_key(&SecretBytes::new(vec![7; 32]));
    let links: Vec<Links> = stores
        .iter()
        .map(|s| Links::new(s.clone(), &key, "https://broker.example/"))
        .collect();
    let sessions = Sessions::new(
        Lifetimes {
            idle: 3600,
            absolute: 86_400,
            anonymous: 600,
        },
        &Sessions::derive_key(&SecretBytes::new(vec![7; 32])),
    );
    let alice = Person {
        iss: "https://idp.example".into(),
        sub: "alice".into(),
    };
    let now = crate::support::now();

    // Half of each kind expired (made long enough ago), half live.
    let old = now - 2 * LINK_TTL;
    let expired_sessions: Vec<Session> = (0..EACH)
        .map(|_| sessions.create(stores[0].as_ref(), anonymous(old)).unwrap())
        .collect();
    let live_sessions: Vec<Session> = (0..EACH)
        .map(|_| sessions.create(stores[0].as_ref(), anonymous(now)).unwrap())
        .collect();
    let expired_links: Vec<String> = (0..EACH)
        .map(|i| link_of(&links[0], &alice, &format!("old-{i}"), old).0)
        .collect();
    let live_links: Vec<String> = (0..EACH)
        .map(|i| link_of(&links[1], &alice, &format!("live-{i}"), now).0)
        .collect();
    let sealer = Sealer::new(&SecretBytes::new(vec![9; 32]), &[]).unwrap();
    let start_flow =
        |at: i64| flows::start(stores[1].as_ref(), &sealer, "s", sign_in_flow(), at).unwrap();
    let expired_flows: Vec<_> = (0..EACH).map(|_| start_flow(old)).collect();
    let live_flows: Vec<_> = (0..EACH).map(|_| start_flow(now)).collect();
    assert_eq!(
        stores[0].scan_prefix(Tree::Sessions, b"").unwrap().len(),
        2 * EACH
    );

    // Every replica sweeps at once, a few times over, while one of them
    // keeps making new sessions (people arriving during housekeeping).
    let arrivals: Vec<Session> = std::thread::scope(|s| {
        let sweepers: Vec<_> = (0..REPLICAS)
            .map(|i| {
                let (store, links, sessions) = (stores[i].as_ref(), &links[i], &sessions);
                let sealer = &sealer;
                s.spawn(move || {
                    for _ in 0..3 {
                        sessions.sweep(store, now).unwrap();
                        flows::sweep(store, sealer, now).unwrap();
                        links.sweep(now).unwrap();
                    }
                })
            })
            .collect();
        let arriving = s.spawn(|| {
            (0..EACH)
                .map(|_| sessions.create(stores[2].as_ref(), anonymous(now)).unwrap())
                .collect::<Vec<_>>()
        });
        for h in sweepers {
            h.join().unwrap();
        }
        arriving.join().unwrap()
    });

    // Nothing live was deleted, on whichever replica it is read...
    for (i, s) in live_sessions.iter().chain(&arrivals).enumerate() {
        let store = stores[i % REPLICAS].as_ref();
        let id = s.id().expose().to_string();
        assert!(
            sessions.load(store, &[id], now).unwrap().is_some(),
            "live session {i} was swept"
        );
    }
    for (i, id) in live_links.iter().enumerate() {
        assert!(
            links[i % REPLICAS].get(id, now).unwrap().is_some(),
            "live link {i} was swept"
        );
        // ...and the open-link index still names it: asking again hands
        // out the same link instead of a second one.
        let (again, fresh) = link_of(
            &links[(i + 1) % REPLICAS],
            &alice,
            &format!("live-{i}"),
            now,
        );
        assert_eq!((&again, fresh), (id, false), "live link {i} lost its index");
    }
    // ...and everything expired is gone, from the records and the index.
    let left = stores[0].scan_prefix(Tree::Sessions, b"").unwrap().len();
    assert_eq!(
        left,
        2 * EACH,
        "only the live and the arrived sessions remain"
    );
    for tree in [Tree::Links, Tree::LinkIndex] {
        let left = stores[1].scan_prefix(tree, b"").unwrap().len();
        assert_eq!(left, EACH, "{tree:?}: only the live links remain");
    }
    let left = stores[2].scan_prefix(Tree::PageFlows, b"state/").unwrap();
    assert_eq!(left.len(), EACH, "only the live flows remain");
    for (i, state) in live_flows.iter().enumerate() {
        let t = flows::take(stores[i % REPLICAS].as_ref(), &sealer, state.expose(), now).unwrap();
        assert!(t.is_some(), "live flow {i} was swept");
    }
    for state in &expired_flows {
        let t = flows::take(stores[0].as_ref(), &sealer, state.expose(), now).unwrap();
        assert!(t.is_none());
    }
    for s in &expired_sessions {
        let id = s.id().expose().to_string();
        assert!(sessions
            .load(stores[1].as_ref(), &[id], now)
            .unwrap()
            .is_none());
    }
    for (i, id) in expired_links.iter().enumerate() {
        assert!(links[2].get(id, now).unwrap().is_none(), "expired link {i}");
        // A new refusal for that service makes a new link (the expired
        // one's index entry went with it).
        let (fresh_id, fresh) = link_of(&links[0], &alice, &format!("old-{i}"), now);
        assert!(fresh && fresh_id != *id, "expired link {i} still indexed");
    }
}
