//! The crate's internals, for the integration tests, the fuzz targets, the
//! examples, the benches and the `credbroker` binary: the one door into
//! what is otherwise `pub(crate)`. Each module here re-exports the `pub`
//! items of the crate module of the same name.
//!
//! Not a stable API: hidden from the docs and free to change. Embedders use
//! [`crate::verify`] and [`crate::client`].

/// The `api` module's `pub` items.
pub mod api {
    pub use crate::api::*;
}

/// The `app` module's `pub` items.
pub mod app {
    pub use crate::app::*;
}

/// The `approve` module's `pub` items.
pub mod approve {
    pub use crate::approve::*;
}

/// The `cli` module's `pub` items.
pub mod cli {
    pub use crate::cli::*;
}

/// The `clock` module's `pub` items.
pub mod clock {
    pub use crate::clock::*;
}

/// The `config` module's `pub` items.
pub mod config {
    pub use crate::config::*;
}

/// The `connect` module's `pub` items.
pub mod connect {
    pub use crate::connect::*;
}

/// The `demo` module's `pub` items.
pub mod demo {
    pub use crate::demo::*;
}

/// The `dpop` module's `pub` items.
pub mod dpop {
    pub use crate::dpop::*;
}

/// The `events` module's `pub` items.
pub mod events {
    pub use crate::events::*;
}

/// The `exchange` module's `pub` items.
pub mod exchange {
    pub use crate::exchange::*;
}

/// The `failpoint` module's `pub` items.
pub mod failpoint {
    pub use crate::failpoint::*;
}

/// The `fuzzing` module's `pub` items.
pub mod fuzzing {
    pub use crate::fuzzing::*;
}

/// The `jose` module's `pub` items.
pub mod jose {
    pub use crate::jose::*;
}

/// The `metrics` module's `pub` items.
pub mod metrics {
    pub use crate::metrics::*;
}

/// The `mint` module's `pub` items.
pub mod mint {
    pub use crate::mint::*;
}

/// The `oauth` module's `pub` items.
pub mod oauth {
    pub use crate::oauth::*;
}

/// The `pages` module's `pub` items.
pub mod pages {
    pub use crate::pages::*;
}

/// The `policy` module's `pub` items.
pub mod policy {
    pub use crate::policy::*;
}

/// The `seal` module's `pub` items.
pub mod seal {
    pub use crate::seal::*;
}

/// The `secret` module's `pub` items.
pub mod secret {
    pub use crate::secret::*;
}

/// The `server` module's `pub` items.
pub mod server {
    pub use crate::server::*;
}

/// The `store` module's `pub` items.
pub mod store {
    pub use crate::store::*;
}

/// The `subject` module's `pub` items.
pub mod subject {
    pub use crate::subject::*;
}

/// The `unix` module's `pub` items.
pub mod unix {
    pub use crate::unix::*;
}

/// The `upstream` module's `pub` items.
pub mod upstream {
    pub use crate::upstream::*;
}

/// The `vault` module's `pub` items.
pub mod vault {
    pub use crate::vault::*;
}
