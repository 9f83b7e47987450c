//! Rate-limit fields against real loopback servers: as server-directed pauses shared by
//! every client of a breaker registry, and as the rate of the client-side rate limit
//! (`rate::RateLimit`), set by hand or learned.
//!
//! The tests pause tokio's clock (the servers stamp each request with it); the clients
//! keep no idle pool, whose timer a paused clock would jump to. The race test runs on a
//! multi-thread runtime with the real clock and a rate that cannot refill during it.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::RetryMiddleware;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, CircuitBreakerMiddleware};
use reqwest_resilience::rate::{Rate, RateLimit, RateLimitConfig, RateLimitRegistry};
use reqwest_resilience::retry::{Deadline, StopReason};
use reqwest_resilience::{
    AttemptHistory, FailureKind, Origin, RequestEvidence, Resilience, ResilienceError,
    Transmission, TransportEvidence,
};
use support::{Action, FaultServer, loopback_client};
use tokio::time::Instant;

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn breaker_client(registry: &BreakerRegistry) -> ClientWithMiddleware {
    ClientBuilder::new(loopback_client())
        .with(CircuitBreakerMiddleware::new(registry.clone()))
        .with(TransportEvidence::new())
        .build()
}

fn rate_client(registry: &RateLimitRegistry) -> ClientWithMiddleware {
    ClientBuilder::new(loopback_client())
        .with(RateLimit::new(registry.clone()))
        .with(TransportEvidence::new())
        .build()
}

async fn get(
    client: &ClientWithMiddleware,
    url: &str,
) -> (reqwest_middleware::Result<reqwest::Response>, Extensions) {
    let mut ext = Extensions::new();
    let req = client.get(url).build().unwrap();
    let result = tokio::time::timeout(3600 * S, client.execute_with_extensions(req, &mut ext))
        .await
        .expect("the request finished");
    (result, ext)
}

async fn status(client: &ClientWithMiddleware, url: &str) -> u16 {
    get(client, url)
        .await
        .0
        .expect("a response")
        .status()
        .as_u16()
}

fn origin(server: &FaultServer) -> Origin {
    Origin::parse(&server.url("/")).unwrap()
}

/// The pause the registry holds for the server's origin.
fn paused_for(registry: &BreakerRegistry) -> Option<Duration> {
    registry.snapshot().first().and_then(|b| b.paused_for)
}

/// A server answering its first request with `first`, every other one `200`.
async fn first_then_ok(first: Action) -> FaultServer {
    FaultServer::sequence(vec![first], Action::ok("ok")).await
}

#[tokio::test(start_paused = true)]
async fn github_remaining_0_on_a_200_pauses_the_origin_for_every_client_of_the_registry() {
    // `X-RateLimit-Reset` is a Unix time: 30 s from the answer on the system clock (whole
    // seconds, so the pause is between 29 and 30 s, less the real time the answer takes
    // to be read on a loaded machine).
    let server = FaultServer::start(|i, _| {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        match i {
            0 => Action::ok("last one")
                .header("x-ratelimit-limit", "5000")
                .header("x-ratelimit-remaining", "0")
                .header("x-ratelimit-reset", &(now.as_secs() + 30).to_string()),
            _ => Action::ok("ok"),
        }
    })
    .await;
    let reg = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let (a, b) = (breaker_client(&reg), breaker_client(&reg));
    let url = server.url("/repos");
    assert_eq!(status(&a, &url).await, 200);
    let pause = paused_for(&reg).expect("paused");
    assert!((28 * S..=30 * S).contains(&pause), "{pause:?}");
    let paused_at = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..10 {
        let c = if i % 2 == 0 { a.clone() } else { b.clone() };
        let url = url.clone();
        tasks.spawn(async move { (status(&c, &url).await, Instant::now() - paused_at) });
    }
    tokio::time::sleep(27 * S).await;
    assert_eq!(
        server.requests_seen(),
        1,
        "nobody reached the server in the pause"
    );
    let done = tasks.join_all().await;
    assert_eq!(done.len(), 10);
    for (s, waited) in done {
        assert_eq!(s, 200);
        assert!(waited >= pause, "{waited:?}");
    }
    assert_eq!(server.requests_seen(), 11);
    assert_eq!(paused_for(&reg), None);
}

#[tokio::test(start_paused = true)]
async fn ietf_ratelimit_r0_pauses_for_t_seconds_capped_like_retry_after() {
    let server = first_then_ok(
        Action::status(429)
            .header("ratelimit-policy", r#""default";q=100;w=60"#)
            .header("ratelimit", r#""default";r=0;t=30"#),
    )
    .await;
    let reg = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let c = breaker_client(&reg);
    assert_eq!(status(&c, &server.url("/")).await, 429);
    assert_eq!(paused_for(&reg), Some(30 * S));
    // An hour is capped at max_pause (60 s by default, the cap of Retry-After).
    let server = first_then_ok(Action::status(429).header("ratelimit", r#""d";r=0;t=3600"#)).await;
    assert_eq!(status(&c, &server.url("/")).await, 429);
    let snap = reg.snapshot();
    let other = snap.iter().find(|b| b.origin == origin(&server)).unwrap();
    assert_eq!(other.paused_for, Some(60 * S));
    // The longer of Retry-After and the rate-limit fields wins.
    let server = first_then_ok(
        Action::status(503)
            .header("retry-after", "5")
            .header("ratelimit-remaining", "0")
            .header("ratelimit-reset", "9"),
    )
    .await;
    assert_eq!(status(&c, &server.url("/")).await, 503);
    let snap = reg.snapshot();
    let third = snap.iter().find(|b| b.origin == origin(&server)).unwrap();
    assert_eq!(third.paused_for, Some(9 * S));
}

#[tokio::test(start_paused = true)]
async fn the_draft_forms_pause_and_something_remaining_does_not() {
    for (headers, pause) in [
        (
            vec![("ratelimit", "limit=10, remaining=0, reset=7")],
            Some(7 * S),
        ),
        (
            vec![("ratelimit-remaining", "0"), ("ratelimit-reset", "4")],
            Some(4 * S),
        ),
        (vec![("ratelimit", r#""default";r=1;t=30"#)], None),
        // Nothing remains but no reset is given: nothing to wait for.
        (vec![("x-ratelimit-remaining", "0")], None),
    ] {
        let mut first = Action::ok("x");
        for (n, v) in &headers {
            first = first.header(n, v);
        }
        let server = first_then_ok(first).await;
        let reg = BreakerRegistry::new(BreakerConfig::default()).unwrap();
        let c = breaker_client(&reg);
        assert_eq!(status(&c, &server.url("/")).await, 200);
        assert_eq!(paused_for(&reg), pause, "{headers:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn malformed_fields_and_pauses_turned_off_pause_nothing() {
    for (value, config) in [
        (r#""default";r=-1;t=30"#, BreakerConfig::default()),
        (r#""default";r=0;t=30s"#, BreakerConfig::default()),
        (
            r#""default";r=0;t=30"#,
            BreakerConfig::default().rate_limit_pauses(false),
        ),
    ] {
        let server = first_then_ok(Action::status(429).header("ratelimit", value)).await;
        let reg = BreakerRegistry::new(config).unwrap();
        let c = breaker_client(&reg);
        let url = server.url("/");
        assert_eq!(status(&c, &url).await, 429);
        assert_eq!(paused_for(&reg), None, "{value}");
        assert_eq!(status(&c, &url).await, 200);
        assert_eq!(server.requests_seen(), 2);
    }
    // An X- field that is not a number: ignored too.
    let server = first_then_ok(
        Action::ok("x")
            .header("x-ratelimit-remaining", "none")
            .header("x-ratelimit-reset", "30"),
    )
    .await;
    let reg = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    assert_eq!(status(&breaker_client(&reg), &server.url("/")).await, 200);
    assert_eq!(paused_for(&reg), None);
}

/// A server that allows `limit` requests in any sliding `window`, answers `429` past it,
/// and stamps every request with tokio's clock.
struct QuotaServer {
    server: FaultServer,
    stamps: Arc<Mutex<Vec<(Instant, u16)>>>,
}

impl QuotaServer {
    async fn start(limit: usize, window: Duration, headers: Vec<(&'static str, String)>) -> Self {
        let stamps: Arc<Mutex<Vec<(Instant, u16)>>> = Arc::default();
        let seen = stamps.clone();
        let server = FaultServer::start(move |_, _| {
            let now = Instant::now();
            let mut seen = seen.lock().unwrap();
            let in_window = seen
                .iter()
                .filter(|(t, s)| *s == 200 && now - *t < window)
                .count();
            let code = if in_window < limit { 200 } else { 429 };
            seen.push((now, code));
            let mut action = Action::status(code);
            for (n, v) in &headers {
                action = action.header(n, v);
            }
            action
        })
        .await;
        QuotaServer { server, stamps }
    }

    fn stamps(&self) -> Vec<(Instant, u16)> {
        self.stamps.lock().unwrap().clone()
    }

    /// The most requests in any window of `window` that starts at a request.
    fn max_in_any(&self, window: Duration) -> usize {
        let stamps = self.stamps();
        stamps
            .iter()
            .map(|(t, _)| {
                stamps
                    .iter()
                    .filter(|(u, _)| *u >= *t && *u - *t < window)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }
}

#[tokio::test(start_paused = true)]
async fn a_server_publishing_10_per_second_sees_at_most_10_a_second_from_100_callers_and_no_429() {
    let quota = QuotaServer::start(10, S, vec![("ratelimit-policy", "10;w=1".into())]).await;
    // Two clients of one registry, through the whole stack (retries on: a 429 would be
    // retried and still be seen by the server).
    let registry = RateLimitRegistry::new(RateLimitConfig::default()).unwrap();
    let build = || {
        Resilience::new()
            .rate_limit(registry.clone())
            .build(loopback_client())
            .unwrap()
    };
    let (a, b) = (build(), build());
    let url = quota.server.url("/items");
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100 {
        let c = if i % 2 == 0 { a.clone() } else { b.clone() };
        let url = url.clone();
        tasks.spawn(async move { status(&c, &url).await });
    }
    let codes = tasks.join_all().await;
    assert_eq!(codes, vec![200; 100]);
    let stamps = quota.stamps();
    assert_eq!(stamps.len(), 100, "one request each, none retried");
    assert_eq!(stamps.iter().filter(|(_, s)| *s == 429).count(), 0);
    assert_eq!(quota.max_in_any(S), 10);
    // The first answer taught the pace: one per 105 ms (the default 5 % headroom) after
    // the probe; the last of the 100 waited 10.4 s (the default max_wait is 30 s).
    let last = stamps.iter().map(|(t, _)| *t).max().unwrap();
    assert_eq!(last - start, 99 * 105 * MS);
    let o = origin(&quota.server);
    assert_eq!(registry.get(&o).unwrap().interval, Some(105 * MS));
    assert_eq!(registry.get(&o).unwrap().rejections, 0);
}

#[tokio::test(start_paused = true)]
async fn remaining_and_reset_hold_the_requests_until_each_reset_then_one_probes() {
    // 5 requests per fixed window of 10 s, announced GitHub-style (with a delta reset,
    // as Reddit sends it).
    let windows: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = windows.clone();
    let t0 = Instant::now();
    let server = FaultServer::start(move |_, _| {
        let now = Instant::now();
        let mut seen = seen.lock().unwrap();
        seen.push(now);
        let window = (now - t0).as_secs() / 10;
        let used = seen
            .iter()
            .filter(|t| (**t - t0).as_secs() / 10 == window)
            .count() as u64;
        let reset = (window + 1) * 10 - (now - t0).as_secs();
        let code = if used <= 5 { 200 } else { 429 };
        Action::status(code)
            .header(
                "x-ratelimit-remaining",
                &5u64.saturating_sub(used).to_string(),
            )
            .header("x-ratelimit-reset", &reset.to_string())
    })
    .await;
    let registry = RateLimitRegistry::new(RateLimitConfig::default().max_wait(60 * S)).unwrap();
    let c = rate_client(&registry);
    let url = server.url("/");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let (c, url) = (c.clone(), url.clone());
        tasks.spawn(async move { status(&c, &url).await });
    }
    assert_eq!(tasks.join_all().await, vec![200; 20]);
    let stamps = windows.lock().unwrap().clone();
    let per_window: Vec<usize> = (0..4)
        .map(|w| {
            stamps
                .iter()
                .filter(|t| (**t - t0).as_secs() / 10 == w)
                .count()
        })
        .collect();
    assert_eq!(per_window, vec![5, 5, 5, 5]);
    assert_eq!(stamps.len(), 20);
}

/// The `NotSent` evidence a rate rejection leaves.
fn assert_rate_limited(ext: &Extensions, retry_in: Duration) {
    let evidence = RequestEvidence::of(ext).expect("evidence");
    assert_eq!(evidence.transmission, Transmission::NotSent);
    assert_eq!(evidence.failure, Some(FailureKind::RateLimited));
    assert_eq!(evidence.retry_after, Some(retry_in));
    let history = AttemptHistory::of(ext).expect("history");
    assert_eq!(history.last().map(|r| &r.evidence), Some(evidence));
}

#[tokio::test(start_paused = true)]
async fn over_the_rate_a_request_is_rejected_not_sent_and_not_retried() {
    let server = FaultServer::always(Action::ok("ok")).await;
    let config = RateLimitConfig::default()
        .learn(false)
        .rate(Rate::per_second(1).burst(1))
        .max_wait(Duration::ZERO);
    // Alone: the typed error and the evidence.
    let registry = RateLimitRegistry::new(config.clone()).unwrap();
    let c = rate_client(&registry);
    let url = server.url("/");
    assert_eq!(status(&c, &url).await, 200);
    let (result, ext) = get(&c, &url).await;
    let err = result.expect_err("rejected");
    assert!(matches!(
        ResilienceError::find(&err),
        Some(ResilienceError::RateLimited { retry_in, origin: o }) if *retry_in == S && *o == origin(&server)
    ));
    assert_rate_limited(&ext, S);
    assert_eq!(server.requests_seen(), 1);
    // In the stack: the retry stops at once (one attempt), the breaker counts nothing.
    let stack = Resilience::new()
        .rate_limit(config)
        .build(loopback_client())
        .unwrap();
    tokio::time::sleep(S).await;
    assert_eq!(status(&stack, &url).await, 200);
    let (result, ext) = get(&stack, &url).await;
    let err = result.expect_err("rejected");
    match ResilienceError::from_middleware_error(&err) {
        Some(ResilienceError::Retry(r)) => {
            assert_eq!(
                (r.attempts(), r.stop_reason()),
                (1, StopReason::RateLimited)
            )
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_rate_limited(&ext, S);
    assert_eq!(server.requests_seen(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_wait_is_bounded_by_the_deadline_and_a_cancelled_wait_gives_its_slot_back() {
    let stamps: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = stamps.clone();
    let server = FaultServer::start(move |_, _| {
        seen.lock().unwrap().push(Instant::now());
        Action::ok("ok")
    })
    .await;
    let registry = RateLimitRegistry::new(
        RateLimitConfig::default()
            .learn(false)
            .rate(Rate::per_second(1).burst(1)),
    )
    .unwrap();
    let c = rate_client(&registry);
    let url = server.url("/");
    let t0 = Instant::now();
    assert_eq!(status(&c, &url).await, 200);
    // The next slot is 1 s away: a deadline in 500 ms turns the request away at once.
    let mut ext = Extensions::new();
    ext.insert(Deadline(t0 + 500 * MS));
    let req = c.get(&url).build().unwrap();
    assert!(c.execute_with_extensions(req, &mut ext).await.is_err());
    assert_eq!(Instant::now(), t0);
    assert_rate_limited(&ext, S);
    // A caller takes the slot at 1 s and gives up at 500 ms: the next caller gets it.
    let (c2, url2) = (c.clone(), url.clone());
    let given_up = tokio::time::timeout(500 * MS, async move { status(&c2, &url2).await }).await;
    assert!(given_up.is_err());
    assert_eq!(status(&c, &url).await, 200);
    let stamps = stamps.lock().unwrap().clone();
    assert_eq!(stamps, vec![t0, t0 + S]);
}

/// A server stamping each request, answering the first with `first` and the rest `200`
/// with `RateLimit-Policy: 2;w=1`.
async fn stamping(first: Action) -> (FaultServer, Arc<Mutex<Vec<Instant>>>) {
    let stamps: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = stamps.clone();
    let server = FaultServer::start(move |i, _| {
        seen.lock().unwrap().push(Instant::now());
        if i == 0 {
            first.clone()
        } else {
            Action::ok("ok").header("ratelimit-policy", "2;w=1")
        }
    })
    .await;
    (server, stamps)
}

async fn three_callers(c: &ClientWithMiddleware, url: &str) -> Vec<Option<u16>> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..3u32 {
        let (c, url) = (c.clone(), url.to_owned());
        tasks.spawn(async move {
            // In this order, a millisecond apart: the first is the origin's probe.
            tokio::time::sleep(i * MS).await;
            get(&c, &url).await.0.ok().map(|r| r.status().as_u16())
        });
    }
    let mut out = tasks.join_all().await;
    out.sort();
    out
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_gets_no_answer_passes_its_turn_to_the_next_request() {
    let (server, stamps) = stamping(Action::ReadThenClose).await;
    let registry = RateLimitRegistry::new(RateLimitConfig::default()).unwrap();
    let c = rate_client(&registry);
    let t0 = Instant::now();
    let outcomes = three_callers(&c, &server.url("/")).await;
    // The probe's connection closed: an error, no answer. The second request (at 1 ms)
    // probed, and its answer taught 2 a second: the third went 525 ms after it (the
    // headroom's 5 %).
    assert_eq!(outcomes, vec![None, Some(200), Some(200)]);
    let stamps: Vec<Duration> = stamps.lock().unwrap().iter().map(|t| *t - t0).collect();
    assert_eq!(stamps, vec![Duration::ZERO, MS, 526 * MS]);
}

#[tokio::test(start_paused = true)]
async fn the_others_wait_for_a_slow_probe_only_up_to_the_probe_wait() {
    let slow = Action::Delay(5 * S, Box::new(Action::ok("slow")));
    let (server, stamps) = stamping(slow).await;
    let registry = RateLimitRegistry::new(RateLimitConfig::default().probe_wait(S)).unwrap();
    let c = rate_client(&registry);
    let t0 = Instant::now();
    let outcomes = three_callers(&c, &server.url("/")).await;
    assert_eq!(outcomes, vec![Some(200), Some(200), Some(200)]);
    // The second (from 1 ms) went after 1 s of waiting, by what was known (nothing),
    // long before the probe's answer at 5 s; its own answer taught 2 a second, so the
    // third (from 2 ms) went 525 ms after it.
    let stamps: Vec<Duration> = stamps.lock().unwrap().iter().map(|t| *t - t0).collect();
    assert_eq!(stamps, vec![Duration::ZERO, S + MS, S + 526 * MS]);
}

#[tokio::test(start_paused = true)]
async fn an_answer_from_another_origin_after_a_redirect_teaches_the_first_nothing() {
    let target =
        FaultServer::always(Action::ok("moved here").header("ratelimit-policy", "1;w=60")).await;
    let moved = target.url("/new");
    let first = FaultServer::always(Action::status(302).header("location", &moved)).await;
    let registry = RateLimitRegistry::new(RateLimitConfig::default()).unwrap();
    let c = rate_client(&registry);
    for _ in 0..3 {
        assert_eq!(status(&c, &first.url("/old")).await, 200);
    }
    // Three requests went at once: the first origin's rate learned no 1-a-minute quota.
    assert_eq!(registry.get(&origin(&first)).unwrap().interval, None);
    assert_eq!((first.requests_seen(), target.requests_seen()), (3, 3));
    // Asked directly, the target's answer teaches its own origin.
    assert_eq!(status(&c, &target.url("/new")).await, 200);
    assert_eq!(
        registry.get(&origin(&target)).unwrap().interval,
        Some(Duration::from_secs(63))
    );
}

#[tokio::test(start_paused = true)]
async fn with_a_concurrency_limit_too_every_attempt_takes_a_slot_and_a_permit() {
    use reqwest_resilience::limit::{LimiterConfig, LimiterRegistry};
    // Two 503s, then 200: three attempts, each through both stages.
    let server = FaultServer::sequence(
        vec![Action::status(503), Action::status(503)],
        Action::ok("ok"),
    )
    .await;
    let rates = RateLimitRegistry::new(
        RateLimitConfig::default()
            .learn(false)
            .rate(Rate::per_second(10).burst(1)),
    )
    .unwrap();
    let limits = LimiterRegistry::new(LimiterConfig::fixed(1)).unwrap();
    let client = Resilience::new()
        .retry(
            RetryMiddleware::builder().backoff(
                reqwest_resilience::Backoff::builder()
                    .base(MS)
                    .jitter(reqwest_resilience::Jitter::None)
                    .build()
                    .unwrap(),
            ),
        )
        .rate_limit(rates.clone())
        .concurrency_limit(limits.clone())
        .build(loopback_client())
        .unwrap();
    let t0 = Instant::now();
    let (result, ext) = get(&client, &server.url("/")).await;
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(AttemptHistory::of(&ext).unwrap().len(), 3);
    // Backoffs of 1 and 2 ms, but slots 100 ms apart: the third attempt left at 200 ms.
    assert_eq!(Instant::now() - t0, 200 * MS);
    assert_eq!(server.requests_seen(), 3);
    let o = origin(&server);
    // The retries waited for their slots (100 ms apart), none was turned away.
    assert_eq!(rates.get(&o).unwrap().rejections, 0);
    assert_eq!(limits.get(&o).unwrap().in_flight, 0);
}

/// Issue 29, finding 11: one answer with a quota of one request per 31 million years
/// (`RateLimit-Policy: 1;w=999999999999999`). Before: every later request was turned away
/// at once, for good, even with `max_server_wait(1s)`. Now: the learned interval is
/// bounded like every server-directed wait, one request per `max_server_wait` (and the
/// 5 % headroom).
#[tokio::test(start_paused = true)]
async fn an_absurd_learned_quota_paces_one_request_per_max_server_wait_and_shuts_nothing() {
    let server =
        FaultServer::always(Action::ok("ok").header("ratelimit-policy", "1;w=999999999999999"))
            .await;
    let registry = RateLimitRegistry::new(RateLimitConfig::default().max_server_wait(S)).unwrap();
    let c = Resilience::new()
        .rate_limit(registry.clone())
        .build(loopback_client())
        .unwrap();
    let url = server.url("/");
    let t0 = Instant::now();
    let mut sent_at = Vec::new();
    for _ in 0..3 {
        let (result, _) = get(&c, &url).await;
        assert_eq!(result.expect("sent, not turned away").status(), 200);
        sent_at.push(Instant::now() - t0);
    }
    // The interval capped at 1 s, then the 5 % headroom.
    assert_eq!(sent_at, [Duration::ZERO, 1050 * MS, 2100 * MS]);
    assert_eq!(server.requests_seen(), 3);
    let snapshot = registry.get(&origin(&server)).unwrap();
    assert_eq!(
        (snapshot.interval, snapshot.rejections),
        (Some(1050 * MS), 0)
    );
    // A caller that may not wait is turned away with the bounded slot, not a far one.
    let (result, ext) = get_within(&c, &url, Duration::ZERO).await;
    assert!(result.is_err());
    assert_rate_limited(&ext, 1050 * MS);
    assert_eq!(server.requests_seen(), 3);
}

/// A request that may wait `max` at most for its slot (its deadline).
async fn get_within(
    client: &ClientWithMiddleware,
    url: &str,
    max: Duration,
) -> (reqwest_middleware::Result<reqwest::Response>, Extensions) {
    let mut ext = Extensions::new();
    ext.insert(Deadline(Instant::now() + max));
    let req = client.get(url).build().unwrap();
    let result = client.execute_with_extensions(req, &mut ext).await;
    (result, ext)
}

/// Issue 29, finding 12: `RateLimitConfig::max_wait(500ms).max_server_wait(1s)` and an
/// answer saying nothing remains for an hour (`RateLimit: "d";r=0;t=3600`). Before: the
/// breaker's rate-limit pause (capped by its own `max_pause`, 60 s) held the next request
/// in the stack. Now: in a stack with a learning rate limit the fields are the rate
/// limit's alone: the origin is held at most `max_server_wait` (1 s), a caller at most
/// `max_wait` (500 ms, here turned away at once), and the breaker pauses nothing.
#[tokio::test(start_paused = true)]
async fn in_the_stack_rate_limit_fields_hold_a_caller_only_within_the_rate_limits_bounds() {
    let server =
        FaultServer::always(Action::ok("ok").header("ratelimit", r#""d";r=0;t=3600"#)).await;
    let breakers = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let registry = RateLimitRegistry::new(
        RateLimitConfig::default()
            .max_wait(500 * MS)
            .max_server_wait(S),
    )
    .unwrap();
    let c = Resilience::new()
        .breaker(breakers.clone())
        .rate_limit(registry.clone())
        .build(loopback_client())
        .unwrap();
    let url = server.url("/");
    assert_eq!(status(&c, &url).await, 200);
    let o = origin(&server);
    assert_eq!(registry.get(&o).unwrap().remaining, Some((0, S)));
    // The reset is 1 s away, past the 500 ms a caller may wait: turned away at once.
    let asked = Instant::now();
    let (result, ext) = get(&c, &url).await;
    assert_eq!(Instant::now() - asked, Duration::ZERO, "held for no time");
    assert_eq!(
        paused_for(&breakers),
        None,
        "the breaker leaves the fields alone"
    );
    let err = result.expect_err("turned away");
    match ResilienceError::from_middleware_error(&err) {
        Some(ResilienceError::Retry(r)) => assert_eq!(
            (r.attempts(), r.stop_reason()),
            (1, StopReason::RateLimited)
        ),
        other => panic!("unexpected {other:?}"),
    }
    assert_rate_limited(&ext, S);
    assert_eq!(server.requests_seen(), 1);
    // At the capped reset one request probes the new window (the hour is not waited).
    tokio::time::sleep(S).await;
    assert_eq!(status(&c, &url).await, 200);
    assert_eq!(server.requests_seen(), 2);
    // A caller allowed to wait past the reset (30 s by default) waits for it, 1 s, and no
    // longer.
    let registry = RateLimitRegistry::new(RateLimitConfig::default().max_server_wait(S)).unwrap();
    let patient = Resilience::new()
        .breaker(breakers.clone())
        .rate_limit(registry)
        .build(loopback_client())
        .unwrap();
    assert_eq!(status(&patient, &url).await, 200);
    let asked = Instant::now();
    assert_eq!(status(&patient, &url).await, 200);
    assert_eq!(Instant::now() - asked, S);
    assert_eq!(server.requests_seen(), 4);
    assert_eq!(paused_for(&breakers), None);
}

/// Issue 29, finding 11, the re-probe: a quota learned from one answer (one a minute) and
/// an hour's reset from an answer that came 50 s late turn every request away; a minute
/// after the first rejection the learned state is forgotten and one request probes the
/// server (before: held until the capped reset, 110 s).
#[tokio::test(start_paused = true)]
async fn a_learned_limit_that_turned_everything_away_for_max_server_wait_is_probed_again() {
    let server = FaultServer::start(|_, req| match req.path.as_str() {
        "/quota" => Action::ok("ok").header("ratelimit-policy", "1;w=60"),
        "/late" => Action::Delay(
            50 * S,
            Box::new(Action::ok("late").header("ratelimit", r#""d";r=0;t=3600"#)),
        ),
        _ => Action::ok("ok"),
    })
    .await;
    let registry = RateLimitRegistry::new(
        RateLimitConfig::default()
            .headroom(0.0)
            .probe_wait(Duration::ZERO)
            .max_wait(Duration::ZERO),
    )
    .unwrap();
    let c = rate_client(&registry);
    let t0 = Instant::now();
    let (quota, late) = (server.url("/quota"), server.url("/late"));
    let (c2, late2) = (c.clone(), late.clone());
    let slow = tokio::spawn(async move { status(&c2, &late2).await });
    assert_eq!(status(&c, &quota).await, 200);
    let o = origin(&server);
    assert_eq!(registry.get(&o).unwrap().interval, Some(60 * S));
    // From 1 s on every request is turned away: first by the pace (its slot at 60 s)...
    tokio::time::sleep_until(t0 + S).await;
    let (result, ext) = get(&c, &server.url("/")).await;
    assert!(result.is_err());
    assert_rate_limited(&ext, 59 * S);
    // ... then by the late answer: nothing remains until 50 s + 60 s (the capped hour).
    assert_eq!(slow.await.unwrap(), 200);
    assert_eq!(Instant::now() - t0, 50 * S);
    tokio::time::sleep_until(t0 + 60 * S).await;
    let (result, ext) = get(&c, &server.url("/")).await;
    assert!(result.is_err());
    assert_rate_limited(&ext, 50 * S);
    assert_eq!(server.requests_seen(), 2);
    // A minute after the first rejection: one request probes, and its answer (no fields)
    // leaves nothing learned.
    tokio::time::sleep_until(t0 + 61 * S).await;
    assert_eq!(status(&c, &server.url("/")).await, 200);
    assert_eq!(server.requests_seen(), 3);
    let snapshot = registry.get(&o).unwrap();
    assert_eq!((snapshot.interval, snapshot.remaining), (None, None));
    assert_eq!(snapshot.rejections, 2);
}

/// In the stack the rate limit's wait is a hook of the attempt, under its cut: a wait for
/// a slot stops the attempt's clock (a 1 s wait does not trip a 200 ms attempt timeout:
/// one attempt, answered), and a caller who gives up while waiting gives its slot back to
/// the next one.
#[tokio::test(start_paused = true)]
async fn in_the_stack_a_wait_for_a_slot_stops_the_attempt_timeout_and_a_dropped_wait_gives_its_slot_back()
 {
    let stamps: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = stamps.clone();
    let server = FaultServer::start(move |_, _| {
        seen.lock().unwrap().push(Instant::now());
        Action::ok("ok")
    })
    .await;
    let registry = RateLimitRegistry::new(
        RateLimitConfig::default()
            .learn(false)
            .rate(Rate::per_second(1).burst(1)),
    )
    .unwrap();
    let c = Resilience::new()
        .retry(RetryMiddleware::builder().attempt_timeout(200 * MS))
        .rate_limit(registry)
        .build(loopback_client())
        .unwrap();
    let url = server.url("/");
    let t0 = Instant::now();
    assert_eq!(status(&c, &url).await, 200);
    // The next slot is 1 s away, past the attempt timeout: waited for, then answered.
    let (result, _) = get(&c, &url).await;
    let response = result.expect("answered after its wait");
    assert_eq!(response.status(), 200);
    assert_eq!(Instant::now() - t0, S);
    let history = AttemptHistory::of_response(&response).expect("recorded");
    assert_eq!(history.len(), 1, "one attempt: the wait was not cut");
    assert_eq!(
        history.attempts()[0].evidence.transmission,
        Transmission::ResponseReceived(http::StatusCode::OK)
    );
    // A caller waits for the slot at 2 s and gives up at 1.5 s: the next caller gets it.
    let (c2, url2) = (c.clone(), url.clone());
    let given_up = tokio::time::timeout(500 * MS, async move { status(&c2, &url2).await }).await;
    assert!(given_up.is_err());
    assert_eq!(status(&c, &url).await, 200);
    assert_eq!(Instant::now() - t0, 2 * S);
    let stamps = stamps.lock().unwrap().clone();
    assert_eq!(stamps, vec![t0, t0 + S, t0 + 2 * S]);
}
