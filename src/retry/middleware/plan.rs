//! The retry's delay planner: after a `Retry` verdict, the wait before the retry (the
//! backoff, a server's `Retry-After` under its cap, an open breaker's "retry in", the
//! token manager's next fetch), or why it cannot be taken (the retry counts, the
//! deadline, the budget); and the retry counts it checks, kept in [`LoopState`].
//!
//! The planner (`Config::delay_before_retry`) is pure: the clock is handed in (`now`), the
//! jitter's random source comes with the configuration
//! ([`SeededRandom`](crate::backoff::SeededRandom) in a test), and nothing is spent. The
//! budget's withdrawal comes after it, last, so that a refused retry costs nothing. One
//! exception: an external policy (the `retry_policies` adapter) reads the wall clock
//! itself.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::config::{Config, Delays, RetryAfterPolicy};
use crate::record::{FailureKind, RequestEvidence, RetryReason, StopReason};
use crate::retry::{RetryBudget, Withdrawal};

/// A retry taken from the budget, given back when dropped before the retry is made.
pub(super) struct Unspent<'a>(pub(super) Option<(&'a RetryBudget, Withdrawal)>);

impl Drop for Unspent<'_> {
    fn drop(&mut self) {
        if let Some((budget, withdrawal)) = self.0.take() {
            budget.refund(withdrawal);
        }
    }
}

/// What happens after an attempt.
pub(super) enum Step {
    Retry {
        delay: Duration,
        reason: RetryReason,
        /// The retry taken from the budget, if there is one.
        withdrawal: Option<Withdrawal>,
    },
    Stop(StopReason),
}

/// The per-logical-request state of the loop.
pub(in crate::retry) struct LoopState {
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
    #[inline]
    pub(super) fn attempts(&self) -> u32 {
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
    #[inline]
    pub(super) fn retry_possible(&self, max_not_processed_retries: u32) -> bool {
        self.retries < self.max_retries
            || (self.max_retries > 0 && self.not_processed_retries < max_not_processed_retries)
    }
}

impl Config {
    /// [`plan_requested`](Self::plan_requested) for a verdict without a delay of its own.
    #[cfg(test)]
    pub(super) fn plan(
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
    /// step: the [`delay_before_retry`](Self::delay_before_retry), then the budget's
    /// withdrawal, last, so that a refused retry costs nothing.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan_requested(
        &self,
        reason: RetryReason,
        requested: Option<Duration>,
        evidence: &RequestEvidence,
        retry_in: Option<Duration>,
        can_replay: bool,
        state: &LoopState,
        now: Instant,
    ) -> Step {
        self.delay_before_retry(
            reason, requested, evidence, retry_in, can_replay, state, now,
        )
        .and_then(|delay| {
            let withdrawal = self.withdraw(reason)?;
            Ok(Step::Retry {
                delay,
                reason,
                withdrawal,
            })
        })
        .unwrap_or_else(Step::Stop)
    }

    /// The wait before a retry for `reason`, or why it cannot be taken: the retry counts
    /// ([`count_allows`](Self::count_allows)), a body that cannot be sent again, the
    /// wait itself ([`delay_for`](Self::delay_for)), and the deadline (a wake exactly at
    /// it is allowed). Pure: `now` is handed in and nothing is spent.
    #[allow(clippy::too_many_arguments)]
    fn delay_before_retry(
        &self,
        reason: RetryReason,
        requested: Option<Duration>,
        evidence: &RequestEvidence,
        retry_in: Option<Duration>,
        can_replay: bool,
        state: &LoopState,
        now: Instant,
    ) -> Result<Duration, StopReason> {
        self.count_allows(reason, state)?;
        if !can_replay {
            return Err(StopReason::BodyNotClonable);
        }
        let delay = self.delay_for(reason, requested, evidence, retry_in, state)?;
        if let Some(deadline) = state.deadline
            && now.checked_add(delay).is_none_or(|wake| wake > deadline)
        {
            return Err(StopReason::DeadlineExceeded);
        }
        Ok(delay)
    }

    /// The retry's withdrawal from the budget (`None`: no budget, or a retry free of it),
    /// or [`StopReason::BudgetExhausted`].
    fn withdraw(&self, reason: RetryReason) -> Result<Option<Withdrawal>, StopReason> {
        match &self.budget {
            // A `GOAWAY` is a connection rotation: the retry goes to a new connection and
            // adds no work the request would not have cost anyway, so only the per-request
            // cap bounds it (a burst meets one rotation per
            // `keepalive_requests` requests, more than any budget's 20 %). A
            // `REFUSED_STREAM` is the server's stream limit, a load signal: budgeted.
            Some(_) if free_of_budget(reason) => Ok(None),
            Some(budget) => budget
                .withdraw()
                .map(Some)
                .ok_or(StopReason::BudgetExhausted),
            None => Ok(None),
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
            let wait = retry_in.or(evidence.retry_after);
            if evidence.failure == Some(FailureKind::BreakerOpen) {
                // An open breaker fails fast, unless the caller asked to wait it out and
                // it opens within that (the deadline is checked by the caller).
                return match (self.open_breaker_wait, wait) {
                    (Some(max), Some(wait)) if wait <= max => {
                        Ok(requested.map_or(wait, |own| own.max(wait)))
                    }
                    _ => Err(StopReason::BreakerRejected),
                };
            }
            return match (wait, requested) {
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

/// Whether a retry for `reason` is taken at once, outside `max_retries`, under the cap of
/// `max_not_processed_retries`: a refused stream, or an idempotent request's connection
/// rotated under it.
fn at_once(reason: RetryReason) -> bool {
    matches!(
        reason,
        RetryReason::NotProcessed | RetryReason::GoAway | RetryReason::NetworkChanged
    )
}

/// Whether a retry for `reason` is bounded by its own cap alone, not by the retry budget:
/// a connection rotation is not a failure to ration.
fn free_of_budget(reason: RetryReason) -> bool {
    matches!(reason, RetryReason::GoAway | RetryReason::NetworkChanged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backoff;
    use crate::record::Transmission;
    use crate::retry::{RetryMiddleware, RetryMiddlewareBuilder};
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
        let fails_fast = config(no_jitter());
        let c = config(no_jitter().wait_for_open_breakers(Duration::from_secs(60)));
        let now = Instant::now();
        let ev = RequestEvidence::rejected_locally(FailureKind::BreakerOpen, None, 1);
        let st = state(0, 3, None);
        let r = RetryReason::BreakerRejected;
        // By default an open breaker fails fast, whatever its "retry in".
        assert_eq!(
            delay_of(fails_fast.plan(r, &ev, Some(Duration::from_secs(5)), true, &st, now)),
            Err(StopReason::BreakerRejected)
        );
        // With the opt-in, not beyond its bound.
        assert_eq!(
            delay_of(c.plan(r, &ev, Some(Duration::from_secs(61)), true, &st, now)),
            Err(StopReason::BreakerRejected)
        );
        // A pause is waited out either way.
        let paused = RequestEvidence::rejected_locally(FailureKind::Paused, None, 1);
        assert_eq!(
            delay_of(fails_fast.plan(r, &paused, Some(Duration::from_secs(5)), true, &st, now)),
            Ok(Duration::from_secs(5))
        );
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
        // Never before a pause's "retry in", which alone is no longer required.
        let pause = RequestEvidence::rejected_locally(FailureKind::Paused, None, 1);
        let r = RetryReason::BreakerRejected;
        assert_eq!(own(&c, r, &pause, Some(s(5)), s(1)), Ok(s(5)));
        assert_eq!(own(&c, r, &pause, Some(s(5)), s(9)), Ok(s(9)));
        assert_eq!(own(&c, r, &pause, None, s(2)), Ok(s(2)));
        // An open breaker fails fast, whatever the strategy asks; with the opt-in, as a
        // pause, but only with a "retry in" within its bound.
        let breaker = RequestEvidence::rejected_locally(FailureKind::BreakerOpen, None, 1);
        assert_eq!(
            own(&c, r, &breaker, Some(s(5)), s(1)),
            Err(StopReason::BreakerRejected)
        );
        let waits = config(no_jitter().wait_for_open_breakers(s(60)));
        assert_eq!(own(&waits, r, &breaker, Some(s(5)), s(1)), Ok(s(5)));
        assert_eq!(own(&waits, r, &breaker, Some(s(5)), s(9)), Ok(s(9)));
        assert_eq!(
            own(&waits, r, &breaker, None, s(2)),
            Err(StopReason::BreakerRejected)
        );
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

    #[tokio::test(start_paused = true)]
    async fn the_backoff_doubles_from_1_s_to_its_30_s_cap() {
        let c = config(no_jitter());
        let ev = response(503, None);
        let now = Instant::now();
        let got: Vec<_> = (0..7)
            .map(|n| delay_of(c.plan(S503, &ev, None, true, &state(n, 10, None), now)))
            .collect();
        let s = Duration::from_secs;
        assert_eq!(
            got,
            [
                Ok(s(1)),
                Ok(s(2)),
                Ok(s(4)),
                Ok(s(8)),
                Ok(s(16)),
                Ok(s(30)),
                Ok(s(30))
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_counts_only_after_a_status() {
        let c = config(no_jitter());
        let now = Instant::now();
        let st = state(1, 3, None);
        let s = Duration::from_secs;
        let mut refused = RequestEvidence::new(Transmission::NotSent, None, 2);
        refused.retry_after = Some(s(7));
        assert_eq!(
            delay_of(c.plan(RetryReason::NotSent, &refused, None, true, &st, now)),
            Ok(s(2)),
            "the backoff's second delay"
        );
        assert_eq!(
            delay_of(c.plan(S503, &response(503, Some(s(7))), None, true, &st, now)),
            Ok(s(7))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_exactly_at_the_deadline_is_taken_and_one_past_it_is_not() {
        let c = config(no_jitter());
        let now = Instant::now();
        let at = |deadline, ev: &RequestEvidence| {
            delay_of(c.plan(S503, ev, None, true, &state(0, 3, Some(deadline)), now))
        };
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(at(now + s(1), &response(503, None)), Ok(s(1)));
        assert_eq!(
            at(now + ms(999), &response(503, None)),
            Err(StopReason::DeadlineExceeded)
        );
        // A `Retry-After` under the cap but past the deadline stops as well.
        assert_eq!(
            at(now + s(10), &response(503, Some(s(11)))),
            Err(StopReason::DeadlineExceeded)
        );
        assert_eq!(at(now + s(10), &response(503, Some(s(10)))), Ok(s(10)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_breakers_retry_in_comes_from_its_error_else_from_its_evidence() {
        let c = config(no_jitter().wait_for_open_breakers(Duration::from_secs(120)));
        let now = Instant::now();
        let st = state(0, 3, None);
        let s = Duration::from_secs;
        let mut ev = RequestEvidence::rejected_locally(FailureKind::BreakerOpen, None, 1);
        ev.retry_after = Some(s(3));
        let r = RetryReason::BreakerRejected;
        assert_eq!(delay_of(c.plan(r, &ev, None, true, &st, now)), Ok(s(3)));
        assert_eq!(
            delay_of(c.plan(r, &ev, Some(s(5)), true, &st, now)),
            Ok(s(5))
        );
        // Not capped by `retry_after_cap`: the breaker's own wait.
        assert_eq!(
            delay_of(c.plan(r, &ev, Some(s(90)), true, &st, now)),
            Ok(s(90))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_stream_and_a_rotation_go_at_once_under_a_cap_of_their_own() {
        let c = config(no_jitter());
        let now = Instant::now();
        let ev = RequestEvidence::new(Transmission::SentNoResponse, None, 4);
        let mut at_the_cap = state(0, 3, None);
        at_the_cap.not_processed_retries = crate::retry::DEFAULT_MAX_NOT_PROCESSED_RETRIES;
        for r in [RetryReason::NotProcessed, RetryReason::GoAway] {
            assert_eq!(
                delay_of(c.plan(r, &ev, None, true, &state(3, 3, None), now)),
                Ok(Duration::ZERO),
                "{r:?}: outside max_retries"
            );
            assert_eq!(
                delay_of(c.plan(r, &ev, None, true, &at_the_cap, now)),
                Err(StopReason::NotProcessedRetryUsed)
            );
            assert_eq!(
                delay_of(c.plan(r, &ev, None, true, &state(0, 0, None), now)),
                Err(StopReason::RetriesExhausted),
                "{r:?}: max_retries 0 disables every retry"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_rotation_spends_no_budget_and_a_retry_never_made_gives_its_share_back() {
        let now = Instant::now();
        let st = state(0, 3, None);
        let ev = response(503, None);
        let budget = RetryBudget::new(Duration::from_secs(1), 1, 0.0).unwrap();
        let c = config(no_jitter().budget(budget.clone()));
        assert!(matches!(
            c.plan(RetryReason::GoAway, &ev, None, true, &st, now),
            Step::Retry {
                withdrawal: None,
                ..
            }
        ));
        assert_eq!(budget.remaining(), 1);
        let Step::Retry {
            withdrawal: Some(taken),
            ..
        } = c.plan(S503, &ev, None, true, &st, now)
        else {
            panic!("the budget's one retry")
        };
        assert_eq!(
            delay_of(c.plan(RetryReason::NotProcessed, &ev, None, true, &st, now)),
            Err(StopReason::BudgetExhausted),
            "a refused stream is budgeted"
        );
        drop(Unspent(Some((&budget, taken))));
        assert_eq!(budget.remaining(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_counted_retry_moves_the_backoff_on_and_one_taken_at_once_does_not() {
        let c = config(no_jitter());
        let now = Instant::now();
        let ev = response(503, None);
        let mut st = state(0, 3, None);
        st.count_retry(S503, Duration::from_secs(1));
        st.count_retry(RetryReason::GoAway, Duration::ZERO);
        assert_eq!(
            (st.retries, st.not_processed_retries, st.previous_delay),
            (1, 1, Some(Duration::from_secs(1)))
        );
        assert_eq!(
            delay_of(c.plan(S503, &ev, None, true, &st, now)),
            Ok(Duration::from_secs(2))
        );
    }
}
