//! Allocations per request on the success path, counted exactly (a counting global
//! allocator, per thread), so that a change which adds work to every request shows up
//! as a failing number rather than as noise in a benchmark. In a test binary of its own:
//! it installs its own global allocator.
//!
//! The innermost middleware answers `200` at once, so no socket or connection task adds
//! allocations of its own; what is counted is the client, `reqwest_middleware` and this
//! crate's middlewares. The figures are the extra allocations over a
//! `ClientWithMiddleware` with the same innermost middleware. When an optimisation lowers
//! one, lower the number here (and in BENCHMARKS.md).

use std::time::Duration;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::{
    AccessToken, BearerAuth, Origin, Resilience, RetryMiddleware, TokenManager, TransportEvidence,
};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

#[path = "support/answer200.rs"]
mod answer200;
use answer200::Answer200;

// Never contacted: `Answer200` answers before reqwest would connect.
const URL: &str = "http://127.0.0.1:9/x";
const REQUESTS: u64 = 50;

/// With the `metrics` feature (no recorder installed): the attempt's
/// `http.client.request.duration` label list (1, in the transport step), and the retry
/// middleware's stop counter label list (1). Label texts are shared, never copied.
/// With the `tracing` feature the `Resilience` stack adds its span stage, boxed (so that
/// a stack without it carries none of its state): one allocation (the span itself is
/// disabled: no subscriber is installed).
const OBSERVER: f64 = if cfg!(feature = "tracing") { 1.0 } else { 0.0 };

const METRICS_ATTEMPT: f64 = if cfg!(feature = "metrics") { 1.0 } else { 0.0 };
const METRICS_RETRY: f64 = if cfg!(feature = "metrics") { 1.0 } else { 0.0 };

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn bearer() -> BearerAuth {
    let tokens = TokenManager::new(|| async {
        Ok::<_, std::io::Error>(AccessToken::new("t").expires_in(Duration::from_secs(3600)))
    });
    BearerAuth::builder(tokens)
        .origin(Origin::parse(URL).unwrap())
        .allow_http_on_loopback()
        .build()
        .unwrap()
}

/// Allocations for `REQUESTS` sequential successful GETs, after a warm-up (the token
/// fetch, the breaker's entry, the origin cache).
async fn allocations_for(client: &ClientWithMiddleware) -> u64 {
    for _ in 0..10 {
        let response = client.get(URL).send().await.unwrap();
        assert_eq!(response.status(), 200);
    }
    let before = counting_alloc::allocations();
    for _ in 0..REQUESTS {
        let response = client.get(URL).send().await.unwrap();
        assert_eq!(response.status(), 200);
    }
    counting_alloc::allocations() - before
}

/// Extra allocations per request over a `ClientWithMiddleware` holding only `Answer200`.
async fn extra_per_request(client: ClientWithMiddleware) -> f64 {
    let empty = ClientBuilder::new(reqwest_client()).with(Answer200).build();
    let base = allocations_for(&empty).await;
    let with = allocations_for(&client).await;
    (with as f64 - base as f64) / REQUESTS as f64
}

// The tests run on the current-thread runtime: every allocation of a request happens on
// the test's own thread, which is what the thread-local counter sees.

#[tokio::test]
async fn the_transport_step_adds_seven_allocations_per_request() {
    let client = ClientBuilder::new(reqwest_client())
        .with(TransportEvidence::new())
        .with(Answer200)
        .build();
    // Its boxed future (1); the per-request record (evidence and history, one
    // extension: `crate::record`) in the caller's extensions (map, table, box: 3) and in
    // the response's, which `Answer200` leaves empty (map, table, box: 3).
    assert_eq!(extra_per_request(client).await, 7.0 + METRICS_ATTEMPT);
}

#[tokio::test]
async fn retry_with_the_transport_step_adds_nine_allocations_per_request() {
    let client = ClientBuilder::new(reqwest_client())
        .with(RetryMiddleware::new())
        .with(TransportEvidence::new())
        .with(Answer200)
        .build();
    // The transport step's 7; the retry's boxed future (1); the copy of the request
    // for a possible retry (1: the URL; `crate::stage::copy_request`, not
    // `Request::try_clone`, which would add reqwest's timeout write into a fresh
    // extensions map: map, table, box). The RetryOutcome goes into the records the
    // transport step left (0).
    assert_eq!(
        extra_per_request(client).await,
        9.0 + METRICS_ATTEMPT + METRICS_RETRY
    );
}

#[tokio::test]
async fn the_quick_start_stack_adds_nine_allocations_per_request() {
    let client = Resilience::new()
        .install(reqwest_middleware::ClientBuilder::new(reqwest_client()))
        .unwrap()
        .inside_transport_step()
        .with(Answer200)
        .build();
    // Retry and transport's 9, less the two middlewares' boxed futures (2), and the
    // composed stack's (1: one for every stage) and the attempt's below the retry loop
    // (1). The breaker's origin lookup and its registry
    // entry allocate nothing.
    assert_eq!(
        extra_per_request(client).await,
        9.0 + OBSERVER + METRICS_ATTEMPT + METRICS_RETRY
    );
}

#[tokio::test]
async fn the_full_stack_with_bearer_adds_eleven_allocations_per_request() {
    let client = Resilience::new()
        .bearer(bearer())
        .install(reqwest_middleware::ClientBuilder::new(reqwest_client()))
        .unwrap()
        .inside_transport_step()
        .with(Answer200)
        .build();
    // The quick start's 9, and the header map growing for `Authorization` (2; over the
    // network reqwest would grow it for its default headers anyway). `BearerAuth` boxes
    // no future of its own, and replays a `401` from the retry's spare copy rather than
    // copying the request itself.
    assert_eq!(
        extra_per_request(client).await,
        11.0 + OBSERVER + METRICS_ATTEMPT + METRICS_RETRY
    );
}

#[tokio::test]
async fn the_quick_start_stack_with_a_concurrency_limit_adds_nine_allocations_per_request() {
    let client = Resilience::new()
        .concurrency_limit(reqwest_resilience::limit::LimiterConfig::default())
        .install(reqwest_middleware::ClientBuilder::new(reqwest_client()))
        .unwrap()
        .inside_transport_step()
        .with(Answer200)
        .build();
    // The quick start's 9: the limiter is a stage of the composed future, and its
    // origin lookup, its registry entry, the permit and the adaptive limit's sample
    // allocate nothing.
    assert_eq!(
        extra_per_request(client).await,
        9.0 + OBSERVER + METRICS_ATTEMPT + METRICS_RETRY
    );
}

#[tokio::test]
async fn hedging_an_answer_faster_than_the_delay_adds_one_allocation_per_request() {
    for hedging in [
        reqwest_resilience::retry::Hedging::fixed(std::time::Duration::from_secs(1)),
        reqwest_resilience::retry::Hedging::adaptive(0.95),
    ] {
        let client = ClientBuilder::new(reqwest_client())
            .with(RetryMiddleware::builder().hedging(hedging).build().unwrap())
            .with(TransportEvidence::new())
            .with(Answer200)
            .build();
        // Retry with the transport step's 9, and the round's own 1: its boxed future.
        // Until the hedge timer fires there is no race: the first copy and the timer run
        // in place in that future, the hedges' template is the request the retry keeps,
        // their extensions are made only when one is sent, and without a deadline or an
        // attempt timeout no "lost" flag is needed (0), nor a scope handed inward (0): the
        // first copy runs as a plain attempt does.
        assert_eq!(
            extra_per_request(client).await,
            10.0 + METRICS_ATTEMPT + METRICS_RETRY
        );
    }
}

/// A zero-sized error: what one `reqwest_middleware::Error` costs by itself (anyhow's
/// box, and its backtrace when `RUST_BACKTRACE` / `RUST_LIB_BACKTRACE` turns them on).
#[derive(Debug)]
struct Nothing;

impl std::fmt::Display for Nothing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("nothing")
    }
}

impl std::error::Error for Nothing {}

fn allocations_of_one_middleware_error() -> u64 {
    let before = counting_alloc::allocations();
    for _ in 0..REQUESTS {
        std::hint::black_box(reqwest_middleware::Error::middleware(Nothing));
    }
    (counting_alloc::allocations() - before) / REQUESTS
}

/// Extra allocations per request through `client` (its requests fail), over the empty
/// client's successful ones.
async fn extra_per_failed_request(client: &ClientWithMiddleware) -> f64 {
    let empty = ClientBuilder::new(reqwest_client()).with(Answer200).build();
    let base = allocations_for(&empty).await;
    for _ in 0..10 {
        assert!(client.get(URL).send().await.is_err());
    }
    let before = counting_alloc::allocations();
    for _ in 0..REQUESTS {
        assert!(client.get(URL).send().await.is_err());
    }
    let with = counting_alloc::allocations() - before;
    (with as f64 - base as f64) / REQUESTS as f64
}

#[tokio::test]
async fn a_request_rejected_by_the_limiter_allocates_less_than_an_admitted_one() {
    use reqwest_resilience::limit::{ConcurrencyLimit, LimiterConfig, LimiterRegistry};
    let through = |registry: &LimiterRegistry| {
        ClientBuilder::new(reqwest_client())
            .with(ConcurrencyLimit::new(registry.clone()))
            .with(TransportEvidence::new())
            .with(Answer200)
            .build()
    };
    // The one permit, held by a request that is never answered (parked before counting).
    let full = LimiterRegistry::new(LimiterConfig::fixed(1)).unwrap();
    let holder = ClientBuilder::new(reqwest_client())
        .with(ConcurrencyLimit::new(full.clone()))
        .with(NeverAnswers)
        .build();
    let held = tokio::spawn(async move { holder.get(URL).send().await });
    let origin = Origin::parse(URL).unwrap();
    while full.get(&origin).is_none_or(|s| s.in_flight == 0) {
        tokio::task::yield_now().await;
    }
    let error = allocations_of_one_middleware_error() as f64;
    let rejected = extra_per_failed_request(&through(&full)).await - error;
    let open = LimiterRegistry::new(LimiterConfig::fixed(1_000)).unwrap();
    let admitted = extra_per_request(through(&open)).await;
    // Over the bare client's answered request, less the error itself (anyhow's box: 1;
    // with backtraces on, 5 more for the captured frames): one fewer. The limiter's
    // boxed future (1) and the caller's record with the rejection's evidence (map,
    // table, box: 3) weigh one less than the answer's response in the bare client.
    assert_eq!(rejected, -1.0);
    // The transport step's 7 and the limiter's boxed future.
    assert_eq!(admitted, 8.0 + METRICS_ATTEMPT);
    assert!(rejected < admitted);
    held.abort();
}

/// An innermost middleware that never answers: its request keeps its limiter permit.
struct NeverAnswers;

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for NeverAnswers {
    async fn handle(
        &self,
        _: reqwest::Request,
        _: &mut http::Extensions,
        _: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        std::future::pending().await
    }
}
