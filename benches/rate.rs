//! Rate-limit benchmarks (a plain binary: `cargo bench --bench rate`).
//!
//! 1. The decision: `RateLimitRegistry::try_acquire` admitting a request (a rate that
//!    never limits) and turning one away (a spent rate), in ns, against a baseline of one
//!    uncontended `Mutex` lock and increment. Goal: ≤ 100 ns.
//! 2. The lookup over 1 000 origins, round-robin.
//! 3. What an answer costs, through the public path (the parser is private): a learning
//!    registry's `try_acquire` with the ticket dropped unanswered, and with `Ticket::learn`
//!    from an answer with no rate-limit field and from one with the IETF pair
//!    (`RateLimit-Policy` + `RateLimit`); the differences are what reading the answer adds.
//!
//! Instructions instead of time (load-independent): `RATE_ONLY=admitted` (or `rejected`,
//! `learn`, `learn-ietf`) runs that loop alone `RATE_OPS` times; run it under `valgrind
//! --tool=callgrind` for N and 2N and divide the difference by N (BENCHMARKS.md).

use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue};
use reqwest_resilience::Origin;
use reqwest_resilience::rate::{Rate, RateLimitConfig, RateLimitRegistry};

const OPS: u32 = 2_000_000;

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

fn registry(rate: Rate) -> RateLimitRegistry {
    RateLimitRegistry::new(
        RateLimitConfig::default()
            .learn(false)
            .rate(rate)
            .max_wait(Duration::ZERO),
    )
    .unwrap()
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let origin = Origin::parse("https://api.example.com").unwrap();
    if let Ok(only) = std::env::var("RATE_ONLY") {
        let n: u32 = std::env::var("RATE_OPS").map_or(10_000, |v| v.parse().unwrap());
        return only_loop(&only, n, &origin);
    }

    let counter = Mutex::new(0u64);
    let baseline = timed(OPS, |_| *counter.lock().unwrap() += 1);
    println!("baseline: Mutex lock + increment         {baseline:>7.1} ns");

    let open = registry(Rate::per_second(u32::MAX));
    let admitted = timed(OPS, |_| drop(black_box(open.try_acquire(&origin).unwrap())));
    println!("decision: admitted (try_acquire + drop)  {admitted:>7.1} ns");

    let spent = registry(Rate::per(1, Duration::from_secs(3600)).burst(1));
    drop(spent.try_acquire(&origin).unwrap());
    let rejected = timed(OPS, |_| {
        drop(black_box(spent.try_acquire(&origin).unwrap_err()))
    });
    println!("decision: turned away                    {rejected:>7.1} ns");

    let many: Vec<Origin> = (0..1_000)
        .map(|i| Origin::parse(&format!("https://host-{i}.example")).unwrap())
        .collect();
    let wide = registry(Rate::per_second(u32::MAX));
    let round = timed(OPS, |i| {
        drop(black_box(
            wide.try_acquire(&many[i as usize % many.len()]).unwrap(),
        ))
    });
    println!("decision: admitted, 1 000 origins        {round:>7.1} ns");

    let mut plain = HeaderMap::new();
    plain.insert("content-type", HeaderValue::from_static("application/json"));
    plain.insert("content-length", HeaderValue::from_static("1234"));
    let ietf = ietf_pair(&plain);
    let learning = learning_registry(&origin);
    let unanswered = timed(OPS / 4, |_| {
        drop(black_box(learning.try_acquire(&origin).unwrap()))
    });
    println!("answer: try_acquire + drop, learning     {unanswered:>7.1} ns");
    let learn = timed(OPS / 4, |_| {
        learning.try_acquire(&origin).unwrap().learn(&plain)
    });
    println!("answer: try_acquire + learn, no field    {learn:>7.1} ns");
    let learned = learning_registry(&origin);
    let pair = timed(OPS / 4, |_| {
        learned.try_acquire(&origin).unwrap().learn(&ietf)
    });
    println!("answer: try_acquire + learn, IETF pair   {pair:>7.1} ns");
    println!(
        "answer: reading it, no field / IETF pair {:>7.1} / {:.1} ns",
        learn - unanswered,
        pair - unanswered
    );
    println!(
        "load average: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
}

/// A learning registry whose first ticket (the probe) was answered with no rate-limit
/// field: the next tickets are no probes.
fn learning_registry(origin: &Origin) -> RateLimitRegistry {
    let learning = RateLimitRegistry::new(RateLimitConfig::default()).unwrap();
    let probe = learning.try_acquire(origin).unwrap();
    assert!(probe.is_probe());
    probe.learn(&HeaderMap::new());
    assert!(!learning.try_acquire(origin).unwrap().is_probe());
    learning
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

/// One loop alone, `n` times, for callgrind.
fn only_loop(which: &str, n: u32, origin: &Origin) {
    let open = registry(Rate::per_second(u32::MAX));
    let spent = registry(Rate::per(1, Duration::from_secs(3600)).burst(1));
    drop(spent.try_acquire(origin).unwrap());
    let learning = learning_registry(origin);
    let plain = HeaderMap::new();
    let ietf = ietf_pair(&plain);
    for _ in 0..n {
        match which {
            "admitted" => drop(black_box(open.try_acquire(origin).unwrap())),
            "rejected" => drop(black_box(spent.try_acquire(origin).unwrap_err())),
            "learn" => learning.try_acquire(origin).unwrap().learn(&plain),
            "learn-ietf" => learning.try_acquire(origin).unwrap().learn(&ietf),
            other => panic!("RATE_ONLY={other}: admitted, rejected, learn or learn-ietf"),
        }
    }
}
