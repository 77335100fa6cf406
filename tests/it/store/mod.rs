//! The stores: the contract every backend keeps, run against PostgreSQL
//! (sled runs it in its unit tests), and what only a shared store has to
//! show: races between processes, durability across a server crash, the
//! schema's versions, and failing closed while the server is away.
mod accounts;
mod browser;
// The replica's clock is moved with the `failpoints` build's clock injection.
#[cfg(feature = "failpoints")]
mod clock_skew;
mod contract;
mod copy;
mod dpop_nonces;
mod faults;
mod housekeeping;
mod links;
mod load;
mod migrations;
mod per_replica;
mod person_stop;
mod processes;
mod proxy_replay;
mod refresh;
mod replicas;
mod roles;
mod rotation;
mod statements;
mod unreachable;
mod vault_keys;
mod webhooks;
