//! Downloads that resume where they broke ([`Resilience::resume_bodies`](crate::Resilience::resume_bodies)):
//! a `GET` whose response body breaks mid-stream continues with `Range: bytes=N-` and
//! `If-Range`, and the caller's `bytes()`, `chunk()` or `bytes_stream()` sees one
//! unbroken body.
//!
//! Layer: above the stages (it drives the retry policy and re-sends through them), below
//! [`crate::stack`], which installs it.
//!
//! - **When.** Only when the two responses are provably byte ranges of one representation
//!   (`representation`): a `GET` with no `Range` of its own answered `200` with
//!   `Accept-Ranges: bytes`, a strong validator (a strong `ETag`; with no `ETag` at all, a
//!   `Last-Modified` at least 60 s older than `Date`, RFC 9110 §8.8.2.2), a
//!   `Content-Length` and no `Content-Encoding`. Any other body (a weak `ETag`, a
//!   `Last-Modified` younger than a minute) is handed over as it came (not wrapped:
//!   nothing to pay).
//! - **What is spliced.** Only a `206` whose `Content-Range` starts at the byte the body
//!   broke at, has the same length and carries the first answer's validator (the same
//!   `ETag`, or the same `Last-Modified`: a server may ignore `If-Range` and send a range
//!   of a changed representation); anything else (a `200` from a server that ignores
//!   `Range` or whose representation changed, a `206` with another or no validator, a
//!   `416`, an error) ends the body with the original error inside a
//!   [`BodyIncomplete`](crate::error::BodyIncomplete). A body that ends short of its
//!   `Content-Length` is an error too, never a success.
//! - **As an attempt.** A resume is an attempt of the same logical request: the retry
//!   policy decides on the cut ([`FailureKind::BodyInterrupted`](crate::FailureKind::BodyInterrupted),
//!   a `GET`: retried), waits its backoff, spends the budget, respects the deadline, and the
//!   resumes count against the same retry limit as the retries before the head
//!   (`crate::retry::continuation`). The range request goes through the stack's stages
//!   (breaker, concurrency limit, bearer token, transport step), so it is recorded in
//!   the history, the metrics and the `on_attempt` hook like any attempt, and the retry
//!   loop may retry *it* (a `503` to the range request) within the same count. The hook
//!   saw the cut attempt when its head came (with its decision then, a final `200`); the
//!   amended record (`BodyInterrupted`, then the retry) is in the history of an
//!   [`Operation`](crate::retry::Operation) around it, and the retry is in the metrics.
//! - **The concurrency limit.** The permit of the first attempt ends when its body breaks
//!   (`crate::limit`'s body); each resume holds its own permit, until its body ends.
//!
//! # Cancel safety
//!
//! Dropping the body (or the future reading it) at any point ends everything it started:
//! during a resume's backoff the retry is not counted and its budget goes back, during a
//! range request that request is dropped (its limiter permit and breaker probe slot with
//! it, as for any attempt), and no further request is sent.
//!
//! What the resumes do not see: a per-attempt middleware of yours
//! ([`Resilience::per_attempt`](crate::Resilience::per_attempt)) and the middleware around
//! the stack (the range request starts at the retry stage), and the request's own
//! extensions (its `MaxRetries` and `Deadline` were fixed by the first pass and hold for the
//! resumes).

mod body;
mod representation;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::Extensions;
use http::header::{IF_RANGE, RANGE};
use reqwest::{Request, Response};

use crate::origin::Origin;
use crate::record::{Continuation, OperationAttempt};
use crate::retry::RetryMiddleware;

/// Per-request override of [`Resilience::resume_bodies`](crate::Resilience::resume_bodies):
/// `ResumeBody(true)` resumes this request's body when it breaks (if the response allows
/// it), `ResumeBody(false)` never does.
///
/// ```
/// use reqwest_resilience::resume::ResumeBody;
///
/// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
/// let client = reqwest_resilience::Resilience::new().build_from(reqwest::Client::builder())?;
/// let request = client
///     .get("http://127.0.0.1:8080/files/dataset.parquet")
///     .with_extension(ResumeBody(true));
/// # drop(request); Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeBody(pub bool);

/// The future of a request sent again by a resume.
pub(crate) type Resent =
    Pin<Box<dyn Future<Output = reqwest_middleware::Result<Response>> + Send + 'static>>;

/// The stack's stages from the retry loop inward, to send a range request through: the
/// composed stack implements it over clones of its stages and the client.
pub(crate) trait Resend: Send + Sync + 'static {
    /// Sends `req` with `extensions` through the stages.
    fn resend(self: Arc<Self>, req: Request, extensions: Extensions) -> Resent;
}

/// What the composed stack holds to resume bodies.
#[derive(Clone)]
pub(crate) struct Resumer {
    /// Whether bodies are resumed unless a request says otherwise ([`ResumeBody`]).
    pub(crate) by_default: bool,
    pub(crate) retry: RetryMiddleware,
    pub(crate) stack: Arc<dyn Resend>,
}

/// A request whose body may be resumed, as it was before it was sent.
pub(crate) struct Candidate {
    url: reqwest::Url,
    headers: http::HeaderMap,
    version: http::Version,
    timeout: Option<std::time::Duration>,
    continuation: Continuation,
    /// Whether the continuation was handed inward here (then it ends with the request).
    handed_inward: bool,
}

impl Resumer {
    /// Readies `req` for a resume of its body, when it may have one: a `GET` with no
    /// `Range` of its own, resumed by default or by its [`ResumeBody`]. The retry loop's
    /// counts go into a [`Continuation`] (the caller's operation's, if the request is part
    /// of one).
    pub(crate) fn candidate(
        &self,
        req: &Request,
        extensions: &mut Extensions,
    ) -> Option<Candidate> {
        // A range request repeats the headers, not a body.
        if *req.method() != http::Method::GET
            || req.body().is_some()
            || crate::upload::ReplayableBody::of(extensions).is_some()
        {
            return None;
        }
        let wanted = extensions
            .get::<ResumeBody>()
            .map_or(self.by_default, |r| r.0);
        if !wanted || req.headers().contains_key(RANGE) {
            return None;
        }
        let (continuation, handed_inward) = match extensions.get::<OperationAttempt>() {
            Some(attempt) => (attempt.continuation().clone(), false),
            None => {
                let continuation = Continuation::default();
                extensions.insert(OperationAttempt::by_stack(continuation.clone()));
                (continuation, true)
            }
        };
        let mut headers = req.headers().clone();
        headers.remove(IF_RANGE);
        Some(Candidate {
            url: req.url().clone(),
            headers,
            version: req.version(),
            timeout: req.timeout().copied(),
            continuation,
            handed_inward,
        })
    }

    /// The request's result, its body made resumable when the response allows it.
    pub(crate) fn finish(
        &self,
        candidate: Candidate,
        result: reqwest_middleware::Result<Response>,
        extensions: &mut Extensions,
    ) -> reqwest_middleware::Result<Response> {
        if candidate.handed_inward {
            extensions.remove::<OperationAttempt>();
        }
        let response = result?;
        let Some(repr) = representation::resumable(
            &http::Method::GET,
            &candidate.headers,
            response.status(),
            response.headers(),
        ) else {
            return Ok(response);
        };
        let plan = body::Plan {
            stack: self.stack.clone(),
            retry: self.retry.clone(),
            continuation: candidate.continuation,
            origin: Origin::cached(&candidate.url),
            url: candidate.url,
            headers: candidate.headers,
            version: candidate.version,
            timeout: candidate.timeout,
            status: response.status(),
            repr,
        };
        Ok(wrap(response, plan))
    }
}

/// `response`, its body resumable under `plan`. As `crate::limit`'s body: reqwest
/// rebuilds a `Response` from an `http::Response` whose body it wraps, and puts the URL
/// back from its own extension.
fn wrap(response: Response, plan: body::Plan) -> Response {
    use reqwest::ResponseBuilderExt;
    let url = response.url().clone();
    let (parts, inner) = http::Response::<reqwest::Body>::from(response).into_parts();
    let body = reqwest::Body::wrap(body::ResumableBody::new(inner, plan));
    let mut rebuilt = http::Response::from_parts(parts, body);
    if let Ok(with_url) = http::Response::builder().url(url).body(()) {
        rebuilt
            .extensions_mut()
            .extend(with_url.into_parts().0.extensions);
    }
    Response::from(rebuilt)
}
