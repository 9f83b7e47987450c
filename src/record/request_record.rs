//! [`RequestRecord`]: everything the stages leave in one `http::Extensions` for one
//! request, in one extension (one allocation, however many stages and attempts).

use http::Extensions;

use super::evidence::RequestEvidence;
use super::history::AttemptHistory;
use super::keys::{Inward, RetryIn, RetryOutcome};

/// What the stages of this crate leave in one `http::Extensions` (the caller's, or a
/// response's) for one request: one extension, read through the public types' `of`
/// accessors (see the [module docs](super)).
#[derive(Clone, Default)]
pub(crate) struct RequestRecord {
    /// The last attempt's evidence (the transport step's, or a local rejection's).
    pub(crate) evidence: Option<RequestEvidence>,
    /// Every attempt so far (on a response: only after more than one attempt).
    pub(crate) history: Option<AttemptHistory>,
    /// What the retry middleware did.
    pub(crate) outcome: Option<RetryOutcome>,
    /// How long until an open breaker or a pause may admit the request.
    pub(crate) retry_in: Option<RetryIn>,
    /// What the retry middleware hands the stages inside it (crate-private).
    pub(crate) inward: Inward,
}

impl RequestRecord {
    /// The record in `extensions`, if a stage left one.
    pub(crate) fn of(extensions: &Extensions) -> Option<&RequestRecord> {
        extensions.get::<RequestRecord>()
    }

    /// The record in `extensions`, if a stage left one, to change.
    pub(crate) fn of_mut(extensions: &mut Extensions) -> Option<&mut RequestRecord> {
        extensions.get_mut::<RequestRecord>()
    }

    /// The record in `extensions`, made (empty) when there is none yet.
    pub(crate) fn get(extensions: &mut Extensions) -> &mut RequestRecord {
        extensions.get_or_insert_default::<RequestRecord>()
    }

    /// The attempt history, made (empty) when there is none yet.
    pub(crate) fn history_mut(extensions: &mut Extensions) -> &mut AttemptHistory {
        RequestRecord::get(extensions)
            .history
            .get_or_insert_with(AttemptHistory::default)
    }

    /// The number of attempts recorded so far.
    pub(crate) fn attempts_recorded(extensions: &Extensions) -> usize {
        AttemptHistory::of(extensions).map_or(0, AttemptHistory::len)
    }

    /// Leaves `evidence` as the last attempt's.
    pub(crate) fn set_evidence(extensions: &mut Extensions, evidence: RequestEvidence) {
        RequestRecord::get(extensions).evidence = Some(evidence);
    }

    /// Removes the last attempt's evidence, and returns it.
    pub(crate) fn take_evidence(extensions: &mut Extensions) -> Option<RequestEvidence> {
        RequestRecord::of_mut(extensions)?.evidence.take()
    }

    /// Removes the attempt history, and returns it.
    pub(crate) fn take_history(extensions: &mut Extensions) -> Option<AttemptHistory> {
        RequestRecord::of_mut(extensions)?.history.take()
    }
}

impl RequestEvidence {
    /// The last attempt's evidence in `extensions` (the caller's, after
    /// `execute_with_extensions`, or those a middleware outside the transport step is
    /// handed): what `extensions.get::<RequestEvidence>()` returned before the record.
    pub fn of(extensions: &Extensions) -> Option<&RequestEvidence> {
        RequestRecord::of(extensions)?.evidence.as_ref()
    }

    /// The evidence of the attempt that produced `response`.
    pub fn of_response(response: &reqwest::Response) -> Option<&RequestEvidence> {
        RequestEvidence::of(response.extensions())
    }

    /// Leaves this evidence in `extensions` as the last attempt's, where
    /// [`of`](Self::of) and the middlewares outside read it: for a transport step of
    /// one's own (a test double, say).
    pub fn insert_into(self, extensions: &mut Extensions) {
        RequestRecord::set_evidence(extensions, self);
    }
}

impl AttemptHistory {
    /// The attempt history in `extensions` (the caller's, after
    /// `execute_with_extensions`): what `extensions.get::<AttemptHistory>()` returned
    /// before the record. A `send()` caller reads it with
    /// [`of_response`](Self::of_response).
    pub fn of(extensions: &Extensions) -> Option<&AttemptHistory> {
        RequestRecord::of(extensions)?.history.as_ref()
    }

    /// Leaves this history in `extensions`, replacing any there.
    pub fn insert_into(self, extensions: &mut Extensions) {
        RequestRecord::get(extensions).history = Some(self);
    }

    /// Removes the history from `extensions`, and returns it.
    pub fn take_from(extensions: &mut Extensions) -> Option<AttemptHistory> {
        RequestRecord::take_history(extensions)
    }
}

impl RetryOutcome {
    /// What the retry middleware did, in `extensions` (the caller's, after
    /// `execute_with_extensions`): what `extensions.get::<RetryOutcome>()` returned
    /// before the record.
    pub fn of(extensions: &Extensions) -> Option<&RetryOutcome> {
        RequestRecord::of(extensions)?.outcome.as_ref()
    }

    /// What the retry middleware did for the request that produced `response`.
    pub fn of_response(response: &reqwest::Response) -> Option<&RetryOutcome> {
        RetryOutcome::of(response.extensions())
    }

    /// Leaves this outcome in `extensions`, replacing any there.
    pub fn insert_into(self, extensions: &mut Extensions) {
        RequestRecord::get(extensions).outcome = Some(self);
    }
}

impl RetryIn {
    /// How long until trying again may succeed, left in `extensions` by a breaker or a
    /// pause that turned the request away: what `extensions.get::<RetryIn>()` returned
    /// before the record.
    pub fn of(extensions: &Extensions) -> Option<&RetryIn> {
        RequestRecord::of(extensions)?.retry_in.as_ref()
    }

    /// Leaves this in `extensions`, where a retry middleware outside reads it with
    /// [`of`](Self::of).
    pub fn insert_into(self, extensions: &mut Extensions) {
        RequestRecord::get(extensions).retry_in = Some(self);
    }

    /// Removes it from `extensions`.
    pub(crate) fn remove_from(extensions: &mut Extensions) {
        if let Some(record) = RequestRecord::of_mut(extensions) {
            record.retry_in = None;
        }
    }
}
