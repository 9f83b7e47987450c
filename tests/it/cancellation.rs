//! Cancellation: every middleware's future is dropped at every await point (polled `n`
//! times with a counting no-op waker, then dropped, for `n = 1, 2, …` until it completes
//! within `n` polls), and the next request must behave normally: no stuck HalfOpen probe
//! slot, no stuck token refresh, no budget retry spent that was not taken, no state left
//! in the caller's extensions.
//!
//! Paused clock. The fake transport steps await only the clock, so each poll moves the
//! request one await point further after a fixed clock step.

use crate::support;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use http::{Extensions, StatusCode};
use reqwest::{Request, Response, ResponseBuilderExt};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use reqwest_resilience::breaker::{
    BreakerConfig, BreakerRegistry, BreakerState, CircuitBreakerMiddleware, TripPolicy,
};
use reqwest_resilience::retry::RetryOutcome;
use reqwest_resilience::{
    AccessToken, Backoff, BearerAuth, Jitter, Origin, RequestEvidence, Resilience, RetryBudget,
    RetryMiddleware, TokenManager, Transmission,
};
use support::{Action, FaultServer};

/// The clock step between two polls.
const STEP: Duration = Duration::from_millis(10);
/// No future here needs more polls than this; reaching it is a failure.
const MAX_POLLS: usize = 400;

/// Counts wake-ups, so a test can tell a future that registered interest from one that
/// returned `Pending` with nothing to wake it.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Polls `fut` up to `polls` times, stepping the paused clock (and letting spawned tasks
/// and sockets run) between polls. `Some(output)` if it completed, else it is dropped.
async fn poll_then_drop<F: Future>(fut: F, polls: usize) -> Option<F::Output> {
    let waker_state = Arc::new(CountingWaker::default());
    let waker = Waker::from(waker_state.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    for _ in 0..polls {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Some(out);
        }
        step().await;
    }
    None
}

async fn step() {
    tokio::time::advance(STEP).await;
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Runs `scenario(n)` for `n = 1, 2, …` until the future it drops completes within `n`
/// polls; returns how many cancellation points were exercised.
async fn at_every_await_point<S, Fut>(mut scenario: S) -> usize
where
    S: FnMut(usize) -> Fut,
    Fut: Future<Output = bool>,
{
    for n in 1..=MAX_POLLS {
        if scenario(n).await {
            return n - 1;
        }
    }
    panic!("the request never completed within {MAX_POLLS} polls");
}

/// A fake transport step: `steps` clock sleeps, then the status the script gives for the
/// n-th call (0-based), with matching evidence.
struct FakeTransport {
    steps: u32,
    calls: Arc<AtomicUsize>,
    script: Box<Script>,
}

type Script = dyn Fn(usize, &Request) -> StatusCode + Send + Sync;

#[async_trait::async_trait]
impl Middleware for FakeTransport {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        _next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        for _ in 0..self.steps {
            tokio::time::sleep(STEP).await;
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let status = (self.script)(n, &req);
        RequestEvidence::new(
            Transmission::ResponseReceived(status),
            Origin::from_url(req.url()).ok(),
            1,
        )
        .insert_into(extensions);
        Ok(Response::from(
            http::Response::builder()
                .status(status)
                .url(req.url().clone())
                .body(Vec::<u8>::new())
                .unwrap(),
        ))
    }
}

fn fake(
    steps: u32,
    script: impl Fn(usize, &Request) -> StatusCode + Send + Sync + 'static,
) -> (FakeTransport, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    (
        FakeTransport {
            steps,
            calls: calls.clone(),
            script: Box::new(script),
        },
        calls,
    )
}

const URL: &str = "https://api.example.test/x";

/// Trips `registry`'s breaker of [`URL`] (the configs here trip on one failure) with one
/// `500` through the breaker middleware.
async fn trip(registry: &BreakerRegistry) {
    let (transport, _) = fake(0, |_, _| StatusCode::INTERNAL_SERVER_ERROR);
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(CircuitBreakerMiddleware::new(registry.clone()))
        .with(transport)
        .build();
    assert_eq!(client.get(URL).send().await.unwrap().status(), 500);
    let origin = Origin::parse(URL).unwrap();
    assert_eq!(registry.state(&origin), Some(BreakerState::Open));
}

async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(600), f)
        .await
        .expect("the follow-up request completes")
}

#[tokio::test(start_paused = true)]
async fn dropping_a_half_open_probe_at_every_await_point_frees_the_probe_slot() {
    let origin = Origin::parse(URL).unwrap();
    let points = at_every_await_point(|n| {
        let origin = origin.clone();
        async move {
            let config = BreakerConfig::default()
                .policy(TripPolicy::consecutive_failures(1))
                .open_duration(Duration::from_secs(1));
            let registry = BreakerRegistry::new(config).unwrap();
            trip(&registry).await;
            tokio::time::advance(Duration::from_secs(1)).await;
            assert_eq!(registry.state(&origin), Some(BreakerState::HalfOpen));

            let (transport, calls) = fake(3, |_, _| StatusCode::OK);
            let client = ClientBuilder::new(reqwest::Client::new())
                .with(CircuitBreakerMiddleware::new(registry.clone()))
                .with(transport)
                .build();
            let done = poll_then_drop(client.get(URL).send(), n).await;
            if let Some(result) = done {
                assert_eq!(result.unwrap().status(), 200);
                assert_eq!(registry.state(&origin), Some(BreakerState::Closed));
                return true;
            }
            let snap = registry.snapshot();
            assert_eq!(snap[0].probes_in_flight, 0, "n={n}: the probe slot is free");
            assert_eq!(snap[0].state, BreakerState::HalfOpen, "n={n}");
            // The next request is admitted as the probe and closes the breaker.
            let response = bounded(client.get(URL).send()).await.unwrap();
            assert_eq!(response.status(), 200, "n={n}");
            assert_eq!(registry.state(&origin), Some(BreakerState::Closed), "n={n}");
            assert_eq!(
                calls.load(Ordering::SeqCst),
                1,
                "n={n}: one attempt completed"
            );
            false
        }
    })
    .await;
    assert_eq!(points, 3, "three sleeps in the transport step");
}

fn token_manager(fetches: Arc<AtomicUsize>, fetch_steps: u32) -> TokenManager {
    TokenManager::new(move || {
        let n = fetches.fetch_add(1, Ordering::SeqCst);
        async move {
            for _ in 0..fetch_steps {
                tokio::time::sleep(STEP).await;
            }
            Ok::<_, std::io::Error>(
                AccessToken::new(format!("token-{n}")).expires_in(Duration::from_secs(3600)),
            )
        }
    })
}

#[tokio::test(start_paused = true)]
async fn dropping_a_request_during_its_fetch_401_or_refresh_leaves_no_stuck_refresh() {
    let points = at_every_await_point(|n| async move {
        let fetches = Arc::new(AtomicUsize::new(0));
        let manager = token_manager(fetches.clone(), 3);
        let auth = BearerAuth::builder(manager)
            .origin(Origin::parse(URL).unwrap())
            .build()
            .unwrap();
        // token-0 is rejected; any later token is accepted.
        let (transport, calls) = fake(2, |_, req| {
            match req
                .headers()
                .get("authorization")
                .map(|v| v.to_str().unwrap())
            {
                Some("Bearer token-0") => StatusCode::UNAUTHORIZED,
                Some(_) => StatusCode::OK,
                None => StatusCode::BAD_REQUEST,
            }
        });
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(auth)
            .with(transport)
            .build();
        let done = poll_then_drop(client.get(URL).send(), n).await;
        if let Some(result) = done {
            assert_eq!(result.unwrap().status(), 200);
            assert_eq!(fetches.load(Ordering::SeqCst), 2);
            assert_eq!(calls.load(Ordering::SeqCst), 2);
            return true;
        }
        let response = bounded(client.get(URL).send()).await.unwrap();
        assert_eq!(response.status(), 200, "n={n}");
        // Whatever point the first request was dropped at, token-0 was fetched once and
        // replaced once: never a second fetch in flight, never a stranded one.
        assert_eq!(fetches.load(Ordering::SeqCst), 2, "n={n}");
        false
    })
    .await;
    // fetch (3 sleeps), send (2), refresh (3), replay (2), and one more poll per fetch:
    // the caller wakes after the spawned fetch task has published.
    assert_eq!(points, 12);
}

/// A client whose retry spends `budget`, over a transport that answers from `script`;
/// every await point of the retry loop is a backoff sleep (100 ms, 200 ms, 400 ms).
fn retrying_client(
    budget: &RetryBudget,
    transport: FakeTransport,
    total_deadline: Option<Duration>,
) -> ClientWithMiddleware {
    let mut retry = RetryMiddleware::builder()
        .max_retries(3)
        .backoff(
            Backoff::builder()
                .base(Duration::from_millis(100))
                .jitter(Jitter::None)
                .build()
                .unwrap(),
        )
        .budget(budget.clone());
    if let Some(total) = total_deadline {
        retry = retry.total_deadline(total);
    }
    ClientBuilder::new(reqwest::Client::new())
        .with(retry.build().unwrap())
        .with(transport)
        .build()
}

#[tokio::test(start_paused = true)]
async fn dropping_a_retrying_request_at_every_await_point_leaks_no_budget_token() {
    let points = at_every_await_point(|n| async move {
        // No ratio, a floor of 10 retries in the 10 s window.
        let budget = RetryBudget::new(Duration::from_secs(10), 1, 0.0).unwrap();
        let (transport, calls) = fake(0, |i, _| {
            if i < 3 {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            }
        });
        let client = retrying_client(&budget, transport, None);
        let done = poll_then_drop(client.get(URL).send(), n).await;
        let attempts = calls.load(Ordering::SeqCst);
        if let Some(result) = done {
            assert_eq!(result.unwrap().status(), 200);
            assert_eq!(attempts, 4);
            assert_eq!(budget.remaining(), 10 - 3);
            return true;
        }
        // Dropped during the backoff after attempt `attempts`: the retry it had taken
        // from the budget was never made, so it is back; only the retries made count.
        assert_eq!(budget.remaining(), 10 - (attempts as u64 - 1), "n={n}");
        false
    })
    .await;
    // Sleeps of 100 + 200 + 400 ms in 10 ms steps.
    assert_eq!(points, 70);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_request_leaves_no_stale_deadline_in_the_callers_extensions() {
    let budget = RetryBudget::new(Duration::from_secs(10), 10, 0.0).unwrap();
    let (transport, calls) = fake(0, |i, _| {
        if i == 0 || i % 3 != 0 {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        }
    });
    let client = retrying_client(&budget, transport, Some(Duration::from_secs(60)));
    let mut extensions = Extensions::new();
    let request = client.get(URL).build().unwrap();
    // Dropped in its first backoff sleep.
    let done = poll_then_drop(client.execute_with_extensions(request, &mut extensions), 2).await;
    assert!(done.is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Long after that request's deadline, the caller sends another with the same
    // extensions: it gets its own 60 s, so its two backoffs fit.
    tokio::time::advance(Duration::from_secs(120)).await;
    let request = client.get(URL).build().unwrap();
    let response = bounded(client.execute_with_extensions(request, &mut extensions))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(RetryOutcome::of(&extensions).unwrap().attempts, 3);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_left_by_a_dropped_request_is_not_read_by_a_breaker_used_alone() {
    let budget = RetryBudget::new(Duration::from_secs(10), 10, 0.0).unwrap();
    let (transport, _) = fake(0, |_, _| StatusCode::SERVICE_UNAVAILABLE);
    let retrying = retrying_client(&budget, transport, Some(Duration::from_secs(60)));
    let mut extensions = Extensions::new();
    let request = retrying.get(URL).build().unwrap();
    // Dropped in its first backoff sleep: the deadline it handed inward stays behind.
    let done = poll_then_drop(
        retrying.execute_with_extensions(request, &mut extensions),
        2,
    )
    .await;
    assert!(done.is_none());
    tokio::time::advance(Duration::from_secs(120)).await;

    // The same extensions through a client with only a breaker: the stale deadline (long
    // past) would cut its attempt at once, uncounted, without the server seeing it.
    let registry = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let (transport, calls) = fake(1, |_, _| StatusCode::OK);
    let breaker_only = ClientBuilder::new(reqwest::Client::new())
        .with(CircuitBreakerMiddleware::new(registry.clone()))
        .with(transport)
        .build();
    let request = breaker_only.get(URL).build().unwrap();
    let response = bounded(breaker_only.execute_with_extensions(request, &mut extensions))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(
        extensions
            .get::<reqwest_resilience::retry::Deadline>()
            .is_none()
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_a_full_stack_request_over_loopback_at_every_await_point_then_the_next_succeeds() {
    let server = FaultServer::always(Action::Delay(
        Duration::from_millis(30),
        Box::new(Action::ok("fine")),
    ))
    .await;
    let origin = Origin::parse(&server.url("/")).unwrap();
    let fetches = Arc::new(AtomicUsize::new(0));
    let manager = token_manager(fetches.clone(), 2);
    let auth = BearerAuth::builder(manager)
        .origin(origin.clone())
        .allow_http_on_loopback()
        .build()
        .unwrap();
    let registry = BreakerRegistry::default();
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .build()
        .unwrap();
    let client = Resilience::new()
        .breaker(registry.clone())
        .bearer(auth)
        .build(http)
        .unwrap();
    let url = server.url("/x");
    let completed_sends = AtomicUsize::new(0);
    let points = at_every_await_point(|n| {
        let (client, url, registry, origin) = (&client, &url, &registry, &origin);
        let completed = &completed_sends;
        async move {
            let done = poll_then_drop(client.get(url.as_str()).send(), n).await;
            if let Some(result) = done {
                assert_eq!(result.unwrap().status(), 200);
                return true;
            }
            let response = bounded(client.get(url.as_str()).send()).await.unwrap();
            assert_eq!(response.status(), 200, "n={n}");
            assert_eq!(response.text().await.unwrap(), "fine");
            completed.fetch_add(1, Ordering::SeqCst);
            let snap = registry.snapshot();
            assert_eq!(snap.len(), 1);
            assert_eq!(&snap[0].origin, origin);
            assert_eq!(snap[0].state, BreakerState::Closed, "n={n}");
            assert_eq!(snap[0].probes_in_flight, 0);
            assert_eq!(
                snap[0].consecutive_failures, 0,
                "n={n}: a drop is no failure"
            );
            false
        }
    })
    .await;
    assert!(
        points >= 4,
        "the token fetch and the server delay are await points"
    );
    assert_eq!(completed_sends.load(Ordering::SeqCst), points);
    // One token for the whole run: no drop stranded or repeated a fetch.
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    // Every dropped request may have reached the server; every follow-up did.
    assert!(server.requests_seen() > points);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_composed_stack_request_during_its_401_replay_frees_the_probe_and_strands_no_refresh()
 {
    // The whole stack as one middleware: the retry's copy of the request is what
    // `BearerAuth` replays, so a drop while the replay waits for its token (or is on the
    // wire) must leave the breaker's probe slot, the token manager and the next request as
    // a drop anywhere else does.
    let origin = Origin::parse(URL).unwrap();
    let points = at_every_await_point(|n| {
        let origin = origin.clone();
        async move {
            let fetches = Arc::new(AtomicUsize::new(0));
            let auth = BearerAuth::builder(token_manager(fetches.clone(), 2))
                .origin(origin.clone())
                .build()
                .unwrap();
            let config = BreakerConfig::default()
                .policy(TripPolicy::consecutive_failures(1))
                .open_duration(Duration::from_secs(1));
            let registry = BreakerRegistry::new(config).unwrap();
            trip(&registry).await;
            tokio::time::advance(Duration::from_secs(1)).await;
            assert_eq!(registry.state(&origin), Some(BreakerState::HalfOpen));
            // token-0 is rejected; any later token is accepted.
            let (transport, calls) = fake(2, |_, req| {
                match req
                    .headers()
                    .get("authorization")
                    .map(|v| v.to_str().unwrap())
                {
                    Some("Bearer token-0") => StatusCode::UNAUTHORIZED,
                    Some(_) => StatusCode::OK,
                    None => StatusCode::BAD_REQUEST,
                }
            });
            let client = Resilience::new()
                .breaker(registry.clone())
                .bearer(auth)
                .install(reqwest_middleware::ClientBuilder::new(
                    reqwest::Client::new(),
                ))
                .unwrap()
                .inside_transport_step()
                .with(transport)
                .build();
            let post = || client.post(URL).body("amount=5").send();
            let done = poll_then_drop(post(), n).await;
            if let Some(result) = done {
                assert_eq!(result.unwrap().status(), 200);
                assert_eq!(fetches.load(Ordering::SeqCst), 2);
                assert_eq!(calls.load(Ordering::SeqCst), 2, "the 401 and its replay");
                assert_eq!(registry.state(&origin), Some(BreakerState::Closed));
                return true;
            }
            let snap = registry.snapshot();
            assert_eq!(snap[0].probes_in_flight, 0, "n={n}: the probe slot is free");
            assert_eq!(
                snap[0].state,
                BreakerState::HalfOpen,
                "n={n}: a drop is no outcome"
            );
            let response = bounded(post()).await.unwrap();
            assert_eq!(response.status(), 200, "n={n}");
            assert_eq!(registry.state(&origin), Some(BreakerState::Closed), "n={n}");
            // token-0 fetched once and replaced once, whatever the drop interrupted.
            assert_eq!(fetches.load(Ordering::SeqCst), 2, "n={n}");
            false
        }
    })
    .await;
    // fetch (2 sleeps), send (2), refresh (2), replay (2), and one more poll per fetch.
    assert_eq!(points, 10);
}
