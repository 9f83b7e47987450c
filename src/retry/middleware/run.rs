//! The retry loop for one logical request: prepare an attempt, run it (plain or as a
//! hedged round), decide, and either stop or wait and go round again. What each step
//! does is a call into a piece of its own: the decision (`after_attempt`), the delay
//! (`plan`), the report (`report`).
//!
//! The loop's states are tower's (`retry/future.rs`) and backon's, in the order the
//! `async` block reads: an attempt running (`Called`: [`RequestRun::prepare`], then
//! [`RequestRun::start_attempt`] or a hedged round), the wait before a retry (`Waiting`:
//! [`RequestRun::wait_then_count`]), and the next round (`Retrying`). What lasts across
//! them is [`RequestRun`], with the retry counts in its [`LoopState`].

use std::time::{Duration, SystemTime};

use http::Extensions;
use reqwest::{Request, Response};
use tokio::time::Instant;

use super::after_attempt::{Decision, Question};
use super::config::{Config, Delays, RetryMiddleware};
use super::plan::{LoopState, Step, Unspent};
use super::report::finish;
use crate::origin::Origin;
use crate::record::{
    AttemptScope, Continuation, Deadline, HandedBack, Inward, RequestEvidence, RequestRecord,
    RetryReason, StopReason,
};
use crate::retry::attempt_timeout::{self, attempt_cut};
use crate::retry::hedge::{Hedging, RoundSpec};
use crate::retry::{Idempotent, MaxRetries, Verdict, Withdrawal, is_idempotent};
use crate::stage::{HandedRequest, Handover, RestOfStack, Stage, standalone_middleware};
use crate::upload::ReplayableBody;

standalone_middleware!(RetryMiddleware);

impl Stage for RetryMiddleware {
    /// The retry loop for one logical request: prepare an attempt, run it (plain or as a
    /// hedged round), decide, and either stop or wait and go round again.
    ///
    /// The caller's request is `kept` untouched while an attempt sends a copy of it, so
    /// the stages inside can replay it after a `401`; the last attempt possible sends it
    /// itself.
    #[allow(clippy::manual_async_fn)]
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        async move {
            // The owner of the request clears what an earlier one left behind, a deadline
            // handed on for a request whose future was dropped included.
            let owner = handover.enter(extensions, "RetryMiddleware", true, req.url())?;
            let timeout = attempt_timeout::for_request(extensions, self.config.attempt_timeout)?;
            let mut run = RequestRun::begin(&self.config, &req, extensions, handover, timeout);
            let mut kept = Some(req);
            if let (Some(_), Some(req)) = (&run.upload, kept.as_mut()) {
                // A replayable upload's body is opened for each attempt: the request's
                // own, if it had one, is never sent (nor copied, which would fail).
                *req.body_mut() = None;
            }
            loop {
                // One attempt and its decision, in a block of their own: the request, the
                // response and the evidence end with it, so the future does not also keep
                // their slots through the backoff wait below (every request pays for the
                // future's size when it is boxed).
                let (wait, retry) = {
                    let Some((prepared, req)) = run.prepare(&mut kept, extensions) else {
                        unreachable!(
                            "the loop goes round only after a retry, which keeps the request"
                        )
                    };
                    let (result, hedges) = if let Some(upload) = &run.upload {
                        // Rare: an upload opens its body first, and is never hedged (boxed:
                        // stage cost rule 2; the attempt's copy is not held across an
                        // `.await` of every request's future, rule 3).
                        let handover = handover.with_spare(kept.as_deref());
                        let sent = run.upload_attempt(
                            upload, &next, req, extensions, handover, owner, &prepared,
                        );
                        (Box::pin(sent).await, 0)
                    } else if let Some((hedging, spec)) = run.hedged_round(&prepared, owner) {
                        let is_final = run.is_final(kept.as_deref().map(Request::url));
                        // Only a hedged request carries the race (boxed: stage cost rules 2, 5),
                        // made in the box's argument: bound to a name first, the round (about
                        // 4 KB) would keep a slot in every request's loop future (rustc keeps a
                        // moved-from local's room while it is in scope: 4 632 → 952 bytes).
                        // The first copy gets what a plain attempt gets.
                        let handover = handover
                            .with_spare(kept.as_deref())
                            .with_origin(&run.origin);
                        let round = Box::pin(hedging.round(
                            spec,
                            &next,
                            req,
                            kept.as_deref(),
                            extensions,
                            handover,
                            is_final,
                        ))
                        .await;
                        (round.result, round.hedges)
                    } else {
                        let handover = handover.with_spare(kept.as_deref());
                        let (sent, end) =
                            run.start_attempt(&next, req, extensions, handover, owner, &prepared);
                        let outcome = sent.await;
                        (end.finish(outcome, extensions, &run.origin), 0)
                    };
                    let kept_url = kept.as_deref().map(Request::url);
                    let retry = match run.decide(&result, extensions, prepared, hedges, kept_url) {
                        Ok(retry) => retry,
                        Err(stopped) => return run.finish(result, stopped, extensions),
                    };
                    // Only a retry waits (boxed: stage cost rule 2).
                    (Box::pin(wait_before_retry(result.ok(), retry.delay)), retry)
                };
                run.wait_then_count(wait, retry).await;
            }
        }
    }
}

/// One logical request in the retry loop: what its attempts share.
struct RequestRun<'a> {
    config: &'a Config,
    method: http::Method,
    idempotent: bool,
    /// Worked out once for every attempt and every stage inside.
    origin: Option<Origin>,
    /// The hedging of a request eligible for it ([`Hedging::eligible`]).
    hedging: Option<&'a Hedging>,
    state: LoopState,
    /// Whether this middleware handed its `total_deadline` inward as a [`Deadline`], or
    /// its attempt timeout: what ends with the request ([`Inward::end`]).
    handed_on: bool,
    /// Whether the stack installed the transport step inside (see [`Decision`]).
    transport_installed: bool,
    /// The earlier passes of this request, when it has some (`continued`).
    continued: Option<Continuation>,
    /// Whether a retry is handed back to the caller's loop ([`Steps`](crate::retry::Steps))
    /// instead of made: the pass makes one attempt (with its hedges).
    hands_back: bool,
    /// The request's replayable upload body, opened for each attempt (never hedged).
    upload: Option<ReplayableBody>,
    /// The URL of the request once the last attempt possible sent the caller's request
    /// itself (none is kept to borrow it from then): boxed, so the loop's future carries a
    /// pointer, not a `Url`, and copied only on that path.
    last_url: Option<Box<url::Url>>,
}

/// An attempt about to run.
struct PreparedAttempt {
    /// Its number, counting the first attempt and every hedge.
    attempt: u32,
    /// Whether its request's body can be copied (for hedges).
    replayable: bool,
    /// The history's length before the attempt.
    recorded_before: usize,
}

/// A retry the decision took: its delay, why, and the budget's withdrawal for it.
struct PlannedRetry {
    delay: Duration,
    reason: RetryReason,
    withdrawal: Option<Withdrawal>,
}

/// Why the loop stopped, after how many attempts.
struct Stopped {
    attempts: u32,
    stop: StopReason,
}

impl<'a> RequestRun<'a> {
    /// Sets the request up (with its `attempt_timeout`, the request's or the configured
    /// one): the deadline handed inward, the loop's state, the deposits in the retry and
    /// hedge budgets.
    #[inline]
    fn begin(
        config: &'a Config,
        req: &Request,
        extensions: &mut Extensions,
        handover: Handover<'_>,
        attempt_timeout: Option<Duration>,
    ) -> Self {
        // A later pass of a request (an operation run again, a body resumed) goes on
        // from the earlier ones: `super::continuation`.
        let continued = Continuation::of_request(extensions);
        let handed_on = continued
            .as_ref()
            .is_some_and(|c| c.hand_on_deadline(extensions))
            | hand_on_deadline(config, extensions);
        // Kept for every attempt (and copy) to start its clock from.
        Inward::set_attempt_timeout(extensions, attempt_timeout);
        let mut idempotent = extensions
            .get::<Idempotent>()
            .map_or_else(|| is_idempotent(req.method(), req.headers()), |i| i.0);
        let mut state = LoopState {
            // Only an external policy reads the wall clock; the success path skips it.
            started_system: matches!(config.delays, Delays::External(_)).then(SystemTime::now),
            deadline: extensions.get::<Deadline>().map(|d| d.0),
            max_retries: extensions
                .get::<MaxRetries>()
                .map_or_else(|| config.max_retries(), |m| m.0),
            retries: 0,
            previous_delay: None,
            attempt_timeout,
            hedges: 0,
            not_processed_retries: 0,
        };
        let mut hands_back = false;
        let deposit = continued.as_ref().is_none_or(|c| {
            c.begin_pass(
                &mut state,
                &mut idempotent,
                &mut hands_back,
                req,
                extensions,
            )
        });
        if let Some(budget) = config.budget.as_ref().filter(|_| deposit) {
            budget.deposit();
        }
        // A hedge would need a second body at once: an upload is never hedged.
        let upload = ReplayableBody::of(extensions).cloned();
        let hedging = config
            .hedging
            .as_ref()
            .filter(|h| upload.is_none() && h.eligible(req.method(), extensions, idempotent));
        if let Some(h) = hedging {
            h.deposit();
        }
        RequestRun {
            config,
            method: req.method().clone(),
            idempotent,
            origin: handover.origin(req.url()),
            hedging,
            state,
            // What this request handed inward ends with it.
            handed_on: handed_on || attempt_timeout.is_some(),
            transport_installed: handover.composed(),
            continued,
            hands_back,
            upload,
            last_url: None,
        }
    }

    /// Readies the next attempt: its number, the request it sends, and the extensions
    /// cleared of the previous attempt's evidence. The request is a copy of the `kept`
    /// one when a retry is still possible, else the kept one itself (`None` when it was
    /// sent already).
    #[inline]
    fn prepare(
        &mut self,
        kept: &mut Option<HandedRequest<'_>>,
        extensions: &mut Extensions,
    ) -> Option<(PreparedAttempt, Request)> {
        // Copying only when a retry is still possible keeps streaming bodies (and
        // `MaxRetries(0)`) on the single-send path.
        let copy = kept
            .as_deref()
            .filter(|_| {
                self.state
                    .retry_possible(self.config.max_not_processed_retries)
            })
            .and_then(crate::stage::copy_request);
        let req = match copy {
            Some(copy) => copy,
            None => {
                let last = kept.take()?.take();
                // The strategy still asks for the URL after this attempt.
                self.last_url = Some(Box::new(last.url().clone()));
                last
            }
        };
        // Evidence from the previous attempt must not be mistaken for this one's.
        RequestRecord::clear_evidence(extensions);
        let prepared = PreparedAttempt {
            attempt: self.state.attempts() + 1,
            replayable: replayable(&req),
            recorded_before: RequestRecord::attempts_recorded(extensions),
        };
        Some((prepared, req))
    }

    /// The hedged round this attempt runs as, when hedges are left, the request has an
    /// origin and its body can be copied.
    #[inline]
    fn hedged_round(
        &self,
        prepared: &PreparedAttempt,
        owner: crate::stage::scope::Ownership,
    ) -> Option<(&'a Hedging, RoundSpec)> {
        let hedging = self.hedging.filter(|h| self.state.hedges < h.max())?;
        let origin = self.origin.as_ref().filter(|_| prepared.replayable)?;
        // The deadline bounds the attempt too: a server that trickles its answer (or
        // none) must not hold the caller past it when reqwest has no timeout.
        let spec = RoundSpec {
            deadline: self.state.deadline,
            attempt_timeout: self.state.attempt_timeout,
            hedges_left: hedging.max() - self.state.hedges,
            attempt: prepared.attempt,
            origin: origin.clone(),
            owner,
        };
        Some((hedging, spec))
    }

    /// Whether the retry decision would stop on a copy's outcome (a hedged round's
    /// winner).
    fn is_final<'u>(
        &'u self,
        url: Option<&'u url::Url>,
    ) -> impl Fn(&RequestEvidence, &reqwest_middleware::Result<Response>, u32) -> bool + Sync + 'u
    {
        let question = self.question(url);
        move |evidence, result, attempt| {
            matches!(
                question.verdict(evidence, result, attempt),
                Verdict::Stop(_)
            )
        }
    }

    /// What the strategy is asked with about this request (`kept_url`: the URL of the
    /// request kept for a retry, if it is).
    fn question<'u>(&'u self, kept_url: Option<&'u url::Url>) -> Question<'u> {
        Question {
            config: self.config,
            method: &self.method,
            url: kept_url.or(self.last_url.as_deref()),
            idempotent: self.idempotent,
            not_processed_retries: self.state.not_processed_retries,
        }
    }

    /// Starts a plain attempt, cut at the deadline or its attempt timeout.
    #[inline]
    fn start_attempt<'s, N: RestOfStack + 's>(
        &'s self,
        next: &N,
        req: Request,
        extensions: &'s mut Extensions,
        handover: Handover<'s>,
        owner: crate::stage::scope::Ownership,
        prepared: &PreparedAttempt,
    ) -> (attempt_timeout::Sent<'s>, attempt_timeout::AttemptEnd) {
        let cut = attempt_cut(self.state.deadline, self.state.attempt_timeout);
        let scope = self
            .state
            .attempt_timeout
            .map(|_| AttemptScope::cut_at(cut));
        // The stages inside share the origin (and replay the kept request: the caller's).
        let handover = handover.with_origin(&self.origin);
        attempt_timeout::start_attempt(
            next.clone(),
            req,
            extensions,
            handover,
            owner,
            cut,
            scope,
            prepared.attempt,
        )
    }

    /// A plain attempt of a replayable upload: its body opened for it ([`ReplayableBody`]:
    /// a body that cannot be opened ends the attempt unsent), then sent as
    /// [`start_attempt`](Self::start_attempt) sends it.
    #[allow(clippy::too_many_arguments)]
    async fn upload_attempt<'s, N: RestOfStack + 's>(
        &'s self,
        upload: &ReplayableBody,
        next: &N,
        mut req: Request,
        extensions: &'s mut Extensions,
        handover: Handover<'s>,
        owner: crate::stage::scope::Ownership,
        prepared: &PreparedAttempt,
    ) -> reqwest_middleware::Result<Response> {
        upload
            .open_into(&mut req, extensions, self.origin.clone())
            .await?;
        let (sent, end) = self.start_attempt(next, req, extensions, handover, owner, prepared);
        let outcome = sent.await;
        end.finish(outcome, extensions, &self.origin)
    }

    /// Decides after the attempt (and the `hedges` its round sent): a retry (possible
    /// only when the request was kept for it: `kept_url` is its URL), or a stop.
    #[inline]
    fn decide(
        &mut self,
        result: &reqwest_middleware::Result<Response>,
        extensions: &mut Extensions,
        prepared: PreparedAttempt,
        hedges: u32,
        kept_url: Option<&url::Url>,
    ) -> Result<PlannedRetry, Stopped> {
        // A retry handed back is the caller's to send: it rebuilds the request.
        let kept = kept_url.is_some() || self.hands_back;
        // Each hedge sent is an attempt of its own.
        self.state.hedges += hedges;
        let attempts = prepared.attempt + hedges;
        let decision = Decision {
            question: self.question(kept_url),
            recorded_before: prepared.recorded_before,
            transport_installed: self.transport_installed,
        };
        let step = decision.decide(result, extensions, attempts, kept, &self.state);
        if let (
            Step::Retry {
                delay,
                reason,
                withdrawal,
            },
            Some(c),
        ) = (&step, &self.continued)
            && self.hands_back
        {
            c.lock().handed_back = Some(Box::new(HandedBack {
                delay: *delay,
                reason: *reason,
                budget_slot: withdrawal.as_ref().map(Withdrawal::slot),
            }));
            return Err(Stopped {
                attempts,
                stop: StopReason::HandedBack,
            });
        }
        match (step, kept) {
            (
                Step::Retry {
                    delay,
                    reason,
                    withdrawal,
                },
                true,
            ) => Ok(PlannedRetry {
                delay,
                reason,
                withdrawal,
            }),
            (Step::Stop(stop), _) => Err(Stopped { attempts, stop }),
            // `plan` never retries without a replayable request.
            (Step::Retry { .. }, false) => Err(Stopped {
                attempts,
                stop: StopReason::BodyNotClonable,
            }),
        }
    }

    /// Waits out the retry's delay, then counts the retry. Dropped during the wait, the
    /// retry is never made: its budget goes back.
    async fn wait_then_count(&mut self, wait: impl Future<Output = ()>, retry: PlannedRetry) {
        let mut unspent = Unspent(self.config.budget.as_ref().zip(retry.withdrawal));
        wait.await;
        unspent.0 = None;
        self.state.count_retry(retry.reason, retry.delay);
    }

    /// The request's result, with its [`RetryOutcome`].
    #[inline]
    fn finish(
        &self,
        result: reqwest_middleware::Result<Response>,
        stopped: Stopped,
        extensions: &mut Extensions,
    ) -> reqwest_middleware::Result<Response> {
        let Stopped { attempts, stop } = stopped;
        if let Some(c) = &self.continued {
            let status = result.as_ref().ok().map(Response::status);
            c.end_pass(&self.state, stop, status, extensions);
        }
        finish(
            self.config,
            result,
            attempts,
            stop,
            extensions,
            self.handed_on,
        )
    }
}

/// Hands the configured total deadline inward as a [`Deadline`] when the request has none:
/// the middlewares inside (the breaker waiting out a pause) honour the same deadline; it
/// ends with the request ([`finish`]). Whether it did.
#[inline]
fn hand_on_deadline(config: &Config, extensions: &mut Extensions) -> bool {
    let handed_on = match (extensions.get::<Deadline>(), config.deadline) {
        (None, Some(total)) => Instant::now().checked_add(total),
        _ => None,
    };
    if let Some(d) = handed_on {
        Inward::hand_on_deadline(extensions, Deadline(d));
    }
    handed_on.is_some()
}

/// Whether `req` can be copied (what `Request::try_clone` needs: no streamed body),
/// without copying it.
fn replayable(req: &Request) -> bool {
    req.body().is_none_or(|body| body.as_bytes().is_some())
}

/// Sleeps `delay`, draining `response` meanwhile.
async fn wait_before_retry(response: Option<Response>, delay: Duration) {
    let wake = Instant::now() + delay;
    if let Some(response) = response {
        // Reading a small body lets its connection be reused; never past the wake.
        let _ = tokio::time::timeout_at(wake, drain(response)).await;
    }
    tokio::time::sleep_until(wake).await;
}

/// Reads up to 64 KiB of a response that will be retried, so HTTP/1 can reuse its
/// connection; a longer body is dropped (which closes the connection instead).
async fn drain(mut response: Response) {
    const LIMIT: u64 = 64 * 1024;
    if response.content_length().is_some_and(|n| n > LIMIT) {
        return;
    }
    let mut read = 0u64;
    while let Ok(Some(chunk)) = response.chunk().await {
        read += chunk.len() as u64;
        if read > LIMIT {
            return;
        }
    }
}
