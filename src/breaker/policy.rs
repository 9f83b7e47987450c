//! When a breaker trips ([`TripPolicy`]) and how an attempt counts ([`Outcome`],
//! [`AttemptClassifier`]).

use std::time::Duration;

use http::StatusCode;
use reqwest::Response;
use tokio::time::Instant;

use crate::record::{FailureKind, RequestEvidence, Transmission};

/// How one attempt counts towards its origin's breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The origin answered as a healthy server does (2xx, 3xx).
    Success,
    /// The origin is unhealthy or overloaded (5xx, 401, 429, a transport failure).
    Failure,
    /// Says nothing about the origin's health (other 4xx: the caller's own bug must not
    /// trip a breaker that other callers share). A neutral probe frees its slot.
    Neutral,
    /// The server closed or reset the connection before any byte of a response
    /// ([`DefaultClassifier::is_connection_loss`]): a failure that counts **at most once
    /// per event**. A graceful reload, a rotation or an idle close ends every attempt in
    /// flight on the origin's pooled connections at once; that is one piece of evidence,
    /// not one per attempt. So a connection loss counts as a [`Failure`](Self::Failure)
    /// only when its attempt was admitted after the last connection loss its origin's
    /// breaker counted; the attempts already in flight at that moment were hit by the same
    /// event and count as [`Neutral`](Self::Neutral). A server that closes every
    /// connection, fresh ones included, still trips the breaker: each attempt started
    /// after the last counted loss counts.
    ConnectionLost,
}

/// When a Closed breaker trips open.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TripPolicy {
    /// Trips after `threshold` failures in a row; a success resets the count, a neutral
    /// outcome leaves it as it is. The seed's policy (default threshold 5).
    ConsecutiveFailures {
        /// Failures in a row that trip the breaker (at least 1).
        threshold: u32,
    },
    /// Trips when, over the last `sampling_window`, at least `minimum_throughput` attempts
    /// were counted and the share of failures among them reached `ratio` (Polly's
    /// advanced circuit breaker, resilience4j's time-based sliding window).
    ///
    /// The window is kept as 10 buckets of `sampling_window / 10` each, so
    /// memory is fixed whatever the traffic; attempts leave the window a bucket at a time.
    FailureRatio {
        /// The failure share that trips the breaker, in `(0, 1]`.
        ratio: f64,
        /// How far back attempts are counted (at least 10 ms).
        sampling_window: Duration,
        /// Attempts the window must hold before the ratio may trip it (at least 1).
        minimum_throughput: u32,
    },
}

impl TripPolicy {
    /// Trips after `threshold` consecutive failures.
    pub fn consecutive_failures(threshold: u32) -> TripPolicy {
        TripPolicy::ConsecutiveFailures { threshold }
    }

    /// Trips when the failure share over `sampling_window` reaches `ratio`, once at least
    /// `minimum_throughput` attempts were counted in the window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use reqwest_resilience::breaker::TripPolicy;
    ///
    /// // Polly's defaults: 10% failures over 30 s, at least 100 calls.
    /// let policy = TripPolicy::failure_ratio(0.1, Duration::from_secs(30), 100);
    /// # drop(policy);
    /// ```
    pub fn failure_ratio(
        ratio: f64,
        sampling_window: Duration,
        minimum_throughput: u32,
    ) -> TripPolicy {
        TripPolicy::FailureRatio {
            ratio,
            sampling_window,
            minimum_throughput,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        match *self {
            TripPolicy::ConsecutiveFailures { threshold } => {
                if threshold == 0 {
                    return Err("consecutive-failures threshold must be at least 1".into());
                }
            }
            TripPolicy::FailureRatio {
                ratio,
                sampling_window,
                minimum_throughput,
            } => {
                if !(ratio > 0.0 && ratio <= 1.0) {
                    return Err(format!("failure ratio must be in (0, 1], got {ratio}"));
                }
                if sampling_window < MIN_SAMPLING_WINDOW {
                    return Err(format!(
                        "sampling window must be at least {MIN_SAMPLING_WINDOW:?}, got {sampling_window:?}"
                    ));
                }
                if minimum_throughput == 0 {
                    return Err("minimum throughput must be at least 1".into());
                }
            }
        }
        Ok(())
    }
}

impl Default for TripPolicy {
    fn default() -> Self {
        TripPolicy::consecutive_failures(5)
    }
}

/// The number of buckets a [`TripPolicy::FailureRatio`] window is cut into.
pub(crate) const WINDOW_BUCKETS: usize = 10;

// Slot numbers at or past this restart the window's epoch (49 days of 1 ms buckets).
const SLOT_LIMIT: u32 = u32::MAX - 1;

/// Below this a bucket would be shorter than a millisecond: timer noise, not a window.
const MIN_SAMPLING_WINDOW: Duration = Duration::from_millis(10);

/// A sliding window of [`WINDOW_BUCKETS`] time buckets, each holding counts `C`: fixed
/// size whatever the traffic; counts leave the window a bucket at a time. Both the
/// failure-ratio policy and the slow-call trip ([`SlowCalls`](super::SlowCalls)) keep
/// one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Window<C> {
    epoch: Instant,
    buckets: [Bucket<C>; WINDOW_BUCKETS],
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Bucket<C> {
    // 1-based index of the bucket's time slice since the window's epoch; 0 = never used.
    // u32 keeps a bucket of two u32 counts at 12 bytes; the epoch is moved before it
    // could overflow.
    slot: u32,
    counts: C,
}

impl<C: Copy + Default> Window<C> {
    pub(crate) fn new(now: Instant) -> Self {
        Window {
            epoch: now,
            buckets: [Bucket::default(); WINDOW_BUCKETS],
        }
    }

    /// The counts of the bucket `now` falls in, for `sampling_window`.
    fn bucket_mut(&mut self, sampling_window: Duration, now: Instant) -> &mut C {
        let mut slot = self.slot(sampling_window, now);
        if slot >= SLOT_LIMIT {
            // Years of a tiny window: start a new epoch.
            *self = Window::new(now);
            slot = 1;
        }
        let bucket = &mut self.buckets[(slot % WINDOW_BUCKETS as u32) as usize];
        if bucket.slot != slot {
            *bucket = Bucket {
                slot,
                counts: C::default(),
            };
        }
        &mut bucket.counts
    }

    /// The counts of the buckets still in the window at `now`, summed by `add`.
    fn sum<T: Default>(
        &self,
        sampling_window: Duration,
        now: Instant,
        add: impl Fn(T, &C) -> T,
    ) -> T {
        let current = self.slot(sampling_window, now);
        self.buckets
            .iter()
            .filter(|b| {
                b.slot != 0 && b.slot <= current && current - b.slot < WINDOW_BUCKETS as u32
            })
            .fold(T::default(), |acc, b| add(acc, &b.counts))
    }

    fn slot(&self, sampling_window: Duration, now: Instant) -> u32 {
        let width = (sampling_window.as_nanos() / WINDOW_BUCKETS as u128).max(1);
        let since = now.saturating_duration_since(self.epoch).as_nanos();
        u32::try_from(since / width)
            .map_or(SLOT_LIMIT, |s| s.saturating_add(1))
            .min(SLOT_LIMIT)
    }
}

/// One bucket of the failure-ratio window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct RatioCounts {
    successes: u32,
    failures: u32,
}

/// One bucket of the slow-call window: the timed calls, and how many of them were slow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SlowCounts {
    calls: u32,
    slow: u32,
}

/// What the policy remembers between attempts while Closed. Fixed size whatever the
/// traffic: a counter and a [`Window`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PolicyState {
    consecutive_failures: u32,
    window: Window<RatioCounts>,
}

impl PolicyState {
    pub(crate) fn new(now: Instant) -> Self {
        PolicyState {
            consecutive_failures: 0,
            window: Window::new(now),
        }
    }

    /// Forgets everything: the breaker (re-)entered Closed at `now`.
    pub(crate) fn reset(&mut self, now: Instant) {
        *self = PolicyState::new(now);
    }

    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// `(attempts, failures)` counted in the window at `now`; zeros under the
    /// consecutive-failures policy.
    pub(crate) fn window_counts(&self, policy: &TripPolicy, now: Instant) -> (u32, u32) {
        let TripPolicy::FailureRatio {
            sampling_window, ..
        } = *policy
        else {
            return (0, 0);
        };
        self.window
            .sum(sampling_window, now, |(calls, failures): (u32, u32), b| {
                (
                    calls.saturating_add(b.successes).saturating_add(b.failures),
                    failures.saturating_add(b.failures),
                )
            })
    }

    /// Counts `outcome`; returns whether the policy now says "trip". A
    /// [`Outcome::ConnectionLost`] reaching the policy is a failure: the breaker has already
    /// decided whether the event it belongs to was counted (see [`Breaker`](super::Breaker)).
    pub(crate) fn record(&mut self, policy: &TripPolicy, outcome: Outcome, now: Instant) -> bool {
        let outcome = match outcome {
            Outcome::ConnectionLost => Outcome::Failure,
            other => other,
        };
        match outcome {
            Outcome::Neutral => return false,
            Outcome::Success => self.consecutive_failures = 0,
            Outcome::Failure | Outcome::ConnectionLost => {
                self.consecutive_failures = self.consecutive_failures.saturating_add(1)
            }
        }
        match *policy {
            TripPolicy::ConsecutiveFailures { threshold } => {
                outcome == Outcome::Failure && self.consecutive_failures >= threshold
            }
            TripPolicy::FailureRatio {
                ratio,
                sampling_window,
                minimum_throughput,
            } => {
                let bucket = self.window.bucket_mut(sampling_window, now);
                match outcome {
                    Outcome::Success => bucket.successes = bucket.successes.saturating_add(1),
                    _ => bucket.failures = bucket.failures.saturating_add(1),
                }
                if outcome != Outcome::Failure {
                    return false;
                }
                let (calls, failures) = self.window_counts(policy, now);
                calls >= minimum_throughput && f64::from(failures) >= ratio * f64::from(calls)
            }
        }
    }
}

impl Window<SlowCounts> {
    /// Counts one timed call (`slow`: it took longer than the threshold); returns whether
    /// the slow share now trips the breaker.
    pub(crate) fn record_slow(
        &mut self,
        trip: &super::SlowCalls,
        slow: bool,
        now: Instant,
    ) -> bool {
        let bucket = self.bucket_mut(trip.sampling_window, now);
        bucket.calls = bucket.calls.saturating_add(1);
        if !slow {
            return false;
        }
        bucket.slow = bucket.slow.saturating_add(1);
        let (calls, slow) = self.slow_counts(trip, now);
        calls >= trip.minimum_throughput && f64::from(slow) >= trip.rate * f64::from(calls)
    }

    /// `(timed calls, slow calls)` in the window at `now`.
    pub(crate) fn slow_counts(&self, trip: &super::SlowCalls, now: Instant) -> (u32, u32) {
        self.sum(trip.sampling_window, now, |(calls, slow): (u32, u32), b| {
            (calls.saturating_add(b.calls), slow.saturating_add(b.slow))
        })
    }
}

/// Decides how an attempt counts towards its origin's breaker. Replace the default
/// ([`DefaultClassifier`]) with
/// [`CircuitBreakerMiddleware::with_classifier`](super::CircuitBreakerMiddleware::with_classifier).
///
/// `evidence` is the [`RequestEvidence`] the transport step left for this attempt, or
/// `None` when no [`TransportEvidence`](crate::TransportEvidence) runs inside the breaker.
///
/// ```
/// use reqwest_resilience::RequestEvidence;
/// use reqwest_resilience::breaker::{AttemptClassifier, Outcome};
///
/// /// Counts only 503s as failures.
/// struct OnlyUnavailable;
///
/// impl AttemptClassifier for OnlyUnavailable {
///     fn classify(
///         &self,
///         evidence: Option<&RequestEvidence>,
///         result: &reqwest_middleware::Result<reqwest::Response>,
///     ) -> Outcome {
///         let _ = evidence;
///         match result {
///             Ok(r) if r.status() == 503 => Outcome::Failure,
///             Ok(_) => Outcome::Success,
///             Err(_) => Outcome::Neutral,
///         }
///     }
/// }
/// ```
pub trait AttemptClassifier: Send + Sync + 'static {
    /// How the attempt counts.
    fn classify(
        &self,
        evidence: Option<&RequestEvidence>,
        result: &reqwest_middleware::Result<Response>,
    ) -> Outcome;
}

/// The design's classification: 5xx, 401, 429 and transport failures are failures; 2xx
/// and 3xx successes; other 4xx neutral.
///
/// - **Connection losses count once per event.** An attempt that ended with no response
///   head because the server closed or reset its connection ([`FailureKind::Closed`],
///   [`FailureKind::Reset`]; [`is_connection_loss`](Self::is_connection_loss)) is an
///   [`Outcome::ConnectionLost`]: a failure only when the attempt was admitted after the
///   last connection loss its origin's breaker counted. A graceful reload of nginx,
///   haproxy, apache2 or caddy closes every pooled keep-alive connection while requests
///   are being written on them; with 50 requests in flight the 50 losses are one piece of
///   evidence, not 50 (nor the 5 that would open the breaker of a healthy origin). A
///   server that resets every connection, fresh ones included, still trips the breaker
///   after the policy's count of such events, one per round of attempts.
/// - **Rotations are neutral.** A stream the server refused with proof that it did not
///   process it ([`RequestEvidence::not_processed`]: HTTP/2 `REFUSED_STREAM`) and an
///   attempt ended by the server's `GOAWAY` ([`FailureKind::GoAway`], of any error code):
///   that is how a healthy server rotates its connections (nginx's `keepalive_requests`)
///   or holds its stream limit, and five of them in a burst must not open the breaker of
///   a server that answers everything else.
/// - **Nothing asked of the origin is neutral.** A rejection by another breaker or a pause
///   (`NotSent`, [`FailureKind::BreakerOpen`] / [`FailureKind::Paused`]), a bearer token
///   that could not be had (`NotSent`, [`FailureKind::TokenUnavailable`]: the identity
///   provider failed, not the origin), a request that could not be built, an upload body
///   of the caller's that broke on this side ([`FailureKind::UploadBody`]: its stream's
///   error, an unreadable file), and an error from a middleware inside the breaker with no
///   evidence of an attempt.
///
/// Everything else that failed without a response counts in full: refused connects, DNS
/// and TLS failures, timeouts (reqwest's, and the retry middleware's attempt timeout),
/// protocol errors. An attempt cut by the caller's own total deadline, or dropped by the
/// caller, never reaches a classifier: it is neutral (see
/// [`CircuitBreakerMiddleware`](super::CircuitBreakerMiddleware), "Deadlines").
///
/// A classifier of your own keeps counting each connection loss as it returns it
/// ([`Outcome::Failure`] counts every one); return [`Outcome::ConnectionLost`] (for
/// instance when [`is_connection_loss`](Self::is_connection_loss) says so) to count them
/// once per event.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassifier;

impl DefaultClassifier {
    /// How a response status counts.
    pub fn classify_status(status: StatusCode) -> Outcome {
        if status.is_server_error()
            || status == StatusCode::UNAUTHORIZED
            || status == StatusCode::TOO_MANY_REQUESTS
        {
            Outcome::Failure
        } else if status.is_client_error() {
            Outcome::Neutral
        } else {
            // 1xx never reaches a client as a final status; 2xx and 3xx are healthy.
            Outcome::Success
        }
    }

    /// Whether `evidence` shows a connection loss: no response head, and the connection
    /// closed ([`FailureKind::Closed`]: EOF before a complete response head, "connection
    /// closed before message completed") or reset ([`FailureKind::Reset`]: RST, broken
    /// pipe) under the attempt, whether or not its bytes had gone out, without the
    /// server's proof that it was not processed (a proven refusal is neutral anyway).
    pub fn is_connection_loss(evidence: &RequestEvidence) -> bool {
        !matches!(evidence.transmission, Transmission::ResponseReceived(_))
            && evidence.not_processed.is_none()
            && matches!(
                evidence.failure,
                Some(FailureKind::Closed | FailureKind::Reset)
            )
    }
}

impl AttemptClassifier for DefaultClassifier {
    fn classify(
        &self,
        evidence: Option<&RequestEvidence>,
        result: &reqwest_middleware::Result<Response>,
    ) -> Outcome {
        if let Some(e) = evidence {
            if let Transmission::ResponseReceived(status) = e.transmission {
                return DefaultClassifier::classify_status(status);
            }
            // A stream the server refused with proof (`REFUSED_STREAM`; the classifier no
            // longer proves a `GOAWAY`, which is neutral below as `FailureKind::GoAway`): a
            // healthy server at its stream limit.
            if e.not_processed.is_some() {
                return Outcome::Neutral;
            }
            if DefaultClassifier::is_connection_loss(e) {
                return Outcome::ConnectionLost;
            }
            return match e.failure {
                Some(
                    FailureKind::GoAway
                    | FailureKind::NetworkChanged
                    | FailureKind::BreakerOpen
                    | FailureKind::Paused
                    | FailureKind::TokenUnavailable
                    | FailureKind::Misconfigured
                    | FailureKind::ConcurrencyLimited
                    | FailureKind::RateLimited
                    | FailureKind::Builder
                    | FailureKind::UploadBody
                    | FailureKind::Redirect
                    | FailureKind::Decode,
                ) => Outcome::Neutral,
                _ => Outcome::Failure,
            };
        }
        match result {
            Ok(response) => DefaultClassifier::classify_status(response.status()),
            Err(reqwest_middleware::Error::Reqwest(e)) if e.is_builder() || e.is_redirect() => {
                Outcome::Neutral
            }
            // No transport step inside: the error itself says whether it was a lost
            // connection.
            Err(reqwest_middleware::Error::Reqwest(e)) => {
                let c = crate::classify::classify_error(e);
                match (c.kind, c.not_processed) {
                    (FailureKind::Closed | FailureKind::Reset, None) => Outcome::ConnectionLost,
                    _ => Outcome::Failure,
                }
            }
            // A middleware inside the breaker failed before any transport step saw the
            // request (a middleware of the caller's; `BearerAuth` leaves `TokenUnavailable`
            // evidence instead): the origin was not asked.
            Err(reqwest_middleware::Error::Middleware(_)) => Outcome::Neutral,
        }
    }
}

impl<F> AttemptClassifier for F
where
    F: Fn(Option<&RequestEvidence>, &reqwest_middleware::Result<Response>) -> Outcome
        + Send
        + Sync
        + 'static,
{
    fn classify(
        &self,
        evidence: Option<&RequestEvidence>,
        result: &reqwest_middleware::Result<Response>,
    ) -> Outcome {
        self(evidence, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn statuses_classify_as_the_design_says() {
        for (code, want) in [
            (200, Outcome::Success),
            (204, Outcome::Success),
            (301, Outcome::Success),
            (304, Outcome::Success),
            (400, Outcome::Neutral),
            (401, Outcome::Failure),
            (403, Outcome::Neutral),
            (404, Outcome::Neutral),
            (409, Outcome::Neutral),
            (429, Outcome::Failure),
            (500, Outcome::Failure),
            (502, Outcome::Failure),
            (503, Outcome::Failure),
            (504, Outcome::Failure),
        ] {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(DefaultClassifier::classify_status(status), want, "{code}");
        }
    }

    #[test]
    fn evidence_without_response_classifies_by_failure_kind() {
        let c = DefaultClassifier;
        let ok: reqwest_middleware::Result<Response> =
            Ok(http::Response::new(reqwest::Body::from("")).into());
        for (kind, want) in [
            (FailureKind::Connect, Outcome::Failure),
            (FailureKind::Timeout, Outcome::Failure),
            // A lost connection: a failure counted once per event (issue 28).
            (FailureKind::Reset, Outcome::ConnectionLost),
            (FailureKind::Closed, Outcome::ConnectionLost),
            (FailureKind::Protocol, Outcome::Failure),
            (FailureKind::Body, Outcome::Failure),
            (FailureKind::BreakerOpen, Outcome::Neutral),
            (FailureKind::Paused, Outcome::Neutral),
            (FailureKind::TokenUnavailable, Outcome::Neutral),
            (FailureKind::ConcurrencyLimited, Outcome::Neutral),
            (FailureKind::Builder, Outcome::Neutral),
            (FailureKind::UploadBody, Outcome::Neutral),
        ] {
            let mut e = RequestEvidence::new(Transmission::Unknown, None, 1);
            e.failure = Some(kind);
            assert_eq!(c.classify(Some(&e), &ok), want, "{kind:?}");
        }
        // Evidence outranks the result: the response's own 200 is not looked at.
        let e = RequestEvidence::new(
            Transmission::ResponseReceived(StatusCode::SERVICE_UNAVAILABLE),
            None,
            1,
        );
        assert_eq!(c.classify(Some(&e), &ok), Outcome::Failure);
        assert_eq!(c.classify(None, &ok), Outcome::Success);
    }

    #[test]
    fn a_connection_loss_is_closed_or_reset_before_any_response_head() {
        let ok: reqwest_middleware::Result<Response> =
            Ok(http::Response::new(reqwest::Body::from("")).into());
        for transmission in [
            Transmission::NotSent,
            Transmission::SentNoResponse,
            Transmission::Unknown,
        ] {
            for kind in [FailureKind::Closed, FailureKind::Reset] {
                let mut e = RequestEvidence::new(transmission, None, 1);
                e.failure = Some(kind);
                assert!(
                    DefaultClassifier::is_connection_loss(&e),
                    "{transmission:?} {kind:?}"
                );
                assert_eq!(
                    DefaultClassifier.classify(Some(&e), &ok),
                    Outcome::ConnectionLost
                );
            }
        }
        // Not losses: a refused connect, a timeout, a body cut after the head.
        for (transmission, kind) in [
            (Transmission::NotSent, FailureKind::Connect),
            (Transmission::Unknown, FailureKind::Timeout),
            (
                Transmission::ResponseReceived(StatusCode::OK),
                FailureKind::Reset,
            ),
            (Transmission::Unknown, FailureKind::BodyInterrupted),
        ] {
            let mut e = RequestEvidence::new(transmission, None, 1);
            e.failure = Some(kind);
            assert!(!DefaultClassifier::is_connection_loss(&e), "{kind:?}");
        }
    }

    #[test]
    fn a_stream_refused_with_proof_is_neutral() {
        use crate::record::NotProcessedProof;
        let err: reqwest_middleware::Result<Response> = Err(reqwest_middleware::Error::middleware(
            crate::ResilienceError::InvalidConfig("refused".into()),
        ));
        for proof in [NotProcessedProof::RefusedStream, NotProcessedProof::GoAway] {
            let mut e = RequestEvidence::new(Transmission::SentNoResponse, None, 1);
            e.failure = Some(FailureKind::Protocol);
            e.not_processed = Some(proof);
            assert_eq!(DefaultClassifier.classify(Some(&e), &err), Outcome::Neutral);
        }
        // Without the proof, the same protocol failure counts.
        let mut e = RequestEvidence::new(Transmission::SentNoResponse, None, 1);
        e.failure = Some(FailureKind::Protocol);
        assert_eq!(DefaultClassifier.classify(Some(&e), &err), Outcome::Failure);
        // A `GOAWAY` (no proof through hyper) is a connection rotation: neutral too.
        let mut e = RequestEvidence::new(Transmission::Unknown, None, 1);
        e.failure = Some(FailureKind::GoAway);
        assert_eq!(DefaultClassifier.classify(Some(&e), &err), Outcome::Neutral);
    }

    #[test]
    fn inner_middleware_error_without_evidence_is_neutral() {
        let err: reqwest_middleware::Result<Response> = Err(reqwest_middleware::Error::middleware(
            crate::ResilienceError::InvalidConfig("no token".into()),
        ));
        assert_eq!(DefaultClassifier.classify(None, &err), Outcome::Neutral);
    }

    #[test]
    fn consecutive_policy_trips_at_threshold_and_success_resets() {
        let policy = TripPolicy::consecutive_failures(3);
        let now = Instant::now();
        let mut s = PolicyState::new(now);
        assert!(!s.record(&policy, Outcome::Failure, now));
        assert!(!s.record(&policy, Outcome::Failure, now));
        assert!(!s.record(&policy, Outcome::Success, now));
        assert_eq!(s.consecutive_failures(), 0);
        assert!(!s.record(&policy, Outcome::Failure, now));
        assert!(!s.record(&policy, Outcome::Failure, now));
        assert!(!s.record(&policy, Outcome::Neutral, now));
        assert_eq!(s.consecutive_failures(), 2);
        assert!(s.record(&policy, Outcome::Failure, now));
    }

    #[test]
    fn ratio_policy_needs_minimum_throughput_before_tripping() {
        let policy = TripPolicy::failure_ratio(0.5, Duration::from_secs(10), 4);
        let now = Instant::now();
        let mut s = PolicyState::new(now);
        // 3 failures out of 3: 100% but below the minimum of 4 attempts.
        for _ in 0..3 {
            assert!(!s.record(&policy, Outcome::Failure, now));
        }
        assert_eq!(s.window_counts(&policy, now), (3, 3));
        assert!(s.record(&policy, Outcome::Failure, now));
    }

    #[test]
    fn ratio_policy_compares_failure_share_with_ratio() {
        let policy = TripPolicy::failure_ratio(0.5, Duration::from_secs(10), 4);
        let now = Instant::now();
        let mut s = PolicyState::new(now);
        for _ in 0..3 {
            assert!(!s.record(&policy, Outcome::Success, now));
        }
        assert!(!s.record(&policy, Outcome::Failure, now)); // 1/4
        assert!(!s.record(&policy, Outcome::Failure, now)); // 2/5
        assert!(s.record(&policy, Outcome::Failure, now)); // 3/6 = 0.5
        assert_eq!(s.window_counts(&policy, now), (6, 3));
    }

    #[test]
    fn ratio_window_forgets_attempts_a_bucket_at_a_time() {
        let policy = TripPolicy::failure_ratio(0.5, Duration::from_secs(10), 2);
        let t0 = Instant::now();
        let mut s = PolicyState::new(t0);
        assert!(!s.record(&policy, Outcome::Failure, t0));
        assert_eq!(s.window_counts(&policy, t0 + 9999 * MS), (1, 1));
        // Bucket 1 covers [0 s, 1 s); at 10 s it has left the 10-bucket window.
        assert_eq!(
            s.window_counts(&policy, t0 + Duration::from_secs(10)),
            (0, 0)
        );
        // A failure at 10.5 s is alone in the window: below the minimum throughput.
        assert!(!s.record(&policy, Outcome::Failure, t0 + 10_500 * MS));
        assert!(s.record(&policy, Outcome::Failure, t0 + 10_600 * MS));
    }

    #[test]
    fn ratio_window_reuses_a_stale_bucket_slot() {
        let policy = TripPolicy::failure_ratio(1.0, Duration::from_secs(1), 100);
        let t0 = Instant::now();
        let mut s = PolicyState::new(t0);
        for _ in 0..5 {
            s.record(&policy, Outcome::Failure, t0);
        }
        // 1 s later the same ring position holds a new slice: the old counts are gone.
        let t1 = t0 + Duration::from_secs(1);
        s.record(&policy, Outcome::Success, t1);
        assert_eq!(s.window_counts(&policy, t1), (1, 0));
    }

    #[test]
    fn invalid_policies_are_rejected() {
        assert!(TripPolicy::consecutive_failures(0).validate().is_err());
        assert!(
            TripPolicy::failure_ratio(0.0, Duration::from_secs(1), 1)
                .validate()
                .is_err()
        );
        assert!(
            TripPolicy::failure_ratio(1.5, Duration::from_secs(1), 1)
                .validate()
                .is_err()
        );
        assert!(
            TripPolicy::failure_ratio(f64::NAN, Duration::from_secs(1), 1)
                .validate()
                .is_err()
        );
        assert!(
            TripPolicy::failure_ratio(0.5, Duration::from_millis(1), 1)
                .validate()
                .is_err()
        );
        assert!(
            TripPolicy::failure_ratio(0.5, Duration::from_secs(1), 0)
                .validate()
                .is_err()
        );
        assert!(
            TripPolicy::failure_ratio(0.5, Duration::from_secs(1), 1)
                .validate()
                .is_ok()
        );
        assert!(TripPolicy::consecutive_failures(1).validate().is_ok());
    }
}
