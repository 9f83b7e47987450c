//! Hedging benchmark (a plain binary: `cargo bench --bench hedging`, about 25 s).
//!
//! A heavy-tail loopback server ("The Tail at Scale"'s setting): each request, hedges
//! included, independently answered after ~2 ms (98 %, uniform in 1.5–2.5 ms) or ~500 ms
//! (2 %, uniform in 450–550 ms), drawn from a seeded hash of the request's index. 10 000
//! logical GETs per configuration arriving at 500/s (open loop: the same offered load for
//! every configuration), at most 64 in flight, through `RetryMiddleware →
//! CircuitBreakerMiddleware → TransportEvidence`, for: no hedging, a fixed 10 ms delay,
//! and adaptive delays at several percentiles (each with the default hedge budget). All
//! configurations run at the same time against one server, each with its own client and
//! path, so a stall of the (shared) machine falls on all of them alike; each first sends
//! 1 000 unmeasured requests (pool warm, estimator full). Reports p50 / p99 / p99.9
//! latency per logical request and the extra requests the server saw: p99.9 against
//! extra load per percentile.
//!
//! Real time throughout (the middleware's CPU time and the machine's stalls count): a
//! paused clock would make every latency a whole number of milliseconds (tokio's timer
//! granularity), so the adaptive delay would tie with the commonest answer time and spend
//! the hedge budget on copies cancelled at once, which no real server produces.
//!
//! `HEDGING_BENCH_REQUESTS=N` changes the measured count (default 10 000).

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, CircuitBreakerMiddleware};
use reqwest_resilience::retry::Hedging;
use reqwest_resilience::{RetryMiddleware, TransportEvidence};
use support::{Action, FaultServer};

const CONCURRENCY: usize = 64;
/// Arrivals per second for each configuration (six at once: 3 000/s in all, well below
/// what the loopback pair sustains on a shared 2-core machine).
const RATE: u32 = 500;
const WARMUP: usize = 1_000;
/// Per mille of requests that are slow.
const SLOW_PER_MILLE: u64 = 20;

/// The server's wait for request `index`: ~2 ms, or ~500 ms for 2 % of requests.
fn wait_for(index: usize) -> Duration {
    let d = draw(index);
    // The low bits choose the mode, the high bits the jitter within it (±25 %, ±10 %).
    let jitter = (d >> 32) as f64 / u32::MAX as f64;
    if d % 1000 < SLOW_PER_MILLE {
        Duration::from_micros(450_000 + (jitter * 100_000.0) as u64)
    } else {
        Duration::from_micros(1_500 + (jitter * 1_000.0) as u64)
    }
}

/// SplitMix64: a seeded, independent draw per request index.
fn draw(index: usize) -> u64 {
    let mut z = (index as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stall probe's findings: the longest stall and the count over 10 ms.
type Stalls = std::sync::Mutex<(Duration, u32)>;
static CLIENT_STALLS: Stalls = std::sync::Mutex::new((Duration::ZERO, 0));
static SERVER_STALLS: Stalls = std::sync::Mutex::new((Duration::ZERO, 0));

/// Measures how late a 1 ms sleep wakes on this runtime (the machine is shared): the
/// longest lateness, and how often it exceeds 10 ms. Runs until aborted or the runtime ends.
async fn probe_stalls(into: &'static Stalls) {
    loop {
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_millis(1)).await;
        // A 1 ms sleep may take up to 2 ms (tokio's timer granularity).
        let late = t0.elapsed().saturating_sub(Duration::from_millis(2));
        let mut s = into.lock().unwrap();
        s.0 = s.0.max(late);
        s.1 += u32::from(late > Duration::from_millis(10));
    }
}

/// Requests the server saw per configuration (by path `/<index>`).
type Seen = Arc<Vec<AtomicUsize>>;

/// The heavy-tail server, counting requests per configuration (path `/<index>`).
async fn serve(seen: Seen) -> FaultServer {
    FaultServer::start(move |i, req| {
        if let Some(c) = req.path[1..]
            .parse::<usize>()
            .ok()
            .and_then(|k| seen.get(k))
        {
            c.fetch_add(1, Ordering::Relaxed);
        }
        Action::DelayUnlessClosed(wait_for(i), Box::new(Action::ok("ok")))
    })
    .await
}

/// Starts the server on a thread (and runtime) of its own; returns its base URL.
fn start_server_thread(seen: Seen) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            tokio::spawn(probe_stalls(&SERVER_STALLS));
            let server = serve(seen).await;
            tx.send(server.url("")).unwrap();
            std::future::pending::<()>().await;
        });
    });
    rx.recv().unwrap()
}

fn client(hedging: Option<Hedging>) -> ClientWithMiddleware {
    let mut retry = RetryMiddleware::builder();
    if let Some(h) = hedging {
        retry = retry.hedging(h);
    }
    let registry = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    // No idle-pool timer: on the paused clock it would be a timer to jump to.
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .build()
        .unwrap();
    ClientBuilder::new(http)
        .with(retry.build().unwrap())
        .with(CircuitBreakerMiddleware::new(registry))
        .with(TransportEvidence::new())
        .build()
}

/// Sends `n` GETs arriving at `RATE` per second (open loop: every configuration offers
/// the same load), at most `CONCURRENCY` in flight; returns each one's latency from its
/// scheduled arrival (a wait for a free slot counts).
async fn run(client: &ClientWithMiddleware, url: &str, n: usize) -> Vec<Duration> {
    let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut tick = tokio::time::interval(Duration::from_secs(1) / RATE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let arrival = tick.tick().await;
        let slot = slots.clone().acquire_owned().await.expect("open");
        let (client, url) = (client.clone(), url.to_owned());
        tasks.spawn(async move {
            let response = client.get(&url).send().await.expect("a response");
            let _ = response.bytes().await.expect("a body");
            drop(slot);
            arrival.elapsed()
        });
    }
    let mut all = Vec::with_capacity(n);
    while let Some(latency) = tasks.join_next().await {
        all.push(latency.unwrap());
    }
    all
}

fn pct(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[rank]
}

struct Row {
    name: String,
    p50: Duration,
    p99: Duration,
    p999: Duration,
    extra: f64,
    wall: Duration,
    /// Requests that took 400 ms or more: a slow answer no hedge rescued.
    slow: usize,
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn configs() -> Vec<(String, Option<Hedging>)> {
    vec![
        ("no hedging".into(), None),
        (
            "fixed 10 ms".into(),
            Some(Hedging::fixed(Duration::from_millis(10))),
        ),
        ("adaptive p90".into(), Some(Hedging::adaptive(0.90))),
        ("adaptive p95".into(), Some(Hedging::adaptive(0.95))),
        ("adaptive p97".into(), Some(Hedging::adaptive(0.97))),
        ("adaptive p99".into(), Some(Hedging::adaptive(0.99))),
    ]
}

/// Runs every configuration at once against the server at `base_url`.
async fn measure(base_url: &str, seen: &Seen, n: usize) -> Vec<Row> {
    let configs = configs();
    let clients: Vec<(ClientWithMiddleware, String)> = configs
        .iter()
        .enumerate()
        .map(|(i, (_, h))| (client(h.clone()), format!("{base_url}/{i}")))
        .collect();
    let all = |count: usize| {
        let runs: Vec<_> = clients
            .iter()
            .map(|(c, url)| {
                let (c, url) = (c.clone(), url.clone());
                tokio::spawn(async move {
                    let t0 = Instant::now();
                    let latencies = run(&c, &url, count).await;
                    (latencies, t0.elapsed())
                })
            })
            .collect();
        async move {
            let mut out = Vec::new();
            for r in runs {
                out.push(r.await.unwrap());
            }
            out
        }
    };
    all(WARMUP).await;
    let before: Vec<usize> = seen.iter().map(|s| s.load(Ordering::Relaxed)).collect();
    let results = all(n).await;
    let sent = seen
        .iter()
        .zip(before)
        .map(|(s, b)| s.load(Ordering::Relaxed) - b);
    configs
        .into_iter()
        .zip(results)
        .zip(sent)
        .map(|(((name, _), (mut lat, wall)), sent)| {
            lat.sort();
            let count = lat.len();
            Row {
                name,
                p50: pct(&lat, 0.50),
                p99: pct(&lat, 0.99),
                p999: pct(&lat, 0.999),
                extra: (sent as f64 - count as f64) / count as f64,
                wall,
                slow: lat
                    .iter()
                    .filter(|l| **l >= Duration::from_millis(400))
                    .count(),
            }
        })
        .collect()
}

fn new_seen() -> Seen {
    Arc::new((0..configs().len()).map(|_| AtomicUsize::new(0)).collect())
}

fn main() {
    let n: usize = std::env::var("HEDGING_BENCH_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    println!(
        "{n} GETs per configuration at {RATE}/s each, all configurations at once, at most \
         {CONCURRENCY} in flight each; server: {} % after ~500 ms, else ~2 ms",
        SLOW_PER_MILLE as f64 / 10.0
    );

    let seen = new_seen();
    let url = start_server_thread(seen.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (real, stalls) = rt.block_on(async {
        let probe = tokio::spawn(probe_stalls(&CLIENT_STALLS));
        let rows = measure(&url, &seen, n).await;
        probe.abort();
        (rows, *CLIENT_STALLS.lock().unwrap())
    });
    // The figures' context: a loaded machine stretches the tails of every configuration.
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    let server_stalls = *SERVER_STALLS.lock().unwrap();
    print_rows(
        &format!(
            "load average {load}; stalls (a 1 ms sleep waking late): client longest {} ms, \
             {} over 10 ms; server longest {} ms, {} over 10 ms",
            ms(stalls.0),
            stalls.1,
            ms(server_stalls.0),
            server_stalls.1
        ),
        &real,
    );
}

fn print_rows(title: &str, rows: &[Row]) {
    let (base_p50, base_p999) = (rows[0].p50, rows[0].p999);
    println!("\n{title}\n");
    println!(
        "| configuration | p50 ms | p99 ms | p99.9 ms | extra requests | p99.9 cut | p50 vs none | ≥ 400 ms | run s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {:.2} % | {:.1}× | {:+.1} % | {} | {:.2} |",
            r.name,
            ms(r.p50),
            ms(r.p99),
            ms(r.p999),
            r.extra * 100.0,
            base_p999.as_secs_f64() / r.p999.as_secs_f64(),
            (r.p50.as_secs_f64() / base_p50.as_secs_f64() - 1.0) * 100.0,
            r.slow,
            r.wall.as_secs_f64(),
        );
    }
}
