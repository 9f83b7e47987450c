//! The per-attempt timeout ([`AttemptTimeout`]) and what the retry middleware tells the
//! middlewares inside it about one attempt ([`AttemptScope`]).
//!
//! The total deadline bounds a logical request; the attempt timeout bounds one attempt's
//! wait for its response head (Polly's attempt timeout, Envoy's `per_try_timeout`), so a
//! server that hangs on one connection costs one attempt, not the whole deadline. A body
//! streamed after the head is not cut: reading it is the caller's business, past this stack.

use std::time::Duration;

use tokio::time::error::Elapsed;

use crate::error::ResilienceError;
use crate::origin::Origin;
use crate::stage::{CutAt, Handover, RestOfStack};
use http::Extensions;
use reqwest::{Request, Response};
use tokio::time::Instant;

use crate::record::{AttemptClock, AttemptScope, Deadline, Inward, RequestEvidence, earlier};

/// Per-request override of the attempt timeout: each attempt of this request waits at
/// most this long for its response head, counted from when it leaves for the network
/// (past the breaker's admission and the concurrency limit's queue). `AttemptTimeout(Duration::MAX)` turns the timeout
/// off for the request; `AttemptTimeout(Duration::ZERO)` is refused, as the builder
/// refuses a zero timeout: the request fails at once with
/// [`ResilienceError::InvalidConfig`], nothing sent and never retried.
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::retry::AttemptTimeout;
///
/// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
/// let client = reqwest_resilience::Resilience::new().build_from(reqwest::Client::builder())?;
/// // This endpoint streams a long completion: give its first byte two minutes.
/// let request = client
///     .post("http://127.0.0.1:8080/v1/completions")
///     .with_extension(AttemptTimeout(Duration::from_secs(120)));
/// # drop(request); Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptTimeout(pub Duration);

/// The request's attempt timeout: its [`AttemptTimeout`], else the configured one.
///
/// A request whose [`AttemptTimeout`] is zero is refused as the builder refuses a zero
/// `attempt_timeout`: a typed error ([`ResilienceError::InvalidConfig`]) before anything
/// is sent, never retried (every attempt would be cut before it left).
pub(super) fn for_request(
    extensions: &Extensions,
    configured: Option<Duration>,
) -> Result<Option<Duration>, reqwest_middleware::Error> {
    match extensions.get::<AttemptTimeout>() {
        Some(AttemptTimeout(t)) if t.is_zero() => Err(reqwest_middleware::Error::middleware(
            ResilienceError::InvalidConfig(
                "AttemptTimeout must be longer than zero (AttemptTimeout(Duration::MAX) turns \
                 it off)"
                    .to_owned(),
            ),
        )),
        Some(AttemptTimeout(t)) => Ok(Some(*t)),
        None => Ok(configured),
    }
}

/// The earlier of the total deadline and `now + timeout`.
pub(super) fn attempt_cut(deadline: Option<Instant>, timeout: Option<Duration>) -> Option<Instant> {
    // A timeout beyond the clock's range is no timeout.
    earlier(
        deadline,
        timeout.and_then(|t| Instant::now().checked_add(t)),
    )
}

/// Runs one attempt through the rest of the stack, cut at `cut` ([`start_attempt`] and
/// then [`AttemptEnd::finish`]), and hands `extensions` back with the result (a hedged
/// round's first copy runs on the caller's, which the round reads once it is done).
///
/// Not an `async fn` (stage cost rule 1): its arguments are held once, in the block.
#[allow(clippy::too_many_arguments, clippy::manual_async_fn)]
pub(super) fn run_attempt<'x, N: RestOfStack + 'x>(
    next: N,
    req: Request,
    extensions: &'x mut Extensions,
    handover: Handover<'x>,
    owner: crate::stage::scope::Ownership,
    cut: Option<Instant>,
    scope: Option<AttemptScope>,
    attempt: u32,
) -> impl Future<Output = (reqwest_middleware::Result<Response>, &'x mut Extensions)> + Send + 'x {
    async move {
        // Taken now (the request moves into the attempt), and only when a cut can use it.
        let origin = cut.and_then(|_| handover.origin(req.url()));
        let (sent, end) = start_attempt(
            next,
            req,
            &mut *extensions,
            handover,
            owner,
            cut,
            scope,
            attempt,
        );
        let outcome = sent.await;
        let result = end.finish(outcome, &mut *extensions, &origin);
        (result, extensions)
    }
}

/// The future of an attempt started by [`start_attempt`].
pub(super) type Sent<'a> = CutAt<crate::stage::scope::PolledAs<crate::stage::Handled<'a>>>;

/// What the end of an attempt needs to know ([`AttemptEnd::finish`]).
#[must_use]
pub(super) struct AttemptEnd {
    /// `Some` when the attempt can be cut: when it started, its number.
    cut: Option<(Instant, u32)>,
    scoped: bool,
    /// The attempt's timeout clock, restarted by the gates inside.
    clock: Option<AttemptClock>,
}

/// Starts one attempt through the rest of the stack, cut at `cut`; synchronous, so that
/// the request moves straight into the attempt's future (an `async fn` would keep it in
/// its own as well). A cut leaves the same evidence as the total deadline's (`Unknown` /
/// `Timeout`: the request may have reached the server) and tokio's `Elapsed` as the
/// error, so the decision table treats both alike (retried only when idempotent).
///
/// `owner` marks the request while the rest of the stack runs: as under a retry
/// middleware, and as owned when the retry owns it (or the copy is its own).
#[allow(clippy::too_many_arguments)]
pub(super) fn start_attempt<'a, N: RestOfStack + 'a>(
    next: N,
    req: Request,
    extensions: &'a mut Extensions,
    handover: Handover<'a>,
    owner: crate::stage::scope::Ownership,
    cut: Option<Instant>,
    scope: Option<AttemptScope>,
    attempt: u32,
) -> (Sent<'a>, AttemptEnd) {
    let scoped = scope.is_some();
    // Read only when something cuts this attempt (most attempts: nothing).
    let now = (scoped || cut.is_some()).then(Instant::now);
    let mut clock = None;
    if let (Some(scope), Some(now)) = (scope, now) {
        // The attempt timeout runs on a clock the gates inside restart when they let the
        // request go (and stop while it waits in a queue or for a pause): it bounds the
        // time the request is out, not a local wait. The deadline bounds both.
        if let Some(timeout) = Inward::attempt_timeout(extensions) {
            let deadline = extensions.get::<Deadline>().map(|d| d.0);
            let started = AttemptClock::start(timeout, deadline, now);
            Inward::set_clock(extensions, started.clone());
            clock = Some(started);
        }
        Inward::set_attempt(extensions, scope);
    }
    let cut_end = cut.zip(now).map(|(_, now)| (now, attempt));
    let sent = CutAt::on_clock(
        owner.poll_as_retry(next, |next| next.run_boxed(req, extensions, handover)),
        cut,
        clock.clone(),
    );
    (
        sent,
        AttemptEnd {
            cut: cut_end,
            scoped,
            clock,
        },
    )
}

impl AttemptEnd {
    /// The attempt's result, its cut's evidence (for the request's `origin`) left in
    /// `extensions`.
    pub(super) fn finish(
        self,
        outcome: Result<reqwest_middleware::Result<Response>, Elapsed>,
        extensions: &mut Extensions,
        origin: &Option<Origin>,
    ) -> reqwest_middleware::Result<Response> {
        let result = match outcome {
            Ok(result) => result,
            Err(elapsed) => {
                if let Some((started, attempt)) = self.cut {
                    // Timed from the clock's last start: a gate's admission.
                    let started = self
                        .clock
                        .as_ref()
                        .and_then(AttemptClock::started)
                        .unwrap_or(started);
                    let mut evidence =
                        RequestEvidence::cut_at_deadline(origin.clone(), attempt, started);
                    crate::record::ProxyUsed::carry_into_cut(extensions, &mut evidence);
                    crate::record::RequestRecord::set_evidence(extensions, evidence);
                }
                Err(reqwest_middleware::Error::middleware(elapsed))
            }
        };
        if self.scoped {
            // The scope (without a breaker inside nothing took it) and the clock.
            Inward::end_attempt(extensions);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_cut_is_the_earlier_of_deadline_and_timeout() {
        let now = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(attempt_cut(None, None), None);
        assert_eq!(attempt_cut(Some(now + s(5)), None), Some(now + s(5)));
        assert_eq!(attempt_cut(None, Some(s(2))), Some(now + s(2)));
        assert_eq!(attempt_cut(Some(now + s(5)), Some(s(2))), Some(now + s(2)));
        assert_eq!(attempt_cut(Some(now + s(1)), Some(s(2))), Some(now + s(1)));
        assert_eq!(attempt_cut(None, Some(Duration::MAX)), None);
    }
}
