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
//!
//! The loop also decides on a failure it did not see: a response body that broke after it
//! returned the head, or an operation's own step ([`Operation`](crate::retry::Operation)),
//! with the same table, delays, retry limit, budget and deadline as an attempt inside it,
//! counted in the request's [`Continuation`].

use std::time::Duration;

use http::{Extensions, Method, StatusCode};
use tokio::time::Instant;

use std::error::Error as StdError;

use super::config::{Config, RetryMiddleware};
use super::plan::{LoopState, Step, Unspent};
use super::report::{announce, report_decision};
use crate::record::{
    AttemptDecision, AttemptHistory, Continuation, Deadline, HandedBack, Inward, PassEnd,
    RequestEvidence, RetryReason, Spent, StopReason,
};
use crate::retry::{AttemptContext, RetryNotice, Verdict, Withdrawal, unsafe_retry};

/// A failure the retry loop did not see: what the decision after it reads.
pub(crate) struct ContinuedFailure<'a> {
    /// The attempt's evidence, as it ended (`BodyInterrupted`, or what the error says).
    pub(crate) evidence: RequestEvidence,
    /// The error it ended with.
    pub(crate) error: &'a (dyn StdError + 'static),
    /// The request's method (an operation's last request's; `GET` when none is known).
    pub(crate) method: &'a Method,
    /// The request's URL, when known.
    pub(crate) url: Option<&'a url::Url>,
}

impl ContinuedFailure<'_> {
    /// What the before-sleep hook is told about the retry after it.
    fn notice(&self, delay: Duration, reason: RetryReason) -> RetryNotice<'_> {
        RetryNotice {
            attempt: self.evidence.attempt,
            evidence: &self.evidence,
            error: Some(self.error),
            status: self.evidence.status(),
            delay,
            reason,
            method: self.method,
            url: self.url,
        }
    }
}

/// A retry decided after a failure outside the loop: wait `delay`, then count it with
/// [`RetryMiddleware::wait_continued`].
#[derive(Debug)]
pub(crate) struct ContinuedRetry {
    pub(crate) delay: Duration,
    reason: RetryReason,
    withdrawal: Option<Withdrawal>,
}

impl ContinuedRetry {
    /// The retry a pass handed back to the caller's loop (`HandedBack`).
    pub(crate) fn handed_back(h: HandedBack) -> Self {
        ContinuedRetry {
            delay: h.delay,
            reason: h.reason,
            withdrawal: h.budget_slot.map(Withdrawal::in_slot),
        }
    }
}

impl RetryMiddleware {
    /// Decides after `failure` (the failure of attempt `failure.evidence.attempt` of the
    /// request `continued` spans: the attempt whose head came back and whose body broke
    /// has its record in the history amended; a later number is a new record), as the loop
    /// decides after an attempt: the strategy's verdict (a retry that could repeat a
    /// request that may have been processed turned into a stop), the delay, the retry
    /// count, the deadline and the budget; the decision goes into the history, the metrics
    /// and, for a retry, the before-sleep hook.
    pub(crate) fn decide_continued(
        &self,
        continued: &Continuation,
        failure: ContinuedFailure<'_>,
    ) -> Result<ContinuedRetry, StopReason> {
        let c = &self.config;
        let mut spent = continued.lock();
        let state = loop_state(c, &spent);
        let evidence = &failure.evidence;
        // The operation's mark, else what every request it sent said; nothing sent and
        // nothing marked: not idempotent.
        let mut ctx = AttemptContext::new(evidence, failure.method);
        ctx.idempotent = spent.idempotent.or(spent.all_idempotent).unwrap_or(false);
        ctx.attempt = evidence.attempt;
        ctx.not_processed_retries = state.not_processed_retries;
        ctx.max_not_processed_retries = c.max_not_processed_retries;
        ctx.url = failure.url;
        ctx.error = Some(failure.error);
        let step = match c.strategy.decide(&ctx) {
            Verdict::Stop(reason) => Step::Stop(reason),
            verdict => match (verdict, unsafe_retry(&ctx)) {
                (_, Some(stop)) => Step::Stop(stop),
                (Verdict::RetryAfter(reason, delay), None) => c.plan_requested(
                    reason,
                    Some(delay),
                    evidence,
                    None,
                    true,
                    &state,
                    Instant::now(),
                ),
                (Verdict::Retry(reason), None) => {
                    c.plan_requested(reason, None, evidence, None, true, &state, Instant::now())
                }
                (other, None) => unreachable!("not a retry: {other:?}"),
            },
        };
        amend(&mut spent.history, evidence.clone());
        let origin = evidence.origin.as_ref();
        let decision = report_decision(&step, evidence.attempt, failure.method, origin);
        spent.history.decide_last(decision);
        drop(spent);
        match step {
            Step::Retry {
                delay,
                reason,
                withdrawal,
            } => {
                announce(c, &failure.notice(delay, reason));
                Ok(ContinuedRetry {
                    delay,
                    reason,
                    withdrawal,
                })
            }
            Step::Stop(reason) => Err(reason),
        }
    }

    /// Waits out `retry`'s delay, then counts it in `continued`.
    ///
    /// # Cancel safety
    ///
    /// Dropped during the wait, the retry is not counted and its budget goes back.
    pub(crate) async fn wait_continued(&self, continued: &Continuation, retry: ContinuedRetry) {
        let mut unspent = Unspent(self.config.budget.as_ref().zip(retry.withdrawal));
        tokio::time::sleep(retry.delay).await;
        unspent.0 = None;
        self.count_continued(continued, retry);
    }

    /// Counts `retry` in `continued`, as made (its wait is over, or the caller's loop
    /// waited it out): its budget is spent.
    pub(crate) fn count_continued(&self, continued: &Continuation, retry: ContinuedRetry) {
        let mut spent = continued.lock();
        // Counted as the loop counts (a `GOAWAY` rotation against the not-processed cap
        // it was allowed under, not the retry count): counted elsewhere, a rotation on
        // every stream never reached either cap.
        let mut state = loop_state(&self.config, &spent);
        state.count_retry(retry.reason, retry.delay);
        spent.retries = state.retries;
        spent.not_processed_retries = state.not_processed_retries;
        spent.previous_delay = state.previous_delay;
    }

    /// Gives back the budget of a retry decided and never made (a step loop dropped
    /// before its next attempt).
    pub(crate) fn give_back(&self, retry: ContinuedRetry) {
        drop(Unspent(self.config.budget.as_ref().zip(retry.withdrawal)));
    }

    /// Fixes what the passes of `continued` share before the first one: the retry limit
    /// (`max_retries`, else the configured one), the deadline (the configured total from
    /// now, unless `deadline`), the idempotency mark, and the request's deposit in the
    /// budget. `hand_back`: each pass makes one attempt and hands a retry back (`Steps`).
    pub(crate) fn begin_continued(
        &self,
        continued: &Continuation,
        max_retries: Option<u32>,
        deadline: Option<Instant>,
        idempotent: Option<bool>,
        hand_back: bool,
    ) {
        let c = &self.config;
        let mut spent = continued.lock();
        spent.hand_back = hand_back;
        spent.max_retries = Some(max_retries.unwrap_or_else(|| c.max_retries()));
        spent.deadline =
            deadline.or_else(|| c.deadline.and_then(|d| Instant::now().checked_add(d)));
        spent.idempotent = idempotent;
        if let Some(budget) = &c.budget
            && !std::mem::replace(&mut spent.deposited, true)
        {
            budget.deposit();
        }
    }
}

impl Continuation {
    /// Hands inward the deadline the earlier passes fixed, when the request has none of
    /// its own (then `true`: it ends with the pass). Before the loop works out its own.
    pub(in crate::retry) fn hand_on_deadline(&self, extensions: &mut Extensions) -> bool {
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
    /// history goes on from theirs; `hands_back` is set when the pass hands a retry back
    /// (`Steps`). Whether the pass still has to deposit in the budget.
    pub(in crate::retry) fn begin_pass(
        &self,
        state: &mut LoopState,
        idempotent: &mut bool,
        hands_back: &mut bool,
        req: &reqwest::Request,
        extensions: &mut Extensions,
    ) -> bool {
        let mut spent = self.lock();
        *hands_back = spent.hand_back;
        spent.method = Some(req.method().clone());
        spent.url = Some(req.url().clone());
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
        if !spent.history.is_empty() && AttemptHistory::of(extensions).is_none() {
            spent.history.clone().insert_into(extensions);
        }
        !std::mem::replace(&mut spent.deposited, true)
    }

    /// A pass ended after `state` with `stop`, returning a response with `status` (`None`:
    /// an error): its counts and history are the next pass's start.
    pub(in crate::retry) fn end_pass(
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
        if let Some(history) = AttemptHistory::of(extensions) {
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
        Continuation::of_request(extensions).map_or(0, |c| c.lock().history.len())
    }
}

/// The loop's state as the passes of a request left it.
fn loop_state(c: &Config, spent: &Spent) -> LoopState {
    LoopState {
        started_system: None,
        deadline: spent.deadline,
        max_retries: spent.max_retries.unwrap_or_else(|| c.max_retries()),
        retries: spent.retries,
        previous_delay: spent.previous_delay,
        attempt_timeout: None,
        hedges: spent.hedges,
        not_processed_retries: spent.not_processed_retries,
    }
}

/// Puts `evidence`'s transmission and failure on the record of its attempt (the last one,
/// when the numbers match: its head came back, then its body broke), else appends it.
fn amend(history: &mut AttemptHistory, evidence: RequestEvidence) {
    match history
        .last()
        .filter(|l| l.evidence.attempt == evidence.attempt)
    {
        Some(last) => {
            // What the transport step saw of the attempt stands; only its end changed.
            let mut amended = last.evidence.clone();
            amended.transmission = evidence.transmission;
            amended.failure = evidence.failure;
            history.replace_last(amended);
        }
        None => history.push(evidence),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backoff;
    use crate::record::{AttemptDecision, FailureKind, Transmission};
    use http::StatusCode;

    fn retry(max_retries: u32) -> RetryMiddleware {
        RetryMiddleware::builder()
            .max_retries(max_retries)
            .backoff(
                Backoff::builder()
                    .jitter(crate::Jitter::None)
                    .build()
                    .unwrap(),
            )
            .no_budget()
            .build()
            .unwrap()
    }

    const CUT: std::io::ErrorKind = std::io::ErrorKind::UnexpectedEof;

    fn cut_body<'a>(
        attempt: u32,
        error: &'a std::io::Error,
        method: &'a Method,
    ) -> ContinuedFailure<'a> {
        let mut evidence = RequestEvidence::new(
            Transmission::ResponseReceived(StatusCode::OK),
            None,
            attempt,
        );
        evidence.failure = Some(FailureKind::BodyInterrupted);
        ContinuedFailure {
            evidence,
            error,
            method,
            url: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_body_of_an_idempotent_request_is_retried_up_to_the_shared_limit() {
        let r = retry(2);
        let c = Continuation::default();
        r.begin_continued(&c, None, None, Some(true), false);
        let mut delays = Vec::new();
        for attempt in 1..=3 {
            let error = std::io::Error::from(CUT);
            match r.decide_continued(&c, cut_body(attempt, &error, &Method::GET)) {
                Ok(planned) => {
                    delays.push(planned.delay);
                    r.wait_continued(&c, planned).await;
                }
                Err(stop) => {
                    assert_eq!(attempt, 3);
                    assert_eq!(stop, StopReason::RetriesExhausted);
                }
            }
        }
        assert_eq!(delays, [Duration::from_secs(1), Duration::from_secs(2)]);
        let spent = c.lock();
        assert_eq!(spent.retries, 2);
        let decisions: Vec<_> = spent
            .history
            .attempts()
            .iter()
            .map(|r| r.decision.clone())
            .collect();
        assert_eq!(
            decisions,
            [
                Some(AttemptDecision::Retry {
                    delay: Duration::from_secs(1),
                    reason: RetryReason::BodyInterrupted
                }),
                Some(AttemptDecision::Retry {
                    delay: Duration::from_secs(2),
                    reason: RetryReason::BodyInterrupted
                }),
                Some(AttemptDecision::Stop {
                    reason: StopReason::RetriesExhausted
                }),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_body_of_a_request_not_known_idempotent_is_not_retried() {
        let r = retry(3);
        let c = Continuation::default();
        r.begin_continued(&c, None, None, None, false);
        let error = std::io::Error::from(CUT);
        let got = r
            .decide_continued(&c, cut_body(1, &error, &Method::GET))
            .map(|p| p.delay);
        assert_eq!(
            got,
            Err(StopReason::MayHaveBeenProcessed),
            "nothing said it was idempotent"
        );
        c.lock().idempotent = Some(true);
        let got = r
            .decide_continued(&c, cut_body(1, &error, &Method::POST))
            .map(|p| p.delay);
        assert_eq!(got, Ok(Duration::from_secs(1)), "marked idempotent");
        assert_eq!(
            c.lock().history.len(),
            1,
            "the same attempt's record, amended"
        );
    }
}
