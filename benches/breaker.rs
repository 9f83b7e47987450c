//! Circuit-breaker benchmarks (a plain binary: `cargo bench --bench breaker`).
//!
//! Everything is measured through the middleware (`ClientWithMiddleware::
//! execute_with_extensions` over an innermost step answering `200` in process, no I/O):
//! the registry's permits are crate-private.
//!
//! 1. Closed path: the stack with a Closed breaker against the same stack without it,
//!    and a baseline of one uncontended `Mutex` lock and increment (the least any shared
//!    breaker costs).
//! 2. Open path: a rejection through the whole middleware (the breaker open, evidence and
//!    error included) against the same stack answering `200` without the breaker. Goal: a
//!    rejection costs at most 1 µs.
//! 3. Registry lookup: requests through the breaker round-robin over 1, 1 000 and 10 000
//!    origins, on 1 and 2 threads at once (ns per request per thread, the stack's own cost
//!    included).
//!
//! (Sizes: the crate's unit tests assert them; the registry's docs state them.)

use std::hint::black_box;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::Origin;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, CircuitBreakerMiddleware};

const OPS: u32 = 2_000_000;
const REQUESTS: u32 = 200_000;

fn ns_per(op_count: u32, took: Duration) -> f64 {
    took.as_nanos() as f64 / f64::from(op_count)
}

fn timed(n: u32, mut f: impl FnMut(u32)) -> f64 {
    // One warm-up pass of a tenth, so caches and the allocator are in their steady state.
    for i in 0..n / 10 {
        f(i);
    }
    let started = Instant::now();
    for i in 0..n {
        f(i);
    }
    ns_per(n, started.elapsed())
}

fn origins(n: usize) -> Vec<Origin> {
    (0..n)
        .map(|i| Origin::parse(&format!("https://host-{i}.example")).unwrap())
        .collect()
}

fn registry(max_origins: usize) -> BreakerRegistry {
    BreakerRegistry::new(BreakerConfig::default().max_origins(max_origins)).unwrap()
}

#[path = "../tests/support/answer200.rs"]
mod answer200;
use answer200::Answer200;

fn stack(breaker: Option<CircuitBreakerMiddleware>) -> ClientWithMiddleware {
    let mut builder = ClientBuilder::new(reqwest::Client::new());
    if let Some(b) = breaker {
        builder = builder.with(b);
    }
    builder.with(Answer200).build()
}

async fn per_request(client: &ClientWithMiddleware, request: &reqwest::Request, n: u32) -> f64 {
    let mut ok = 0u32;
    let started = Instant::now();
    for _ in 0..n {
        let mut ext = Extensions::new();
        let r = client
            .execute_with_extensions(request.try_clone().unwrap(), &mut ext)
            .await;
        ok += u32::from(r.is_ok());
        black_box(ext);
    }
    let took = started.elapsed();
    black_box(ok);
    ns_per(n, took)
}

/// One GET per origin, built once (each is cloned per request).
fn requests(client: &ClientWithMiddleware, origins: &[Origin]) -> Vec<reqwest::Request> {
    origins
        .iter()
        .map(|o| client.get(format!("{o}/v1/items")).build().unwrap())
        .collect()
}

/// Requests through `client` (a breaker over `Answer200`) round-robin over `origins`, on
/// `threads` threads at once, each on a runtime of its own; the mean ns per request per
/// thread.
fn lookup(client: &ClientWithMiddleware, origins: &Arc<Vec<Origin>>, threads: usize) -> f64 {
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (client, origins, start) = (client.clone(), origins.clone(), start.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let requests = requests(&client, &origins);
                let n = requests.len();
                let run = |count: u32| {
                    let (client, requests) = (&client, &requests);
                    async move {
                        let started = Instant::now();
                        for i in 0..count {
                            let request = &requests[(i as usize + t * 7919) % n];
                            let mut ext = Extensions::new();
                            let r = client
                                .execute_with_extensions(request.try_clone().unwrap(), &mut ext)
                                .await;
                            assert_eq!(r.unwrap().status(), 200);
                        }
                        ns_per(count, started.elapsed())
                    }
                };
                start.wait();
                rt.block_on(async {
                    run(REQUESTS / 10).await;
                    run(REQUESTS).await
                })
            })
        })
        .collect();
    let per: Vec<f64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    per.iter().sum::<f64>() / per.len() as f64
}

fn main() {
    // anyhow captures a backtrace in every error it creates when RUST_BACKTRACE or
    // RUST_LIB_BACKTRACE asks for one (microseconds each): measure the production
    // setting unless RUST_LIB_BACKTRACE was chosen explicitly.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: first statement of main, before any other thread exists.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
    println!(
        "RUST_LIB_BACKTRACE={} (error backtraces {})",
        std::env::var("RUST_LIB_BACKTRACE").unwrap_or_default(),
        if std::env::var("RUST_LIB_BACKTRACE").as_deref() == Ok("0") {
            "off"
        } else {
            "on"
        }
    );
    // (The breaker's own size, 248 bytes, and the fixed memory per tracked origin, 329
    // bytes, are asserted by the crate's unit tests: neither is public.)

    // 1. and 2. The Closed and the Open path, through the stack.
    let counter = Mutex::new(0u64);
    let baseline = timed(OPS, |_| *counter.lock().unwrap() += 1);
    println!("baseline: uncontended Mutex lock + increment      {baseline:8.1} ns");
    let one = origins(1).remove(0);
    let open = registry(10_000);
    open.isolate(&one);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let request = reqwest::Client::new()
        .get("https://host-0.example/v1/items?id=7")
        .build()
        .unwrap();
    let bare = stack(None);
    let guarded = stack(Some(CircuitBreakerMiddleware::new(open.clone())));
    let passing = stack(Some(CircuitBreakerMiddleware::new(registry(10_000))));
    let (bare_ns, reject_ns, pass_ns) = rt.block_on(async {
        // Warm up each stack once.
        per_request(&bare, &request, REQUESTS / 10).await;
        per_request(&guarded, &request, REQUESTS / 10).await;
        per_request(&passing, &request, REQUESTS / 10).await;
        (
            per_request(&bare, &request, REQUESTS).await,
            per_request(&guarded, &request, REQUESTS).await,
            per_request(&passing, &request, REQUESTS).await,
        )
    });
    println!("stack without breaker, stub 200 (baseline)       {bare_ns:8.1} ns");
    println!(
        "stack with Closed breaker, stub 200               {pass_ns:8.1} ns  (+{:.1} ns, {:.2}x)",
        pass_ns - bare_ns,
        pass_ns / bare_ns
    );
    println!(
        "stack with Open breaker: full rejection           {reject_ns:8.1} ns  ({:.2}x baseline; goal <= 1000 ns: {})",
        reject_ns / bare_ns,
        if reject_ns <= 1000.0 {
            "met"
        } else {
            "NOT met"
        }
    );

    // 3. Registry lookup by size and threads, through the stack.
    for n in [1usize, 1_000, 10_000] {
        let origins = Arc::new(origins(n));
        let reg = registry(10_000);
        let client = stack(Some(CircuitBreakerMiddleware::new(reg.clone())));
        rt.block_on(async {
            for request in requests(&client, &origins) {
                client.execute(request).await.unwrap();
            }
        });
        assert_eq!(reg.len(), n);
        let t1 = lookup(&client, &origins, 1);
        let t2 = lookup(&client, &origins, 2);
        println!(
            "lookup, {n:>6} origins: 1 thread {t1:7.1} ns/request; 2 threads {t2:7.1} ns/request/thread ({:.2}x single-thread throughput)",
            2.0 * t1 / t2
        );
    }
}
