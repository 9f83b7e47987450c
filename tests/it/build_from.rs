//! Precise by default: `Resilience::build_from(reqwest::Client::builder())` builds the
//! client with the recorded redirect policy and declares it, so the quick start gets the
//! whole decision table; a `ClientRedirects` declaration a response proves false turns
//! that client `Unobserved` for the rest of its life and is reported once.
//!
//! Loopback servers that count what they receive; exact delays under a paused clock.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::Extensions;
use reqwest_middleware::ClientWithMiddleware;
use reqwest_resilience::RetryMiddleware;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry};
use reqwest_resilience::exchange::SendWithHistory;
use reqwest_resilience::misconfig::Misconfiguration;
use reqwest_resilience::redirect::ClientRedirects;
use reqwest_resilience::retry::{MaxRetries, RetryOutcome, StopReason};
use reqwest_resilience::stack::StackPart;
use reqwest_resilience::{
    AttemptHistory, Backoff, BreakerState, FailureKind, Jitter, Origin, Redirects, Resilience,
    ResilienceError, StackError, Transmission,
};
use support::held_port::HeldRefusedPort;
use support::{Action, FaultServer};

/// The loopback options (no proxy, no idle pool for the paused clock): all a user's
/// builder would hold, the redirect policy left to `build_from`.
fn loopback_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
}

/// A loopback client built by the caller with reqwest's default redirect policy, not
/// recorded.
fn unrecorded_client() -> reqwest::Client {
    loopback_builder().build().unwrap()
}

fn exact_stack() -> Resilience {
    Resilience::new().retry(
        RetryMiddleware::builder()
            .backoff(Backoff::builder().jitter(Jitter::None).build().unwrap())
            .no_budget(),
    )
}

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

fn attempts(ext: &Extensions) -> Vec<(Transmission, Option<FailureKind>, Redirects)> {
    AttemptHistory::of(ext)
        .unwrap()
        .attempts()
        .iter()
        .map(|r| {
            (
                r.evidence.transmission,
                r.evidence.failure,
                r.evidence.redirects,
            )
        })
        .collect()
}

/// How many requests with `method` and `path` the server saw.
fn saw(server: &FaultServer, method: &str, path: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.method == method && r.path == path)
        .count()
}

#[tokio::test(start_paused = true)]
async fn the_quick_start_client_retries_a_refused_post_four_times_unsent() {
    let client = exact_stack().build_from(loopback_builder()).unwrap();
    let dead = HeldRefusedPort::new();
    let url = dead.url("/pay");
    let (result, ext) = execute(client.post(&url).body("1 EUR")).await;
    let err = result.unwrap_err();
    assert!(err.is_connect(), "reqwest's own error: {err:?}");
    assert_eq!(
        attempts(&ext),
        vec![
            (
                Transmission::NotSent,
                Some(FailureKind::Connect),
                Redirects::None
            );
            4
        ]
    );
    let outcome = RetryOutcome::of(&ext).unwrap();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (4, StopReason::RetriesExhausted)
    );
}

#[tokio::test(start_paused = true)]
async fn the_quick_start_client_charges_a_redirect_targets_failure_to_the_target() {
    let held = HeldRefusedPort::new();
    let dead = held.url("/gone");
    let a = FaultServer::always(Action::status(302).header("location", &dead)).await;
    let registry = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let client = Resilience::new()
        .no_retry()
        .breaker(registry.clone())
        .build_from(loopback_builder())
        .unwrap();
    for _ in 0..5 {
        let (result, ext) = execute(client.get(a.url("/start"))).await;
        assert!(result.unwrap_err().is_connect());
        assert_eq!(
            attempts(&ext),
            [(
                Transmission::Unknown,
                Some(FailureKind::Connect),
                Redirects::Followed { hops: Some(1) }
            )]
        );
    }
    assert_eq!(a.requests_seen(), 5);
    let origin_a = Origin::parse(&a.url("/")).unwrap();
    let origin_b = Origin::parse(&dead).unwrap();
    assert_eq!(registry.state(&origin_a), Some(BreakerState::Closed));
    assert_eq!(registry.state(&origin_b), Some(BreakerState::Open));
}

#[tokio::test(start_paused = true)]
async fn the_policy_given_is_the_one_build_from_records() {
    // `Policy::none()`, recorded: the 302 comes back as the answer, and the stack knows
    // no hop was followed.
    let server = FaultServer::always(Action::status(302).header("location", "/next")).await;
    let client = Resilience::new()
        .redirect_policy(reqwest::redirect::Policy::none())
        .build_from(loopback_builder())
        .unwrap();
    let (result, ext) = execute(client.get(server.url("/start"))).await;
    assert_eq!(result.unwrap().status(), 302);
    assert_eq!(
        attempts(&ext),
        [(
            Transmission::ResponseReceived(http::StatusCode::FOUND),
            None,
            Redirects::None
        )]
    );
    assert_eq!(server.requests_seen(), 1);
}

#[test]
fn build_from_errors_are_typed() {
    // reqwest's own builder error, kept as the source.
    let err = Resilience::new()
        .build_from(reqwest::Client::builder().user_agent("bad\nagent"))
        .unwrap_err();
    let ResilienceError::ClientBuild(inner) = &err else {
        panic!("{err:?}");
    };
    assert!(inner.is_builder());
    assert!(std::error::Error::source(&err).is_some());
    // A policy for a client built elsewhere would be ignored.
    let err = Resilience::new()
        .redirect_policy(reqwest::redirect::Policy::none())
        .build(unrecorded_client())
        .unwrap_err();
    assert!(matches!(
        err,
        ResilienceError::InvalidStack(StackError::Conflict {
            part: StackPart::Client,
            setting: "redirect_policy"
        })
    ));
    // build_from declares the client's redirects itself.
    let err = Resilience::new()
        .client_redirects(ClientRedirects::Off)
        .build_from(loopback_builder())
        .unwrap_err();
    assert!(matches!(
        err,
        ResilienceError::InvalidStack(StackError::Conflict {
            part: StackPart::Client,
            setting: "client_redirects"
        })
    ));
}

/// `GET /moved` is redirected to `/here` on the same server; `POST /pay` is answered
/// `303` to the refused port returned beside it.
async fn mover() -> (FaultServer, HeldRefusedPort) {
    let dead = HeldRefusedPort::new();
    let location = dead.url("/receipt");
    let server = FaultServer::start(
        move |_, req| match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/moved") => Action::status(302).header("location", "/here"),
            ("POST", "/pay") => Action::status(303).header("location", &location),
            _ => Action::ok("here"),
        },
    )
    .await;
    (server, dead)
}

/// The proof, then the POST of the issue: sent once, and a refused GET afterwards is
/// judged as by an `Unobserved` client.
async fn assert_downgraded(client: &ClientWithMiddleware, server: &FaultServer) {
    // The proof: a response from another URL, no hop recorded (none can be).
    let (result, ext) = execute(client.get(server.url("/moved"))).await;
    assert_eq!(result.unwrap().text().await.unwrap(), "here");
    assert_eq!(
        attempts(&ext),
        [(
            Transmission::ResponseReceived(http::StatusCode::OK),
            None,
            Redirects::Followed { hops: None }
        )]
    );
    // POST → 303 → refused: the error names the first URL and proves nothing about the
    // first hop, so the POST is not sent again.
    let (result, ext) = execute(client.post(server.url("/pay")).body("1 EUR")).await;
    assert!(result.unwrap_err().is_connect());
    assert_eq!(saw(server, "POST", "/pay"), 1, "the POST was executed once");
    assert_eq!(
        attempts(&ext),
        [(
            Transmission::Unknown,
            Some(FailureKind::Connect),
            Redirects::Unknown
        )]
    );
    assert_eq!(
        RetryOutcome::of(&ext).unwrap().stop,
        StopReason::MayHaveBeenProcessed
    );
    // Later requests too: a refused GET (one retry allowed) is retried as `Unknown`
    // (idempotent), not as `NotSent`.
    let dead = HeldRefusedPort::new();
    let url = dead.url("/items");
    let (client, request) = client.get(url).build_split();
    let mut ext = Extensions::new();
    ext.insert(MaxRetries(1));
    let _ = client
        .execute_with_extensions(request.unwrap(), &mut ext)
        .await;
    assert_eq!(
        attempts(&ext),
        vec![
            (
                Transmission::Unknown,
                Some(FailureKind::Connect),
                Redirects::Unknown
            );
            2
        ]
    );
}

fn reported(m: Misconfiguration) -> usize {
    Misconfiguration::reported()
        .iter()
        .filter(|r| **r == m)
        .count()
}

#[tokio::test(start_paused = true)]
async fn a_false_recorded_declaration_is_downgraded_after_its_first_proof() {
    let (server, _dead) = mover().await;
    let client = exact_stack()
        .client_redirects(ClientRedirects::Recorded)
        .build(unrecorded_client())
        .unwrap();
    assert_downgraded(&client, &server).await;
    // A second proof reports nothing new.
    let _ = execute(client.get(server.url("/moved"))).await;
    assert_eq!(reported(Misconfiguration::RedirectsNotRecorded), 1);
}

#[tokio::test(start_paused = true)]
async fn a_false_off_declaration_is_downgraded_after_its_first_proof() {
    let (server, _dead) = mover().await;
    let client = exact_stack()
        .client_redirects(ClientRedirects::Off)
        .build(unrecorded_client())
        .unwrap();
    assert_downgraded(&client, &server).await;
    assert_eq!(reported(Misconfiguration::RedirectsNotOff), 1);
}

#[tokio::test(start_paused = true)]
async fn a_true_recorded_declaration_is_never_downgraded() {
    // build_from's client: the same redirect, recorded; the POST's refused first hop
    // afterwards is still proven unsent and retried.
    let (server, _dead) = mover().await;
    let client = exact_stack().build_from(loopback_builder()).unwrap();
    let (result, ext) = execute(client.get(server.url("/moved"))).await;
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(attempts(&ext)[0].2, Redirects::Followed { hops: Some(1) });
    let dead = HeldRefusedPort::new();
    let url = dead.url("/pay");
    let (_, ext) = execute(client.post(url).body("x")).await;
    assert_eq!(
        attempts(&ext),
        vec![
            (
                Transmission::NotSent,
                Some(FailureKind::Connect),
                Redirects::None
            );
            4
        ]
    );
}

/// A middleware that counts the requests it sees (a codebase's own, kept as
/// `Arc<dyn Middleware>`).
struct Counting(Arc<AtomicUsize>);

#[reqwest_resilience::async_trait]
impl reqwest_middleware::Middleware for Counting {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.0.fetch_add(1, Ordering::SeqCst);
        next.run(req, extensions).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_shared_per_attempt_middleware_sees_every_attempt() {
    let seen = Arc::new(AtomicUsize::new(0));
    let extra: Vec<Arc<dyn reqwest_middleware::Middleware>> =
        vec![Arc::new(Counting(seen.clone()))];
    let client = extra
        .iter()
        .fold(exact_stack(), |stack, m| stack.per_attempt(m.clone()))
        .build_from(loopback_builder())
        .unwrap();
    let dead = HeldRefusedPort::new();
    let url = dead.url("/pay");
    let (_, ext) = execute(client.post(url).body("x")).await;
    assert_eq!(seen.load(Ordering::SeqCst), 4);
    assert_eq!(
        attempts(&ext),
        vec![
            (
                Transmission::NotSent,
                Some(FailureKind::Connect),
                Redirects::None
            );
            4
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_stack_as_one_middleware_serves_a_client_built_later() {
    // pixi's way: the middlewares are kept, the client is built when first needed.
    let middlewares: Vec<Arc<dyn reqwest_middleware::Middleware>> = vec![Arc::new(
        exact_stack()
            .client_redirects(ClientRedirects::Recorded)
            .into_middleware()
            .unwrap(),
    )];
    let client = loopback_builder()
        .redirect(reqwest_resilience::redirect::recorded(
            reqwest::redirect::Policy::default(),
        ))
        .build()
        .unwrap();
    let client = middlewares
        .iter()
        .fold(reqwest_middleware::ClientBuilder::new(client), |b, m| {
            b.with_arc(m.clone())
        })
        .build();
    let dead = HeldRefusedPort::new();
    let url = dead.url("/pay");
    let (_, ext) = execute(client.post(url).body("x")).await;
    assert_eq!(
        attempts(&ext),
        vec![
            (
                Transmission::NotSent,
                Some(FailureKind::Connect),
                Redirects::None
            );
            4
        ]
    );
    // A 503 then a 200: the server saw two, the evidence step is part of the middleware.
    let server = FaultServer::sequence(vec![Action::status(503)], Action::ok("done")).await;
    let response = client.get(server.url("/")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(AttemptHistory::of_response(&response).unwrap().len(), 2);
    assert_eq!(server.requests_seen(), 2);
}

#[test]
fn one_middleware_cannot_hold_per_attempt_middlewares() {
    let err = Resilience::new()
        .per_attempt(Arc::new(Counting(Arc::default())))
        .into_middleware()
        .unwrap_err();
    assert!(matches!(
        err,
        ResilienceError::InvalidStack(StackError::PerAttemptInOneMiddleware)
    ));
}

#[tokio::test(start_paused = true)]
async fn the_stack_as_a_middleware_list_serves_a_lazily_built_client_with_per_attempt_ones() {
    // pixi's way: `[outer…, stack…]` kept as `Vec<Arc<dyn Middleware>>`, handed to
    // `ClientWithMiddleware::new` when the client is first needed.
    let (outer, per_attempt) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut middlewares: Vec<Arc<dyn reqwest_middleware::Middleware>> =
        vec![Arc::new(Counting(outer.clone()))];
    middlewares.extend(
        exact_stack()
            .client_redirects(ClientRedirects::Recorded)
            .per_attempt(Arc::new(Counting(per_attempt.clone())))
            .into_middlewares()
            .unwrap(),
    );
    assert_eq!(
        middlewares.len(),
        4,
        "outer, the stages, the per-attempt one, transport"
    );
    let client = loopback_builder()
        .redirect(reqwest_resilience::redirect::recorded(
            reqwest::redirect::Policy::default(),
        ))
        .build()
        .unwrap();
    let client = ClientWithMiddleware::new(client, middlewares);
    let dead = HeldRefusedPort::new();
    let url = dead.url("/pay");
    let (_, ext) = execute(client.post(url).body("x")).await;
    assert_eq!(
        attempts(&ext),
        vec![
            (
                Transmission::NotSent,
                Some(FailureKind::Connect),
                Redirects::None
            );
            4
        ]
    );
    assert_eq!(outer.load(Ordering::SeqCst), 1, "once per logical request");
    assert_eq!(per_attempt.load(Ordering::SeqCst), 4, "once per attempt");
}

/// reqwest 0.13 sends again, below the transport step, a request whose HTTP/2 stream
/// failed with the server's `GOAWAY(NO_ERROR)` (any method, up to 2 more times), and hyper
/// can fail that way a stream the server had taken (hyper#2500). A server that takes each
/// stream and then says `GOAWAY` below it: through `build_from` with a retry part, a POST
/// reaches it once (the stack's evidence says `GoAway`, which proves nothing for a POST)
/// and a GET is retried by the stack, each rotation in its history; without a retry part,
/// reqwest's own retries stay (the stack is never worse than reqwest alone).
#[tokio::test(start_paused = true)]
async fn build_from_turns_reqwest_s_goaway_replays_off_when_the_stack_retries() {
    use support::h2::{H2Action, H2Server};
    let builder = || {
        reqwest::Client::builder()
            .no_proxy()
            .pool_idle_timeout(None)
            .http2_prior_knowledge()
    };
    let client = Resilience::new().build_from(builder()).unwrap();

    let server = H2Server::start(|_| H2Action::GoAwayBelow).await;
    let post = client
        .post(server.url("/pay"))
        .body("1 EUR")
        .send_with_history()
        .await;
    assert!(post.result.is_err());
    assert_eq!(
        server.requests_seen(),
        1,
        "the POST reached the server once"
    );
    let outcome = post.outcome.unwrap();
    assert_eq!(outcome.attempts, 1);
    assert_eq!(outcome.stop, StopReason::MayHaveBeenProcessed);
    let seen = &post.history.attempts()[0].evidence;
    assert_eq!(
        (seen.transmission, seen.failure),
        (Transmission::Unknown, Some(FailureKind::GoAway))
    );

    let server = twice_then(H2Action::GoAwayBelow, 200).await;
    let response = client.get(server.url("/")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(server.requests_seen(), 3);
    let history = AttemptHistory::of_response(&response).unwrap();
    assert_eq!(
        history
            .attempts()
            .iter()
            .map(|a| (a.evidence.transmission, a.evidence.failure))
            .collect::<Vec<_>>(),
        [
            (Transmission::Unknown, Some(FailureKind::GoAway)),
            (Transmission::Unknown, Some(FailureKind::GoAway)),
            (Transmission::ResponseReceived(http::StatusCode::OK), None),
        ],
        "each rotation is the stack's retry, seen"
    );

    // No retry part: reqwest's own replays are kept where harmless (a GET: the original
    // and 2 more; a refused stream, for any method); a GOAWAY'd POST is not sent again
    // (reqwest alone sends it 3 times).
    let bare = Resilience::new()
        .no_retry()
        .no_breaker()
        .build_from(builder())
        .unwrap();
    assert_harmless_replays_only(&bare).await;
}

/// What a client keeping only reqwest's harmless replays does: a POST whose stream failed
/// with a `GOAWAY` below it reaches the server once; a GET, or a POST whose stream was
/// refused, is replayed by reqwest (twice at most), one attempt in the history.
async fn assert_harmless_replays_only(client: &reqwest_middleware::ClientWithMiddleware) {
    use support::h2::{H2Action, H2Server};
    let server = H2Server::start(|_| H2Action::GoAwayBelow).await;
    let post = client
        .post(server.url("/pay"))
        .body("1 EUR")
        .send_with_history()
        .await;
    assert!(post.result.is_err());
    assert_eq!(
        server.requests_seen(),
        1,
        "the GOAWAY'd POST reached it once"
    );
    let seen = &post.history.attempts()[0].evidence;
    assert_eq!(
        (post.history.len(), seen.transmission, seen.failure),
        (1, Transmission::Unknown, Some(FailureKind::GoAway))
    );

    let get = twice_then(H2Action::GoAwayBelow, 200).await;
    let response = client.get(get.url("/")).send().await.unwrap();
    assert_eq!((response.status().as_u16(), get.requests_seen()), (200, 3));
    assert_eq!(AttemptHistory::of_response(&response).unwrap().len(), 1);

    let refused = twice_then(H2Action::RefuseStream, 201).await;
    let response = client
        .post(refused.url("/pay"))
        .body("1 EUR")
        .send()
        .await
        .unwrap();
    assert_eq!(
        (response.status().as_u16(), refused.requests_seen()),
        (201, 3)
    );

    let always = H2Server::start(|_| H2Action::GoAwayBelow).await;
    let _ = client.get(always.url("/")).send().await;
    assert_eq!(
        always.requests_seen(),
        3,
        "the original and 2 replays at most"
    );
}

/// A client of `redirect::recorded_client` (built apart from its middlewares, rattler's
/// `LazyClient`) keeps only reqwest's harmless replays too.
#[tokio::test(start_paused = true)]
async fn recorded_client_keeps_only_reqwest_s_harmless_replays() {
    let client = reqwest_resilience::redirect::recorded_client(
        reqwest::Client::builder()
            .no_proxy()
            .pool_idle_timeout(None)
            .http2_prior_knowledge(),
        reqwest::redirect::Policy::default(),
    )
    .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(client)
        .with(reqwest_resilience::TransportEvidence::new())
        .build();
    assert_harmless_replays_only(&client).await;
}

/// A scripted HTTP/2 server whose first two streams meet `first`, answered `status` after.
async fn twice_then(first: support::h2::H2Action, status: u16) -> support::h2::H2Server {
    support::h2::H2Server::start(move |i| {
        if i < 2 {
            first
        } else {
            support::h2::H2Action::Respond(status)
        }
    })
    .await
}
