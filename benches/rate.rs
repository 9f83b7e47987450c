//! Rate-limit benchmarks (a plain binary: `cargo bench --bench rate`).
//!
//! Everything is measured through the middleware (`ClientWithMiddleware::execute` of a
//! GET built once and cloned, `RateLimit` over an innermost step answering `200` in
//! process, no I/O): the registry's tickets are crate-private. The baseline is the same
//! stack without the `RateLimit` step; the differences are what the rate limit adds.
//!
//! 1. The decision: a request admitted (a rate that never limits) and one turned away (a
//!    spent rate: the error and its evidence included), against the baseline and one
//!    uncontended `Mutex` lock and increment.
//! 2. The lookup over 1 000 origins, round-robin.
//! 3. What an answer costs: a learning rate limit (its probe answered) whose answers carry
//!    no rate-limit field, and carry the IETF pair (`RateLimit-Policy` + `RateLimit`); the
//!    difference is what reading the pair adds.
//!
//! Instructions instead of time (load-independent): `RATE_ONLY=bare` (or `admitted`,
//! `rejected`, `learn`, `learn-ietf`) runs that loop alone `RATE_OPS` times; run it under
//! `valgrind --tool=callgrind` for N and 2N and divide the difference by N (BENCHMARKS.md).

use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue};
use reqwest::ResponseBuilderExt;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::rate::{Rate, RateLimit, RateLimitConfig, RateLimitRegistry};

const OPS: u32 = 2_000_000;
const REQUESTS: u32 = 200_000;
const URL: &str = "https://api.example.com/v1/items";

fn timed(n: u32, mut f: impl FnMut(u32)) -> f64 {
    for i in 0..n / 10 {
        f(i);
    }
    let started = Instant::now();
    for i in 0..n {
        f(i);
    }
    started.elapsed().as_nanos() as f64 / f64::from(n)
}

/// Stands in for the network: a `200` from the request's URL with these header fields
/// (the URL matters: the rate limit learns only from its origin's answers).
struct Answer(HeaderMap);

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Answer {
    async fn handle(
        &self,
        req: reqwest::Request,
        _: &mut http::Extensions,
        _: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let mut response = http::Response::builder()
            .status(200)
            .url(req.url().clone())
            .body("")
            .expect("a response");
        *response.headers_mut() = self.0.clone();
        Ok(reqwest::Response::from(response))
    }
}

/// `RateLimit` over `registry` (none: the baseline), answered with `headers`.
fn stack(registry: Option<&RateLimitRegistry>, headers: &HeaderMap) -> ClientWithMiddleware {
    let mut builder = ClientBuilder::new(reqwest::Client::new());
    if let Some(r) = registry {
        builder = builder.with(RateLimit::new(r.clone()));
    }
    builder.with(Answer(headers.clone())).build()
}

fn hand_set(rate: Rate) -> RateLimitRegistry {
    RateLimitRegistry::new(
        RateLimitConfig::default()
            .learn(false)
            .rate(rate)
            .max_wait(Duration::ZERO),
    )
    .unwrap()
}

/// `n` requests through `client`, round-robin over `requests`; ns per request. `ok`:
/// whether each is admitted (asserted).
async fn per_request(
    client: &ClientWithMiddleware,
    requests: &[reqwest::Request],
    n: u32,
    ok: bool,
) -> f64 {
    let started = Instant::now();
    for i in 0..n {
        let request = requests[i as usize % requests.len()].try_clone().unwrap();
        let r = client.execute(request).await;
        assert_eq!(black_box(r).is_ok(), ok);
    }
    started.elapsed().as_nanos() as f64 / f64::from(n)
}

/// A warm-up of a tenth, then `n` timed.
async fn measured(
    client: &ClientWithMiddleware,
    requests: &[reqwest::Request],
    n: u32,
    ok: bool,
) -> f64 {
    per_request(client, requests, n / 10, ok).await;
    per_request(client, requests, n, ok).await
}

/// `headers` with the IETF pair: a quota and a remainder that never hold a request up (a
/// billion a second, as many left), so the loop measures the reading, not a wait.
fn ietf_pair(headers: &HeaderMap) -> HeaderMap {
    let mut ietf = headers.clone();
    ietf.insert(
        "ratelimit-policy",
        HeaderValue::from_static(r#""default";q=1000000000;w=1"#),
    );
    ietf.insert(
        "ratelimit",
        HeaderValue::from_static(r#""default";r=999999999;t=1"#),
    );
    ietf
}

/// The stacks of the loops, each with its first request sent (a learning origin's probe
/// answered; the spent rate's one slot taken).
struct Stacks {
    bare: ClientWithMiddleware,
    admitted: ClientWithMiddleware,
    rejected: ClientWithMiddleware,
    learn: ClientWithMiddleware,
    learn_ietf: ClientWithMiddleware,
}

async fn stacks(one: &[reqwest::Request], plain: &HeaderMap) -> Stacks {
    let ietf = ietf_pair(plain);
    let learning = || RateLimitRegistry::new(RateLimitConfig::default()).unwrap();
    let s = Stacks {
        bare: stack(None, plain),
        admitted: stack(Some(&hand_set(Rate::per_second(u32::MAX))), plain),
        rejected: stack(
            Some(&hand_set(Rate::per(1, Duration::from_secs(3600)).burst(1))),
            plain,
        ),
        learn: stack(Some(&learning()), plain),
        learn_ietf: stack(Some(&learning()), &ietf),
    };
    for c in [&s.rejected, &s.learn, &s.learn_ietf] {
        per_request(c, one, 1, true).await;
    }
    s
}

fn main() {
    // anyhow captures a backtrace in every error it creates when RUST_BACKTRACE or
    // RUST_LIB_BACKTRACE asks for one (microseconds each): measure the production
    // setting unless RUST_LIB_BACKTRACE was chosen explicitly (as the breaker bench).
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: first statement of main, before any other thread exists.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut plain = HeaderMap::new();
    plain.insert("content-type", HeaderValue::from_static("application/json"));
    plain.insert("content-length", HeaderValue::from_static("1234"));
    let one = vec![reqwest::Client::new().get(URL).build().unwrap()];
    if let Ok(only) = std::env::var("RATE_ONLY") {
        let n: u32 = std::env::var("RATE_OPS").map_or(10_000, |v| v.parse().unwrap());
        return rt.block_on(only_loop(&only, n, &one, &plain));
    }

    let counter = Mutex::new(0u64);
    let baseline = timed(OPS, |_| *counter.lock().unwrap() += 1);
    println!("baseline: Mutex lock + increment             {baseline:>7.1} ns");

    rt.block_on(async {
        let s = stacks(&one, &plain).await;
        let bare = measured(&s.bare, &one, REQUESTS, true).await;
        println!("baseline: the stack without the rate limit   {bare:>7.1} ns");
        let admitted = measured(&s.admitted, &one, REQUESTS, true).await;
        println!(
            "decision: admitted                           {admitted:>7.1} ns (+{:.1})",
            admitted - bare
        );
        let rejected = measured(&s.rejected, &one, REQUESTS, false).await;
        println!(
            "decision: turned away (error included)       {rejected:>7.1} ns (+{:.1})",
            rejected - bare
        );
        let many: Vec<reqwest::Request> = (0..1_000)
            .map(|i| {
                let url = format!("https://host-{i}.example/v1/items");
                reqwest::Client::new().get(url).build().unwrap()
            })
            .collect();
        let wide = stack(Some(&hand_set(Rate::per_second(u32::MAX))), &plain);
        let round = measured(&wide, &many, REQUESTS, true).await;
        println!(
            "decision: admitted, 1 000 origins            {round:>7.1} ns (+{:.1})",
            round - bare
        );
        let learn = measured(&s.learn, &one, REQUESTS, true).await;
        println!(
            "answer: learning, no field                   {learn:>7.1} ns (+{:.1})",
            learn - bare
        );
        let pair = measured(&s.learn_ietf, &one, REQUESTS, true).await;
        println!(
            "answer: learning, the IETF pair              {pair:>7.1} ns (+{:.1}; reading the pair {:.1})",
            pair - bare,
            pair - learn
        );
    });
    println!(
        "load average: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
}

/// One loop alone, `n` times, for callgrind.
async fn only_loop(which: &str, n: u32, one: &[reqwest::Request], plain: &HeaderMap) {
    let s = stacks(one, plain).await;
    let (client, ok) = match which {
        "bare" => (&s.bare, true),
        "admitted" => (&s.admitted, true),
        "rejected" => (&s.rejected, false),
        "learn" => (&s.learn, true),
        "learn-ietf" => (&s.learn_ietf, true),
        other => panic!("RATE_ONLY={other}: bare, admitted, rejected, learn or learn-ietf"),
    };
    per_request(client, one, n, ok).await;
}
