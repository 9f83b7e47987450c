//! Retry benchmarks (a plain binary: `cargo bench --bench retry`, about 30 s).
//!
//! 1. Overhead on the success path, against baselines measured in the same process.
//!    (a) Middleware cost alone: the stack ends in a middleware answering `200` without
//!    I/O, so the time is the middlewares' own work (ns per request). (b) End to end over
//!    loopback HTTP/1.1 keep-alive: bare `reqwest::Client`, this crate's `RetryMiddleware`
//!    with `TransportEvidence`, and reqwest-retry 0.9's `RetryTransientMiddleware` (µs per
//!    request, median of interleaved rounds).
//! 2. Outage amplification: a server answering `503` to everything; logical GETs arrive at
//!    a steady rate for 10 s (paused tokio clock, real sockets), each allowed 3 retries with
//!    the default backoff. Reports server requests per logical request with and without the
//!    default `RetryBudget` (goal ≤ 1.2× with it under steady traffic).
//! 3. Herd: 1 000 simulated clients failing at the same instant and retrying 5 times into a
//!    persisting outage, for each jitter mode (pure simulation of the delay function):
//!    the peak number of retries in any 100 ms window.
//!
//! `RETRY_BENCH_ONLY_COST=1 cargo bench --bench retry` runs 1a alone (a few seconds).

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::backoff::{RandomSource, SeededRandom};
use reqwest_resilience::{Backoff, Jitter, RetryMiddleware, TransportEvidence};
use support::{Action, FaultServer};

fn main() {
    if std::env::var_os("RETRY_BENCH_ONLY_COST").is_some() {
        middleware_cost();
        return;
    }
    middleware_cost();
    loopback_overhead();
    outage_amplification();
    herd();
}

// ---------------------------------------------------------------------------------------
// 1a. Middleware cost alone

#[path = "../tests/support/answer200.rs"]
mod answer200;
use answer200::Answer200;

fn reqwest_retry()
-> reqwest_retry::RetryTransientMiddleware<reqwest_retry::policies::ExponentialBackoff> {
    let policy = reqwest_retry::policies::ExponentialBackoff::builder().build_with_max_retries(3);
    reqwest_retry::RetryTransientMiddleware::new_with_policy(policy)
}

#[derive(Clone, Copy, PartialEq)]
enum Stack {
    Bare,
    Ours,
    RetryOnly,
    RetryNoBudget,
    TransportOnly,
    ReqwestRetry,
}

impl Stack {
    const ALL: [Stack; 3] = [Stack::Bare, Stack::Ours, Stack::ReqwestRetry];
    const PARTS: [Stack; 6] = [
        Stack::Bare,
        Stack::Ours,
        Stack::RetryOnly,
        Stack::RetryNoBudget,
        Stack::TransportOnly,
        Stack::ReqwestRetry,
    ];

    fn name(self) -> &'static str {
        match self {
            Stack::Bare => "no retry middleware",
            Stack::Ours => "RetryMiddleware + TransportEvidence",
            Stack::RetryOnly => "  of which RetryMiddleware alone",
            Stack::RetryNoBudget => "  RetryMiddleware alone, no budget",
            Stack::TransportOnly => "  of which TransportEvidence alone",
            Stack::ReqwestRetry => "reqwest-retry 0.9 RetryTransientMiddleware",
        }
    }

    fn wrap(self, builder: ClientBuilder) -> ClientBuilder {
        match self {
            Stack::Bare => builder,
            Stack::Ours => builder
                .with(RetryMiddleware::new())
                .with(TransportEvidence::new()),
            Stack::RetryOnly => builder.with(RetryMiddleware::new()),
            Stack::RetryNoBudget => {
                builder.with(RetryMiddleware::builder().no_budget().build().unwrap())
            }
            Stack::TransportOnly => builder.with(TransportEvidence::new()),
            Stack::ReqwestRetry => builder.with(reqwest_retry()),
        }
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn middleware_cost() {
    const N: u32 = 100_000;
    const ROUNDS: usize = 7;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clients: Vec<ClientWithMiddleware> = Stack::PARTS
        .iter()
        .map(|s| {
            s.wrap(ClientBuilder::new(reqwest::Client::new()))
                .with(Answer200)
                .build()
        })
        .collect();
    let mut samples = vec![Vec::new(); clients.len()];
    rt.block_on(async {
        for round in 0..=ROUNDS {
            for (i, c) in clients.iter().enumerate() {
                let started = Instant::now();
                for _ in 0..N {
                    let res = c.get("http://127.0.0.1:9/x").send().await.unwrap();
                    black_box(res.status());
                }
                // Round 0 warms up.
                if round > 0 {
                    samples[i].push(started.elapsed().as_nanos() as f64 / f64::from(N));
                }
            }
        }
    });
    println!("== 1a. success-path cost of the middlewares alone (no I/O), ns/request");
    let base = median(samples[0].clone());
    for (s, xs) in Stack::PARTS.iter().zip(samples) {
        let m = median(xs);
        println!(
            "  {:<44} {:>8.0} ns  (+{:.0} ns over no middleware)",
            s.name(),
            m,
            m - base
        );
    }
}

// ---------------------------------------------------------------------------------------
// 1b. End to end over loopback

fn loopback_overhead() {
    const N: u32 = 2_000;
    const ROUNDS: usize = 7;
    // The server runs on its own runtime thread, as a real server would.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = server_rt.block_on(FaultServer::always(Action::ok("ok")));
    let url = server.url("/bench");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let reqwest = reqwest::Client::builder().no_proxy().build().unwrap();
    let clients: Vec<ClientWithMiddleware> = Stack::ALL
        .iter()
        .map(|s| s.wrap(ClientBuilder::new(reqwest.clone())).build())
        .collect();
    let mut samples = vec![Vec::new(); clients.len()];
    rt.block_on(async {
        for round in 0..=ROUNDS {
            for (i, c) in clients.iter().enumerate() {
                let started = Instant::now();
                for _ in 0..N {
                    let res = c.get(&url).send().await.unwrap();
                    black_box(res.bytes().await.unwrap());
                }
                if round > 0 {
                    samples[i].push(started.elapsed().as_nanos() as f64 / 1e3 / f64::from(N));
                }
            }
        }
    });
    println!(
        "== 1b. success path over loopback HTTP/1.1 keep-alive, µs/request (median of {ROUNDS} rounds × {N})"
    );
    let base = median(samples[0].clone());
    for (s, xs) in Stack::ALL.iter().zip(samples) {
        let m = median(xs);
        println!("  {:<44} {:>8.1} µs  ratio {:.3}", s.name(), m, m / base);
    }
    drop(server);
}

// ---------------------------------------------------------------------------------------
// 2. Outage amplification

fn outage_amplification() {
    println!(
        "== 2. total outage (every response 503), 10 s of steady traffic, 3 retries each, default backoff"
    );
    println!(
        "  {:>10} {:>9} {:>24} {:>24}",
        "rate", "logical", "no budget", "default RetryBudget"
    );
    for rate in [10u32, 100, 1000] {
        let without = amplification(rate, false);
        let with = amplification(rate, true);
        println!(
            "  {:>7}/s {:>9} {:>17} ({:.2}×) {:>17} ({:.2}×)",
            rate,
            rate * 10,
            without.1,
            without.1 as f64 / without.0 as f64,
            with.1,
            with.1 as f64 / with.0 as f64
        );
    }
}

/// `(logical requests, requests the server saw)`.
fn amplification(rate_per_sec: u32, budget: bool) -> (usize, usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let server = FaultServer::always(Action::status(503)).await;
        let mut retry = RetryMiddleware::builder();
        if !budget {
            retry = retry.no_budget();
        }
        let client = ClientBuilder::new(
            reqwest::Client::builder()
                .no_proxy()
                .pool_idle_timeout(None)
                .build()
                .unwrap(),
        )
        .with(retry.build().unwrap())
        .with(TransportEvidence::new())
        .build();
        let logical = rate_per_sec as usize * 10;
        let interval = Duration::from_secs(1) / rate_per_sec;
        let start = tokio::time::Instant::now();
        let tasks: Vec<_> = (0..logical)
            .map(|i| {
                let (client, url) = (client.clone(), server.url("/"));
                tokio::spawn(async move {
                    tokio::time::sleep_until(start + interval * i as u32).await;
                    let res = client.get(url).send().await.unwrap();
                    assert_eq!(res.status(), 503);
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        (logical, server.requests_seen())
    })
}

// ---------------------------------------------------------------------------------------
// 3. Herd

fn herd() {
    const CLIENTS: usize = 1_000;
    const RETRIES: u32 = 5;
    const WINDOW: Duration = Duration::from_millis(100);
    println!(
        "== 3. herd: {CLIENTS} clients fail at t = 0 and retry {RETRIES} times (base 1 s, ×2, cap 30 s): peak retries per 100 ms window"
    );
    let modes = [
        ("None", Jitter::None),
        ("Proportional(0.10) (default)", Jitter::Proportional(0.10)),
        ("Additive(0.50)", Jitter::Additive(0.50)),
        ("Full", Jitter::Full),
        ("Decorrelated", Jitter::Decorrelated),
    ];
    for (name, jitter) in modes {
        let backoff = Backoff::builder().jitter(jitter).build().unwrap();
        let random: Arc<dyn RandomSource> = Arc::new(SeededRandom::new(2026));
        let mut windows = std::collections::BTreeMap::<u128, u32>::new();
        let mut last = Duration::ZERO;
        for _ in 0..CLIENTS {
            let mut at = Duration::ZERO;
            let mut previous = None;
            for n in 0..RETRIES {
                let d = backoff.delay(n, previous, random.as_ref());
                previous = Some(d);
                at += d;
                *windows
                    .entry(at.as_nanos() / WINDOW.as_nanos())
                    .or_default() += 1;
            }
            last = last.max(at);
        }
        let peak = windows.values().max().copied().unwrap_or(0);
        println!(
            "  {:<30} peak {:>5} retries/100 ms ({:>5.1}% of clients), last retry at {:>6.1} s",
            name,
            peak,
            100.0 * f64::from(peak) / CLIENTS as f64,
            last.as_secs_f64()
        );
    }
}
