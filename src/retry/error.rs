//! [`ErrorWrapping`]: how the retry middleware returns its final error ([`RetryError`]).

/// How the retry middleware returns the last attempt's error when it stops.
///
/// The default, [`ExceptReqwest`](ErrorWrapping::ExceptReqwest), keeps existing `reqwest`
/// error handling working: a failure that ends in a `reqwest::Error` comes back as
/// `reqwest_middleware::Error::Reqwest`, so `is_connect()`, `is_timeout()`, `status()` and
/// `url()` answer as reqwest's would (reqwest-retry does the same). The attempt count and
/// the stop reason are then in [`RetryOutcome`](super::RetryOutcome) and the
/// [`AttemptHistory`](crate::AttemptHistory) in the caller's extensions
/// (`execute_with_extensions`). This crate's own failures (breaker open, pause, no token,
/// the deadline cutting an attempt) are wrapped in
/// [`ResilienceError::Retry`](crate::ResilienceError::Retry), which carries the count and
/// the reason itself; [`ResilienceError::find`](crate::ResilienceError::find) reaches the
/// cause either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ErrorWrapping {
    /// A `reqwest::Error` is returned as it came; any other error is wrapped in
    /// [`ResilienceError::Retry`](crate::ResilienceError::Retry). The default.
    #[default]
    ExceptReqwest,
    /// Every final error is wrapped in
    /// [`ResilienceError::Retry`](crate::ResilienceError::Retry), so a `send()` caller
    /// always learns the attempt count and the stop reason from the error.
    Always,
    /// Every final error is returned as the last attempt produced it.
    Never,
}

impl ErrorWrapping {
    /// Whether `last` is wrapped.
    pub(crate) fn wraps(self, last: &reqwest_middleware::Error) -> bool {
        match self {
            ErrorWrapping::ExceptReqwest => !matches!(last, reqwest_middleware::Error::Reqwest(_)),
            ErrorWrapping::Always => true,
            ErrorWrapping::Never => false,
        }
    }
}

pub use crate::error::retry::RetryError;
pub(crate) use crate::error::retry::find_reqwest_error;
