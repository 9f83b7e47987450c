//! The retry middleware's configuration: [`RetryMiddleware`] (a handle on it), its
//! [`RetryMiddlewareBuilder`] and the defaults, checked once in
//! [`build`](RetryMiddlewareBuilder::build).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::backoff::{Backoff, RandomSource, ThreadRandom};
use crate::error::ResilienceError;
use crate::origin::Origin;
use crate::record::{AttemptHistory, FailureKind, RequestEvidence};
use crate::retry::{
    BeforeSleep, DEFAULT_MAX_NOT_PROCESSED_RETRIES, DefaultStrategy, ErrorWrapping, Hedging,
    RetryBudget, RetryNotice, RetryStrategy,
};

/// What to do with a `Retry-After` longer than the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RetryAfterPolicy {
    /// Wait the cap instead (the default).
    #[default]
    Clamp,
    /// Do not retry: return the response as received.
    GiveUp,
}

/// Retries failed attempts with backoff and jitter, honouring `Retry-After`, deciding retry
/// safety from the transport step's evidence, spending a shared [`RetryBudget`] and
/// respecting a total deadline.
///
/// Register it outermost, with [`TransportEvidence`](crate::TransportEvidence) innermost.
/// Defaults: 3 retries, [`Backoff::default`] (1 s, ×2, cap 30 s, ±10 % jitter),
/// `Retry-After` capped at 60 s (clamped), [`RetryBudget::default`], no deadline,
/// [`DefaultStrategy`], a final `reqwest::Error` returned as it came
/// ([`ErrorWrapping::ExceptReqwest`]).
///
/// Clones share the configuration and the budget.
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::{Backoff, Jitter, RetryMiddleware};
///
/// let retry = RetryMiddleware::builder()
///     .max_retries(5)
///     .backoff(Backoff::builder().base(Duration::from_millis(200)).jitter(Jitter::Full).build()?)
///     .total_deadline(Duration::from_secs(10))
///     .build()?;
/// # drop(retry);
/// # Ok::<(), reqwest_resilience::ResilienceError>(())
/// ```
///
/// # Final outcome
///
/// A response (successful, final, or the last retryable one) is returned unchanged. A final
/// error that is a `reqwest::Error` is returned as `reqwest_middleware::Error::Reqwest`,
/// as without this middleware: `is_connect()`, `is_timeout()`, `status()` and `url()`
/// answer as reqwest's do, so existing error handling keeps working. Any other final error
/// (an open breaker, a pause, no token, the deadline cutting the attempt) is
/// `reqwest_middleware::Error::Middleware` holding [`ResilienceError::Retry`]
/// ([`RetryError`]: attempts, stop reason, the last error as `source()`);
/// [`ResilienceError::find`] reaches the cause in both shapes.
///
/// How many attempts were made and why retrying stopped is always in the caller's
/// extensions as [`RetryOutcome`] (with the whole [`AttemptHistory`]), and on a response as
/// [`RetryOutcome`] and [`AttemptHistory::of_response`]. A bare `reqwest::Error` cannot carry
/// it: a caller who wants it beside the error, which stays reqwest's own, sends with
/// [`send_with_history()`](crate::SendWithHistory) (which also keeps the extensions set
/// on the request builder); one who wants it *inside* every error opts into
/// [`ErrorWrapping::Always`] ([`error_wrapping`](RetryMiddlewareBuilder::error_wrapping),
/// or `wrap_errors(true)`), at the cost of `is_timeout()`/`is_connect()`/`status()`;
/// [`ErrorWrapping::Never`] returns every error unwrapped.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use http::Extensions;
/// use reqwest_resilience::retry::RetryOutcome;
/// use reqwest_resilience::{RetryMiddleware, TransportEvidence};
/// use reqwest_resilience::redirect::{self, ClientRedirects};
///
/// let recorded = redirect::recorded(reqwest::redirect::Policy::default()); // every hop seen
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::builder().redirect(recorded).build()?)
///     .with(RetryMiddleware::new())
///     .with(TransportEvidence::with_client_redirects(ClientRedirects::Recorded))
///     .build();
/// let request = client.get("http://127.0.0.1:1/").build()?;
/// let mut extensions = Extensions::new();
/// if let Err(e) = client.execute_with_extensions(request, &mut extensions).await {
///     let outcome = RetryOutcome::of(&extensions);
///     eprintln!("connect error: {}, after {:?}", e.is_connect(), outcome.map(|o| o.attempts));
/// }
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Dropping the future stops the retry loop at once (during an attempt or a sleep). A
/// retry taken from the budget for a backoff that is dropped is given back. What stays
/// behind is harmless: the records already in the caller's [`AttemptHistory`], and, when
/// the deadline came from [`total_deadline`](RetryMiddlewareBuilder::total_deadline), the
/// [`Deadline`] it handed to the inner middlewares through the caller's extensions (the
/// next request through this middleware recognises it and sets its own). With
/// [hedging](RetryMiddlewareBuilder::hedging), every copy in flight is dropped with it.
///
/// [`RetryError`]: crate::retry::RetryError
/// [`RetryOutcome`]: crate::retry::RetryOutcome
/// [`AttemptHistory`]: crate::AttemptHistory
/// [`AttemptHistory::of_response`]: crate::AttemptHistory::of_response
/// [`Deadline`]: crate::retry::Deadline
#[derive(Clone)]
pub struct RetryMiddleware {
    pub(super) config: Arc<Config>,
}

pub(super) struct Config {
    /// `None`: the default for the delays chosen ([`Config::max_retries`]).
    pub(super) max_retries: Option<u32>,
    pub(super) delays: Delays,
    pub(super) retry_after_cap: Duration,
    pub(super) retry_after_policy: RetryAfterPolicy,
    pub(super) budget: Option<RetryBudget>,
    pub(super) deadline: Option<Duration>,
    pub(super) strategy: Arc<dyn RetryStrategy>,
    pub(super) random: Arc<dyn RandomSource>,
    pub(super) error_wrapping: ErrorWrapping,
    pub(super) attempt_timeout: Option<Duration>,
    pub(super) hedging: Option<Hedging>,
    /// The cap on [`RetryReason::NotProcessed`](crate::retry::RetryReason::NotProcessed)
    /// retries per request.
    pub(super) max_not_processed_retries: u32,
    /// The longest open breaker's "retry in" a request waits out
    /// ([`RetryMiddlewareBuilder::wait_for_open_breakers`]); `None`: it fails at once.
    pub(super) open_breaker_wait: Option<Duration>,
    /// The proxies of the stack's pool (0: none): a request stops retrying proxies whose
    /// connects time out once each of them has ([`Config::proxy_timeouts_spent`]).
    pub(super) proxies: u32,
    /// Called before each retry's wait.
    pub(super) before_sleep: Option<Arc<BeforeSleep>>,
    /// The level of the event before each retry.
    #[cfg(feature = "tracing")]
    pub(super) retry_event_level: tracing::Level,
}

/// Where backoff delays come from.
#[derive(Clone)]
pub(in crate::retry) enum Delays {
    Backoff(Backoff),
    /// An external policy (the `retry_policies` adapter): `(start, retries so far)` to a
    /// delay, or `None` to stop.
    #[cfg_attr(not(feature = "retry-policies"), allow(dead_code))]
    External(Arc<dyn Fn(SystemTime, u32) -> Option<Duration> + Send + Sync>),
}

impl Default for RetryMiddleware {
    fn default() -> Self {
        RetryMiddleware::new()
    }
}

impl RetryMiddleware {
    /// A retry middleware with the defaults.
    pub fn new() -> Self {
        RetryMiddleware::builder()
            .build()
            .unwrap_or_else(|_| unreachable!("the defaults are valid"))
    }

    /// A builder starting from the defaults.
    pub fn builder() -> RetryMiddlewareBuilder {
        RetryMiddlewareBuilder {
            config: Config {
                max_retries: None,
                delays: Delays::Backoff(Backoff::default()),
                retry_after_cap: Duration::from_secs(60),
                retry_after_policy: RetryAfterPolicy::Clamp,
                budget: Some(RetryBudget::default()),
                deadline: None,
                strategy: Arc::new(DefaultStrategy),
                random: Arc::new(ThreadRandom),
                error_wrapping: ErrorWrapping::ExceptReqwest,
                attempt_timeout: None,
                hedging: None,
                max_not_processed_retries: DEFAULT_MAX_NOT_PROCESSED_RETRIES,
                open_breaker_wait: None,
                proxies: 0,
                before_sleep: None,
                #[cfg(feature = "tracing")]
                retry_event_level: tracing::Level::WARN,
            },
        }
    }

    /// A builder starting from reqwest-retry's settings, the retry of
    /// [`Resilience::like_reqwest_retry`](crate::Resilience::like_reqwest_retry): 3
    /// retries, 1 s × 2 per retry capped at 30 minutes (retry-policies' default bounds),
    /// [`Jitter::Bounded`](crate::Jitter::Bounded), every `5xx`, 408 and 429 retried for
    /// an idempotent request ([`AnyServerError`](crate::retry::AnyServerError)), no retry
    /// budget. Every other setting is the default, and each can be changed on it:
    ///
    /// ```
    /// use reqwest_resilience::{Resilience, RetryMiddleware};
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::like_reqwest_retry()
    ///     .retry(RetryMiddleware::like_reqwest_retry().max_retries(5))
    ///     .build_from(reqwest::Client::builder())?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn like_reqwest_retry() -> RetryMiddlewareBuilder {
        let backoff = Backoff::builder()
            .base(Duration::from_secs(1))
            .factor(2.0)
            .max_delay(Duration::from_secs(30 * 60))
            .jitter(crate::backoff::Jitter::Bounded)
            .build()
            .unwrap_or_else(|_| unreachable!("reqwest-retry's bounds are valid"));
        RetryMiddleware::builder()
            .max_retries(3)
            .backoff(backoff)
            .strategy(crate::retry::AnyServerError)
            .no_budget()
    }

    /// The budget this middleware spends, shared with its clones.
    pub fn budget(&self) -> Option<&RetryBudget> {
        self.config.budget.as_ref()
    }
}

impl fmt::Debug for RetryMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        f.debug_struct("RetryMiddleware")
            .field("max_retries", &c.max_retries())
            .field(
                "backoff",
                &match &c.delays {
                    Delays::Backoff(b) => Some(b),
                    Delays::External(_) => None,
                },
            )
            .field("retry_after_cap", &c.retry_after_cap)
            .field("retry_after_policy", &c.retry_after_policy)
            .field("budget", &c.budget)
            .field("deadline", &c.deadline)
            .field("attempt_timeout", &c.attempt_timeout)
            .field("hedging", &c.hedging)
            .field("max_not_processed_retries", &c.max_not_processed_retries)
            .field("open_breaker_wait", &c.open_breaker_wait)
            .field("error_wrapping", &c.error_wrapping)
            .field("before_sleep", &c.before_sleep.is_some())
            .finish_non_exhaustive()
    }
}

/// Builds a [`RetryMiddleware`]; see its documentation for the defaults.
pub struct RetryMiddlewareBuilder {
    config: Config,
}

impl fmt::Debug for RetryMiddlewareBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        f.debug_struct("RetryMiddlewareBuilder")
            .field("max_retries", &c.max_retries)
            .field("retry_after_cap", &c.retry_after_cap)
            .field("deadline", &c.deadline)
            .finish_non_exhaustive()
    }
}

impl RetryMiddlewareBuilder {
    /// Retries after the first attempt (default 3; 0 disables retrying).
    pub fn max_retries(mut self, max_retries: u32) -> Self {
        self.config.max_retries = Some(max_retries);
        self
    }

    /// The backoff between attempts (default [`Backoff::default`]).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.config.delays = Delays::Backoff(backoff);
        self
    }

    /// The most retries one request takes on the server's proof that it did not process
    /// an attempt ([`RetryReason::NotProcessed`]: HTTP/2 `REFUSED_STREAM`) and, for an
    /// idempotent request, after the server's `GOAWAY` ([`RetryReason::GoAway`]: a
    /// connection rotation, which through hyper proves nothing for a POST); default
    /// 5, 0 turns them off.
    ///
    /// [`RetryReason::NotProcessed`]: crate::retry::RetryReason::NotProcessed
    /// [`RetryReason::GoAway`]: crate::retry::RetryReason::GoAway
    ///
    /// A refused stream is as safe to send again as a request never sent, for any method;
    /// both are what a server at its stream limit or rotating its connections (nginx's
    /// `keepalive_requests`) asks for: they are taken at once (no backoff) and are not
    /// counted against [`max_retries`](Self::max_retries) (whose 0 still disables every
    /// retry), but against this cap; a refused stream spends the
    /// [retry budget](Self::budget) like any retry (a rotation does not), so a server that
    /// refuses everything gets at most `1 + cap` attempts of a request. reqwest retries a
    /// refused stream itself too, below this middleware (twice by default;
    /// `reqwest::ClientBuilder::retry(reqwest::retry::never())` turns that off).
    pub fn max_not_processed_retries(mut self, cap: u32) -> Self {
        self.config.max_not_processed_retries = cap;
        self
    }

    #[cfg_attr(not(feature = "retry-policies"), allow(dead_code))]
    pub(in crate::retry) fn delays(mut self, delays: Delays) -> Self {
        self.config.delays = delays;
        self
    }

    /// The longest `Retry-After` honoured (default 60 s), and what to do beyond it.
    pub fn retry_after_cap(mut self, cap: Duration, policy: RetryAfterPolicy) -> Self {
        self.config.retry_after_cap = cap;
        self.config.retry_after_policy = policy;
        self
    }

    /// The retry budget (default [`RetryBudget::default`]). Pass a clone of one budget to
    /// several middlewares to share it.
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.config.budget = Some(budget);
        self
    }

    /// No retry budget: every retry the strategy allows is taken.
    pub fn no_budget(mut self) -> Self {
        self.config.budget = None;
        self
    }

    /// A total deadline per logical request (default none): no retry whose delay would end
    /// past it, and an attempt still running at it is cut (a
    /// [`CircuitBreakerMiddleware`](crate::breaker::CircuitBreakerMiddleware) inside,
    /// which sees the same deadline, cuts it first and counts it as a timeout). The
    /// per-request [`Deadline`](crate::retry::Deadline) extension replaces it.
    pub fn total_deadline(mut self, total: Duration) -> Self {
        self.config.deadline = Some(total);
        self
    }

    /// Waits out an open circuit breaker, when it will let requests through again within
    /// `max_wait` and before the request's deadline. Off by default: a request an open
    /// breaker turns away ([`FailureKind::BreakerOpen`](crate::FailureKind::BreakerOpen),
    /// `NotSent`: the stack's breaker, or a [proxy pool](crate::proxy) whose every proxy's
    /// breaker is open) fails at once with
    /// [`ResilienceError::BreakerOpen`](crate::ResilienceError::BreakerOpen)
    /// ([`StopReason::BreakerRejected`](crate::retry::StopReason::BreakerRejected)): a
    /// breaker is there to fail fast, and a request that sleeps out its open period (30 s by
    /// default, longer with [`OpenGrowth`](crate::breaker::OpenGrowth)) is a request that
    /// hangs. With it, the retry waits the breaker's remaining open period ("retry in")
    /// when that is at most `max_wait` and ends no later than the request's
    /// [`Deadline`](crate::retry::Deadline) (or [`total_deadline`](Self::total_deadline)),
    /// then spends one retry on the probe; otherwise the request fails at once
    /// ([`StopReason::BreakerRejected`](crate::retry::StopReason::BreakerRejected), or
    /// [`DeadlineExceeded`](crate::retry::StopReason::DeadlineExceeded) when the wait would
    /// pass the deadline). A server-directed pause (`Retry-After`,
    /// [`FailureKind::Paused`](crate::FailureKind::Paused)) is not an open breaker: it is
    /// waited out as before, with or without this.
    ///
    /// ```
    /// use std::time::Duration;
    /// use reqwest_resilience::RetryMiddleware;
    ///
    /// // A batch job that would rather wait for a recovering server than fail.
    /// let retry = RetryMiddleware::builder()
    ///     .wait_for_open_breakers(Duration::from_secs(30))
    ///     .total_deadline(Duration::from_secs(120))
    ///     .build()?;
    /// # drop(retry);
    /// # Ok::<(), reqwest_resilience::ResilienceError>(())
    /// ```
    pub fn wait_for_open_breakers(mut self, max_wait: Duration) -> Self {
        self.config.open_breaker_wait = Some(max_wait);
        self
    }

    /// Replaces the decision table.
    pub fn strategy(mut self, strategy: impl RetryStrategy) -> Self {
        self.config.strategy = Arc::new(strategy);
        self
    }

    /// The random source for jitter (default the thread-local generator); use
    /// [`SeededRandom`](crate::backoff::SeededRandom) for reproducible tests.
    pub fn random_source(mut self, random: Arc<dyn RandomSource>) -> Self {
        self.config.random = random;
        self
    }

    /// Which final errors are wrapped in [`ResilienceError::Retry`] (default
    /// [`ErrorWrapping::ExceptReqwest`]: all but a `reqwest::Error`).
    pub fn error_wrapping(mut self, wrapping: ErrorWrapping) -> Self {
        self.config.error_wrapping = wrapping;
        self
    }

    /// `true`: every final error is wrapped in [`ResilienceError::Retry`]
    /// ([`ErrorWrapping::Always`]); `false`: none is ([`ErrorWrapping::Never`]). Without
    /// this call, all but a `reqwest::Error` are ([`ErrorWrapping::ExceptReqwest`]).
    pub fn wrap_errors(mut self, wrap: bool) -> Self {
        self.config.error_wrapping = if wrap {
            ErrorWrapping::Always
        } else {
            ErrorWrapping::Never
        };
        self
    }

    /// Bounds each attempt's wait for its response head (default: none), counted from
    /// when the request leaves for the network: a
    /// [`CircuitBreakerMiddleware`](crate::breaker::CircuitBreakerMiddleware) or
    /// [`ConcurrencyLimit`](crate::limit::ConcurrencyLimit) inside restarts the clock when
    /// it lets the request go, and a wait for a pause or in the limiter's queue is not
    /// part of it (the deadline bounds that wait). A cut attempt is
    /// `Unknown` / [`Timeout`](crate::FailureKind::Timeout), so only an idempotent request is
    /// retried after it, and a
    /// [`CircuitBreakerMiddleware`](crate::breaker::CircuitBreakerMiddleware) inside counts
    /// it as a failure. A body streamed after the head is not cut, and the total deadline
    /// still bounds everything. The per-request [`AttemptTimeout`](crate::retry::AttemptTimeout)
    /// extension replaces it.
    ///
    /// Off by default on purpose: endpoints such as LLM APIs take well over 10 s to their
    /// first byte, and a default like Polly's 10 s attempt timeout would cut (and, for an
    /// idempotent request, repeat) every one of their calls.
    ///
    /// ```
    /// use std::time::Duration;
    /// use reqwest_resilience::RetryMiddleware;
    ///
    /// let retry = RetryMiddleware::builder()
    ///     .attempt_timeout(Duration::from_secs(2))
    ///     .total_deadline(Duration::from_secs(10))
    ///     .build()?;
    /// # drop(retry);
    /// # Ok::<(), reqwest_resilience::ResilienceError>(())
    /// ```
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.config.attempt_timeout = Some(timeout);
        self
    }

    /// Calls `hook` before each retry's wait (also before a retry taken at once, with a zero
    /// delay), with the attempt that failed, its evidence, its error or status, why it is
    /// retried and the delay: to tell a user that a request is being retried while it is,
    /// not after it ended ([`AttemptHistory`](crate::AttemptHistory) has it all afterwards).
    /// The hook runs on the request's task, inside the retry loop: keep it short and do not
    /// block.
    ///
    /// ```
    /// use reqwest_resilience::RetryMiddleware;
    ///
    /// let retry = RetryMiddleware::builder()
    ///     .before_sleep(|notice| {
    ///         eprintln!(
    ///             "attempt {} failed ({}), retrying in {:?}",
    ///             notice.attempt,
    ///             notice.error_messages().join(": "),
    ///             notice.delay
    ///         )
    ///     })
    ///     .build()?;
    /// # drop(retry);
    /// # Ok::<(), reqwest_resilience::ResilienceError>(())
    /// ```
    pub fn before_sleep(mut self, hook: impl Fn(&RetryNotice<'_>) + Send + Sync + 'static) -> Self {
        self.config.before_sleep = Some(Arc::new(hook));
        self
    }

    /// The level of the `tracing` event emitted before each retry (default `WARN`, with
    /// the error's text and its "Caused by" chain; target `reqwest_resilience::retry`).
    #[cfg(feature = "tracing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
    pub fn retry_event_level(mut self, level: tracing::Level) -> Self {
        self.config.retry_event_level = level;
        self
    }

    /// Hedged requests (default: off): see [`Hedging`] for when a copy is sent, how the
    /// first answer wins and what bounds the extra load.
    pub fn hedging(mut self, hedging: Hedging) -> Self {
        self.config.hedging = Some(hedging);
        self
    }

    /// The retry in front of a pool of `proxies`: its limit raised to `retries` when it is
    /// lower (the retries to try every proxy), and a proxy whose connect timed out tried
    /// once per request.
    pub(crate) fn for_proxy_pool(mut self, proxies: usize, retries: u32) -> Self {
        if self.config.max_retries() < retries {
            self.config.max_retries = Some(retries);
        }
        self.config.proxies = u32::try_from(proxies).unwrap_or(u32::MAX);
        self
    }

    /// The total deadline and the shortest delay the jitter can draw before the first
    /// retry, when the deadline leaves no room for that retry (or is zero).
    pub(crate) fn deadline_before_first_retry(&self) -> Option<(Duration, Duration)> {
        let total = self.config.deadline?;
        let Delays::Backoff(backoff) = &self.config.delays else {
            return None;
        };
        let first_delay = backoff.jitter().apply(backoff.base_delay(0), 0.0);
        (total.is_zero() || total < first_delay).then_some((total, first_delay))
    }

    /// Checks the configuration.
    ///
    /// # Errors
    ///
    /// [`ResilienceError::InvalidConfig`] when the `Retry-After` cap exceeds one day, the
    /// attempt timeout is zero, or the [`Hedging`] settings are out of range.
    pub fn build(self) -> Result<RetryMiddleware, ResilienceError> {
        self.check()?;
        Ok(RetryMiddleware {
            config: Arc::new(self.config),
        })
    }

    /// What [`build`](Self::build) checks, without building (the stack checks a retry it
    /// hands out before it takes the builder: `Resilience::retry_middleware`).
    pub(crate) fn check(&self) -> Result<(), ResilienceError> {
        if let Some(h) = &self.config.hedging {
            h.validate()?;
        }
        if self.config.attempt_timeout == Some(Duration::ZERO) {
            return Err(ResilienceError::InvalidConfig(
                "attempt_timeout must be longer than zero".to_owned(),
            ));
        }
        if self.config.retry_after_cap > Duration::from_secs(24 * 60 * 60) {
            return Err(ResilienceError::InvalidConfig(
                "retry_after_cap must not exceed one day".to_owned(),
            ));
        }
        Ok(())
    }
}

impl Config {
    /// Whether a retry after `evidence`, an attempt whose connect through a proxy of the
    /// pool timed out, would only wait on a dead proxy again: this proxy had timed out
    /// earlier in this request, or each proxy of the pool has (`history` holds this
    /// attempt). Then the request stops, [`StopReason::ConnectTimedOut`](crate::retry::StopReason::ConnectTimedOut).
    #[inline]
    pub(super) fn proxy_timeouts_spent(
        &self,
        evidence: &RequestEvidence,
        history: &AttemptHistory,
    ) -> bool {
        self.proxies > 0
            && evidence.charged_to_proxy
            && evidence.failure == Some(FailureKind::ConnectTimeout)
            && proxies_timed_out(evidence, history, self.proxies)
    }

    /// The retry limit: the configured one, else the default for the delays chosen.
    #[inline]
    pub(super) fn max_retries(&self) -> u32 {
        self.max_retries.unwrap_or(match self.delays {
            Delays::Backoff(_) => 3,
            // An external policy carries its own retry limit.
            Delays::External(_) => u32::MAX,
        })
    }
}

/// Whether `evidence`'s proxy timed out connecting before in `history`, or `proxies`
/// distinct proxies have.
#[cold]
fn proxies_timed_out(evidence: &RequestEvidence, history: &AttemptHistory, proxies: u32) -> bool {
    let mut timed_out: Vec<&Origin> = Vec::new();
    let mut this_one = 0;
    for e in history.attempts().iter().map(|r| &r.evidence) {
        let Some(proxy) = e.proxy.as_ref() else {
            continue;
        };
        if !(e.charged_to_proxy && e.failure == Some(FailureKind::ConnectTimeout)) {
            continue;
        }
        if evidence.proxy.as_ref() == Some(proxy) {
            this_one += 1;
        }
        if !timed_out.contains(&proxy) {
            timed_out.push(proxy);
        }
    }
    this_one > 1 || timed_out.len() >= usize::try_from(proxies).unwrap_or(usize::MAX)
}
