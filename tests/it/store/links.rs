//! One open link per (person, agent, service) across replicas: link stores
//! of two instances on one PostgreSQL database, refusing at the same moment
//! from several threads each, hand out one link, and a link made on one
//! resolves on the other.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use credbroker::internals::connect::{LinkKind, LinkRequest, Links};
use credbroker::internals::secret::SecretBytes;
use credbroker::internals::store::{PgStore, Store};
use credbroker::internals::subject::Person;

use crate::support::postgres::{cluster_or_not_shown, database};

#[test]
fn two_replicas_refusing_at_once_hand_out_the_same_link() {
    let Some(cluster) = cluster_or_not_shown("one open link across replicas") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "links");
    let mut settings = db.settings();
    settings.pool_size = 8;
    // Not a timeout test (faults.rs is): room for a loaded machine.
    settings.statement_timeout = std::time::Duration::from_secs(15);
    settings.connect_timeout = std::time::Duration::from_secs(15);
    let key = Links::derive_key(&SecretBytes::new(vec![7; 32]));
    let replicas: Vec<Links> = (0..2)
        .map(|_| {
            let store: Arc<dyn Store> = Arc::new(PgStore::open(&settings).unwrap());
            Links::new(store, &key, "https://broker.example/")
        })
        .collect();
    let alice = Person {
        iss: "https://idp.example".into(),
        sub: "alice".into(),
    };
    let scopes = vec!["repo".to_string()];
    let now = crate::support::now();
    for round in 0..5 {
        let service = format!("github-{round}");
        let req = LinkRequest {
            person: &alice,
            agent: "repo-helper",
            service: &service,
            kind: LinkKind::Connect,
            scopes: &scopes,
            policy_hash: "ph",
        };
        let ids: Vec<(String, bool)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let links = &replicas[i % 2];
                    let req = &req;
                    s.spawn(move || {
                        let l = links.open_link(req, now).unwrap();
                        (l.link.id, l.fresh)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let first = &ids[0].0;
        assert!(
            ids.iter().all(|(id, _)| id == first),
            "round {round}: several links: {ids:?}"
        );
        assert_eq!(
            ids.iter().filter(|(_, fresh)| *fresh).count(),
            1,
            "round {round}: exactly one call made the link"
        );
        // Made on one replica, it resolves on both.
        for links in &replicas {
            assert_eq!(
                links.get(first, now).unwrap().map(|l| l.id).as_deref(),
                Some(first.as_str())
            );
        }
    }
}
