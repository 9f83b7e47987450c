//! The retry engine: [`RetryMiddleware`], its decision table ([`RetryStrategy`],
//! [`DefaultStrategy`]), the [`RetryBudget`], and the per-request overrides.
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
//! [`Idempotent`], [`Deadline`]. After the request, [`RetryOutcome`] (attempt count, why it
//! stopped) is in the caller's extensions (with `execute_with_extensions`) and in the
//! response's.

mod budget;
mod decision;
mod error;
mod middleware;
#[cfg(feature = "retry-policies")]
mod policies;

pub use budget::RetryBudget;
pub use decision::{
    AttemptContext, DefaultStrategy, RetryReason, RetryStrategy, StopReason, Verdict, is_idempotent,
};
pub use error::{RetryError, find_reqwest_error};
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

/// Per-request total deadline: no retry whose delay would end past it. Replaces the
/// middleware's own total deadline for that request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(DeadlineAt);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeadlineAt {
    After(Duration),
    At(Instant),
}

impl Deadline {
    /// `total` after the retry middleware receives the request.
    pub fn after(total: Duration) -> Self {
        Deadline(DeadlineAt::After(total))
    }

    /// At a fixed instant (tokio's clock), e.g. one derived from an incoming request.
    pub fn at(instant: Instant) -> Self {
        Deadline(DeadlineAt::At(instant))
    }

    /// The instant, for a request received at `started`; `None` if beyond the clock's range.
    fn resolve(self, started: Instant) -> Option<Instant> {
        match self.0 {
            DeadlineAt::After(d) => started.checked_add(d),
            DeadlineAt::At(i) => Some(i),
        }
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
