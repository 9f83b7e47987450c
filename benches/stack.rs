//! The whole stack's cost on the success path (a plain binary: `cargo bench --bench stack`,
//! about 30 s; results and machine in BENCHMARKS.md).
//!
//! A keep-alive HTTP/1.1 server on loopback, on its own thread and runtime, answers every
//! request with the same `200`. The client runs on a current-thread runtime on the main
//! thread, one request at a time over one pooled connection shared by every stack, so the
//! stacks differ only by their middleware:
//!
//! - `reqwest::Client` alone (the baseline);
//! - `ClientWithMiddleware` with no middleware (reqwest-middleware's own cost);
//! - `Resilience::new()`: retry → breaker → transport (the quick start);
//! - the full `Resilience` stack: retry → breaker → bearer (a cached token) → transport;
//! - reqwest-retry 0.9's `RetryTransientMiddleware` (exponential backoff, 3 retries).
//!
//! 1. Requests per second: rounds of `PER_ROUND` sequential GETs, the stacks interleaved
//!    (their order rotates each round); the median round per stack, and the median over
//!    rounds of the baseline's time divided by the stack's time in the same round.
//!    `STACK_BENCH_PARTS=1` adds each middleware alone (with `TransportEvidence`).
//! 0. First, the middlewares' CPU cost without I/O (the innermost middleware answers
//!    `200`); `STACK_BENCH_CPU_ONLY=1` stops after it (for a profiler).
//! 2. Allocations per request on the main thread (client, middleware and hyper's
//!    connection task all run there; the server's thread is not counted), with a counting
//!    global allocator.

use std::time::{Duration, Instant};

use std::sync::Arc;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware};
use reqwest_resilience::breaker::CircuitBreakerMiddleware;
use reqwest_resilience::{BearerAuth, Resilience, RetryMiddleware, TransportEvidence};

// ---------------------------------------------------------------------------------------
// Counting allocator: allocations made by the current thread.

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocations;

// ---------------------------------------------------------------------------------------
// The server (a fixed 200 on every request of a keep-alive connection) and the configured
// middlewares, shared with `benches/instructions.rs`.

mod support;
use support::{bearer, reqwest_retry_middleware, start_server};

// ---------------------------------------------------------------------------------------
// The stacks.

enum Client {
    Bare(reqwest::Client),
    Middleware(ClientWithMiddleware),
}

struct Stack {
    name: &'static str,
    client: Client,
}

impl Stack {
    async fn get(&self, url: &str) {
        let response = match &self.client {
            Client::Bare(c) => c.get(url).send().await.expect("response"),
            Client::Middleware(c) => c.get(url).send().await.expect("response"),
        };
        assert_eq!(response.status(), 200);
        let body = response.bytes().await.expect("body");
        assert_eq!(&body[..], b"ok");
    }
}

fn stacks(client: &reqwest::Client, url: &str) -> Vec<Stack> {
    let bearer = bearer(url);
    let reqwest_retry = ClientBuilder::new(client.clone())
        .with(reqwest_retry_middleware())
        .build();
    let with = |m: &[Arc<dyn Middleware>]| {
        let mut b = ClientBuilder::new(client.clone());
        for m in m {
            b = b.with_arc(m.clone());
        }
        Client::Middleware(b.build())
    };
    let transport: Arc<dyn Middleware> = Arc::new(TransportEvidence::new());
    let parts = if std::env::var_os("STACK_BENCH_PARTS").is_some() {
        vec![
            Stack {
                name: "TransportEvidence only",
                client: with(std::slice::from_ref(&transport)),
            },
            Stack {
                name: "Retry + TransportEvidence",
                client: with(&[Arc::new(RetryMiddleware::new()), transport.clone()]),
            },
            Stack {
                name: "Breaker + TransportEvidence",
                client: with(&[
                    Arc::new(CircuitBreakerMiddleware::default()),
                    transport.clone(),
                ]),
            },
            Stack {
                name: "BearerAuth + TransportEvidence",
                client: with(&[Arc::new(bearer.clone()), transport.clone()]),
            },
        ]
    } else {
        Vec::new()
    };
    let full = Resilience::new()
        .bearer(bearer)
        .build(client.clone())
        .expect("stack");
    let mut all = vec![
        Stack {
            name: "reqwest::Client (baseline)",
            client: Client::Bare(client.clone()),
        },
        Stack {
            name: "ClientWithMiddleware, no middleware",
            client: Client::Middleware(ClientBuilder::new(client.clone()).build()),
        },
        Stack {
            name: "Resilience::new() (no bearer)",
            client: Client::Middleware(Resilience::new().build(client.clone()).expect("stack")),
        },
        Stack {
            name: "Resilience + bearer (full stack)",
            client: Client::Middleware(full),
        },
        Stack {
            name: "reqwest-retry 0.9",
            client: Client::Middleware(reqwest_retry),
        },
    ];
    all.extend(parts);
    all
}

#[path = "../tests/support/answer200.rs"]
mod answer200;
use answer200::Answer200;

/// The middlewares' CPU cost alone: ns per request with `Answer200` innermost, the full
/// stack against `ClientWithMiddleware` with only `Answer200`.
async fn cpu_cost(client: &reqwest::Client, url: &str, bearer: BearerAuth) {
    let n: u32 = if std::env::var_os("STACK_BENCH_CPU_ONLY").is_some() {
        500_000
    } else {
        50_000
    };
    let empty = ClientBuilder::new(client.clone()).with(Answer200).build();
    // `Answer200` after the transport step stands in for the network (the one place
    // where adding middleware after the stack makes sense).
    let full = Resilience::new()
        .bearer(bearer)
        .install(reqwest_middleware::ClientBuilder::new(client.clone()))
        .expect("stack")
        .inside_transport_step()
        .with(Answer200)
        .build();
    let reqwest_retry = ClientBuilder::new(client.clone())
        .with(reqwest_retry_middleware())
        .with(Answer200)
        .build();
    let clients = [&empty, &full, &reqwest_retry];
    let mut samples = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..8 {
        for (i, c) in clients.into_iter().enumerate() {
            let t0 = Instant::now();
            for _ in 0..n {
                let response = c.get(url).send().await.expect("response");
                std::hint::black_box(response.status());
            }
            if round > 0 {
                samples[i].push(t0.elapsed().as_nanos() as f64 / f64::from(n));
            }
        }
    }
    let [a, b, c] = samples.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    });
    println!(
        "\nCPU cost without I/O (innermost middleware answers 200), ns per request:\n  \
         ClientWithMiddleware {a:.0}, full stack {b:.0} (+{:.0}), reqwest-retry 0.9 {c:.0} (+{:.0})",
        b - a,
        c - a
    );
}

const ROUNDS: usize = 21;
const PER_ROUND: usize = 3_000;
const ALLOC_REQUESTS: u64 = 2_000;

fn main() {
    let (addr, _server) = start_server();
    let url = format!("http://{addr}/bench");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        cpu_cost(&client, &url, bearer(&url)).await;
        if std::env::var_os("STACK_BENCH_CPU_ONLY").is_some() {
            // For a profiler: only the no-I/O section.
            return;
        }
        let stacks = stacks(&client, &url);
        // Warm up: the connection, the token, the breaker's entry, the caches.
        for stack in &stacks {
            for _ in 0..500 {
                stack.get(&url).await;
            }
        }

        println!(
            "stack benchmark: {ROUNDS} interleaved rounds × {PER_ROUND} sequential GETs, \
             loopback HTTP/1.1 keep-alive, current-thread client{}",
            if cfg!(feature = "tracing") {
                " (feature tracing on, no subscriber)"
            } else {
                ""
            }
        );
        let mut rounds: Vec<Vec<Duration>> = vec![Vec::with_capacity(ROUNDS); stacks.len()];
        for round in 0..ROUNDS {
            for k in 0..stacks.len() {
                let i = (round + k) % stacks.len();
                let t0 = Instant::now();
                for _ in 0..PER_ROUND {
                    stacks[i].get(&url).await;
                }
                rounds[i].push(t0.elapsed());
            }
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "\n{:<38} {:>12} {:>12} {:>14}",
            "stack", "requests/s", "µs/request", "× baseline"
        );
        for (i, stack) in stacks.iter().enumerate() {
            let secs = median(rounds[i].iter().map(Duration::as_secs_f64).collect());
            // Paired with the baseline's time in the same round, so that drift in the
            // machine's load between rounds cancels out.
            let ratio = median(
                rounds[0]
                    .iter()
                    .zip(&rounds[i])
                    .map(|(b, s)| b.as_secs_f64() / s.as_secs_f64())
                    .collect(),
            );
            println!(
                "{:<38} {:>12.0} {:>12.2} {:>14.3}",
                stack.name,
                PER_ROUND as f64 / secs,
                secs * 1e6 / PER_ROUND as f64,
                ratio
            );
        }

        println!(
            "\n{:<38} {:>16} {:>14}",
            "stack", "allocations/req", "vs baseline"
        );
        let mut base_allocs = 0.0;
        for (i, stack) in stacks.iter().enumerate() {
            let before = allocations();
            for _ in 0..ALLOC_REQUESTS {
                stack.get(&url).await;
            }
            let per_request = (allocations() - before) as f64 / ALLOC_REQUESTS as f64;
            if i == 0 {
                base_allocs = per_request;
            }
            println!(
                "{:<38} {:>16.1} {:>+14.1}",
                stack.name,
                per_request,
                per_request - base_allocs
            );
        }
    });
}
