//! The race of one hedged round: the first copy on the caller's extensions, a hedge each
//! time the timer fires, until a copy comes back with an outcome the retry would keep.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use crate::stage::{Handover, RestOfStack};
use http::Extensions;
use reqwest::{Request, Response};
use tokio::time::Instant;

use super::delay::{FirstCopy, HedgeTimer};
use super::record::{RaceOutcome, cancelled, copy_evidence, record_of, refused_locally};
use super::{Hedging, RoundSpec};
use crate::record::{AttemptRecord, AttemptScope, RequestEvidence};
use crate::retry::attempt_timeout::{attempt_cut, run_attempt};
use crate::retry::budget::Withdrawal;
use crate::retry::latency::Window;

/// What a race is run from: the round, the rest of the stack, the retry's test of a
/// final outcome, and what each hedge is a copy of.
pub(super) struct RaceInputs<'r, N, F> {
    pub(super) spec: &'r RoundSpec,
    pub(super) next: &'r N,
    /// Whether the retry decision would stop on an outcome (then it wins at once).
    pub(super) is_final: &'r F,
    /// The request each hedge copies (`None`: its body cannot be copied, no hedge).
    pub(super) template: Option<Request>,
    /// The caller's extensions less this request's records: each hedge runs on a copy.
    pub(super) base: Extensions,
}

/// Where a copy's extensions are: the first copy runs with the caller's own (the common
/// case of no hedge costs no copy of them), each hedge with a copy of its own.
pub(super) enum InFlightExtensions<'x> {
    Caller(&'x mut Extensions),
    Own(Extensions),
}

impl InFlightExtensions<'_> {
    fn get(&self) -> &Extensions {
        match self {
            InFlightExtensions::Caller(e) => e,
            InFlightExtensions::Own(e) => e,
        }
    }
}

type InFlightOutput<'x> = (reqwest_middleware::Result<Response>, InFlightExtensions<'x>);
type InFlightFuture<'x> = Pin<Box<dyn Future<Output = InFlightOutput<'x>> + Send + 'x>>;

/// One copy of the request in flight in a round (the first, or a hedge).
struct InFlight<'x> {
    future: Option<InFlightFuture<'x>>,
    attempt: u32,
    started: Instant,
    /// Its hedge budget withdrawal (hedges only), given back if it was refused locally.
    withdrawal: Option<Withdrawal>,
}

enum Event<'x> {
    Done(usize, InFlightOutput<'x>),
    HedgeDue,
}

/// A finished copy waiting to learn whether it won.
struct Finished<'x> {
    result: reqwest_middleware::Result<Response>,
    extensions: InFlightExtensions<'x>,
    evidence: RequestEvidence,
}

/// A race under way.
struct Race<'x, 'r, N, F> {
    hedging: &'r Hedging,
    inputs: RaceInputs<'r, N, F>,
    /// Set once the race is decided: the copies dropped then were cancelled.
    lost: Arc<AtomicBool>,
    copies: Vec<InFlight<'x>>,
    timer: HedgeTimer,
    hedges: u32,
    /// Copies that failed first, superseded by a later answer.
    superseded: Vec<AttemptRecord>,
    /// The latest failure the retry would retry, kept while other copies may answer.
    last_failure: Option<Finished<'x>>,
}

impl Hedging {
    /// The race itself: the first copy on the caller's extensions, hedges on copies of
    /// the inputs' `base`, until one wins.
    pub(super) async fn race<'x, N: RestOfStack + 'x, F>(
        &self,
        inputs: RaceInputs<'_, N, F>,
        req: Request,
        extensions: &'x mut Extensions,
    ) -> RaceOutcome
    where
        F: Fn(&RequestEvidence, &reqwest_middleware::Result<Response>, u32) -> bool + Sync,
    {
        let window = self.adaptive_window(&inputs.spec.origin);
        let delay = self.delay_from(window.as_deref().and_then(Window::estimate));
        let mut race = Race::start(self, inputs, delay, req, extensions);
        let winner = loop {
            match race.next_event().await {
                Event::HedgeDue => race.send_hedge(),
                Event::Done(index, output) => {
                    if let Some(winner) = race.settle(index, output) {
                        break winner;
                    }
                }
            }
        };
        race.finish(winner, window.as_deref())
    }
}

impl<'x, 'r, N: RestOfStack + 'x, F> Race<'x, 'r, N, F>
where
    F: Fn(&RequestEvidence, &reqwest_middleware::Result<Response>, u32) -> bool + Sync,
{
    /// Sends the first copy, on the caller's extensions, and sets the timer of the first
    /// hedge.
    fn start(
        hedging: &'r Hedging,
        inputs: RaceInputs<'r, N, F>,
        delay: Duration,
        req: Request,
        extensions: &'x mut Extensions,
    ) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let (cut, scope) = copy_scope(inputs.spec, &lost, false);
        let (next, attempt, owner) = (inputs.next.clone(), inputs.spec.attempt, inputs.spec.owner);
        // Each copy works out for itself what the stages inside need (a hedged round is
        // rare; its copies outlive what this round could lend them).
        let first: InFlightFuture<'x> = Box::pin(async move {
            let handover = Handover::default();
            let result = run_attempt(
                next,
                req,
                &mut *extensions,
                handover,
                owner,
                cut,
                Some(scope),
                attempt,
            )
            .await;
            (result, InFlightExtensions::Caller(extensions))
        });
        let now = Instant::now();
        Race {
            timer: HedgeTimer::start(delay, inputs.spec, now),
            copies: vec![InFlight {
                future: Some(first),
                attempt,
                started: now,
                withdrawal: None,
            }],
            hedging,
            inputs,
            lost,
            hedges: 0,
            superseded: Vec::new(),
            last_failure: None,
        }
    }

    /// The next copy to finish, or the timer of the next hedge.
    async fn next_event(&mut self) -> Event<'x> {
        std::future::poll_fn(|cx| {
            for (i, copy) in self.copies.iter_mut().enumerate() {
                if let Some(f) = copy.future.as_mut()
                    && let Poll::Ready(out) = f.as_mut().poll(cx)
                {
                    return Poll::Ready(Event::Done(i, out));
                }
            }
            if self.timer.poll_due(cx) {
                return Poll::Ready(Event::HedgeDue);
            }
            Poll::Pending
        })
        .await
    }

    /// Sends a hedge, when the body can be copied and the hedge budget allows one (spent,
    /// no hedge now, nor later in this round), and sets the timer of the next.
    fn send_hedge(&mut self) {
        self.timer.disarm();
        let origin = &self.inputs.spec.origin;
        let Some(copy) = self
            .inputs
            .template
            .as_ref()
            .and_then(crate::stage::copy_request)
        else {
            return;
        };
        let withdrawal = match &self.hedging.budget {
            None => None,
            Some(b) => match b.withdraw() {
                Some(w) => Some(w),
                None => {
                    crate::metrics::hedge_skipped(origin, "budget");
                    return;
                }
            },
        };
        let attempt = self.inputs.spec.attempt + self.copies.len() as u32;
        let future = self.launch_hedge(copy, attempt);
        self.copies.push(InFlight {
            future: Some(future),
            attempt,
            started: Instant::now(),
            withdrawal,
        });
        self.hedges += 1;
        crate::metrics::hedge_sent(origin);
        self.timer.arm(Instant::now(), self.hedges);
    }

    /// A hedge's future, on a copy of the base extensions, owned there.
    fn launch_hedge(&self, req: Request, attempt: u32) -> InFlightFuture<'x> {
        let (cut, scope) = copy_scope(self.inputs.spec, &self.lost, true);
        let mut ext = self.inputs.base.clone();
        let next = self.inputs.next.clone();
        Box::pin(async move {
            let owner = crate::stage::scope::owner_of_copy(&ext);
            let handover = Handover::default();
            let result = run_attempt(
                next,
                req,
                &mut ext,
                handover,
                owner,
                cut,
                Some(scope),
                attempt,
            )
            .await;
            (result, InFlightExtensions::Own(ext))
        })
    }

    /// Takes in the copy `index` that finished: the winner, or `None` while the race goes
    /// on. A copy refused locally sent nothing: it never ends the race while another copy
    /// is in flight (a hedge refused so is not counted either); a failure the retry would
    /// retry waits for the copies still in flight.
    fn settle(&mut self, index: usize, (result, ext): InFlightOutput<'x>) -> Option<Finished<'x>> {
        self.copies[index].future = None;
        let evidence = copy_evidence(&result, ext.get(), self.copies[index].attempt);
        let in_flight = self.copies.iter().any(|c| c.future.is_some());
        let finished = Finished {
            result,
            extensions: ext,
            evidence,
        };
        if let Some(reason) = refused_locally(&finished.evidence) {
            return self.refused(index, finished, reason, in_flight);
        }
        if !in_flight
            || (self.inputs.is_final)(
                &finished.evidence,
                &finished.result,
                finished.evidence.attempt,
            )
        {
            if let Some(earlier) = self.last_failure.take() {
                self.superseded.push(record_of(earlier.evidence));
            }
            return Some(finished);
        }
        // A failure the retry would retry: the copies in flight may still answer.
        self.keep_failure(finished);
        None
    }

    /// Copy `index` was refused locally (by a breaker, a pause, the concurrency limit, a
    /// missing token): it leaves the race to the copies that were sent. A hedge refused so
    /// is taken back (no record, its budget refunded, no further hedge); the first copy's
    /// refusal is kept as the outcome should no other copy answer.
    fn refused(
        &mut self,
        index: usize,
        finished: Finished<'x>,
        reason: &'static str,
        in_flight: bool,
    ) -> Option<Finished<'x>> {
        if index > 0 {
            self.take_back_hedge(index, reason);
            if in_flight {
                return None;
            }
            return Some(self.last_failure.take().unwrap_or(finished));
        }
        if !in_flight {
            return Some(finished);
        }
        self.keep_failure(finished);
        None
    }

    /// Keeps a failure while other copies may answer (an earlier one is superseded).
    fn keep_failure(&mut self, finished: Finished<'x>) {
        if let Some(earlier) = self.last_failure.replace(finished) {
            self.superseded.push(record_of(earlier.evidence));
        }
    }

    /// Hedge `index` was refused locally: nothing went out, so its budget goes back, it is
    /// no hedge sent, and no further one is tried.
    fn take_back_hedge(&mut self, index: usize, reason: &'static str) {
        if let (Some(b), Some(w)) = (&self.hedging.budget, self.copies[index].withdrawal) {
            b.refund(w);
        }
        crate::metrics::hedge_skipped(&self.inputs.spec.origin, reason);
        self.hedges -= 1;
        self.timer.disarm();
    }

    /// The race is decided: the copies still running lost, and dropping them is a
    /// cancellation (their breakers must not count it).
    fn finish(mut self, winner: Finished<'x>, window: Option<&Window>) -> RaceOutcome {
        let spec = self.inputs.spec;
        self.lost.store(true, Ordering::Release);
        let mut cancelled_copies = Vec::new();
        for copy in self.copies.iter_mut() {
            if let Some(future) = copy.future.take() {
                drop(future);
                cancelled_copies.push(cancelled(copy.attempt, copy.started, &spec.origin));
            }
        }
        if let Some(window) = window {
            let first = if winner.evidence.attempt == spec.attempt {
                FirstCopy::Won(&winner.evidence)
            } else {
                FirstCopy::Lost(spec.attempt)
            };
            let losers = cancelled_copies.iter().chain(&self.superseded);
            self.hedging.record_first_copy(window, first, losers);
        }
        if winner.evidence.attempt != spec.attempt {
            crate::metrics::hedge_won(&spec.origin);
        }
        let hedge_extensions = match winner.extensions {
            InFlightExtensions::Own(e) => Some(e),
            InFlightExtensions::Caller(_) => None,
        };
        let mut losers = std::mem::take(&mut self.superseded);
        losers.extend(cancelled_copies);
        RaceOutcome {
            result: winner.result,
            evidence: winner.evidence,
            hedge_extensions,
            losers,
            hedges: self.hedges,
        }
    }
}

/// A copy's cut and its scope for the stages inside (`hedge`: an extra copy).
fn copy_scope(
    spec: &RoundSpec,
    lost: &Arc<AtomicBool>,
    hedge: bool,
) -> (Option<Instant>, AttemptScope) {
    let cut = attempt_cut(spec.deadline, spec.attempt_timeout);
    let scope = AttemptScope {
        cut,
        lost: Some(lost.clone()),
        hedge,
    };
    (cut, scope)
}
