//! Hedged requests against real loopback servers, with tokio's clock paused (no idle-pool
//! timer in the clients, so the only timers are the middleware's and the servers' delays:
//! elapsed virtual time is exact).

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream;
use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::breaker::{
    BreakerConfig, BreakerRegistry, BreakerState, CircuitBreakerMiddleware, TripPolicy,
};
use reqwest_resilience::retry::{HedgeDelay, Hedging, RetryOutcome, RetryReason, StopReason};
use reqwest_resilience::{
    AttemptDecision, AttemptHistory, FailureKind, Origin, Resilience, ResilienceError, RetryBudget,
    RetryMiddleware, Transmission, TransportEvidence,
};
use support::{Action, FaultServer, RecordedRequest, exact_retry, loopback_client};
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;

fn registry(failures_to_open: u32) -> BreakerRegistry {
    BreakerRegistry::new(
        BreakerConfig::default().policy(TripPolicy::consecutive_failures(failures_to_open)),
    )
    .unwrap()
}

fn client(retry: RetryMiddleware, registry: &BreakerRegistry) -> ClientWithMiddleware {
    ClientBuilder::new(loopback_client())
        .with(retry)
        .with(CircuitBreakerMiddleware::new(registry.clone()))
        .with(TransportEvidence::new())
        .build()
}

/// A server whose first request for each path answers `first`, and every later one
/// `rest`: a logical request's first copy is slow and its hedge is not.
async fn first_slow(first: Action, rest: Action) -> FaultServer {
    let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    FaultServer::start(move |_, req: &RecordedRequest| {
        let mut seen = seen.lock().unwrap();
        let n = seen.entry(req.path.clone()).or_default();
        *n += 1;
        if *n == 1 { first.clone() } else { rest.clone() }
    })
    .await
}

fn slow(ms: u64, body: &str) -> Action {
    Action::DelayUnlessClosed(MS(ms), Box::new(Action::ok(body)))
}

fn fast(ms: u64, body: &str) -> Action {
    Action::Delay(MS(ms), Box::new(Action::ok(body)))
}

struct Sent {
    result: reqwest_middleware::Result<reqwest::Response>,
    ext: Extensions,
    took: Duration,
}

impl Sent {
    fn history(&self) -> &AttemptHistory {
        AttemptHistory::of(&self.ext).expect("an attempt history")
    }

    fn outcome(&self) -> RetryOutcome {
        *RetryOutcome::of(&self.ext).expect("a retry outcome")
    }

    async fn body(self) -> String {
        match self.result {
            Ok(r) => r.text().await.unwrap(),
            Err(e) => panic!("no response: {e:?}"),
        }
    }
}

async fn send(c: &ClientWithMiddleware, req: reqwest_middleware::RequestBuilder) -> Sent {
    send_with(c, req, Extensions::new()).await
}

/// `send` with the caller's extensions (a builder's `with_extension` does not survive
/// `build()`).
async fn send_with(
    c: &ClientWithMiddleware,
    req: reqwest_middleware::RequestBuilder,
    mut ext: Extensions,
) -> Sent {
    let req = req.build().unwrap();
    let t0 = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(3600),
        c.execute_with_extensions(req, &mut ext),
    )
    .await
    .expect("the request finished");
    Sent {
        result,
        ext,
        took: t0.elapsed(),
    }
}

/// Lets the server's connection tasks see what the client did (bounded).
async fn settle(server: &FaultServer, closed: usize) {
    for _ in 0..1000 {
        if server.closed_by_client() >= closed {
            return;
        }
        tokio::time::sleep(MS(1)).await;
    }
}

fn cancelled(record: &reqwest_resilience::AttemptRecord, attempt: u32, ran: Duration, by: u32) {
    assert_eq!(record.evidence.attempt, attempt);
    assert_eq!(record.evidence.transmission, Transmission::Unknown);
    assert_eq!(record.evidence.failure, Some(FailureKind::Cancelled));
    assert_eq!(record.evidence.elapsed, ran);
    assert_eq!(record.decision, Some(AttemptDecision::Superseded { by }));
}

fn answered(record: &reqwest_resilience::AttemptRecord, attempt: u32, took: Duration) {
    assert_eq!(record.evidence.attempt, attempt);
    assert_eq!(
        record.evidence.transmission,
        Transmission::ResponseReceived(http::StatusCode::OK)
    );
    assert_eq!(record.evidence.elapsed, took);
    assert_eq!(
        record.decision,
        Some(AttemptDecision::Stop {
            reason: StopReason::FinalResponse(http::StatusCode::OK)
        })
    );
}

#[tokio::test(start_paused = true)]
async fn a_fast_first_attempt_sends_no_hedge() {
    let server = FaultServer::always(fast(10, "fast")).await;
    let reg = registry(1);
    let c = client(
        exact_retry()
            .hedging(Hedging::fixed(MS(100)))
            .build()
            .unwrap(),
        &reg,
    );

    let sent = send(&c, c.get(server.url("/"))).await;
    assert_eq!(sent.took, MS(10));
    assert_eq!(sent.history().len(), 1);
    answered(&sent.history().attempts()[0], 1, MS(10));
    assert_eq!(sent.outcome().attempts, 1);
    assert_eq!(sent.body().await, "fast");
    assert_eq!(server.requests_seen(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_slow_first_attempt_gets_exactly_one_hedge_whose_faster_answer_wins() {
    let server = first_slow(slow(5000, "slow"), fast(10, "fast")).await;
    // One failure would open it: a loser counted as a failure would show.
    let reg = registry(1);
    let c = client(
        exact_retry()
            .hedging(Hedging::fixed(MS(100)))
            .build()
            .unwrap(),
        &reg,
    );

    let sent = send(&c, c.get(server.url("/report"))).await;
    // The hedge went out at 100 ms and answered 10 ms later.
    assert_eq!(sent.took, MS(110));
    let h = sent.history();
    assert_eq!(h.len(), 2);
    cancelled(&h.attempts()[0], 1, MS(110), 2);
    answered(&h.attempts()[1], 2, MS(10));
    assert_eq!(sent.outcome().attempts, 2);
    let response = sent.result.as_ref().unwrap();
    let evidence = reqwest_resilience::RequestEvidence::of(response.extensions()).unwrap();
    assert_eq!(
        evidence.attempt, 2,
        "the response's evidence is the winner's"
    );
    assert_eq!(
        reqwest_resilience::RequestEvidence::of(&sent.ext),
        Some(evidence)
    );
    assert_eq!(sent.body().await, "fast");
    assert_eq!(server.requests_seen(), 2);
    settle(&server, 1).await;
    assert_eq!(
        server.closed_by_client(),
        1,
        "the loser's connection was closed"
    );
    let origin = Origin::parse(&server.url("/")).unwrap();
    assert_eq!(reg.state(&origin), Some(BreakerState::Closed));
    assert_eq!(reg.snapshot()[0].consecutive_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn a_post_or_a_streamed_body_is_never_hedged() {
    let server = FaultServer::always(fast(1000, "slow")).await;
    let reg = registry(5);
    let c = client(
        exact_retry()
            .hedging(Hedging::fixed(MS(100)).no_budget())
            .build()
            .unwrap(),
        &reg,
    );

    let sent = send(&c, c.post(server.url("/pay")).body("x")).await;
    assert_eq!(sent.took, MS(1000));
    assert_eq!(sent.history().len(), 1);
    assert_eq!(sent.body().await, "slow");
    assert_eq!(server.requests_seen(), 1);

    // A PUT is idempotent, but a streamed body cannot be copied.
    let body = reqwest::Body::wrap_stream(stream::iter([Ok::<_, std::io::Error>("part")]));
    let sent = send(&c, c.put(server.url("/doc")).body(body)).await;
    assert_eq!(sent.took, MS(1000));
    assert_eq!(sent.history().len(), 1);
    assert_eq!(sent.body().await, "slow");
    assert_eq!(server.requests_seen(), 2);
}

#[tokio::test(start_paused = true)]
async fn no_hedge_is_sent_once_the_hedge_budget_is_spent() {
    let server = first_slow(slow(1000, "slow"), fast(10, "fast")).await;
    let reg = registry(5);
    // Half a hedge per request: the first request earns none, the second one.
    let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.5).unwrap();
    let c = client(
        exact_retry()
            .hedging(Hedging::fixed(MS(100)).budget(budget.clone()))
            .build()
            .unwrap(),
        &reg,
    );

    let a = send(&c, c.get(server.url("/a"))).await;
    assert_eq!((a.took, a.history().len()), (MS(1000), 1));
    assert_eq!(a.body().await, "slow");
    assert_eq!(server.requests_seen(), 1);

    let b = send(&c, c.get(server.url("/b"))).await;
    assert_eq!((b.took, b.history().len()), (MS(110), 2));
    assert_eq!(b.body().await, "fast");
    assert_eq!(server.requests_seen(), 3);
    assert_eq!(budget.remaining(), 0);

    let c3 = send(&c, c.get(server.url("/c"))).await;
    assert_eq!((c3.took, c3.history().len()), (MS(1000), 1));
    assert_eq!(c3.body().await, "slow");
    assert_eq!(server.requests_seen(), 4, "budget spent: no hedge");
}

#[tokio::test(start_paused = true)]
async fn no_hedge_goes_into_an_open_breaker_or_a_pause() {
    let server = first_slow(slow(1000, "slow"), fast(10, "fast")).await;
    let reg = registry(5);
    let budget = RetryBudget::new(Duration::from_secs(10), 100, 1.0).unwrap();
    let c = client(
        exact_retry()
            .hedging(Hedging::fixed(MS(100)).budget(budget.clone()))
            .build()
            .unwrap(),
        &reg,
    );
    let origin = Origin::parse(&server.url("/")).unwrap();

    for (path, close) in [("/isolated", true), ("/paused", false)] {
        let before = budget.remaining();
        let (sent, ()) = tokio::join!(send(&c, c.get(server.url(path))), async {
            // The breaker opens (or a server pauses the origin) while the first copy waits.
            tokio::time::sleep(MS(50)).await;
            if close {
                reg.isolate(&origin);
            } else {
                reg.pause(&origin, Duration::from_secs(30));
            }
        });
        assert_eq!(sent.took, MS(1000), "{path}: the first copy's own answer");
        assert_eq!(sent.history().len(), 1, "{path}: no hedge recorded");
        assert_eq!(sent.outcome().attempts, 1);
        assert_eq!(
            budget.remaining(),
            before,
            "{path}: the refused hedge was given back"
        );
        assert_eq!(sent.body().await, "slow");
        reg.reset(&origin);
    }
    assert_eq!(server.requests_seen(), 2, "one request per path, no hedge");
}

#[tokio::test(start_paused = true)]
async fn at_most_max_hedges_copies_and_the_first_answer_among_them_wins() {
    // Every copy is slow; the first one sent answers first.
    let server = FaultServer::always(slow(1000, "slow")).await;
    let reg = registry(1);
    let c = client(
        exact_retry()
            .hedging(Hedging::fixed(MS(100)).max_hedges(2).no_budget())
            .build()
            .unwrap(),
        &reg,
    );

    let sent = send(&c, c.get(server.url("/"))).await;
    assert_eq!(sent.took, MS(1000));
    let h = sent.history();
    assert_eq!(h.len(), 3, "the first copy and two hedges, no third");
    cancelled(&h.attempts()[0], 2, MS(900), 1);
    cancelled(&h.attempts()[1], 3, MS(800), 1);
    answered(&h.attempts()[2], 1, MS(1000));
    assert_eq!(sent.outcome().attempts, 3);
    assert_eq!(sent.body().await, "slow");
    assert_eq!(server.requests_seen(), 3);
    settle(&server, 2).await;
    assert_eq!(server.closed_by_client(), 2);
    assert_eq!(reg.snapshot()[0].consecutive_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn failed_hedges_are_attempts_so_retries_plus_hedges_bound_the_copies() {
    let server = FaultServer::always(Action::Delay(MS(150), Box::new(Action::status(503)))).await;
    let reg = registry(100);
    let c = client(
        exact_retry()
            .max_retries(2)
            .hedging(Hedging::fixed(MS(100)).no_budget())
            .build()
            .unwrap(),
        &reg,
    );

    let sent = send(&c, c.get(server.url("/"))).await;
    // Copies at 0 and 100 ms both fail (150, 250 ms); retries after 1 s and 2 s, unhedged.
    assert_eq!(sent.took, MS(250 + 1000 + 150 + 2000 + 150));
    assert_eq!(server.requests_seen(), 4, "1 + 2 retries + 1 hedge");
    let outcome = sent.outcome();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (4, StopReason::RetriesExhausted)
    );
    let s503 = http::StatusCode::SERVICE_UNAVAILABLE;
    let got: Vec<_> = sent
        .history()
        .attempts()
        .iter()
        .map(|r| (r.evidence.attempt, r.evidence.status(), r.decision.clone()))
        .collect();
    let retry = |ms| AttemptDecision::Retry {
        delay: MS(ms),
        reason: RetryReason::Status(s503),
    };
    assert_eq!(
        got,
        [
            (1, Some(s503), Some(AttemptDecision::Superseded { by: 2 })),
            (2, Some(s503), Some(retry(1000))),
            (3, Some(s503), Some(retry(2000))),
            (
                4,
                Some(s503),
                Some(AttemptDecision::Stop {
                    reason: StopReason::RetriesExhausted
                })
            ),
        ]
    );
    assert_eq!(sent.result.unwrap().status(), s503);
    // Every copy's 503 was counted by the breaker.
    assert_eq!(reg.snapshot()[0].consecutive_failures, 4);
}

#[tokio::test(start_paused = true)]
async fn the_total_deadline_ends_a_hedged_request_on_time() {
    let server = FaultServer::always(Action::Stall).await;
    let reg = registry(100);
    let c = client(
        exact_retry()
            .total_deadline(MS(300))
            .hedging(Hedging::fixed(MS(100)).max_hedges(2).no_budget())
            .build()
            .unwrap(),
        &reg,
    );
    let sent = send(&c, c.get(server.url("/"))).await;
    assert_eq!(sent.took, MS(300));
    let outcome = sent.outcome();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (3, StopReason::DeadlineExceeded)
    );
    let h = sent.history();
    assert_eq!(h.len(), 3);
    for r in h.attempts() {
        assert_eq!(r.evidence.failure, Some(FailureKind::Timeout));
        assert_eq!(r.evidence.transmission, Transmission::Unknown);
    }
    assert_eq!(server.requests_seen(), 3);
    match &sent.result {
        Err(e) => assert!(matches!(
            ResilienceError::from_middleware_error(e),
            Some(ResilienceError::Retry(r)) if r.is_timeout()
        )),
        Ok(r) => panic!("unexpected {}", r.status()),
    }

    // No hedge would start at or past the deadline: 150 ms leaves room for one.
    let c = client(
        exact_retry()
            .total_deadline(MS(150))
            .hedging(Hedging::fixed(MS(100)).max_hedges(2).no_budget())
            .build()
            .unwrap(),
        &reg,
    );
    let sent = send(&c, c.get(server.url("/"))).await;
    assert_eq!(sent.took, MS(150));
    assert_eq!(sent.history().len(), 2);
    assert_eq!(server.requests_seen(), 5);
}

#[tokio::test(start_paused = true)]
async fn the_adaptive_delay_learns_the_origins_percentile() {
    let server = first_slow(slow(5000, "slow"), fast(20, "fast")).await;
    let reg = registry(5);
    let hedging = Hedging::adaptive(0.9).no_budget();
    assert_eq!(
        hedging.hedge_delay(),
        HedgeDelay::Adaptive {
            quantile: 0.9,
            min: MS(1),
            max: Duration::from_secs(2)
        }
    );
    let c = Resilience::new()
        .breaker(reg.clone())
        .retry(RetryMiddleware::builder().hedging(hedging.clone()))
        .build(loopback_client())
        .unwrap();
    let origin = Origin::parse(&server.url("/")).unwrap();
    assert_eq!(
        hedging.current_delay(&origin),
        Duration::from_secs(2),
        "no samples yet"
    );

    // 32 requests answered in 20 ms each (their paths seen twice: not the first time).
    for i in 0..32 {
        let warm = format!("/warm{i}");
        let _ = send(&c, c.get(server.url(&warm))).await; // first sight: slow, hedged
    }
    // Each of those was slow first and hedged at 2 s, so its first copy ran 2.02 s (a
    // sample, as a lower bound of its latency), beyond the 2 s bound.
    assert_eq!(hedging.current_delay(&origin), Duration::from_secs(2));
    assert_eq!(server.requests_seen(), 64);

    // Fast first copies now: 32 more samples of 20 ms, half the window.
    for i in 0..32 {
        let _ = send(&c, c.get(server.url(&format!("/warm{i}")))).await;
    }
    // p90 of 32 × 2.02 s and 32 × 20 ms is still the slow value...
    assert_eq!(hedging.current_delay(&origin), Duration::from_secs(2));
    for i in 0..256 {
        let _ = send(&c, c.get(server.url(&format!("/warm{}", i % 32)))).await;
    }
    // ...and after a window of fast answers, it is theirs.
    assert_eq!(hedging.current_delay(&origin), MS(20));
    let seen = server.requests_seen();

    let sent = send(&c, c.get(server.url("/new"))).await;
    assert_eq!(
        sent.took,
        MS(40),
        "hedged after the learnt 20 ms, answered 20 ms later"
    );
    assert_eq!(sent.history().len(), 2);
    assert_eq!(sent.body().await, "fast");
    assert_eq!(server.requests_seen(), seen + 2);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_callers_future_drops_every_copy() {
    let server = FaultServer::always(slow(5000, "slow")).await;
    let reg = registry(1);
    let c = client(
        exact_retry()
            .hedging(Hedging::fixed(MS(100)).no_budget())
            .build()
            .unwrap(),
        &reg,
    );
    let req = c.get(server.url("/")).build().unwrap();
    let mut ext = Extensions::new();
    let gave_up = tokio::time::timeout(MS(150), c.execute_with_extensions(req, &mut ext)).await;
    assert!(gave_up.is_err());
    assert_eq!(server.requests_seen(), 2);
    settle(&server, 2).await;
    assert_eq!(
        server.closed_by_client(),
        2,
        "both copies' connections closed"
    );
    assert_eq!(reg.snapshot()[0].consecutive_failures, 0);
    assert_eq!(reg.snapshot()[0].state, BreakerState::Closed);
}

#[test]
fn out_of_range_hedging_settings_are_typed_errors() {
    for hedging in [
        Hedging::adaptive(0.0),
        Hedging::adaptive(1.0),
        Hedging::adaptive(f64::NAN),
        Hedging::adaptive(0.9).delay_bounds(MS(10), MS(5)),
        Hedging::fixed(MS(10)).max_hedges(0),
        Hedging::fixed(MS(10)).max_hedges(5),
    ] {
        assert!(
            matches!(
                RetryMiddleware::builder().hedging(hedging.clone()).build(),
                Err(ResilienceError::InvalidConfig(_))
            ),
            "{hedging:?}"
        );
    }
    assert!(
        RetryMiddleware::builder()
            .hedging(Hedging::fixed(MS(10)).max_hedges(4))
            .build()
            .is_ok()
    );
}

#[tokio::test(start_paused = true)]
async fn a_hedge_never_takes_a_half_open_probe_slot() {
    let server = first_slow(Action::status(500), slow(1000, "slow")).await;
    // Two probe slots: without the rule, the hedge would take the second.
    let reg = BreakerRegistry::new(
        BreakerConfig::default()
            .policy(TripPolicy::consecutive_failures(1))
            .open_duration(Duration::from_secs(5))
            .open_jitter(0.0)
            .half_open_probes(2),
    )
    .unwrap();
    let c = client(
        exact_retry()
            .max_retries(0)
            .hedging(Hedging::fixed(MS(100)).no_budget())
            .build()
            .unwrap(),
        &reg,
    );
    let origin = Origin::parse(&server.url("/")).unwrap();
    // A 500 opens the breaker; 5 s later it is half-open.
    let sent = send(&c, c.get(server.url("/probe"))).await;
    assert_eq!(sent.result.unwrap().status(), 500);
    assert_eq!(reg.state(&origin), Some(BreakerState::Open));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(reg.state(&origin), Some(BreakerState::HalfOpen));

    // The probe is slow; its hedge is refused rather than becoming a second probe.
    let sent = send(&c, c.get(server.url("/probe"))).await;
    assert_eq!(sent.took, MS(1000));
    assert_eq!(sent.history().len(), 1);
    assert_eq!(sent.body().await, "slow");
    assert_eq!(server.requests_seen(), 2);
    // The refused hedge's slot was given back with its permit.
    assert_eq!(reg.snapshot()[0].probes_in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn each_hedged_copy_has_its_own_attempt_timeout_and_each_cut_is_a_breaker_failure() {
    let server = FaultServer::always(Action::Stall).await;
    let reg = registry(100);
    let c = client(
        exact_retry()
            .max_retries(1)
            .attempt_timeout(MS(150))
            .hedging(Hedging::fixed(MS(100)).no_budget())
            .build()
            .unwrap(),
        &reg,
    );
    let sent = send(&c, c.get(server.url("/"))).await;
    // Copies at 0 and 100 ms, cut at 150 and 250 ms; the retry after 1 s has no hedge
    // left and is cut at 1.4 s.
    assert_eq!(sent.took, MS(250 + 1000 + 150));
    assert_eq!(server.requests_seen(), 3);
    let got: Vec<_> = sent
        .history()
        .attempts()
        .iter()
        .map(|r| {
            (
                r.evidence.attempt,
                r.evidence.failure,
                r.evidence.elapsed,
                r.decision.clone(),
            )
        })
        .collect();
    let timeout = Some(FailureKind::Timeout);
    assert_eq!(
        got,
        [
            (
                1,
                timeout,
                MS(150),
                Some(AttemptDecision::Superseded { by: 2 })
            ),
            (
                2,
                timeout,
                MS(150),
                Some(AttemptDecision::Retry {
                    delay: Duration::from_secs(1),
                    reason: RetryReason::Transient
                })
            ),
            (
                3,
                timeout,
                MS(150),
                Some(AttemptDecision::Stop {
                    reason: StopReason::RetriesExhausted
                })
            ),
        ]
    );
    assert_eq!(
        reg.snapshot()[0].consecutive_failures,
        3,
        "every cut counted once"
    );
}

fn limited_client(
    retry: RetryMiddleware,
    registry: &BreakerRegistry,
    limits: &reqwest_resilience::limit::LimiterRegistry,
) -> ClientWithMiddleware {
    ClientBuilder::new(loopback_client())
        .with(retry)
        .with(CircuitBreakerMiddleware::new(registry.clone()))
        .with(reqwest_resilience::limit::ConcurrencyLimit::new(
            limits.clone(),
        ))
        .with(TransportEvidence::new())
        .build()
}

#[tokio::test(start_paused = true)]
async fn a_hedge_refused_by_the_limiter_leaves_the_race_to_the_first_copy() {
    use reqwest_resilience::limit::{LimiterConfig, LimiterRegistry};
    let server = FaultServer::always(slow(300, "first")).await;
    let reg = registry(5);
    let limits = LimiterRegistry::new(LimiterConfig::fixed(1)).unwrap();
    // One hedge per request: what is refunded shows in `remaining`.
    let budget = RetryBudget::new(Duration::from_secs(10), 0, 1.0).unwrap();
    let c = limited_client(
        exact_retry()
            .hedging(Hedging::fixed(MS(50)).budget(budget.clone()))
            .build()
            .unwrap(),
        &reg,
        &limits,
    );

    let sent = send(&c, c.get(server.url("/slow"))).await;
    // The hedge at 50 ms found the only permit taken: it sent nothing, so the first
    // copy, not the limiter's refusal, is the answer.
    assert_eq!(sent.took, MS(300));
    assert_eq!(sent.history().len(), 1);
    answered(&sent.history().attempts()[0], 1, MS(300));
    assert_eq!(sent.outcome().attempts, 1);
    assert_eq!(sent.body().await, "first");
    assert_eq!(server.requests_seen(), 1);
    assert_eq!(
        server.closed_by_client(),
        0,
        "the first copy was not cancelled"
    );
    assert_eq!(
        budget.remaining(),
        1,
        "the refused hedge's withdrawal is refunded"
    );

    // The same through the composed stack.
    let budget = RetryBudget::new(Duration::from_secs(10), 0, 1.0).unwrap();
    let c = Resilience::new()
        .breaker(reg.clone())
        .concurrency_limit(LimiterConfig::fixed(1))
        .retry(RetryMiddleware::builder().hedging(Hedging::fixed(MS(50)).budget(budget.clone())))
        .build(loopback_client())
        .unwrap();
    let sent = send(&c, c.get(server.url("/slow"))).await;
    assert_eq!((sent.took, sent.history().len()), (MS(300), 1));
    answered(&sent.history().attempts()[0], 1, MS(300));
    assert_eq!(sent.body().await, "first");
    assert_eq!(server.requests_seen(), 2);
    assert_eq!(server.closed_by_client(), 0);
    assert_eq!(budget.remaining(), 1);
}

#[tokio::test(start_paused = true)]
async fn concurrent_gets_at_the_limit_all_succeed_and_their_refused_hedges_are_refunded() {
    use reqwest_resilience::limit::{LimiterConfig, LimiterRegistry};
    const N: usize = 4;
    let server = FaultServer::always(slow(300, "first")).await;
    let reg = registry(5);
    let limits = LimiterRegistry::new(LimiterConfig::fixed(N as u32)).unwrap();
    let budget = RetryBudget::new(Duration::from_secs(10), 0, 1.0).unwrap();
    let c = limited_client(
        exact_retry()
            .hedging(Hedging::fixed(MS(50)).budget(budget.clone()))
            .build()
            .unwrap(),
        &reg,
        &limits,
    );

    let runs = (0..N).map(|i| {
        let c = c.clone();
        let url = server.url(&format!("/slow/{i}"));
        async move { send(&c, c.get(url)).await }
    });
    let all = futures_util::future::join_all(runs).await;
    for sent in all {
        assert_eq!(sent.took, MS(300));
        assert_eq!(sent.history().len(), 1);
        assert_eq!(sent.outcome().attempts, 1);
        assert_eq!(sent.body().await, "first");
    }
    assert_eq!(server.requests_seen(), N);
    // Every hedge was refused and refunded: the next N requests can each send one.
    assert_eq!(budget.remaining(), N as u64);
}

/// A server that implements concurrent-duplicate detection as real ones do: a request
/// arriving while an identical one (method, path, and `Idempotency-Key`) is still being
/// processed (300 ms) is answered at once with `conflict` (409 for a keyed POST, 404
/// for a DELETE whose original is deleting, 412 for a conditional PUT whose original is
/// changing the validator); otherwise the request is processed and answered 200.
async fn duplicate_detecting() -> FaultServer {
    let busy: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    FaultServer::start(move |_, req: &RecordedRequest| {
        let key = format!(
            "{} {} {:?}",
            req.method,
            req.path,
            req.header("idempotency-key")
        );
        let now = Instant::now();
        let mut busy = busy.lock().unwrap();
        if busy.get(&key).is_some_and(|until| now < *until) {
            return match req.method.as_str() {
                "DELETE" => Action::status(404),
                "PUT" => Action::status(412),
                _ => Action::status(409),
            };
        }
        busy.insert(key, now + MS(300));
        Action::Delay(MS(300), Box::new(Action::ok("processed")))
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn by_default_put_delete_and_keyed_or_marked_posts_are_not_hedged() {
    use reqwest_resilience::retry::Idempotent;
    let server = duplicate_detecting().await;
    let reg = registry(5);
    let c = client(
        exact_retry()
            .hedging(Hedging::fixed(MS(50)).no_budget())
            .build()
            .unwrap(),
        &reg,
    );

    let requests = [
        (
            c.post(server.url("/pay"))
                .header("idempotency-key", "k-1")
                .body("x"),
            None,
        ),
        (
            c.post(server.url("/jobs")).body("x"),
            Some(Idempotent(true)),
        ),
        (c.delete(server.url("/doc/1")), None),
        (
            c.put(server.url("/doc/2"))
                .header("if-match", "\"v1\"")
                .body("new"),
            None,
        ),
    ];
    for (i, (req, marker)) in requests.into_iter().enumerate() {
        let mut ext = Extensions::new();
        if let Some(m) = marker {
            ext.insert(m);
        }
        let sent = send_with(&c, req, ext).await;
        assert_eq!(sent.took, MS(300), "request {i}");
        assert_eq!(sent.history().len(), 1, "request {i}");
        answered(&sent.history().attempts()[0], 1, MS(300));
        assert_eq!(sent.body().await, "processed", "request {i}");
        assert_eq!(server.requests_seen(), i + 1, "each seen exactly once");
    }
}

#[tokio::test(start_paused = true)]
async fn put_and_delete_are_hedged_on_opt_in_a_key_alone_never() {
    use reqwest_resilience::retry::{Hedge, Idempotent};
    let server = first_slow(slow(5000, "slow"), fast(10, "fast")).await;
    let reg = registry(5);
    let c = client(
        exact_retry()
            .hedging(Hedging::fixed(MS(100)).hedge_idempotent(true).no_budget())
            .build()
            .unwrap(),
        &reg,
    );
    let mut marked = Extensions::new();
    marked.insert(Idempotent(true));
    let hedged = [
        (c.put(server.url("/doc/1")).body("new"), Extensions::new()),
        (c.delete(server.url("/doc/2")), Extensions::new()),
        (c.post(server.url("/jobs/1")).body("x"), marked),
    ];
    for (i, (req, ext)) in hedged.into_iter().enumerate() {
        let sent = send_with(&c, req, ext).await;
        assert_eq!(sent.took, MS(110), "request {i}");
        assert_eq!(sent.history().len(), 2, "request {i}");
        assert_eq!(sent.body().await, "fast");
        assert_eq!(server.requests_seen(), 2 * (i + 1));
    }
    // An idempotency key alone is no opt-in, whatever the setting.
    let sent = send(
        &c,
        c.post(server.url("/pay"))
            .header("idempotency-key", "k-1")
            .body("x"),
    )
    .await;
    assert_eq!((sent.took, sent.history().len()), (MS(5000), 1));
    assert_eq!(server.requests_seen(), 7);

    // Per request, on a default `Hedging`: `Hedge(true)` opts a DELETE in, `Hedge(false)`
    // a GET out, and `Hedge(true)` never makes a plain POST hedgeable.
    let c = client(
        exact_retry()
            .hedging(Hedging::fixed(MS(100)).no_budget())
            .build()
            .unwrap(),
        &reg,
    );
    let with = |hedge: bool| {
        let mut ext = Extensions::new();
        ext.insert(Hedge(hedge));
        ext
    };
    let sent = send_with(&c, c.delete(server.url("/doc/3")), with(true)).await;
    assert_eq!((sent.took, sent.history().len()), (MS(110), 2));
    assert_eq!(server.requests_seen(), 9);
    let sent = send_with(&c, c.get(server.url("/doc/4")), with(false)).await;
    assert_eq!((sent.took, sent.history().len()), (MS(5000), 1));
    assert_eq!(server.requests_seen(), 10);
    let sent = send_with(&c, c.post(server.url("/pay/2")).body("x"), with(true)).await;
    assert_eq!((sent.took, sent.history().len()), (MS(5000), 1));
    assert_eq!(server.requests_seen(), 11);
}

#[tokio::test(start_paused = true)]
async fn fast_error_answers_do_not_pull_the_adaptive_delay_down() {
    let seen_slow = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = seen_slow.clone();
    let server = FaultServer::start(move |_, req: &RecordedRequest| {
        if req.path.starts_with("/missing") {
            Action::Delay(MS(1), Box::new(Action::status(404)))
        } else if req.path.starts_with("/learn") {
            Action::DelayUnlessClosed(MS(200), Box::new(Action::ok("learned")))
        } else {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Action::DelayUnlessClosed(MS(100), Box::new(Action::ok("slow")))
        }
    })
    .await;
    let reg = registry(5);
    let hedging = Hedging::adaptive(0.95)
        .delay_bounds(MS(1), MS(1000))
        .no_budget();
    let c = client(
        exact_retry().hedging(hedging.clone()).build().unwrap(),
        &reg,
    );
    let origin = Origin::parse(&server.url("/")).unwrap();

    // 32 answers in 200 ms: the estimate (p95) is 200 ms; none was hedged (the 1 s bound).
    for i in 0..32 {
        let sent = send(&c, c.get(server.url(&format!("/learn/{i}")))).await;
        assert_eq!(sent.history().len(), 1);
    }
    assert_eq!(hedging.current_delay(&origin), MS(200));
    assert_eq!(server.requests_seen(), 32);

    // Many fast 404s, more than a window of them: no sample, the delay stays.
    for i in 0..300 {
        let sent = send(&c, c.get(server.url(&format!("/missing/{i}")))).await;
        assert_eq!(sent.result.as_ref().unwrap().status(), 404);
        assert_eq!(sent.history().len(), 1);
    }
    assert_eq!(hedging.current_delay(&origin), MS(200));
    assert_eq!(server.requests_seen(), 332);

    // The 200 path, answered in 100 ms, is hedged no more than before: not at all.
    for i in 0..10 {
        let sent = send(&c, c.get(server.url(&format!("/slow/{i}")))).await;
        assert_eq!((sent.took, sent.history().len()), (MS(100), 1));
        assert_eq!(sent.body().await, "slow");
    }
    assert_eq!(
        seen_slow.load(std::sync::atomic::Ordering::Relaxed),
        10,
        "each seen exactly once"
    );
}
