//! The crate's internals, for the integration tests, the fuzz targets, the
//! examples, the benches and the `credbroker` binary: the one door into
//! what is otherwise `pub(crate)`. Each module here re-exports, under the
//! module's short name, the items of that crate module the tests, fuzz
//! targets, examples and benches use (and no others), so their paths
//! (`credbroker::internals::store::Tree`) do not follow the folders of
//! `src/`. A new use adds its item here.
//!
//! Not a stable API: hidden from the docs and free to change. Embedders use
//! [`crate::verify`] and [`crate::client`].

/// `crate::edge::api`: the orchestrator socket's parsing and error mapping.
pub mod api {
    pub use crate::edge::api::{
        error_response, parse_form, parse_json, ACCESS_TOKEN_TYPE, JWT_TOKEN_TYPE, TOKEN_EXCHANGE,
    };
}

/// `crate::app`: the composition root.
pub mod app {
    pub use crate::app::{build, Instance};
    /// `crate::app::reload`: hot reload of the policy.
    pub mod reload {
        pub use crate::app::reload::{Refusal, SETTLE};
    }
}

/// `crate::cli`: the command line (the binary's `main`).
pub mod cli {
    pub use crate::cli::{
        demo_policy, demo_proxy, dev_subject_token, load_pem_key, main, pem_pkcs8,
        quickstart_files, QUICKSTART_POLICY,
    };
}

/// `crate::base::clock`: the injected clock.
pub mod clock {
    pub use crate::base::clock::{Clock, ManualClock, SharedClock, SystemClock};
    pub use crate::infra::skew::{Skew, Standing, TooFar};
}

/// `crate::infra::config`: the instance config.
pub mod config {
    pub use crate::infra::config::{
        accepted_keys, max_derive_rate, read_secret_file, write_secret_file, AcceptedKey,
        AccountLookup, ClientAuth, Config, ConfigError, Endpoints, IntrospectionConfig,
        IssuerConfig, JwksSource, ProviderConfig, SignIn, DEFAULT_REPLAY_CACHE_BYTES,
        RESERVED_KEYS,
    };
}

/// `crate::accounts::connect`: connect-link records.
pub mod connect {
    pub use crate::accounts::connect::{
        disconnect_account, LinkKind, LinkRequest, Links, LINK_TTL,
    };
}

/// `crate::base::dpop`: DPoP proofs, replay cache, nonces.
pub mod dpop {
    pub use crate::base::dpop::{
        make_proof, DpopError, Expect, Nonces, ReplayCache, Validator, MAX_JTI_LIFETIME,
        REPLAY_SLOT_BYTES,
    };
}

/// `crate::infra::events`: audit events.
pub mod events {
    pub use crate::infra::events::{Event, Kind, Opaque, ProxyCall, ReservedFields};
}

/// `crate::derive::exchange`: the derive pipeline.
pub mod exchange {
    pub use crate::derive::exchange::{
        ApprovalRefusal, DeriveError, DeriveRequest, Endpoint, IntendedRequest, InternalError,
        Issued, LinkRefusal, SubjectTokenType,
    };
}

/// `crate::infra::failpoint`: crash points for fault tests.
pub mod failpoint {
    pub use crate::infra::failpoint::ENV;
}

/// `crate::fuzzing`: the fuzz targets' entry points.
pub mod fuzzing {
    pub use crate::fuzzing::{
        config, dpop, dpop_signed, id_token, jws, nonce, page_cookie, page_form, policy,
        provider_metadata, request_form, request_json, run, sealed, sealer, token_answer,
        ACCESS_TOKEN, HTU, ID_CLIENT, ID_ISSUER, ID_NONCE, NOW, PROVIDER_ISSUER, SEAL_AAD,
        SEAL_KEYS, TARGETS,
    };
}

/// `crate::base::jose`: JWS, JWK and base64url.
pub mod jose {
    pub use crate::base::jose::{
        b64d, b64e, parse, sha256_b64, sha256_hex, Alg, Es256Key, Jwk, JwkSet,
    };
}

/// `crate::infra::metrics`: Prometheus metrics.
pub mod metrics {
    pub use crate::infra::metrics::{MetricInfo, Metrics, ReservedMetric, RESERVED};
}

/// `crate::derive::mint`: minted tokens.
pub mod mint {
    pub use crate::derive::mint::{MintError, Minted};
}

/// `crate::base::oauth`: the one OAuth client.
pub mod oauth {
    pub use crate::base::oauth::check_callback_iss;
}

/// `crate::edge::pages`: the browser pages.
pub mod pages {
    pub use crate::edge::pages::{Options, PageLimits, Pages};
    /// `crate::edge::pages::flows`: pending sign-in and provider flows.
    pub mod flows {
        pub use crate::edge::pages::flows::{start, sweep, take, Flow};
    }
    /// `crate::edge::pages::limits`: the pages' rate limits.
    pub mod limits {
        pub use crate::edge::pages::limits::SIGNIN_FAILED_PER_MINUTE;
    }
    /// `crate::edge::pages::links`: the pages' connected-services traits.
    pub mod links {
        pub use crate::edge::pages::links::{
            AccountVault, AccountView, AllowanceView, AuthorizationRequest, BackendError,
            BoxFuture, ConnectedServices, Disconnected, Link, LinkKind, LinkRecords, ProviderFlow,
            ProviderGrant, ProviderInfo,
        };
    }
    /// `crate::edge::pages::session`: the pages' sessions.
    pub mod session {
        pub use crate::edge::pages::session::{Lifetimes, Record, Session, Sessions};
    }
    /// `crate::accounts::users`: the local accounts the pages sign in with
    /// (the path is the one from before they moved out of the pages).
    pub mod users {
        pub use crate::accounts::users::{add, verify, Verdict, LOCK_AFTER, LOCK_FOR};
    }
}

/// `crate::derive::policy`: the policy file.
pub mod policy {
    pub use crate::derive::policy::{lint, DenyReason, Policy, RouteDenial, RESERVED_KEYS};
}

/// `crate::infra::reserved` and `crate::edge::reserved`: names reserved for
/// features not built yet (config and policy keys, refusals).
pub mod reserved {
    pub use crate::edge::reserved::{ReservedRefusal, RESERVED_REFUSALS};
    pub use crate::infra::reserved::ReservedKey;
}

/// `crate::infra::seal`: encryption at rest.
pub mod seal {
    pub use crate::infra::seal::Sealer;
}

/// `crate::base::secret`: secret types.
pub mod secret {
    pub use crate::base::secret::{SecretBytes, SecretString};
}

/// `crate::app::server`: the listeners and accept loops.
pub mod server {
    pub use crate::app::server::{run, Listeners};
}

/// `crate::infra::store`: storage.
pub mod store {
    /// `crate::infra::store::contract`: the backends' shared contract tests.
    pub mod contract {
        pub use crate::infra::store::contract::{run_all, run_concurrent};
    }
    pub use crate::infra::store::{
        tuple_key, Backend, Hooked, Migrate, PgSettings, PgStore, SledStore, Store, StoreError,
        Tree,
    };
}

/// `crate::accounts::subject`: subject tokens.
pub mod subject {
    pub use crate::accounts::subject::{Person, SubjectError, Validator};
}

/// `crate::base::unix`: Unix helpers.
pub mod unix {
    pub use crate::base::unix::{bind, current_uid, Created, ReadOnlyStream};
}

/// `crate::accounts::upstream`: the third-party providers.
pub mod upstream {
    pub use crate::accounts::upstream::{
        pkce_challenge, AccountInfo, Provider, Revocation, TokenSet, UpstreamError,
    };
}

/// `crate::derive::upstreams`: the organisation's authorization servers.
pub mod upstreams {
    pub use crate::derive::upstreams::UpstreamError;
}

/// `crate::accounts::vault`: connected accounts and provider tokens.
pub mod vault {
    pub use crate::accounts::vault::{
        lease_lifetime, AccountStatus, TokenOutcome, TokenRequest, Vault, VaultError,
    };
}
