//! Goodput under overload, with and without a concurrency limit (a plain binary: `cargo
//! bench --bench overload`, about a minute; results and machine in BENCHMARKS.md).
//!
//! The server, on loopback, has **16 handlers with a 5 ms service time** (threads that
//! sleep, so the service time does not round to tokio's 1 ms timer): a capacity of 3 200
//! requests per second. Requests beyond 16 wait in its FIFO queue, and it serves them even
//! after their client gave up (like most servers: nothing tells a handler that its caller
//! left). The client sends **open-loop arrivals at 2× capacity** (6 400/s, in batches
//! every millisecond) for `OVERLOAD_SECS` seconds (default 10) per configuration, each
//! request with a **50 ms deadline** (a [`Deadline`] in its extensions, and a timeout at
//! it). The stack is `ConcurrencyLimit → TransportEvidence` (no retry: the arrivals are
//! the load), in four configurations: no limit, a fixed limit of 16, of 64, and the
//! adaptive limit with its defaults (it is not told the capacity).
//!
//! Reported per configuration: goodput (answers within the deadline, per second and as
//! a share of capacity), p50 / p99 latency of the *admitted* requests (a request cut at
//! its deadline counts as 50 ms), local rejections, timeouts, the server's work spent on
//! requests whose client had already given up (share of the requests it served during the
//! run) and the backlog left in its queue at the end.
//!
//! Then the mixed-latency runs (issue 21): the same 16 handlers, each answer 5 ms or
//! 50 ms at random by request id (independent of load, a capacity of 582 requests/s):
//! 12 callers in a closed loop below capacity (the adaptive limit should reject none), and
//! 2x open-loop overload with 200 ms deadlines (and 50 ms, which cuts every slow answer).
//!
//! Then the cost of one rejection, in nanoseconds, in the same run: a request turned away
//! by the middleware (`ClientWithMiddleware::execute`, evidence and error included; the
//! limit's one permit held by a request that is never answered) against a request the
//! same stack lets through to an innermost middleware that answers `200` at once. (The
//! registry's `try_acquire` alone is crate-private, so no longer measured by itself.)

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::limit::{ConcurrencyLimit, Gradient, LimiterConfig, LimiterRegistry};
use reqwest_resilience::retry::Deadline;
use reqwest_resilience::{Origin, ResilienceError, TransportEvidence};
use tokio::time::Instant;

#[path = "../tests/support/answer200.rs"]
mod answer200;

const HANDLERS: usize = 16;
const SERVICE: Duration = Duration::from_millis(5);
const SLOW: Duration = Duration::from_millis(50);
const DEADLINE: Duration = Duration::from_millis(50);
const CAPACITY: f64 = HANDLERS as f64 / 0.005;

/// One run's setting: the server's service times, the deadline, and the load.
#[derive(Clone, Copy)]
struct Setup {
    /// 5 ms or 50 ms at random (by request id, independent of load) instead of 5 ms.
    mixed: bool,
    deadline: Duration,
    /// `Some(n)`: `n` callers in a closed loop; `None`: open-loop arrivals at 2x capacity.
    callers: Option<usize>,
}

impl Setup {
    const OVERLOAD: Setup = Setup {
        mixed: false,
        deadline: DEADLINE,
        callers: None,
    };

    fn capacity(&self) -> f64 {
        if self.mixed {
            HANDLERS as f64 / ((SERVICE + SLOW).as_secs_f64() / 2.0)
        } else {
            CAPACITY
        }
    }
}

/// Request `id`'s service time: a fixed pseudo-random choice per id (splitmix64).
fn service(id: usize, mixed: bool) -> Duration {
    if !mixed {
        return SERVICE;
    }
    let mut z = (id as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    if (z ^ (z >> 31)) & 1 == 1 {
        SERVICE
    } else {
        SLOW
    }
}

// ---------------------------------------------------------------------------------------
// The server: a tokio runtime reads requests, 16 threads serve them in FIFO order.

struct Job {
    id: usize,
    done: tokio::sync::oneshot::Sender<()>,
}

struct Server {
    addr: SocketAddr,
    queued: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    served: Arc<Vec<AtomicBool>>,
    served_in_run: Arc<AtomicU64>,
    rt: Option<tokio::runtime::Runtime>,
    handlers: Vec<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(max_ids: usize, mixed: bool) -> Server {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("server runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let queued = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let served: Arc<Vec<AtomicBool>> =
            Arc::new((0..max_ids).map(|_| AtomicBool::new(false)).collect());
        let served_in_run = Arc::new(AtomicU64::new(0));
        let handlers = (0..HANDLERS)
            .map(|_| {
                let (rx, queued, stop, served, count) = (
                    rx.clone(),
                    queued.clone(),
                    stop.clone(),
                    served.clone(),
                    served_in_run.clone(),
                );
                std::thread::spawn(move || {
                    loop {
                        let job = match rx.lock().unwrap().recv() {
                            Ok(job) => job,
                            Err(_) => return,
                        };
                        queued.fetch_sub(1, Ordering::SeqCst);
                        if stop.load(Ordering::SeqCst) {
                            // After the run: drop the backlog instead of serving it.
                            continue;
                        }
                        std::thread::sleep(service(job.id, mixed));
                        served[job.id].store(true, Ordering::SeqCst);
                        count.fetch_add(1, Ordering::SeqCst);
                        let _ = job.done.send(());
                    }
                })
            })
            .collect();
        let q = queued.clone();
        rt.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let (tx, q) = (tx.clone(), q.clone());
                tokio::spawn(serve_connection(stream, tx, q));
            }
        });
        Server {
            addr,
            queued,
            stop,
            served,
            served_in_run,
            rt: Some(rt),
            handlers,
        }
    }

    /// Stops serving (the backlog is dropped) and returns the backlog's size.
    fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        let backlog = self.queued.load(Ordering::SeqCst);
        // Dropping the runtime closes every connection and the job sender.
        drop(self.rt.take());
        for h in self.handlers.drain(..) {
            let _ = h.join();
        }
        backlog
    }
}

async fn serve_connection(
    mut stream: tokio::net::TcpStream,
    jobs: mpsc::Sender<Job>,
    queued: Arc<AtomicUsize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let mut buf = vec![0u8; 8 * 1024];
    let mut filled = 0;
    loop {
        let end = loop {
            if let Some(end) = buf[..filled].windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            match stream.read(&mut buf[filled..]).await {
                Ok(0) | Err(_) => return,
                Ok(n) => filled += n,
            }
            if filled == buf.len() {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let id = head
            .lines()
            .find_map(|l| l.strip_prefix("x-id:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        buf.copy_within(end + 4..filled, 0);
        filled -= end + 4;
        let (done, served) = tokio::sync::oneshot::channel();
        queued.fetch_add(1, Ordering::SeqCst);
        if jobs.send(Job { id, done }).is_err() {
            return;
        }
        // Served whether or not the client is still there.
        if served.await.is_err() || stream.write_all(RESPONSE).await.is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------
// The client: open-loop arrivals, each with a deadline.

#[derive(Clone, Copy)]
enum Outcome {
    Answered(Duration),
    TimedOut,
    Rejected,
    Failed,
}

struct Report {
    name: &'static str,
    capacity: f64,
    offered: usize,
    goodput: f64,
    p50: Duration,
    p99: Duration,
    rejected: usize,
    timed_out: usize,
    failed: usize,
    wasted: f64,
    backlog: usize,
    /// The limit during the run (after its first second): min, mean, max.
    limit_seen: Option<(u32, f64, u32)>,
}

fn client(limit: Option<&LimiterRegistry>) -> ClientWithMiddleware {
    let inner = reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .pool_max_idle_per_host(1024)
        .build()
        .expect("client");
    let mut b = ClientBuilder::new(inner);
    if let Some(registry) = limit {
        b = b.with(ConcurrencyLimit::new(registry.clone()));
    }
    b.with(TransportEvidence::new()).build()
}

fn run(name: &'static str, limit: Option<LimiterConfig>, secs: u64, setup: Setup) -> Report {
    let rate = 2.0 * setup.capacity();
    let max_ids = match setup.callers {
        None => (rate * secs as f64 * 1.1) as usize + 1024,
        // A closed loop below capacity, rejected requests retried after 1 ms: bounded by
        // the callers' pace plus their retries.
        Some(n) => n * (secs as usize * 1_000 + 1024),
    };
    let server = Server::start(max_ids, setup.mixed);
    let url = format!("http://{}/work", server.addr);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime");
    let registry = limit.map(|c| LimiterRegistry::new(c).expect("valid config"));
    let client = client(registry.as_ref());
    let gave_up: Arc<Vec<AtomicBool>> =
        Arc::new((0..max_ids).map(|_| AtomicBool::new(false)).collect());
    let origin = Origin::parse(&url).expect("origin");
    // The limit sampled every 100 ms after the first second: (min, mean, max).
    let mut limits: Vec<u32> = Vec::new();
    let outcomes = rt.block_on(async {
        let start = Instant::now();
        let end = start + Duration::from_secs(secs);
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut tasks = Vec::with_capacity(max_ids);
        let mut due = 0.0f64;
        let mut id = 0usize;
        let mut ticks = 0u64;
        let next_id = Arc::new(AtomicUsize::new(0));
        let mut loops = Vec::new();
        for _ in 0..setup.callers.unwrap_or(0) {
            let (client, url, gave_up, next_id) = (
                client.clone(),
                url.clone(),
                gave_up.clone(),
                next_id.clone(),
            );
            loops.push(tokio::spawn(async move {
                let mut out = Vec::new();
                while Instant::now() < end {
                    let this = next_id.fetch_add(1, Ordering::Relaxed);
                    if this >= max_ids {
                        break;
                    }
                    let o = request(&client, &url, this, &gave_up, setup.deadline).await;
                    out.push((this, o));
                    if matches!(o, Outcome::Rejected) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                out
            }));
        }
        while Instant::now() < end {
            tick.tick().await;
            ticks += 1;
            if ticks.is_multiple_of(100) && start.elapsed() > Duration::from_secs(1) {
                limits.extend(
                    registry
                        .as_ref()
                        .and_then(|r| r.get(&origin))
                        .map(|s| s.limit),
                );
            }
            // Arrivals owed by now (open loop: independent of how the last ones fared).
            let owed = start.elapsed().as_secs_f64() * rate;
            while setup.callers.is_none() && due < owed && id < max_ids {
                due += 1.0;
                let (client, url, gave_up) = (client.clone(), url.clone(), gave_up.clone());
                let this = id;
                id += 1;
                let deadline = setup.deadline;
                tasks.push(tokio::spawn(async move {
                    (this, request(&client, &url, this, &gave_up, deadline).await)
                }));
            }
        }
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.extend(t.await.ok());
        }
        for l in loops {
            out.extend(l.await.unwrap_or_default());
        }
        out
    });
    let served_in_run = server.served_in_run.load(Ordering::SeqCst);
    let wasted = outcomes
        .iter()
        .filter(|&&(i, _)| {
            gave_up[i].load(Ordering::SeqCst) && server.served[i].load(Ordering::SeqCst)
        })
        .count();
    let outcomes: Vec<Outcome> = outcomes.into_iter().map(|(_, o)| o).collect();
    let limit_seen = (!limits.is_empty()).then(|| {
        let mean = limits.iter().map(|&l| f64::from(l)).sum::<f64>() / limits.len() as f64;
        let (min, max) = (limits.iter().min(), limits.iter().max());
        (*min.unwrap_or(&0), mean, *max.unwrap_or(&0))
    });
    let backlog = server.stop();
    drop(rt);
    summarize(
        name,
        &outcomes,
        secs,
        wasted as f64 / served_in_run.max(1) as f64,
        backlog,
        limit_seen,
        setup,
    )
}

async fn request(
    client: &ClientWithMiddleware,
    url: &str,
    id: usize,
    gave_up: &[AtomicBool],
    deadline: Duration,
) -> Outcome {
    let started = Instant::now();
    let deadline = started + deadline;
    let mut extensions = http::Extensions::new();
    extensions.insert(Deadline(deadline));
    let req = match client.get(url).header("x-id", id).build() {
        Ok(r) => r,
        Err(_) => return Outcome::Failed,
    };
    let attempt = async {
        let response = client.execute_with_extensions(req, &mut extensions).await?;
        response
            .bytes()
            .await
            .map_err(reqwest_middleware::Error::from)
    };
    match tokio::time::timeout_at(deadline, attempt).await {
        Ok(Ok(_)) => Outcome::Answered(started.elapsed()),
        Ok(Err(e)) => match ResilienceError::from_middleware_error(&e) {
            Some(ResilienceError::ConcurrencyLimited { .. }) => Outcome::Rejected,
            _ => Outcome::Failed,
        },
        Err(_) => {
            gave_up[id].store(true, Ordering::SeqCst);
            Outcome::TimedOut
        }
    }
}

fn summarize(
    name: &'static str,
    outcomes: &[Outcome],
    secs: u64,
    wasted: f64,
    backlog: usize,
    limit_seen: Option<(u32, f64, u32)>,
    setup: Setup,
) -> Report {
    let mut admitted: Vec<Duration> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Answered(d) => Some(*d),
            Outcome::TimedOut => Some(setup.deadline),
            _ => None,
        })
        .collect();
    admitted.sort();
    let pct = |p: f64| {
        admitted
            .get(((admitted.len() as f64 * p) as usize).min(admitted.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let count = |f: fn(&Outcome) -> bool| outcomes.iter().filter(|o| f(o)).count();
    Report {
        name,
        capacity: setup.capacity(),
        offered: outcomes.len(),
        goodput: count(|o| matches!(o, Outcome::Answered(_))) as f64 / secs as f64,
        p50: pct(0.50),
        p99: pct(0.99),
        rejected: count(|o| matches!(o, Outcome::Rejected)),
        timed_out: count(|o| matches!(o, Outcome::TimedOut)),
        failed: count(|o| matches!(o, Outcome::Failed)),
        wasted,
        backlog,
        limit_seen,
    }
}

// ---------------------------------------------------------------------------------------
// The cost of one rejection.

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

fn rejection_cost() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // `OVERLOAD_COST=rejected|admitted|bare` runs one loop of `OVERLOAD_COST_ITERS`
    // and prints nothing else, for `valgrind --tool=callgrind` (instructions per
    // operation: the difference of two runs with different counts, over the difference).
    let single = std::env::var("OVERLOAD_COST").ok();
    let iters: u32 = std::env::var("OVERLOAD_COST_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50_000);
    rt.block_on(async {
        let origin = Origin::parse("http://127.0.0.1:9").unwrap();
        let registry = LimiterRegistry::new(LimiterConfig::fixed(1)).unwrap();
        // The one permit, held by a request that is never answered.
        let holder = ClientBuilder::new(reqwest::Client::new())
            .with(ConcurrencyLimit::new(registry.clone()))
            .with(NeverAnswers)
            .build();
        let held = tokio::spawn(async move { holder.get("http://127.0.0.1:9/x").send().await });
        while registry.get(&origin).is_none_or(|s| s.in_flight == 0) {
            tokio::task::yield_now().await;
        }
        let through = |r: &LimiterRegistry| {
            ClientBuilder::new(reqwest::Client::new())
                .with(ConcurrencyLimit::new(r.clone()))
                .with(answer200::Answer200)
                .build()
        };
        let full = through(&registry);
        let open = through(&LimiterRegistry::new(LimiterConfig::fixed(1_000)).unwrap());
        // No limiter: the cost of building and executing a request through
        // reqwest-middleware to an innermost answer.
        let bare = ClientBuilder::new(reqwest::Client::new())
            .with(answer200::Answer200)
            .build();
        let requests = |c: &ClientWithMiddleware, n: u32| {
            let c = c.clone();
            async move {
                let t0 = std::time::Instant::now();
                for _ in 0..n {
                    let req = c.get("http://127.0.0.1:9/x").build().unwrap();
                    std::hint::black_box(c.execute(req).await.is_err());
                }
                t0.elapsed().as_nanos() as f64 / f64::from(n)
            }
        };
        let one = match single.as_deref() {
            Some("rejected") => Some(requests(&full, iters).await),
            Some("admitted") => Some(requests(&open, iters).await),
            Some("bare") => Some(requests(&bare, iters).await),
            _ => None,
        };
        if one.is_some() {
            return;
        }
        // Interleaved rounds, median of each.
        let (mut rejected, mut admitted) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            rejected.push(requests(&full, iters).await);
            admitted.push(requests(&open, iters).await);
        }
        for v in [&mut rejected, &mut admitted] {
            v.sort_by(f64::total_cmp);
        }
        held.abort();
        println!();
        // With `RUST_BACKTRACE=1` (and no `RUST_LIB_BACKTRACE=0`) every error of
        // reqwest-middleware (an `anyhow::Error`) captures a backtrace when it is made:
        // that, not the limiter, is most of a rejection's time.
        let backtraces = std::backtrace::Backtrace::capture().status()
            == std::backtrace::BacktraceStatus::Captured;
        println!(
            "cost of one rejection (median of 5 interleaved rounds; library backtraces {})",
            if backtraces {
                "ON: every middleware error captures one"
            } else {
                "off"
            }
        );
        println!(
            "  request rejected by the middleware:   {:>7.0} ns (evidence, history, error)",
            rejected[2]
        );
        println!(
            "  request admitted, answered at once:   {:>7.0} ns (the baseline)",
            admitted[2]
        );
    });
}

fn main() {
    let secs: u64 = std::env::var("OVERLOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    if std::env::var("OVERLOAD_COST").is_ok() {
        return rejection_cost();
    }
    let only = std::env::var("OVERLOAD_ONLY").ok();
    println!(
        "server: {HANDLERS} handlers x {SERVICE:?} = {CAPACITY:.0} req/s; open-loop arrivals at \
         {:.0} req/s for {secs} s per configuration; deadline {DEADLINE:?}",
        2.0 * CAPACITY
    );
    let mut configs: Vec<(&'static str, Option<LimiterConfig>, Setup)> = vec![
        ("no limit", None, Setup::OVERLOAD),
        ("fixed 16", Some(LimiterConfig::fixed(16)), Setup::OVERLOAD),
        ("fixed 64", Some(LimiterConfig::fixed(64)), Setup::OVERLOAD),
        ("adaptive", Some(LimiterConfig::default()), Setup::OVERLOAD),
    ];
    // `OVERLOAD_EXTRA=1`: the adaptive limit with a tighter latency tolerance, to show
    // the trade-off between admitted latency and goodput.
    if std::env::var("OVERLOAD_EXTRA").is_ok() {
        configs.push((
            "adaptive, tolerance 1.25",
            Some(LimiterConfig::adaptive(Gradient::default().tolerance(1.25))),
            Setup::OVERLOAD,
        ));
    }
    // Mixed latency (issue 21): the same 16 handlers, each answer 5 ms or 50 ms at random
    // (independent of load): a capacity of 16 / 27.5 ms = 582 req/s. Below capacity: 12
    // callers in a closed loop. At 2x: open-loop arrivals, with a deadline of 200 ms
    // (4x the slow answer: a 50 ms deadline would cut every slow answer, whatever the
    // limit) and, to show it, with 50 ms.
    let mixed = |callers, deadline| Setup {
        mixed: true,
        deadline,
        callers,
    };
    configs.extend([
        (
            "mixed, 12 callers, adaptive",
            Some(LimiterConfig::default()),
            mixed(Some(12), Duration::from_secs(1)),
        ),
        (
            "mixed, 2x, no limit",
            None,
            mixed(None, Duration::from_millis(200)),
        ),
        (
            "mixed, 2x, adaptive",
            Some(LimiterConfig::default()),
            mixed(None, Duration::from_millis(200)),
        ),
        (
            "mixed, 2x, adaptive, 50 ms deadline",
            Some(LimiterConfig::default()),
            mixed(None, DEADLINE),
        ),
    ]);
    let mut reports = Vec::new();
    for (name, config, setup) in configs {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        reports.push(run(name, config, secs, setup));
    }
    println!(
        "\n| limit | offered | goodput/s | of capacity | admitted p50 | admitted p99 | rejected | timed out | failed | server work on abandoned | backlog at end | limit min / mean / max |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &reports {
        println!(
            "| {} | {} | {:.0} | {:.1} % | {:.1} ms | {:.1} ms | {} ({:.2} %) | {} | {} | {:.1} % | {} | {} |",
            r.name,
            r.offered,
            r.goodput,
            100.0 * r.goodput / r.capacity,
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            r.rejected,
            100.0 * r.rejected as f64 / r.offered.max(1) as f64,
            r.timed_out,
            r.failed,
            100.0 * r.wasted,
            r.backlog,
            r.limit_seen.map_or("-".to_owned(), |(min, mean, max)| {
                format!("{min} / {mean:.1} / {max}")
            }),
        );
    }
    rejection_cost();
}
