//! [`StackError`]: a [`Resilience`](crate::Resilience)(crate::Resilience) stack whose parts
//! cannot work together.

use std::fmt;
use std::time::Duration;

/// Which part of the stack a [`StackError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StackPart {
    /// The retry middleware.
    Retry,
    /// The `reqwest::Client` below the stack: prebuilt by the caller (a
    /// [`redirect_policy`](crate::Resilience::redirect_policy) cannot apply to it), or
    /// built by [`build_from`](crate::Resilience::build_from), which declares its
    /// redirects itself.
    Client,
    /// The [`per_attempt`](crate::Resilience::per_attempt) middlewares.
    PerAttempt,
}

/// A [`Resilience`](crate::Resilience) configuration that cannot work, found when the stack
/// is built (inside
/// [`ResilienceError::InvalidStack`](super::ResilienceError::InvalidStack)). A part's own
/// checks (a bad [`Backoff`](crate::Backoff), an invalid
/// [`BreakerConfig`](crate::BreakerConfig) field other than the probes) keep their
/// [`ResilienceError::InvalidConfig`](super::ResilienceError::InvalidConfig).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StackError {
    /// The total deadline ends before the shortest first backoff delay the jitter can
    /// give (or is zero): no retry could ever be made.
    DeadlineBeforeFirstRetry {
        /// The configured total deadline.
        total_deadline: Duration,
        /// The shortest possible delay before the first retry.
        first_delay: Duration,
    },
    /// `BreakerConfig::half_open_probes` is 0: a HalfOpen breaker would admit no probe
    /// and could never close again.
    NoHalfOpenProbes,
    /// A setting was given for a part that is removed or built elsewhere, so it would be
    /// silently ignored: [`resume_bodies`](crate::Resilience::resume_bodies) with
    /// [`no_retry`](crate::Resilience::no_retry), a
    /// [`redirect_policy`](crate::Resilience::redirect_policy) for a prebuilt client, a
    /// [`client_redirects`](crate::Resilience::client_redirects) declaration with
    /// [`build_from`](crate::Resilience::build_from).
    Conflict {
        /// The part.
        part: StackPart,
        /// The setting that cannot apply (the builder method's name).
        setting: &'static str,
    },
    /// A per-attempt middleware of the other `Middleware` trait than the builder's: one
    /// for the astral fork's `ClientBuilder` given to a reqwest-middleware one, or the
    /// reverse (feature `astral`).
    PerAttemptOtherTrait {
        /// The crate whose `ClientBuilder` the stack is installed into.
        builder: &'static str,
    },
    /// [`Resilience::into_middleware`](crate::Resilience::into_middleware) with
    /// per-attempt middlewares: they run between `BearerAuth` and the transport step, in
    /// the client's chain, which one middleware cannot hold. Take
    /// [`into_middlewares`](crate::Resilience::into_middlewares) or install the stack
    /// into a builder ([`install`](crate::Resilience::install)) instead.
    PerAttemptInOneMiddleware,
    /// [`Resilience::into_middleware`](crate::Resilience::into_middleware) with a chaos
    /// layer (feature `chaos`): it runs after the transport step, in the client's chain,
    /// which one middleware cannot hold. Take
    /// [`into_middlewares`](crate::Resilience::into_middlewares) instead.
    ChaosInOneMiddleware,
    /// [`Resilience::resume_bodies`](crate::Resilience::resume_bodies) on a stack made for
    /// a client built later ([`into_middleware`](crate::Resilience::into_middleware),
    /// [`into_middlewares`](crate::Resilience::into_middlewares)): a resumed body sends its
    /// range requests over the `reqwest::Client` below the stack, which such a stack does
    /// not know. Build or install it with the client instead.
    ResumeWithoutClient,
    /// [`Resilience::coalesce_gets`](crate::Resilience::coalesce_gets) with
    /// [`per_attempt`](crate::Resilience::per_attempt) middlewares: the coalescing stage
    /// sits outside the retry and cannot see what a per-attempt middleware adds to each
    /// request (a tenant's key taken from the request's extensions), so it could not keep
    /// apart requests that differ on the wire. Put a middleware whose headers depend on
    /// the request around the stack ([`install`](crate::Resilience::install)), where the
    /// coalescing stage sees and keys them.
    CoalesceWithPerAttempt,
    /// A [`ProxyPool`](crate::proxy::ProxyPool) with no proxy.
    NoProxies,
    /// The proxy at `index` of a [`ProxyPool`](crate::proxy::ProxyPool) is not a proxy URL
    /// reqwest can use (`http`, `https`, `socks5`, `socks5h`, with a host). The URL is not
    /// repeated: it may carry a password.
    InvalidProxy {
        /// Its place in the pool, from 0.
        index: usize,
    },
    /// A status given to [`ProxyPool::rotate_on`](crate::proxy::ProxyPool::rotate_on)
    /// outside 100–599.
    InvalidRotateStatus {
        /// The status.
        status: u16,
    },
    /// A [`proxies`](crate::Resilience::proxies) pool with another way of building than
    /// [`build_from`](crate::Resilience::build_from) given a closure (one
    /// `reqwest::Client` per proxy is built from your settings, which only a closure
    /// returning a `reqwest::ClientBuilder` can give more than once), or with a part the
    /// pool cannot serve: `with` names it (`build`, `install`, `into_middleware`,
    /// `into_middlewares`, `a single ClientBuilder`, `per_attempt`, `resume_bodies`,
    /// `chaos`).
    ProxiesNeedBuildFrom {
        /// What the pool was combined with.
        with: &'static str,
    },
}

impl fmt::Display for StackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StackError::DeadlineBeforeFirstRetry {
                total_deadline,
                first_delay,
            } => write!(
                f,
                "total deadline {total_deadline:?} ends before the first retry could start \
                 (shortest first delay {first_delay:?})"
            ),
            StackError::NoHalfOpenProbes => f.write_str(
                "half_open_probes is 0: a half-open breaker could never close; use at least 1",
            ),
            StackError::Conflict {
                part: StackPart::Client,
                setting,
            } => write!(
                f,
                "`{setting}` cannot apply: build_from builds the client with the recorded \
                 redirect policy and declares it, and a prebuilt client has its redirect \
                 policy from its own builder"
            ),
            StackError::Conflict { part, setting } => {
                write!(f, "`{setting}` cannot apply: the {part:?} part is removed")
            }
            StackError::PerAttemptOtherTrait { builder } => write!(
                f,
                "a per-attempt middleware implements the other crate's Middleware trait than \
                 the {builder} ClientBuilder the stack is installed into"
            ),
            StackError::PerAttemptInOneMiddleware => f.write_str(
                "per-attempt middlewares cannot be part of one middleware (into_middleware): \
                 install the stack into a ClientBuilder instead",
            ),
            StackError::ResumeWithoutClient => f.write_str(
                "resume_bodies needs the reqwest::Client below the stack (its range requests go \
                 over it): build or install the stack with the client, not into_middleware(s)",
            ),
            StackError::CoalesceWithPerAttempt => f.write_str(
                "coalesce_gets cannot be combined with per-attempt middlewares: the coalescing \
                 stage cannot see what they add to a request; install a middleware whose \
                 headers depend on the request around the stack instead",
            ),
            StackError::NoProxies => f.write_str("a proxy pool needs at least one proxy"),
            StackError::InvalidProxy { index } => write!(
                f,
                "proxy {index} of the pool is not a proxy URL (http, https, socks5 or socks5h, \
                 with a host)"
            ),
            StackError::InvalidRotateStatus { status } => {
                write!(f, "rotate_on: {status} is not an HTTP status (100-599)")
            }
            StackError::ProxiesNeedBuildFrom { with } => write!(
                f,
                "a proxy pool cannot be combined with {with}: build the stack with \
                 build_from(|| reqwest::Client::builder()...), one client per proxy"
            ),
            StackError::ChaosInOneMiddleware => f.write_str(
                "a chaos layer cannot be part of one middleware (into_middleware): it runs \
                 after the transport step; install the stack into a ClientBuilder instead",
            ),
        }
    }
}

impl std::error::Error for StackError {}
