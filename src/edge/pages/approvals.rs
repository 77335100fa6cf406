//! What the pages need from the approval records (`approve`): a small
//! trait, implemented on the real store by `app::backend`, so the browser
//! routes do not depend on how approvals are stored.
//!
//! [`NoApprovals`] is an instance without an approval store: no approval
//! code resolves.

use std::fmt::Debug;

use crate::accounts::subject::Person;
use crate::base::secret::SecretString;

use super::links::BackendError;

/// What the page shows of one detail entry: the records' own type.
pub(crate) use crate::derive::approve::ShownEntry;

/// A pending approval, as the pages see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalView {
    /// The approval id.
    pub id: String,
    /// The person it was made for.
    pub person: Person,
    /// The agent asking.
    pub agent: String,
    /// The step the agent is in.
    pub step: String,
    /// The tool that will make the call.
    pub tool: String,
    /// The resource it will call.
    pub resource: String,
    /// The scopes of its token.
    pub scopes: Vec<String>,
    /// `each_call` or `per_step`.
    pub mode: &'static str,
    /// For `per_step`: how long one approval covers the step, in words in
    /// the unit the policy wrote it in (`"90 seconds"`, `"5 minutes"`).
    pub covers: Option<String>,
    /// For `per_step`: the same as the policy spells it (`"90s"`), for the
    /// events.
    pub approval_ttl: Option<String>,
    /// SHA-256 of the details (events carry it).
    pub details_sha256: String,
    /// The details, with the policy's labels.
    pub shown: Vec<ShownEntry>,
    /// The bound request's `req_sha256` (events carry it).
    pub request_sha256: Option<String>,
    /// The bound request, as the page shows it.
    pub request: Option<crate::derive::approve::ShownRequest>,
    /// When the link stops resolving.
    pub expires: i64,
}

/// Approval records.
pub trait ApprovalRecords: Send + Sync + Debug {
    /// The pending approval behind `code`; `None` for every code that is
    /// not one (unknown, answered, expired, replaced).
    fn resolve(&self, code: &SecretString, now: i64) -> Result<Option<ApprovalView>, BackendError>;
    /// Records the person's answer; `false` if the approval is no longer
    /// pending (nothing changed).
    fn answer(&self, id: &str, approve: bool, now: i64) -> Result<bool, BackendError>;
    /// Whether the broker is frozen: then nothing is offered or approved.
    fn frozen(&self) -> bool;
}

/// No approval store: nothing resolves.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NoApprovals;

impl ApprovalRecords for NoApprovals {
    fn resolve(
        &self,
        _code: &SecretString,
        _now: i64,
    ) -> Result<Option<ApprovalView>, BackendError> {
        Ok(None)
    }
    fn answer(&self, _id: &str, _approve: bool, _now: i64) -> Result<bool, BackendError> {
        Err(BackendError::NotFound)
    }
    fn frozen(&self) -> bool {
        true
    }
}

/// One piece of a value as shown: text, or a code point that would be
/// invisible or reorder the text, named (`U+202E`) instead of applied; and
/// text that can be misread, marked with its script
/// ([`super::confusable`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The text, or the code point's name.
    pub text: String,
    /// Whether `text` names a code point.
    pub named: bool,
    /// The mark's label (a script's name, or `combining`); empty when the
    /// piece is not marked.
    pub mark: String,
    /// Why it is marked (the mark's title); empty when it is not.
    pub why: &'static str,
}

/// Code points shown by name: controls, the bidirectional marks,
/// embeddings, overrides and isolates, zero-width and other invisible
/// format characters, fillers, and the tag characters.
pub(crate) fn shown_by_name(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        | '\u{ad}'
        | '\u{34f}'
        | '\u{61c}'
        | '\u{115f}' | '\u{1160}'
        | '\u{17b4}' | '\u{17b5}'
        | '\u{180b}'..='\u{180f}'
        | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}'
        | '\u{3164}'
        | '\u{fe00}'..='\u{fe0f}'
        | '\u{feff}'
        | '\u{ffa0}'
        | '\u{fff9}'..='\u{fffb}'
        | '\u{e0000}'..='\u{e0fff}')
}

/// Splits `s` into pieces for the page (see [`Piece`]): runs of plain
/// text, each named code point, and runs of marked text with one label.
/// Combining marks that are marked are named too, so that none stacks on a
/// letter unseen.
pub(crate) fn pieces(s: &str) -> Vec<Piece> {
    use super::confusable::Why;
    let mut out: Vec<Piece> = Vec::new();
    for (c, m) in s.chars().zip(super::confusable::marks(s)) {
        let (mark, why) = match &m {
            Some(m) => (m.label.clone(), m.why.text()),
            None => (String::new(), ""),
        };
        let named = shown_by_name(c) || m.as_ref().is_some_and(|m| m.why == Why::Combining);
        if named {
            out.push(Piece {
                text: format!("U+{:04X}", u32::from(c)),
                named: true,
                mark,
                why,
            });
            continue;
        }
        match out.last_mut() {
            Some(p) if !p.named && p.mark == mark => p.text.push(c),
            _ => out.push(Piece {
                text: c.to_string(),
                named: false,
                mark,
                why,
            }),
        }
    }
    out
}
