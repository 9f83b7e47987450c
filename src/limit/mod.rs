//! Per-origin concurrency limits: a bulkhead, or a limit that adapts to the origin's
//! latency so a saturated server keeps its goodput.
//!
//! A circuit breaker acts once a server is failing; a concurrency limit keeps a slow
//! server from being buried in the first place, and keeps the client's own tasks and
//! sockets bounded. Requests beyond what a server can serve at once only wait in its
//! queue: they add latency to every request and, once their callers have given up, work
//! that nobody reads. Limiting the attempts in flight per origin keeps that queue short;
//! the requests over the limit fail at once, locally, and cost no network.
//!
//! - [`LimitPolicy`] (`config.rs`): [`LimitPolicy::Fixed`] (a bulkhead: Polly's
//!   concurrency limiter, resilience4j's bulkhead, Envoy's `max_requests`) or
//!   [`LimitPolicy::Adaptive`] with [`Gradient`] parameters (the default).
//! - `AdaptiveLimit` (`gradient.rs`): the pure arithmetic of the adaptive limit, after
//!   Netflix concurrency-limits' gradient limit; see [`Gradient`] for the algorithm, its
//!   parameters and their defaults.
//! - [`LimiterConfig`]: the policy, a bounded wait queue with its own timeout (default:
//!   no queue, fail fast), the bound on origins.
//! - [`LimiterRegistry`] (`registry.rs`): one limit per [`Origin`](crate::Origin),
//!   bounded, shared across clients, with a [`snapshot`](LimiterRegistry::snapshot).
//! - [`ConcurrencyLimit`] (`middleware.rs`): the `reqwest_middleware` step.
//!
//! # Place in the stack
//!
//! Inside the breaker, so an open breaker rejects before a permit is taken; inside the
//! retry, so a limit counts wire attempts (every retry takes a permit of its own), which
//! is what loads the server (the whole order: [`guide::stack`](crate::guide::stack)). Off by default in [`Resilience`](crate::Resilience); one
//! call turns it on:
//!
//! ```
//! use reqwest_resilience::Resilience;
//! use reqwest_resilience::limit::LimiterConfig;
//!
//! # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
//! let client = Resilience::new()
//!     .concurrency_limit(LimiterConfig::default()) // adaptive, fail fast
//!     .build_from(reqwest::Client::builder())?;
//! # drop(client); Ok(()) }
//! ```
//!
//! # What a rejection leaves
//!
//! [`ResilienceError::ConcurrencyLimited`](crate::ResilienceError::ConcurrencyLimited)
//! (origin, limit, in-flight count), and in the extensions a `NotSent`
//! [`RequestEvidence`](crate::RequestEvidence) with
//! [`FailureKind::ConcurrencyLimited`](crate::FailureKind::ConcurrencyLimited), appended
//! to the [`AttemptHistory`](crate::AttemptHistory). The retry middleware stops at once
//! on it ([`StopReason::ConcurrencyLimited`](crate::retry::StopReason::ConcurrencyLimited)):
//! waiting for a permit is the queue's job, within the same deadline, and a retry after a
//! backoff would only return to an origin that was already full. The breaker counts it
//! as neutral.
//!
//! # Observability
//!
//! [`LimiterRegistry::snapshot`] and [`LimiterRegistry::get`] give each origin's limit,
//! in-flight count, queue length, rejections and no-load latency. With the `tracing`
//! feature, a `DEBUG` event (target `reqwest_resilience::limit`) on every change of a
//! limit and every rejection. With the `metrics` feature (label `origin`, the origin's
//! text; `_overflow` for the shared overflow limit):
//!
//! | instrument | kind | unit |
//! |---|---|---|
//! | `reqwest_resilience.limiter.limit` | gauge | attempts |
//! | `reqwest_resilience.limiter.in_flight` | gauge | attempts |
//! | `reqwest_resilience.limiter.rejections` | counter | requests |

mod body;
mod config;
mod gradient;
mod middleware;
mod registry;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use config::{LimitPolicy, LimiterConfig};
pub use gradient::Gradient;
pub use middleware::ConcurrencyLimit;
pub(crate) use middleware::LimitChoice;
pub use registry::{LimitSnapshot, LimiterRegistry};

/// Instants are added to configured durations; a year keeps every sum far inside the
/// clock's range.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
