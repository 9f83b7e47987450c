//! One attempt through the composed stack's stages inside the retry loop, as one
//! function: the breaker's admission, the rate limit's, the attempt under its cut, what
//! the rate limit learns from the answer, the breaker's record.
//!
//! The breaker, the rate limit and the transport step are hooks here, not futures nested
//! in each other: [`CircuitBreakerMiddleware::admit_attempt`] before the attempt and
//! [`end_attempt`](CircuitBreakerMiddleware::end_attempt) after it, the rate limit's
//! admission (a ticket at once; on the rare path a wait for a slot, under the attempt's
//! cut) and its learning from the answer's fields, [`TransportEvidence::send`] and
//! [`conclude`](TransportEvidence::conclude) around the call of the rest of the client's
//! chain. The same hooks make those middlewares used alone. The concurrency limit (which
//! holds its permit until the response body ends) and `BearerAuth` (which may replay the
//! request after a `401`) stay nested stages, run between the hooks when the stack has
//! one of them.
//!
//! # Cancel safety
//!
//! As the breaker's, the rate limit's and the transport step's: dropped before its
//! admissions, the attempt took nothing; dropped while it waits for a slot, the rate
//! limit's wait ends (a probe's ticket ends its probe); dropped while it runs, the
//! breaker's permit counts what its cut says (see `breaker::middleware::CutAtDeadline`)
//! and the transport step records nothing.

use std::future::Future;

use http::Extensions;
use reqwest::Response;
use tokio::time::error::Elapsed;

use crate::breaker::{Admitted, CircuitBreakerMiddleware};
use crate::evidence::TransportEvidence;
use crate::origin::Origin;
use crate::rate::{RateLimit, Ticket, Waiting};
use crate::record::{AttemptClock, RetryIn};
use crate::stage::{CutAt, CutTimer, HandedRequest, Handover, Nested, RestOfStack, Stage};

/// The stages of one attempt, from the breaker inward, over `inner` (the rest of the
/// client's chain, or a proxy of the pool): what the retry loop runs for each attempt.
/// Cloned per attempt: references, and the inside's handle.
pub(crate) struct ComposedAttempt<'s, L, B, N> {
    pub(crate) breaker: Option<&'s CircuitBreakerMiddleware>,
    pub(crate) rate: Option<&'s RateLimit>,
    pub(crate) limit: &'s L,
    pub(crate) bearer: &'s B,
    /// `None` when a user's per-attempt middleware runs between `BearerAuth` and the
    /// transport step: then the transport step is a middleware of its own after them.
    pub(crate) transport: &'s Option<TransportEvidence>,
    pub(crate) inner: N,
}

impl<L, B, N: Clone> Clone for ComposedAttempt<'_, L, B, N> {
    fn clone(&self) -> Self {
        ComposedAttempt {
            breaker: self.breaker,
            rate: self.rate,
            limit: self.limit,
            bearer: self.bearer,
            transport: self.transport,
            inner: self.inner.clone(),
        }
    }
}

impl<'s, L: Stage, B: Stage, N: RestOfStack + 's> ComposedAttempt<'s, L, B, N> {
    /// The transport step, when it runs right over the inside: no stage between them and
    /// no upload for it to open (which it opens under the breaker's cut as a stage).
    fn transport_only(&self, req: &reqwest::Request, extensions: &Extensions) -> bool {
        !self.limit.present()
            && !self.bearer.present()
            && crate::upload::to_open(req, extensions).is_none()
    }
}

impl<'s, L: Stage, B: Stage, N: RestOfStack + 's> RestOfStack for ComposedAttempt<'s, L, B, N> {
    // An `async move` block, not an `async fn`, which would keep its arguments twice.
    #[allow(clippy::manual_async_fn)]
    fn run<'a>(
        self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a
    where
        Self: 'a,
    {
        async move {
            let breaker = self.breaker;
            if breaker.is_some() {
                // A "retry in" from an earlier attempt must not be read as this one's.
                RetryIn::remove_from(extensions);
            }
            // No origin, no breaker and no rate: reqwest will reject the URL itself.
            let origin = (breaker.is_some() || self.rate.is_some())
                .then(|| handover.origin(req.url()))
                .flatten();
            let admitted = match (breaker, &origin) {
                (Some(breaker), Some(origin)) => {
                    Some(breaker.admit_attempt(origin, extensions, true).await?)
                }
                _ => None,
            };
            let clock = admitted.as_ref().and_then(|a| a.clock());
            let mut timer = admitted
                .as_ref()
                .and_then(|a| crate::stage::cut_timer(a.cut(), clock.as_ref()));
            // The rate limit's admission: a ticket at once, or (rare) after a wait under
            // the attempt's cut.
            let ticket = match self.rate.zip(origin.as_ref()) {
                None => None,
                Some((rate, at)) => match rate.admit_now(at, extensions) {
                    Ok(Ok(ticket)) => Some(ticket),
                    // Boxed: only a wait carries it.
                    Ok(Err(waiting)) => {
                        let wait =
                            wait_for_slot(rate, at, *waiting, extensions, &mut timer, &clock);
                        match Box::pin(wait).await {
                            Ok(ticket) => Some(ticket),
                            Err(ended) => {
                                return end(breaker, admitted, ended, extensions, &origin);
                            }
                        }
                    }
                    Err(rejected) => {
                        return end(breaker, admitted, Ok(Err(rejected)), extensions, &origin);
                    }
                },
            };
            // Each attempt's future made where its cut keeps it, pinned there (`CutAt`).
            let transport_only = self.transport_only(&req, extensions);
            let outcome = match self.transport {
                Some(transport) if transport_only => {
                    let (begun, sent) = transport.send(req, &mut *extensions, handover, self.inner);
                    let watched = std::pin::pin!(CutAt::by(sent, timer, clock)).await;
                    watched.map(|watched| transport.conclude(begun, watched, extensions))
                }
                _ => {
                    let inner = Nested::new(self.transport, self.inner);
                    let inner = Nested::new(self.bearer, inner);
                    let inner = Nested::new(self.limit, inner);
                    let sent = inner.run(req, extensions, handover);
                    std::pin::pin!(CutAt::by(sent, timer, clock)).await
                }
            };
            if let (Some(ticket), Some(at), Ok(result)) = (ticket, &origin, &outcome) {
                crate::rate::learn(ticket, at, result);
            }
            end(breaker, admitted, outcome, extensions, &origin)
        }
    }
}

/// The wait of an attempt for a slot of `origin`'s `rate`, under the attempt's cut (its
/// `timer`, handed back for the attempt's own, and its `clock`): the ticket, or how the
/// attempt ended (the rate's rejection, or the cut).
async fn wait_for_slot(
    rate: &RateLimit,
    origin: &Origin,
    waiting: Waiting,
    extensions: &mut Extensions,
    timer: &mut Option<CutTimer>,
    clock: &Option<AttemptClock>,
) -> Result<Ticket, Ended> {
    let wait = rate.wait_for_slot(origin, waiting, extensions);
    let mut cut = std::pin::pin!(CutAt::by(wait, timer.take(), clock.clone()));
    let waited = cut.as_mut().await;
    *timer = cut.as_mut().project().timer.take();
    match waited {
        Ok(Ok(ticket)) => Ok(ticket),
        Ok(Err(rejected)) => Err(Ok(Err(rejected))),
        Err(elapsed) => Err(Err(elapsed)),
    }
}

/// How an attempt ended: its result, or its cut.
type Ended = Result<reqwest_middleware::Result<Response>, Elapsed>;

/// The attempt's end: the `breaker`'s record of its outcome (`admitted` by it for
/// `origin`), or the outcome as it is.
#[inline]
fn end(
    breaker: Option<&CircuitBreakerMiddleware>,
    admitted: Option<Admitted<'_>>,
    outcome: Ended,
    extensions: &mut Extensions,
    origin: &Option<Origin>,
) -> reqwest_middleware::Result<Response> {
    match (breaker, admitted, origin) {
        (Some(breaker), Some(admitted), Some(origin)) => {
            breaker.end_attempt(admitted, outcome, extensions, origin)
        }
        // Nothing cut it: there was no timer.
        _ => outcome.unwrap_or_else(|elapsed| Err(reqwest_middleware::Error::middleware(elapsed))),
    }
}
