//! [`Operation`]: a whole operation (send, read the body, parse, or anything done with the
//! response) retried under a [`RetryMiddleware`]'s policy; see its docs.

use std::future::Future;

use http::Method;

use super::RetryMiddleware;
use crate::classify::{classify, classify_body};
use crate::record::{AttemptHistory, RequestEvidence, RetryOutcome, StopReason};
use crate::record::{Continuation, OperationAttempt, PassEnd};

/// A whole operation (send, read the body, parse, or anything done with the response)
/// retried under a [`RetryMiddleware`]'s policy; made by [`RetryMiddleware::operation`],
/// reusable for any number of runs.
///
/// The middleware returns at the response head, so a body that breaks while it is read (a
/// reset, a timeout, a truncated download) reaches the caller after every retry is over.
/// An `Operation` runs the caller's closure again in that case, with the middleware's
/// decision table, backoff, `Retry-After` cap, budget, deadline and retry limit, and the
/// attempts it makes and those the middleware makes inside it are one count: each request
/// the closure sends carries the [`OperationAttempt`] (`.with_extension(attempt)`), so the
/// middleware goes on from the attempts already made instead of starting over (no 4 × 4 =
/// 16 attempts), deposits in the budget once, and continues the history.
///
/// ```no_run
/// use reqwest_resilience::{Resilience, RetryMiddleware};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let retry = RetryMiddleware::new();
/// let client = Resilience::new().retry(retry.clone()).build_from(reqwest::Client::builder())?;
/// let url = "http://127.0.0.1:8080/simple/flask/flask-3.1.0.whl";
/// let client = &client;
/// let wheel = retry
///     .operation()
///     .run(|attempt| async move {
///         let response = client.get(url).with_extension(attempt).send().await?;
///         Ok::<_, reqwest_middleware::Error>(response.error_for_status()?.bytes().await?)
///     })
///     .await?;
/// # drop(wheel); Ok(()) }
/// ```
///
/// # What runs again
///
/// After the closure fails, the decision looks at how the last request it sent through
/// the retry middleware ended:
///
/// - the middleware returned an error, or stopped on a response it would have retried
///   (retries exhausted, budget, deadline): its decision stands, the error is returned;
/// - it returned a final response with status `s`: the error is classified with
///   [the rules for an operation on a response](crate::evidence#body-failures) (a cut body is
///   `ResponseReceived(s)` / `BodyInterrupted`, a decode error of a complete body `Decode`,
///   anything else `Other`) and the decision table decides on that attempt's record,
///   amended: a cut body is run again when the request is idempotent, a decode error or
///   the caller's own error after a `200` are not;
/// - no request went through a retry middleware (a plain client, an error before the
///   send): the error is classified by [the rules of a send](crate::evidence#what-each-failure-proves).
///
/// A request is idempotent as the middleware says (method, `Idempotency-Key`,
/// [`Idempotent`](super::Idempotent)); an operation is idempotent when every request it
/// sent was, or when marked so ([`Operation::idempotent`]), which also marks every
/// request in it. An operation that sent nothing through the middleware and is not marked
/// is not idempotent: a failure that may have reached a server is not run again.
///
/// The per-origin breakers, pauses and the concurrency limit apply to each request the
/// closure sends, as to any. The stack's `on_attempt` hook sees every attempt sent; the
/// amended decision of an attempt whose body broke is in the history
/// ([`Operation::run_recorded`]) and the metrics, and the middleware's before-sleep hook
/// ([`RetryMiddlewareBuilder::before_sleep`](super::RetryMiddlewareBuilder::before_sleep))
/// is told of the retry, as of any. A custom [`RetryStrategy`](super::RetryStrategy)
/// decides these retries too, with the error the closure returned in
/// [`AttemptContext::error`](super::AttemptContext::error).
#[derive(Clone, Debug)]
pub struct Operation {
    pub(super) retry: RetryMiddleware,
    pub(super) idempotent: Option<bool>,
    pub(super) max_retries: Option<u32>,
    pub(super) deadline: Option<crate::record::Deadline>,
}

/// What [`Operation::run_recorded`] returns: the closure's last result, how many
/// attempts were made and why they stopped, and every attempt's record.
#[derive(Debug)]
#[non_exhaustive]
pub struct OperationOutcome<T, E> {
    /// The closure's last result.
    pub result: Result<T, E>,
    /// Attempts made (the operation's and the middleware's, one count), and why no
    /// further one was made.
    pub outcome: RetryOutcome,
    /// Every attempt (each with its decision), as the retry middleware records them.
    pub history: AttemptHistory,
}

impl RetryMiddleware {
    /// An operation retried under this middleware's policy, sharing its budget: run it
    /// with a closure ([`Operation::run`]) or step by step in a loop of your own
    /// ([`Operation::steps`]). From a [`Resilience`](crate::Resilience) stack, take the
    /// middleware its client uses with
    /// [`Resilience::retry_middleware`](crate::Resilience::retry_middleware).
    ///
    /// The requests an operation sends carry its [`OperationAttempt`], and the client's
    /// retry middleware (this one, or a clone) counts their attempts as the operation's:
    /// one attempt count, one retry limit, one deadline, one deposit in the budget and one
    /// history, whether the middleware retries inside an attempt or the operation runs
    /// it again. A request sent through a middleware built separately (another
    /// `RetryMiddleware`) is counted too, but decided under that one's table and budget.
    pub fn operation(&self) -> Operation {
        Operation {
            retry: self.clone(),
            idempotent: None,
            max_retries: None,
            deadline: None,
        }
    }
}

impl Operation {
    /// Marks the operation as harmless to repeat (`true`: like
    /// [`Idempotent(true)`](super::Idempotent), for every request in it) or not
    /// (`false`: nothing that may have reached a server runs again).
    pub fn idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = Some(idempotent);
        self
    }

    /// The retries after the first attempt, over the operation and the middleware inside
    /// it (default: the middleware's).
    pub fn max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = Some(max_retries);
        self
    }

    /// The deadline of the whole operation (default: the middleware's `total_deadline`
    /// from the start of each run): no retry whose delay would end past it, and every
    /// request in it is cut at it.
    pub fn deadline(mut self, deadline: crate::record::Deadline) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Runs `op` until it succeeds or the policy stops it; the last result.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops at once (during the closure or a wait); a retry taken
    /// from the budget for a wait that is dropped is given back.
    pub async fn run<T, E, F, Fut>(&self, op: F) -> Result<T, E>
    where
        F: FnMut(OperationAttempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: std::error::Error + 'static,
    {
        self.run_recorded(op).await.result
    }

    /// [`run`](Self::run), with the attempt count, the stop reason and the history.
    pub async fn run_recorded<T, E, F, Fut>(&self, mut op: F) -> OperationOutcome<T, E>
    where
        F: FnMut(OperationAttempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: std::error::Error + 'static,
    {
        let continuation = Continuation::default();
        let deadline = self.deadline.map(|d| d.0);
        self.retry.begin_continued(
            &continuation,
            self.max_retries,
            deadline,
            self.idempotent,
            false,
        );
        loop {
            let attempt = OperationAttempt::continuing(continuation.clone());
            let result = op(attempt).await;
            let decided = match &result {
                Ok(_) => Err(success_stop(&continuation)),
                Err(e) => self.decide(&continuation, e),
            };
            match decided {
                Ok(retry) => self.retry.wait_continued(&continuation, retry).await,
                Err(stop) => return finish(result, stop, &continuation),
            }
        }
    }

    /// The decision after the closure failed with `err` (see the module docs); also the
    /// decision of a [`Steps`](super::Steps) loop's attempt.
    pub(super) fn decide(
        &self,
        continuation: &Continuation,
        err: &(dyn std::error::Error + 'static),
    ) -> Result<super::middleware::ContinuedRetry, StopReason> {
        let (evidence, method, url) = {
            let spent = continuation.lock();
            let last = spent.history.last().map(|r| &r.evidence);
            match spent.last {
                Some(PassEnd {
                    stop: StopReason::FinalResponse(_),
                    status: Some(status),
                }) => {
                    let c = classify_body(err, status);
                    let mut evidence = last.cloned().unwrap_or_else(|| {
                        RequestEvidence::new(c.transmission, None, spent.attempts() + 1)
                    });
                    evidence.transmission = c.transmission;
                    evidence.failure = Some(c.kind);
                    (evidence, spent.method.clone(), spent.url.clone())
                }
                // The middleware decided on what it saw: its stop stands.
                Some(PassEnd { stop, .. }) => return Err(stop),
                None => {
                    let c = classify(err);
                    let mut evidence =
                        RequestEvidence::new(c.transmission, None, spent.attempts() + 1);
                    evidence.failure = Some(c.kind);
                    evidence.not_processed = c.not_processed;
                    (evidence, None, None)
                }
            }
        };
        continuation.lock().last = None;
        let method = method.unwrap_or(Method::GET);
        let failure = super::middleware::ContinuedFailure {
            evidence,
            error: err,
            method: &method,
            url: url.as_ref(),
        };
        self.retry.decide_continued(continuation, failure)
    }
}

/// Why a successful run stopped: the last pass's reason, else a final `200`.
pub(super) fn success_stop(continuation: &Continuation) -> StopReason {
    match continuation.lock().last {
        Some(PassEnd { stop, .. }) => stop,
        None => StopReason::FinalResponse(http::StatusCode::OK),
    }
}

pub(super) fn finish<T, E>(
    result: Result<T, E>,
    stop: StopReason,
    continuation: &Continuation,
) -> OperationOutcome<T, E> {
    let spent = continuation.lock();
    OperationOutcome {
        result,
        outcome: RetryOutcome {
            attempts: spent.attempts() + 1,
            stop,
        },
        history: spent.history.clone(),
    }
}
