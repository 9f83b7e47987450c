//! The pure state machine of one origin's breaker: no I/O, no locks, time passed in.
//!
//! ```text
//!            policy trips                 open period over
//!  Closed ─────────────────▶ Open ─────────────────────────▶ HalfOpen
//!    ▲                        ▲                                 │
//!    │                        └──────── a probe fails ──────────┤
//!    └──────────── `half_open_probes` probes succeed ───────────┘
//! ```
//!
//! `isolate` forces [`BreakerState::Isolated`] until `reset`; a server-directed pause is
//! kept beside the state and turns every request away until it ends, whatever the state.

use std::time::Duration;

use tokio::time::Instant;

use super::config::BreakerConfig;
use super::policy::{Outcome, PolicyState, SlowCounts, TripPolicy, Window};

pub use crate::error::breaker::BreakerState;

/// A change of state, reported to the registry's listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Transition {
    /// The state left.
    pub from: BreakerState,
    /// The state entered.
    pub to: BreakerState,
    /// When it happened.
    pub at: Instant,
    /// For a transition to Open: how long it stays open.
    pub open_for: Option<Duration>,
    /// For a transition to Open: what tripped it.
    pub cause: Option<TripCause>,
}

/// What opened a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TripCause {
    /// The [`TripPolicy`] counted enough failures.
    Failures,
    /// The share of slow calls reached the [`SlowCalls`](super::SlowCalls) rate.
    SlowCalls,
    /// A HalfOpen probe failed.
    ProbeFailed,
    /// A HalfOpen probe took longer than the slow-call threshold.
    ProbeSlow,
}

/// The right to send one attempt, handed out by [`Breaker::try_acquire`]; give it back
/// with [`Breaker::record`] or [`Breaker::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    generation: u32,
    // The breaker's count of connection losses when the attempt was admitted: a loss
    // counted since then was the same event (see `Outcome::ConnectionLost`).
    losses: u32,
    probe: bool,
}

/// The bits of the connection-loss count a [`Ticket`] compares (it is published in 30 bits
/// of the registry's lock-free word). An attempt would have to stay in flight while 2³⁰
/// losses were counted for two counts to be confused.
pub(crate) const LOSS_BITS: u32 = 30;
const LOSS_MASK: u32 = (1 << LOSS_BITS) - 1;

impl Ticket {
    /// Whether this attempt is a HalfOpen probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// The ticket [`Breaker::try_acquire`] hands out while Closed, for a breaker of
    /// `generation` that has counted `losses` connection losses (the registry's lock-free
    /// path, which read both from the word the breaker's [`Breaker::quiet_admission`] was
    /// published in).
    pub(crate) fn closed(generation: u32, losses: u32) -> Ticket {
        Ticket {
            generation,
            losses: losses & LOSS_MASK,
            probe: false,
        }
    }

    /// Whether [`Breaker::record`] of `outcome` with this ticket does nothing but note the
    /// time in every state: a neutral outcome of a non-probe attempt (Closed policies
    /// ignore neutral outcomes; in the other states only probes are counted).
    pub(crate) fn never_counts(&self, outcome: Outcome) -> bool {
        !self.probe && outcome == Outcome::Neutral
    }

    /// Whether [`Breaker::release`] of this ticket does nothing: it holds no probe slot.
    pub(crate) fn holds_nothing(&self) -> bool {
        !self.probe
    }
}

pub use crate::error::breaker::RejectReason;

/// A request turned away by [`Breaker::try_acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rejection {
    /// Why.
    pub reason: RejectReason,
    /// The breaker's state at that moment.
    pub state: BreakerState,
    /// When trying again may succeed: the end of the open period or the pause, the
    /// configured `half_open_retry_in` while probes are busy; `None` when isolated.
    pub retry_in: Option<Duration>,
}

/// One origin's breaker. Every method takes the registry's [`BreakerConfig`] (kept once
/// per registry, not per breaker) and the current time.
///
/// Size: see [`Breaker::SIZE`]; nothing is allocated on the heap, but for the slow-call
/// window of a breaker whose config has [`slow_calls`](BreakerConfig::slow_calls).
#[derive(Debug, Clone)]
pub struct Breaker {
    state: BreakerState,
    // Bumped on every transition: a ticket from an older state is stale and its outcome
    // is not counted (an in-flight Closed request that fails after the breaker tripped
    // must not count against the HalfOpen probe).
    generation: u32,
    // Trips since the breaker was last Closed: drives the growth of the open period.
    trips: u32,
    // Connection losses counted (modulo 2^30): a ticket admitted before the last one was
    // in flight when that event struck, so its own loss is the same event.
    losses: u32,
    probes_in_flight: u32,
    probe_successes: u32,
    since: Instant,
    open_until: Instant,
    paused_until: Option<Instant>,
    last_used: Instant,
    rejections: u64,
    policy: PolicyState,
    // Only with `BreakerConfig::slow_calls`, made on the first timed call: boxed, so a
    // breaker without it stays at its size.
    slow: Option<Box<Window<SlowCounts>>>,
}

// Stated in the docs (248 bytes on 64-bit targets); keep it small.
const _: () = assert!(Breaker::SIZE <= 256);

impl Breaker {
    /// `size_of::<Breaker>()`: the memory of one breaker, all inline.
    pub const SIZE: usize = std::mem::size_of::<Breaker>();

    /// A Closed breaker.
    pub fn new(now: Instant) -> Self {
        Breaker {
            state: BreakerState::Closed,
            generation: 0,
            trips: 0,
            losses: 0,
            probes_in_flight: 0,
            probe_successes: 0,
            since: now,
            open_until: now,
            paused_until: None,
            last_used: now,
            rejections: 0,
            policy: PolicyState::new(now),
            slow: None,
        }
    }

    /// The state as last updated (an Open breaker whose period is over still says Open
    /// until the next [`try_acquire`](Self::try_acquire) moves it to HalfOpen).
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// Asks to send one attempt at `now`. Moves Open to HalfOpen when the open period is
    /// over (the transition is returned too).
    pub fn try_acquire(
        &mut self,
        config: &BreakerConfig,
        now: Instant,
    ) -> (Result<Ticket, Rejection>, Option<Transition>) {
        self.last_used = now;
        let mut transition = None;
        if let Some(until) = self.paused_until {
            if now < until && self.state != BreakerState::Isolated {
                return (
                    Err(self.reject(RejectReason::Paused, Some(until - now))),
                    None,
                );
            }
            self.paused_until = None;
        }
        if self.state == BreakerState::Open && now >= self.open_until {
            transition = Some(self.enter(BreakerState::HalfOpen, now, None));
        }
        let result = match self.state {
            BreakerState::Closed => Ok(self.ticket(false)),
            BreakerState::HalfOpen => {
                if self.probes_in_flight + self.probe_successes < config.half_open_probes {
                    self.probes_in_flight += 1;
                    Ok(self.ticket(true))
                } else {
                    Err(self.reject(RejectReason::ProbesBusy, Some(config.half_open_retry_in)))
                }
            }
            BreakerState::Open => {
                let retry_in = self.open_until - now;
                Err(self.reject(RejectReason::Open, Some(retry_in)))
            }
            BreakerState::Isolated => Err(self.reject(RejectReason::Isolated, None)),
        };
        (result, transition)
    }

    /// Counts the outcome of the attempt `ticket` was given for. It is not timed: with
    /// [`slow_calls`](BreakerConfig::slow_calls) configured, use
    /// [`record_timed`](Self::record_timed). (The middleware records timed; the tests of
    /// the state machine use this.)
    #[cfg(test)]
    pub fn record(
        &mut self,
        config: &BreakerConfig,
        ticket: Ticket,
        outcome: Outcome,
        now: Instant,
    ) -> Option<Transition> {
        self.record_timed(config, ticket, outcome, None, now)
    }

    /// Counts the outcome of the attempt `ticket` was given for, which took `took` (from
    /// leaving for the network to its response head; `None`: not timed). With
    /// [`slow_calls`](BreakerConfig::slow_calls) configured, a timed success or failure
    /// also counts in the slow-call window, and a slow probe re-opens a HalfOpen breaker.
    pub fn record_timed(
        &mut self,
        config: &BreakerConfig,
        ticket: Ticket,
        outcome: Outcome,
        took: Option<Duration>,
        now: Instant,
    ) -> Option<Transition> {
        self.last_used = now;
        if ticket.generation != self.generation {
            return None;
        }
        let outcome = self.one_per_event(ticket, outcome);
        let slow = match (&config.slow_calls, took) {
            (Some(trip), Some(took)) if outcome != Outcome::Neutral => {
                Some((trip, took > trip.duration_threshold))
            }
            _ => None,
        };
        match self.state {
            BreakerState::Closed => {
                let by_failures = self.policy.record(&config.policy, outcome, now);
                let by_slowness = slow.is_some_and(|(trip, is_slow)| {
                    self.slow
                        .get_or_insert_with(|| Box::new(Window::new(now)))
                        .record_slow(trip, is_slow, now)
                });
                match (by_failures, by_slowness) {
                    (true, _) => Some(self.trip(config, now, TripCause::Failures)),
                    (false, true) => Some(self.trip(config, now, TripCause::SlowCalls)),
                    (false, false) => None,
                }
            }
            BreakerState::HalfOpen if ticket.probe => {
                self.probes_in_flight = self.probes_in_flight.saturating_sub(1);
                match outcome {
                    Outcome::Failure | Outcome::ConnectionLost => {
                        Some(self.trip(config, now, TripCause::ProbeFailed))
                    }
                    _ if slow.is_some_and(|(_, is_slow)| is_slow) => {
                        Some(self.trip(config, now, TripCause::ProbeSlow))
                    }
                    Outcome::Success => {
                        self.probe_successes += 1;
                        (self.probe_successes >= config.half_open_probes)
                            .then(|| self.enter(BreakerState::Closed, now, None))
                    }
                    Outcome::Neutral => None,
                }
            }
            _ => None,
        }
    }

    /// A connection loss counts as a failure when its attempt was admitted after the last
    /// counted one (which it now is), and is neutral when it was in flight then: the same
    /// event struck it.
    fn one_per_event(&mut self, ticket: Ticket, outcome: Outcome) -> Outcome {
        match outcome {
            Outcome::ConnectionLost if ticket.losses == self.losses => {
                self.losses = self.losses.wrapping_add(1) & LOSS_MASK;
                Outcome::Failure
            }
            Outcome::ConnectionLost => Outcome::Neutral,
            other => other,
        }
    }

    /// Gives back a ticket whose attempt ended with no outcome (its future was dropped):
    /// a probe's slot is freed for another request.
    pub fn release(&mut self, ticket: Ticket) {
        if ticket.probe && ticket.generation == self.generation {
            self.probes_in_flight = self.probes_in_flight.saturating_sub(1);
        }
    }

    /// Turns every request away until `until` (a server-directed pause). An existing
    /// later pause is kept: pauses only ever grow. Returns whether the pause grew.
    pub fn pause_until(&mut self, until: Instant) -> bool {
        if self.paused_until.is_some_and(|p| p >= until) {
            return false;
        }
        self.paused_until = Some(until);
        true
    }

    /// Forces the breaker open until [`reset`](Self::reset).
    pub fn isolate(&mut self, now: Instant) -> Option<Transition> {
        (self.state != BreakerState::Isolated)
            .then(|| self.enter(BreakerState::Isolated, now, None))
    }

    /// Closes the breaker and forgets its counts, trips and pause.
    pub fn reset(&mut self, now: Instant) -> Option<Transition> {
        self.paused_until = None;
        self.trips = 0;
        if self.state == BreakerState::Closed {
            self.policy.reset(now);
            self.slow = None;
            return None;
        }
        Some(self.enter(BreakerState::Closed, now, None))
    }

    fn trip(&mut self, config: &BreakerConfig, now: Instant, cause: TripCause) -> Transition {
        self.trips = self.trips.saturating_add(1);
        let open_for = config.open_duration_for(self.trips);
        self.open_until = now + open_for;
        Transition {
            cause: Some(cause),
            ..self.enter(BreakerState::Open, now, Some(open_for))
        }
    }

    fn enter(&mut self, to: BreakerState, now: Instant, open_for: Option<Duration>) -> Transition {
        let from = self.state;
        self.state = to;
        self.generation = self.generation.wrapping_add(1);
        self.since = now;
        self.probes_in_flight = 0;
        self.probe_successes = 0;
        if to == BreakerState::Closed {
            self.trips = 0;
            self.policy.reset(now);
            if let Some(slow) = &mut self.slow {
                **slow = Window::new(now);
            }
        }
        Transition {
            from,
            to,
            at: now,
            open_for,
            cause: None,
        }
    }

    fn ticket(&self, probe: bool) -> Ticket {
        Ticket {
            generation: self.generation,
            losses: self.losses,
            probe,
        }
    }

    fn reject(&mut self, reason: RejectReason, retry_in: Option<Duration>) -> Rejection {
        self.rejections = self.rejections.saturating_add(1);
        Rejection {
            reason,
            state: self.state,
            retry_in,
        }
    }

    /// When the current state began.
    pub fn since(&self) -> Instant {
        self.since
    }

    /// When the breaker was last asked or told anything.
    pub fn last_used(&self) -> Instant {
        self.last_used
    }

    /// When an Open breaker's period ends (meaningless in other states).
    pub fn open_until(&self) -> Instant {
        self.open_until
    }

    /// The end of the server-directed pause, if one is set (it may be over).
    pub fn paused_until(&self) -> Option<Instant> {
        self.paused_until
    }

    /// Trips since the breaker was last Closed.
    pub fn trips(&self) -> u32 {
        self.trips
    }

    /// Probes admitted in this HalfOpen period whose outcome is not in yet.
    pub fn probes_in_flight(&self) -> u32 {
        self.probes_in_flight
    }

    /// Failures in a row counted while Closed.
    pub fn consecutive_failures(&self) -> u32 {
        self.policy.consecutive_failures()
    }

    /// `(attempts, failures)` in the failure-ratio window at `now` (zeros under the
    /// consecutive-failures policy).
    pub fn window_counts(&self, config: &BreakerConfig, now: Instant) -> (u32, u32) {
        self.policy.window_counts(&config.policy, now)
    }

    /// Requests turned away since the breaker was created.
    pub fn rejections(&self) -> u64 {
        self.rejections
    }

    /// The generation of the current state: a [`Ticket`] of another is stale.
    pub(crate) fn generation(&self) -> u32 {
        self.generation
    }

    /// The connection losses counted so far, modulo 2^30 (what a [`Ticket`] admitted now
    /// carries).
    pub(crate) fn losses(&self) -> u32 {
        self.losses
    }

    /// `(timed calls, slow calls)` in the slow-call window at `now`: zeros without
    /// [`slow_calls`](BreakerConfig::slow_calls) or before the first timed call.
    pub fn slow_call_counts(&self, config: &BreakerConfig, now: Instant) -> (u32, u32) {
        match (&config.slow_calls, &self.slow) {
            (Some(trip), Some(window)) => window.slow_counts(trip, now),
            _ => (0, 0),
        }
    }

    /// Whether [`try_acquire`](Self::try_acquire) would, at any time from now until the
    /// next change made through `&mut self`, do nothing but note the time and hand out
    /// [`Ticket::closed`]`(generation)`: Closed, and no pause set (an ended pause still
    /// set is cleared by the next `try_acquire`, so it is not quiet yet).
    pub(crate) fn quiet_admission(&self) -> bool {
        self.state == BreakerState::Closed && self.paused_until.is_none()
    }

    /// Whether [`record`](Self::record) of [`Outcome::Success`] with any non-probe ticket
    /// would do nothing but note the time: Closed under the consecutive-failures policy
    /// with no failure counted (a ticket of this generation resets a count of 0 to 0; one
    /// of another generation is stale and not counted). The failure-ratio policy counts
    /// every success in its window, and slow-call trips time every success: neither is
    /// ever quiet.
    pub(crate) fn quiet_success(&self, config: &BreakerConfig) -> bool {
        self.state == BreakerState::Closed
            && matches!(config.policy, TripPolicy::ConsecutiveFailures { .. })
            && config.slow_calls.is_none()
            && self.policy.consecutive_failures() == 0
    }

    /// Whether the registry may forget this breaker at `now` without losing anything a
    /// caller relies on: Closed (or Open with its period over) and not paused.
    pub(crate) fn is_evictable(&self, now: Instant) -> bool {
        let paused = self.paused_until.is_some_and(|p| now < p);
        let open_over = self.state == BreakerState::Open && now >= self.open_until;
        !paused && (self.state == BreakerState::Closed || open_over)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::config::OpenGrowth;
    use crate::breaker::policy::TripPolicy;

    const S: Duration = Duration::from_secs(1);

    fn config() -> BreakerConfig {
        BreakerConfig::default()
            .policy(TripPolicy::consecutive_failures(3))
            .open_duration(10 * S)
    }

    #[test]
    fn the_documented_sizes_hold() {
        // The connection-loss count fits in the padding: the docs' 248 bytes still hold.
        #[cfg(target_pointer_width = "64")]
        assert_eq!(Breaker::SIZE, 248);
    }

    #[test]
    fn configs_the_registry_refuses_never_panic_the_state_machine() {
        let year = Duration::from_secs(365 * 24 * 3600);
        for c in [
            config().open_duration(Duration::MAX),
            config().open_jitter(3.0),
            config().open_jitter(f64::NAN),
            config().open_jitter(-1.0),
            config()
                .open_duration(Duration::MAX)
                .open_growth(OpenGrowth::new(f64::NAN, Duration::MAX)),
            config().open_growth(OpenGrowth::new(-2.0, Duration::ZERO)),
        ] {
            assert!(c.validate().is_err() || c.open_jitter == 0.0, "{c:?}");
            let mut b = Breaker::new(Instant::now());
            for _ in 0..2 {
                trip(&mut b, &c);
                assert_eq!(b.state(), BreakerState::Open, "{c:?}");
                let open_for = b.open_until() - Instant::now();
                assert!(open_for <= year, "{c:?}: open for {open_for:?}");
                // Into HalfOpen and back to Open: a repeated trip grows from the cap.
                let (_, _) = b.try_acquire(&c, b.open_until());
                b.reset(Instant::now());
            }
        }
    }

    /// Sends one attempt at `now` and records `outcome`.
    fn attempt(b: &mut Breaker, c: &BreakerConfig, outcome: Outcome) -> Option<Transition> {
        let now = Instant::now();
        let (ticket, _) = b.try_acquire(c, now);
        b.record(c, ticket.expect("admitted"), outcome, now)
    }

    fn trip(b: &mut Breaker, c: &BreakerConfig) {
        for _ in 0..3 {
            attempt(b, c, Outcome::Failure);
        }
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn closed_stays_closed_below_threshold_and_on_neutral_outcomes() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        attempt(&mut b, &c, Outcome::Failure);
        attempt(&mut b, &c, Outcome::Failure);
        for _ in 0..100 {
            assert_eq!(attempt(&mut b, &c, Outcome::Neutral), None);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.consecutive_failures(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn closed_to_open_on_threshold_with_open_period() {
        let c = config();
        let t0 = Instant::now();
        let mut b = Breaker::new(t0);
        attempt(&mut b, &c, Outcome::Failure);
        attempt(&mut b, &c, Outcome::Failure);
        let t = attempt(&mut b, &c, Outcome::Failure).expect("tripped");
        assert_eq!(
            (t.from, t.to, t.at, t.open_for),
            (BreakerState::Closed, BreakerState::Open, t0, Some(10 * S))
        );
        assert_eq!(b.open_until(), t0 + 10 * S);
        assert_eq!(b.trips(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn open_rejects_with_time_until_probe() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        trip(&mut b, &c);
        tokio::time::advance(4 * S).await;
        let (r, t) = b.try_acquire(&c, Instant::now());
        assert_eq!(t, None);
        assert_eq!(
            r,
            Err(Rejection {
                reason: RejectReason::Open,
                state: BreakerState::Open,
                retry_in: Some(6 * S)
            })
        );
        assert_eq!(b.rejections(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn open_to_half_open_when_period_is_over_admits_one_probe() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        trip(&mut b, &c);
        tokio::time::advance(10 * S).await;
        let now = Instant::now();
        let (r, t) = b.try_acquire(&c, now);
        let ticket = r.expect("probe admitted");
        assert!(ticket.is_probe());
        let t = t.expect("transition");
        assert_eq!((t.from, t.to), (BreakerState::Open, BreakerState::HalfOpen));
        assert_eq!(b.probes_in_flight(), 1);
        let (r2, t2) = b.try_acquire(&c, now);
        assert_eq!(t2, None);
        assert_eq!(
            r2,
            Err(Rejection {
                reason: RejectReason::ProbesBusy,
                state: BreakerState::HalfOpen,
                retry_in: Some(S)
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_to_closed_on_probe_success() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        trip(&mut b, &c);
        tokio::time::advance(10 * S).await;
        let t = attempt(&mut b, &c, Outcome::Success).expect("closed");
        assert_eq!(
            (t.from, t.to, t.open_for),
            (BreakerState::HalfOpen, BreakerState::Closed, None)
        );
        assert_eq!(b.trips(), 0);
        assert_eq!(b.consecutive_failures(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_to_open_on_probe_failure() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        trip(&mut b, &c);
        tokio::time::advance(10 * S).await;
        let t = attempt(&mut b, &c, Outcome::Failure).expect("re-opened");
        assert_eq!(
            (t.from, t.to, t.open_for),
            (BreakerState::HalfOpen, BreakerState::Open, Some(10 * S))
        );
        assert_eq!(b.trips(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_neutral_probe_frees_its_slot() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        trip(&mut b, &c);
        tokio::time::advance(10 * S).await;
        assert_eq!(attempt(&mut b, &c, Outcome::Neutral), None);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert_eq!(b.probes_in_flight(), 0);
        assert!(attempt(&mut b, &c, Outcome::Success).is_some());
        assert_eq!(b.state(), BreakerState::Closed);
    }

    /// `n` tickets admitted now, held in flight together.
    fn in_flight(b: &mut Breaker, c: &BreakerConfig, n: usize) -> Vec<Ticket> {
        let now = Instant::now();
        (0..n)
            .map(|_| b.try_acquire(c, now).0.expect("admitted"))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn connection_losses_of_attempts_in_flight_together_count_once() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        // A reload closes the 50 pooled connections 50 requests were written on.
        let cut = in_flight(&mut b, &c, 50);
        tokio::time::advance(S / 100).await;
        for t in cut {
            assert_eq!(
                b.record(&c, t, Outcome::ConnectionLost, Instant::now()),
                None
            );
        }
        assert_eq!(
            (b.state(), b.consecutive_failures()),
            (BreakerState::Closed, 1)
        );
        // A second reload, later, is a second event: 2 of the 3 the policy needs.
        let cut = in_flight(&mut b, &c, 50);
        for t in cut {
            assert_eq!(
                b.record(&c, t, Outcome::ConnectionLost, Instant::now()),
                None
            );
        }
        assert_eq!(
            (b.state(), b.consecutive_failures()),
            (BreakerState::Closed, 2)
        );
        // Any success in between resets the count as before.
        attempt(&mut b, &c, Outcome::Success);
        assert_eq!(b.consecutive_failures(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_loss_counts_when_its_attempt_started_after_the_last_counted_one() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        let early = in_flight(&mut b, &c, 2);
        let now = Instant::now();
        // The first loss counts; the other early attempt was in flight then: neutral.
        assert_eq!(b.record(&c, early[0], Outcome::ConnectionLost, now), None);
        assert_eq!(b.consecutive_failures(), 1);
        let late = in_flight(&mut b, &c, 1)[0];
        assert_eq!(b.record(&c, early[1], Outcome::ConnectionLost, now), None);
        assert_eq!(b.consecutive_failures(), 1);
        // Admitted after the counted loss (at the same instant: the order is the
        // breaker's, not the clock's): a new event.
        assert_eq!(b.record(&c, late, Outcome::ConnectionLost, now), None);
        assert_eq!(b.consecutive_failures(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_loses_every_connection_trips_after_the_policys_count() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        assert_eq!(attempt(&mut b, &c, Outcome::ConnectionLost), None);
        assert_eq!(attempt(&mut b, &c, Outcome::ConnectionLost), None);
        let t = attempt(&mut b, &c, Outcome::ConnectionLost).expect("the third event trips");
        assert_eq!(
            (t.from, t.to, t.cause),
            (
                BreakerState::Closed,
                BreakerState::Open,
                Some(TripCause::Failures)
            )
        );
        // A probe that loses its connection was admitted after every earlier loss: it
        // re-opens the breaker as any failed probe does.
        tokio::time::advance(10 * S).await;
        let t = attempt(&mut b, &c, Outcome::ConnectionLost).expect("re-opened");
        assert_eq!(
            (t.from, t.to, t.cause),
            (
                BreakerState::HalfOpen,
                BreakerState::Open,
                Some(TripCause::ProbeFailed)
            )
        );
    }

    #[tokio::test(start_paused = true)]
    async fn other_failures_of_attempts_in_flight_together_count_in_full() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        let held = in_flight(&mut b, &c, 3);
        let now = Instant::now();
        // A loss counted first changes nothing for a 503, a refused connect, a timeout.
        let lost = in_flight(&mut b, &c, 1)[0];
        assert_eq!(b.record(&c, lost, Outcome::ConnectionLost, now), None);
        assert_eq!(b.record(&c, held[0], Outcome::Failure, now), None);
        let t = b
            .record(&c, held[1], Outcome::Failure, now)
            .expect("tripped");
        assert_eq!(t.cause, Some(TripCause::Failures));
        // The third was in flight across the trip: stale, as before.
        assert_eq!(b.record(&c, held[2], Outcome::Failure, now), None);
        assert_eq!(b.trips(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_ratio_policy_counts_one_failure_per_connection_event() {
        let c = BreakerConfig::default()
            .policy(TripPolicy::failure_ratio(0.5, 10 * S, 4))
            .open_duration(5 * S);
        let mut b = Breaker::new(Instant::now());
        attempt(&mut b, &c, Outcome::Success);
        attempt(&mut b, &c, Outcome::Success);
        // 40 attempts cut by one reload: one failure in the window, not 40.
        for t in in_flight(&mut b, &c, 40) {
            assert_eq!(
                b.record(&c, t, Outcome::ConnectionLost, Instant::now()),
                None
            );
        }
        assert_eq!(b.window_counts(&c, Instant::now()), (3, 1));
        assert_eq!(b.state(), BreakerState::Closed);
        // One loss per round of fresh attempts: the 4th attempt counted is the 2nd
        // failure of 4, which reaches 0.5.
        assert_eq!(
            attempt(&mut b, &c, Outcome::ConnectionLost).unwrap().to,
            BreakerState::Open
        );
        assert_eq!(b.window_counts(&c, Instant::now()), (4, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_connection_of_a_stale_ticket_counts_nothing_and_starts_no_event() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        let old = in_flight(&mut b, &c, 1)[0];
        trip(&mut b, &c);
        tokio::time::advance(10 * S).await;
        assert!(
            attempt(&mut b, &c, Outcome::Success).is_some(),
            "closed again"
        );
        let now = Instant::now();
        let fresh = in_flight(&mut b, &c, 1)[0];
        assert_eq!(b.record(&c, old, Outcome::ConnectionLost, now), None);
        assert_eq!(b.consecutive_failures(), 0);
        // The stale loss was not counted, so the fresh one is not its event's twin.
        assert_eq!(b.record(&c, fresh, Outcome::ConnectionLost, now), None);
        assert_eq!(b.consecutive_failures(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn released_probe_frees_its_slot() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        trip(&mut b, &c);
        tokio::time::advance(10 * S).await;
        let now = Instant::now();
        let ticket = b.try_acquire(&c, now).0.unwrap();
        assert!(b.try_acquire(&c, now).0.is_err());
        b.release(ticket);
        assert_eq!(b.probes_in_flight(), 0);
        assert!(b.try_acquire(&c, now).0.unwrap().is_probe());
    }

    #[tokio::test(start_paused = true)]
    async fn several_probes_must_all_succeed_to_close() {
        let c = config().half_open_probes(3);
        let mut b = Breaker::new(Instant::now());
        trip(&mut b, &c);
        tokio::time::advance(10 * S).await;
        let now = Instant::now();
        let tickets: Vec<_> = (0..3).map(|_| b.try_acquire(&c, now).0.unwrap()).collect();
        assert_eq!(
            b.try_acquire(&c, now).0.unwrap_err().reason,
            RejectReason::ProbesBusy
        );
        assert_eq!(b.record(&c, tickets[0], Outcome::Success, now), None);
        assert_eq!(b.record(&c, tickets[1], Outcome::Success, now), None);
        // A finished success still holds its place: no fourth probe.
        assert_eq!(
            b.try_acquire(&c, now).0.unwrap_err().reason,
            RejectReason::ProbesBusy
        );
        let t = b.record(&c, tickets[2], Outcome::Success, now).unwrap();
        assert_eq!(t.to, BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn stale_ticket_outcomes_are_ignored() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        let now = Instant::now();
        let old = b.try_acquire(&c, now).0.unwrap();
        trip(&mut b, &c);
        tokio::time::advance(10 * S).await;
        let now = Instant::now();
        let probe = b.try_acquire(&c, now).0.unwrap();
        // The Closed-era request that fails late changes nothing.
        assert_eq!(b.record(&c, old, Outcome::Failure, now), None);
        b.release(old);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert_eq!(b.probes_in_flight(), 1);
        assert_eq!(
            b.record(&c, probe, Outcome::Success, now).unwrap().to,
            BreakerState::Closed
        );
    }

    #[tokio::test(start_paused = true)]
    async fn full_flow_closed_open_half_open_open_half_open_closed() {
        let c = config().open_growth(OpenGrowth::new(2.0, 60 * S));
        let mut b = Breaker::new(Instant::now());
        let mut path = vec![b.state()];
        let mut open_periods = Vec::new();
        let step = |b: &mut Breaker, outcome| {
            let now = Instant::now();
            let (r, t) = b.try_acquire(&c, now);
            let mut ts: Vec<Transition> = t.into_iter().collect();
            ts.extend(b.record(&c, r.unwrap(), outcome, now));
            ts
        };
        let mut log = |ts: Vec<Transition>, path: &mut Vec<BreakerState>| {
            for t in ts {
                path.push(t.to);
                open_periods.extend(t.open_for);
            }
        };
        for _ in 0..3 {
            let ts = step(&mut b, Outcome::Failure);
            log(ts, &mut path);
        }
        tokio::time::advance(10 * S).await;
        let ts = step(&mut b, Outcome::Failure);
        log(ts, &mut path);
        // Grown: the second trip in a row stays open 20 s.
        tokio::time::advance(19 * S).await;
        assert_eq!(
            b.try_acquire(&c, Instant::now()).0.unwrap_err().retry_in,
            Some(S)
        );
        tokio::time::advance(S).await;
        let ts = step(&mut b, Outcome::Success);
        log(ts, &mut path);
        assert_eq!(
            path,
            [
                BreakerState::Closed,
                BreakerState::Open,
                BreakerState::HalfOpen,
                BreakerState::Open,
                BreakerState::HalfOpen,
                BreakerState::Closed
            ]
        );
        assert_eq!(open_periods, [10 * S, 20 * S]);
        assert_eq!(b.trips(), 0);
    }

    fn slow_config() -> BreakerConfig {
        config().slow_calls(
            crate::breaker::SlowCalls::new(S)
                .rate(0.5)
                .minimum_throughput(4)
                .sampling_window(10 * S),
        )
    }

    fn timed(b: &mut Breaker, c: &BreakerConfig, o: Outcome, took: Duration) -> Option<Transition> {
        let now = Instant::now();
        let ticket = b.try_acquire(c, now).0.expect("admitted");
        b.record_timed(c, ticket, o, Some(took), now)
    }

    #[tokio::test(start_paused = true)]
    async fn half_of_four_timed_calls_slow_trips_with_cause_slow_calls() {
        let c = slow_config();
        let mut b = Breaker::new(Instant::now());
        assert_eq!(
            timed(&mut b, &c, Outcome::Success, S),
            None,
            "at the threshold: not slow"
        );
        assert_eq!(timed(&mut b, &c, Outcome::Success, 2 * S), None);
        // A neutral call is not timed; an untimed one neither.
        assert_eq!(timed(&mut b, &c, Outcome::Neutral, 9 * S), None);
        assert_eq!(attempt(&mut b, &c, Outcome::Success), None);
        assert_eq!(b.slow_call_counts(&c, Instant::now()), (2, 1));
        assert_eq!(timed(&mut b, &c, Outcome::Success, S / 2), None);
        assert_eq!(b.slow_call_counts(&c, Instant::now()), (3, 1));
        let t = timed(&mut b, &c, Outcome::Success, 3 * S).expect("2 slow of 4 = 0.5 trips");
        assert_eq!((t.from, t.to), (BreakerState::Closed, BreakerState::Open));
        assert_eq!(t.cause, Some(TripCause::SlowCalls));
        assert_eq!(t.open_for, Some(10 * S));
        // Every success, so the failure policy saw nothing.
        assert_eq!(b.consecutive_failures(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_calls_age_out_of_the_window_and_a_close_forgets_them() {
        let c = slow_config();
        let mut b = Breaker::new(Instant::now());
        for _ in 0..3 {
            timed(&mut b, &c, Outcome::Success, 5 * S);
        }
        assert_eq!(b.slow_call_counts(&c, Instant::now()), (3, 3));
        tokio::time::advance(10 * S).await;
        assert_eq!(b.slow_call_counts(&c, Instant::now()), (0, 0));
        // Three fast calls then one slow: 1 of 4 is below 0.5.
        for _ in 0..3 {
            timed(&mut b, &c, Outcome::Success, S / 10);
        }
        assert_eq!(timed(&mut b, &c, Outcome::Success, 5 * S), None);
        assert_eq!(b.slow_call_counts(&c, Instant::now()), (4, 1));
        // A trip by failures, then a successful probe closes it: the window starts over.
        for _ in 0..3 {
            timed(&mut b, &c, Outcome::Failure, S / 10);
        }
        assert_eq!(b.state(), BreakerState::Open);
        tokio::time::advance(10 * S).await;
        assert_eq!(
            timed(&mut b, &c, Outcome::Success, S / 10).unwrap().to,
            BreakerState::Closed
        );
        assert_eq!(b.slow_call_counts(&c, Instant::now()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_probe_reopens_a_fast_one_closes_and_failures_outrank_slowness() {
        let c = slow_config();
        let mut b = Breaker::new(Instant::now());
        for _ in 0..2 {
            timed(&mut b, &c, Outcome::Failure, 5 * S);
        }
        // The third failure trips both ways: the failures are named.
        let t = timed(&mut b, &c, Outcome::Failure, 5 * S).unwrap();
        assert_eq!(t.cause, Some(TripCause::Failures));
        tokio::time::advance(10 * S).await;
        let t = timed(&mut b, &c, Outcome::Success, 2 * S).expect("a slow probe re-opens");
        assert_eq!(
            (t.from, t.to, t.cause),
            (
                BreakerState::HalfOpen,
                BreakerState::Open,
                Some(TripCause::ProbeSlow)
            )
        );
        assert_eq!(b.trips(), 2);
        tokio::time::advance(10 * S).await;
        let t = timed(&mut b, &c, Outcome::Failure, S / 10).unwrap();
        assert_eq!(t.cause, Some(TripCause::ProbeFailed));
        tokio::time::advance(10 * S).await;
        let t = timed(&mut b, &c, Outcome::Success, S).unwrap();
        assert_eq!((t.to, t.cause), (BreakerState::Closed, None));
    }

    #[tokio::test(start_paused = true)]
    async fn without_slow_calls_configured_timing_changes_nothing() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        for _ in 0..50 {
            assert_eq!(timed(&mut b, &c, Outcome::Success, 3600 * S), None);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.slow_call_counts(&c, Instant::now()), (0, 0));
        assert!(b.slow.is_none(), "nothing allocated");
        assert!(b.quiet_success(&c));
        assert!(!b.quiet_success(&slow_config()));
    }

    #[tokio::test(start_paused = true)]
    async fn ratio_policy_trips_and_recloses_under_paused_clock() {
        let c = BreakerConfig::default()
            .policy(TripPolicy::failure_ratio(0.5, 10 * S, 4))
            .open_duration(5 * S);
        let mut b = Breaker::new(Instant::now());
        attempt(&mut b, &c, Outcome::Success);
        attempt(&mut b, &c, Outcome::Success);
        attempt(&mut b, &c, Outcome::Failure);
        assert_eq!(b.state(), BreakerState::Closed);
        // The successes age out of the window; the failure at 0 s too.
        tokio::time::advance(10 * S).await;
        assert_eq!(b.window_counts(&c, Instant::now()), (0, 0));
        attempt(&mut b, &c, Outcome::Success);
        attempt(&mut b, &c, Outcome::Failure);
        attempt(&mut b, &c, Outcome::Success);
        assert_eq!(b.state(), BreakerState::Closed);
        let t = attempt(&mut b, &c, Outcome::Failure).expect("2 of 4 = 0.5 trips");
        assert_eq!(t.to, BreakerState::Open);
        tokio::time::advance(5 * S).await;
        assert_eq!(
            attempt(&mut b, &c, Outcome::Success).unwrap().to,
            BreakerState::Closed
        );
        // Closing forgets the window.
        assert_eq!(b.window_counts(&c, Instant::now()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn pause_rejects_every_request_until_it_ends() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        assert!(b.pause_until(Instant::now() + 5 * S));
        // A shorter pause does not shorten it.
        assert!(!b.pause_until(Instant::now() + 2 * S));
        tokio::time::advance(2 * S).await;
        let r = b.try_acquire(&c, Instant::now()).0.unwrap_err();
        assert_eq!(
            (r.reason, r.state, r.retry_in),
            (RejectReason::Paused, BreakerState::Closed, Some(3 * S))
        );
        tokio::time::advance(3 * S).await;
        assert!(b.try_acquire(&c, Instant::now()).0.is_ok());
        assert_eq!(b.paused_until(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn isolate_rejects_without_retry_in_until_reset() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        let t = b.isolate(Instant::now()).unwrap();
        assert_eq!(
            (t.from, t.to),
            (BreakerState::Closed, BreakerState::Isolated)
        );
        assert_eq!(b.isolate(Instant::now()), None);
        tokio::time::advance(3600 * S).await;
        let r = b.try_acquire(&c, Instant::now()).0.unwrap_err();
        assert_eq!((r.reason, r.retry_in), (RejectReason::Isolated, None));
        let t = b.reset(Instant::now()).unwrap();
        assert_eq!(
            (t.from, t.to),
            (BreakerState::Isolated, BreakerState::Closed)
        );
        assert!(b.try_acquire(&c, Instant::now()).0.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn reset_closes_an_open_breaker_and_clears_the_pause() {
        let c = config();
        let mut b = Breaker::new(Instant::now());
        trip(&mut b, &c);
        b.pause_until(Instant::now() + 30 * S);
        assert_eq!(b.reset(Instant::now()).unwrap().to, BreakerState::Closed);
        assert_eq!(b.paused_until(), None);
        assert_eq!(b.trips(), 0);
        assert!(b.try_acquire(&c, Instant::now()).0.is_ok());
        assert_eq!(b.reset(Instant::now()), None);
    }

    /// A reference model: the same rules written the plain way (every attempt kept in a
    /// list with its time, the window recomputed by filtering it), to check the
    /// bucketed, generation-counted implementation against.
    mod model {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Advance(u64),
            Attempt(Outcome),
            Hold,
            Finish(usize, Outcome),
            Drop(usize),
        }

        fn outcome() -> impl Strategy<Value = Outcome> {
            prop_oneof![
                3 => Just(Outcome::Failure),
                2 => Just(Outcome::Success),
                1 => Just(Outcome::Neutral),
                2 => Just(Outcome::ConnectionLost)
            ]
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                3 => (0u64..4_000).prop_map(Op::Advance),
                6 => outcome().prop_map(Op::Attempt),
                2 => Just(Op::Hold),
                2 => (0usize..8, outcome()).prop_map(|(i, o)| Op::Finish(i, o)),
                1 => (0usize..8).prop_map(Op::Drop),
            ]
        }

        fn config() -> impl Strategy<Value = BreakerConfig> {
            let policy = prop_oneof![
                (1u32..5).prop_map(TripPolicy::consecutive_failures),
                (1u32..=10, 1u32..=10, 1u32..6).prop_map(|(r, w, m)| {
                    TripPolicy::failure_ratio(f64::from(r) / 10.0, w * S, m)
                }),
            ];
            (policy, 1u32..8, 1u32..4, any::<bool>()).prop_map(|(p, open, probes, grow)| {
                let c = BreakerConfig::default()
                    .policy(p)
                    .open_duration(open * S)
                    .half_open_probes(probes);
                if grow {
                    c.open_growth(OpenGrowth::new(2.0, 4 * open * S))
                } else {
                    c
                }
            })
        }

        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        enum M {
            Closed,
            Open,
            HalfOpen,
        }

        struct Model {
            c: BreakerConfig,
            state: M,
            era: u64,
            closed_at: u64,
            open_until: u64,
            trips: u32,
            consecutive: u32,
            attempts: Vec<(u64, bool)>,
            probes_out: u32,
            probe_ok: u32,
            // Acquires so far, and their number when the last connection loss was counted:
            // a loss counts when its attempt was acquired after that.
            acquires: u64,
            last_loss: u64,
        }

        #[derive(Debug, PartialEq, Eq)]
        enum Answer {
            Admitted { probe: bool },
            Rejected(RejectReason, Option<Duration>),
        }

        impl Model {
            fn open_for(&self) -> u64 {
                let base = self.c.open_duration.as_nanos() as u64;
                match self.c.open_growth {
                    None => base,
                    Some(g) => {
                        let cap = g.max_open_duration.as_nanos() as u64;
                        let mut d = base;
                        for _ in 1..self.trips {
                            d = (d * 2).min(cap);
                        }
                        d
                    }
                }
            }
            fn trip(&mut self, now: u64) {
                self.trips += 1;
                self.state = M::Open;
                self.open_until = now + self.open_for();
                self.probes_out = 0;
                self.probe_ok = 0;
                self.era += 1;
            }
            fn close(&mut self, now: u64) {
                self.state = M::Closed;
                self.trips = 0;
                self.consecutive = 0;
                self.attempts.clear();
                self.closed_at = now;
                self.era += 1;
            }
            fn acquire(&mut self, now: u64) -> (Answer, (u64, u64)) {
                self.acquires += 1;
                if self.state == M::Open && now >= self.open_until {
                    self.state = M::HalfOpen;
                    self.probes_out = 0;
                    self.probe_ok = 0;
                    self.era += 1;
                }
                let answer = match self.state {
                    M::Closed => Answer::Admitted { probe: false },
                    M::Open => Answer::Rejected(
                        RejectReason::Open,
                        Some(Duration::from_nanos(self.open_until - now)),
                    ),
                    M::HalfOpen if self.probes_out + self.probe_ok < self.c.half_open_probes => {
                        self.probes_out += 1;
                        Answer::Admitted { probe: true }
                    }
                    M::HalfOpen => {
                        Answer::Rejected(RejectReason::ProbesBusy, Some(self.c.half_open_retry_in))
                    }
                };
                (answer, (self.era, self.acquires))
            }
            fn record(&mut self, (era, seq): (u64, u64), probe: bool, o: Outcome, now: u64) {
                if era != self.era {
                    return;
                }
                let o = match o {
                    Outcome::ConnectionLost if seq > self.last_loss => {
                        self.last_loss = self.acquires;
                        Outcome::Failure
                    }
                    Outcome::ConnectionLost => Outcome::Neutral,
                    o => o,
                };
                match (self.state, probe) {
                    (M::Closed, _) => {
                        if o == Outcome::Neutral {
                            return;
                        }
                        let failed = o == Outcome::Failure;
                        self.consecutive = if failed { self.consecutive + 1 } else { 0 };
                        self.attempts.push((now, failed));
                        if !failed {
                            return;
                        }
                        let trips = match self.c.policy {
                            TripPolicy::ConsecutiveFailures { threshold } => {
                                self.consecutive >= threshold
                            }
                            TripPolicy::FailureRatio {
                                ratio,
                                sampling_window,
                                minimum_throughput,
                            } => {
                                let width = sampling_window.as_nanos() as u64 / 10;
                                let slot = |t: u64| (t - self.closed_at) / width;
                                let window: Vec<_> = self
                                    .attempts
                                    .iter()
                                    .filter(|(t, _)| slot(now) - slot(*t) < 10)
                                    .collect();
                                let fails = window.iter().filter(|(_, f)| *f).count() as f64;
                                window.len() as u32 >= minimum_throughput
                                    && fails >= ratio * window.len() as f64
                            }
                        };
                        if trips {
                            self.trip(now);
                        }
                    }
                    (M::HalfOpen, true) => {
                        self.probes_out -= 1;
                        match o {
                            Outcome::Failure => self.trip(now),
                            Outcome::Success => {
                                self.probe_ok += 1;
                                if self.probe_ok >= self.c.half_open_probes {
                                    self.close(now);
                                }
                            }
                            // (A connection loss was made a failure or neutral above.)
                            Outcome::Neutral | Outcome::ConnectionLost => {}
                        }
                    }
                    _ => {}
                }
            }
            fn release(&mut self, (era, _): (u64, u64), probe: bool) {
                if probe && era == self.era {
                    self.probes_out -= 1;
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            #[test]
            fn breaker_matches_reference_model(
                c in config(),
                ops in proptest::collection::vec(op(), 1..120),
            ) {
                let t0 = Instant::now();
                let at = |ns: u64| t0 + Duration::from_nanos(ns);
                let mut b = Breaker::new(t0);
                let mut m = Model {
                    c: c.clone(), state: M::Closed, era: 0, closed_at: 0, open_until: 0,
                    trips: 0, consecutive: 0, attempts: Vec::new(), probes_out: 0, probe_ok: 0,
                    acquires: 0, last_loss: 0,
                };
                let mut now = 0u64;
                let mut held: Vec<(Ticket, (u64, u64))> = Vec::new();
                let answer = |r: &Result<Ticket, Rejection>| match r {
                    Ok(t) => Answer::Admitted { probe: t.is_probe() },
                    Err(r) => Answer::Rejected(r.reason, r.retry_in),
                };
                for op in ops {
                    match op {
                        Op::Advance(ms) => now += ms * 1_000_000,
                        Op::Attempt(o) => {
                            let (r, _) = b.try_acquire(&c, at(now));
                            let (want, era) = m.acquire(now);
                            prop_assert_eq!(answer(&r), want);
                            if let Ok(t) = r {
                                b.record(&c, t, o, at(now));
                                m.record(era, t.is_probe(), o, now);
                            }
                        }
                        Op::Hold => {
                            let (r, _) = b.try_acquire(&c, at(now));
                            let (want, era) = m.acquire(now);
                            prop_assert_eq!(answer(&r), want);
                            if let Ok(t) = r {
                                held.push((t, era));
                            }
                        }
                        Op::Finish(i, o) if i < held.len() => {
                            let (t, era) = held.remove(i);
                            b.record(&c, t, o, at(now));
                            m.record(era, t.is_probe(), o, now);
                        }
                        Op::Drop(i) if i < held.len() => {
                            let (t, era) = held.remove(i);
                            b.release(t);
                            m.release(era, t.is_probe());
                        }
                        Op::Finish(..) | Op::Drop(_) => {}
                    }
                    let want = match m.state {
                        M::Closed => BreakerState::Closed,
                        M::Open => BreakerState::Open,
                        M::HalfOpen => BreakerState::HalfOpen,
                    };
                    prop_assert_eq!(b.state(), want);
                    prop_assert_eq!(b.trips(), m.trips);
                    prop_assert_eq!(b.probes_in_flight(), m.probes_out);
                    prop_assert_eq!(b.consecutive_failures(), m.consecutive);
                }
            }
        }
    }
}
