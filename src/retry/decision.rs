//! The retry decision table ([`DefaultStrategy`]) behind a trait users can replace
//! ([`RetryStrategy`]), and the typed reasons recorded after each attempt.
//!
//! The table answers only "is another attempt safe and useful?" from the evidence, the
//! failure kind and the request's idempotency. Retry count, `Retry-After`, budget and
//! deadline are the middleware's mechanism and apply on top of any strategy.
//!
//! So does the product's promise: whatever a strategy concludes, a request that may have
//! been processed is sent again only when that is harmless (the middleware turns such a
//! retry into a stop, for every strategy: `unsafe_retry` below).

use std::error::Error as StdError;
use std::io;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method, StatusCode};

use crate::record::{FailureKind, Redirects, RequestEvidence, Transmission};
pub use crate::record::{RetryReason, StopReason};

/// What a [`RetryStrategy`] concluded about one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Another attempt is safe and may help, after the middleware's delay (the backoff, or
    /// a `Retry-After`).
    Retry(RetryReason),
    /// Another attempt after this delay instead of the backoff (a wait a response header
    /// asked for, e.g. GitHub's `x-ratelimit-reset`). Capped like `Retry-After`
    /// ([`retry_after_cap`](super::RetryMiddlewareBuilder::retry_after_cap): clamped to the
    /// cap, or a stop with [`StopReason::RetryAfterTooLong`] under
    /// [`RetryAfterPolicy::GiveUp`](super::RetryAfterPolicy::GiveUp)); never shorter than
    /// a wait the stack itself knows of (an open breaker's "retry in", the token
    /// manager's next fetch). The retry count, the budget and the deadline apply as to
    /// any retry.
    RetryAfter(RetryReason, Duration),
    /// No further attempt.
    Stop(StopReason),
}

/// The head of the response an attempt got: its status and headers.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ResponseHead<'a> {
    /// The response status.
    pub status: StatusCode,
    /// The response headers.
    pub headers: &'a HeaderMap,
}

impl<'a> ResponseHead<'a> {
    /// A response head (to describe a case to a strategy in a test).
    pub fn new(status: StatusCode, headers: &'a HeaderMap) -> Self {
        ResponseHead { status, headers }
    }
}

/// What a strategy sees about the attempt that just ended.
///
/// Besides the evidence: the request's method and URL, the error the attempt ended with
/// (its whole chain, searched by [`has_io_kind`](Self::has_io_kind),
/// [`h2_reason`](Self::h2_reason), [`find_error`](Self::find_error), …, which see through
/// `io::Error::get_ref` and `reqwest_middleware::Error`: see [`crate::chain`]), or the
/// response head.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AttemptContext<'a> {
    /// What the transport step observed.
    pub evidence: &'a RequestEvidence,
    /// The request method.
    pub method: &'a Method,
    /// The request's URL (the first hop's, before any redirect); `None` only in a context
    /// made by [`AttemptContext::new`] without [`with_url`](Self::with_url).
    pub url: Option<&'a url::Url>,
    /// The error the attempt ended with, if it failed.
    pub error: Option<&'a (dyn StdError + 'static)>,
    /// The response head, if the attempt got a response.
    pub response: Option<ResponseHead<'a>>,
    /// Whether the request is idempotent (method, `Idempotency-Key`, or the per-request
    /// [`Idempotent`](super::Idempotent) marker).
    pub idempotent: bool,
    /// Attempts made so far, counting this one (1 after the first).
    pub attempt: u32,
    /// Retries already taken on a [`RetryReason::NotProcessed`] verdict.
    pub not_processed_retries: u32,
    /// How many [`RetryReason::NotProcessed`] retries one request may take
    /// ([`RetryMiddlewareBuilder::max_not_processed_retries`](super::RetryMiddlewareBuilder::max_not_processed_retries),
    /// default 5).
    pub max_not_processed_retries: u32,
}

/// The default cap on [`RetryReason::NotProcessed`] retries per request: 5.
///
/// Outside `max_retries`: a server rotating its connections (nginx's `keepalive_requests`)
/// refuses a stream now and then without being unwell, and a request may meet more than
/// one rotation in a burst. The cap (with the retry budget) keeps a server that refuses
/// everything from making a loop.
pub(crate) const DEFAULT_MAX_NOT_PROCESSED_RETRIES: u32 = 5;

impl<'a> AttemptContext<'a> {
    /// The context of a first attempt of `method`, idempotent by its method alone; set the
    /// public fields to describe another case (e.g. to test a custom [`RetryStrategy`]).
    ///
    /// ```
    /// use http::{Method, StatusCode};
    /// use reqwest_resilience::{RequestEvidence, Transmission};
    /// use reqwest_resilience::retry::{AttemptContext, DefaultStrategy, RetryStrategy, StopReason, Verdict};
    ///
    /// let evidence = RequestEvidence::new(Transmission::ResponseReceived(StatusCode::BAD_GATEWAY), None, 1);
    /// let mut ctx = AttemptContext::new(&evidence, &Method::POST);
    /// assert_eq!(
    ///     DefaultStrategy.decide(&ctx),
    ///     Verdict::Stop(StopReason::StatusNotSafe(StatusCode::BAD_GATEWAY))
    /// );
    /// ctx.idempotent = true; // e.g. an Idempotency-Key header
    /// assert!(matches!(DefaultStrategy.decide(&ctx), Verdict::Retry(_)));
    /// ```
    pub fn new(evidence: &'a RequestEvidence, method: &'a Method) -> Self {
        AttemptContext {
            evidence,
            method,
            idempotent: is_idempotent(method, &HeaderMap::new()),
            attempt: 1,
            not_processed_retries: 0,
            max_not_processed_retries: DEFAULT_MAX_NOT_PROCESSED_RETRIES,
            url: None,
            error: None,
            response: None,
        }
    }

    /// The context with the request's URL.
    pub fn with_url(self, url: &'a url::Url) -> Self {
        AttemptContext {
            url: Some(url),
            ..self
        }
    }

    /// The context of an attempt that failed with `error`.
    pub fn with_error(self, error: &'a (dyn StdError + 'static)) -> Self {
        AttemptContext {
            error: Some(error),
            ..self
        }
    }

    /// The context of an attempt answered with `response`.
    pub fn with_response(self, response: ResponseHead<'a>) -> Self {
        AttemptContext {
            response: Some(response),
            ..self
        }
    }

    /// The response status: the response head's, else the evidence's.
    pub fn status(&self) -> Option<StatusCode> {
        self.response
            .map(|r| r.status)
            .or_else(|| self.evidence.status())
    }

    /// A header of the response head, if there is one.
    pub fn header(&self, name: impl http::header::AsHeaderName) -> Option<&'a HeaderValue> {
        self.response.and_then(|r| r.headers.get(name))
    }

    /// The first error of type `T` in the error's chain ([`chain::find`](crate::chain::find)).
    pub fn find_error<T: StdError + 'static>(&self) -> Option<&'a T> {
        self.error.and_then(crate::chain::find::<T>)
    }

    /// The `reqwest::Error` in the error's chain, wherever it is.
    pub fn reqwest_error(&self) -> Option<&'a reqwest::Error> {
        self.error.and_then(crate::chain::reqwest_error)
    }

    /// The kinds of every `io::Error` in the error's chain, outermost first (empty for a
    /// response).
    pub fn io_kinds(&self) -> impl Iterator<Item = io::ErrorKind> + 'a {
        self.error.into_iter().flat_map(crate::chain::io_kinds)
    }

    /// Whether an `io::Error` of one of `kinds` is anywhere in the error's chain.
    pub fn has_io_kind(&self, kinds: &[io::ErrorKind]) -> bool {
        self.error
            .is_some_and(|e| crate::chain::has_io_kind(e, kinds))
    }

    /// The reason of the first HTTP/2 error in the chain that has one (`RST_STREAM`,
    /// `GOAWAY`).
    pub fn h2_reason(&self) -> Option<h2::Reason> {
        self.error.and_then(crate::chain::h2_reason)
    }

    /// Whether an HTTP/2 error (of the `h2` crate, any reason or none) is in the chain.
    pub fn has_h2_error(&self) -> bool {
        self.find_error::<h2::Error>().is_some()
    }

    /// The display text of every error of the chain, outermost first, without repeats
    /// (many wrappers print their inner error's text as their own); empty for a response.
    pub fn error_messages(&self) -> Vec<String> {
        self.error.map(crate::chain::messages).unwrap_or_default()
    }
}

/// The stop a retry verdict becomes when the request may have been processed and is not
/// idempotent: whatever a [`RetryStrategy`] concluded, the middleware sends such a request
/// again only when the evidence shows that is harmless. `None`: the retry may be taken.
///
/// A non-idempotent request may be sent again when it was proven not sent
/// ([`Transmission::NotSent`]), when the server proved it did not process it
/// ([`RequestEvidence::not_processed`]), or when its response says to come back (a `429`,
/// or any status with `Retry-After`: the server directs the retry), and never after a
/// followed redirect, or where one cannot be ruled out. This is the safety half of
/// [`DefaultStrategy`]'s table, which never concludes otherwise.
pub(crate) fn unsafe_retry(ctx: &AttemptContext<'_>) -> Option<StopReason> {
    if ctx.idempotent {
        return None;
    }
    let ev = ctx.evidence;
    match ev.redirects {
        Redirects::Followed { .. } => return Some(StopReason::RedirectFollowed),
        Redirects::Unknown => return Some(StopReason::MayHaveBeenProcessed),
        Redirects::None => {}
    }
    match ev.transmission {
        Transmission::NotSent => None,
        Transmission::ResponseReceived(s)
            if s == StatusCode::TOO_MANY_REQUESTS || ev.retry_after.is_some() =>
        {
            None
        }
        Transmission::ResponseReceived(s) => Some(StopReason::StatusNotSafe(s)),
        _ if ev.not_processed.is_some() => None,
        _ => Some(StopReason::MayHaveBeenProcessed),
    }
}

/// Decides whether an attempt may be followed by another. Implement it to replace the
/// built-in table ([`DefaultStrategy`]); delegate to it for the cases you do not change.
///
/// ```
/// use reqwest_resilience::retry::{AttemptContext, DefaultStrategy, RetryStrategy, StopReason, Verdict};
///
/// /// Like the default, but never retries a 500.
/// struct No500;
///
/// impl RetryStrategy for No500 {
///     fn decide(&self, ctx: &AttemptContext<'_>) -> Verdict {
///         match ctx.evidence.status() {
///             Some(s) if s.as_u16() == 500 => Verdict::Stop(StopReason::FinalResponse(s)),
///             _ => DefaultStrategy.decide(ctx),
///         }
///     }
/// }
/// ```
pub trait RetryStrategy: Send + Sync + 'static {
    /// The verdict for the attempt described by `ctx`.
    fn decide(&self, ctx: &AttemptContext<'_>) -> Verdict;
}

/// A shared strategy decides as the one it shares.
impl<S: RetryStrategy + ?Sized> RetryStrategy for std::sync::Arc<S> {
    fn decide(&self, ctx: &AttemptContext<'_>) -> Verdict {
        (**self).decide(ctx)
    }
}

/// The decision table: [`guide::retries`](crate::guide::retries) gives it whole, row by
/// row. In short, a `NotSent` attempt is retried whatever its method (not one over the
/// concurrency limit, [`FailureKind::ConcurrencyLimited`], or over the origin's rate,
/// [`FailureKind::RateLimited`]: their wait is their own; nor one whose every address
/// timed out, [`FailureKind::ConnectTimeout`]: a retry would wait as long again,
/// [`StopReason::ConnectTimedOut`]; unless the connect was to a proxy of a pool, which
/// sends the retry through its next proxy); a request the server proved it
/// did not process ([`RequestEvidence::not_processed`]) is sent again at once; anything
/// that may have been processed (`SentNoResponse`, `Unknown`, a body cut after the head,
/// [`FailureKind::BodyInterrupted`], anything after a followed redirect,
/// [`Redirects::Followed`]) only when the request is idempotent; 408, 500, 502, 503, 504
/// when idempotent or with `Retry-After`; 429 always; certificate, builder, redirect and
/// decode errors never, nor an upload body that broke on this side
/// ([`FailureKind::UploadBody`]: the caller's stream or file).
///
/// A request an open breaker turned away ([`FailureKind::BreakerOpen`]: the stack's
/// breaker, or a proxy pool whose every proxy's breaker is open) gets
/// [`RetryReason::BreakerRejected`] here, but the middleware fails it at once
/// ([`StopReason::BreakerRejected`]), for every strategy: a breaker is there to fail fast.
/// Only a middleware that
/// [waits for open breakers](super::RetryMiddlewareBuilder::wait_for_open_breakers) retries
/// it, after the breaker's "retry in" when that is within its bound and ends before the
/// request's deadline. A server-directed pause ([`FailureKind::Paused`]) is retried after
/// its "retry in".
///
/// A request that got no bearer token was not sent, so it is retried like any `NotSent`
/// attempt, whatever its method and whatever [`TokenErrorKind`](crate::auth::TokenErrorKind)
/// the manager reported: a fetch error or timeout is the identity provider's outage, and
/// even a token no header can carry may be replaced by the source's next fetch. The wait
/// is the backoff, but never shorter than the evidence's `retry_after` (when the token
/// manager will fetch again): a retry sooner would get the same error back at once. When
/// that fetch lies beyond the middleware's `retry_after_cap`, the middleware stops at once
/// ([`StopReason::RetryAfterTooLong`]) with the token error: a retry at the cap would get
/// it too.
///
/// A request the server proved it did not process (HTTP/2 `REFUSED_STREAM`: RFC 9113 §8.7)
/// is as safe to send again as one never sent, whatever its method:
/// [`RetryReason::NotProcessed`], taken by the middleware at once (no backoff), outside
/// `max_retries`, up to [`AttemptContext::max_not_processed_retries`] per request and within
/// the retry budget. Past that cap an idempotent request falls back to the row below (a
/// counted [`RetryReason::Transient`] retry), a non-idempotent one stops
/// ([`StopReason::NotProcessedRetryUsed`]).
///
/// An attempt ended by the server's `GOAWAY` ([`FailureKind::GoAway`], a connection
/// rotation) proves nothing through hyper (see
/// [the `evidence` module](crate::evidence#goaway-rule-5)): an idempotent request is sent again
/// at once ([`RetryReason::GoAway`], under the same cap, free of the retry budget), a
/// non-idempotent one stops ([`StopReason::MayHaveBeenProcessed`]).
///
/// An idempotent attempt cut because the machine's network changed under it
/// ([`FailureKind::NetworkChanged`]) is sent again the same way, at once, on a connection
/// opened after the change ([`RetryReason::NetworkChanged`], under the same cap, free of
/// the retry budget): the server is not to blame.
///
/// A request over its origin's concurrency limit was not sent either, but is not
/// retried: the limit says the origin already has as many of our attempts as it should
/// serve at once, so a retry after a backoff would return to a full origin (or, with a
/// short backoff, spin on it). Waiting for a permit is the limiter's own bounded queue,
/// within the same deadline ([`LimiterConfig::queue`](crate::limit::LimiterConfig::queue)).
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultStrategy;

impl RetryStrategy for DefaultStrategy {
    fn decide(&self, ctx: &AttemptContext<'_>) -> Verdict {
        let ev = ctx.evidence;
        if let Some(kind) = ev.failure.filter(|k| is_permanent(*k)) {
            return Verdict::Stop(StopReason::Permanent(kind));
        }
        // The connect timed out: a retry would wait as long again, whatever hop it was
        // (the request's connect budget is one connect timeout). Through a proxy of a
        // pool, that proxy's: the retry goes through the next one (the retry middleware
        // stops once every proxy, or this one again, timed out).
        if ev.failure == Some(FailureKind::ConnectTimeout) && !ev.charged_to_proxy {
            return Verdict::Stop(StopReason::ConnectTimedOut);
        }
        // A later hop's answer does not make the first hop's request safe to repeat, and
        // where a redirect cannot be ruled out, neither does a failure's evidence.
        match ev.redirects {
            _ if ctx.idempotent => {}
            Redirects::Followed { .. } => return Verdict::Stop(StopReason::RedirectFollowed),
            Redirects::Unknown => return Verdict::Stop(StopReason::MayHaveBeenProcessed),
            _ => {}
        }
        if ev.failure == Some(FailureKind::BodyInterrupted) {
            return decide_body_interrupted(ctx.idempotent);
        }
        if let Transmission::ResponseReceived(status) = ev.transmission {
            if ev.charged_to_proxy {
                // A `407`, or a status the proxy pool rotates on: the next attempt goes
                // through another proxy, so it is retried as a `503` would be (a `429` as
                // itself).
                let like = match status {
                    StatusCode::TOO_MANY_REQUESTS => status,
                    _ => StatusCode::SERVICE_UNAVAILABLE,
                };
                return decide_status(like, ctx.idempotent, ev.retry_after.is_some())
                    .with_status(status);
            }
            return decide_status(status, ctx.idempotent, ev.retry_after.is_some());
        }
        match ev.transmission {
            Transmission::NotSent => decide_not_sent(ev),
            _ if ev.not_processed.is_some()
                && ctx.not_processed_retries < ctx.max_not_processed_retries =>
            {
                Verdict::Retry(RetryReason::NotProcessed)
            }
            // A connection rotation: harmless to repeat for an idempotent request, at once.
            _ if ev.failure == Some(FailureKind::GoAway)
                && ctx.idempotent
                && ctx.not_processed_retries < ctx.max_not_processed_retries =>
            {
                Verdict::Retry(RetryReason::GoAway)
            }
            // Cut because the network changed under it: at once, on a fresh connection.
            _ if ev.failure == Some(FailureKind::NetworkChanged)
                && ctx.idempotent
                && ctx.not_processed_retries < ctx.max_not_processed_retries =>
            {
                Verdict::Retry(RetryReason::NetworkChanged)
            }
            _ if ctx.idempotent => Verdict::Retry(RetryReason::Transient),
            _ if ev.not_processed.is_some() => Verdict::Stop(StopReason::NotProcessedRetryUsed),
            _ => Verdict::Stop(StopReason::MayHaveBeenProcessed),
        }
    }
}

/// An attempt that sent nothing: safe to send again for any method, unless a wait of its
/// own already ran.
fn decide_not_sent(ev: &RequestEvidence) -> Verdict {
    match ev.failure {
        // An open breaker's is stopped by the middleware unless it waits for open
        // breakers (see the type's docs); a pause's is waited out.
        Some(FailureKind::BreakerOpen | FailureKind::Paused) => {
            Verdict::Retry(RetryReason::BreakerRejected)
        }
        // Nothing was sent: safe for any method (the middleware waits for the token
        // manager's next fetch, see the type's docs).
        Some(FailureKind::TokenUnavailable) => Verdict::Retry(RetryReason::NotSent),
        // Rejected locally by a full origin: the limiter's queue already waited
        // (within the deadline) if one is configured; see the type's docs.
        Some(FailureKind::ConcurrencyLimited) => Verdict::Stop(StopReason::ConcurrencyLimited),
        // Turned away by the origin's rate: its wait for a slot already ran
        // (within the deadline); a retry would only spend the quota again.
        Some(FailureKind::RateLimited) => Verdict::Stop(StopReason::RateLimited),
        _ => Verdict::Retry(RetryReason::NotSent),
    }
}

/// A body cut after its response head: the server answered, so only a request that is
/// harmless to repeat runs again.
fn decide_body_interrupted(idempotent: bool) -> Verdict {
    if idempotent {
        Verdict::Retry(RetryReason::BodyInterrupted)
    } else {
        Verdict::Stop(StopReason::MayHaveBeenProcessed)
    }
}

fn decide_status(status: StatusCode, idempotent: bool, has_retry_after: bool) -> Verdict {
    match status.as_u16() {
        // Throttled: the server refused the work, so it did not act on it.
        429 => Verdict::Retry(RetryReason::Status(status)),
        408 | 500 | 502 | 503 | 504 if idempotent || has_retry_after => {
            Verdict::Retry(RetryReason::Status(status))
        }
        408 | 500 | 502 | 503 | 504 => Verdict::Stop(StopReason::StatusNotSafe(status)),
        _ => Verdict::Stop(StopReason::FinalResponse(status)),
    }
}

impl Verdict {
    /// The same verdict about `status` (for a status decided as another would be).
    fn with_status(self, status: StatusCode) -> Verdict {
        match self {
            Verdict::Retry(RetryReason::Status(_)) => Verdict::Retry(RetryReason::Status(status)),
            Verdict::Stop(StopReason::StatusNotSafe(_)) => {
                Verdict::Stop(StopReason::StatusNotSafe(status))
            }
            other => other,
        }
    }
}

/// Failure kinds no retry can fix.
fn is_permanent(kind: FailureKind) -> bool {
    matches!(
        kind,
        FailureKind::Certificate
            | FailureKind::Builder
            | FailureKind::UploadBody
            | FailureKind::Redirect
            | FailureKind::Decode
            | FailureKind::ConnectPermanent
            | FailureKind::Misconfigured
    )
}

/// Whether a request is idempotent by its method (RFC 9110 §9.2.2) or carries an
/// `Idempotency-Key` header. The per-request [`Idempotent`](super::Idempotent) marker
/// overrides this in the middleware.
pub(crate) fn is_idempotent(method: &Method, headers: &HeaderMap) -> bool {
    crate::record::idempotent_request(method, headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::NotProcessedProof;

    fn evidence(t: Transmission, kind: Option<FailureKind>) -> RequestEvidence {
        let mut e = RequestEvidence::new(t, None, 1);
        e.failure = kind;
        e
    }

    fn decide(ev: &RequestEvidence, method: Method, not_processed_retries: u32) -> Verdict {
        decide_capped(ev, method, not_processed_retries, 1)
    }

    fn decide_capped(
        ev: &RequestEvidence,
        method: Method,
        not_processed_retries: u32,
        max_not_processed_retries: u32,
    ) -> Verdict {
        let idempotent = is_idempotent(&method, &HeaderMap::new());
        DefaultStrategy.decide(&AttemptContext {
            evidence: ev,
            method: &method,
            idempotent,
            attempt: 1,
            not_processed_retries,
            max_not_processed_retries,
            url: None,
            error: None,
            response: None,
        })
    }

    fn status(code: u16) -> Transmission {
        Transmission::ResponseReceived(StatusCode::from_u16(code).unwrap())
    }

    #[test]
    fn idempotency_follows_rfc_9110_and_the_idempotency_key_header() {
        let none = HeaderMap::new();
        for m in [
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::TRACE,
            Method::PUT,
            Method::DELETE,
        ] {
            assert!(is_idempotent(&m, &none), "{m}");
        }
        assert!(!is_idempotent(&Method::POST, &none));
        assert!(!is_idempotent(&Method::PATCH, &none));
        let mut keyed = HeaderMap::new();
        keyed.insert("Idempotency-Key", "abc".parse().unwrap());
        assert!(is_idempotent(&Method::POST, &keyed));
    }

    #[test]
    fn row_not_sent_without_a_bearer_token_retries_any_method_even_a_post() {
        let ev = evidence(Transmission::NotSent, Some(FailureKind::TokenUnavailable));
        for method in [Method::POST, Method::PATCH, Method::GET, Method::PUT] {
            assert_eq!(
                decide(&ev, method.clone(), 0),
                Verdict::Retry(RetryReason::NotSent),
                "{method}"
            );
        }
    }

    #[test]
    fn row_not_sent_transient_retries_any_method() {
        for kind in [FailureKind::Connect, FailureKind::Dns, FailureKind::Tls] {
            let ev = evidence(Transmission::NotSent, Some(kind));
            assert_eq!(
                decide(&ev, Method::POST, 0),
                Verdict::Retry(RetryReason::NotSent)
            );
            assert_eq!(
                decide(&ev, Method::GET, 0),
                Verdict::Retry(RetryReason::NotSent)
            );
        }
        let ev = evidence(Transmission::NotSent, Some(FailureKind::BreakerOpen));
        assert_eq!(
            decide(&ev, Method::POST, 0),
            Verdict::Retry(RetryReason::BreakerRejected)
        );
    }

    #[test]
    fn row_not_sent_every_address_timed_out_stops_for_any_method_but_refused_is_retried() {
        let ev = evidence(Transmission::NotSent, Some(FailureKind::ConnectTimeout));
        for method in [Method::GET, Method::POST] {
            assert_eq!(
                decide(&ev, method.clone(), 0),
                Verdict::Stop(StopReason::ConnectTimedOut),
                "{method}"
            );
        }
        let ev = evidence(Transmission::NotSent, Some(FailureKind::Connect));
        assert_eq!(
            decide(&ev, Method::POST, 0),
            Verdict::Retry(RetryReason::NotSent)
        );
        // A proxy's connect (a pool's): the retry goes through the next proxy.
        let mut ev = evidence(Transmission::NotSent, Some(FailureKind::ConnectTimeout));
        ev.charged_to_proxy = true;
        assert_eq!(
            decide(&ev, Method::POST, 0),
            Verdict::Retry(RetryReason::NotSent)
        );
    }

    #[test]
    fn row_not_sent_over_the_concurrency_limit_stops_at_once_for_any_method() {
        let ev = evidence(Transmission::NotSent, Some(FailureKind::ConcurrencyLimited));
        for method in [Method::GET, Method::PUT, Method::POST] {
            assert_eq!(
                decide(&ev, method.clone(), 0),
                Verdict::Stop(StopReason::ConcurrencyLimited),
                "{method}"
            );
        }
    }

    #[test]
    fn row_not_processed_proof_retries_non_idempotent_once() {
        let mut ev = evidence(Transmission::SentNoResponse, Some(FailureKind::Protocol));
        ev.not_processed = Some(NotProcessedProof::RefusedStream);
        assert_eq!(
            decide(&ev, Method::POST, 0),
            Verdict::Retry(RetryReason::NotProcessed)
        );
        assert_eq!(
            decide(&ev, Method::POST, 1),
            Verdict::Stop(StopReason::NotProcessedRetryUsed)
        );
        assert_eq!(
            decide(&ev, Method::GET, 1),
            Verdict::Retry(RetryReason::Transient)
        );
    }

    #[test]
    fn row_not_processed_proof_retries_any_method_up_to_its_own_cap() {
        let cap = DEFAULT_MAX_NOT_PROCESSED_RETRIES;
        for proof in [NotProcessedProof::RefusedStream, NotProcessedProof::GoAway] {
            for t in [Transmission::SentNoResponse, Transmission::Unknown] {
                let mut ev = evidence(t, Some(FailureKind::Protocol));
                ev.not_processed = Some(proof);
                for method in [Method::POST, Method::PATCH, Method::GET, Method::PUT] {
                    for used in 0..cap {
                        assert_eq!(
                            decide_capped(&ev, method.clone(), used, cap),
                            Verdict::Retry(RetryReason::NotProcessed),
                            "{method} {proof:?} {used}"
                        );
                    }
                }
                // Past the cap: an idempotent request is an ordinary (counted) retry.
                assert_eq!(
                    decide_capped(&ev, Method::POST, cap, cap),
                    Verdict::Stop(StopReason::NotProcessedRetryUsed)
                );
                assert_eq!(
                    decide_capped(&ev, Method::GET, cap, cap),
                    Verdict::Retry(RetryReason::Transient)
                );
                // A cap of 0 turns the row off.
                assert_eq!(
                    decide_capped(&ev, Method::POST, 0, 0),
                    Verdict::Stop(StopReason::NotProcessedRetryUsed)
                );
            }
        }
        // `AttemptContext::new` carries the default cap.
        let mut ev = evidence(Transmission::SentNoResponse, Some(FailureKind::Protocol));
        ev.not_processed = Some(NotProcessedProof::GoAway);
        let mut ctx = AttemptContext::new(&ev, &Method::POST);
        assert_eq!(ctx.max_not_processed_retries, 5);
        ctx.not_processed_retries = 4;
        assert_eq!(
            DefaultStrategy.decide(&ctx),
            Verdict::Retry(RetryReason::NotProcessed)
        );
    }

    #[test]
    fn row_go_away_retries_idempotent_requests_at_once_and_never_a_post() {
        let cap = DEFAULT_MAX_NOT_PROCESSED_RETRIES;
        let ev = evidence(Transmission::Unknown, Some(FailureKind::GoAway));
        for method in [Method::GET, Method::HEAD, Method::PUT, Method::DELETE] {
            for used in 0..cap {
                assert_eq!(
                    decide_capped(&ev, method.clone(), used, cap),
                    Verdict::Retry(RetryReason::GoAway),
                    "{method} {used}"
                );
            }
            // Past the cap: an ordinary (counted, backed-off) retry.
            assert_eq!(
                decide_capped(&ev, method.clone(), cap, cap),
                Verdict::Retry(RetryReason::Transient)
            );
        }
        // The stream may have been processed: a POST or a PATCH is not sent again, whatever
        // the cap says.
        for method in [Method::POST, Method::PATCH] {
            for used in [0, cap] {
                assert_eq!(
                    decide_capped(&ev, method.clone(), used, cap),
                    Verdict::Stop(StopReason::MayHaveBeenProcessed),
                    "{method} {used}"
                );
            }
        }
    }

    #[test]
    fn row_sent_no_response_retries_only_idempotent() {
        for t in [Transmission::SentNoResponse, Transmission::Unknown] {
            for kind in [
                FailureKind::Reset,
                FailureKind::Timeout,
                FailureKind::Closed,
                FailureKind::Other,
            ] {
                let ev = evidence(t, Some(kind));
                assert_eq!(
                    decide(&ev, Method::PUT, 0),
                    Verdict::Retry(RetryReason::Transient)
                );
                assert_eq!(
                    decide(&ev, Method::POST, 0),
                    Verdict::Stop(StopReason::MayHaveBeenProcessed)
                );
                assert_eq!(
                    decide(&ev, Method::PATCH, 0),
                    Verdict::Stop(StopReason::MayHaveBeenProcessed)
                );
            }
        }
    }

    #[test]
    fn row_retryable_statuses_need_idempotency_or_retry_after() {
        for code in [408, 500, 502, 503, 504] {
            let s = StatusCode::from_u16(code).unwrap();
            let mut ev = evidence(status(code), None);
            assert_eq!(
                decide(&ev, Method::GET, 0),
                Verdict::Retry(RetryReason::Status(s))
            );
            assert_eq!(
                decide(&ev, Method::POST, 0),
                Verdict::Stop(StopReason::StatusNotSafe(s))
            );
            ev.retry_after = Some(std::time::Duration::from_secs(1));
            assert_eq!(
                decide(&ev, Method::POST, 0),
                Verdict::Retry(RetryReason::Status(s))
            );
        }
    }

    #[test]
    fn row_429_retries_any_method() {
        let ev = evidence(status(429), None);
        let s = StatusCode::TOO_MANY_REQUESTS;
        assert_eq!(
            decide(&ev, Method::POST, 0),
            Verdict::Retry(RetryReason::Status(s))
        );
        assert_eq!(
            decide(&ev, Method::GET, 0),
            Verdict::Retry(RetryReason::Status(s))
        );
    }

    #[test]
    fn row_other_statuses_are_final() {
        for code in [200, 201, 204, 301, 304, 400, 401, 403, 404, 409, 501, 505] {
            let s = StatusCode::from_u16(code).unwrap();
            let mut ev = evidence(status(code), None);
            ev.retry_after = Some(std::time::Duration::from_secs(1));
            assert_eq!(
                decide(&ev, Method::GET, 0),
                Verdict::Stop(StopReason::FinalResponse(s))
            );
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn transmission() -> impl Strategy<Value = Transmission> {
            prop_oneof![
                Just(Transmission::NotSent),
                Just(Transmission::SentNoResponse),
                Just(Transmission::Unknown),
                (100u16..600).prop_map(|c| {
                    Transmission::ResponseReceived(StatusCode::from_u16(c).unwrap())
                }),
            ]
        }

        fn kind() -> impl Strategy<Value = Option<FailureKind>> {
            proptest::option::of(proptest::sample::select(vec![
                FailureKind::Connect,
                FailureKind::Dns,
                FailureKind::Tls,
                FailureKind::Certificate,
                FailureKind::ConnectPermanent,
                FailureKind::Timeout,
                FailureKind::Reset,
                FailureKind::Closed,
                FailureKind::Protocol,
                FailureKind::Body,
                FailureKind::Redirect,
                FailureKind::Builder,
                FailureKind::Decode,
                FailureKind::BreakerOpen,
                FailureKind::Paused,
                FailureKind::TokenUnavailable,
                FailureKind::ConcurrencyLimited,
                FailureKind::Other,
                FailureKind::Misconfigured,
                FailureKind::Cancelled,
                FailureKind::UploadBody,
            ]))
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(10_000))]

            /// The safety half of the table, for any evidence: a request that may have
            /// been processed is retried only if idempotent, proven unprocessed (once),
            /// throttled, or told when by `Retry-After`; permanent kinds never.
            #[test]
            fn no_unsafe_retry_for_any_evidence(
                t in transmission(),
                k in kind(),
                proof in any::<bool>(),
                retry_after in any::<bool>(),
                idempotent in any::<bool>(),
                proof_used in 0u32..3,
                redirected in 0u8..3,
            ) {
                let mut ev = evidence(t, k);
                ev.not_processed = proof.then_some(NotProcessedProof::RefusedStream);
                ev.retry_after = retry_after.then_some(std::time::Duration::from_secs(1));
                ev.redirects = match redirected {
                    0 => Redirects::None,
                    1 => Redirects::Followed { hops: Some(1) },
                    _ => Redirects::Unknown,
                };
                let method = if idempotent { Method::PUT } else { Method::POST };
                let verdict = decide(&ev, method.clone(), proof_used);
                // The middleware's guard never has to overrule the default table.
                if matches!(verdict, Verdict::Retry(_)) {
                    prop_assert_eq!(unsafe_retry(&AttemptContext::new(&ev, &method)), None);
                }
                if let Verdict::Retry(reason) = verdict {
                    // After a redirect, or where one cannot be ruled out, only an
                    // idempotent request is sent again.
                    prop_assert!(idempotent || !ev.redirects.may_have_redirected());
                    if ev.status().is_none() {
                        prop_assert!(!k.is_some_and(is_permanent));
                    }
                    match t {
                        Transmission::NotSent => {}
                        Transmission::ResponseReceived(s) => {
                            let code = s.as_u16();
                            prop_assert!([408, 429, 500, 502, 503, 504].contains(&code));
                            prop_assert!(idempotent || code == 429 || retry_after);
                        }
                        _ => prop_assert!(
                            idempotent || (proof && proof_used == 0),
                            "{:?}", reason
                        ),
                    }
                }
            }

            /// With any cap: a non-idempotent request that may have been processed is sent
            /// again only on a proof, while the cap has room.
            #[test]
            fn no_unsafe_retry_past_the_not_processed_cap(
                t in prop_oneof![Just(Transmission::SentNoResponse), Just(Transmission::Unknown)],
                k in kind(),
                proof in any::<bool>(),
                idempotent in any::<bool>(),
                used in 0u32..8,
                cap in 0u32..8,
            ) {
                let mut ev = evidence(t, k);
                ev.not_processed = proof.then_some(NotProcessedProof::GoAway);
                let method = if idempotent { Method::PUT } else { Method::POST };
                let verdict = decide_capped(&ev, method, used, cap);
                if verdict == Verdict::Retry(RetryReason::NotProcessed) {
                    prop_assert!(proof && used < cap);
                } else if let Verdict::Retry(_) = verdict {
                    prop_assert!(idempotent);
                }
            }
        }
    }

    #[test]
    fn the_guard_stops_a_retry_of_a_request_that_may_have_been_processed() {
        let post = |ev: &RequestEvidence| unsafe_retry(&AttemptContext::new(ev, &Method::POST));
        let put = |ev: &RequestEvidence| unsafe_retry(&AttemptContext::new(ev, &Method::PUT));
        let sent = evidence(Transmission::SentNoResponse, Some(FailureKind::Reset));
        assert_eq!(post(&sent), Some(StopReason::MayHaveBeenProcessed));
        assert_eq!(put(&sent), None);
        let mut proven = sent.clone();
        proven.not_processed = Some(NotProcessedProof::RefusedStream);
        assert_eq!(post(&proven), None);
        assert_eq!(
            post(&evidence(Transmission::NotSent, Some(FailureKind::Connect))),
            None
        );
        let forbidden = StatusCode::FORBIDDEN;
        let mut answered = evidence(Transmission::ResponseReceived(forbidden), None);
        assert_eq!(post(&answered), Some(StopReason::StatusNotSafe(forbidden)));
        // The server directs the retry: cargo-binstall's `Retry-After` on a 403.
        answered.retry_after = Some(std::time::Duration::from_secs(3));
        assert_eq!(post(&answered), None);
        assert_eq!(post(&evidence(status(429), None)), None);
        let mut redirected = evidence(Transmission::NotSent, Some(FailureKind::Connect));
        redirected.redirects = Redirects::Followed { hops: Some(1) };
        assert_eq!(post(&redirected), Some(StopReason::RedirectFollowed));
        assert_eq!(put(&redirected), None);
        redirected.redirects = Redirects::Unknown;
        assert_eq!(post(&redirected), Some(StopReason::MayHaveBeenProcessed));
    }

    #[test]
    fn row_permanent_failures_never_retry_even_when_not_sent() {
        for kind in [
            FailureKind::Certificate,
            FailureKind::Builder,
            FailureKind::Redirect,
            FailureKind::Decode,
            FailureKind::ConnectPermanent,
        ] {
            for t in [
                Transmission::NotSent,
                Transmission::SentNoResponse,
                Transmission::Unknown,
            ] {
                let ev = evidence(t, Some(kind));
                assert_eq!(
                    decide(&ev, Method::GET, 0),
                    Verdict::Stop(StopReason::Permanent(kind))
                );
            }
        }
    }

    #[test]
    fn a_status_charged_to_a_proxy_is_retried_as_a_503() {
        let mut ev = evidence(Transmission::ResponseReceived(StatusCode::FORBIDDEN), None);
        assert_eq!(
            decide(&ev, Method::GET, 0),
            Verdict::Stop(StopReason::FinalResponse(StatusCode::FORBIDDEN))
        );
        ev.charged_to_proxy = true;
        assert_eq!(
            decide(&ev, Method::GET, 0),
            Verdict::Retry(RetryReason::Status(StatusCode::FORBIDDEN))
        );
        assert_eq!(
            decide(&ev, Method::POST, 0),
            Verdict::Stop(StopReason::StatusNotSafe(StatusCode::FORBIDDEN))
        );
        let mut throttled = evidence(
            Transmission::ResponseReceived(StatusCode::TOO_MANY_REQUESTS),
            None,
        );
        throttled.charged_to_proxy = true;
        assert_eq!(
            decide(&throttled, Method::POST, 0),
            Verdict::Retry(RetryReason::Status(StatusCode::TOO_MANY_REQUESTS))
        );
    }
}
