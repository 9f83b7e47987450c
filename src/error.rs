//! [`ResilienceError`]: the typed errors this crate's middlewares return.
//!
//! They travel inside `reqwest_middleware::Error::Middleware` (an `anyhow::Error`); get
//! them back with [`ResilienceError::from_middleware_error`] or `downcast_ref`.

use std::fmt;

/// An error raised by one of this crate's middlewares.
#[derive(Debug)]
#[non_exhaustive]
pub enum ResilienceError {
    /// A configuration was rejected when it was built.
    InvalidConfig(String),
    /// A [`Resilience`](crate::Resilience) stack whose parts cannot work together (a
    /// deadline shorter than the first delay, no half-open probe, a setting that would be
    /// ignored).
    InvalidStack(crate::stack::StackError),
    /// No bearer token could be had for the request (`BearerAuth`). The token source's
    /// own error is kept as `source()`; the secret never appears.
    Token(crate::auth::TokenError),
    /// The origin's circuit breaker turned the request away; it was not sent
    /// (`Transmission::NotSent`). `retry_in` is when it will probe again (Open), when a
    /// probe's answer is due (HalfOpen with its probes taken), or `None` when it was
    /// isolated by hand and no probe is scheduled.
    BreakerOpen {
        /// The origin whose breaker rejected the request.
        origin: crate::Origin,
        /// The breaker's state.
        state: crate::breaker::BreakerState,
        /// When trying again may succeed.
        retry_in: Option<std::time::Duration>,
    },
    /// The origin is paused by a server's `Retry-After` for every caller of the breaker
    /// registry; the request was not sent (`Transmission::NotSent`).
    Paused {
        /// The paused origin.
        origin: crate::Origin,
        /// Time left in the pause.
        retry_in: std::time::Duration,
    },
    /// The retry middleware stopped after a failed attempt: how many attempts, why it
    /// stopped, and the last error as `source()` (see [`RetryError`](crate::retry::RetryError)).
    Retry(crate::retry::RetryError),
    /// The origin's concurrency limit turned the request away (at once, or after its wait
    /// in the queue ended without a permit); it was not sent (`Transmission::NotSent`).
    /// See [`limit`](crate::limit).
    ConcurrencyLimited {
        /// The origin whose limit was reached.
        origin: crate::Origin,
        /// The limit at the rejection.
        limit: u32,
        /// The attempts in flight to the origin at the rejection.
        in_flight: u32,
    },
}

impl fmt::Display for ResilienceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResilienceError::InvalidConfig(why) => write!(f, "invalid configuration: {why}"),
            ResilienceError::InvalidStack(why) => write!(f, "invalid resilience stack: {why}"),
            ResilienceError::Token(_) => f.write_str("no bearer token for the request"),
            ResilienceError::BreakerOpen {
                origin,
                state,
                retry_in,
            } => match retry_in {
                Some(d) => write!(
                    f,
                    "circuit breaker for {origin} is {state:?}: not sent, retry in {d:?}"
                ),
                None => write!(f, "circuit breaker for {origin} is {state:?}: not sent"),
            },
            ResilienceError::Paused { origin, retry_in } => write!(
                f,
                "{origin} is paused by the server's Retry-After: not sent, retry in {retry_in:?}"
            ),
            ResilienceError::Retry(e) => fmt::Display::fmt(e, f),
            ResilienceError::ConcurrencyLimited {
                origin,
                limit,
                in_flight,
            } => write!(
                f,
                "concurrency limit for {origin} reached ({in_flight} in flight, limit \
                 {limit}): not sent"
            ),
        }
    }
}

impl std::error::Error for ResilienceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ResilienceError::Token(e) => Some(e),
            // The retry error's own cause, so `source()` reaches the `reqwest::Error`.
            ResilienceError::Retry(e) => std::error::Error::source(e),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

impl ResilienceError {
    /// For a local rejection by a breaker or a pause, when trying again may succeed.
    pub fn retry_in(&self) -> Option<std::time::Duration> {
        match self {
            ResilienceError::BreakerOpen { retry_in, .. } => *retry_in,
            ResilienceError::Paused { retry_in, .. } => Some(*retry_in),
            _ => None,
        }
    }

    /// Finds a `ResilienceError` inside a middleware error, if there is one.
    pub fn from_middleware_error(err: &reqwest_middleware::Error) -> Option<&ResilienceError> {
        match err {
            reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<ResilienceError>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }
}
