//! [`RequestRecord`]: everything the stages leave in one `http::Extensions` for one
//! request, in one extension (one allocation, however many stages and attempts).

use http::Extensions;

use std::time::Duration;

use super::decision::AttemptDecision;
use super::evidence::{FailureKind, RequestEvidence};
use super::history::{AttemptHistory, next_attempt};
use super::keys::{AttemptClock, AttemptScope, Deadline, Inward, RetryIn, RetryOutcome};
use crate::origin::Origin;

/// What the stages of this crate leave in one `http::Extensions` (the caller's, or a
/// response's) for one request: one extension, read through the public types' `of`
/// accessors (see the [module docs](super)).
#[derive(Clone, Default)]
pub(crate) struct RequestRecord {
    /// Where the last attempt's evidence is (the transport step's, or a local
    /// rejection's): read with [`evidence`](Self::evidence).
    last: LastEvidence,
    /// Every attempt so far (on a response: only after more than one attempt).
    pub(crate) history: Option<AttemptHistory>,
    /// What the retry middleware did.
    pub(crate) outcome: Option<RetryOutcome>,
    /// How long until an open breaker or a pause may admit the request.
    pub(crate) retry_in: Option<RetryIn>,
    /// What the retry middleware hands the stages inside it (crate-private).
    pub(crate) inward: Inward,
    /// Whether a transport step's attempt is on the wire, not yet concluded: a cut now
    /// cut it (even after an earlier answer in the same attempt, the `401` before
    /// `BearerAuth`'s replay), so the cut is that attempt's record.
    on_wire: bool,
}

/// Where a record keeps the last attempt's evidence. An attempt the record's history
/// holds is stored once, there: the evidence is that history's last attempt.
#[derive(Clone, Default)]
enum LastEvidence {
    /// None yet, or taken before the next attempt (so a stale one is never read as it).
    #[default]
    None,
    /// The history's last attempt ([`RequestRecord::keep_attempt`]).
    InHistory,
    /// Its own: an attempt the history does not end with (a hedged race's winner, a
    /// caller's own transport step, a response's single attempt).
    Own(RequestEvidence),
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

    /// A response's record after one attempt: its evidence.
    pub(crate) fn of_attempt(evidence: RequestEvidence) -> Self {
        RequestRecord {
            last: LastEvidence::Own(evidence),
            ..RequestRecord::default()
        }
    }

    /// A response's record after more than one attempt: the history, which ends with the
    /// attempt that produced the response.
    pub(crate) fn of_history(history: AttemptHistory) -> Self {
        RequestRecord {
            last: LastEvidence::InHistory,
            history: Some(history),
            ..RequestRecord::default()
        }
    }

    /// The record's parts other than the attempts (a hedge's start).
    pub(crate) fn without_attempts(
        outcome: Option<RetryOutcome>,
        retry_in: Option<RetryIn>,
        inward: Inward,
    ) -> Self {
        RequestRecord {
            last: LastEvidence::None,
            history: None,
            outcome,
            retry_in,
            inward,
            on_wire: false,
        }
    }

    /// The last attempt's evidence, if one was left.
    pub(crate) fn evidence(&self) -> Option<&RequestEvidence> {
        match &self.last {
            LastEvidence::None => None,
            LastEvidence::InHistory => self.history.as_ref()?.last().map(|r| &r.evidence),
            LastEvidence::Own(evidence) => Some(evidence),
        }
    }

    /// The last attempt's evidence, to change (in the history too when it is there).
    pub(crate) fn evidence_mut(&mut self) -> Option<&mut RequestEvidence> {
        match &mut self.last {
            LastEvidence::None => None,
            LastEvidence::InHistory => self.history.as_mut()?.last_mut().map(|r| &mut r.evidence),
            LastEvidence::Own(evidence) => Some(evidence),
        }
    }

    /// Appends an attempt to the history, its evidence the last attempt's: stored once.
    /// The attempt is no longer on the wire.
    pub(crate) fn keep_attempt(&mut self, evidence: RequestEvidence) -> &mut AttemptHistory {
        self.on_wire = false;
        let history = self.history.get_or_insert_with(AttemptHistory::default);
        history.push(evidence);
        self.last = LastEvidence::InHistory;
        history
    }

    /// A transport step sends an attempt: it is on the wire until its record is kept.
    /// Returns the number of attempts recorded before it. Without a record yet nothing is
    /// marked: nothing was recorded that a cut could be mistaken for.
    pub(crate) fn begin_send(extensions: &mut Extensions) -> usize {
        let Some(record) = RequestRecord::of_mut(extensions) else {
            return 0;
        };
        record.on_wire = true;
        record.history.as_ref().map_or(0, AttemptHistory::len)
    }

    /// The attempt a transport step sent ended without a record of its own (a stage
    /// inside refused it and left its evidence).
    pub(crate) fn end_send(extensions: &mut Extensions) {
        if let Some(record) = RequestRecord::of_mut(extensions) {
            record.on_wire = false;
        }
    }

    /// Whether an attempt was on the wire, not concluded (its cut is then its record);
    /// it no longer is.
    pub(crate) fn take_on_wire(&mut self) -> bool {
        std::mem::take(&mut self.on_wire)
    }

    /// Gives the attempt after `recorded_before` attempts a record in the history when it
    /// has none: a local rejection (breaker, pause) or a missing transport step left
    /// none, and an attempt cut on the wire after an earlier answer (a `401` replay) left
    /// only that answer's. The record is the last evidence, or `made_up` when there is
    /// none; the last evidence stays what it was.
    pub(crate) fn record_unrecorded(
        &mut self,
        recorded_before: usize,
        made_up: Option<&RequestEvidence>,
    ) {
        let unrecorded = self.history.as_ref().map_or(0, AttemptHistory::len) == recorded_before;
        if !(self.take_on_wire() || unrecorded) {
            return;
        }
        let Some(evidence) = made_up.or(self.evidence()).cloned() else {
            return;
        };
        self.detach_evidence();
        self.history
            .get_or_insert_with(AttemptHistory::default)
            .push(evidence);
    }

    /// Leaves `evidence` as the last attempt's, apart from the history.
    pub(crate) fn set_own_evidence(&mut self, evidence: RequestEvidence) {
        self.last = LastEvidence::Own(evidence);
    }

    /// Gives the evidence kept in the history a place of its own, before the history
    /// is replaced or taken: the evidence stays what it was.
    fn detach_evidence(&mut self) {
        if let LastEvidence::InHistory = self.last {
            self.last = match self.history.as_ref().and_then(AttemptHistory::last) {
                Some(last) => LastEvidence::Own(last.evidence.clone()),
                None => LastEvidence::None,
            };
        }
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
        RequestRecord::get(extensions).set_own_evidence(evidence);
    }

    /// Forgets the last attempt's evidence (the history keeps its attempts), so that it
    /// is not read as the next attempt's.
    pub(crate) fn clear_evidence(extensions: &mut Extensions) {
        if let Some(record) = RequestRecord::of_mut(extensions) {
            record.last = LastEvidence::None;
        }
    }

    /// Removes the attempt history, and returns it (the last evidence stays).
    pub(crate) fn take_history(extensions: &mut Extensions) -> Option<AttemptHistory> {
        let record = RequestRecord::of_mut(extensions)?;
        record.detach_evidence();
        record.history.take()
    }
}

impl RequestEvidence {
    /// The last attempt's evidence in `extensions` (the caller's, after
    /// `execute_with_extensions`, or those a middleware outside the transport step is
    /// handed): what `extensions.get::<RequestEvidence>()` returned before the record.
    pub fn of(extensions: &Extensions) -> Option<&RequestEvidence> {
        RequestRecord::of(extensions)?.evidence()
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
        let record = RequestRecord::get(extensions);
        record.detach_evidence();
        record.history = Some(self);
    }

    /// The history of the logical request that produced `response`, for a caller that
    /// used `send()` (its extensions were not its own to read).
    ///
    /// Cost on the success path: none. A response after one attempt carries its
    /// [`RequestEvidence`] and [`RetryOutcome`](crate::retry::RetryOutcome) anyway, and
    /// the one record is rebuilt from them here, on demand. After a retry (or a `401`
    /// replayed by `BearerAuth`) the transport step puts a copy of the history on each
    /// response it hands back, a cost of the retry path only; the final decision comes
    /// from the `RetryOutcome`. `None` when no
    /// [`TransportEvidence`](crate::evidence::TransportEvidence) saw the request.
    pub fn of_response(response: &reqwest::Response) -> Option<AttemptHistory> {
        let record = RequestRecord::of(response.extensions())?;
        let outcome = record.outcome.as_ref();
        let mut history = match &record.history {
            Some(full) => full.clone(),
            None => {
                let mut one = AttemptHistory::default();
                one.push(record.evidence()?.clone());
                one
            }
        };
        // The retry middleware decided after the last attempt; its outcome says how.
        if let (Some(outcome), Some(last)) = (outcome, history.last())
            && last.decision.is_none()
        {
            history.decide_last(AttemptDecision::Stop {
                reason: outcome.stop,
            });
        }
        Some(history)
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

impl Inward {
    /// Puts `deadline` in the extensions for the stages inside, marked as handed on.
    pub(crate) fn hand_on_deadline(extensions: &mut Extensions, deadline: Deadline) {
        extensions.insert(deadline);
        RequestRecord::get(extensions).inward.handed_on = Some(deadline);
    }

    /// Ends what the retry middleware handed inward for its request, and the deadline
    /// [`hand_on_deadline`](Self::hand_on_deadline) put there.
    pub(crate) fn end(extensions: &mut Extensions) {
        let Some(record) = RequestRecord::of_mut(extensions) else {
            return;
        };
        if std::mem::take(&mut record.inward).handed_on.is_some() {
            extensions.remove::<Deadline>();
        }
    }

    /// Hands the next attempt its scope.
    pub(crate) fn set_attempt(extensions: &mut Extensions, scope: AttemptScope) {
        RequestRecord::get(extensions).inward.attempt = Some(scope);
    }

    /// Takes the attempt's scope (the breaker does, so it never outlives the attempt).
    /// The attempt's clock stays, for the gates further in.
    pub(crate) fn take_attempt(extensions: &mut Extensions) -> Option<AttemptScope> {
        RequestRecord::of_mut(extensions)?.inward.attempt.take()
    }

    /// Keeps the request's attempt timeout for each of its attempts (`None`: none).
    pub(crate) fn set_attempt_timeout(extensions: &mut Extensions, timeout: Option<Duration>) {
        if let Some(timeout) = timeout {
            RequestRecord::get(extensions).inward.attempt_timeout = Some(timeout);
        }
    }

    /// The request's attempt timeout, as the retry middleware kept it.
    pub(crate) fn attempt_timeout(extensions: &Extensions) -> Option<Duration> {
        RequestRecord::of(extensions)?.inward.attempt_timeout
    }

    /// Hands the next attempt its timeout clock.
    pub(crate) fn set_clock(extensions: &mut Extensions, clock: AttemptClock) {
        RequestRecord::get(extensions).inward.clock = Some(clock);
    }

    /// The current attempt's timeout clock, if it has one.
    pub(crate) fn clock(extensions: &Extensions) -> Option<AttemptClock> {
        RequestRecord::of(extensions)?.inward.clock.clone()
    }

    /// Ends the attempt: its scope and its clock.
    pub(crate) fn end_attempt(extensions: &mut Extensions) {
        if let Some(record) = RequestRecord::of_mut(extensions) {
            record.inward.attempt = None;
            record.inward.clock = None;
        }
    }

    /// Whether nothing is handed inward.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.handed_on.is_none()
            && self.attempt.is_none()
            && self.attempt_timeout.is_none()
            && self.clock.is_none()
    }

    /// Removes what the stack handed inward for the request of an earlier `Extensions`'
    /// owner: the handed-on deadline (when it is still the one in the extensions) and an
    /// attempt's scope.
    pub(super) fn clear(extensions: &mut Extensions) {
        let Some(record) = RequestRecord::of_mut(extensions) else {
            return;
        };
        if let Inward {
            handed_on: Some(stale),
            ..
        } = std::mem::take(&mut record.inward)
            && extensions.get::<Deadline>() == Some(&stale)
        {
            extensions.remove::<Deadline>();
        }
    }
}

/// Leaves the `NotSent` evidence of an attempt rejected locally (breaker open, paused, no
/// bearer token) where the breaker, the retry middleware and the caller look: appended to
/// the [`AttemptHistory`] and in the extensions. `retry_after` is when another attempt
/// could be admitted.
pub(crate) fn record_rejected_locally(
    extensions: &mut Extensions,
    kind: FailureKind,
    origin: Option<Origin>,
    retry_after: Option<Duration>,
) {
    let record = RequestRecord::get(extensions);
    let recorded = record.history.as_ref().map_or(0, AttemptHistory::len);
    let mut evidence = RequestEvidence::rejected_locally(kind, origin, next_attempt(recorded));
    evidence.retry_after = retry_after;
    record.keep_attempt(evidence);
}

/// Leaves the evidence of an attempt cut at its deadline or its attempt timeout (by the
/// breaker or the concurrency limit), as the retry middleware writes its own cut:
/// `Unknown` (the request may have reached the server), `Timeout`. Appended to the
/// history only when nothing inside recorded this attempt, so it is never counted twice
/// (a stage outside sees the record and adds none).
pub(crate) fn record_attempt_cut(
    extensions: &mut Extensions,
    origin: &Origin,
    recorded_before: usize,
    started: tokio::time::Instant,
) {
    let mut evidence = RequestEvidence::cut_at_deadline(
        Some(origin.clone()),
        next_attempt(recorded_before),
        started,
    );
    // Through a proxy of a pool: the cut attempt keeps it (taken out either way, so it is
    // never read as a later attempt's).
    super::ProxyUsed::carry_into_cut(extensions, &mut evidence);
    let record = RequestRecord::get(extensions);
    let on_wire = record.take_on_wire();
    if !on_wire && record.history.as_ref().map_or(0, AttemptHistory::len) != recorded_before {
        // The transport step finished (and left in the extensions) its record, and a
        // middleware between it and this one was still working (not sending): that
        // record stands.
        return;
    }
    record.keep_attempt(evidence);
}
