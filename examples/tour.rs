//! A tour of every capability, against a flaky server embedded in this program (loopback
//! only, no outside network): `cargo run --example tour`.
//!
//! Each scene builds the stack with [`Resilience`], makes a few requests, prints what
//! the attempt history shows, and checks the outcome; the summary table at the end says
//! which checks held (the program exits with an error if one did not). Delays and open
//! periods are shortened so that the whole tour takes a few seconds; the defaults are
//! seconds long (see the README).

mod common;
#[path = "tour/streams.rs"]
mod streams;
#[path = "tour/weather.rs"]
mod weather;

use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{FlakyServer, Reply, refused_url};
use http::Extensions;
use reqwest_middleware::ClientWithMiddleware;
use reqwest_resilience::RetryMiddleware;
use reqwest_resilience::breaker::{
    BreakerConfig, BreakerRegistry, BreakerState, SlowCalls, TripPolicy,
};
use reqwest_resilience::coalesce::CoalesceGets;
use reqwest_resilience::proxy::ProxyPool;
use reqwest_resilience::retry::{Hedge, Hedging, MaxRetries, RetryMiddlewareBuilder};
use reqwest_resilience::upload::ReplayableBody;
use reqwest_resilience::{
    AccessToken, AttemptDecision, AttemptHistory, AttemptRecord, Backoff, BearerAuth, Origin,
    Redirects, Resilience, ResilienceError, RetryBudget, TokenManager, Transmission,
};

type BoxError = Box<dyn Error + Send + Sync>;

/// The demo's backoff: 50 ms doubling to 200 ms (the default is 1 s doubling to 30 s).
fn demo_backoff() -> Result<Backoff, BoxError> {
    Ok(Backoff::builder()
        .base(Duration::from_millis(50))
        .max_delay(Duration::from_millis(200))
        .build()?)
}

/// The stack every scene starts from: the defaults, with the demo's short backoff.
fn demo_stack() -> Result<Resilience, BoxError> {
    Ok(Resilience::new().retry(demo_retry()?))
}

/// The demo stack's retry, to change one of its settings (`.retry(demo_retry()?.…)`).
fn demo_retry() -> Result<RetryMiddlewareBuilder, BoxError> {
    Ok(RetryMiddleware::builder().backoff(demo_backoff()?))
}

/// One line of the summary table.
struct Check {
    scene: &'static str,
    expected: String,
    observed: String,
    ok: bool,
}

#[derive(Default)]
struct Tour {
    checks: Vec<Check>,
}

impl Tour {
    fn check(&mut self, scene: &'static str, expected: impl ToString, observed: impl ToString) {
        let (expected, observed) = (expected.to_string(), observed.to_string());
        let ok = expected == observed;
        self.verify(scene, expected, observed, ok);
    }

    fn verify(&mut self, scene: &'static str, expected: String, observed: String, ok: bool) {
        println!(
            "   {} expected {expected}, observed {observed}",
            if ok { "✓" } else { "✗" }
        );
        self.checks.push(Check {
            scene,
            expected,
            observed,
            ok,
        });
    }
}

/// Sends a request with these extensions; returns the result and the attempt history.
async fn send(
    client: &ClientWithMiddleware,
    request: reqwest_middleware::RequestBuilder,
    mut extensions: Extensions,
) -> Result<
    (
        Result<reqwest::Response, reqwest_middleware::Error>,
        AttemptHistory,
    ),
    BoxError,
> {
    let request = request.build()?;
    let result = client
        .execute_with_extensions(request, &mut extensions)
        .await;
    let history = AttemptHistory::take_from(&mut extensions).unwrap_or_default();
    Ok((result, history))
}

fn describe(record: &AttemptRecord) -> String {
    let e = &record.evidence;
    let what = match (e.transmission, e.failure) {
        (Transmission::ResponseReceived(status), _) => format!("response {status}"),
        (t, Some(kind)) => format!("{t:?} ({kind:?})"),
        (t, None) => format!("{t:?}"),
    };
    let what = match (e.redirects, e.outcome_origin()) {
        (Redirects::Followed { hops }, Some(last)) => {
            let hops = hops.map_or("a redirect".to_owned(), |n| format!("{n} redirect(s)"));
            format!("answered with {hops}, then {what} at {last}")
        }
        _ => what,
    };
    let decision = match &record.decision {
        Some(AttemptDecision::Retry { delay, reason }) => {
            format!(" → retry in {delay:.0?}: {reason}")
        }
        Some(AttemptDecision::Stop { reason }) => format!(" → stop: {reason}"),
        None => String::new(),
        Some(other) => format!(" → {other:?}"),
    };
    format!("attempt {}: {what}{decision}", e.attempt)
}

fn print_history(history: &AttemptHistory) {
    for record in history.attempts() {
        println!("   {}", describe(record));
    }
}

fn outcome(result: &Result<reqwest::Response, reqwest_middleware::Error>) -> String {
    match result {
        Ok(response) => format!("{}", response.status().as_u16()),
        // The cause, whether or not the retry middleware wrapped it.
        Err(err) => match ResilienceError::find(err) {
            Some(ResilienceError::BreakerOpen { .. }) => "breaker open".into(),
            Some(ResilienceError::Paused { .. }) => "paused".into(),
            _ => "error".into(),
        },
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let started = Instant::now();
    println!("reqwest-resilience tour: every server below is local (127.0.0.1).");
    println!(
        "Timings are shortened for the demo: backoff 50 ms → 200 ms (default 1 s → 30 s), \
         breaker open 300 ms (default 30 s).\n"
    );
    let mut tour = Tour::default();

    refused_connection(&mut tour).await?;
    retry_after(&mut tour).await?;
    post_not_retried(&mut tour).await?;
    breaker(&mut tour).await?;
    shared_pause(&mut tour).await?;
    token_storm(&mut tour).await?;
    healed_401(&mut tour).await?;
    budget(&mut tour).await?;
    redirected_post(&mut tour).await?;
    metrics_scene(&mut tour).await?;
    overload(&mut tour).await?;
    hedging(&mut tour).await?;
    attempt_timeout(&mut tour).await?;
    hedging_safe_methods(&mut tour).await?;
    visible_retries_with_uvs_rules(&mut tour).await?;
    coalesced_gets(&mut tour).await?;
    slow_call_trip(&mut tour).await?;
    chaos_scene(&mut tour).await?;
    rate_limit_fields(&mut tour).await?;
    like_reqwest_retry(&mut tour).await?;
    resumed_download(&mut tour).await?;
    proxy_pool(&mut tour).await?;
    replayed_upload(&mut tour).await?;
    weather::dropped_path(&mut tour).await?;
    weather::dead_address(&mut tour).await?;
    streams::server_sent_events(&mut tour).await?;

    println!("\nSummary");
    println!("{:<34} {:<26} {:<26} ok", "scene", "expected", "observed");
    println!("{}", "-".repeat(90));
    for c in &tour.checks {
        println!(
            "{:<34} {:<26} {:<26} {}",
            c.scene,
            c.expected,
            c.observed,
            if c.ok { "✓" } else { "✗" }
        );
    }
    let failed = tour.checks.iter().filter(|c| !c.ok).count();
    println!(
        "\n{} checks, {failed} failed, in {:.1?}.",
        tour.checks.len(),
        started.elapsed()
    );
    if failed > 0 {
        return Err(format!("{failed} tour checks failed").into());
    }
    Ok(())
}

/// A refused connection is proven not sent, so even a POST may be retried.
async fn refused_connection(tour: &mut Tour) -> Result<(), BoxError> {
    println!("1. A POST to a refused connection: proven not sent, so retried (nobody listens)");
    // `build_from` builds the client with a redirect policy the stack watches: a refused
    // connect with no redirect before it is then proven to be the first hop's (scene 9).
    let client = demo_stack()?.build_from(reqwest::Client::builder())?;
    let url = refused_url("/orders")?;
    let (result, history) = send(&client, client.post(&url).body("{}"), Extensions::new()).await?;
    print_history(&history);
    let first = &history.attempts()[0].evidence;
    tour.check(
        "refused: evidence",
        "NotSent",
        format!("{:?}", first.transmission),
    );
    tour.check(
        "refused: POST retried (not sent)",
        "4 attempts, error",
        format!("{} attempts, {}", history.len(), outcome(&result)),
    );
    // The final error is reqwest's own, as without the stack: existing checks still work.
    tour.check(
        "refused: reqwest's is_connect()",
        "true",
        result.as_ref().err().is_some_and(|e| e.is_connect()),
    );
    Ok(())
}

/// A 503 with `Retry-After: 1` is retried after the server's second, not the backoff.
async fn retry_after(tour: &mut Tour) -> Result<(), BoxError> {
    println!("\n2. A retry honouring Retry-After");
    let server = FlakyServer::start(|i, _| {
        if i == 0 {
            Reply::status(503).header("retry-after", "1")
        } else {
            Reply::ok("fresh data")
        }
    })
    .await?;
    let client = demo_stack()?.build_from(reqwest::Client::builder())?;
    let (result, history) =
        send(&client, client.get(server.url("/data")), Extensions::new()).await?;
    print_history(&history);
    let delay = match history.attempts()[0].decision {
        Some(AttemptDecision::Retry { delay, .. }) => format!("{delay:?}"),
        _ => "none".into(),
    };
    tour.check("Retry-After: delay taken", "1s", delay);
    tour.check(
        "Retry-After: outcome",
        "2 attempts, 200",
        format!("{} attempts, {}", history.len(), outcome(&result)),
    );
    Ok(())
}

/// A POST whose connection closed after it was sent may have been processed: not
/// retried. The same failure on a GET is retried.
async fn post_not_retried(tour: &mut Tour) -> Result<(), BoxError> {
    println!("\n3. A POST correctly not retried (the server reads it, then hangs up)");
    let server = FlakyServer::start(|_, _| Reply::HangUp).await?;
    let client = demo_stack()?
        .no_breaker()
        .build_from(reqwest::Client::builder())?;
    let (result, history) = send(
        &client,
        client
            .post(server.url("/payments"))
            .body(r#"{"amount":10}"#),
        Extensions::new(),
    )
    .await?;
    print_history(&history);
    tour.check(
        "POST after hang-up",
        "1 attempt, 1 at server",
        format!("{} attempt, {} at server", history.len(), server.requests()),
    );
    let _ = result;
    println!("   the same failure on a GET (idempotent) is retried:");
    let (_, history) = send(
        &client,
        client.get(server.url("/payments")),
        Extensions::new(),
    )
    .await?;
    print_history(&history);
    tour.check(
        "GET after hang-up",
        "4 attempts",
        format!("{} attempts", history.len()),
    );
    Ok(())
}

/// Three 503s open the breaker; the next request fails at once without reaching the
/// server; after the open period one probe succeeds and closes it.
async fn breaker(tour: &mut Tour) -> Result<(), BoxError> {
    println!("\n4. A breaker opening, failing fast and closing (3 failures, 300 ms open)");
    let healthy = Arc::new(AtomicBool::new(false));
    let h = healthy.clone();
    let server = FlakyServer::start(move |_, _| {
        if h.load(Ordering::SeqCst) {
            Reply::ok("back")
        } else {
            Reply::status(503)
        }
    })
    .await?;
    let transitions = Arc::new(Mutex::new(Vec::new()));
    let t = transitions.clone();
    let registry = BreakerRegistry::with_listener(
        BreakerConfig::default()
            .policy(TripPolicy::consecutive_failures(3))
            .open_duration(Duration::from_millis(300)),
        move |event| {
            println!("   breaker: {:?} → {:?}", event.from, event.to);
            t.lock().unwrap().push(format!("{:?}", event.to));
        },
    )?;
    let client = demo_stack()?
        .breaker(registry.clone())
        .build_from(reqwest::Client::builder())?;
    let no_retry = || {
        let mut e = Extensions::new();
        e.insert(MaxRetries(0)); // one attempt each, to count the breaker's failures
        e
    };
    for _ in 0..3 {
        let (result, _) = send(&client, client.get(server.url("/")), no_retry()).await?;
        println!("   GET → {}", outcome(&result));
    }
    let seen_before = server.requests();
    let (result, history) = send(&client, client.get(server.url("/")), no_retry()).await?;
    print_history(&history);
    println!(
        "   not retried: this call carries MaxRetries(0); with retries on, the retry \
         middleware would wait the breaker's \"retry in\" (the rest of the 300 ms) before \
         asking again, never retry into it at once"
    );
    if let Some(err) = result.as_ref().err().and_then(ResilienceError::find) {
        println!("   error: {err}");
    }
    tour.check(
        "breaker: fails fast",
        "breaker open, 0 sent",
        format!(
            "{}, {} sent",
            outcome(&result),
            server.requests() - seen_before
        ),
    );
    healthy.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (result, _) = send(&client, client.get(server.url("/")), no_retry()).await?;
    println!("   after 300 ms, the probe: GET → {}", outcome(&result));
    let origin = Origin::parse(&server.url("/"))?;
    tour.check(
        "breaker: closes after a probe",
        "Closed",
        format!(
            "{:?}",
            registry.state(&origin).unwrap_or(BreakerState::Open)
        ),
    );
    tour.check(
        "breaker: transitions",
        "Open HalfOpen Closed",
        transitions.lock().unwrap().join(" "),
    );
    Ok(())
}

/// A 429 with `Retry-After` pauses the origin for every client sharing the registry.
async fn shared_pause(tour: &mut Tour) -> Result<(), BoxError> {
    println!("\n5. A shared pause: one 429 with Retry-After: 1 holds back every client");
    let server = FlakyServer::start(|i, _| {
        if i == 0 {
            Reply::status(429).header("retry-after", "1")
        } else {
            Reply::ok("ok")
        }
    })
    .await?;
    let registry = BreakerRegistry::new(BreakerConfig::default())?;
    let client_a = demo_stack()?
        .breaker(registry.clone())
        .build_from(reqwest::Client::builder())?;
    let client_b = demo_stack()?
        .breaker(registry.clone())
        .build_from(reqwest::Client::builder())?;
    let mut once = Extensions::new();
    once.insert(MaxRetries(0));
    let (result, _) = send(&client_a, client_a.get(server.url("/a")), once).await?;
    println!(
        "   client A: GET → {} (origin now paused for 1 s)",
        outcome(&result)
    );
    let waited = Instant::now();
    let (result, _) = send(&client_b, client_b.get(server.url("/b")), Extensions::new()).await?;
    println!(
        "   client B: GET → {} after waiting {:.1?} without sending",
        outcome(&result),
        waited.elapsed()
    );
    tour.check(
        "pause: B held back, then sent once",
        "200, 2 at server",
        format!("{}, {} at server", outcome(&result), server.requests()),
    );
    Ok(())
}

/// A token source that counts its fetches and takes 100 ms, issuing `token-1`, `token-2`, …
fn counting_tokens(fetches: Arc<AtomicUsize>) -> TokenManager {
    TokenManager::new(move || {
        let fetches = fetches.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let n = fetches.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, std::io::Error>(AccessToken::new(format!("token-{n}")))
        }
    })
}

fn bearer_for(server: &FlakyServer, tokens: TokenManager) -> Result<BearerAuth, BoxError> {
    Ok(BearerAuth::builder(tokens)
        .origin(Origin::parse(&server.url("/"))?)
        .allow_http_on_loopback() // the demo server is plain http on 127.0.0.1
        .build()?)
}

/// Concurrent requests: 1 token fetch. 401s: 1 refresh.
async fn run_concurrently(
    client: &ClientWithMiddleware,
    url: &str,
    n: usize,
) -> Result<Vec<String>, BoxError> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (client, url) = (client.clone(), url.to_owned());
        tasks.spawn(async move { outcome(&client.get(url).send().await) });
    }
    let mut outcomes = Vec::with_capacity(n);
    while let Some(o) = tasks.join_next().await {
        outcomes.push(o?);
    }
    Ok(outcomes)
}

/// 50 concurrent requests with no token cached cause one fetch.
async fn token_storm(tour: &mut Tour) -> Result<(), BoxError> {
    println!("\n6. A token storm: 50 concurrent requests, no token cached yet");
    let server = FlakyServer::start(|_, r| match r.authorization.as_deref() {
        Some("Bearer token-1") => Reply::ok("hello"),
        _ => Reply::status(401),
    })
    .await?;
    let fetches = Arc::new(AtomicUsize::new(0));
    let client = demo_stack()?
        .bearer(bearer_for(&server, counting_tokens(fetches.clone()))?)
        .build_from(reqwest::Client::builder())?;
    let outcomes = run_concurrently(&client, &server.url("/me"), 50).await?;
    let ok = outcomes.iter().filter(|o| *o == "200").count();
    println!(
        "   {ok} of 50 got 200; the token source was called {} time(s)",
        fetches.load(Ordering::SeqCst)
    );
    tour.check(
        "token storm: fetches",
        "50 × 200, 1 fetch",
        format!("{ok} × 200, {} fetch", fetches.load(Ordering::SeqCst)),
    );
    Ok(())
}

/// The server revoked `token-1`: 20 concurrent 401s cause one refresh and one replay
/// each; the breaker counts the healed requests as successes.
async fn healed_401(tour: &mut Tour) -> Result<(), BoxError> {
    println!("\n7. A 401 healed by one refresh: the server accepts only token-2");
    let server = FlakyServer::start(|_, r| match r.authorization.as_deref() {
        Some("Bearer token-2") => Reply::ok("hello again"),
        _ => Reply::status(401).header("www-authenticate", "Bearer error=\"invalid_token\""),
    })
    .await?;
    let fetches = Arc::new(AtomicUsize::new(0));
    let tokens = counting_tokens(fetches.clone());
    tokens.token().await?; // token-1 is cached before the requests start
    let registry = BreakerRegistry::new(BreakerConfig::default())?;
    let client = demo_stack()?
        .breaker(registry.clone())
        .bearer(bearer_for(&server, tokens)?)
        .build_from(reqwest::Client::builder())?;
    let outcomes = run_concurrently(&client, &server.url("/me"), 20).await?;
    let ok = outcomes.iter().filter(|o| *o == "200").count();
    let origin = Origin::parse(&server.url("/"))?;
    let failures = registry
        .snapshot()
        .into_iter()
        .find(|b| b.origin == origin)
        .map_or(u32::MAX, |b| b.consecutive_failures);
    println!(
        "   {ok} of 20 got 200; refreshes: {}; the server answered {} requests with 401 (each \
         replayed once with token-2); breaker failures counted: {failures}",
        fetches.load(Ordering::SeqCst) - 1,
        server.requests() - ok
    );
    tour.check(
        "401: one refresh, all healed",
        "20 × 200, 1 refresh",
        format!("{ok} × 200, {} refresh", fetches.load(Ordering::SeqCst) - 1),
    );
    tour.check(
        "401: breaker not charged",
        "0 failures",
        format!("{failures} failures"),
    );
    Ok(())
}

/// A server failing everything: without a budget each request is sent 4 times; the
/// budget (20 % of requests) stops the storm.
async fn budget(tour: &mut Tour) -> Result<(), BoxError> {
    println!("\n8. The budget stopping a retry storm: 50 requests to a server answering 503");
    let mut sent = Vec::new();
    for with_budget in [false, true] {
        let server = FlakyServer::start(|_, _| Reply::status(503)).await?;
        let stack = demo_stack()?.no_breaker(); // the breaker would stop the storm too
        let stack = if with_budget {
            // 20 % of requests, as the default; the default's floor of 10 retries/s is
            // set to 0 so that this small demo shows the ratio.
            stack.retry(demo_retry()?.budget(RetryBudget::new(Duration::from_secs(10), 0, 0.2)?))
        } else {
            stack.retry(demo_retry()?.no_budget())
        };
        let client = stack.build_from(reqwest::Client::builder())?;
        run_concurrently(&client, &server.url("/report"), 50).await?;
        println!(
            "   {}: the server received {} requests",
            if with_budget {
                "with a 20 % budget"
            } else {
                "without a budget"
            },
            server.requests()
        );
        sent.push(server.requests());
    }
    // All 50 requests deposit before their first retry, so at most 20 % × 50 = 10 retries.
    tour.verify(
        "budget: requests at server",
        "200 → at most 60".into(),
        format!("{} → {}", sent[0], sent[1]),
        sent[0] == 200 && sent[1] <= 60,
    );
    Ok(())
}

/// A POST answered `303 See Other` was received and processed, whatever the next hop does:
/// it is never sent again, and the failure of the hop it led to is that origin's.
async fn redirected_post(tour: &mut Tour) -> Result<(), BoxError> {
    println!("\n9. A redirected POST: 303 to a receipt host that refuses connections");
    let receipt = refused_url("/receipt")?;
    let server =
        FlakyServer::start(move |_, _| Reply::status(303).header("location", &receipt)).await?;
    let client = demo_stack()?.build_from(reqwest::Client::builder())?;
    let (result, history) = send(
        &client,
        client.post(server.url("/pay")).body("{\"amount\": 10}"),
        Extensions::new(),
    )
    .await?;
    print_history(&history);
    println!(
        "   the payment server received {} POST(s)",
        server.requests()
    );
    tour.check(
        "redirect: POST executed once",
        "1 attempt, error, 1 at server",
        format!(
            "{} attempt, {}, {} at server",
            history.len(),
            outcome(&result),
            server.requests()
        ),
    );
    Ok(())
}

/// Feature `metrics`: what a recorder sees of a request retried once (a debugging
/// recorder here; Prometheus or OpenTelemetry exporters in an application).
#[cfg(feature = "metrics")]
async fn metrics_scene(tour: &mut Tour) -> Result<(), BoxError> {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    println!("\n10. Metrics: a 503 then a 200, as a metrics recorder sees them");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install()?;
    reqwest_resilience::metrics::describe();
    let server = FlakyServer::start(|i, _| {
        if i == 0 {
            Reply::status(503)
        } else {
            Reply::ok("ok")
        }
    })
    .await?;
    let client = demo_stack()?.build_from(reqwest::Client::builder())?;
    client.get(server.url("/m")).send().await?;
    let (mut attempts, mut retries) = (0, 0);
    let mut lines = Vec::new();
    for (key, unit, _, value) in snapshotter.snapshot().into_vec() {
        let labels: Vec<String> = key
            .key()
            .labels()
            .filter(|l| l.key() != "origin" && l.key() != "server.port")
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let (shown, n) = match &value {
            DebugValue::Counter(n) => (format!("{n}"), *n),
            DebugValue::Histogram(v) => (format!("{} sample(s)", v.len()), v.len() as u64),
            DebugValue::Gauge(g) => (format!("{g}"), 0),
        };
        let name = key.key().name();
        lines.push(format!(
            "   {name} {{{}}} {unit:?}: {shown}",
            labels.join(", ")
        ));
        match name {
            "http.client.request.duration" => attempts += n,
            "reqwest_resilience.retry.retries" => retries += n,
            _ => {}
        }
    }
    lines.sort();
    println!("{}", lines.join("\n"));
    tour.check(
        "metrics: attempts, retries",
        "2 attempts, 1 retry",
        format!("{attempts} attempts, {retries} retry"),
    );
    Ok(())
}

#[cfg(not(feature = "metrics"))]
async fn metrics_scene(_: &mut Tour) -> Result<(), BoxError> {
    println!(
        "\n10. Metrics: run `cargo run --example tour --features metrics` to see what a \
         metrics recorder records"
    );
    Ok(())
}

/// A server with 4 handlers taking 100 ms each, and 12 requests at once: with a fixed
/// limit of 4 per origin, the server never has more than 4 (what it can serve); the 8
/// others are turned away at once, locally, and not retried. With a queue they wait
/// for a permit instead, and all are served.
async fn overload(tour: &mut Tour) -> Result<(), BoxError> {
    use reqwest_resilience::limit::{LimiterConfig, LimiterRegistry};
    const SERVICE: Duration = Duration::from_millis(100);
    println!("\n11. Overload: 12 requests at once to a server taking 100 ms, limit 4 per origin");
    // When each request arrived: each is in the server's hands for the 100 ms after.
    let arrivals = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let log = arrivals.clone();
    let server = FlakyServer::start(move |_, _| {
        log.lock().unwrap().push(Instant::now());
        Reply::After(SERVICE, Box::new(Reply::ok("done")))
    })
    .await?;
    let mut lines = Vec::new();
    for queue in [0, 8] {
        arrivals.lock().unwrap().clear();
        let limits =
            LimiterRegistry::new(LimiterConfig::fixed(4).queue(queue, Duration::from_secs(1)))?;
        let client = demo_stack()?
            .concurrency_limit(limits.clone())
            .build_from(reqwest::Client::builder())?;
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..12 {
            let (client, url) = (client.clone(), server.url("/work"));
            tasks.spawn(async move {
                match client
                    .get(url)
                    .send()
                    .await
                    .as_ref()
                    .map_err(ResilienceError::find)
                {
                    Ok(_) => "200",
                    Err(Some(ResilienceError::ConcurrencyLimited { .. })) => "limited",
                    Err(_) => "error",
                }
            });
        }
        let (mut ok, mut limited) = (0, 0);
        while let Some(o) = tasks.join_next().await {
            match o? {
                "200" => ok += 1,
                "limited" => limited += 1,
                _ => {}
            }
        }
        let seen = arrivals.lock().unwrap().clone();
        let peak = seen
            .iter()
            .map(|&a| seen.iter().filter(|&&b| b <= a && a < b + SERVICE).count())
            .max()
            .unwrap_or(0);
        let snap = &limits.snapshot()[0];
        println!(
            "   queue {queue}: {ok} × 200, {limited} rejected locally (not sent, not retried); \
             the server had at most {peak} at once; limiter: {} in flight, {} rejections",
            snap.in_flight, snap.rejections
        );
        lines.push(format!("{ok}+{limited}, peak {peak}"));
    }
    tour.check(
        "overload: fail fast | queue",
        "4+8, peak 4 | 12+0, peak 4",
        lines.join(" | "),
    );
    Ok(())
}

/// A slow first answer: after 100 ms without a response head a second copy goes out, and
/// the first answer wins; the slow copy is cancelled (its connection closed).
async fn hedging(tour: &mut Tour) -> Result<(), BoxError> {
    println!(
        "\n12. A hedge winning: the first copy takes 2 s, a copy sent after 100 ms answers at once"
    );
    let server = FlakyServer::start(|i, _| {
        if i == 0 {
            Reply::After(Duration::from_secs(2), Box::new(Reply::ok("slow")))
        } else {
            Reply::ok("fast")
        }
    })
    .await?;
    let client = demo_stack()?
        .retry(demo_retry()?.hedging(Hedging::fixed(Duration::from_millis(100))))
        .build_from(reqwest::Client::builder())?;
    let t0 = Instant::now();
    let (result, history) = send(
        &client,
        client.get(server.url("/search")),
        Extensions::new(),
    )
    .await?;
    let took = t0.elapsed();
    print_history(&history);
    let body = result?.text().await?;
    println!("   answered {body:?} in {took:.0?}");
    tour.check(
        "hedge: answer, copies at server",
        "fast, 2",
        format!("{body}, {}", server.requests()),
    );
    tour.verify(
        "hedge: well before the slow copy",
        "< 1 s".into(),
        format!("{took:.0?}"),
        took < Duration::from_secs(1),
    );
    Ok(())
}

/// A silent server: each attempt is cut after 200 ms. The GET is retried (3 retries), a
/// POST is not (it may have been processed).
async fn attempt_timeout(tour: &mut Tour) -> Result<(), BoxError> {
    println!("\n13. An attempt timeout: a server that never answers, each attempt cut at 200 ms");
    let server = FlakyServer::start(|_, _| {
        Reply::After(Duration::from_secs(3600), Box::new(Reply::ok("never")))
    })
    .await?;
    let client = demo_stack()?
        .no_breaker()
        .retry(demo_retry()?.attempt_timeout(Duration::from_millis(200)))
        .build_from(reqwest::Client::builder())?;
    let (_, history) = send(&client, client.get(server.url("/slow")), Extensions::new()).await?;
    print_history(&history);
    let at_server = server.requests();
    let (_, post) = send(
        &client,
        client.post(server.url("/slow")).body("x"),
        Extensions::new(),
    )
    .await?;
    print_history(&post);
    tour.check(
        "attempt timeout: GET, POST",
        "4 attempts, 1 attempt",
        format!("{} attempts, {} attempt", history.len(), post.len()),
    );
    tour.check(
        "attempt timeout: at server",
        "4 + 1",
        format!("{at_server} + {}", server.requests() - at_server),
    );
    Ok(())
}

/// A hedge is a concurrent duplicate: only the safe methods are hedged by default, never a
/// request because of an `Idempotency-Key` (which makes a sequential retry safe, not a
/// concurrent copy), and PUT or DELETE only when asked.
async fn hedging_safe_methods(tour: &mut Tour) -> Result<(), BoxError> {
    println!(
        "\n14. Hedging only what a concurrent duplicate cannot harm: a keyed POST is never hedged \
         (its duplicate would get 409 while the first is processed), a PUT only when asked"
    );
    // The first request of each path takes 300 ms; a duplicate meanwhile is a conflict.
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let server = FlakyServer::start({
        let seen = seen.clone();
        move |_, req| {
            let mut seen = seen.lock().unwrap();
            let first = !seen.contains(&req.path);
            seen.push(req.path.clone());
            if first {
                Reply::After(Duration::from_millis(300), Box::new(Reply::ok("done")))
            } else if req.path == "/payments" {
                Reply::status(409)
            } else {
                // A PUT of the same state twice is harmless: the copy answers at once.
                Reply::ok("done")
            }
        }
    })
    .await?;
    let client = demo_stack()?
        .retry(demo_retry()?.hedging(Hedging::fixed(Duration::from_millis(50))))
        .build_from(reqwest::Client::builder())?;
    let keyed = client
        .post(server.url("/payments"))
        .header("idempotency-key", "order-7")
        .body("{}");
    let (keyed, _) = send(&client, keyed, Extensions::new()).await?;
    let keyed = keyed?.status().as_u16();
    let after_post = server.requests();
    let mut asked = Extensions::new();
    asked.insert(Hedge(true));
    let (put, history) = send(
        &client,
        client.put(server.url("/profile")).body("{}"),
        asked,
    )
    .await?;
    print_history(&history);
    let put = put?.status().as_u16();
    println!("   keyed POST: {keyed}, {after_post} at the server; PUT with Hedge(true): {put}");
    tour.check(
        "hedge: keyed POST not hedged",
        "200, 1 at server",
        format!("{keyed}, {after_post} at server"),
    );
    tour.check(
        "hedge: PUT hedged when asked",
        "200, 2 at server",
        format!("{put}, {} at server", server.requests() - after_post),
    );
    Ok(())
}

/// uv's transient rules as the strategy, each retry told before its wait, and the outcome
/// beside the result.
async fn visible_retries_with_uvs_rules(tour: &mut Tour) -> Result<(), BoxError> {
    use reqwest_resilience::SendWithHistory;
    use reqwest_resilience::retry::strategies::UvTransient;

    println!(
        "\n15. uv's rules, retries told as they happen: a 507 (which uv retries, the default \
         table does not) and a hang-up, then 200"
    );
    let server = FlakyServer::start(|n, _| match n {
        0 => Reply::status(507),
        1 => Reply::HangUp,
        _ => Reply::ok("index"),
    })
    .await?;
    let notices = Arc::new(AtomicUsize::new(0));
    let client = demo_stack()?
        .retry(demo_retry()?.strategy(UvTransient).before_sleep({
            let notices = notices.clone();
            move |n| {
                notices.fetch_add(1, Ordering::SeqCst);
                let what = n
                    .status
                    .map_or_else(|| n.error_messages().join(": "), |s| s.to_string());
                println!(
                    "   attempt {} failed ({what}); retrying in {:?}",
                    n.attempt, n.delay
                );
            }
        }))
        .build_from(reqwest::Client::builder())?;
    let exchange = client.get(server.url("/simple/")).send_with_history().await;
    print_history(&exchange.history);
    let status = exchange.result?.status().as_u16();
    let retries = exchange.outcome.map_or(0, |o| o.retries());
    tour.check(
        "uv rules: 507 and hang-up retried",
        "200 after 2 retries, 2 told",
        format!(
            "{status} after {retries} retries, {} told",
            notices.load(Ordering::SeqCst)
        ),
    );
    Ok(())
}
/// Concurrent identical GETs share one request: the server answers once, every caller gets
/// the body, and each history says it was shared.
async fn coalesced_gets(tour: &mut Tour) -> Result<(), BoxError> {
    println!("\n16. 100 concurrent identical GETs with coalescing: one request at the server");
    let server = FlakyServer::start(|_, _| {
        Reply::After(Duration::from_millis(200), Box::new(Reply::ok("catalogue")))
    })
    .await?;
    let client = demo_stack()?
        .coalesce_gets(CoalesceGets::new())
        .build_from(reqwest::Client::builder())?;
    let url = server.url("/catalogue");
    let calls = (0..100).map(|_| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let response = client.get(&url).send().await?;
            let shared = AttemptHistory::of_response(&response).and_then(|h| h.shared());
            let body = response.text().await?;
            Ok::<_, BoxError>((body, shared.map(|s| s.callers)))
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    let mut bodies = 0;
    let mut shared_by = None;
    for answer in answers {
        let (body, callers) = answer?;
        bodies += usize::from(body == "catalogue");
        shared_by = shared_by.or(callers);
    }
    println!("   {bodies} callers got the body; shared by {shared_by:?} callers");
    tour.check(
        "coalesce: at server, bodies",
        "1, 100",
        format!("{}, {bodies}", server.requests()),
    );
    tour.check("coalesce: shared by", "Some(100)", format!("{shared_by:?}"));
    Ok(())
}

/// A server that still answers 200, but slowly: the breaker opens on slow calls and the
/// callers after it fail fast.
async fn slow_call_trip(tour: &mut Tour) -> Result<(), BoxError> {
    println!(
        "\n17. Slow-call trip: latency jumps from 5 ms to 300 ms; half of the calls over 100 ms \
         opens the breaker"
    );
    let slow = Arc::new(AtomicBool::new(false));
    let server = FlakyServer::start({
        let slow = slow.clone();
        move |_, _| {
            let latency = if slow.load(Ordering::SeqCst) { 300 } else { 5 };
            Reply::After(Duration::from_millis(latency), Box::new(Reply::ok("ok")))
        }
    })
    .await?;
    let registry = BreakerRegistry::new(
        BreakerConfig::default()
            .open_duration(Duration::from_millis(300))
            .slow_calls(
                SlowCalls::new(Duration::from_millis(100))
                    .rate(0.5)
                    .minimum_throughput(8)
                    .sampling_window(Duration::from_secs(5)),
            ),
    )?;
    let client = Resilience::new()
        .no_retry()
        .breaker(registry.clone())
        .build_from(reqwest::Client::builder())?;
    let url = server.url("/report");
    for _ in 0..4 {
        client.get(&url).send().await?;
    }
    slow.store(true, Ordering::SeqCst);
    let slow_calls = (0..4).map(|_| client.get(&url).send());
    let statuses: Vec<_> = futures_util::future::join_all(slow_calls)
        .await
        .into_iter()
        .map(|r| r.map(|r| r.status().as_u16()))
        .collect::<Result<_, _>>()?;
    let state = registry.snapshot().pop().map(|s| s.state);
    let t0 = Instant::now();
    let (next, _) = send(&client, client.get(&url), Extensions::new()).await?;
    println!(
        "   4 slow calls answered {statuses:?}; breaker {state:?}; the next call: {} in {:.0?}",
        outcome(&next),
        t0.elapsed()
    );
    tour.check(
        "slow calls: state, next call",
        "Some(Open), breaker open",
        format!("{state:?}, {}", outcome(&next)),
    );
    tour.check("slow calls: at server", "8", server.requests());
    Ok(())
}

/// Seeded chaos: the faults this crate classifies, injected on the layer's own loopback
/// sockets; the retry heals every GET, and the histories show the faults it met.
#[cfg(feature = "chaos")]
async fn chaos_scene(tour: &mut Tour) -> Result<(), BoxError> {
    use reqwest_resilience::chaos::{Chaos, Fault};
    println!(
        "\n18. Chaos (seed 7): refused connects, resets after sending and 429s on a third of \
         the attempts; the retry heals every GET"
    );
    let server = FlakyServer::start(|_, _| Reply::ok("ok")).await?;
    let chaos = Chaos::builder()
        .seed(7)
        .fault(Fault::RefusedConnect, 0.1)
        .fault(Fault::ResetAfterSend, 0.1)
        .fault(Fault::TooManyRequests, 0.1)
        .build()?;
    let client = demo_stack()?
        .no_breaker()
        .chaos(chaos.clone())
        .build_from(reqwest::Client::builder())?;
    let (mut ok, mut failed_attempts) = (0, 0);
    for _ in 0..20 {
        let (result, history) =
            send(&client, client.get(server.url("/")), Extensions::new()).await?;
        ok += usize::from(result.is_ok_and(|r| r.status() == 200));
        failed_attempts += history.len() - 1;
    }
    let planned = (0..chaos.requests())
        .filter(|&n| chaos.injection(n).fault.is_some())
        .count();
    println!(
        "   20 GETs answered 200: {ok}; attempts {}, faults injected {planned}",
        chaos.requests()
    );
    tour.check("chaos: GETs answered", "20", ok);
    tour.check(
        "chaos: retried attempts = faults",
        planned.to_string(),
        failed_attempts,
    );
    Ok(())
}

#[cfg(not(feature = "chaos"))]
async fn chaos_scene(_: &mut Tour) -> Result<(), BoxError> {
    println!("\n18. Chaos: run with `--features chaos` to see seeded faults healed by the retry");
    Ok(())
}

/// A server's rate-limit fields: `RateLimit: "default";r=0;t=1` on an answer pauses the
/// origin for every client of the breaker registry until the quota resets; and with the
/// client-side rate limit on, a server publishing `RateLimit-Policy: 10;w=1` is paced at
/// 10 a second from 20 callers at once, and answers no `429`.
async fn rate_limit_fields(tour: &mut Tour) -> Result<(), BoxError> {
    use reqwest_resilience::rate::RateLimitConfig;
    println!(
        "\n19. Rate-limit fields: a quota spent pauses the origin for every client; a quota \
         published is learned, so 20 callers at once get no 429"
    );
    // Part 1: the first answer says nothing remains for 1 s.
    let server = FlakyServer::start(|i, _| {
        if i == 0 {
            Reply::ok("last one").header("ratelimit", r#""default";r=0;t=1"#)
        } else {
            Reply::ok("ok")
        }
    })
    .await?;
    let registry = BreakerRegistry::new(BreakerConfig::default())?;
    let a = demo_stack()?
        .breaker(registry.clone())
        .build_from(reqwest::Client::builder())?;
    let b = demo_stack()?
        .breaker(registry.clone())
        .build_from(reqwest::Client::builder())?;
    a.get(server.url("/quota")).send().await?;
    let paused = registry.snapshot()[0].paused_for;
    let t0 = Instant::now();
    let status = b.get(server.url("/quota")).send().await?.status().as_u16();
    let waited = t0.elapsed();
    println!("   the other client waited {waited:.1?} for the reset, then got {status}");
    tour.check(
        "rate fields: pause, other client",
        "1s, 200",
        format!(
            "{}s, {status}",
            paused.map_or(0.0, |p| p.as_secs_f64().round())
        ),
    );
    // Part 2: at most 10 in any second, or 429.
    let arrivals = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let log = arrivals.clone();
    let server = FlakyServer::start(move |_, _| {
        let now = Instant::now();
        let mut seen = log.lock().unwrap();
        let recent = seen
            .iter()
            .filter(|&&t| now - t < Duration::from_secs(1))
            .count();
        seen.push(now);
        let reply = if recent < 10 {
            Reply::ok("ok")
        } else {
            Reply::status(429)
        };
        reply.header("ratelimit-policy", "10;w=1")
    })
    .await?;
    let client = Resilience::new()
        .no_retry()
        .rate_limit(RateLimitConfig::default())
        .build_from(reqwest::Client::builder())?;
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let (client, url) = (client.clone(), server.url("/items"));
        tasks.spawn(async move { client.get(url).send().await.map(|r| r.status().as_u16()) });
    }
    let mut codes = Vec::new();
    while let Some(r) = tasks.join_next().await {
        codes.push(r??);
    }
    let ok = codes.iter().filter(|&&c| c == 200).count();
    println!(
        "   20 callers: {ok} × 200, {} × 429, in {:.1?} (the first answer taught 10 a second)",
        codes.len() - ok,
        t0.elapsed()
    );
    tour.check(
        "rate fields: learned 10/s, 20 callers",
        "20 × 200",
        format!("{ok} × 200"),
    );
    Ok(())
}

/// `Resilience::like_reqwest_retry()`: reqwest-retry's statuses (every 5xx) and no breaker
/// or budget, but still no second POST that may have been processed.
async fn like_reqwest_retry(tour: &mut Tour) -> Result<(), BoxError> {
    println!(
        "\n20. Coming from reqwest-retry: its preset retries a GET answered 501 (every 5xx), \
         and still sends a POST answered 500 once (delays shortened for the demo)"
    );
    let server = FlakyServer::start(|i, req| match (req.method.as_str(), i) {
        ("GET", 0) => Reply::status(501),
        ("GET", _) => Reply::ok("report"),
        _ => Reply::status(500),
    })
    .await?;
    let client = Resilience::like_reqwest_retry()
        .retry(RetryMiddleware::like_reqwest_retry().backoff(demo_backoff()?))
        .build_from(reqwest::Client::builder())?;
    let (get, history) = send(
        &client,
        client.get(server.url("/report")),
        Extensions::new(),
    )
    .await?;
    print_history(&history);
    let get = get?.status().as_u16();
    let after_get = server.requests();
    let (post, history) = send(
        &client,
        client.post(server.url("/pay")).body("{}"),
        Extensions::new(),
    )
    .await?;
    print_history(&history);
    let post = post?.status().as_u16();
    tour.check(
        "reqwest-retry preset: GET 501",
        "200, 2 at server",
        format!("{get}, {after_get} at server"),
    );
    tour.check(
        "reqwest-retry preset: POST 500",
        "500, 1 at server",
        format!("{post}, {} at server", server.requests() - after_get),
    );
    Ok(())
}

/// A download whose connection breaks twice resumes where it broke: the caller reads one
/// body, and the server sends each byte once.
async fn resumed_download(tour: &mut Tour) -> Result<(), BoxError> {
    println!(
        "\n21. A 1 MiB download cut twice: resumed with Range + If-Range, one body for the \
         caller, each byte sent once"
    );
    let file: Arc<Vec<u8>> = Arc::new((0..1 << 20).map(|i: usize| (i % 251) as u8).collect());
    let sent = Arc::new(AtomicUsize::new(0));
    let server = FlakyServer::start({
        let (file, sent) = (file.clone(), sent.clone());
        move |i, req| {
            let from = req
                .range
                .as_deref()
                .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok())
                .unwrap_or(0);
            // The first two answers break after 300 KiB.
            let cut_after = (i < 2).then_some(300 * 1024);
            let bytes = cut_after.map_or(file.len() - from, |n: usize| n.min(file.len() - from));
            sent.fetch_add(bytes, Ordering::SeqCst);
            println!(
                "   request {}: Range {:?}",
                i + 1,
                req.range.as_deref().unwrap_or("none")
            );
            Reply::Download {
                file: file.clone(),
                from,
                cut_after,
            }
        }
    })
    .await?;
    let client = demo_stack()?
        .resume_bodies(true)
        .build_from(reqwest::Client::builder())?;
    let body = client
        .get(server.url("/dist/wheel.whl"))
        .send()
        .await?
        .bytes()
        .await?;
    let same = body[..] == file[..];
    let sent = sent.load(Ordering::SeqCst);
    println!(
        "   caller read {} bytes (identical: {same}); the server sent {sent} body bytes in {} answers",
        body.len(),
        server.requests()
    );
    tour.check(
        "resume: cut twice, one body",
        format!("{} bytes, identical", file.len()),
        format!(
            "{} bytes, {}",
            body.len(),
            if same { "identical" } else { "different" }
        ),
    );
    tour.check(
        "resume: bytes at the server",
        format!("{} in 3 answers", file.len()),
        format!("{sent} in {} answers", server.requests()),
    );
    Ok(())
}

/// A pool of two proxies, the first down: the retry goes through the second, and the
/// target's breaker never hears of the first one's refusal.
async fn proxy_pool(tour: &mut Tour) -> Result<(), BoxError> {
    println!(
        "\n22. A pool of proxies, the first one down: the retry goes through the next, and \
         the refusal is the proxy's, not the target's"
    );
    // The second "proxy" answers itself (a forward proxy receives the target's absolute
    // URL): the target's name is never resolved, nothing leaves 127.0.0.1.
    let proxy = FlakyServer::start(|_, req| {
        println!("   the second proxy received: {} {}", req.method, req.path);
        Reply::ok("relayed")
    })
    .await?;
    let down = refused_url("")?;
    let registry = BreakerRegistry::new(BreakerConfig::default())?;
    let client = demo_stack()?
        .breaker(registry.clone())
        .proxies(ProxyPool::new([down.clone(), proxy.url("")]))
        // One reqwest::Client per proxy, each from these settings.
        .build_from(reqwest::Client::builder)?;
    let target = "http://api.example.test/items";
    let (result, history) = send(&client, client.get(target), Extensions::new()).await?;
    print_history(&history);
    let via: Vec<String> = history
        .attempts()
        .iter()
        .map(|r| match (&r.evidence.proxy, r.evidence.charged_to_proxy) {
            (Some(p), true) => format!("{p} (its fault)"),
            (Some(p), false) => p.to_string(),
            (None, _) => "direct".to_owned(),
        })
        .collect();
    println!("   through: {}", via.join(", then "));
    tour.check(
        "proxies: the retry via the next",
        "2 attempts, 200",
        format!("{} attempts, {}", history.len(), outcome(&result)),
    );
    let failures = |origin: &str| {
        let origin = Origin::from_url(&reqwest::Url::parse(origin).ok()?).ok()?;
        let snapshot = registry
            .snapshot()
            .into_iter()
            .find(|s| s.origin == origin)?;
        Some(snapshot.consecutive_failures)
    };
    tour.check(
        "proxies: failures proxy/target",
        "1/0",
        format!(
            "{}/{}",
            failures(&down).unwrap_or(99),
            failures(target).unwrap_or(99)
        ),
    );
    Ok(())
}

/// A file uploaded as a stream, answered `503` with `Retry-After`: the file is opened
/// again for the retry and sent whole, never held in memory.
async fn replayed_upload(tour: &mut Tour) -> Result<(), BoxError> {
    println!(
        "\n23. A 4 MiB file POSTed as a stream, answered 503 with Retry-After: sent again whole"
    );
    const LEN: usize = 4 << 20;
    let path = std::env::temp_dir().join(format!("tour-upload-{}.bin", std::process::id()));
    std::fs::write(&path, vec![42u8; LEN])?;
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let server = FlakyServer::start({
        let bodies = bodies.clone();
        move |i, req| {
            bodies.lock().unwrap().push(req.body_len);
            if i == 0 {
                Reply::status(503).header("retry-after", "1")
            } else {
                Reply::status(201)
            }
        }
    })
    .await?;
    let client = demo_stack()?.build_from(reqwest::Client::builder())?;
    let mut extensions = Extensions::new();
    extensions.insert(ReplayableBody::file(&path));
    let (result, history) = send(&client, client.post(server.url("/upload")), extensions).await?;
    let _ = std::fs::remove_file(&path);
    print_history(&history);
    tour.check(
        "upload: 503, then sent again",
        "2 attempts, 201",
        format!("{} attempts, {}", history.len(), outcome(&result)),
    );
    tour.check(
        "upload: bodies at the server",
        format!("{LEN}, {LEN}"),
        format!("{:?}", bodies.lock().unwrap())
            .trim_matches(['[', ']'])
            .to_owned(),
    );
    Ok(())
}
