//! The [`Resilience`] builder: what each part of the stack is to be (a default, a
//! configuration, a shared registry, a prebuilt middleware or nothing), set by one
//! method each. It only records choices; `assemble` turns them into stages.

use std::fmt;
use std::sync::Arc;

use reqwest_middleware::Middleware;

use super::observer::AttemptHook;
use crate::auth::BearerAuth;
use crate::breaker::{BreakerConfig, BreakerRegistry, CircuitBreakerMiddleware};
#[cfg(doc)]
use crate::error::{ResilienceError, StackError};
#[cfg(doc)]
use crate::evidence::TransportEvidence;
use crate::limit::{LimitChoice, LimiterConfig, LimiterRegistry};
use crate::rate::{RateChoice, RateLimitConfig, RateLimitRegistry};
use crate::record::{AttemptDecision, RequestEvidence};
use crate::redirect::ClientRedirects;
#[cfg(doc)]
use crate::retry::RetryBudget;
use crate::retry::{RetryMiddleware, RetryMiddlewareBuilder};

/// Which retry middleware the stack installs.
pub(super) enum RetryKind {
    /// Built from this builder when the stack is built (boxed: it is large, and the
    /// other choices small).
    Builder(Box<RetryMiddlewareBuilder>),
    Prebuilt(RetryMiddleware),
    Off,
}

/// Which breaker the stack installs.
pub(super) enum BreakerKind {
    Default,
    Config(BreakerConfig),
    Registry(BreakerRegistry),
    Middleware(CircuitBreakerMiddleware),
    Off,
}

/// What [`Resilience::retry`] takes: a [`RetryMiddlewareBuilder`] (built with the stack,
/// its errors those of [building the stack](Resilience#errors-at-build-time)) or a
/// prebuilt [`RetryMiddleware`] (one whose clone you keep, e.g. for its
/// [`operation`](RetryMiddleware::operation)s or its [budget](RetryMiddleware::budget)).
/// You never name it: pass either to `.retry(..)`.
pub struct RetryChoice(pub(super) RetryKind);

impl From<RetryMiddlewareBuilder> for RetryChoice {
    fn from(builder: RetryMiddlewareBuilder) -> Self {
        RetryChoice(RetryKind::Builder(Box::new(builder)))
    }
}

impl From<RetryMiddleware> for RetryChoice {
    fn from(retry: RetryMiddleware) -> Self {
        RetryChoice(RetryKind::Prebuilt(retry))
    }
}

impl fmt::Debug for RetryChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name())
    }
}

impl RetryKind {
    fn name(&self) -> &'static str {
        match self {
            RetryKind::Builder(_) => "builder",
            RetryKind::Prebuilt(_) => "prebuilt",
            RetryKind::Off => "off",
        }
    }
}

/// What [`Resilience::breaker`] takes: a [`BreakerConfig`] (a new registry per built
/// stack, checked at build time), a shared [`BreakerRegistry`] (clients built with clones
/// of one registry share their breakers and pauses; its listener is the one of
/// [`BreakerRegistry::with_listener`]) or a prebuilt [`CircuitBreakerMiddleware`] (e.g.
/// one with its own [`AttemptClassifier`](crate::breaker::AttemptClassifier)). You never
/// name it: pass any of them to `.breaker(..)`.
pub struct BreakerChoice(pub(super) BreakerKind);

impl From<BreakerConfig> for BreakerChoice {
    fn from(config: BreakerConfig) -> Self {
        BreakerChoice(BreakerKind::Config(config))
    }
}

impl From<BreakerRegistry> for BreakerChoice {
    fn from(registry: BreakerRegistry) -> Self {
        BreakerChoice(BreakerKind::Registry(registry))
    }
}

impl From<CircuitBreakerMiddleware> for BreakerChoice {
    fn from(breaker: CircuitBreakerMiddleware) -> Self {
        BreakerChoice(BreakerKind::Middleware(breaker))
    }
}

impl fmt::Debug for BreakerChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name())
    }
}

impl BreakerKind {
    fn name(&self) -> &'static str {
        match self {
            BreakerKind::Default => "default",
            BreakerKind::Config(_) => "config",
            BreakerKind::Registry(_) => "shared registry",
            BreakerKind::Middleware(_) => "prebuilt",
            BreakerKind::Off => "off",
        }
    }
}

/// What [`Resilience::concurrency_limit`] takes: a [`LimiterConfig`] (a new registry per
/// built stack, checked at build time) or a shared [`LimiterRegistry`] (clients built with
/// clones of one registry share their limits). You never name it.
pub struct ConcurrencyLimitChoice(pub(super) LimitChoice);

impl fmt::Debug for ConcurrencyLimitChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            LimitChoice::Config(_) => "config",
            LimitChoice::Registry(_) => "shared registry",
        })
    }
}

impl From<LimiterConfig> for ConcurrencyLimitChoice {
    fn from(config: LimiterConfig) -> Self {
        ConcurrencyLimitChoice(LimitChoice::Config(config))
    }
}

impl From<LimiterRegistry> for ConcurrencyLimitChoice {
    fn from(registry: LimiterRegistry) -> Self {
        ConcurrencyLimitChoice(LimitChoice::Registry(registry))
    }
}

/// What [`Resilience::rate_limit`] takes: a [`RateLimitConfig`] (a new registry per built
/// stack, checked at build time) or a shared [`RateLimitRegistry`] (clients built with
/// clones of one registry spend the same quotas). You never name it.
pub struct RateLimitChoice(pub(super) RateChoice);

impl fmt::Debug for RateLimitChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            RateChoice::Config(_) => "config",
            RateChoice::Registry(_) => "shared registry",
        })
    }
}

impl From<RateLimitConfig> for RateLimitChoice {
    fn from(config: RateLimitConfig) -> Self {
        RateLimitChoice(RateChoice::Config(config))
    }
}

impl From<RateLimitRegistry> for RateLimitChoice {
    fn from(registry: RateLimitRegistry) -> Self {
        RateLimitChoice(RateChoice::Registry(registry))
    }
}

/// Builds the whole resilience stack on a `reqwest_middleware::ClientBuilder`: the stages,
/// their order and why in [`guide::stack`](crate::guide::stack), every default and where it
/// comes from in [`guide::defaults`](crate::guide::defaults). A new [`BreakerRegistry`] per
/// built stack unless one is given; [`TransportEvidence`] always.
///
/// Each part is set in one place: the retry by [`retry`](Self::retry), from a
/// [`RetryMiddleware::builder()`](RetryMiddleware::builder) (every retry setting is
/// there) or a prebuilt [`RetryMiddleware`]; the breaker by [`breaker`](Self::breaker),
/// from a [`BreakerConfig`], a shared [`BreakerRegistry`] or a prebuilt
/// [`CircuitBreakerMiddleware`]; the limits by [`concurrency_limit`](Self::concurrency_limit)
/// and [`rate_limit`](Self::rate_limit), from a configuration or a shared registry. A part
/// is removed with [`no_retry`](Self::no_retry) or [`no_breaker`](Self::no_breaker). A
/// later call replaces an earlier one. To share breakers and a retry budget between
/// clients, hand each stack a clone of one [`BreakerRegistry`] and one [`RetryBudget`].
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry};
/// use reqwest_resilience::{Backoff, Resilience, RetryBudget, RetryMiddleware};
///
/// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
/// let registry = BreakerRegistry::new(BreakerConfig::default())?;
/// let budget = RetryBudget::default();
/// let client = Resilience::new()
///     .retry(
///         RetryMiddleware::builder()
///             .max_retries(2)
///             .backoff(Backoff::builder().base(Duration::from_millis(100)).build()?)
///             .total_deadline(Duration::from_secs(5))
///             .budget(budget.clone()),
///     )
///     .breaker(registry.clone())
///     .on_attempt(|evidence, decision| {
///         eprintln!("attempt {} {:?} -> {:?}", evidence.attempt, evidence.transmission, decision);
///     })
///     .build_from(reqwest::Client::builder())?;
/// # drop(client); Ok(()) }
/// ```
///
/// # Errors at build time
///
/// [`build`](Self::build), [`build_from`](Self::build_from), [`install`](Self::install),
/// [`into_middleware`](Self::into_middleware) and
/// [`into_middlewares`](Self::into_middlewares) (and with feature `astral` their fork
/// counterparts, [`stack::astral`](crate::stack::astral)) check the whole configuration and return
/// [`ResilienceError::InvalidStack`] ([`StackError`]) for a combination that cannot work,
/// or a part's own [`ResilienceError::InvalidConfig`].
#[must_use = "a Resilience does nothing until it is built onto a client"]
pub struct Resilience {
    pub(super) retry: RetryKind,
    pub(super) breaker: BreakerKind,
    pub(super) bearer: Option<BearerAuth>,
    pub(super) per_attempt: Vec<PerAttempt>,
    pub(super) on_attempt: Option<AttemptHook>,
    /// `None`: not declared (`Unobserved`, unless `build_from` builds the client).
    pub(super) client_redirects: Option<ClientRedirects>,
    /// The policy `build_from` wraps in `redirect::recorded` (`None`: reqwest's default).
    pub(super) redirect_policy: Option<reqwest::redirect::Policy>,
    pub(super) span_url_query: bool,
    pub(super) concurrency_limit: Option<LimitChoice>,
    pub(super) coalesce: Option<crate::coalesce::CoalesceGets>,
    #[cfg(feature = "chaos")]
    pub(super) chaos: Option<crate::chaos::Chaos>,
    pub(super) rate_limit: Option<RateChoice>,
    pub(super) resume_bodies: bool,
    /// The pool [`proxies`](Self::proxies) set, until `build_from` builds its clients.
    pub(super) proxies: Option<crate::proxy::ProxyPool>,
    /// The pool's clients, built by `build_from`.
    pub(super) routes: Option<crate::proxy::Routes>,
    /// How `build_from`'s clients connect and how long they wait on the network.
    pub(super) network: crate::network::Network,
    /// The network's state for `build_from`'s client, made by `build_from`.
    pub(super) weather: Option<Arc<crate::network::weather::Weather>>,
}

impl Default for Resilience {
    fn default() -> Self {
        Resilience::new()
    }
}

impl fmt::Debug for Resilience {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resilience")
            .field("retry", &self.retry.name())
            .field("breaker", &self.breaker.name())
            // BearerAuth's Debug never shows the token.
            .field("bearer", &self.bearer)
            .field("per_attempt", &self.per_attempt.len())
            .field("client_redirects", &self.client_redirects)
            .field("on_attempt", &self.on_attempt.is_some())
            .field("concurrency_limit", &self.concurrency_limit.is_some())
            .field("coalesce", &self.coalesce)
            .field("rate_limit", &self.rate_limit.is_some())
            .field("resume_bodies", &self.resume_bodies)
            // The pool's Debug shows each proxy's origin, never its credentials.
            .field("proxies", &self.proxies)
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

impl Resilience {
    /// The full stack with the defaults (see the table above).
    pub fn new() -> Self {
        Resilience {
            retry: RetryKind::Builder(Box::new(RetryMiddleware::builder())),
            breaker: BreakerKind::Default,
            bearer: None,
            per_attempt: Vec::new(),
            on_attempt: None,
            client_redirects: None,
            redirect_policy: None,
            span_url_query: false,
            concurrency_limit: None,
            coalesce: None,
            #[cfg(feature = "chaos")]
            chaos: None,
            rate_limit: None,
            resume_bodies: false,
            proxies: None,
            routes: None,
            network: crate::network::Network::new(),
            weather: None,
        }
    }

    /// The stack that behaves like reqwest-retry's `RetryTransientMiddleware` with
    /// retry-policies' `ExponentialBackoff::builder().jitter(Jitter::Bounded)
    /// .build_with_max_retries(3)`, for a migration that changes nothing silently: 3
    /// retries, 1 s × 2 per retry capped at 30 minutes (retry-policies' default bounds),
    /// [`Jitter::Bounded`](crate::Jitter::Bounded), every `5xx`, 408 and 429 retried for
    /// an idempotent request ([`AnyServerError`](crate::retry::AnyServerError)), no
    /// circuit breaker, no retry budget. What still differs from reqwest-retry, and why,
    /// is the table of [`guide::migration`](crate::guide::migration): above all, a request that may have
    /// been processed (a `POST` after a reset, a timeout or a `500`) is not sent again,
    /// while one proven unsent (a refused connect) is, whatever its method.
    ///
    /// Its retry is [`RetryMiddleware::like_reqwest_retry`]; to change a retry setting,
    /// hand [`retry`](Self::retry) that builder with the change (a later `.retry(..)`
    /// replaces the whole retry part, so start from the preset's builder to keep the rest
    /// of it). The other parts are set as on [`new`](Self::new) (`.breaker(..)` turns a
    /// breaker back on). The client's retry, for an operation or a loop of your own:
    /// [`retry_middleware`](Self::retry_middleware).
    ///
    /// ```
    /// use reqwest_resilience::{Resilience, RetryMiddleware};
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::like_reqwest_retry().build_from(reqwest::Client::builder())?;
    /// // The same, with 5 retries:
    /// let five = Resilience::like_reqwest_retry()
    ///     .retry(RetryMiddleware::like_reqwest_retry().max_retries(5))
    ///     .build_from(reqwest::Client::builder())?;
    /// # drop((client, five)); Ok(()) }
    /// ```
    pub fn like_reqwest_retry() -> Self {
        Resilience::new()
            .retry(RetryMiddleware::like_reqwest_retry())
            .no_breaker()
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
    /// let client = Resilience::new().resume_bodies(true).build_from(reqwest::Client::builder())?;
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

    /// The retry part: a [`RetryMiddlewareBuilder`] (every retry setting: the retry
    /// limit, the backoff, the deadline, the budget, the `Retry-After` cap, the decision
    /// table, the attempt timeout, hedging, the hooks; built with the stack) or a prebuilt
    /// [`RetryMiddleware`] (one whose clone you keep). It replaces the retry part whole,
    /// the preset's of [`like_reqwest_retry`](Self::like_reqwest_retry) included (start
    /// from [`RetryMiddleware::like_reqwest_retry`] to change one of its settings). With a
    /// builder, a [`total_deadline`](RetryMiddlewareBuilder::total_deadline) shorter than
    /// the shortest first backoff delay fails the build
    /// ([`StackError::DeadlineBeforeFirstRetry`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use reqwest_resilience::{Resilience, RetryMiddleware};
    /// use reqwest_resilience::retry::Hedging;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::new()
    ///     .retry(
    ///         RetryMiddleware::builder()
    ///             .max_retries(5)
    ///             .total_deadline(Duration::from_secs(30))
    ///             .hedging(Hedging::adaptive(0.95)),
    ///     )
    ///     .build_from(reqwest::Client::builder())?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn retry(mut self, retry: impl Into<RetryChoice>) -> Self {
        self.retry = retry.into().0;
        self
    }

    /// No retry middleware.
    pub fn no_retry(mut self) -> Self {
        self.retry = RetryKind::Off;
        self
    }

    /// The breaker part (default a new registry with [`BreakerConfig::default`] per built
    /// stack): a [`BreakerConfig`] (a new registry with it, checked at build time), a
    /// shared [`BreakerRegistry`] (clients built with clones of one registry share their
    /// breakers and pauses) or a prebuilt [`CircuitBreakerMiddleware`] (e.g. one with its
    /// own [`AttemptClassifier`](crate::breaker::AttemptClassifier)). To be called on
    /// every state change, build the registry with [`BreakerRegistry::with_listener`].
    ///
    /// ```
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry};
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let registry = BreakerRegistry::with_listener(BreakerConfig::default(), |event| {
    ///     eprintln!("{} is now {:?}", event.origin, event.to);
    /// })?;
    /// let client = Resilience::new().breaker(registry).build(reqwest::Client::new())?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn breaker(mut self, breaker: impl Into<BreakerChoice>) -> Self {
        self.breaker = breaker.into().0;
        self
    }

    /// No circuit breaker.
    pub fn no_breaker(mut self) -> Self {
        self.breaker = BreakerKind::Off;
        self
    }

    /// Attaches bearer tokens (none by default).
    pub fn bearer(mut self, auth: BearerAuth) -> Self {
        self.bearer = Some(auth);
        self
    }

    /// Adds a middleware that runs once per request on the wire: inside retry, breaker
    /// and `BearerAuth` (so it sees the `Authorization` header and every `401` replay),
    /// just outside the transport step. Several run in the order added. It takes the
    /// middleware shared, as `reqwest_middleware::ClientBuilder::with_arc` does:
    /// `.per_attempt(Arc::new(mine))`, or a clone of one of the
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
    ///     .fold(Resilience::new(), |stack, m| stack.per_attempt(m.clone()));
    /// let client = stack.build_from(reqwest::Client::builder())?;
    /// # drop(client); let _ = TransportEvidence::new(); Ok(()) }
    /// ```
    pub fn per_attempt(mut self, middleware: Arc<dyn Middleware>) -> Self {
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

    /// Turns on a per-origin concurrency limit (off by default), between the breaker and
    /// `BearerAuth`: an open breaker rejects before a permit is taken, and every retry
    /// takes a permit of its own. It takes a [`LimiterConfig`] (a new [`LimiterRegistry`]
    /// with it, checked at build time) or a shared [`LimiterRegistry`] (clients built with
    /// clones of one registry share their limits). See [`limit`](crate::limit).
    ///
    /// ```
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::limit::LimiterConfig;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::new()
    ///     .concurrency_limit(LimiterConfig::default()) // adaptive, fail fast
    ///     .build_from(reqwest::Client::builder())?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn concurrency_limit(mut self, limit: impl Into<ConcurrencyLimitChoice>) -> Self {
        self.concurrency_limit = Some(limit.into().0);
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
    ///     .build_from(reqwest::Client::builder())?;
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

    /// Turns on a per-origin rate limit (off by default), between the breaker and the
    /// concurrency limit: an open breaker turns a request away before it spends a slot, a
    /// request waiting for its slot holds no concurrency permit, and every retry takes a
    /// slot of its own. It takes a [`RateLimitConfig`] (a new [`RateLimitRegistry`] with
    /// it, checked at build time) or a shared [`RateLimitRegistry`] (clients built with
    /// clones of one registry spend the same quotas). See [`rate`](crate::rate).
    ///
    /// ```
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::rate::{Rate, RateLimitConfig};
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::new()
    ///     .rate_limit(RateLimitConfig::default().rate(Rate::per_second(20)))
    ///     .build_from(reqwest::Client::builder())?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn rate_limit(mut self, rate: impl Into<RateLimitChoice>) -> Self {
        self.rate_limit = Some(rate.into().0);
        self
    }

    /// Sends every attempt through a proxy of `pool` (none by default), a retry through
    /// the next one when the last proxy failed or refused, each proxy an origin of its own
    /// for the breaker and the evidence ([`RequestEvidence::proxy`]). The retry limit is
    /// raised to [`ProxyPool::retries_to_try_all`](crate::proxy::ProxyPool::retries_to_try_all)
    /// (one fewer than the proxies, at most 10) when it is lower; a prebuilt
    /// [`RetryMiddleware`] keeps its own. See [`crate::proxy`] and
    /// [`guide::proxies`](crate::guide::proxies).
    ///
    /// One `reqwest::Client` is built per proxy, from your settings: only
    /// [`build_from`](Self::build_from) given a closure returning a
    /// `reqwest::ClientBuilder` can build them. Any other way of building, or a pool with
    /// [`per_attempt`](Self::per_attempt) middlewares, [`resume_bodies`](Self::resume_bodies)
    /// or a chaos layer, fails with [`StackError::ProxiesNeedBuildFrom`]; an empty pool or
    /// an invalid proxy URL with their own [`StackError`].
    ///
    /// ```
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::proxy::ProxyPool;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::new()
    ///     .proxies(ProxyPool::new(["http://127.0.0.1:3128", "http://127.0.0.1:3129"]).rotate_on([403]))
    ///     .build_from(|| reqwest::Client::builder().user_agent("mine/1.0"))?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn proxies(mut self, pool: crate::proxy::ProxyPool) -> Self {
        self.proxies = Some(pool);
        self
    }
}

/// A per-attempt middleware, of reqwest-middleware's trait or (feature `astral`) the
/// fork's: it can only be installed into a builder of its own crate.
pub(super) enum PerAttempt {
    Reqwest(Arc<dyn Middleware>),
    #[cfg(feature = "astral")]
    Astral(Arc<dyn astral_reqwest_middleware::Middleware>),
}
