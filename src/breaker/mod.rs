//! Per-origin circuit breakers, with server-directed pauses shared by every caller.
//!
//! - `Breaker` (`state.rs`): the pure state machine of one origin, Closed → Open →
//!   HalfOpen → Closed | Open, driven by `tokio::time::Instant` (so a paused test clock
//!   drives it), plus manual isolation and a `Retry-After` pause.
//! - [`TripPolicy`] (`policy.rs`): consecutive failures (default 5) or a failure ratio
//!   over a sliding window of 10 buckets with a minimum throughput (Polly style);
//!   [`AttemptClassifier`] decides how an attempt counts ([`DefaultClassifier`]: 5xx,
//!   401, 429 and transport failures are failures, a lost connection once per event (see
//!   below); 2xx/3xx successes; other 4xx, a refused stream and a `GOAWAY` neutral).
//! - [`BreakerConfig`] (`config.rs`): open period (30 s), probes (1), growth of the open
//!   period on repeated trips with a cap, jitter, pause cap (60 s) and mode, bound on origins.
//! - [`BreakerRegistry`] (`registry.rs`): one breaker per [`Origin`](crate::Origin),
//!   bounded, sharded, cheap to clone; snapshot, isolate, reset, transition events.
//! - [`CircuitBreakerMiddleware`] (`middleware.rs`): the `reqwest_middleware` step.
//!
//! # What a rejection leaves for the retry middleware
//!
//! When the breaker turns a request away (Open, HalfOpen with its probes taken,
//! isolated, or paused), nothing is sent and the middleware returns
//! `reqwest_middleware::Error::Middleware` holding a [`ResilienceError::BreakerOpen`] or
//! [`ResilienceError::Paused`](crate::ResilienceError::Paused) (both carry the origin and
//! the "retry in"; [`ResilienceError::retry_in`](crate::ResilienceError::retry_in) reads
//! it). In the request's extensions it leaves:
//!
//! - a [`RequestEvidence`](crate::RequestEvidence) from
//!   `RequestEvidence::rejected_locally(FailureKind::BreakerOpen | FailureKind::Paused, …)`:
//!   `Transmission::NotSent`, the origin, the attempt number, and the "retry in" as its
//!   `retry_after`;
//! - the same evidence appended to the [`AttemptHistory`](crate::AttemptHistory);
//! - a [`RetryIn`]: how long until trying again may succeed (absent when the breaker was
//!   isolated by hand: no probe is scheduled, so retrying is pointless).
//!
//! A retry middleware outside it reads `RetryIn::of(&extensions)` after `next.run`
//! and retries no sooner than that: this crate's returns an open breaker's rejection at
//! once unless it waits for open breakers
//! ([`wait_for_open_breakers`](crate::retry::RetryMiddlewareBuilder::wait_for_open_breakers)),
//! and a pause's after its "retry in". The breaker removes a stale `RetryIn` at the start of
//! every attempt, so one found there belongs to the attempt just made.
//!
//! # Routine server events
//!
//! A graceful reload (nginx `HUP`, haproxy `-sf`, apache2 `graceful`, caddy's `/load`), a
//! connection rotation or an idle close shuts the pooled keep-alive connections requests
//! are being written on: every attempt in flight on them ends with no response head,
//! `Closed` ("connection closed before message completed") or `Reset`, on a healthy
//! origin. Those are [`Outcome::ConnectionLost`], and the breaker counts **one failure
//! per event**: a connection loss counts only when its attempt was admitted after the
//! last connection loss the origin's breaker counted; the attempts in flight at that
//! moment were struck by the same event and are neutral. The order is the breaker's own
//! (a count of losses carried by each `Ticket`), not the clock's, so attempts admitted
//! in the same instant are told apart. Everything else counts as before: refused
//! connects, DNS, TLS, 5xx, 401, 429, timeouts and slow calls count every attempt, so a
//! server that is down trips the breaker as fast as ever, and one that resets every
//! connection, fresh ones included, trips it after the policy's count of rounds (5 in a
//! row by default). The failure-ratio policy counts the same: an uncounted loss is not in
//! its window.
//!
//! # Deadlines
//!
//! A request may carry a [`Deadline`](crate::retry::Deadline) in its extensions. In [`PauseMode::Wait`] a request
//! whose deadline would pass before the pause ends fails fast instead of waiting. An
//! attempt still running at the earlier of its deadline and the retry middleware's attempt
//! timeout is cut by the breaker (see [`CircuitBreakerMiddleware`]). **The caller's own
//! limits are neutral**: a cut by the total deadline, or a request future the caller
//! dropped, says nothing about the origin; nothing is counted and a HalfOpen probe's slot
//! is freed (the breaker stays HalfOpen, the next request probes). A cut by the **attempt
//! timeout** is a timeout failure, so a server that hangs trips its breaker when an attempt
//! timeout (or reqwest's own timeout) is set; under a total deadline alone it does not.
//!
//! # The end of a pause
//!
//! The callers a pause held back do not all go in the instant it ends: each waits a
//! uniform share of a short window after it (a tenth of the pause, at most 1 s): a 10 s
//! pause over 100 waiting callers lets about 10 through per 100 ms instead of 100 at once.
//! (A retry middleware that was turned away waits the rejection's "retry in" exactly.)
//!
//! [`ResilienceError::BreakerOpen`]: crate::ResilienceError::BreakerOpen
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use reqwest_middleware::ClientBuilder;
//! use reqwest_resilience::TransportEvidence;
//! use reqwest_resilience::breaker::{
//!     BreakerConfig, BreakerRegistry, CircuitBreakerMiddleware, TripPolicy,
//! };
//! use reqwest_resilience::redirect::{self, ClientRedirects};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = BreakerRegistry::with_listener(
//!     BreakerConfig::default()
//!         .policy(TripPolicy::failure_ratio(0.5, Duration::from_secs(30), 20))
//!         .open_duration(Duration::from_secs(10)),
//!     |event| eprintln!("{} {:?} -> {:?}", event.origin, event.from, event.to),
//! )?;
//! let recorded = redirect::recorded(reqwest::redirect::Policy::default()); // every hop seen
//! let client = ClientBuilder::new(reqwest::Client::builder().redirect(recorded).build()?)
//!     .with(CircuitBreakerMiddleware::new(registry.clone()))
//!     .with(TransportEvidence::with_client_redirects(ClientRedirects::Recorded))
//!     .build();
//! for breaker in registry.snapshot() {
//!     println!("{} {:?} for {:?}", breaker.origin, breaker.state, breaker.time_in_state);
//! }
//! # drop(client); Ok(()) }
//! ```

mod config;
mod middleware;
mod policy;
mod registry;
mod state;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use config::{BreakerConfig, OpenGrowth, PauseMode, SlowCalls};
pub(crate) use middleware::Admitted;
pub use middleware::CircuitBreakerMiddleware;
pub use policy::{AttemptClassifier, DefaultClassifier, Outcome, TripPolicy};
pub use registry::{BreakerEvent, BreakerRegistry, BreakerSnapshot};
pub use state::{BreakerState, RejectReason, TripCause};

pub use crate::record::RetryIn;

/// The wait of one caller held back by a shared pause:
/// `wait` plus a uniform share of a short window (a tenth of the wait, at most 1 s), so
/// the callers a pause held do not all reach the server in the instant it ends.
pub(crate) fn spread_after_pause(wait: Duration) -> Duration {
    const MAX_WINDOW: Duration = Duration::from_secs(1);
    let window = (wait / 10).min(MAX_WINDOW);
    if window.is_zero() {
        return wait;
    }
    let nanos = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
    wait.saturating_add(Duration::from_nanos(rand::random_range(0..nanos)))
}
