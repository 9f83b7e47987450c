//! Soak: mixed traffic for minutes with 10⁶ distinct origins cycling through one bounded
//! `BreakerRegistry` (through the breaker middleware, ending in a stand-in transport that
//! answers without a network, and the registry's `pause`), while loopback requests go
//! through the full stack sharing that registry. Resident memory must stay flat
//! once the registry is full: the registry forgets cold breakers instead of growing.
//!
//! Not in CI (it runs for minutes):
//!
//! ```text
//! cargo test --release --test soak -- --ignored --nocapture
//! ```
//!
//! `SOAK_SECS` (default 600) sets the duration. CI runs a short version with the same checks
//! on a smaller scale, ended by a count of work done (two full cycles of the origins and
//! some loopback requests), never by the clock: a slow machine takes longer, it does not
//! fail. `VmRSS` is read from `/proc/self/status` (Linux).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http::Extensions;
use reqwest::{Request, Response, ResponseBuilderExt};
use reqwest_middleware::{ClientBuilder, Middleware, Next};
use reqwest_resilience::breaker::{
    BreakerConfig, BreakerRegistry, BreakerState, CircuitBreakerMiddleware,
};
use reqwest_resilience::{Origin, Resilience};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Resident memory in KiB, from `/proc/self/status`.
fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A keep-alive HTTP/1.1 server that answers every request `200 ok` and keeps no record
/// (the shared fault server records every request, which would grow over a soak).
async fn tiny_server() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut pending = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => pending.extend_from_slice(&buf[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
                    let body_len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while pending.len() < end + 4 + body_len {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => pending.extend_from_slice(&buf[..n]),
                        }
                    }
                    pending.drain(..end + 4 + body_len);
                    let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if stream.write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, task)
}

/// The end of the churn's stack: `500` for a request carrying `x-fail`, else `200`,
/// without a network (10⁶ origins cannot all be loopback servers).
struct Answer;

#[async_trait::async_trait]
impl Middleware for Answer {
    async fn handle(
        &self,
        req: Request,
        _: &mut Extensions,
        _: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let status = if req.headers().contains_key("x-fail") {
            500
        } else {
            200
        };
        Ok(Response::from(
            http::Response::builder()
                .status(status)
                .url(req.url().clone())
                .body(Vec::<u8>::new())
                .unwrap(),
        ))
    }
}

struct Soak {
    origins: u64,
    max_origins: usize,
    until: Until,
}

/// When a soak ends.
#[derive(Clone, Copy)]
enum Until {
    /// After this many full cycles of the origins and at least `MIN_REQUESTS` loopback
    /// requests, however long that takes (bounded by `GENEROUS`, a hang guard only).
    Cycles(u64),
    /// After this much wall-clock time (the long run, by hand).
    Elapsed(Duration),
}

/// Loopback requests a count-ended soak waits for (every lane's loop ran).
const MIN_REQUESTS: u64 = 20;

/// The hang guard of a count-ended soak: far beyond what the slowest machine needs.
const GENEROUS: Duration = Duration::from_secs(300);

struct SoakReport {
    rss_start_kib: u64,
    rss_warm_kib: u64,
    rss_end_kib: u64,
    registry_ops: u64,
    http_requests: u64,
    cycles: u64,
    elapsed: Duration,
}

fn soak(s: Soak) -> SoakReport {
    let rss_start_kib = vm_rss_kib();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let config = BreakerConfig::default()
            .max_origins(s.max_origins)
            .open_duration(Duration::from_millis(200));
        let registry = BreakerRegistry::new(config).unwrap();
        let (addr, server) = tiny_server().await;
        let client = Resilience::new()
            .breaker(registry.clone())
            .build(reqwest::Client::builder().no_proxy().build().unwrap())
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let http_requests = Arc::new(AtomicU64::new(0));

        // Real traffic: two loops through the full stack, GETs and POSTs.
        let mut traffic = tokio::task::JoinSet::new();
        for lane in 0..2u64 {
            let (client, stop, count) = (client.clone(), stop.clone(), http_requests.clone());
            let url = format!("http://{addr}/lane/{lane}");
            traffic.spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let request = if n.is_multiple_of(3) {
                        client.post(&url).body(vec![b'x'; 256])
                    } else {
                        client.get(&url)
                    };
                    let response = request.send().await.expect("loopback request");
                    assert_eq!(response.status(), 200);
                    assert_eq!(response.text().await.unwrap(), "ok");
                    n += 1;
                    count.fetch_add(1, Ordering::Relaxed);
                }
            });
        }

        // Registry churn: origin i of 10⁶, one attempt each through the breaker middleware,
        // about 1 % failures (so some breakers open and must be kept), and now and then a
        // server-directed pause.
        let churn = {
            let (registry, http_requests) = (registry.clone(), http_requests.clone());
            let breaker = ClientBuilder::new(reqwest::Client::new())
                .with(CircuitBreakerMiddleware::new(registry.clone()))
                .with(Answer)
                .build();
            tokio::spawn(async move {
                let (mut ops, mut i, mut rss_warm, mut cycles) = (0u64, 0u64, 0u64, 0u64);
                let started = std::time::Instant::now();
                while !done(s.until, cycles, &http_requests, started) {
                    let url = format!("https://h{}.example.test/", i % s.origins);
                    let origin = Origin::parse(&url).unwrap();
                    let mut request = breaker.get(&url);
                    if i % 97 < 5 {
                        request = request.header("x-fail", "1");
                    }
                    // An open breaker turns the request away: an `Err`, as `acquire`'s was.
                    if let Ok(response) = request.send().await {
                        assert_eq!(response.status(), if i % 97 < 5 { 500 } else { 200 });
                    }
                    if i.is_multiple_of(10_007) {
                        registry.pause(&origin, Duration::from_millis(50));
                    }
                    assert!(registry.len() <= s.max_origins);
                    ops += 1;
                    i += 1;
                    if i.is_multiple_of(s.origins) {
                        cycles += 1;
                        if cycles == 1 {
                            // Warm: the registry is full and every origin was seen once.
                            rss_warm = vm_rss_kib();
                        }
                    }
                    if i.is_multiple_of(1024) {
                        tokio::task::yield_now().await;
                    }
                }
                (ops, rss_warm, cycles, started.elapsed())
            })
        };

        let (registry_ops, rss_warm_kib, cycles, elapsed) = churn.await.unwrap();
        stop.store(true, Ordering::Relaxed);
        while let Some(joined) = traffic.join_next().await {
            joined.unwrap();
        }
        server.abort();
        assert!(registry.len() <= s.max_origins);
        let loopback = Origin::parse(&format!("http://{addr}/")).unwrap();
        assert_eq!(registry.state(&loopback), Some(BreakerState::Closed));
        SoakReport {
            rss_start_kib,
            rss_warm_kib,
            rss_end_kib: vm_rss_kib(),
            registry_ops,
            http_requests: http_requests.load(Ordering::Relaxed),
            cycles,
            elapsed,
        }
    })
}

/// Whether the churn loop is done: its count reached (or the hang guard passed), or its
/// time is up.
fn done(until: Until, cycles: u64, http_requests: &AtomicU64, started: std::time::Instant) -> bool {
    match until {
        Until::Cycles(n) => {
            (cycles >= n && http_requests.load(Ordering::Relaxed) >= MIN_REQUESTS)
                || started.elapsed() >= GENEROUS
        }
        Until::Elapsed(d) => started.elapsed() >= d,
    }
}

fn check(r: &SoakReport) {
    eprintln!(
        "soak: {} registry operations ({} full cycles of the origins), {} loopback requests; \
         VmRSS start {} KiB, warm {} KiB, end {} KiB",
        r.registry_ops, r.cycles, r.http_requests, r.rss_start_kib, r.rss_warm_kib, r.rss_end_kib
    );
    assert!(r.http_requests > 0);
    assert!(
        r.cycles >= 2,
        "the origins cycled through the registry more than once"
    );
    // Flat: after the first cycle filled the registry, later cycles add no more than
    // allocator noise (the registry's bound is 10⁴ breakers of ~300 bytes: 3 MiB).
    assert!(
        r.rss_end_kib <= r.rss_warm_kib + 16 * 1024,
        "RSS grew from {} KiB to {} KiB",
        r.rss_warm_kib,
        r.rss_end_kib
    );
}

#[test]
fn soak_short_20_000_origins_cycle_twice_through_a_bounded_registry() {
    let r = soak(Soak {
        origins: 20_000,
        max_origins: 2_000,
        until: Until::Cycles(2),
    });
    check(&r);
    assert!(
        r.elapsed < GENEROUS,
        "ended by its count, not by the hang guard"
    );
    assert!(
        r.registry_ops >= 2 * 20_000,
        "two full cycles: {}",
        r.registry_ops
    );
    assert!(r.http_requests >= MIN_REQUESTS);
}

#[test]
#[ignore = "long: cargo test --release --test soak -- --ignored --nocapture"]
fn soak_one_million_origins_for_ten_minutes_keeps_resident_memory_flat() {
    let secs = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let r = soak(Soak {
        origins: 1_000_000,
        max_origins: 10_000,
        until: Until::Elapsed(Duration::from_secs(secs)),
    });
    check(&r);
}
