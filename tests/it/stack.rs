//! The `Resilience` builder against real loopback servers: the order of the stack, its
//! defaults, removing and replacing parts, the hooks, and the build-time checks.
//!
//! Paused clock + real sockets, as in `tests/it/retry.rs`: the clients set no reqwest timeout
//! and no idle-pool timer, so the only timers are the middlewares' own sleeps and tokio's
//! auto-advance turns them into exact virtual time.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Extensions, StatusCode};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use reqwest_resilience::breaker::{
    BreakerConfig, BreakerRegistry, BreakerState, CircuitBreakerMiddleware, TripPolicy,
};
use reqwest_resilience::limit::{LimiterConfig, LimiterRegistry};
use reqwest_resilience::redirect::{self, ClientRedirects};
use reqwest_resilience::retry::{
    MaxRetries, RetryAfterPolicy, RetryError, RetryOutcome, RetryReason, StopReason,
};
use reqwest_resilience::{
    AccessToken, AttemptDecision, AttemptHistory, Backoff, BearerAuth, FailureKind, Jitter, Origin,
    RequestEvidence, Resilience, ResilienceError, RetryMiddleware, StackError, TokenManager,
    Transmission,
};
use support::{Action, FaultServer};
use tokio::time::Instant;

const S: fn(u64) -> Duration = Duration::from_secs;

/// What a hook or probe saw, shared with the test.
type Shared<T> = Arc<Mutex<Vec<T>>>;

/// Its redirects are recorded; a stack that relies on that says so with
/// `.client_redirects(ClientRedirects::Recorded)`.
fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        // No idle-pool timer: with a paused clock it would be the "next timer" tokio jumps to.
        .pool_idle_timeout(None)
        .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
        .build()
        .unwrap()
}

/// 1 s, 2 s, 4 s without jitter: the default backoff made exact.
fn exact_backoff() -> Backoff {
    Backoff::builder().jitter(Jitter::None).build().unwrap()
}

/// Sends a GET with caller-side extensions; returns the outcome, the extensions and the
/// virtual time it took.
async fn get(
    client: &ClientWithMiddleware,
    url: &str,
    mut extensions: Extensions,
) -> (
    reqwest_middleware::Result<reqwest::Response>,
    Extensions,
    Duration,
) {
    let request = client.get(url).build().unwrap();
    let t0 = Instant::now();
    let result = tokio::time::timeout(
        S(3600),
        client.execute_with_extensions(request, &mut extensions),
    )
    .await
    .expect("the request finished");
    (result, extensions, t0.elapsed())
}

fn once() -> Extensions {
    let mut e = Extensions::new();
    e.insert(MaxRetries(0));
    e
}

fn history(ext: &Extensions) -> Vec<(Transmission, Option<FailureKind>, Option<AttemptDecision>)> {
    AttemptHistory::of(ext)
        .expect("an attempt history")
        .attempts()
        .iter()
        .map(|r| {
            (
                r.evidence.transmission,
                r.evidence.failure,
                r.decision.clone(),
            )
        })
        .collect()
}

fn status(code: u16) -> Transmission {
    Transmission::ResponseReceived(StatusCode::from_u16(code).unwrap())
}

fn retry(delay: Duration, reason: RetryReason) -> Option<AttemptDecision> {
    Some(AttemptDecision::Retry { delay, reason })
}

fn stop(reason: StopReason) -> Option<AttemptDecision> {
    Some(AttemptDecision::Stop { reason })
}

const S503: RetryReason = RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE);

/// Tokens `token-1`, `token-2`, … counting the fetches.
fn counting_tokens() -> (TokenManager, Arc<AtomicUsize>) {
    let fetches = Arc::new(AtomicUsize::new(0));
    let f = fetches.clone();
    let manager = TokenManager::new(move || {
        let n = f.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok::<_, std::io::Error>(AccessToken::new(format!("token-{n}"))) }
    });
    (manager, fetches)
}

fn bearer(server: &FaultServer, tokens: TokenManager) -> BearerAuth {
    BearerAuth::builder(tokens)
        .origin(Origin::parse(&server.url("/")).unwrap())
        .allow_http_on_loopback()
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn full_stack_503_then_200_leaves_two_attempts_with_their_evidence_and_decisions() {
    let server = FaultServer::sequence(vec![Action::status(503)], Action::ok("done")).await;
    let client = Resilience::new()
        .retry(RetryMiddleware::builder().backoff(exact_backoff()))
        .build(reqwest_client())
        .unwrap();

    let (result, ext, took) = get(&client, &server.url("/x"), Extensions::new()).await;

    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(server.requests_seen(), 2);
    assert_eq!(took, S(1));
    let records = AttemptHistory::of(&ext).unwrap().attempts().to_vec();
    let origin = Origin::parse(&server.url("/")).unwrap();
    assert_eq!(records.len(), 2);
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.evidence.attempt, i as u32 + 1);
        assert_eq!(r.evidence.origin.as_ref(), Some(&origin));
        assert_eq!(r.evidence.failure, None);
    }
    assert_eq!(
        history(&ext),
        [
            (status(503), None, retry(S(1), S503)),
            (
                status(200),
                None,
                stop(StopReason::FinalResponse(StatusCode::OK))
            ),
        ]
    );
    assert_eq!(
        RetryOutcome::of(&ext).map(|o| (o.attempts, o.resend_count())),
        Some((2, 1))
    );
}

#[tokio::test(start_paused = true)]
async fn default_stack_retries_three_times_with_jittered_1_2_4_s_then_the_fifth_failure_opens_the_breaker()
 {
    let server = FaultServer::always(Action::status(503)).await;
    let events = Arc::new(Mutex::new(Vec::new()));
    let e = events.clone();
    // The default breaker's configuration, in a registry with a listener.
    let registry = BreakerRegistry::with_listener(BreakerConfig::default(), move |event| {
        e.lock()
            .unwrap()
            .push((event.from, event.to, event.open_for));
    })
    .unwrap();
    let client = Resilience::new()
        .breaker(registry)
        .build(reqwest_client())
        .unwrap();

    // 4 attempts: the default 3 retries, delays 1 s, 2 s, 4 s ± 10 %.
    let (result, ext, _) = get(&client, &server.url("/"), Extensions::new()).await;
    assert_eq!(result.unwrap().status(), 503);
    assert_eq!(server.requests_seen(), 4);
    let delays: Vec<Duration> = history(&ext)
        .into_iter()
        .filter_map(|(_, _, d)| match d {
            Some(AttemptDecision::Retry { delay, .. }) => Some(delay),
            _ => None,
        })
        .collect();
    assert_eq!(delays.len(), 3);
    for (delay, nominal) in delays.iter().zip([1.0, 2.0, 4.0]) {
        let s = delay.as_secs_f64();
        assert!(
            (nominal * 0.9..nominal * 1.1).contains(&s),
            "{delay:?} is not {nominal} s ± 10 %"
        );
    }
    assert!(
        events.lock().unwrap().is_empty(),
        "4 failures keep it closed"
    );

    // The 5th consecutive failure opens it for the default 30 s.
    let (result, _, _) = get(&client, &server.url("/"), once()).await;
    assert_eq!(result.unwrap().status(), 503);
    assert_eq!(
        *events.lock().unwrap(),
        [(BreakerState::Closed, BreakerState::Open, Some(S(30)))]
    );

    // Open: turned away locally, the server sees nothing more.
    let (result, ext, _) = get(&client, &server.url("/"), once()).await;
    assert!(result.is_err());
    assert_eq!(server.requests_seen(), 5);
    assert_eq!(
        history(&ext),
        [(
            Transmission::NotSent,
            Some(FailureKind::BreakerOpen),
            stop(StopReason::RetriesExhausted)
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn retry_is_outside_the_breaker_so_a_rejection_is_retried_after_the_open_period() {
    let server = FaultServer::sequence(vec![Action::status(500)], Action::ok("back")).await;
    let registry = BreakerRegistry::new(
        BreakerConfig::default()
            .policy(TripPolicy::consecutive_failures(1))
            .open_duration(S(5)),
    )
    .unwrap();
    // Waiting out an open breaker is an opt-in (issue 42): without it the rejection is
    // returned at once.
    let client = Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .backoff(exact_backoff())
                .wait_for_open_breakers(S(60)),
        )
        .breaker(registry.clone())
        .build(reqwest_client())
        .unwrap();

    let (result, ext, took) = get(&client, &server.url("/"), Extensions::new()).await;

    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(server.requests_seen(), 2, "the rejected attempt never left");
    assert_eq!(took, S(5), "1 s backoff, then the breaker's remaining 4 s");
    assert_eq!(
        history(&ext),
        [
            (
                status(500),
                None,
                retry(S(1), RetryReason::Status(StatusCode::INTERNAL_SERVER_ERROR))
            ),
            (
                Transmission::NotSent,
                Some(FailureKind::BreakerOpen),
                retry(S(4), RetryReason::BreakerRejected)
            ),
            (
                status(200),
                None,
                stop(StopReason::FinalResponse(StatusCode::OK))
            ),
        ]
    );
    let origin = Origin::parse(&server.url("/")).unwrap();
    assert_eq!(registry.state(&origin), Some(BreakerState::Closed));
}

#[tokio::test(start_paused = true)]
async fn a_401_healed_by_one_refresh_is_not_counted_as_a_breaker_failure() {
    let server = FaultServer::start(|_, r| match r.header("authorization") {
        Some("Bearer token-2") => Action::ok("hello"),
        _ => Action::status(401),
    })
    .await;
    // One failure would open this breaker.
    let registry =
        BreakerRegistry::new(BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)))
            .unwrap();
    let (tokens, fetches) = counting_tokens();
    let client = Resilience::new()
        .breaker(registry.clone())
        .bearer(bearer(&server, tokens))
        .build(reqwest_client())
        .unwrap();

    let (result, ext, took) = get(&client, &server.url("/me"), Extensions::new()).await;

    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(took, Duration::ZERO, "healed without any retry sleep");
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    let seen: Vec<_> = server
        .requests()
        .iter()
        .map(|r| r.header("authorization").map(str::to_owned))
        .collect();
    assert_eq!(
        seen,
        [
            Some("Bearer token-1".to_owned()),
            Some("Bearer token-2".to_owned())
        ]
    );
    // Both wire requests are in the history; only the last carries the retry's decision.
    assert_eq!(
        history(&ext),
        [
            (status(401), None, None),
            (
                status(200),
                None,
                stop(StopReason::FinalResponse(StatusCode::OK))
            ),
        ]
    );
    let origin = Origin::parse(&server.url("/")).unwrap();
    assert_eq!(registry.state(&origin), Some(BreakerState::Closed));
    let snapshot = registry.snapshot();
    assert_eq!(snapshot.len(), 1);
    assert_eq!(snapshot[0].consecutive_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn a_401_that_survives_the_refresh_counts_as_a_breaker_failure() {
    let server = FaultServer::always(Action::status(401)).await;
    let registry =
        BreakerRegistry::new(BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)))
            .unwrap();
    let (tokens, fetches) = counting_tokens();
    let client = Resilience::new()
        .breaker(registry.clone())
        .bearer(bearer(&server, tokens))
        .build(reqwest_client())
        .unwrap();

    let (result, _, _) = get(&client, &server.url("/me"), Extensions::new()).await;

    assert_eq!(
        result.unwrap().status(),
        401,
        "a 401 is final for the retry"
    );
    assert_eq!(server.requests_seen(), 2, "one request, one replay");
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    let origin = Origin::parse(&server.url("/")).unwrap();
    assert_eq!(registry.state(&origin), Some(BreakerState::Open));
}

/// Records, per wire request, whether it carried `Authorization` and what the transport
/// step reported after it.
#[derive(Clone, Default)]
struct PerAttemptProbe {
    seen: Shared<(bool, Option<Transmission>)>,
}

#[async_trait::async_trait]
impl Middleware for PerAttemptProbe {
    async fn handle(
        &self,
        req: reqwest::Request,
        ext: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let authorized = req.headers().contains_key(http::header::AUTHORIZATION);
        let result = next.run(req, ext).await;
        let evidence = RequestEvidence::of(ext).map(|e| e.transmission);
        self.seen.lock().unwrap().push((authorized, evidence));
        result
    }
}

/// Counts logical requests.
#[derive(Clone, Default)]
struct OuterProbe {
    calls: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl Middleware for OuterProbe {
    async fn handle(
        &self,
        req: reqwest::Request,
        ext: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        next.run(req, ext).await
    }
}

#[tokio::test(start_paused = true)]
async fn install_keeps_outer_middleware_around_the_stack_and_per_attempt_inside_bearer_outside_transport()
 {
    let server = FaultServer::start(|i, r| match (i, r.header("authorization")) {
        (0, _) => Action::status(503),
        (_, Some("Bearer token-1")) => Action::ok("ok"),
        _ => Action::status(401),
    })
    .await;
    let (tokens, _) = counting_tokens();
    let outer = OuterProbe::default();
    let per_attempt = PerAttemptProbe::default();
    let client = Resilience::new()
        .retry(RetryMiddleware::builder().backoff(exact_backoff()))
        .bearer(bearer(&server, tokens))
        .per_attempt(Arc::new(per_attempt.clone()))
        .install(ClientBuilder::new(reqwest_client()).with(outer.clone()))
        .unwrap()
        .build();

    let (result, _, _) = get(&client, &server.url("/"), Extensions::new()).await;

    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(
        outer.calls.load(Ordering::SeqCst),
        1,
        "once per logical request"
    );
    assert_eq!(
        *per_attempt.seen.lock().unwrap(),
        [(true, Some(status(503))), (true, Some(status(200)))],
        "per attempt, after BearerAuth and with the transport step's evidence"
    );
}

#[tokio::test(start_paused = true)]
async fn no_retry_sends_once_and_leaves_no_retry_outcome() {
    let server = FaultServer::always(Action::status(503)).await;
    let client = Resilience::new()
        .no_retry()
        .build(reqwest_client())
        .unwrap();

    let (result, ext, _) = get(&client, &server.url("/"), Extensions::new()).await;

    assert_eq!(result.unwrap().status(), 503);
    assert_eq!(server.requests_seen(), 1);
    assert_eq!(history(&ext), [(status(503), None, None)]);
    assert!(RetryOutcome::of(&ext).is_none());
}

#[tokio::test(start_paused = true)]
async fn no_breaker_lets_every_failure_reach_the_server() {
    let server = FaultServer::always(Action::status(503)).await;
    let with = Resilience::new().build(reqwest_client()).unwrap();
    let without = Resilience::new()
        .no_breaker()
        .build(reqwest_client())
        .unwrap();

    for _ in 0..6 {
        let _ = get(&with, &server.url("/"), once()).await;
    }
    assert_eq!(
        server.requests_seen(),
        5,
        "the default breaker opens after 5"
    );
    for _ in 0..6 {
        let (result, _, _) = get(&without, &server.url("/"), once()).await;
        assert_eq!(result.unwrap().status(), 503);
    }
    assert_eq!(server.requests_seen(), 11);
}

#[tokio::test(start_paused = true)]
async fn a_prebuilt_retry_and_breaker_middleware_are_installed_as_given() {
    let server = FaultServer::always(Action::status(503)).await;
    let registry = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let client = Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .max_retries(1)
                .backoff(exact_backoff())
                .build()
                .unwrap(),
        )
        .breaker(CircuitBreakerMiddleware::new(registry.clone()))
        .build(reqwest_client())
        .unwrap();

    let (result, ext, took) = get(&client, &server.url("/"), Extensions::new()).await;

    assert_eq!(result.unwrap().status(), 503);
    assert_eq!(server.requests_seen(), 2);
    assert_eq!(took, S(1));
    assert_eq!(RetryOutcome::of(&ext).map(|o| o.attempts), Some(2));
    assert_eq!(registry.snapshot()[0].consecutive_failures, 2);
}

#[tokio::test(start_paused = true)]
async fn on_attempt_hook_sees_every_attempt_in_order_with_its_decision() {
    let server = FaultServer::sequence(
        vec![Action::status(503), Action::status(503)],
        Action::ok("done"),
    )
    .await;
    type Seen = Vec<(u32, Transmission, Option<AttemptDecision>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let s = seen.clone();
    let client = Resilience::new()
        .retry(RetryMiddleware::builder().backoff(exact_backoff()))
        .on_attempt(move |evidence, decision| {
            s.lock()
                .unwrap()
                .push((evidence.attempt, evidence.transmission, decision.cloned()));
        })
        .build(reqwest_client())
        .unwrap();

    // Extensions reused from an earlier call: only this call's attempts are reported.
    let (_, ext, _) = get(&client, &server.url("/"), Extensions::new()).await;
    seen.lock().unwrap().clear();
    let (result, _, _) = get(&client, &server.url("/"), ext).await;

    assert_eq!(result.unwrap().status(), 200);
    // A request of its own: its one attempt is attempt 1, whatever the extensions held.
    assert_eq!(
        *seen.lock().unwrap(),
        [(
            1,
            status(200),
            stop(StopReason::FinalResponse(StatusCode::OK))
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn on_attempt_hook_reports_a_refused_connection_as_not_sent_for_each_attempt() {
    let port = support::refused_port();
    let seen: Shared<(u32, Transmission, Option<FailureKind>)> = Arc::default();
    let s = seen.clone();
    let client = Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .max_retries(1)
                .backoff(exact_backoff()),
        )
        .client_redirects(ClientRedirects::Recorded)
        .on_attempt(move |e, _| {
            s.lock()
                .unwrap()
                .push((e.attempt, e.transmission, e.failure));
        })
        .build(reqwest_client())
        .unwrap();

    let (result, _, took) = get(
        &client,
        &format!("http://127.0.0.1:{port}/"),
        Extensions::new(),
    )
    .await;

    assert!(result.is_err());
    assert_eq!(took, S(1));
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (1, Transmission::NotSent, Some(FailureKind::Connect)),
            (2, Transmission::NotSent, Some(FailureKind::Connect)),
        ]
    );
}

fn stack_error(result: Result<ClientWithMiddleware, ResilienceError>) -> StackError {
    match result {
        Err(ResilienceError::InvalidStack(e)) => e,
        Err(other) => panic!("expected InvalidStack, got {other:?}"),
        Ok(_) => panic!("expected InvalidStack, got a client"),
    }
}

#[test]
fn a_deadline_shorter_than_the_shortest_first_delay_is_rejected() {
    // Default jitter ±10 %: the first delay is at least 900 ms.
    let err = stack_error(
        Resilience::new()
            .retry(RetryMiddleware::builder().total_deadline(Duration::from_millis(500)))
            .build(reqwest::Client::new()),
    );
    assert_eq!(
        err,
        StackError::DeadlineBeforeFirstRetry {
            total_deadline: Duration::from_millis(500),
            first_delay: Duration::from_millis(900),
        }
    );
    let err = stack_error(
        Resilience::new()
            .retry(
                RetryMiddleware::builder()
                    .backoff(exact_backoff())
                    .total_deadline(Duration::from_millis(999)),
            )
            .build(reqwest::Client::new()),
    );
    assert!(
        matches!(err, StackError::DeadlineBeforeFirstRetry { first_delay, .. } if first_delay == S(1))
    );
    let err = stack_error(
        Resilience::new()
            .retry(
                RetryMiddleware::builder()
                    .backoff(Backoff::builder().jitter(Jitter::Full).build().unwrap())
                    .total_deadline(Duration::ZERO),
            )
            .build(reqwest::Client::new()),
    );
    assert!(
        matches!(err, StackError::DeadlineBeforeFirstRetry { first_delay, .. } if first_delay.is_zero())
    );
    // Exactly the first delay leaves room for it.
    assert!(
        Resilience::new()
            .retry(
                RetryMiddleware::builder()
                    .backoff(exact_backoff())
                    .total_deadline(S(1))
            )
            .build(reqwest::Client::new())
            .is_ok()
    );
}

#[test]
fn zero_half_open_probes_is_rejected() {
    let err = stack_error(
        Resilience::new()
            .breaker(BreakerConfig::default().half_open_probes(0))
            .build(reqwest::Client::new()),
    );
    assert_eq!(err, StackError::NoHalfOpenProbes);
}

/// What were conflicts (a retry setting beside a prebuilt or removed retry, a breaker
/// hook beside a shared registry or no breaker, refused) cannot be written: each part is
/// set in one place, and a later call replaces an earlier one whole.
#[tokio::test(start_paused = true)]
async fn each_part_is_set_in_one_place_and_a_later_call_replaces_it_whole() {
    let server = FaultServer::always(Action::status(503)).await;
    // The retry limit on the retry that replaces a prebuilt one: 2 retries.
    let client = Resilience::new()
        .retry(RetryMiddleware::new())
        .retry(
            RetryMiddleware::builder()
                .max_retries(2)
                .backoff(exact_backoff()),
        )
        .no_breaker()
        .build(reqwest_client())
        .unwrap();
    let (result, _, _) = get(&client, &server.url("/"), Extensions::new()).await;
    assert_eq!(result.unwrap().status(), 503);
    assert_eq!(server.requests_seen(), 3);
    // A retry after `no_retry` turns it back on, with its deadline.
    let client = Resilience::new()
        .no_retry()
        .retry(
            RetryMiddleware::builder()
                .max_retries(1)
                .backoff(exact_backoff())
                .total_deadline(S(10)),
        )
        .no_breaker()
        .build(reqwest_client())
        .unwrap();
    let (result, _, _) = get(&client, &server.url("/"), Extensions::new()).await;
    assert_eq!(result.unwrap().status(), 503);
    assert_eq!(server.requests_seen(), 5);
    // The breaker's listener is its registry's: `no_breaker` after it removes both.
    let events = Arc::new(Mutex::new(0));
    let e = events.clone();
    let registry = BreakerRegistry::with_listener(
        BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)),
        move |_| *e.lock().unwrap() += 1,
    )
    .unwrap();
    let client = Resilience::new()
        .no_retry()
        .breaker(registry)
        .no_breaker()
        .build(reqwest_client())
        .unwrap();
    let (result, _, _) = get(&client, &server.url("/"), Extensions::new()).await;
    assert_eq!(result.unwrap().status(), 503);
    assert_eq!(*events.lock().unwrap(), 0);
}

#[test]
fn a_part_s_own_invalid_config_keeps_its_invalid_config_error() {
    let result = Resilience::new()
        .breaker(BreakerConfig::default().open_duration(Duration::ZERO))
        .build(reqwest::Client::new());
    assert!(
        matches!(&result, Err(ResilienceError::InvalidConfig(why)) if why.contains("open_duration")),
        "{result:?}"
    );
    let result = Resilience::new()
        .retry(RetryMiddleware::builder().retry_after_cap(S(2 * 24 * 3600), Default::default()))
        .build(reqwest::Client::new());
    assert!(
        matches!(result, Err(ResilienceError::InvalidConfig(_))),
        "{result:?}"
    );
}

#[test]
fn stack_errors_say_what_is_wrong() {
    let err = ResilienceError::InvalidStack(StackError::NoHalfOpenProbes);
    assert_eq!(
        err.to_string(),
        "invalid resilience stack: half_open_probes is 0: a half-open breaker could never \
         close; use at least 1"
    );
    let err = StackError::DeadlineBeforeFirstRetry {
        total_deadline: Duration::from_millis(500),
        first_delay: Duration::from_millis(900),
    };
    assert_eq!(
        err.to_string(),
        "total deadline 500ms ends before the first retry could start (shortest first delay 900ms)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_calls_share_one_refresh_and_every_wire_request_is_reported_once() {
    let server = FaultServer::start(|_, r| match r.header("authorization") {
        Some("Bearer token-2") => Action::ok("hello"),
        _ => Action::status(401),
    })
    .await;
    let registry = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let (tokens, fetches) = counting_tokens();
    tokens.token().await.unwrap(); // token-1, which the server no longer accepts
    let seen: Shared<Transmission> = Arc::default();
    let s = seen.clone();
    let client = Resilience::new()
        .breaker(registry.clone())
        .bearer(bearer(&server, tokens))
        .on_attempt(move |e, _| s.lock().unwrap().push(e.transmission))
        .build(reqwest_client())
        .unwrap();

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (client, url) = (client.clone(), server.url("/me"));
        tasks.spawn(async move { client.get(url).send().await.map(|r| r.status()) });
    }
    let statuses = tokio::time::timeout(S(60), async {
        let mut statuses = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            statuses.push(joined.unwrap().unwrap());
        }
        statuses
    })
    .await
    .expect("every call finished");

    assert_eq!(statuses, vec![StatusCode::OK; 64]);
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        2,
        "token-1, then one refresh"
    );
    let seen = seen.lock().unwrap().clone();
    let unauthorized = seen.iter().filter(|t| **t == status(401)).count();
    let ok = seen.iter().filter(|t| **t == status(200)).count();
    assert_eq!(ok, 64);
    assert_eq!(unauthorized + ok, seen.len(), "nothing but 401s and 200s");
    assert_eq!(
        seen.len(),
        server.requests_seen(),
        "one report per wire request"
    );
    let origin = Origin::parse(&server.url("/")).unwrap();
    assert_eq!(registry.state(&origin), Some(BreakerState::Closed));
    assert_eq!(registry.snapshot()[0].consecutive_failures, 0);
}

#[tokio::test]
async fn debug_of_a_stack_with_a_cached_token_never_shows_the_secret() {
    let tokens =
        TokenManager::new(|| async { Ok::<_, std::io::Error>(AccessToken::new("s3cr3t-value")) });
    tokens.token().await.unwrap();
    let auth = BearerAuth::builder(tokens)
        .origin(Origin::parse("https://api.example.com").unwrap())
        .build()
        .unwrap();
    let stack = Resilience::new().bearer(auth).on_attempt(|_, _| {});
    let text = format!("{stack:?}");
    assert!(!text.contains("s3cr3t-value"), "{text}");
    assert!(text.contains("on_attempt: true"), "{text}");
}

/// The final `RetryError` of a wrapped failure.
fn retry_error(result: &reqwest_middleware::Result<reqwest::Response>) -> &RetryError {
    let err = result.as_ref().expect_err("a failure");
    match ResilienceError::from_middleware_error(err) {
        Some(ResilienceError::Retry(retry)) => retry,
        other => panic!("not a RetryError: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_hanging_server_cut_at_the_total_deadline_trips_nothing_and_three_attempt_timeouts_trip_it()
 {
    let server = FaultServer::always(Action::Stall).await;
    let registry =
        BreakerRegistry::new(BreakerConfig::default().policy(TripPolicy::consecutive_failures(3)))
            .unwrap();
    let client = Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .max_retries(0)
                .total_deadline(S(2)),
        )
        .breaker(registry.clone())
        .build(reqwest_client())
        .unwrap();
    let origin = Origin::parse(&server.url("/")).unwrap();

    for call in 1..=3 {
        let (result, ext, took) = get(&client, &server.url("/hang"), Extensions::new()).await;
        let retry = retry_error(&result);
        assert_eq!(retry.attempts(), 1);
        assert_eq!(retry.stop_reason(), StopReason::DeadlineExceeded);
        assert!(retry.is_timeout());
        assert_eq!(took, S(2), "cut exactly at the deadline (virtual time)");
        assert_eq!(
            RetryOutcome::of(&ext).map(|o| (o.attempts, o.stop)),
            Some((1, StopReason::DeadlineExceeded))
        );
        // One record, though both the breaker and the retry watch the same deadline.
        assert_eq!(
            history(&ext),
            [(
                Transmission::Unknown,
                Some(FailureKind::Timeout),
                stop(StopReason::DeadlineExceeded)
            )]
        );
        let evidence = RequestEvidence::of(&ext).expect("evidence");
        assert_eq!(evidence.attempt, 1);
        assert_eq!(evidence.elapsed, S(2));
        assert_eq!(evidence.origin.as_ref(), Some(&origin));
        assert_eq!(server.requests_seen(), call);
        // Issue 28: the total deadline is the caller's own limit, neutral for the breaker
        // (this test had the third deadline cut open it).
        assert_eq!(registry.state(&origin), Some(BreakerState::Closed));
        assert_eq!(registry.snapshot()[0].consecutive_failures, 0);
    }

    // An attempt timeout is the server's verdict: three cuts open the breaker.
    let client = Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .max_retries(0)
                .total_deadline(S(10))
                .attempt_timeout(S(2)),
        )
        .breaker(registry.clone())
        .build(reqwest_client())
        .unwrap();
    for call in 1..=3 {
        let (result, ext, took) = get(&client, &server.url("/hang"), Extensions::new()).await;
        assert_eq!(retry_error(&result).attempts(), 1);
        assert!(retry_error(&result).is_timeout());
        assert_eq!(
            took,
            S(2),
            "cut exactly at the attempt timeout (virtual time)"
        );
        assert_eq!(history(&ext)[0].1, Some(FailureKind::Timeout));
        assert_eq!(server.requests_seen(), 3 + call);
        let expected = if call < 3 {
            BreakerState::Closed
        } else {
            BreakerState::Open
        };
        assert_eq!(registry.state(&origin), Some(expected), "after call {call}");
    }

    // Open: turned away at once, the hanging server sees nothing more.
    let (result, ext, took) = get(&client, &server.url("/hang"), Extensions::new()).await;
    assert_eq!(took, Duration::ZERO);
    let retry = retry_error(&result);
    assert_eq!(retry.attempts(), 1);
    assert!(!retry.is_timeout());
    assert!(matches!(
        ResilienceError::from_middleware_error(retry.last_error()),
        Some(ResilienceError::BreakerOpen {
            state: BreakerState::Open,
            ..
        })
    ));
    assert_eq!(
        history(&ext)
            .into_iter()
            .map(|(t, f, _)| (t, f))
            .collect::<Vec<_>>(),
        [(Transmission::NotSent, Some(FailureKind::BreakerOpen))]
    );
    assert_eq!(server.requests_seen(), 6);
}

#[tokio::test(start_paused = true)]
async fn with_retries_left_a_hanging_attempt_cut_by_the_breaker_still_stops_at_the_deadline() {
    // Default retries (3) and a per-request deadline instead of the client's: the breaker
    // cuts the attempt; the retry recognises the cut and makes no further attempt.
    let server = FaultServer::always(Action::Stall).await;
    let registry =
        BreakerRegistry::new(BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)))
            .unwrap();
    let client = Resilience::new()
        .retry(RetryMiddleware::builder().backoff(exact_backoff()))
        .breaker(registry.clone())
        .build(reqwest_client())
        .unwrap();
    let mut ext = Extensions::new();
    ext.insert(reqwest_resilience::retry::Deadline::after(S(5)));
    let (result, ext, took) = get(&client, &server.url("/"), ext).await;
    let retry = retry_error(&result);
    assert_eq!(
        (retry.attempts(), retry.stop_reason(), retry.is_timeout()),
        (1, StopReason::DeadlineExceeded, true)
    );
    assert_eq!(took, S(5));
    assert_eq!(
        history(&ext),
        [(
            Transmission::Unknown,
            Some(FailureKind::Timeout),
            stop(StopReason::DeadlineExceeded)
        )]
    );
    assert_eq!(server.requests_seen(), 1);
    // Issue 28: the deadline is the caller's, so the cut is neutral (it opened the
    // breaker before).
    assert_eq!(
        registry.state(&Origin::parse(&server.url("/")).unwrap()),
        Some(BreakerState::Closed)
    );
}

/// A token source that fails its first `failures` fetches, then hands out `token-N`.
fn tokens_failing_first(failures: usize) -> (Arc<AtomicUsize>, impl Fn() -> TokenFetch + Clone) {
    let fetches = Arc::new(AtomicUsize::new(0));
    let f = fetches.clone();
    let source = move || {
        let n = f.fetch_add(1, Ordering::SeqCst) + 1;
        Box::pin(async move {
            if n <= failures {
                Err(std::io::Error::other("identity provider down"))
            } else {
                Ok(AccessToken::new(format!("token-{n}")))
            }
        }) as TokenFetch
    };
    (fetches, source)
}

type TokenFetch = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<AccessToken, std::io::Error>> + Send>,
>;

/// The middleware error a stopped retry loop returns, unwrapped down to the `TokenError`.
fn is_token_error(err: &reqwest_middleware::Error) -> bool {
    match ResilienceError::from_middleware_error(err) {
        Some(ResilienceError::Token(_)) => true,
        Some(ResilienceError::Retry(r)) => is_token_error(r.last_error()),
        _ => false,
    }
}

#[tokio::test(start_paused = true)]
async fn post_whose_first_token_fetch_fails_is_retried_and_reaches_the_server_exactly_once() {
    let server = FaultServer::always(Action::ok("created")).await;
    let (fetches, source) = tokens_failing_first(1);
    let client = Resilience::new()
        .retry(RetryMiddleware::builder().backoff(exact_backoff()))
        .bearer(bearer(&server, TokenManager::new(source)))
        .build(reqwest_client())
        .unwrap();

    let request = client
        .post(server.url("/orders"))
        .body("{}")
        .build()
        .unwrap();
    let mut ext = Extensions::new();
    let t0 = Instant::now();
    let result = tokio::time::timeout(S(3600), client.execute_with_extensions(request, &mut ext))
        .await
        .expect("the request finished");

    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    assert_eq!(
        server.requests_seen(),
        1,
        "the tokenless attempt never left"
    );
    let seen = &server.requests()[0];
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.header("authorization"), Some("Bearer token-2"));
    // The manager's first failure backoff (1 s) and the retry's first delay (1 s) agree.
    assert_eq!(t0.elapsed(), S(1));
    assert_eq!(
        history(&ext),
        [
            (
                Transmission::NotSent,
                Some(FailureKind::TokenUnavailable),
                retry(S(1), RetryReason::NotSent)
            ),
            (
                status(200),
                None,
                stop(StopReason::FinalResponse(StatusCode::OK))
            ),
        ]
    );
    let origin = Origin::parse(&server.url("/")).unwrap();
    let records = AttemptHistory::of(&ext).unwrap().attempts().to_vec();
    let numbered: Vec<_> = records
        .iter()
        .map(|r| (r.evidence.attempt, r.evidence.origin.clone()))
        .collect();
    assert_eq!(
        numbered,
        [(1, Some(origin.clone())), (2, Some(origin.clone()))]
    );
    assert_eq!(
        RetryOutcome::of(&ext).map(|o| o.attempts),
        Some(2),
        "one retry"
    );
}

#[tokio::test(start_paused = true)]
async fn post_after_a_token_failure_waits_for_the_token_managers_next_fetch_not_only_the_backoff() {
    // The manager will not fetch again for 5 s; a retry after the 1 s backoff would get
    // the same error back and spend a retry for nothing.
    let (result, ext, took, fetches, seen) =
        post_after_a_token_failure(RetryMiddleware::builder().max_retries(1), S(5)).await;

    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(took, S(5));
    assert_eq!(fetches, 2);
    assert_eq!(seen, 1);
    assert_eq!(
        history(&ext),
        [
            (
                Transmission::NotSent,
                Some(FailureKind::TokenUnavailable),
                retry(S(5), RetryReason::NotSent)
            ),
            (
                status(200),
                None,
                stop(StopReason::FinalResponse(StatusCode::OK))
            ),
        ]
    );
}

/// A POST through the stack with `retry` whose first token fetch fails, the manager holding off for
/// `backoff` after it: the outcome, the extensions, the time taken, the token fetches and
/// the requests the server saw.
async fn post_after_a_token_failure(
    retry: reqwest_resilience::retry::RetryMiddlewareBuilder,
    backoff: Duration,
) -> (
    reqwest_middleware::Result<reqwest::Response>,
    Extensions,
    Duration,
    usize,
    usize,
) {
    let server = FaultServer::always(Action::ok("created")).await;
    let (fetches, source) = tokens_failing_first(1);
    let tokens = TokenManager::builder(source)
        .failure_backoff(backoff, backoff)
        .build();
    let client = Resilience::new()
        .retry(retry.backoff(exact_backoff()))
        .bearer(bearer(&server, tokens))
        .build(reqwest_client())
        .unwrap();
    let request = client
        .post(server.url("/orders"))
        .body("{}")
        .build()
        .unwrap();
    let mut ext = Extensions::new();
    let t0 = Instant::now();
    let result = client.execute_with_extensions(request, &mut ext).await;
    let took = t0.elapsed();
    let fetched = fetches.load(Ordering::SeqCst);
    (result, ext, took, fetched, server.requests_seen())
}

#[tokio::test(start_paused = true)]
async fn a_token_manager_held_off_beyond_the_cap_fails_the_request_at_once() {
    // The manager backs off for an hour after a failure (with `Duration::MAX`, for
    // decades): a retry at the 60 s cap would meet the same error, so, under either
    // policy, the token error comes back at once after one attempt, and nothing was sent.
    for backoff in [S(3600), Duration::MAX] {
        for policy in [RetryAfterPolicy::Clamp, RetryAfterPolicy::GiveUp] {
            let retry = RetryMiddleware::builder().retry_after_cap(S(60), policy);
            let (result, ext, took, fetches, seen) =
                post_after_a_token_failure(retry, backoff).await;
            assert_eq!(
                (took, fetches, seen),
                (Duration::ZERO, 1, 0),
                "{backoff:?} {policy:?}"
            );
            assert!(is_token_error(&result.unwrap_err()));
            assert_eq!(
                history(&ext),
                [(
                    Transmission::NotSent,
                    Some(FailureKind::TokenUnavailable),
                    stop(StopReason::RetryAfterTooLong)
                )],
                "{backoff:?} {policy:?}"
            );
            let outcome = RetryOutcome::of(&ext).copied().expect("an outcome");
            assert_eq!(
                (outcome.attempts, outcome.stop),
                (1, StopReason::RetryAfterTooLong)
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_token_managers_next_fetch_within_the_cap_is_waited_for() {
    // 30 s of backoff, under the 60 s cap: one retry, when the manager fetches again.
    let (result, ext, took, fetches, seen) =
        post_after_a_token_failure(RetryMiddleware::builder().max_retries(1), S(30)).await;
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!((took, fetches, seen), (S(30), 2, 1));
    assert_eq!(history(&ext)[0].2, retry(S(30), RetryReason::NotSent));
}

#[tokio::test(start_paused = true)]
async fn ten_consecutive_token_failures_leave_the_origins_breaker_closed_and_send_nothing() {
    let server = FaultServer::always(Action::ok("hello")).await;
    let (fetches, source) = tokens_failing_first(10);
    // One counted failure would open this breaker.
    let registry =
        BreakerRegistry::new(BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)))
            .unwrap();
    let client = Resilience::new()
        .breaker(registry.clone())
        .bearer(bearer(&server, TokenManager::new(source)))
        .build(reqwest_client())
        .unwrap();
    let origin = Origin::parse(&server.url("/")).unwrap();

    for i in 1..=10 {
        let (result, ext, _) = get(&client, &server.url("/me"), once()).await;
        let err = result.expect_err("no token, no request");
        assert!(is_token_error(&err), "attempt {i}: {err:?}");
        assert_eq!(
            history(&ext),
            [(
                Transmission::NotSent,
                Some(FailureKind::TokenUnavailable),
                stop(StopReason::RetriesExhausted)
            )],
            "request {i}"
        );
        // The token is fetched before the breaker is asked (a request holds no probe
        // slot while it waits for one): a request without a token never reaches it.
        assert_eq!(registry.state(&origin), None, "request {i}");
        // Past the manager's failure backoff (capped at 30 s), so every request makes a
        // fetch of its own that fails.
        tokio::time::advance(S(31)).await;
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 10);
    assert_eq!(server.requests_seen(), 0);
    assert!(registry.snapshot().is_empty());

    // The 11th fetch succeeds and the breaker, asked for the first time, lets the request
    // through: closed, with no failure counted and no trip.
    let (result, _, _) = get(&client, &server.url("/me"), once()).await;
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(server.requests_seen(), 1);
    let snapshot = registry.snapshot();
    assert_eq!(snapshot.len(), 1);
    assert_eq!(snapshot[0].state, BreakerState::Closed);
    assert_eq!(snapshot[0].consecutive_failures, 0);
    assert_eq!(snapshot[0].trips, 0);
}

// ---------------------------------------------------------------------------------------
// The composed stack: the stages share one request copy per attempt, and a stack nested in
// another middleware of this crate keeps that one's request state.

/// A server that answers `401` to `token-1` and `200` to any other token.
async fn old_token_refused() -> FaultServer {
    FaultServer::start(|_, r| match r.header("authorization") {
        Some("Bearer token-1") => Action::status(401),
        _ => Action::ok("paid"),
    })
    .await
}

/// What the server saw: method, body and token of each request.
fn seen(server: &FaultServer) -> Vec<(String, Vec<u8>, Option<String>)> {
    server
        .requests()
        .into_iter()
        .map(|r| {
            let token = r.header("authorization").map(str::to_owned);
            (r.method, r.body, token)
        })
        .collect()
}

/// POSTs `amount=5` through the full stack with `BearerAuth` against [`old_token_refused`],
/// with the caller's extensions `ext`, and checks what every `401` replay must show: two
/// POSTs with the body, the second with the fresh token, both in the history.
async fn post_healed_by_one_replay(mut ext: Extensions) -> Extensions {
    let server = old_token_refused().await;
    let (tokens, fetches) = counting_tokens();
    let client = Resilience::new()
        .bearer(bearer(&server, tokens))
        .build(reqwest_client())
        .unwrap();
    let request = client
        .post(server.url("/pay"))
        .body("amount=5")
        .build()
        .unwrap();
    let response = client
        .execute_with_extensions(request, &mut ext)
        .await
        .unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    let post = |token: &str| {
        (
            "POST".to_owned(),
            b"amount=5".to_vec(),
            Some(format!("Bearer {token}")),
        )
    };
    assert_eq!(seen(&server), [post("token-1"), post("token-2")]);
    assert_eq!(
        history(&ext),
        [
            (status(401), None, None),
            (
                status(200),
                None,
                stop(StopReason::FinalResponse(StatusCode::OK))
            ),
        ]
    );
    ext
}

#[tokio::test(start_paused = true)]
async fn a_401_replay_of_a_post_is_made_from_the_retrys_copy_with_the_body_and_the_fresh_token() {
    let ext = post_healed_by_one_replay(Extensions::new()).await;
    // One attempt of the retry's, healed inside it by the replay.
    assert_eq!(RetryOutcome::of(&ext).unwrap().attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn on_the_last_attempt_bearer_auth_copies_the_request_itself_and_still_replays_a_401() {
    // No retry left: the retry keeps no copy of the request.
    let ext = post_healed_by_one_replay(once()).await;
    assert_eq!(RetryOutcome::of(&ext).unwrap().attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn a_stack_without_retry_inside_a_retry_middleware_keeps_one_history_across_its_attempts() {
    let server = FaultServer::sequence(vec![Action::status(503)], Action::ok("done")).await;
    // The retry outside makes the composed stack's future for each attempt; the stack must
    // see that the request is already owned, and leave the first attempt's record alone.
    let outer = ClientBuilder::new(reqwest_client()).with(
        RetryMiddleware::builder()
            .backoff(exact_backoff())
            .no_budget()
            .build()
            .unwrap(),
    );
    let client = Resilience::new().no_retry().install(outer).unwrap().build();

    let (result, ext, took) = get(&client, &server.url("/"), Extensions::new()).await;

    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(took, S(1));
    assert_eq!(server.requests_seen(), 2);
    assert_eq!(
        history(&ext),
        [
            (status(503), None, retry(S(1), S503)),
            (
                status(200),
                None,
                stop(StopReason::FinalResponse(StatusCode::OK))
            ),
        ]
    );
    let numbers: Vec<u32> = AttemptHistory::of(&ext)
        .unwrap()
        .attempts()
        .iter()
        .map(|r| r.evidence.attempt)
        .collect();
    assert_eq!(numbers, [1, 2]);
}

/// A half-open breaker whose origin also serves the tokens: the request must get its token
/// before it takes the origin's only probe slot. Taking the slot first (today), the token
/// fetch, through a client sharing the registry, is refused `ProbesBusy`, the attempt ends
/// `TokenUnavailable` and frees the slot without a verdict, and the retry takes it again:
/// the breaker never closes while every request needs a token.
#[tokio::test(start_paused = true)]
async fn a_half_open_probe_gets_its_token_first_so_a_fetch_from_the_same_origin_closes_the_breaker()
{
    // `/api` fails once (opening the breaker), then answers; `/oauth/token` always answers.
    let api_calls = Arc::new(AtomicUsize::new(0));
    let server = FaultServer::start({
        let api_calls = api_calls.clone();
        move |_, req| match req.path.as_str() {
            "/oauth/token" => Action::ok("secret"),
            _ if api_calls.fetch_add(1, Ordering::SeqCst) == 0 => Action::status(503),
            _ => Action::ok("data"),
        }
    })
    .await;
    let registry = BreakerRegistry::new(
        BreakerConfig::default()
            .policy(TripPolicy::consecutive_failures(1))
            .open_duration(S(5)),
    )
    .unwrap();
    // The token source fetches from the API's own origin, through the same registry.
    let token_client = Resilience::new()
        .retry(RetryMiddleware::builder().max_retries(0))
        .breaker(registry.clone())
        .build(support::loopback_client())
        .unwrap();
    let fetches = Arc::new(AtomicUsize::new(0));
    let tokens = TokenManager::new({
        let (fetches, url) = (fetches.clone(), server.url("/oauth/token"));
        move || {
            fetches.fetch_add(1, Ordering::SeqCst);
            let (client, url) = (token_client.clone(), url.clone());
            async move {
                let secret = client.get(&url).send().await?.text().await?;
                // Shorter than the open period: the probe needs a new one.
                Ok::<_, reqwest_middleware::Error>(AccessToken::new(secret).expires_in(S(2)))
            }
        }
    });
    let client = Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .backoff(exact_backoff())
                .max_retries(3),
        )
        .breaker(registry.clone())
        .bearer(bearer(&server, tokens))
        .build(support::loopback_client())
        .unwrap();
    let origin = Origin::parse(&server.url("/")).unwrap();

    // Opened by a 503 (one token fetched while Closed), then HalfOpen after 5 s.
    let (result, _, _) = get(&client, &server.url("/api"), once()).await;
    assert_eq!(result.unwrap().status(), 503);
    assert_eq!(registry.state(&origin), Some(BreakerState::Open));
    tokio::time::sleep(S(6)).await;
    assert_eq!(registry.state(&origin), Some(BreakerState::HalfOpen));

    let (result, _, _) = get(&client, &server.url("/api"), Extensions::new()).await;
    let count = |path: &str| server.requests().iter().filter(|r| r.path == path).count();
    assert_eq!(
        (
            registry.state(&origin),
            fetches.load(Ordering::SeqCst),
            count("/oauth/token"),
            count("/api"),
            result.as_ref().ok().map(|r| r.status().as_u16()),
        ),
        (Some(BreakerState::Closed), 2, 2, 2, Some(200)),
        "(breaker state, token fetches, /oauth/token seen, /api seen, status): {result:?}"
    );
}

/// A request waits for its bearer token before it takes a limiter permit: while a slow
/// token fetch lasts, the origin's only permit stays free for a request that carries its
/// own `Authorization` header (taking the permit first, it was turned away
/// `ConcurrencyLimited`).
#[tokio::test(start_paused = true)]
async fn a_request_waiting_for_its_token_holds_no_limiter_permit() {
    let server = FaultServer::always(Action::ok("data")).await;
    let limiter = LimiterRegistry::new(LimiterConfig::fixed(1)).unwrap();
    let tokens = TokenManager::new(|| async {
        tokio::time::sleep(S(10)).await;
        Ok::<_, std::io::Error>(AccessToken::new("slow"))
    });
    let client = Resilience::new()
        .retry(RetryMiddleware::builder().max_retries(0))
        .concurrency_limit(limiter.clone())
        .bearer(bearer(&server, tokens))
        .build(support::loopback_client())
        .unwrap();
    let waiting = tokio::spawn({
        let (client, url) = (client.clone(), server.url("/needs-token"));
        async move { client.get(&url).send().await.map(|r| r.status().as_u16()) }
    });
    tokio::time::sleep(S(1)).await;
    let own = client
        .get(server.url("/own-token"))
        .header(http::header::AUTHORIZATION, "Bearer own")
        .send()
        .await
        .map(|r| r.status().as_u16());
    assert_eq!(own.unwrap(), 200, "the permit was free");
    assert_eq!(waiting.await.unwrap().unwrap(), 200);
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/own-token", "/needs-token"]);
    let snapshot = limiter.snapshot();
    assert_eq!(snapshot.len(), 1);
    assert_eq!(
        (
            snapshot[0].in_flight,
            snapshot[0].queued,
            snapshot[0].rejections
        ),
        (0, 0, 0)
    );
}

/// `BearerAuth`'s replay after a `401` is part of the attempt, under the attempt's one
/// clock: a 1 s attempt timeout counts from the first send, so a `401` at once and a
/// replay the server answers after 1.5 s are cut together at 1 s; the cut is the
/// replay's record (`Unknown`, `Timeout`), and the GET is retried with the fresh token.
/// Before, the breaker's cut kept the `401`'s record as the attempt's, and the request
/// failed with "final status 401" after one attempt. The same as one middleware, as four,
/// and without a breaker (the retry's own cut).
#[tokio::test(start_paused = true)]
async fn a_401_replay_runs_under_the_attempts_timeout_and_its_cut_is_retried() {
    let retry = || {
        RetryMiddleware::builder()
            .backoff(exact_backoff())
            .attempt_timeout(S(1))
    };
    replay_cut_by_the_attempt_timeout(|bearer| {
        Resilience::new()
            .retry(retry())
            .bearer(bearer)
            .build(reqwest_client())
            .unwrap()
    })
    .await;
    // As middlewares of their own, with a breaker and without (the retry's own cut).
    for breaker in [true, false] {
        replay_cut_by_the_attempt_timeout(|bearer| {
            let mut builder = ClientBuilder::new(reqwest_client()).with(retry().build().unwrap());
            if breaker {
                builder = builder.with(CircuitBreakerMiddleware::default());
            }
            let transport = reqwest_resilience::TransportEvidence::with_client_redirects(
                ClientRedirects::Recorded,
            );
            builder.with(bearer).with(transport).build()
        })
        .await;
    }
}

async fn replay_cut_by_the_attempt_timeout(client: impl Fn(BearerAuth) -> ClientWithMiddleware) {
    let server = FaultServer::start(|n, r| match r.header("authorization") {
        // The replay (the second request) hangs past the attempt's timeout; the retry's
        // request is answered at once.
        Some("Bearer token-2") if n == 1 => {
            Action::Delay(Duration::from_millis(1500), Box::new(Action::ok("late")))
        }
        Some("Bearer token-2") => Action::ok("hello"),
        _ => Action::status(401),
    })
    .await;
    let (tokens, fetches) = counting_tokens();
    let client = client(bearer(&server, tokens));

    let (result, ext, took) = get(&client, &server.url("/me"), Extensions::new()).await;

    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(fetches.load(Ordering::SeqCst), 2, "one refresh");
    let seen: Vec<_> = server
        .requests()
        .iter()
        .map(|r| r.header("authorization").map(str::to_owned))
        .collect();
    assert_eq!(
        seen,
        [
            Some("Bearer token-1".to_owned()),
            Some("Bearer token-2".to_owned()),
            Some("Bearer token-2".to_owned())
        ]
    );
    // The cut at 1 s, then the 1 s backoff.
    assert_eq!(took, S(2));
    assert_eq!(
        history(&ext),
        [
            (status(401), None, None),
            (
                Transmission::Unknown,
                Some(FailureKind::Timeout),
                retry(S(1), RetryReason::Transient)
            ),
            (
                status(200),
                None,
                stop(StopReason::FinalResponse(StatusCode::OK))
            ),
        ]
    );
}
