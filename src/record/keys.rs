//! The keys the stages leave in a request's extensions: what the retry middleware did
//! ([`RetryOutcome`]), what a breaker's rejection says ([`RetryIn`]), the request's
//! [`Deadline`], and the crate-private keys a stage hands inward ([`HandedOnDeadline`],
//! [`AttemptScope`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::Extensions;
use tokio::time::Instant;

use super::decision::StopReason;

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
}

/// Left in the request's extensions when a breaker or a pause turned the request away:
/// how long until trying again may succeed, counted from the rejection.
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::breaker::RetryIn;
///
/// let mut extensions = http::Extensions::new();
/// extensions.insert(RetryIn(Duration::from_secs(5)));
/// // What a retry middleware does after `next.run`:
/// let wait = extensions.get::<RetryIn>().map(|r| r.0);
/// assert_eq!(wait, Some(Duration::from_secs(5)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RetryIn(pub Duration);

/// A request's total deadline (`retry::Deadline` and `breaker::Deadline` are this type).
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
/// use reqwest_resilience::breaker::Deadline;
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
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let client = reqwest_middleware::ClientWithMiddleware::from(reqwest::Client::new());
    /// let request = client
    ///     .get("http://127.0.0.1:8080/report")
    ///     .with_extension(Deadline::after(Duration::from_secs(5)));
    /// # drop(request); }
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

/// The crate-private keys the retry middleware hands the stages inside it, in one
/// extension (one allocation per request, however many attempts).
#[derive(Clone, Default)]
pub(crate) struct Inward {
    /// The [`Deadline`] the retry middleware put in the caller's extensions from its
    /// `total_deadline`, so that one left behind by a dropped request is recognised and
    /// removed by the next request's owner (a caller's own `Deadline` stays).
    handed_on: Option<Deadline>,
    /// The current attempt's own cut and role, which the breaker takes.
    attempt: Option<AttemptScope>,
}

impl Inward {
    /// Puts `deadline` in the extensions for the stages inside, marked as handed on.
    pub(crate) fn hand_on_deadline(extensions: &mut Extensions, deadline: Deadline) {
        extensions.insert(deadline);
        extensions.get_or_insert_default::<Inward>().handed_on = Some(deadline);
    }

    /// Ends what the retry middleware handed inward for its request: the record, and the
    /// deadline [`hand_on_deadline`](Self::hand_on_deadline) put there.
    pub(crate) fn end(extensions: &mut Extensions) {
        if extensions
            .remove::<Inward>()
            .is_some_and(|inward| inward.handed_on.is_some())
        {
            extensions.remove::<Deadline>();
        }
    }

    /// Hands the next attempt its scope.
    pub(crate) fn set_attempt(extensions: &mut Extensions, scope: AttemptScope) {
        extensions.get_or_insert_default::<Inward>().attempt = Some(scope);
    }

    /// Takes the attempt's scope (the breaker does, so it never outlives the attempt),
    /// and the record with it when it holds nothing else: nothing is left behind.
    pub(crate) fn take_attempt(extensions: &mut Extensions) -> Option<AttemptScope> {
        let inward = extensions.get_mut::<Inward>()?;
        let scope = inward.attempt.take();
        if inward.handed_on.is_none() {
            extensions.remove::<Inward>();
        }
        scope
    }

    /// Removes what the stack handed inward for the request of an earlier `Extensions`'
    /// owner: the handed-on deadline (when it is still the one in the extensions) and an
    /// attempt's scope.
    pub(super) fn clear(extensions: &mut Extensions) {
        if let Some(Inward {
            handed_on: Some(stale),
            ..
        }) = extensions.remove::<Inward>()
            && extensions.get::<Deadline>() == Some(&stale)
        {
            extensions.remove::<Deadline>();
        }
    }
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

/// The earlier of two instants, either of which may be absent (no cut).
pub(crate) fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
