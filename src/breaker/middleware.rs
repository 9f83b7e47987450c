//! [`CircuitBreakerMiddleware`]: asks the origin's breaker before each attempt, counts the
//! attempt's outcome after it, and turns a `429`/`503` with `Retry-After`, or rate-limit
//! fields saying nothing remains, into a pause for every caller of the registry.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, SystemTime};

use crate::stage::{HandedRequest, Handover, RestOfStack, Stage, standalone_middleware};
use http::{Extensions, StatusCode};
use reqwest::Response;
use tokio::time::Instant;
use tokio::time::error::Elapsed;

use super::config::PauseMode;
use super::policy::{AttemptClassifier, DefaultClassifier, Outcome};
use super::registry::{BreakerPermit, BreakerRegistry, BreakerRejection};
use crate::error::{RejectReason, ResilienceError};
use crate::origin::Origin;
use crate::record::{
    AttemptClock, AttemptScope, Deadline, FailureKind, Inward, RequestEvidence, RequestRecord,
    RetryIn, Transmission, earlier, record_attempt_cut, record_rejected_locally,
};
use crate::stage::CutAt;

/// One circuit breaker per origin, from a shared [`BreakerRegistry`].
///
/// Register it inside the retry middleware and outside `BearerAuth` and
/// [`TransportEvidence`](crate::TransportEvidence) (see the crate docs for the order).
/// Per attempt:
///
/// 1. It asks the origin's breaker. Turned away (Open, probes busy, isolated, or paused
///    and not waiting), it returns [`ResilienceError::BreakerOpen`] or
///    [`ResilienceError::Paused`] at once, without touching the network, and leaves in
///    the extensions a `NotSent` [`RequestEvidence`] (also appended to the
///    [`AttemptHistory`](crate::AttemptHistory)) and a [`RetryIn`]. While the origin is paused and the
///    [`PauseMode`] is `Wait`, it sleeps until the pause ends unless that passes the
///    request's [`Deadline`].
/// 2. It sends the attempt and reads the [`RequestEvidence`] the transport step left;
///    the [`AttemptClassifier`] turns it into an outcome for the breaker.
/// 3. A `429` or `503` whose evidence carries `Retry-After` pauses the origin for every
///    caller of the registry (clamped to [`max_pause`](super::BreakerConfig::max_pause)).
///    So does any response whose rate-limit fields say nothing remains until the quota
///    resets (`X-RateLimit-Remaining: 0` with `X-RateLimit-Reset`, `RateLimit:
///    "default";r=0;t=30`, every form [the guide](crate::guide::rate_limits) lists),
///    unless [`rate_limit_pauses`](super::BreakerConfig::rate_limit_pauses) is off, or
///    the [`Resilience`](crate::Resilience) stack has a learning
///    [rate limit](crate::rate#how-long-a-servers-fields-hold-a-caller), which then
///    applies them alone; the longer of the two wins.
///
/// After a redirect to another origin ([`RequestEvidence::final_origin`]), each origin
/// answers for its own hop: this request's origin records a success (it answered, with a
/// `3xx`), and the last hop's outcome and pause go to the last hop's origin (when its
/// breaker admits one more attempt; an Open breaker there counts nothing). Where the
/// transport step cannot tell which hop failed (an error under
/// [`ClientRedirects::Unobserved`](crate::redirect::ClientRedirects::Unobserved)), the
/// request's origin is charged.
///
/// # Deadlines
///
/// When the extensions hold a [`Deadline`] (a per-request one, or the one the retry
/// middleware hands inward from its `total_deadline`), the attempt runs under it, and under
/// the retry middleware's [attempt
/// timeout](crate::retry::RetryMiddlewareBuilder::attempt_timeout), handed inward for each
/// attempt: it is cut here at the earlier of the two. The cut leaves what the retry
/// middleware's own cut leaves, so the retry reads either one alike (at the deadline it
/// stops with [`StopReason::DeadlineExceeded`](crate::retry::StopReason::DeadlineExceeded)):
///
/// - a [`RequestEvidence`] `Transmission::Unknown` with [`FailureKind::Timeout`] in the
///   extensions and appended to the [`AttemptHistory`](crate::AttemptHistory) (unless the transport step already
///   recorded this attempt; the retry middleware adds no second record);
/// - the error `reqwest_middleware::Error::Middleware` holding tokio's
///   [`Elapsed`](tokio::time::error::Elapsed).
///
/// How the cut counts, without asking the [`AttemptClassifier`], depends on whose limit
/// it was:
///
/// - **The attempt timeout** (its cut at or before the deadline): an
///   [`Outcome::Failure`]. A timeout is a transport failure, and a server that hangs must
///   trip its breaker.
/// - **The caller's total deadline** alone: neutral. The caller's own budget ran out,
///   which says nothing about the origin: nothing is counted, and a HalfOpen probe so cut
///   frees its slot (the breaker stays HalfOpen and the next request probes; it is not
///   re-opened). A server that hangs is caught by an attempt timeout or by reqwest's own
///   timeout (`reqwest::ClientBuilder::timeout`, a [`FailureKind::Timeout`] failure).
///
/// A request whose deadline is nearly spent may still take the HalfOpen probe slot: no
/// threshold tells "too little time" for a server whose latency is unknown, and turning it
/// away would fail a request that might have completed. Since its cut is neutral, it holds
/// the slot at most for the time it has left, and the next request probes.
///
/// When both timers are due, the breaker's is normally seen first (it is polled inside the
/// retry's); if the retry's cut wins instead (two timers firing together on a multi-thread
/// runtime), the breaker sees its attempt dropped at the cut and counts it as above, while
/// the retry writes the same evidence itself. A hedge (an extra copy of a hedged request)
/// is turned away at once by an Open breaker or a pause, never waits one out, and never
/// takes a HalfOpen probe slot; a copy dropped because another copy answered first is a
/// cancellation and is never counted.
///
/// ```
/// use reqwest_middleware::ClientBuilder;
/// use reqwest_resilience::TransportEvidence;
/// use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, CircuitBreakerMiddleware};
/// use reqwest_resilience::redirect::{self, ClientRedirects};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let registry = BreakerRegistry::new(BreakerConfig::default())?;
/// // Clients built with clones of one registry share their breakers.
/// let recorded = redirect::recorded(reqwest::redirect::Policy::default()); // every hop seen
/// let client = ClientBuilder::new(reqwest::Client::builder().redirect(recorded).build()?)
///     .with(CircuitBreakerMiddleware::new(registry.clone()))
///     .with(TransportEvidence::with_client_redirects(ClientRedirects::Recorded))
///     .build();
/// # drop(client); Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Dropping the request future at any point leaves the breaker consistent: a HalfOpen
/// probe slot held by the dropped attempt is freed (the permit is an RAII guard), no
/// outcome is counted, and a wait for a pause holds nothing. The one exception is the
/// attempt timeout above: an attempt dropped at or after its attempt timeout's cut (by
/// whichever timer saw it first) counts as the timeout it is. A caller's own timeout or
/// `select!` that drops the future, at its deadline or before, is a cancellation, not a
/// verdict on the server.
#[derive(Clone)]
pub struct CircuitBreakerMiddleware {
    registry: BreakerRegistry,
    classifier: Arc<dyn AttemptClassifier>,
    /// Whether a rate limit inside applies the rate-limit fields (the stack says so when
    /// it installs a learning one): then they pause nothing here.
    fields_left_to_rate_limit: bool,
}

impl std::fmt::Debug for CircuitBreakerMiddleware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CircuitBreakerMiddleware")
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

impl Default for CircuitBreakerMiddleware {
    fn default() -> Self {
        CircuitBreakerMiddleware::new(BreakerRegistry::default())
    }
}

impl CircuitBreakerMiddleware {
    /// A middleware using `registry`'s breakers, with the [`DefaultClassifier`].
    pub fn new(registry: BreakerRegistry) -> Self {
        CircuitBreakerMiddleware {
            registry,
            classifier: Arc::new(DefaultClassifier),
            fields_left_to_rate_limit: false,
        }
    }

    /// This middleware, leaving the servers' rate-limit fields to a learning rate limit
    /// inside it ([`crate::rate`]): one stage applies them, under one bound (the rate
    /// limit's `max_server_wait` and `max_wait`); `Retry-After` still pauses here.
    pub(crate) fn leaving_rate_limit_fields(mut self) -> Self {
        self.fields_left_to_rate_limit = true;
        self
    }

    /// Replaces how attempts are counted.
    pub fn with_classifier(mut self, classifier: impl AttemptClassifier) -> Self {
        self.classifier = Arc::new(classifier);
        self
    }

    /// The registry whose breakers this middleware uses.
    pub fn registry(&self) -> &BreakerRegistry {
        &self.registry
    }

    /// What to do with a first rejection: wait out a pause (in `Wait` mode, within the
    /// deadline) and ask again, or give up. Only reached when the first `acquire` failed,
    /// so the success path neither awaits nor carries the sleep in its future.
    async fn admit_after<'a>(
        &'a self,
        origin: &'a Origin,
        extensions: &mut Extensions,
        mut rejection: BreakerRejection,
    ) -> Result<BreakerPermit<'a>, BreakerRejection> {
        // Each pass sleeps until the pause it saw ends, so this only goes round again
        // while servers keep extending the pause: the caller's whole wait is bounded by
        // `max_pause` (and its deadline), whatever the servers answer; past it the pause's
        // rejection is returned.
        let config = self.registry.config();
        let end_of_wait = Instant::now().checked_add(config.max_pause);
        loop {
            if let (RejectReason::Paused, Some(wait), PauseMode::Wait) =
                (rejection.reason, rejection.retry_in, config.pause_mode)
            {
                let deadline = earlier(extensions.get::<Deadline>().map(|d| d.0), end_of_wait);
                let fits = deadline.is_none_or(|d| Instant::now() + wait <= d);
                if fits {
                    // A wait here is local: the attempt's timeout clock stops for it (the
                    // admission restarts it), so only the deadline bounds it.
                    if let Some(clock) = Inward::clock(extensions) {
                        clock.stop();
                    }
                    // Spread over a short window after the pause, never past the bound.
                    let spread = super::spread_after_pause(wait);
                    let wake = Instant::now() + spread;
                    tokio::time::sleep_until(deadline.map_or(wake, |d| wake.min(d))).await;
                    rejection = match self.registry.acquire(origin) {
                        Ok(permit) => return Ok(permit),
                        Err(r) => r,
                    };
                    continue;
                }
            }
            return Err(rejection);
        }
    }
}

/// Why a hedge was refused a half-open breaker's probe slot: as if its probes were busy
/// (the hedge's request is still in flight as the probe or beside it).
fn hedge_refused(origin: &Origin) -> BreakerRejection {
    BreakerRejection {
        origin: origin.clone(),
        reason: RejectReason::ProbesBusy,
        state: super::BreakerState::HalfOpen,
        retry_in: None,
    }
}

/// Leaves the rejection's evidence where the retry middleware and the caller look.
fn record_rejection(rejection: &BreakerRejection, extensions: &mut Extensions) {
    let kind = match rejection.reason {
        RejectReason::Paused => FailureKind::Paused,
        _ => FailureKind::BreakerOpen,
    };
    // The retry middleware also reads a rejection's "retry in" from the evidence.
    record_rejected_locally(
        extensions,
        kind,
        Some(rejection.origin.clone()),
        rejection.retry_in,
    );
    if let Some(retry_in) = rejection.retry_in {
        RetryIn(retry_in).insert_into(extensions);
    }
}

/// The permit of an attempt running under a cut: the earlier of the request's
/// [`Deadline`] and the attempt's own timeout (the retry middleware's attempt timeout).
///
/// Dropped unrecorded at or after the cut, the attempt was cut there, by this middleware's
/// timer or by an outer one due at the same instant (the retry middleware's, which may be
/// seen first when both fire together on a multi-thread runtime). A cut by the attempt
/// timeout is counted as a timeout failure: a server that hangs must trip its breaker. A
/// cut by the caller's total deadline alone is the caller's own limit and is neutral (a
/// probe's slot is freed). Dropped before the cut, the caller gave up: neutral too. A copy
/// of a hedged request dropped because another copy won (`lost` set) was cancelled,
/// whenever that happened: nothing is counted.
struct CutAtDeadline<'a> {
    permit: Option<BreakerPermit<'a>>,
    deadline: Instant,
    /// Without a clock: the attempt's own cut when it is earlier than the deadline.
    timeout_cut: Option<Instant>,
    started: Instant,
    lost: Option<Arc<AtomicBool>>,
    /// The attempt's timeout clock: then the cut is the clock's, as it stands.
    clock: Option<AttemptClock>,
}

impl<'a> CutAtDeadline<'a> {
    /// The attempt finished in time: its outcome is counted from its result.
    fn disarm(mut self) -> Option<BreakerPermit<'a>> {
        self.permit.take()
    }
}

impl CutAtDeadline<'_> {
    /// When the attempt is cut as things stand (`None`: never, while a limiter inside
    /// keeps the request in its queue with no deadline).
    fn cut(&self) -> Option<Instant> {
        match &self.clock {
            None => Some(self.deadline),
            Some(clock) => clock.cut(),
        }
    }

    /// Whether the cut is the attempt timeout's, not the caller's deadline alone.
    fn cut_by_timeout(&self) -> bool {
        match &self.clock {
            None => self.timeout_cut.is_some(),
            Some(clock) => clock.cut_by_timeout(),
        }
    }
}

impl CutAtDeadline<'_> {
    /// The cut that counts as the attempt timeout's failure, if the attempt was so cut: a
    /// request a gate inside still held locally (a limiter's queue) was not out, and its
    /// cut says nothing about the server; nor does the caller's deadline alone.
    fn timed_out(&self) -> Option<Instant> {
        let waiting = self.clock.as_ref().is_some_and(AttemptClock::is_stopped);
        self.cut().filter(|&cut| {
            self.started < cut
                && Instant::now() >= cut
                && !waiting
                && self.cut_by_timeout()
                && !AttemptScope::is_lost(self.lost.as_ref())
        })
    }
}

impl Drop for CutAtDeadline<'_> {
    fn drop(&mut self) {
        if let Some(cut) = self.timed_out()
            && let Some(permit) = self.permit.take()
        {
            // A timeout is a transport failure, whatever a classifier would make of the
            // error, which it cannot see here; timed up to the cut.
            let registry = permit.registry();
            permit.record_timed(
                Outcome::Failure,
                cut.saturating_duration_since(self.started),
            );
            // Through a proxy of a pool: the timeout counts for the target, and the proxy,
            // which connected and carried the request, has its success (see
            // [`guide::proxies`](crate::guide::proxies)).
            if let Some(proxy) = self.clock.as_ref().and_then(AttemptClock::proxy)
                && let Ok(permit) = registry.acquire(&proxy)
            {
                permit.record(Outcome::Success);
            }
        }
        // Otherwise the permit is dropped unrecorded: nothing counted, a probe slot freed.
    }
}

/// The pause a server asked for: `Retry-After` on a 429 or 503, or, when `rate_limits`,
/// rate-limit fields saying nothing remains (on any response), the longer of the two.
fn server_pause(
    evidence: Option<&RequestEvidence>,
    result: &reqwest_middleware::Result<Response>,
    rate_limits: bool,
) -> Option<Duration> {
    let retry_after = retry_after_pause(evidence, result);
    let Some(response) = result.as_ref().ok().filter(|_| rate_limits) else {
        return retry_after;
    };
    retry_after.max(rate_limit_pause(response.headers()))
}

/// The wait rate-limit fields direct: until the quota resets, when they say nothing
/// remains. A malformed field is ignored (reported at DEBUG with `tracing`).
fn rate_limit_pause(headers: &http::HeaderMap) -> Option<Duration> {
    if !crate::ratelimit_fields::may_be_present(headers) {
        return None;
    }
    match crate::ratelimit_fields::parse(headers, SystemTime::now()) {
        Ok(fields) => fields.exhausted_for(),
        Err(_malformed) => {
            #[cfg(feature = "tracing")]
            tracing::debug!(error = %_malformed, "rate-limit field ignored");
            None
        }
    }
}

/// `Retry-After` on a 429 or 503.
fn retry_after_pause(
    evidence: Option<&RequestEvidence>,
    result: &reqwest_middleware::Result<Response>,
) -> Option<Duration> {
    let pausing =
        |s: StatusCode| s == StatusCode::TOO_MANY_REQUESTS || s == StatusCode::SERVICE_UNAVAILABLE;
    if let Some(e) = evidence {
        return match e.transmission {
            Transmission::ResponseReceived(s) if pausing(s) => e.retry_after,
            _ => None,
        };
    }
    // Without a transport step inside, read the header ourselves.
    let response = result.as_ref().ok().filter(|r| pausing(r.status()))?;
    let value = response
        .headers()
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?;
    crate::retry_after::parse(value, SystemTime::now())
}

standalone_middleware!(CircuitBreakerMiddleware);

impl Stage for CircuitBreakerMiddleware {
    #[allow(clippy::manual_async_fn)]
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        async move {
            let owner = handover.enter(extensions, "CircuitBreakerMiddleware", false, req.url())?;
            // A "retry in" from an earlier attempt must not be read as this one's.
            RetryIn::remove_from(extensions);
            let Some(origin) = handover.origin(req.url()) else {
                // No origin, no breaker: reqwest will reject the URL itself.
                return owner
                    .poll_as(next, |next| next.run(req, extensions, handover))
                    .await;
            };
            let held = self
                .admit_attempt(&origin, extensions, handover.composed())
                .await?;
            let clock = held.clock();
            // The inner future made where the cut keeps it, pinned there (`CutAt`: not
            // moved again, neither into the cut nor by the `.await`).
            let outcome = {
                let cut = std::pin::pin!(CutAt {
                    inner: owner.poll_as(next, |next| next.run(req, extensions, handover)),
                    timer: crate::stage::cut_timer(held.cut(), clock.as_ref()),
                    clock,
                });
                cut.await
            };
            self.end_attempt(held, outcome, extensions, &origin)
        }
    }
}

impl CircuitBreakerMiddleware {
    /// The breaker before an attempt to `origin` leaves: admitted (after waiting out a
    /// pause, when it may) and held under the attempt's cut, or refused with its typed
    /// error and its evidence left. `composed`: the composed stack runs it, with the
    /// transport step inside.
    #[inline]
    pub(crate) async fn admit_attempt<'a>(
        &'a self,
        origin: &'a Origin,
        extensions: &mut Extensions,
        composed: bool,
    ) -> Result<Admitted<'a>, reqwest_middleware::Error> {
        // The retry middleware's word on this attempt: its own cut, whether it is a hedge.
        let scope = Inward::take_attempt(extensions).unwrap_or_default();
        match self.admit(origin, scope.hedge, extensions).await {
            Ok(permit) => Ok(Admitted(Held::under_cut(
                permit, scope, extensions, composed,
            ))),
            Err(rejection) => Err(reject(origin, rejection, extensions)),
        }
    }

    /// The breaker once an attempt it admitted ended (or was cut: `outcome` is then
    /// tokio's `Elapsed`): the outcome counted, the attempt's result.
    #[inline]
    pub(crate) fn end_attempt(
        &self,
        Admitted(held): Admitted<'_>,
        outcome: Result<reqwest_middleware::Result<Response>, Elapsed>,
        extensions: &mut Extensions,
        origin: &Origin,
    ) -> reqwest_middleware::Result<Response> {
        let (result, permit) = held.end(outcome, extensions, origin);
        if let Some(permit) = permit {
            self.record_outcome(permit, origin, extensions, &result);
        }
        result
    }
}

impl CircuitBreakerMiddleware {
    /// The gate: the origin's breaker admits the attempt, or turns it away (after waiting
    /// out a pause, when it may).
    #[inline]
    async fn admit<'a>(
        &'a self,
        origin: &'a Origin,
        hedge: bool,
        extensions: &mut Extensions,
    ) -> Result<BreakerPermit<'a>, BreakerRejection> {
        match self.registry.acquire(origin) {
            // A hedge is never a probe: one slow probe must not become two.
            Ok(permit) if hedge && permit.is_probe() => Err(hedge_refused(origin)),
            Ok(permit) => Ok(permit),
            // A hedge does not wait out a pause: it would only add load when it ends.
            Err(first) if hedge => Err(first),
            // Rare: the wait for a pause (boxed: stage cost rule 2).
            Err(first) => Box::pin(self.admit_after(origin, extensions, first)).await,
        }
    }

    /// Counts the outcome of an attempt that ran to its end with the breaker's permit,
    /// timed (under slow-call trips) by the transport step's evidence, else from the
    /// permit's admission.
    #[inline]
    fn record_outcome(
        &self,
        permit: BreakerPermit<'_>,
        origin: &Origin,
        extensions: &Extensions,
        result: &reqwest_middleware::Result<Response>,
    ) {
        let evidence = RequestEvidence::of(extensions);
        let outcome = self.classifier.classify(evidence, result);
        let rate_limits =
            self.registry.config().rate_limit_pauses && !self.fields_left_to_rate_limit;
        let pause = server_pause(evidence, result, rate_limits);
        // Slow-call trips time an attempt the transport step did not time from its admission.
        let took = (self.registry.config().slow_calls)
            .map(|_| evidence.map_or_else(|| permit.acquired().elapsed(), |e| e.elapsed));
        if let Some(e) = evidence.filter(|e| e.proxy.is_some()) {
            // Through a proxy of a pool (see `guide::proxies`).
            if self.charged_to_proxy(e, took, pause) {
                // The target said nothing: its permit goes back uncounted.
                return;
            }
        }
        match evidence.and_then(|e| e.final_origin.as_ref()) {
            // Each hop's outcome belongs to the origin that produced it: this origin
            // answered with a redirect, and the last hop's answer (or failure, and any
            // pause it asked for) is the other origin's.
            Some(last) if last != origin => {
                permit.record(Outcome::Success);
                if let Ok(other) = self.registry.acquire(last) {
                    other.record_with_pause(outcome, took, pause);
                }
            }
            _ => permit.record_with_pause(outcome, took, pause),
        }
    }
}

impl CircuitBreakerMiddleware {
    /// Records the proxy's part of an attempt through a proxy of a pool: its failure when
    /// the outcome is charged to it (whatever the classifier makes of a `407` or of a
    /// `403` the pool rotates on), else a success (it connected and relayed the answer).
    /// `true` when the outcome was the proxy's alone.
    #[cold]
    fn charged_to_proxy(
        &self,
        evidence: &RequestEvidence,
        took: Option<Duration>,
        pause: Option<Duration>,
    ) -> bool {
        let Some(proxy) = &evidence.proxy else {
            return false;
        };
        let charged = evidence.charged_to_proxy;
        if let Ok(permit) = self.registry.acquire(proxy) {
            match charged {
                true => permit.record_with_pause(Outcome::Failure, took, pause),
                false => permit.record(Outcome::Success),
            }
        }
        charged
    }
}

/// A rejected attempt: counted in the metrics, its evidence left in the extensions, and
/// its error.
fn reject(
    origin: &Origin,
    rejection: BreakerRejection,
    extensions: &mut Extensions,
) -> reqwest_middleware::Error {
    crate::metrics::breaker_rejection(origin, rejection.reason);
    record_rejection(&rejection, extensions);
    reqwest_middleware::Error::middleware(ResilienceError::from(rejection))
}

/// An attempt the breaker admitted ([`CircuitBreakerMiddleware::admit_attempt`]), to be
/// run under its cut and ended with [`CircuitBreakerMiddleware::end_attempt`]. Dropped
/// instead (the attempt's future dropped), it counts what its cut says: see
/// [`CutAtDeadline`].
pub(crate) struct Admitted<'p>(Held<'p>);

impl Admitted<'_> {
    /// When the attempt is cut (`None`: never).
    pub(crate) fn cut(&self) -> Option<Instant> {
        self.0.cut()
    }

    /// The attempt's timeout clock, if it runs on one.
    pub(crate) fn clock(&self) -> Option<AttemptClock> {
        self.0.clock()
    }
}

/// How an admitted attempt holds its permit while it runs.
enum Held<'p> {
    /// No cut: a hedge loser dropped here frees its permit unrecorded, like any
    /// cancellation.
    Uncut(BreakerPermit<'p>),
    /// Under a cut: dropped past an attempt timeout, the guard counts the timeout.
    CutAt {
        /// Boxed: an attempt under no cut (the common case) does not carry it.
        guard: Box<CutAtDeadline<'p>>,
        /// The history's length before the attempt.
        recorded_before: usize,
    },
}

impl<'p> Held<'p> {
    /// Holds an admitted attempt's permit under its cut: the earlier of the request's
    /// [`Deadline`] and the retry middleware's attempt timeout.
    #[inline]
    fn under_cut(
        permit: BreakerPermit<'p>,
        scope: AttemptScope,
        extensions: &mut Extensions,
        composed: bool,
    ) -> Self {
        // Evidence left by an earlier attempt would otherwise be read as this one's when
        // no transport step runs inside (the composed stack always has one).
        if !composed {
            RequestRecord::clear_evidence(extensions);
        }
        let deadline = extensions.get::<Deadline>().map(|d| d.0);
        // Admitted: the attempt's timeout runs from here (a pause waited out is not in it).
        let clock = Inward::clock(extensions);
        if clock.is_none() && deadline.is_none() && scope.cut.is_none() {
            // Nothing cuts this attempt: no clock to read (the common case).
            return Held::Uncut(permit);
        }
        let now = Instant::now();
        if let Some(clock) = &clock {
            clock.restart(now);
        }
        let cut = match &clock {
            Some(clock) => clock.cut(),
            None => earlier(deadline, scope.cut),
        };
        // Without a clock, the scope's cut is the attempt's own only when it comes first.
        let timeout_cut = scope
            .cut
            .filter(|c| clock.is_none() && deadline.is_none_or(|d| *c < d));
        match cut {
            None if clock.is_none() => Held::Uncut(permit),
            // On a clock with no deadline, the cut is the clock's timeout (`None` only
            // once a gate inside stops it).
            cut => Held::CutAt {
                recorded_before: RequestRecord::attempts_recorded(extensions),
                guard: Box::new(CutAtDeadline {
                    permit: Some(permit),
                    deadline: cut.unwrap_or(now),
                    timeout_cut,
                    started: now,
                    lost: scope.lost,
                    clock,
                }),
            },
        }
    }

    /// When the attempt is cut (`None`: never).
    #[inline]
    fn cut(&self) -> Option<Instant> {
        match self {
            Held::Uncut(_) => None,
            Held::CutAt { guard, .. } => guard.cut(),
        }
    }

    /// The attempt's timeout clock, if it runs on one.
    #[inline]
    fn clock(&self) -> Option<AttemptClock> {
        match self {
            Held::Uncut(_) => None,
            Held::CutAt { guard, .. } => guard.clock.clone(),
        }
    }

    /// The attempt's result, and the permit to count it with (`None` when the cut
    /// counted it already, or it has nothing to count).
    #[inline]
    fn end(
        self,
        outcome: Result<reqwest_middleware::Result<Response>, Elapsed>,
        extensions: &mut Extensions,
        origin: &Origin,
    ) -> (
        reqwest_middleware::Result<Response>,
        Option<BreakerPermit<'p>>,
    ) {
        match (self, outcome) {
            (Held::Uncut(permit), Ok(result)) => (result, Some(permit)),
            (Held::CutAt { guard, .. }, Ok(result)) => (result, (*guard).disarm()),
            (held, Err(elapsed)) => {
                if let Held::CutAt {
                    guard,
                    recorded_before,
                } = held
                {
                    record_attempt_cut(extensions, origin, recorded_before, guard.started);
                    // Its drop counts an attempt timeout (and the proxy's success); a
                    // deadline's cut is neutral.
                    drop(guard);
                }
                (Err(reqwest_middleware::Error::middleware(elapsed)), None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::{BreakerConfig, BreakerState, TripPolicy};

    /// The retry's timer fired first and dropped the breaker's future (a race of two
    /// timers at one instant): the guard alone counts the cut, for the target a timeout
    /// and for the proxy the attempt went out through a success.
    #[tokio::test(start_paused = true)]
    async fn a_cut_dropped_from_outside_counts_the_target_timeout_and_the_proxy_success() {
        let policy = TripPolicy::failure_ratio(0.5, Duration::from_secs(60), 100);
        let registry = BreakerRegistry::new(BreakerConfig::default().policy(policy)).unwrap();
        let target = Origin::parse("http://api.example.test").unwrap();
        let proxy = Origin::parse("http://127.0.0.1:3128").unwrap();
        let now = Instant::now();
        let clock = AttemptClock::start(Duration::from_millis(300), None, now);
        clock.carried_by(&proxy);
        let guard = CutAtDeadline {
            permit: Some(registry.acquire(&target).unwrap()),
            deadline: clock.cut().unwrap(),
            timeout_cut: None,
            started: now,
            lost: None,
            clock: Some(clock),
        };
        tokio::time::advance(Duration::from_millis(300)).await;
        drop(guard);
        let window = |o: &Origin| {
            let snapshot = registry.snapshot();
            let s = snapshot.iter().find(|s| &s.origin == o)?;
            Some((s.state, s.window_attempts, s.window_failures))
        };
        assert_eq!(window(&target), Some((BreakerState::Closed, 1, 1)));
        assert_eq!(window(&proxy), Some((BreakerState::Closed, 1, 0)));
    }

    /// A cut before the timeout (the caller's deadline alone) counts nothing, for the
    /// target or the proxy.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_cut_counts_nothing_for_the_target_or_the_proxy() {
        let registry = BreakerRegistry::new(BreakerConfig::default()).unwrap();
        let target = Origin::parse("http://api.example.test").unwrap();
        let proxy = Origin::parse("http://127.0.0.1:3128").unwrap();
        let now = Instant::now();
        let deadline = now + Duration::from_millis(100);
        let clock = AttemptClock::start(Duration::from_millis(300), Some(deadline), now);
        clock.carried_by(&proxy);
        let guard = CutAtDeadline {
            permit: Some(registry.acquire(&target).unwrap()),
            deadline,
            timeout_cut: None,
            started: now,
            lost: None,
            clock: Some(clock),
        };
        tokio::time::advance(Duration::from_millis(100)).await;
        drop(guard);
        let seen = registry
            .snapshot()
            .iter()
            .map(|s| s.window_attempts)
            .sum::<u32>();
        assert_eq!(seen, 0);
    }
}
