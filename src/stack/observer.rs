//! The observer, outermost: the span of each logical request (feature `tracing`) and the
//! [`on_attempt`](super::Resilience::on_attempt) hook, both fed from the request's
//! attempt history when it ends.

use std::sync::Arc;

use http::Extensions;
use reqwest::Response;

use crate::record::{AttemptDecision, AttemptHistory, RequestEvidence};
use crate::stage::{HandedRequest, Handover, RestOfStack, Stage, standalone_middleware};

/// The [`on_attempt`](super::Resilience::on_attempt) hook, as the builder keeps it and the
/// observer calls it.
pub(super) type AttemptHook = Arc<dyn Fn(&RequestEvidence, Option<&AttemptDecision>) + Send + Sync>;

/// The outermost layer: the span per logical request (feature `tracing`) and the
/// `on_attempt` hook. Installed only when one of them is wanted.
#[derive(Clone)]
pub(crate) struct RequestObserver {
    on_attempt: Option<AttemptHook>,
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    span_url_query: bool,
}

impl RequestObserver {
    pub(super) fn new(on_attempt: Option<AttemptHook>, span_url_query: bool) -> Option<Self> {
        if cfg!(feature = "tracing") || on_attempt.is_some() {
            Some(RequestObserver {
                on_attempt,
                span_url_query,
            })
        } else {
            None
        }
    }
}

standalone_middleware!(RequestObserver);

impl Stage for RequestObserver {
    #[allow(clippy::manual_async_fn)]
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        async move {
            let owner = handover.enter_unchecked(extensions);
            // Extensions reused across calls keep older attempts: report only this call's.
            let before = AttemptHistory::of(extensions)
                .map_or(0, AttemptHistory::len)
                // A later pass of an operation or a resumed body: the earlier passes'
                // records were reported with them.
                .max(crate::retry::continuation_recorded(extensions));

            #[cfg(feature = "tracing")]
            let span = observe::request_span(&req, self.span_url_query);
            #[cfg(feature = "tracing")]
            let result = {
                use tracing::Instrument;
                owner
                    .poll_as(next, |next| next.run(req, extensions, handover))
                    .instrument(span.clone())
                    .await
            };
            #[cfg(not(feature = "tracing"))]
            let result = owner
                .poll_as(next, |next| next.run(req, extensions, handover))
                .await;

            let attempts = AttemptHistory::of(extensions)
                .map_or(&[][..], |h| h.attempts().get(before..).unwrap_or(&[]));
            if let Some(hook) = &self.on_attempt {
                for record in attempts {
                    hook(&record.evidence, record.decision.as_ref());
                }
            }
            #[cfg(feature = "tracing")]
            observe::record_outcome(&span, attempts, &result);
            result
        }
    }
}

/// The `tracing` side: OpenTelemetry HTTP client field names where they exist.
#[cfg(feature = "tracing")]
mod observe {
    use reqwest::{Request, Response};
    use tracing::field::Empty;

    use crate::error::ResilienceError;
    use crate::origin::Origin;
    use crate::record::{AttemptDecision, AttemptRecord, RetryReason, StopReason};

    /// The span of the logical call. Its kind is `internal`: it encloses every attempt
    /// (and the waits between them), while OpenTelemetry's HTTP conventions give each
    /// request on the wire a `client` span of its own (reqwest-tracing's, installed per
    /// attempt). A `client` span here would nest `client` spans in a `client` span, which
    /// exporters then read as a call made from inside another call.
    pub(super) fn request_span(req: &Request, keep_query: bool) -> tracing::Span {
        let url = req.url();
        let span = tracing::info_span!(
            target: "reqwest_resilience::stack",
            "http.client.request",
            otel.name = %req.method(),
            otel.kind = "internal",
            http.request.method = %req.method(),
            url.full = Empty,
            url.scheme = url.scheme(),
            server.address = url.host_str().unwrap_or(""),
            server.port = url.port_or_known_default().unwrap_or(0),
            http.response.status_code = Empty,
            http.request.resend_count = Empty,
            error.type = Empty,
            resilience.attempts = Empty,
            resilience.stop = Empty,
        );
        if !span.is_disabled() {
            // Formatted only for a subscriber that records the span.
            span.record("url.full", redacted(url, keep_query).as_str());
        }
        span
    }

    /// `url` as `url.full` may show it: user name and password replaced by `REDACTED`
    /// (OpenTelemetry's rule), no fragment (it is never sent, and may carry a token), and
    /// unless `keep_query` the query redacted by [`redacted_query`].
    pub(super) fn redacted(url: &url::Url, keep_query: bool) -> url::Url {
        let mut url = url.clone();
        url.set_fragment(None);
        if !url.username().is_empty() {
            let _ = url.set_username("REDACTED");
        }
        if url.password().is_some() {
            let _ = url.set_password(Some("REDACTED"));
        }
        if !keep_query && let Some(query) = url.query().filter(|q| !q.is_empty()) {
            let query = redacted_query(query);
            url.set_query(Some(&query));
        }
        url
    }

    /// The query with every value `REDACTED`: of each `&`-separated component, only the
    /// key of a `key=value` pair is kept, and only when it reads as a name (at most 64
    /// ASCII letters, digits, `-`, `_`, `.`, `[`, `]`). A component without `=` is a
    /// value (`?sk_live_51Hx…`, a key passed as the whole query) and so is a key that
    /// does not read as a name: either becomes `REDACTED` whole. Empty components go.
    pub(super) fn redacted_query(query: &str) -> String {
        let is_name = |key: &str| {
            !key.is_empty()
                && key.len() <= 64
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.[]".contains(&b))
        };
        let mut out = String::with_capacity(query.len());
        for component in query.split('&').filter(|c| !c.is_empty()) {
            if !out.is_empty() {
                out.push('&');
            }
            match component.split_once('=') {
                Some((key, _)) if is_name(key) => {
                    out.push_str(key);
                    out.push_str("=REDACTED");
                }
                _ => out.push_str("REDACTED"),
            }
        }
        out
    }

    /// A decision as one event field ("retry: …" / "stop: …"), formatted only when a
    /// subscriber records it.
    enum DecisionField {
        Retry(RetryReason),
        Stop(StopReason),
        Superseded(u32),
    }

    impl std::fmt::Display for DecisionField {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                DecisionField::Retry(reason) => write!(f, "retry: {reason}"),
                DecisionField::Stop(reason) => write!(f, "stop: {reason}"),
                DecisionField::Superseded(by) => write!(f, "superseded by attempt {by}"),
            }
        }
    }

    /// One event per attempt (in order, with its decision), then the span's outcome.
    pub(super) fn record_outcome(
        span: &tracing::Span,
        attempts: &[AttemptRecord],
        result: &reqwest_middleware::Result<Response>,
    ) {
        if span.is_disabled() {
            // No subscriber wants the span: spend nothing on its fields or the events.
            return;
        }
        let _entered = span.enter();
        for record in attempts {
            let e = &record.evidence;
            let (decision, delay_ms) = match &record.decision {
                Some(AttemptDecision::Retry { delay, reason }) => (
                    Some(DecisionField::Retry(*reason)),
                    Some(delay.as_millis() as u64),
                ),
                Some(AttemptDecision::Stop { reason }) => {
                    (Some(DecisionField::Stop(*reason)), None)
                }
                Some(AttemptDecision::Superseded { by }) => {
                    (Some(DecisionField::Superseded(*by)), None)
                }
                None => (None, None),
            };
            tracing::event!(
                target: "reqwest_resilience::stack",
                tracing::Level::DEBUG,
                http.request.resend_count = e.attempt.saturating_sub(1),
                server.address = e.origin.as_ref().map(Origin::host),
                http.response.status_code = e.status().map(|s| s.as_u16()),
                error.type = e.failure.map(tracing::field::debug),
                resilience.transmission = ?e.transmission,
                resilience.elapsed_ms = e.elapsed.as_millis() as u64,
                resilience.decision = decision.map(tracing::field::display),
                resilience.delay_ms = delay_ms,
                "attempt"
            );
        }
        let count = attempts.len() as u64;
        span.record("resilience.attempts", count);
        span.record("http.request.resend_count", count.saturating_sub(1));
        if let Some(AttemptDecision::Stop { reason }) =
            attempts.last().and_then(|r| r.decision.as_ref())
        {
            span.record("resilience.stop", tracing::field::display(reason));
        }
        match result {
            Ok(response) => {
                let status = response.status();
                span.record("http.response.status_code", status.as_u16());
                if status.is_client_error() || status.is_server_error() {
                    span.record("error.type", status.as_str());
                }
            }
            Err(err) => {
                let kind = attempts.last().and_then(|r| r.evidence.failure);
                match (kind, ResilienceError::from_middleware_error(err)) {
                    (Some(kind), _) => span.record("error.type", tracing::field::debug(kind)),
                    (None, Some(_)) => span.record("error.type", "ResilienceError"),
                    (None, None) => span.record("error.type", "_OTHER"),
                };
            }
        }
    }
}
