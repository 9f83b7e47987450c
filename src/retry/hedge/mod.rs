//! Hedged requests ([`Hedging`]): when an attempt of a safe request (GET, HEAD, OPTIONS,
//! TRACE; PUT, DELETE and `Idempotent(true)` ones on opt-in) has no response head after
//! the hedging delay, another copy is sent, and the first answer wins.
//!
//! After Dean & Barroso, "The Tail at Scale" (CACM 2013), Finagle's backup requests, gRPC
//! A6's `hedgingPolicy` and Polly's hedging strategy. It lives in the retry loop because a
//! hedge is one more attempt of the same logical request: every copy goes through the
//! breaker, `BearerAuth` and the transport step like any attempt, and appears in the
//! [`AttemptHistory`].

mod delay;
mod race;
mod record;

use std::sync::Arc;
use std::time::Duration;

use http::Extensions;
use reqwest::Response;
use tokio::time::Instant;

use super::RetryBudget;
use super::latency::LatencyTracker;
use crate::error::ResilienceError;
use crate::origin::Origin;

/// How long a copy waits for its response head before the next copy is sent.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum HedgeDelay {
    /// Always this long.
    Fixed(Duration),
    /// The `quantile` of the origin's recent first-attempt latencies (e.g. 0.95: p95),
    /// kept within `min..=max`; `max` until the origin has 32 samples. Only successful
    /// answers (2xx, 3xx) and first copies cancelled by a winning hedge are samples: a
    /// `404` answered in 1 ms says how fast the origin refuses, and a share of such fast
    /// errors would pull the percentile down until every request there were hedged.
    Adaptive {
        /// The percentile as a fraction, in `(0, 1)`.
        quantile: f64,
        /// The shortest delay, whatever the estimate.
        min: Duration,
        /// The longest delay, and the delay while the origin has too few samples.
        max: Duration,
    },
}

/// Hedged requests for [`RetryMiddleware`](super::RetryMiddleware)
/// ([`RetryMiddlewareBuilder::hedging`](super::RetryMiddlewareBuilder::hedging), also
/// the retry handed to [`Resilience::retry`](crate::Resilience::retry)).
///
/// For a request whose body can be cloned and whose method is safe (GET, HEAD, OPTIONS,
/// TRACE), or, with [`hedge_idempotent(true)`](Self::hedge_idempotent), a PUT, a DELETE
/// or a request marked [`Idempotent(true)`](super::Idempotent) (per request,
/// [`Hedge`](super::Hedge) decides instead): when the attempt has no response head after
/// the [delay](HedgeDelay), another copy is sent, up to [`max_hedges`](Self::max_hedges)
/// per logical request. An `Idempotency-Key` makes a *sequential* retry safe, not a
/// concurrent duplicate (servers answer one that arrives while the original is processing
/// `409 Conflict`), so it never makes a request hedged by itself.
///
/// The first copy to come back with an outcome the retry decision would keep (a response
/// it does not retry, or a permanent failure) wins; the others are dropped, which cancels
/// them (an HTTP/1 connection is closed, an HTTP/2 stream reset). A copy that fails in a way the decision would retry
/// does not end the race while another copy is in flight; when it is the last, the retry
/// loop decides as for any attempt, so one logical request sends at most
/// `1 + max_retries + max_hedges` copies (copies, not wire requests: with `BearerAuth`
/// each may be replayed once after a `401`, see [`max_hedges`](Self::max_hedges)).
///
/// A hedge is never sent for a request not eligible as above or a body that cannot be
/// cloned, when it would start at or past the deadline, or when the
/// [hedge budget](Self::budget) is spent. A hedge refused on this side before anything
/// was sent — by an open breaker or a pause (the breaker turns a hedge away at once,
/// without waiting, and never lets it take a half-open probe slot), by the
/// [concurrency limit](crate::limit::ConcurrencyLimit), for want of a bearer token, or by
/// a misconfigured stack — leaves the race to the copies that were sent: it is never the
/// result and cancels nothing, nothing of it is recorded, its budget is given back, and
/// no further hedge is tried for that attempt.
///
/// In the [`AttemptHistory`](crate::AttemptHistory) every copy that went out is an attempt: the winner last (the
/// retry's decision lands on it), before it the copies that failed first and the cancelled
/// losers (`Unknown` /
/// [`FailureKind::Cancelled`](crate::evidence::FailureKind::Cancelled)), each with
/// [`AttemptDecision::Superseded`](crate::evidence::AttemptDecision::Superseded) naming the
/// winner. The breaker counts the winner's outcome and each failed copy's, never a
/// cancelled loser.
///
/// # Budget
///
/// A hedge budget of its own (by default 5 % of hedge-eligible requests, at least one
/// hedge per second, over 10 s), beside the retry budget and not shared with it: a hedge
/// answers a slow server, a retry a failing one, and a burst of slowness must not use up
/// the retries a failing server needs (nor an outage's retries stop hedging). Dean and
/// Barroso's p95 delay sends about 5 % more requests: the budget lets that through and
/// caps a server whose latency moves faster than the estimate at 1.05× the load. Choose
/// an adaptive percentile whose share of hedged requests (`1 − quantile`) fits the
/// budget: with p90 and a 5 % budget the budget runs dry, and the hedges it allows go to
/// whichever copies cross the delay first, most of them about to answer anyway.
///
/// The budget is one for every origin the middleware serves (as the retry budget is):
/// it caps the middleware's extra load, wherever it goes. The delay is per origin, and
/// error answers do not lower it (see [`HedgeDelay::Adaptive`]), so one origin's fast
/// errors do not make its requests spend the budget the others' slow tails need.
///
/// # Cost
///
/// The first copy runs as a plain attempt does (on the caller's extensions, with what the
/// retry lends a plain attempt, no scope handed inward when nothing can cut it), against
/// the timer of the first hedge; answered first, it is finished as a plain attempt is,
/// and nothing is merged. Until that timer fires no race is built: the hedges are copied
/// from the request the retry keeps for a retry (a request it keeps none of is copied
/// once, up front), and each hedge's extensions — a copy of the caller's (what this
/// crate's own middlewares put there for the request, and yours), merged back afterwards
/// — are made only when it is sent. Extensions holding anything besides the stack's own
/// record and deadline are cloned once before the first copy leaves (it runs on them). An
/// answer faster than the delay costs 1 allocation more than the unhedged retry loop (the
/// round's future; `tests/alloc_budget.rs`, with the caller passing no extensions), 2
/// with a deadline or an attempt timeout (the flag that tells a cancelled loser's
/// breaker it lost), and about 2 500 instructions (`benches/instructions.rs`, end to
/// end). Requests that are not eligible pay nothing.
///
/// # Cancel safety
///
/// Dropping the request's future drops every copy in flight (the first copy runs in place
/// in the round's future, each hedge is a future it owns); a copy dropped that way is a
/// cancellation for its breaker, as any dropped attempt is. Dropped before the first
/// hedge was due, nothing of the race exists yet: the first copy is cancelled as a plain
/// attempt would be, and no hedge budget was taken. A hedge taken from the budget and sent
/// is not given back (one cancelled while it waited in a limiter's queue counts as sent:
/// nothing below tells).
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::retry::Hedging;
/// use reqwest_resilience::RetryMiddleware;
///
/// // A copy after the origin's p95 latency (between 5 ms and 1 s), at most one per request.
/// let retry = RetryMiddleware::builder()
///     .hedging(Hedging::adaptive(0.95).delay_bounds(Duration::from_millis(5), Duration::from_secs(1)))
///     .build()?;
/// # drop(retry);
/// # Ok::<(), reqwest_resilience::ResilienceError>(())
/// ```
#[derive(Clone)]
pub struct Hedging {
    delay: HedgeDelay,
    max_hedges: u32,
    /// Whether PUT, DELETE and `Idempotent(true)` requests are hedged too.
    idempotent: bool,
    budget: Option<RetryBudget>,
    latencies: Arc<LatencyTracker>,
}

impl std::fmt::Debug for Hedging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hedging")
            .field("delay", &self.delay)
            .field("max_hedges", &self.max_hedges)
            .field("hedge_idempotent", &self.idempotent)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

/// The most hedges of one request (gRPC A6 caps `maxAttempts` at 5).
const MAX_HEDGES: u32 = 4;

/// The default adaptive delay's bounds: at least 1 ms (below that a hedge races the
/// scheduler, not the server), and 2 s (Polly's default hedging delay) at most and while
/// the origin has too few samples.
const ADAPTIVE_MIN: Duration = Duration::from_millis(1);
const ADAPTIVE_MAX: Duration = Duration::from_secs(2);

impl Hedging {
    /// Hedges after a fixed `delay`.
    pub fn fixed(delay: Duration) -> Self {
        Hedging::with_delay(HedgeDelay::Fixed(delay), 0.5)
    }

    /// Hedges after the `quantile` (e.g. `0.95`) of the origin's recent first-attempt
    /// latencies, kept within 1 ms..=2 s ([`delay_bounds`](Self::delay_bounds)); 2 s until
    /// the origin has 32 samples. See the [estimator](HedgeDelay::Adaptive) for its
    /// memory (about 1 KiB per origin) and speed (it follows a change within 256 samples).
    pub fn adaptive(quantile: f64) -> Self {
        Hedging::with_delay(
            HedgeDelay::Adaptive {
                quantile,
                min: ADAPTIVE_MIN,
                max: ADAPTIVE_MAX,
            },
            quantile,
        )
    }

    fn with_delay(delay: HedgeDelay, quantile: f64) -> Self {
        Hedging {
            delay,
            max_hedges: 1,
            idempotent: false,
            budget: Some(default_budget()),
            latencies: Arc::new(LatencyTracker::new(quantile)),
        }
    }

    /// The bounds of an adaptive delay (no effect on a fixed one).
    pub fn delay_bounds(mut self, min: Duration, max: Duration) -> Self {
        if let HedgeDelay::Adaptive { quantile, .. } = self.delay {
            self.delay = HedgeDelay::Adaptive { quantile, min, max };
        }
        self
    }

    /// Extra copies per logical request (default 1, at most 4): at most `1 + max_hedges`
    /// in flight. Each waits one more delay after the previous one. The ceiling is gRPC
    /// A6's: five copies of one request in all.
    ///
    /// The bound counts copies, not wire requests: under
    /// [`BearerAuth`](crate::auth::BearerAuth) each copy may be replayed once after a `401`
    /// with a fresh token, so `1 + max_hedges` copies can be up to `2 × (1 + max_hedges)`
    /// requests on the wire (and with reqwest following redirects inside each, more
    /// hops).
    pub fn max_hedges(mut self, max_hedges: u32) -> Self {
        self.max_hedges = max_hedges;
        self
    }

    /// Whether PUT, DELETE and requests marked [`Idempotent(true)`](super::Idempotent) are
    /// hedged too (default `false`: only the safe methods, GET, HEAD, OPTIONS and TRACE).
    ///
    /// Idempotent means that a request repeated *after* the first has been processed does
    /// no more harm; a hedge is a *concurrent* duplicate, sent while the first may still be
    /// processing, and servers answer that differently: a DELETE's duplicate gets `404`
    /// while the original succeeds, a conditional PUT's `412`, and a request with an
    /// `Idempotency-Key` (the IETF draft, Stripe-style APIs) `409 Conflict`, any of which
    /// may win the race while the original's effect goes through on the cancelled copy.
    /// Opt in when the server answers a concurrent duplicate as it does the original. An
    /// `Idempotency-Key` alone never makes a request hedged, with this setting or without;
    /// per request, [`Hedge`](super::Hedge) decides.
    pub fn hedge_idempotent(mut self, hedge: bool) -> Self {
        self.idempotent = hedge;
        self
    }

    /// The hedge budget (default 5 % of eligible requests, at least 1 hedge/s, over 10 s).
    /// Clones of one budget share it.
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// No hedge budget: every delay that passes sends a hedge.
    pub fn no_budget(mut self) -> Self {
        self.budget = None;
        self
    }

    /// The configured delay.
    pub fn hedge_delay(&self) -> HedgeDelay {
        self.delay
    }

    /// The hedge budget, shared with clones.
    pub fn hedge_budget(&self) -> Option<&RetryBudget> {
        self.budget.as_ref()
    }

    /// The delay a request to `origin` would wait now before its first hedge.
    pub fn current_delay(&self, origin: &Origin) -> Duration {
        self.delay_from(self.latencies.estimate(origin))
    }

    pub(super) fn validate(&self) -> Result<(), ResilienceError> {
        let invalid = |why: &str| Err(ResilienceError::InvalidConfig(why.to_owned()));
        if !(1..=MAX_HEDGES).contains(&self.max_hedges) {
            return invalid("max_hedges must be within 1..=4 (leave hedging off for none)");
        }
        if let HedgeDelay::Adaptive { quantile, min, max } = self.delay {
            if !(quantile > 0.0 && quantile < 1.0) {
                return invalid("the hedging quantile must be within (0, 1), e.g. 0.95");
            }
            if min > max {
                return invalid("the hedging delay bounds must have min <= max");
            }
        }
        Ok(())
    }

    /// Whether a request the retry treats as `idempotent` (or not) may be hedged: its
    /// [`Hedge`](super::Hedge) extension, else a safe method, or, with
    /// [`hedge_idempotent`](Self::hedge_idempotent), PUT, DELETE or `Idempotent(true)`.
    #[inline]
    pub(super) fn eligible(
        &self,
        method: &http::Method,
        extensions: &Extensions,
        idempotent: bool,
    ) -> bool {
        use http::Method;
        if !idempotent {
            return false;
        }
        if let Some(super::Hedge(hedge)) = extensions.get::<super::Hedge>() {
            return *hedge;
        }
        let safe = matches!(
            *method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        );
        safe || (self.idempotent
            && (matches!(*method, Method::PUT | Method::DELETE)
                || extensions.get::<super::Idempotent>() == Some(&super::Idempotent(true))))
    }

    /// Called once per eligible logical request.
    pub(super) fn deposit(&self) {
        if let Some(b) = &self.budget {
            b.deposit();
        }
    }

    pub(super) fn max(&self) -> u32 {
        self.max_hedges
    }
}

fn default_budget() -> RetryBudget {
    RetryBudget::new(Duration::from_secs(10), 1, 0.05)
        .unwrap_or_else(|_| unreachable!("the default hedge budget is valid"))
}

/// What one hedged round needs from the retry loop.
pub(super) struct RoundSpec {
    pub(super) deadline: Option<Instant>,
    pub(super) attempt_timeout: Option<Duration>,
    /// Hedges this logical request may still send.
    pub(super) hedges_left: u32,
    /// The attempt number of the round's first copy.
    pub(super) attempt: u32,
    /// The request's origin: whose latencies the adaptive delay reads.
    pub(super) origin: Origin,
    /// The retry middleware's place in the request (the first copy runs on its
    /// extensions; each hedge is owned on extensions of its own).
    pub(super) owner: crate::stage::scope::Ownership,
}

/// A round's outcome: the winner's result, its extensions merged into the caller's (its
/// evidence there, every copy in the history, the winner last).
pub(super) struct Round {
    pub(super) result: reqwest_middleware::Result<Response>,
    /// Copies sent besides the first.
    pub(super) hedges: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_delay_never_panics_on_bounds_a_build_would_refuse() {
        let origin = Origin::parse("http://a.example").unwrap();
        let hedging = Hedging::adaptive(0.5);
        let window = hedging.latencies.window(&origin);
        for _ in 0..64 {
            hedging.latencies.record(&window, Duration::from_millis(20));
        }
        assert_eq!(hedging.current_delay(&origin), Duration::from_millis(20));
        // A clone shares the estimates; its inverted bounds are refused at build time, and
        // reading its delay gives the upper bound instead of a panic.
        let inverted = hedging
            .clone()
            .delay_bounds(Duration::from_secs(2), Duration::from_secs(1));
        assert!(inverted.validate().is_err());
        assert_eq!(inverted.current_delay(&origin), Duration::from_secs(1));
    }
}
