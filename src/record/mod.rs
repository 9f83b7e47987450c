//! The per-request record, in one place: everything a stage of this crate leaves in a
//! request's `http::Extensions`, and the one function that clears it.
//!
//! # Reading what the stages left
//!
//! The stages leave what they observed and decided in one [`RequestRecord`] per
//! `http::Extensions`, read and written through accessors on the public types
//! (`RequestEvidence::of`, `of_response`, `insert_into`, and the same on
//! `AttemptHistory`, `RetryOutcome`, `RetryIn`); the contract users read is in
//! [`crate::guide::observability`] ("Reading the records"): keep the two in step.
//!
//! The caller's extensions after `execute_with_extensions` hold the evidence of the last
//! attempt, the history of every attempt and the outcome; a response holds the evidence
//! of the attempt that produced it, the outcome and, after more than one attempt, the
//! history (with `send()`, the response is where the caller reads them).
//!
//! The crate-private keys a stage hands inward ([`Inward`]: a handed-on deadline, an
//! attempt's scope and clock) live in the same record.
//!
//! # One request's state
//!
//! A caller may reuse one `Extensions` for several requests, and a request's future may
//! be dropped half-way, so this state must belong to one request and end with it: the
//! stage that owns a request (see [`crate::stage::scope`]) calls
//! [`clear_earlier_request`] when it enters it. A field added to the record and not
//! cleared there would leak into the next request: add both in this module.

mod connect;
mod continuation;
mod decision;
mod evidence;
mod history;
mod keys;
pub(crate) mod polled;
mod request_record;

pub use connect::{AddressOutcome, AddressTried, ConnectAttempts};
pub use continuation::OperationAttempt;
pub(crate) use continuation::{Continuation, HandedBack, PassEnd, Spent};
pub use decision::{AttemptDecision, RetryReason, StopReason};
pub(crate) use evidence::ProxyUsed;
pub use evidence::{FailureKind, NotProcessedProof, Redirects, RequestEvidence, Transmission};
pub(crate) use history::next_attempt;
pub use history::{AttemptHistory, AttemptRecord, Shared, SharedRole};
pub(crate) use keys::{AttemptClock, AttemptScope, Inward, earlier};
pub use keys::{Deadline, RetryIn, RetryOutcome};
pub(crate) use request_record::{RequestRecord, record_attempt_cut, record_rejected_locally};

use http::Extensions;

/// Whether a request is idempotent by its method (RFC 9110 §9.2.2) or carries an
/// `Idempotency-Key` header: [`retry::is_idempotent`](crate::retry::is_idempotent), defined
/// here for the transport step below the retry layer.
pub(crate) fn idempotent_request(method: &http::Method, headers: &http::HeaderMap) -> bool {
    idempotent_method(method) || headers.contains_key("idempotency-key")
}

/// Whether a request of this `method` is harmless to repeat by its method alone (RFC 9110
/// §9.2.2).
pub(crate) fn idempotent_method(method: &http::Method) -> bool {
    use http::Method;
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Removes what an earlier request left in `extensions`: its history, evidence, outcome,
/// a breaker's "retry in", an attempt's own cut (left by a retry whose attempt was dropped
/// with no breaker inside to take it), and a deadline a stage handed inward (a caller's
/// own [`Deadline`] stays).
pub(crate) fn clear_earlier_request(extensions: &mut Extensions) {
    // A fresh request's extensions (every `send()`) hold nothing to clear.
    if extensions.is_empty() {
        return;
    }
    Inward::clear(extensions);
    extensions.remove::<RequestRecord>();
    // Put there by the stack for a body it may resume (a caller's own stays).
    if extensions
        .get::<OperationAttempt>()
        .is_some_and(OperationAttempt::is_by_stack)
    {
        extensions.remove::<OperationAttempt>();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    fn scope_at(cut: Instant) -> AttemptScope {
        AttemptScope::cut_at(Some(cut))
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_handed_inward_is_one_record_that_ends_with_the_request() {
        let mut ext = Extensions::new();
        let deadline = Deadline(Instant::now() + Duration::from_secs(5));
        Inward::hand_on_deadline(&mut ext, deadline);
        for attempt in 1..=3u64 {
            let cut = Instant::now() + Duration::from_secs(attempt);
            Inward::set_attempt(&mut ext, scope_at(cut));
            assert_eq!(
                ext.len(),
                2,
                "the deadline and one record, attempt {attempt}"
            );
            let taken = Inward::take_attempt(&mut ext).map(|s| s.cut);
            assert_eq!(taken, Some(Some(cut)));
            assert!(Inward::take_attempt(&mut ext).is_none(), "taken once");
            assert_eq!(ext.get::<Deadline>(), Some(&deadline));
        }
        Inward::end(&mut ext);
        assert!(
            ext.get::<Deadline>().is_none() && RequestRecord::of(&ext).unwrap().inward.is_empty(),
            "the handed-on deadline ends with the request"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_is_the_attempt_timeouts_when_it_comes_no_later_than_the_deadline() {
        let s = Duration::from_secs;
        let now = Instant::now();
        let clock = |deadline: Option<Instant>| AttemptClock::start(s(2), deadline, now);
        assert!(clock(None).cut_by_timeout());
        assert!(clock(Some(now + s(3))).cut_by_timeout());
        // A tie: the attempt had its whole timeout.
        assert!(clock(Some(now + s(2))).cut_by_timeout());
        // The caller's deadline comes first: its cut, not the server's timeout.
        assert!(!clock(Some(now + s(1))).cut_by_timeout());
        // Restarted by a gate 2 s later: the timeout now ends past the deadline.
        let c = clock(Some(now + s(3)));
        c.restart(now + s(2));
        assert!(!c.cut_by_timeout());
        // Stopped (waiting locally): only the deadline cuts.
        let c = clock(None);
        c.stop();
        assert!(!c.cut_by_timeout());
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempts_scope_alone_leaves_nothing_once_taken() {
        let mut ext = Extensions::new();
        Inward::set_attempt(&mut ext, scope_at(Instant::now()));
        assert!(Inward::take_attempt(&mut ext).is_some());
        assert!(RequestRecord::of(&ext).unwrap().inward.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_owner_clears_a_stale_handed_on_deadline_and_keeps_a_callers_own() {
        let now = Instant::now();
        let handed = Deadline(now + Duration::from_secs(5));
        // A dropped request left its handed-on deadline and an attempt's scope.
        let mut stale = Extensions::new();
        Inward::hand_on_deadline(&mut stale, handed);
        Inward::set_attempt(&mut stale, scope_at(now));
        clear_earlier_request(&mut stale);
        assert!(stale.is_empty());
        // The caller replaced the deadline with its own since: that one stays.
        let mut replaced = Extensions::new();
        Inward::hand_on_deadline(&mut replaced, handed);
        let own = Deadline(now + Duration::from_secs(9));
        replaced.insert(own);
        clear_earlier_request(&mut replaced);
        assert_eq!(replaced.get::<Deadline>(), Some(&own));
        assert!(RequestRecord::of(&replaced).is_none());
    }
}
