//! One attempt through the composed stack's stages inside the retry loop, as one
//! function: the breaker's admission, the attempt under its cut, the breaker's record.
//!
//! The breaker and the transport step are hooks here, not futures nested in each other:
//! [`CircuitBreakerMiddleware::admit_attempt`] before the attempt and
//! [`end_attempt`](CircuitBreakerMiddleware::end_attempt) after it,
//! [`TransportEvidence::send`] and [`conclude`](TransportEvidence::conclude) around the
//! call of the rest of the client's chain. The same hooks make those middlewares used
//! alone. The stages that may wait for their own reasons between the two (the rate limit,
//! the concurrency limit, `BearerAuth` and its replay after a `401`) stay nested stages,
//! run between the hooks when the stack has one of them.
//!
//! # Cancel safety
//!
//! As the breaker's and the transport step's: dropped before its admission, the attempt
//! took nothing; dropped while it runs, the breaker's permit counts what its cut says
//! (see `breaker::middleware::CutAtDeadline`) and the transport step records nothing.

use std::future::Future;

use http::Extensions;
use reqwest::Response;

use crate::breaker::CircuitBreakerMiddleware;
use crate::evidence::TransportEvidence;
use crate::record::RetryIn;
use crate::stage::{CutAt, HandedRequest, Handover, Nested, RestOfStack, Stage};

/// The stages of one attempt, from the breaker inward, over `inner` (the rest of the
/// client's chain, or a proxy of the pool): what the retry loop runs for each attempt.
/// Cloned per attempt: references, and the inside's handle.
pub(crate) struct ComposedAttempt<'s, R, L, B, N> {
    pub(crate) breaker: Option<&'s CircuitBreakerMiddleware>,
    pub(crate) rate: &'s R,
    pub(crate) limit: &'s L,
    pub(crate) bearer: &'s B,
    /// `None` when a user's per-attempt middleware runs between `BearerAuth` and the
    /// transport step: then the transport step is a middleware of its own after them.
    pub(crate) transport: &'s Option<TransportEvidence>,
    pub(crate) inner: N,
}

impl<R, L, B, N: Clone> Clone for ComposedAttempt<'_, R, L, B, N> {
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

impl<'s, R: Stage, L: Stage, B: Stage, N: RestOfStack + 's> ComposedAttempt<'s, R, L, B, N> {
    /// The transport step, when it runs right over the inside: no stage between them and
    /// no upload for it to open (which it opens under the breaker's cut as a stage).
    fn transport_only(&self, req: &reqwest::Request, extensions: &Extensions) -> bool {
        !self.rate.present()
            && !self.limit.present()
            && !self.bearer.present()
            && crate::upload::to_open(req, extensions).is_none()
    }
}

impl<'s, R: Stage, L: Stage, B: Stage, N: RestOfStack + 's> RestOfStack
    for ComposedAttempt<'s, R, L, B, N>
{
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
            if self.breaker.is_some() {
                // A "retry in" from an earlier attempt must not be read as this one's.
                RetryIn::remove_from(extensions);
            }
            // No origin, no breaker: reqwest will reject the URL itself.
            let origin = self.breaker.and_then(|_| handover.origin(req.url()));
            let admitted = match (self.breaker, &origin) {
                (Some(breaker), Some(origin)) => {
                    Some(breaker.admit_attempt(origin, extensions, true).await?)
                }
                _ => None,
            };
            let clock = admitted.as_ref().and_then(|a| a.clock());
            let timer = admitted
                .as_ref()
                .and_then(|a| crate::stage::cut_timer(a.cut(), clock.as_ref()));
            // Each attempt's future made where its cut keeps it, pinned there (`CutAt`).
            let outcome = match self.transport {
                Some(transport) if self.transport_only(&req, extensions) => {
                    let (begun, sent) = transport.send(req, &mut *extensions, handover, self.inner);
                    let watched = {
                        let cut = std::pin::pin!(CutAt {
                            inner: sent,
                            timer,
                            clock
                        });
                        cut.await
                    };
                    watched.map(|watched| transport.conclude(begun, watched, extensions))
                }
                _ => {
                    let inner = Nested::new(self.transport, self.inner);
                    let inner = Nested::new(self.bearer, inner);
                    let inner = Nested::new(self.limit, inner);
                    let inner = Nested::new(self.rate, inner);
                    let cut = std::pin::pin!(CutAt {
                        inner: inner.run(req, extensions, handover),
                        timer,
                        clock
                    });
                    cut.await
                }
            };
            match (self.breaker, admitted, &origin) {
                (Some(breaker), Some(admitted), Some(origin)) => {
                    breaker.end_attempt(admitted, outcome, extensions, origin)
                }
                // Nothing cut it: there was no timer.
                _ => outcome
                    .unwrap_or_else(|elapsed| Err(reqwest_middleware::Error::middleware(elapsed))),
            }
        }
    }
}
