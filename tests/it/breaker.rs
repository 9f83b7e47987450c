//! The circuit-breaker middleware against real loopback servers.
//!
//! Most tests pause tokio's clock: the only timers are the breaker's own (open periods
//! pass by `sleep`, which the idle runtime auto-advances) and the clients set no reqwest
//! timeout and no pool idle timer. The concurrency tests run on a multi-thread runtime
//! with the real clock. (The registry's lock-free Closed path raced on threads through
//! its permits is tested in `src/breaker/tests.rs`: the permit API is crate-private.)

use crate::support;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::breaker::{
    BreakerConfig, BreakerRegistry, BreakerState, CircuitBreakerMiddleware, OpenGrowth, Outcome,
    PauseMode, RetryIn, TripPolicy,
};
use reqwest_resilience::retry::Deadline;
use reqwest_resilience::{
    AttemptHistory, FailureKind, Origin, RequestEvidence, ResilienceError, Transmission,
    TransportEvidence,
};
use support::{Action, FaultServer};
use tokio::time::Instant;

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        // No idle-pool timer: with a paused clock it would be the "next timer" tokio jumps to.
        .pool_idle_timeout(None)
        .build()
        .unwrap()
}

fn client(registry: &BreakerRegistry) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest_client())
        .with(CircuitBreakerMiddleware::new(registry.clone()))
        .with(TransportEvidence::new())
        .build()
}

fn registry(config: BreakerConfig) -> BreakerRegistry {
    BreakerRegistry::new(config).unwrap()
}

/// Sends a GET with fresh caller-side extensions, returning both.
async fn get(
    client: &ClientWithMiddleware,
    url: &str,
    extensions: Extensions,
) -> (reqwest_middleware::Result<reqwest::Response>, Extensions) {
    let mut ext = extensions;
    let req = client.get(url).build().unwrap();
    let result = tokio::time::timeout(3600 * S, client.execute_with_extensions(req, &mut ext))
        .await
        .expect("the request finished");
    (result, ext)
}

async fn status(client: &ClientWithMiddleware, url: &str) -> u16 {
    get(client, url, Extensions::new())
        .await
        .0
        .expect("a response")
        .status()
        .as_u16()
}

fn breaker_error(result: &reqwest_middleware::Result<reqwest::Response>) -> &ResilienceError {
    let err = result.as_ref().expect_err("rejected");
    ResilienceError::from_middleware_error(err).expect("a ResilienceError")
}

/// The evidence and "retry in" a rejection leaves, checked to be a local, unsent one.
fn assert_rejected_locally(ext: &Extensions, kind: FailureKind, retry_in: Option<Duration>) {
    let evidence = RequestEvidence::of(ext).expect("evidence");
    assert_eq!(evidence.transmission, Transmission::NotSent);
    assert_eq!(evidence.failure, Some(kind));
    assert_eq!(evidence.retry_after, retry_in);
    assert_eq!(RetryIn::of(ext).map(|r| r.0), retry_in);
    let last = AttemptHistory::of(ext)
        .and_then(|h| h.last())
        .expect("history");
    assert_eq!(&last.evidence, evidence);
}

fn origin(server: &FaultServer) -> Origin {
    Origin::parse(&server.url("/")).unwrap()
}

#[tokio::test(start_paused = true)]
async fn five_503s_trip_the_breaker_and_the_open_breaker_sends_nothing() {
    let server = FaultServer::always(Action::status(503)).await;
    let reg = registry(BreakerConfig::default());
    let c = client(&reg);
    let url = server.url("/down");
    for _ in 0..5 {
        assert_eq!(status(&c, &url).await, 503);
    }
    assert_eq!(reg.state(&origin(&server)), Some(BreakerState::Open));
    let (seen, conns) = (server.requests_seen(), server.connections());
    assert_eq!(seen, 5);
    for _ in 0..100 {
        let (result, ext) = get(&c, &url, Extensions::new()).await;
        match breaker_error(&result) {
            ResilienceError::BreakerOpen {
                origin: o,
                state,
                retry_in,
            } => {
                assert_eq!(o, &origin(&server));
                assert_eq!(*state, BreakerState::Open);
                assert_eq!(*retry_in, Some(30 * S));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_rejected_locally(&ext, FailureKind::BreakerOpen, Some(30 * S));
    }
    // Fail-fast touched no socket: not one more request, not one more connection.
    assert_eq!(server.requests_seen(), seen);
    assert_eq!(server.connections(), conns);
    let snap = reg.snapshot();
    assert_eq!(
        (snap[0].state, snap[0].rejections),
        (BreakerState::Open, 100)
    );
}

#[tokio::test(start_paused = true)]
async fn dying_server_trips_it_fail_fast_makes_no_connection_and_the_probe_closes_it() {
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let first = FaultServer::always(Action::ok("up")).await;
    let port = first.addr().port();
    let url = first.url("/");
    let reg = registry(BreakerConfig::default());
    let c = client(&reg);
    assert_eq!(status(&c, &url).await, 200);
    // The server dies; wait (bounded) until its port refuses connections.
    drop(first);
    let mut refused = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect((ip, port)).await.is_err() {
            refused = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(refused, "the dead server's port still accepts");
    for _ in 0..5 {
        let (result, ext) = get(&c, &url, Extensions::new()).await;
        assert!(matches!(result, Err(reqwest_middleware::Error::Reqwest(_))));
        let e = RequestEvidence::of(&ext).unwrap();
        assert_ne!(e.failure, Some(FailureKind::BreakerOpen));
    }
    let o = Origin::parse(&url).unwrap();
    assert_eq!(reg.state(&o), Some(BreakerState::Open));
    // The server comes back on the same port while the breaker is open.
    let second = FaultServer::try_start_on(ip, port, |_| None, |_, _| Action::ok("back"))
        .await
        .expect("rebind the port");
    for _ in 0..10 {
        let (result, ext) = get(&c, &url, Extensions::new()).await;
        assert!(matches!(
            breaker_error(&result),
            ResilienceError::BreakerOpen { .. }
        ));
        assert_rejected_locally(&ext, FailureKind::BreakerOpen, Some(30 * S));
    }
    assert_eq!((second.connections(), second.requests_seen()), (0, 0));
    tokio::time::sleep(30 * S).await;
    assert_eq!(reg.state(&o), Some(BreakerState::HalfOpen));
    assert_eq!(status(&c, &url).await, 200);
    assert_eq!(reg.state(&o), Some(BreakerState::Closed));
    assert_eq!(status(&c, &url).await, 200);
    assert_eq!(second.requests_seen(), 2);
}

#[tokio::test(start_paused = true)]
async fn failed_probe_reopens_then_a_later_probe_closes_after_recovery() {
    // 5 failures trip it, the first probe fails too, the second probe succeeds.
    let server = FaultServer::start(|i, _| {
        if i < 6 {
            Action::status(500)
        } else {
            Action::ok("ok")
        }
    })
    .await;
    let reg = registry(
        BreakerConfig::default()
            .open_duration(10 * S)
            .open_growth(OpenGrowth::new(2.0, 60 * S)),
    );
    let c = client(&reg);
    let url = server.url("/");
    let o = origin(&server);
    for _ in 0..5 {
        assert_eq!(status(&c, &url).await, 500);
    }
    tokio::time::sleep(10 * S).await;
    assert_eq!(status(&c, &url).await, 500);
    assert_eq!(reg.state(&o), Some(BreakerState::Open));
    // Second trip in a row: the open period grew to 20 s.
    let (result, _) = get(&c, &url, Extensions::new()).await;
    assert_eq!(breaker_error(&result).retry_in(), Some(20 * S));
    tokio::time::sleep(20 * S).await;
    assert_eq!(status(&c, &url).await, 200);
    assert_eq!(reg.state(&o), Some(BreakerState::Closed));
    assert_eq!(server.requests_seen(), 7);
}

#[tokio::test(start_paused = true)]
async fn not_found_and_bad_request_never_trip_the_breaker() {
    let server =
        FaultServer::start(|i, _| Action::status(if i % 2 == 0 { 404 } else { 400 })).await;
    let reg = registry(BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)));
    let c = client(&reg);
    for _ in 0..50 {
        let s = status(&c, &server.url("/missing")).await;
        assert!(s == 404 || s == 400);
    }
    assert_eq!(server.requests_seen(), 50);
    let snap = reg.snapshot();
    assert_eq!(snap.len(), 1);
    assert_eq!(snap[0].state, BreakerState::Closed);
    assert_eq!(snap[0].consecutive_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn clients_sharing_a_registry_share_a_breaker_and_separate_registries_do_not() {
    let server = FaultServer::always(Action::status(502)).await;
    let shared = registry(BreakerConfig::default().policy(TripPolicy::consecutive_failures(3)));
    let (a, b) = (client(&shared), client(&shared.clone()));
    let other = client(&registry(
        BreakerConfig::default().policy(TripPolicy::consecutive_failures(3)),
    ));
    let url = server.url("/");
    for _ in 0..3 {
        assert_eq!(status(&a, &url).await, 502);
    }
    // Client b never sent anything, yet its breaker is the one a tripped.
    let (result, ext) = get(&b, &url, Extensions::new()).await;
    assert!(matches!(
        breaker_error(&result),
        ResilienceError::BreakerOpen { .. }
    ));
    assert_rejected_locally(&ext, FailureKind::BreakerOpen, Some(30 * S));
    assert_eq!(server.requests_seen(), 3);
    // A separate registry has its own, Closed, breaker.
    assert_eq!(status(&other, &url).await, 502);
    assert_eq!(server.requests_seen(), 4);
}

#[tokio::test(start_paused = true)]
async fn failure_ratio_policy_trips_on_half_failures_over_the_window() {
    // Alternating 200 and 503: 50% failures.
    let server = FaultServer::start(|i, _| {
        if i % 2 == 0 {
            Action::ok("ok")
        } else {
            Action::status(503)
        }
    })
    .await;
    let reg = registry(BreakerConfig::default().policy(TripPolicy::failure_ratio(0.5, 10 * S, 10)));
    let c = client(&reg);
    let url = server.url("/");
    for _ in 0..9 {
        status(&c, &url).await;
    }
    assert_eq!(reg.state(&origin(&server)), Some(BreakerState::Closed));
    assert_eq!(status(&c, &url).await, 503);
    assert_eq!(reg.state(&origin(&server)), Some(BreakerState::Open));
    assert_eq!(server.requests_seen(), 10);
}

#[tokio::test(start_paused = true)]
async fn custom_classifier_replaces_the_default() {
    let server = FaultServer::always(Action::status(404)).await;
    let reg = registry(BreakerConfig::default().policy(TripPolicy::consecutive_failures(2)));
    let c = ClientBuilder::new(reqwest_client())
        .with(CircuitBreakerMiddleware::new(reg.clone()).with_classifier(
            |e: Option<&RequestEvidence>, _: &reqwest_middleware::Result<reqwest::Response>| {
                match e.and_then(RequestEvidence::status) {
                    Some(s) if s == 404 => Outcome::Failure,
                    _ => Outcome::Success,
                }
            },
        ))
        .with(TransportEvidence::new())
        .build();
    let url = server.url("/");
    assert_eq!(status(&c, &url).await, 404);
    assert_eq!(status(&c, &url).await, 404);
    assert_eq!(reg.state(&origin(&server)), Some(BreakerState::Open));
}

#[tokio::test(start_paused = true)]
async fn without_transport_evidence_the_result_is_classified() {
    let server = FaultServer::always(Action::status(503).header("retry-after", "2")).await;
    let reg = registry(BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)));
    let c = ClientBuilder::new(reqwest_client())
        .with(CircuitBreakerMiddleware::new(reg.clone()))
        .build();
    assert_eq!(status(&c, &server.url("/")).await, 503);
    let snap = reg.snapshot();
    assert_eq!(snap[0].state, BreakerState::Open);
    // The Retry-After header was read without the transport step's evidence.
    assert_eq!(snap[0].paused_for, Some(2 * S));
}

#[tokio::test(start_paused = true)]
async fn retry_after_5_on_a_429_stops_every_concurrent_caller_for_5_seconds_then_traffic_resumes() {
    let server = FaultServer::start(|i, _| {
        if i == 0 {
            Action::status(429).header("retry-after", "5")
        } else {
            Action::ok("ok")
        }
    })
    .await;
    let reg = registry(BreakerConfig::default());
    let (a, b) = (client(&reg), client(&reg));
    let url = server.url("/");
    assert_eq!(status(&a, &url).await, 429);
    let paused_at = Instant::now();
    assert_eq!(reg.snapshot()[0].paused_for, Some(5 * S));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let c = if i % 2 == 0 { a.clone() } else { b.clone() };
        let url = url.clone();
        tasks.spawn(async move {
            let s = status(&c, &url).await;
            (s, Instant::now() - paused_at)
        });
    }
    // Half-way through the pause nobody has reached the server.
    tokio::time::sleep(2500 * MS).await;
    assert_eq!(server.requests_seen(), 1);
    let mut done = Vec::new();
    while let Some(r) = tasks.join_next().await {
        done.push(r.unwrap());
    }
    assert_eq!(done.len(), 20);
    for (s, waited) in done {
        assert_eq!(s, 200);
        assert!(waited >= 5 * S, "{waited:?}");
    }
    assert_eq!(server.requests_seen(), 21);
    // The 429 was one failure; the 20 successes reset the count.
    let snap = reg.snapshot();
    assert_eq!(
        (snap[0].state, snap[0].consecutive_failures),
        (BreakerState::Closed, 0)
    );
    assert_eq!(snap[0].paused_for, None);
}

#[tokio::test(start_paused = true)]
async fn fail_fast_pause_rejects_with_not_sent_evidence_and_time_left() {
    let server = FaultServer::start(|i, _| {
        if i == 0 {
            Action::status(503).header("retry-after", "120")
        } else {
            Action::ok("ok")
        }
    })
    .await;
    let reg = registry(
        BreakerConfig::default()
            .pause_mode(PauseMode::FailFast)
            .max_pause(60 * S),
    );
    let c = client(&reg);
    let url = server.url("/");
    assert_eq!(status(&c, &url).await, 503);
    tokio::time::sleep(10 * S).await;
    let (result, ext) = get(&c, &url, Extensions::new()).await;
    // 120 s was clamped to the 60 s cap; 10 s of it have passed.
    match breaker_error(&result) {
        ResilienceError::Paused {
            origin: o,
            retry_in,
        } => {
            assert_eq!(o, &origin(&server));
            assert_eq!(*retry_in, 50 * S);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_rejected_locally(&ext, FailureKind::Paused, Some(50 * S));
    assert_eq!(server.requests_seen(), 1);
    tokio::time::sleep(50 * S).await;
    assert_eq!(status(&c, &url).await, 200);
}

#[tokio::test(start_paused = true)]
async fn waiting_caller_fails_fast_when_the_pause_outlasts_its_deadline() {
    let server = FaultServer::start(|i, _| {
        if i == 0 {
            Action::status(429).header("retry-after", "30")
        } else {
            Action::ok("ok")
        }
    })
    .await;
    let reg = registry(BreakerConfig::default());
    let c = client(&reg);
    let url = server.url("/");
    assert_eq!(status(&c, &url).await, 429);
    let t0 = Instant::now();
    let mut ext = Extensions::new();
    ext.insert(Deadline(t0 + 10 * S));
    let (result, ext) = get(&c, &url, ext).await;
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert_eq!(breaker_error(&result).retry_in(), Some(30 * S));
    assert_rejected_locally(&ext, FailureKind::Paused, Some(30 * S));
    // A deadline past the pause waits it out.
    let mut ext = Extensions::new();
    ext.insert(Deadline(t0 + 40 * S));
    let (result, _) = get(&c, &url, ext).await;
    assert_eq!(result.unwrap().status(), 200);
    // The pause's 30 s, and its share of the 1 s window that spreads the waiters.
    let waited = t0.elapsed();
    assert!((30 * S..=31 * S).contains(&waited), "{waited:?}");
    assert_eq!(server.requests_seen(), 2);
}

#[tokio::test(start_paused = true)]
async fn isolated_origin_is_rejected_without_retry_in_until_reset() {
    let server = FaultServer::always(Action::ok("ok")).await;
    let reg = registry(BreakerConfig::default());
    let c = client(&reg);
    let url = server.url("/");
    assert!(reg.isolate(&origin(&server)));
    let (result, ext) = get(&c, &url, Extensions::new()).await;
    assert!(matches!(
        breaker_error(&result),
        ResilienceError::BreakerOpen {
            state: BreakerState::Isolated,
            retry_in: None,
            ..
        }
    ));
    assert_rejected_locally(&ext, FailureKind::BreakerOpen, None);
    assert_eq!(server.requests_seen(), 0);
    reg.reset(&origin(&server));
    assert_eq!(status(&c, &url).await, 200);
}

#[tokio::test(start_paused = true)]
async fn dropped_probe_releases_its_slot_for_the_next_request() {
    // #0 trips it, #1 (the probe) stalls forever, #2 (the next probe) succeeds.
    let server = FaultServer::start(|i, _| match i {
        0 => Action::status(503),
        1 => Action::Stall,
        _ => Action::ok("ok"),
    })
    .await;
    let reg = registry(
        BreakerConfig::default()
            .policy(TripPolicy::consecutive_failures(1))
            .open_duration(S),
    );
    let c = client(&reg);
    let url = server.url("/");
    let o = origin(&server);
    assert_eq!(status(&c, &url).await, 503);
    tokio::time::sleep(S).await;
    let probe = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { c.get(&url).send().await })
    };
    for _ in 0..1_000 {
        if server.requests_seen() == 2 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(server.requests_seen(), 2, "the probe reached the server");
    assert_eq!(reg.snapshot()[0].probes_in_flight, 1);
    // While the probe holds the only slot, others are turned away.
    let (result, ext) = get(&c, &url, Extensions::new()).await;
    assert!(matches!(
        breaker_error(&result),
        ResilienceError::BreakerOpen {
            state: BreakerState::HalfOpen,
            ..
        }
    ));
    assert_rejected_locally(&ext, FailureKind::BreakerOpen, Some(S));
    probe.abort();
    assert!(probe.await.unwrap_err().is_cancelled());
    assert_eq!(reg.snapshot()[0].probes_in_flight, 0);
    assert_eq!(reg.state(&o), Some(BreakerState::HalfOpen));
    assert_eq!(status(&c, &url).await, 200);
    assert_eq!(reg.state(&o), Some(BreakerState::Closed));
    assert_eq!(server.requests_seen(), 3);
}

/// 1 000 tasks released at once against a HalfOpen breaker on a multi-thread runtime:
/// exactly `probes` requests reach the server, every other task is turned away locally.
/// The server holds each probe's answer (a 503) for 300 ms, so the probes are all in
/// flight together; the failed probe re-opens the breaker for 20 s (growth ×1000), so a
/// task however late can only be rejected. Repeated with 1, 3 and 5 probes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_tasks_on_half_open_breaker_send_exactly_the_permitted_probes() {
    for (round, probes) in [1u32, 3, 5, 1, 3].into_iter().enumerate() {
        let outcome = tokio::time::timeout(30 * S, half_open_round(probes))
            .await
            .expect("round finished");
        assert_eq!(
            outcome,
            (probes as usize, 1_000 - probes as usize),
            "round {round}"
        );
    }
}

async fn half_open_round(probes: u32) -> (usize, usize) {
    let server = FaultServer::start(|i, _| {
        if i == 0 {
            Action::status(503)
        } else {
            Action::Delay(Duration::from_millis(300), Box::new(Action::status(503)))
        }
    })
    .await;
    let reg = registry(
        BreakerConfig::default()
            .policy(TripPolicy::consecutive_failures(1))
            .open_duration(Duration::from_millis(20))
            .half_open_probes(probes)
            .open_growth(OpenGrowth::new(1_000.0, 3600 * S)),
    );
    let c = client(&reg);
    let url = server.url("/");
    assert_eq!(status(&c, &url).await, 503);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let start = Arc::new(tokio::sync::Barrier::new(1_000));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..1_000 {
        let (c, url, start) = (c.clone(), url.clone(), start.clone());
        tasks.spawn(async move {
            start.wait().await;
            c.get(&url).send().await
        });
    }
    let (mut sent, mut rejected) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok(response) => {
                assert_eq!(response.status(), 503);
                sent += 1;
            }
            Err(e) => {
                let err = ResilienceError::from_middleware_error(&e).expect("breaker error");
                assert!(
                    matches!(err, ResilienceError::BreakerOpen { .. }),
                    "{err:?}"
                );
                rejected += 1;
            }
        }
    }
    assert_eq!(server.requests_seen(), 1 + sent);
    let snap = reg.snapshot();
    assert_eq!((snap[0].state, snap[0].trips), (BreakerState::Open, 2));
    assert_eq!(snap[0].rejections, rejected as u64);
    (sent, rejected)
}

fn snapshot(reg: &BreakerRegistry, server: &FaultServer) -> (BreakerState, u32, u32) {
    let snap = reg.snapshot();
    let s = snap
        .iter()
        .find(|s| s.origin == origin(server))
        .expect("a breaker for the origin");
    (s.state, s.consecutive_failures, s.probes_in_flight)
}

fn with_deadline(after: Duration) -> Extensions {
    let mut ext = Extensions::new();
    ext.insert(Deadline(Instant::now() + after));
    ext
}

/// What a deadline cut leaves: tokio's `Elapsed` as the error, and one `Unknown`/`Timeout`
/// record for the attempt.
fn assert_cut_at_deadline(
    result: &reqwest_middleware::Result<reqwest::Response>,
    ext: &Extensions,
    server: &FaultServer,
    elapsed: Duration,
) {
    match result.as_ref().expect_err("cut") {
        reqwest_middleware::Error::Middleware(e) => {
            assert!(e.is::<tokio::time::error::Elapsed>(), "{e:?}")
        }
        other => panic!("not a deadline cut: {other:?}"),
    }
    let evidence = RequestEvidence::of(ext).expect("evidence");
    assert_eq!(evidence.transmission, Transmission::Unknown);
    assert_eq!(evidence.failure, Some(FailureKind::Timeout));
    assert_eq!(evidence.origin, Some(origin(server)));
    assert_eq!(evidence.elapsed, elapsed);
    let history = AttemptHistory::of(ext).expect("history");
    assert_eq!(history.len(), 1);
    assert_eq!(&history.last().unwrap().evidence, evidence);
}

#[tokio::test(start_paused = true)]
async fn an_attempt_hanging_past_its_callers_deadline_is_cut_and_counts_nothing() {
    // Issue 28: the caller's own deadline says nothing about the origin (it counted as a
    // timeout failure before; an attempt timeout still does, see tests/it/attempt_timeout.rs).
    let server = FaultServer::always(Action::Stall).await;
    let reg = registry(BreakerConfig::default().policy(TripPolicy::consecutive_failures(2)));
    let c = client(&reg);
    let url = server.url("/hang");

    let t0 = Instant::now();
    let (result, ext) = get(&c, &url, with_deadline(2 * S)).await;
    assert_eq!(t0.elapsed(), 2 * S);
    assert_cut_at_deadline(&result, &ext, &server, 2 * S);
    assert_eq!(server.requests_seen(), 1);
    assert_eq!(snapshot(&reg, &server), (BreakerState::Closed, 0, 0));

    for n in 2..=5 {
        let (result, ext) = get(&c, &url, with_deadline(3 * S)).await;
        assert_cut_at_deadline(&result, &ext, &server, 3 * S);
        assert_eq!(server.requests_seen(), n);
        assert_eq!(snapshot(&reg, &server), (BreakerState::Closed, 0, 0));
    }
}

#[tokio::test(start_paused = true)]
async fn a_half_open_probe_cut_at_its_deadline_frees_its_slot_and_the_next_probe_closes_it() {
    let server =
        FaultServer::sequence(vec![Action::status(503), Action::Stall], Action::ok("up")).await;
    let reg = registry(BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)));
    let c = client(&reg);
    let url = server.url("/");
    assert_eq!(status(&c, &url).await, 503);
    assert_eq!(reg.state(&origin(&server)), Some(BreakerState::Open));
    tokio::time::sleep(30 * S).await;
    assert_eq!(reg.state(&origin(&server)), Some(BreakerState::HalfOpen));

    // The probe's caller gave it 1 s: cut, neutral, the breaker stays HalfOpen.
    let (result, ext) = get(&c, &url, with_deadline(S)).await;
    assert_cut_at_deadline(&result, &ext, &server, S);
    assert_eq!(server.requests_seen(), 2);
    let (state, _, probes) = snapshot(&reg, &server);
    assert_eq!((state, probes), (BreakerState::HalfOpen, 0));
    assert_eq!(reg.snapshot()[0].trips, 1, "not re-opened");
    // The freed slot admits the next request as the probe; its answer closes it.
    assert_eq!(status(&c, &url).await, 200);
    assert_eq!(server.requests_seen(), 3);
    assert_eq!(reg.state(&origin(&server)), Some(BreakerState::Closed));
}

#[tokio::test(start_paused = true)]
async fn an_attempt_admitted_at_its_deadline_is_cut_without_being_counted() {
    let server = FaultServer::always(Action::Stall).await;
    let reg = registry(BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)));
    let c = client(&reg);
    // The deadline is already due: the server was given no time, so its breaker learns
    // nothing, though the caller still gets the cut.
    let (result, ext) = get(&c, &server.url("/"), with_deadline(Duration::ZERO)).await;
    assert_cut_at_deadline(&result, &ext, &server, Duration::ZERO);
    assert_eq!(snapshot(&reg, &server), (BreakerState::Closed, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn dropped_attempts_in_closed_count_nothing_two_failures_five_drops_two_failures_stay_closed()
{
    // Requests 2..=6 hang; the caller drops them (its own timeout: no Deadline).
    let server = FaultServer::start(|i, _| {
        if (2..7).contains(&i) {
            Action::Stall
        } else {
            Action::status(503)
        }
    })
    .await;
    let reg = registry(BreakerConfig::default().policy(TripPolicy::consecutive_failures(5)));
    let c = client(&reg);
    let url = server.url("/");
    for _ in 0..2 {
        assert_eq!(status(&c, &url).await, 503);
    }
    assert_eq!(snapshot(&reg, &server), (BreakerState::Closed, 2, 0));
    for dropped in 1..=5 {
        let mut ext = Extensions::new();
        let req = c.get(&url).build().unwrap();
        let cancelled = tokio::time::timeout(S, c.execute_with_extensions(req, &mut ext)).await;
        assert!(cancelled.is_err(), "the caller's timeout dropped it");
        assert_eq!(server.requests_seen(), 2 + dropped, "it reached the server");
        assert!(AttemptHistory::of(&ext).is_none_or(|h| h.is_empty()));
        assert_eq!(snapshot(&reg, &server), (BreakerState::Closed, 2, 0));
    }
    for _ in 0..2 {
        assert_eq!(status(&c, &url).await, 503);
    }
    assert_eq!(snapshot(&reg, &server), (BreakerState::Closed, 4, 0));
    // The count is exactly 4: the next failure is the 5th and trips it.
    assert_eq!(status(&c, &url).await, 503);
    assert_eq!(reg.state(&origin(&server)), Some(BreakerState::Open));
    assert_eq!(server.requests_seen(), 10);
}

/// Sends a GET carrying `Deadline(deadline)` and drops it when a timer of the caller's,
/// polled before the request, fires at `drop_at`: what an outer middleware whose own timer
/// is seen first does.
async fn drop_at(c: &ClientWithMiddleware, url: &str, deadline: Instant, drop_at: Instant) {
    let mut ext = Extensions::new();
    ext.insert(Deadline(deadline));
    let req = c.get(url).build().unwrap();
    let request = c.execute_with_extensions(req, &mut ext);
    tokio::select! {
        biased;
        () = tokio::time::sleep_until(drop_at) => {}
        result = request => panic!("the request must still be running: {result:?}"),
    }
    assert!(
        AttemptHistory::of(&ext).is_none_or(|h| h.is_empty()),
        "a dropped attempt leaves no record of its own"
    );
}

#[tokio::test(start_paused = true)]
async fn an_attempt_dropped_by_an_outer_timer_at_its_deadline_counts_nothing() {
    // Issue 28: it counted as a timeout failure before; the deadline is the caller's.
    let server = FaultServer::always(Action::Stall).await;
    let reg = registry(BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)));
    let c = client(&reg);
    let deadline = Instant::now() + 2 * S;
    tokio::time::timeout(10 * S, drop_at(&c, &server.url("/"), deadline, deadline))
        .await
        .expect("dropped at the deadline");
    assert_eq!(Instant::now(), deadline);
    assert_eq!(server.requests_seen(), 1);
    assert_eq!(snapshot(&reg, &server), (BreakerState::Closed, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn an_attempt_dropped_by_its_caller_before_its_deadline_counts_nothing_and_frees_the_probe() {
    // The second request fails; every other one hangs.
    let server = FaultServer::start(|i, _| {
        if i == 1 {
            Action::status(503)
        } else {
            Action::Stall
        }
    })
    .await;
    let reg = registry(BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)));
    let c = client(&reg);
    let url = server.url("/");
    let start = Instant::now();
    // Closed: a request with a deadline in 10 s dropped after 1 s counts nothing.
    tokio::time::timeout(20 * S, drop_at(&c, &url, start + 10 * S, start + S))
        .await
        .expect("dropped by the caller");
    assert_eq!(server.requests_seen(), 1);
    assert_eq!(snapshot(&reg, &server), (BreakerState::Closed, 0, 0));

    // One failure trips it; after the open period a probe dropped early frees its slot.
    assert_eq!(status(&c, &url).await, 503);
    assert_eq!(reg.state(&origin(&server)), Some(BreakerState::Open));
    tokio::time::sleep(30 * S).await;
    let now = Instant::now();
    tokio::time::timeout(20 * S, drop_at(&c, &url, now + 10 * S, now + S))
        .await
        .expect("dropped by the caller");
    assert_eq!(server.requests_seen(), 3);
    let (state, _, probes) = snapshot(&reg, &server);
    assert_eq!((state, probes), (BreakerState::HalfOpen, 0));
    // The freed slot admits the next probe, which reaches the server; its cut at its
    // caller's deadline frees the slot again (issue 28: it re-opened the breaker before).
    let (result, ext) = get(&c, &url, with_deadline(S)).await;
    assert_cut_at_deadline(&result, &ext, &server, S);
    assert_eq!(server.requests_seen(), 4);
    let (state, _, probes) = snapshot(&reg, &server);
    assert_eq!((state, probes), (BreakerState::HalfOpen, 0));
}

/// Stands in for the network and notes the (virtual) instant each request reached it.
struct Stamp(Arc<std::sync::Mutex<Vec<Instant>>>);

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Stamp {
    async fn handle(
        &self,
        _: reqwest::Request,
        _: &mut Extensions,
        _: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.0.lock().unwrap().push(Instant::now());
        Ok(reqwest::Response::from(
            http::Response::builder().status(200).body("").unwrap(),
        ))
    }
}

#[tokio::test(start_paused = true)]
async fn waiters_released_by_the_end_of_a_pause_are_spread_over_a_short_window() {
    // No sockets: the stamps are the instants the breaker let each waiter go, exactly.
    let reg = registry(BreakerConfig::default());
    let origin = Origin::parse("http://127.0.0.1:9").unwrap();
    let stamps = Arc::new(std::sync::Mutex::new(Vec::new()));
    let client = ClientBuilder::new(reqwest_client())
        .with(CircuitBreakerMiddleware::new(reg.clone()))
        .with(Stamp(stamps.clone()))
        .build();
    let start = Instant::now();
    assert_eq!(reg.pause(&origin, 10 * S), 10 * S);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let c = client.clone();
        tasks.spawn(async move {
            c.get("http://127.0.0.1:9/")
                .send()
                .await
                .map(|r| r.status())
        });
    }
    while let Some(r) = tasks.join_next().await {
        assert_eq!(r.unwrap().unwrap(), 200);
    }
    let offsets: Vec<Duration> = stamps.lock().unwrap().iter().map(|t| *t - start).collect();
    assert_eq!(offsets.len(), 100);
    // Nobody before the pause ends; everybody within its 1 s window after it (tokio's
    // timers have a 1 ms resolution: the last share may fire at 11 s itself).
    assert!(
        offsets.iter().all(|d| (10 * S..=11 * S).contains(d)),
        "{offsets:?}"
    );
    // The herd at the pause's end: without the spread all 100 arrive in one instant.
    // Binomial(100, 1/10) per 100 ms: more than 30 in one has odds below 1e-8.
    let mut per_100ms = [0usize; 10];
    for d in &offsets {
        per_100ms[(((*d - 10 * S).as_millis() / 100) as usize).min(9)] += 1;
    }
    let herd = offsets.iter().filter(|d| **d == 10 * S).count();
    assert!(herd <= 1, "{herd} in the instant the pause ended");
    assert!(per_100ms.iter().all(|n| *n <= 30), "{per_100ms:?}");
}

/// A waiting caller is not parked past `max_pause` by pauses that keep being extended (a
/// hostile server answering other callers `429 Retry-After: 1` every 0.9 s): its whole
/// wait is bounded by the cap, then it gets the pause's rejection, unsent.
#[tokio::test(start_paused = true)]
async fn a_waiting_caller_waits_at_most_max_pause_however_often_the_pause_is_extended() {
    let server = FaultServer::always(Action::ok("ok")).await;
    let reg = registry(BreakerConfig::default().max_pause(S));
    let c = client(&reg);
    let o = origin(&server);
    assert_eq!(reg.pause(&o, S), S);
    let extender = tokio::spawn({
        let (reg, o) = (reg.clone(), o.clone());
        async move {
            for _ in 0..20 {
                tokio::time::sleep(900 * MS).await;
                reg.pause(&o, S);
            }
        }
    });
    let t0 = Instant::now();
    let (result, ext) = get(&c, &server.url("/"), Extensions::new()).await;
    assert_eq!(t0.elapsed(), S, "the cap, not the 20 extensions");
    // At 1 s the pause (extended at 0.9 s) has 0.9 s left.
    assert!(matches!(
        breaker_error(&result),
        ResilienceError::Paused { retry_in, .. } if *retry_in == 900 * MS
    ));
    assert_rejected_locally(&ext, FailureKind::Paused, Some(900 * MS));
    assert_eq!(server.requests_seen(), 0);
    extender.abort();
}

/// A server whose latency jumps from 5 ms to 5 s (the measure): the breaker opens
/// on slow calls within its window and the callers after it fail fast, unsent.
#[tokio::test(start_paused = true)]
async fn latency_jump_from_5ms_to_5s_opens_on_slow_calls_and_callers_fail_fast() {
    use reqwest_resilience::breaker::{SlowCalls, TripCause};
    use std::sync::atomic::{AtomicBool, Ordering};
    let slow = Arc::new(AtomicBool::new(false));
    let server = {
        let slow = slow.clone();
        FaultServer::start(move |_, _| {
            let latency = if slow.load(Ordering::SeqCst) {
                5 * S
            } else {
                5 * MS
            };
            Action::Delay(latency, Box::new(Action::ok("ok")))
        })
        .await
    };
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let config = BreakerConfig::default().open_duration(5 * S).slow_calls(
        SlowCalls::new(S)
            .rate(0.5)
            .minimum_throughput(10)
            .sampling_window(10 * S),
    );
    let reg = {
        let events = events.clone();
        BreakerRegistry::with_listener(config, move |e| {
            events.lock().unwrap().push((e.from, e.to, e.cause));
        })
        .unwrap()
    };
    let c = client(&reg);
    let url = server.url("/");
    for _ in 0..20 {
        assert_eq!(status(&c, &url).await, 200);
    }
    let snap = |reg: &BreakerRegistry| {
        let s = reg.snapshot().pop().unwrap();
        (s.state, s.slow_window_calls, s.slow_window_slow)
    };
    assert_eq!(snap(&reg), (BreakerState::Closed, 20, 0));
    slow.store(true, Ordering::SeqCst);
    let jumped = Instant::now();
    // 20 callers at once, each answered in 5 s: the 20th slow call makes 20 of 40 slow.
    let statuses = futures_util::future::join_all((0..20).map(|_| status(&c, &url))).await;
    assert_eq!(statuses, vec![200; 20]);
    assert_eq!(
        snap(&reg),
        (BreakerState::Open, 40, 20),
        "the window that tripped it"
    );
    assert!(
        jumped.elapsed() < 10 * S,
        "opened within its window: {:?}",
        jumped.elapsed()
    );
    assert_eq!(
        *events.lock().unwrap(),
        [(
            BreakerState::Closed,
            BreakerState::Open,
            Some(TripCause::SlowCalls)
        )]
    );
    assert_eq!(server.requests_seen(), 40);
    // The callers after it fail fast: no time passes, nothing is sent.
    let before = Instant::now();
    for _ in 0..10 {
        let (result, ext) = get(&c, &url, Extensions::new()).await;
        assert!(matches!(
            breaker_error(&result),
            ResilienceError::BreakerOpen { .. }
        ));
        assert_rejected_locally(
            &ext,
            FailureKind::BreakerOpen,
            Some(5 * S - before.elapsed()),
        );
    }
    assert_eq!(before.elapsed(), Duration::ZERO);
    assert_eq!(server.requests_seen(), 40);
    // The probe after the open period is still slow: open again, as a slow probe.
    tokio::time::advance(5 * S).await;
    assert_eq!(status(&c, &url).await, 200);
    assert_eq!(server.requests_seen(), 41);
    assert_eq!(snap(&reg).0, BreakerState::Open);
    // The server recovers: the next probe closes it.
    slow.store(false, Ordering::SeqCst);
    tokio::time::advance(5 * S).await;
    assert_eq!(status(&c, &url).await, 200);
    assert_eq!(snap(&reg), (BreakerState::Closed, 0, 0));
    assert_eq!(
        *events.lock().unwrap(),
        [
            (
                BreakerState::Closed,
                BreakerState::Open,
                Some(TripCause::SlowCalls)
            ),
            (BreakerState::Open, BreakerState::HalfOpen, None),
            (
                BreakerState::HalfOpen,
                BreakerState::Open,
                Some(TripCause::ProbeSlow)
            ),
            (BreakerState::Open, BreakerState::HalfOpen, None),
            (BreakerState::HalfOpen, BreakerState::Closed, None),
        ]
    );
    assert_eq!(server.requests_seen(), 42);
}

/// Without `slow_calls`, the same jump trips nothing: existing behaviour unchanged.
#[tokio::test(start_paused = true)]
async fn without_slow_calls_a_5s_server_never_trips() {
    let server = FaultServer::always(Action::Delay(5 * S, Box::new(Action::ok("ok")))).await;
    let reg = registry(BreakerConfig::default());
    let c = client(&reg);
    let url = server.url("/");
    let statuses = futures_util::future::join_all((0..40).map(|_| status(&c, &url))).await;
    assert_eq!(statuses, vec![200; 40]);
    let s = reg.snapshot().pop().unwrap();
    assert_eq!(
        (s.state, s.slow_window_calls, s.slow_window_slow),
        (BreakerState::Closed, 0, 0)
    );
    assert_eq!(server.requests_seen(), 40);
}

/// A slow call is timed from the attempt leaving for the network, not from the breaker's
/// admission: a wait in the concurrency limiter's queue is local and never makes a call
/// slow. Two calls at once through a limit of 1: the second waits 600 ms in the queue,
/// then takes 600 ms; timed from its admission it would be slow (1.2 s > 1 s) and trip the
/// breaker (1 of 2 at a 50 % rate); timed as the transport step measures it, neither is.
#[tokio::test(start_paused = true)]
async fn a_wait_in_the_limiters_queue_never_makes_a_call_slow() {
    use reqwest_resilience::Resilience;
    use reqwest_resilience::breaker::SlowCalls;
    use reqwest_resilience::limit::LimiterConfig;
    let server = FaultServer::always(Action::Delay(600 * MS, Box::new(Action::ok("ok")))).await;
    let reg = registry(
        BreakerConfig::default().slow_calls(
            SlowCalls::new(S)
                .rate(0.5)
                .minimum_throughput(2)
                .sampling_window(10 * S),
        ),
    );
    let client = Resilience::new()
        .no_retry()
        .breaker(reg.clone())
        .concurrency_limit(LimiterConfig::fixed(1).queue(4, 10 * S))
        .build(reqwest_client())
        .unwrap();
    let url = server.url("/");
    let started = Instant::now();
    let (a, b) = tokio::join!(status(&client, &url), status(&client, &url));
    assert_eq!((a, b), (200, 200));
    assert_eq!(started.elapsed(), 1200 * MS, "one after the other");
    let s = reg.snapshot().pop().unwrap();
    assert_eq!(
        (s.state, s.slow_window_calls, s.slow_window_slow),
        (BreakerState::Closed, 2, 0)
    );
    assert_eq!(server.requests_seen(), 2);
}

/// A retry (1 s backoff, no jitter, no budget) outside the breaker, waiting out an open
/// breaker up to `open_breaker_wait` when given.
fn retrying_client(
    registry: &BreakerRegistry,
    open_breaker_wait: Option<Duration>,
) -> ClientWithMiddleware {
    let backoff = reqwest_resilience::Backoff::builder()
        .jitter(reqwest_resilience::Jitter::None)
        .build()
        .unwrap();
    let mut retry = reqwest_resilience::RetryMiddleware::builder()
        .backoff(backoff)
        .no_budget();
    if let Some(wait) = open_breaker_wait {
        retry = retry.wait_for_open_breakers(wait);
    }
    ClientBuilder::new(reqwest_client())
        .with(retry.build().unwrap())
        .with(CircuitBreakerMiddleware::new(registry.clone()))
        .with(TransportEvidence::new())
        .build()
}

/// A server whose first answer is a 500, then 200s; the breaker (one failure trips it, 30 s
/// open) opened by a first request that is not retried.
async fn tripped_by_one_500(
    registry: &BreakerRegistry,
    client: &ClientWithMiddleware,
) -> FaultServer {
    let server = FaultServer::sequence(vec![Action::status(500)], Action::ok("back")).await;
    let mut ext = Extensions::new();
    ext.insert(reqwest_resilience::retry::MaxRetries(0));
    let (result, _) = get(client, &server.url("/"), ext).await;
    assert_eq!(result.unwrap().status(), 500);
    assert_eq!(registry.state(&origin(&server)), Some(BreakerState::Open));
    server
}

fn one_failure_trips() -> BreakerRegistry {
    registry(BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)))
}

/// An open breaker fails fast: the retry outside it does not sleep out the open period
/// (30 s) inside the request; one attempt, no time passes, the breaker's typed error.
#[tokio::test(start_paused = true)]
async fn an_open_breaker_fails_the_request_at_once_under_a_retry() {
    let reg = one_failure_trips();
    let c = retrying_client(&reg, None);
    let server = tripped_by_one_500(&reg, &c).await;

    let started = Instant::now();
    let (result, ext) = get(&c, &server.url("/"), with_deadline(3600 * S)).await;

    assert_eq!(started.elapsed(), Duration::ZERO);
    let err = result.unwrap_err();
    assert!(matches!(
        ResilienceError::find(&err),
        Some(ResilienceError::BreakerOpen { state: BreakerState::Open, retry_in: Some(d), .. })
            if *d == 30 * S
    ));
    let outcome = reqwest_resilience::retry::RetryOutcome::of(&ext).unwrap();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (1, reqwest_resilience::retry::StopReason::BreakerRejected)
    );
    let history = AttemptHistory::of(&ext).unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(
        (
            history.attempts()[0].evidence.transmission,
            history.attempts()[0].evidence.failure
        ),
        (Transmission::NotSent, Some(FailureKind::BreakerOpen))
    );
    assert_eq!(
        server.requests_seen(),
        1,
        "only the request that tripped it"
    );
}

/// With `wait_for_open_breakers` and a deadline the open period fits, the request waits for
/// the breaker's probe and gets the recovered server's answer.
#[tokio::test(start_paused = true)]
async fn with_the_opt_in_an_open_breaker_is_waited_out_within_the_deadline() {
    let reg = one_failure_trips();
    let c = retrying_client(&reg, Some(60 * S));
    let server = tripped_by_one_500(&reg, &c).await;

    let started = Instant::now();
    let (result, ext) = get(&c, &server.url("/"), with_deadline(40 * S)).await;

    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(
        started.elapsed(),
        30 * S,
        "the breaker's remaining open period"
    );
    let outcome = reqwest_resilience::retry::RetryOutcome::of(&ext).unwrap();
    assert_eq!(outcome.attempts, 2);
    let history = AttemptHistory::of(&ext).unwrap();
    assert_eq!(
        history.attempts()[0].evidence.failure,
        Some(FailureKind::BreakerOpen)
    );
    assert_eq!(
        history.attempts()[1].evidence.transmission,
        Transmission::ResponseReceived(http::StatusCode::OK)
    );
    assert_eq!(server.requests_seen(), 2);
    assert_eq!(reg.state(&origin(&server)), Some(BreakerState::Closed));
}

/// With the opt-in but a deadline the open period does not fit (10 s of 30), or an open
/// period longer than the opt-in's bound, the request fails at once.
#[tokio::test(start_paused = true)]
async fn with_the_opt_in_an_open_breaker_past_the_deadline_or_the_bound_fails_at_once() {
    use reqwest_resilience::retry::StopReason;
    for (wait, deadline, stop) in [
        (60 * S, 10 * S, StopReason::DeadlineExceeded),
        (20 * S, 3600 * S, StopReason::BreakerRejected),
    ] {
        let reg = one_failure_trips();
        let c = retrying_client(&reg, Some(wait));
        let server = tripped_by_one_500(&reg, &c).await;

        let started = Instant::now();
        let (result, ext) = get(&c, &server.url("/"), with_deadline(deadline)).await;

        assert_eq!(started.elapsed(), Duration::ZERO);
        let err = result.unwrap_err();
        assert!(matches!(
            ResilienceError::find(&err),
            Some(ResilienceError::BreakerOpen { .. })
        ));
        let outcome = reqwest_resilience::retry::RetryOutcome::of(&ext).unwrap();
        assert_eq!((outcome.attempts, outcome.stop), (1, stop));
        assert_eq!(server.requests_seen(), 1);
    }
}
