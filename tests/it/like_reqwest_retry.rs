//! `Resilience::like_reqwest_retry()`: reqwest-retry's own test cases (its
//! `tests/all/retry.rs`: `RetryTransientMiddleware` with `ExponentialBackoff`, 3 retries)
//! re-run through the preset on loopback, with the counts that suite expects from the
//! server, and the one difference it keeps on purpose.

use crate::support;

use std::time::Duration;

use http::Extensions;
use reqwest_resilience::retry::{RetryOutcome, StopReason};
use reqwest_resilience::{AttemptDecision, AttemptHistory, Resilience};
use support::held_port::HeldRefusedPort;
use support::{Action, FaultServer};

fn loopback_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
}

fn preset() -> reqwest_middleware::ClientWithMiddleware {
    Resilience::like_reqwest_retry()
        .build_from(loopback_builder())
        .unwrap()
}

/// reqwest-retry's `RetryResponder::new(3, status)`: `status` once, then `200`.
async fn status_then_ok(status: u16) -> FaultServer {
    FaultServer::sequence(vec![Action::status(status)], Action::ok("")).await
}

#[tokio::test(start_paused = true)]
async fn assert_retry_succeeds_on_every_5xx_408_and_429() {
    // reqwest-retry: `assert_retry_succeeds!(500..=511, 408, 429)`, `.expect(2)`, a 200.
    let client = preset();
    for status in [
        500, 501, 502, 503, 504, 505, 506, 507, 508, 510, 511, 408, 429,
    ] {
        let server = status_then_ok(status).await;
        let response = client.get(server.url("/foo")).send().await.unwrap();
        assert_eq!(response.status(), 200, "{status}");
        assert_eq!(server.requests_seen(), 2, "{status}");
    }
}

#[tokio::test(start_paused = true)]
async fn assert_no_retry_on_success_redirect_and_client_error_statuses() {
    // reqwest-retry: `assert_no_retry!(..)`, `.expect(1)`, the status itself.
    let client = preset();
    let statuses = [
        200, 201, 202, 203, 204, 205, 206, 207, 226, 300, 301, 302, 303, 304, 307, 308, 400, 401,
        402, 403, 404, 405, 406, 407, 409, 410, 411, 412, 413, 414, 415, 416, 417, 418, 421, 422,
        423, 424, 426, 428, 431, 451,
    ];
    for status in statuses {
        let server = FaultServer::always(Action::status(status)).await;
        let response = client.get(server.url("/foo")).send().await.unwrap();
        assert_eq!(response.status().as_u16(), status);
        assert_eq!(server.requests_seen(), 1, "{status}");
    }
}

#[tokio::test(start_paused = true)]
async fn assert_retry_on_request_timeout() {
    // reqwest-retry: the first answer comes after the request's 10 ms timeout, the second
    // is a 200; `.expect(2)`.
    let server = FaultServer::sequence(
        vec![Action::Delay(
            Duration::from_millis(1000),
            Box::new(Action::status(500)),
        )],
        Action::ok(""),
    )
    .await;
    let response = preset()
        .get(server.url("/foo"))
        .timeout(Duration::from_millis(10))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(server.requests_seen(), 2);
}

#[tokio::test(start_paused = true)]
async fn assert_retry_on_connection_reset_by_peer() {
    // reqwest-retry: a reset after the request was read, then a 200.
    let server = FaultServer::sequence(vec![Action::ReadThenReset], Action::ok("")).await;
    let response = preset().get(server.url("/foo")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(server.requests_seen(), 2);
}

#[tokio::test(start_paused = true)]
async fn assert_retry_on_incomplete_message() {
    // reqwest-retry: half a response head (`IncompleteMessage`), then a 200.
    let server = FaultServer::sequence(vec![Action::HalfHead], Action::ok("")).await;
    let response = preset().get(server.url("/foo")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(server.requests_seen(), 2);
}

#[tokio::test(start_paused = true)]
async fn three_retries_with_bounded_jitter_then_the_last_answer() {
    // `build_with_max_retries(3)`: four requests, the last answer returned; each delay in
    // `[base / 2, base × 2^n]` (retry-policies' `Jitter::Bounded`, base 1 s).
    let server = FaultServer::always(Action::status(503)).await;
    let (client, request) = preset().get(server.url("/foo")).build_split();
    let mut ext = Extensions::new();
    let response = client
        .execute_with_extensions(request.unwrap(), &mut ext)
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(server.requests_seen(), 4);
    let outcome = RetryOutcome::of(&ext).unwrap();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (4, StopReason::RetriesExhausted)
    );
    let history = AttemptHistory::of(&ext).unwrap();
    for (n, record) in history.attempts()[..3].iter().enumerate() {
        let Some(AttemptDecision::Retry { delay, .. }) = record.decision else {
            panic!("retry {n}: {:?}", record.decision);
        };
        assert!(
            delay >= Duration::from_millis(500) && delay <= Duration::from_secs(1 << n),
            "retry {n}: {delay:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn no_breaker_and_no_budget_a_failing_origin_gets_every_retry() {
    // reqwest-retry has neither: ten requests to a server answering 500 all get their
    // four attempts (the default stack's breaker would open after five failures).
    let server = FaultServer::always(Action::status(500)).await;
    let client = preset();
    for _ in 0..10 {
        assert_eq!(
            client.get(server.url("/")).send().await.unwrap().status(),
            500
        );
    }
    assert_eq!(server.requests_seen(), 40);
}

#[tokio::test(start_paused = true)]
async fn the_difference_kept_a_post_that_may_have_been_processed_is_not_sent_again() {
    // reqwest-retry retries this POST (the server would see 2); the preset does not.
    let server = status_then_ok(500).await;
    let response = preset()
        .post(server.url("/pay"))
        .body("1 EUR")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    assert_eq!(server.requests_seen(), 1);
    // A POST proven unsent is retried, like every request reqwest-retry retries on a
    // connect error: four attempts.
    let dead = HeldRefusedPort::new();
    let url = dead.url("/pay");
    let (client, request) = preset().post(url).body("1 EUR").build_split();
    let mut ext = Extensions::new();
    let err = client
        .execute_with_extensions(request.unwrap(), &mut ext)
        .await
        .unwrap_err();
    assert!(err.is_connect());
    assert_eq!(RetryOutcome::of(&ext).unwrap().attempts, 4);
}

/// What was a conflict (a prebuilt retry over the preset, refused) is now how a
/// preset's retry is changed: `.retry(..)` replaces it whole, and starting from
/// `RetryMiddleware::like_reqwest_retry()` keeps the rest of the preset.
#[tokio::test(start_paused = true)]
async fn the_preset_s_retry_is_changed_by_handing_over_its_builder_with_the_change() {
    use reqwest_resilience::RetryMiddleware;
    let client = Resilience::like_reqwest_retry()
        .retry(RetryMiddleware::like_reqwest_retry().max_retries(5))
        .build_from(loopback_builder())
        .unwrap();
    // reqwest-retry's statuses still retried (a 507: the preset's table, not the default).
    let server = status_then_ok(507).await;
    assert_eq!(
        client
            .get(server.url("/foo"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(server.requests_seen(), 2);
    // 5 retries: six attempts of a refused GET; still no breaker in the way.
    let dead = HeldRefusedPort::new();
    let (client, request) = client.get(dead.url("/")).build_split();
    let mut ext = Extensions::new();
    let err = client
        .execute_with_extensions(request.unwrap(), &mut ext)
        .await
        .unwrap_err();
    assert!(err.is_connect());
    assert_eq!(RetryOutcome::of(&ext).unwrap().attempts, 6);
    // A prebuilt retry replaces the preset's: it builds, with the default table.
    let prebuilt = Resilience::like_reqwest_retry()
        .retry(RetryMiddleware::new())
        .build_from(loopback_builder())
        .unwrap();
    let server = status_then_ok(507).await;
    assert_eq!(
        prebuilt
            .get(server.url("/foo"))
            .send()
            .await
            .unwrap()
            .status(),
        507
    );
    assert_eq!(server.requests_seen(), 1);
}
