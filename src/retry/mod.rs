//! The retry engine: [`RetryMiddleware`], its decision table ([`RetryStrategy`],
//! [`DefaultStrategy`]), the [`RetryBudget`], the per-request overrides, and the tail
//! latency tools that work on its attempts: the attempt timeout and [`Hedging`].
//!
//! The middleware re-runs the rest of the stack per attempt and decides from the
//! [`RequestEvidence`](crate::RequestEvidence) the transport step left, never from the error
//! type alone: a POST whose connection was refused is retried, a POST whose connection
//! closed after the request went out is not.
//!
//! ```
//! use std::time::Duration;
//! use reqwest_middleware::ClientBuilder;
//! use reqwest_resilience::{RetryMiddleware, TransportEvidence};
//! use reqwest_resilience::retry::{Idempotent, MaxRetries};
//!
//! let client = ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::new())
//!     .with(TransportEvidence::new()) // innermost: the evidence the retry decides from
//!     .build();
//!
//! // Per request: this POST is safe to repeat, and one retry is enough.
//! let request = client
//!     .post("http://127.0.0.1:8080/jobs")
//!     .with_extension(Idempotent(true))
//!     .with_extension(MaxRetries(1));
//! # drop(request);
//! ```
//!
//! Per-request overrides are extensions: [`MaxRetries`] (0 disables retrying),
//! [`Idempotent`], [`Deadline`], [`AttemptTimeout`]. After the request, [`RetryOutcome`] (attempt count, why it
//! stopped) is in the caller's extensions (with `execute_with_extensions`) and in the
//! response's.

mod attempt_timeout;
mod budget;
mod decision;
mod error;
mod fallback;
mod hedge;
mod latency;
mod middleware;
#[cfg(feature = "retry-policies")]
mod policies;

pub use attempt_timeout::AttemptTimeout;
pub(crate) use attempt_timeout::{AttemptScope, earlier};
pub use budget::RetryBudget;
use budget::Withdrawal;
pub use decision::{
    AttemptContext, DefaultStrategy, RetryReason, RetryStrategy, StopReason, Verdict, is_idempotent,
};
pub use error::{ErrorWrapping, RetryError, find_reqwest_error};
pub use hedge::{HedgeDelay, Hedging};
pub use middleware::{RetryAfterPolicy, RetryMiddleware, RetryMiddlewareBuilder};

use std::time::Duration;

use tokio::time::Instant;

/// Per-request override of the maximum number of retries (`MaxRetries(0)` disables
/// retrying for that request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxRetries(pub u32);

/// Per-request idempotency marker: `Idempotent(true)` lets a POST be retried like a PUT
/// (the caller vouches that repeating it is harmless); `Idempotent(false)` stops a GET with
/// side effects from being retried after it may have been processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idempotent(pub bool);

/// Per-request total deadline, shared with the circuit breaker (the same type as
/// [`breaker::Deadline`](crate::breaker::Deadline)): the retry middleware makes no retry whose
/// delay would end past it and cuts an attempt still running at it (the attempt's evidence
/// is then `Unknown`/`Timeout`, and the stop reason `DeadlineExceeded`), and the breaker does not wait for a pause past it. It replaces
/// the retry middleware's own [`total_deadline`](RetryMiddlewareBuilder::total_deadline) for
/// that request; when only the latter is set, the retry middleware hands it on to the
/// middlewares inside it as a `Deadline` for the duration of the request.
pub use crate::breaker::Deadline;

impl Deadline {
    /// `total` from now (tokio's clock).
    ///
    /// ```
    /// use std::time::Duration;
    /// use reqwest_resilience::retry::Deadline;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let client = reqwest_middleware::ClientWithMiddleware::from(reqwest::Client::new());
    /// let request = client
    ///     .get("http://127.0.0.1:8080/report")
    ///     .with_extension(Deadline::after(Duration::from_secs(5)));
    /// # drop(request); }
    /// ```
    pub fn after(total: Duration) -> Self {
        let now = Instant::now();
        // Beyond the clock's range is as good as no deadline.
        Deadline(
            now.checked_add(total)
                .unwrap_or(now + Duration::from_secs(86_400 * 365 * 30)),
        )
    }
}

/// What the retry middleware did, left in the caller's extensions and the response's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryOutcome {
    /// Attempts made, counting the first.
    pub attempts: u32,
    /// Why no further attempt was made (for a success: `FinalResponse(200)`).
    pub stop: StopReason,
}

impl RetryOutcome {
    /// Attempts after the first: OpenTelemetry's `http.request.resend_count`.
    pub fn resend_count(&self) -> u32 {
        self.attempts.saturating_sub(1)
    }
}
