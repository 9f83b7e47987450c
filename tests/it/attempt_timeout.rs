//! The per-attempt timeout against real loopback servers, with tokio's clock paused (the
//! clients keep no idle-pool timer, so the only timers are the middleware's: elapsed
//! virtual time is exactly their sum).

use crate::support;

use std::time::Duration;

use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::breaker::{
    BreakerConfig, BreakerRegistry, BreakerState, CircuitBreakerMiddleware, TripPolicy,
};
use reqwest_resilience::retry::{AttemptTimeout, Deadline, RetryOutcome, RetryReason, StopReason};
use reqwest_resilience::{
    AttemptDecision, AttemptHistory, Backoff, FailureKind, Jitter, Origin, Resilience,
    ResilienceError, RetryMiddleware, Transmission, TransportEvidence,
};
use support::{Action, FaultServer, exact_retry, loopback_client};
use tokio::time::Instant;

const S: fn(u64) -> Duration = Duration::from_secs;

fn client(retry: RetryMiddleware, registry: Option<&BreakerRegistry>) -> ClientWithMiddleware {
    let mut b = ClientBuilder::new(loopback_client()).with(retry);
    if let Some(registry) = registry {
        b = b.with(CircuitBreakerMiddleware::new(registry.clone()));
    }
    b.with(TransportEvidence::new()).build()
}

/// The exact-delay retry with `max_retries` and a 1 s attempt timeout.
fn one_second_attempts(max_retries: u32) -> RetryMiddleware {
    exact_retry()
        .max_retries(max_retries)
        .attempt_timeout(S(1))
        .build()
        .unwrap()
}

/// Sends `method` to `url` with `extensions`; returns the outcome, the extensions and the
/// virtual time taken.
async fn send(
    c: &ClientWithMiddleware,
    method: reqwest::Method,
    url: &str,
    mut ext: Extensions,
) -> (
    reqwest_middleware::Result<reqwest::Response>,
    Extensions,
    Duration,
) {
    let req = c.request(method, url).build().unwrap();
    let t0 = Instant::now();
    let result = tokio::time::timeout(S(3600), c.execute_with_extensions(req, &mut ext))
        .await
        .expect("the request finished");
    (result, ext, t0.elapsed())
}

fn history(ext: &Extensions) -> &AttemptHistory {
    AttemptHistory::of(ext).expect("an attempt history")
}

/// Every attempt in the history was cut: `Unknown` / `Timeout`, numbered in order.
fn assert_all_cut(ext: &Extensions, attempts: u32, elapsed: Duration) {
    let h = history(ext);
    assert_eq!(h.len(), attempts as usize);
    for (i, record) in h.attempts().iter().enumerate() {
        assert_eq!(record.evidence.transmission, Transmission::Unknown);
        assert_eq!(record.evidence.failure, Some(FailureKind::Timeout));
        assert_eq!(record.evidence.attempt, i as u32 + 1);
        assert_eq!(record.evidence.elapsed, elapsed);
    }
}

fn retry_error(result: &reqwest_middleware::Result<reqwest::Response>) -> (u32, StopReason) {
    match result {
        Err(e) => match ResilienceError::from_middleware_error(e) {
            Some(ResilienceError::Retry(r)) => {
                assert!(r.is_timeout(), "a cut attempt is a timeout: {r:?}");
                (r.attempts(), r.stop_reason())
            }
            other => panic!("not a retry error: {other:?}"),
        },
        Ok(r) => panic!("unexpected response {}", r.status()),
    }
}

#[tokio::test(start_paused = true)]
async fn a_silent_server_cuts_every_get_attempt_and_the_get_is_retried_max_retries_times() {
    let server = FaultServer::always(Action::Stall).await;
    let c = client(one_second_attempts(2), None);

    let (result, ext, took) = send(
        &c,
        reqwest::Method::GET,
        &server.url("/"),
        Extensions::new(),
    )
    .await;

    assert_eq!(retry_error(&result), (3, StopReason::RetriesExhausted));
    assert_eq!(
        server.requests_seen(),
        3,
        "max_retries + 1 attempts reached the server"
    );
    // 1 s cut, 1 s backoff, 1 s cut, 2 s backoff, 1 s cut.
    assert_eq!(took, S(6));
    assert_all_cut(&ext, 3, S(1));
    let decisions: Vec<_> = history(&ext)
        .attempts()
        .iter()
        .map(|r| r.decision.clone())
        .collect();
    assert_eq!(
        decisions,
        [
            Some(AttemptDecision::Retry {
                delay: S(1),
                reason: RetryReason::Transient
            }),
            Some(AttemptDecision::Retry {
                delay: S(2),
                reason: RetryReason::Transient
            }),
            Some(AttemptDecision::Stop {
                reason: StopReason::RetriesExhausted
            }),
        ]
    );
    let outcome = *RetryOutcome::of(&ext).unwrap();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (3, StopReason::RetriesExhausted)
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_server_cuts_a_post_once_and_it_is_never_sent_again() {
    let server = FaultServer::always(Action::Stall).await;
    let c = client(one_second_attempts(2), None);

    let (result, ext, took) = send(
        &c,
        reqwest::Method::POST,
        &server.url("/pay"),
        Extensions::new(),
    )
    .await;

    assert_eq!(retry_error(&result), (1, StopReason::MayHaveBeenProcessed));
    assert_eq!(server.requests_seen(), 1);
    assert_eq!(took, S(1));
    assert_all_cut(&ext, 1, S(1));
}

#[tokio::test(start_paused = true)]
async fn each_cut_attempt_counts_as_a_breaker_failure_and_opens_it() {
    let server = FaultServer::always(Action::Stall).await;
    let registry =
        BreakerRegistry::new(BreakerConfig::default().policy(TripPolicy::consecutive_failures(3)))
            .unwrap();
    let c = client(one_second_attempts(1), Some(&registry));
    let origin = Origin::parse(&server.url("/")).unwrap();

    // Two cut attempts: two failures, still closed.
    let (result, ext, _) = send(
        &c,
        reqwest::Method::GET,
        &server.url("/"),
        Extensions::new(),
    )
    .await;
    assert_eq!(retry_error(&result), (2, StopReason::RetriesExhausted));
    assert_all_cut(&ext, 2, S(1));
    assert_eq!(registry.state(&origin), Some(BreakerState::Closed));
    let snapshot = registry.snapshot();
    assert_eq!(snapshot[0].consecutive_failures, 2);

    // The third cut opens it; the retry after it is turned away locally.
    let (result, ext, _) = send(
        &c,
        reqwest::Method::GET,
        &server.url("/"),
        Extensions::new(),
    )
    .await;
    assert_eq!(registry.state(&origin), Some(BreakerState::Open));
    assert_eq!(server.requests_seen(), 3);
    let h = history(&ext);
    assert_eq!(h.len(), 2);
    assert_eq!(h.attempts()[0].evidence.failure, Some(FailureKind::Timeout));
    assert_eq!(h.attempts()[1].evidence.transmission, Transmission::NotSent);
    assert_eq!(
        h.attempts()[1].evidence.failure,
        Some(FailureKind::BreakerOpen)
    );
    assert!(result.is_err());
}

#[tokio::test(start_paused = true)]
async fn the_total_deadline_still_ends_the_request_on_time() {
    let server = FaultServer::always(Action::Stall).await;
    let registry = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let c = client(
        exact_retry()
            .max_retries(5)
            .attempt_timeout(S(1))
            .total_deadline(Duration::from_millis(2500))
            .build()
            .unwrap(),
        Some(&registry),
    );

    let (result, ext, took) = send(
        &c,
        reqwest::Method::GET,
        &server.url("/"),
        Extensions::new(),
    )
    .await;

    // Cut at 1 s, backoff to 2 s, the second attempt cut by the deadline at 2.5 s.
    assert_eq!(took, Duration::from_millis(2500));
    assert_eq!(retry_error(&result), (2, StopReason::DeadlineExceeded));
    assert_eq!(server.requests_seen(), 2);
    let h = history(&ext);
    assert_eq!(h.len(), 2);
    assert_eq!(h.attempts()[0].evidence.elapsed, S(1));
    assert_eq!(h.attempts()[1].evidence.elapsed, Duration::from_millis(500));
    assert_eq!(h.attempts()[1].evidence.failure, Some(FailureKind::Timeout));
    // The attempt timeout's cut is a breaker failure; the deadline's is the caller's own
    // limit, neutral (issue 28: both counted before).
    assert_eq!(registry.snapshot()[0].consecutive_failures, 1);

    // An attempt timeout longer than the deadline: the deadline cuts the first attempt.
    let c = client(
        exact_retry()
            .attempt_timeout(S(10))
            .total_deadline(S(3))
            .build()
            .unwrap(),
        None,
    );
    let (result, ext, took) = send(
        &c,
        reqwest::Method::GET,
        &server.url("/"),
        Extensions::new(),
    )
    .await;
    assert_eq!(took, S(3));
    assert_eq!(retry_error(&result), (1, StopReason::DeadlineExceeded));
    assert_all_cut(&ext, 1, S(3));
    assert_eq!(server.requests_seen(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_timeout_bounds_the_response_head_only_and_a_slow_body_is_read_whole() {
    let server = FaultServer::always(Action::BodyAfter(S(5), b"slow body".to_vec())).await;
    let c = client(exact_retry().attempt_timeout(S(1)).build().unwrap(), None);

    let (result, ext, took) = send(
        &c,
        reqwest::Method::GET,
        &server.url("/"),
        Extensions::new(),
    )
    .await;
    let response = result.expect("the head came at once");
    assert_eq!(took, Duration::ZERO);
    let t0 = Instant::now();
    assert_eq!(response.text().await.unwrap(), "slow body");
    assert_eq!(t0.elapsed(), S(5), "the body took its time, uncut");
    assert_eq!(server.requests_seen(), 1);
    assert_eq!(history(&ext).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_per_request_extension_sets_or_lifts_the_timeout() {
    let slow = FaultServer::always(Action::Delay(S(5), Box::new(Action::ok("late")))).await;

    // No client timeout; the request asks for 2 s.
    let c = client(exact_retry().max_retries(0).build().unwrap(), None);
    let mut ext = Extensions::new();
    ext.insert(AttemptTimeout(S(2)));
    let (result, ext, took) = send(&c, reqwest::Method::GET, &slow.url("/"), ext).await;
    assert_eq!(retry_error(&result), (1, StopReason::RetriesExhausted));
    assert_eq!(took, S(2));
    assert_all_cut(&ext, 1, S(2));

    // A client timeout of 1 s; this request lifts it.
    let c = client(exact_retry().attempt_timeout(S(1)).build().unwrap(), None);
    let mut ext = Extensions::new();
    ext.insert(AttemptTimeout(Duration::MAX));
    let (result, _, took) = send(&c, reqwest::Method::GET, &slow.url("/"), ext).await;
    assert_eq!(result.unwrap().text().await.unwrap(), "late");
    assert_eq!(took, S(5));
    assert_eq!(slow.requests_seen(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_stack_builder_installs_the_timeout_and_a_deadline_extension_still_wins() {
    let server = FaultServer::always(Action::Stall).await;
    let c = Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .max_retries(1)
                .backoff(Backoff::builder().jitter(Jitter::None).build().unwrap())
                .attempt_timeout(S(2)),
        )
        .build(loopback_client())
        .unwrap();
    let (result, ext, took) = send(
        &c,
        reqwest::Method::GET,
        &server.url("/"),
        Extensions::new(),
    )
    .await;
    assert_eq!(retry_error(&result), (2, StopReason::RetriesExhausted));
    assert_eq!(took, S(5));
    assert_all_cut(&ext, 2, S(2));
    assert_eq!(server.requests_seen(), 2);

    let mut ext = Extensions::new();
    ext.insert(Deadline::after(S(1)));
    let (result, ext, took) = send(&c, reqwest::Method::GET, &server.url("/"), ext).await;
    assert_eq!(retry_error(&result), (1, StopReason::DeadlineExceeded));
    assert_eq!(took, S(1));
    assert_all_cut(&ext, 1, S(1));

    assert!(matches!(
        RetryMiddleware::builder()
            .attempt_timeout(Duration::ZERO)
            .build(),
        Err(ResilienceError::InvalidConfig(_))
    ));
}

/// What was a conflict (a timeout or hedging setting beside a prebuilt or removed retry,
/// refused) cannot be written: both are set on the retry handed to the stack, which
/// replaces an earlier prebuilt or removed one whole; their own checks still apply.
#[test]
fn timeout_and_hedging_are_set_on_the_stack_s_retry_which_replaces_an_earlier_one() {
    use reqwest_resilience::retry::Hedging;
    assert!(
        Resilience::new()
            .retry(RetryMiddleware::new())
            .retry(RetryMiddleware::builder().attempt_timeout(S(1)))
            .build(loopback_client())
            .is_ok()
    );
    assert!(
        Resilience::new()
            .no_retry()
            .retry(RetryMiddleware::builder().hedging(Hedging::fixed(S(1))))
            .build(loopback_client())
            .is_ok()
    );
    assert!(matches!(
        Resilience::new()
            .retry(RetryMiddleware::builder().attempt_timeout(Duration::ZERO))
            .build(loopback_client()),
        Err(ResilienceError::InvalidConfig(_))
    ));
}

/// Issue 21, item 8: `AttemptTimeout(Duration::ZERO)` on a request is refused as the
/// builder refuses a zero timeout: a typed error at once, nothing sent, no attempt made.
#[tokio::test(start_paused = true)]
async fn a_zero_attempt_timeout_on_a_request_is_refused_before_anything_is_sent() {
    let server = FaultServer::always(Action::ok("x")).await;
    let c = client(one_second_attempts(3), None);
    for method in [reqwest::Method::GET, reqwest::Method::POST] {
        let mut ext = Extensions::new();
        ext.insert(AttemptTimeout(Duration::ZERO));
        let (result, ext, elapsed) = send(&c, method, &server.url("/"), ext).await;
        let err = result.unwrap_err();
        assert!(
            matches!(
                ResilienceError::from_middleware_error(&err),
                Some(ResilienceError::InvalidConfig(why)) if why.contains("AttemptTimeout")
            ),
            "{err:?}"
        );
        assert_eq!(elapsed, Duration::ZERO);
        assert!(AttemptHistory::of(&ext).is_none(), "no attempt was made");
    }
    assert_eq!(server.requests_seen(), 0);
}
