//! One cached JWKS per issuer (pinned or fetched): the embedder crate's
//! [`credbroker_verify::keyset`], with the broker's own size cap and HTTP
//! client builder.

pub(crate) use credbroker_verify::keyset::{Refetch, RemoteKeySet};

/// The size cap the broker itself uses for an IdP's JWKS document.
pub(crate) const MAX_ISSUER_JWKS: usize = 256 * 1024;

/// The HTTP client for key and metadata documents, built on the broker's
/// outbound builder ([`crate::base::http::outbound_client`]) with the key
/// set's timeouts and no redirects.
pub(crate) fn http_client() -> reqwest::Client {
    credbroker_verify::keyset::http_client_from(crate::base::http::outbound_client())
}
