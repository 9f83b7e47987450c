//! The stack dropped into existing reqwest code: errors that keep reqwest's answers, one
//! way to find this crate's own errors, the attempt history from a `Response`, token
//! sources in the usual shapes, and misconfigurations that are not silent.
//!
//! Paused clock + real loopback sockets, as in `tests/it/retry.rs`.

use crate::support;

use std::error::Error as StdError;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, BreakerState, TripPolicy};
use reqwest_resilience::misconfig::Misconfiguration;
use reqwest_resilience::redirect::{self, ClientRedirects};
use reqwest_resilience::retry::{
    ErrorWrapping, RetryError, RetryMiddlewareBuilder, RetryOutcome, StopReason,
};
use reqwest_resilience::{
    AccessToken, AttemptDecision, AttemptHistory, Backoff, BearerAuth, CircuitBreakerMiddleware,
    FailureKind, Jitter, Origin, Resilience, ResilienceError, RetryMiddleware, TokenManager,
    TokenSource, Transmission, TransportEvidence,
};
use support::{Action, FaultServer, refused_port};
use tokio::time::Instant;

const S: fn(u64) -> Duration = Duration::from_secs;

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .build()
        .unwrap()
}

/// A client whose redirects the stack sees, so a refused connect is proven unsent.
fn recorded_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
        .build()
        .unwrap()
}

/// 1 s, 2 s, 4 s without jitter.
fn exact() -> Resilience {
    Resilience::new().retry(exact_retry())
}

/// [`exact`]'s retry, to change one of its settings.
fn exact_retry() -> RetryMiddlewareBuilder {
    RetryMiddleware::builder().backoff(Backoff::builder().jitter(Jitter::None).build().unwrap())
}

async fn execute(
    client: &ClientWithMiddleware,
    request: reqwest_middleware::RequestBuilder,
) -> (
    reqwest_middleware::Result<reqwest::Response>,
    Extensions,
    Duration,
) {
    let mut ext = Extensions::new();
    let t0 = Instant::now();
    let result = tokio::time::timeout(
        S(3600),
        client.execute_with_extensions(request.build().unwrap(), &mut ext),
    )
    .await
    .expect("the request finished");
    (result, ext, t0.elapsed())
}

fn outcome(ext: &Extensions) -> RetryOutcome {
    *RetryOutcome::of(ext).expect("a RetryOutcome")
}

fn history(ext: &Extensions) -> Vec<(Transmission, Option<FailureKind>)> {
    AttemptHistory::of(ext)
        .expect("a history")
        .attempts()
        .iter()
        .map(|r| (r.evidence.transmission, r.evidence.failure))
        .collect()
}

/// Every link of the `source()` chain, starting with `err` itself.
fn chain<'a>(err: &'a (dyn StdError + 'static)) -> Vec<&'a (dyn StdError + 'static)> {
    let mut links = vec![err];
    while let Some(next) = links[links.len() - 1].source() {
        links.push(next);
    }
    links
}

// ---------------------------------------------------------------------------------------
// 1. Errors keep reqwest's answers

#[tokio::test(start_paused = true)]
async fn through_resilience_new_a_refused_connection_answers_is_connect_and_url_as_reqwest_does() {
    // A recorded client: the refused POST is proven unsent, so it is retried.
    let client = exact()
        .client_redirects(ClientRedirects::Recorded)
        .build(recorded_client())
        .unwrap();
    let url = format!("http://127.0.0.1:{}/items", refused_port());
    let (result, ext, took) = execute(&client, client.post(&url).body("x")).await;
    let err = result.unwrap_err();
    let reqwest_middleware::Error::Reqwest(inner) = &err else {
        panic!("expected Error::Reqwest, got {err:?}");
    };
    assert!(inner.is_connect());
    assert!(err.is_connect() && !err.is_timeout() && !err.is_middleware());
    assert_eq!(err.status(), None);
    assert_eq!(err.url().map(|u| u.as_str()), Some(url.as_str()));
    assert!(ResilienceError::find(&err).is_none());
    // The count and the reason are in the caller's extensions: 4 attempts, 1 + 2 + 4 s.
    assert_eq!(
        (outcome(&ext).attempts, outcome(&ext).stop),
        (4, StopReason::RetriesExhausted)
    );
    assert_eq!(
        history(&ext),
        vec![(Transmission::NotSent, Some(FailureKind::Connect)); 4]
    );
    assert!(
        took >= S(7) && took < S(7) + Duration::from_millis(10),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn through_resilience_new_a_reqwest_timeout_answers_is_timeout() {
    let server = FaultServer::always(Action::Stall).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .timeout(S(2))
        .build()
        .unwrap();
    let client = Resilience::new()
        .retry(exact_retry().max_retries(1))
        .build(http)
        .unwrap();
    let url = server.url("/slow");
    let (result, ext, _) = execute(&client, client.get(&url)).await;
    let err = result.unwrap_err();
    assert!(
        matches!(&err, reqwest_middleware::Error::Reqwest(e) if e.is_timeout()),
        "{err:?}"
    );
    assert!(err.is_timeout());
    assert_eq!(err.url().map(|u| u.as_str()), Some(url.as_str()));
    assert_eq!(server.requests_seen(), 2);
    assert_eq!(outcome(&ext).attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn error_wrapping_always_is_the_opt_in_to_the_count_on_the_error() {
    let client = Resilience::new()
        .retry(exact_retry().error_wrapping(ErrorWrapping::Always))
        .build(reqwest_client())
        .unwrap();
    let url = format!("http://127.0.0.1:{}/", refused_port());
    let err = client.get(&url).send().await.unwrap_err();
    assert!(!err.is_connect(), "wrapped: reqwest's answers are inside");
    let Some(ResilienceError::Retry(retry)) = ResilienceError::find(&err) else {
        panic!("expected the Retry wrapper as the innermost ResilienceError: {err:?}");
    };
    assert_eq!(
        (retry.attempts(), retry.stop_reason()),
        (4, StopReason::RetriesExhausted)
    );
    assert!(retry.is_connect());
    assert_eq!(
        err.to_string(),
        "request failed after 4 attempts; stopped: retries exhausted"
    );
}

// ---------------------------------------------------------------------------------------
// 2. One way to find the cause

fn trip_on_first_failure() -> BreakerRegistry {
    BreakerRegistry::new(BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_breaker_rejection_is_found_by_find_with_retry_on_and_off_and_retry_error_is_in_the_chain()
 {
    let server = FaultServer::always(Action::status(503)).await;
    let registry = trip_on_first_failure();
    let no_retry = Resilience::new()
        .no_retry()
        .breaker(registry.clone())
        .build(reqwest_client())
        .unwrap();
    let with_retry = Resilience::new()
        .retry(exact_retry().total_deadline(S(5)))
        .breaker(registry.clone())
        .build(reqwest_client())
        .unwrap();
    let url = server.url("/");
    // One 503 opens the breaker (30 s).
    let first = no_retry.get(&url).send().await.unwrap();
    assert_eq!(first.status(), 503);
    assert_eq!(server.requests_seen(), 1);

    let bare = no_retry.get(&url).send().await.unwrap_err();
    let (wrapped, ext, _) = execute(&with_retry, with_retry.get(&url)).await;
    let wrapped = wrapped.unwrap_err();
    assert_eq!(server.requests_seen(), 1, "both rejected without a request");

    let origin = Origin::parse(&url).unwrap();
    for err in [&bare, &wrapped] {
        match ResilienceError::find(err) {
            Some(ResilienceError::BreakerOpen {
                origin: o,
                state: BreakerState::Open,
                retry_in: Some(_),
            }) => assert_eq!(o, &origin),
            other => panic!("expected BreakerOpen, got {other:?} from {err:?}"),
        }
    }
    // Without retry the rejection is the error; with it, the Retry wraps it (an open
    // breaker fails fast, issue 42) and says so.
    assert!(matches!(
        ResilienceError::from_middleware_error(&bare),
        Some(ResilienceError::BreakerOpen { .. })
    ));
    let Some(ResilienceError::Retry(retry)) = ResilienceError::from_middleware_error(&wrapped)
    else {
        panic!("{wrapped:?}")
    };
    assert_eq!(
        (retry.attempts(), retry.stop_reason()),
        (1, StopReason::BreakerRejected)
    );
    assert_eq!(outcome(&ext).stop, StopReason::BreakerRejected);

    // The chain: the top error (displaying the Retry's summary), the RetryError, the
    // BreakerOpen; each message once.
    let links = chain(&wrapped);
    assert_eq!(links.len(), 3, "{links:?}");
    assert!(links[1].is::<RetryError>());
    assert!(matches!(
        links[2].downcast_ref::<ResilienceError>(),
        Some(ResilienceError::BreakerOpen { .. })
    ));
    let messages: Vec<String> = links.iter().map(|l| l.to_string()).collect();
    assert_eq!(
        messages[..2],
        [
            format!(
                "request failed after 1 attempt; stopped: an open circuit breaker rejected it; \
                 the last attempt was not sent: the circuit breaker for {origin} is Open"
            ),
            "the last attempt failed".to_owned(),
        ]
    );
    assert!(messages[2].starts_with(&format!("circuit breaker for {origin} is Open")));
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_is_named_with_its_origin_in_the_top_level_message() {
    let server = FaultServer::always(Action::status(503)).await;
    let client = Resilience::new()
        .retry(
            exact_retry()
                .max_retries(0)
                .error_wrapping(ErrorWrapping::Always),
        )
        .breaker(trip_on_first_failure())
        .build(reqwest_client())
        .unwrap();
    let url = server.url("/");
    assert_eq!(client.get(&url).send().await.unwrap().status(), 503);
    let err = client.get(&url).send().await.unwrap_err();
    assert_eq!(
        server.requests_seen(),
        1,
        "the second was turned away locally"
    );
    let origin = Origin::parse(&url).unwrap();
    assert_eq!(
        err.to_string(),
        format!(
            "request failed after 1 attempt; stopped: retries exhausted; \
             the last attempt was not sent: the circuit breaker for {origin} is Open"
        )
    );
}

// ---------------------------------------------------------------------------------------
// 3. Token sources in the usual shapes

fn bearer(server: &FaultServer, tokens: TokenManager) -> BearerAuth {
    BearerAuth::builder(tokens)
        .origin(Origin::parse(&server.url("/")).unwrap())
        .allow_http_on_loopback()
        .build()
        .unwrap()
}

/// A source as a struct, implemented with the re-exported attribute.
struct Counted(Arc<AtomicUsize>);

#[reqwest_resilience::async_trait]
impl TokenSource for Counted {
    type Error = Box<dyn StdError + Send + Sync>;

    async fn fetch(&self) -> Result<AccessToken, Self::Error> {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        if n == 0 {
            Err("the identity provider is down".into())
        } else {
            Ok(AccessToken::new(format!("struct-{n}")))
        }
    }
}

#[tokio::test(start_paused = true)]
async fn anyhow_boxed_and_struct_token_sources_are_accepted_and_their_errors_reach_the_caller() {
    let server = FaultServer::always(Action::ok("fine")).await;
    // anyhow, no turbofish.
    let anyhow_tokens = TokenManager::new(|| async {
        let secret = "from-anyhow".parse::<String>()?;
        anyhow::Ok(AccessToken::new(secret))
    });
    let client = Resilience::new()
        .bearer(bearer(&server, anyhow_tokens))
        .build(reqwest_client())
        .unwrap();
    client.get(server.url("/a")).send().await.unwrap();
    // A boxed error from a source that fails.
    let failing = TokenManager::new(|| async {
        Err::<AccessToken, _>(anyhow::anyhow!("token endpoint answered 500"))
    });
    let client = Resilience::new()
        .no_retry()
        .bearer(bearer(&server, failing))
        .build(reqwest_client())
        .unwrap();
    let err = client.get(server.url("/b")).send().await.unwrap_err();
    let Some(ResilienceError::Token(token)) = ResilienceError::find(&err) else {
        panic!("{err:?}")
    };
    assert_eq!(
        token.source().map(|s| s.to_string()).as_deref(),
        Some("token endpoint answered 500")
    );
    // A struct source with a `Box<dyn Error>` error: the first fetch fails, the retry
    // waits for the manager's next fetch and gets a token.
    let fetches = Arc::new(AtomicUsize::new(0));
    let client = exact()
        .bearer(bearer(&server, TokenManager::new(Counted(fetches.clone()))))
        .build(reqwest_client())
        .unwrap();
    let (result, ext, _) = execute(&client, client.get(server.url("/c"))).await;
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    assert_eq!(outcome(&ext).attempts, 2);

    let auth: Vec<_> = server
        .requests()
        .iter()
        .map(|r| (r.path.clone(), r.header("authorization").map(str::to_owned)))
        .collect();
    assert_eq!(
        auth,
        [
            ("/a".to_owned(), Some("Bearer from-anyhow".to_owned())),
            ("/c".to_owned(), Some("Bearer struct-1".to_owned())),
        ]
    );
}

// ---------------------------------------------------------------------------------------
// 4. The history from the response

#[tokio::test(start_paused = true)]
async fn a_send_caller_reads_the_attempt_history_from_the_response() {
    let server = FaultServer::sequence(
        vec![Action::status(503), Action::status(503)],
        Action::ok("ok"),
    )
    .await;
    let client = exact().build(reqwest_client()).unwrap();
    let retried = client.get(server.url("/")).send().await.unwrap();
    let history = AttemptHistory::of_response(&retried).expect("a history");
    let got: Vec<_> = history
        .attempts()
        .iter()
        .map(|r| {
            (
                r.evidence.attempt,
                r.evidence.status().map(|s| s.as_u16()),
                r.decision.clone(),
            )
        })
        .collect();
    let retry = |secs| {
        Some(AttemptDecision::Retry {
            delay: S(secs),
            reason: reqwest_resilience::retry::RetryReason::Status(
                http::StatusCode::SERVICE_UNAVAILABLE,
            ),
        })
    };
    let done = Some(AttemptDecision::Stop {
        reason: StopReason::FinalResponse(http::StatusCode::OK),
    });
    assert_eq!(
        got,
        [
            (1, Some(503), retry(1)),
            (2, Some(503), retry(2)),
            (3, Some(200), done.clone())
        ]
    );
    // One attempt: rebuilt from the response's evidence and outcome, same shape.
    let once = client.get(server.url("/")).send().await.unwrap();
    let history = AttemptHistory::of_response(&once).expect("a history");
    assert_eq!(history.len(), 1);
    assert_eq!(
        history.attempts()[0].evidence.status(),
        Some(http::StatusCode::OK)
    );
    assert_eq!(history.attempts()[0].decision, done);
    assert_eq!(server.requests_seen(), 4);
}

#[tokio::test(start_paused = true)]
async fn without_retry_a_401_replay_leaves_both_attempts_on_the_response() {
    let server = FaultServer::sequence(vec![Action::status(401)], Action::ok("ok")).await;
    let n = Arc::new(AtomicUsize::new(0));
    let tokens = TokenManager::new(move || {
        let n = n.fetch_add(1, Ordering::SeqCst);
        async move { anyhow::Ok(AccessToken::new(format!("t{n}"))) }
    });
    let client = Resilience::new()
        .no_retry()
        .bearer(bearer(&server, tokens))
        .build(reqwest_client())
        .unwrap();
    let response = client.get(server.url("/")).send().await.unwrap();
    let history = AttemptHistory::of_response(&response).expect("a history");
    let statuses: Vec<_> = history
        .attempts()
        .iter()
        .map(|r| {
            (
                r.evidence.attempt,
                r.evidence.status().map(|s| s.as_u16()),
                r.decision.clone(),
            )
        })
        .collect();
    assert_eq!(statuses, [(1, Some(401), None), (2, Some(200), None)]);
    assert_eq!(server.requests_seen(), 2);
}

// ---------------------------------------------------------------------------------------
// 5. Misconfiguration

fn refused(err: &reqwest_middleware::Error) -> Misconfiguration {
    match ResilienceError::find(err) {
        Some(ResilienceError::Misconfigured(m)) => *m,
        other => panic!("expected Misconfigured, got {other:?} from {err:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn the_stack_installed_twice_is_refused_on_the_first_request_before_anything_is_sent() {
    let server = FaultServer::always(Action::status(503)).await;
    // An already resilient client wrapped once more.
    let resilient = exact().build(reqwest_client()).unwrap();
    let twice = exact()
        .install(ClientBuilder::from_client(resilient))
        .unwrap()
        .build();
    let (result, ext, took) = execute(&twice, twice.get(server.url("/"))).await;
    let err = result.unwrap_err();
    assert_eq!(
        refused(&err),
        Misconfiguration::InsideTransportStep {
            middleware: "RetryMiddleware"
        }
    );
    assert_eq!(server.requests_seen(), 0);
    assert_eq!(took, Duration::ZERO);
    assert_eq!(
        history(&ext),
        [(Transmission::NotSent, Some(FailureKind::Misconfigured))]
    );
    assert_eq!(
        AttemptHistory::of(&ext).unwrap().attempts()[0]
            .evidence
            .origin,
        Some(Origin::parse(&server.url("/")).unwrap())
    );
    assert_eq!(
        (outcome(&ext).attempts, outcome(&ext).stop),
        (1, StopReason::Permanent(FailureKind::Misconfigured))
    );
}

#[tokio::test(start_paused = true)]
async fn each_middleware_of_this_crate_added_after_the_transport_step_is_refused() {
    let server = FaultServer::always(Action::ok("ok")).await;
    let tokens = TokenManager::new(|| async { anyhow::Ok(AccessToken::new("t")) });
    let cases: Vec<(&str, ClientWithMiddleware)> = vec![
        (
            "CircuitBreakerMiddleware",
            ClientBuilder::new(reqwest_client())
                .with(TransportEvidence::new())
                .with(CircuitBreakerMiddleware::new(trip_on_first_failure()))
                .build(),
        ),
        (
            "BearerAuth",
            ClientBuilder::new(reqwest_client())
                .with(TransportEvidence::new())
                .with(bearer(&server, tokens))
                .build(),
        ),
        (
            "TransportEvidence",
            ClientBuilder::new(reqwest_client())
                .with(TransportEvidence::new())
                .with(TransportEvidence::new())
                .build(),
        ),
        (
            "RetryMiddleware",
            Resilience::new()
                .no_breaker()
                .install(reqwest_middleware::ClientBuilder::new(reqwest_client()))
                .unwrap()
                .inside_transport_step()
                .with(RetryMiddleware::new())
                .build(),
        ),
    ];
    for (name, client) in cases {
        let (result, ext, _) = execute(&client, client.get(server.url("/"))).await;
        let err = result.unwrap_err();
        assert_eq!(
            refused(&err),
            Misconfiguration::InsideTransportStep { middleware: name }
        );
        assert_eq!(
            history(&ext),
            [(Transmission::NotSent, Some(FailureKind::Misconfigured))],
            "{name}"
        );
    }
    assert_eq!(server.requests_seen(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_retry_middleware_inside_another_is_refused() {
    let server = FaultServer::always(Action::status(503)).await;
    let client = ClientBuilder::new(reqwest_client())
        .with(RetryMiddleware::new())
        .with(RetryMiddleware::new())
        .with(TransportEvidence::new())
        .build();
    let (result, ext, took) = execute(&client, client.get(server.url("/"))).await;
    assert_eq!(refused(&result.unwrap_err()), Misconfiguration::NestedRetry);
    assert_eq!(server.requests_seen(), 0);
    assert_eq!(took, Duration::ZERO);
    assert_eq!(outcome(&ext).attempts, 1);
}

/// A per-attempt middleware that makes a request of its own through another resilient
/// client, inside the outer request's poll.
struct SideRequest {
    client: ClientWithMiddleware,
    url: String,
}

#[reqwest_resilience::async_trait]
impl Middleware for SideRequest {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let side = self.client.get(&self.url).send().await?;
        assert_eq!(side.status(), 200);
        next.run(req, extensions).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_made_by_another_resilient_client_inside_a_request_is_not_a_misconfiguration() {
    let server = FaultServer::always(Action::ok("ok")).await;
    let side = Resilience::new().build(reqwest_client()).unwrap();
    let client = Resilience::new()
        .per_attempt(Arc::new(SideRequest {
            client: side,
            url: server.url("/side"),
        }))
        .build(reqwest_client())
        .unwrap();
    let response = client.get(server.url("/main")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let paths: Vec<_> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/side", "/main"]);
}

#[tokio::test(start_paused = true)]
async fn a_missing_transport_step_is_reported_once_per_process_and_the_request_still_works() {
    let server = FaultServer::always(Action::ok("ok")).await;
    let client = ClientBuilder::new(reqwest_client())
        .with(RetryMiddleware::new())
        .build();
    for _ in 0..3 {
        assert_eq!(
            client.get(server.url("/")).send().await.unwrap().status(),
            200
        );
    }
    assert_eq!(
        Misconfiguration::reported()
            .iter()
            .filter(|m| **m == Misconfiguration::NoTransportEvidence)
            .count(),
        1
    );
    assert_eq!(server.requests_seen(), 3);
}

#[tokio::test(start_paused = true)]
async fn error_wrapping_never_returns_a_breaker_rejection_bare_with_retry_on() {
    let server = FaultServer::always(Action::status(503)).await;
    let registry = trip_on_first_failure();
    let client = Resilience::new()
        .retry(
            exact_retry()
                .max_retries(0)
                .error_wrapping(ErrorWrapping::Never),
        )
        .breaker(registry)
        .build(reqwest_client())
        .unwrap();
    let url = server.url("/");
    assert_eq!(client.get(&url).send().await.unwrap().status(), 503);
    let (result, ext, _) = execute(&client, client.get(&url)).await;
    let err = result.unwrap_err();
    assert!(matches!(
        ResilienceError::from_middleware_error(&err),
        Some(ResilienceError::BreakerOpen { .. })
    ));
    assert_eq!(
        (outcome(&ext).attempts, outcome(&ext).stop),
        (1, StopReason::RetriesExhausted)
    );
    assert_eq!(server.requests_seen(), 1);
}

/// What was a conflict (`error_wrapping` beside a prebuilt retry, refused) cannot be
/// written: the wrapping is set on the retry, and a later `.retry(..)` replaces an
/// earlier prebuilt one whole, so it applies.
#[tokio::test(start_paused = true)]
async fn error_wrapping_is_set_on_the_retry_which_replaces_a_prebuilt_one() {
    let client = Resilience::new()
        .retry(RetryMiddleware::new())
        .retry(exact_retry().error_wrapping(ErrorWrapping::Always))
        .build(reqwest_client())
        .unwrap();
    let url = format!("http://127.0.0.1:{}/", refused_port());
    let err = client.get(&url).send().await.unwrap_err();
    assert!(!err.is_connect(), "wrapped: reqwest's answers are inside");
    assert!(matches!(
        ResilienceError::find(&err),
        Some(ResilienceError::Retry(_))
    ));
}
