//! Per-origin client-side rate limits, set by hand and learned from the servers'
//! rate-limit fields, so a client spends its quota before a server has to answer `429`
//! (layer 5: a stage).
//!
//! A concurrency limit bounds how many requests are in flight; a rate limit bounds how
//! many start per unit of time, which is what a server's quota counts. A request over the
//! rate waits for its slot (bounded by [`RateLimitConfig::max_wait`] and its deadline) or
//! is turned away at once, locally, `NotSent`, without touching the network.
//!
//! - [`Rate`] and [`RateLimitConfig`] (`config.rs`): the hand-set rate, learning, the
//!   bounds of a wait, the cap on a server's reset, the bound on origins.
//! - `schedule.rs`: one origin's rate as pure arithmetic (GCRA, the server's allowance,
//!   the probe), the clock passed in.
//! - [`RateLimitRegistry`] (`registry.rs`): one rate per [`Origin`](crate::Origin),
//!   bounded, shared across clients, with a per-origin [`get`](RateLimitRegistry::get).
//! - [`RateLimit`] (`middleware.rs`): the `reqwest_middleware` step.
//!
//! # Learned from the server
//!
//! With [`learn`](RateLimitConfig::learn) on (the default), every answer's rate-limit
//! fields (every form in [the guide](crate::guide::rate_limits): the IETF `RateLimit-Policy` /
//! `RateLimit` in their current and earlier forms, `RateLimit-Limit` / `-Remaining` /
//! `-Reset`, GitHub-style `X-RateLimit-*`) set the origin's rate:
//!
//! | the server says | the client does |
//! |---|---|
//! | a quota: `q` requests per `w` seconds (`RateLimit-Policy: 10;w=1`) | one request per `w / q` (capped at [`max_server_wait`](RateLimitConfig::max_server_wait), 60 s) and 5 % ([`headroom`](RateLimitConfig::headroom)), no burst: no window of `w` holds more than `q` of them, however the server counts |
//! | `r` remain until a reset in `t` (`RateLimit: "default";r=5;t=30`, `X-RateLimit-Remaining` + `-Reset`) | at most `r` more before the reset (`t` capped at [`max_server_wait`](RateLimitConfig::max_server_wait), 60 s); when none remain, the requests wait for the reset, then one goes first |
//! | nothing yet (the origin's first request) | that request goes alone; the others wait for its answer, up to [`probe_wait`](RateLimitConfig::probe_wait) (1 s) |
//!
//! The slower of the hand-set and the learned rate applies. A malformed field teaches
//! nothing.
//!
//! # How long a server's fields hold a caller
//!
//! One bound, [`max_server_wait`](RateLimitConfig::max_server_wait) (60 s), on what the
//! fields do to an origin: a quota's interval is capped at it (plus the headroom), so is a
//! reset, and a learned state that has turned every request away for that long is
//! forgotten: the next request probes the server again. A server never shuts an origin
//! for good (`RateLimit-Policy: 1;w=999999999999999` paces one request per 63 s with the
//! defaults). One request waits for its slot at most
//! [`max_wait`](RateLimitConfig::max_wait) (30 s) and its [`Deadline`](crate::retry::Deadline),
//! else it is turned away at once (`RateLimited`, `NotSent`, not retried): a caller is held
//! at most the shortest of `max_wait`, `max_server_wait` and its deadline.
//!
//! In the [`Resilience`](crate::Resilience) stack a learning rate limit is the one stage
//! that applies the fields: the circuit breaker, which otherwise turns fields saying
//! nothing remains into a pause of the origin (capped at its
//! [`max_pause`](crate::breaker::BreakerConfig::max_pause), each wait for it at most
//! `max_pause`, then `Paused` and the retry policy decides), leaves them to it, and its
//! `max_pause` bounds `Retry-After` alone. Stacked by hand, turn the breaker's
//! [`rate_limit_pauses`](crate::breaker::BreakerConfig::rate_limit_pauses) off for the
//! same single bound.
//!
//! # Place in the stack
//!
//! Between the breaker and the concurrency limit (the whole order:
//! [`guide::stack`](crate::guide::stack)).
//!
//! Off by default in [`Resilience`](crate::Resilience); one call turns it on:
//!
//! ```
//! use reqwest_resilience::Resilience;
//! use reqwest_resilience::rate::RateLimitConfig;
//!
//! # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
//! let client = Resilience::new()
//!     .rate_limit(RateLimitConfig::default()) // learned from the servers
//!     .build_from(reqwest::Client::builder())?;
//! # drop(client); Ok(()) }
//! ```
//!
//! # Why this crate's own GCRA, not `governor`
//!
//! `governor` 0.10 is the well-kept Rust rate limiter, and its GCRA is the same
//! arithmetic. It does not fit here: its quota is fixed per limiter (a learned rate would
//! mean a new limiter per change, losing the schedule), its state cannot take a server's
//! "r remain until t", its keyed store is unbounded (only swept by `retain_recent`), and
//! its waits run on `futures-timer`, not tokio's clock, so they cannot be tested on a
//! paused clock. The arithmetic is 30 lines of `schedule.rs`, tested alone.
//!
//! # What a rejection leaves
//!
//! [`ResilienceError::RateLimited`](crate::ResilienceError::RateLimited) (origin, when the
//! next slot is free), and in the extensions a `NotSent`
//! [`RequestEvidence`](crate::RequestEvidence) with
//! [`FailureKind::RateLimited`](crate::FailureKind::RateLimited) and `retry_after` the
//! time to the next slot, appended to the [`AttemptHistory`](crate::AttemptHistory). The
//! retry middleware stops at once on it
//! ([`StopReason::RateLimited`](crate::retry::StopReason::RateLimited)); the breaker
//! counts it as neutral.

mod config;
mod middleware;
mod registry;
mod schedule;
#[cfg(test)]
mod tests;

pub use config::{Rate, RateLimitConfig};
pub use middleware::RateLimit;
pub(crate) use middleware::{RateChoice, learn};
pub use registry::{RateLimitRegistry, RateSnapshot};
pub(crate) use registry::{Ticket, Waiting};
