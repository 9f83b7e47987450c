//! One logical request over several passes through the retry loop: an operation run again
//! ([`Operation`](super::Operation)), a response body resumed
//! ([`Resilience::resume_bodies`](crate::Resilience::resume_bodies)).
//!
//! Each pass is a request of its own through the stack, so without this each would get a
//! fresh attempt count, deposit in the budget again and start the backoff over: an
//! operation retried 3 times around a middleware retrying 3 times would make 16 attempts.
//! The passes share a [`Continuation`] instead, handed to the retry loop in the request's
//! extensions (inside an [`OperationAttempt`](super::OperationAttempt)): the loop starts
//! from the counts the earlier passes left (retries, not-processed retries, hedges, the
//! last delay), under the first pass's retry limit and deadline, deposits in the budget
//! once for the whole request, continues the [`AttemptHistory`] (so attempt numbers go on
//! from the last one), and leaves its counts and how it ended for the next pass.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http::{Extensions, Method, StatusCode};
use tokio::time::Instant;

use super::middleware::LoopState;
use crate::record::{AttemptDecision, AttemptHistory, Deadline, Inward, StopReason};

/// What the passes of one logical request share (cheap to clone: one `Arc`).
#[derive(Clone, Default)]
pub(crate) struct Continuation(Arc<Mutex<Spent>>);

/// What the passes so far spent, and how the last one ended.
#[derive(Default)]
pub(crate) struct Spent {
    pub(crate) retries: u32,
    pub(crate) not_processed_retries: u32,
    pub(crate) hedges: u32,
    pub(crate) previous_delay: Option<Duration>,
    /// Fixed by the first pass (or the operation): every pass retries under it.
    pub(crate) max_retries: Option<u32>,
    /// Fixed by the first pass (or the operation).
    pub(crate) deadline: Option<Instant>,
    /// The operation's own mark (`Operation::idempotent`), for every request in it.
    pub(crate) idempotent: Option<bool>,
    /// Whether every request a pass sent so far was idempotent (`None`: none was sent).
    pub(crate) all_idempotent: Option<bool>,
    /// Whether the request's deposit in the retry budget was made.
    pub(crate) deposited: bool,
    pub(crate) history: AttemptHistory,
    /// How the last pass through the retry loop ended.
    pub(crate) last: Option<PassEnd>,
    /// The method of the last pass's request.
    pub(crate) method: Option<Method>,
}

/// How a pass through the retry loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PassEnd {
    /// Why the loop stopped.
    pub(crate) stop: StopReason,
    /// The status of the response it returned (`None`: it returned an error).
    pub(crate) status: Option<StatusCode>,
}

impl Spent {
    /// Attempts made so far, over every pass.
    pub(crate) fn attempts(&self) -> u32 {
        self.retries + self.not_processed_retries + self.hedges
    }
}

impl Continuation {
    /// The shared state, locked. Never held across an `.await`; a panic while it was held
    /// leaves counts that are still counts, so a poisoned lock is used as it is.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Spent> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands inward the deadline the earlier passes fixed, when the request has none of
    /// its own (then `true`: it ends with the pass). Before the loop works out its own.
    pub(super) fn hand_on_deadline(&self, extensions: &mut Extensions) -> bool {
        let fixed = self.lock().deadline;
        match fixed {
            Some(fixed) if extensions.get::<Deadline>().is_none() => {
                Inward::hand_on_deadline(extensions, Deadline(fixed));
                true
            }
            _ => false,
        }
    }

    /// A pass begins with `state` (as the loop set it up from its own configuration) and
    /// `idempotent` (as the request says): both continue from the earlier passes, and the
    /// history goes on from theirs. Whether the pass still has to deposit in the budget.
    pub(super) fn begin_pass(
        &self,
        state: &mut LoopState,
        idempotent: &mut bool,
        method: &Method,
        extensions: &mut Extensions,
    ) -> bool {
        let mut spent = self.lock();
        spent.method = Some(method.clone());
        state.retries = spent.retries;
        state.not_processed_retries = spent.not_processed_retries;
        state.hedges = spent.hedges;
        state.previous_delay = spent.previous_delay;
        state.max_retries = *spent.max_retries.get_or_insert(state.max_retries);
        if spent.deadline.is_none() {
            spent.deadline = state.deadline;
        }
        if let Some(marked) = spent.idempotent {
            *idempotent = marked;
        }
        spent.all_idempotent = Some(spent.all_idempotent.unwrap_or(true) && *idempotent);
        if !spent.history.is_empty() && extensions.get::<AttemptHistory>().is_none() {
            extensions.insert(spent.history.clone());
        }
        !std::mem::replace(&mut spent.deposited, true)
    }

    /// A pass ended after `state` with `stop`, returning a response with `status` (`None`:
    /// an error): its counts and history are the next pass's start.
    pub(super) fn end_pass(
        &self,
        state: &LoopState,
        stop: StopReason,
        status: Option<StatusCode>,
        extensions: &Extensions,
    ) {
        let mut spent = self.lock();
        spent.retries = state.retries;
        spent.not_processed_retries = state.not_processed_retries;
        spent.hedges = state.hedges;
        spent.previous_delay = state.previous_delay;
        if let Some(history) = extensions.get::<AttemptHistory>() {
            spent.history = history.clone();
            // The loop's own stop is on the record (as it is on a response's history).
            if history.last().is_some_and(|l| l.decision.is_none()) {
                spent
                    .history
                    .decide_last(AttemptDecision::Stop { reason: stop });
            }
        }
        spent.last = Some(PassEnd { stop, status });
    }

    /// How many records the earlier passes left in the history (the observer outside the
    /// retry loop reports only the ones after them).
    pub(crate) fn recorded(extensions: &Extensions) -> usize {
        extensions
            .get::<super::OperationAttempt>()
            .map_or(0, |a| a.continuation().lock().history.len())
    }
}
