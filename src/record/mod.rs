//! The per-request state, in one place: everything a stage of this crate leaves in a
//! request's `http::Extensions`, and the one function that clears it.
//!
//! The public part is read with `extensions.get::<T>()` and re-exported where users find
//! it: [`RequestEvidence`] (the transport step's contract), [`AttemptHistory`] and the
//! attempt record in [`crate::evidence`], [`RetryOutcome`] and [`Deadline`] in
//! [`crate::retry`], [`RetryIn`] in [`crate::breaker`]. The crate-private keys a stage
//! hands inward ([`HandedOnDeadline`], [`AttemptScope`]) live here too.
//!
//! A caller may reuse one `Extensions` for several requests, and a request's future may
//! be dropped half-way, so this state must belong to one request and end with it: the
//! stage that owns a request (see [`crate::stage::scope`]) calls
//! [`clear_earlier_request`] when it enters it. A key added here and not cleared there
//! would leak into the next request: add both in this module.

mod decision;
mod evidence;
mod history;
mod keys;

pub use decision::{AttemptDecision, RetryReason, StopReason};
pub use evidence::{FailureKind, NotProcessedProof, Redirects, RequestEvidence, Transmission};
pub use history::{AttemptHistory, AttemptRecord};
pub(crate) use history::{next_attempt, record_rejected_locally};
pub(crate) use keys::{AttemptScope, HandedOnDeadline, earlier};
pub use keys::{Deadline, RetryIn, RetryOutcome};

use http::Extensions;

/// Removes what an earlier request left in `extensions`: its history, evidence, outcome,
/// a breaker's "retry in", an attempt's own cut (left by a retry whose attempt was dropped
/// with no breaker inside to take it), and a deadline a stage handed inward (a caller's
/// own [`Deadline`] stays).
pub(crate) fn clear_earlier_request(extensions: &mut Extensions) {
    // A fresh request's extensions (every `send()`) hold nothing to clear.
    if extensions.is_empty() {
        return;
    }
    if let Some(HandedOnDeadline(stale)) = extensions.remove::<HandedOnDeadline>()
        && extensions.get::<Deadline>() == Some(&stale)
    {
        extensions.remove::<Deadline>();
    }
    extensions.remove::<AttemptHistory>();
    extensions.remove::<RequestEvidence>();
    extensions.remove::<RetryOutcome>();
    extensions.remove::<RetryIn>();
    extensions.remove::<AttemptScope>();
}
