//! [`Steps`]: an [`Operation`] driven by a loop of the caller's own, one attempt at a time
//! (mirrors, fallback URLs, a request rebuilt for every attempt); see its docs.

use std::time::Duration;

use super::Operation;
use super::middleware::ContinuedRetry;
use super::operation::{finish, success_stop};
use crate::record::{AttemptHistory, Continuation, OperationAttempt, RetryOutcome, StopReason};

/// What to do after an attempt of a [`Steps`] loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Send the next attempt after this delay (sleep it yourself; to the same place, or
    /// the next mirror).
    Retry(Duration),
    /// No further attempt: why (a success is [`StopReason::FinalResponse`]).
    Stop(StopReason),
}

/// An [`Operation`] step by step, for a loop that is not a closure: each attempt's
/// outcome goes to [`after`](Self::after), which says whether to retry and after how
/// long, under the operation's policy, budget, deadline, retry limit and history (the
/// same decision [`Operation::run`] takes). Made by [`Operation::steps`]; one `Steps` per
/// logical request.
///
/// Each request of an attempt carries [`attempt`](Self::attempt)
/// (`.with_extension(steps.attempt())`). The client's retry middleware then sends it
/// once (with its hedges, if it hedges) and hands its decision back instead of retrying
/// itself: the request ends with the attempt's response or error (its
/// [`RetryOutcome`] says [`StopReason::HandedBack`]), and `after` returns the retry the
/// middleware decided from the transport step's evidence, the response head and
/// `Retry-After`. So the loop chooses where the next attempt goes (the next mirror, a
/// fallback URL, a request rebuilt with a fresh body), and the attempt count, the retry
/// limit and the history go on across all of them. A failure the middleware did not see
/// (a body that broke while read, the loop's own error) is decided as
/// [`Operation`]'s docs say.
///
/// ```no_run
/// use reqwest_resilience::Resilience;
/// use reqwest_resilience::retry::Step;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let mut stack = Resilience::like_reqwest_retry();
/// let retry = stack.retry_middleware()?;
/// let client = stack.build_from(reqwest::Client::builder())?;
/// let mirrors = ["http://127.0.0.1:8081/repodata.json", "http://127.0.0.1:8082/repodata.json"];
/// let mut steps = retry.operation().steps();
/// let mut next = 0;
/// let body = 'candidates: loop {
///     let url = mirrors[next % mirrors.len()];
///     let result = client.get(url).with_extension(steps.attempt()).send().await;
///     match steps.after(&result) {
///         Step::Retry(delay) => {
///             tokio::time::sleep(delay).await;
///             next += 1; // the next attempt goes to the next mirror
///             continue 'candidates;
///         }
///         Step::Stop(_) => break 'candidates result?.error_for_status()?.bytes().await?,
///     }
/// };
/// # drop(body); Ok(()) }
/// ```
///
/// # Cancel safety
///
/// A `Steps` never waits: the loop sleeps the delay of [`Step::Retry`] itself (or does
/// not), so it can be dropped anywhere. A retry counts when the next attempt begins (at
/// [`attempt`](Self::attempt), or at the next `after`): one decided and never made is
/// not counted, and the retry it took from the budget goes back when the `Steps` is
/// dropped.
pub struct Steps {
    operation: Operation,
    continuation: Continuation,
    /// The retry `after` decided, made when the next attempt begins.
    pending: Option<ContinuedRetry>,
    stopped: Option<StopReason>,
}

impl std::fmt::Debug for Steps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steps")
            .field("operation", &self.operation)
            .field("attempts", &(self.continuation.lock().attempts() + 1))
            .field("retry_pending", &self.pending.as_ref().map(|r| r.delay))
            .field("stopped", &self.stopped)
            .finish()
    }
}

impl Operation {
    /// The operation step by step, for a loop of your own: see [`Steps`]. Its deadline
    /// (the operation's, or the middleware's `total_deadline`) runs from now.
    pub fn steps(&self) -> Steps {
        let continuation = Continuation::default();
        let deadline = self.deadline.map(|d| d.0);
        self.retry.begin_continued(
            &continuation,
            self.max_retries,
            deadline,
            self.idempotent,
            true,
        );
        Steps {
            operation: self.clone(),
            continuation,
            pending: None,
            stopped: None,
        }
    }
}

impl Steps {
    /// The extension to put on every request this attempt sends
    /// (`.with_extension(steps.attempt())`): the client's retry middleware counts it as
    /// this attempt and hands its decision back. Begins the attempt (a retry decided
    /// before is counted now); called again before [`after`](Self::after), the same
    /// attempt.
    pub fn attempt(&mut self) -> OperationAttempt {
        self.begin_attempt();
        OperationAttempt::continuing(self.continuation.clone())
    }

    /// After an attempt ended with `result` (the send's, or what the loop made of the
    /// response: a read body, a parse), whether to retry and after how long. A retry the
    /// client's retry middleware decided for the attempt's request stands whatever
    /// `result` is (a `503` returned as `Ok` included); otherwise an `Ok` stops (with the
    /// middleware's own stop, or a final `200`) and an `Err` is decided as
    /// [`Operation`]'s docs say.
    pub fn after<T, E>(&mut self, result: &Result<T, E>) -> Step
    where
        E: std::error::Error + 'static,
    {
        // An attempt made without `attempt()` (nothing sent through the middleware).
        self.begin_attempt();
        let handed_back = {
            let mut spent = self.continuation.lock();
            let handed = spent.handed_back.take();
            if handed.is_some() {
                spent.last = None;
            }
            handed
        };
        let decided = match (handed_back, result) {
            (Some(retry), _) => Ok(ContinuedRetry::handed_back(*retry)),
            (None, Ok(_)) => Err(success_stop(&self.continuation)),
            (None, Err(e)) => self.operation.decide(&self.continuation, e),
        };
        match decided {
            Ok(retry) => {
                let delay = retry.delay;
                self.pending = Some(retry);
                Step::Retry(delay)
            }
            Err(stop) => {
                self.stopped = Some(stop);
                Step::Stop(stop)
            }
        }
    }

    /// The attempts made so far (the loop's and the middleware's hedges, one count) and,
    /// once [`after`](Self::after) said [`Step::Stop`], why they stopped.
    pub fn outcome(&self) -> Option<RetryOutcome> {
        let stop = self.stopped?;
        Some(
            finish(
                Ok::<(), std::convert::Infallible>(()),
                stop,
                &self.continuation,
            )
            .outcome,
        )
    }

    /// Every attempt so far, each with its decision.
    pub fn history(&self) -> AttemptHistory {
        self.continuation.lock().history.clone()
    }

    /// Counts the retry decided after the last attempt, if any: the next one begins.
    fn begin_attempt(&mut self) {
        if let Some(retry) = self.pending.take() {
            self.operation
                .retry
                .count_continued(&self.continuation, retry);
        }
    }
}

impl Drop for Steps {
    /// Gives back the budget of a retry decided and never made.
    fn drop(&mut self) {
        let handed_back = self.continuation.lock().handed_back.take();
        let unmade = self
            .pending
            .take()
            .into_iter()
            .chain(handed_back.map(|h| ContinuedRetry::handed_back(*h)));
        for retry in unmade {
            self.operation.retry.give_back(retry);
        }
    }
}
