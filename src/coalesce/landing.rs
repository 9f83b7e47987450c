//! What a flight lands with ([`Landing`]), and how each caller gets its own `Response`
//! from it.

use http::{Extensions, HeaderMap, StatusCode, Version};
use hyper::body::Bytes;
use reqwest::{Response, ResponseBuilderExt, Url};

use crate::record::{AttemptHistory, RequestEvidence, RetryOutcome, Shared, SharedRole};

/// How the leader's request ended, for its followers.
// One per flight, behind the `Arc` every follower holds: its size is paid once.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Landing {
    /// A response whose body was read whole: every caller gets a copy.
    Response(SharedResponse),
    /// The request failed; every follower gets the same failure (as text: a
    /// `reqwest::Error` cannot be cloned) and the request's evidence.
    Failed {
        error: String,
        record: Record,
        callers: u32,
    },
    /// The response could not be shared (no `Content-Length`, over the bound, the
    /// caller's own answer, or its body broke while it was read): each follower sends
    /// its own request.
    NotShared,
}

/// The leader's record of the request: what a follower's extensions get.
#[derive(Clone, Default)]
pub(crate) struct Record {
    evidence: Option<RequestEvidence>,
    history: Option<AttemptHistory>,
    outcome: Option<RetryOutcome>,
}

impl Record {
    /// What the stages inside left in the leader's extensions.
    pub(crate) fn of(extensions: &Extensions) -> Record {
        Record {
            evidence: RequestEvidence::of(extensions).cloned(),
            history: AttemptHistory::of(extensions).cloned(),
            outcome: RetryOutcome::of(extensions).cloned(),
        }
    }

    /// The origin the transport step recorded, for the metrics' label.
    pub(crate) fn origin(&self) -> Option<&crate::origin::Origin> {
        self.evidence.as_ref().and_then(|e| e.origin.as_ref())
    }

    /// Leaves the record in `extensions`, its history saying it was shared (a history
    /// is made when the stages inside left none).
    pub(crate) fn leave(&self, extensions: &mut Extensions, shared: Shared) {
        let record = crate::record::RequestRecord::get(extensions);
        if let Some(evidence) = &self.evidence {
            record.set_own_evidence(evidence.clone());
        }
        if let Some(outcome) = &self.outcome {
            record.outcome = Some(*outcome);
        }
        let mut history = self.history.clone().unwrap_or_default();
        if history.is_empty()
            && let Some(evidence) = &self.evidence
        {
            history.push(evidence.clone());
        }
        history.mark_shared(shared);
        record.history = Some(history);
    }
}

/// A response read whole, to be handed to each caller.
pub(crate) struct SharedResponse {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    url: Url,
    /// The response's extensions (the transport step's evidence among them).
    extensions: Extensions,
    body: Bytes,
    /// The leader's request record, for the followers' extensions.
    pub(crate) record: Record,
    callers: u32,
}

impl SharedResponse {
    pub(crate) fn new(
        head: http::response::Parts,
        url: Url,
        body: Bytes,
        record: Record,
        callers: u32,
    ) -> SharedResponse {
        SharedResponse {
            status: head.status,
            version: head.version,
            headers: head.headers,
            url,
            extensions: head.extensions,
            body,
            record,
            callers,
        }
    }

    /// How `role` shared this response.
    pub(crate) fn shared(&self, role: SharedRole) -> Shared {
        Shared {
            role,
            callers: self.callers,
        }
    }

    /// A caller's own copy: the same status, headers and body bytes (the body is not
    /// copied: `Bytes` is shared), its extensions with a history saying it was shared.
    pub(crate) fn response_for(&self, role: SharedRole) -> Response {
        let mut builder = http::Response::builder()
            .status(self.status)
            .version(self.version);
        if let Some(extensions) = builder.extensions_mut() {
            *extensions = self.extensions.clone();
        }
        if let Some(headers) = builder.headers_mut() {
            *headers = self.headers.clone();
        }
        let mut response = builder
            .url(self.url.clone())
            .body(reqwest::Body::from(self.body.clone()))
            .map(Response::from)
            .expect("the parts of a response that was received are valid");
        // Alone (no one joined), the response is what it was: nothing says "shared".
        if self.callers > 1 || role == SharedRole::Joined {
            self.record
                .leave(response.extensions_mut(), self.shared(role));
        }
        response
    }
}
