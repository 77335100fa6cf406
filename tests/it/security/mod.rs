//! Attack and bad-input cases against the running binary, by group.
mod at_rest;
mod availability;
mod canary;
mod derive_check_order;
mod dpop;
mod exchange;
mod jose;
mod policy;
mod restart_replay;
