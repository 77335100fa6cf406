//! Local accounts, for the quick start and small teams: argon2id password
//! hashes in the store, with a lockout after repeated failures.
//!
//! A local account `NAME` is the person (broker issuer, `NAME`): in the
//! quick start, local account `alice` is the same person as subject tokens
//! with `sub` `alice` from the dev issuer.
//!
//! Verifying is slow on purpose (argon2id, 19 MiB, 2 passes); callers run it
//! off the async threads and cap how many run at once. An unknown name costs
//! the same as a wrong password (a dummy hash is verified), and every
//! failure reads the same to the browser.

use argon2::password_hash::phc::PasswordHash;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use argon2::Argon2;
use serde::{Deserialize, Serialize};

use crate::base::secret::SecretString;
use crate::infra::seal::Sealer;
use crate::infra::store::{Store, StoreError, Tree};

/// Consecutive failures that lock an account.
pub const LOCK_AFTER: u32 = 5;
/// How long a locked account stays locked.
pub const LOCK_FOR: i64 = 15 * 60;
/// Shortest password accepted by `users add`.
pub(crate) const MIN_PASSWORD: usize = 8;
/// Longest password accepted (argon2 cost does not depend on it much, but
/// form bodies are bounded anyway).
pub(crate) const MAX_PASSWORD: usize = 1024;

/// A stored local account.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct UserRecord {
    /// The PHC string (`$argon2id$v=19$...`).
    hash: String,
    created: i64,
    #[serde(default)]
    failures: u32,
    #[serde(default)]
    locked_until: i64,
}

/// Errors managing accounts.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// The name is not acceptable.
    #[error("a user name is 1 to 64 characters: letters, digits, '.', '_', '-', '@'")]
    BadName,
    /// The password is too short or too long.
    #[error("a password is {MIN_PASSWORD} to {MAX_PASSWORD} bytes")]
    BadPassword,
    /// The account exists (and replacing was not asked for).
    #[error("user {0} already exists (use --replace to set a new password)")]
    Exists(String),
    /// Hashing failed.
    #[error("password hashing failed")]
    Hash,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The outcome of a sign-in attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Right name and password.
    Ok,
    /// Wrong password (or unknown name: the caller cannot tell, on purpose).
    Wrong,
    /// The account is locked after repeated failures.
    Locked,
    /// This failure locked the account.
    NowLocked,
    /// No such account.
    Unknown,
}

/// Whether `name` is acceptable as a local account name (it becomes a
/// `sub`).
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@'))
}

fn hasher() -> Argon2<'static> {
    // argon2id, v19, m = 19 MiB, t = 2, p = 1 (the crate's default, OWASP's
    // first recommendation).
    Argon2::default()
}

fn hash_password(password: &SecretString) -> Result<String, UserError> {
    let mut salt = [0u8; 16];
    aws_lc_rs::rand::fill(&mut salt).map_err(|_| UserError::Hash)?;
    hasher()
        .hash_password_with_salt(password.expose().as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|_| UserError::Hash)
}

/// A hash of a random password, verified when the name is unknown so that
/// unknown names cost as much as wrong passwords.
fn dummy_hash() -> &'static str {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DUMMY.get_or_init(|| {
        let mut pw = [0u8; 24];
        let _ = aws_lc_rs::rand::fill(&mut pw);
        hash_password(&SecretString::new(crate::base::jose::b64e(&pw))).unwrap_or_default()
    })
}

fn verify_hash(hash: &str, password: &SecretString) -> bool {
    match PasswordHash::new(hash) {
        Ok(h) => hasher()
            .verify_password(password.expose().as_bytes(), &h)
            .is_ok(),
        Err(_) => false,
    }
}

/// The associated data of `name`'s sealed record: a record moved under
/// another name does not open.
fn aad(name: &str) -> Vec<u8> {
    let mut a = b"credbroker local account v1\0".to_vec();
    a.extend_from_slice(name.as_bytes());
    a
}

/// The stored form of `rec`: sealed under the master key (`sealer`), so
/// that nobody without it (another writer of a shared store) can set a
/// password hash of their choosing, or move one account's record to
/// another name.
fn encode(sealer: &Sealer, name: &str, rec: &UserRecord) -> Result<Vec<u8>, StoreError> {
    let json = serde_json::to_vec(rec).map_err(|e| StoreError::Backend(e.to_string()))?;
    sealer
        .seal(&aad(name), &json)
        .map_err(|e| StoreError::Backend(format!("local account record: {e}")))
}

/// The record stored as `bytes` for `name`, if it opens: one that does not
/// (written without the key, or in clear by an earlier release) is no
/// account.
fn decode(sealer: &Sealer, name: &str, bytes: &[u8]) -> Option<UserRecord> {
    let plain = sealer.open(&aad(name), bytes).ok()?;
    serde_json::from_slice(plain.expose()).ok()
}

/// Adds a local account (or, with `replace`, sets a new password and clears
/// its lockout). Its record is sealed under the master key (`sealer`).
pub fn add(
    store: &dyn Store,
    sealer: &Sealer,
    name: &str,
    password: &SecretString,
    replace: bool,
    now: i64,
) -> Result<(), UserError> {
    if !valid_name(name) {
        return Err(UserError::BadName);
    }
    let len = password.expose().len();
    if !(MIN_PASSWORD..=MAX_PASSWORD).contains(&len) {
        return Err(UserError::BadPassword);
    }
    let record = UserRecord {
        hash: hash_password(password)?,
        created: now,
        failures: 0,
        locked_until: 0,
    };
    let value = encode(sealer, name, &record)?;
    if replace {
        store.put(Tree::LocalUsers, name.as_bytes(), &value)?;
        return Ok(());
    }
    if store.compare_and_swap(Tree::LocalUsers, name.as_bytes(), None, Some(&value))? {
        Ok(())
    } else {
        Err(UserError::Exists(name.to_string()))
    }
}

/// Whether the account exists: its record is there and opens.
pub(crate) fn exists(store: &dyn Store, sealer: &Sealer, name: &str) -> Result<bool, StoreError> {
    if !valid_name(name) {
        return Ok(false);
    }
    Ok(store
        .get(Tree::LocalUsers, name.as_bytes())?
        .is_some_and(|b| decode(sealer, name, &b).is_some()))
}

/// A local account as `users list` shows it (never its hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Listed {
    /// The account name.
    pub name: String,
    /// When it was made (Unix seconds).
    pub created: i64,
    /// Locked after repeated failures, at `now`.
    pub locked: bool,
}

/// The local accounts, by name, and the names whose records do not open
/// (written without the master key, or under another name): those are no
/// accounts, and `users remove` deletes them.
pub(crate) fn list(
    store: &dyn Store,
    sealer: &Sealer,
    now: i64,
) -> Result<(Vec<Listed>, Vec<String>), StoreError> {
    let mut listed = Vec::new();
    let mut unreadable = Vec::new();
    for (k, v) in store.scan_prefix(Tree::LocalUsers, b"")? {
        let name = String::from_utf8_lossy(&k).into_owned();
        match decode(sealer, &name, &v) {
            Some(rec) => listed.push(Listed {
                name,
                created: rec.created,
                locked: rec.locked_until > now,
            }),
            None => unreadable.push(name),
        }
    }
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    unreadable.sort();
    Ok((listed, unreadable))
}

/// Deletes the local account `name`; whether there was a record. Its
/// sessions on the pages are not this module's: the caller ends them.
pub(crate) fn remove(store: &dyn Store, name: &str) -> Result<bool, UserError> {
    if !valid_name(name) {
        return Err(UserError::BadName);
    }
    let had = store.get(Tree::LocalUsers, name.as_bytes())?.is_some();
    store.delete(Tree::LocalUsers, name.as_bytes())?;
    Ok(had)
}

/// Checks a name and password, counting failures and locking the account
/// after [`LOCK_AFTER`] in a row. Slow (argon2id): run it off the async
/// threads.
///
/// Each attempt is counted as a failure *before* its password is checked
/// (a compare-and-swap on the account's record, retried on a conflict),
/// and a success clears the count afterwards. So guesses made at the same
/// moment, on one replica or several, each take one of the
/// [`LOCK_AFTER`] attempts; once they are all taken, further attempts are
/// refused unchecked and the account is locked.
pub fn verify(
    store: &dyn Store,
    sealer: &Sealer,
    name: &str,
    password: &SecretString,
    now: i64,
) -> Result<Verdict, StoreError> {
    if !valid_name(name) {
        verify_hash(dummy_hash(), password);
        return Ok(Verdict::Unknown);
    }
    let hash = match update(store, sealer, name, |rec| {
        if rec.locked_until > now {
            // No check while locked: a guess cannot succeed, and the
            // answer reads the same as a wrong password.
            return Err(Verdict::Locked);
        }
        if rec.failures >= LOCK_AFTER {
            // Every attempt is taken by guesses still being checked (or
            // left counted by a crash): lock now.
            rec.failures = 0;
            rec.locked_until = now + LOCK_FOR;
            return Ok(Some(Verdict::Locked));
        }
        rec.failures += 1;
        Ok(None)
    })? {
        Reserved::Unknown => {
            verify_hash(dummy_hash(), password);
            return Ok(Verdict::Unknown);
        }
        Reserved::Answered(v) => return Ok(v),
        Reserved::Counted(hash) => hash,
    };
    if verify_hash(&hash, password) {
        // A success clears the count (this attempt's and any other's) and
        // any lock set meanwhile by attempts refused unchecked.
        let cleared = update(store, sealer, name, |rec| {
            if rec.hash != hash {
                // The password was replaced meanwhile: this one is no
                // longer the account's.
                return Err(Verdict::Wrong);
            }
            rec.failures = 0;
            rec.locked_until = 0;
            Ok(None)
        })?;
        return Ok(match cleared {
            Reserved::Counted(_) => Verdict::Ok,
            Reserved::Answered(v) => v,
            Reserved::Unknown => Verdict::Unknown,
        });
    }
    // A wrong password: its failure is already counted. The attempt that
    // finds all of them taken locks the account.
    let locked = update(store, sealer, name, |rec| {
        if rec.failures >= LOCK_AFTER && rec.locked_until <= now {
            rec.failures = 0;
            rec.locked_until = now + LOCK_FOR;
            return Ok(Some(Verdict::NowLocked));
        }
        Err(Verdict::Wrong)
    })?;
    Ok(match locked {
        Reserved::Answered(v) => v,
        Reserved::Counted(_) | Reserved::Unknown => Verdict::Wrong,
    })
}

/// What [`update`] did.
enum Reserved {
    /// No such account (or its record does not read).
    Unknown,
    /// The change answered this verdict (written when it returned
    /// `Ok(Some(_))`, not when it returned `Err`).
    Answered(Verdict),
    /// The record was changed and written; the account's password hash.
    Counted(String),
}

/// Applies `change` to `name`'s record by compare-and-swap, reading again
/// and retrying when another attempt wrote it meanwhile. `change` returns
/// `Err(v)` to write nothing and answer `v`, `Ok(Some(v))` to write and
/// answer `v`, `Ok(None)` to write and go on.
fn update(
    store: &dyn Store,
    sealer: &Sealer,
    name: &str,
    change: impl Fn(&mut UserRecord) -> Result<Option<Verdict>, Verdict>,
) -> Result<Reserved, StoreError> {
    // Each lost race means another attempt's write went through, so this
    // bound is reached only under a flood that the sign-in limits refuse
    // long before.
    for _ in 0..64 {
        let Some(bytes) = store.get(Tree::LocalUsers, name.as_bytes())? else {
            return Ok(Reserved::Unknown);
        };
        let Some(mut rec) = decode(sealer, name, &bytes) else {
            return Ok(Reserved::Unknown);
        };
        let answer = match change(&mut rec) {
            Err(v) => return Ok(Reserved::Answered(v)),
            Ok(a) => a,
        };
        let new = encode(sealer, name, &rec)?;
        if store.compare_and_swap(Tree::LocalUsers, name.as_bytes(), Some(&bytes), Some(&new))? {
            return Ok(match answer {
                Some(v) => Reserved::Answered(v),
                None => Reserved::Counted(rec.hash),
            });
        }
    }
    Err(StoreError::Unavailable(format!(
        "the local account {name:?} kept changing under concurrent sign-ins"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer() -> Sealer {
        Sealer::new(&crate::base::secret::SecretBytes::new(vec![7; 32]), &[]).unwrap()
    }

    /// A store holding the local account `alice`, made at time 0 with the
    /// returned password, sealed with the returned sealer.
    fn with_alice() -> (
        tempfile::TempDir,
        crate::infra::store::SledStore,
        Sealer,
        SecretString,
    ) {
        let d = tempfile::tempdir().unwrap();
        let st = crate::infra::store::SledStore::open(d.path()).unwrap();
        let sealer = sealer();
        let pw = SecretString::new("correct horse".into());
        add(&st, &sealer, "alice", &pw, false, 0).unwrap();
        (d, st, sealer, pw)
    }

    #[test]
    fn add_verify_lockout_and_replace() {
        let (_d, st, sealer, pw) = with_alice();
        let wrong = SecretString::new("battery staple".into());
        let raw = st.get(Tree::LocalUsers, b"alice").unwrap().unwrap();
        let stored = decode(&sealer, "alice", &raw).unwrap();
        assert!(stored.hash.starts_with("$argon2id$"), "{}", stored.hash);
        for clear in [&b"correct horse"[..], b"$argon2id$"] {
            assert!(!raw.windows(clear.len()).any(|w| w == clear));
        }
        assert!(matches!(
            add(&st, &sealer, "alice", &pw, false, 0),
            Err(UserError::Exists(_))
        ));
        assert!(matches!(
            add(&st, &sealer, "a b", &pw, false, 0),
            Err(UserError::BadName)
        ));
        assert!(matches!(
            add(
                &st,
                &sealer,
                "bob",
                &SecretString::new("short".into()),
                false,
                0
            ),
            Err(UserError::BadPassword)
        ));

        assert_eq!(verify(&st, &sealer, "alice", &pw, 10).unwrap(), Verdict::Ok);
        assert_eq!(
            verify(&st, &sealer, "nobody", &pw, 10).unwrap(),
            Verdict::Unknown
        );
        for _ in 0..LOCK_AFTER - 1 {
            assert_eq!(
                verify(&st, &sealer, "alice", &wrong, 10).unwrap(),
                Verdict::Wrong
            );
        }
        assert_eq!(
            verify(&st, &sealer, "alice", &wrong, 10).unwrap(),
            Verdict::NowLocked
        );
        // Locked: even the right password is refused until the lock ends.
        assert_eq!(
            verify(&st, &sealer, "alice", &pw, 11).unwrap(),
            Verdict::Locked
        );
        assert_eq!(
            verify(&st, &sealer, "alice", &pw, 10 + LOCK_FOR).unwrap(),
            Verdict::Ok
        );
        // Replacing the password clears a lock.
        for _ in 0..LOCK_AFTER {
            verify(&st, &sealer, "alice", &wrong, 20_000).unwrap();
        }
        assert_eq!(
            verify(&st, &sealer, "alice", &pw, 20_001).unwrap(),
            Verdict::Locked
        );
        let pw2 = SecretString::new("another password".into());
        add(&st, &sealer, "alice", &pw2, true, 20_002).unwrap();
        assert_eq!(
            verify(&st, &sealer, "alice", &pw2, 20_003).unwrap(),
            Verdict::Ok
        );
        assert_eq!(
            verify(&st, &sealer, "alice", &pw, 20_004).unwrap(),
            Verdict::Wrong
        );
    }

    /// SECURITY-CASES C18: a local account's record written without the
    /// master key (a password hash of someone else's choosing, as another
    /// writer of a shared store would put it, or in clear as an earlier
    /// release stored it), or moved from another name, is no account.
    #[test]
    fn a_record_written_without_the_key_is_no_account() {
        let (_d, st, sealer, pw) = with_alice();
        let theirs = SecretString::new("the forger's password".into());
        add(&st, &sealer, "mallory", &theirs, false, 0).unwrap();
        // In clear, with the forger's own hash.
        let forged = UserRecord {
            hash: hash_password(&theirs).unwrap(),
            created: 0,
            failures: 0,
            locked_until: 0,
        };
        st.put(
            Tree::LocalUsers,
            b"alice",
            &serde_json::to_vec(&forged).unwrap(),
        )
        .unwrap();
        assert_eq!(
            verify(&st, &sealer, "alice", &theirs, 10).unwrap(),
            Verdict::Unknown
        );
        assert!(!exists(&st, &sealer, "alice").unwrap());
        // Mallory's sealed record moved under alice's name.
        let moved = st.get(Tree::LocalUsers, b"mallory").unwrap().unwrap();
        st.put(Tree::LocalUsers, b"alice", &moved).unwrap();
        assert_eq!(
            verify(&st, &sealer, "alice", &theirs, 10).unwrap(),
            Verdict::Unknown
        );
        // Positive control: replacing the password (`users add --replace`)
        // makes the account again, and it signs in.
        add(&st, &sealer, "alice", &pw, true, 11).unwrap();
        assert!(exists(&st, &sealer, "alice").unwrap());
        assert_eq!(verify(&st, &sealer, "alice", &pw, 12).unwrap(), Verdict::Ok);
        assert_eq!(
            verify(&st, &sealer, "mallory", &theirs, 12).unwrap(),
            Verdict::Ok
        );
    }

    #[test]
    fn guesses_at_the_same_moment_each_take_an_attempt() {
        let (_d, st, sealer, pw) = with_alice();
        // Twelve wrong guesses at once (as from several addresses, or
        // several replicas sharing the store).
        let guesses = 12;
        let start = std::sync::Barrier::new(guesses);
        let verdicts: Vec<Verdict> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..guesses)
                .map(|i| {
                    let (st, start, sealer) = (&st, &start, &sealer);
                    scope.spawn(move || {
                        let wrong = SecretString::new(format!("guess number {i}"));
                        start.wait();
                        verify(st, sealer, "alice", &wrong, 100).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let checked = verdicts
            .iter()
            .filter(|v| matches!(v, Verdict::Wrong | Verdict::NowLocked))
            .count();
        assert!(
            checked <= LOCK_AFTER as usize,
            "{checked} of {guesses} guesses were checked: {verdicts:?}"
        );
        assert!(verdicts.iter().all(|v| *v != Verdict::Ok));
        // The account is locked: the right password is refused unchecked.
        assert_eq!(
            verify(&st, &sealer, "alice", &pw, 101).unwrap(),
            Verdict::Locked
        );
        // Positive control: once the lock ends, it signs in, and the count
        // starts again from zero.
        assert_eq!(
            verify(&st, &sealer, "alice", &pw, 101 + LOCK_FOR).unwrap(),
            Verdict::Ok
        );
        let wrong = SecretString::new("battery staple".into());
        assert_eq!(
            verify(&st, &sealer, "alice", &wrong, 102 + LOCK_FOR).unwrap(),
            Verdict::Wrong
        );
        assert_eq!(
            verify(&st, &sealer, "alice", &pw, 103 + LOCK_FOR).unwrap(),
            Verdict::Ok
        );
    }

    #[test]
    fn attempts_left_counted_by_a_crash_lock_for_a_while_not_for_ever() {
        let (_d, st, sealer, pw) = with_alice();
        // Every attempt counted, none finished: what a crash during as
        // many checks leaves behind.
        let bytes = st.get(Tree::LocalUsers, b"alice").unwrap().unwrap();
        let mut rec = decode(&sealer, "alice", &bytes).unwrap();
        rec.failures = LOCK_AFTER;
        st.put(
            Tree::LocalUsers,
            b"alice",
            &encode(&sealer, "alice", &rec).unwrap(),
        )
        .unwrap();
        assert_eq!(
            verify(&st, &sealer, "alice", &pw, 50).unwrap(),
            Verdict::Locked
        );
        assert_eq!(
            verify(&st, &sealer, "alice", &pw, 49 + LOCK_FOR).unwrap(),
            Verdict::Locked
        );
        assert_eq!(
            verify(&st, &sealer, "alice", &pw, 50 + LOCK_FOR).unwrap(),
            Verdict::Ok
        );
    }
}
