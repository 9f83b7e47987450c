//! [`TransportEvidence`]: the innermost middleware, which observes each attempt.

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use super::{AttemptHistory, RequestEvidence, Transmission, classify_error, next_attempt};
use crate::{Origin, ResilienceError};

/// The transport step: register it last (innermost), right before the `reqwest::Client`.
///
/// For every attempt it writes a [`RequestEvidence`] into the extensions it is handed
/// (so the middlewares outside it read it after `next.run`), into the response's own
/// extensions, and appends it to the [`AttemptHistory`] in the caller's extensions.
/// What the evidence says for each kind of failure, and why, is documented with
/// [`classify_error`](super::classify_error).
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
/// `.retry(reqwest::retry::never())` to make every request on the wire an attempt of its own.
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
///
/// let client = ClientBuilder::new(reqwest::Client::new())
///     .with(TransportEvidence::new())
///     .build();
/// # drop(client);
/// ```
#[derive(Debug, Clone, Default)]
pub struct TransportEvidence {
    _private: (),
}

impl TransportEvidence {
    /// A transport step.
    pub fn new() -> Self {
        TransportEvidence { _private: () }
    }
}

#[async_trait::async_trait]
impl Middleware for TransportEvidence {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        if let Some(m) = crate::misconfig::check(extensions, "TransportEvidence", None) {
            return Err(crate::misconfig::refuse(extensions, m, req.url()));
        }
        let (origin, attempt, started, method, sent) = hand_on(req, extensions, next);
        let result = sent.await;
        if let Err(e) = &result
            && let Some(ResilienceError::Misconfigured(_)) =
                ResilienceError::from_middleware_error(e)
        {
            // A middleware of this crate inside refused the request unsent and left its
            // evidence: that is this attempt's.
            return result;
        }
        let mut evidence = match &result {
            Ok(response) => RequestEvidence::of_response(response, origin, attempt),
            Err(reqwest_middleware::Error::Reqwest(err)) => {
                let c = classify_error(err);
                let mut e = RequestEvidence::new(c.transmission, origin, attempt);
                e.failure = Some(c.kind);
                e.not_processed = c.not_processed;
                e
            }
            // A middleware between this one and the client failed: nothing proves the
            // request stayed local.
            Err(reqwest_middleware::Error::Middleware(_)) => {
                let mut e = RequestEvidence::new(Transmission::Unknown, origin, attempt);
                e.failure = Some(super::FailureKind::Other);
                e
            }
        };
        evidence.elapsed = started.elapsed();
        crate::metrics::attempt(method, &evidence);
        #[cfg(feature = "tracing")]
        // OpenTelemetry HTTP client names where one exists (`resend_count`: the retries
        // before this attempt, 0 for the first; `error.type`: the failure kind).
        tracing::debug!(
            server.address = evidence.origin.as_ref().map(Origin::host),
            server.port = evidence.origin.as_ref().map(Origin::port),
            http.request.resend_count = evidence.attempt.saturating_sub(1),
            http.response.status_code = evidence.status().map(|s| s.as_u16()),
            error.type = evidence.failure.map(tracing::field::debug),
            transmission = ?evidence.transmission,
            not_processed = ?evidence.not_processed,
            elapsed = ?evidence.elapsed,
            "attempt observed"
        );
        let history = extensions.get_or_insert_default::<AttemptHistory>();
        history.push(evidence.clone());
        // After a retry or a `401` replay the response carries a copy of the history (the
        // retry's last decision comes with its `RetryOutcome`); a single record needs no
        // copy: `AttemptHistory::of_response` rebuilds it from the evidence.
        let full = (history.len() > 1).then(|| history.clone());
        let result = result.map(|mut response| {
            response.extensions_mut().insert(evidence.clone());
            if let Some(full) = full {
                response.extensions_mut().insert(full);
            }
            response
        });
        extensions.insert(evidence);
        result
    }
}

/// The rest of the stack's answer to one attempt, as `Next::run` returns it.
type Attempt<'a> =
    std::pin::Pin<Box<dyn Future<Output = reqwest_middleware::Result<Response>> + Send + 'a>>;

/// Takes what the evidence needs from the request and hands it on. Synchronous on
/// purpose: a request borrowed inside `handle` keeps a second 264-byte copy of it in the
/// future, which every request copies into its box.
fn hand_on<'a>(
    req: Request,
    extensions: &'a mut Extensions,
    next: Next<'a>,
) -> (
    Option<Origin>,
    u32,
    tokio::time::Instant,
    crate::metrics::MethodLabel,
    crate::misconfig::Scoped<Attempt<'a>>,
) {
    let origin = Origin::cached(req.url());
    let attempt = next_attempt(extensions.get::<AttemptHistory>().map_or(0, |h| h.len()));
    let started = tokio::time::Instant::now();
    let method = crate::metrics::method_label(req.method());
    let key = crate::misconfig::key(extensions);
    let sent = crate::misconfig::scoped(
        next.run(req, extensions),
        crate::misconfig::Layer::Transport,
        key,
    );
    (origin, attempt, started, method, sent)
}
