//! [`ResilienceError`]: the typed errors this crate's middlewares return.
//!
//! They travel inside `reqwest_middleware::Error::Middleware` (an `anyhow::Error`). Find
//! the cause with [`ResilienceError::find`], which gives the same answer whether or not
//! the retry middleware is installed; [`ResilienceError::from_middleware_error`] gives the
//! outermost one (e.g. the [`ResilienceError::Retry`] that wraps it).

#[cfg(feature = "astral")]
pub(crate) mod astral;
mod body;
pub(crate) mod breaker;
pub(crate) mod retry;
pub(crate) mod stack;
pub(crate) mod token;
pub(crate) mod upload;

pub use body::BodyIncomplete;
// Each error has one public path, in the module of the part it is about:
// `breaker::{BreakerState, RejectReason}`, `retry::RetryError`,
// `stack::{StackError, StackPart}`, `upload::UploadBodyError`, `auth::{TokenError,
// TokenErrorKind}` (and the crate root's `BreakerState`, `StackError`).
pub(crate) use breaker::{BreakerState, RejectReason};
pub(crate) use retry::RetryError;
pub(crate) use stack::{StackError, StackPart};
pub(crate) use token::{SharedSourceError, TokenError, TokenErrorKind};
pub(crate) use upload::UploadBodyError;

use std::fmt;

use crate::misconfig::Misconfiguration;
use crate::origin::Origin;

/// An error raised by one of this crate's middlewares.
///
/// A failure that ends in a `reqwest::Error` is *not* one of these by default: it comes
/// back as `reqwest_middleware::Error::Reqwest`, so existing `is_connect()` /
/// `is_timeout()` / `status()` checks keep working (see
/// [`ErrorWrapping`](crate::retry::ErrorWrapping)). These are this crate's own failures.
///
/// Match on the cause with [`find`](ResilienceError::find): with the retry middleware on,
/// a breaker's rejection arrives wrapped in [`ResilienceError::Retry`] (which says how many
/// attempts were made); without it, bare. `find` gives the innermost either way.
///
/// ```no_run
/// use reqwest_resilience::{Resilience, ResilienceError};
///
/// # async fn run() -> Result<(), ResilienceError> {
/// let client = Resilience::new().build_from(reqwest::Client::builder())?;
/// match client.get("http://127.0.0.1:8080/items").send().await {
///     Ok(response) => println!("{}", response.status()),
///     // reqwest's own answers, as without the stack.
///     Err(e) if e.is_connect() || e.is_timeout() => eprintln!("network: {e}"),
///     Err(e) => match ResilienceError::find(&e) {
///         Some(ResilienceError::BreakerOpen { origin, retry_in, .. }) => {
///             eprintln!("{origin} is failing; try again in {retry_in:?}")
///         }
///         Some(other) => eprintln!("{other}"),
///         None => eprintln!("{e}"),
///     },
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ResilienceError {
    /// A configuration was rejected when it was built.
    InvalidConfig(String),
    /// A [`Resilience`](crate::Resilience) stack whose parts cannot work together (a
    /// deadline shorter than the first delay, no half-open probe, a setting that would be
    /// ignored).
    InvalidStack(StackError),
    /// No bearer token could be had for the request (`BearerAuth`). The token source's
    /// own error is kept as `source()`; the secret never appears.
    Token(TokenError),
    /// The origin's circuit breaker turned the request away; it was not sent
    /// (`Transmission::NotSent`). `retry_in` is when it will probe again (Open), when a
    /// probe's answer is due (HalfOpen with its probes taken), or `None` when it was
    /// isolated by hand and no probe is scheduled.
    BreakerOpen {
        /// The origin whose breaker rejected the request.
        origin: Origin,
        /// The breaker's state.
        state: BreakerState,
        /// When trying again may succeed.
        retry_in: Option<std::time::Duration>,
    },
    /// The origin is paused by a server's `Retry-After` (or by rate-limit fields saying
    /// nothing remains) for every caller of the breaker registry; the request was not
    /// sent (`Transmission::NotSent`).
    Paused {
        /// The paused origin.
        origin: Origin,
        /// Time left in the pause.
        retry_in: std::time::Duration,
    },
    /// The retry middleware stopped after a failed attempt: how many attempts, why it
    /// stopped, and the last error as `source()` (see [`RetryError`]).
    Retry(RetryError),
    /// The stack is assembled so that it cannot work (installed twice, a middleware of
    /// this crate inside the transport step, a retry inside a retry); found on the
    /// request, which was not sent.
    Misconfigured(Misconfiguration),
    /// The origin's concurrency limit turned the request away (at once, or after its wait
    /// in the queue ended without a permit); it was not sent (`Transmission::NotSent`).
    /// See [`limit`](crate::limit).
    ConcurrencyLimited {
        /// The origin whose limit was reached.
        origin: Origin,
        /// The limit at the rejection.
        limit: u32,
        /// The attempts in flight to the origin at the rejection.
        in_flight: u32,
    },
    /// A GET or HEAD that joined a concurrent identical one
    /// ([`CoalesceGets`](crate::coalesce::CoalesceGets)) shares its failure: the one
    /// request another caller sent failed, for all of them. A `reqwest::Error` cannot be
    /// cloned, so its text is kept; that request's [`RequestEvidence`](crate::RequestEvidence)
    /// and [`AttemptHistory`](crate::AttemptHistory) are in this caller's extensions.
    SharedRequestFailed {
        /// The sender's error, as text.
        error: String,
    },
    /// The origin's rate limit turned the request away (its next free slot lay beyond
    /// its wait, or its deadline); it was not sent (`Transmission::NotSent`). See
    /// [`rate`](crate::rate).
    RateLimited {
        /// The origin whose rate was reached.
        origin: Origin,
        /// When the origin's next slot is free.
        retry_in: std::time::Duration,
    },
    /// The `reqwest::ClientBuilder` handed to
    /// [`Resilience::build_from`](crate::Resilience::build_from) could not build the
    /// client (reqwest's own error, kept as `source()`: a TLS backend that cannot start,
    /// a bad certificate or proxy).
    ClientBuild(reqwest::Error),
    /// The request's [`ReplayableBody`](crate::upload::ReplayableBody) could not be
    /// opened for an attempt (the file is missing, unreadable); that attempt was not sent
    /// (`Transmission::NotSent`) and is not retried. The I/O error is kept as `source()`.
    UploadBody(UploadBodyError),
    /// No byte came from the server for the no-progress bound
    /// ([`Network::no_progress`](crate::network::Network::no_progress)) before the
    /// response head: the attempt was cut (`Transmission::Unknown`,
    /// [`FailureKind::NoProgress`](crate::FailureKind::NoProgress)).
    NoProgress {
        /// The origin that sent nothing.
        origin: Origin,
        /// The bound that passed.
        after: std::time::Duration,
    },
    /// The machine's network changed (or the process woke from a suspend) while the
    /// attempt waited on a connection opened before it: the attempt was cut, to run
    /// again on a new connection (`Transmission::Unknown`,
    /// [`FailureKind::NetworkChanged`](crate::FailureKind::NetworkChanged)).
    NetworkChanged {
        /// The origin the attempt went to.
        origin: Origin,
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
                "{origin} is paused by the server (Retry-After or rate-limit fields): not sent, \
                 retry in {retry_in:?}"
            ),
            ResilienceError::Retry(e) => e.fmt_summary(f),
            ResilienceError::Misconfigured(m) => write!(f, "misconfigured stack: {m}"),
            ResilienceError::SharedRequestFailed { error } => {
                write!(
                    f,
                    "the request shared with identical concurrent GETs failed: {error}"
                )
            }
            ResilienceError::ConcurrencyLimited {
                origin,
                limit,
                in_flight,
            } => write!(
                f,
                "concurrency limit for {origin} reached ({in_flight} in flight, limit \
                 {limit}): not sent"
            ),
            ResilienceError::RateLimited { origin, retry_in } => write!(
                f,
                "rate limit for {origin} reached: not sent, next slot in {retry_in:?}"
            ),
            ResilienceError::ClientBuild(_) => f.write_str("the reqwest client could not be built"),
            ResilienceError::UploadBody(e) => write!(f, "{e}: not sent"),
            ResilienceError::NoProgress { origin, after } => {
                write!(
                    f,
                    "no byte from {origin} for {after:?}: the attempt was cut"
                )
            }
            ResilienceError::NetworkChanged { origin } => write!(
                f,
                "the network changed under the attempt to {origin}: cut, to be sent again on a new connection"
            ),
        }
    }
}

impl std::error::Error for ResilienceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ResilienceError::Token(e) => Some(e),
            // The `RetryError` itself, so chain walkers see it; its own source is the last
            // attempt's error.
            ResilienceError::Retry(e) => Some(e),
            ResilienceError::ClientBuild(e) => Some(e),
            ResilienceError::UploadBody(e) => Some(e),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

impl ResilienceError {
    /// For a local rejection by a breaker, a pause or a rate limit, when trying again may
    /// succeed.
    pub fn retry_in(&self) -> Option<std::time::Duration> {
        match self {
            ResilienceError::BreakerOpen { retry_in, .. } => *retry_in,
            ResilienceError::Paused { retry_in, .. } => Some(*retry_in),
            ResilienceError::RateLimited { retry_in, .. } => Some(*retry_in),
            _ => None,
        }
    }

    /// The outermost `ResilienceError` of a middleware error, if it is one (with the retry
    /// middleware on, often the [`ResilienceError::Retry`] wrapping the cause; see
    /// [`find`](Self::find) for the cause itself).
    pub fn from_middleware_error(err: &reqwest_middleware::Error) -> Option<&ResilienceError> {
        match err {
            reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<ResilienceError>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// [`from_middleware_error`](Self::from_middleware_error) for the astral fork's error
    /// (feature `astral`): the same answer for the same failure, so the
    /// [`ResilienceError::Retry`] of a fork client's request says how many attempts were
    /// made.
    ///
    /// ```
    /// use reqwest_resilience::ResilienceError;
    ///
    /// let fork = astral_reqwest_middleware::Error::middleware(ResilienceError::InvalidConfig(
    ///     "example".into(),
    /// ));
    /// assert!(matches!(
    ///     ResilienceError::from_middleware_error_astral(&fork),
    ///     Some(ResilienceError::InvalidConfig(_))
    /// ));
    /// ```
    #[cfg(feature = "astral")]
    #[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
    pub fn from_middleware_error_astral(
        err: &astral_reqwest_middleware::Error,
    ) -> Option<&ResilienceError> {
        match err {
            astral_reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<ResilienceError>(),
            astral_reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// The innermost `ResilienceError` of a middleware error: the cause, whether or not a
    /// retry middleware wrapped it in [`ResilienceError::Retry`] (then the `Retry` itself
    /// when the last attempt's error was not one of this crate's, e.g. a `reqwest::Error`
    /// under [`ErrorWrapping::Always`](crate::retry::ErrorWrapping::Always)), and through
    /// any context a middleware of yours added with `anyhow`. `None` for a
    /// `reqwest_middleware::Error::Reqwest` or an error of another middleware.
    ///
    /// ```
    /// use reqwest_resilience::{Origin, ResilienceError, breaker::BreakerState};
    ///
    /// let open = || ResilienceError::BreakerOpen {
    ///     origin: Origin::parse("https://api.example.com").unwrap(),
    ///     state: BreakerState::Open,
    ///     retry_in: None,
    /// };
    /// let bare = reqwest_middleware::Error::middleware(open());
    /// let context = reqwest_middleware::Error::Middleware(
    ///     anyhow::Error::new(open()).context("while fetching the price list"),
    /// );
    /// for err in [&bare, &context] {
    ///     assert!(matches!(
    ///         ResilienceError::find(err),
    ///         Some(ResilienceError::BreakerOpen { state: BreakerState::Open, .. })
    ///     ));
    /// }
    /// ```
    pub fn find(err: &reqwest_middleware::Error) -> Option<&ResilienceError> {
        match err {
            // The chain runs outer → inner: `Retry`, its `RetryError`, the last error and
            // its sources; the last `ResilienceError` in it is the cause.
            reqwest_middleware::Error::Middleware(e) => e
                .chain()
                .filter_map(|link| link.downcast_ref::<ResilienceError>())
                .last(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// [`find`](Self::find) for the astral fork's error (feature `astral`): the same
    /// answer for the same failure (the cause; the attempt count is in the outermost one,
    /// [`from_middleware_error_astral`](Self::from_middleware_error_astral)).
    ///
    /// ```
    /// use reqwest_resilience::ResilienceError;
    ///
    /// let fork = astral_reqwest_middleware::Error::middleware(ResilienceError::InvalidConfig(
    ///     "example".into(),
    /// ));
    /// assert!(matches!(
    ///     ResilienceError::find_astral(&fork),
    ///     Some(ResilienceError::InvalidConfig(_))
    /// ));
    /// ```
    #[cfg(feature = "astral")]
    #[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
    pub fn find_astral(err: &astral_reqwest_middleware::Error) -> Option<&ResilienceError> {
        match err {
            astral_reqwest_middleware::Error::Middleware(e) => e
                .chain()
                .filter_map(|link| link.downcast_ref::<ResilienceError>())
                .last(),
            astral_reqwest_middleware::Error::Reqwest(_) => None,
        }
    }
}
