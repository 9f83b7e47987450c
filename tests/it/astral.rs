//! Feature `astral`: the crate in the astral fork's client (`astral-reqwest-middleware`,
//! what uv, rattler and pixi use), beside reqwest-middleware's in the same build.
//!
//! Each middleware used alone and the `Resilience` stack, in a fork `ClientBuilder`, on
//! loopback servers that count what they receive: a refused `POST` (retried, every
//! attempt `NotSent`), a `503` retried (the server saw exactly N), a breaker opening
//! (its state, the rejections that never reach the server).

#![cfg(feature = "astral")]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use astral_reqwest_middleware as fork;
use http::Extensions;
use reqwest_resilience::RetryMiddleware;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry};
use reqwest_resilience::redirect::ClientRedirects;
use reqwest_resilience::retry::{RetryOutcome, StopReason};
use reqwest_resilience::stack::StackPart;
use reqwest_resilience::stack::astral::AstralResilience;
use reqwest_resilience::{
    AttemptHistory, Backoff, BreakerState, CircuitBreakerMiddleware, FailureKind, Jitter, Origin,
    Resilience, ResilienceError, StackError, Transmission, TransportEvidence,
};
use support::held_port::HeldRefusedPort;
use support::{Action, FaultServer, exact_retry};

/// A loopback client that follows no redirects (uv's default: it follows them itself).
fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The loopback client options, for the stacks that build the client themselves.
fn loopback_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
}

fn exact_backoff() -> Backoff {
    Backoff::builder().jitter(Jitter::None).build().unwrap()
}

/// The stack with exact delays and no budget, for exact counts.
fn exact_stack() -> Resilience {
    Resilience::new().retry(
        RetryMiddleware::builder()
            .backoff(exact_backoff())
            .no_budget(),
    )
}

/// The fork client with each middleware used alone, in the order `Resilience` uses.
fn standalone(registry: &BreakerRegistry) -> fork::ClientWithMiddleware {
    fork::ClientBuilder::new(no_redirects())
        .with(exact_retry().build().unwrap())
        .with(CircuitBreakerMiddleware::new(registry.clone()))
        .with(TransportEvidence::with_client_redirects(
            ClientRedirects::Off,
        ))
        .build()
}

/// Sends with fresh caller-side extensions: the outcome and the extensions.
async fn execute(request: fork::RequestBuilder) -> (fork::Result<reqwest::Response>, Extensions) {
    let (client, request) = request.build_split();
    let mut ext = Extensions::new();
    let result = client
        .execute_with_extensions(request.unwrap(), &mut ext)
        .await;
    (result, ext)
}

fn transmissions(ext: &Extensions) -> Vec<(Transmission, Option<FailureKind>)> {
    AttemptHistory::of(ext)
        .unwrap()
        .attempts()
        .iter()
        .map(|r| (r.evidence.transmission, r.evidence.failure))
        .collect()
}

/// A refused `POST` through `client`: four attempts, each `NotSent`, and reqwest's own
/// error at the end (`is_connect()` on the fork's error, as without the stack).
async fn assert_refused_post_retried(client: &fork::ClientWithMiddleware) {
    let dead = HeldRefusedPort::new();
    let url = dead.url("/pay");
    let (result, ext) = execute(client.post(&url).body("1 EUR")).await;
    let err = result.unwrap_err();
    assert!(matches!(err, fork::Error::Reqwest(_)), "{err:?}");
    assert!(err.is_connect(), "{err:?}");
    assert!(
        reqwest_resilience::chain::find::<reqwest::Error>(&err).is_some_and(|e| e.is_connect())
    );
    assert_eq!(
        transmissions(&ext),
        vec![(Transmission::NotSent, Some(FailureKind::Connect)); 4]
    );
    let outcome = RetryOutcome::of(&ext).unwrap();
    assert_eq!(outcome.attempts, 4);
    assert_eq!(outcome.stop, StopReason::RetriesExhausted);
}

/// Two `503`s, then a `200`: the server saw exactly three requests.
async fn assert_503_retried(client: &fork::ClientWithMiddleware) {
    let server = FaultServer::sequence(
        vec![Action::status(503), Action::status(503)],
        Action::ok("done"),
    )
    .await;
    let response = client.get(server.url("/simple")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let history = AttemptHistory::of_response(&response).unwrap();
    assert_eq!(history.len(), 3);
    assert_eq!(response.text().await.unwrap(), "done");
    assert_eq!(server.requests_seen(), 3);
}

/// Five `500`s open `registry`'s breaker for the server's origin; the next two requests
/// are turned away unsent (the server still saw five).
async fn assert_breaker_opens(client: &fork::ClientWithMiddleware, registry: &BreakerRegistry) {
    let server = FaultServer::start(|_, _| Action::status(500)).await;
    let origin = Origin::from_url(&server.url("/").parse().unwrap()).unwrap();
    for _ in 0..5 {
        let response = client.get(server.url("/down")).send().await.unwrap();
        assert_eq!(response.status(), 500);
    }
    assert_eq!(registry.state(&origin), Some(BreakerState::Open));
    for _ in 0..2 {
        let err = client.get(server.url("/down")).send().await.unwrap_err();
        assert!(
            matches!(
                ResilienceError::find_astral(&err),
                Some(ResilienceError::BreakerOpen {
                    state: BreakerState::Open,
                    ..
                })
            ),
            "{err:?}"
        );
    }
    assert_eq!(server.requests_seen(), 5);
}

fn registry() -> BreakerRegistry {
    BreakerRegistry::new(BreakerConfig::default()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn standalone_middlewares_in_the_fork_client_retry_a_refused_post_unsent() {
    assert_refused_post_retried(&standalone(&registry())).await;
}

#[tokio::test(start_paused = true)]
async fn standalone_middlewares_in_the_fork_client_retry_a_503() {
    assert_503_retried(&standalone(&registry())).await;
}

#[tokio::test(start_paused = true)]
async fn a_standalone_breaker_in_the_fork_client_opens_and_rejects_unsent() {
    let registry = registry();
    let client = fork::ClientBuilder::new(no_redirects())
        .with(CircuitBreakerMiddleware::new(registry.clone()))
        .with(TransportEvidence::with_client_redirects(
            ClientRedirects::Off,
        ))
        .build();
    assert_breaker_opens(&client, &registry).await;
}

#[tokio::test(start_paused = true)]
async fn the_stack_built_from_a_client_builder_for_the_fork_retries_a_refused_post_unsent() {
    let client = exact_stack().build_from_astral(loopback_builder()).unwrap();
    assert_refused_post_retried(&client).await;
}

#[tokio::test(start_paused = true)]
async fn the_stack_installed_into_a_fork_builder_retries_a_503() {
    let client = exact_stack()
        .client_redirects(ClientRedirects::Off)
        .install_astral(fork::ClientBuilder::new(no_redirects()))
        .unwrap()
        .build();
    assert_503_retried(&client).await;
}

#[tokio::test(start_paused = true)]
async fn the_stacks_breaker_in_the_fork_client_opens_and_rejects_unsent() {
    let registry = registry();
    let client = Resilience::new()
        .no_retry()
        .breaker(registry.clone())
        .build_astral(no_redirects())
        .unwrap();
    assert_breaker_opens(&client, &registry).await;
}

#[tokio::test(start_paused = true)]
async fn both_kinds_of_client_share_one_registry_in_one_build() {
    // Five failures through a reqwest-middleware client open the breaker that a fork
    // client of the same registry then honours.
    let registry = registry();
    let server = FaultServer::start(|_, _| Action::status(500)).await;
    let ours = Resilience::new()
        .no_retry()
        .breaker(registry.clone())
        .build_from(loopback_builder())
        .unwrap();
    let theirs = Resilience::new()
        .no_retry()
        .breaker(registry.clone())
        .build_from_astral(loopback_builder())
        .unwrap();
    for _ in 0..5 {
        assert_eq!(
            ours.get(server.url("/")).send().await.unwrap().status(),
            500
        );
    }
    let err = theirs.get(server.url("/")).send().await.unwrap_err();
    assert!(matches!(
        ResilienceError::find_astral(&err),
        Some(ResilienceError::BreakerOpen { .. })
    ));
    assert_eq!(server.requests_seen(), 5);
}

/// A fork middleware that counts the requests it sees.
struct Counting(Arc<AtomicUsize>);

#[reqwest_resilience::async_trait]
impl fork::Middleware for Counting {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: fork::Next<'_>,
    ) -> fork::Result<reqwest::Response> {
        self.0.fetch_add(1, Ordering::SeqCst);
        next.run(req, extensions).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_fork_middleware_per_attempt_sees_every_attempt_and_the_evidence_stays() {
    let seen = Arc::new(AtomicUsize::new(0));
    let shared: Arc<dyn fork::Middleware> = Arc::new(Counting(seen.clone()));
    let client = exact_stack()
        .per_attempt_astral(shared)
        .build_from_astral(loopback_builder())
        .unwrap();
    assert_refused_post_retried(&client).await;
    assert_eq!(seen.load(Ordering::SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn the_stack_as_one_middleware_serves_a_fork_builder_made_later() {
    let middleware = exact_stack().into_middleware().unwrap();
    let client = fork::ClientBuilder::new(no_redirects())
        .with(middleware)
        .build();
    assert_503_retried(&client).await;
}

#[test]
fn a_per_attempt_middleware_of_the_other_trait_is_refused_at_build_time() {
    let seen = Arc::new(AtomicUsize::new(0));
    let err = Resilience::new()
        .per_attempt_astral(Arc::new(Counting(seen)))
        .build(no_redirects())
        .unwrap_err();
    assert!(matches!(
        err,
        ResilienceError::InvalidStack(StackError::PerAttemptOtherTrait {
            builder: "reqwest-middleware"
        })
    ));
    let err = Resilience::new()
        .per_attempt(Arc::new(TransportEvidence::new()))
        .build_astral(no_redirects())
        .unwrap_err();
    assert!(matches!(
        err,
        ResilienceError::InvalidStack(StackError::PerAttemptOtherTrait {
            builder: "astral-reqwest-middleware"
        })
    ));
    // build_from declares the client's redirects itself.
    let err = Resilience::new()
        .client_redirects(ClientRedirects::Off)
        .build_from_astral(loopback_builder())
        .unwrap_err();
    assert!(matches!(
        err,
        ResilienceError::InvalidStack(StackError::Conflict {
            part: StackPart::Client,
            setting: "client_redirects"
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn every_middleware_alone_serves_the_fork_client_a_401_healed_by_one_refresh() {
    // All five in the fork's builder, in the stack's order: the first token is refused
    // with a 401, BearerAuth refreshes once and replays, the limiter admits each attempt.
    use reqwest_resilience::limit::{ConcurrencyLimit, LimiterConfig, LimiterRegistry};
    use reqwest_resilience::{AccessToken, BearerAuth, TokenManager};

    let fetches = Arc::new(AtomicUsize::new(0));
    let tokens = TokenManager::new({
        let fetches = fetches.clone();
        move || {
            let n = fetches.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, std::io::Error>(AccessToken::new(format!("token-{n}"))) }
        }
    });
    let server = FaultServer::start(|_, req| match req.header("authorization") {
        Some("Bearer token-1") => Action::ok("welcome"),
        _ => Action::status(401),
    })
    .await;
    let origin = Origin::from_url(&server.url("/").parse().unwrap()).unwrap();
    let client = fork::ClientBuilder::new(no_redirects())
        .with(exact_retry().build().unwrap())
        .with(CircuitBreakerMiddleware::new(registry()))
        .with(ConcurrencyLimit::new(
            LimiterRegistry::new(LimiterConfig::fixed(4)).unwrap(),
        ))
        .with(
            BearerAuth::builder(tokens)
                .origin(origin)
                .allow_http_on_loopback()
                .build()
                .unwrap(),
        )
        .with(TransportEvidence::with_client_redirects(
            ClientRedirects::Off,
        ))
        .build();
    let response = client.get(server.url("/me")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "welcome");
    assert_eq!(fetches.load(Ordering::SeqCst), 2, "one fetch, one refresh");
    assert_eq!(server.requests_seen(), 2, "the 401, then the replay");
}

#[tokio::test(start_paused = true)]
async fn the_stack_as_a_fork_middleware_list_serves_a_client_built_later() {
    // rattler's way: `Vec<Arc<dyn Middleware>>` of the fork, handed to
    // `ClientWithMiddleware::new` when the client is first needed.
    let seen = Arc::new(AtomicUsize::new(0));
    let middlewares = exact_stack()
        .client_redirects(ClientRedirects::Off)
        .per_attempt_astral(Arc::new(Counting(seen.clone())))
        .into_middlewares_astral()
        .unwrap();
    assert_eq!(
        middlewares.len(),
        3,
        "the stages, the per-attempt one, transport"
    );
    let client = fork::ClientWithMiddleware::new(no_redirects(), middlewares);
    assert_refused_post_retried(&client).await;
    assert_eq!(seen.load(Ordering::SeqCst), 4);
}
