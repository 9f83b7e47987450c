//! [`RateLimit`]: takes a slot from the origin's rate before each attempt, and teaches the
//! rate what the answer's rate-limit fields said.

use crate::stage::{HandedRequest, Handover, RestOfStack, Stage, standalone_middleware};
use http::Extensions;
use reqwest::Response;

use super::registry::{Admission, RateLimitRegistry, RateRejection, Ticket, Waiting};
use crate::error::ResilienceError;
use crate::origin::Origin;
use crate::record::{Deadline, FailureKind, Inward, record_rejected_locally};

/// A per-origin rate limit, from a shared [`RateLimitRegistry`].
///
/// Register it inside the circuit breaker (an open breaker turns a request away before
/// it spends a slot) and outside the concurrency limit, `BearerAuth` and
/// [`TransportEvidence`](crate::TransportEvidence) (a request waiting for its slot holds
/// no concurrency permit); [`Resilience::rate_limit`](crate::Resilience::rate_limit) puts
/// it there. Per attempt:
///
/// 1. It takes a slot from the origin's rate. When the next free slot is later, the
///    request waits for it, up to [`max_wait`](super::RateLimitConfig::max_wait) and its
///    [`Deadline`]; a slot beyond both turns it away at once, without touching the
///    network, with [`ResilienceError::RateLimited`] (the origin, and when its next slot
///    is free) and a `NotSent` [`RequestEvidence`](crate::RequestEvidence) with
///    [`FailureKind::RateLimited`] in the extensions (also appended to the
///    [`AttemptHistory`](crate::AttemptHistory)).
/// 2. It sends the attempt and hands the answer's header fields to the origin's rate
///    ([`learn`](super::RateLimitConfig::learn)): a quota paces the next requests, an
///    allowance running out holds them until the reset, so the client slows down before
///    the server has to answer `429`. An answer that reqwest got from another origin
///    after a redirect teaches this origin nothing (its fields are the other's quota).
///
/// Each retry and each hedge takes a slot of its own: the server counts every request.
/// The retry middleware does not retry a rejection (waiting for a slot is this
/// middleware's job, within the same deadline); a circuit breaker outside counts it as
/// neutral. A wait here stops the retry middleware's attempt-timeout clock, which starts
/// again when the request leaves.
///
/// ```
/// use reqwest_middleware::ClientBuilder;
/// use reqwest_resilience::TransportEvidence;
/// use reqwest_resilience::rate::{Rate, RateLimit, RateLimitConfig, RateLimitRegistry};
/// use reqwest_resilience::redirect::{self, ClientRedirects};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let registry = RateLimitRegistry::new(RateLimitConfig::default().rate(Rate::per_second(10)))?;
/// let recorded = redirect::recorded(reqwest::redirect::Policy::default()); // every hop seen
/// let client = ClientBuilder::new(reqwest::Client::builder().redirect(recorded).build()?)
///     .with(RateLimit::new(registry.clone()))
///     .with(TransportEvidence::with_client_redirects(ClientRedirects::Recorded))
///     .build();
/// # drop(client); Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Dropping the request future while it waits gives back the slot it took ahead (unless
/// a later request took one since: then the slot stays spent, and the origin sees one
/// request fewer, never more) and, for an origin's first request (the probe), its turn
/// to the next request. Dropped after it left, the slot was used: the server may have
/// counted it.
#[derive(Clone, Debug)]
pub struct RateLimit {
    registry: RateLimitRegistry,
}

impl RateLimit {
    /// A middleware using `registry`'s rates.
    pub fn new(registry: RateLimitRegistry) -> Self {
        RateLimit { registry }
    }

    /// The registry whose rates this middleware uses.
    pub fn registry(&self) -> &RateLimitRegistry {
        &self.registry
    }
}

/// How [`Resilience`](crate::Resilience) was asked for a rate limit.
pub(crate) enum RateChoice {
    Config(super::RateLimitConfig),
    Registry(RateLimitRegistry),
}

impl RateChoice {
    pub(crate) fn build(self) -> Result<RateLimit, ResilienceError> {
        Ok(RateLimit::new(match self {
            RateChoice::Config(config) => RateLimitRegistry::new(config)?,
            RateChoice::Registry(registry) => registry,
        }))
    }
}

/// Leaves the rejection's `NotSent` evidence and builds its error.
fn rejected(rejection: RateRejection, extensions: &mut Extensions) -> reqwest_middleware::Error {
    record_rejected_locally(
        extensions,
        FailureKind::RateLimited,
        Some(rejection.origin.clone()),
        Some(rejection.retry_in),
    );
    reqwest_middleware::Error::middleware(ResilienceError::from(rejection))
}

standalone_middleware!(RateLimit);

/// Teaches `origin`'s rate what the attempt's answer said (an error teaches nothing; the
/// ticket's drop still ends a probe).
pub(crate) fn learn(
    ticket: Ticket,
    origin: &Origin,
    result: &reqwest_middleware::Result<Response>,
) {
    if let Ok(response) = result {
        // After a redirect to another origin the fields are that origin's quota, not this
        // one's: the answer teaches nothing (it still ends a probe).
        if origin.is_origin_of_url(response.url()) {
            ticket.learn(response.headers());
        } else {
            ticket.learn(&http::HeaderMap::new());
        }
    }
}

impl RateLimit {
    /// The registry's verdict now, under the request's deadline: a ticket, a wait (boxed:
    /// rare), or the rejection's error (its `NotSent` evidence left in `extensions`).
    pub(crate) fn admit_now(
        &self,
        origin: &Origin,
        extensions: &mut Extensions,
    ) -> reqwest_middleware::Result<Result<Ticket, Box<Waiting>>> {
        let deadline = extensions.get::<Deadline>().map(|d| d.0);
        match self.registry.admit(origin, deadline) {
            Admission::Go(ticket) => Ok(Ok(ticket)),
            Admission::Wait(waiting) => Ok(Err(Box::new(waiting))),
            Admission::Rejected(rejection) => Err(rejected(rejection, extensions)),
        }
    }

    /// Waits for a slot. A wait is not part of the attempt: its timeout clock stops, and
    /// starts on leaving.
    pub(crate) async fn wait_for_slot(
        &self,
        origin: &Origin,
        waiting: Waiting,
        extensions: &mut Extensions,
    ) -> reqwest_middleware::Result<Ticket> {
        let clock = Inward::clock(extensions);
        if let Some(clock) = &clock {
            clock.stop();
        }
        let waited = self.registry.wait(origin, waiting).await;
        if let Some(clock) = &clock {
            clock.restart(tokio::time::Instant::now());
        }
        waited.map_err(|rejection| rejected(rejection, extensions))
    }
}

impl Stage for RateLimit {
    #[allow(clippy::manual_async_fn)]
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        async move {
            let owner = handover.enter(extensions, "RateLimit", false, req.url())?;
            let Some(origin) = handover.origin(req.url()) else {
                // No origin, no rate: reqwest will reject the URL itself.
                return owner
                    .poll_as(next, |next| next.run(req, extensions, handover))
                    .await;
            };
            // What is kept across the rare wait is a pointer, not the registry's whole
            // verdict, so the attempt's future stays small (stage cost rule 6).
            let ticket = match self.admit_now(&origin, extensions)? {
                Ok(ticket) => ticket,
                // Rare: the wait for a slot (boxed: stage cost rule 2).
                Err(waiting) => Box::pin(self.wait_for_slot(&origin, *waiting, extensions)).await?,
            };
            let result = owner
                .poll_as(next, |next| next.run(req, extensions, handover))
                .await;
            learn(ticket, &origin, &result);
            result
        }
    }
}
