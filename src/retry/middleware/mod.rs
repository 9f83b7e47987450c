//! [`RetryMiddleware`]: the retry loop (mechanism), separate from the decision
//! ([`RetryStrategy`](crate::retry::RetryStrategy)) and the arithmetic
//! ([`Backoff`](crate::Backoff), [`RetryBudget`]).

use std::error::Error as StdError;
use std::time::{Duration, SystemTime};

use crate::stage::{Handover, RestOfStack, Stage, standalone_middleware};
use http::Extensions;
use reqwest::{Request, Response};
use tokio::time::Instant;

use super::attempt_timeout::{self, attempt_cut};
use super::fallback::fallback_evidence;
use super::hedge::{Hedging, RoundSpec};
use super::notice::RetryNotice;
use super::{
    AttemptContext, Idempotent, MaxRetries, ResponseHead, RetryBudget, Verdict, Withdrawal,
    is_idempotent, unsafe_retry,
};
use crate::error::ResilienceError;
use crate::misconfig::{self, Misconfiguration};
use crate::origin::Origin;
use crate::record::Continuation;
use crate::record::{
    AttemptHistory, AttemptScope, Deadline, FailureKind, Inward, RequestEvidence, RetryReason,
    StopReason,
};

mod config;
mod report;
use config::Config;
pub(in crate::retry) use config::Delays;
pub use config::{RetryAfterPolicy, RetryMiddleware, RetryMiddlewareBuilder};
use report::{announce, finish, record};

/// A retry taken from the budget, given back when dropped before the retry is made.
struct Unspent<'a>(Option<(&'a RetryBudget, Withdrawal)>);

impl Drop for Unspent<'_> {
    fn drop(&mut self) {
        if let Some((budget, withdrawal)) = self.0.take() {
            budget.refund(withdrawal);
        }
    }
}

/// What happens after an attempt.
enum Step {
    Retry {
        delay: Duration,
        reason: RetryReason,
        /// The retry taken from the budget, if there is one.
        withdrawal: Option<Withdrawal>,
    },
    Stop(StopReason),
}

/// The per-logical-request state of the loop.
pub(super) struct LoopState {
    pub(super) started_system: Option<SystemTime>,
    pub(super) deadline: Option<Instant>,
    pub(super) max_retries: u32,
    pub(super) retries: u32,
    pub(super) previous_delay: Option<Duration>,
    /// The per-attempt timeout for this request ([`AttemptTimeout`] or the configured one).
    pub(super) attempt_timeout: Option<Duration>,
    /// Hedges sent so far.
    pub(super) hedges: u32,
    /// Retries taken on [`RetryReason::NotProcessed`] (not counted in `retries`).
    pub(super) not_processed_retries: u32,
}

impl LoopState {
    /// Attempts made so far: the first, the retries of either kind and the hedges.
    fn attempts(&self) -> u32 {
        self.retries + self.not_processed_retries + self.hedges
    }

    /// Counts a retry taken for `reason` after `delay`: one taken at once ([`at_once`])
    /// against the not-processed cap, outside the retry count and the backoff's
    /// progression; every other against `max_retries`. The one place both the loop and a
    /// later pass (`continued`) count, so that the cap a retry was checked against
    /// (`Config::count_allows`) is the count it spends.
    pub(super) fn count_retry(&mut self, reason: RetryReason, delay: Duration) {
        if at_once(reason) {
            self.not_processed_retries += 1;
        } else {
            self.previous_delay = Some(delay);
            self.retries += 1;
        }
    }

    /// Whether another retry may still be taken (so the request must be kept for it).
    fn retry_possible(&self, max_not_processed_retries: u32) -> bool {
        self.retries < self.max_retries
            || (self.max_retries > 0 && self.not_processed_retries < max_not_processed_retries)
    }
}

impl Config {
    /// [`plan_requested`](Self::plan_requested) for a verdict without a delay of its own.
    #[cfg(test)]
    fn plan(
        &self,
        reason: RetryReason,
        evidence: &RequestEvidence,
        retry_in: Option<Duration>,
        can_replay: bool,
        state: &LoopState,
        now: Instant,
    ) -> Step {
        self.plan_requested(reason, None, evidence, retry_in, can_replay, state, now)
    }

    /// Turns a `Retry` verdict (with the delay the strategy `requested`, if any) into a
    /// delay, or the reason it cannot be taken. Pure except for the budget withdrawal,
    /// which comes last so that a refused retry costs nothing.
    #[allow(clippy::too_many_arguments)]
    fn plan_requested(
        &self,
        reason: RetryReason,
        requested: Option<Duration>,
        evidence: &RequestEvidence,
        retry_in: Option<Duration>,
        can_replay: bool,
        state: &LoopState,
        now: Instant,
    ) -> Step {
        if let Err(stop) = self.count_allows(reason, state) {
            return Step::Stop(stop);
        }
        if !can_replay {
            return Step::Stop(StopReason::BodyNotClonable);
        }
        let delay = match self.delay_for(reason, requested, evidence, retry_in, state) {
            Ok(d) => d,
            Err(stop) => return Step::Stop(stop),
        };
        if let Some(deadline) = state.deadline
            && now.checked_add(delay).is_none_or(|wake| wake > deadline)
        {
            return Step::Stop(StopReason::DeadlineExceeded);
        }
        let withdrawal = match &self.budget {
            // A `GOAWAY` is a connection rotation: the retry goes to a new connection and
            // adds no work the request would not have cost anyway, so only the per-request
            // cap bounds it (a burst meets one rotation per
            // `keepalive_requests` requests, more than any budget's 20 %). A
            // `REFUSED_STREAM` is the server's stream limit, a load signal: budgeted.
            Some(_) if free_of_budget(reason) => None,
            Some(budget) => match budget.withdraw() {
                Some(w) => Some(w),
                None => return Step::Stop(StopReason::BudgetExhausted),
            },
            None => None,
        };
        Step::Retry {
            delay,
            reason,
            withdrawal,
        }
    }

    /// Whether the retry counts leave room for a retry for `reason`: a not-processed one
    /// has a cap of its own, every other the retry count (whose 0 disables both).
    fn count_allows(&self, reason: RetryReason, state: &LoopState) -> Result<(), StopReason> {
        if state.max_retries == 0 {
            return Err(StopReason::RetriesExhausted);
        }
        if at_once(reason) {
            if state.not_processed_retries >= self.max_not_processed_retries {
                return Err(StopReason::NotProcessedRetryUsed);
            }
        } else if state.retries >= state.max_retries {
            return Err(StopReason::RetriesExhausted);
        }
        Ok(())
    }

    /// The wait before a retry for `reason`: the strategy's `requested` one (capped), else
    /// the schedule's ([`scheduled_delay`](Self::scheduled_delay)), never shorter than a
    /// wait the stack knows of (an open breaker's "retry in", the token manager's next
    /// fetch).
    fn delay_for(
        &self,
        reason: RetryReason,
        requested: Option<Duration>,
        evidence: &RequestEvidence,
        retry_in: Option<Duration>,
        state: &LoopState,
    ) -> Result<Duration, StopReason> {
        let requested = requested.map(|d| self.capped(d)).transpose()?;
        if reason == RetryReason::BreakerRejected {
            // The breaker's "retry in" comes with its error (`ResilienceError::retry_in`) or
            // as `retry_after` on its evidence. Retrying into an open breaker before it says
            // so would be a tight loop.
            return match (retry_in.or(evidence.retry_after), requested) {
                (Some(wait), own) => Ok(own.map_or(wait, |own| own.max(wait))),
                (None, Some(own)) => Ok(own),
                (None, None) => Err(StopReason::BreakerRejected),
            };
        }
        // Until its next fetch the token manager answers with the same error at once: a
        // retry sooner would be spent for nothing. When that fetch lies beyond the cap, a
        // retry at the cap would meet the same error too (the manager still holds off), so
        // the request stops at once with the token error instead of sleeping the cap.
        let refetch = match (reason, evidence.failure, evidence.retry_after) {
            (RetryReason::NotSent, Some(FailureKind::TokenUnavailable), Some(refetch)) => {
                if refetch > self.retry_after_cap {
                    return Err(StopReason::RetryAfterTooLong);
                }
                refetch
            }
            _ => Duration::ZERO,
        };
        let delay = match requested {
            Some(own) => own,
            None => self.scheduled_delay(reason, evidence, state)?,
        };
        Ok(delay.max(refetch))
    }

    /// The wait the middleware chooses itself: none for a retry the server proved
    /// harmless, a `Retry-After` for a status, else the backoff.
    fn scheduled_delay(
        &self,
        reason: RetryReason,
        evidence: &RequestEvidence,
        state: &LoopState,
    ) -> Result<Duration, StopReason> {
        if at_once(reason) {
            // A refused stream or a rotated connection: the connection the server gave up
            // on is not used again (h2 opens no stream on a connection that sent `GOAWAY`),
            // so waiting would only delay a request the server is ready for (a second per
            // rotation, with the default backoff).
            return Ok(Duration::ZERO);
        }
        if let (RetryReason::Status(_), Some(after)) = (reason, evidence.retry_after) {
            // 0 or a past date gives no wait of its own: the backoff applies.
            if !after.is_zero() {
                return self.capped(after);
            }
        }
        match &self.delays {
            Delays::Backoff(b) => {
                Ok(b.delay(state.retries, state.previous_delay, self.random.as_ref()))
            }
            Delays::External(policy) => {
                let started = state.started_system.unwrap_or_else(SystemTime::now);
                policy(started, state.retries).ok_or(StopReason::RetriesExhausted)
            }
        }
    }

    /// A server's (or the token manager's) wait, capped at `retry_after_cap`.
    fn capped(&self, wait: Duration) -> Result<Duration, StopReason> {
        if wait <= self.retry_after_cap {
            return Ok(wait);
        }
        match self.retry_after_policy {
            RetryAfterPolicy::Clamp => Ok(self.retry_after_cap),
            RetryAfterPolicy::GiveUp => Err(StopReason::RetryAfterTooLong),
        }
    }
}

standalone_middleware!(RetryMiddleware);

impl Stage for RetryMiddleware {
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: Request,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        self.attempts(Some(req), extensions, handover, next)
    }
}

impl RetryMiddleware {
    /// The retry loop for one logical request: prepare an attempt, run it (plain or as a
    /// hedged round), decide, and either stop or wait and go round again.
    ///
    /// The caller's request is `kept` (always `Some` when the loop starts) untouched while
    /// an attempt sends a copy of it, so the stages inside can replay it after a `401`;
    /// the last attempt possible sends it itself. The future holds the request in that
    /// one place (an argument of its own besides would be a second 264 bytes: stage cost
    /// rule 3).
    #[allow(clippy::manual_async_fn)]
    fn attempts<'a, N: RestOfStack + 'a>(
        &'a self,
        mut kept: Option<Request>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        async move {
            // The owner of the request clears what an earlier one left behind, a deadline
            // handed on for a request whose future was dropped included.
            let Some(first) = kept.as_ref() else {
                unreachable!("serve hands the request in")
            };
            let owner = handover.enter(extensions, "RetryMiddleware", true, first.url())?;
            let timeout = attempt_timeout::for_request(extensions, self.config.attempt_timeout)?;
            let mut run = RequestRun::begin(&self.config, first, extensions, handover, timeout);
            loop {
                // One attempt and its decision, in a block of their own: the request, the
                // response and the evidence end with it, so the future does not also keep
                // their slots through the backoff wait below (every request pays for the
                // future's size when it is boxed).
                let (wait, retry) = {
                    let Some((prepared, req)) = run.prepare(&mut kept, extensions) else {
                        unreachable!(
                            "the loop goes round only after a retry, which keeps the request"
                        )
                    };
                    let (result, hedges) = if let Some((hedging, spec)) =
                        run.hedged_round(&prepared, owner)
                    {
                        let is_final = run.is_final(kept.as_ref().map(Request::url));
                        // Only a hedged request carries the race (boxed: stage cost rule 2).
                        let round =
                            Box::pin(hedging.round(spec, &next, req, extensions, is_final)).await;
                        (round.result, round.hedges)
                    } else {
                        let handover = handover.with_spare(kept.as_ref());
                        let (sent, end) =
                            run.start_attempt(&next, req, extensions, handover, owner, &prepared);
                        let outcome = sent.await;
                        (end.finish(outcome, extensions, &run.origin), 0)
                    };
                    let kept_url = kept.as_ref().map(Request::url);
                    let retry = match run.decide(&result, extensions, prepared, hedges, kept_url) {
                        Ok(retry) => retry,
                        Err(stopped) => return run.finish(result, stopped, extensions),
                    };
                    // Only a retry waits (boxed: stage cost rule 2).
                    (Box::pin(wait_before_retry(result.ok(), retry.delay)), retry)
                };
                run.wait_then_count(wait, retry).await;
            }
        }
    }
}

/// One logical request in the retry loop: what its attempts share.
struct RequestRun<'a> {
    config: &'a Config,
    method: http::Method,
    idempotent: bool,
    /// Worked out once for every attempt and every stage inside.
    origin: Option<Origin>,
    /// The hedging of a request eligible for it ([`Hedging::eligible`]).
    hedging: Option<&'a Hedging>,
    state: LoopState,
    /// Whether this middleware handed its `total_deadline` inward as a [`Deadline`], or
    /// its attempt timeout: what ends with the request ([`Inward::end`]).
    handed_on: bool,
    /// Whether the stack installed the transport step inside (see [`Decision`]).
    transport_installed: bool,
    /// The earlier passes of this request, when it has some (`continued`).
    continued: Option<Continuation>,
    /// The URL of the request once the last attempt possible sent the caller's request
    /// itself (none is kept to borrow it from then): boxed, so the loop's future carries a
    /// pointer, not a `Url`, and copied only on that path.
    last_url: Option<Box<url::Url>>,
}

/// An attempt about to run.
struct PreparedAttempt {
    /// Its number, counting the first attempt and every hedge.
    attempt: u32,
    /// Whether its request's body can be copied (for hedges).
    replayable: bool,
    /// The history's length before the attempt.
    recorded_before: usize,
}

/// A retry the decision took: its delay, why, and the budget's withdrawal for it.
struct PlannedRetry {
    delay: Duration,
    reason: RetryReason,
    withdrawal: Option<Withdrawal>,
}

/// Why the loop stopped, after how many attempts.
struct Stopped {
    attempts: u32,
    stop: StopReason,
}

impl<'a> RequestRun<'a> {
    /// Sets the request up (with its `attempt_timeout`, the request's or the configured
    /// one): the deadline handed inward, the loop's state, the deposits in the retry and
    /// hedge budgets.
    #[inline]
    fn begin(
        config: &'a Config,
        req: &Request,
        extensions: &mut Extensions,
        handover: Handover<'_>,
        attempt_timeout: Option<Duration>,
    ) -> Self {
        // A later pass of a request (an operation run again, a body resumed) goes on
        // from the earlier ones: `super::continuation`.
        let continued = Continuation::of_request(extensions);
        let handed_on = continued
            .as_ref()
            .is_some_and(|c| c.hand_on_deadline(extensions))
            | hand_on_deadline(config, extensions);
        // Kept for every attempt (and copy) to start its clock from.
        Inward::set_attempt_timeout(extensions, attempt_timeout);
        let mut idempotent = extensions
            .get::<Idempotent>()
            .map_or_else(|| is_idempotent(req.method(), req.headers()), |i| i.0);
        let mut state = LoopState {
            // Only an external policy reads the wall clock; the success path skips it.
            started_system: matches!(config.delays, Delays::External(_)).then(SystemTime::now),
            deadline: extensions.get::<Deadline>().map(|d| d.0),
            max_retries: extensions
                .get::<MaxRetries>()
                .map_or_else(|| config.max_retries(), |m| m.0),
            retries: 0,
            previous_delay: None,
            attempt_timeout,
            hedges: 0,
            not_processed_retries: 0,
        };
        let deposit = continued
            .as_ref()
            .is_none_or(|c| c.begin_pass(&mut state, &mut idempotent, req, extensions));
        if let Some(budget) = config.budget.as_ref().filter(|_| deposit) {
            budget.deposit();
        }
        let hedging = config
            .hedging
            .as_ref()
            .filter(|h| h.eligible(req.method(), extensions, idempotent));
        if let Some(h) = hedging {
            h.deposit();
        }
        RequestRun {
            config,
            method: req.method().clone(),
            idempotent,
            origin: handover.origin(req.url()),
            hedging,
            state,
            // What this request handed inward ends with it.
            handed_on: handed_on || attempt_timeout.is_some(),
            transport_installed: handover.composed(),
            continued,
            last_url: None,
        }
    }

    /// Readies the next attempt: its number, the request it sends, and the extensions
    /// cleared of the previous attempt's evidence. The request is a copy of the `kept`
    /// one when a retry is still possible, else the kept one itself (`None` when it was
    /// sent already).
    #[inline]
    fn prepare(
        &mut self,
        kept: &mut Option<Request>,
        extensions: &mut Extensions,
    ) -> Option<(PreparedAttempt, Request)> {
        // Copying only when a retry is still possible keeps streaming bodies (and
        // `MaxRetries(0)`) on the single-send path.
        let copy = kept
            .as_ref()
            .filter(|_| {
                self.state
                    .retry_possible(self.config.max_not_processed_retries)
            })
            .and_then(Request::try_clone);
        let req = match copy {
            Some(copy) => copy,
            None => {
                let last = kept.take()?;
                // The strategy still asks for the URL after this attempt.
                self.last_url = Some(Box::new(last.url().clone()));
                last
            }
        };
        // Evidence from the previous attempt must not be mistaken for this one's.
        extensions.remove::<RequestEvidence>();
        let prepared = PreparedAttempt {
            attempt: self.state.attempts() + 1,
            replayable: replayable(&req),
            recorded_before: extensions.get::<AttemptHistory>().map_or(0, |h| h.len()),
        };
        Some((prepared, req))
    }

    /// The hedged round this attempt runs as, when hedges are left, the request has an
    /// origin and its body can be copied.
    #[inline]
    fn hedged_round(
        &self,
        prepared: &PreparedAttempt,
        owner: crate::stage::scope::Ownership,
    ) -> Option<(&'a Hedging, RoundSpec)> {
        let hedging = self.hedging.filter(|h| self.state.hedges < h.max())?;
        let origin = self.origin.as_ref().filter(|_| prepared.replayable)?;
        // The deadline bounds the attempt too: a server that trickles its answer (or
        // none) must not hold the caller past it when reqwest has no timeout.
        let spec = RoundSpec {
            deadline: self.state.deadline,
            attempt_timeout: self.state.attempt_timeout,
            hedges_left: hedging.max() - self.state.hedges,
            attempt: prepared.attempt,
            origin: origin.clone(),
            owner,
        };
        Some((hedging, spec))
    }

    /// Whether the retry decision would stop on a copy's outcome (a hedged round's
    /// winner).
    fn is_final<'u>(
        &'u self,
        url: Option<&'u url::Url>,
    ) -> impl Fn(&RequestEvidence, &reqwest_middleware::Result<Response>, u32) -> bool + Sync + 'u
    {
        let question = self.question(url);
        move |evidence, result, attempt| {
            matches!(
                question.verdict(evidence, result, attempt),
                Verdict::Stop(_)
            )
        }
    }

    /// What the strategy is asked with about this request (`kept_url`: the URL of the
    /// request kept for a retry, if it is).
    fn question<'u>(&'u self, kept_url: Option<&'u url::Url>) -> Question<'u> {
        Question {
            config: self.config,
            method: &self.method,
            url: kept_url.or(self.last_url.as_deref()),
            idempotent: self.idempotent,
            not_processed_retries: self.state.not_processed_retries,
        }
    }

    /// Starts a plain attempt, cut at the deadline or its attempt timeout.
    #[inline]
    fn start_attempt<'s, N: RestOfStack + 's>(
        &'s self,
        next: &N,
        req: Request,
        extensions: &'s mut Extensions,
        handover: Handover<'s>,
        owner: crate::stage::scope::Ownership,
        prepared: &PreparedAttempt,
    ) -> (attempt_timeout::Sent<'s>, attempt_timeout::AttemptEnd) {
        let cut = attempt_cut(self.state.deadline, self.state.attempt_timeout);
        let scope = self
            .state
            .attempt_timeout
            .map(|_| AttemptScope::cut_at(cut));
        // The stages inside share the origin (and replay the kept request: the caller's).
        let handover = handover.with_origin(&self.origin);
        attempt_timeout::start_attempt(
            next.clone(),
            req,
            extensions,
            handover,
            owner,
            cut,
            scope,
            prepared.attempt,
        )
    }

    /// Decides after the attempt (and the `hedges` its round sent): a retry (possible
    /// only when the request was kept for it: `kept_url` is its URL), or a stop.
    #[inline]
    fn decide(
        &mut self,
        result: &reqwest_middleware::Result<Response>,
        extensions: &mut Extensions,
        prepared: PreparedAttempt,
        hedges: u32,
        kept_url: Option<&url::Url>,
    ) -> Result<PlannedRetry, Stopped> {
        let kept = kept_url.is_some();
        // Each hedge sent is an attempt of its own.
        self.state.hedges += hedges;
        let attempts = prepared.attempt + hedges;
        let decision = Decision {
            question: self.question(kept_url),
            recorded_before: prepared.recorded_before,
            transport_installed: self.transport_installed,
        };
        let step = decision.decide(result, extensions, attempts, kept, &self.state);
        match (step, kept) {
            (
                Step::Retry {
                    delay,
                    reason,
                    withdrawal,
                },
                true,
            ) => Ok(PlannedRetry {
                delay,
                reason,
                withdrawal,
            }),
            (Step::Stop(stop), _) => Err(Stopped { attempts, stop }),
            // `plan` never retries without a replayable request.
            (Step::Retry { .. }, false) => Err(Stopped {
                attempts,
                stop: StopReason::BodyNotClonable,
            }),
        }
    }

    /// Waits out the retry's delay, then counts the retry. Dropped during the wait, the
    /// retry is never made: its budget goes back.
    async fn wait_then_count(&mut self, wait: impl Future<Output = ()>, retry: PlannedRetry) {
        let mut unspent = Unspent(self.config.budget.as_ref().zip(retry.withdrawal));
        wait.await;
        unspent.0 = None;
        self.state.count_retry(retry.reason, retry.delay);
    }

    /// The request's result, with its [`RetryOutcome`].
    #[inline]
    fn finish(
        &self,
        result: reqwest_middleware::Result<Response>,
        stopped: Stopped,
        extensions: &mut Extensions,
    ) -> reqwest_middleware::Result<Response> {
        let Stopped { attempts, stop } = stopped;
        if let Some(c) = &self.continued {
            let status = result.as_ref().ok().map(Response::status);
            c.end_pass(&self.state, stop, status, extensions);
        }
        finish(
            self.config,
            result,
            attempts,
            stop,
            extensions,
            self.handed_on,
        )
    }
}

/// Whether a retry for `reason` is taken at once, outside `max_retries`, under the cap of
/// `max_not_processed_retries`: a refused stream, or an idempotent request's connection
/// rotated under it.
fn at_once(reason: RetryReason) -> bool {
    matches!(reason, RetryReason::NotProcessed | RetryReason::GoAway)
}

/// Whether a retry for `reason` is bounded by its own cap alone, not by the retry budget:
/// a connection rotation is not a failure to ration.
fn free_of_budget(reason: RetryReason) -> bool {
    reason == RetryReason::GoAway
}

/// Hands the configured total deadline inward as a [`Deadline`] when the request has none:
/// the middlewares inside (the breaker waiting out a pause) honour the same deadline; it
/// ends with the request ([`finish`]). Whether it did.
#[inline]
fn hand_on_deadline(config: &Config, extensions: &mut Extensions) -> bool {
    let handed_on = match (extensions.get::<Deadline>(), config.deadline) {
        (None, Some(total)) => Instant::now().checked_add(total),
        _ => None,
    };
    if let Some(d) = handed_on {
        Inward::hand_on_deadline(extensions, Deadline(d));
    }
    handed_on.is_some()
}

/// What the strategy is asked with about a request, besides the attempt itself.
#[derive(Clone, Copy)]
struct Question<'a> {
    config: &'a Config,
    method: &'a http::Method,
    /// The request's URL (`None` only when it could not be kept: see `RequestRun::last_url`).
    url: Option<&'a url::Url>,
    idempotent: bool,
    not_processed_retries: u32,
}

impl Question<'_> {
    /// The strategy's verdict on an attempt, a retry that could repeat a request that may
    /// have been processed turned into a stop ([`unsafe_retry`]): the promise holds for
    /// every strategy.
    #[inline]
    fn verdict(
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
struct Decision<'a> {
    question: Question<'a>,
    /// The history's length before the attempt.
    recorded_before: usize,
    /// Whether the stack installed the transport step (then an attempt without evidence
    /// was answered by a per-attempt middleware, e.g. a cache: nothing to report).
    transport_installed: bool,
}

impl Decision<'_> {
    /// The step after attempt number `attempt`, written into the history (and the
    /// metrics): the attempt's evidence (the transport step's, or one made up when nothing
    /// inside left a record), the strategy's verdict, and for a retry its delay and the
    /// budget's withdrawal.
    // Inlined: one call per attempt, and as a call it costs every request about 70
    // instructions of argument passing (`benches/instructions.rs`).
    #[inline(always)]
    fn decide(
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
        let evidence = attempt_evidence(result, extensions, attempt, self.transport_installed);
        // A local rejection (breaker, pause) or a missing transport step leaves no
        // record: add one, so the decision below lands on this attempt.
        let history = extensions.get_or_insert_default::<AttemptHistory>();
        if history.len() == self.recorded_before {
            history.push(evidence.clone());
        }
        let verdict = self.question.verdict(&evidence, result, attempt);
        let (reason, requested) = match verdict {
            // The deadline passed during the attempt: no time is left for another.
            _ if timed_out => (Err(StopReason::DeadlineExceeded), None),
            Verdict::Retry(reason) => (Ok(reason), None),
            Verdict::RetryAfter(reason, delay) => (Ok(reason), Some(delay)),
            Verdict::Stop(reason) => (Err(reason), None),
        };
        let step = match reason {
            Err(reason) => Step::Stop(reason),
            Ok(reason) => c.plan_requested(
                reason,
                requested,
                &evidence,
                retry_in(result),
                can_replay,
                state,
                Instant::now(),
            ),
        };
        let method = self.question.method;
        record(extensions, &step, attempt, method, evidence.origin.as_ref());
        if let Step::Retry { delay, reason, .. } = step {
            let notice = RetryNotice {
                attempt,
                evidence: &evidence,
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
        step
    }
}

/// The attempt's evidence: the transport step's, or one made up when nothing inside left
/// a record.
#[inline]
fn attempt_evidence(
    result: &reqwest_middleware::Result<Response>,
    extensions: &Extensions,
    attempt: u32,
    transport_installed: bool,
) -> RequestEvidence {
    match extensions.get::<RequestEvidence>() {
        Some(e) => e.clone(),
        None => {
            // A response or a reqwest error without evidence means no transport step,
            // unless the stack installed one (a per-attempt middleware answered itself);
            // a middleware error may just come from one inside (a token).
            if !transport_installed
                && !matches!(result, Err(reqwest_middleware::Error::Middleware(_)))
            {
                misconfig::report_once(Misconfiguration::NoTransportEvidence);
            }
            fallback_evidence(result, attempt)
        }
    }
}

/// The "retry in" an error from inside (the breaker's rejection) carries.
fn retry_in(result: &reqwest_middleware::Result<Response>) -> Option<Duration> {
    result
        .as_ref()
        .err()
        .and_then(ResilienceError::from_middleware_error)
        .and_then(ResilienceError::retry_in)
}

/// Whether `req` can be copied (what `Request::try_clone` needs: no streamed body),
/// without copying it.
fn replayable(req: &Request) -> bool {
    req.body().is_none_or(|body| body.as_bytes().is_some())
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

/// Sleeps `delay`, draining `response` meanwhile.
async fn wait_before_retry(response: Option<Response>, delay: Duration) {
    let wake = Instant::now() + delay;
    if let Some(response) = response {
        // Reading a small body lets its connection be reused; never past the wake.
        let _ = tokio::time::timeout_at(wake, drain(response)).await;
    }
    tokio::time::sleep_until(wake).await;
}

/// Reads up to 64 KiB of a response that will be retried, so HTTP/1 can reuse its
/// connection; a longer body is dropped (which closes the connection instead).
async fn drain(mut response: Response) {
    const LIMIT: u64 = 64 * 1024;
    if response.content_length().is_some_and(|n| n > LIMIT) {
        return;
    }
    let mut read = 0u64;
    while let Ok(Some(chunk)) = response.chunk().await {
        read += chunk.len() as u64;
        if read > LIMIT {
            return;
        }
    }
}

mod continued;
pub(crate) use continued::{ContinuedFailure, ContinuedRetry};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backoff;
    use crate::record::Transmission;
    use http::StatusCode;
    use std::sync::Arc;

    fn config(builder: RetryMiddlewareBuilder) -> Arc<Config> {
        builder.build().unwrap().config
    }

    fn state(retries: u32, max_retries: u32, deadline: Option<Instant>) -> LoopState {
        LoopState {
            started_system: None,
            deadline,
            max_retries,
            retries,
            previous_delay: None,
            attempt_timeout: None,
            hedges: 0,
            not_processed_retries: 0,
        }
    }

    fn response(code: u16, retry_after: Option<Duration>) -> RequestEvidence {
        let mut e = RequestEvidence::new(
            Transmission::ResponseReceived(StatusCode::from_u16(code).unwrap()),
            None,
            1,
        );
        e.retry_after = retry_after;
        e
    }

    fn no_jitter() -> RetryMiddlewareBuilder {
        RetryMiddleware::builder()
            .backoff(
                Backoff::builder()
                    .jitter(crate::Jitter::None)
                    .build()
                    .unwrap(),
            )
            .no_budget()
    }

    fn delay_of(step: Step) -> Result<Duration, StopReason> {
        match step {
            Step::Retry { delay, .. } => Ok(delay),
            Step::Stop(r) => Err(r),
        }
    }

    const S503: RetryReason = RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE);

    #[tokio::test(start_paused = true)]
    async fn plan_uses_backoff_then_stops_at_max_retries() {
        let c = config(no_jitter());
        let ev = response(503, None);
        let now = Instant::now();
        let got: Vec<_> = (0..4)
            .map(|n| delay_of(c.plan(S503, &ev, None, true, &state(n, 3, None), now)))
            .collect();
        let s = Duration::from_secs;
        assert_eq!(
            got,
            [
                Ok(s(1)),
                Ok(s(2)),
                Ok(s(4)),
                Err(StopReason::RetriesExhausted)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn plan_prefers_retry_after_and_caps_it() {
        let now = Instant::now();
        let st = state(0, 3, None);
        let clamp = config(no_jitter());
        let give_up =
            config(no_jitter().retry_after_cap(Duration::from_secs(60), RetryAfterPolicy::GiveUp));
        let s = Duration::from_secs;
        let plan =
            |c: &Config, ra| delay_of(c.plan(S503, &response(503, ra), None, true, &st, now));
        assert_eq!(plan(&clamp, Some(s(7))), Ok(s(7)));
        assert_eq!(plan(&clamp, Some(s(120))), Ok(s(60)));
        assert_eq!(plan(&clamp, Some(Duration::ZERO)), Ok(s(1)), "0 → backoff");
        assert_eq!(
            plan(&give_up, Some(s(120))),
            Err(StopReason::RetryAfterTooLong)
        );
        assert_eq!(plan(&give_up, Some(s(60))), Ok(s(60)));
    }

    #[tokio::test(start_paused = true)]
    async fn plan_cuts_a_sleep_that_would_pass_the_deadline() {
        let c = config(no_jitter());
        let now = Instant::now();
        let ev = response(503, None);
        let deadline = Some(now + Duration::from_millis(1999));
        assert_eq!(
            delay_of(c.plan(S503, &ev, None, true, &state(0, 3, deadline), now)),
            Ok(Duration::from_secs(1))
        );
        assert_eq!(
            delay_of(c.plan(S503, &ev, None, true, &state(1, 3, deadline), now)),
            Err(StopReason::DeadlineExceeded)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn plan_waits_for_the_breaker_or_returns_at_once() {
        let c = config(no_jitter());
        let now = Instant::now();
        let ev = RequestEvidence::rejected_locally(FailureKind::BreakerOpen, None, 1);
        let st = state(0, 3, None);
        let r = RetryReason::BreakerRejected;
        assert_eq!(
            delay_of(c.plan(r, &ev, Some(Duration::from_secs(5)), true, &st, now)),
            Ok(Duration::from_secs(5))
        );
        assert_eq!(
            delay_of(c.plan(r, &ev, None, true, &st, now)),
            Err(StopReason::BreakerRejected)
        );
        let short = state(0, 3, Some(now + Duration::from_secs(2)));
        assert_eq!(
            delay_of(c.plan(r, &ev, Some(Duration::from_secs(5)), true, &short, now)),
            Err(StopReason::DeadlineExceeded)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_strategys_own_delay_replaces_the_backoff_is_capped_and_keeps_the_known_floors() {
        let c = config(no_jitter());
        let now = Instant::now();
        let st = state(0, 3, None);
        let s = Duration::from_secs;
        let own = |c: &Config, reason, ev: &RequestEvidence, retry_in, d| {
            delay_of(c.plan_requested(reason, Some(d), ev, retry_in, true, &st, now))
        };
        // Instead of the 1 s backoff, and of a `Retry-After`.
        assert_eq!(own(&c, S503, &response(503, None), None, s(7)), Ok(s(7)));
        assert_eq!(
            own(&c, S503, &response(503, Some(s(2))), None, s(7)),
            Ok(s(7))
        );
        assert_eq!(own(&c, S503, &response(503, None), None, s(600)), Ok(s(60)));
        let give_up =
            config(no_jitter().retry_after_cap(Duration::from_secs(60), RetryAfterPolicy::GiveUp));
        assert_eq!(
            own(&give_up, S503, &response(503, None), None, s(600)),
            Err(StopReason::RetryAfterTooLong)
        );
        // Never before an open breaker's "retry in", which alone is no longer required.
        let breaker = RequestEvidence::rejected_locally(FailureKind::BreakerOpen, None, 1);
        let r = RetryReason::BreakerRejected;
        assert_eq!(own(&c, r, &breaker, Some(s(5)), s(1)), Ok(s(5)));
        assert_eq!(own(&c, r, &breaker, Some(s(5)), s(9)), Ok(s(9)));
        assert_eq!(own(&c, r, &breaker, None, s(2)), Ok(s(2)));
        // Never before the token manager's next fetch.
        let mut token = RequestEvidence::rejected_locally(FailureKind::TokenUnavailable, None, 1);
        token.retry_after = Some(s(20));
        assert_eq!(own(&c, RetryReason::NotSent, &token, None, s(3)), Ok(s(20)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_managers_next_fetch_beyond_the_cap_stops_under_either_policy() {
        let now = Instant::now();
        let st = state(0, 3, None);
        let s = Duration::from_secs;
        let mut token = RequestEvidence::rejected_locally(FailureKind::TokenUnavailable, None, 1);
        let clamp = config(no_jitter());
        let give_up =
            config(no_jitter().retry_after_cap(Duration::from_secs(60), RetryAfterPolicy::GiveUp));
        for c in [&clamp, &give_up] {
            token.retry_after = Some(s(3600));
            let plan = |ev: &RequestEvidence| {
                delay_of(c.plan(RetryReason::NotSent, ev, None, true, &st, now))
            };
            assert_eq!(plan(&token), Err(StopReason::RetryAfterTooLong));
            // At the cap it is still waited for; below the backoff, the backoff applies.
            token.retry_after = Some(s(60));
            assert_eq!(plan(&token), Ok(s(60)));
            token.retry_after = Some(Duration::from_millis(10));
            assert_eq!(plan(&token), Ok(s(1)));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn plan_refuses_unreplayable_bodies_and_an_empty_budget() {
        let now = Instant::now();
        let ev = response(503, None);
        let st = state(0, 3, None);
        let c = config(no_jitter());
        assert_eq!(
            delay_of(c.plan(S503, &ev, None, false, &st, now)),
            Err(StopReason::BodyNotClonable)
        );
        let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.0).unwrap();
        let c = config(no_jitter().budget(budget));
        assert_eq!(
            delay_of(c.plan(S503, &ev, None, true, &st, now)),
            Err(StopReason::BudgetExhausted)
        );
    }
}
