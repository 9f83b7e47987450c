//! Bearer-token benchmarks (a plain binary: `cargo bench --bench auth`).
//!
//! 1. Warm path: the cost `BearerAuth` adds to a request when a valid token is cached —
//!    the same middleware stack with and without it, ending in a middleware that answers
//!    `200` without any I/O, so only the middleware work is measured.
//! 2. Refresh storm: 10 000 callers ask an empty `TokenManager` for a token at once on a
//!    2-worker runtime; the source takes 20 ms. Reports the number of fetches (goal: 1)
//!    and how much later than one lone fetch the last caller got its token.
//!
//! Numbers are printed as ratios against baselines measured in the same process.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use reqwest_resilience::{AccessToken, BearerAuth, Origin, TokenManager};

const WARM_REQUESTS: u32 = 200_000;
const STORM_CALLERS: usize = 10_000;
const STORM_ROUNDS: usize = 20;
const FETCH_TIME: Duration = Duration::from_millis(20);

/// Answers every request with `200` and checks the header is (or is not) there.
struct Answer200 {
    expect_auth: bool,
}

#[async_trait::async_trait]
impl Middleware for Answer200 {
    async fn handle(
        &self,
        req: reqwest::Request,
        _: &mut Extensions,
        _: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        assert_eq!(
            req.headers().contains_key(http::header::AUTHORIZATION),
            self.expect_auth
        );
        Ok(reqwest::Response::from(
            http::Response::builder().status(200).body("").unwrap(),
        ))
    }
}

fn stack(auth: Option<BearerAuth>) -> ClientWithMiddleware {
    let mut builder = ClientBuilder::new(reqwest::Client::new());
    let expect_auth = auth.is_some();
    if let Some(auth) = auth {
        builder = builder.with(auth);
    }
    builder.with(Answer200 { expect_auth }).build()
}

async fn per_request(client: &ClientWithMiddleware, n: u32) -> Duration {
    let started = Instant::now();
    for _ in 0..n {
        let res = client
            .get("https://api.example.com/v1/items")
            .send()
            .await
            .unwrap();
        black_box(res.status());
    }
    started.elapsed() / n
}

fn warm_path() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let manager = TokenManager::new(|| async {
            Ok::<_, std::io::Error>(
                AccessToken::new("warm-token").expires_in(Duration::from_secs(3600)),
            )
        });
        manager.token().await.unwrap();
        let auth = BearerAuth::builder(manager.clone())
            .origin(Origin::parse("https://api.example.com").unwrap())
            .build()
            .unwrap();
        let with_auth = stack(Some(auth.clone()));
        let without = stack(None);
        // Warm-up, then alternate to even out drift.
        per_request(&without, 10_000).await;
        per_request(&with_auth, 10_000).await;
        let mut base = Vec::new();
        let mut auth_runs = Vec::new();
        for _ in 0..3 {
            base.push(per_request(&without, WARM_REQUESTS / 3).await);
            auth_runs.push(per_request(&with_auth, WARM_REQUESTS / 3).await);
        }
        base.sort();
        auth_runs.sort();
        let (b, a) = (base[1], auth_runs[1]);

        let started = Instant::now();
        for _ in 0..WARM_REQUESTS {
            black_box(manager.token().await.unwrap());
        }
        let token_ns = started.elapsed().as_nanos() as f64 / WARM_REQUESTS as f64;
        let url = reqwest::Url::parse("https://api.example.com/v1/items").unwrap();
        let started = Instant::now();
        for _ in 0..WARM_REQUESTS {
            black_box(auth.covers(black_box(&url)));
        }
        let covers_ns = started.elapsed().as_nanos() as f64 / WARM_REQUESTS as f64;
        // `BearerAuth` keeps a copy of every request for a possible 401 replay.
        let request = reqwest::Request::new(http::Method::GET, url.clone());
        let started = Instant::now();
        for _ in 0..WARM_REQUESTS {
            black_box(black_box(&request).try_clone());
        }
        let clone_ns = started.elapsed().as_nanos() as f64 / WARM_REQUESTS as f64;

        println!(
            "== warm path (token cached), median of 3 runs of {} requests",
            WARM_REQUESTS / 3
        );
        println!("request without BearerAuth:   {:>8} ns", b.as_nanos());
        println!("request with BearerAuth:      {:>8} ns", a.as_nanos());
        println!(
            "overhead:                     {:>8} ns  (ratio {:.3})",
            a.as_nanos() as i128 - b.as_nanos() as i128,
            a.as_secs_f64() / b.as_secs_f64()
        );
        println!("  of which TokenManager::token: {token_ns:>6.0} ns");
        println!("  of which origin check:        {covers_ns:>6.0} ns");
        println!("  of which Request::try_clone:  {clone_ns:>6.0} ns (kept for a 401 replay)");
    });
}

fn storm() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let lone = {
            let manager = slow_manager(Arc::new(AtomicUsize::new(0)));
            let started = Instant::now();
            manager.token().await.unwrap();
            started.elapsed()
        };
        // Baseline: spawning and joining the same number of tasks that do nothing.
        let mut spawn_only = Vec::new();
        for _ in 0..STORM_ROUNDS {
            let started = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..STORM_CALLERS {
                tasks.spawn(async { black_box(0u8) });
            }
            while tasks.join_next().await.is_some() {}
            spawn_only.push(started.elapsed());
        }
        spawn_only.sort();
        let mut extra = Vec::new();
        let mut fetch_counts = Vec::new();
        for _ in 0..STORM_ROUNDS {
            let fetches = Arc::new(AtomicUsize::new(0));
            let manager = slow_manager(Arc::clone(&fetches));
            let started = Instant::now();
            let mut callers = tokio::task::JoinSet::new();
            for _ in 0..STORM_CALLERS {
                let manager = manager.clone();
                callers.spawn(async move { manager.token().await.unwrap() });
            }
            let mut first: Option<AccessToken> = None;
            while let Some(token) = callers.join_next().await {
                let token = token.unwrap();
                let first = first.get_or_insert_with(|| token.clone());
                assert!(first.same_token(&token));
            }
            extra.push(started.elapsed().saturating_sub(lone));
            fetch_counts.push(fetches.load(Ordering::SeqCst));
        }
        extra.sort();
        println!(
            "== refresh storm: {STORM_CALLERS} concurrent callers, empty cache, fetch of {FETCH_TIME:?}, \
             {STORM_ROUNDS} rounds, 2 worker threads"
        );
        println!("lone fetch:                     {:>8.2} ms", ms(lone));
        println!(
            "fetches per storm:              {:?} (max {})",
            fetch_counts,
            fetch_counts.iter().max().unwrap()
        );
        println!(
            "extra latency over one fetch:   median {:.2} ms, max {:.2} ms \
             (spawning and waking {STORM_CALLERS} tasks)",
            ms(extra[extra.len() / 2]),
            ms(*extra.last().unwrap())
        );
        println!(
            "baseline, spawn+join only:      median {:.2} ms",
            ms(spawn_only[spawn_only.len() / 2])
        );
        println!(
            "per caller:                     {:.0} ns extra, {:.0} ns of it beyond spawn+join",
            extra[extra.len() / 2].as_nanos() as f64 / STORM_CALLERS as f64,
            extra[extra.len() / 2]
                .saturating_sub(spawn_only[spawn_only.len() / 2])
                .as_nanos() as f64
                / STORM_CALLERS as f64
        );
    });
}

fn slow_manager(fetches: Arc<AtomicUsize>) -> TokenManager {
    TokenManager::new(move || {
        let n = fetches.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(FETCH_TIME).await;
            Ok::<_, std::io::Error>(AccessToken::new(format!("storm-{n}")))
        }
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    warm_path();
    storm();
}
