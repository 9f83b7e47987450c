//! When a hedge is due: the round's delay (fixed, or the origin's latency percentile),
//! the timer that fires it, and the first copy's latency fed back to the estimate.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::{HedgeDelay, Hedging, RoundSpec};
use crate::origin::Origin;
use crate::record::{AttemptRecord, FailureKind, RequestEvidence};
use crate::retry::latency::Window;

impl Hedging {
    pub(super) fn delay_from(&self, estimate: Option<Duration>) -> Duration {
        match self.delay {
            HedgeDelay::Fixed(d) => d,
            // Not `clamp`: bounds a built middleware never accepts (`min > max`, refused by
            // `validate`) can still reach `current_delay` on an unbuilt clone, and must not
            // panic there.
            HedgeDelay::Adaptive { min, max, .. } => estimate.map_or(max, |e| e.max(min).min(max)),
        }
    }

    /// The origin's latency window, when the delay is adaptive (a fixed one reads none).
    pub(super) fn adaptive_window(&self, origin: &Origin) -> Option<Arc<Window>> {
        matches!(self.delay, HedgeDelay::Adaptive { .. }).then(|| self.latencies.window(origin))
    }

    /// Feeds the first copy's latency to the estimate: its time to a successful answer
    /// (2xx or 3xx), or, cancelled, the time it had run (a lower bound that keeps the slow
    /// tail's share true). An error answer (a `404` in 1 ms, a `503` shed at once) is no
    /// sample: it says how fast the origin refuses, not how long a request it serves
    /// takes, and a share of fast errors would pull the percentile down until every
    /// request to the origin is hedged.
    pub(super) fn record_first_copy<'r>(
        &self,
        window: &Window,
        first: FirstCopy<'_>,
        mut losers: impl Iterator<Item = &'r AttemptRecord>,
    ) {
        let sample = match first {
            FirstCopy::Won(evidence) => successful(evidence).then_some(evidence.elapsed),
            FirstCopy::Lost(attempt) => losers
                .find(|r| r.evidence.attempt == attempt)
                .filter(|r| {
                    r.evidence.failure == Some(FailureKind::Cancelled) || successful(&r.evidence)
                })
                .map(|r| r.evidence.elapsed),
        };
        if let Some(sample) = sample {
            self.latencies.record(window, sample);
        }
    }
}

/// Whether a copy's answer is a latency sample: a response head with a 2xx or 3xx status
/// (the answers a breaker counts as successes).
fn successful(evidence: &RequestEvidence) -> bool {
    evidence
        .status()
        .is_some_and(|s| s.is_success() || s.is_redirection())
}

/// How the first copy of a round ended, for its latency sample.
pub(super) enum FirstCopy<'e> {
    /// It won, with this evidence.
    Won(&'e RequestEvidence),
    /// It lost: its record, if any, is among the losers under this attempt number.
    Lost(u32),
}

/// The timer of the next hedge: one delay after the previous copy was sent, while the
/// request may send more hedges and the hedge would start before the deadline.
pub(super) struct HedgeTimer {
    delay: Duration,
    hedges_left: u32,
    deadline: Option<Instant>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl HedgeTimer {
    /// When the first hedge of `spec`'s round, started `now`, is due (`None`: never).
    pub(super) fn first_due(delay: Duration, spec: &RoundSpec, now: Instant) -> Option<Instant> {
        due_at(delay, spec.hedges_left, spec.deadline, now, 0)
    }

    /// The timer of a round whose first hedge was due (disarmed: the hedge arms it again).
    pub(super) fn fired(delay: Duration, spec: &RoundSpec) -> Self {
        HedgeTimer {
            delay,
            hedges_left: spec.hedges_left,
            deadline: spec.deadline,
            sleep: None,
        }
    }

    /// Sets the timer one delay after `from`, when a hedge beyond the `sent` ones may go.
    pub(super) fn arm(&mut self, from: Instant, sent: u32) {
        self.sleep = due_at(self.delay, self.hedges_left, self.deadline, from, sent)
            .map(|at| Box::pin(tokio::time::sleep_until(at)));
    }

    /// No (further) hedge for now.
    pub(super) fn disarm(&mut self) {
        self.sleep = None;
    }

    /// Whether a hedge is due.
    pub(super) fn poll_due(&mut self, cx: &mut Context<'_>) -> bool {
        self.sleep
            .as_mut()
            .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready())
    }
}

/// One `delay` after `from`, when a hedge beyond the `sent` ones may go (fewer than
/// `hedges_left`) and would start before the `deadline`.
fn due_at(
    delay: Duration,
    hedges_left: u32,
    deadline: Option<Instant>,
    from: Instant,
    sent: u32,
) -> Option<Instant> {
    from.checked_add(delay)
        .filter(|at| sent < hedges_left && deadline.is_none_or(|d| *at < d))
}
