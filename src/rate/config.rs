//! [`RateLimitConfig`]: every knob of a [`RateLimitRegistry`](super::RateLimitRegistry).

use std::time::Duration;

use crate::error::ResilienceError;

/// A rate set by hand: `limit` requests per `window`, in bursts of at most `burst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rate {
    /// Requests per window (at least 1).
    pub limit: u32,
    /// The window (more than zero).
    pub window: Duration,
    /// How many may go at once after a quiet spell (at least 1; default `limit`, as
    /// governor's and Polly's token buckets). A burst of 1 spaces every request by
    /// `window / limit`, which no way of counting on the server can see as more than
    /// `limit` in a window.
    pub burst: u32,
}

impl Rate {
    /// `limit` requests per second, in bursts of up to `limit`.
    pub fn per_second(limit: u32) -> Self {
        Rate::per(limit, Duration::from_secs(1))
    }

    /// `limit` requests per `window`, in bursts of up to `limit`.
    pub fn per(limit: u32, window: Duration) -> Self {
        Rate {
            limit,
            window,
            burst: limit,
        }
    }

    /// The same rate in bursts of at most `burst`.
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = burst;
        self
    }
}

/// The configuration shared by every origin of a
/// [`RateLimitRegistry`](super::RateLimitRegistry).
///
/// Defaults: no rate set by hand; the rate learned from the servers' rate-limit fields,
/// 5 % below their quota; a request waits up to 30 s for its slot (its [`Deadline`](crate::retry::Deadline)
/// shortens that), up to 1 s for the first answer of an origin; a server's reset is
/// honoured up to 60 s (the cap of `Retry-After`); at most 10 000 origins.
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::rate::{Rate, RateLimitConfig};
///
/// // 50 requests a second per origin, 5 at once at most; slower when a server says so.
/// let config = RateLimitConfig::default()
///     .rate(Rate::per_second(50).burst(5))
///     .max_wait(Duration::from_secs(2));
/// assert!(config.learn);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RateLimitConfig {
    /// The rate set by hand for every origin (default none).
    pub rate: Option<Rate>,
    /// Whether the servers' rate-limit fields set their origin's rate (default `true`):
    /// a quota (`RateLimit-Policy`, `RateLimit-Limit` with a window) paces the requests
    /// one per `window / limit`; what remains until the reset (`RateLimit`,
    /// `X-RateLimit-Remaining` + `-Reset`) is spent and then waited out. The slower of
    /// the hand-set and the learned rate applies.
    pub learn: bool,
    /// How much slower than a learned quota the client goes, as a share of it (default
    /// 0.05: 10 a second is paced at one per 105 ms). A request's way to the server
    /// varies by a few milliseconds (a new connection, a busy event loop), and a server
    /// counting a window of exactly one second would otherwise see the eleventh request
    /// of a pace of exactly 100 ms arrive inside the window. Between 0 and 1.
    pub headroom: f64,
    /// The longest a request waits for its slot (default 30 s); past it, or past its
    /// deadline, it is turned away at once with
    /// [`ResilienceError::RateLimited`](crate::ResilienceError::RateLimited). Zero: never
    /// wait.
    pub max_wait: Duration,
    /// While learning, the first request to an origin goes alone and the others wait for
    /// its answer, this long at most (default 1 s); then they go by what is known.
    pub probe_wait: Duration,
    /// The longest a server's fields hold an origin (default 60 s, the cap of
    /// `Retry-After`): the longest reset honoured (a server that says nothing remains for
    /// an hour is asked again after this), the longest interval a learned quota sets
    /// (before the headroom), and the longest the learned state may turn every request
    /// away before the next request probes the server again. A wrong field cannot park a
    /// client. See [How long a server's fields hold a
    /// caller](super#how-long-a-servers-fields-hold-a-caller).
    pub max_server_wait: Duration,
    /// The most origins with a rate of their own (default 10 000); see
    /// [Bounds](super::RateLimitRegistry#bounds).
    pub max_origins: usize,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            rate: None,
            learn: true,
            headroom: 0.05,
            max_wait: Duration::from_secs(30),
            probe_wait: Duration::from_secs(1),
            max_server_wait: Duration::from_secs(60),
            max_origins: 10_000,
        }
    }
}

impl RateLimitConfig {
    /// Sets [`rate`](Self::rate).
    pub fn rate(mut self, rate: Rate) -> Self {
        self.rate = Some(rate);
        self
    }
    /// Sets [`learn`](Self::learn).
    pub fn learn(mut self, learn: bool) -> Self {
        self.learn = learn;
        self
    }
    /// Sets [`headroom`](Self::headroom).
    pub fn headroom(mut self, headroom: f64) -> Self {
        self.headroom = headroom;
        self
    }
    /// Sets [`max_wait`](Self::max_wait).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }
    /// Sets [`probe_wait`](Self::probe_wait).
    pub fn probe_wait(mut self, probe_wait: Duration) -> Self {
        self.probe_wait = probe_wait;
        self
    }
    /// Sets [`max_server_wait`](Self::max_server_wait).
    pub fn max_server_wait(mut self, max_server_wait: Duration) -> Self {
        self.max_server_wait = max_server_wait;
        self
    }
    /// Sets [`max_origins`](Self::max_origins).
    pub fn max_origins(mut self, max_origins: usize) -> Self {
        self.max_origins = max_origins;
        self
    }

    /// Checks every field; the registry refuses an invalid configuration.
    pub fn validate(&self) -> Result<(), ResilienceError> {
        self.check().map_err(ResilienceError::InvalidConfig)
    }

    fn check(&self) -> Result<(), String> {
        if let Some(r) = self.rate {
            if r.limit == 0 || r.burst == 0 {
                return Err("a rate's limit and burst must be at least 1".into());
            }
            if r.window.is_zero() {
                return Err("a rate's window must be more than zero".into());
            }
        }
        if !(0.0..=1.0).contains(&self.headroom) {
            return Err(format!(
                "headroom must be between 0 and 1, got {}",
                self.headroom
            ));
        }
        if self.rate.is_none() && !self.learn {
            return Err("a rate limit with no rate and no learning limits nothing".into());
        }
        // Instants are added to these; a year keeps every sum far inside the clock's range.
        const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
        for (name, d) in [
            ("max_wait", self.max_wait),
            ("probe_wait", self.probe_wait),
            ("max_server_wait", self.max_server_wait),
            (
                "rate window",
                self.rate.map_or(Duration::ZERO, |r| r.window),
            ),
        ] {
            if d > YEAR {
                return Err(format!("{name} must be at most a year, got {d:?}"));
            }
        }
        if self.max_origins == 0 {
            return Err("max_origins must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_configurations_are_refused() {
        let bad = [
            RateLimitConfig::default().rate(Rate::per_second(0)),
            RateLimitConfig::default().rate(Rate::per_second(5).burst(0)),
            RateLimitConfig::default().rate(Rate::per(5, Duration::ZERO)),
            RateLimitConfig::default().learn(false),
            RateLimitConfig::default().max_wait(Duration::from_secs(400 * 24 * 3600)),
            RateLimitConfig::default().max_origins(0),
            RateLimitConfig::default().headroom(f64::NAN),
            RateLimitConfig::default().headroom(1.5),
        ];
        for config in bad {
            assert!(
                matches!(config.validate(), Err(ResilienceError::InvalidConfig(_))),
                "{config:?}"
            );
        }
        assert!(RateLimitConfig::default().validate().is_ok());
        assert!(
            RateLimitConfig::default()
                .learn(false)
                .rate(Rate::per_second(1))
                .validate()
                .is_ok()
        );
    }
}
