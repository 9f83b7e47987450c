//! Delays between attempts: [`Backoff`] (capped exponential growth) and [`Jitter`].
//!
//! `delay(n) = min(base × factor^n, max_delay)` for the `n`-th retry (`n = 0` is the first
//! retry), then a [`Jitter`] spreads it so that clients failing together do not retry
//! together. The defaults (3 retries in the middleware; base 1 s, factor 2.0, cap 30 s,
//! [`Jitter::Proportional`]`(0.10)`) give roughly 1 s, 2 s, 4 s.
//!
//! ```
//! use std::time::Duration;
//! use reqwest_resilience::{Backoff, Jitter};
//!
//! let backoff = Backoff::builder()
//!     .base(Duration::from_millis(100))
//!     .factor(3.0)
//!     .max_delay(Duration::from_secs(1))
//!     .jitter(Jitter::None)
//!     .build()
//!     .unwrap();
//! let delays: Vec<_> = (0..4).map(|n| backoff.base_delay(n)).collect();
//! assert_eq!(delays, [100, 300, 900, 1000].map(Duration::from_millis));
//! ```
//!
//! The arithmetic is pure: the random source is passed in ([`RandomSource`]), so tests and
//! simulations can fix it with [`SeededRandom`].

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use rand::{RngExt, SeedableRng, rngs::SmallRng};

use crate::error::ResilienceError;

/// How a backoff delay is spread.
///
/// Variants carrying a ratio are checked when a [`Backoff`] is built: a ratio outside its
/// range is a [`ResilienceError::InvalidConfig`], never a panic.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Jitter {
    /// The delay as computed.
    None,
    /// Uniform in `[d(1−r), d(1+r))`, applied after the cap (so a capped delay may exceed
    /// `max_delay` by `r`). `0 ≤ r ≤ 1`. The default, with `r = 0.10`.
    Proportional(f64),
    /// Uniform in `[d, d(1+r)]`: never shorter than the computed delay. `0 ≤ r ≤ 10`.
    Additive(f64),
    /// Uniform in `[0, d]` (AWS "full jitter"): the widest spread, but some retries come
    /// almost at once.
    Full,
    /// AWS "decorrelated jitter" (also Polly's classic decorrelated backoff): each delay is
    /// uniform in `[base, 3 × previous]`, capped at `max_delay`. The growth comes from the
    /// previous delay, not from `factor`.
    Decorrelated,
    /// retry-policies' `Jitter::Bounded` (what reqwest-retry users such as uv pick):
    /// uniform in `[base / 2, d]`, a floor at half the backoff's *base* delay whatever the
    /// retry, so no retry comes almost at once, and the spread of full jitter above it.
    /// [`Jitter::apply`] alone knows no base and takes `delay` as it (the first retry).
    Bounded,
}

impl Default for Jitter {
    fn default() -> Self {
        Jitter::Proportional(0.10)
    }
}

impl Jitter {
    fn validate(self) -> Result<Self, ResilienceError> {
        let bad = |what: &str| Err(ResilienceError::InvalidConfig(what.to_owned()));
        match self {
            Jitter::Proportional(r) if !(0.0..=1.0).contains(&r) => {
                bad("Jitter::Proportional ratio must be within 0.0..=1.0")
            }
            Jitter::Additive(r) if !(0.0..=10.0).contains(&r) => {
                bad("Jitter::Additive ratio must be within 0.0..=10.0")
            }
            ok => Ok(ok),
        }
    }

    /// Spreads `delay` with one uniform `sample` in `[0, 1)`. Pure; [`Decorrelated`]
    /// needs the previous delay and is applied by [`Backoff::delay`], so here it behaves as
    /// [`Full`].
    ///
    /// [`Decorrelated`]: Jitter::Decorrelated
    /// [`Full`]: Jitter::Full
    pub fn apply(self, delay: Duration, sample: f64) -> Duration {
        let u = clamp_unit(sample);
        let d = nanos_f64(delay);
        let (lo, hi) = match self {
            Jitter::None => return delay,
            Jitter::Proportional(r) => {
                let r = r.clamp(0.0, 1.0);
                (d * (1.0 - r), d * (1.0 + r))
            }
            Jitter::Additive(r) => (d, d * (1.0 + r.clamp(0.0, 10.0))),
            Jitter::Full | Jitter::Decorrelated => (0.0, d),
            Jitter::Bounded => (d / 2.0, d),
        };
        let mut v = lo + u * (hi - lo);
        if matches!(self, Jitter::Proportional(_)) && hi > lo && v >= hi {
            // Keep the interval half-open even when rounding lands on its end.
            v = hi - 1.0;
        }
        from_nanos_floor(v)
    }
}

/// Capped exponential backoff with jitter. Build it with [`Backoff::builder`]; the
/// default is base 1 s, factor 2.0, cap 30 s, [`Jitter::Proportional`]`(0.10)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    base: Duration,
    factor: f64,
    max_delay: Duration,
    jitter: Jitter,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(1),
            factor: 2.0,
            max_delay: Duration::from_secs(30),
            jitter: Jitter::default(),
        }
    }
}

impl Backoff {
    /// A builder starting from the defaults.
    pub fn builder() -> BackoffBuilder {
        BackoffBuilder {
            backoff: Backoff::default(),
        }
    }

    /// The delay before the first retry.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The growth factor per retry.
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// The cap applied before jitter.
    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// The jitter mode.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// `min(base × factor^retry, max_delay)`, before jitter; `retry = 0` is the first retry.
    ///
    /// Computed by repeated squaring and multiplication that stops as soon as the product
    /// passes the cap, so any `retry` (64, `u32::MAX`) is cheap and cannot overflow.
    pub fn base_delay(&self, retry: u32) -> Duration {
        let base = nanos_f64(self.base);
        let cap = nanos_f64(self.max_delay);
        if base >= cap {
            return self.max_delay;
        }
        // Every factor is ≥ 1, so once a partial product passes `limit` the full one does.
        let limit = cap / base;
        let mut result = 1.0_f64;
        let mut square = self.factor;
        let mut n = retry;
        while n > 0 {
            if n & 1 == 1 {
                result *= square;
                if result >= limit {
                    return self.max_delay;
                }
            }
            n >>= 1;
            if n > 0 {
                square *= square;
                if square >= limit {
                    // Some bit of `n` is still set, so `square` will be multiplied in.
                    return self.max_delay;
                }
            }
        }
        from_nanos_round(base * result).min(self.max_delay)
    }

    /// The jittered delay before retry number `retry` (0-based). `previous` is the delay
    /// taken before the previous retry, used only by [`Jitter::Decorrelated`].
    pub fn delay(
        &self,
        retry: u32,
        previous: Option<Duration>,
        random: &dyn RandomSource,
    ) -> Duration {
        match self.jitter {
            Jitter::None => self.base_delay(retry),
            Jitter::Decorrelated => {
                self.decorrelated(previous.unwrap_or(self.base), random.next_unit())
            }
            Jitter::Bounded => self.bounded(self.base_delay(retry), random.next_unit()),
            jitter => jitter.apply(self.base_delay(retry), random.next_unit()),
        }
    }

    /// retry-policies' bounded jitter: `base / 2 + sample × (delay − base / 2)`.
    fn bounded(&self, delay: Duration, sample: f64) -> Duration {
        let floor = nanos_f64(self.base) / 2.0;
        let d = nanos_f64(delay);
        from_nanos_floor(floor + clamp_unit(sample) * (d - floor)).min(self.max_delay)
    }

    /// AWS: `sleep = min(cap, random_between(base, sleep × 3))`.
    fn decorrelated(&self, previous: Duration, sample: f64) -> Duration {
        let base = nanos_f64(self.base);
        let hi = (nanos_f64(previous) * 3.0).max(base);
        from_nanos_floor(base + clamp_unit(sample) * (hi - base)).min(self.max_delay)
    }
}

/// Builds a [`Backoff`]; [`build`](BackoffBuilder::build) checks the values.
#[derive(Debug, Clone)]
pub struct BackoffBuilder {
    backoff: Backoff,
}

impl BackoffBuilder {
    /// The delay before the first retry (default 1 s).
    pub fn base(mut self, base: Duration) -> Self {
        self.backoff.base = base;
        self
    }

    /// The growth per retry (default 2.0); must be finite and within `1.0..=1000.0`.
    pub fn factor(mut self, factor: f64) -> Self {
        self.backoff.factor = factor;
        self
    }

    /// The cap applied before jitter (default 30 s).
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.backoff.max_delay = max_delay;
        self
    }

    /// The jitter (default [`Jitter::Proportional`]`(0.10)`).
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.backoff.jitter = jitter;
        self
    }

    /// Checks the values.
    ///
    /// # Errors
    ///
    /// [`ResilienceError::InvalidConfig`] when the factor is not finite or outside
    /// `1.0..=1000.0`, when `max_delay < base`, or when a jitter ratio is out of range.
    pub fn build(self) -> Result<Backoff, ResilienceError> {
        let b = self.backoff;
        if !(1.0..=1000.0).contains(&b.factor) {
            return Err(ResilienceError::InvalidConfig(
                "backoff factor must be finite and within 1.0..=1000.0".to_owned(),
            ));
        }
        if b.max_delay < b.base {
            return Err(ResilienceError::InvalidConfig(
                "backoff max_delay must not be below base".to_owned(),
            ));
        }
        // Durations beyond ~104 days lose nanosecond precision in f64 and no retry
        // should wait that long anyway.
        if b.max_delay > MAX_DELAY {
            return Err(ResilienceError::InvalidConfig(
                "backoff max_delay must not exceed one day".to_owned(),
            ));
        }
        b.jitter.validate()?;
        Ok(b)
    }
}

const MAX_DELAY: Duration = Duration::from_secs(24 * 60 * 60);

/// A source of uniform samples in `[0, 1)` for jitter.
///
/// The middleware holds one behind an `Arc` and calls it from many tasks, hence `&self`.
pub trait RandomSource: Send + Sync + fmt::Debug {
    /// A uniform sample in `[0, 1)`.
    fn next_unit(&self) -> f64;
}

/// The thread-local generator of `rand` (the default).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ThreadRandom;

impl RandomSource for ThreadRandom {
    fn next_unit(&self) -> f64 {
        rand::rng().random::<f64>()
    }
}

/// A seeded, reproducible generator for tests and simulations.
#[derive(Debug)]
pub struct SeededRandom(Mutex<SmallRng>);

impl SeededRandom {
    /// A generator that yields the same sequence for the same seed.
    pub fn new(seed: u64) -> Self {
        SeededRandom(Mutex::new(SmallRng::seed_from_u64(seed)))
    }
}

impl RandomSource for SeededRandom {
    fn next_unit(&self) -> f64 {
        // A panic while holding the lock cannot corrupt an RNG state worth protecting.
        let mut rng = self.0.lock().unwrap_or_else(|p| p.into_inner());
        rng.random::<f64>()
    }
}

fn clamp_unit(sample: f64) -> f64 {
    if sample.is_nan() {
        0.0
    } else {
        sample.clamp(0.0, 1.0)
    }
}

fn nanos_f64(d: Duration) -> f64 {
    d.as_nanos() as f64
}

fn from_nanos_floor(nanos: f64) -> Duration {
    Duration::from_nanos(nanos.max(0.0).floor() as u64)
}

fn from_nanos_round(nanos: f64) -> Duration {
    Duration::from_nanos(nanos.max(0.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn plain(base_ms: u64, factor: f64, cap_ms: u64) -> Backoff {
        Backoff::builder()
            .base(Duration::from_millis(base_ms))
            .factor(factor)
            .max_delay(Duration::from_millis(cap_ms))
            .jitter(Jitter::None)
            .build()
            .unwrap()
    }

    #[test]
    fn default_sequence_is_1_2_4_8_16_then_capped_at_30s() {
        let b = Backoff::builder().jitter(Jitter::None).build().unwrap();
        let got: Vec<u64> = (0..7).map(|n| b.base_delay(n).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 30, 30]);
    }

    #[test]
    fn fractional_factor_sequence_is_exact() {
        let b = plain(100, 1.5, 10_000);
        let got: Vec<Duration> = (0..4).map(|n| b.base_delay(n)).collect();
        assert_eq!(
            got,
            [100_000_000, 150_000_000, 225_000_000, 337_500_000].map(Duration::from_nanos)
        );
    }

    #[test]
    fn attempt_64_and_beyond_is_the_cap_without_overflow() {
        let b = Backoff::builder()
            .factor(1000.0)
            .max_delay(Duration::from_secs(24 * 3600))
            .jitter(Jitter::None)
            .build()
            .unwrap();
        for n in [20, 63, 64, 65, 1000, u32::MAX] {
            assert_eq!(b.base_delay(n), Duration::from_secs(24 * 3600), "n = {n}");
        }
        let slow = plain(1, 1.0, 5);
        assert_eq!(slow.base_delay(u32::MAX), Duration::from_millis(1));
    }

    #[test]
    fn base_above_cap_and_zero_base_are_handled() {
        assert_eq!(plain(0, 2.0, 10).base_delay(5), Duration::ZERO);
        let b = plain(10, 2.0, 10);
        assert_eq!(b.base_delay(0), Duration::from_millis(10));
        assert_eq!(b.base_delay(3), Duration::from_millis(10));
    }

    #[test]
    fn invalid_configurations_are_typed_errors() {
        let cases = [
            Backoff::builder().factor(f64::NAN),
            Backoff::builder().factor(0.5),
            Backoff::builder().factor(f64::INFINITY),
            Backoff::builder()
                .base(Duration::from_secs(2))
                .max_delay(Duration::from_secs(1)),
            Backoff::builder().max_delay(Duration::from_secs(2 * 24 * 3600)),
            Backoff::builder().jitter(Jitter::Proportional(1.5)),
            Backoff::builder().jitter(Jitter::Proportional(f64::NAN)),
            Backoff::builder().jitter(Jitter::Additive(-0.1)),
        ];
        for case in cases {
            let dbg = format!("{case:?}");
            assert!(
                matches!(case.build(), Err(ResilienceError::InvalidConfig(_))),
                "{dbg}"
            );
        }
    }

    #[test]
    fn seeded_random_is_reproducible() {
        let a = SeededRandom::new(7);
        let b = SeededRandom::new(7);
        let xs: Vec<f64> = (0..5).map(|_| a.next_unit()).collect();
        let ys: Vec<f64> = (0..5).map(|_| b.next_unit()).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
    }

    #[test]
    fn jitter_extremes_hit_the_documented_bounds() {
        let d = Duration::from_secs(10);
        assert_eq!(
            Jitter::Proportional(0.1).apply(d, 0.0),
            Duration::from_secs(9)
        );
        assert_eq!(Jitter::Additive(0.5).apply(d, 0.0), d);
        assert_eq!(Jitter::Additive(0.5).apply(d, 1.0), Duration::from_secs(15));
        assert_eq!(Jitter::Full.apply(d, 0.0), Duration::ZERO);
        assert_eq!(Jitter::Full.apply(d, 1.0), d);
        assert_eq!(Jitter::None.apply(d, 0.3), d);
        // Out-of-range samples are clamped, never a panic.
        assert_eq!(Jitter::Full.apply(d, f64::NAN), Duration::ZERO);
        assert_eq!(Jitter::Full.apply(d, -3.0), Duration::ZERO);
    }

    #[test]
    fn bounded_jitter_has_its_floor_at_half_the_base_for_every_retry() {
        let b = Backoff::builder()
            .base(Duration::from_secs(1))
            .max_delay(Duration::from_secs(30 * 60))
            .jitter(Jitter::Bounded)
            .build()
            .unwrap();
        // The third retry's delay is 4 s: spread over [0.5 s, 4 s].
        let d = b.base_delay(2);
        assert_eq!(d, Duration::from_secs(4));
        assert_eq!(b.bounded(d, 0.0), Duration::from_millis(500));
        assert_eq!(b.bounded(d, 0.5), Duration::from_millis(2250));
        assert_eq!(b.bounded(d, 1.0), d);
        // The same arithmetic as retry-policies' `Jitter::Bounded`.
        let theirs =
            |u: f64| (d - Duration::from_millis(500)).mul_f64(u) + Duration::from_millis(500);
        for u in [0.0, 0.25, 0.5, 0.75, 1.0] {
            assert_eq!(b.bounded(d, u), theirs(u), "sample {u}");
        }
        // Alone, `apply` takes the delay as the base (the first retry).
        assert_eq!(
            Jitter::Bounded.apply(Duration::from_secs(1), 0.0),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn decorrelated_grows_from_the_previous_delay_and_is_capped() {
        let b = Backoff::builder()
            .base(Duration::from_secs(1))
            .max_delay(Duration::from_secs(20))
            .jitter(Jitter::Decorrelated)
            .build()
            .unwrap();
        assert_eq!(
            b.decorrelated(Duration::from_secs(4), 0.0),
            Duration::from_secs(1)
        );
        assert_eq!(
            b.decorrelated(Duration::from_secs(4), 0.5),
            Duration::from_nanos(6_500_000_000)
        );
        assert_eq!(
            b.decorrelated(Duration::from_secs(60), 0.99),
            Duration::from_secs(20)
        );
    }

    fn jitter_strategy() -> impl Strategy<Value = Jitter> {
        prop_oneof![
            Just(Jitter::None),
            (0.0..=1.0f64).prop_map(Jitter::Proportional),
            (0.0..=10.0f64).prop_map(Jitter::Additive),
            Just(Jitter::Full),
            Just(Jitter::Decorrelated),
            Just(Jitter::Bounded),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        #[test]
        fn jittered_delay_stays_within_its_mode_bounds(
            jitter in jitter_strategy(),
            base_ms in 1u64..5_000,
            factor in 1.0f64..5.0,
            cap_extra_ms in 0u64..120_000,
            retry in 0u32..100,
            previous_ms in 0u64..200_000,
            seed in any::<u64>(),
        ) {
            let b = Backoff::builder()
                .base(Duration::from_millis(base_ms))
                .factor(factor)
                .max_delay(Duration::from_millis(base_ms + cap_extra_ms))
                .jitter(jitter)
                .build()
                .unwrap();
            let random = SeededRandom::new(seed);
            let previous = Duration::from_millis(previous_ms);
            let got = b.delay(retry, Some(previous), &random).as_nanos() as f64;
            let d = b.base_delay(retry).as_nanos() as f64;
            prop_assert!(b.base_delay(retry) <= b.max_delay());
            match jitter {
                Jitter::None => prop_assert_eq!(got, d),
                Jitter::Proportional(r) => {
                    prop_assert!(got >= (d * (1.0 - r)).floor());
                    prop_assert!(got < d * (1.0 + r) || (r == 0.0 && got == d));
                }
                Jitter::Additive(r) => {
                    prop_assert!(got >= d.floor());
                    prop_assert!(got <= d * (1.0 + r));
                }
                Jitter::Full => prop_assert!((0.0..=d).contains(&got)),
                Jitter::Bounded => {
                    let floor = b.base().as_nanos() as f64 / 2.0;
                    prop_assert!(got >= floor.floor() && got <= d);
                }
                Jitter::Decorrelated => {
                    let base = b.base().as_nanos() as f64;
                    let cap = b.max_delay().as_nanos() as f64;
                    let hi = (previous.as_nanos() as f64 * 3.0).max(base);
                    prop_assert!(got >= base.min(cap).floor());
                    prop_assert!(got <= hi.min(cap));
                }
            }
        }
    }
}
