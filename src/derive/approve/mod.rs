//! Step-up approvals (docs/APPROVALS.md): a connect link for one call.
//!
//! A tool marked `approval = "each_call" | "per_step"` gets a token only for
//! a call its person approved on the pages. The call is named by its hash,
//! SHA-256 over the person, agent, step, tool, resource, scopes, the DPoP
//! key thumbprint and the SHA-256 of the `authorization_details` in RFC 8785
//! (JCS) form: the approval index maps that hash to the one approval record
//! of the call, so several calls may wait at once, asking again for the same
//! call hands out the same link, and any change (a detail, another key)
//! is another call.
//!
//! Records are keyed by SHA-256 of their code, as connect links are; the
//! code is HMAC-SHA256(approval key, id), the key derived from the master
//! key under its own label. A record moves pending -> granted -> redeemed
//! (each_call) or pending -> declined, each move one compare-and-swap of
//! the record, so one grant is redeemed by exactly one derive.
//!
//! A record is sealed (AES-256-GCM, `crate::infra::seal`) under the record key,
//! derived from the approval key under its own label, and bound to the
//! record's own store key: the call's details and the person are never in
//! the store in clear, and whoever can write the store but holds no key
//! (a shared PostgreSQL's other users) can neither read an approval nor
//! forge or move one; a record that does not open is corrupt, and the
//! sweep removes it.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;

use base64::Engine;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::accounts::connect::LinkCodes;
use crate::accounts::subject::Person;
use crate::base::secret::{SecretBytes, SecretString};
use crate::derive::policy::TtlUnit;
use crate::infra::seal::{SealError, Sealer};
use crate::infra::store::{tuple_key, Store, StoreError, Tree};

/// An unanswered approval link stops resolving after this long.
pub(crate) const PENDING_TTL: i64 = 10 * 60;
/// A granted `each_call` approval must be redeemed within this long.
pub(crate) const REDEEM_TTL: i64 = 5 * 60;
/// A declined call stays declined this long (asking with other details is
/// another call and gets its own link at once).
pub(crate) const DECLINED_TTL: i64 = 60 * 60;
/// Tokens minted on an `each_call` approval live at most this long.
pub(crate) const EACH_CALL_TOKEN_TTL: i64 = 60;
/// At most this many approvals wait for one person from one agent.
pub(crate) const MAX_OPEN: usize = 5;
/// New approvals per (person, agent): a burst of this many, then one a
/// minute.
pub(crate) const CREATE_BURST: u32 = 10;

/// Errors of the approval store.
#[derive(Debug, thiserror::Error)]
pub enum ApproveError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A record is not what this module wrote.
    #[error("an approval record is malformed")]
    Corrupt,
    /// No randomness.
    #[error("no randomness for an approval id")]
    Random,
    /// Too many approvals wait for this person from this agent.
    #[error("too many approvals are waiting for this person")]
    TooManyOpen,
    /// Approvals are asked too fast for this person.
    #[error("approvals are asked too fast for this person")]
    RateLimited,
}

/// How the approval applies (from the policy's `approval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// One derive.
    EachCall,
    /// Identical derives in steps of this name, for `ttl` seconds.
    PerStep {
        /// Seconds from the grant.
        ttl: i64,
        /// The unit the policy wrote `approval_ttl` in (records written
        /// before it was kept read as seconds, which are exact).
        #[serde(default)]
        unit: TtlUnit,
    },
}

impl Mode {
    /// The policy's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::EachCall => "each_call",
            Mode::PerStep { .. } => "per_step",
        }
    }

    /// A per-step approval's reach in the policy's spelling (`"90s"`,
    /// `"5m"`), for the events; none for `each_call`.
    pub fn approval_ttl(self) -> Option<String> {
        match self {
            Mode::EachCall => None,
            Mode::PerStep { ttl, unit } => Some(unit.spelled(ttl)),
        }
    }

    /// A per-step approval's reach in words, in the unit the policy wrote
    /// it in (`"4 seconds"`, `"90 seconds"`, `"5 minutes"`), for the page;
    /// none for `each_call`.
    pub fn reach(self) -> Option<String> {
        match self {
            Mode::EachCall => None,
            Mode::PerStep { ttl, unit } => Some(unit.words(ttl)),
        }
    }
}

/// Where an approval is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Waiting for the person.
    Pending,
    /// Approved.
    Granted,
    /// Declined.
    Declined,
    /// An each_call approval used by its derive.
    Redeemed,
}

/// One field as the page shows it: the policy's label and the values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShownField {
    /// The policy's label.
    pub label: String,
    /// The values (one for a string or integer; the list for a list).
    pub values: Vec<String>,
}

/// One `authorization_details` entry as the page shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShownEntry {
    /// The entry's `type`.
    pub kind: String,
    /// Its fields in the policy's order.
    pub fields: Vec<ShownField>,
}

/// A bound request as the page shows it (docs/APPROVALS.md, "The
/// request, bound"): where it goes and every field of its body, whole.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShownRequest {
    /// The method.
    pub method: String,
    /// Where it is sent: the service's `api_base` + path + query for the
    /// proxy, the resource's origin + path + query for a `self` resource.
    pub url: String,
    /// The `Content-Type` as sent (empty: none).
    pub content_type: String,
    /// The body's members the tool declares as detail fields, with the
    /// policy's labels, in the policy's order.
    pub fields: Vec<ShownField>,
    /// Every other member, named by its name, in canonical order.
    pub other_fields: Vec<ShownField>,
    /// A body that is not a JSON object, whole (the canonical form of
    /// JSON, the text of any other body); `None` without a body.
    pub text: Option<String>,
}

/// An approval record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// The approval id (`connect_id` of the refusal, `approval_id` claim).
    pub id: String,
    /// The call hash (hex): the index key.
    pub call: String,
    /// The person's issuer.
    pub person_iss: String,
    /// The person's subject.
    pub person_sub: String,
    /// The agent.
    pub agent: String,
    /// The step.
    pub step: String,
    /// The tool.
    pub tool: String,
    /// The resource (as the policy writes it).
    pub resource: String,
    /// Granted scopes.
    pub scopes: Vec<String>,
    /// The DPoP key thumbprint of the asking derive.
    pub jkt: String,
    /// SHA-256 (hex) of the details in JCS form (of `[]` without details).
    pub details_sha256: String,
    /// The details, as checked against the policy (`Null` without).
    pub details: Value,
    /// What the page shows of them.
    pub shown: Vec<ShownEntry>,
    /// The bound request's `req_sha256`, when the derive carried its
    /// request (records from before request binding have none).
    #[serde(default)]
    pub request_sha256: Option<String>,
    /// What the page shows of the bound request.
    #[serde(default)]
    pub request: Option<ShownRequest>,
    /// How it applies.
    pub mode: Mode,
    /// Where it is.
    pub state: State,
    /// The deciding policy's hash.
    pub policy_hash: String,
    /// Unix time made.
    pub created: i64,
    /// Unix time the current state ends (pending: the link expires;
    /// granted: the approval can no longer be redeemed or used).
    pub expires: i64,
}

impl Approval {
    /// The person it was made for.
    pub fn person(&self) -> Person {
        Person {
            iss: self.person_iss.clone(),
            sub: self.person_sub.clone(),
        }
    }
}

/// The call a derive asks to be approved.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The person.
    pub person: &'a Person,
    /// The agent.
    pub agent: &'a str,
    /// The step.
    pub step: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// The resource (as the policy writes it, the token's `aud`).
    pub resource: &'a str,
    /// The granted scopes (sorted).
    pub scopes: &'a [String],
    /// The proof's key thumbprint.
    pub jkt: &'a str,
    /// The checked details, if any.
    pub details: Option<&'a Value>,
    /// The bound request's `req_sha256` and what the page shows of it,
    /// when the derive carried its request.
    pub request: Option<(&'a str, &'a ShownRequest)>,
}

/// What the store says about a call.
#[derive(Debug)]
pub enum Lookup {
    /// Waiting for the person: the link to hand out again (`fresh` when this
    /// derive made it).
    Pending(Box<Issued>),
    /// Approved: the record (each_call: already marked redeemed by this
    /// derive, which is the only one to get it).
    Granted(Box<Approval>),
    /// Declined.
    Declined(Box<Approval>),
}

/// A pending approval with its code.
#[derive(Debug)]
pub struct Issued {
    /// The record.
    pub approval: Approval,
    /// The link code.
    pub code: SecretString,
    /// Whether this derive made it (`approval.requested` is recorded once).
    pub fresh: bool,
}

/// The approval store.
pub struct Approvals {
    store: Arc<dyn Store>,
    codes: LinkCodes,
    /// Seals and opens the records (see the module doc).
    records: Sealer,
    created: DefaultKeyedRateLimiter<(String, String, String)>,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("base", &self.codes.base())
            .finish_non_exhaustive()
    }
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

fn sha256(b: &[u8]) -> Vec<u8> {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b)
        .as_ref()
        .to_vec()
}

/// The RFC 8785 (JCS) form of checked details. serde_json writes it for the
/// values the policy admits: its maps sort keys by bytes, which is JCS's
/// UTF-16 order for the ASCII names the loader allows; strings are escaped
/// as JCS says (`\b \t \n \f \r \" \\`, other controls as lower-case
/// `\u00xx`, everything else as it is); integers within ±(2^53 - 1) print
/// as ECMAScript prints them; no whitespace. The tests compare it with the
/// RFC's own examples.
pub(crate) fn canonical_details(details: Option<&Value>) -> Vec<u8> {
    match details {
        // Serialising a `Value` cannot fail (string keys only).
        Some(v) => serde_json::to_vec(v).unwrap_or_default(),
        None => b"[]".to_vec(),
    }
}

/// SHA-256 (hex) of [`canonical_details`].
pub(crate) fn details_sha256(details: Option<&Value>) -> String {
    hex::encode(sha256(&canonical_details(details)))
}

/// The call hash (hex): every part length-prefixed, so that no two calls
/// share one; a bound request's `req_sha256` is a tenth part (a call
/// without one keeps the nine parts it always had).
pub(crate) fn call_hash(c: &Call<'_>) -> String {
    let scopes = c.scopes.join(" ");
    let details = details_sha256(c.details);
    let mut parts: Vec<&str> = vec![
        &c.person.iss,
        &c.person.sub,
        c.agent,
        c.step,
        c.tool,
        c.resource,
        &scopes,
        c.jkt,
        &details,
    ];
    if let Some((req, _)) = c.request {
        parts.push(req);
    }
    hex::encode(sha256(&tuple_key(&parts)))
}

/// What the page shows of checked details: per entry its type and each
/// declared field present, with the policy's label, in the policy's order.
pub(crate) fn shown(
    tool: &crate::derive::policy::Tool,
    details: Option<&Value>,
) -> Vec<ShownEntry> {
    let mut out = Vec::new();
    for e in details.and_then(Value::as_array).into_iter().flatten() {
        let Some(kind) = e.get("type").and_then(Value::as_str) else {
            continue;
        };
        let Some(declared) = tool.details.get(kind) else {
            continue;
        };
        let fields = declared
            .ordered()
            .filter_map(|(name, f)| {
                let values = match e.get(name)? {
                    Value::String(s) => vec![s.clone()],
                    Value::Array(a) => a
                        .iter()
                        .map(|v| v.as_str().unwrap_or_default().to_string())
                        .collect(),
                    other => vec![other.to_string()],
                };
                Some(ShownField {
                    label: f.label.clone(),
                    values,
                })
            })
            .collect();
        out.push(ShownEntry {
            kind: kind.to_string(),
            fields,
        });
    }
    out
}

impl Approvals {
    /// An approval store; `key` makes codes and (under another label)
    /// seals records, `public_base` serves `/connect/{code}`.
    pub fn new(
        store: Arc<dyn Store>,
        key: &SecretBytes,
        public_base: &str,
    ) -> Result<Approvals, SealError> {
        let quota = Quota::per_minute(NonZeroU32::MIN)
            .allow_burst(NonZeroU32::new(CREATE_BURST).unwrap_or(NonZeroU32::MIN));
        let record_key = LinkCodes::derive_key(key, b"credbroker approval-record key v1");
        Ok(Approvals {
            store,
            codes: LinkCodes::new(key, public_base),
            records: Sealer::new(&record_key, &[])?,
            created: RateLimiter::keyed(quota),
        })
    }

    /// The stored form of `a`, under store key `at`.
    fn seal(&self, at: &[u8], a: &Approval) -> Result<Vec<u8>, ApproveError> {
        let plain =
            zeroize::Zeroizing::new(serde_json::to_vec(a).map_err(|_| ApproveError::Corrupt)?);
        self.records
            .seal(at, &plain)
            .map_err(|_| ApproveError::Corrupt)
    }

    /// The approval stored under `at`; `Corrupt` if it does not open
    /// there (tampered, moved, written without the key) or does not parse.
    fn open(&self, at: &[u8], stored: &[u8]) -> Result<Approval, ApproveError> {
        let plain = self
            .records
            .open(at, stored)
            .map_err(|_| ApproveError::Corrupt)?;
        serde_json::from_slice(plain.expose()).map_err(|_| ApproveError::Corrupt)
    }

    /// The approval key derived from the master key (its own label: an
    /// approval code is never a connect-link code).
    pub fn derive_key(master: &SecretBytes) -> SecretBytes {
        LinkCodes::derive_key(master, b"credbroker approval-link key v1")
    }

    fn code_bytes(&self, id: &str) -> Vec<u8> {
        self.codes.code_bytes(id)
    }

    /// The code of approval `id`.
    pub fn code_for(&self, id: &str) -> SecretString {
        self.codes.code_for(id)
    }

    /// The URL the person opens.
    pub fn uri(&self, code: &SecretString) -> String {
        self.codes.uri(code)
    }

    fn record_key(&self, id: &str) -> Vec<u8> {
        sha256(&self.code_bytes(id))
    }

    fn load(&self, id: &str) -> Result<Option<(Vec<u8>, Approval)>, ApproveError> {
        let at = self.record_key(id);
        match self.store.get(Tree::Approvals, &at)? {
            None => Ok(None),
            Some(v) => {
                let a = self.open(&at, &v)?;
                // The record must be the one its key names.
                if a.id != id {
                    return Err(ApproveError::Corrupt);
                }
                Ok(Some((v, a)))
            }
        }
    }

    /// Moves `old` (whose stored bytes are `bytes`) to `new`; whether this
    /// call made the move.
    fn swap(&self, bytes: &[u8], new: &Approval) -> Result<bool, ApproveError> {
        let at = self.record_key(&new.id);
        let value = self.seal(&at, new)?;
        Ok(self
            .store
            .compare_and_swap(Tree::Approvals, &at, Some(bytes), Some(&value))?)
    }

    fn person_prefix(person: &Person, agent: &str) -> Vec<u8> {
        tuple_key(&[&person.iss, &person.sub, agent])
    }

    /// How many approvals wait for `person` from `agent` at `now`.
    fn open_count(&self, person: &Person, agent: &str, now: i64) -> Result<usize, ApproveError> {
        let mut n = 0;
        for (_, id) in self.store.scan_prefix(
            Tree::ApprovalPerson,
            &Approvals::person_prefix(person, agent),
        )? {
            let id = String::from_utf8(id).map_err(|_| ApproveError::Corrupt)?;
            if let Some((_, a)) = self.load(&id)? {
                if a.state == State::Pending && a.expires > now {
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// The state of `call` for a derive at `now`, making a pending approval
    /// when there is none in force. A granted each_call approval is marked
    /// redeemed here, by one compare-and-swap: of two derives racing for it,
    /// one gets [`Lookup::Granted`], the other a new approval.
    // reason: the record's parts come from different steps of the derive.
    #[allow(clippy::too_many_arguments)]
    pub fn lookup(
        &self,
        call: &Call<'_>,
        mode: Mode,
        shown: Vec<ShownEntry>,
        policy_hash: &str,
        now: i64,
    ) -> Result<Lookup, ApproveError> {
        let hash = call_hash(call);
        loop {
            let current = self.store.get(Tree::ApprovalIndex, hash.as_bytes())?;
            if let Some(id) = current.as_deref().and_then(|v| std::str::from_utf8(v).ok()) {
                if let Some((bytes, a)) = self.load(id)? {
                    if a.expires > now {
                        match a.state {
                            State::Pending => {
                                let code = self.code_for(&a.id);
                                return Ok(Lookup::Pending(Box::new(Issued {
                                    approval: a,
                                    code,
                                    fresh: false,
                                })));
                            }
                            State::Declined => return Ok(Lookup::Declined(Box::new(a))),
                            State::Granted if a.mode == Mode::EachCall => {
                                let mut used = a.clone();
                                used.state = State::Redeemed;
                                if self.swap(&bytes, &used)? {
                                    return Ok(Lookup::Granted(Box::new(a)));
                                }
                                // Another derive redeemed it first: look again.
                                continue;
                            }
                            State::Granted => return Ok(Lookup::Granted(Box::new(a))),
                            State::Redeemed => {}
                        }
                    }
                }
            }
            // Nothing in force: a new pending approval, within the limits.
            if self.open_count(call.person, call.agent, now)? >= MAX_OPEN {
                return Err(ApproveError::TooManyOpen);
            }
            let limit_key = (
                call.person.iss.clone(),
                call.person.sub.clone(),
                call.agent.to_string(),
            );
            if self.created.check_key(&limit_key).is_err() {
                return Err(ApproveError::RateLimited);
            }
            let mut r = [0u8; 16];
            aws_lc_rs::rand::fill(&mut r).map_err(|_| ApproveError::Random)?;
            let a = Approval {
                id: b64().encode(r),
                call: hash.clone(),
                person_iss: call.person.iss.clone(),
                person_sub: call.person.sub.clone(),
                agent: call.agent.to_string(),
                step: call.step.to_string(),
                tool: call.tool.to_string(),
                resource: call.resource.to_string(),
                scopes: call.scopes.to_vec(),
                jkt: call.jkt.to_string(),
                details_sha256: details_sha256(call.details),
                details: call.details.cloned().unwrap_or(Value::Null),
                shown: shown.clone(),
                request_sha256: call.request.map(|(h, _)| h.to_string()),
                request: call.request.map(|(_, r)| r.clone()),
                mode,
                state: State::Pending,
                policy_hash: policy_hash.to_string(),
                created: now,
                expires: now + PENDING_TTL,
            };
            let at = self.record_key(&a.id);
            let value = self.seal(&at, &a)?;
            self.store.put(Tree::Approvals, &at, &value)?;
            let mut pkey = Approvals::person_prefix(call.person, call.agent);
            pkey.extend_from_slice(&tuple_key(&[&a.id]));
            self.store
                .put(Tree::ApprovalPerson, &pkey, a.id.as_bytes())?;
            if self.store.compare_and_swap(
                Tree::ApprovalIndex,
                hash.as_bytes(),
                current.as_deref(),
                Some(a.id.as_bytes()),
            )? {
                if let Some(old) = current.as_deref().and_then(|v| std::str::from_utf8(v).ok()) {
                    self.remove(old)?;
                }
                let code = self.code_for(&a.id);
                return Ok(Lookup::Pending(Box::new(Issued {
                    approval: a,
                    code,
                    fresh: true,
                })));
            }
            // Another derive changed the index first: drop ours, look again.
            self.remove_record(&a)?;
        }
    }

    /// The key of `a`'s entry among its person's approvals.
    fn person_key(a: &Approval) -> Vec<u8> {
        let mut pkey = Approvals::person_prefix(&a.person(), &a.agent);
        pkey.extend_from_slice(&tuple_key(&[&a.id]));
        pkey
    }

    fn remove_record(&self, a: &Approval) -> Result<(), ApproveError> {
        self.store
            .delete(Tree::ApprovalPerson, &Approvals::person_key(a))?;
        self.store
            .delete(Tree::Approvals, &self.record_key(&a.id))?;
        Ok(())
    }

    fn remove(&self, id: &str) -> Result<(), ApproveError> {
        match self.load(id) {
            Ok(Some((_, a))) => self.remove_record(&a),
            Ok(None) => Ok(()),
            // An unreadable record can never resolve: drop its key.
            Err(ApproveError::Corrupt) => {
                self.store.delete(Tree::Approvals, &self.record_key(id))?;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Closes a pending approval that could not be recorded (no event, no
    /// link), so that the next ask makes a new one.
    pub fn discard(&self, a: &Approval) -> Result<(), ApproveError> {
        self.store.compare_and_swap(
            Tree::ApprovalIndex,
            a.call.as_bytes(),
            Some(a.id.as_bytes()),
            None,
        )?;
        self.remove_record(a)
    }

    /// The pending approval behind `code`, or `None` for an unknown,
    /// malformed, expired, answered or replaced code.
    pub fn resolve(&self, code: &str, now: i64) -> Result<Option<Approval>, ApproveError> {
        let bytes = match (code.len(), b64().decode(code)) {
            (43, Ok(b)) if b.len() == 32 => b,
            _ => return Ok(None),
        };
        let at = sha256(&bytes);
        let Some(v) = self.store.get(Tree::Approvals, &at)? else {
            return Ok(None);
        };
        let a = self.open(&at, &v)?;
        let expected = self.code_bytes(&a.id);
        if !bool::from(subtle::ConstantTimeEq::ct_eq(
            expected.as_slice(),
            bytes.as_slice(),
        )) {
            return Ok(None);
        }
        if a.state != State::Pending || a.expires <= now {
            return Ok(None);
        }
        match self.store.get(Tree::ApprovalIndex, a.call.as_bytes())? {
            Some(id) if id == a.id.as_bytes() => Ok(Some(a)),
            _ => Ok(None),
        }
    }

    /// The person's answer to pending approval `id`: granted (with its
    /// window from `now`) or declined. `None` if it is no longer pending
    /// (answered in another tab, expired): nothing changes.
    pub fn answer(
        &self,
        id: &str,
        approve: bool,
        now: i64,
    ) -> Result<Option<Approval>, ApproveError> {
        let Some((bytes, a)) = self.load(id)? else {
            return Ok(None);
        };
        if a.state != State::Pending || a.expires <= now {
            return Ok(None);
        }
        let mut next = a.clone();
        if approve {
            next.state = State::Granted;
            next.expires = now
                + match a.mode {
                    Mode::EachCall => REDEEM_TTL,
                    Mode::PerStep { ttl, .. } => ttl,
                };
        } else {
            next.state = State::Declined;
            next.expires = now + DECLINED_TTL;
        }
        Ok(self.swap(&bytes, &next)?.then_some(next))
    }

    /// Ends `person`'s approvals (a person stopped: `derive::persons`):
    /// each pending one is declined (its link no longer resolves), each
    /// granted one is removed (it serves no call). Returns the declined
    /// ones and how many granted ones ended.
    pub fn end_for_person(
        &self,
        person: &Person,
        now: i64,
    ) -> Result<(Vec<Approval>, usize), ApproveError> {
        let (mut declined, mut ended) = (Vec::new(), 0);
        let prefix = tuple_key(&[&person.iss, &person.sub]);
        for (_, id) in self.store.scan_prefix(Tree::ApprovalPerson, &prefix)? {
            let id = String::from_utf8(id).map_err(|_| ApproveError::Corrupt)?;
            let Some((_, a)) = self.load(&id)? else {
                continue;
            };
            match a.state {
                State::Pending if a.expires > now => {
                    if let Some(d) = self.answer(&id, false, now)? {
                        declined.push(d);
                    }
                }
                State::Granted => {
                    self.discard(&a)?;
                    ended += 1;
                }
                _ => {}
            }
        }
        Ok((declined, ended))
    }

    /// Deletes approvals whose state has ended; returns how many.
    pub fn sweep(&self, now: i64) -> Result<usize, ApproveError> {
        let mut n = 0;
        for (k, v) in self.store.scan_prefix(Tree::Approvals, b"")? {
            let a: Approval = match self.open(&k, &v) {
                Ok(a) => a,
                Err(_) => {
                    self.store.delete(Tree::Approvals, &k)?;
                    n += 1;
                    continue;
                }
            };
            if a.expires <= now || a.state == State::Redeemed {
                // Only the record as it was read goes: one answered or
                // redeemed since (by another replica, whose clock may lag
                // this one's) keeps its new state. Its index entries go
                // after it; one left by a crash in between points at no
                // record, which every reader takes as none.
                if !self
                    .store
                    .compare_and_swap(Tree::Approvals, &k, Some(&v), None)?
                {
                    continue;
                }
                self.store.compare_and_swap(
                    Tree::ApprovalIndex,
                    a.call.as_bytes(),
                    Some(a.id.as_bytes()),
                    None,
                )?;
                self.store
                    .delete(Tree::ApprovalPerson, &Approvals::person_key(&a))?;
                n += 1;
            }
        }
        self.created.retain_recent();
        Ok(n)
    }

    /// Approvals by state (for tests and `status`).
    pub fn counts(&self) -> Result<BTreeMap<&'static str, usize>, ApproveError> {
        let mut out = BTreeMap::new();
        for (k, v) in self.store.scan_prefix(Tree::Approvals, b"")? {
            let a = self.open(&k, &v)?;
            let s = match a.state {
                State::Pending => "pending",
                State::Granted => "granted",
                State::Declined => "declined",
                State::Redeemed => "redeemed",
            };
            *out.entry(s).or_insert(0) += 1;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
