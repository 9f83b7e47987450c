//! [`RetryError`]: the retry middleware stopped after a failed attempt.

use std::fmt;

use crate::error::ResilienceError;
use crate::record::StopReason;

/// The last attempt failed and no further attempt was made.
///
/// It travels as [`ResilienceError::Retry`](crate::ResilienceError::Retry) inside
/// `reqwest_middleware::Error::Middleware` (see
/// [`ErrorWrapping`](crate::retry::ErrorWrapping) for when). The last attempt's error stays
/// reachable: as [`last_error`](RetryError::last_error), as
/// [`reqwest_error`](RetryError::reqwest_error), and as `source()` (the `reqwest::Error`
/// itself, or the inner middleware's error), so `is_timeout()` and friends can still be
/// asked. In the `source()` chain it sits between the `ResilienceError::Retry` (whose
/// `Display` says how many attempts and why it stopped) and the last error.
///
/// ```no_run
/// # async fn run(client: reqwest_middleware::ClientWithMiddleware) {
/// use reqwest_resilience::{ResilienceError, chain};
///
/// if let Err(err) = client.get("http://127.0.0.1:1/").send().await {
///     if let Some(ResilienceError::Retry(retry)) = ResilienceError::from_middleware_error(&err) {
///         eprintln!("{} attempts, stopped: {}", retry.attempts(), retry.stop_reason());
///     }
///     // Works whether or not the error was wrapped:
///     let timed_out = chain::find::<reqwest::Error>(&err).is_some_and(|e| e.is_timeout());
///     # let _ = timed_out;
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct RetryError {
    attempts: u32,
    stop: StopReason,
    last: reqwest_middleware::Error,
}

impl RetryError {
    pub(crate) fn new(attempts: u32, stop: StopReason, last: reqwest_middleware::Error) -> Self {
        RetryError {
            attempts,
            stop,
            last,
        }
    }

    /// Attempts made, counting the first.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Why no further attempt was made.
    pub fn stop_reason(&self) -> StopReason {
        self.stop
    }

    /// The last attempt's error.
    pub fn last_error(&self) -> &reqwest_middleware::Error {
        &self.last
    }

    /// The last attempt's error, by value.
    pub fn into_last_error(self) -> reqwest_middleware::Error {
        self.last
    }

    /// [`into_last_error`](Self::into_last_error) as the astral fork's error (feature
    /// `astral`), variant for variant: the same `reqwest::Error` or the same middleware
    /// error, without naming reqwest-middleware's type.
    #[cfg(feature = "astral")]
    #[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
    pub fn into_last_error_astral(self) -> astral_reqwest_middleware::Error {
        super::astral::into_astral(self.last)
    }

    /// The `reqwest::Error` of the last attempt, if it was one.
    pub fn reqwest_error(&self) -> Option<&reqwest::Error> {
        find_reqwest_error(&self.last)
    }

    /// Whether the last attempt timed out (`reqwest::Error::is_timeout`), or the
    /// request's deadline cut it (its error is then tokio's `Elapsed`).
    pub fn is_timeout(&self) -> bool {
        self.reqwest_error().is_some_and(reqwest::Error::is_timeout)
            || matches!(&self.last, reqwest_middleware::Error::Middleware(e)
                if e.chain().any(|c| c.is::<tokio::time::error::Elapsed>()))
    }

    /// Whether the last attempt failed to connect (`reqwest::Error::is_connect`).
    pub fn is_connect(&self) -> bool {
        self.reqwest_error().is_some_and(reqwest::Error::is_connect)
    }
}

impl RetryError {
    /// The summary `ResilienceError::Retry` displays: the count and the reason.
    ///
    /// When the last attempt was turned away locally (an open breaker, a server-directed
    /// pause, a concurrency or rate limit), the summary names that cause and the origin:
    /// "stopped: retries exhausted" alone would hide that nothing was sent.
    pub(crate) fn fmt_summary(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = if self.attempts == 1 { "" } else { "s" };
        write!(
            f,
            "request failed after {} attempt{plural}; stopped: {}",
            self.attempts, self.stop
        )?;
        match self.local_rejection() {
            Some(cause) => write!(f, "; the last attempt was not sent: {cause}"),
            None => Ok(()),
        }
    }

    /// The local rejection that ended the last attempt, if one did, in a few words.
    fn local_rejection(&self) -> Option<String> {
        let reqwest_middleware::Error::Middleware(e) = &self.last else {
            return None;
        };
        let cause = e
            .chain()
            .find_map(|c| c.downcast_ref::<ResilienceError>())?;
        match cause {
            ResilienceError::BreakerOpen { origin, state, .. } => {
                Some(format!("the circuit breaker for {origin} is {state:?}"))
            }
            ResilienceError::Paused { origin, .. } => Some(format!("{origin} is paused")),
            ResilienceError::ConcurrencyLimited { origin, .. } => {
                Some(format!("the concurrency limit for {origin} was reached"))
            }
            ResilienceError::RateLimited { origin, .. } => {
                Some(format!("the rate limit for {origin} was reached"))
            }
            _ => None,
        }
    }
}

impl fmt::Display for RetryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The summary is the `ResilienceError::Retry` link above this one and the last
        // error the `source()` below it; neither is repeated here (Rust API guidelines
        // C-GOOD-ERR), so a chain printer shows each once.
        f.write_str("the last attempt failed")
    }
}

impl std::error::Error for RetryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.last {
            reqwest_middleware::Error::Reqwest(e) => Some(e),
            reqwest_middleware::Error::Middleware(e) => Some(e.as_ref()),
        }
    }
}

/// The `reqwest::Error` inside a middleware error, wrapped or not: the error itself for
/// `Error::Reqwest`, else the first `reqwest::Error` in the `source()` chain.
pub(crate) fn find_reqwest_error(err: &reqwest_middleware::Error) -> Option<&reqwest::Error> {
    match err {
        reqwest_middleware::Error::Reqwest(e) => Some(e),
        reqwest_middleware::Error::Middleware(e) => {
            e.chain().find_map(|c| c.downcast_ref::<reqwest::Error>())
        }
    }
}
