//! [`Resilience`]: the whole stack, in the right order, with the design's defaults, in
//! one builder (the analogue of Polly's `AddStandardResilienceHandler`).
//!
//! ```text
//! [your outer middleware] → Retry → CircuitBreaker → [RateLimit] → [ConcurrencyLimit] → BearerAuth → [per_attempt] → TransportEvidence → reqwest::Client
//! ```
//!
//! - **Retry outermost**: every attempt passes through the breaker, gets a fresh token
//!   and is observed by the transport step (Polly's standard pipeline also puts retry
//!   outside the breaker).
//! - **Breaker outside `BearerAuth`**: it sees the outcome *after* a `401` was healed by a
//!   refresh and a replay, so a routine token expiry does not count against the server.
//! - **The token before the breaker and the limiter**: the stack fetches an attempt's
//!   bearer token before the breaker and the concurrency limit admit it, so a request
//!   waiting for its token holds no half-open probe slot and no limiter permit (a token
//!   source that fetches from the same origin through the same breaker registry would
//!   otherwise be refused by the probe its own request holds). A request that gets no
//!   token is `NotSent` / `TokenUnavailable` and never reaches them. Used alone,
//!   `BearerAuth` fetches where it stands: under a `CircuitBreakerMiddleware` of yours,
//!   its token wait holds the breaker's permit.
//! - **`TransportEvidence` innermost**: only there is the raw `reqwest::Error` seen before
//!   anything interprets it. It is always installed: every decision above reads it.
//!
//! Your own middleware goes either *around* the stack (one call per logical request:
//! build a `ClientBuilder` with it and hand that to [`Resilience::install`]) or *per
//! attempt* ([`Resilience::per_attempt`]: between `BearerAuth` and the transport step, so
//! it sees every request that goes on the wire, a `401` replay included). Put
//! `reqwest-tracing`'s `TracingMiddleware` per attempt to get the `client` span per
//! physical request that OpenTelemetry's HTTP conventions ask for, under this crate's
//! `internal` span of the logical call (feature `tracing`). reqwest-tracing records no
//! `http.request.resend_count`: the attempt number is on this crate's per-attempt
//! events, in the [`RequestEvidence`](crate::RequestEvidence) and in the history. Around
//! the stack it gives one `client` span per call instead (this crate's span, `internal`,
//! then nests inside it).
//!
//! The stack is installed as one middleware whose stages are nested at compile time
//! (`src/stack/compose.rs`, over the stage vocabulary of `src/stage/`): one boxed future
//! per request for all of them (and one per attempt below the retry loop) instead of one
//! per layer, the origin worked out once per logical request, the bearer token fetched
//! before the breaker and the limiter admit an attempt, and `BearerAuth` replaying a
//! `401` from the retry's copy of the request. With a
//! [`per_attempt`](Resilience::per_attempt) middleware, the transport step follows it as
//! a middleware of its own.
//!
//! A middleware cannot be added with `.with()` *after* the stack (the [`StackBuilder`]
//! has no `.with()`): it would land inside the transport step.
//!
//! ```
//! use reqwest_resilience::Resilience;
//!
//! # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
//! // The client built with the redirect policy the stack watches (`build(client)` takes
//! // one you built; see `client_redirects`).
//! let client = Resilience::new().build_from(reqwest::Client::builder())?;
//! // use `client` exactly like a reqwest::Client: client.get(url).send().await
//! # drop(client); Ok(()) }
//! ```
//!
//! # The files, by idea
//!
//! Each file imports only the ones above it in this list:
//!
//! | file | what it holds |
//! |---|---|
//! | `observer.rs` | the outermost stage: the span per logical request and the [`on_attempt`](Resilience::on_attempt) hook |
//! | `compose.rs` | the stages nested into one middleware (`Composed`) and a resumed body's range requests through them |
//! | `builder.rs` | [`Resilience`]: the choices for each part, one setter each, and the defaults |
//! | `assemble.rs` | those choices built into stages and nested (the retry from its settings, the breaker, the limits) |
//! | `install.rs` | the assembled stack in a `reqwest_middleware::ClientBuilder` ([`StackBuilder`]), as one middleware ([`ResilienceMiddleware`]) or as a list |
//! | `astral.rs` | the same installation for the astral fork's builder ([`astral`], feature `astral`) |

mod assemble;
#[cfg(feature = "astral")]
#[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
pub mod astral;
mod builder;
pub(crate) mod compose;
mod install;
mod observer;

pub use builder::{
    BreakerChoice, ConcurrencyLimitChoice, RateLimitChoice, Resilience, RetryChoice,
};
pub use install::{ResilienceMiddleware, StackBuilder};

pub use crate::error::stack::{StackError, StackPart};
