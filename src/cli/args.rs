//! The command definitions (clap): what each command takes. What each one
//! does is in the sibling modules, one function per command.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// credbroker: a credential broker sidecar for AI agents.
#[derive(Debug, Parser)]
#[command(name = "credbroker", version = env!("CREDBROKER_VERSION"), about, long_about = None, after_help = super::exit::HELP)]
pub(crate) struct Cli {
    /// Log format.
    #[arg(long, global = true, value_parser = ["text", "json"], default_value = "text")]
    pub(super) log_format: String,
    #[command(subcommand)]
    pub(super) command: Command,
}

/// One subcommand.
#[derive(Debug, Subcommand)]
pub(super) enum Command {
    /// Create (or reuse) a quick-start directory and serve from it, with
    /// local accounts alice and bob and the built-in demo service.
    Quickstart {
        /// The directory.
        #[arg(long, default_value = "credbroker-quickstart")]
        dir: PathBuf,
        /// Public listener address, on loopback (default 127.0.0.1:8440; a
        /// reused directory keeps the address it was made for).
        #[arg(long)]
        listen: Option<String>,
        /// The demo service's address, on loopback (default: the port after
        /// --listen's, so 127.0.0.1:8441 without flags; a reused directory
        /// keeps the address it was made for).
        #[arg(long)]
        demo_listen: Option<String>,
    },
    /// Serve with a configuration file.
    Serve {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Print a subject token from the quick start's dev issuer (development only).
    SubjectToken {
        /// The quick-start directory.
        #[arg(long, default_value = "credbroker-quickstart")]
        dir: PathBuf,
        /// The person's name (`sub`).
        #[arg(long)]
        sub: String,
        /// Lifetime, e.g. 1h, 15m.
        #[arg(long, default_value = "1h")]
        ttl: String,
    },
    /// Ask a running broker for a token, with a DPoP proof.
    Derive {
        /// The broker's socket.
        #[arg(long)]
        socket: PathBuf,
        /// The broker's public issuer URL (base of the proof's htu); by
        /// default the issuer the socket's `GET /v1/info` names.
        #[arg(long)]
        issuer: Option<String>,
        /// The person's subject token.
        #[arg(long)]
        subject_token: String,
        /// The tool call.
        #[command(flatten)]
        call: crate::derive::policy::cli::CallArgs,
        /// The tool's DPoP key (PKCS#8 PEM, 0600); created there if it does
        /// not exist. Without it a new key is made and saved to a new file
        /// whose path is printed.
        #[arg(long)]
        dpop_key: Option<PathBuf>,
        /// Print only this member of the answer, raw (a string without its
        /// quotes), e.g. `access_token` or `connect_uri`, for scripts
        /// without a JSON tool. A refusal still exits 2; an answer without
        /// the member is printed whole on standard error.
        #[arg(long, value_name = "MEMBER")]
        print: Option<String>,
    },
    /// Show a running instance's status (through the admin socket). Exits 0
    /// when ready, 1 when running but not ready, 3 when not running, 6 when
    /// it cannot tell (the config does not load, or it runs as another user
    /// than the broker's: run it as the owner of the admin socket).
    Status {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Emergency freeze: deny every derive until lifted.
    Freeze {
        /// on or off.
        #[arg(value_parser = ["on", "off"])]
        state: String,
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Signing keys.
    Keys {
        #[command(subcommand)]
        action: KeysAction,
    },
    /// Webhook event delivery (through the admin socket of the running
    /// instance).
    Events {
        #[command(subcommand)]
        action: EventsAction,
    },
    /// Connected accounts (through the admin socket; the store directly
    /// when no instance runs).
    Accounts {
        #[command(subcommand)]
        action: AccountsAction,
    },
    /// Policy files: check, test, explain, diff (see policy/README.md).
    Policy {
        #[command(subcommand)]
        command: crate::derive::policy::cli::PolicyCommand,
    },
    /// Stop a person's agents everywhere, lift the stop, or list the
    /// stopped persons (through the admin socket; the store directly when
    /// no instance runs).
    Persons {
        #[command(subcommand)]
        action: PersonsAction,
    },
    /// Local accounts for the pages (sign-in paired with the broker's own
    /// issuer, as in the quick start).
    Users {
        #[command(subcommand)]
        action: UsersAction,
    },
    /// The store: upgrade a PostgreSQL schema, or copy a sled store into
    /// PostgreSQL.
    Store {
        #[command(subcommand)]
        action: StoreAction,
    },
    /// The organisation's authorization servers (`[upstreams.<name>]`).
    Upstream {
        #[command(subcommand)]
        action: UpstreamAction,
    },
    /// Shared Signals: the transmitter's stream for this receiver.
    Ssf {
        #[command(subcommand)]
        action: SsfAction,
    },
    /// Make a DPoP proof with a key (for scripts and tests).
    Proof {
        /// The key (PKCS#8 PEM).
        #[arg(long)]
        key: PathBuf,
        /// HTTP method.
        #[arg(long, default_value = "GET")]
        method: String,
        /// Request URL.
        #[arg(long)]
        url: String,
        /// The access token, for `ath`.
        #[arg(long)]
        access_token: Option<String>,
        /// The server's DPoP nonce (the `DPoP-Nonce` header of its
        /// `use_dpop_nonce` answer), for the proof's `nonce` claim.
        #[arg(long)]
        nonce: Option<String>,
    },
}

/// `credbroker persons ...`.
#[derive(Debug, Subcommand)]
pub(super) enum PersonsAction {
    /// Stop a person: their derives and proxied calls are refused
    /// (`person_revoked`), their streams in flight cut, their page sessions
    /// ended, their open links closed and pending approvals declined, on
    /// every replica; held until `persons restore`.
    Revoke {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// The person: their issuer and subject.
        #[arg(long, num_args = 2, value_names = ["ISS", "SUB"], required = true)]
        person: Vec<String>,
        /// Why (recorded in the `person.revoked` event; default `manual`).
        #[arg(long)]
        reason: Option<String>,
        /// Also revoke every connected account's tokens at its provider
        /// and mark it for reconnection.
        #[arg(long)]
        revoke_at_providers: bool,
    },
    /// Lift a person's stop, whatever its kind.
    Restore {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// The person: their issuer and subject.
        #[arg(long, num_args = 2, value_names = ["ISS", "SUB"], required = true)]
        person: Vec<String>,
    },
    /// List the stopped persons.
    List {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
    },
}
/// `credbroker upstream ...`.
#[derive(Debug, Subcommand)]
pub(super) enum UpstreamAction {
    /// Check one upstream against what the config needs, each check named
    /// on its own line (ok, FAIL or skip): `metadata` (discovery, issuer
    /// identical), `grant` (the grant and, for an ID-JAG IdP, the id-jag
    /// token type, where advertised), `dpop_algs` (ES256 advertised),
    /// `client_auth_method` (the configured method advertised) and
    /// `client_auth` (one token request with the client's authentication
    /// and a subject token that is no token: passes when the AS refuses it
    /// for anything but invalid_client). Exits 1 when a check fails.
    /// Nothing of a person's is sent. With private_key_jwt the running
    /// instance signs and sends the client_auth test (admin socket; the
    /// key stays in it); with none running, the client key is read from
    /// the store (as the broker's user).
    Check {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// The upstream's name (`[upstreams.<NAME>]`).
        name: String,
    },
}

/// `credbroker ssf ...`.
#[derive(Debug, Subcommand)]
pub(super) enum SsfAction {
    /// The stream at a transmitter (`ssf.transmitters.<name>`).
    Stream {
        #[command(subcommand)]
        action: StreamAction,
    },
}

/// `credbroker ssf stream ...`.
#[derive(Debug, Subcommand)]
pub(super) enum StreamAction {
    /// Ask the transmitter for a stream to this receiver (push to
    /// `{issuer}/ssf/events`, or poll) with its management credentials,
    /// and keep its id in the store.
    Create {
        /// The config file.
        #[arg(long)]
        config: PathBuf,
        /// The transmitter's name in the config.
        #[arg(long)]
        transmitter: String,
    },
    /// Read the kept stream back from the transmitter, check it against
    /// the config, and ask for a verification event.
    Verify {
        /// The config file.
        #[arg(long)]
        config: PathBuf,
        /// The transmitter's name in the config.
        #[arg(long)]
        transmitter: String,
    },
    /// Read the kept stream's status at the transmitter (exit 1 unless it
    /// is `enabled`), or set it with `--set`.
    Status {
        /// The config file.
        #[arg(long)]
        config: PathBuf,
        /// The transmitter's name in the config.
        #[arg(long)]
        transmitter: String,
        /// Ask the transmitter for this status (exit 1 unless it answers
        /// with it).
        #[arg(long, value_parser = ["enabled", "paused", "disabled"])]
        set: Option<String>,
        /// The reason sent with `--set`.
        #[arg(long, requires = "set")]
        reason: Option<String>,
    },
}

/// `credbroker accounts ...`.
#[derive(Debug, Subcommand)]
pub(super) enum AccountsAction {
    /// List connected accounts with the agents allowed to use them, and
    /// report records that do not decrypt.
    List {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Only this person (`sub`).
        #[arg(long)]
        person: Option<String>,
        /// The person's issuer (default: the only trusted issuer).
        #[arg(long)]
        issuer: Option<String>,
    },
    /// Revoke an account's tokens at the provider (RFC 7009 where it has a
    /// revocation endpoint; GitHub's application grant API for the GitHub
    /// preset) and delete it with its allowances; the answer's `message`
    /// says what was revoked and what was not.
    Disconnect {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// The person (`sub`).
        #[arg(long)]
        person: String,
        /// The person's issuer (default: the only trusted issuer).
        #[arg(long)]
        issuer: Option<String>,
        /// The service.
        #[arg(long)]
        service: String,
        /// Delete even if revocation at the provider fails.
        #[arg(long)]
        force: bool,
    },
}

/// `credbroker events ...`.
#[derive(Debug, Subcommand)]
pub(super) enum EventsAction {
    /// Send this instance's webhook dead letters again, each under its own
    /// webhook-id (a delivered one leaves the store; one refused again
    /// stays). Needs the running instance: exit 3 when none runs.
    Redeliver {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Only this subscription's dead letters (default: every one's).
        #[arg(long)]
        subscription: Option<String>,
    },
}

/// `credbroker keys ...`.
#[derive(Debug, Subcommand)]
pub(super) enum KeysAction {
    /// Publish a new signing key in the JWKS now and make it active after
    /// `[keys] activation_delay` (default 120 s: the JWKS cache lifetime plus
    /// the resource servers' refetch interval); the old key then stays in the
    /// JWKS until its tokens have expired. While a rotation is pending, running
    /// this again adds no key and reports the pending one.
    Rotate {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Suspected key compromise: the new key signs at once and every other
        /// key leaves the JWKS. What that costs resource servers: every token
        /// signed before stops verifying (callers must derive again), and a
        /// resource server that fetched the JWKS less than a minute ago rejects
        /// the new kid until it refetches.
        #[arg(long)]
        emergency: bool,
    },
    /// Rotate the client key (RFC 7523 client assertions and actor tokens at
    /// the upstream authorization servers; published at
    /// {issuer}/.well-known/client-jwks.json) as `keys rotate` does the
    /// signing key: the new key is published now and signs after
    /// `[keys] activation_delay`; the old one stays published for its grace.
    RotateClient {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Suspected compromise: the new key signs at once and every other
        /// client key leaves the client JWKS (an authorization server that
        /// cached it refuses the new key's assertions until it refetches).
        #[arg(long)]
        emergency: bool,
    },
    /// Re-encrypt the vault under a new key. Resumable: an interrupted run
    /// (or one stopped by --limit) continues where it stopped, and old keys
    /// keep decrypting until it reports `done`.
    RotateVault {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Re-wrap at most this many records in this run.
        #[arg(long)]
        limit: Option<usize>,
    },
}

/// `credbroker store ...`.
#[derive(Debug, Subcommand)]
pub(super) enum StoreAction {
    /// Apply the schema migrations this binary has and the database lacks
    /// (expand-only: instances of the previous version keep running).
    /// Running it again when the schema is current does nothing.
    Migrate {
        /// The config file (with a [postgres] table).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Copy every record of a sled store into the PostgreSQL store of a
    /// config file (sealed records stay sealed), then verify the counts.
    /// Stop the instance that uses the sled store first.
    Copy {
        /// The sled store directory (the old config's `store`).
        #[arg(long)]
        from: PathBuf,
        /// The config file with the [postgres] table to copy into.
        #[arg(long)]
        to: PathBuf,
        /// Copy into a store that already holds records (same keys are
        /// overwritten).
        #[arg(long)]
        force: bool,
    },
}

/// `credbroker users ...`.
#[derive(Debug, Subcommand)]
pub(super) enum UsersAction {
    /// Add a local account. Prompts for the password twice (not echoed) on
    /// the terminal; without one (scripts, containers), use
    /// --password-stdin.
    /// Local account NAME is the person (broker issuer, NAME): in the quick
    /// start, the same person as subject tokens with `sub` NAME.
    Add {
        /// The account name.
        name: String,
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Read the password from the first line of standard input (for
        /// scripts and tests) instead of prompting.
        #[arg(long)]
        password_stdin: bool,
        /// Set a new password for an existing account (and clear its lockout).
        #[arg(long)]
        replace: bool,
    },
    /// List the local accounts (names, creation times, locks; never a
    /// password hash), and the names whose records do not open.
    List {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Remove a local account, and sign out every browser signed in with
    /// it (its page sessions end). Exits 1 when there was no such account
    /// (its sessions are ended all the same).
    Remove {
        /// The account name.
        name: String,
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
    },
}
