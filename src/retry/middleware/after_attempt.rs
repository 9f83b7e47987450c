//! The decision after an attempt: the attempt's evidence (the transport step's, or one
//! made up when nothing inside left a record), the strategy's verdict with the crate's
//! promise enforced ([`unsafe_retry`]), the planner's delay for a retry, and the
//! decision's report.

use std::error::Error as StdError;
use std::time::Duration;

use http::Extensions;
use reqwest::Response;
use tokio::time::Instant;

use super::config::Config;
use super::plan::{LoopState, Step};
use super::report::{announce, report_decision};
use crate::error::ResilienceError;
use crate::misconfig::{self, Misconfiguration};
use crate::record::{RequestEvidence, StopReason};
use crate::retry::fallback::fallback_evidence;
use crate::retry::{AttemptContext, ResponseHead, RetryNotice, Verdict, unsafe_retry};

/// What the strategy is asked with about a request, besides the attempt itself.
#[derive(Clone, Copy)]
pub(super) struct Question<'a> {
    pub(super) config: &'a Config,
    pub(super) method: &'a http::Method,
    /// The request's URL (`None` only when it could not be kept: see `RequestRun::last_url`).
    pub(super) url: Option<&'a url::Url>,
    pub(super) idempotent: bool,
    pub(super) not_processed_retries: u32,
}

impl Question<'_> {
    /// The strategy's verdict on an attempt, a retry that could repeat a request that may
    /// have been processed turned into a stop ([`unsafe_retry`]): the promise holds for
    /// every strategy.
    #[inline]
    pub(super) fn verdict(
        &self,
        evidence: &RequestEvidence,
        result: &reqwest_middleware::Result<Response>,
        attempt: u32,
    ) -> Verdict {
        let ctx = AttemptContext {
            evidence,
            method: self.method,
            url: self.url,
            idempotent: self.idempotent,
            attempt,
            not_processed_retries: self.not_processed_retries,
            max_not_processed_retries: self.config.max_not_processed_retries,
            error: result
                .as_ref()
                .err()
                .map(|e| e as &(dyn StdError + 'static)),
            response: result
                .as_ref()
                .ok()
                .map(|r| ResponseHead::new(r.status(), r.headers())),
        };
        let verdict = self.config.strategy.decide(&ctx);
        match verdict {
            Verdict::Retry(_) | Verdict::RetryAfter(..) => {
                unsafe_retry(&ctx).map_or(verdict, Verdict::Stop)
            }
            Verdict::Stop(_) => verdict,
        }
    }
}

/// What the decision after an attempt needs besides the attempt itself.
pub(super) struct Decision<'a> {
    pub(super) question: Question<'a>,
    /// The history's length before the attempt.
    pub(super) recorded_before: usize,
    /// Whether the stack installed the transport step (then an attempt without evidence
    /// was answered by a per-attempt middleware, e.g. a cache: nothing to report).
    pub(super) transport_installed: bool,
}

impl Decision<'_> {
    /// The step after attempt number `attempt`, written into the history (and the
    /// metrics): the attempt's evidence (the transport step's, or one made up when nothing
    /// inside left a record), the strategy's verdict, and for a retry its delay and the
    /// budget's withdrawal.
    // Inlined: one call per attempt, and as a call it costs every request about 70
    // instructions of argument passing (`benches/instructions.rs`).
    #[inline(always)]
    pub(super) fn decide(
        &self,
        result: &reqwest_middleware::Result<Response>,
        extensions: &mut Extensions,
        attempt: u32,
        can_replay: bool,
        state: &LoopState,
    ) -> Step {
        let c = self.question.config;
        // An attempt timeout's cut is an ordinary failed attempt; the deadline's is the end.
        let timed_out = state.deadline.is_some_and(|d| cut_inside(result, d));
        // Read in place: the attempt's evidence is stored once, in the request's record.
        let kept = crate::record::RequestRecord::get(extensions);
        let made_up = match kept.evidence() {
            Some(_) => None,
            None => Some(fallback(result, attempt, self.transport_installed)),
        };
        // So that the decision below lands on this attempt.
        kept.record_unrecorded(self.recorded_before, made_up.as_ref());
        let record = &*kept;
        let Some(evidence) = made_up.as_ref().or(record.evidence()) else {
            unreachable!("made up when the record has none")
        };
        let history = record
            .history
            .as_ref()
            .expect("pushed to above, if not before");
        let proxies_spent = c.proxy_timeouts_spent(evidence, history);
        let verdict = self.question.verdict(evidence, result, attempt);
        let (reason, requested) = match verdict {
            // The deadline passed during the attempt: no time is left for another.
            _ if timed_out => (Err(StopReason::DeadlineExceeded), None),
            Verdict::Retry(_) | Verdict::RetryAfter(..) if proxies_spent => {
                (Err(StopReason::ConnectTimedOut), None)
            }
            Verdict::Retry(reason) => (Ok(reason), None),
            Verdict::RetryAfter(reason, delay) => (Ok(reason), Some(delay)),
            Verdict::Stop(reason) => (Err(reason), None),
        };
        let step = match reason {
            Err(reason) => Step::Stop(reason),
            Ok(reason) => c.plan_requested(
                reason,
                requested,
                evidence,
                retry_in(result),
                can_replay,
                state,
                Instant::now(),
            ),
        };
        let method = self.question.method;
        let decision = report_decision(&step, attempt, method, evidence.origin.as_ref());
        if let Step::Retry { delay, reason, .. } = step {
            let notice = RetryNotice {
                attempt,
                evidence,
                error: result
                    .as_ref()
                    .err()
                    .map(|e| e as &(dyn StdError + 'static)),
                status: evidence.status(),
                delay,
                reason,
                method,
                url: self.question.url,
            };
            announce(c, &notice);
        }
        if let Some(history) = kept.history.as_mut() {
            history.decide_last(decision);
        }
        step
    }
}

/// The evidence of an attempt nothing inside left a record of: made up from its result.
#[cold]
fn fallback(
    result: &reqwest_middleware::Result<Response>,
    attempt: u32,
    transport_installed: bool,
) -> RequestEvidence {
    // A response or a reqwest error without evidence means no transport step, unless the
    // stack installed one (a per-attempt middleware answered itself); a middleware error
    // may just come from one inside (a token).
    if !transport_installed && !matches!(result, Err(reqwest_middleware::Error::Middleware(_))) {
        misconfig::report_once(Misconfiguration::NoTransportEvidence);
    }
    fallback_evidence(result, attempt)
}

/// The "retry in" an error from inside (the breaker's rejection) carries.
fn retry_in(result: &reqwest_middleware::Result<Response>) -> Option<Duration> {
    result
        .as_ref()
        .err()
        .and_then(ResilienceError::from_middleware_error)
        .and_then(ResilienceError::retry_in)
}

/// Whether a middleware inside (the circuit breaker) cut the attempt at this same
/// deadline. It fires first when both timers are due, being polled inside this one's
/// future, and then leaves what this middleware's own cut would: the `Unknown`/`Timeout`
/// evidence and an [`Elapsed`](tokio::time::error::Elapsed) error.
fn cut_inside(result: &reqwest_middleware::Result<Response>, deadline: Instant) -> bool {
    matches!(
        result,
        Err(reqwest_middleware::Error::Middleware(e))
            if e.is::<tokio::time::error::Elapsed>()
    ) && Instant::now() >= deadline
}
