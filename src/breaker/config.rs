//! [`BreakerConfig`]: every knob of a registry's breakers, with the design's defaults.

use std::time::Duration;

use super::policy::TripPolicy;
use crate::error::ResilienceError;

const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// What a request does when its origin is paused by a server's `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum PauseMode {
    /// Sleep until the pause ends, then go on; fail fast instead when the pause would
    /// end after the request's [`Deadline`](crate::retry::Deadline). One attempt waits for
    /// pauses at most [`max_pause`](BreakerConfig::max_pause) in all, however often other
    /// responses extend the pause meanwhile: past that it fails with
    /// [`ResilienceError::Paused`] (`NotSent`, `retry_in` the pause's time left), like
    /// `FailFast`. A retry after that rejection is an attempt like any other: it spends
    /// one of the retry middleware's retries.
    #[default]
    Wait,
    /// Fail at once with [`ResilienceError::Paused`] (and `NotSent` evidence).
    FailFast,
}

/// Growth of the open period when a breaker trips again without having closed in between
/// (HalfOpen → Open): `open_duration × factor^(trips − 1)`, capped at `max_open_duration`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct OpenGrowth {
    /// The multiplier per repeated trip (at least 1).
    pub factor: f64,
    /// The cap on the grown open period.
    pub max_open_duration: Duration,
}

impl OpenGrowth {
    /// Grows by `factor` per repeated trip, up to `max_open_duration`.
    pub fn new(factor: f64, max_open_duration: Duration) -> Self {
        OpenGrowth {
            factor,
            max_open_duration,
        }
    }
}

/// Slow-call trips: a breaker also opens when, over its last `sampling_window`, at least
/// `minimum_throughput` calls were timed and the share of them that took longer than
/// `duration_threshold` reached `rate` (resilience4j's `slowCallDurationThreshold` and
/// `slowCallRateThreshold`). A server that answers `200` in 20 s is down for its callers.
///
/// What is timed: an attempt counted as a success or a failure (a neutral one says nothing
/// about the origin and is not timed either), from the moment it leaves for the network
/// to its response head: the transport step's
/// [`RequestEvidence::elapsed`](crate::RequestEvidence::elapsed), which leaves out the concurrency limiter's queue and
/// the bearer token fetch (local waits, not the server's), and the body (a large download
/// is not a slow server; the attempt timeout is cut at the head too). Without a transport
/// step inside the breaker, from the breaker's admission to the response head. An attempt
/// cut by a deadline or an attempt timeout is timed up to the cut.
///
/// In HalfOpen a probe slower than `duration_threshold` re-opens the breaker as a failed
/// one does (a server still that slow has not recovered), whatever its status.
///
/// Defaults ([`SlowCalls::new`]): `rate` 1.0 (resilience4j's `slowCallRateThreshold`
/// of 100 %), `minimum_throughput` 100 (resilience4j's `minimumNumberOfCalls`),
/// `sampling_window` 30 s (resilience4j counts its last 100 calls by default; this
/// crate's windows are kept in time, as Polly's, whose `SamplingDuration` is 30 s).
/// resilience4j's own `slowCallDurationThreshold` default is 60 s
/// ([`SlowCalls::default`]); pick one from your endpoint's latency.
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::breaker::{BreakerConfig, SlowCalls};
///
/// // Open when half of at least 20 calls in 10 s took more than 2 s.
/// let config = BreakerConfig::default().slow_calls(
///     SlowCalls::new(Duration::from_secs(2))
///         .rate(0.5)
///         .minimum_throughput(20)
///         .sampling_window(Duration::from_secs(10)),
/// );
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct SlowCalls {
    /// A call that took longer than this is slow (more than zero).
    pub duration_threshold: Duration,
    /// The slow share that trips the breaker, in `(0, 1]`.
    pub rate: f64,
    /// How far back timed calls are counted (at least 10 ms), in 10 buckets.
    pub sampling_window: Duration,
    /// Timed calls the window must hold before the share may trip it (at least 1).
    pub minimum_throughput: u32,
}

impl SlowCalls {
    /// Calls over `duration_threshold` are slow; every other setting its default.
    pub fn new(duration_threshold: Duration) -> Self {
        SlowCalls {
            duration_threshold,
            rate: 1.0,
            sampling_window: Duration::from_secs(30),
            minimum_throughput: 100,
        }
    }
    /// Sets [`rate`](Self::rate).
    pub fn rate(mut self, rate: f64) -> Self {
        self.rate = rate;
        self
    }
    /// Sets [`sampling_window`](Self::sampling_window).
    pub fn sampling_window(mut self, window: Duration) -> Self {
        self.sampling_window = window;
        self
    }
    /// Sets [`minimum_throughput`](Self::minimum_throughput).
    pub fn minimum_throughput(mut self, calls: u32) -> Self {
        self.minimum_throughput = calls;
        self
    }

    fn check(&self) -> Result<(), String> {
        if self.duration_threshold.is_zero() || self.duration_threshold > MAX_DURATION {
            return Err(format!(
                "slow-call duration threshold must be more than zero and at most a year, got {:?}",
                self.duration_threshold
            ));
        }
        if !(self.rate > 0.0 && self.rate <= 1.0) {
            return Err(format!(
                "slow-call rate must be in (0, 1], got {}",
                self.rate
            ));
        }
        // The same bounds as the failure-ratio window's.
        super::policy::TripPolicy::failure_ratio(1.0, self.sampling_window, self.minimum_throughput)
            .validate()
            .map_err(|e| format!("slow calls: {e}"))
    }
}

/// resilience4j's `slowCallDurationThreshold` default, 60 s, with [`SlowCalls::new`]'s
/// other defaults.
impl Default for SlowCalls {
    fn default() -> Self {
        SlowCalls::new(Duration::from_secs(60))
    }
}

/// The configuration shared by every breaker of a [`BreakerRegistry`](super::BreakerRegistry).
///
/// Defaults (from the design): trip after 5 consecutive failures, stay open 30 s, then
/// admit 1 probe; no growth, no jitter; server pauses (`Retry-After`, and rate-limit
/// fields saying nothing remains) capped at 60 s and waited out; at most 10 000 origins.
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::breaker::{BreakerConfig, OpenGrowth, PauseMode, TripPolicy};
///
/// let config = BreakerConfig::default()
///     .policy(TripPolicy::failure_ratio(0.5, Duration::from_secs(30), 20))
///     .open_duration(Duration::from_secs(5))
///     .half_open_probes(2)
///     .open_growth(OpenGrowth::new(2.0, Duration::from_secs(60)))
///     .open_jitter(0.1)
///     .pause_mode(PauseMode::FailFast)
///     .max_origins(1_000);
/// assert_eq!(config.open_duration, Duration::from_secs(5));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// When a Closed breaker trips.
    pub policy: TripPolicy,
    /// How long a tripped breaker stays Open before it admits probes (default 30 s).
    pub open_duration: Duration,
    /// Probes a HalfOpen breaker admits; this many successes close it, one failure
    /// re-opens it (default 1).
    pub half_open_probes: u32,
    /// Growth of the open period on repeated trips (default none).
    pub open_growth: Option<OpenGrowth>,
    /// Proportional jitter on the open period, in `[0, 1)`: uniform in
    /// `[d(1 − r), d(1 + r))`, applied after the growth cap (default 0: none). Spreads
    /// the probes of many clients that tripped at the same moment.
    pub open_jitter: f64,
    /// The "retry in" given to a request that a HalfOpen breaker turns away because its
    /// probes are all taken: the probe's answer is usually due within it (default 1 s).
    pub half_open_retry_in: Duration,
    /// The longest server-directed pause honoured; a longer `Retry-After` is clamped to
    /// it (default 60 s, as the retry middleware). Also the longest one attempt waits for
    /// pauses in [`PauseMode::Wait`], however often they are extended.
    pub max_pause: Duration,
    /// What a request does while its origin is paused (default [`PauseMode::Wait`]).
    pub pause_mode: PauseMode,
    /// Whether a response whose rate-limit fields say nothing remains (`RateLimit:
    /// "default";r=0;t=30`, `X-RateLimit-Remaining: 0` with `X-RateLimit-Reset`, every form
    /// [the guide](crate::guide::rate_limits) lists) pauses its origin until the
    /// quota resets, for every caller of the registry, like `Retry-After` and capped by the
    /// same [`max_pause`](Self::max_pause), whatever the response's status (default `true`).
    /// In a [`Resilience`](crate::Resilience) stack with a learning rate limit, the rate
    /// limit applies the fields alone, under its own bound
    /// ([`crate::rate`](crate::rate#how-long-a-servers-fields-hold-a-caller)).
    pub rate_limit_pauses: bool,
    /// The most origins the registry tracks (default 10 000).
    pub max_origins: usize,
    /// Slow-call trips, beside the [`policy`](Self::policy) (default none: only
    /// failures trip the breaker).
    pub slow_calls: Option<SlowCalls>,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            policy: TripPolicy::default(),
            open_duration: Duration::from_secs(30),
            half_open_probes: 1,
            open_growth: None,
            open_jitter: 0.0,
            half_open_retry_in: Duration::from_secs(1),
            max_pause: Duration::from_secs(60),
            pause_mode: PauseMode::Wait,
            rate_limit_pauses: true,
            max_origins: 10_000,
            slow_calls: None,
        }
    }
}

impl BreakerConfig {
    /// Sets [`policy`](Self::policy).
    pub fn policy(mut self, policy: TripPolicy) -> Self {
        self.policy = policy;
        self
    }
    /// Sets [`open_duration`](Self::open_duration).
    pub fn open_duration(mut self, open_duration: Duration) -> Self {
        self.open_duration = open_duration;
        self
    }
    /// Sets [`half_open_probes`](Self::half_open_probes).
    pub fn half_open_probes(mut self, probes: u32) -> Self {
        self.half_open_probes = probes;
        self
    }
    /// Sets [`open_growth`](Self::open_growth).
    pub fn open_growth(mut self, growth: OpenGrowth) -> Self {
        self.open_growth = Some(growth);
        self
    }
    /// Sets [`open_jitter`](Self::open_jitter).
    pub fn open_jitter(mut self, ratio: f64) -> Self {
        self.open_jitter = ratio;
        self
    }
    /// Sets [`half_open_retry_in`](Self::half_open_retry_in).
    pub fn half_open_retry_in(mut self, retry_in: Duration) -> Self {
        self.half_open_retry_in = retry_in;
        self
    }
    /// Sets [`max_pause`](Self::max_pause).
    pub fn max_pause(mut self, max_pause: Duration) -> Self {
        self.max_pause = max_pause;
        self
    }
    /// Sets [`pause_mode`](Self::pause_mode).
    pub fn pause_mode(mut self, mode: PauseMode) -> Self {
        self.pause_mode = mode;
        self
    }
    /// Sets [`rate_limit_pauses`](Self::rate_limit_pauses).
    pub fn rate_limit_pauses(mut self, on: bool) -> Self {
        self.rate_limit_pauses = on;
        self
    }
    /// Sets [`max_origins`](Self::max_origins).
    pub fn max_origins(mut self, max_origins: usize) -> Self {
        self.max_origins = max_origins;
        self
    }

    /// Sets [`slow_calls`](Self::slow_calls).
    pub fn slow_calls(mut self, slow_calls: SlowCalls) -> Self {
        self.slow_calls = Some(slow_calls);
        self
    }

    /// Checks every field; the registry refuses an invalid configuration.
    pub fn validate(&self) -> Result<(), ResilienceError> {
        self.check().map_err(ResilienceError::InvalidConfig)
    }

    fn check(&self) -> Result<(), String> {
        self.policy.validate()?;
        if self.open_duration.is_zero() {
            return Err("open_duration must be more than zero".into());
        }
        // Instants are added to these; a year keeps every sum far inside the clock's range.
        for (name, d) in [
            ("open_duration", self.open_duration),
            ("half_open_retry_in", self.half_open_retry_in),
            ("max_pause", self.max_pause),
            (
                "open growth max_open_duration",
                self.open_growth
                    .map_or(Duration::ZERO, |g| g.max_open_duration),
            ),
        ] {
            if d > MAX_DURATION {
                return Err(format!("{name} must be at most a year, got {d:?}"));
            }
        }
        if self.half_open_probes == 0 {
            return Err("half_open_probes must be at least 1".into());
        }
        if let Some(g) = self.open_growth {
            if !(g.factor.is_finite() && g.factor >= 1.0) {
                return Err(format!(
                    "open growth factor must be finite and at least 1, got {}",
                    g.factor
                ));
            }
            if g.max_open_duration < self.open_duration {
                return Err("open growth max_open_duration is below open_duration".into());
            }
        }
        if !(self.open_jitter >= 0.0 && self.open_jitter < 1.0) {
            return Err(format!(
                "open_jitter must be in [0, 1), got {}",
                self.open_jitter
            ));
        }
        if self.half_open_retry_in.is_zero() {
            // Zero would invite a retry loop spinning against a busy HalfOpen breaker.
            return Err("half_open_retry_in must be more than zero".into());
        }
        if self.max_origins == 0 {
            return Err("max_origins must be at least 1".into());
        }
        self.slow_calls.as_ref().map_or(Ok(()), SlowCalls::check)
    }

    /// The open period after the `trips`-th trip in a row (1 = first trip), before jitter.
    pub(crate) fn grown_open_duration(&self, trips: u32) -> Duration {
        let base = self.open_duration;
        let Some(g) = self.open_growth else {
            return base;
        };
        let mut d = base;
        // Repeated multiplication stops at the cap, so no power can overflow.
        for _ in 1..trips {
            if d >= g.max_open_duration || g.factor <= 1.0 {
                break;
            }
            d = Duration::try_from_secs_f64(d.as_secs_f64() * g.factor)
                .unwrap_or(g.max_open_duration);
        }
        d.min(g.max_open_duration)
    }

    /// The open period after the `trips`-th trip in a row, with jitter.
    ///
    /// Total for any configuration, not only a validated one (the public
    /// [`Breaker`](super::Breaker) state machine takes its config per call): the period is
    /// capped at a year, and a jitter ratio outside `[0, 1)` (or NaN) is ignored.
    pub(crate) fn open_duration_for(&self, trips: u32) -> Duration {
        let d = self.grown_open_duration(trips).min(MAX_DURATION);
        let r = self.open_jitter;
        if r > 0.0 && r < 1.0 {
            Duration::try_from_secs_f64(d.as_secs_f64() * rand::random_range(1.0 - r..1.0 + r))
                .unwrap_or(d)
        } else {
            d
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn defaults_are_the_designs() {
        let c = BreakerConfig::default();
        assert_eq!(c.policy, TripPolicy::ConsecutiveFailures { threshold: 5 });
        assert_eq!(c.open_duration, 30 * S);
        assert_eq!(c.half_open_probes, 1);
        assert_eq!(c.max_pause, 60 * S);
        assert_eq!(c.max_origins, 10_000);
        assert_eq!(c.pause_mode, PauseMode::Wait);
        assert_eq!(c.slow_calls, None);
        assert!(c.validate().is_ok());
        let slow = SlowCalls::default();
        assert_eq!(slow.duration_threshold, 60 * S);
        assert_eq!(slow.rate, 1.0);
        assert_eq!(slow.minimum_throughput, 100);
        assert_eq!(slow.sampling_window, 30 * S);
    }

    #[test]
    fn growth_multiplies_per_repeated_trip_up_to_the_cap() {
        let c = BreakerConfig::default()
            .open_duration(S)
            .open_growth(OpenGrowth::new(2.0, 10 * S));
        let got: Vec<_> = (1..=6).map(|t| c.grown_open_duration(t)).collect();
        assert_eq!(got, [S, 2 * S, 4 * S, 8 * S, 10 * S, 10 * S]);
        assert_eq!(c.grown_open_duration(u32::MAX), 10 * S);
        assert_eq!(BreakerConfig::default().grown_open_duration(9), 30 * S);
    }

    #[test]
    fn jitter_stays_within_its_ratio() {
        let c = BreakerConfig::default()
            .open_duration(10 * S)
            .open_jitter(0.2);
        let mut seen_other_than_base = false;
        for _ in 0..200 {
            let d = c.open_duration_for(1);
            assert!(d >= 8 * S && d < 12 * S, "{d:?}");
            seen_other_than_base |= d != 10 * S;
        }
        assert!(seen_other_than_base);
    }

    #[test]
    fn invalid_configs_are_typed_errors() {
        let bad = [
            BreakerConfig::default().open_duration(Duration::ZERO),
            BreakerConfig::default().half_open_probes(0),
            BreakerConfig::default().open_jitter(1.0),
            BreakerConfig::default().open_jitter(f64::NAN),
            BreakerConfig::default().max_origins(0),
            BreakerConfig::default().half_open_retry_in(Duration::ZERO),
            BreakerConfig::default().open_growth(OpenGrowth::new(0.5, 60 * S)),
            BreakerConfig::default().open_growth(OpenGrowth::new(2.0, S)),
            BreakerConfig::default().policy(TripPolicy::consecutive_failures(0)),
            BreakerConfig::default().open_duration(Duration::MAX),
            BreakerConfig::default().max_pause(Duration::MAX),
            BreakerConfig::default().half_open_retry_in(Duration::MAX),
            BreakerConfig::default().open_growth(OpenGrowth::new(2.0, Duration::MAX)),
            BreakerConfig::default().slow_calls(SlowCalls::new(Duration::ZERO)),
            BreakerConfig::default().slow_calls(SlowCalls::new(Duration::MAX)),
            BreakerConfig::default().slow_calls(SlowCalls::new(S).rate(0.0)),
            BreakerConfig::default().slow_calls(SlowCalls::new(S).rate(f64::NAN)),
            BreakerConfig::default().slow_calls(SlowCalls::new(S).rate(1.5)),
            BreakerConfig::default().slow_calls(SlowCalls::new(S).minimum_throughput(0)),
            BreakerConfig::default()
                .slow_calls(SlowCalls::new(S).sampling_window(Duration::from_millis(1))),
        ];
        for c in bad {
            assert!(
                matches!(c.validate(), Err(ResilienceError::InvalidConfig(_))),
                "{c:?}"
            );
        }
    }
}
