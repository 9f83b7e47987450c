//! The [`Resilience`] builder: what each part of the stack is to be (a default, a
//! configuration, a shared registry, a prebuilt middleware or nothing), set by one
//! method each. It only records choices; `assemble` turns them into stages.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest_middleware::Middleware;

use super::observer::AttemptHook;
use crate::auth::BearerAuth;
use crate::backoff::Backoff;
use crate::breaker::{BreakerConfig, BreakerEvent, BreakerRegistry, CircuitBreakerMiddleware};
#[cfg(doc)]
use crate::error::{ResilienceError, StackError};
#[cfg(doc)]
use crate::evidence::TransportEvidence;
use crate::limit::{LimitChoice, LimiterConfig, LimiterRegistry};
use crate::record::{AttemptDecision, RequestEvidence};
use crate::redirect::ClientRedirects;
use crate::retry::{
    BeforeSleep, ErrorWrapping, Hedging, RetryAfterPolicy, RetryBudget, RetryMiddleware,
    RetryMiddlewareBuilder, RetryNotice, RetryStrategy,
};

pub(super) type TransitionHook = Arc<dyn Fn(&BreakerEvent) + Send + Sync>;

/// Which retry middleware the stack installs.
pub(super) enum RetryChoice {
    Default,
    Prebuilt(RetryMiddleware),
    Off,
}

/// Which breaker the stack installs.
pub(super) enum BreakerChoice {
    Default,
    Config(BreakerConfig),
    Registry(BreakerRegistry),
    Middleware(CircuitBreakerMiddleware),
    Off,
}

/// Settings applied to the default retry middleware; `None` keeps its default.
#[derive(Default)]
pub(super) struct RetrySettings {
    pub(super) max_retries: Option<u32>,
    pub(super) backoff: Option<Backoff>,
    pub(super) total_deadline: Option<Duration>,
    pub(super) budget: Option<Option<RetryBudget>>,
    pub(super) retry_after_cap: Option<(Duration, RetryAfterPolicy)>,
    pub(super) error_wrapping: Option<ErrorWrapping>,
    pub(super) attempt_timeout: Option<Duration>,
    pub(super) hedging: Option<Hedging>,
    pub(super) max_not_processed_retries: Option<u32>,
    pub(super) strategy: Option<Arc<dyn RetryStrategy>>,
    pub(super) before_sleep: Option<Arc<BeforeSleep>>,
    #[cfg(feature = "tracing")]
    pub(super) retry_event_level: Option<tracing::Level>,
    /// Set by [`Resilience::like_reqwest_retry`] (the settings above it made), to name it
    /// in a conflict.
    pub(super) like_reqwest_retry: bool,
}

impl RetrySettings {
    /// The strategy, the `before_sleep` hook and the retry event's level, where set.
    pub(super) fn apply_decision_and_observers(
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
    pub(super) fn first_set(&self) -> Option<&'static str> {
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

/// Builds the whole resilience stack on a `reqwest_middleware::ClientBuilder`: the stages,
/// their order and why in [`guide::stack`](crate::guide::stack), every default and where it
/// comes from in [`guide::defaults`](crate::guide::defaults). A new [`BreakerRegistry`] per
/// built stack unless one is given; [`TransportEvidence`] always.
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
///     .build_from(reqwest::Client::builder())?;
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
    pub(super) retry: RetryChoice,
    pub(super) retry_settings: RetrySettings,
    pub(super) breaker: BreakerChoice,
    pub(super) bearer: Option<BearerAuth>,
    pub(super) per_attempt: Vec<PerAttempt>,
    pub(super) on_attempt: Option<AttemptHook>,
    pub(super) on_breaker_transition: Option<TransitionHook>,
    /// `None`: not declared (`Unobserved`, unless `build_from` builds the client).
    pub(super) client_redirects: Option<ClientRedirects>,
    /// The policy `build_from` wraps in `redirect::recorded` (`None`: reqwest's default).
    pub(super) redirect_policy: Option<reqwest::redirect::Policy>,
    pub(super) span_url_query: bool,
    pub(super) concurrency_limit: Option<LimitChoice>,
    pub(super) coalesce: Option<crate::coalesce::CoalesceGets>,
    #[cfg(feature = "chaos")]
    pub(super) chaos: Option<crate::chaos::Chaos>,
    pub(super) rate_limit: Option<crate::rate::RateChoice>,
    pub(super) resume_bodies: bool,
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
    /// is the table of [`guide::migration`](crate::guide::migration): above all, a request that may have
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
    ///     .build_from(reqwest::Client::builder())?;
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
    /// let client = stack.build_from(reqwest::Client::builder())?;
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
    ///     .build_from(reqwest::Client::builder())?;
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
    ///     .build_from(reqwest::Client::builder())?;
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
}

/// A per-attempt middleware, of reqwest-middleware's trait or (feature `astral`) the
/// fork's: it can only be installed into a builder of its own crate.
pub(super) enum PerAttempt {
    Reqwest(Arc<dyn Middleware>),
    #[cfg(feature = "astral")]
    Astral(Arc<dyn astral_reqwest_middleware::Middleware>),
}
