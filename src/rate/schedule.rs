//! [`Schedule`]: one origin's rate limit as pure arithmetic, the clock passed in (`now`).
//!
//! The pace is GCRA (the generic cell rate algorithm, ITU-T I.371; the arithmetic of
//! `governor` and of Redis' `redis-cell`) in its virtual-scheduling form: a theoretical
//! arrival time `tat`; a request at `now` may start at `max(now, tat − tolerance)`, and
//! moves `tat` to `max(tat, now) + interval`. A request that must wait takes its slot at
//! once (a reservation), so waiters go in the order they came, each at its own instant,
//! and a cancelled one gives its slot back when no later one was taken.
//!
//! On top of the pace, what the server said ([`learn`](Schedule::learn)):
//!
//! - its quota (`q` requests per `w`) becomes a pace of one request per `w / q` (made
//!   slower by the headroom, 5 % by default, for the network's jitter) with no tolerance
//!   (no burst): however the server counts (a fixed window, a sliding one, its own GCRA),
//!   no window of length `w` then holds more than `q` of this client's requests. The
//!   slower of the hand-set and the learned pace applies.
//! - what remains until the reset is an allowance: at most that many more requests
//!   before the reset instant (capped at `max_server_wait` from the answer).
//! - before the first answer, and after an exhausted allowance has reset, the server's
//!   state is unknown: one request goes first (the probe) and the others wait for its
//!   answer, up to the probe wait.
//!
//! What a server says never holds the origin longer than `max_server_wait`, the bound of
//! every server-directed wait: a learned quota's interval is capped at it before the
//! headroom is added (`1;w=10⁹` paces one request per `max_server_wait` and 5 %, it does
//! not shut the origin), so is a reset,
//! and when the learned state has turned every request away for that long (answers that
//! overtook each other, a reset learned late), it is forgotten and the next request
//! probes the server again.

use std::time::Duration;

use tokio::time::Instant;

use crate::ratelimit_fields::RateLimitFields;

/// One request per `interval`, `tolerance` ahead of schedule at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pace {
    pub(crate) interval: Duration,
    pub(crate) tolerance: Duration,
}

impl Pace {
    /// `limit` requests per `window` in bursts of at most `burst` (≥ 1).
    pub(crate) fn new(limit: u64, window: Duration, burst: u32) -> Self {
        let limit = u32::try_from(limit.max(1)).unwrap_or(u32::MAX);
        let interval = (window / limit).max(Duration::from_nanos(1));
        Pace {
            interval,
            tolerance: interval.saturating_mul(burst.max(1) - 1),
        }
    }
}

/// At most `remaining` more requests before `reset_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Allowance {
    remaining: u64,
    reset_at: Instant,
}

/// Whether the server's state must be learned from a first answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// Known (or not learning): requests go by the pace and the allowance.
    Done,
    /// Unknown: the next request is the probe.
    Needed,
    /// The probe is out; the others wait for its answer.
    InFlight,
}

/// What a request gets from its origin's schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Go now; `probe`: its answer is awaited by the others.
    Now { probe: bool },
    /// Go at `at`: the slot is taken (give it back with [`Schedule::give_back`] if the
    /// request is dropped before).
    At(Slot),
    /// Wait for the probe's answer (or the end of the probe wait), then ask again.
    AwaitProbe,
    /// The allowance is spent: ask again at its reset.
    AwaitReset(Instant),
    /// Not before `retry_in`, which is past the request's latest start: turned away.
    Over { retry_in: Duration },
}

/// A slot taken ahead of time, and what to undo if it is not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) at: Instant,
    /// Whether the request that took it is the probe.
    pub(crate) probe: bool,
    /// `tat` after the slot was taken, and the interval it added.
    tat_after: Instant,
    interval: Duration,
    /// The allowance it spent, by its reset instant.
    spent_of: Option<Instant>,
}

/// One origin's rate limit.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    hand: Option<Pace>,
    learned: Option<Pace>,
    /// The slower of the two, worked out when either changes.
    pace: Option<Pace>,
    tat: Instant,
    allowance: Option<Allowance>,
    probe: Probe,
    learning: bool,
    /// How much slower than a learned quota to go (a share of it).
    headroom: f64,
    /// The longest a server's word holds the origin: a learned interval, a reset, and
    /// how long the learned state may turn every request away before it is probed again.
    max_server_wait: Duration,
    last_start: Option<Instant>,
    /// Since when every request was turned away (none started since).
    rejecting_since: Option<Instant>,
}

impl Schedule {
    pub(crate) fn new(
        hand: Option<Pace>,
        learning: bool,
        headroom: f64,
        max_server_wait: Duration,
        now: Instant,
    ) -> Self {
        Schedule {
            hand,
            learned: None,
            pace: hand,
            tat: now,
            allowance: None,
            probe: if learning { Probe::Needed } else { Probe::Done },
            learning,
            headroom,
            max_server_wait,
            last_start: None,
            rejecting_since: None,
        }
    }

    /// The pace in force: the slower of the hand-set and the learned one.
    pub(crate) fn pace(&self) -> Option<Pace> {
        self.pace
    }

    fn slower_pace(&self) -> Option<Pace> {
        match (self.hand, self.learned) {
            (Some(h), Some(l)) if l.interval > h.interval => Some(l),
            (Some(h), _) => Some(h),
            (None, l) => l,
        }
    }

    /// What remains of the server's allowance and when it resets, if one is known.
    pub(crate) fn allowance(&self) -> Option<(u64, Instant)> {
        self.allowance.map(|a| (a.remaining, a.reset_at))
    }

    /// Whether forgetting this schedule loses nothing but what a probe relearns: no slot
    /// taken ahead, no allowance running, no probe out.
    pub(crate) fn is_idle(&self, now: Instant) -> bool {
        self.tat <= now && self.allowance.is_none() && self.probe != Probe::InFlight
    }

    /// The verdict for a request at `now` that may start no later than `latest_start`;
    /// `wait_for_probe`: it may still wait for a probe's answer.
    pub(crate) fn decide(
        &mut self,
        now: Instant,
        latest_start: Instant,
        wait_for_probe: bool,
    ) -> Verdict {
        if let Some(a) = self.allowance
            && a.reset_at <= now
        {
            self.allowance = None;
            if a.remaining == 0 && self.learning {
                // The window reset: how much the new one holds is the next answer's.
                self.probe = Probe::Needed;
            }
        }
        if self.learning
            && self.probe != Probe::InFlight
            && (self.learned.is_some() || self.allowance.is_some())
            && self
                .rejecting_since
                .is_some_and(|since| now.saturating_duration_since(since) >= self.max_server_wait)
        {
            self.forget_learned(now);
        }
        let probe = match self.probe {
            Probe::Needed => true,
            Probe::InFlight if wait_for_probe => return Verdict::AwaitProbe,
            _ => false,
        };
        if let Some(a) = self.allowance
            && a.remaining == 0
        {
            return if a.reset_at <= latest_start {
                Verdict::AwaitReset(a.reset_at)
            } else {
                self.over(now, a.reset_at - now)
            };
        }
        let (start, interval) = match self.pace() {
            // A zero tolerance (every learned pace, a burst of 1) needs no subtraction.
            Some(p) if p.tolerance.is_zero() => (now.max(self.tat), p.interval),
            Some(p) => (
                now.max(self.tat.checked_sub(p.tolerance).unwrap_or(now)),
                p.interval,
            ),
            None => (now, Duration::ZERO),
        };
        if start > latest_start {
            return self.over(now, start - now);
        }
        self.tat = self.tat.max(now) + interval;
        let spent_of = self.allowance.as_mut().map(|a| {
            a.remaining -= 1;
            a.reset_at
        });
        self.last_start = Some(start);
        self.rejecting_since = None;
        if probe {
            self.probe = Probe::InFlight;
        }
        if start == now {
            Verdict::Now { probe }
        } else {
            Verdict::At(Slot {
                at: start,
                probe,
                tat_after: self.tat,
                interval,
                spent_of,
            })
        }
    }

    /// A request turned away at `now`, its slot `retry_in` away; noted for the re-probe.
    fn over(&mut self, now: Instant, retry_in: Duration) -> Verdict {
        self.rejecting_since.get_or_insert(now);
        Verdict::Over { retry_in }
    }

    /// Forgets what the server said (it has turned every request away for
    /// `max_server_wait`): the hand-set pace alone holds from the last start, and the next
    /// request probes the server.
    fn forget_learned(&mut self, now: Instant) {
        self.learned = None;
        self.pace = self.hand;
        self.allowance = None;
        let hand_next = match (self.hand, self.last_start) {
            (Some(h), Some(last)) => last + h.interval,
            _ => now,
        };
        self.tat = self.tat.min(hand_next.max(now));
        self.probe = Probe::Needed;
        self.rejecting_since = None;
    }

    /// Gives back a slot whose request was dropped before it started: the pace's when no
    /// later slot was taken since, the allowance's when it is the same allowance.
    pub(crate) fn give_back(&mut self, slot: Slot) {
        if slot.probe {
            self.probe_lost();
        }
        if self.tat == slot.tat_after {
            self.tat -= slot.interval;
        }
        if let (Some(a), Some(of)) = (self.allowance.as_mut(), slot.spent_of)
            && a.reset_at == of
        {
            a.remaining += 1;
        }
    }

    /// The probe ended without an answer (an error, or dropped): the next request probes.
    pub(crate) fn probe_lost(&mut self) {
        if self.probe == Probe::InFlight {
            self.probe = Probe::Needed;
        }
    }

    /// Learns from an answer's rate-limit fields at `now` (`probe`: the probe's answer,
    /// which ends the unknown state even when it has no fields). A quota's interval and a
    /// reset are capped at `max_server_wait`.
    pub(crate) fn learn(&mut self, fields: &RateLimitFields, now: Instant, probe: bool) {
        if probe && self.probe == Probe::InFlight {
            self.probe = Probe::Done;
        }
        if !self.learning {
            return;
        }
        if let Some(q) = fields.quota {
            let mut pace = Pace::new(q.limit, q.window, 1);
            // The server's interval bounded like every server-directed wait, then slower
            // by the client's own headroom (at most 1 + headroom times the bound).
            pace.interval = pace
                .interval
                .min(self.max_server_wait)
                .mul_f64(1.0 + self.headroom);
            if self.pace().is_none() {
                // The requests already sent count: the next starts one interval after
                // the last one.
                let after_last = self.last_start.map_or(now, |s| s + pace.interval);
                self.tat = self.tat.max(after_last);
            }
            self.learned = Some(pace);
            self.pace = self.slower_pace();
        }
        if let (Some(remaining), Some(reset)) = (fields.remaining, fields.reset) {
            let reset_at = now + reset.min(self.max_server_wait);
            let same_window = self.allowance.filter(|a| {
                a.reset_at.max(reset_at) - a.reset_at.min(reset_at) <= Duration::from_secs(1)
            });
            self.allowance = Some(match same_window {
                // Answers overtake each other: within one window, the least remaining.
                Some(a) => Allowance {
                    remaining: a.remaining.min(remaining),
                    reset_at: a.reset_at,
                },
                None => Allowance {
                    remaining,
                    reset_at,
                },
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit_fields::Quota;

    const MS: Duration = Duration::from_millis(1);
    const S: Duration = Duration::from_secs(1);

    fn quota(limit: u64, window: Duration) -> RateLimitFields {
        RateLimitFields {
            quota: Some(Quota { limit, window }),
            ..RateLimitFields::default()
        }
    }

    fn remaining(n: u64, reset: Duration) -> RateLimitFields {
        RateLimitFields {
            remaining: Some(n),
            reset: Some(reset),
            ..RateLimitFields::default()
        }
    }

    #[test]
    fn a_hand_pace_admits_its_burst_then_one_per_interval() {
        let t0 = Instant::now();
        let mut s = Schedule::new(Some(Pace::new(10, S, 3)), false, 0.0, 60 * S, t0);
        let far = t0 + 60 * S;
        for _ in 0..3 {
            assert_eq!(s.decide(t0, far, true), Verdict::Now { probe: false });
        }
        // The fourth takes the slot 100 ms on, the fifth 200 ms on.
        let Verdict::At(a) = s.decide(t0, far, true) else {
            panic!()
        };
        let Verdict::At(b) = s.decide(t0, far, true) else {
            panic!()
        };
        assert_eq!((a.at - t0, b.at - t0), (100 * MS, 200 * MS));
        // One that may not wait that long is turned away, taking nothing.
        assert_eq!(
            s.decide(t0, t0 + 250 * MS, true),
            Verdict::Over { retry_in: 300 * MS }
        );
        // Giving back the last slot frees it; an earlier one cannot be (b is later).
        s.give_back(a);
        s.give_back(b);
        let Verdict::At(c) = s.decide(t0, far, true) else {
            panic!()
        };
        assert_eq!(c.at - t0, 200 * MS);
        // A second later the schedule has caught up.
        assert_eq!(
            s.decide(t0 + 2 * S, far, true),
            Verdict::Now { probe: false }
        );
    }

    #[test]
    fn the_first_request_probes_and_the_others_wait_for_its_answer() {
        let t0 = Instant::now();
        let far = t0 + 60 * S;
        let mut s = Schedule::new(None, true, 0.0, 60 * S, t0);
        assert_eq!(s.decide(t0, far, true), Verdict::Now { probe: true });
        assert_eq!(s.decide(t0, far, true), Verdict::AwaitProbe);
        // Past its probe wait, a request goes without the answer.
        assert_eq!(s.decide(t0, far, false), Verdict::Now { probe: false });
        // The answer: 10 a second. The sent requests count: the next starts 100 ms after
        // the last one.
        s.learn(&quota(10, S), t0 + MS, true);
        assert_eq!(
            s.pace(),
            Some(Pace {
                interval: 100 * MS,
                tolerance: Duration::ZERO
            })
        );
        let Verdict::At(a) = s.decide(t0 + MS, far, true) else {
            panic!()
        };
        assert_eq!(a.at - t0, 100 * MS);
        // A lost probe (no answer) makes the next request the probe.
        let mut s = Schedule::new(None, true, 0.0, 60 * S, t0);
        assert_eq!(s.decide(t0, far, true), Verdict::Now { probe: true });
        s.probe_lost();
        assert_eq!(s.decide(t0, far, true), Verdict::Now { probe: true });
        // An answer without fields ends the unknown state: nothing limits.
        s.learn(&RateLimitFields::default(), t0, true);
        for _ in 0..100 {
            assert_eq!(s.decide(t0, far, true), Verdict::Now { probe: false });
        }
    }

    #[test]
    fn the_allowance_is_spent_then_waited_out_then_probed() {
        let t0 = Instant::now();
        let far = t0 + 60 * S;
        let mut s = Schedule::new(None, true, 0.0, 60 * S, t0);
        assert_eq!(s.decide(t0, far, true), Verdict::Now { probe: true });
        s.learn(&remaining(2, 10 * S), t0, true);
        assert_eq!(s.decide(t0, far, true), Verdict::Now { probe: false });
        // A late answer of the same window with more remaining changes nothing.
        s.learn(&remaining(5, 10 * S + 400 * MS), t0, false);
        assert_eq!(s.allowance(), Some((1, t0 + 10 * S)));
        assert_eq!(s.decide(t0, far, true), Verdict::Now { probe: false });
        assert_eq!(s.decide(t0, far, true), Verdict::AwaitReset(t0 + 10 * S));
        assert_eq!(
            s.decide(t0, t0 + 5 * S, true),
            Verdict::Over { retry_in: 10 * S }
        );
        assert!(!s.is_idle(t0));
        // At the reset the new window is unknown: one probe again.
        let t1 = t0 + 10 * S;
        assert_eq!(s.decide(t1, far, true), Verdict::Now { probe: true });
        assert_eq!(s.decide(t1, far, true), Verdict::AwaitProbe);
    }

    #[test]
    fn a_reset_is_capped_at_the_longest_server_wait() {
        let t0 = Instant::now();
        let mut s = Schedule::new(None, true, 0.0, 60 * S, t0);
        s.learn(&remaining(0, 3600 * S), t0, false);
        assert_eq!(s.allowance(), Some((0, t0 + 60 * S)));
    }

    #[test]
    fn a_learned_interval_is_capped_at_the_longest_server_wait() {
        let t0 = Instant::now();
        let far = t0 + 3600 * S;
        let mut s = Schedule::new(None, true, 0.05, S, t0);
        assert_eq!(s.decide(t0, far, true), Verdict::Now { probe: true });
        // One request per 31 million years: one per second, 5 % slower.
        s.learn(
            &quota(1, Duration::from_secs(999_999_999_999_999)),
            t0,
            true,
        );
        assert_eq!(s.pace().unwrap().interval, 1050 * MS);
        let Verdict::At(next) = s.decide(t0, far, true) else {
            panic!()
        };
        assert_eq!(next.at - t0, 1050 * MS);
        // Below the cap, the quota and its headroom stand.
        let mut s = Schedule::new(None, true, 0.05, S, t0);
        s.learn(&quota(10, S), t0, false);
        assert_eq!(s.pace().unwrap().interval, 105 * MS);
    }

    #[test]
    fn a_learned_state_that_turned_everything_away_for_the_longest_server_wait_is_probed() {
        let t0 = Instant::now();
        let mut s = Schedule::new(None, true, 0.0, 60 * S, t0);
        assert_eq!(s.decide(t0, t0, true), Verdict::Now { probe: true });
        s.learn(&quota(1, 60 * S), t0, true);
        // From 1 s on, everything is turned away (no wait allowed)...
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        assert_eq!(
            s.decide(at(1), at(1), true),
            Verdict::Over { retry_in: 59 * S }
        );
        // ... and an answer that overtook the others, learned late, says an hour.
        s.learn(&remaining(0, 3600 * S), at(50), false);
        assert_eq!(s.allowance(), Some((0, at(110))));
        assert_eq!(
            s.decide(at(60), at(60), true),
            Verdict::Over { retry_in: 50 * S }
        );
        // A minute after the first rejection the learned state is forgotten: one probe
        // goes, the others wait for its answer.
        assert_eq!(s.decide(at(61), at(61), true), Verdict::Now { probe: true });
        assert_eq!(s.pace(), None);
        assert_eq!(s.allowance(), None);
        assert_eq!(s.decide(at(61), at(61), true), Verdict::AwaitProbe);
        // A request that starts resets the clock of the rejections.
        s.learn(&quota(1, 60 * S), at(61), true);
        assert_eq!(
            s.decide(at(62), at(62), true),
            Verdict::Over { retry_in: 59 * S }
        );
        assert_eq!(
            s.decide(at(121), at(121), true),
            Verdict::Now { probe: false },
            "the capped interval frees the slot first"
        );
    }

    #[test]
    fn the_slower_pace_wins() {
        let t0 = Instant::now();
        let mut s = Schedule::new(Some(Pace::new(5, S, 1)), true, 0.0, 60 * S, t0);
        s.learn(&quota(10, S), t0, false);
        assert_eq!(s.pace().unwrap().interval, 200 * MS);
        s.learn(&quota(1, S), t0, false);
        assert_eq!(s.pace().unwrap().interval, S);
        // With headroom, the learned pace is that much slower.
        let mut s = Schedule::new(None, true, 0.05, 60 * S, t0);
        s.learn(&quota(10, S), t0, false);
        assert_eq!(s.pace().unwrap().interval, 105 * MS);
        // Without learning, the server's word is ignored.
        let mut s = Schedule::new(Some(Pace::new(5, S, 1)), false, 0.0, 60 * S, t0);
        s.learn(&quota(1, S), t0, false);
        assert_eq!(s.pace().unwrap().interval, 200 * MS);
    }
}
