//! Requests per second through `ClientWithMiddleware` + `TransportEvidence`, against the bare
//! `reqwest::Client`, on a loopback keep-alive HTTP/1.1 server in the same process.
//!
//! ```text
//! cargo bench --bench transport
//! TRANSPORT_BENCH_ROUNDS=40 TRANSPORT_BENCH_REQUESTS=8000 cargo bench --bench transport
//! ```
//!
//! The two clients take turns (ABBA order, so drift in machine load hits both alike) for a
//! number of rounds; each round sends the same number of GETs from `CONCURRENCY` tasks. The
//! ratio reported is evidence ÷ bare over the summed rounds (goal ≥ 0.99), plus the median
//! of the per-round ratios. The server is a minimal loop (read a head, write a fixed
//! response) so that its cost does not hide the client side's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::TransportEvidence;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const CONCURRENCY: usize = 8;

/// Counts allocations, so the bench can report allocations per request: unlike time, an
/// exact number that other processes on the machine cannot disturb.
struct CountingAllocator;

static ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a
// relaxed atomic and never allocates.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, passed on as is.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as above, for `dealloc`.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: as above, for `realloc`.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn allocations() -> u64 {
    ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed)
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A keep-alive server that answers every GET with `200 OK` and a 2-byte body.
async fn start_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut filled = 0;
                loop {
                    match stream.read(&mut buf[filled..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => filled += n,
                    }
                    // Answer every complete head in the buffer (GETs carry no body).
                    while let Some(end) = buf[..filled].windows(4).position(|w| w == b"\r\n\r\n") {
                        let head_len = end + 4;
                        if stream
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .await
                            .is_err()
                        {
                            return;
                        }
                        buf.copy_within(head_len..filled, 0);
                        filled -= head_len;
                    }
                    if filled == buf.len() {
                        return; // a head larger than the buffer: not a client of this bench
                    }
                }
            });
        }
    });
    addr
}

#[derive(Clone)]
enum Subject {
    Bare(reqwest::Client),
    /// `ClientWithMiddleware` with no middleware: what reqwest-middleware itself costs.
    Empty(ClientWithMiddleware),
    /// One middleware that only calls `next.run`: what any one middleware layer costs.
    Passthrough(ClientWithMiddleware),
    Evidence(ClientWithMiddleware),
}

impl Subject {
    async fn get(&self, url: &str) {
        let response = match self {
            Subject::Bare(c) => c.get(url).send().await.expect("bare request"),
            Subject::Empty(c) | Subject::Passthrough(c) | Subject::Evidence(c) => {
                c.get(url).send().await.expect("middleware request")
            }
        };
        assert_eq!(response.status(), 200);
        let body = response.bytes().await.expect("body");
        assert_eq!(&body[..], b"ok");
    }
}

/// CPU time used so far by every thread of this process, in nanoseconds (Linux
/// `/proc/self/task/*/schedstat`), or `None` where that is not available.
///
/// Wall-clock requests/s on a shared 2-core machine swing with whatever else runs; CPU time
/// per request is what the middleware adds, and it is far less sensitive to neighbours.
fn cpu_ns() -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

struct Sample {
    requests_per_sec: f64,
    cpu_ns_per_request: Option<f64>,
    /// Client and server together: the server's share is the same for every subject.
    allocations_per_request: f64,
}

/// Sends `requests` GETs from `CONCURRENCY` tasks.
async fn round(subject: &Subject, url: &Arc<str>, requests: usize) -> Sample {
    let per_task = requests / CONCURRENCY;
    let cpu_before = cpu_ns();
    let allocations_before = allocations();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (subject, url) = (subject.clone(), url.clone());
        tasks.spawn(async move {
            for _ in 0..per_task {
                subject.get(&url).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("bench task");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let allocated = allocations() - allocations_before;
    let sent = (per_task * CONCURRENCY) as f64;
    let cpu = cpu_before
        .zip(cpu_ns())
        .map(|(b, a)| a.saturating_sub(b) as f64 / sent);
    Sample {
        requests_per_sec: sent / elapsed,
        cpu_ns_per_request: cpu,
        allocations_per_request: allocated as f64 / sent,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

#[path = "../tests/support/pass_through.rs"]
mod pass_through;
use pass_through::Passthrough;

const BARE: usize = 0;
const EMPTY: usize = 1;
const PASSTHROUGH: usize = 2;
const EVIDENCE: usize = 3;

fn main() {
    let rounds = env_or("TRANSPORT_BENCH_ROUNDS", 20);
    let requests = env_or("TRANSPORT_BENCH_REQUESTS", 8_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let addr = start_server().await;
        let url: Arc<str> = format!("http://{addr}/bench").into();
        let subjects = [
            Subject::Bare(client()),
            Subject::Empty(ClientBuilder::new(client()).build()),
            Subject::Passthrough(ClientBuilder::new(client()).with(Passthrough).build()),
            Subject::Evidence(
                ClientBuilder::new(client())
                    .with(TransportEvidence::new())
                    .build(),
            ),
        ];
        let names = [
            "bare reqwest::Client",
            "ClientWithMiddleware, no middleware",
            "ClientWithMiddleware + pass-through",
            "ClientWithMiddleware + TransportEvidence",
        ];

        // Warm-up: open the pools' connections and fault in the code paths.
        for subject in &subjects {
            round(subject, &url, requests / 4).await;
        }

        let mut rps: [Vec<f64>; 4] = Default::default();
        let mut cpu: [Vec<f64>; 4] = Default::default();
        let mut allocs: [Vec<f64>; 4] = Default::default();
        for r in 0..rounds {
            // Rotate the order each round so drift in machine load hits all subjects alike.
            for k in 0..subjects.len() {
                let i = (k + r) % subjects.len();
                let sample = round(&subjects[i], &url, requests).await;
                rps[i].push(sample.requests_per_sec);
                allocs[i].push(sample.allocations_per_request);
                if let Some(ns) = sample.cpu_ns_per_request {
                    cpu[i].push(ns);
                }
            }
            println!(
                "round {r:2}: req/s bare {:7.0}  empty {:7.0}  pass-through {:7.0}  evidence {:7.0}   evidence/bare {:.4}",
                rps[BARE][r],
                rps[EMPTY][r],
                rps[PASSTHROUGH][r],
                rps[EVIDENCE][r],
                rps[EVIDENCE][r] / rps[BARE][r]
            );
        }

        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let ratios = |num: &[f64], den: &[f64]| -> Vec<f64> {
            num.iter().zip(den).map(|(n, d)| n / d).collect()
        };
        println!(
            "transport: {rounds} rounds x {requests} GETs, concurrency {CONCURRENCY}, 2 worker threads"
        );
        for i in 0..subjects.len() {
            let cpu_text = if cpu[i].is_empty() {
                String::from("n/a")
            } else {
                format!("{:6.0} ns", median(&cpu[i]))
            };
            println!(
                "{:42}: {:8.0} req/s (mean), CPU per request {cpu_text} (median), {:.2} allocations per request (mean)",
                names[i],
                mean(&rps[i]),
                mean(&allocs[i])
            );
        }
        for (label, i, base) in [
            ("evidence/bare      ", EVIDENCE, BARE),
            ("empty/bare         ", EMPTY, BARE),
            ("evidence/passthru  ", EVIDENCE, PASSTHROUGH),
        ] {
            let cpu_text = if cpu.iter().all(|c| c.len() == rounds) {
                // Requests per CPU-second as a ratio: base CPU/request ÷ subject CPU/request.
                format!("{:.4}", median(&ratios(&cpu[base], &cpu[i])))
            } else {
                String::from("n/a")
            };
            println!(
                "ratio {label}: throughput {:.4} (means), {:.4} (median of rounds); requests per CPU-second {cpu_text} (median)",
                mean(&rps[i]) / mean(&rps[base]),
                median(&ratios(&rps[i], &rps[base])),
            );
        }
        let ratio = median(&ratios(&rps[EVIDENCE], &rps[BARE]));
        println!(
            "goal evidence/bare >= 0.99 (throughput, median of rounds): {} ({ratio:.4})",
            if ratio >= 0.99 { "met" } else { "NOT met" }
        );
    });
}
