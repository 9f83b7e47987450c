//! The race of one hedged round: the first copy on the caller's extensions, a hedge each
//! time the timer fires, until a copy comes back with an outcome the retry would keep.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::stage::{Handover, RestOfStack};
use http::Extensions;
use reqwest::{Request, Response};
use tokio::time::Instant;

use super::delay::{FirstCopy, HedgeTimer};
use super::record::{
    BaseSnapshot, RaceOutcome, cancelled, copy_evidence, record_of, refused_locally,
};
use super::{Hedging, Round, RoundSpec};
use crate::record::{AttemptRecord, AttemptScope, RequestEvidence, RequestRecord};
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
    /// The request each hedge copies.
    pub(super) template: Template<'r>,
    /// What each hedge's extensions are made from, taken before the first copy started.
    pub(super) base: BaseSnapshot,
}

/// The request each hedge copies: the one the retry loop keeps for a retry (the first copy
/// is a copy of it), or, when it keeps none, a copy made before the first copy left.
pub(super) enum Template<'r> {
    Kept(&'r Request),
    /// `None`: its body cannot be copied, no hedge (boxed: this path is rare, and the
    /// round's future would otherwise carry a second request's room).
    Own(Option<Box<Request>>),
}

impl Template<'_> {
    /// A copy to send as a hedge.
    fn copy(&self) -> Option<Request> {
        match self {
            Template::Kept(req) => crate::stage::copy_request(req),
            Template::Own(req) => req.as_deref().and_then(crate::stage::copy_request),
        }
    }
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

/// The first copy, pinned in place in the round's future (it was started before anyone
/// knew whether a hedge would be sent, so it is not boxed): polled and dropped there.
trait PinnedCopy<'x> {
    fn poll_copy(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<InFlightOutput<'x>>;
    /// Drops the copy in place (a cancellation, when it has not finished).
    fn cancel(self: Pin<&mut Self>);
}

/// The first copy's future hands the caller's extensions back with its result.
type FirstOutput<'x> = (reqwest_middleware::Result<Response>, &'x mut Extensions);

impl<'x, T: Future<Output = FirstOutput<'x>>> PinnedCopy<'x> for Option<T> {
    fn poll_copy(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<InFlightOutput<'x>> {
        match self.as_pin_mut() {
            Some(future) => future
                .poll(cx)
                .map(|(result, ext)| (result, InFlightExtensions::Caller(ext))),
            None => Poll::Pending,
        }
    }

    fn cancel(mut self: Pin<&mut Self>) {
        self.set(None);
    }
}

type FirstSlot<'f, 'x> = Pin<&'f mut (dyn PinnedCopy<'x> + Send + 'f)>;

/// A copy's future: the first copy's, in place, or a hedge's, boxed.
enum CopyFuture<'f, 'x> {
    First(FirstSlot<'f, 'x>),
    Hedge(InFlightFuture<'x>),
}

impl<'x> CopyFuture<'_, 'x> {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<InFlightOutput<'x>> {
        match self {
            CopyFuture::First(first) => first.as_mut().poll_copy(cx),
            CopyFuture::Hedge(hedge) => hedge.as_mut().poll(cx),
        }
    }

    fn cancel(self) {
        match self {
            CopyFuture::First(mut first) => first.as_mut().cancel(),
            CopyFuture::Hedge(hedge) => drop(hedge),
        }
    }
}

/// One copy of the request in flight in a round (the first, or a hedge).
struct InFlight<'f, 'x> {
    future: Option<CopyFuture<'f, 'x>>,
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

/// A race under way: the first copy (in place) and the hedges sent since the timer fired.
struct Race<'x, 'r, 'f, N, F> {
    hedging: &'r Hedging,
    inputs: RaceInputs<'r, N, F>,
    /// What each hedge's extensions are a copy of.
    base: Extensions,
    /// Set once the race is decided: the copies dropped then were cancelled.
    lost: Arc<AtomicBool>,
    copies: Vec<InFlight<'f, 'x>>,
    timer: HedgeTimer,
    hedges: u32,
    /// Copies that failed first, superseded by a later answer.
    superseded: Vec<AttemptRecord>,
    /// The latest failure the retry would retry, kept while other copies may answer.
    last_failure: Option<Finished<'x>>,
}

impl Hedging {
    /// Runs one attempt of the retry loop as a hedged round: the first copy on the
    /// caller's extensions, against the timer of the first hedge. Answered first (the
    /// common case), it is the round's outcome and no race is built; when the timer fires
    /// first, the race starts with the first copy in flight, and hedges run on copies of
    /// the caller's extensions until one copy wins. `kept`: the request the retry loop
    /// keeps for a retry (`req` is a copy of it). `is_final(evidence, attempt)`: whether
    /// the retry decision would stop on that outcome (then it wins at once). After a race,
    /// the winner's extensions are merged into the caller's (its evidence there, every
    /// copy in the history, the winner last); a first copy answered alone left its records
    /// there itself, as a plain attempt does.
    ///
    /// Not an `async fn` (stage cost rule 1): its arguments are held once, in the block;
    /// the race is made in its box's argument (a named local would keep its room in the
    /// round's future, boxed for every hedged request).
    #[allow(clippy::too_many_arguments, clippy::manual_async_fn)]
    pub(in crate::retry) fn round<'a, N: RestOfStack + 'a, F>(
        &'a self,
        spec: RoundSpec,
        next: &'a N,
        req: Request,
        kept: Option<&'a Request>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        is_final: F,
    ) -> impl Future<Output = Round> + Send + 'a
    where
        F: Fn(&RequestEvidence, &reqwest_middleware::Result<Response>, u32) -> bool
            + Send
            + Sync
            + 'a,
    {
        async move {
            let recorded_before = RequestRecord::attempts_recorded(extensions);
            // What the hedges are copied from: the request the retry loop keeps, else a
            // copy of `req` (a body that cannot be copied sends none).
            let template = match kept {
                Some(kept) => Template::Kept(kept),
                None => Template::Own(crate::stage::copy_request(&req).map(Box::new)),
            };
            // Each hedge runs with a copy of the caller's extensions, less this logical
            // request's records (merged back after the race, renumbered).
            let base = BaseSnapshot::take(extensions);
            let window = self.adaptive_window(&spec.origin);
            let delay = self.delay_from(window.as_deref().and_then(Window::estimate));
            // Read only by a breaker inside that cuts the copy (at the deadline or its
            // attempt timeout): without either, a copy dropped is no verdict however it
            // ends.
            let lost = (spec.deadline.is_some() || spec.attempt_timeout.is_some())
                .then(|| Arc::new(AtomicBool::new(false)));
            let outcome = {
                let mut first = std::pin::pin!(Some(first_copy(
                    next.clone(),
                    &spec,
                    lost.as_ref(),
                    req,
                    &mut *extensions,
                    handover,
                )));
                let started = Instant::now();
                let due = HedgeTimer::first_due(delay, &spec, started);
                match alone(first.as_mut(), due).await {
                    Some(output) => return self.alone_won(output, &spec, window.as_deref()),
                    // Boxed (rare: the timer fired): the round's own future, boxed for
                    // every hedged request, stays the first copy's and its timer's size.
                    None => {
                        Box::pin(
                            Race::after_timer(
                                self,
                                RaceInputs {
                                    spec: &spec,
                                    next,
                                    is_final: &is_final,
                                    template,
                                    base,
                                },
                                delay,
                                lost,
                                first,
                                started,
                            )
                            .run(window.as_deref()),
                        )
                        .await
                    }
                }
            };
            outcome.merge_into(extensions, recorded_before)
        }
    }

    /// The first copy answered before any hedge was due: it is the round's outcome (as the
    /// last copy in flight it wins, whatever it is). It ran as a plain attempt runs, on the
    /// caller's extensions, so it left there what a plain attempt leaves (its evidence,
    /// numbered as this attempt, and its record in the history, or none when nothing
    /// inside wrote one): the retry's decision finishes it as it finishes a plain attempt,
    /// and nothing is merged.
    fn alone_won(
        &self,
        (result, ext): InFlightOutput<'_>,
        spec: &RoundSpec,
        window: Option<&Window>,
    ) -> Round {
        if let Some(window) = window {
            let evidence = copy_evidence(&result, ext.get(), spec.attempt);
            self.record_first_copy(window, FirstCopy::Won(&evidence), std::iter::empty());
        }
        Round { result, hedges: 0 }
    }
}

/// The first copy's future, on the caller's extensions, with what the retry loop lends a
/// plain attempt (`handover`: the request's origin, the kept request to replay, the
/// composed stack's place). Each hedge works out for itself what the stages inside need.
fn first_copy<'x, N: RestOfStack + 'x>(
    next: N,
    spec: &RoundSpec,
    lost: Option<&Arc<AtomicBool>>,
    req: Request,
    extensions: &'x mut Extensions,
    handover: Handover<'x>,
) -> impl Future<Output = FirstOutput<'x>> + Send + 'x {
    let (cut, scope) = copy_scope(spec, lost, false);
    // Without a deadline or an attempt timeout the scope is the default one (no cut, no
    // "lost" flag, no hedge), which the stages inside assume when there is none: as for
    // a plain attempt, none is handed inward.
    let scope = (spec.deadline.is_some() || spec.attempt_timeout.is_some()).then_some(scope);
    run_attempt(
        next,
        req,
        extensions,
        handover,
        spec.owner,
        cut,
        scope,
        spec.attempt,
    )
}

/// Runs the first copy alone until it answers (`Some`) or the first hedge is `due`
/// (`None`); the copy is polled first, so an answer ready when the timer fires wins.
async fn alone<'x, P: PinnedCopy<'x> + ?Sized>(
    mut first: Pin<&mut P>,
    due: Option<Instant>,
) -> Option<InFlightOutput<'x>> {
    let mut sleep = std::pin::pin!(due.map(tokio::time::sleep_until));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = first.as_mut().poll_copy(cx) {
            return Poll::Ready(Some(output));
        }
        let due = sleep
            .as_mut()
            .as_pin_mut()
            .is_some_and(|sleep| sleep.poll(cx).is_ready());
        if due {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    })
    .await
}

impl<'x, 'r, 'f, N: RestOfStack + 'x, F> Race<'x, 'r, 'f, N, F>
where
    F: Fn(&RequestEvidence, &reqwest_middleware::Result<Response>, u32) -> bool + Sync,
{
    /// The race, once the timer of the first hedge fired with the `first` copy (sent at
    /// `started`) in flight.
    fn after_timer(
        hedging: &'r Hedging,
        inputs: RaceInputs<'r, N, F>,
        delay: Duration,
        lost: Option<Arc<AtomicBool>>,
        first: FirstSlot<'f, 'x>,
        started: Instant,
    ) -> Self {
        Race {
            timer: HedgeTimer::fired(delay, inputs.spec),
            copies: vec![InFlight {
                future: Some(CopyFuture::First(first)),
                attempt: inputs.spec.attempt,
                started,
                withdrawal: None,
            }],
            base: inputs.base.extensions(),
            hedging,
            inputs,
            lost: lost.unwrap_or_default(),
            hedges: 0,
            superseded: Vec::new(),
            last_failure: None,
        }
    }

    /// Sends the first hedge (its timer just fired), and goes on until a copy wins.
    async fn run(mut self, window: Option<&Window>) -> RaceOutcome {
        self.send_hedge();
        let winner = loop {
            match self.next_event().await {
                Event::HedgeDue => self.send_hedge(),
                Event::Done(index, output) => {
                    if let Some(winner) = self.settle(index, output) {
                        break winner;
                    }
                }
            }
        };
        self.finish(winner, window)
    }

    /// The next copy to finish, or the timer of the next hedge.
    async fn next_event(&mut self) -> Event<'x> {
        std::future::poll_fn(|cx| {
            for (i, copy) in self.copies.iter_mut().enumerate() {
                if let Some(f) = copy.future.as_mut()
                    && let Poll::Ready(out) = f.poll(cx)
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
        let Some(copy) = self.inputs.template.copy() else {
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
            future: Some(CopyFuture::Hedge(future)),
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
        let (cut, scope) = copy_scope(self.inputs.spec, Some(&self.lost), true);
        let mut ext = self.base.clone();
        let next = self.inputs.next.clone();
        Box::pin(async move {
            let owner = crate::stage::scope::owner_of_copy(&ext);
            let handover = Handover::default();
            let (result, _) = run_attempt(
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
                future.cancel();
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
    lost: Option<&Arc<AtomicBool>>,
    hedge: bool,
) -> (Option<Instant>, AttemptScope) {
    let cut = attempt_cut(spec.deadline, spec.attempt_timeout);
    let scope = AttemptScope {
        cut,
        lost: lost.cloned(),
        hedge,
    };
    (cut, scope)
}
