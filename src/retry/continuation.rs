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

use http::{Extensions, Method, StatusCode};

use super::middleware::LoopState;
use crate::record::{
    AttemptDecision, AttemptHistory, Continuation, Deadline, Inward, PassEnd, StopReason,
};

impl Continuation {
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
        super::OperationAttempt::continuation_in(extensions).map_or(0, |c| c.lock().history.len())
    }
}
