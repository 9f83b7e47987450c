//! Guides: how the crate behaves, one subject each, with examples that compile.
//!
//! Each guide is reference for one subject; the API of each part is in its module.
//!
//! | guide | what it answers |
//! |---|---|
//! | [`retries`] | when a request is retried: the decision table, idempotency, connections a server closes, your own rules |
//! | [`defaults`] | every default and where it comes from |
//! | [`stack`] | the order of the stages and why, your own middleware, build-time errors, the mistakes the stack catches |
//! | [`redirects`] | what can be proven about the redirects reqwest follows, and the precise client |
//! | [`bodies`] | a body that breaks after the response head: classified, run again, resumed; streamed uploads retried |
//! | [`hedging`] | tail latency: attempt timeouts and hedged requests |
//! | [`limits`] | overload: per-origin concurrency limits and slow-call trips |
//! | [`coalescing`] | concurrent identical GETs sharing one request |
//! | [`rate_limits`] | the servers' rate-limit fields: pauses and a client-side rate limit |
//! | [`proxies`] | a pool of proxies: each retry through the next one, whose failure is whose |
//! | [`streams`] | server-sent events and long-lived streams: reconnects, `Last-Event-ID`, a `POST` stream never sent twice, dead streams |
//! | [`observability`] | the attempt history, errors, `tracing`, hooks |
//! | [`metrics`] | the instruments of feature `metrics` |
//! | [`migration`] | coming from reqwest-retry |
//! | [`astral`] | uv, rattler, pixi: the astral fork of reqwest-middleware |
//! | [`comparison`] | compared with tower-resilience, Polly and resilience4j |

#[doc = include_str!("retries.md")]
pub mod retries {}

#[doc = include_str!("defaults.md")]
pub mod defaults {}

#[doc = include_str!("stack.md")]
pub mod stack {}

#[doc = include_str!("redirects.md")]
pub mod redirects {}

#[doc = include_str!("bodies.md")]
pub mod bodies {}

#[doc = include_str!("hedging.md")]
pub mod hedging {}

#[doc = include_str!("limits.md")]
pub mod limits {}

#[doc = include_str!("coalescing.md")]
pub mod coalescing {}

#[doc = include_str!("rate_limits.md")]
pub mod rate_limits {}

#[doc = include_str!("proxies.md")]
pub mod proxies {}

#[doc = include_str!("streams.md")]
pub mod streams {}

#[doc = include_str!("observability.md")]
pub mod observability {}

#[doc = include_str!("metrics.md")]
pub mod metrics {}

#[doc = include_str!("migration.md")]
pub mod migration {}

#[doc = include_str!("astral.md")]
pub mod astral {}

#[doc = include_str!("comparison.md")]
pub mod comparison {}
