//! One burst of requests against a [`RealServer`], through the stack as users deploy it
//! (`Resilience::new().retry(RetryMiddleware::builder().attempt_timeout(ATTEMPT_TIMEOUT))
//! .breaker(registry).build_from(reqwest::Client::builder())`, the registry's listener
//! recording every transition) and then through a bare `reqwest::Client`, with the
//! executions read from the server's own access log.
//!
//! The attempt timeout is the stack's bound on an attempt hyper never answers: over h2c,
//! a connection rotated by `GOAWAY` now and then leaves requests queued inside
//! reqwest/hyper that are never sent and never failed (reqwest#1323, hyper#2500; bare
//! reqwest hangs the same way, see [`ATTEMPT_TIMEOUT`]). Without it,
//! neither client ever answers them; with it, the stack cuts them (`Unknown`/`Timeout`:
//! a GET is retried, a POST stops `MayHaveBeenProcessed`) and the run counts them
//! ([`Run::cut`]).
//!
//! Request `i` of a burst is a POST when `i` is even (or always, `posts_only`), a GET when
//! odd, and carries
//! `x-request-id: {run}-{i}` (`run` is `stack` or `bare`). `concurrency` tasks take the
//! next index in turn, so connections are reused as a pooled client reuses them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Extensions, Method};
use reqwest_middleware::ClientWithMiddleware;
use reqwest_resilience::breaker::{BreakerConfig, BreakerEvent, BreakerRegistry};
use reqwest_resilience::retry::{RetryOutcome, StopReason};
use reqwest_resilience::{AttemptHistory, FailureKind, Resilience, RetryMiddleware, Transmission};
use tokio::task::JoinSet;

use super::{Execution, Protocol, RealServer, Scenario};

/// The routine event a burst meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Connections rotated by the server's per-connection request limit.
    Rotation,
    /// Idle keep-alive connections closed by the server between waves.
    IdleClose,
    /// Two graceful reloads during the burst.
    Reload,
}

/// A scenario: the event, the server's config for it and the burst's shape.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub event: Event,
    pub scenario: Scenario,
    pub requests: usize,
    pub concurrency: usize,
    /// Waves of `requests / waves` requests, `pause` between two (IdleClose); a Reload
    /// burst has two reloads inside it (at a third and two thirds of its requests).
    pub waves: usize,
    pub pause: Duration,
    /// Every request a POST (else POSTs and GETs alternate).
    pub posts_only: bool,
}

impl Shape {
    /// The test's scenarios: 200 requests (100 POSTs, 100 GETs) at concurrency 32; for
    /// the reloads, 400 at concurrency 50.
    pub fn of(event: Event, protocol: Protocol) -> Shape {
        let mut scenario = Scenario::plain(protocol);
        let (waves, pause) = match event {
            Event::Rotation => {
                scenario.max_requests_per_connection = Some(5);
                (1, Duration::ZERO)
            }
            Event::IdleClose => {
                scenario.keepalive_timeout = Some(Duration::from_millis(200));
                (4, Duration::from_millis(200))
            }
            Event::Reload => (1, Duration::ZERO),
        };
        let (requests, concurrency) = match event {
            Event::Reload => (400, 50),
            _ => (200, 32),
        };
        Shape {
            event,
            scenario,
            requests,
            concurrency,
            waves,
            pause,
            posts_only: false,
        }
    }
}

/// What one request came to, as its caller saw it.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub id: String,
    pub method: Method,
    /// The caller got a `200`.
    pub delivered: bool,
    /// The retry's stop reason (stack only).
    pub stop: Option<StopReason>,
    /// The last attempt's transmission (stack only).
    pub last: Option<Transmission>,
    pub attempts: u32,
    /// Its attempts the attempt timeout cut (stack only).
    pub cut: usize,
    /// The error's text when it failed.
    pub error: Option<String>,
}

/// One run of a burst through one client.
#[derive(Debug, Default)]
pub struct Run {
    pub outcomes: Vec<Outcome>,
    /// The server's executions of this run's ids, counted by id.
    pub executed: HashMap<String, usize>,
    /// Breaker transitions (stack only).
    pub transitions: Vec<BreakerEvent>,
    /// Attempts the stack's attempt timeout cut ([`ATTEMPT_TIMEOUT`]; stack only).
    pub cut: usize,
}

impl Run {
    pub fn delivered(&self, method: &Method) -> usize {
        self.outcomes
            .iter()
            .filter(|o| o.delivered && o.method == *method)
            .count()
    }

    pub fn sent(&self, method: &Method) -> usize {
        self.outcomes.iter().filter(|o| o.method == *method).count()
    }

    /// Ids of `method` the server executed more than once.
    pub fn executed_twice(&self, method: &Method) -> Vec<&str> {
        self.outcomes
            .iter()
            .filter(|o| o.method == *method && self.executed.get(&o.id).copied() > Some(1))
            .map(|o| o.id.as_str())
            .collect()
    }

    /// One line of figures.
    pub fn summary(&self) -> String {
        format!(
            "POST {}/{} GET {}/{} delivered, executed twice: {} POST {} GET, transitions {}, \
             attempts cut by the attempt timeout {}",
            self.delivered(&Method::POST),
            self.sent(&Method::POST),
            self.delivered(&Method::GET),
            self.sent(&Method::GET),
            self.executed_twice(&Method::POST).len(),
            self.executed_twice(&Method::GET).len(),
            self.transitions.len(),
            self.cut
        )
    }
}

/// The client builder both runs start from: the scenario's protocol, no proxy.
fn builder(protocol: Protocol) -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder().no_proxy();
    match protocol {
        Protocol::Http1 => builder.http1_only(),
        Protocol::H2c => builder.http2_prior_knowledge(),
    }
}

/// The stack's attempt timeout: far above any answer nginx, haproxy, apache2 or caddy give
/// here (milliseconds, seconds on a loaded machine), it only cuts an attempt hyper left
/// unanswered. Over h2c on a loaded machine, a few runs in a hundred meet such an attempt,
/// through the stack and through bare reqwest alike (bare reqwest retried by hand as often
/// as the stack retries): a request handed to a connection the server rotated with
/// `GOAWAY` is neither sent nor failed (reqwest#1323, hyper#2500; hyper 1.12, h2 0.4.20,
/// hyper-util 0.1.21).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// The stack as users deploy it, and its transitions as the listener saw them.
pub fn stack(protocol: Protocol) -> (ClientWithMiddleware, Arc<Mutex<Vec<BreakerEvent>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let registry = BreakerRegistry::with_listener(BreakerConfig::default(), move |e| {
        record.lock().unwrap().push(e.clone());
    })
    .expect("default breaker config");
    let client = Resilience::new()
        .retry(RetryMiddleware::builder().attempt_timeout(ATTEMPT_TIMEOUT))
        .breaker(registry)
        .build_from(builder(protocol))
        .expect("the stack builds");
    (client, seen)
}

/// reqwest alone, in a `ClientWithMiddleware` with no middleware (same call path).
pub fn bare(protocol: Protocol) -> ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(builder(protocol).build().expect("client")).build()
}

/// Runs `shape`'s burst against `server` through the stack, then through reqwest alone.
pub async fn both(server: &Arc<dyn RealServer>, shape: &Shape) -> (Run, Run) {
    let bare_first = std::env::var_os("SERVERS_BARE_FIRST").is_some();
    let mut bare_run = Run::default();
    if bare_first {
        bare_run = burst(server, shape, &bare(shape.scenario.protocol), "bare").await;
    }
    let (client, transitions) = stack(shape.scenario.protocol);
    let mut stack_run = burst(server, shape, &client, "stack").await;
    stack_run.transitions = transitions.lock().unwrap().clone();
    drop(client);
    if !bare_first {
        bare_run = burst(server, shape, &bare(shape.scenario.protocol), "bare").await;
    }
    let executions = {
        let server = server.clone();
        tokio::task::spawn_blocking(move || server.executions())
            .await
            .expect("read the access log")
    };
    let count = |run: &mut Run, prefix: &str| {
        run.executed = count_ids(&executions, prefix);
    };
    count(&mut stack_run, "stack-");
    count(&mut bare_run, "bare-");
    (stack_run, bare_run)
}

fn count_ids(executions: &[Execution], prefix: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for e in executions
        .iter()
        .filter(|e| e.request_id.starts_with(prefix))
    {
        *counts.entry(e.request_id.clone()).or_insert(0) += 1;
    }
    counts
}

/// One burst through `client`, in `shape.waves` waves (a pause between two; ids
/// `{run}-{i:04}`).
pub async fn burst(
    server: &Arc<dyn RealServer>,
    shape: &Shape,
    client: &ClientWithMiddleware,
    run: &str,
) -> Run {
    let url = format!("{}/burst", server.base_url());
    let per_wave = shape.requests.div_ceil(shape.waves);
    let mut outcomes = Vec::with_capacity(shape.requests);
    for wave in 0..shape.waves {
        if wave > 0 {
            tokio::time::sleep(shape.pause).await;
        }
        let range = wave * per_wave..((wave + 1) * per_wave).min(shape.requests);
        // Two reloads per burst, at a third and two thirds of its requests.
        let points = match shape.event {
            Event::Reload => vec![shape.requests / 3, shape.requests * 2 / 3],
            _ => Vec::new(),
        };
        let reloads = Reloads::at(&range, &points);
        let gate = reloads.gate.clone();
        let (traffic, ()) = tokio::join!(
            wave_of(client, &url, run, range, shape, &gate),
            reloads.run(server),
        );
        outcomes.extend(traffic);
    }
    outcomes.sort_by(|a, b| a.id.cmp(&b.id));
    Run {
        cut: outcomes.iter().map(|o| o.cut).sum(),
        outcomes,
        ..Run::default()
    }
}

/// Graceful reloads in the middle of a wave: reload `k` starts when the wave has handed
/// out index `at[k]`, and the requests from `at[k]` on wait (bounded) until it has
/// started, so every reload meets requests in flight; the next one starts once the
/// previous one serves.
struct Reloads {
    at: Vec<usize>,
    gate: Gate,
}

/// The next index to hand out, and how many reloads have started.
#[derive(Clone)]
struct Gate {
    next: Arc<AtomicUsize>,
    at: Arc<Vec<usize>>,
    started: tokio::sync::watch::Sender<usize>,
}

impl Reloads {
    /// The reloads at those of `points` that fall inside `range` (after its first index).
    fn at(range: &std::ops::Range<usize>, points: &[usize]) -> Reloads {
        let at: Vec<usize> = points
            .iter()
            .copied()
            .filter(|p| range.start < *p && *p < range.end)
            .collect();
        let gate = Gate {
            next: Arc::new(AtomicUsize::new(range.start)),
            at: Arc::new(at.clone()),
            started: tokio::sync::watch::channel(0).0,
        };
        Reloads { at, gate }
    }

    async fn run(self, server: &Arc<dyn RealServer>) {
        for (k, &at) in self.at.iter().enumerate() {
            let reached = async {
                while self.gate.next.load(Ordering::SeqCst) < at {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(60), reached)
                .await
                .expect("the wave reaches its reload point within 60 s");
            let server = server.clone();
            let reload = tokio::task::spawn_blocking(move || server.reload());
            self.gate.started.send_replace(k + 1);
            reload.await.expect("reload");
        }
    }
}

impl Gate {
    /// The next index below `end`, once the reloads it comes after have started.
    async fn take(&self, end: usize) -> Option<usize> {
        let i = self.next.fetch_add(1, Ordering::SeqCst);
        if i >= end {
            return None;
        }
        let needed = self.at.iter().filter(|&&at| at <= i).count();
        let mut started = self.started.subscribe();
        tokio::time::timeout(Duration::from_secs(60), started.wait_for(|&s| s >= needed))
            .await
            .expect("the reload starts within 60 s")
            .expect("the reloads' sender lives as long as the wave");
        Some(i)
    }
}

/// Requests `range` at `concurrency`, each task taking the next index from `gate`.
async fn wave_of(
    client: &ClientWithMiddleware,
    url: &str,
    run: &str,
    range: std::ops::Range<usize>,
    shape: &Shape,
    gate: &Gate,
) -> Vec<Outcome> {
    let mut tasks = JoinSet::new();
    let posts_only = shape.posts_only;
    for _ in 0..shape.concurrency {
        let (client, url, run, gate) =
            (client.clone(), url.to_owned(), run.to_owned(), gate.clone());
        let end = range.end;
        tasks.spawn(async move {
            let mut done = Vec::new();
            while let Some(i) = gate.take(end).await {
                let post = posts_only || i.is_multiple_of(2);
                done.push(one(&client, &url, format!("{run}-{i:04}"), post).await);
            }
            done
        });
    }
    let mut outcomes = Vec::new();
    while let Some(done) = tasks.join_next().await {
        outcomes.extend(done.expect("burst task"));
    }
    outcomes
}

/// The test's bound on one request (none of the clients has a timeout of its own).
const HUNG: Duration = Duration::from_secs(20);

/// One request: a POST (with a body) or a GET.
async fn one(client: &ClientWithMiddleware, url: &str, id: String, post: bool) -> Outcome {
    let method = if post { Method::POST } else { Method::GET };
    let mut req = client
        .request(method.clone(), url)
        .header("x-request-id", &id);
    if method == Method::POST {
        req = req.body(format!("order {id}"));
    }
    let req = req.build().expect("request builds");
    let mut ext = Extensions::new();
    let Ok(result) =
        tokio::time::timeout(HUNG, client.execute_with_extensions(req, &mut ext)).await
    else {
        return Outcome {
            id,
            method,
            delivered: false,
            stop: None,
            last: None,
            attempts: 0,
            cut: 0,
            error: Some(format!("no outcome within {HUNG:?} (the test's bound)")),
        };
    };
    let outcome = RetryOutcome::of(&ext).copied();
    let history = AttemptHistory::of(&ext).cloned();
    let (delivered, error) = match result {
        Ok(res) => {
            let status = res.status();
            // The body is read so the connection goes back to the pool.
            match res.bytes().await {
                Ok(_) if status == 200 => (true, None),
                Ok(_) => (false, Some(format!("status {status}"))),
                Err(e) => (false, Some(format!("body: {e:?}"))),
            }
        }
        Err(e) => (false, Some(format!("{e:?}"))),
    };
    Outcome {
        id,
        method,
        delivered,
        stop: outcome.map(|o| o.stop),
        last: history
            .as_ref()
            .and_then(|h| h.last())
            .map(|r| r.evidence.transmission),
        attempts: outcome.map_or(1, |o| o.attempts),
        cut: history.as_ref().map_or(0, |h| {
            h.attempts()
                .iter()
                .filter(|r| r.evidence.failure == Some(FailureKind::Timeout))
                .count()
        }),
        error,
    }
}
