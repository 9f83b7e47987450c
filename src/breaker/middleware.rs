//! [`CircuitBreakerMiddleware`]: asks the origin's breaker before each attempt, counts the
//! attempt's outcome after it, and turns a `429`/`503` with `Retry-After` into a pause for
//! every caller of the registry.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{Extensions, StatusCode};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use tokio::time::Instant;

use super::config::PauseMode;
use super::policy::{AttemptClassifier, DefaultClassifier};
use super::registry::{BreakerPermit, BreakerRegistry, BreakerRejection};
use super::state::RejectReason;
use super::{Deadline, RetryIn};
use crate::evidence::{AttemptHistory, FailureKind, RequestEvidence, Transmission};
use crate::{Origin, ResilienceError};

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
///    [`AttemptHistory`]) and a [`RetryIn`]. While the origin is paused and the
///    [`PauseMode`] is `Wait`, it sleeps until the pause ends unless that passes the
///    request's [`Deadline`].
/// 2. It sends the attempt and reads the [`RequestEvidence`] the transport step left;
///    the [`AttemptClassifier`] turns it into an outcome for the breaker.
/// 3. A `429` or `503` whose evidence carries `Retry-After` pauses the origin for every
///    caller of the registry (clamped to [`max_pause`](super::BreakerConfig::max_pause)).
///
/// ```
/// use reqwest_middleware::ClientBuilder;
/// use reqwest_resilience::TransportEvidence;
/// use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, CircuitBreakerMiddleware};
///
/// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
/// let registry = BreakerRegistry::new(BreakerConfig::default())?;
/// // Clients built with clones of one registry share their breakers.
/// let client = ClientBuilder::new(reqwest::Client::new())
///     .with(CircuitBreakerMiddleware::new(registry.clone()))
///     .with(TransportEvidence::new())
///     .build();
/// # drop(client); Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Dropping the request future at any point leaves the breaker consistent: a HalfOpen
/// probe slot held by the dropped attempt is freed (the permit is an RAII guard), no
/// outcome is counted, and a wait for a pause holds nothing.
#[derive(Clone)]
pub struct CircuitBreakerMiddleware {
    registry: BreakerRegistry,
    classifier: Arc<dyn AttemptClassifier>,
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
        }
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
        // while servers keep extending the pause (and a deadline bounds that).
        loop {
            if let (RejectReason::Paused, Some(wait), PauseMode::Wait) = (
                rejection.reason,
                rejection.retry_in,
                self.registry.config().pause_mode,
            ) {
                let fits = extensions
                    .get::<Deadline>()
                    .is_none_or(|d| Instant::now() + wait <= d.0);
                if fits {
                    tokio::time::sleep(wait).await;
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

/// Leaves the rejection's evidence where the retry middleware and the caller look.
fn record_rejection(rejection: &BreakerRejection, extensions: &mut Extensions) {
    let kind = match rejection.reason {
        RejectReason::Paused => FailureKind::Paused,
        _ => FailureKind::BreakerOpen,
    };
    let history = extensions.get_or_insert_default::<AttemptHistory>();
    let attempt = u32::try_from(history.len())
        .unwrap_or(u32::MAX)
        .saturating_add(1);
    let mut evidence =
        RequestEvidence::rejected_locally(kind, Some(rejection.origin.clone()), attempt);
    // The retry middleware also reads a rejection's "retry in" from here.
    evidence.retry_after = rejection.retry_in;
    history.push(evidence.clone());
    extensions.insert(evidence);
    if let Some(retry_in) = rejection.retry_in {
        extensions.insert(RetryIn(retry_in));
    }
}

/// The pause a server asked for: `Retry-After` on a 429 or 503.
fn server_pause(
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

#[async_trait::async_trait]
impl Middleware for CircuitBreakerMiddleware {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        // A "retry in" from an earlier attempt must not be read as this one's.
        extensions.remove::<RetryIn>();
        let Some(origin) = Origin::cached(req.url()) else {
            // No origin, no breaker: reqwest will reject the URL itself.
            return next.run(req, extensions).await;
        };
        let admitted = match self.registry.acquire(&origin) {
            Ok(permit) => Ok(permit),
            // Boxed: rare, and its sleep would otherwise enlarge every request's future.
            Err(first) => Box::pin(self.admit_after(&origin, extensions, first)).await,
        };
        let permit = match admitted {
            Ok(permit) => permit,
            Err(rejection) => {
                record_rejection(&rejection, extensions);
                return Err(reqwest_middleware::Error::middleware(
                    ResilienceError::from(rejection),
                ));
            }
        };
        // Evidence left by an earlier attempt would otherwise be read as this one's when
        // no transport step runs inside.
        extensions.remove::<RequestEvidence>();
        let result = next.run(req, extensions).await;
        let evidence = extensions.get::<RequestEvidence>();
        let outcome = self.classifier.classify(evidence, &result);
        permit.record_with_pause(outcome, server_pause(evidence, &result));
        result
    }
}
