//! What the transport step observed about one attempt: [`RequestEvidence`] and its parts.

use std::time::Duration;

use http::StatusCode;

use crate::origin::Origin;

/// How far an attempt got on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transmission {
    /// Proven: no byte of the request can have reached a server (connect refused or
    /// unreachable, DNS failure, TLS handshake failure, rejected locally by an open breaker,
    /// a pause or a concurrency limit, no bearer token to be had, a request that could not
    /// be built).
    NotSent,
    /// The request, or part of it, went out and no response head came back.
    SentNoResponse,
    /// The failure gives no proof either way.
    Unknown,
    /// A response head was received with this status.
    ResponseReceived(StatusCode),
}

impl Transmission {
    /// Whether a server may have acted on the request.
    pub fn may_have_been_processed(self) -> bool {
        !matches!(self, Transmission::NotSent)
    }
}

/// What kind of failure ended an attempt that got no response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// TCP connect failed on every address (refused, unreachable, connect timeout). The kind
    /// does not say *how* each address failed: hyper-util reports only the first address's
    /// error, so "refused" is never claimed for all of them.
    Connect,
    /// The host name could not be resolved.
    Dns,
    /// The TLS handshake failed for a reason other than the peer's certificate.
    Tls,
    /// The peer's certificate was rejected (untrusted, expired, wrong name). Never transient.
    Certificate,
    /// The connector cannot serve this request at all (e.g. `https` with no TLS backend
    /// built in, a proxy misconfiguration). Never transient.
    ConnectPermanent,
    /// A timeout elapsed (reqwest's total or read timeout, or an I/O timeout).
    Timeout,
    /// The connection was reset by the peer (or broke: `BrokenPipe`, `ConnectionAborted`).
    Reset,
    /// The connection was closed before a complete response head arrived. hyper reports a
    /// truncated head and no response at all alike ("incomplete message"), so both are
    /// `Closed`.
    Closed,
    /// The peer broke the protocol: a malformed response head, an HTTP/2 stream or
    /// connection error (including `REFUSED_STREAM`).
    Protocol,
    /// The server's HTTP/2 `GOAWAY` ended the attempt: a connection rotation (nginx's
    /// `keepalive_requests`) or a shutdown. Through hyper it proves nothing about this
    /// request's stream: hyper reports the connection's `GOAWAY` also as the error of a
    /// stream it had already handed to the connection, which the server may have processed
    /// (see [the `evidence` module, "GOAWAY"](crate::evidence#goaway-rule-5)). Always with
    /// [`Transmission::Unknown`].
    GoAway,
    /// Writing the request's body failed (or a body failed where nothing tells whose).
    Body,
    /// The response head arrived and its body broke before its end (a reset, a timeout,
    /// a connection closed short of the `Content-Length`): the server received and
    /// answered the request. With [`Transmission::ResponseReceived`] when the status is
    /// known (see [the `evidence` module](crate::evidence#body-failures)). Distinct from
    /// [`Decode`](Self::Decode), a complete body that could not be decoded.
    BodyInterrupted,
    /// The redirect policy stopped the request (e.g. a redirect loop).
    Redirect,
    /// The request could not be built (bad URL, bad header).
    Builder,
    /// The response body could not be decoded.
    Decode,
    /// An open circuit breaker rejected the request locally.
    BreakerOpen,
    /// A server-directed pause (`Retry-After` shared by the breaker registry) rejected the
    /// request locally.
    Paused,
    /// `BearerAuth` could get no bearer token (the token source failed, timed out, or
    /// gave a token no header can carry), so the request was not sent: always with
    /// [`Transmission::NotSent`]. Says nothing about the origin.
    TokenUnavailable,
    /// The origin's concurrency limit ([`ConcurrencyLimit`](crate::limit::ConcurrencyLimit))
    /// rejected the request locally: always with [`Transmission::NotSent`]. Says nothing
    /// about the origin's health.
    ConcurrencyLimited,
    /// The origin's rate limit ([`RateLimit`](crate::rate::RateLimit)) rejected the
    /// request locally: always with [`Transmission::NotSent`], `retry_after` the time to
    /// the origin's next free slot. Says nothing about the origin's health.
    RateLimited,
    /// A failure this crate does not recognise.
    Other,
    /// The stack is assembled so that it cannot work (installed twice, a middleware of
    /// this crate inside the transport step, a retry inside a retry): the request was
    /// refused before it was sent (always with [`Transmission::NotSent`]) and is never
    /// retried. See [`Misconfiguration`](crate::misconfig::Misconfiguration).
    Misconfigured,
    /// The connect timed out: every address of the host (the connect timeout per address,
    /// [`Network::connect_timeout`](crate::network::Network::connect_timeout)), or, on a
    /// client without the address race, reqwest's `connect_timeout` or the system's
    /// (`ETIMEDOUT`): a host, or a path to it, that drops what is sent to it.
    /// [`Transmission::NotSent`] (`Unknown` on a client whose redirects are not
    /// recorded); not retried, since a retry would wait as long again (the request's
    /// connect budget is spent), but through a proxy of a pool, which retries through
    /// its next proxy.
    ConnectTimeout,
    /// No byte came from the server for the no-progress bound
    /// ([`Network::no_progress`](crate::network::Network::no_progress)): a stuck server or
    /// a dead path. [`Transmission::Unknown`] before the response head (an idempotent
    /// request is retried, another is not), a body failure after it.
    NoProgress,
    /// The machine's network changed (an address or a link came or went, or the process
    /// woke from a suspend) while the attempt waited on a connection opened before it:
    /// the attempt was cut, so that it runs again at once on a new connection. Only an
    /// idempotent request is cut (always with [`Transmission::Unknown`]). Says nothing
    /// about the origin.
    NetworkChanged,
    /// A copy of a hedged request, dropped without an outcome because another copy
    /// answered first (always with [`Transmission::Unknown`]: nothing below the transport
    /// step reports whether its bytes had gone out, so it may have reached the server).
    Cancelled,
    /// The request's own [`ReplayableBody`](crate::upload::ReplayableBody) broke on this
    /// side while it was sent: its closure's stream yielded an error, or its file could
    /// not be read (an [`UploadBodyError`](crate::upload::UploadBodyError) in the error's
    /// chain). The caller's failure, not the server's: neutral for the origin's breaker and
    /// never retried (a retry would open the same broken source again). The transmission
    /// stays what the wire showed (`Unknown`: part of the request may have gone out).
    UploadBody,
}

/// The server's proof that it did not process the request, so even a non-idempotent
/// request may be sent again (once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NotProcessedProof {
    /// HTTP/2 `RST_STREAM` with `REFUSED_STREAM` (RFC 9113 §8.7).
    RefusedStream,
    /// HTTP/2 `GOAWAY` whose last stream id is below this request's stream (RFC 9113 §6.8).
    ///
    /// No longer produced: hyper 1.x fails a stream it had already handed to the connection
    /// with the connection's `GOAWAY` error too (its client task checks the connection
    /// again after opening a stream), so the error does not say whether the stream was
    /// below the last stream id. A `GOAWAY` is [`FailureKind::GoAway`] with
    /// [`Transmission::Unknown`]. Kept so code matching on it still compiles.
    GoAway,
}

/// Whether the redirects reqwest follows inside one attempt were seen (see
/// [`crate::redirect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Redirects {
    /// No redirect was followed, as far as can be told: proven for an outcome under
    /// [`ClientRedirects::Recorded`](crate::redirect::ClientRedirects::Recorded) or
    /// [`ClientRedirects::Off`](crate::redirect::ClientRedirects::Off), and for a
    /// response whose URL is the request's under `Unobserved` (where a chain that ends at
    /// the URL it started from cannot be told apart). Also the value of evidence no
    /// transport step wrote (a local rejection).
    None,
    /// At least one redirect was followed: the request the transport step was handed
    /// was received and answered (`3xx`), and the rest of the evidence describes the
    /// last hop, at [`RequestEvidence::final_origin`].
    Followed {
        /// How many, when the [`recorded`](crate::redirect::recorded) policy counted
        /// them; `None` when only the response's URL showed it.
        hops: Option<u32>,
    },
    /// An error under
    /// [`ClientRedirects::Unobserved`](crate::redirect::ClientRedirects::Unobserved):
    /// reqwest reports a later hop's transport error with the first hop's URL, so
    /// whether an earlier hop was answered cannot be told. The transmission is then never
    /// `NotSent`.
    Unknown,
}

impl Redirects {
    /// Whether a redirect was followed, or cannot be ruled out: the first hop may have
    /// been processed.
    pub fn may_have_redirected(self) -> bool {
        !matches!(self, Redirects::None)
    }
}

/// What the transport step observed about one attempt.
///
/// Read it from the request's extensions inside a middleware (after `next.run`), from a
/// response's extensions, or from the [`AttemptHistory`](super::AttemptHistory) left in the
/// caller's extensions.
///
/// ```no_run
/// use reqwest_resilience::{RequestEvidence, Resilience, Transmission};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Resilience::new().build_from(reqwest::Client::builder())?;
/// let response = client.post("http://127.0.0.1:8080/orders").body("{}").send().await?;
/// if let Some(evidence) = RequestEvidence::of_response(&response) {
///     // The last attempt: its status, its origin, how long it took.
///     assert!(matches!(evidence.transmission, Transmission::ResponseReceived(_)));
///     println!("attempt {} to {:?} took {:?}", evidence.attempt, evidence.origin, evidence.elapsed);
/// }
/// # Ok(()) }
/// ```
///
/// What a retry may rely on:
///
/// ```
/// use reqwest_resilience::{FailureKind, RequestEvidence, Transmission};
///
/// let mut refused = RequestEvidence::new(Transmission::NotSent, None, 1);
/// refused.failure = Some(FailureKind::Connect);
/// assert!(!refused.transmission.may_have_been_processed()); // safe to send again, even a POST
/// let reset = RequestEvidence::new(Transmission::SentNoResponse, None, 1);
/// assert!(reset.transmission.may_have_been_processed()); // only an idempotent request is retried
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestEvidence {
    /// How far the attempt got.
    pub transmission: Transmission,
    /// Why it failed, when no response came back; `None` for a received response.
    pub failure: Option<FailureKind>,
    /// Set when the server proved it did not process the request.
    pub not_processed: Option<NotProcessedProof>,
    /// Where the request went; `None` only for a URL without an origin.
    pub origin: Option<Origin>,
    /// The attempt number within one logical request, starting at 1.
    pub attempt: u32,
    /// How long the attempt took, from handing the request on to the outcome.
    pub elapsed: Duration,
    /// The response's `Retry-After`, parsed and uncapped, if present and valid.
    pub retry_after: Option<Duration>,
    /// Whether reqwest followed redirects during the attempt. When it did, the
    /// transmission, failure, proof and `Retry-After` describe the last hop.
    pub redirects: Redirects,
    /// The origin of the last hop when a redirect was followed to another origin (`None`
    /// otherwise): the one whose breaker the outcome is charged to. See
    /// [`outcome_origin`](Self::outcome_origin).
    pub final_origin: Option<Origin>,
    /// The proxy of a [`ProxyPool`](crate::proxy::ProxyPool) that carried the attempt
    /// (`None`: sent without one). [`origin`](Self::origin) stays the target's.
    pub proxy: Option<Origin>,
    /// Every address the attempt's new connection tried, with each one's outcome (`None`:
    /// no connection was opened for it, a pooled one was reused, or the client is not one
    /// of [`build_from`](crate::Resilience::build_from) or
    /// [`recorded_client`](crate::redirect::recorded_client)).
    pub connect: Option<std::sync::Arc<super::ConnectAttempts>>,
    /// Whether the outcome is the proxy's rather than the target's (a failed connection
    /// to the proxy, a `407`, a status the pool rotates on): the breaker charges
    /// [`proxy`](Self::proxy), and the next attempt takes the next proxy. See
    /// [`guide::proxies`](crate::guide::proxies).
    pub charged_to_proxy: bool,
}

impl RequestEvidence {
    /// Evidence of an attempt that ended with `transmission`, with no failure recorded.
    pub fn new(transmission: Transmission, origin: Option<Origin>, attempt: u32) -> Self {
        RequestEvidence {
            transmission,
            failure: None,
            not_processed: None,
            origin,
            attempt,
            elapsed: Duration::ZERO,
            retry_after: None,
            redirects: Redirects::None,
            final_origin: None,
            proxy: None,
            connect: None,
            charged_to_proxy: false,
        }
    }

    /// The origin that produced the outcome: the proxy's when it is
    /// [charged to the proxy](Self::charged_to_proxy), else the last hop's after a
    /// redirect to another origin, else the request's.
    pub fn outcome_origin(&self) -> Option<&Origin> {
        if self.charged_to_proxy && self.proxy.is_some() {
            return self.proxy.as_ref();
        }
        self.final_origin.as_ref().or(self.origin.as_ref())
    }

    /// Evidence of a request rejected locally (breaker open, paused, no bearer token):
    /// `NotSent`.
    pub fn rejected_locally(kind: FailureKind, origin: Option<Origin>, attempt: u32) -> Self {
        RequestEvidence {
            failure: Some(kind),
            ..RequestEvidence::new(Transmission::NotSent, origin, attempt)
        }
    }

    /// Evidence of an attempt started at `started` and cut at its deadline (by the retry
    /// middleware or the breaker): `Unknown`, since the request may have reached the
    /// server, and `Timeout`.
    pub(crate) fn cut_at_deadline(
        origin: Option<Origin>,
        attempt: u32,
        started: tokio::time::Instant,
    ) -> Self {
        RequestEvidence {
            failure: Some(FailureKind::Timeout),
            elapsed: started.elapsed(),
            ..RequestEvidence::new(Transmission::Unknown, origin, attempt)
        }
    }

    /// Evidence of an attempt answered by `response`, with its `Retry-After` parsed
    /// against the system clock (`SystemTime::now()` is read only when the header is there).
    pub(crate) fn from_response(
        response: &reqwest::Response,
        origin: Option<Origin>,
        attempt: u32,
    ) -> Self {
        RequestEvidence {
            retry_after: response
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| crate::retry_after::parse(v, std::time::SystemTime::now())),
            ..RequestEvidence::new(
                Transmission::ResponseReceived(response.status()),
                origin,
                attempt,
            )
        }
    }

    /// The status, when a response was received.
    pub fn status(&self) -> Option<StatusCode> {
        match self.transmission {
            Transmission::ResponseReceived(s) => Some(s),
            _ => None,
        }
    }
}

/// The proxy a [`ProxyPool`](crate::proxy::ProxyPool) sent an attempt through, left in the
/// request's extensions for the transport step around it, which writes it into the
/// attempt's evidence ([`RequestEvidence::proxy`]). Left when the attempt leaves (not
/// charged), so that an attempt cut before it completes keeps its proxy
/// ([`carry_into_cut`](Self::carry_into_cut)); replaced by the outcome's when it completes.
#[derive(Clone)]
pub(crate) struct ProxyUsed {
    pub(crate) origin: Origin,
    pub(crate) charged: bool,
}

impl ProxyUsed {
    /// Gives the evidence of an attempt cut by a timeout (or the deadline) the proxy it
    /// went through, taken out of `extensions`: a cut counts for the target, as a timeout
    /// through a proxy does (see [`guide::proxies`](crate::guide::proxies)), so it is not
    /// charged to the proxy.
    pub(crate) fn carry_into_cut(
        extensions: &mut http::Extensions,
        evidence: &mut RequestEvidence,
    ) {
        if let Some(used) = extensions.remove::<ProxyUsed>() {
            evidence.proxy = Some(used.origin);
            evidence.charged_to_proxy = false;
        }
    }
}
