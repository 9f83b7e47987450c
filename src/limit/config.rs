//! [`LimiterConfig`] and [`LimitPolicy`]: every knob of a
//! [`LimiterRegistry`](super::LimiterRegistry).

use std::time::Duration;

use super::gradient::Gradient;
use crate::error::ResilienceError;

/// How an origin's limit is set.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum LimitPolicy {
    /// A bulkhead: at most this many attempts in flight, always (Polly's concurrency
    /// limiter, resilience4j's bulkhead, Envoy's `max_requests`).
    Fixed(u32),
    /// A limit that follows the origin's latency and overload signals ([`Gradient`]).
    Adaptive(Gradient),
}

impl Default for LimitPolicy {
    fn default() -> Self {
        LimitPolicy::Adaptive(Gradient::default())
    }
}

/// The configuration shared by every origin of a [`LimiterRegistry`](super::LimiterRegistry).
///
/// Defaults: the adaptive limit with [`Gradient::default`], no wait queue (a request over
/// the limit fails at once), a queue timeout of 1 s once a queue is configured, at most
/// 10 000 origins.
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::limit::{LimiterConfig, LimitPolicy};
///
/// // A bulkhead of 16 per origin; up to 32 more requests wait for a permit, 100 ms at most.
/// let config = LimiterConfig::fixed(16).queue(32, Duration::from_millis(100));
/// assert_eq!(config.policy, LimitPolicy::Fixed(16));
/// assert_eq!(LimiterConfig::default().max_queue, 0);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LimiterConfig {
    /// How the limit is set (default adaptive).
    pub policy: LimitPolicy,
    /// How many requests per origin may wait for a permit when the limit is reached
    /// (default 0: none wait, the request over the limit is rejected at once).
    pub max_queue: usize,
    /// The longest a request waits in the queue (default 1 s); a request's
    /// [`Deadline`](crate::retry::Deadline) shortens it.
    pub queue_timeout: Duration,
    /// The most origins with a limit of their own (default 10 000); see
    /// [Bounds](super::LimiterRegistry#bounds).
    pub max_origins: usize,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        LimiterConfig {
            policy: LimitPolicy::default(),
            max_queue: 0,
            queue_timeout: Duration::from_secs(1),
            max_origins: 10_000,
        }
    }
}

impl LimiterConfig {
    /// A fixed limit of `max_in_flight` per origin (a bulkhead), the other defaults.
    pub fn fixed(max_in_flight: u32) -> Self {
        LimiterConfig::default().policy(LimitPolicy::Fixed(max_in_flight))
    }

    /// The adaptive limit with these parameters, the other defaults.
    pub fn adaptive(gradient: Gradient) -> Self {
        LimiterConfig::default().policy(LimitPolicy::Adaptive(gradient))
    }

    /// Sets [`policy`](Self::policy).
    pub fn policy(mut self, policy: LimitPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets [`max_queue`](Self::max_queue) and [`queue_timeout`](Self::queue_timeout).
    pub fn queue(mut self, max_queue: usize, timeout: Duration) -> Self {
        self.max_queue = max_queue;
        self.queue_timeout = timeout;
        self
    }

    /// Sets [`max_origins`](Self::max_origins).
    pub fn max_origins(mut self, max_origins: usize) -> Self {
        self.max_origins = max_origins;
        self
    }

    /// Checks the configuration: a [`ResilienceError::InvalidConfig`] says what is wrong.
    pub fn validate(&self) -> Result<(), ResilienceError> {
        self.check().map_err(ResilienceError::InvalidConfig)
    }

    fn check(&self) -> Result<(), String> {
        match self.policy {
            LimitPolicy::Fixed(0) => return Err("a fixed limit must be at least 1".into()),
            LimitPolicy::Fixed(_) => {}
            LimitPolicy::Adaptive(g) => g.check()?,
        }
        if self.max_origins == 0 {
            return Err("max_origins must be at least 1".into());
        }
        if self.queue_timeout > super::MAX_DURATION {
            return Err(format!(
                "queue_timeout must be at most a year, got {:?}",
                self.queue_timeout
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_configurations_are_typed_errors() {
        assert!(LimiterConfig::default().validate().is_ok());
        for bad in [
            LimiterConfig::fixed(0),
            LimiterConfig::default().max_origins(0),
            LimiterConfig::default().queue(1, Duration::from_secs(400 * 24 * 3600)),
            LimiterConfig::adaptive(Gradient::default().smoothing(2.0)),
        ] {
            assert!(
                matches!(bad.validate(), Err(ResilienceError::InvalidConfig(_))),
                "{bad:?}"
            );
        }
    }
}
