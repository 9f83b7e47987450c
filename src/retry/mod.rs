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
//! use reqwest_resilience::redirect::{self, ClientRedirects};
//!
//! # fn main() -> Result<(), reqwest::Error> {
//! let recorded = redirect::recorded(reqwest::redirect::Policy::default()); // every hop seen
//! let client = ClientBuilder::new(reqwest::Client::builder().redirect(recorded).build()?)
//!     .with(RetryMiddleware::new())
//!     // innermost: the evidence the retry decides from
//!     .with(TransportEvidence::with_client_redirects(ClientRedirects::Recorded))
//!     .build();
//!
//! // Per request: this POST is safe to repeat, and one retry is enough.
//! let request = client
//!     .post("http://127.0.0.1:8080/jobs")
//!     .with_extension(Idempotent(true))
//!     .with_extension(MaxRetries(1));
//! # drop(request); Ok(()) }
//! ```
//!
//! Per-request overrides are extensions: [`MaxRetries`] (0 disables retrying),
//! [`Idempotent`], [`Deadline`], [`AttemptTimeout`], [`Hedge`]. After the request, [`RetryOutcome`]
//! (attempt count, why it stopped) is in the caller's extensions (with
//! `execute_with_extensions`) and in the response's.

mod attempt_timeout;
mod budget;
mod compat;
mod decision;
mod error;
mod fallback;
mod hedge;
mod latency;
mod middleware;
mod notice;
mod operation;
#[cfg(feature = "retry-policies")]
mod policies;
mod steps;
pub mod strategies;

pub use attempt_timeout::AttemptTimeout;
pub use budget::RetryBudget;
use budget::Withdrawal;
pub use compat::AnyServerError;

pub use crate::record::OperationAttempt;
pub use decision::{
    AttemptContext, DefaultStrategy, ResponseHead, RetryReason, RetryStrategy, StopReason, Verdict,
};
pub(crate) use decision::{DEFAULT_MAX_NOT_PROCESSED_RETRIES, is_idempotent, unsafe_retry};
pub(crate) use error::find_reqwest_error;
pub use error::{ErrorWrapping, RetryError};
pub use hedge::{HedgeDelay, Hedging};
pub(crate) use middleware::ContinuedFailure;
pub use middleware::{RetryAfterPolicy, RetryMiddleware, RetryMiddlewareBuilder};
pub use operation::{Operation, OperationOutcome};
#[cfg(feature = "retry-policies")]
pub use policies::IntoRetryPolicy;
pub use steps::{Step, Steps};

/// How many attempt records the earlier passes of a continued request left (see
/// `continuation`).
pub(crate) fn continuation_recorded(extensions: &http::Extensions) -> usize {
    crate::record::Continuation::recorded(extensions)
}
pub(crate) use notice::BeforeSleep;
pub use notice::RetryNotice;

/// Per-request override of the maximum number of retries (`MaxRetries(0)` disables
/// retrying for that request, not-processed retries included). Retries on the server's
/// proof that it did not process a request ([`RetryReason::NotProcessed`]) and after a
/// connection rotation ([`RetryReason::GoAway`]) are not counted against it: they have a
/// cap of their own
/// ([`RetryMiddlewareBuilder::max_not_processed_retries`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxRetries(pub u32);

/// Per-request idempotency marker: `Idempotent(true)` lets a POST be retried like a PUT
/// (the caller vouches that repeating it is harmless); `Idempotent(false)` stops a GET with
/// side effects from being retried after it may have been processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idempotent(pub bool);

/// Per-request hedging override, for a [`RetryMiddleware`] with [`Hedging`]:
/// `Hedge(false)` sends no hedge for this request (a GET whose load matters more than its
/// tail); `Hedge(true)` hedges it though the [`Hedging`] default would not (a PUT or a
/// DELETE, an `Idempotent(true)` POST): the caller vouches that a *concurrent* duplicate
/// is harmless, which an idempotent request does not promise (a server answers a
/// duplicate that arrives while the original is processing `409`, `404` or `412`).
///
/// `Hedge(true)` never makes a request the retry treats as non-idempotent hedgeable (a
/// POST without `Idempotent(true)` or an `Idempotency-Key`, a GET marked
/// `Idempotent(false)`), nor a body that cannot be copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hedge(pub bool);

pub use crate::record::Deadline;

pub use crate::record::RetryOutcome;
