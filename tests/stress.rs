//! Stress: thousands of concurrent logical requests through the full `Resilience` stack
//! (retry → breaker → bearer → transport) against a loopback server that flaps between up,
//! down (resets), `429`, `503`, slow answers and dropped connections, while bearer tokens
//! expire every 100 ms.
//!
//! Per round it asserts: every logical request returns (no deadlock, no lost request,
//! bounded by a timeout); the server executed no POST twice (a POST counts as possibly
//! executed once the server read it and answered 2xx/503 or dropped the connection;
//! `401`/`429` answers are refusals); no HalfOpen probe slot is held once all requests
//! returned; retries stayed within the retry budget; never two token fetches at once.
//!
//! CI runs `stress_small` (500 requests × 3 rounds). The full run is ignored by default:
//!
//! ```text
//! cargo test --release --test stress -- --ignored --nocapture
//! ```
//!
//! (10 000 requests × 100 rounds; `STRESS_ROUNDS` / `STRESS_REQUESTS` override.) Real
//! clock: thousands of sockets and a paused clock do not mix; no assertion reads it.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use reqwest_resilience::RetryMiddleware;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry};
use reqwest_resilience::retry::RetryOutcome;
use reqwest_resilience::{
    AccessToken, Backoff, BearerAuth, Jitter, Origin, Resilience, ResilienceError, RetryBudget,
    TokenManager,
};
use support::{Action, FaultServer, RecordedRequest};

/// What the server does right now; a flapper task changes it every few milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Mode {
    Up,
    Down,
    TooMany,
    Unavailable,
    Slow,
    DropAfterRead,
}

const MODES: [Mode; 6] = [
    Mode::Up,
    Mode::Down,
    Mode::TooMany,
    Mode::Unavailable,
    Mode::Slow,
    Mode::DropAfterRead,
];

/// What the server did with each POST, by request id.
#[derive(Default)]
struct Ledger {
    /// POST id → times possibly executed.
    executed: Mutex<HashMap<u64, u32>>,
}

impl Ledger {
    fn executed(&self, req: &RecordedRequest) {
        if req.method != "POST" {
            return;
        }
        let id: u64 = req.header("x-request-id").unwrap().parse().unwrap();
        *self.executed.lock().unwrap().entry(id).or_default() += 1;
    }
}

/// Bounds attempts on the wire (file descriptors), not logical requests: every logical
/// request is in flight at once, attempts queue here.
struct WireLimit(tokio::sync::Semaphore);

#[async_trait::async_trait]
impl Middleware for WireLimit {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let _permit = self.0.acquire().await.unwrap();
        next.run(req, extensions).await
    }
}

struct Round {
    requests: usize,
    returned: usize,
    ok: usize,
    retries: u64,
    posts_executed_max: u32,
    fetches: usize,
    server_requests: usize,
}

async fn round(requests: usize) -> Round {
    let mode = Arc::new(AtomicU8::new(Mode::Up as u8));
    let generation = Arc::new(AtomicUsize::new(0));
    let ledger = Arc::new(Ledger::default());

    let script = {
        let (mode, generation, ledger) = (mode.clone(), generation.clone(), ledger.clone());
        move |_: usize, req: &RecordedRequest| {
            // A token two refreshes old is expired for the server.
            let token_gen = req
                .header("authorization")
                .and_then(|v| v.strip_prefix("Bearer tok-"))
                .and_then(|g| g.parse::<usize>().ok());
            let latest = generation.load(Ordering::SeqCst);
            if token_gen.is_none_or(|g| g + 2 < latest) {
                return Action::status(401);
            }
            match MODES[usize::from(mode.load(Ordering::SeqCst))] {
                Mode::Up => {
                    ledger.executed(req);
                    Action::ok("done")
                }
                Mode::Slow => {
                    ledger.executed(req);
                    Action::Delay(Duration::from_millis(20), Box::new(Action::ok("slow")))
                }
                Mode::TooMany => Action::status(429).header("retry-after", "0"),
                Mode::Unavailable => {
                    ledger.executed(req);
                    Action::status(503)
                }
                Mode::DropAfterRead => {
                    ledger.executed(req);
                    Action::ReadThenClose
                }
                Mode::Down => {
                    ledger.executed(req);
                    Action::ReadThenReset
                }
            }
        }
    };
    let accept_mode = mode.clone();
    let server = FaultServer::start_with_accept(
        move |_| {
            (MODES[usize::from(accept_mode.load(Ordering::SeqCst))] == Mode::Down)
                .then_some(Action::CloseWithoutReading)
        },
        script,
    )
    .await;
    let origin = Origin::parse(&server.url("/")).unwrap();

    let fetching = Arc::new(AtomicUsize::new(0));
    let max_fetching = Arc::new(AtomicUsize::new(0));
    let manager = {
        let (generation, fetching, max_fetching) =
            (generation.clone(), fetching.clone(), max_fetching.clone());
        TokenManager::builder(move || {
            let (generation, fetching, max_fetching) =
                (generation.clone(), fetching.clone(), max_fetching.clone());
            async move {
                let now = fetching.fetch_add(1, Ordering::SeqCst) + 1;
                max_fetching.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                let g = generation.fetch_add(1, Ordering::SeqCst) + 1;
                fetching.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(
                    AccessToken::new(format!("tok-{g}")).expires_in(Duration::from_millis(100)),
                )
            }
        })
        .failure_backoff(Duration::from_millis(5), Duration::from_millis(50))
        .build()
    };
    let auth = BearerAuth::builder(manager)
        .origin(origin.clone())
        .allow_http_on_loopback()
        .build()
        .unwrap();
    let registry = BreakerRegistry::new(
        BreakerConfig::default()
            .open_duration(Duration::from_millis(100))
            .half_open_retry_in(Duration::from_millis(10))
            .max_pause(Duration::from_millis(100)),
    )
    .unwrap();
    // 20 % of requests, no floor: all requests deposit at the start, so the whole round
    // can retry at most a fifth of them however long it runs.
    let budget = RetryBudget::new(Duration::from_secs(60), 0, 0.2).unwrap();
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let client = Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .backoff(
                    Backoff::builder()
                        .base(Duration::from_millis(5))
                        .max_delay(Duration::from_millis(50))
                        .jitter(Jitter::Full)
                        .build()
                        .unwrap(),
                )
                .budget(budget.clone())
                .total_deadline(Duration::from_secs(5)),
        )
        .breaker(registry.clone())
        .bearer(auth)
        .per_attempt(Arc::new(WireLimit(tokio::sync::Semaphore::new(1_000))))
        .build(http)
        .unwrap();

    let flapper = {
        let mode = mode.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let m = MODES[rand::random_range(0..MODES.len())];
                mode.store(m as u8, Ordering::SeqCst);
            }
        })
    };

    let mut tasks = tokio::task::JoinSet::new();
    for id in 0..requests {
        let client = client.clone();
        let url = server.url(&format!("/r/{id}"));
        tasks.spawn(async move {
            let builder = if id % 2 == 0 {
                client.get(&url)
            } else {
                client.post(&url).body(format!("payload {id}"))
            };
            let request = builder
                .header("x-request-id", id.to_string())
                .build()
                .unwrap();
            let mut extensions = Extensions::new();
            let result = client
                .execute_with_extensions(request, &mut extensions)
                .await;
            let attempts = RetryOutcome::of(&extensions).map_or(1, |o| o.attempts);
            let ok = match result {
                Ok(response) => response.text().await.is_ok(),
                Err(e) => {
                    // Errors are typed: reqwest's own (returned as it came, the default
                    // `ErrorWrapping`), or a retry error, a breaker rejection, a token error.
                    assert!(
                        matches!(e, reqwest_middleware::Error::Reqwest(_))
                            || ResilienceError::from_middleware_error(&e).is_some(),
                        "{e}"
                    );
                    false
                }
            };
            (ok, u64::from(attempts - 1))
        });
    }
    let (mut returned, mut ok, mut retries) = (0, 0, 0);
    let drained = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(joined) = tasks.join_next().await {
            let (success, r) = joined.expect("no request task panicked");
            returned += 1;
            ok += usize::from(success);
            retries += r;
        }
    })
    .await;
    flapper.abort();
    // Awaited, so that no last flip lands after the server is set up for good below.
    let _ = flapper.await;
    assert!(
        drained.is_ok(),
        "deadlock or lost request: {returned}/{requests} returned"
    );

    let posts_executed_max = ledger
        .executed
        .lock()
        .unwrap()
        .values()
        .copied()
        .max()
        .unwrap_or(0);
    for snap in registry.snapshot() {
        assert_eq!(snap.probes_in_flight, 0, "a probe slot is held: {snap:?}");
    }
    assert!(registry.len() <= 1);
    // Nothing is stuck: once the server stays up and the open period (100 ms) and any
    // pause (≤ 100 ms) are over, the next request goes through (as the HalfOpen probe if
    // the breaker was open) and closes the breaker.
    mode.store(Mode::Up as u8, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let response = client
        .get(server.url("/after"))
        .header("x-request-id", "after")
        .send()
        .await
        .expect("the recovered server answers");
    assert_eq!(response.status(), 200);
    assert_eq!(
        registry.state(&origin),
        Some(reqwest_resilience::BreakerState::Closed)
    );
    Round {
        requests,
        returned,
        ok,
        retries,
        posts_executed_max,
        fetches: generation.load(Ordering::SeqCst),
        server_requests: server.requests_seen(),
    }
    .check(max_fetching.load(Ordering::SeqCst))
}

impl Round {
    fn check(self, max_fetching: usize) -> Round {
        assert_eq!(
            self.returned, self.requests,
            "every logical request returned"
        );
        assert!(
            self.posts_executed_max <= 1,
            "a POST was executed {} times",
            self.posts_executed_max
        );
        assert!(
            self.retries <= (self.requests / 5) as u64,
            "{} retries for {} requests: over the 20 % budget",
            self.retries,
            self.requests
        );
        assert!(max_fetching <= 1, "{max_fetching} token fetches at once");
        self
    }
}

fn run(rounds: usize, requests: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for i in 0..rounds {
            let r = round(requests).await;
            eprintln!(
                "round {i}: {} requests returned ({} ok), {} retries, {} server requests, \
                 {} token fetches, max POST executions {}",
                r.returned, r.ok, r.retries, r.server_requests, r.fetches, r.posts_executed_max
            );
        }
    });
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn stress_small_500_requests_3_rounds_against_a_flapping_server() {
    run(3, 500);
}

#[test]
#[ignore = "long: cargo test --release --test stress -- --ignored --nocapture"]
fn stress_10_000_concurrent_requests_100_rounds_against_a_flapping_server() {
    run(
        env_or("STRESS_ROUNDS", 100),
        env_or("STRESS_REQUESTS", 10_000),
    );
}
