//! [`TransportEvidence`]: the innermost middleware, which observes each attempt.

use http::Extensions;
use reqwest::Response;

use super::classify_error;
use crate::error::ResilienceError;
use crate::origin::Origin;
use crate::record::polled::{HopCount, Recording};
use crate::record::{
    AttemptHistory, FailureKind, Redirects, RequestEvidence, RequestRecord, Transmission,
    next_attempt,
};
use crate::redirect::{ClientRedirects, Declared};
use crate::stage::{HandedRequest, Handover, RestOfStack, Stage, standalone_middleware};

/// The transport step: register it last (innermost), right before the `reqwest::Client`.
///
/// For every attempt it writes a [`RequestEvidence`] into the extensions it is handed
/// (so the middlewares outside it read it after `next.run`), into the response's own
/// extensions, and appends it to the [`AttemptHistory`] in the caller's extensions.
/// What the evidence says for each kind of failure, and why, is documented in
/// [the `evidence` module](super#what-each-failure-proves).
///
/// # reqwest's own retries
///
/// reqwest 0.13's `Client` retries HTTP/2 protocol NACKs by itself (`RST_STREAM` with
/// `REFUSED_STREAM`, and `GOAWAY` with `NO_ERROR`; `ClientBuilder::retry`, by default two
/// replays without backoff) inside `execute`, below every middleware. Those replays are
/// invisible here: one attempt in the history can stand for up to three requests on the
/// wire, and its evidence describes the last one. The server's proof survives: when reqwest
/// gives up, the error still carries the `REFUSED_STREAM` / `GOAWAY`, so the attempt is
/// `SentNoResponse` with [`NotProcessedProof`](super::NotProcessedProof), and a retry
/// middleware above may send it once more. Build the client with
/// `.retry(reqwest::retry::never())` to make every request on the wire an attempt of its own
/// ([`Resilience::build_from`](crate::Resilience::build_from) does, when the stack retries).
/// reqwest's default also replays a stream failed by a `GOAWAY` for a `POST`, which hyper
/// can fail that way after the server took it: a client of
/// [`redirect::recorded_client`](crate::redirect::recorded_client), or of `build_from`
/// without a retry part, replays that only for an idempotent method.
///
/// # Redirects
///
/// reqwest follows redirects inside one attempt. Once one was followed, the request this
/// step was handed was received and answered, so its evidence is never `NotSent` and
/// carries no not-processed proof (those would describe a later hop), and
/// [`RequestEvidence::redirects`] says so; the failure, status and `Retry-After` describe
/// the last hop, at [`RequestEvidence::final_origin`]. What can be proven depends on the
/// client ([`ClientRedirects`], set with
/// [`with_client_redirects`](Self::with_client_redirects)): by default an error proves
/// nothing about earlier hops (reqwest reports it with the first URL), so it is never
/// `NotSent` either. See [`crate::redirect`].
///
/// # Cancel safety
///
/// Dropping the attempt's future (a caller's timeout, a `select!`) records nothing: the
/// extensions and the history are written only once the attempt has an outcome, so a
/// dropped attempt leaves no half-written evidence behind.
///
/// ```
/// use reqwest_middleware::ClientBuilder;
/// use reqwest_resilience::TransportEvidence;
/// use reqwest_resilience::redirect::{self, ClientRedirects};
///
/// # fn main() -> Result<(), reqwest::Error> {
/// let recorded = redirect::recorded(reqwest::redirect::Policy::default()); // every hop seen
/// let client = ClientBuilder::new(reqwest::Client::builder().redirect(recorded).build()?)
///     .with(TransportEvidence::with_client_redirects(ClientRedirects::Recorded))
///     .build();
/// # drop(client); Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct TransportEvidence {
    redirects: Declared,
    /// The network's state, for a client `build_from` built (`crate::network`).
    weather: Option<std::sync::Arc<crate::network::weather::Weather>>,
}

impl TransportEvidence {
    /// A transport step for a client whose redirects are not observed
    /// ([`ClientRedirects::Unobserved`]).
    pub fn new() -> Self {
        TransportEvidence::default()
    }

    /// A transport step told what the client below does with redirects.
    ///
    /// A declaration a response proves false (a response from another URL than the
    /// request's, with no hop recorded under `Recorded`, at all under `Off`) turns this
    /// step and its clones to
    /// [`ClientRedirects::Unobserved`] for the rest of their life, and is reported once as
    /// a [`Misconfiguration`](crate::misconfig::Misconfiguration).
    pub fn with_client_redirects(redirects: ClientRedirects) -> Self {
        TransportEvidence {
            redirects: Declared::new(redirects),
            weather: None,
        }
    }

    /// The same step over a client `build_from` built: its attempts watched for progress
    /// and for changes of the network.
    pub(crate) fn with_weather(
        mut self,
        weather: Option<std::sync::Arc<crate::network::weather::Weather>>,
    ) -> Self {
        self.weather = weather;
        self
    }

    /// What this step assumes about the client's redirects now: the declaration, or
    /// [`ClientRedirects::Unobserved`] once a response proved it false.
    pub fn client_redirects(&self) -> ClientRedirects {
        self.redirects.current()
    }
}

standalone_middleware!(TransportEvidence);

impl Stage for TransportEvidence {
    #[allow(clippy::manual_async_fn)]
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        mut req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        async move {
            // Nothing of this crate runs inside the transport step, so as the owner (used
            // alone) it only clears what an earlier request left behind.
            let _ = handover.enter(extensions, "TransportEvidence", false, req.url())?;
            if let Some(upload) = crate::upload::to_open(&req, extensions) {
                // A replayable upload no retry loop outside opened (boxed: rare, stage
                // cost rule 2).
                let origin = handover.origin(req.url());
                Box::pin(upload.open_into(&mut req, extensions, origin)).await?;
            }
            let (begun, sent) = self.send(req, &mut *extensions, handover, next);
            let watched = sent.await;
            self.conclude(begun, watched, extensions)
        }
    }
}

/// What the transport step took from an attempt before it left
/// ([`TransportEvidence::send`]), for its evidence once it ends
/// ([`TransportEvidence::conclude`]).
pub(crate) struct Begun {
    origin: Option<Origin>,
    attempt: u32,
    started: tokio::time::Instant,
    method: crate::metrics::MethodLabel,
    url_key: UrlKey,
    /// A request not harmless to repeat through a client whose redirects are not
    /// known: the one `judge_redirects` reports when it fails unsent and unproven.
    unsafe_unobserved: bool,
    /// Whether a proxy of a pool carries the attempt.
    routed: bool,
}

/// An attempt's outcome as the transport step watched it: cut by the network watch or
/// not, and the hops its client's redirect policy recorded.
pub(crate) type Watched = (
    Result<reqwest_middleware::Result<Response>, crate::network::progress::Cut>,
    Option<HopCount>,
);

impl TransportEvidence {
    /// The transport step before an attempt leaves: what its evidence needs, taken from
    /// the request, and the attempt's future through `next`, watched for progress and
    /// for network changes (a client built from scratch after one) and its redirects
    /// recorded. Synchronous, so the request moves straight into the attempt's future
    /// ([stage cost rule 3](crate::stage#cost-rules)).
    pub(crate) fn send<'a, N: RestOfStack + 'a>(
        &self,
        mut req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> (Begun, impl Future<Output = Watched> + Send + 'a) {
        let declared = self.redirects.current();
        let unsafe_unobserved = declared == ClientRedirects::Unobserved
            && !crate::record::idempotent_request(req.method(), req.headers());
        let routed = next.routed();
        let prepared =
            (self.weather.as_deref()).map(|w| super::weather::prepare(w, &mut req, routed));
        let (client, watch) = match prepared {
            Some(p) => (p.client, Some(p.watch)),
            None => (None, None),
        };
        let next = super::weather::OnClient { client, next };
        let begun = Begun {
            origin: handover.origin(req.url()),
            attempt: next_attempt(RequestRecord::begin_send(extensions)),
            url_key: UrlKey::of(req.url()),
            started: tokio::time::Instant::now(),
            method: crate::metrics::method_label(req.method()),
            unsafe_unobserved,
            routed,
        };
        let at = crate::stage::scope::key(extensions);
        let sent = crate::stage::scope::poll_as_transport(at, next, |next| {
            next.run(req, extensions, handover)
        });
        let sent = crate::network::progress::Guarded::new(sent, watch);
        (
            begun,
            Recording::new(sent, declared != ClientRedirects::Off),
        )
    }

    /// The transport step once an attempt [`send`](Self::send) started has ended: its
    /// evidence, kept in the request's record and on its response.
    pub(crate) fn conclude(
        &self,
        begun: Begun,
        (outcome, hops): Watched,
        extensions: &mut Extensions,
    ) -> reqwest_middleware::Result<Response> {
        let (result, cut) = super::weather::outcome(outcome, &begun.origin, begun.attempt);
        // Read again: a response of another attempt may have proven the declaration
        // false meanwhile.
        let client = assumed(self.redirects.current(), hops.as_ref());
        if let Err(e) = &result
            && refused_inside(e, begun.routed)
        {
            // A middleware of this crate inside (or the proxy pool, every proxy's
            // breaker open) refused the request unsent and left its evidence: that is
            // this attempt's.
            RequestRecord::end_send(extensions);
            return result;
        }
        let mut evidence = cut.unwrap_or_else(|| evidence_of(&result, begun.origin, begun.attempt));
        evidence.connect = hops.as_ref().and_then(HopCount::connect);
        self.judge_redirects(
            &mut evidence,
            &result,
            (begun.url_key, client, hops),
            begun.unsafe_unobserved,
        );
        if begun.routed
            && let Some(used) = extensions.remove::<crate::record::ProxyUsed>()
        {
            evidence.proxy = Some(used.origin);
            evidence.charged_to_proxy = used.charged;
        }
        evidence.elapsed = begun.started.elapsed();
        crate::metrics::attempt(begun.method, &evidence);
        #[cfg(feature = "tracing")]
        trace_attempt(&evidence);
        self.keep(extensions, evidence, result)
    }
}

impl TransportEvidence {
    /// Keeps the attempt's `evidence` in the request's record and its history, and on a
    /// response a record of its own (bounded by the network weather's idle bound).
    fn keep(
        &self,
        extensions: &mut Extensions,
        evidence: RequestEvidence,
        result: reqwest_middleware::Result<Response>,
    ) -> reqwest_middleware::Result<Response> {
        // On a response, a record of its own. After a retry or a `401` replay it carries
        // a copy of the history (the retry's last decision comes with its
        // `RetryOutcome`); a single attempt needs no copy: `AttemptHistory::of_response`
        // rebuilds it from the evidence.
        let record = RequestRecord::get(extensions);
        let first = record.history.as_ref().is_none_or(AttemptHistory::is_empty);
        let single = (result.is_ok() && first).then(|| evidence.clone());
        let history = record.keep_attempt(evidence);
        let on_response = match single {
            Some(evidence) => Some(RequestRecord::of_attempt(evidence)),
            None => result
                .is_ok()
                .then(|| RequestRecord::of_history(history.clone())),
        };
        result.map(|mut response| {
            if let Some(record) = on_response {
                response.extensions_mut().insert(record);
            }
            // After the record: the response's extensions are then a map already.
            super::weather::bound_response(response, self.weather.as_deref())
        })
    }

    /// Applies what the client's redirects prove to `evidence` (see [`apply_redirects`]),
    /// and reports once a non-idempotent request through an `Unobserved` client
    /// (`unsafe_unobserved`) left unsent that cannot be retried for want of proof that no
    /// redirect came first.
    fn judge_redirects(
        &self,
        evidence: &mut RequestEvidence,
        result: &reqwest_middleware::Result<Response>,
        (request, client, hops): (UrlKey, ClientRedirects, Option<HopCount>),
        unsafe_unobserved: bool,
    ) {
        let unsent = evidence.transmission == Transmission::NotSent;
        if apply_redirects(evidence, result, request, client, hops) {
            self.disproved();
        }
        if unsafe_unobserved && unsent && evidence.redirects == Redirects::Unknown {
            crate::misconfig::report_once(crate::misconfig::Misconfiguration::RedirectsUnobserved);
        }
    }

    /// A response proved the declaration false: from now on the client is `Unobserved`.
    #[cold]
    fn disproved(&self) {
        if self.redirects.disprove() {
            crate::misconfig::report_once(match self.redirects.declared() {
                ClientRedirects::Off => crate::misconfig::Misconfiguration::RedirectsNotOff,
                _ => crate::misconfig::Misconfiguration::RedirectsNotRecorded,
            });
        }
    }
}

/// What an attempt may assume about the client's redirects: the `declared` ones, or
/// `Recorded` for `Unobserved` when a client of
/// [`recorded_client`](crate::redirect::recorded_client) opened a connection during the
/// attempt (its policy is the recorded one).
fn assumed(declared: ClientRedirects, hops: Option<&HopCount>) -> ClientRedirects {
    match declared {
        ClientRedirects::Unobserved if hops.is_some_and(|h| h.proven) => ClientRedirects::Recorded,
        declared => declared,
    }
}

/// What an attempt's result shows of how far it got on the wire.
fn evidence_of(
    result: &reqwest_middleware::Result<Response>,
    origin: Option<Origin>,
    attempt: u32,
) -> RequestEvidence {
    match result {
        Ok(response) => RequestEvidence::from_response(response, origin, attempt),
        Err(reqwest_middleware::Error::Reqwest(err)) => {
            let c = classify_error(err);
            let mut e = RequestEvidence::new(c.transmission, origin, attempt);
            e.failure = Some(c.kind);
            e.not_processed = c.not_processed;
            e
        }
        // A middleware between this one and the client failed: nothing proves the request
        // stayed local.
        Err(reqwest_middleware::Error::Middleware(_)) => {
            let mut e = RequestEvidence::new(Transmission::Unknown, origin, attempt);
            e.failure = Some(super::FailureKind::Other);
            e
        }
    }
}

/// Whether a stage of this crate inside the transport step refused the request unsent and
/// left its evidence: a misplaced middleware, or (`routed`) the proxy pool with every
/// proxy's breaker open.
fn refused_inside(e: &reqwest_middleware::Error, routed: bool) -> bool {
    match ResilienceError::from_middleware_error(e) {
        Some(ResilienceError::Misconfigured(_)) => true,
        Some(ResilienceError::BreakerOpen { .. } | ResilienceError::Paused { .. }) => routed,
        _ => false,
    }
}

/// The per-attempt event (OpenTelemetry HTTP client names where one exists:
/// `resend_count`, the retries before this attempt, 0 for the first; `error.type`, the
/// failure kind).
#[cfg(feature = "tracing")]
fn trace_attempt(evidence: &RequestEvidence) {
    tracing::debug!(
        server.address = evidence.origin.as_ref().map(Origin::host),
        server.port = evidence.origin.as_ref().map(Origin::port),
        http.request.resend_count = evidence.attempt.saturating_sub(1),
        http.response.status_code = evidence.status().map(|s| s.as_u16()),
        error.type = evidence.failure.map(tracing::field::debug),
        transmission = ?evidence.transmission,
        not_processed = ?evidence.not_processed,
        elapsed = ?evidence.elapsed,
        // A pool's proxy: its origin only (never its credentials).
        proxy = evidence.proxy.as_ref().map(tracing::field::display),
        charged_to_proxy = evidence.charged_to_proxy,
        "attempt observed"
    );
}

/// The request's URL without its fragment, kept as a fingerprint (its length and a
/// multiply-rotate hash of its bytes, 8 at a time) to tell whether the response came from
/// another URL without a copy of the URL per attempt. Not collision-resistant on purpose
/// (a tenth of SipHash's cost): only a server that redirects can choose the URLs compared,
/// and a collision would only hide its own redirect from the URL check, which a server can
/// do anyway by redirecting to the same URL (the recorded policy sees both).
#[derive(Clone, Copy, PartialEq, Eq)]
struct UrlKey(usize, u64);

impl UrlKey {
    fn of(url: &reqwest::Url) -> Self {
        const K: u64 = 0x9e37_79b9_7f4a_7c15;
        let bytes = crate::redirect::without_fragment(url).as_bytes();
        let mut chunks = bytes.chunks_exact(8);
        let mut h = 0u64;
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            h = (h ^ u64::from_le_bytes(word))
                .wrapping_mul(K)
                .rotate_left(29);
        }
        let mut tail = [0u8; 8];
        tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(K);
        UrlKey(bytes.len(), h)
    }
}

/// Fills in what the attempt proves about redirects, and keeps the evidence honest about
/// the request this step was handed: after a redirect (or where one cannot be ruled out)
/// it is not `NotSent`, and a later hop's not-processed proof does not speak for it.
/// `true` when the attempt proves the `client` declaration false ([`Declared`]).
fn apply_redirects(
    evidence: &mut RequestEvidence,
    result: &reqwest_middleware::Result<Response>,
    request: UrlKey,
    client: ClientRedirects,
    hops: Option<HopCount>,
) -> bool {
    let consulted = hops.as_ref().map_or(0, |h| h.consulted);
    // Only a response can show a followed redirect: an error carries the first URL, and
    // one about a `Location` (unparsable, refused) comes whether or not a policy follows.
    let mut disproved = false;
    let (redirects, final_url_origin) = match result {
        Ok(response) => {
            let (redirects, moved) = response_redirects(response, request, consulted);
            disproved = Declared::disproved_by(client, moved, consulted);
            (
                redirects,
                moved.then(|| Origin::cached(response.url())).flatten(),
            )
        }
        Err(reqwest_middleware::Error::Reqwest(err)) => {
            // A Location reqwest would not follow (a scheme it cannot serve) is reported
            // with the Location's URL; one it could not parse, with a `url::ParseError`.
            let refused_location = err.is_builder()
                && (err.url().is_some_and(|u| UrlKey::of(u) != request)
                    || has_url_parse_error(err));
            let redirects = if consulted > 0 {
                Redirects::Followed {
                    hops: Some(consulted),
                }
            } else if refused_location || err.is_redirect() {
                // A server answered with a redirect the policy or reqwest refused.
                Redirects::Followed { hops: None }
            } else if err.is_builder() {
                // Every later hop's builder error is one of the two above: this one was
                // raised before the first hop was sent.
                Redirects::None
            } else if client == ClientRedirects::Unobserved {
                Redirects::Unknown
            } else {
                Redirects::None
            };
            let last = hops.and_then(|h| h.last_location);
            (redirects, last.filter(|_| !err.is_redirect()))
        }
        Err(reqwest_middleware::Error::Middleware(_)) => {
            let redirects = match consulted {
                0 => Redirects::None,
                n => Redirects::Followed { hops: Some(n) },
            };
            (redirects, hops.and_then(|h| h.last_location))
        }
    };
    evidence.redirects = redirects;
    if !redirects.may_have_redirected() {
        return disproved;
    }
    if evidence.transmission == Transmission::NotSent {
        evidence.transmission = Transmission::Unknown;
    }
    evidence.not_processed = None;
    if let Redirects::Followed { .. } = redirects {
        evidence.final_origin = final_url_origin.filter(|o| Some(o) != evidence.origin.as_ref());
    }
    if evidence.failure == Some(FailureKind::Builder) && redirects != Redirects::Unknown {
        // The builder error was about the Location, after the first hop was answered.
        evidence.failure = Some(FailureKind::Redirect);
    }
    disproved
}

/// What a response proves about redirects, and whether it came from another URL than the
/// request's (`consulted`: the hops the recorded policy saw).
fn response_redirects(response: &Response, request: UrlKey, consulted: u32) -> (Redirects, bool) {
    // A policy that stopped on a 3xx was consulted for the response returned.
    let stopped_here = response.status().is_redirection()
        && response.headers().contains_key(http::header::LOCATION);
    let followed = consulted.saturating_sub(u32::from(stopped_here));
    // A response built from an `http::Response` (by a middleware inside, a cache) carries
    // reqwest's placeholder URL, which says nothing about hops.
    let moved = response.url().host_str() != Some("no.url.provided.local")
        && UrlKey::of(response.url()) != request;
    let redirects = match (followed, moved) {
        (0, false) => Redirects::None,
        (0, true) => Redirects::Followed { hops: None },
        (n, _) => Redirects::Followed { hops: Some(n) },
    };
    (redirects, moved)
}

fn has_url_parse_error(err: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        if e.is::<url::ParseError>() {
            return true;
        }
        source = e.source();
    }
    false
}
