//! Evidence-based retries, `Retry-After`, per-origin circuit breakers and single-flight
//! bearer tokens for [`reqwest`], as [`reqwest_middleware`] middlewares.
//!
//! An existing `reqwest` codebase becomes resilient without rewriting its call sites: wrap
//! the `reqwest::Client` once and keep calling `get(..).send()` on the
//! `ClientWithMiddleware`. The innermost middleware records how far each attempt got on
//! the wire ([`Transmission`]), and a retry is decided from that, not from the error type:
//! a refused connection is retried even for a POST, while a POST whose connection dropped
//! after it went out, or that a redirect shows was answered, is never sent twice.
//!
//! # Quick start
//!
//! ```no_run
//! use reqwest_resilience::Resilience;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Retry → CircuitBreaker → TransportEvidence with the defaults, over a client built
//! // with the redirect policy the stack watches: the whole decision table applies. Handed
//! // the builder's function, the stack can build the client again with fresh
//! // connections when the network changes (`network`).
//! let client = Resilience::new().build_from(reqwest::Client::builder)?;
//! let body = client.get("https://api.example.com/v1/items").send().await?.text().await?;
//! # let _ = body; Ok(()) }
//! ```
//!
//! Build the client with [`Resilience::build_from`] (your settings in a closure:
//! `build_from(|| reqwest::Client::builder().user_agent("my-app/1.0"))`): every wait on
//! the network is then bounded, a host's addresses raced, a changed network noticed
//! ([`network`]). A client built elsewhere and handed to
//! [`Resilience::build`] hides its redirects from the stack, so a POST whose connection
//! was refused is tried once ([`guide::redirects`]).
//!
//! # Guides
//!
//! | guide | |
//! |---|---|
//! | [`guide::retries`] | when a request is retried: the decision table, idempotency, your own rules |
//! | [`guide::defaults`] | every default and where it comes from |
//! | [`guide::stack`] | the stages, their order and why; your own middleware; the mistakes the stack catches |
//! | [`guide::redirects`] | what can be proven about redirects; the precise client |
//! | [`guide::bodies`] | bodies that break: classified, run again ([`retry::Operation`]), resumed ([`resume`]); streamed uploads retried ([`upload`]) |
//! | [`guide::hedging`] | attempt timeouts and hedged requests |
//! | [`guide::limits`] | per-origin concurrency limits, slow-call trips |
//! | [`guide::coalescing`] | concurrent identical GETs sharing one request |
//! | [`guide::proxies`] | a pool of proxies: each retry through the next one, each proxy its own origin |
//! | [`guide::rate_limits`] | the servers' rate-limit fields: pauses and client-side rate limits |
//! | [`guide::observability`] | the attempt history, errors, `tracing`, hooks |
//! | [`guide::metrics`] | the instruments of feature `metrics` |
//! | [`guide::migration`] | coming from reqwest-retry |
//! | [`guide::astral`] | uv, rattler, pixi: the astral fork |
//! | [`guide::comparison`] | compared with tower-resilience, Polly, resilience4j |
//!
//! `cargo run --example tour` walks through every capability against a local server.
//!
//! # Modules
//!
//! | module | what it holds |
//! |---|---|
//! | [`stack`] | [`Resilience`]: the whole stack in one builder |
//! | [`retry`] | [`RetryMiddleware`], the decision table ([`retry::DefaultStrategy`]), ready strategies, [`RetryBudget`], per-request overrides, attempt timeout, [hedging](retry::Hedging), [operations](retry::Operation) retried whole or [step by step](retry::Steps) |
//! | [`breaker`] | [`CircuitBreakerMiddleware`], [`BreakerRegistry`], [`BreakerConfig`], trip policies, server pauses |
//! | [`limit`] | per-origin concurrency limits, fixed or adaptive (off by default) |
//! | [`rate`] | per-origin rate limits, set by hand or learned from the servers (off by default) |
//! | [`coalesce`] | concurrent identical GETs share one request (off by default) |
//! | [`resume`] | bodies that resume where they broke (off by default) |
//! | [`upload`] | streamed uploads retried: [`upload::ReplayableBody`] re-opens a file or a stream for each attempt |
//! | [`auth`] | [`BearerAuth`], [`TokenManager`], [`TokenSource`], [`AccessToken`] |
//! | [`evidence`] | [`TransportEvidence`], [`RequestEvidence`], [`Transmission`], [`AttemptHistory`], [what each failure proves](evidence#what-each-failure-proves) |
//! | [`exchange`] | [`SendWithHistory`]: `send()` returning the history and the outcome with the result |
//! | [`redirect`] | the redirect proof: [`redirect::recorded`], [`redirect::ClientRedirects`] |
//! | [`backoff`] | [`Backoff`] and [`Jitter`] |
//! | [`retry_after`] | `Retry-After` parsing |
//! | [`origin`] | [`Origin`]: the `scheme://host:port` key |
//! | [`misconfig`] | a stack that cannot work, found on the first request |
//! | [`metrics`] | the instruments of feature `metrics` |
//! | [`error`] | [`ResilienceError`] and every typed error it carries |
//! | `chaos` | seeded fault injection for your own tests (feature `chaos`) |
//!
//! # Feature flags
//!
//! | feature | what it adds |
//! |---|---|
//! | `http2` (default) | reqwest's `http2`, and the HTTP/2 keep-alive pings of [`Network::http2_keep_alive`](network::Network::http2_keep_alive) |
//! | `tracing` | a span per logical request, events per attempt, retry decision and breaker transition ([`guide::observability`]) |
//! | `metrics` | instruments through the `metrics` facade ([`guide::metrics`]) |
//! | `retry-policies` | `RetryMiddleware::new_with_policy` takes reqwest-retry's `retry_policies::RetryPolicy` (owned or `Arc<dyn RetryPolicy + Send + Sync>`) |
//! | `oauth2` | `auth::OAuth2Source`: OAuth 2.0 client-credentials and refresh-token grants |
//! | `astral` | every middleware and the stack also implement `astral-reqwest-middleware`'s `Middleware` ([`guide::astral`]) |
//! | `chaos` | `chaos::Chaos`: seeded fault injection on loopback sockets of its own (turns on reqwest's `http2`, tokio's `net` and `io-util`) |
//!
//! Only `http2` is on by default. reqwest is used without its default features: choose your
//! TLS backend in your own `reqwest` dependency. MSRV: Rust 1.88 (edition 2024).
//!
//! # Layers
//!
//! A module imports only the modules below it (`.ci/tools/module-graph`: no loop between
//! modules or between the files of one; `.ci/tools/long-fns 80`: no function over 80
//! lines). The stages meet only in the layers below them and in the stack above them.
//!
//! ```text
//! 7  stack                       Resilience; the composed stack
//! 6  resume                      resumable bodies: range requests through the stages
//! 5  retry breaker limit rate auth evidence coalesce chaos
//!                                the stages
//! 4  stage metrics backoff classify upload
//!                                the stage vocabulary · instruments · delays · the error classifier ·
//!                                upload bodies opened per attempt
//! 3  error exchange              ResilienceError and the errors it carries · send_with_history
//! 2  record redirect tls_alert   the per-request state and its clearing · the redirect proof ·
//!                                certificate alerts in an error's text
//! 1  chain origin token retry_after ratelimit_fields misconfig sync guide
//!                                origins, tokens, parsers, reports; the guides (docs only)
//! ```

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
pub mod guide;
pub mod limit;
pub mod metrics;
pub mod misconfig;
pub mod network;
pub mod origin;
mod origin_map;
mod protocol_nacks;
pub mod proxy;
pub mod rate;
// Public only to the fuzz target (cargo-fuzz builds with `--cfg fuzzing`).
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod ratelimit_fields;
#[cfg(not(fuzzing))]
mod ratelimit_fields;
pub(crate) mod record;
pub mod redirect;
mod response_body;
pub mod resume;
pub mod retry;
pub mod retry_after;
pub mod stack;
pub(crate) mod stage;
pub mod stream;
mod sync;
pub(crate) mod tls_alert;
pub(crate) mod token;
// The integration tests' helper, for the unit tests' scoped subscribers too.
#[cfg(all(test, feature = "tracing"))]
#[path = "../tests/support/tracing_scope.rs"]
mod tracing_scope;
pub mod upload;

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
