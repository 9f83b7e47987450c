//! [`Misconfiguration`]: a stack assembled so that it cannot work as intended, found on
//! the first request because a `reqwest_middleware::ClientBuilder` cannot be inspected
//! when it is built.
//!
//! | misconfiguration | how it shows |
//! |---|---|
//! | the stack installed twice, or one of this crate's middlewares added with `.with()` after [`TransportEvidence`](crate::TransportEvidence) | [`ResilienceError::Misconfigured`](crate::ResilienceError::Misconfigured) for every request, before anything is sent ([`Misconfiguration::InsideTransportStep`]) |
//! | a [`RetryMiddleware`](crate::RetryMiddleware) inside another (for the same request) | [`ResilienceError::Misconfigured`](crate::ResilienceError::Misconfigured) for every request, before anything is sent ([`Misconfiguration::NestedRetry`]) |
//! | a retry middleware with no [`TransportEvidence`](crate::TransportEvidence) under it | it still works (failures are `Unknown`, so only idempotent requests are retried); reported **once per process** on standard error, as a `tracing` warning with feature `tracing`, and in [`Misconfiguration::reported`] |
//! | a non-idempotent request that failed before it was sent, through a transport step that cannot see the client's redirects (`ClientRedirects::Unobserved`, the default) | it is not retried (a redirect may have followed a processed request); reported once per process like the row above ([`Misconfiguration::RedirectsUnobserved`]), naming the one call that fixes it, [`redirect::recorded_client`](crate::redirect::recorded_client) |
//! | a `ClientRedirects` declaration a response proves false (`Recorded` and a response from another URL with no recorded hop; `Off` and a response from another URL) | that transport step (the client it serves) treats the client as `Unobserved` for the rest of its life, so no error is taken for a first hop's; reported once per process like the row above ([`Misconfiguration::RedirectsNotRecorded`], [`Misconfiguration::RedirectsNotOff`]) |
//!
//! The first two are errors because they multiply attempts (a stack inside a stack made a
//! refused connection take 16 attempts and minutes of backoff while the history said 4) or
//! make the evidence describe a middleware rather than the wire. Their rejection is
//! `Transmission::NotSent` with
//! [`FailureKind::Misconfigured`](crate::FailureKind::Misconfigured), which no retry
//! repeats.
//!
//! A middleware of another crate added with `.with()` after the stack cannot be seen from
//! inside it; [`Resilience`](crate::Resilience)'s builders return a
//! [`StackBuilder`](crate::stack::StackBuilder), which has no `.with()`, so that mistake
//! does not compile.
//!
//! Detection costs no allocation: while the retry middleware and the transport step poll
//! the rest of a request, they record that request's extensions in what the thread is
//! polling, the record that also tells a request's owner (`src/stage/scope.rs`), and a
//! middleware of this crate starting there for the *same* extensions knows where it is.
//! Another request made meanwhile (a token fetch through another resilient client) has
//! extensions of its own and is not mistaken for a nested one. The stack that
//! [`Resilience`](crate::Resilience) installs checks once, at its top, for all its stages
//! (as the middleware the outermost of them is: `RetryMiddleware` when it has one), as its
//! future is made; a middleware of this crate makes the future of a middleware inside it
//! as it will poll it, so that check sees what a poll would.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

/// A stack that cannot work as intended; see the [module docs](self).
///
/// ```
/// use reqwest_resilience::misconfig::Misconfiguration;
///
/// // At startup, after a first request: nothing was found.
/// assert!(Misconfiguration::reported().is_empty());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Misconfiguration {
    /// A middleware of this crate runs inside the transport step of the same request: the
    /// stack was installed twice, or the middleware was added with `.with()` after it.
    InsideTransportStep {
        /// The middleware that found itself there.
        middleware: &'static str,
    },
    /// A retry middleware runs inside another retry middleware for the same request.
    NestedRetry,
    /// A retry middleware found no `RequestEvidence` after an attempt: no
    /// `TransportEvidence` is installed innermost. Never reported for the stack
    /// [`Resilience`](crate::Resilience) installs, which always has one: an attempt that a
    /// [`per_attempt`](crate::Resilience::per_attempt) middleware answered itself (a cache)
    /// leaves no evidence there.
    NoTransportEvidence,
    /// The transport step was told the client records its redirects
    /// (`ClientRedirects::Recorded`), and a response came from another URL with no hop
    /// recorded: the client's redirect policy is not wrapped in `redirect::recorded`.
    /// That transport step treats the client as `Unobserved` from then on (errors prove
    /// nothing about earlier hops, so a `POST` is not retried after one).
    RedirectsNotRecorded,
    /// The transport step was told the client follows no redirects
    /// (`ClientRedirects::Off`), and a response came from another URL. That transport
    /// step treats the client as `Unobserved` from then on.
    RedirectsNotOff,
    /// A non-idempotent request (`POST`, `PATCH`, no `Idempotency-Key`) failed before it
    /// was sent (a refused connect, a DNS failure) through a transport step that cannot
    /// tell its first hop from a later redirect hop (`ClientRedirects::Unobserved`, the
    /// default): a redirect may have followed a processed request, so it is not retried
    /// (unless marked `Idempotent(true)`). The one call that fixes it: build the client with
    /// `redirect::recorded_client(builder, policy)` (or let `Resilience::build_from`
    /// build it).
    RedirectsUnobserved,
}

impl fmt::Display for Misconfiguration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Misconfiguration::InsideTransportStep { middleware } => write!(
                f,
                "{middleware} runs inside TransportEvidence: the stack is installed twice, or \
                 it was added with .with() after the stack"
            ),
            Misconfiguration::NestedRetry => f.write_str(
                "a RetryMiddleware runs inside another one: every retry would multiply the \
                 attempts; install one retry middleware",
            ),
            Misconfiguration::NoTransportEvidence => f.write_str(
                "no RequestEvidence after an attempt: install TransportEvidence as the \
                 innermost middleware; failures are treated as Unknown (only idempotent \
                 requests are retried)",
            ),
            Misconfiguration::RedirectsNotRecorded => f.write_str(
                "ClientRedirects::Recorded was declared, but a response came from another URL \
                 with no redirect recorded: wrap the client's policy in redirect::recorded (or \
                 use Resilience::build_from); that client is treated as Unobserved from now on",
            ),
            Misconfiguration::RedirectsUnobserved => f.write_str(
                "a POST or PATCH whose connection failed before it was sent is not retried: \
                 the client's redirects are not observed (ClientRedirects::Unobserved), so a \
                 redirect hop after a processed request cannot be ruled out; build the \
                 client with reqwest_resilience::redirect::recorded_client(builder, policy) \
                 (Resilience::build_from does) to retry them",
            ),
            Misconfiguration::RedirectsNotOff => f.write_str(
                "ClientRedirects::Off was declared, but a response came from another URL: the \
                 client follows redirects; that client is treated as Unobserved from now on",
            ),
        }
    }
}

impl Misconfiguration {
    /// The misconfigurations reported once per process so far (the ones that are not
    /// errors), in the order found.
    pub fn reported() -> Vec<Misconfiguration> {
        crate::sync::lock(&REPORTED).clone()
    }

    fn bit(self) -> u8 {
        match self {
            Misconfiguration::InsideTransportStep { .. } => 1,
            Misconfiguration::NestedRetry => 2,
            Misconfiguration::NoTransportEvidence => 4,
            Misconfiguration::RedirectsNotRecorded => 8,
            Misconfiguration::RedirectsNotOff => 16,
            Misconfiguration::RedirectsUnobserved => 32,
        }
    }
}

static REPORTED_BITS: AtomicU8 = AtomicU8::new(0);
static REPORTED: Mutex<Vec<Misconfiguration>> = Mutex::new(Vec::new());

/// Reports `m` on standard error (and `tracing`) the first time this process finds it.
pub(crate) fn report_once(m: Misconfiguration) {
    // The common case after the first report is one atomic load.
    if REPORTED_BITS.load(Ordering::Relaxed) & m.bit() != 0
        || REPORTED_BITS.fetch_or(m.bit(), Ordering::Relaxed) & m.bit() != 0
    {
        return;
    }
    crate::sync::lock(&REPORTED).push(m);
    #[cfg(feature = "tracing")]
    tracing::warn!(target: "reqwest_resilience::misconfig", "{m}");
    eprintln!("reqwest-resilience: {m} (reported once per process)");
}
