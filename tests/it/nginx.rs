//! The whole stack against a real server no one here wrote: nginx over HTTP/2 cleartext
//! (prior knowledge), which ends each connection with `GOAWAY` after `keepalive_requests`
//! requests and refuses streams over `http2_max_concurrent_streams` with `REFUSED_STREAM`.
//! Under a burst, the streams above a `GOAWAY`'s last stream id and the refused ones were
//! not processed (RFC 9113 §6.8, §8.7). hyper, though, also fails a stream it had already
//! written with the connection's `GOAWAY` (see the `evidence` module docs, "GOAWAY"; this
//! test found it: a POST so failed was in nginx's log), so only `REFUSED_STREAM` is a proof.
//! The stack must deliver every GET, execute no POST twice, and keep the origin's breaker
//! Closed; the POSTs a rotation leaves unproven stop `MayHaveBeenProcessed` (counted and
//! printed).
//!
//! reqwest's own HTTP/2 retries are off (`reqwest::retry::never()`), so every replay seen
//! here is this crate's decision. The stack has an attempt timeout ([`ATTEMPT_TIMEOUT`]):
//! now and then, on a loaded machine, hyper leaves a request handed to a rotated
//! connection neither sent nor failed (reqwest#1323, hyper#2500; bare reqwest hangs the
//! same way), and the timeout is the stack's bound on it (see [`lost_at_rotation`]). The clock is tokio's real one: nginx is a real process.
//! Skipped (printed) without nginx, a failure under `CI=true` (see `support::nginx`).
//! nginx writes a request's log line when it finalises the request, which can be after
//! the client read the answer: the log is read once it has settled.
//! The p99 comparison with `keepalive_requests 100000` is a wall-clock figure: it is
//! printed by the `#[ignore]`d test at the end, never asserted.

use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Extensions, Method};
use reqwest_middleware::{ClientWithMiddleware, Middleware, Next};
use reqwest_resilience::RetryMiddleware;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, BreakerState};
use reqwest_resilience::redirect::{self, ClientRedirects};
use reqwest_resilience::retry::RetryOutcome;
use reqwest_resilience::{
    AttemptHistory, Backoff, FailureKind, NotProcessedProof, Origin, Resilience, Transmission,
};
use support::nginx::{Nginx, NginxConfig};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// What one burst came to (printed whole, so some fields are only read by `Debug`).
#[derive(Debug)]
#[allow(dead_code)]
struct Figures {
    sent: usize,
    delivered: usize,
    /// Stop reasons of the requests that were not delivered, counted.
    failures: BTreeMap<String, usize>,
    /// Request ids nginx logged more than once.
    executed_twice: usize,
    /// Request ids nginx never logged.
    never_executed: usize,
    /// Lines in nginx's access log once it settled.
    logged: usize,
    breaker: Option<BreakerState>,
    p50: Duration,
    p99: Duration,
    /// Attempts over all requests (the first ones included).
    attempts: u32,
    /// Attempts ended by a `REFUSED_STREAM` (a proof) and by a `GOAWAY` (none).
    refused_streams: usize,
    goaways: usize,
    /// Attempts cut by [`ATTEMPT_TIMEOUT`] (hyper's unanswered requests).
    cut: usize,
    /// Request ids nginx logged twice whose history shows an attempt that failed without
    /// proof and was retried: harmless for an idempotent request, a defect for a POST.
    twice_after_unproven: usize,
    /// The evidence of the last attempt of requests that failed without a proof.
    unproven: Vec<String>,
}

/// Each attempt's error text, by `x-request-id` (a `per_attempt` middleware: it sees
/// every attempt on the wire, inside the retry loop).
#[derive(Clone, Default)]
struct AttemptErrors(Arc<Mutex<HashMap<String, Vec<String>>>>);

#[reqwest_resilience::async_trait]
impl Middleware for AttemptErrors {
    async fn handle(
        &self,
        req: reqwest::Request,
        ext: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let id = req
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        let result = next.run(req, ext).await;
        let text = match &result {
            Ok(r) => r.status().to_string(),
            Err(e) => format!("{e:?}"),
        };
        self.0.lock().unwrap().entry(id).or_default().push(text);
        result
    }
}

/// The attempt timeout: far above nginx's answers here (milliseconds; seconds on a loaded
/// machine), it only cuts an attempt hyper left unanswered (see
/// `support::servers::burst::ATTEMPT_TIMEOUT`).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// The stack of the issue: defaults, recorded redirects, a 5–20 ms backoff, a 20 s
/// deadline, a 5 s attempt timeout, the breaker's registry kept to read its state.
fn stack(
    max_not_processed_retries: u32,
    errors: AttemptErrors,
) -> (ClientWithMiddleware, BreakerRegistry) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .retry(reqwest::retry::never())
        .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
        .build()
        .unwrap();
    let registry = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let backoff = Backoff::builder()
        .base(Duration::from_millis(5))
        .max_delay(Duration::from_millis(20))
        .build()
        .unwrap();
    let stack = Resilience::new()
        .per_attempt(Arc::new(errors))
        .client_redirects(ClientRedirects::Recorded)
        .retry(
            RetryMiddleware::builder()
                .backoff(backoff)
                .total_deadline(Duration::from_secs(20))
                .attempt_timeout(ATTEMPT_TIMEOUT)
                .max_not_processed_retries(max_not_processed_retries)
                // A GET that waited for a stream slot when a rotation came is lost by
                // hyper (`DispatchGone`, see `lost_at_rotation`) and retried as any
                // unanswered GET, counted: under 20 rotations per burst one GET can meet
                // several.
                .max_retries(if max_not_processed_retries > DEFAULT_CAP {
                    10
                } else {
                    3
                }),
        )
        .breaker(registry.clone())
        .build(client)
        .unwrap();
    (stack, registry)
}

/// `n` concurrent requests of `method`, each with its own `x-request-id`.
async fn burst(nginx: &Nginx, method: Method, n: usize, cap: u32) -> Figures {
    let errors = AttemptErrors::default();
    let (client, registry) = stack(cap, errors.clone());
    let url = nginx.url("/burst");
    let mut tasks = JoinSet::new();
    for id in 0..n {
        let (client, url, method) = (client.clone(), url.clone(), method.clone());
        tasks.spawn(async move {
            let mut req = client
                .request(method.clone(), &url)
                .header("x-request-id", id.to_string());
            if method == Method::POST {
                req = req.body(format!("payment {id}"));
            }
            let req = req.build().unwrap();
            let mut ext = Extensions::new();
            let t0 = Instant::now();
            let result = client.execute_with_extensions(req, &mut ext).await;
            let took = t0.elapsed();
            let outcome = RetryOutcome::of(&ext).copied();
            let ok = matches!(&result, Ok(r) if r.status() == 200);
            let history = AttemptHistory::of(&ext).cloned().unwrap_or_default();
            let error = result.err().map(|e| format!("{e:?}"));
            (ok, took, outcome, history, error, id)
        });
    }
    let mut latencies = Vec::with_capacity(n);
    let mut failures = BTreeMap::new();
    let (mut delivered, mut attempts, mut refused_streams, mut goaways, mut cut) = (0, 0, 0, 0, 0);
    let mut unproven = Vec::new();
    let mut histories = HashMap::new();
    while let Some(joined) = tasks.join_next().await {
        let (ok, took, outcome, history, error, id) = joined.unwrap();
        histories.insert(id.to_string(), history.clone());
        for record in history.attempts() {
            if record.evidence.not_processed == Some(NotProcessedProof::RefusedStream) {
                refused_streams += 1;
            }
            if record.evidence.failure == Some(FailureKind::GoAway) {
                goaways += 1;
            }
            if record.evidence.failure == Some(FailureKind::Timeout) {
                cut += 1;
            }
        }
        if let Some(last) = history
            .last()
            .filter(|r| !ok && r.evidence.not_processed.is_none())
        {
            unproven.push(format!(
                "{:?}/{:?} attempt {}: {}",
                last.evidence.transmission,
                last.evidence.failure,
                last.evidence.attempt,
                error.unwrap_or_default()
            ));
        }
        latencies.push(took);
        attempts += outcome.map_or(1, |o| o.attempts);
        if ok {
            delivered += 1;
        } else {
            let reason = outcome.map_or("no outcome".to_owned(), |o| format!("{:?}", o.stop));
            *failures.entry(reason).or_insert(0) += 1;
        }
    }
    latencies.sort();
    let pct = |p: usize| latencies[(latencies.len() * p / 100).min(latencies.len() - 1)];
    let log = nginx.settled_access_log().await;
    let id_of = |line: &String| line.split(' ').next().unwrap_or_default().to_owned();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for line in &log {
        *seen.entry(id_of(line)).or_insert(0) += 1;
    }
    let executed_twice = seen.values().filter(|&&c| c > 1).count();
    let twice_after_unproven = seen
        .iter()
        .filter(|(id, c)| **c > 1 && histories.get(*id).is_some_and(retried_unproven))
        .count();
    for (id, _) in seen.iter().filter(|(_, c)| **c > 1) {
        for line in log.iter().filter(|l| id_of(l) == *id) {
            eprintln!("twice {id}, logged: {line}");
        }
        for text in errors.0.lock().unwrap().get(id).into_iter().flatten() {
            eprintln!("twice {id}, attempt: {text}");
        }
        for r in histories
            .get(id)
            .map(AttemptHistory::attempts)
            .unwrap_or_default()
        {
            eprintln!(
                "twice {id}: {:?} {:?} {:?} {:?}",
                r.evidence.transmission, r.evidence.failure, r.evidence.not_processed, r.decision
            );
        }
    }
    let never_executed = (0..n)
        .filter(|i| !seen.contains_key(&i.to_string()))
        .count();
    let origin = Origin::from_url(&url.parse().unwrap()).unwrap();
    Figures {
        sent: n,
        delivered,
        failures,
        executed_twice,
        never_executed,
        logged: log.len(),
        breaker: registry.state(&origin),
        p50: pct(50),
        p99: pct(99),
        attempts,
        refused_streams,
        goaways,
        cut,
        twice_after_unproven,
        unproven,
    }
}

/// Whether a request was sent again after an attempt that may have been processed.
fn retried_unproven(history: &AttemptHistory) -> bool {
    let attempts = history.attempts();
    attempts
        .iter()
        .take(attempts.len().saturating_sub(1))
        .any(|r| {
            !matches!(r.evidence.transmission, Transmission::NotSent)
                && r.evidence.not_processed.is_none()
        })
}

/// Runs a burst against a fresh nginx, prints its figures and asserts the promise: no POST
/// executed twice (a GET only after an unproven attempt, which is harmless), the breaker
/// Closed, every GET delivered, and every POST delivered except the ones a rotation left
/// unproven (see [`lost_at_rotation`]), which stop unretried.
async fn scenario(config: NginxConfig, method: Method, n: usize, cap: u32) -> Option<Figures> {
    let nginx = Nginx::start(config)?;
    let f = burst(&nginx, method.clone(), n, cap).await;
    println!("{method} ×{n} {config:?} cap {cap}: {f:?}");
    assert!(
        matches!(f.breaker, Some(BreakerState::Closed) | None),
        "{f:?}"
    );
    assert_eq!(f.executed_twice, f.twice_after_unproven, "{f:?}");
    let lost = f.unproven.iter().filter(|e| lost_at_rotation(e)).count();
    assert_eq!(lost, f.unproven.len(), "only rotations are unproven: {f:?}");
    if method == Method::GET {
        // Idempotent: every rotation is retried.
        assert_eq!(lost, 0, "{f:?}");
    } else {
        assert_eq!(f.executed_twice, 0, "{f:?}");
    }
    assert_eq!(f.delivered + lost, f.sent, "{f:?}");
    assert_eq!(
        f.failures.get("MayHaveBeenProcessed").copied().unwrap_or(0),
        lost,
        "{f:?}"
    );
    // Each delivered id in nginx's log (twice only as above); a lost POST at most once.
    assert_eq!(
        f.sent - f.never_executed + f.executed_twice,
        f.logged,
        "{f:?}"
    );
    assert!(f.never_executed <= lost, "{f:?}");
    Some(f)
}

/// The three ways a rotation leaves a request unproven: the server's `GOAWAY` (hyper may
/// have written the stream: `Unknown`, `GoAway`); hyper 1.x dropping a request that waited
/// for a stream slot under the server's `SETTINGS_MAX_CONCURRENT_STREAMS` when the
/// `GOAWAY` ended its connection task (`User(DispatchGone)`, "runtime dropped the dispatch
/// task", which is also the error of a runtime dropping the task of a stream it wrote, so
/// it proves nothing either; hyper issue #2500); and hyper leaving a request handed to the
/// rotated connection unanswered, neither sent nor failed, until [`ATTEMPT_TIMEOUT`] cut it
/// (`Unknown`, `Timeout`: nothing proves it was not written; reqwest#1323). nginx answers
/// `return 200` in milliseconds, so a cut here is that hang (an attempt cut because the
/// machine stalled 5 s would be counted the same way: every assertion holds for it too).
fn lost_at_rotation(unproven: &str) -> bool {
    unproven.starts_with("Unknown/Some(GoAway)")
        || (unproven.starts_with("Unknown/Some(Other)") && unproven.contains("DispatchGone"))
        || unproven.starts_with("Unknown/Some(Timeout)")
}

const ROTATING: NginxConfig = NginxConfig {
    keepalive_requests: 100,
    max_concurrent_streams: 128,
};

const CHURNING: NginxConfig = NginxConfig {
    keepalive_requests: 3,
    max_concurrent_streams: 2,
};

/// The default cap of not-processed retries per request.
/// `RetryMiddlewareBuilder::max_not_processed_retries`'s default.
const DEFAULT_CAP: u32 = 5;

/// `keepalive_requests 3` serves 3 requests per connection, and hyper-util keeps one
/// HTTP/2 connection per origin at a time: a burst of 60 goes through 20 rotations, and
/// the unluckiest request meets most of them. A cap of 5 delivers about half (the figures
/// of the ignored test below); the caller who runs such a server raises the cap.
const CHURN_CAP: u32 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_300_concurrent_posts_with_keepalive_requests_100_are_each_delivered_once() {
    scenario(ROTATING, Method::POST, 300, DEFAULT_CAP).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_300_concurrent_gets_with_keepalive_requests_100_are_each_delivered_once() {
    scenario(ROTATING, Method::GET, 300, DEFAULT_CAP).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_60_concurrent_posts_with_keepalive_requests_3_and_2_streams_are_executed_once() {
    for _ in 0..3 {
        scenario(CHURNING, Method::POST, 60, CHURN_CAP).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_60_concurrent_gets_with_keepalive_requests_3_and_2_streams_are_each_delivered_once()
{
    for _ in 0..3 {
        scenario(CHURNING, Method::GET, 60, CHURN_CAP).await;
    }
}

/// The latency figure: the p99 of a rotating burst against the same burst on a
/// server that never rotates (`keepalive_requests 100000`), over five runs each.
/// Wall clock, so printed only: `cargo test --test it nginx:: -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "wall-clock figures, printed for the record"]
async fn nginx_burst_p99_against_a_server_that_does_not_rotate() {
    let steady = NginxConfig {
        keepalive_requests: 100_000,
        max_concurrent_streams: 128,
    };
    for (label, config, n, cap) in [
        (
            "300 POSTs, keepalive_requests 100",
            ROTATING,
            300,
            DEFAULT_CAP,
        ),
        (
            "300 POSTs, keepalive_requests 100000",
            steady,
            300,
            DEFAULT_CAP,
        ),
        (
            "60 POSTs, keepalive_requests 3, 2 streams, cap 5",
            CHURNING,
            60,
            DEFAULT_CAP,
        ),
        (
            "60 POSTs, keepalive_requests 3, 2 streams, cap 30",
            CHURNING,
            60,
            CHURN_CAP,
        ),
        (
            "60 POSTs, keepalive_requests 100000",
            steady,
            60,
            DEFAULT_CAP,
        ),
    ] {
        let mut runs = Vec::new();
        for _ in 0..5 {
            let Some(nginx) = Nginx::start(config) else {
                return;
            };
            runs.push(burst(&nginx, Method::POST, n, cap).await);
        }
        let p50: Vec<_> = runs.iter().map(|f| f.p50).collect();
        let p99: Vec<_> = runs.iter().map(|f| f.p99).collect();
        let delivered: Vec<_> = runs.iter().map(|f| f.delivered).collect();
        let twice: usize = runs.iter().map(|f| f.executed_twice).sum();
        let breakers: Vec<_> = runs.iter().map(|f| f.breaker).collect();
        let attempts: Vec<_> = runs.iter().map(|f| f.attempts).collect();
        let failures: Vec<_> = runs.iter().map(|f| &f.failures).collect();
        println!(
            "{label}: delivered {delivered:?} of {n}, executed twice {twice}, breaker \
             {breakers:?}, attempts {attempts:?}, p50 {p50:?}, p99 {p99:?}, failures {failures:?}"
        );
    }
}
