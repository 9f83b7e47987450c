//! Retrying outside the client, under the client's own retry: the stack's retry middleware
//! handed out by every preset (`Resilience::retry_middleware`), its operations sharing the
//! client's attempt count and budget, and loops that are not closures (`Steps`): a port
//! of rattler's labelled mirror loop and of uv's `fetch_with_url_fallback`. Loopback
//! servers, a paused clock, exact counts.

use crate::support;

use std::future::Future;
use std::time::Duration;

use http::StatusCode;
use reqwest_middleware::ClientWithMiddleware;
use reqwest_resilience::retry::{OperationAttempt, RetryReason, Step, Steps, StopReason};
use reqwest_resilience::{AttemptDecision, AttemptHistory, Resilience, RetryMiddleware};
use support::held_port::HeldRefusedPort;
use support::{Action, FaultServer};

const S: fn(u64) -> Duration = Duration::from_secs;

fn retried(delay: Duration, reason: RetryReason) -> Option<AttemptDecision> {
    Some(AttemptDecision::Retry { delay, reason })
}

fn stop(reason: StopReason) -> Option<AttemptDecision> {
    Some(AttemptDecision::Stop { reason })
}

fn decisions(history: &AttemptHistory) -> Vec<Option<AttemptDecision>> {
    history
        .attempts()
        .iter()
        .map(|r| r.decision.clone())
        .collect()
}

const R503: RetryReason = RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE);

/// A client builder for these servers: no proxy, and no idle pool, whose timer a paused
/// clock would jump to.
fn loopback_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .pool_idle_timeout(None)
}

/// A stack with exact delays (1 s, 2 s, 4 s…), no breaker, and its retry handed out; the
/// client records its redirects (a refused connect is proven unsent).
fn exact_stack(max_retries: u32) -> (RetryMiddleware, ClientWithMiddleware) {
    let mut stack = Resilience::new()
        .retry(support::exact_retry().max_retries(max_retries))
        .no_breaker();
    let retry = stack.retry_middleware().unwrap();
    (retry, stack.build_from(loopback_builder()).unwrap())
}

// ---------------------------------------------------------------------------------------
// rattler's repodata loop (`rattler_repodata_gateway::fetch::with_cache`): a labelled loop
// over candidates, `continue 'candidates` to the next, `break 'candidates` with the
// answer. Here the candidates are two mirrors; a mirror that cannot be reached is left
// for the next one, one that answers a retryable status is asked again.
// ---------------------------------------------------------------------------------------

/// The mirror loop, as rattler would write it over `Steps`: the repodata's body, or the
/// last error, and the steps (for their count and history).
async fn fetch_repodata(
    client: &ClientWithMiddleware,
    mirrors: &[String],
    mut steps: Steps,
) -> (Result<String, reqwest_middleware::Error>, Steps) {
    let mut candidates = mirrors.iter().cycle();
    let result = 'candidates: loop {
        let Some(mirror) = candidates.next() else {
            unreachable!("cycle")
        };
        loop {
            let result = client
                .get(format!("{mirror}/linux-64/repodata.json"))
                .with_extension(steps.attempt())
                .send()
                .await;
            match steps.after(&result) {
                Step::Retry(delay) => {
                    tokio::time::sleep(delay).await;
                    if result
                        .as_ref()
                        .is_err_and(reqwest_middleware::Error::is_connect)
                    {
                        // This mirror cannot be reached: the next one.
                        continue 'candidates;
                    }
                }
                Step::Stop(_) => break 'candidates result,
            }
        }
    };
    let body = match result {
        Ok(response) => match response.error_for_status() {
            Ok(response) => response.text().await.map_err(Into::into),
            Err(e) => Err(e.into()),
        },
        Err(e) => Err(e),
    };
    (body, steps)
}

#[tokio::test(start_paused = true)]
async fn a_labelled_mirror_loop_moves_on_from_a_refusing_mirror_and_the_count_goes_on() {
    let down = HeldRefusedPort::new();
    let up = FaultServer::sequence(vec![Action::status(503)], Action::ok("{}")).await;
    let (retry, client) = exact_stack(3);
    let mirrors = [down.url(""), up.url("")];
    let started = tokio::time::Instant::now();
    let (body, steps) = fetch_repodata(&client, &mirrors, retry.operation().steps()).await;
    assert_eq!(body.unwrap(), "{}");
    // The refused mirror once (the middleware did not retry it itself), then the second
    // mirror twice: one count of three attempts, one history.
    assert_eq!(up.requests_seen(), 2);
    let outcome = steps.outcome().unwrap();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (3, StopReason::FinalResponse(StatusCode::OK))
    );
    let history = steps.history();
    assert_eq!(
        decisions(&history),
        [
            retried(S(1), RetryReason::NotSent),
            retried(S(2), R503),
            stop(StopReason::FinalResponse(StatusCode::OK)),
        ]
    );
    let numbers: Vec<u32> = history
        .attempts()
        .iter()
        .map(|r| r.evidence.attempt)
        .collect();
    assert_eq!(numbers, [1, 2, 3]);
    assert_eq!(
        started.elapsed(),
        S(3),
        "1 s, then 2 s: the backoff went on"
    );
}

#[tokio::test(start_paused = true)]
async fn the_retry_limit_spans_the_mirrors() {
    // Both mirrors refuse: with 2 retries, three attempts in all, alternating.
    let (first, second) = (HeldRefusedPort::new(), HeldRefusedPort::new());
    let (retry, client) = exact_stack(2);
    let mirrors = [first.url(""), second.url("")];
    let (body, steps) = fetch_repodata(&client, &mirrors, retry.operation().steps()).await;
    assert!(
        body.unwrap_err().is_connect(),
        "the last error, as reqwest's"
    );
    let outcome = steps.outcome().unwrap();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (3, StopReason::RetriesExhausted)
    );
    let ports: Vec<Option<u16>> = steps
        .history()
        .attempts()
        .iter()
        .map(|r| r.evidence.origin.as_ref().map(|o| o.port()))
        .collect();
    let (a, b) = (Some(first.port()), Some(second.port()));
    assert_eq!(ports, [a, b, a]);
}

#[tokio::test(start_paused = true)]
async fn a_mirror_answering_503_with_retry_after_is_asked_again_after_it() {
    let mirror = FaultServer::sequence(
        vec![Action::status(503).header("Retry-After", "7")],
        Action::ok("{}"),
    )
    .await;
    let (retry, client) = exact_stack(3);
    let started = tokio::time::Instant::now();
    let (body, steps) = fetch_repodata(&client, &[mirror.url("")], retry.operation().steps()).await;
    assert_eq!(body.unwrap(), "{}");
    assert_eq!(mirror.requests_seen(), 2);
    assert_eq!(decisions(&steps.history())[0], retried(S(7), R503));
    assert_eq!(started.elapsed(), S(7));
}

// ---------------------------------------------------------------------------------------
// uv's `fetch_with_url_fallback` (uv-client): a list of URLs; an error that says so moves
// to the next URL at once, and after the last one the list starts over after the
// backoff; a fatal error ends it. Its five cases, over real servers.
// ---------------------------------------------------------------------------------------

/// What uv's fetch closure fails with: `fallback` is its `should_try_next_url()`.
#[derive(Debug)]
struct FetchError {
    fallback: bool,
    source: reqwest_middleware::Error,
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fetch failed")
    }
}

impl std::error::Error for FetchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// uv's `fetch_with_url_fallback`, over `Steps` instead of its own policy and counter:
/// the URL whose turn it is, and what to do after each attempt.
async fn fetch_with_url_fallback<T, F, Fut>(
    urls: &[String],
    mut steps: Steps,
    mut fetch: F,
) -> (Result<T, FetchError>, Steps)
where
    F: FnMut(String, OperationAttempt) -> Fut,
    Fut: Future<Output = Result<T, FetchError>>,
{
    let mut index = 0;
    loop {
        let result = fetch(urls[index].clone(), steps.attempt()).await;
        match steps.after(&result) {
            Step::Stop(_) => return (result, steps),
            Step::Retry(delay) => {
                let fallback = result.as_ref().err().is_some_and(|e| e.fallback);
                if fallback && index + 1 < urls.len() {
                    // The next URL, at once.
                    index += 1;
                } else {
                    tokio::time::sleep(delay).await;
                    if fallback {
                        index = 0;
                    }
                }
            }
        }
    }
}

/// The fetch of uv's tests: the body, every error falling back to the next URL unless
/// `fallback` says otherwise.
async fn fetch_text(
    client: &ClientWithMiddleware,
    url: String,
    attempt: OperationAttempt,
    fallback: bool,
) -> Result<String, FetchError> {
    let error = |source: reqwest_middleware::Error| FetchError { fallback, source };
    let response = client
        .get(url)
        .with_extension(attempt)
        .send()
        .await
        .map_err(error)?;
    let response = response.error_for_status().map_err(|e| error(e.into()))?;
    response.text().await.map_err(|e| error(e.into()))
}

struct TwoUrls {
    mirror: FaultServer,
    canonical: FaultServer,
}

impl TwoUrls {
    async fn start(mirror: Vec<Action>, canonical: Vec<Action>) -> TwoUrls {
        TwoUrls {
            mirror: FaultServer::sequence(mirror, Action::ok("mirror")).await,
            canonical: FaultServer::sequence(canonical, Action::ok("canonical")).await,
        }
    }

    fn urls(&self) -> [String; 2] {
        [self.mirror.url("/mirror"), self.canonical.url("/canonical")]
    }

    fn seen(&self) -> (usize, usize) {
        (self.mirror.requests_seen(), self.canonical.requests_seen())
    }
}

/// The path of each attempt, in order.
fn paths(history: &AttemptHistory, servers: &TwoUrls) -> Vec<&'static str> {
    let mirror = servers.mirror.addr().port();
    history
        .attempts()
        .iter()
        .map(|r| match r.evidence.origin.as_ref().map(|o| o.port()) {
            Some(p) if p == mirror => "/mirror",
            _ => "/canonical",
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn uv_url_fallback_success_stops_before_the_next_url() {
    let servers = TwoUrls::start(vec![], vec![]).await;
    let (retry, client) = exact_stack(2);
    let client = &client;
    let (result, steps) =
        fetch_with_url_fallback(&servers.urls(), retry.operation().steps(), |url, a| {
            fetch_text(client, url, a, true)
        })
        .await;
    assert_eq!(result.unwrap(), "mirror");
    assert_eq!(servers.seen(), (1, 0));
    assert_eq!(steps.outcome().unwrap().attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn uv_url_fallback_exhausted_urls_restart_from_the_beginning() {
    let servers = TwoUrls::start(
        vec![Action::status(503), Action::status(503)],
        vec![Action::status(503)],
    )
    .await;
    let (retry, client) = exact_stack(3);
    let client = &client;
    let started = tokio::time::Instant::now();
    let (result, steps) =
        fetch_with_url_fallback(&servers.urls(), retry.operation().steps(), |url, a| {
            fetch_text(client, url, a, true)
        })
        .await;
    assert_eq!(result.unwrap(), "canonical");
    assert_eq!(servers.seen(), (2, 2));
    let history = steps.history();
    assert_eq!(
        paths(&history, &servers),
        ["/mirror", "/canonical", "/mirror", "/canonical"]
    );
    // The next URL at once; the backoff of the retry that starts the list over only.
    assert_eq!(started.elapsed(), S(2));
    assert_eq!(
        decisions(&history),
        [
            retried(S(1), R503),
            retried(S(2), R503),
            retried(S(4), R503),
            stop(StopReason::FinalResponse(StatusCode::OK)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn uv_url_fallback_a_fatal_error_does_not_try_the_next_url() {
    let servers = TwoUrls::start(vec![Action::status(404)], vec![]).await;
    let (retry, client) = exact_stack(2);
    let client = &client;
    let (result, steps) =
        fetch_with_url_fallback(&servers.urls(), retry.operation().steps(), |url, a| {
            fetch_text(client, url, a, true)
        })
        .await;
    let error = result.unwrap_err();
    assert_eq!(error.source.status(), Some(StatusCode::NOT_FOUND));
    assert_eq!(servers.seen(), (1, 0));
    let outcome = steps.outcome().unwrap();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (1, StopReason::FinalResponse(StatusCode::NOT_FOUND))
    );
}

#[tokio::test(start_paused = true)]
async fn uv_url_fallback_a_transient_error_can_opt_out_of_the_fallback() {
    let servers = TwoUrls::start(vec![Action::status(503)], vec![]).await;
    let (retry, client) = exact_stack(1);
    let client = &client;
    let (result, _) =
        fetch_with_url_fallback(&servers.urls(), retry.operation().steps(), |url, a| {
            fetch_text(client, url, a, false)
        })
        .await;
    assert_eq!(result.unwrap(), "mirror");
    assert_eq!(servers.seen(), (2, 0), "the same URL again");
}

#[tokio::test(start_paused = true)]
async fn uv_url_fallback_exhausted_retries_keep_the_last_error() {
    let servers = TwoUrls::start(vec![Action::status(503); 9], vec![Action::status(502); 9]).await;
    let (retry, client) = exact_stack(5);
    let client = &client;
    let (result, steps) =
        fetch_with_url_fallback(&servers.urls(), retry.operation().steps(), |url, a| {
            fetch_text(client, url, a, true)
        })
        .await;
    // Three rounds over both URLs: 6 attempts, the last the canonical URL's 502.
    assert_eq!(servers.seen(), (3, 3));
    assert_eq!(
        result.unwrap_err().source.status(),
        Some(StatusCode::BAD_GATEWAY)
    );
    let outcome = steps.outcome().unwrap();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (6, StopReason::RetriesExhausted)
    );
}

// ---------------------------------------------------------------------------------------
// Every preset hands out the retry its client uses.
// ---------------------------------------------------------------------------------------

/// The presets, each with 3 retries: the default stack, the reqwest-retry preset, a
/// builder handed to `.retry(..)`, a prebuilt middleware handed to `.retry(..)`.
fn presets() -> Vec<(&'static str, Resilience)> {
    vec![
        ("new", Resilience::new()),
        ("like_reqwest_retry", Resilience::like_reqwest_retry()),
        (
            "builder",
            Resilience::new().retry(support::exact_retry().max_retries(3)),
        ),
        (
            "prebuilt",
            Resilience::like_reqwest_retry().retry(
                RetryMiddleware::like_reqwest_retry()
                    .max_retries(3)
                    .build()
                    .unwrap(),
            ),
        ),
    ]
}

#[tokio::test(start_paused = true)]
async fn an_operation_from_every_preset_shares_the_client_s_attempt_count() {
    for (name, mut stack) in presets() {
        let server = FaultServer::always(Action::status(503)).await;
        let retry = stack.retry_middleware().unwrap();
        let client = stack.build(support::loopback_client()).unwrap();
        let (client, url) = (&client, server.url("/"));
        let url = url.as_str();
        let done = retry
            .operation()
            .run_recorded(|attempt| async move {
                let response = client.get(url).with_extension(attempt).send().await?;
                Ok::<_, reqwest_middleware::Error>(response.error_for_status()?.bytes().await?)
            })
            .await;
        assert_eq!(
            done.result.unwrap_err().status(),
            Some(StatusCode::SERVICE_UNAVAILABLE),
            "{name}"
        );
        // The middleware's 3 retries inside the operation's first run are the
        // operation's: 4 requests, not 4 × 4.
        assert_eq!(server.requests_seen(), 4, "{name}");
        assert_eq!(
            (done.outcome.attempts, done.outcome.stop),
            (4, StopReason::RetriesExhausted),
            "{name}"
        );

        // Step by step: the same count, each attempt's decision handed back (to a server
        // of its own: the default stack's breaker opens after five failures of an origin).
        let server = FaultServer::always(Action::status(503)).await;
        let url = server.url("/");
        let url = url.as_str();
        let mut steps = retry.operation().steps();
        let mut sent = 0;
        let last = loop {
            let result = client.get(url).with_extension(steps.attempt()).send().await;
            sent += 1;
            match steps.after(&result) {
                Step::Retry(delay) => tokio::time::sleep(delay).await,
                Step::Stop(stop) => break (result.unwrap().status(), stop),
            }
        };
        assert_eq!(
            last,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                StopReason::RetriesExhausted
            ),
            "{name}"
        );
        assert_eq!((sent, server.requests_seen()), (4, 4), "{name}");
        assert_eq!(steps.outcome().unwrap().attempts, 4, "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_operation_spends_the_client_s_budget() {
    let server = FaultServer::sequence(vec![Action::status(503)], Action::ok("")).await;
    let mut stack = Resilience::new()
        .retry(support::exact_retry().budget(reqwest_resilience::RetryBudget::default()))
        .no_breaker();
    let retry = stack.retry_middleware().unwrap();
    let client = stack.build(support::loopback_client()).unwrap();
    let budget = retry.budget().unwrap().clone();
    // The default budget's floor: 10 retries a second over 10 s.
    assert_eq!(budget.remaining(), 100);
    // The client's own retry spends it...
    assert_eq!(
        client.get(server.url("/")).send().await.unwrap().status(),
        200
    );
    assert_eq!(budget.remaining(), 99);
    // ...and so does a retry decided for a step loop.
    let mut steps = retry.operation().idempotent(true).steps();
    let failed: Result<(), std::io::Error> = Err(std::io::ErrorKind::ConnectionReset.into());
    assert!(matches!(steps.after(&failed), Step::Retry(_)));
    assert_eq!(budget.remaining(), 98);
    // Dropped before that attempt, the loop gives the retry back.
    drop(steps);
    assert_eq!(budget.remaining(), 99);
    // The reqwest-retry preset has no budget.
    let mut preset = Resilience::like_reqwest_retry();
    assert!(preset.retry_middleware().unwrap().budget().is_none());
}

#[test]
fn the_handed_out_retry_is_the_one_the_stack_keeps_and_no_retry_has_none() {
    let mut stack = Resilience::new();
    let first = stack.retry_middleware().unwrap();
    let again = stack.retry_middleware().unwrap();
    let (a, b) = (first.budget().unwrap(), again.budget().unwrap());
    assert!(a.try_withdraw());
    assert_eq!(a.remaining(), b.remaining(), "one budget: one middleware");
    let err = Resilience::new().no_retry().retry_middleware().unwrap_err();
    assert!(err.to_string().contains("retry_middleware"), "{err}");
    // A builder the stack would refuse is refused now, and stays in place.
    let mut bad =
        Resilience::new().retry(RetryMiddleware::builder().total_deadline(Duration::ZERO));
    assert!(bad.retry_middleware().is_err());
    assert!(bad.build(reqwest::Client::new()).is_err());
}

// ---------------------------------------------------------------------------------------
// uv-publish's upload loop: the upload's body is a stream, which the middleware cannot
// copy, so uv rebuilds the request for every attempt. The decision is handed back, and
// the loop sends the rebuilt request.
// ---------------------------------------------------------------------------------------

/// A streamed upload body (as a file read in chunks): two chunks.
fn streamed_upload() -> reqwest::Body {
    let chunks: Vec<Result<&'static [u8], std::io::Error>> = vec![Ok(b"wheel-"), Ok(b"bytes")];
    reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
}

#[tokio::test(start_paused = true)]
async fn an_upload_loop_rebuilds_its_streamed_body_for_each_attempt() {
    let down = HeldRefusedPort::new();
    let index = FaultServer::sequence(
        vec![Action::status(503).header("Retry-After", "3")],
        Action::ok("uploaded"),
    )
    .await;
    let (retry, client) = exact_stack(3);
    let targets = [down.url("/upload"), index.url("/upload")];
    let mut steps = retry.operation().steps();
    let mut target = 0;
    let status = loop {
        let result = client
            .post(&targets[target])
            .body(streamed_upload())
            .with_extension(steps.attempt())
            .send()
            .await;
        match steps.after(&result) {
            Step::Retry(delay) => {
                tokio::time::sleep(delay).await;
                target = 1; // the refused one was a wrong address: the index from now on
            }
            Step::Stop(_) => break result.unwrap().status(),
        }
    };
    assert_eq!(status, StatusCode::OK);
    // A POST proven unsent (refused) and one answered 503 with Retry-After are sent
    // again; the index got the whole body both times.
    let bodies: Vec<Vec<u8>> = index.requests().into_iter().map(|r| r.body).collect();
    assert_eq!(bodies, [b"wheel-bytes".to_vec(), b"wheel-bytes".to_vec()]);
    assert_eq!(
        decisions(&steps.history()),
        [
            retried(S(1), RetryReason::NotSent),
            retried(S(3), R503),
            stop(StopReason::FinalResponse(StatusCode::OK)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_upload_loop_does_not_send_again_a_post_that_may_have_been_processed() {
    let index = FaultServer::always(Action::ReadThenClose).await;
    let (retry, client) = exact_stack(3);
    let mut steps = retry.operation().steps();
    let result = client
        .post(index.url("/upload"))
        .body(streamed_upload())
        .with_extension(steps.attempt())
        .send()
        .await;
    assert_eq!(
        steps.after(&result),
        Step::Stop(StopReason::MayHaveBeenProcessed)
    );
    assert_eq!(index.requests_seen(), 1);
}

// ---------------------------------------------------------------------------------------
// The astral fork (uv, rattler): the same handle and the same steps, the client built
// with the fork's builder. Nothing of it is trait-bound: no twin is needed.
// ---------------------------------------------------------------------------------------

#[cfg(feature = "astral")]
#[tokio::test(start_paused = true)]
async fn the_fork_s_client_shares_its_retry_with_steps_and_operations() {
    use reqwest_resilience::stack::astral::AstralResilience;
    let down = HeldRefusedPort::new();
    let up = FaultServer::sequence(vec![Action::status(503)], Action::ok("{}")).await;
    let mut stack = Resilience::like_reqwest_retry();
    let retry = stack.retry_middleware().unwrap();
    let client = stack.build_from_astral(loopback_builder()).unwrap();
    let mirrors = [down.url("/"), up.url("/")];
    let mut steps = retry.operation().steps();
    let mut next = 0;
    let status = loop {
        let result = client
            .get(&mirrors[next])
            .with_extension(steps.attempt())
            .send()
            .await;
        match steps.after(&result) {
            Step::Retry(delay) => {
                tokio::time::sleep(delay).await;
                next = 1;
            }
            Step::Stop(_) => break result.unwrap().status(),
        }
    };
    assert_eq!(status, StatusCode::OK);
    assert_eq!(up.requests_seen(), 2);
    let reasons: Vec<Option<AttemptDecision>> = decisions(&steps.history())
        .into_iter()
        .map(|d| match d {
            // The preset's jitter draws the delays: compare the reasons.
            Some(AttemptDecision::Retry { reason, .. }) => retried(Duration::ZERO, reason),
            other => other,
        })
        .collect();
    assert_eq!(
        reasons,
        [
            retried(Duration::ZERO, RetryReason::NotSent),
            retried(Duration::ZERO, R503),
            stop(StopReason::FinalResponse(StatusCode::OK)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_operation_of_a_separately_built_middleware_shares_the_client_s_count_too() {
    // rattler's shape: a second `RetryMiddleware` only for its operations. The client's
    // middleware still counts the operation's attempts as one count (its own table and
    // limit decide inside): 4 requests, not 4 × 4.
    let server = FaultServer::always(Action::status(503)).await;
    let (_, client) = exact_stack(3);
    let separate = support::exact_retry().max_retries(3).build().unwrap();
    let (client, url) = (&client, server.url("/"));
    let url = url.as_str();
    let done = separate
        .operation()
        .run_recorded(|attempt| async move {
            let response = client.get(url).with_extension(attempt).send().await?;
            Ok::<_, reqwest_middleware::Error>(response.error_for_status()?.bytes().await?)
        })
        .await;
    assert!(done.result.is_err());
    assert_eq!(server.requests_seen(), 4);
    assert_eq!(
        (done.outcome.attempts, done.outcome.stop),
        (4, StopReason::RetriesExhausted)
    );
}
