//! Redirects followed inside one attempt: a request that was answered (3xx) is never sent
//! again unless that is harmless, and each origin answers for its own hops.
//!
//! reqwest follows redirects inside `Client::execute`, below every middleware. Each test
//! runs the default `Resilience` stack on real loopback servers that count what they
//! receive, with a client whose redirects are either not observed (reqwest's default
//! policy, the default [`ClientRedirects::Unobserved`]) or recorded
//! ([`redirect::recorded`] with [`ClientRedirects::Recorded`]).
//!
//! What reqwest 0.13 lets a middleware see, pinned down here: a response carries the last
//! hop's URL; an error after a redirect carries the *first* URL, so it cannot be told
//! from the first hop's own failure without the recorded policy.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Extensions, StatusCode};
use reqwest_middleware::ClientWithMiddleware;
use reqwest_resilience::RetryMiddleware;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, PauseMode};
use reqwest_resilience::redirect::{self, ClientRedirects};
use reqwest_resilience::retry::{RetryOutcome, RetryReason, StopReason};
use reqwest_resilience::{
    AccessToken, AttemptDecision, AttemptHistory, Backoff, BearerAuth, BreakerState, FailureKind,
    Jitter, Origin, Redirects, Resilience, ResilienceError, TokenManager, Transmission,
};
use support::{Action, FaultServer, refused_port};

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn client_with(policy_recorded: bool) -> reqwest::Client {
    let policy = reqwest::redirect::Policy::default();
    reqwest::Client::builder()
        .no_proxy()
        // No idle-pool timer: with a paused clock it would be the "next timer" tokio jumps to.
        .pool_max_idle_per_host(0)
        .redirect(if policy_recorded {
            redirect::recorded(policy)
        } else {
            policy
        })
        .build()
        .unwrap()
}

/// The default stack, with an exact backoff and no budget, over a client whose redirects
/// are recorded or not.
fn retry() -> reqwest_resilience::retry::RetryMiddlewareBuilder {
    RetryMiddleware::builder()
        .backoff(Backoff::builder().jitter(Jitter::None).build().unwrap())
        .no_budget()
}

/// [`stack`] with `max_retries`.
fn stack_retrying(recorded: bool, max_retries: u32) -> Resilience {
    stack(recorded).retry(retry().max_retries(max_retries))
}

fn stack(recorded: bool) -> Resilience {
    Resilience::new()
        .retry(retry())
        .client_redirects(if recorded {
            ClientRedirects::Recorded
        } else {
            ClientRedirects::Unobserved
        })
}

/// The stack without retry, over a client whose redirects are recorded or not.
fn no_retry(recorded: bool) -> Resilience {
    Resilience::new().no_retry().client_redirects(if recorded {
        ClientRedirects::Recorded
    } else {
        ClientRedirects::Unobserved
    })
}

fn build(stack: Resilience, recorded: bool) -> ClientWithMiddleware {
    stack.build(client_with(recorded)).unwrap()
}

/// Sends `request` with fresh caller-side extensions, returning both.
async fn execute(
    request: reqwest_middleware::RequestBuilder,
) -> (reqwest_middleware::Result<reqwest::Response>, Extensions) {
    let (client, request) = request.build_split();
    let mut ext = Extensions::new();
    let result = client
        .execute_with_extensions(request.unwrap(), &mut ext)
        .await;
    (result, ext)
}

/// Sends through a stack with retry: the outcome, the history and the `RetryOutcome`.
async fn send(
    request: reqwest_middleware::RequestBuilder,
) -> (
    reqwest_middleware::Result<reqwest::Response>,
    AttemptHistory,
    RetryOutcome,
) {
    let (result, ext) = execute(request).await;
    let history = AttemptHistory::of(&ext).cloned().unwrap();
    (result, history, *RetryOutcome::of(&ext).unwrap())
}

/// Sends through a stack without retry: the outcome and the history.
async fn send_no_retry(
    request: reqwest_middleware::RequestBuilder,
) -> (
    reqwest_middleware::Result<reqwest::Response>,
    AttemptHistory,
) {
    let (result, ext) = execute(request).await;
    (result, AttemptHistory::of(&ext).cloned().unwrap())
}

/// How many requests with `method` and `path` the server saw.
fn saw(server: &FaultServer, method: &str, path: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.method == method && r.path == path)
        .count()
}

/// `POST /pay` is answered `303` to `location`; anything else gets `then`.
async fn pay_then(location: String, then: Action) -> FaultServer {
    FaultServer::start(
        move |_, req| match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/pay") => Action::status(303).header("location", &location),
            _ => then.clone(),
        },
    )
    .await
}

// ---- scenario 1: POST → 303 → a refused connect ------------------------------------------

#[tokio::test(start_paused = true)]
async fn post_303_to_a_refused_port_is_executed_once_and_recorded_as_answered() {
    let dead = format!("http://127.0.0.1:{}/receipt", refused_port());
    let a = pay_then(dead.clone(), Action::ok("unused")).await;
    let client = build(stack(true), true);
    let (result, history, outcome) = send(client.post(a.url("/pay")).body("1 EUR")).await;

    let err = result.unwrap_err();
    assert!(
        reqwest_resilience::chain::find::<reqwest::Error>(&err).is_some_and(|e| e.is_connect())
    );
    assert_eq!(saw(&a, "POST", "/pay"), 1, "the POST was executed once");
    assert_eq!(history.len(), 1);
    let e = &history.attempts()[0].evidence;
    assert_eq!(e.transmission, Transmission::Unknown, "{e:?}");
    assert_eq!(e.failure, Some(FailureKind::Connect));
    assert_eq!(e.redirects, Redirects::Followed { hops: Some(1) });
    assert_eq!(e.origin, Some(Origin::parse(&a.url("/")).unwrap()));
    assert_eq!(e.final_origin, Some(Origin::parse(&dead).unwrap()));
    assert_eq!(e.outcome_origin(), Some(&Origin::parse(&dead).unwrap()));
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (1, StopReason::RedirectFollowed)
    );
}

#[tokio::test(start_paused = true)]
async fn post_303_to_a_refused_port_is_executed_once_with_an_unobserved_client() {
    let dead = format!("http://127.0.0.1:{}/receipt", refused_port());
    let a = pay_then(dead, Action::ok("unused")).await;
    let client = build(stack(false), false);
    let (result, history, outcome) = send(client.post(a.url("/pay")).body("1 EUR")).await;

    // reqwest reports the second hop's refused connect with the first hop's URL: nothing
    // in the error tells it from a refused first hop.
    let err = result.unwrap_err();
    let reqwest_err = reqwest_resilience::chain::find::<reqwest::Error>(&err).unwrap();
    assert!(reqwest_err.is_connect());
    assert_eq!(reqwest_err.url().map(|u| u.as_str()), Some(&*a.url("/pay")));
    assert_eq!(saw(&a, "POST", "/pay"), 1, "the POST was executed once");
    let e = &history.attempts()[0].evidence;
    assert_eq!(
        (e.transmission, e.failure, e.redirects),
        (
            Transmission::Unknown,
            Some(FailureKind::Connect),
            Redirects::Unknown
        )
    );
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (1, StopReason::MayHaveBeenProcessed)
    );
}

#[tokio::test(start_paused = true)]
async fn get_to_a_refused_port_is_still_retried_with_an_unobserved_client() {
    let url = format!("http://127.0.0.1:{}/items", refused_port());
    let client = build(stack_retrying(false, 2), false);
    let (result, history, outcome) = send(client.get(url)).await;
    assert!(result.is_err());
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (3, StopReason::RetriesExhausted)
    );
    let reasons: Vec<_> = history
        .attempts()
        .iter()
        .map(|r| {
            (
                r.evidence.transmission,
                r.evidence.redirects,
                r.decision.clone(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [
            (
                Transmission::Unknown,
                Redirects::Unknown,
                Some(AttemptDecision::Retry {
                    delay: s(1),
                    reason: RetryReason::Transient
                })
            ),
            (
                Transmission::Unknown,
                Redirects::Unknown,
                Some(AttemptDecision::Retry {
                    delay: s(2),
                    reason: RetryReason::Transient
                })
            ),
            (
                Transmission::Unknown,
                Redirects::Unknown,
                Some(AttemptDecision::Stop {
                    reason: StopReason::RetriesExhausted
                })
            ),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn post_to_a_refused_port_is_retried_when_the_client_follows_no_redirects() {
    let port = refused_port();
    let client = Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .backoff(Backoff::builder().jitter(Jitter::None).build().unwrap())
                .max_retries(2),
        )
        .client_redirects(ClientRedirects::Off)
        .build(
            reqwest::Client::builder()
                .no_proxy()
                .pool_max_idle_per_host(0)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
        )
        .unwrap();
    let (result, history, outcome) = send(
        client
            .post(format!("http://127.0.0.1:{port}/jobs"))
            .body("x"),
    )
    .await;
    assert!(result.is_err());
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (3, StopReason::RetriesExhausted)
    );
    assert!(history.attempts().iter().all(|r| {
        r.evidence.transmission == Transmission::NotSent && r.evidence.redirects == Redirects::None
    }));
}

// ---- scenario 2: POST → 303 → GET answers 429 --------------------------------------------

#[tokio::test(start_paused = true)]
async fn post_303_to_a_429_is_not_replayed() {
    for recorded in [false, true] {
        let a = pay_then(
            "/status".into(),
            Action::status(429).header("retry-after", "1"),
        )
        .await;
        let client = build(stack(recorded), recorded);
        let (result, history, outcome) = send(client.post(a.url("/pay")).body("1 EUR")).await;
        assert_eq!(result.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(saw(&a, "POST", "/pay"), 1, "recorded: {recorded}");
        assert_eq!(saw(&a, "GET", "/status"), 1, "recorded: {recorded}");
        let e = &history.attempts()[0].evidence;
        let hops = recorded.then_some(1);
        assert_eq!(e.redirects, Redirects::Followed { hops });
        // Same origin: nothing to charge elsewhere.
        assert_eq!(e.final_origin, None);
        assert_eq!(
            (outcome.attempts, outcome.stop),
            (1, StopReason::RedirectFollowed)
        );
    }
}

// ---- scenario 3: POST → 303 → GET answers 401, under BearerAuth ---------------------------

fn counted_tokens() -> (TokenManager, Arc<AtomicUsize>) {
    let fetches = Arc::new(AtomicUsize::new(0));
    let f = Arc::clone(&fetches);
    let manager = TokenManager::new(move || {
        let n = f.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, std::io::Error>(AccessToken::new(format!("token-{n}"))) }
    });
    (manager, fetches)
}

fn bearer(manager: TokenManager, origins: &[&FaultServer]) -> BearerAuth {
    let mut b = BearerAuth::builder(manager).allow_http_on_loopback();
    for server in origins {
        b = b.origin(Origin::parse(&server.url("/")).unwrap());
    }
    b.build().unwrap()
}

#[tokio::test(start_paused = true)]
async fn post_303_to_a_401_is_returned_as_is_without_a_refresh() {
    let a = pay_then("/status".into(), Action::status(401)).await;
    let (manager, fetches) = counted_tokens();
    let client = build(stack(false).bearer(bearer(manager, &[&a])), false);
    let (result, _, outcome) = send(client.post(a.url("/pay")).body("1 EUR")).await;
    assert_eq!(result.unwrap().status(), StatusCode::UNAUTHORIZED);
    assert_eq!(saw(&a, "POST", "/pay"), 1);
    assert_eq!(saw(&a, "GET", "/status"), 1);
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "no refresh");
    assert_eq!(outcome.stop, StopReason::RedirectFollowed);
    // The same-origin hop kept the token (reqwest strips it only across origins).
    let get = &a.requests()[1];
    assert_eq!(get.header("authorization"), Some("Bearer token-0"));
}

#[tokio::test(start_paused = true)]
async fn a_cross_origin_redirect_carries_no_token_and_its_401_causes_no_refresh() {
    let b = FaultServer::always(Action::status(401)).await;
    let a = FaultServer::always(Action::status(302).header("location", &b.url("/elsewhere"))).await;
    let (manager, fetches) = counted_tokens();
    // Both origins are covered: the token still must not leave A, nor A's request be
    // replayed for B's 401.
    let client = build(stack(false).bearer(bearer(manager, &[&a, &b])), false);
    let (result, _, outcome) = send(client.get(a.url("/start"))).await;
    assert_eq!(result.unwrap().status(), StatusCode::UNAUTHORIZED);
    assert_eq!((a.requests_seen(), b.requests_seen()), (1, 1));
    assert_eq!(
        a.requests()[0].header("authorization"),
        Some("Bearer token-0")
    );
    assert_eq!(b.requests()[0].header("authorization"), None);
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "no refresh");
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (1, StopReason::FinalResponse(StatusCode::UNAUTHORIZED))
    );
}

// ---- scenario 4: POST → 307 to a scheme reqwest cannot follow ----------------------------

#[tokio::test(start_paused = true)]
async fn post_307_to_ftp_is_not_recorded_as_not_sent() {
    for recorded in [false, true] {
        let a =
            FaultServer::always(Action::status(307).header("location", "ftp://127.0.0.1/receipt"))
                .await;
        let client = build(stack(recorded), recorded);
        let (result, history, outcome) = send(client.post(a.url("/pay")).body("1 EUR")).await;
        assert!(result.is_err());
        assert_eq!(a.requests_seen(), 1, "recorded: {recorded}");
        let e = &history.attempts()[0].evidence;
        assert_ne!(e.transmission, Transmission::NotSent, "{e:?}");
        assert_eq!(e.transmission, Transmission::Unknown);
        assert_eq!(e.failure, Some(FailureKind::Redirect));
        // Recorded: the policy was asked once. Unobserved: the error's URL (the ftp
        // Location) shows it, without a count.
        let hops = recorded.then_some(1);
        assert_eq!(e.redirects, Redirects::Followed { hops });
        assert_eq!(outcome.attempts, 1);
    }
}

// ---- scenario 5: A → 302 → a dead origin B ------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_redirect_to_a_dead_origin_trips_that_origins_breaker_not_the_first() {
    let dead = format!("http://127.0.0.1:{}/gone", refused_port());
    let a = FaultServer::always(Action::status(302).header("location", &dead)).await;
    let registry = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let client = build(no_retry(true).breaker(registry.clone()), true);
    for _ in 0..5 {
        let (result, history) = send_no_retry(client.get(a.url("/start"))).await;
        assert!(result.is_err());
        assert_eq!(history.len(), 1);
    }
    assert_eq!(a.requests_seen(), 5);
    let origin_a = Origin::parse(&a.url("/")).unwrap();
    let origin_b = Origin::parse(&dead).unwrap();
    assert_eq!(registry.state(&origin_a), Some(BreakerState::Closed));
    assert_eq!(registry.state(&origin_b), Some(BreakerState::Open));
    let snapshot = registry.snapshot();
    let a_snap = snapshot.iter().find(|s| s.origin == origin_a).unwrap();
    assert_eq!(a_snap.consecutive_failures, 0);
    // A still answers: the next call reaches it.
    let _ = send_no_retry(client.get(a.url("/start"))).await;
    assert_eq!(a.requests_seen(), 6);
}

#[tokio::test(start_paused = true)]
async fn an_unobserved_client_charges_a_later_hops_failure_to_the_first_origin() {
    // The documented limit: without the recorded policy the error names no hop.
    let dead = format!("http://127.0.0.1:{}/gone", refused_port());
    let a = FaultServer::always(Action::status(302).header("location", &dead)).await;
    let registry = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let client = build(no_retry(false).breaker(registry.clone()), false);
    for _ in 0..5 {
        let _ = send_no_retry(client.get(a.url("/start"))).await;
    }
    let origin_a = Origin::parse(&a.url("/")).unwrap();
    assert_eq!(registry.state(&origin_a), Some(BreakerState::Open));
    assert_eq!(registry.state(&Origin::parse(&dead).unwrap()), None);
}

// ---- scenario 6: A → B, B answers 503 + Retry-After ---------------------------------------

#[tokio::test(start_paused = true)]
async fn a_503_with_retry_after_from_the_second_origin_pauses_it_not_the_first() {
    let b = FaultServer::always(Action::status(503).header("retry-after", "30")).await;
    let a = FaultServer::start({
        let to_b = b.url("/busy");
        move |_, req| match req.path.as_str() {
            "/start" => Action::status(302).header("location", &to_b),
            _ => Action::ok("a is fine"),
        }
    })
    .await;
    // Fail fast on a pause, so a paused origin shows as a rejection.
    let config = BreakerConfig::default().pause_mode(PauseMode::FailFast);
    let registry = BreakerRegistry::new(config).unwrap();
    let client = build(no_retry(false).breaker(registry.clone()), false);
    let (result, history) = send_no_retry(client.get(a.url("/start"))).await;
    assert_eq!(result.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
    let e = &history.attempts()[0].evidence;
    assert_eq!(e.final_origin, Some(Origin::parse(&b.url("/")).unwrap()));
    assert_eq!(e.retry_after, Some(s(30)));

    // A is not paused: a request to it goes out and is answered.
    let (result, _) = send_no_retry(client.get(a.url("/other"))).await;
    assert_eq!(result.unwrap().status(), StatusCode::OK);
    assert_eq!(a.requests_seen(), 2);
    // B is paused for every caller of the registry: rejected locally, nothing sent.
    let (result, history) = send_no_retry(client.get(b.url("/direct"))).await;
    let err = result.unwrap_err();
    assert!(matches!(
        ResilienceError::from_middleware_error(&err),
        Some(ResilienceError::Paused { .. })
    ));
    assert_eq!(
        history.attempts()[0].evidence.failure,
        Some(FailureKind::Paused)
    );
    assert_eq!(b.requests_seen(), 1);
}

// ---- chains, loops, 307 --------------------------------------------------------------------

/// `/1 → /2 → a refused port`, on one server.
async fn two_hops_to_a_dead_end() -> (FaultServer, String) {
    let dead = format!("http://127.0.0.1:{}/end", refused_port());
    let d = dead.clone();
    let server = FaultServer::start(move |_, req| match req.path.as_str() {
        "/1" => Action::status(303).header("location", "/2"),
        "/2" => Action::status(302).header("location", &d),
        _ => Action::ok("unused"),
    })
    .await;
    (server, dead)
}

#[tokio::test(start_paused = true)]
async fn a_three_hop_chain_ending_refused_executes_a_post_once_and_replays_a_get() {
    let (server, dead) = two_hops_to_a_dead_end().await;
    let client = build(stack_retrying(true, 2), true);

    let (result, history, outcome) = send(client.post(server.url("/1")).body("x")).await;
    assert!(result.is_err());
    assert_eq!(
        (saw(&server, "POST", "/1"), saw(&server, "GET", "/2")),
        (1, 1)
    );
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (1, StopReason::RedirectFollowed)
    );
    let e = &history.attempts()[0].evidence;
    assert_eq!(e.redirects, Redirects::Followed { hops: Some(2) });
    assert_eq!(e.final_origin, Some(Origin::parse(&dead).unwrap()));

    let (result, history, outcome) = send(client.get(server.url("/1"))).await;
    assert!(result.is_err());
    // The chain is harmless to re-run for a GET: 3 attempts, each through both hops.
    assert_eq!(
        (saw(&server, "GET", "/1"), saw(&server, "GET", "/2")),
        (3, 4)
    );
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (3, StopReason::RetriesExhausted)
    );
    assert!(history.attempts().iter().all(|r| r.evidence.redirects
        == Redirects::Followed { hops: Some(2) }
        && r.evidence.transmission == Transmission::Unknown));
}

#[tokio::test(start_paused = true)]
async fn post_307_and_308_are_resent_by_reqwest_and_not_by_the_stack() {
    for code in [307, 308] {
        let b = FaultServer::always(Action::status(503)).await;
        let a = FaultServer::always(Action::status(code).header("location", &b.url("/new"))).await;
        let client = build(stack(false), false);
        let (result, _, outcome) = send(client.post(a.url("/pay")).body("1 EUR")).await;
        assert_eq!(result.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
        // reqwest re-sent the POST, body and all, to the new location itself; the stack
        // added nothing.
        assert_eq!(
            (saw(&a, "POST", "/pay"), saw(&b, "POST", "/new")),
            (1, 1),
            "{code}"
        );
        assert_eq!(b.requests()[0].body, b"1 EUR");
        assert_eq!(
            (outcome.attempts, outcome.stop),
            (1, StopReason::RedirectFollowed)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_redirect_back_to_the_same_url_is_seen_only_by_the_recorded_policy() {
    // POST /orders → 303 → GET /orders → 429: the response's URL is the request's.
    let orders = || {
        FaultServer::start(|_, req| match req.method.as_str() {
            "POST" => Action::status(303).header("location", "/orders"),
            _ => Action::status(429),
        })
    };
    let recorded = orders().await;
    let client = build(stack(true), true);
    let (_, history, outcome) = send(client.post(recorded.url("/orders")).body("x")).await;
    assert_eq!(saw(&recorded, "POST", "/orders"), 1);
    assert_eq!(
        history.attempts()[0].evidence.redirects,
        Redirects::Followed { hops: Some(1) }
    );
    assert_eq!(outcome.stop, StopReason::RedirectFollowed);

    // The documented limit: unobserved, the chain cannot be told from a plain 429, and
    // the "throttled, not processed" rule replays the POST.
    let unobserved = orders().await;
    let client = build(stack_retrying(false, 1), false);
    let (_, history, _) = send(client.post(unobserved.url("/orders")).body("x")).await;
    assert_eq!(history.attempts()[0].evidence.redirects, Redirects::None);
    assert_eq!(saw(&unobserved, "POST", "/orders"), 2);
}

#[tokio::test(start_paused = true)]
async fn a_redirect_loop_ends_in_too_many_redirects_and_is_never_retried() {
    for method in [reqwest::Method::GET, reqwest::Method::POST] {
        let server = FaultServer::always(Action::status(302).header("location", "/loop")).await;
        let client = build(stack(false), false);
        let (result, history, outcome) =
            send(client.request(method.clone(), server.url("/loop"))).await;
        let err = result.unwrap_err();
        let reqwest_err = reqwest_resilience::chain::find::<reqwest::Error>(&err).unwrap();
        assert!(reqwest_err.is_redirect(), "{method}");
        // The first request and reqwest's default 10 redirects.
        assert_eq!(server.requests_seen(), 11, "{method}");
        let e = &history.attempts()[0].evidence;
        assert_eq!(
            (e.transmission, e.failure),
            (Transmission::Unknown, Some(FailureKind::Redirect))
        );
        // The policy's own error: a redirect was answered, the count is not known.
        assert_eq!(e.redirects, Redirects::Followed { hops: None });
        assert_eq!(
            (outcome.attempts, outcome.stop),
            (1, StopReason::Permanent(FailureKind::Redirect))
        );
    }
}
