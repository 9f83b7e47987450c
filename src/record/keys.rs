//! The keys the stages leave in a request's extensions: what the retry middleware did
//! ([`RetryOutcome`]), what a breaker's rejection says ([`RetryIn`]), the request's
//! [`Deadline`], and the crate-private keys a stage hands inward ([`HandedOnDeadline`],
//! [`AttemptScope`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::decision::StopReason;
use crate::origin::Origin;

/// What the retry middleware did, left in the caller's extensions and the response's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryOutcome {
    /// Attempts made, counting the first.
    pub attempts: u32,
    /// Why no further attempt was made (for a success: `FinalResponse(200)`).
    pub stop: StopReason,
}

impl RetryOutcome {
    /// Attempts after the first: OpenTelemetry's `http.request.resend_count`.
    pub fn resend_count(&self) -> u32 {
        self.attempts.saturating_sub(1)
    }

    /// Retries made: the attempts after the first (with hedging, the hedges sent count as
    /// attempts too). uv reports it as "Request failed after N retries".
    ///
    /// ```
    /// use reqwest_resilience::retry::RetryOutcome;
    /// # fn show(outcome: &RetryOutcome) {
    /// println!("failed after {} retries: {}", outcome.retries(), outcome.stop);
    /// # }
    /// ```
    pub fn retries(&self) -> u32 {
        self.attempts.saturating_sub(1)
    }
}

/// Left in the request's extensions when a breaker or a pause turned the request away:
/// how long until trying again may succeed, counted from the rejection.
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::breaker::RetryIn;
///
/// let mut extensions = http::Extensions::new();
/// RetryIn(Duration::from_secs(5)).insert_into(&mut extensions);
/// // What a retry middleware does after `next.run`:
/// let wait = RetryIn::of(&extensions).map(|r| r.0);
/// assert_eq!(wait, Some(Duration::from_secs(5)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RetryIn(pub Duration);

/// A request's total deadline (public as `retry::Deadline`; the breaker and the limiter read it too).
///
/// The retry middleware makes no retry whose delay would end past it and cuts an attempt
/// still running at it (the attempt's evidence is then `Unknown`/`Timeout`, and the stop
/// reason `DeadlineExceeded`); the breaker does not wait for a pause past it. It replaces
/// the retry middleware's own
/// [`total_deadline`](crate::retry::RetryMiddlewareBuilder::total_deadline) for that
/// request; when only the latter is set, the retry middleware hands it on to the
/// middlewares inside it as a `Deadline` for the duration of the request.
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::retry::Deadline;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let mut extensions = http::Extensions::new();
/// extensions.insert(Deadline(tokio::time::Instant::now() + Duration::from_secs(2)));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Deadline(pub tokio::time::Instant);

impl Deadline {
    /// `total` from now (tokio's clock).
    ///
    /// ```
    /// use std::time::Duration;
    /// use reqwest_resilience::retry::Deadline;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = reqwest_resilience::Resilience::new().build_from(reqwest::Client::builder())?;
    /// let request = client
    ///     .get("http://127.0.0.1:8080/report")
    ///     .with_extension(Deadline::after(Duration::from_secs(5)));
    /// # drop(request); Ok(()) }
    /// ```
    pub fn after(total: Duration) -> Self {
        let now = Instant::now();
        // Beyond the clock's range is as good as no deadline.
        Deadline(
            now.checked_add(total)
                .unwrap_or(now + Duration::from_secs(86_400 * 365 * 30)),
        )
    }
}

/// The crate-private keys the retry middleware hands the stages inside it, in the
/// request's [`RequestRecord`] (no allocation of their own, however many attempts).
#[derive(Clone, Default)]
pub(crate) struct Inward {
    /// The [`Deadline`] the retry middleware put in the caller's extensions from its
    /// `total_deadline`, so that one left behind by a dropped request is recognised and
    /// removed by the next request's owner (a caller's own `Deadline` stays).
    pub(super) handed_on: Option<Deadline>,
    /// The current attempt's own cut and role, which the breaker takes.
    pub(super) attempt: Option<AttemptScope>,
    /// The request's attempt timeout, from which each attempt (each copy of a hedged
    /// round) starts a clock of its own.
    pub(super) attempt_timeout: Option<Duration>,
    /// The current attempt's timeout clock, which the gates inside restart when they let
    /// the request go (and stop while it waits locally).
    pub(super) clock: Option<AttemptClock>,
}

/// What the retry middleware hands the middlewares inside it for one attempt (in
/// [`Inward`]). The circuit breaker takes it (so it never outlives the attempt it was
/// meant for): it cuts the attempt at `cut` and counts that as a failure, as it does at
/// the total deadline.
#[derive(Clone, Default)]
pub(crate) struct AttemptScope {
    /// When the attempt timeout cuts this attempt (`None`: only the total deadline).
    pub(crate) cut: Option<Instant>,
    /// Set once another copy of a hedged request won: a copy dropped after that was
    /// cancelled, and says nothing about the server's health.
    pub(crate) lost: Option<Arc<AtomicBool>>,
    /// A hedge (an extra copy): the breaker turns it away at once rather than wait out a
    /// pause or take a half-open probe slot.
    pub(crate) hedge: bool,
}

impl AttemptScope {
    /// The scope of an attempt cut at `cut`, not part of a hedged race.
    pub(crate) fn cut_at(cut: Option<Instant>) -> Self {
        AttemptScope {
            cut,
            ..AttemptScope::default()
        }
    }

    /// Whether this copy lost a hedged race (then its drop is no verdict on the server).
    pub(crate) fn is_lost(lost: Option<&Arc<AtomicBool>>) -> bool {
        lost.is_some_and(|l| l.load(Ordering::Acquire))
    }
}

/// The clock of one attempt's timeout, shared by the stages that cut the attempt (the
/// retry middleware that started it, and the gates inside: the breaker, the limiter).
///
/// The attempt timeout bounds the time a request is *out*, not the time it waits
/// locally: a gate that lets the request go (the breaker after its admission, the
/// concurrency limit after its permit) restarts the clock, and one that makes it wait (a
/// pause, the limiter's queue) stops it for the wait. Every stage cuts at the same
/// instant, [`cut`](Self::cut), re-read when its timer fires; the innermost one, being
/// polled first, normally sees it first. The total deadline cuts everything, stopped or
/// not.
#[derive(Clone)]
pub(crate) struct AttemptClock(Arc<ClockState>);

struct ClockState {
    timeout: Duration,
    deadline: Option<Instant>,
    /// When the attempt started: the base of `started`.
    base: Instant,
    /// Nanoseconds after `base` at which the clock last started, or [`STOPPED`].
    started: AtomicU64,
    /// The proxy of a pool the attempt went out through: the breaker that counts the
    /// attempt's cut gives it its success, whichever stage's timer fired first.
    proxy: Mutex<Option<Origin>>,
}

/// The clock's `started` while the request waits locally.
const STOPPED: u64 = u64::MAX;

impl AttemptClock {
    /// A clock started `now`, for an attempt of `timeout` under `deadline`.
    pub(crate) fn start(timeout: Duration, deadline: Option<Instant>, now: Instant) -> Self {
        AttemptClock(Arc::new(ClockState {
            timeout,
            deadline,
            base: now,
            started: AtomicU64::new(0),
            proxy: Mutex::new(None),
        }))
    }

    /// The attempt goes out through `proxy` (of a proxy pool).
    pub(crate) fn carried_by(&self, proxy: &Origin) {
        *self.0.proxy.lock().unwrap_or_else(PoisonError::into_inner) = Some(proxy.clone());
    }

    /// The proxy the attempt went out through, if any.
    pub(crate) fn proxy(&self) -> Option<Origin> {
        self.0
            .proxy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The request waits locally (a queue, a pause): only the deadline cuts it.
    pub(crate) fn stop(&self) {
        self.0.started.store(STOPPED, Ordering::Release);
    }

    /// A gate let the request go at `now`: the timeout runs from there.
    pub(crate) fn restart(&self, now: Instant) {
        let nanos = now.saturating_duration_since(self.0.base).as_nanos();
        let nanos = u64::try_from(nanos).unwrap_or(STOPPED - 1).min(STOPPED - 1);
        self.0.started.store(nanos, Ordering::Release);
    }

    /// When the clock last started (`None`: stopped).
    pub(crate) fn started(&self) -> Option<Instant> {
        match self.0.started.load(Ordering::Acquire) {
            STOPPED => None,
            nanos => Some(self.0.base + Duration::from_nanos(nanos)),
        }
    }

    /// Whether the request waits locally now.
    pub(crate) fn is_stopped(&self) -> bool {
        self.started().is_none()
    }

    /// Whether the cut, as things stand, is the attempt timeout's: the clock runs and its
    /// timeout ends at or before the deadline (a cut that is the deadline's alone is the
    /// caller's own limit, and says nothing about the server).
    pub(crate) fn cut_by_timeout(&self) -> bool {
        let timed = self
            .started()
            .and_then(|started| started.checked_add(self.0.timeout));
        timed.is_some_and(|t| self.0.deadline.is_none_or(|d| t <= d))
    }

    /// When the attempt is cut as things stand: the timeout after the clock's last start
    /// or the deadline, whichever is first; while stopped, the deadline (`None`: never).
    pub(crate) fn cut(&self) -> Option<Instant> {
        let timed = self
            .started()
            .and_then(|started| started.checked_add(self.0.timeout));
        earlier(self.0.deadline, timed)
    }
}

/// The earlier of two instants, either of which may be absent (no cut).
pub(crate) fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
