//! [`Resilience`]: the whole stack, in the right order, with the design's defaults, in
//! one builder (the analogue of Polly's `AddStandardResilienceHandler`).
//!
//! ```text
//! [your outer middleware] → Retry → CircuitBreaker → [RateLimit] → [ConcurrencyLimit] → BearerAuth → [per_attempt] → TransportEvidence → reqwest::Client
//! ```
//!
//! - **Retry outermost**: every attempt passes through the breaker, gets a fresh token
//!   and is observed by the transport step (Polly's standard pipeline also puts retry
//!   outside the breaker).
//! - **Breaker outside `BearerAuth`**: it sees the outcome *after* a `401` was healed by a
//!   refresh and a replay, so a routine token expiry does not count against the server.
//! - **The token before the breaker and the limiter**: the stack fetches an attempt's
//!   bearer token before the breaker and the concurrency limit admit it, so a request
//!   waiting for its token holds no half-open probe slot and no limiter permit (a token
//!   source that fetches from the same origin through the same breaker registry would
//!   otherwise be refused by the probe its own request holds). A request that gets no
//!   token is `NotSent` / `TokenUnavailable` and never reaches them. Used alone,
//!   `BearerAuth` fetches where it stands: under a `CircuitBreakerMiddleware` of yours,
//!   its token wait holds the breaker's permit.
//! - **`TransportEvidence` innermost**: only there is the raw `reqwest::Error` seen before
//!   anything interprets it. It is always installed: every decision above reads it.
//!
//! Your own middleware goes either *around* the stack (one call per logical request:
//! build a `ClientBuilder` with it and hand that to [`Resilience::install`]) or *per
//! attempt* ([`Resilience::per_attempt`]: between `BearerAuth` and the transport step, so
//! it sees every request that goes on the wire, a `401` replay included). Put
//! `reqwest-tracing`'s `TracingMiddleware` per attempt to get the `client` span per
//! physical request that OpenTelemetry's HTTP conventions ask for, under this crate's
//! `internal` span of the logical call (feature `tracing`). reqwest-tracing records no
//! `http.request.resend_count`: the attempt number is on this crate's per-attempt
//! events, in the [`RequestEvidence`] and in the history. Around the stack it gives one
//! `client` span per call instead (this crate's span, `internal`, then nests inside it).
//! The stack is installed as one middleware whose stages are nested at compile time
//! (`src/stack/compose.rs`, over the stage vocabulary of `src/stage/`): one boxed future
//! per request for all of them (and one per attempt below the retry loop) instead of one
//! per layer, the origin worked out once per logical request, the bearer token fetched
//! before the breaker and the limiter admit an attempt, and `BearerAuth` replaying a
//! `401` from the retry's copy of the request. With a
//! [`per_attempt`](Resilience::per_attempt) middleware, the transport step follows it as
//! a middleware of its own.
//!
//! A middleware cannot be added with `.with()` *after* the stack (the [`StackBuilder`]
//! has no `.with()`): it would land inside the transport step.
//!
//! ```
//! use reqwest_resilience::Resilience;
//!
//! # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
//! // The client built with the redirect policy the stack watches (`build(client)` takes
//! // one you built; see `client_redirects`).
//! let client = Resilience::new().build_from(reqwest::Client::builder())?;
//! // use `client` exactly like a reqwest::Client: client.get(url).send().await
//! # drop(client); Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware};

#[cfg(feature = "astral")]
mod astral;
pub(crate) mod compose;
use crate::stage::{Handover, RestOfStack, Stage, standalone_middleware};
#[cfg(feature = "astral")]
#[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
pub use astral::AstralStackBuilder;

use crate::auth::BearerAuth;
use crate::backoff::Backoff;
use crate::breaker::{BreakerConfig, BreakerEvent, BreakerRegistry, CircuitBreakerMiddleware};
use crate::error::ResilienceError;
use crate::evidence::TransportEvidence;
use crate::limit::{LimitChoice, LimiterConfig, LimiterRegistry};
use crate::record::{AttemptDecision, AttemptHistory, RequestEvidence};
use crate::redirect::ClientRedirects;
use crate::retry::{
    BeforeSleep, ErrorWrapping, Hedging, RetryAfterPolicy, RetryBudget, RetryMiddleware,
    RetryMiddlewareBuilder, RetryNotice, RetryStrategy,
};

type AttemptHook = Arc<dyn Fn(&RequestEvidence, Option<&AttemptDecision>) + Send + Sync>;
type TransitionHook = Arc<dyn Fn(&BreakerEvent) + Send + Sync>;

pub use crate::error::{StackError, StackPart};

/// Which retry middleware the stack installs.
enum RetryChoice {
    Default,
    Prebuilt(RetryMiddleware),
    Off,
}

/// Which breaker the stack installs.
enum BreakerChoice {
    Default,
    Config(BreakerConfig),
    Registry(BreakerRegistry),
    Middleware(CircuitBreakerMiddleware),
    Off,
}

/// Settings applied to the default retry middleware; `None` keeps its default.
#[derive(Default)]
struct RetrySettings {
    max_retries: Option<u32>,
    backoff: Option<Backoff>,
    total_deadline: Option<Duration>,
    budget: Option<Option<RetryBudget>>,
    retry_after_cap: Option<(Duration, RetryAfterPolicy)>,
    error_wrapping: Option<ErrorWrapping>,
    attempt_timeout: Option<Duration>,
    hedging: Option<Hedging>,
    max_not_processed_retries: Option<u32>,
    strategy: Option<Arc<dyn RetryStrategy>>,
    before_sleep: Option<Arc<BeforeSleep>>,
    #[cfg(feature = "tracing")]
    retry_event_level: Option<tracing::Level>,
    /// Set by [`Resilience::like_reqwest_retry`] (the settings above it made), to name it
    /// in a conflict.
    like_reqwest_retry: bool,
}

impl RetrySettings {
    /// The strategy, the `before_sleep` hook and the retry event's level, where set.
    fn apply_decision_and_observers(
        &self,
        mut b: RetryMiddlewareBuilder,
    ) -> RetryMiddlewareBuilder {
        if let Some(strategy) = &self.strategy {
            b = b.strategy(strategy.clone());
        }
        if let Some(hook) = &self.before_sleep {
            let hook = hook.clone();
            b = b.before_sleep(move |notice| hook(notice));
        }
        #[cfg(feature = "tracing")]
        if let Some(level) = self.retry_event_level {
            b = b.retry_event_level(level);
        }
        b
    }

    /// The first setting made, for a conflict report.
    fn first_set(&self) -> Option<&'static str> {
        [
            // The preset sets several; it is the setting the user made.
            (self.like_reqwest_retry, "like_reqwest_retry"),
            (self.max_retries.is_some(), "max_retries"),
            (self.backoff.is_some(), "backoff"),
            (self.total_deadline.is_some(), "total_deadline"),
            (self.budget.is_some(), "retry_budget"),
            (self.retry_after_cap.is_some(), "retry_after_cap"),
            (self.error_wrapping.is_some(), "error_wrapping"),
            (self.attempt_timeout.is_some(), "attempt_timeout"),
            (self.hedging.is_some(), "hedging"),
            (
                self.max_not_processed_retries.is_some(),
                "max_not_processed_retries",
            ),
            (self.strategy.is_some(), "retry_strategy"),
            (self.before_sleep.is_some(), "before_sleep"),
            #[cfg(feature = "tracing")]
            (self.retry_event_level.is_some(), "retry_event_level"),
        ]
        .into_iter()
        .find_map(|(set, name)| set.then_some(name))
    }
}

/// Builds the whole resilience stack on a `reqwest_middleware::ClientBuilder`:
///
/// ```text
/// RetryMiddleware → CircuitBreakerMiddleware → BearerAuth → TransportEvidence → reqwest::Client
/// ```
///
/// See the [module docs](self) for why this order and where your own middleware goes.
///
/// # Defaults (from the design)
///
/// | part | default |
/// |---|---|
/// | retry | 3 retries; backoff 1 s × 2 capped at 30 s with ±10 % jitter; `Retry-After` honoured up to 60 s (clamped); [`RetryBudget::default`] (20 % of requests, at least 10 retries/s); no deadline |
/// | breaker | a new [`BreakerRegistry`] per built stack: open after 5 consecutive failures, 30 s open, 1 half-open probe, server pauses (`Retry-After`, rate-limit fields with nothing remaining) up to 60 s waited out |
/// | bearer | none (it needs your [`TokenManager`](crate::TokenManager)) |
/// | attempt timeout | none ([`attempt_timeout`](Self::attempt_timeout)) |
/// | hedging | off ([`hedging`](Self::hedging)) |
/// | transport | [`TransportEvidence`], always |
/// | concurrency limit | off ([`concurrency_limit`](Self::concurrency_limit) turns it on) |
/// | coalesced GETs | off ([`coalesce_gets`](Self::coalesce_gets) turns it on) |
/// | rate limit | off ([`rate_limit`](Self::rate_limit) turns it on) |
/// | hooks | none |
///
/// Each part can be replaced by a prebuilt one ([`retry`](Self::retry),
/// [`breaker`](Self::breaker), [`breaker_middleware`](Self::breaker_middleware)) or
/// removed ([`no_retry`](Self::no_retry), [`no_breaker`](Self::no_breaker)). To share
/// breakers and a retry budget between clients, hand each stack a clone of one
/// [`BreakerRegistry`] and one [`RetryBudget`].
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry};
/// use reqwest_resilience::{Backoff, Resilience, RetryBudget};
///
/// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
/// let registry = BreakerRegistry::new(BreakerConfig::default())?;
/// let budget = RetryBudget::default();
/// let client = Resilience::new()
///     .max_retries(2)
///     .backoff(Backoff::builder().base(Duration::from_millis(100)).build()?)
///     .total_deadline(Duration::from_secs(5))
///     .retry_budget(budget.clone())
///     .breaker(registry.clone())
///     .on_attempt(|evidence, decision| {
///         eprintln!("attempt {} {:?} -> {:?}", evidence.attempt, evidence.transmission, decision);
///     })
///     .build(reqwest::Client::new())?;
/// # drop(client); Ok(()) }
/// ```
///
/// # Errors at build time
///
/// [`build`](Self::build), [`build_from`](Self::build_from),
/// [`client_builder`](Self::client_builder), [`install`](Self::install),
/// [`into_middleware`](Self::into_middleware) and
/// [`into_middlewares`](Self::into_middlewares) (and with feature `astral` their fork
/// counterparts) check the whole configuration and return
/// [`ResilienceError::InvalidStack`] ([`StackError`]) for a combination that cannot work,
/// or a part's own [`ResilienceError::InvalidConfig`].
#[must_use = "a Resilience does nothing until it is built onto a client"]
pub struct Resilience {
    retry: RetryChoice,
    retry_settings: RetrySettings,
    breaker: BreakerChoice,
    bearer: Option<BearerAuth>,
    per_attempt: Vec<PerAttempt>,
    on_attempt: Option<AttemptHook>,
    on_breaker_transition: Option<TransitionHook>,
    /// `None`: not declared (`Unobserved`, unless `build_from` builds the client).
    client_redirects: Option<ClientRedirects>,
    /// The policy `build_from` wraps in `redirect::recorded` (`None`: reqwest's default).
    redirect_policy: Option<reqwest::redirect::Policy>,
    span_url_query: bool,
    concurrency_limit: Option<LimitChoice>,
    coalesce: Option<crate::coalesce::CoalesceGets>,
    #[cfg(feature = "chaos")]
    chaos: Option<crate::chaos::Chaos>,
    rate_limit: Option<crate::rate::RateChoice>,
    resume_bodies: bool,
}

impl Default for Resilience {
    fn default() -> Self {
        Resilience::new()
    }
}

impl fmt::Debug for Resilience {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let retry = match &self.retry {
            RetryChoice::Default => "default",
            RetryChoice::Prebuilt(_) => "prebuilt",
            RetryChoice::Off => "off",
        };
        let breaker = match &self.breaker {
            BreakerChoice::Default => "default",
            BreakerChoice::Config(_) => "config",
            BreakerChoice::Registry(_) => "shared registry",
            BreakerChoice::Middleware(_) => "prebuilt",
            BreakerChoice::Off => "off",
        };
        f.debug_struct("Resilience")
            .field("retry", &retry)
            .field("breaker", &breaker)
            // BearerAuth's Debug never shows the token.
            .field("bearer", &self.bearer)
            .field("per_attempt", &self.per_attempt.len())
            .field("client_redirects", &self.client_redirects)
            .field("on_attempt", &self.on_attempt.is_some())
            .field(
                "on_breaker_transition",
                &self.on_breaker_transition.is_some(),
            )
            .field("concurrency_limit", &self.concurrency_limit.is_some())
            .field("coalesce", &self.coalesce)
            .field("rate_limit", &self.rate_limit.is_some())
            .field("resume_bodies", &self.resume_bodies)
            .finish()
    }
}

impl Resilience {
    /// The full stack with the defaults (see the table above).
    pub fn new() -> Self {
        Resilience {
            retry: RetryChoice::Default,
            retry_settings: RetrySettings::default(),
            breaker: BreakerChoice::Default,
            bearer: None,
            per_attempt: Vec::new(),
            on_attempt: None,
            on_breaker_transition: None,
            client_redirects: None,
            redirect_policy: None,
            span_url_query: false,
            concurrency_limit: None,
            coalesce: None,
            #[cfg(feature = "chaos")]
            chaos: None,
            rate_limit: None,
            resume_bodies: false,
        }
    }

    /// The stack that behaves like reqwest-retry's `RetryTransientMiddleware` with
    /// retry-policies' `ExponentialBackoff::builder().jitter(Jitter::Bounded)
    /// .build_with_max_retries(3)`, for a migration that changes nothing silently: 3
    /// retries, 1 s × 2 per retry capped at 30 minutes (retry-policies' default bounds),
    /// [`Jitter::Bounded`](crate::Jitter::Bounded), every `5xx`, 408 and 429 retried for
    /// an idempotent request ([`AnyServerError`](crate::retry::AnyServerError)), no
    /// circuit breaker, no retry budget. What still differs from reqwest-retry, and why,
    /// is README's "Coming from reqwest-retry" table: above all, a request that may have
    /// been processed (a `POST` after a reset, a timeout or a `500`) is not sent again,
    /// while one proven unsent (a refused connect) is, whatever its method.
    ///
    /// Every setting of this builder still applies on top (`.max_retries(5)`,
    /// `.breaker_config(..)`, …).
    ///
    /// ```
    /// use reqwest_resilience::Resilience;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::like_reqwest_retry().build_from(reqwest::Client::builder())?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn like_reqwest_retry() -> Self {
        let backoff = Backoff::builder()
            .base(Duration::from_secs(1))
            .factor(2.0)
            .max_delay(Duration::from_secs(30 * 60))
            .jitter(crate::backoff::Jitter::Bounded)
            .build()
            .expect("reqwest-retry's bounds are valid");
        let mut stack = Resilience::new().no_breaker().no_retry_budget();
        stack.retry_settings.max_retries = Some(3);
        stack.retry_settings.backoff = Some(backoff);
        stack.retry_settings.strategy = Some(Arc::new(crate::retry::AnyServerError));
        stack.retry_settings.like_reqwest_retry = true;
        stack
    }

    /// Resumes response bodies that break mid-stream (default off: it wraps the body of
    /// every `GET` that can be resumed): the rest is asked for with `Range: bytes=N-` and
    /// `If-Range`, as an attempt of the same request under the retry policy, and spliced
    /// only when the answer provably continues the same representation. A request can
    /// say otherwise with [`ResumeBody`](crate::resume::ResumeBody), either way. See
    /// [`crate::resume`] for the conditions.
    ///
    /// Needs the retry stage (the resumes count against its limit): with
    /// [`no_retry`](Self::no_retry), building fails with [`StackError::Conflict`]. And it
    /// needs the `reqwest::Client` the range requests go over: a stack made for a client
    /// built later ([`into_middleware`](Self::into_middleware),
    /// [`into_middlewares`](Self::into_middlewares)) fails with
    /// [`StackError::ResumeWithoutClient`] (there, a request's own
    /// [`ResumeBody`](crate::resume::ResumeBody) is not resumed either).
    ///
    /// ```
    /// use reqwest_resilience::Resilience;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::new().resume_bodies(true).build(reqwest::Client::new())?;
    /// // client.get(url).send().await?.bytes().await: one body, however often it broke.
    /// # drop(client); Ok(()) }
    /// ```
    pub fn resume_bodies(mut self, resume: bool) -> Self {
        self.resume_bodies = resume;
        self
    }

    /// Tells the transport step what the `reqwest::Client` does with redirects (default
    /// [`ClientRedirects::Unobserved`]): [`Recorded`](ClientRedirects::Recorded) when its
    /// policy is wrapped in [`redirect::recorded`](crate::redirect::recorded),
    /// [`Off`](ClientRedirects::Off) for `reqwest::redirect::Policy::none()`. Unobserved,
    /// an error can come from a later hop, so a non-idempotent request is not retried
    /// after a failure the transport step would otherwise prove unsent (a refused
    /// connect): see [`crate::redirect`].
    ///
    /// A declaration a response proves false turns that client to `Unobserved` for the
    /// rest of its life and is reported once as a
    /// [`Misconfiguration`](crate::misconfig::Misconfiguration). [`build_from`](Self::build_from)
    /// builds the client and declares `Recorded` itself (combining them is a
    /// [`StackError::Conflict`]).
    pub fn client_redirects(mut self, redirects: ClientRedirects) -> Self {
        self.client_redirects = Some(redirects);
        self
    }

    /// The redirect policy [`build_from`](Self::build_from) gives the client, wrapped in
    /// [`redirect::recorded`](crate::redirect::recorded) (default reqwest's own,
    /// `Policy::default()`: up to 10 hops). Only for `build_from`: a prebuilt client has
    /// its policy from its own builder (combining them is a [`StackError::Conflict`]).
    pub fn redirect_policy(mut self, policy: reqwest::redirect::Policy) -> Self {
        self.redirect_policy = Some(policy);
        self
    }

    /// Retries after the first attempt (default 3; 0 keeps the middleware but never
    /// retries).
    pub fn max_retries(mut self, max_retries: u32) -> Self {
        self.retry_settings.max_retries = Some(max_retries);
        self
    }

    /// The backoff between attempts (default [`Backoff::default`]).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.retry_settings.backoff = Some(backoff);
        self
    }

    /// The most retries one request takes, at once and outside
    /// [`max_retries`](Self::max_retries), on the server's proof that it did not process an
    /// attempt (HTTP/2 `REFUSED_STREAM`) or, for an idempotent request, after a `GOAWAY` (a
    /// server rotating its connections); default 5, 0 turns them off. See
    /// [`RetryMiddlewareBuilder::max_not_processed_retries`](crate::retry::RetryMiddlewareBuilder::max_not_processed_retries).
    pub fn max_not_processed_retries(mut self, cap: u32) -> Self {
        self.retry_settings.max_not_processed_retries = Some(cap);
        self
    }

    /// A total deadline per logical request (default none): no retry whose delay would
    /// end past it. Must leave room for the first retry.
    pub fn total_deadline(mut self, total: Duration) -> Self {
        self.retry_settings.total_deadline = Some(total);
        self
    }

    /// The retry budget (default a new [`RetryBudget::default`] per built stack). Pass
    /// clones of one budget to share it between clients.
    pub fn retry_budget(mut self, budget: RetryBudget) -> Self {
        self.retry_settings.budget = Some(Some(budget));
        self
    }

    /// No retry budget: every retry the decision table allows is taken. A failing server
    /// then receives up to `1 + max_retries` times the load.
    pub fn no_retry_budget(mut self) -> Self {
        self.retry_settings.budget = Some(None);
        self
    }

    /// The longest `Retry-After` honoured (default 60 s) and what to do beyond it
    /// (default: clamp to the cap).
    pub fn retry_after_cap(mut self, cap: Duration, policy: RetryAfterPolicy) -> Self {
        self.retry_settings.retry_after_cap = Some((cap, policy));
        self
    }

    /// Replaces the retry decision table (default
    /// [`DefaultStrategy`](crate::retry::DefaultStrategy)), e.g. with uv's rules,
    /// [`retry::strategies::uv_transient`](crate::retry::strategies::uv_transient). The
    /// promise holds for any strategy: a request that may have been processed is sent
    /// again only when that is harmless ([`unsafe_retry`](crate::retry::unsafe_retry)).
    pub fn retry_strategy(mut self, strategy: impl RetryStrategy) -> Self {
        self.retry_settings.strategy = Some(Arc::new(strategy));
        self
    }

    /// Calls `hook` before each retry's wait
    /// ([`RetryMiddlewareBuilder::before_sleep`]).
    pub fn before_sleep(mut self, hook: impl Fn(&RetryNotice<'_>) + Send + Sync + 'static) -> Self {
        self.retry_settings.before_sleep = Some(Arc::new(hook));
        self
    }

    /// The level of the `tracing` event before each retry (default `WARN`;
    /// [`RetryMiddlewareBuilder::retry_event_level`]).
    #[cfg(feature = "tracing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
    pub fn retry_event_level(mut self, level: tracing::Level) -> Self {
        self.retry_settings.retry_event_level = Some(level);
        self
    }

    /// Which final errors the retry middleware wraps in [`ResilienceError::Retry`]
    /// (default [`ErrorWrapping::ExceptReqwest`]: a `reqwest::Error` comes back as
    /// `reqwest_middleware::Error::Reqwest`, as without the stack).
    /// [`ErrorWrapping::Always`] puts the attempt count and the stop reason on every error.
    pub fn error_wrapping(mut self, wrapping: ErrorWrapping) -> Self {
        self.retry_settings.error_wrapping = Some(wrapping);
        self
    }

    /// Bounds each attempt's wait for its response head (default: none; see
    /// [`RetryMiddlewareBuilder::attempt_timeout`](crate::retry::RetryMiddlewareBuilder::attempt_timeout)
    /// for why it is off by default). A cut attempt is a breaker failure and is retried
    /// only when the request is idempotent; the total deadline still bounds everything (a
    /// cut by the deadline alone is neutral for the breaker).
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.retry_settings.attempt_timeout = Some(timeout);
        self
    }

    /// Hedged requests (default: off): after a delay with no response head, a safe
    /// request (GET, HEAD, OPTIONS, TRACE; PUT, DELETE and `Idempotent(true)` ones on
    /// opt-in) sends another copy through the breaker and the transport step, and the
    /// first answer wins. See [`Hedging`] for the delay, the budget and the limits.
    ///
    /// ```
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::retry::Hedging;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::new()
    ///     .hedging(Hedging::adaptive(0.95))
    ///     .build(reqwest::Client::new())?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn hedging(mut self, hedging: Hedging) -> Self {
        self.retry_settings.hedging = Some(hedging);
        self
    }

    /// Installs this retry middleware instead of the default one (e.g. one with its own
    /// [`RetryStrategy`]). The retry settings of this builder
    /// then cannot apply: combining them is a [`StackError::Conflict`].
    pub fn retry(mut self, retry: RetryMiddleware) -> Self {
        self.retry = RetryChoice::Prebuilt(retry);
        self
    }

    /// No retry middleware.
    pub fn no_retry(mut self) -> Self {
        self.retry = RetryChoice::Off;
        self
    }

    /// Uses a shared breaker registry (clients built with clones of one registry share
    /// their breakers and pauses).
    pub fn breaker(mut self, registry: BreakerRegistry) -> Self {
        self.breaker = BreakerChoice::Registry(registry);
        self
    }

    /// Builds a new registry with this configuration (checked at build time).
    pub fn breaker_config(mut self, config: BreakerConfig) -> Self {
        self.breaker = BreakerChoice::Config(config);
        self
    }

    /// Installs this breaker middleware (e.g. one with its own
    /// [`AttemptClassifier`](crate::breaker::AttemptClassifier)).
    pub fn breaker_middleware(mut self, breaker: CircuitBreakerMiddleware) -> Self {
        self.breaker = BreakerChoice::Middleware(breaker);
        self
    }

    /// No circuit breaker.
    pub fn no_breaker(mut self) -> Self {
        self.breaker = BreakerChoice::Off;
        self
    }

    /// Attaches bearer tokens (none by default).
    pub fn bearer(mut self, auth: BearerAuth) -> Self {
        self.bearer = Some(auth);
        self
    }

    /// Adds a middleware that runs once per request on the wire: inside retry, breaker
    /// and `BearerAuth` (so it sees the `Authorization` header and every `401` replay),
    /// just outside the transport step. Several run in the order added.
    pub fn per_attempt(mut self, middleware: impl Middleware) -> Self {
        self.per_attempt
            .push(PerAttempt::Reqwest(Arc::new(middleware)));
        self
    }

    /// [`per_attempt`](Self::per_attempt) for a middleware already shared, e.g. one of a
    /// `Vec<Arc<dyn Middleware>>` a codebase keeps its middlewares in.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use reqwest_middleware::Middleware;
    /// use reqwest_resilience::{Resilience, TransportEvidence};
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let extra: Vec<Arc<dyn Middleware>> = Vec::new(); // e.g. a codebase's own middlewares
    /// let stack = extra
    ///     .iter()
    ///     .fold(Resilience::new(), |stack, m| stack.per_attempt_arc(m.clone()));
    /// let client = stack.build(reqwest::Client::new())?;
    /// # drop(client); let _ = TransportEvidence::new(); Ok(()) }
    /// ```
    pub fn per_attempt_arc(mut self, middleware: Arc<dyn Middleware>) -> Self {
        self.per_attempt.push(PerAttempt::Reqwest(middleware));
        self
    }

    /// Calls `hook` once per attempt with its evidence and the decision taken after it
    /// (`None` when no retry middleware decided, e.g. the `401` answer that `BearerAuth`
    /// replayed). The calls come in order when the logical request ends, so the decision
    /// is known; they run on the request's task and should be quick (count, don't block).
    /// For metrics without `tracing`. A request whose future is dropped before it ends
    /// (cancelled, timed out by the caller) reports nothing.
    pub fn on_attempt<F>(mut self, hook: F) -> Self
    where
        F: Fn(&RequestEvidence, Option<&AttemptDecision>) + Send + Sync + 'static,
    {
        self.on_attempt = Some(Arc::new(hook));
        self
    }

    /// Calls `hook` on every breaker state change (the registry's listener, called
    /// outside any lock). Applies to the default breaker or one built from
    /// [`breaker_config`](Self::breaker_config); a shared registry takes its listener
    /// from [`BreakerRegistry::with_listener`] (combining them is a
    /// [`StackError::Conflict`]).
    pub fn on_breaker_transition<F>(mut self, hook: F) -> Self
    where
        F: Fn(&BreakerEvent) + Send + Sync + 'static,
    {
        self.on_breaker_transition = Some(Arc::new(hook));
        self
    }

    /// With feature `tracing`: whether the span's `url.full` keeps the query as it is
    /// (default `false`: every value is `REDACTED`, stricter than OpenTelemetry's
    /// conventions, which redact the values of a few signature keys). Of each
    /// `&`-separated component only the key of a `key=value` pair stays, when it reads as
    /// a name (at most 64 ASCII letters, digits, `-`, `_`, `.`, `[`, `]`); a component
    /// without `=` (a key passed as the whole query) or with any other key becomes
    /// `REDACTED` whole. Credentials in the URL are always redacted, and the fragment is
    /// never shown. Without the feature it changes nothing.
    pub fn span_url_query(mut self, keep: bool) -> Self {
        self.span_url_query = keep;
        self
    }

    /// Turns on a per-origin concurrency limit (off by default), in a new
    /// [`LimiterRegistry`] with this configuration (checked at build time), between the
    /// breaker and `BearerAuth`: an open breaker rejects before a permit is taken, and
    /// every retry takes a permit of its own. See [`limit`](crate::limit).
    ///
    /// ```
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::limit::LimiterConfig;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::new()
    ///     .concurrency_limit(LimiterConfig::default()) // adaptive, fail fast
    ///     .build(reqwest::Client::new())?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn concurrency_limit(mut self, config: LimiterConfig) -> Self {
        self.concurrency_limit = Some(LimitChoice::Config(config));
        self
    }

    /// Like [`concurrency_limit`](Self::concurrency_limit), with a shared registry:
    /// clients built with clones of one registry share their limits.
    pub fn concurrency_limiter(mut self, registry: LimiterRegistry) -> Self {
        self.concurrency_limit = Some(LimitChoice::Registry(registry));
        self
    }

    /// Turns on coalesced identical GETs (off by default), outermost: concurrent GET and
    /// HEAD requests of this stack identical in every header share one logical request,
    /// retried, admitted and counted once. See [`coalesce`](crate::coalesce). With
    /// [`per_attempt`](Self::per_attempt) middlewares the build fails
    /// ([`StackError::CoalesceWithPerAttempt`]): the stage cannot see what they add.
    ///
    /// ```
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::coalesce::CoalesceGets;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::new()
    ///     .coalesce_gets(CoalesceGets::new().max_body(256 * 1024))
    ///     .build(reqwest::Client::new())?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn coalesce_gets(mut self, coalesce: crate::coalesce::CoalesceGets) -> Self {
        self.coalesce = Some(coalesce);
        self
    }

    /// Injects seeded faults for your tests (feature `chaos`), innermost: after the
    /// transport step, which observes each fault as it observes a real one (the transport
    /// step is then a middleware of its own). See [`chaos`](crate::chaos).
    #[cfg(feature = "chaos")]
    #[cfg_attr(docsrs, doc(cfg(feature = "chaos")))]
    pub fn chaos(mut self, chaos: crate::chaos::Chaos) -> Self {
        self.chaos = Some(chaos);
        self
    }

    /// Turns on a per-origin rate limit (off by default), in a new
    /// [`RateLimitRegistry`](crate::rate::RateLimitRegistry) with this configuration
    /// (checked at build time), between the breaker and the concurrency limit: an open
    /// breaker turns a request away before it spends a slot, a request waiting for its
    /// slot holds no concurrency permit, and every retry takes a slot of its own. See
    /// [`rate`](crate::rate).
    ///
    /// ```
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::rate::{Rate, RateLimitConfig};
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::new()
    ///     .rate_limit(RateLimitConfig::default().rate(Rate::per_second(20)))
    ///     .build(reqwest::Client::new())?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn rate_limit(mut self, config: crate::rate::RateLimitConfig) -> Self {
        self.rate_limit = Some(crate::rate::RateChoice::Config(config));
        self
    }

    /// Like [`rate_limit`](Self::rate_limit), with a shared registry: clients built with
    /// clones of one registry spend the same quotas.
    pub fn rate_limiter(mut self, registry: crate::rate::RateLimitRegistry) -> Self {
        self.rate_limit = Some(crate::rate::RateChoice::Registry(registry));
        self
    }

    /// Builds the client: `reqwest::Client` wrapped in the stack. The stack sees the
    /// client's redirects as [`client_redirects`](Self::client_redirects) declares
    /// (default `Unobserved`); [`build_from`](Self::build_from) builds a client whose every
    /// hop is seen.
    ///
    /// # Errors
    ///
    /// See [Errors at build time](Self#errors-at-build-time).
    pub fn build(self, client: reqwest::Client) -> Result<ClientWithMiddleware, ResilienceError> {
        Ok(self.client_builder(client)?.build())
    }

    /// Builds the client from `builder` with the recorded redirect policy
    /// ([`redirect::recorded`](crate::redirect::recorded) around
    /// [`redirect_policy`](Self::redirect_policy), default reqwest's) and declares it
    /// ([`ClientRedirects::Recorded`]), then wraps it in the stack: the whole decision
    /// table, a refused connect of a `POST` retried, each hop charged to its own origin.
    ///
    /// ```
    /// use reqwest_resilience::Resilience;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::new().build_from(reqwest::Client::builder())?;
    /// # drop(client); Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ResilienceError::ClientBuild`] when reqwest cannot build the client, and those of
    /// [Errors at build time](Self#errors-at-build-time) (a
    /// [`client_redirects`](Self::client_redirects) declaration is a
    /// [`StackError::Conflict`]: this builds and declares the client itself).
    pub fn build_from(
        self,
        builder: reqwest::ClientBuilder,
    ) -> Result<ClientWithMiddleware, ResilienceError> {
        let (stack, client) = self.precise_client(builder)?;
        stack.build(client)
    }

    /// The stack on a new client builder, for adding initialisers. It has no `.with()`:
    /// a middleware added after the stack would run inside the transport step (see
    /// [`StackBuilder`] and [`install`](Self::install)).
    ///
    /// # Errors
    ///
    /// See [Errors at build time](Self#errors-at-build-time).
    pub fn client_builder(self, client: reqwest::Client) -> Result<StackBuilder, ResilienceError> {
        self.install(ClientBuilder::new(client))
    }

    /// Appends the stack to `builder`, inside whatever middleware it already holds: the
    /// place for middleware that should see each logical request once.
    ///
    /// ```
    /// use reqwest_middleware::ClientBuilder;
    /// use reqwest_resilience::Resilience;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let outer = ClientBuilder::new(reqwest::Client::new()); // .with(TracingMiddleware::default())
    /// let client = Resilience::new().install(outer)?.build();
    /// # drop(client); Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// See [Errors at build time](Self#errors-at-build-time).
    pub fn install(self, builder: ClientBuilder) -> Result<StackBuilder, ResilienceError> {
        // The client under the builder, for resumed bodies' range requests.
        let built = builder.build();
        let client = built.as_ref().clone();
        let chain: Vec<Arc<dyn Middleware>> = self.chain(Some(client))?;
        Ok(StackBuilder {
            builder: chain
                .into_iter()
                .fold(ClientBuilder::from_client(built), ClientBuilder::with_arc),
        })
    }

    /// The composed stack as one middleware, for a client builder made later (a client
    /// built lazily, a `Vec<Arc<dyn Middleware>>` handed to a builder elsewhere): every
    /// stage of [`install`](Self::install), the transport step included, so it must be
    /// the *last* middleware of that builder (nearest the `reqwest::Client`). With feature
    /// `astral` it is a middleware of the fork as well.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use reqwest_middleware::Middleware;
    /// use reqwest_resilience::Resilience;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let mut middlewares: Vec<Arc<dyn Middleware>> = Vec::new();
    /// middlewares.push(Arc::new(Resilience::new().into_middleware()?));
    /// // Later, when the client is first needed:
    /// let client = middlewares
    ///     .iter()
    ///     .fold(reqwest_middleware::ClientBuilder::new(reqwest::Client::new()), |b, m| {
    ///         b.with_arc(m.clone())
    ///     })
    ///     .build();
    /// # drop(client); Ok(()) }
    /// ```
    ///
    /// The stack sees the client's redirects as
    /// [`client_redirects`](Self::client_redirects) declares: build that client with
    /// [`redirect::recorded`](crate::redirect::recorded) and declare
    /// [`ClientRedirects::Recorded`] for the whole decision table.
    ///
    /// # Errors
    ///
    /// [`StackError::PerAttemptInOneMiddleware`] with per-attempt middlewares (they run
    /// between `BearerAuth` and the transport step, in the client's own chain: take
    /// [`into_middlewares`](Self::into_middlewares) then), [`StackError::ChaosInOneMiddleware`]
    /// with a chaos layer (the same), and those of
    /// [Errors at build time](Self#errors-at-build-time).
    pub fn into_middleware(self) -> Result<ResilienceMiddleware, ResilienceError> {
        if !self.per_attempt.is_empty() {
            return Err(ResilienceError::InvalidStack(
                StackError::PerAttemptInOneMiddleware,
            ));
        }
        let parts = self.prebuilt_client()?.assemble(None)?;
        if !parts.is_one_middleware() {
            // Only a chaos layer moves the transport step out without per-attempt ones.
            return Err(ResilienceError::InvalidStack(
                StackError::ChaosInOneMiddleware,
            ));
        }
        Ok(ResilienceMiddleware { stack: parts.stack })
    }

    /// The stack as the middlewares a client builder made later is to hold, in order,
    /// after any of its own: the composed stages, the
    /// [`per_attempt`](Self::per_attempt) middlewares, and the transport step (without
    /// per-attempt middlewares, the one middleware of
    /// [`into_middleware`](Self::into_middleware)). For a codebase that hands a
    /// `Vec<Arc<dyn Middleware>>` to `ClientWithMiddleware::new(client, middlewares)` when
    /// its client is first needed (pixi's `LazyClient`).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use reqwest_middleware::{ClientWithMiddleware, Middleware};
    /// use reqwest_resilience::{Resilience, TransportEvidence};
    ///
    /// # struct Mirror; // rewrites each attempt's URL to a mirror
    /// # #[reqwest_resilience::async_trait]
    /// # impl Middleware for Mirror {
    /// #     async fn handle(&self, req: reqwest::Request, ext: &mut http::Extensions,
    /// #         next: reqwest_middleware::Next<'_>) -> reqwest_middleware::Result<reqwest::Response> {
    /// #         next.run(req, ext).await
    /// #     }
    /// # }
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let middlewares: Vec<Arc<dyn Middleware>> = Resilience::like_reqwest_retry()
    ///     .per_attempt(Mirror)
    ///     .into_middlewares()?;
    /// assert_eq!(middlewares.len(), 3); // the stages, Mirror, the transport step
    /// // Later:
    /// let client = ClientWithMiddleware::new(reqwest::Client::new(), middlewares);
    /// # drop(client); Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`install`](Self::install).
    pub fn into_middlewares(self) -> Result<Vec<Arc<dyn Middleware>>, ResilienceError> {
        self.chain(None)
    }

    /// The middlewares a client builder of `M`'s crate holds, in order (see
    /// [`Assembled::into_chain`]); `client` is the one under that builder, when known.
    fn chain<M: ?Sized + ChainMember>(
        self,
        client: Option<reqwest::Client>,
    ) -> Result<Vec<Arc<M>>, ResilienceError> {
        // (`into_middleware`, the other way to `assemble`, refuses per-attempt ones.)
        if self.coalesce.is_some() && !self.per_attempt.is_empty() {
            return Err(ResilienceError::InvalidStack(
                StackError::CoalesceWithPerAttempt,
            ));
        }
        let per_attempt = self
            .per_attempt
            .iter()
            .map(|m| {
                M::per_attempt(m).ok_or(ResilienceError::InvalidStack(
                    StackError::PerAttemptOtherTrait { builder: M::CRATE },
                ))
            })
            .collect::<Result<_, _>>()?;
        Ok(self
            .prebuilt_client()?
            .assemble(client)?
            .into_chain(per_attempt))
    }

    /// Refuses the settings only `build_from` can apply, for a client built elsewhere.
    fn prebuilt_client(self) -> Result<Self, ResilienceError> {
        if self.redirect_policy.is_some() {
            return Err(ResilienceError::InvalidStack(StackError::Conflict {
                part: StackPart::Client,
                setting: "redirect_policy",
            }));
        }
        Ok(self)
    }

    /// The client `build_from` builds: the recorded redirect policy, declared.
    fn precise_client(
        mut self,
        builder: reqwest::ClientBuilder,
    ) -> Result<(Self, reqwest::Client), ResilienceError> {
        if self.client_redirects.is_some() {
            return Err(ResilienceError::InvalidStack(StackError::Conflict {
                part: StackPart::Client,
                setting: "client_redirects",
            }));
        }
        let policy = self.redirect_policy.take().unwrap_or_default();
        let client = builder
            .redirect(crate::redirect::recorded(policy))
            .build()
            .map_err(ResilienceError::ClientBuild)?;
        self.client_redirects = Some(ClientRedirects::Recorded);
        Ok((self, client))
    }

    /// The stages as one middleware, and the transport step as a middleware of its own
    /// when per-attempt middlewares run between `BearerAuth` and it.
    /// The stack's parts; `client` is the `reqwest::Client` below it when it is known
    /// (resumed bodies send their range requests over it).
    fn assemble(self, client: Option<reqwest::Client>) -> Result<Assembled, ResilienceError> {
        let retry = self.build_retry()?;
        if self.resume_bodies && retry.is_none() {
            return Err(ResilienceError::InvalidStack(StackError::Conflict {
                part: StackPart::Retry,
                setting: "resume_bodies",
            }));
        }
        if self.resume_bodies && client.is_none() {
            return Err(ResilienceError::InvalidStack(
                StackError::ResumeWithoutClient,
            ));
        }
        let limit = self.concurrency_limit.map(LimitChoice::build).transpose()?;
        let rate = self
            .rate_limit
            .map(crate::rate::RateChoice::build)
            .transpose()?;
        let breaker = build_breaker(self.breaker, self.on_breaker_transition)?
            .map(|breaker| beside_rate_limit(breaker, rate.as_ref()));

        // One middleware for the stages, one boxed future per request; a user's
        // per-attempt middleware runs between `BearerAuth` and the transport step, which
        // then follows it as a middleware of its own.
        let transport = TransportEvidence::with_client_redirects(
            self.client_redirects.unwrap_or(ClientRedirects::Unobserved),
        );
        // A resumed body's range requests go through the stages over the client itself.
        let resume = client.map(|client| ResumeSetup {
            by_default: self.resume_bodies,
            client,
            transport: transport.clone(),
        });
        #[cfg(feature = "chaos")]
        let chaos = self.chaos;
        #[cfg(not(feature = "chaos"))]
        let chaos: Option<std::convert::Infallible> = None;
        let (inner_transport, outer_transport) = if self.per_attempt.is_empty() && chaos.is_none() {
            (Some(transport), None)
        } else {
            (None, Some(transport))
        };
        let composed = compose::Composed {
            observer: crate::stage::BoxedWhenPresent(RequestObserver::new(
                self.on_attempt,
                self.span_url_query,
            )),
            coalesce: crate::stage::BoxedWhenPresent(self.coalesce),
            retry: crate::stage::RetrySlot(retry),
            token_first: crate::stage::Absent,
            breaker,
            rate,
            limit: crate::stage::Absent,
            bearer: self.bearer.clone(),
            transport: inner_transport,
            resume: None,
        };
        // Each optional stage whose future is large is there by type only when the stack
        // has it (see `Composed`).
        let stack: Arc<dyn compose::StackMiddleware> = match (self.bearer, limit) {
            (Some(bearer), Some(limit)) => Arc::new(ResumeSetup::onto(
                resume,
                composed
                    .with_token_first(crate::auth::TokenFirst(bearer))
                    .with_limit(limit),
            )),
            (Some(bearer), None) => Arc::new(ResumeSetup::onto(
                resume,
                composed.with_token_first(crate::auth::TokenFirst(bearer)),
            )),
            (None, Some(limit)) => Arc::new(ResumeSetup::onto(resume, composed.with_limit(limit))),
            (None, None) => Arc::new(ResumeSetup::onto(resume, composed)),
        };
        Ok(Assembled {
            stack,
            transport: outer_transport,
            #[cfg(feature = "chaos")]
            chaos,
        })
    }

    fn build_retry(&self) -> Result<Option<RetryMiddleware>, ResilienceError> {
        let s = &self.retry_settings;
        // The settings configure the default middleware only.
        if !matches!(self.retry, RetryChoice::Default)
            && let Some(setting) = s.first_set()
        {
            return Err(ResilienceError::InvalidStack(StackError::Conflict {
                part: StackPart::Retry,
                setting,
            }));
        }
        match &self.retry {
            RetryChoice::Prebuilt(retry) => Ok(Some(retry.clone())),
            RetryChoice::Off => Ok(None),
            RetryChoice::Default => {
                let backoff = s.backoff.unwrap_or_default();
                let mut b = RetryMiddleware::builder().backoff(backoff);
                if let Some(n) = s.max_retries {
                    b = b.max_retries(n);
                }
                if let Some(cap) = s.max_not_processed_retries {
                    b = b.max_not_processed_retries(cap);
                }
                if let Some(total) = s.total_deadline {
                    // The smallest delay the jitter can draw before the first retry.
                    let first_delay = backoff.jitter().apply(backoff.base_delay(0), 0.0);
                    if total.is_zero() || total < first_delay {
                        return Err(ResilienceError::InvalidStack(
                            StackError::DeadlineBeforeFirstRetry {
                                total_deadline: total,
                                first_delay,
                            },
                        ));
                    }
                    b = b.total_deadline(total);
                }
                match &s.budget {
                    Some(Some(budget)) => b = b.budget(budget.clone()),
                    Some(None) => b = b.no_budget(),
                    None => {}
                }
                if let Some((cap, policy)) = s.retry_after_cap {
                    b = b.retry_after_cap(cap, policy);
                }
                if let Some(wrapping) = s.error_wrapping {
                    b = b.error_wrapping(wrapping);
                }
                if let Some(timeout) = s.attempt_timeout {
                    b = b.attempt_timeout(timeout);
                }
                if let Some(hedging) = &s.hedging {
                    b = b.hedging(hedging.clone());
                }
                s.apply_decision_and_observers(b).build().map(Some)
            }
        }
    }
}

/// What a composed stack needs to resume bodies (`crate::resume`).
struct ResumeSetup {
    by_default: bool,
    client: reqwest::Client,
    transport: TransportEvidence,
}

impl ResumeSetup {
    /// `composed`, able to resume bodies (when the client is known and the stack has a
    /// retry stage, whose limit the resumes count against), by default or per request.
    fn onto<T, L>(
        setup: Option<Self>,
        mut composed: compose::Composed<T, L>,
    ) -> compose::Composed<T, L>
    where
        T: crate::stage::Stage + Clone + 'static,
        L: crate::stage::Stage + Clone + 'static,
    {
        let (Some(setup), Some(retry)) = (setup, composed.retry.0.clone()) else {
            return composed;
        };
        let stages = compose::ResumeStages {
            observer: composed.observer.0.clone(),
            retry: retry.clone(),
            token_first: composed.token_first.clone(),
            breaker: composed.breaker.clone(),
            limit: composed.limit.clone(),
            rate: composed.rate.clone(),
            bearer: composed.bearer.clone(),
            transport: setup.transport,
            client: setup.client,
        };
        composed.resume = Some(crate::resume::Resumer {
            by_default: setup.by_default,
            retry,
            stack: Arc::new(stages),
        });
        composed
    }
}

/// A `reqwest_middleware::ClientBuilder` ending in the stack, from
/// [`Resilience::client_builder`] and [`Resilience::install`]: add request initialisers,
/// then [`build`](Self::build).
///
/// It has no `.with()` on purpose. A middleware added after the stack runs *inside* the
/// transport step: once per wire request but unseen by the evidence (its failures become
/// `Unknown`, a retry of its own sends requests the history never shows). Put yours
/// around the stack ([`Resilience::install`]) or per attempt ([`Resilience::per_attempt`]).
///
/// ```compile_fail
/// # struct Mine;
/// # #[reqwest_resilience::async_trait]
/// # impl reqwest_middleware::Middleware for Mine {
/// #     async fn handle(&self, req: reqwest::Request, ext: &mut http::Extensions,
/// #         next: reqwest_middleware::Next<'_>) -> reqwest_middleware::Result<reqwest::Response> {
/// #         next.run(req, ext).await
/// #     }
/// # }
/// let client = reqwest_resilience::Resilience::new()
///     .client_builder(reqwest::Client::new())
///     .unwrap()
///     .with(Mine) // does not compile: it would run inside the transport step
///     .build();
/// ```
///
/// A stand-in for the network (a test double answering every request) is the one
/// middleware that belongs there; [`inside_transport_step`](Self::inside_transport_step)
/// says so in the code.
#[must_use = "a StackBuilder does nothing until it is built"]
pub struct StackBuilder {
    builder: ClientBuilder,
}

impl fmt::Debug for StackBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackBuilder").finish_non_exhaustive()
    }
}

impl StackBuilder {
    /// Adds a request initialiser (`reqwest_middleware::ClientBuilder::with_init`).
    ///
    /// ```
    /// use reqwest_middleware::Extension;
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::retry::MaxRetries;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// // Every request of this client gets one retry at most.
    /// let client = Resilience::new()
    ///     .client_builder(reqwest::Client::new())?
    ///     .with_init(Extension(MaxRetries(1)))
    ///     .build();
    /// # drop(client); Ok(()) }
    /// ```
    pub fn with_init<I: reqwest_middleware::RequestInitialiser>(self, initialiser: I) -> Self {
        StackBuilder {
            builder: self.builder.with_init(initialiser),
        }
    }

    /// Adds a shared request initialiser (`ClientBuilder::with_arc_init`).
    pub fn with_arc_init(
        self,
        initialiser: Arc<dyn reqwest_middleware::RequestInitialiser>,
    ) -> Self {
        StackBuilder {
            builder: self.builder.with_arc_init(initialiser),
        }
    }

    /// The client.
    pub fn build(self) -> ClientWithMiddleware {
        self.builder.build()
    }

    /// The underlying `ClientBuilder`, whose `.with()` adds middleware *inside* the
    /// transport step: only for a stand-in for the network (a test double, a recorded
    /// answer), whose responses the evidence then describes.
    ///
    /// ```
    /// struct Canned; // answers every request itself
    ///
    /// #[reqwest_resilience::async_trait]
    /// impl reqwest_middleware::Middleware for Canned {
    ///     async fn handle(&self, _: reqwest::Request, _: &mut http::Extensions,
    ///         _: reqwest_middleware::Next<'_>) -> reqwest_middleware::Result<reqwest::Response> {
    ///         Ok(http::Response::new("canned").into())
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = reqwest_resilience::Resilience::new()
    ///     .client_builder(reqwest::Client::new())?
    ///     .inside_transport_step()
    ///     .with(Canned)
    ///     .build();
    /// let response = client.get("http://example.invalid/").send().await?;
    /// assert_eq!(response.text().await?, "canned");
    /// # Ok(()) }
    /// ```
    pub fn inside_transport_step(self) -> ClientBuilder {
        self.builder
    }
}

/// A per-attempt middleware, of reqwest-middleware's trait or (feature `astral`) the
/// fork's: it can only be installed into a builder of its own crate.
pub(crate) enum PerAttempt {
    Reqwest(Arc<dyn Middleware>),
    #[cfg(feature = "astral")]
    Astral(Arc<dyn astral_reqwest_middleware::Middleware>),
}

/// The stack as [`Resilience::assemble`] builds it for a builder.
struct Assembled {
    /// The stages, one middleware.
    stack: Arc<dyn compose::StackMiddleware>,
    /// The transport step as a middleware of its own, after the per-attempt ones.
    transport: Option<TransportEvidence>,
    /// Seeded faults, innermost: after the transport step, where the network is.
    #[cfg(feature = "chaos")]
    chaos: Option<crate::chaos::Chaos>,
}

impl Assembled {
    /// The middlewares in the order a client builder holds them (the stages, the
    /// per-attempt ones, the transport step when it is not among the stages, the chaos
    /// layer), as trait objects of either crate's `Middleware`.
    fn into_chain<M: ?Sized + ChainMember>(self, per_attempt: Vec<Arc<M>>) -> Vec<Arc<M>> {
        let mut chain = Vec::with_capacity(per_attempt.len() + 3);
        chain.push(M::stack(self.stack));
        chain.extend(per_attempt);
        chain.extend(self.transport.map(M::transport));
        #[cfg(feature = "chaos")]
        chain.extend(self.chaos.map(M::chaos));
        chain
    }

    /// Whether the whole stack is the one middleware `stack`.
    fn is_one_middleware(&self) -> bool {
        self.transport.is_none()
    }
}

/// A trait object of either crate's `Middleware`, as a client's chain holds them.
trait ChainMember {
    /// The crate whose `ClientBuilder` holds such middlewares (for an error).
    const CRATE: &'static str;
    fn stack(stack: Arc<dyn compose::StackMiddleware>) -> Arc<Self>;
    fn transport(transport: TransportEvidence) -> Arc<Self>;
    #[cfg(feature = "chaos")]
    fn chaos(chaos: crate::chaos::Chaos) -> Arc<Self>;
    /// The per-attempt middleware, when it is of this crate's trait.
    fn per_attempt(middleware: &PerAttempt) -> Option<Arc<Self>>;
}

impl ChainMember for dyn Middleware {
    const CRATE: &'static str = "reqwest-middleware";
    fn stack(stack: Arc<dyn compose::StackMiddleware>) -> Arc<Self> {
        stack
    }
    fn transport(transport: TransportEvidence) -> Arc<Self> {
        Arc::new(transport)
    }
    #[cfg(feature = "chaos")]
    fn chaos(chaos: crate::chaos::Chaos) -> Arc<Self> {
        Arc::new(chaos)
    }
    fn per_attempt(middleware: &PerAttempt) -> Option<Arc<Self>> {
        match middleware {
            PerAttempt::Reqwest(m) => Some(m.clone()),
            #[cfg(feature = "astral")]
            PerAttempt::Astral(_) => None,
        }
    }
}

/// The whole stack as one middleware ([`Resilience::into_middleware`]), for a client
/// builder made later: install it last. It implements `reqwest_middleware::Middleware`
/// and, with feature `astral`, the fork's `Middleware` too. Clones share the stack (its
/// breakers, budget and redirect proof).
#[derive(Clone)]
pub struct ResilienceMiddleware {
    stack: Arc<dyn compose::StackMiddleware>,
}

impl fmt::Debug for ResilienceMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResilienceMiddleware")
            .finish_non_exhaustive()
    }
}

impl Middleware for ResilienceMiddleware {
    fn handle<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        req: Request,
        extensions: &'life1 mut Extensions,
        next: reqwest_middleware::Next<'life2>,
    ) -> crate::stage::Handled<'async_trait>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        Middleware::handle(&*self.stack, req, extensions, next)
    }
}

#[cfg(feature = "astral")]
impl astral_reqwest_middleware::Middleware for ResilienceMiddleware {
    fn handle<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        req: Request,
        extensions: &'life1 mut Extensions,
        next: astral_reqwest_middleware::Next<'life2>,
    ) -> crate::stage::astral::AstralHandled<'async_trait>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        astral_reqwest_middleware::Middleware::handle(&*self.stack, req, extensions, next)
    }
}

/// The breaker as it runs outside `rate`: a learning rate limit applies the servers'
/// rate-limit fields under its own bounds, and the breaker leaves them to it (one bound on
/// how long they hold a caller: `crate::rate`, "How long a server's fields hold a caller").
fn beside_rate_limit(
    breaker: CircuitBreakerMiddleware,
    rate: Option<&crate::rate::RateLimit>,
) -> CircuitBreakerMiddleware {
    match rate {
        Some(rate) if rate.registry().config().learn => breaker.leaving_rate_limit_fields(),
        _ => breaker,
    }
}

fn build_breaker(
    choice: BreakerChoice,
    on_transition: Option<TransitionHook>,
) -> Result<Option<CircuitBreakerMiddleware>, ResilienceError> {
    let config = match choice {
        // The hook is installed on a registry this builder makes.
        BreakerChoice::Off | BreakerChoice::Registry(_) | BreakerChoice::Middleware(_)
            if on_transition.is_some() =>
        {
            return Err(ResilienceError::InvalidStack(StackError::Conflict {
                part: StackPart::Breaker,
                setting: "on_breaker_transition",
            }));
        }
        BreakerChoice::Off => return Ok(None),
        BreakerChoice::Registry(registry) => {
            return Ok(Some(CircuitBreakerMiddleware::new(registry)));
        }
        BreakerChoice::Middleware(breaker) => return Ok(Some(breaker)),
        BreakerChoice::Default => BreakerConfig::default(),
        BreakerChoice::Config(config) => config,
    };
    if config.half_open_probes == 0 {
        return Err(ResilienceError::InvalidStack(StackError::NoHalfOpenProbes));
    }
    let registry = match on_transition {
        Some(hook) => BreakerRegistry::with_listener(config, move |event| hook(event))?,
        None => BreakerRegistry::new(config)?,
    };
    Ok(Some(CircuitBreakerMiddleware::new(registry)))
}

/// The outermost layer: the span per logical request (feature `tracing`) and the
/// `on_attempt` hook. Installed only when one of them is wanted.
#[derive(Clone)]
pub(crate) struct RequestObserver {
    on_attempt: Option<AttemptHook>,
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    span_url_query: bool,
}

impl RequestObserver {
    fn new(on_attempt: Option<AttemptHook>, span_url_query: bool) -> Option<Self> {
        if cfg!(feature = "tracing") || on_attempt.is_some() {
            Some(RequestObserver {
                on_attempt,
                span_url_query,
            })
        } else {
            None
        }
    }
}

standalone_middleware!(RequestObserver);

impl Stage for RequestObserver {
    #[allow(clippy::manual_async_fn)]
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: Request,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        async move {
            let owner = handover.enter_unchecked(extensions);
            // Extensions reused across calls keep older attempts: report only this call's.
            let before = extensions
                .get::<AttemptHistory>()
                .map_or(0, AttemptHistory::len)
                // A later pass of an operation or a resumed body: the earlier passes'
                // records were reported with them.
                .max(crate::retry::continuation_recorded(extensions));

            #[cfg(feature = "tracing")]
            let span = observe::request_span(&req, self.span_url_query);
            #[cfg(feature = "tracing")]
            let result = {
                use tracing::Instrument;
                owner
                    .poll_as(next, |next| next.run(req, extensions, handover))
                    .instrument(span.clone())
                    .await
            };
            #[cfg(not(feature = "tracing"))]
            let result = owner
                .poll_as(next, |next| next.run(req, extensions, handover))
                .await;

            let attempts = extensions
                .get::<AttemptHistory>()
                .map_or(&[][..], |h| h.attempts().get(before..).unwrap_or(&[]));
            if let Some(hook) = &self.on_attempt {
                for record in attempts {
                    hook(&record.evidence, record.decision.as_ref());
                }
            }
            #[cfg(feature = "tracing")]
            observe::record_outcome(&span, attempts, &result);
            result
        }
    }
}

/// The `tracing` side: OpenTelemetry HTTP client field names where they exist.
#[cfg(feature = "tracing")]
mod observe {
    use reqwest::{Request, Response};
    use tracing::field::Empty;

    use crate::error::ResilienceError;
    use crate::origin::Origin;
    use crate::record::{AttemptDecision, AttemptRecord, RetryReason, StopReason};

    /// The span of the logical call. Its kind is `internal`: it encloses every attempt
    /// (and the waits between them), while OpenTelemetry's HTTP conventions give each
    /// request on the wire a `client` span of its own (reqwest-tracing's, installed per
    /// attempt). A `client` span here would nest `client` spans in a `client` span, which
    /// exporters then read as a call made from inside another call.
    pub(super) fn request_span(req: &Request, keep_query: bool) -> tracing::Span {
        let url = req.url();
        let span = tracing::info_span!(
            target: "reqwest_resilience::stack",
            "http.client.request",
            otel.name = %req.method(),
            otel.kind = "internal",
            http.request.method = %req.method(),
            url.full = Empty,
            url.scheme = url.scheme(),
            server.address = url.host_str().unwrap_or(""),
            server.port = url.port_or_known_default().unwrap_or(0),
            http.response.status_code = Empty,
            http.request.resend_count = Empty,
            error.type = Empty,
            resilience.attempts = Empty,
            resilience.stop = Empty,
        );
        if !span.is_disabled() {
            // Formatted only for a subscriber that records the span.
            span.record("url.full", redacted(url, keep_query).as_str());
        }
        span
    }

    /// `url` as `url.full` may show it: user name and password replaced by `REDACTED`
    /// (OpenTelemetry's rule), no fragment (it is never sent, and may carry a token), and
    /// unless `keep_query` the query redacted by [`redacted_query`].
    pub(super) fn redacted(url: &url::Url, keep_query: bool) -> url::Url {
        let mut url = url.clone();
        url.set_fragment(None);
        if !url.username().is_empty() {
            let _ = url.set_username("REDACTED");
        }
        if url.password().is_some() {
            let _ = url.set_password(Some("REDACTED"));
        }
        if !keep_query && let Some(query) = url.query().filter(|q| !q.is_empty()) {
            let query = redacted_query(query);
            url.set_query(Some(&query));
        }
        url
    }

    /// The query with every value `REDACTED`: of each `&`-separated component, only the
    /// key of a `key=value` pair is kept, and only when it reads as a name (at most 64
    /// ASCII letters, digits, `-`, `_`, `.`, `[`, `]`). A component without `=` is a
    /// value (`?sk_live_51Hx…`, a key passed as the whole query) and so is a key that
    /// does not read as a name: either becomes `REDACTED` whole. Empty components go.
    pub(super) fn redacted_query(query: &str) -> String {
        let is_name = |key: &str| {
            !key.is_empty()
                && key.len() <= 64
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.[]".contains(&b))
        };
        let mut out = String::with_capacity(query.len());
        for component in query.split('&').filter(|c| !c.is_empty()) {
            if !out.is_empty() {
                out.push('&');
            }
            match component.split_once('=') {
                Some((key, _)) if is_name(key) => {
                    out.push_str(key);
                    out.push_str("=REDACTED");
                }
                _ => out.push_str("REDACTED"),
            }
        }
        out
    }

    /// A decision as one event field ("retry: …" / "stop: …"), formatted only when a
    /// subscriber records it.
    enum DecisionField {
        Retry(RetryReason),
        Stop(StopReason),
        Superseded(u32),
    }

    impl std::fmt::Display for DecisionField {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                DecisionField::Retry(reason) => write!(f, "retry: {reason}"),
                DecisionField::Stop(reason) => write!(f, "stop: {reason}"),
                DecisionField::Superseded(by) => write!(f, "superseded by attempt {by}"),
            }
        }
    }

    /// One event per attempt (in order, with its decision), then the span's outcome.
    pub(super) fn record_outcome(
        span: &tracing::Span,
        attempts: &[AttemptRecord],
        result: &reqwest_middleware::Result<Response>,
    ) {
        if span.is_disabled() {
            // No subscriber wants the span: spend nothing on its fields or the events.
            return;
        }
        let _entered = span.enter();
        for record in attempts {
            let e = &record.evidence;
            let (decision, delay_ms) = match &record.decision {
                Some(AttemptDecision::Retry { delay, reason }) => (
                    Some(DecisionField::Retry(*reason)),
                    Some(delay.as_millis() as u64),
                ),
                Some(AttemptDecision::Stop { reason }) => {
                    (Some(DecisionField::Stop(*reason)), None)
                }
                Some(AttemptDecision::Superseded { by }) => {
                    (Some(DecisionField::Superseded(*by)), None)
                }
                None => (None, None),
            };
            tracing::event!(
                target: "reqwest_resilience::stack",
                tracing::Level::DEBUG,
                http.request.resend_count = e.attempt.saturating_sub(1),
                server.address = e.origin.as_ref().map(Origin::host),
                http.response.status_code = e.status().map(|s| s.as_u16()),
                error.type = e.failure.map(tracing::field::debug),
                resilience.transmission = ?e.transmission,
                resilience.elapsed_ms = e.elapsed.as_millis() as u64,
                resilience.decision = decision.map(tracing::field::display),
                resilience.delay_ms = delay_ms,
                "attempt"
            );
        }
        let count = attempts.len() as u64;
        span.record("resilience.attempts", count);
        span.record("http.request.resend_count", count.saturating_sub(1));
        if let Some(AttemptDecision::Stop { reason }) =
            attempts.last().and_then(|r| r.decision.as_ref())
        {
            span.record("resilience.stop", tracing::field::display(reason));
        }
        match result {
            Ok(response) => {
                let status = response.status();
                span.record("http.response.status_code", status.as_u16());
                if status.is_client_error() || status.is_server_error() {
                    span.record("error.type", status.as_str());
                }
            }
            Err(err) => {
                let kind = attempts.last().and_then(|r| r.evidence.failure);
                match (kind, ResilienceError::from_middleware_error(err)) {
                    (Some(kind), _) => span.record("error.type", tracing::field::debug(kind)),
                    (None, Some(_)) => span.record("error.type", "ResilienceError"),
                    (None, None) => span.record("error.type", "_OTHER"),
                };
            }
        }
    }
}
