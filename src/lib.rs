//! Evidence-based retries, `Retry-After`, per-origin circuit breakers and single-flight
//! bearer tokens for [`reqwest`], as [`reqwest_middleware`] middlewares.
//!
//! An existing `reqwest` codebase becomes resilient without rewriting its call sites: wrap
//! the `reqwest::Client` once and keep calling `get(..).send()` on the
//! `ClientWithMiddleware`. What sets this crate apart is *evidence*: the innermost
//! middleware records how far each attempt got on the wire ([`Transmission`]), and a retry
//! is decided from that, not from the error type, so a refused connection is retried even
//! for a POST (once the client's redirects are seen: see [`redirect`]) while a POST whose
//! connection dropped after it went out, or that a redirect shows was answered, is never
//! sent twice.
//!
//! # Quick start
//!
//! ```no_run
//! use reqwest_resilience::Resilience;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Retry → CircuitBreaker → TransportEvidence, with the defaults below, over a client
//! // built with the redirect policy the stack watches (the whole decision table).
//! let client = Resilience::new().build_from(reqwest::Client::builder())?;
//! let body = client.get("https://api.example.com/v1/items").send().await?.text().await?;
//! # let _ = body; Ok(()) }
//! ```
//!
//! `cargo run --example tour` walks through every capability against a local server.
//!
//! # The stack, outer to inner, and why
//!
//! ```text
//! RetryMiddleware → CircuitBreakerMiddleware → [RateLimit] → [ConcurrencyLimit] → BearerAuth → TransportEvidence → reqwest::Client
//! (+ attempt timeout, hedging)                  (off by default, each)
//! ```
//!
//! - [`RetryMiddleware`] is outermost: every attempt passes through the breaker, gets a
//!   fresh token and is observed anew (Polly's standard HTTP pipeline puts retry outside
//!   the breaker too). A rejection by an open breaker is retried only after the breaker's
//!   own "retry in", never in a tight loop.
//! - [`CircuitBreakerMiddleware`] sits outside [`BearerAuth`], so it sees the outcome
//!   *after* a `401` was healed by a token refresh and one replay: a routine token expiry
//!   is not an endpoint failure.
//! - [`TransportEvidence`] is innermost: only there is the raw `reqwest::Error` seen before
//!   anything interprets it.
//!
//! [`Resilience`] installs them in this order; each also works alone (see each module).
//! An optional per-origin concurrency limit ([`limit`]) goes between the breaker and
//! [`BearerAuth`] ([`Resilience::concurrency_limit`]); optional coalesced GETs
//! ([`coalesce`]) go outermost, outside the retry ([`Resilience::coalesce_gets`]).
//! [`BearerAuth`] ([`Resilience::concurrency_limit`]), and an optional per-origin rate
//! limit ([`rate`], set by hand or learned from the servers' rate-limit fields) between
//! the breaker and the concurrency limit ([`Resilience::rate_limit`]).
//! Your own middleware goes around the stack ([`Resilience::install`]) or per attempt
//! ([`Resilience::per_attempt`], [`Resilience::per_attempt_arc`]); see [`stack`]. For a
//! client builder made later, [`Resilience::into_middleware`] is the whole stack as one
//! middleware. Coming from reqwest-retry: [`Resilience::like_reqwest_retry`].
//!
//! # When is a request retried?
//!
//! | evidence | idempotent request | non-idempotent request |
//! |---|---|---|
//! | `NotSent` with a transient kind (connect refused, DNS, breaker/pause rejection) | retry | retry |
//! | `NotSent` because no bearer token could be had (`TokenUnavailable`) | retry, not before the token manager's next fetch (at once with the token error when it lies beyond `retry_after_cap`) | same |
//! | `NotSent` because the origin's concurrency limit was reached (`ConcurrencyLimited`) | no: the limiter's queue is the wait | no |
//! | `NotSent` because the origin's rate was reached (`RateLimited`) | no: the rate limit's wait for a slot is the wait | no |
//! | sent, and the server proved it did not process it (HTTP/2 `REFUSED_STREAM`) | retry at once, outside `max_retries`, up to `max_not_processed_retries` (5) | same |
//! | ended by the server's HTTP/2 `GOAWAY` (a connection rotation; through hyper no proof either way: `Unknown`, `GoAway`) | retry at once, outside `max_retries`, under the same cap | **never** |
//! | `SentNoResponse` / `Unknown` (reset, timeout, closed) | retry | **never** |
//! | response 408, 500, 502, 503, 504 | retry | only with `Retry-After` |
//! | response 429 | retry | retry |
//! | any other status | no | no |
//! | anything after reqwest followed a redirect | as the last hop's row says | **never** |
//! | the response body broke after its head (`BodyInterrupted`) | run the operation again ([`retry::Operation`]) or resume the body ([`Resilience::resume_bodies`]) | **never** (it was answered) |
//! | certificate errors and TLS alerts about a certificate (`unknown_ca`, `certificate_expired`, …), builder, redirect, decode errors (a complete body that does not decode) | no | no |
//!
//! **Bodies.** The middlewares return at the response head; a failure while the body is
//! read comes later. [`evidence::classify`] classifies it from any error chain
//! (`FailureKind::BodyInterrupted`, distinct from `Decode`), [`retry::Operation`] runs a
//! whole operation (send, read, parse) again under the retry policy with one attempt
//! count, and [`resume`] continues a broken download with `Range` where the server
//! provably serves the same bytes.
//!
//! **Redirects.** reqwest follows them inside one attempt. Once one was followed, the
//! request the stack sent was received and answered (`3xx`): it is never `NotSent`, a
//! non-idempotent request is never sent again (by the retry or by `BearerAuth` after a
//! `401`), and each origin's breaker answers for its own hop. By default an *error* proves
//! nothing about earlier hops (reqwest 0.13 reports a later hop's error with the first
//! URL), so it is never `NotSent` either. [`Resilience::build_from`] builds the client
//! with [`redirect::recorded`] and declares it, so every hop is seen; for a client built
//! elsewhere, wrap its policy and declare it ([`Resilience::client_redirects`]). A
//! declaration a response proves false turns that client `Unobserved` and is reported
//! ([`misconfig`]). See [`redirect`].
//!
//! Idempotent: GET, HEAD, OPTIONS, TRACE, PUT, DELETE (RFC 9110 §9.2.2), a request with an
//! `Idempotency-Key` header, or one marked with [`retry::Idempotent`]. The table is
//! [`retry::DefaultStrategy`]; replace it through [`retry::RetryStrategy`], whose
//! [`retry::AttemptContext`] has the error chain, the URL and the response head, and whose
//! verdict may carry a delay ([`retry::Verdict::RetryAfter`]); uv's rules are
//! [`retry::strategies::uv_transient`]. No strategy can send again a request that may have
//! been processed unless that is harmless ([`retry::unsafe_retry`]). Retries are told
//! before each wait ([`retry::RetryMiddlewareBuilder::before_sleep`], and a `WARN` event
//! with feature `tracing`); [`SendWithHistory::send_with_history`] returns the attempt
//! count and stop reason beside reqwest's own error.
//!
//! # Defaults and where they come from
//!
//! | setting | default | origin |
//! |---|---|---|
//! | retries | 3 | Polly v8's `MaxRetryAttempts` default; reqwest-retry has no default (its README example uses 3) |
//! | backoff | 1 s × 2 per retry, capped at 30 s | exponential backoff, capped |
//! | jitter | proportional ±10 % ([`Jitter`]; full and decorrelated available) | AWS Architecture Blog, "Exponential Backoff and Jitter" |
//! | `Retry-After` | honoured for every retryable status, capped at 60 s (clamped) | RFC 9110 §10.2.3; the cap keeps a server from parking a client |
//! | retry budget | 20 % of requests, at least 10 retries/s, over 10 s ([`RetryBudget`]) | Finagle's `RetryBudget`, gRPC retry throttling |
//! | idempotency | by method or `Idempotency-Key` | RFC 9110 §9.2.2 |
//! | breaker trip | 5 consecutive failures (a failure-ratio policy is built in) | the seed ADR of this crate's design; for comparison, Polly v8's standard HTTP handler trips at a 10 % failure ratio over 30 s with at least 100 calls, resilience4j at 50 % over the last 100 calls |
//! | breaker open | 30 s, then 1 half-open probe | the seed ADR; Polly v8 breaks for 5 s, resilience4j for 60 s with 10 half-open calls |
//! | breaker scope | one per origin `scheme://host:port`, at most 10 000 origins | RFC 6454 origin |
//! | breaker failures | 5xx, 401, 429, transport failures; a lost connection (`Closed`/`Reset`, no response) once per event; other 4xx, a refused stream, a `GOAWAY`, the caller's own deadline or dropped future neutral | a caller's bug must not trip a shared breaker, nor a healthy server's graceful reload |
//! | server pause | a `429`/`503` with `Retry-After` pauses the origin for every caller of the registry, at most `max_pause` (60 s); a request waits at most `max_pause` in all per attempt, however often servers extend the pause, then fails `Paused` (`NotSent`) | the cap keeps a server from parking a client |
//! | token refresh | 5 min before expiry (at most half the lifetime), one fetch at a time | |
//! | concurrency limit | off; when on: adaptive ([`limit::Gradient`]: initial 20, min 4, max 1 000), no wait queue | Netflix concurrency-limits |
//! | coalesced GETs | off ([`coalesce`]); when on: bodies with `Content-Length` shared up to 1 MiB, never `private`, `no-store` or `Set-Cookie` answers | every request header keys them, and each client or stack is its own identity: a response is shared only by requests identical in all the server sees |
//! | slow-call trips | off ([`breaker::SlowCalls`]); when on: rate 100 %, at least 100 calls, over 30 s | resilience4j's `slowCallRateThreshold` and `minimumNumberOfCalls`; Polly's 30 s `SamplingDuration` |
//! | rate-limit pause | rate-limit fields saying nothing remains (`X-RateLimit-Remaining: 0` + `-Reset`, `RateLimit: "default";r=0;t=30`, …) pause the origin like `Retry-After`, at most `max_pause` (60 s); with a learning rate limit in the stack, that stage applies them instead | GitHub's REST API docs; draft-ietf-httpapi-ratelimit-headers; `Retry-After`'s cap |
//! | rate limit | off; when on: learned from the servers' fields ([`ratelimit_fields`]), 5 % below their quota, a server's word holding an origin at most 60 s (`max_server_wait`), a probe first per origin, a wait of at most 30 s for a slot, at most 10 000 origins ([`rate::RateLimitConfig`]) | the servers' quotas; GCRA (ITU-T I.371, as `governor`) |
//! | resumed bodies | off ([`Resilience::resume_bodies`], or [`resume::ResumeBody`] per request); when on: a `GET` answered `200` with byte ranges, a strong validator, a length and no encoding | RFC 9110 §13.1.5 (`If-Range`), §14 (ranges) |
//!
//! # Observability
//!
//! - Every attempt's [`RequestEvidence`] and the decision taken after it
//!   ([`AttemptDecision`]) are left in the caller's `http::Extensions` as an
//!   [`AttemptHistory`] (use `ClientWithMiddleware::execute_with_extensions`).
//! - A `send()` caller reads the history from the response:
//!   [`AttemptHistory::of_response`].
//! - Feature `tracing`: a span per logical request with OpenTelemetry's HTTP client
//!   fields (`http.request.method`, `url.full` with credentials, the fragment and by
//!   default every query value redacted, exactly as
//!   [`Resilience::span_url_query`] says, `url.scheme`, `server.address`, `server.port`,
//!   `http.response.status_code`, `http.request.resend_count`, `error.type`), an event per
//!   attempt, per retry decision and per breaker transition. The span is of kind
//!   `internal`, the logical call: the `client` spans per wire request come from
//!   reqwest-tracing installed per attempt (see [`stack`]).
//! - Feature `metrics`: the instruments listed in [`metrics`].
//! - Before each retry's wait: [`Resilience::before_sleep`] (attempt, evidence, error or
//!   status, reason, delay); with `tracing`, a `WARN` event with the error's text and its
//!   `Caused by:` chain ([`Resilience::retry_event_level`] changes the level).
//! - Without `tracing`: [`Resilience::on_attempt`] and
//!   [`Resilience::on_breaker_transition`] hooks, e.g. to feed metrics.
//!
//! # Modules
//!
//! | module | what it holds |
//! |---|---|
//! | [`stack`] | [`Resilience`]: the whole stack in one builder |
//! | [`retry`] | [`RetryMiddleware`], the decision table, ready strategies ([`retry::strategies`]), [`RetryBudget`], per-request overrides, attempt timeout, [hedging](retry::Hedging), [operations](retry::Operation) retried whole |
//! | [`resume`] | bodies that resume where they broke ([`Resilience::resume_bodies`], [`resume::ResumeBody`]) |
//! | [`exchange`] | [`SendWithHistory`]: `send()` that keeps the builder's extensions and returns the history and the outcome with the result |
//! | [`backoff`] | [`Backoff`] and [`Jitter`]: the delays between attempts |
//! | [`retry_after`] | `Retry-After` parsing |
//! | [`redirect`] | what can be proven about the redirects reqwest follows: [`redirect::ClientRedirects`], [`redirect::recorded`] |
//! | [`breaker`] | [`CircuitBreakerMiddleware`], [`BreakerRegistry`], [`BreakerConfig`], trip policies |
//! | [`limit`] | [`ConcurrencyLimit`](limit::ConcurrencyLimit): per-origin concurrency limits, fixed or adaptive (off by default) |
//! | [`coalesce`] | [`CoalesceGets`](coalesce::CoalesceGets): concurrent identical GETs share one request (off by default) |
//! | `chaos` | `Chaos` (feature `chaos`): seeded fault injection for your own tests, with the real faults' evidence |
//! | [`rate`] | [`RateLimit`](rate::RateLimit): per-origin rate limits, set by hand and learned from the servers (off by default) |
//! | [`ratelimit_fields`] | parsing the servers' rate-limit fields (IETF `RateLimit` / `RateLimit-Policy` in every draft's form, GitHub-style `X-RateLimit-*`) |
//! | [`auth`] | [`BearerAuth`], [`TokenManager`], [`TokenSource`], [`AccessToken`] |
//! | [`evidence`] | [`TransportEvidence`], [`RequestEvidence`], [`Transmission`], [`AttemptHistory`] |
//! | [`origin`] | [`Origin`]: the `scheme://host:port` key |
//! | [`misconfig`] | [`Misconfiguration`](misconfig::Misconfiguration): a stack that cannot work, found on the first request |
//! | [`metrics`] | the instruments of feature `metrics` |
//! | [`error`] | [`ResilienceError`] and every typed error it carries |
//!
//! # Architecture: the layers
//!
//! A module imports only the modules below it; CI checks it (`module-graph`: no loop
//! between modules or between the files of one) and that no function is over 80 lines.
//! The stages are the middlewares' logic, and none imports another: they meet only in the
//! layers below them (the per-request state, the stage vocabulary) and in the stack
//! above them. The per-request state they leave in a request's `http::Extensions` lives
//! in one crate-private module, `record`, with the one function that clears it, and is
//! re-exported where users read it ([`evidence`], [`retry`], [`breaker`]).
//!
//! ```text
//! 7  stack                       Resilience; the composed stack (one middleware, the stages nested)
//! 6  resume                      resumable bodies: range requests through the stages
//! 5  retry breaker limit rate auth evidence coalesce chaos
//!                                the stages: the retry loop (+ attempt timeout, hedging,
//!                                operations), the per-origin breakers and pauses, the
//!                                concurrency limit, the rate limit, bearer tokens (TokenFirst,
//!                                BearerAuth), the transport step, coalesced GETs; the chaos
//!                                layer (feature)
//! 4  stage metrics backoff classify
//!                                the stage vocabulary (a stage, the rest of the stack it runs,
//!                                what the stages outside hand inward, request ownership, the
//!                                placement checks) · instruments · delays · the error classifier
//! 3  error exchange              ResilienceError and every typed error it carries ·
//!                                send_with_history
//! 2  record redirect tls_alert   the per-request state (evidence, history, decisions, what a
//!                                stage hands inward) and its clearing · the redirect proof ·
//!                                certificate alerts in an error's text
//! 1  chain origin token retry_after ratelimit_fields misconfig sync
//!                                origins, tokens and their source, parsers, reports
//! ```
//!
//! # Feature flags
//!
//! | feature | what it adds |
//! |---|---|
//! | `tracing` | spans and events (optional dependency `tracing`) |
//! | `retry-policies` | `RetryMiddleware::new_with_policy` takes a `retry_policies::RetryPolicy`, for a one-line migration from reqwest-retry |
//! | `oauth2` | `auth::OAuth2Source`: OAuth 2.0 client-credentials and refresh-token grants |
//! | `astral` | every middleware and the composed stack also implement `astral-reqwest-middleware`'s `Middleware` (the fork uv, rattler and pixi use): [`Resilience::install_astral`], `build_astral`, `build_from_astral`, `into_middlewares_astral`, `per_attempt_astral`, [`ResilienceError::find_astral`]; additive (both traits in one build) |
//! | `metrics` | per-attempt `http.client.request.duration` and counters for retries, stops, breakers, pauses, budget and tokens through the `metrics` facade (see [`metrics`]) |
//! | `chaos` | `chaos::Chaos`: seeded fault injection on loopback sockets of its own (turns on reqwest's `http2`, tokio's `net` and `io-util`) |
//!
//! No feature is on by default. reqwest is used without default features: choose your TLS
//! backend in your own `reqwest` dependency.
//!
//! # MSRV
//!
//! Rust 1.88 (`rust-version` in `Cargo.toml`; edition 2024).

#![deny(missing_docs)]
// docs.rs builds with `--cfg docsrs` on nightly: each feature-gated item gets its badge.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod auth;
pub mod backoff;
pub mod breaker;
pub mod chain;
#[cfg(feature = "chaos")]
#[cfg_attr(docsrs, doc(cfg(feature = "chaos")))]
pub mod chaos;
mod classify;
pub mod coalesce;
pub mod error;
pub mod evidence;
pub mod exchange;
pub mod limit;
pub mod metrics;
pub mod misconfig;
pub mod origin;
mod origin_map;
pub mod rate;
pub mod ratelimit_fields;
pub(crate) mod record;
pub mod redirect;
pub mod resume;
pub mod retry;
pub mod retry_after;
pub mod stack;
pub(crate) mod stage;
mod sync;
pub(crate) mod tls_alert;
pub(crate) mod token;

/// The `async_trait` attribute, for implementing [`TokenSource`] (or a
/// `reqwest_middleware::Middleware`) without an `async-trait` dependency of your own.
pub use async_trait::async_trait;
pub use auth::{AccessToken, BearerAuth, TokenManager, TokenSource};
pub use backoff::{Backoff, Jitter};
pub use breaker::{BreakerConfig, BreakerRegistry, BreakerState, CircuitBreakerMiddleware};
pub use error::ResilienceError;
pub use evidence::{
    AttemptDecision, AttemptHistory, AttemptRecord, FailureKind, NotProcessedProof, Redirects,
    RequestEvidence, Transmission, TransportEvidence,
};
pub use exchange::{Exchange, SendWithHistory};
pub use origin::Origin;
pub use retry::{RetryBudget, RetryMiddleware};
pub use stack::{Resilience, ResilienceMiddleware, StackBuilder, StackError};

// README's quick start must compile.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
