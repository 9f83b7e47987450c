//! [`ResumableBody`]: a response body that, when it breaks, asks for the rest with
//! `Range: bytes=N-` and `If-Range`, and goes on with the answer when it continues the
//! same representation ([`representation::continues`]).

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::header::{IF_RANGE, RANGE};
use http::{Extensions, HeaderMap, Method, StatusCode};
use reqwest::{Body, Request};

use super::Resend;
use super::representation::{self, Representation};
use crate::error::BodyIncomplete;
use crate::origin::Origin;
use crate::record::{Continuation, FailureKind, OperationAttempt, RequestEvidence, Transmission};
use crate::retry::{ContinuedFailure, RetryMiddleware};

type BoxError = Box<dyn StdError + Send + Sync>;
type Bytes = <Body as http_body::Body>::Data;
type Resumed = Pin<Box<dyn Future<Output = Result<Body, BoxError>> + Send>>;

/// What a body needs to ask for its rest: shared by its resumes.
pub(super) struct Plan {
    pub(super) stack: Arc<dyn Resend>,
    pub(super) retry: RetryMiddleware,
    pub(super) continuation: Continuation,
    pub(super) url: reqwest::Url,
    /// The original request's headers, without `Range` and `If-Range`.
    pub(super) headers: HeaderMap,
    pub(super) version: http::Version,
    pub(super) timeout: Option<std::time::Duration>,
    pub(super) origin: Option<Origin>,
    pub(super) status: StatusCode,
    pub(super) repr: Representation,
}

enum State {
    Reading(Body),
    /// A resume in flight. In a `Mutex` only to be `Sync` as `reqwest::Body::wrap`
    /// asks (the future is `Send`): it is reached through `get_mut`, never locked.
    Resuming(Mutex<Resumed>),
    Done,
}

/// The caller's body: the first response's, then each resume's, as one.
pub(super) struct ResumableBody {
    state: State,
    /// Bytes handed to the caller.
    received: u64,
    /// The status of the response whose body is being read (`200`, then `206`).
    reading: StatusCode,
    resumes: u32,
    plan: Arc<Plan>,
}

impl ResumableBody {
    pub(super) fn new(body: Body, plan: Plan) -> Self {
        ResumableBody {
            state: State::Reading(body),
            received: 0,
            reading: plan.status,
            resumes: 0,
            plan: Arc::new(plan),
        }
    }

    /// The error that ends the body: short of its length after `resumes` resumes, with
    /// the cause (`None`: it ended cleanly but short).
    fn incomplete(&self, cause: Option<BoxError>) -> BoxError {
        Box::new(BodyIncomplete::new(
            self.plan.status,
            self.received,
            self.plan.repr.total,
            self.resumes,
            cause,
        ))
    }
}

impl http_body::Body for ResumableBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Done => return Poll::Ready(None),
                State::Resuming(resumed) => {
                    let resumed = resumed.get_mut().unwrap_or_else(|p| p.into_inner());
                    match std::task::ready!(resumed.as_mut().poll(cx)) {
                        Ok(body) => this.state = State::Reading(body),
                        Err(e) => {
                            this.state = State::Done;
                            return Poll::Ready(Some(Err(e)));
                        }
                    }
                }
                State::Reading(body) => {
                    match std::task::ready!(Pin::new(body).poll_frame(cx)) {
                        Some(Ok(frame)) => return Poll::Ready(Some(this.counted(frame))),
                        // Every byte came: an error after the last one loses nothing.
                        Some(Err(_)) if this.received == this.plan.repr.total => {
                            this.state = State::Done;
                            return Poll::Ready(None);
                        }
                        Some(Err(cut)) => this.resume(cut.into()),
                        None if this.received == this.plan.repr.total => {
                            this.state = State::Done;
                            return Poll::Ready(None);
                        }
                        // `Content-Length` is checked at the end: short is an error.
                        None => {
                            this.state = State::Done;
                            return Poll::Ready(Some(Err(this.incomplete(None))));
                        }
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.plan.repr.total.saturating_sub(self.received))
    }
}

impl ResumableBody {
    /// Counts a frame's data; more than the `Content-Length` is an error.
    fn counted(
        &mut self,
        frame: http_body::Frame<Bytes>,
    ) -> Result<http_body::Frame<Bytes>, BoxError> {
        if let Some(data) = frame.data_ref() {
            self.received += data.len() as u64;
            if self.received > self.plan.repr.total {
                self.state = State::Done;
                return Err(self.incomplete(None));
            }
        }
        Ok(frame)
    }

    /// Starts a resume after `cut` (the body's error).
    fn resume(&mut self, cut: BoxError) {
        // Given up, the error says how many resumes were made before this cut.
        let cause = self.incomplete(Some(cut));
        self.resumes += 1;
        let plan = self.plan.clone();
        let resumed = resume(plan, self.received, self.reading, cause);
        self.reading = StatusCode::PARTIAL_CONTENT;
        self.state = State::Resuming(Mutex::new(Box::pin(resumed)));
    }
}

/// One resume: the retry policy's decision on the cut, its wait, the range request
/// through the stack, and the check of its answer. On any refusal, the original error
/// (`cause`, a [`BodyIncomplete`] around it).
async fn resume(
    plan: Arc<Plan>,
    from: u64,
    reading: StatusCode,
    cause: BoxError,
) -> Result<Body, BoxError> {
    let attempt = plan
        .continuation
        .lock()
        .history
        .last()
        .map_or(1, |r| r.evidence.attempt);
    let mut evidence = RequestEvidence::new(
        Transmission::ResponseReceived(reading),
        plan.origin.clone(),
        attempt,
    );
    evidence.failure = Some(FailureKind::BodyInterrupted);
    let failure = ContinuedFailure {
        evidence,
        error: &*cause,
        method: &Method::GET,
        url: Some(&plan.url),
    };
    let Ok(retry) = plan.retry.decide_continued(&plan.continuation, failure) else {
        return Err(cause);
    };
    plan.retry.wait_continued(&plan.continuation, retry).await;
    let response = match plan
        .stack
        .clone()
        .resend(range_request(&plan, from), extensions(&plan))
        .await
    {
        Ok(response) => response,
        Err(_) => return Err(cause),
    };
    if !representation::continues(&plan.repr, from, response.status(), response.headers()) {
        // Never spliced: a `200` (the server ignored the range, or the representation
        // changed and `If-Range` failed), another range, another length.
        return Err(cause);
    }
    Ok(http::Response::<Body>::from(response).into_body())
}

/// The original request again, asking for the body from byte `from` on.
fn range_request(plan: &Plan, from: u64) -> Request {
    let mut req = Request::new(Method::GET, plan.url.clone());
    *req.headers_mut() = plan.headers.clone();
    req.headers_mut()
        .insert(RANGE, representation::range_from(from));
    req.headers_mut()
        .insert(IF_RANGE, plan.repr.validator.clone());
    *req.version_mut() = plan.version;
    *req.timeout_mut() = plan.timeout;
    req
}

/// A resume's extensions: a later pass of the same request.
fn extensions(plan: &Plan) -> Extensions {
    let mut extensions = Extensions::new();
    extensions.insert(OperationAttempt::continuing(plan.continuation.clone()));
    extensions
}
