//! [`RetryBudget`]: a limit on retries relative to requests, shared by clones.
//!
//! After Finagle's `RetryBudget` and gRPC's retry throttling: every logical request
//! deposits, every retry withdraws, over a sliding window (10 s by default). Allowed retries
//! in the window are `max(ratio × requests, floor × window)`: 20 % of requests, or 10
//! retries per second when traffic is light.
//!
//! The floor is a *minimum*, not an addition (Finagle and tower's `TpsBudget` add it on top
//! of the percentage). Taking the maximum keeps the promise that matters during an outage:
//! once traffic exceeds the floor (50 requests/s by default), retries within any window are
//! at most `ratio` of the requests in it, so a client sends a failing server about
//! `1 + ratio` (1.2×) the requests it would have sent without retries, whatever the retry
//! count (`benches/retry.rs`: 1.20× at 1 000 requests/s, 1.24× at 100/s, where retries
//! after the traffic stops still count against requests in the window); the floor still
//! lets a quiet client retry (2× at 10 requests/s). tower's `TpsBudget` (same Finagle
//! design, and on tokio's clock, so it would work with a paused clock) was not reused for
//! the additive floor, because it panics on out-of-range arguments, and because it rounds
//! the ratio to `1 / n` (0.3 becomes 0.33).
//!
//! Time is tokio's clock, so tests with a paused clock control the window.
//!
//! ```
//! use std::time::Duration;
//! use reqwest_resilience::RetryBudget;
//!
//! let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.5).unwrap();
//! budget.deposit();
//! budget.deposit();
//! assert!(budget.try_withdraw()); // 50 % of 2 requests: one retry
//! assert!(!budget.try_withdraw());
//! ```

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ResilienceError;

const SLOTS: usize = 10;

/// A retry budget. Clones share one budget: hand a clone to every client that talks to the
/// same service.
#[derive(Clone)]
pub struct RetryBudget {
    inner: Arc<BudgetState>,
}

/// What every clone of a [`RetryBudget`] shares: its ratio, floor and window.
struct BudgetState {
    ratio: f64,
    floor: u64,
    slot_len: Duration,
    window: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    /// `(requests, retries)` per slot; `current` is the slot being written.
    slots: [(u64, u64); SLOTS],
    current: usize,
    current_started: Instant,
    /// How many slots have been started since the budget was made: names a slot across
    /// rotations, so a refund finds the slot of its withdrawal (or knows it expired).
    seq: u64,
}

/// A retry taken from a [`RetryBudget`], to give back with [`RetryBudget::refund`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Withdrawal {
    slot: u64,
}

impl Withdrawal {
    /// The window's slot it was taken in (kept in a `Continuation` while a step loop
    /// holds the retry).
    pub(crate) fn slot(&self) -> u64 {
        self.slot
    }

    /// The withdrawal taken in `slot`.
    pub(crate) fn in_slot(slot: u64) -> Self {
        Withdrawal { slot }
    }
}

impl RetryBudget {
    /// A budget over `window` (1 s to 60 s) allowing `max(retry_ratio × requests,
    /// min_retries_per_sec × window)` retries.
    ///
    /// # Errors
    ///
    /// [`ResilienceError::InvalidConfig`] when the window is out of range or the ratio is
    /// not finite or outside `0.0..=1000.0`.
    pub fn new(
        window: Duration,
        min_retries_per_sec: u32,
        retry_ratio: f64,
    ) -> Result<Self, ResilienceError> {
        if !(Duration::from_secs(1)..=Duration::from_secs(60)).contains(&window) {
            return Err(ResilienceError::InvalidConfig(
                "retry budget window must be within 1 s..=60 s".to_owned(),
            ));
        }
        if !(0.0..=1000.0).contains(&retry_ratio) {
            return Err(ResilienceError::InvalidConfig(
                "retry budget ratio must be finite and within 0.0..=1000.0".to_owned(),
            ));
        }
        let floor = (u64::from(min_retries_per_sec) as f64 * window.as_secs_f64()) as u64;
        Ok(RetryBudget {
            inner: Arc::new(BudgetState {
                ratio: retry_ratio,
                floor,
                slot_len: window / SLOTS as u32,
                window: Mutex::new(Window {
                    slots: [(0, 0); SLOTS],
                    current: 0,
                    current_started: Instant::now(),
                    seq: 0,
                }),
            }),
        })
    }

    /// Records a logical request (not a retry).
    pub fn deposit(&self) {
        self.with_window(|w| w.slots[w.current].0 += 1);
    }

    /// Takes a retry from the budget; `false` when none is left in the window.
    pub fn try_withdraw(&self) -> bool {
        self.withdraw().is_some()
    }

    /// Takes a retry from the budget, remembering where, so that a retry never made
    /// (its request dropped during the backoff) can be given back.
    pub(crate) fn withdraw(&self) -> Option<Withdrawal> {
        self.with_window(|w| {
            (self.room(w) > 0).then(|| {
                w.slots[w.current].1 += 1;
                Withdrawal { slot: w.seq }
            })
        })
    }

    /// Gives back a retry taken and never made, unless it already left the window.
    pub(crate) fn refund(&self, taken: Withdrawal) {
        self.with_window(|w| {
            let back = w.seq.wrapping_sub(taken.slot);
            if back < SLOTS as u64 {
                let slot = (w.current + SLOTS - back as usize) % SLOTS;
                w.slots[slot].1 = w.slots[slot].1.saturating_sub(1);
            }
        });
    }

    /// Retries still allowed in the current window.
    pub fn remaining(&self) -> u64 {
        self.with_window(|w| self.room(w))
    }

    /// The retries `w` still allows: the ratio of its requests (at least the floor), less
    /// the retries it holds.
    fn room(&self, w: &Window) -> u64 {
        let (requests, retries) = w.totals();
        ((requests as f64 * self.inner.ratio) as u64)
            .max(self.inner.floor)
            .saturating_sub(retries)
    }

    fn with_window<T>(&self, f: impl FnOnce(&mut Window) -> T) -> T {
        // The window holds plain counters: a panic elsewhere cannot leave them torn.
        let mut w = self.inner.window.lock().unwrap_or_else(|p| p.into_inner());
        w.expire(Instant::now(), self.inner.slot_len);
        f(&mut w)
    }
}

impl Window {
    /// Moves `current` to the slot that covers `now`, clearing the slots skipped over.
    fn expire(&mut self, now: Instant, slot_len: Duration) {
        let elapsed = now.saturating_duration_since(self.current_started);
        if elapsed < slot_len {
            return;
        }
        let steps = (elapsed.as_nanos() / slot_len.as_nanos().max(1)) as u64;
        self.seq = self.seq.wrapping_add(steps);
        for _ in 0..steps.min(SLOTS as u64) {
            self.current = (self.current + 1) % SLOTS;
            self.slots[self.current] = (0, 0);
        }
        if steps >= SLOTS as u64 {
            // Every slot was cleared: realigning to `now` loses nothing.
            self.current_started = now;
        } else {
            // `steps × slot_len` ≤ elapsed, so this cannot pass `now`.
            self.current_started += slot_len * steps as u32;
        }
    }

    fn totals(&self) -> (u64, u64) {
        self.slots.iter().fold((0, 0), |(q, r), (sq, sr)| {
            (q.saturating_add(*sq), r.saturating_add(*sr))
        })
    }
}

impl Default for RetryBudget {
    /// 20 % of requests, or at least 10 retries per second, over 10 s.
    fn default() -> Self {
        RetryBudget::new(Duration::from_secs(10), 10, 0.2)
            .unwrap_or_else(|_| unreachable!("the default budget is valid"))
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ratio", &self.inner.ratio)
            .field("floor", &self.inner.floor)
            .field("window", &(self.inner.slot_len * SLOTS as u32))
            .field("remaining", &self.remaining())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn default_allows_the_floor_then_twenty_percent_of_requests() {
        let budget = RetryBudget::default();
        assert_eq!(budget.remaining(), 100);
        for _ in 0..1000 {
            budget.deposit();
        }
        assert_eq!(budget.remaining(), 200);
        let granted = (0..500).filter(|_| budget.try_withdraw()).count();
        assert_eq!(granted, 200);
        assert_eq!(budget.remaining(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn clones_share_one_budget() {
        let a = RetryBudget::new(Duration::from_secs(10), 0, 1.0).unwrap();
        let b = a.clone();
        a.deposit();
        assert!(b.try_withdraw());
        assert!(!a.try_withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_and_retries_leave_the_window_after_it_passes() {
        let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.5).unwrap();
        for _ in 0..4 {
            budget.deposit();
        }
        assert!(budget.try_withdraw());
        assert!(budget.try_withdraw());
        assert!(!budget.try_withdraw());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(budget.remaining(), 0);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(
            budget.remaining(),
            0,
            "requests and retries expired together"
        );
        budget.deposit();
        budget.deposit();
        assert_eq!(budget.remaining(), 1);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(budget.remaining(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_expire_slot_by_slot() {
        let budget = RetryBudget::new(Duration::from_secs(10), 1, 0.0).unwrap();
        let first = (0..20).filter(|_| budget.try_withdraw()).count();
        assert_eq!(first, 10);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(budget.remaining(), 0);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(budget.remaining(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refund_goes_to_its_own_slot_until_that_slot_expires() {
        let budget = RetryBudget::new(Duration::from_secs(10), 1, 0.0).unwrap();
        let early = budget.withdraw().unwrap();
        let expiring = budget.withdraw().unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        let late = budget.withdraw().unwrap();
        assert_eq!(budget.remaining(), 7);
        // Three slots later the early retry's slot is still in the window.
        budget.refund(early);
        assert_eq!(budget.remaining(), 8);
        // Once its slot has left the window there is nothing to give back, and the late
        // slot's retry is not given back in its place.
        tokio::time::advance(Duration::from_secs(8)).await;
        assert_eq!(budget.remaining(), 9);
        budget.refund(expiring);
        assert_eq!(budget.remaining(), 9);
        budget.refund(late);
        assert_eq!(budget.remaining(), 10);
        // Past a whole window (the slots realign), an old withdrawal is ignored too.
        let stale = budget.withdraw().unwrap();
        tokio::time::advance(Duration::from_secs(25)).await;
        let fresh = budget.withdraw().unwrap();
        budget.refund(stale);
        assert_eq!(budget.remaining(), 9);
        budget.refund(fresh);
        assert_eq!(budget.remaining(), 10);
    }

    #[test]
    fn invalid_budgets_are_typed_errors() {
        for (w, r) in [(0, 0.2), (61, 0.2), (10, -0.1), (10, f64::NAN), (10, 1e9)] {
            assert!(matches!(
                RetryBudget::new(Duration::from_secs(w), 10, r),
                Err(ResilienceError::InvalidConfig(_))
            ));
        }
    }

    #[test]
    fn concurrent_withdrawals_never_exceed_the_allowance() {
        let budget = RetryBudget::new(Duration::from_secs(60), 0, 0.5).unwrap();
        for _ in 0..1000 {
            budget.deposit();
        }
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let b = budget.clone();
                std::thread::spawn(move || (0..200).filter(|_| b.try_withdraw()).count())
            })
            .collect();
        let granted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(granted, 500);
    }
}
