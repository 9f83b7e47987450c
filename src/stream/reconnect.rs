//! The reconnect loop of any long-lived stream: [`Reconnect`] decides when to open the
//! next connection from how the last one ended, and waits for it.
//!
//! The rules (the seed's SSE loop fixed, LaunchDarkly's client as the anchor):
//!
//! - the delay grows from the reconnection time ([`ReconnectPolicy::reconnection_time`],
//!   or a server's `retry:`, but at least twice the floor) by 2× per reconnect since the
//!   last *stable* connection (one that stayed open
//!   [`stable_after`](ReconnectPolicy::stable_after)), up to 30 s, with jitter, so clients
//!   cut by the same outage do not come back at the same instant;
//! - no delay is shorter than the floor (500 ms, Firefox's minimum reconnection time): a
//!   server's `retry: 0` cannot make a tight loop;
//! - a server's wait (`Retry-After`) outranks a shorter delay, capped at 60 s like every
//!   server-directed wait of the crate;
//! - a rejection on this side (an open breaker, a pause) waits the breaker's "retry in",
//!   never a tight loop, and is not a failed reconnect;
//! - the budget ([`max_failed`](ReconnectPolicy::max_failed)) counts failed reconnects in
//!   a row (a status or a transport failure before the stream opened), not the normal
//!   reconnect after a stream ended.
//!
//! The planning ([`Reconnect::plan`]) is pure: the clock and the random source are passed
//! in, so it is tested without a network. [`Reconnect::after`] plans and sleeps.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;

use crate::backoff::{Backoff, Jitter, RandomSource, ThreadRandom};
use crate::error::ResilienceError;
use crate::origin::Origin;
use crate::record::FailureKind;

/// How a long-lived stream reconnects. The defaults and where they come from:
///
/// | setting | default | from |
/// |---|---|---|
/// | `reconnection_time` | 3 s | Chromium's `EventSource` (the standard leaves it to the client) |
/// | `floor` | 500 ms | Firefox's minimum reconnection time |
/// | `max_delay` | 30 s | the seed's cap |
/// | `jitter` | [`Jitter::Bounded`]: uniform in `[d₀ / 2, d]` | LaunchDarkly's half jitter |
/// | `stable_after` | 60 s | LaunchDarkly's reset interval |
/// | `max_server_wait` | 60 s | the crate's `Retry-After` cap |
/// | `max_failed` | none: reconnect as long as the stream lives | the standard's `EventSource` |
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::stream::{Reconnect, ReconnectPolicy};
///
/// let policy = ReconnectPolicy::new()
///     .reconnection_time(Duration::from_secs(1))
///     .max_failed(Some(10));
/// let reconnect = Reconnect::new(policy)?;
/// # Ok::<(), reqwest_resilience::ResilienceError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ReconnectPolicy {
    reconnection_time: Duration,
    floor: Duration,
    max_delay: Duration,
    jitter: Jitter,
    stable_after: Duration,
    max_server_wait: Duration,
    max_failed: Option<u32>,
    random: Option<Arc<dyn RandomSource>>,
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        ReconnectPolicy {
            reconnection_time: Duration::from_secs(3),
            floor: ReconnectPolicy::FLOOR,
            max_delay: Duration::from_secs(30),
            jitter: Jitter::Bounded,
            stable_after: Duration::from_secs(60),
            max_server_wait: Duration::from_secs(60),
            max_failed: None,
            random: None,
        }
    }
}

impl ReconnectPolicy {
    /// The shortest delay before a reconnect (Firefox's minimum reconnection time).
    pub const FLOOR: Duration = Duration::from_millis(500);

    /// The defaults (see the table above).
    pub fn new() -> ReconnectPolicy {
        ReconnectPolicy::default()
    }

    /// The delay before the first reconnect after a stable connection, until a server sets
    /// its own (`retry:`).
    pub fn reconnection_time(mut self, time: Duration) -> Self {
        self.reconnection_time = time;
        self
    }

    /// The shortest delay, whatever the server asks.
    pub fn floor(mut self, floor: Duration) -> Self {
        self.floor = floor;
        self
    }

    /// The longest delay of the backoff.
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// How the delay is spread ([`Jitter::None`]: every client at the same instant).
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// How long a connection must stay open for the delay to start again from the
    /// reconnection time.
    pub fn stable_after(mut self, stable_after: Duration) -> Self {
        self.stable_after = stable_after;
        self
    }

    /// The cap on a server's `Retry-After`.
    pub fn max_server_wait(mut self, max: Duration) -> Self {
        self.max_server_wait = max;
        self
    }

    /// How many failed reconnects in a row end the stream (`None`: never).
    pub fn max_failed(mut self, max: Option<u32>) -> Self {
        self.max_failed = max;
        self
    }

    /// The random source of the jitter (a [`SeededRandom`](crate::backoff::SeededRandom)
    /// makes the delays reproducible).
    pub fn random(mut self, random: Arc<dyn RandomSource>) -> Self {
        self.random = Some(random);
        self
    }

    /// The backoff from the reconnection time `base`: its first delay at least twice the
    /// floor, so that a jitter down to half of it stays above the floor.
    fn backoff(&self, base: Duration) -> Result<Backoff, ResilienceError> {
        let base = base.max(self.floor.saturating_mul(2)).min(self.max_delay);
        Backoff::builder()
            .base(base)
            .factor(2.0)
            .max_delay(self.max_delay)
            .jitter(self.jitter)
            .build()
    }
}

/// Why a stream reconnects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReconnectCause {
    /// The server ended an open stream.
    Ended,
    /// An open stream broke (reset, closed part way, cut by the network's no-progress
    /// bound).
    Cut,
    /// Nothing came on an open stream for its idle timeout.
    Idle,
    /// The server answered with a status that calls for a later try (`5xx`, `429`,
    /// `408`), after the stack's own retries.
    Status(StatusCode),
    /// The connection failed before a response, as its evidence says (`None`: no
    /// evidence, the client has no transport step).
    Failed(Option<FailureKind>),
    /// Turned away on this side, unsent: an open breaker, a server's pause, a rate limit.
    Rejected,
}

impl ReconnectCause {
    /// A short name in snake case (a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            ReconnectCause::Ended => "ended",
            ReconnectCause::Cut => "cut",
            ReconnectCause::Idle => "idle",
            ReconnectCause::Status(_) => "status",
            ReconnectCause::Failed(_) => "failed",
            ReconnectCause::Rejected => "rejected",
        }
    }

    /// Whether the connection had opened (its stream ended), rather than failed to.
    fn had_opened(self) -> bool {
        matches!(
            self,
            ReconnectCause::Ended | ReconnectCause::Cut | ReconnectCause::Idle
        )
    }
}

/// One reconnect decided: why, which, and after how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reconnection {
    /// Why the stream reconnects.
    pub cause: ReconnectCause,
    /// The reconnect's number since the last stable connection (1 for the first).
    pub attempt: u32,
    /// The failed reconnects in a row before this one (what the budget counts).
    pub failed: u32,
    /// The wait before the connection is opened again.
    pub delay: Duration,
}

/// The budget of failed reconnects was spent: the stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GaveUp {
    /// The failed reconnects in a row.
    pub failed: u32,
    /// The last one's cause.
    pub cause: ReconnectCause,
}

/// The reconnect state of one long-lived stream.
///
/// Call [`opened`](Self::opened) when a connection opens (its response is good), then,
/// when it ends or a connect fails, [`after`](Self::after) with the cause: it waits the
/// delay and returns the [`Reconnection`], or [`GaveUp`].
///
/// ```no_run
/// use reqwest_resilience::stream::{Reconnect, ReconnectCause, ReconnectPolicy};
///
/// # async fn run(client: reqwest_middleware::ClientWithMiddleware) -> Result<(), Box<dyn std::error::Error>> {
/// let mut reconnect = Reconnect::new(ReconnectPolicy::new())?;
/// loop {
///     let cause = match client.get("http://127.0.0.1:8080/tail").send().await {
///         Ok(mut response) if response.status().is_success() => {
///             reconnect.opened();
///             while let Ok(Some(chunk)) = response.chunk().await {
///                 println!("{} bytes", chunk.len());
///             }
///             ReconnectCause::Ended
///         }
///         Ok(response) => ReconnectCause::Status(response.status()),
///         Err(_) => ReconnectCause::Failed(None),
///     };
///     // Dropping this future (a `select!` with a shutdown signal) cancels the wait.
///     let next = reconnect.after(cause, None).await?;
///     eprintln!("reconnect #{} after {:?}: {:?}", next.attempt, next.delay, next.cause);
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Reconnect {
    policy: ReconnectPolicy,
    backoff: Backoff,
    /// The reconnection time in force (the policy's, or the server's).
    base: Duration,
    /// Reconnects since the last stable connection: the backoff's exponent.
    unstable: u32,
    /// Failed reconnects in a row: what the budget counts.
    failed: u32,
    opened_at: Option<Instant>,
    previous: Option<Duration>,
    /// The origin reported with each reconnect (`tracing`, `metrics`).
    origin: Option<Origin>,
}

impl Reconnect {
    /// The state of a stream not yet connected.
    ///
    /// # Errors
    ///
    /// [`ResilienceError::InvalidConfig`] for a policy whose backoff cannot be built (a
    /// ratio of jitter out of range, a cap above a day).
    pub fn new(policy: ReconnectPolicy) -> Result<Reconnect, ResilienceError> {
        let backoff = policy.backoff(policy.reconnection_time)?;
        Ok(Reconnect {
            base: policy.reconnection_time,
            backoff,
            policy,
            unstable: 0,
            failed: 0,
            opened_at: None,
            previous: None,
            origin: None,
        })
    }

    /// The origin reported with each reconnect [`after`](Self::after) decides (the
    /// `origin` of its `tracing` event and its metric).
    pub fn origin(mut self, origin: Origin) -> Self {
        self.origin = Some(origin);
        self
    }

    /// A connection opened (its response was good): the failed reconnects are forgiven,
    /// and it is timed for stability.
    pub fn opened(&mut self) {
        self.opened_at = Some(Instant::now());
        self.failed = 0;
    }

    /// The server set the reconnection time (`retry:`); the policy's floor and cap still
    /// apply.
    pub fn set_reconnection_time(&mut self, time: Duration) {
        if time == self.base {
            return;
        }
        // A backoff from a time the policy already bounds always builds.
        if let Ok(backoff) = self.policy.backoff(time) {
            self.base = time;
            self.backoff = backoff;
        }
    }

    /// Failed reconnects in a row so far.
    pub fn failed(&self) -> u32 {
        self.failed
    }

    /// Plans the next reconnect after a connection ended with `cause` at `now`:
    /// `server_wait` is a server's `Retry-After` or a breaker's "retry in". Pure: nothing
    /// waits.
    pub fn plan(
        &mut self,
        cause: ReconnectCause,
        server_wait: Option<Duration>,
        now: Instant,
        random: &dyn RandomSource,
    ) -> Result<Reconnection, GaveUp> {
        let opened_at = self.opened_at.take();
        if cause.had_opened() && opened_at.is_some_and(|at| now - at >= self.policy.stable_after) {
            self.unstable = 0;
            self.previous = None;
        }
        if !cause.had_opened() && cause != ReconnectCause::Rejected {
            self.failed += 1;
            if self.policy.max_failed.is_some_and(|max| self.failed > max) {
                return Err(GaveUp {
                    failed: self.failed,
                    cause,
                });
            }
        }
        let delay = match (cause, server_wait) {
            // The breaker's own time: not a backoff step, not a failure.
            (ReconnectCause::Rejected, wait) => {
                wait.unwrap_or(self.policy.max_delay).max(self.policy.floor)
            }
            (_, wait) => {
                let backoff = self.backoff.delay(self.unstable, self.previous, random);
                self.previous = Some(backoff);
                self.unstable = self.unstable.saturating_add(1);
                let server = wait.map_or(Duration::ZERO, |w| w.min(self.policy.max_server_wait));
                backoff.max(server).max(self.policy.floor)
            }
        };
        Ok(Reconnection {
            cause,
            attempt: self.unstable.max(1),
            failed: self.failed,
            delay,
        })
    }

    /// [`plan`](Self::plan) now, then waits the delay (tokio's clock).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future cancels the wait; the plan is already counted, so a reconnect
    /// made anyway is the next attempt.
    pub async fn after(
        &mut self,
        cause: ReconnectCause,
        server_wait: Option<Duration>,
    ) -> Result<Reconnection, GaveUp> {
        let next = self.plan_now(cause, server_wait)?;
        tokio::time::sleep(next.delay).await;
        Ok(next)
    }

    /// [`plan`](Self::plan) at tokio's now with the policy's random source.
    pub(crate) fn plan_now(
        &mut self,
        cause: ReconnectCause,
        server_wait: Option<Duration>,
    ) -> Result<Reconnection, GaveUp> {
        let random = self.policy.random.clone();
        let random: &dyn RandomSource = match &random {
            Some(r) => r.as_ref(),
            None => &ThreadRandom,
        };
        let next = self.plan(cause, server_wait, Instant::now(), random)?;
        crate::stream::observe::reconnect(
            self.origin.as_ref(),
            next.cause.as_str(),
            next.attempt,
            next.failed,
            next.delay,
        );
        Ok(next)
    }
}

impl std::fmt::Display for GaveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "gave up after {} failed reconnects in a row (last: {})",
            self.failed,
            self.cause.as_str()
        )
    }
}

impl std::error::Error for GaveUp {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::SeededRandom;

    const S: Duration = Duration::from_secs(1);

    /// A random source that always gives the same sample.
    #[derive(Debug)]
    struct Fixed(f64);
    impl RandomSource for Fixed {
        fn next_unit(&self) -> f64 {
            self.0
        }
    }

    fn exact() -> Reconnect {
        Reconnect::new(ReconnectPolicy::new().jitter(Jitter::None)).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn failed_reconnects_back_off_to_the_cap_and_a_stable_connection_resets() {
        let mut r = exact();
        let now = Instant::now();
        let status = ReconnectCause::Status(StatusCode::SERVICE_UNAVAILABLE);
        let delays: Vec<_> = (0..6)
            .map(|_| {
                r.plan(status, None, now, &Fixed(0.0))
                    .unwrap()
                    .delay
                    .as_secs()
            })
            .collect();
        assert_eq!(delays, [3, 6, 12, 24, 30, 30]);
        assert_eq!(r.failed(), 6);
        r.opened();
        assert_eq!(r.failed(), 0);
        tokio::time::advance(60 * S).await;
        let next = r.plan(ReconnectCause::Cut, None, Instant::now(), &Fixed(0.0));
        assert_eq!(next.unwrap().delay, 3 * S);
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_lived_connection_does_not_reset_the_backoff() {
        let mut r = exact();
        for want in [3, 6, 12] {
            r.opened();
            tokio::time::advance(S).await;
            let next = r.plan(ReconnectCause::Ended, None, Instant::now(), &Fixed(0.0));
            assert_eq!(next.unwrap().delay, want * S);
        }
        assert_eq!(r.failed(), 0, "an ended stream is not a failed reconnect");
    }

    #[test]
    fn retry_zero_is_held_to_the_floor_with_jitter_too() {
        let mut r = Reconnect::new(ReconnectPolicy::new()).unwrap();
        r.set_reconnection_time(Duration::ZERO);
        for sample in [0.0, 0.5, 0.999] {
            r.unstable = 0;
            let d = (r.plan(ReconnectCause::Ended, None, Instant::now(), &Fixed(sample)))
                .unwrap()
                .delay;
            assert!(
                (ReconnectPolicy::FLOOR..=2 * ReconnectPolicy::FLOOR).contains(&d),
                "{d:?}"
            );
        }
    }

    #[test]
    fn jitter_spreads_the_first_reconnect_between_half_and_all_of_the_time() {
        let mut r = Reconnect::new(ReconnectPolicy::new()).unwrap();
        let seeded = SeededRandom::new(7);
        let mut delays: Vec<_> = (0..100)
            .map(|_| {
                r.unstable = 0;
                r.plan(ReconnectCause::Cut, None, Instant::now(), &seeded)
                    .unwrap()
                    .delay
            })
            .collect();
        delays.sort();
        delays.dedup();
        assert!(delays.len() > 90, "{}", delays.len());
        assert!(delays[0] >= Duration::from_millis(1500) && delays[delays.len() - 1] <= 3 * S);
    }

    #[test]
    fn a_server_wait_outranks_the_backoff_up_to_its_cap() {
        let mut r = exact();
        let status = ReconnectCause::Status(StatusCode::TOO_MANY_REQUESTS);
        let now = Instant::now();
        assert_eq!(
            r.plan(status, Some(20 * S), now, &Fixed(0.0))
                .unwrap()
                .delay,
            20 * S
        );
        assert_eq!(
            r.plan(status, Some(3600 * S), now, &Fixed(0.0))
                .unwrap()
                .delay,
            60 * S
        );
    }

    #[test]
    fn a_rejection_waits_the_breakers_time_and_is_no_failure() {
        let mut r = exact();
        let now = Instant::now();
        let next = r
            .plan(ReconnectCause::Rejected, Some(12 * S), now, &Fixed(0.0))
            .unwrap();
        assert_eq!((next.delay, next.failed), (12 * S, 0));
        let zero = r.plan(
            ReconnectCause::Rejected,
            Some(Duration::ZERO),
            now,
            &Fixed(0.0),
        );
        assert_eq!(
            zero.unwrap().delay,
            ReconnectPolicy::FLOOR,
            "never a tight loop"
        );
        let isolated = r.plan(ReconnectCause::Rejected, None, now, &Fixed(0.0));
        assert_eq!(isolated.unwrap().delay, 30 * S);
    }

    #[test]
    fn the_budget_counts_failed_reconnects_in_a_row() {
        let mut r = Reconnect::new(ReconnectPolicy::new().max_failed(Some(2))).unwrap();
        let failed = ReconnectCause::Failed(Some(FailureKind::Connect));
        let now = Instant::now();
        assert!(r.plan(failed, None, now, &Fixed(0.0)).is_ok());
        assert!(
            r.plan(ReconnectCause::Rejected, None, now, &Fixed(0.0))
                .is_ok()
        );
        assert!(r.plan(failed, None, now, &Fixed(0.0)).is_ok());
        assert_eq!(
            r.plan(failed, None, now, &Fixed(0.0)),
            Err(GaveUp {
                failed: 3,
                cause: failed
            })
        );
    }

    #[test]
    fn a_bad_policy_is_a_typed_error() {
        let bad = ReconnectPolicy::new().jitter(Jitter::Proportional(7.0));
        assert!(matches!(
            Reconnect::new(bad),
            Err(ResilienceError::InvalidConfig(_))
        ));
        let huge = ReconnectPolicy::new().max_delay(Duration::from_secs(1 << 40));
        assert!(matches!(
            Reconnect::new(huge),
            Err(ResilienceError::InvalidConfig(_))
        ));
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn each_reconnect_is_counted_by_origin_and_cause() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let origin = Origin::parse("http://127.0.0.1:9").unwrap();
        let mut r = exact().origin(origin);
        metrics::with_local_recorder(&recorder, || {
            r.plan_now(ReconnectCause::Cut, None).unwrap();
            r.plan_now(ReconnectCause::Rejected, None).unwrap();
            r.plan_now(ReconnectCause::Cut, None).unwrap();
        });
        let mut counts: Vec<(String, u64)> = recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == crate::stream::observe::RECONNECTS)
            .map(|(key, _, _, value)| {
                let labels: Vec<String> = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                let DebugValue::Counter(n) = value else {
                    panic!("{value:?}")
                };
                (labels.join(","), n)
            })
            .collect();
        counts.sort();
        assert_eq!(
            counts,
            [
                ("origin=http://127.0.0.1:9,cause=cut".to_owned(), 2),
                ("origin=http://127.0.0.1:9,cause=rejected".to_owned(), 1)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn after_waits_the_delay_on_tokios_clock() {
        let mut r = exact();
        let start = Instant::now();
        let next = r.after(ReconnectCause::Ended, None).await.unwrap();
        assert_eq!((next.delay, start.elapsed()), (3 * S, 3 * S));
    }
}
