//! [`ConcurrencyLimit`]: takes a permit from the origin's limit before each attempt, and
//! feeds the attempt's latency or overload signal back to it.

use std::time::Duration;

use crate::stage::{HandedRequest, Handover, RestOfStack, Stage, standalone_middleware};
use http::{Extensions, StatusCode};
use reqwest::Response;

use super::body::hold_until_body_end;
use super::gradient::Sample;
use super::registry::{Admission, LimitPermit, LimitRejection, LimiterRegistry};
use crate::error::ResilienceError;
use crate::record::{
    AttemptClock, Deadline, FailureKind, Inward, RequestEvidence, RequestRecord, Transmission,
    record_attempt_cut, record_rejected_locally,
};
use crate::stage::CutAt;

/// A per-origin concurrency limit, from a shared [`LimiterRegistry`].
///
/// Register it inside the circuit breaker (so an open breaker rejects before a permit
/// is taken) and outside `BearerAuth` and [`TransportEvidence`](crate::TransportEvidence);
/// [`Resilience::concurrency_limit`](crate::Resilience::concurrency_limit) puts it there.
/// Per attempt:
///
/// 1. It takes a permit from the origin's limit. Over the limit, the request waits in the
///    origin's queue when one is configured (up to its timeout and the request's
///    [`Deadline`]), else, or when the wait ends without a permit, it returns
///    [`ResilienceError::ConcurrencyLimited`] at once, without touching the network, and
///    leaves in the extensions a `NotSent` [`RequestEvidence`] with
///    [`FailureKind::ConcurrencyLimited`] (also appended to the
///    [`AttemptHistory`](crate::AttemptHistory)).
/// 2. It sends the attempt and, from the evidence the transport step left, tells the
///    limit what it showed: the latency to the response head, an overload signal (a
///    `429`, a `503`, a timeout), or nothing (a refused connection, a rejection inside).
/// 3. It holds the permit until the response body has been read to its end, failed or
///    been dropped: a body still streaming (a download, streamed LLM output) is load on
///    the server, so a limit of 1 serves one body at a time. The response is rebuilt
///    around the wrapped body (status, version, headers, extensions and URL kept); one
///    with `Content-Length: 0` gives the permit back at its head.
///
/// The retry middleware does not retry a rejection: waiting for a permit is this
/// middleware's queue, bounded by the same deadline; a retry after a backoff would only
/// come back to an origin that was already full (see
/// [`StopReason::ConcurrencyLimited`](crate::retry::StopReason::ConcurrencyLimited)). A
/// circuit breaker outside counts a rejection as neutral: it says nothing about the
/// origin's health. Each retry, and each hedge, takes a permit of its own.
///
/// What one permit covers: the attempt as this middleware hands it on. A `401` replay by
/// `BearerAuth` inside runs under the same permit (after the first request, so the count
/// in flight stays exact), and so do the redirects reqwest follows within the attempt,
/// even to another origin: the permit, and the latency sample, belong to the origin the
/// request was sent to.
///
/// ```
/// use reqwest_middleware::ClientBuilder;
/// use reqwest_resilience::TransportEvidence;
/// use reqwest_resilience::limit::{ConcurrencyLimit, LimiterConfig, LimiterRegistry};
/// use reqwest_resilience::redirect::{self, ClientRedirects};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let registry = LimiterRegistry::new(LimiterConfig::fixed(16))?;
/// let recorded = redirect::recorded(reqwest::redirect::Policy::default()); // every hop seen
/// let client = ClientBuilder::new(reqwest::Client::builder().redirect(recorded).build()?)
///     .with(ConcurrencyLimit::new(registry.clone()))
///     .with(TransportEvidence::with_client_redirects(ClientRedirects::Recorded))
///     .build();
/// for limit in registry.snapshot() {
///     println!("{}: {} of {} in flight", limit.origin, limit.in_flight, limit.limit);
/// }
/// # drop(client); Ok(()) }
/// ```
///
/// # Deadlines
///
/// A request's [`Deadline`] bounds its wait in the queue: a wait that reaches it ends
/// with the rejection above (`NotSent`, never sent). When the breaker outside cuts the
/// attempt at the same deadline, the queue's timer wins (it is polled inside the
/// breaker's), so a request that only waited locally is never counted as a timeout
/// against the origin. An attempt that was admitted and is still running at the
/// deadline is a timeout: an overload signal for the limit.
///
/// The retry middleware's [attempt
/// timeout](crate::retry::RetryMiddlewareBuilder::attempt_timeout) runs from the permit:
/// a wait in the queue stops its clock, and the permit restarts it. This middleware cuts
/// the attempt there itself (`Unknown` / `Timeout` evidence and tokio's `Elapsed`, as the
/// retry's own cut), and counts the cut as an overload signal.
///
/// # Cancel safety
///
/// The permit is an RAII guard: dropping the request future at any point (waiting in
/// the queue, or during the attempt) gives its place back at once. A drop before the
/// request's [`Deadline`] tells the limit nothing (the caller gave up); a drop at or
/// after it (an outer middleware cut the attempt there) counts as a timeout.
#[derive(Clone, Debug, Default)]
pub struct ConcurrencyLimit {
    registry: LimiterRegistry,
}

impl ConcurrencyLimit {
    /// A middleware using `registry`'s limits.
    pub fn new(registry: LimiterRegistry) -> Self {
        ConcurrencyLimit { registry }
    }

    /// The registry whose limits this middleware uses.
    pub fn registry(&self) -> &LimiterRegistry {
        &self.registry
    }
}

/// How [`Resilience`](crate::Resilience) was asked for a limit.
pub(crate) enum LimitChoice {
    Config(super::LimiterConfig),
    Registry(LimiterRegistry),
}

impl LimitChoice {
    pub(crate) fn build(self) -> Result<ConcurrencyLimit, ResilienceError> {
        Ok(ConcurrencyLimit::new(match self {
            LimitChoice::Config(config) => LimiterRegistry::new(config)?,
            LimitChoice::Registry(registry) => registry,
        }))
    }
}

/// Leaves the rejection's `NotSent` evidence and builds its error.
fn rejected(rejection: LimitRejection, extensions: &mut Extensions) -> reqwest_middleware::Error {
    record_rejected_locally(
        extensions,
        FailureKind::ConcurrencyLimited,
        Some(rejection.origin.clone()),
        None,
    );
    reqwest_middleware::Error::middleware(ResilienceError::from(rejection))
}

/// What an attempt tells its origin's limit.
fn sample_of(
    evidence: Option<&RequestEvidence>,
    result: &reqwest_middleware::Result<Response>,
    elapsed: impl FnOnce() -> Duration,
) -> Sample {
    let overload =
        |s: StatusCode| s == StatusCode::TOO_MANY_REQUESTS || s == StatusCode::SERVICE_UNAVAILABLE;
    match evidence {
        Some(e) => match (e.transmission, e.failure) {
            // The server's stream limit: an overload signal. A `GOAWAY` is a connection
            // rotation, not load (`FailureKind::GoAway`, ignored below).
            _ if e.not_processed == Some(crate::record::NotProcessedProof::RefusedStream) => {
                Sample::Overload
            }
            (Transmission::ResponseReceived(s), _) if overload(s) => Sample::Overload,
            // The transport step's own time: a token wait in `BearerAuth` is not latency.
            (Transmission::ResponseReceived(_), _) => Sample::Latency(e.elapsed),
            (_, Some(FailureKind::Timeout | FailureKind::NoProgress)) => Sample::Overload,
            _ => Sample::Ignored,
        },
        // No transport step inside: the result speaks for itself.
        None => match result {
            Ok(r) if overload(r.status()) => Sample::Overload,
            Ok(_) => Sample::Latency(elapsed()),
            Err(reqwest_middleware::Error::Reqwest(e)) if e.is_timeout() => Sample::Overload,
            Err(_) => Sample::Ignored,
        },
    }
}

standalone_middleware!(ConcurrencyLimit);

impl Stage for ConcurrencyLimit {
    #[allow(clippy::manual_async_fn)]
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        async move {
            // The owner of the request (used alone) clears what an earlier one left
            // behind, a deadline handed on for a request whose future was dropped included.
            let owner = handover.enter(extensions, "ConcurrencyLimit", false, req.url())?;
            let Some(origin) = handover.origin(req.url()) else {
                // No origin, no limit: reqwest will reject the URL itself.
                return owner
                    .poll_as(next, |next| next.run(req, extensions, handover))
                    .await;
            };
            let deadline = extensions.get::<Deadline>().map(|d| d.0);
            // The retry middleware's attempt timeout, whose clock this gate restarts when
            // the request leaves: a wait in the queue is not part of the attempt.
            let clock = Inward::clock(extensions);
            let mut permit = match self.registry.admit(&origin, deadline, true) {
                Admission::Admitted(permit) => permit,
                // Rare: the wait in the queue (boxed: stage cost rule 2).
                Admission::Queued(queued) => {
                    if let Some(clock) = &clock {
                        clock.stop();
                    }
                    match Box::pin(self.registry.wait(&origin, queued, deadline)).await {
                        Ok(permit) => permit,
                        Err(rejection) => return Err(rejected(rejection, extensions)),
                    }
                }
                Admission::Rejected(rejection) => return Err(rejected(rejection, extensions)),
            };
            let recorded_before =
                start_attempt(&mut permit, clock.as_ref(), extensions, handover.composed());
            // The attempt's future is made once, where it is kept, and pinned there: the cut
            // (with an attempt clock) holds only the pin (made first and handed to the cut,
            // or awaited by value, the future would be moved again).
            let outcome = {
                let sent =
                    std::pin::pin!(owner.poll_as(next, |next| next.run(req, extensions, handover)));
                match clock {
                    None => Ok(sent.await),
                    Some(clock) => {
                        let timer = crate::stage::cut_timer(None, Some(&clock));
                        CutAt::by(sent, timer, Some(clock)).await
                    }
                }
            };
            let result = match outcome {
                Ok(result) => result,
                Err(elapsed) => {
                    return Err(cut_here(
                        permit,
                        elapsed,
                        extensions,
                        &origin,
                        recorded_before,
                    ));
                }
            };
            // The clock is read only when no evidence says how long the attempt took.
            let admitted_at = permit.admitted_at();
            let sample = sample_of(RequestEvidence::of(extensions), &result, || {
                admitted_at.elapsed()
            });
            hand_back(permit, sample, result)
        }
    }
}

/// The attempt starts under `permit`: on the attempt's `clock`, restarted from the
/// admission, if it has one. How many attempts the history held before it (0 without a
/// clock: only a cut reads it).
#[inline]
fn start_attempt(
    permit: &mut LimitPermit,
    clock: Option<&AttemptClock>,
    extensions: &mut Extensions,
    composed: bool,
) -> usize {
    // Evidence left by an earlier attempt would otherwise be read as this one's when no
    // transport step runs inside (the composed stack always has one).
    if !composed {
        RequestRecord::clear_evidence(extensions);
    }
    let Some(clock) = clock else {
        return 0;
    };
    clock.restart(permit.admitted_at());
    permit.on_clock(clock.clone());
    RequestRecord::attempts_recorded(extensions)
}

/// An attempt cut by the attempt timeout (or the deadline) here, the innermost gate: the
/// evidence the retry's own cut would leave, and a timeout for the limit (an overload
/// signal).
fn cut_here(
    permit: LimitPermit,
    elapsed: tokio::time::error::Elapsed,
    extensions: &mut Extensions,
    origin: &crate::Origin,
    recorded_before: usize,
) -> reqwest_middleware::Error {
    record_attempt_cut(extensions, origin, recorded_before, permit.admitted_at());
    permit.record(Sample::Overload);
    reqwest_middleware::Error::middleware(elapsed)
}

/// `result`, the permit given back with `sample`: at once for an error or a response
/// with nothing to stream, else when the response's body ends (a body still streaming is
/// load on the server).
fn hand_back(
    permit: LimitPermit,
    sample: Sample,
    result: reqwest_middleware::Result<Response>,
) -> reqwest_middleware::Result<Response> {
    match result {
        // Nothing to stream (`Content-Length: 0`, a `204`, a `HEAD`'s answer).
        Ok(response) if response.content_length() == Some(0) => {
            permit.record(sample);
            Ok(response)
        }
        Ok(response) => Ok(hold_until_body_end(
            response,
            permit.record_and_hold(sample),
        )),
        Err(e) => {
            permit.record(sample);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(code: u16) -> reqwest_middleware::Result<Response> {
        Ok(Response::from(
            http::Response::builder().status(code).body("").unwrap(),
        ))
    }

    #[test]
    fn a_refused_stream_is_an_overload_sample_and_a_goaway_is_not() {
        use crate::record::NotProcessedProof;
        let refused = |proof| {
            let mut e = RequestEvidence::new(Transmission::SentNoResponse, None, 1);
            e.failure = Some(FailureKind::Protocol);
            e.not_processed = Some(proof);
            e
        };
        let err = Err(reqwest_middleware::Error::middleware(
            std::io::Error::other("x"),
        ));
        let ms = Duration::from_millis;
        // The server's stream limit is load; a connection rotation is not.
        assert_eq!(
            sample_of(
                Some(&refused(NotProcessedProof::RefusedStream)),
                &err,
                || ms(3)
            ),
            Sample::Overload
        );
        assert_eq!(
            sample_of(Some(&refused(NotProcessedProof::GoAway)), &err, || ms(3)),
            Sample::Ignored
        );
    }

    #[test]
    fn samples_read_latency_overload_or_nothing_from_the_evidence() {
        let ms = Duration::from_millis;
        let status = |c| Transmission::ResponseReceived(StatusCode::from_u16(c).unwrap());
        let mut ok = RequestEvidence::new(status(200), None, 1);
        ok.elapsed = ms(7);
        // The evidence's time wins over the middleware's own (which may include a token wait).
        assert_eq!(
            sample_of(Some(&ok), &response(200), || ms(90)),
            Sample::Latency(ms(7))
        );
        for code in [429, 503] {
            let e = RequestEvidence::new(status(code), None, 1);
            assert_eq!(
                sample_of(Some(&e), &response(code), || ms(1)),
                Sample::Overload
            );
        }
        let e = RequestEvidence::new(status(500), None, 1);
        assert_eq!(
            sample_of(Some(&e), &response(500), || ms(1)),
            Sample::Latency(ms(0))
        );
        let mut timeout = RequestEvidence::new(Transmission::Unknown, None, 1);
        timeout.failure = Some(FailureKind::Timeout);
        assert_eq!(
            sample_of(Some(&timeout), &response(200), || ms(1)),
            Sample::Overload
        );
        for kind in [
            FailureKind::Connect,
            FailureKind::Reset,
            FailureKind::BreakerOpen,
            FailureKind::TokenUnavailable,
            FailureKind::ConcurrencyLimited,
        ] {
            let e = RequestEvidence::rejected_locally(kind, None, 1);
            assert_eq!(
                sample_of(Some(&e), &response(200), || ms(1)),
                Sample::Ignored
            );
        }
        // Without evidence: the response itself.
        assert_eq!(
            sample_of(None, &response(204), || ms(3)),
            Sample::Latency(ms(3))
        );
        assert_eq!(sample_of(None, &response(503), || ms(3)), Sample::Overload);
        let other = Err(reqwest_middleware::Error::middleware(
            std::io::Error::other("x"),
        ));
        assert_eq!(sample_of(None, &other, || ms(3)), Sample::Ignored);
    }
}
