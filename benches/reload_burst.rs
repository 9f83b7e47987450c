//! A graceful reload under load, on loopback: `cargo bench --bench reload_burst` (figures in BENCHMARKS.md)
//!
//! A keep-alive HTTP/1.1 server on 127.0.0.1 answers every GET `200` after a few
//! milliseconds. Twice during a burst of 300 GETs at concurrency 50 (after its 100th and
//! 200th answer) it "reloads": every open connection is closed at once, the requests read
//! on them and not yet answered included (what a graceful reload of nginx, haproxy,
//! apache2 or caddy does to the pooled keep-alive connections a client is writing on).
//!
//! The burst runs through the whole stack with its defaults (`Resilience::new()`, a
//! breaker registry with a transition listener), then through a bare `reqwest::Client`.
//! Printed per run: requests delivered, GETs the server answered more than once, the
//! attempts that failed on a closed connection, and the breaker's transitions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry};
use reqwest_resilience::{AttemptHistory, FailureKind, Resilience};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

const REQUESTS: usize = 300;
const CONCURRENCY: usize = 50;
const RELOAD_AT: [usize; 2] = [100, 200];

struct Server {
    url: String,
    answered: Arc<Mutex<HashMap<String, usize>>>,
}

/// The reloading server; see the module docs.
async fn server() -> std::io::Result<Server> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let answered = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let (reload, reloads) = watch::channel(0usize);
    let reload = Arc::new(reload);
    let a = answered.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (answered, count, reload) = (a.clone(), count.clone(), reload.clone());
            let mut reloads = reloads.clone();
            reloads.mark_unchanged();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // A reload closes the connection whatever it is doing.
                    let path = tokio::select! {
                        path = read_head(&mut stream, &mut buf) => path,
                        _ = reloads.changed() => return,
                    };
                    let Some(path) = path else { return };
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(5)) => {}
                        _ = reloads.changed() => return,
                    }
                    *answered.lock().unwrap().entry(path).or_default() += 1;
                    let out = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if stream.write_all(out).await.is_err() {
                        return;
                    }
                    let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                    if RELOAD_AT.contains(&n) {
                        reload.send_modify(|g| *g += 1);
                    }
                }
            });
        }
    });
    Ok(Server { url, answered })
}

/// Reads one request head (GETs only: no body); its path, `None` at EOF.
async fn read_head(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            return head.split(' ').nth(1).map(str::to_owned);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

#[derive(Default)]
struct Tally {
    delivered: usize,
    closed_attempts: usize,
    rejected_attempts: usize,
    took: Duration,
}

async fn burst_stack(
    url: &str,
    deadline: Option<Duration>,
) -> Result<(Tally, Vec<String>), Box<dyn std::error::Error>> {
    let transitions = Arc::new(Mutex::new(Vec::new()));
    let t = transitions.clone();
    let registry = BreakerRegistry::with_listener(BreakerConfig::default(), move |e| {
        t.lock()
            .unwrap()
            .push(format!("{:?}->{:?} ({:?})", e.from, e.to, e.cause));
    })?;
    let stack = Resilience::new().breaker(registry);
    let stack = match deadline {
        Some(d) => stack.retry(reqwest_resilience::RetryMiddleware::builder().total_deadline(d)),
        None => stack,
    };
    let client = stack.build_from(reqwest::Client::builder().no_proxy())?;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let start = std::time::Instant::now();
    futures_util::stream::iter(0..REQUESTS)
        .for_each_concurrent(CONCURRENCY, |i| {
            let (client, tally) = (client.clone(), tally.clone());
            let url = format!("{url}/get/{i}");
            async move {
                let mut ext = http::Extensions::new();
                let req = client.get(&url).build().unwrap();
                let result = tokio::time::timeout(
                    Duration::from_secs(120),
                    client.execute_with_extensions(req, &mut ext),
                )
                .await;
                let closed = AttemptHistory::of(&ext).map_or(0, |h| {
                    h.attempts()
                        .iter()
                        .filter(|a| {
                            matches!(
                                a.evidence.failure,
                                Some(FailureKind::Closed | FailureKind::Reset)
                            )
                        })
                        .count()
                });
                let rejected = AttemptHistory::of(&ext).map_or(0, |h| {
                    h.attempts()
                        .iter()
                        .filter(|a| a.evidence.failure == Some(FailureKind::BreakerOpen))
                        .count()
                });
                let mut t = tally.lock().unwrap();
                t.closed_attempts += closed;
                t.rejected_attempts += rejected;
                if matches!(result, Ok(Ok(ref r)) if r.status() == 200) {
                    t.delivered += 1;
                }
            }
        })
        .await;
    let mut tally = std::mem::take(&mut *tally.lock().unwrap());
    tally.took = start.elapsed();
    let transitions = transitions.lock().unwrap().clone();
    Ok((tally, transitions))
}

async fn burst_reqwest(url: &str) -> Result<Tally, Box<dyn std::error::Error>> {
    let client = reqwest::Client::builder().no_proxy().build()?;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let start = std::time::Instant::now();
    futures_util::stream::iter(0..REQUESTS)
        .for_each_concurrent(CONCURRENCY, |i| {
            let (client, tally) = (client.clone(), tally.clone());
            let url = format!("{url}/get/{i}");
            async move {
                let result =
                    tokio::time::timeout(Duration::from_secs(120), client.get(&url).send()).await;
                let mut t = tally.lock().unwrap();
                match result {
                    Ok(Ok(r)) if r.status() == 200 => t.delivered += 1,
                    Ok(Err(_)) => t.closed_attempts += 1,
                    _ => {}
                }
            }
        })
        .await;
    let mut tally = std::mem::take(&mut *tally.lock().unwrap());
    tally.took = start.elapsed();
    Ok(tally)
}

fn twice(server: &Server) -> usize {
    server
        .answered
        .lock()
        .unwrap()
        .values()
        .filter(|&&n| n > 1)
        .count()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    println!("{REQUESTS} GETs at concurrency {CONCURRENCY}, all connections closed twice");
    for run in 1..=runs {
        for deadline in [None, Some(Duration::from_secs(5))] {
            let s = server().await?;
            let (tally, transitions) = burst_stack(&s.url, deadline).await?;
            println!(
                "run {run} stack (deadline {deadline:?}): delivered {}/{REQUESTS} in {:.1?}, \
                 answered twice {}, attempts cut {}, rejected by the breaker {}, transitions {} \
                 {:?}",
                tally.delivered,
                tally.took,
                twice(&s),
                tally.closed_attempts,
                tally.rejected_attempts,
                transitions.len(),
                transitions
            );
        }
        let s = server().await?;
        let tally = burst_reqwest(&s.url).await?;
        println!(
            "run {run} reqwest: delivered {}/{REQUESTS} in {:.1?}, answered twice {}, failed {}",
            tally.delivered,
            tally.took,
            twice(&s),
            tally.closed_attempts
        );
    }
    Ok(())
}
