//! Coalesced identical GETs against real loopback servers: how many requests the server
//! sees, what every caller gets, and what cancelling callers does.
//!
//! The gated server holds its answers until the test opens the gate, after every caller
//! has joined its flight (an outer middleware counts the callers whose stack has been
//! polled once and is waiting: by then each has joined a flight or started one), so the
//! callers that share one request are known exactly. The races run on a multi-thread
//! runtime, repeated.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use reqwest_resilience::RetryMiddleware;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, BreakerState, TripPolicy};
use reqwest_resilience::coalesce::CoalesceGets;
use reqwest_resilience::evidence::{Shared, SharedRole};
use reqwest_resilience::{
    AttemptHistory, FailureKind, Origin, Resilience, ResilienceError, Transmission,
    TransportEvidence,
};
use support::gate::GatedServer;
use support::{Action, FaultServer};

const BODY: &[u8] = b"the same answer for everyone";

/// Counts the callers whose stack inside it was polled once: each has then joined a
/// flight (as its sender or behind it) or left without one, in that first poll.
#[derive(Clone, Default)]
struct Entered(Arc<AtomicUsize>);

#[reqwest_resilience::async_trait]
impl Middleware for Entered {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let mut inner = std::pin::pin!(next.run(req, extensions));
        let first = std::future::poll_fn(|cx| Poll::Ready(inner.as_mut().poll(cx))).await;
        self.0.fetch_add(1, Ordering::SeqCst);
        match first {
            Poll::Ready(result) => result,
            Poll::Pending => inner.await,
        }
    }
}

fn alone(entered: &Entered, coalesce: CoalesceGets) -> ClientWithMiddleware {
    ClientBuilder::new(support::loopback_client())
        .with(entered.clone())
        .with(coalesce)
        .with(TransportEvidence::new())
        .build()
}

/// Waits (bounded) until `n` callers joined their flights (see [`Entered`]).
async fn until_entered(entered: &Entered, n: usize) {
    for _ in 0..10_000 {
        if entered.0.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "only {} of {n} callers entered",
        entered.0.load(Ordering::SeqCst)
    );
}

/// Waits (bounded) until the server read `n` request heads.
async fn until_seen(server: &GatedServer, n: usize) {
    for _ in 0..10_000 {
        if server.requests_seen() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the server saw {} of {n} requests", server.requests_seen());
}

/// How a history says it was shared: (role, callers).
type SharedAs = Option<(SharedRole, u32)>;

fn shared_as(history: Option<AttemptHistory>) -> SharedAs {
    history
        .and_then(|h| h.shared())
        .map(|s: Shared| (s.role, s.callers))
}

/// One caller's outcome: status, body, and how the histories on its response and in its
/// extensions say it was shared.
async fn get(
    client: ClientWithMiddleware,
    url: String,
    auth: Option<&'static str>,
) -> (u16, Vec<u8>, SharedAs, SharedAs) {
    let mut req = client.get(&url);
    if let Some(auth) = auth {
        req = req.header("authorization", auth);
    }
    let mut ext = Extensions::new();
    let response = client
        .execute_with_extensions(req.build().unwrap(), &mut ext)
        .await
        .unwrap();
    let on_response = shared_as(AttemptHistory::of_response(&response));
    let in_extensions = shared_as(AttemptHistory::of(&ext).cloned());
    let status = response.status().as_u16();
    let body = response.bytes().await.unwrap().to_vec();
    (status, body, on_response, in_extensions)
}

/// `n` callers of the same GET at once; the gate opens once all of them entered.
async fn round(n: usize) -> (GatedServer, Vec<(u16, Vec<u8>, SharedAs, SharedAs)>) {
    let server = GatedServer::start(BODY).await;
    let entered = Entered::default();
    let client = alone(&entered, CoalesceGets::new());
    let url = server.url("/items?page=1");
    let tasks: Vec<_> = (0..n)
        .map(|_| tokio::spawn(get(client.clone(), url.clone(), None)))
        .collect();
    until_entered(&entered, n).await;
    server.open();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    (server, out)
}

fn roles(outcomes: &[(u16, Vec<u8>, SharedAs, SharedAs)]) -> (usize, usize) {
    let count = |role| {
        outcomes
            .iter()
            .filter(|o| o.2.map(|s| s.0) == Some(role))
            .count()
    };
    (count(SharedRole::Sent), count(SharedRole::Joined))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_concurrent_identical_gets_send_one_request_and_every_caller_gets_the_body() {
    let (server, outcomes) = round(1_000).await;
    assert_eq!(server.requests_seen(), 1);
    assert_eq!(outcomes.len(), 1_000);
    for (status, body, on_response, in_extensions) in &outcomes {
        assert_eq!(*status, 200);
        assert_eq!(body, BODY);
        assert_eq!(on_response.map(|s| s.1), Some(1_000));
        assert_eq!(on_response, in_extensions);
    }
    assert_eq!(roles(&outcomes), (1, 999));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repeated_rounds_of_concurrent_gets_each_send_exactly_one_request() {
    for _ in 0..25 {
        let (server, outcomes) = round(50).await;
        assert_eq!(server.requests_seen(), 1);
        assert!(
            outcomes
                .iter()
                .all(|o| o.0 == 200 && o.1 == BODY && o.2.map(|s| s.1) == Some(50))
        );
        assert_eq!(roles(&outcomes), (1, 49));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_alone_is_not_marked_shared_and_a_later_one_sends_again() {
    let server = GatedServer::start(BODY).await;
    server.open();
    let client = alone(&Entered::default(), CoalesceGets::new());
    for n in 1..=3 {
        let (status, body, on_response, in_extensions) =
            get(client.clone(), server.url("/"), None).await;
        assert_eq!(
            (status, body.as_slice(), on_response, in_extensions),
            (200, BODY, None, None)
        );
        assert_eq!(server.requests_seen(), n);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn different_credentials_never_share_and_the_same_ones_do() {
    let server = GatedServer::start(BODY).await;
    let entered = Entered::default();
    let client = alone(&entered, CoalesceGets::new());
    let url = server.url("/me");
    let tasks: Vec<_> = [
        "Bearer alice",
        "Bearer bob",
        "Bearer alice",
        "Bearer bob",
        "Bearer carol",
    ]
    .into_iter()
    .map(|auth| tokio::spawn(get(client.clone(), url.clone(), Some(auth))))
    .collect();
    until_entered(&entered, 5).await;
    server.open();
    let mut callers = Vec::new();
    for t in tasks {
        let (status, body, shared, _) = t.await.unwrap();
        assert_eq!((status, body.as_slice()), (200, BODY));
        callers.push(shared.map(|s| s.1));
    }
    assert_eq!(server.requests_seen(), 3, "alice, bob, carol");
    assert_eq!(callers, [Some(2), Some(2), Some(2), Some(2), None]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn posts_and_gets_with_a_body_are_never_coalesced() {
    let server = GatedServer::start(BODY).await;
    let entered = Entered::default();
    let client = alone(&entered, CoalesceGets::new());
    let url = server.url("/");
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let req = if i % 2 == 0 {
                    client.post(&url)
                } else {
                    client.get(&url)
                };
                let response = req.body("x").send().await.unwrap();
                let shared = shared_as(AttemptHistory::of_response(&response));
                (response.status().as_u16(), shared)
            })
        })
        .collect();
    until_entered(&entered, 6).await;
    server.open();
    for t in tasks {
        assert_eq!(t.await.unwrap(), (200, None));
    }
    assert_eq!(server.requests_seen(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_over_the_bound_goes_to_the_sender_and_each_follower_sends_its_own() {
    let server = GatedServer::start(BODY).await;
    let entered = Entered::default();
    let client = alone(&entered, CoalesceGets::new().max_body(BODY.len() - 1));
    let url = server.url("/large");
    let tasks: Vec<_> = (0..5)
        .map(|_| tokio::spawn(get(client.clone(), url.clone(), None)))
        .collect();
    until_entered(&entered, 5).await;
    server.open();
    for t in tasks {
        let (status, body, on_response, in_extensions) = t.await.unwrap();
        assert_eq!(
            (status, body.as_slice(), on_response, in_extensions),
            (200, BODY, None, None)
        );
    }
    assert_eq!(
        server.requests_seen(),
        5,
        "one shared attempt, then four of their own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_followers_leave_the_others_one_request_and_their_bodies() {
    for _ in 0..10 {
        let server = GatedServer::start(BODY).await;
        let entered = Entered::default();
        let client = alone(&entered, CoalesceGets::new());
        let url = server.url("/");
        let leader = tokio::spawn(get(client.clone(), url.clone(), None));
        until_entered(&entered, 1).await;
        let followers: Vec<_> = (0..6)
            .map(|_| tokio::spawn(get(client.clone(), url.clone(), None)))
            .collect();
        until_entered(&entered, 7).await;
        // Every other follower gives up.
        let mut kept = Vec::new();
        for (i, f) in followers.into_iter().enumerate() {
            if i % 2 == 0 {
                f.abort();
                assert!(f.await.unwrap_err().is_cancelled());
            } else {
                kept.push(f);
            }
        }
        server.open();
        let (status, body, shared, _) = leader.await.unwrap();
        assert_eq!(
            (status, body.as_slice(), shared),
            (200, BODY, Some((SharedRole::Sent, 7)))
        );
        for f in kept {
            let (status, body, shared, _) = f.await.unwrap();
            assert_eq!(
                (status, body.as_slice(), shared),
                (200, BODY, Some((SharedRole::Joined, 7)))
            );
        }
        assert_eq!(server.requests_seen(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_sender_hands_the_request_to_a_follower_which_sends_it_again() {
    for _ in 0..10 {
        let server = GatedServer::start(BODY).await;
        let entered = Entered::default();
        let client = alone(&entered, CoalesceGets::new());
        let url = server.url("/");
        let leader = tokio::spawn(get(client.clone(), url.clone(), None));
        until_entered(&entered, 1).await;
        until_seen(&server, 1).await;
        let followers: Vec<_> = (0..4)
            .map(|_| tokio::spawn(get(client.clone(), url.clone(), None)))
            .collect();
        until_entered(&entered, 5).await;
        leader.abort();
        assert!(leader.await.unwrap_err().is_cancelled());
        // The dropped sender's wire request is cancelled (its connection closed), and
        // one follower sends the request again.
        for _ in 0..2_000 {
            if server.closed_by_client() == 1 && server.requests_seen() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!((server.closed_by_client(), server.requests_seen()), (1, 2));
        // The other followers joined the new sender as they woke, in the same step.
        tokio::time::sleep(Duration::from_millis(50)).await;
        server.open();
        let mut outcomes = Vec::new();
        for f in followers {
            outcomes.push(f.await.unwrap());
        }
        assert!(
            outcomes
                .iter()
                .all(|o| o.0 == 200 && o.1 == BODY && o.2.map(|s| s.1) == Some(4)),
            "{:?}",
            outcomes.iter().map(|o| (o.0, o.2, o.3)).collect::<Vec<_>>()
        );
        assert_eq!(roles(&outcomes), (1, 3));
        assert_eq!(server.requests_seen(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_every_caller_cancels_the_wire_request() {
    for _ in 0..10 {
        let server = GatedServer::start(BODY).await;
        let entered = Entered::default();
        let client = alone(&entered, CoalesceGets::new());
        let url = server.url("/");
        // Every caller in one task, so that one abort drops them all at once (aborted one
        // by one, each drop of the sender would hand the request to the next).
        let callers: Vec<_> = (0..8)
            .map(|_| get(client.clone(), url.clone(), None))
            .collect();
        let all = tokio::spawn(futures_util::future::join_all(callers));
        until_entered(&entered, 8).await;
        until_seen(&server, 1).await;
        all.abort();
        assert!(all.await.unwrap_err().is_cancelled());
        for _ in 0..2_000 {
            if server.closed_by_client() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!((server.requests_seen(), server.closed_by_client()), (1, 1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_request_is_shared_as_a_typed_error_with_its_evidence() {
    let server = FaultServer::always(Action::Delay(
        Duration::from_millis(200),
        Box::new(Action::ReadThenReset),
    ))
    .await;
    let entered = Entered::default();
    let client = alone(&entered, CoalesceGets::new());
    let url = server.url("/");
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let mut ext = Extensions::new();
                let req = client.get(&url).build().unwrap();
                let result = client.execute_with_extensions(req, &mut ext).await;
                (result.map(|r| r.status()), ext)
            })
        })
        .collect();
    let mut shared_failures = Vec::new();
    let mut own_failures = Vec::new();
    for t in tasks {
        let (result, ext) = t.await.unwrap();
        let err = result.unwrap_err();
        let evidence = reqwest_resilience::RequestEvidence::of(&ext).unwrap();
        assert_eq!(evidence.transmission, Transmission::SentNoResponse);
        assert_eq!(evidence.failure, Some(FailureKind::Reset));
        let history = AttemptHistory::of(&ext).unwrap();
        assert_eq!(history.len(), 1);
        match ResilienceError::from_middleware_error(&err) {
            Some(ResilienceError::SharedRequestFailed { error }) => {
                assert_eq!(
                    history.shared().map(|s| (s.role, s.callers)),
                    Some((SharedRole::Joined, 5))
                );
                shared_failures.push(error.clone());
            }
            _ => {
                assert!(
                    matches!(err, reqwest_middleware::Error::Reqwest(_)),
                    "{err:?}"
                );
                assert_eq!(
                    history.shared().map(|s| (s.role, s.callers)),
                    Some((SharedRole::Sent, 5))
                );
                own_failures.push(err.to_string());
            }
        }
    }
    // The sender's own error, and its text for the four that joined it.
    assert_eq!(own_failures.len(), 1);
    assert_eq!(shared_failures, vec![own_failures[0].clone(); 4]);
    assert_eq!(server.requests_seen(), 1);
}

/// In the stack, coalescing is outside the retry and the breaker: one shared request is
/// one logical request, counted once by the breaker however many callers share it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_the_stack_a_shared_failure_counts_once_for_the_breaker() {
    let server = FaultServer::always(Action::Delay(
        Duration::from_millis(200),
        Box::new(Action::status(503)),
    ))
    .await;
    let registry =
        BreakerRegistry::new(BreakerConfig::default().policy(TripPolicy::consecutive_failures(3)))
            .unwrap();
    let client = Resilience::new()
        .no_retry()
        .breaker(registry.clone())
        .coalesce_gets(CoalesceGets::new())
        .build(support::loopback_client())
        .unwrap();
    let url = server.url("/");
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { client.get(&url).send().await.unwrap().status().as_u16() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 503);
    }
    assert_eq!(server.requests_seen(), 1);
    let origin = Origin::parse(&url).unwrap();
    assert_eq!(registry.state(&origin), Some(BreakerState::Closed));
    let snapshot = registry.snapshot().pop().unwrap();
    assert_eq!(
        snapshot.consecutive_failures, 1,
        "20 callers, one failure counted"
    );
}

/// In the stack, the shared request is retried once for all its callers: every caller
/// gets the retried answer and the history of both attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_the_stack_the_shared_request_is_retried_once_for_every_caller() {
    let slow = |action| Action::Delay(Duration::from_millis(200), Box::new(action));
    let server =
        FaultServer::sequence(vec![slow(Action::status(503))], slow(Action::ok("ok"))).await;
    let client = Resilience::new()
        .retry(
            RetryMiddleware::builder().backoff(
                reqwest_resilience::Backoff::builder()
                    .base(Duration::from_millis(10))
                    .jitter(reqwest_resilience::Jitter::None)
                    .build()
                    .unwrap(),
            ),
        )
        .coalesce_gets(CoalesceGets::new())
        .build(support::loopback_client())
        .unwrap();
    let url = server.url("/");
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let response = client.get(&url).send().await.unwrap();
                let history = AttemptHistory::of_response(&response).unwrap();
                let statuses: Vec<_> = history
                    .attempts()
                    .iter()
                    .map(|a| a.evidence.status().map(|s| s.as_u16()))
                    .collect();
                let shared = history.shared().map(|s| s.callers);
                (response.text().await.unwrap(), statuses, shared)
            })
        })
        .collect();
    for t in tasks {
        let (body, statuses, shared) = t.await.unwrap();
        assert_eq!(body, "ok");
        assert_eq!(statuses, [Some(503), Some(200)]);
        assert_eq!(shared, Some(10));
    }
    assert_eq!(server.requests_seen(), 2);
}

// ---------------------------------------------------------------------------------------
// Issue 29, findings 1–9: a response is shared only between requests identical in
// everything the server can see, and never when the answer is the caller's own.
// ---------------------------------------------------------------------------------------

use reqwest_resilience::retry::{Deadline, RetryOutcome, StopReason};
use reqwest_resilience::{AccessToken, BearerAuth, StackError, TokenManager};
use support::gate::{Answer, GatedRequest};

/// One caller's outcome: status, body, how its history says it was shared.
type Outcome = (u16, String, SharedAs);

/// Sends `req` through `client` with `ext`; the body read whole.
async fn send(client: ClientWithMiddleware, req: reqwest::Request, mut ext: Extensions) -> Outcome {
    let response = client.execute_with_extensions(req, &mut ext).await.unwrap();
    let shared = shared_as(AttemptHistory::of_response(&response));
    let status = response.status().as_u16();
    (status, response.text().await.unwrap(), shared)
}

/// A GET of `url` with `headers`.
fn get_with(
    client: &ClientWithMiddleware,
    url: &str,
    headers: &[(&str, &str)],
) -> reqwest::Request {
    let mut req = client.get(url);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    req.build().unwrap()
}

/// Starts one caller per request, in order, each after the one before joined its flight,
/// then opens the gate and collects what each received.
async fn in_order(
    server: &GatedServer,
    entered: &Entered,
    callers: Vec<(ClientWithMiddleware, reqwest::Request)>,
) -> Vec<Outcome> {
    let mut tasks = Vec::new();
    for (i, (client, req)) in callers.into_iter().enumerate() {
        tasks.push(tokio::spawn(send(client, req, Extensions::new())));
        until_entered(entered, i + 1).await;
    }
    server.open();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// The body names the `Authorization` the server saw.
fn for_authorization(r: &GatedRequest) -> Answer {
    Answer::ok(format!(
        "for {}",
        r.header("authorization").unwrap_or("nobody")
    ))
}

fn bearer(server: &GatedServer, token: &'static str) -> BearerAuth {
    let manager =
        TokenManager::new(move || async move { Ok::<_, std::io::Error>(AccessToken::new(token)) });
    BearerAuth::builder(manager)
        .origin(Origin::parse(&server.url("/")).unwrap())
        .allow_http_on_loopback()
        .build()
        .unwrap()
}

/// Finding 1: two stacks holding clones of one `CoalesceGets`, each with its own
/// `BearerAuth`, are two identities: bob never receives the answer fetched with alice's
/// token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stacks_with_their_own_tokens_and_clones_of_one_coalesce_never_share() {
    let server = GatedServer::start_with(for_authorization).await;
    let entered = Entered::default();
    let coalesce = CoalesceGets::new();
    let stack = |token| {
        Resilience::new()
            .bearer(bearer(&server, token))
            .coalesce_gets(coalesce.clone())
            .install(ClientBuilder::new(support::loopback_client()).with(entered.clone()))
            .unwrap()
            .build()
    };
    let (alice, bob) = (stack("alice"), stack("bob"));
    let url = server.url("/me");
    let outcomes = in_order(
        &server,
        &entered,
        vec![
            (alice.clone(), get_with(&alice, &url, &[])),
            (bob.clone(), get_with(&bob, &url, &[])),
        ],
    )
    .await;
    assert_eq!(
        outcomes,
        [
            (200, "for Bearer alice".into(), None),
            (200, "for Bearer bob".into(), None)
        ]
    );
    assert_eq!(server.requests_seen(), 2);
}

/// Finding 2: two reqwest clients with their own default `Authorization` (which no
/// middleware sees) and clones of one `CoalesceGets` never share; the callers of one
/// client do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_clients_with_their_own_default_credentials_never_share() {
    let server = GatedServer::start_with(for_authorization).await;
    let entered = Entered::default();
    let coalesce = CoalesceGets::new();
    let client = |auth: &str| {
        let mut headers = http::HeaderMap::new();
        headers.insert("authorization", auth.parse().unwrap());
        let http = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .default_headers(headers)
            .build()
            .unwrap();
        ClientBuilder::new(http)
            .with(entered.clone())
            .with(coalesce.clone())
            .with(TransportEvidence::new())
            .build()
    };
    let (alice, bob) = (client("Bearer alice"), client("Bearer bob"));
    let url = server.url("/me");
    let outcomes = in_order(
        &server,
        &entered,
        vec![
            (alice.clone(), get_with(&alice, &url, &[])),
            (bob.clone(), get_with(&bob, &url, &[])),
            (alice.clone(), get_with(&alice, &url, &[])),
        ],
    )
    .await;
    let alices = Some((SharedRole::Sent, 2));
    assert_eq!(
        outcomes,
        [
            (200, "for Bearer alice".into(), alices),
            (200, "for Bearer bob".into(), None),
            (
                200,
                "for Bearer alice".into(),
                Some((SharedRole::Joined, 2))
            ),
        ]
    );
    assert_eq!(server.requests_seen(), 2);
}

/// Finding 2, the opt-in: clones given one identity share across clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clones_declared_one_identity_share_across_clients() {
    let server = GatedServer::start(BODY).await;
    let entered = Entered::default();
    let coalesce = CoalesceGets::new().identity("service-account");
    let (one, two) = (
        alone(&entered, coalesce.clone()),
        alone(&entered, coalesce.clone()),
    );
    let url = server.url("/config");
    let outcomes = in_order(
        &server,
        &entered,
        vec![
            (one.clone(), get_with(&one, &url, &[])),
            (two.clone(), get_with(&two, &url, &[])),
        ],
    )
    .await;
    let body = String::from_utf8(BODY.to_vec()).unwrap();
    assert_eq!(
        outcomes,
        [
            (200, body.clone(), Some((SharedRole::Sent, 2))),
            (200, body, Some((SharedRole::Joined, 2))),
        ]
    );
    assert_eq!(server.requests_seen(), 1);
}

/// Finding 3: every request header is keyed, not an allow-list: callers differing only
/// in `X-Api-Key` never share; those with the same key do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_differing_in_any_header_never_share() {
    let server = GatedServer::start_with(|r| {
        Answer::ok(format!("data of {}", r.header("x-api-key").unwrap_or("-")))
            .header("vary", "X-Api-Key")
    })
    .await;
    let entered = Entered::default();
    let client = alone(&entered, CoalesceGets::new());
    let url = server.url("/data");
    let outcomes = in_order(
        &server,
        &entered,
        ["a", "b", "a"]
            .into_iter()
            .map(|key| {
                (
                    client.clone(),
                    get_with(&client, &url, &[("x-api-key", key)]),
                )
            })
            .collect(),
    )
    .await;
    assert_eq!(
        outcomes,
        [
            (200, "data of a".into(), Some((SharedRole::Sent, 2))),
            (200, "data of b".into(), None),
            (200, "data of a".into(), Some((SharedRole::Joined, 2))),
        ]
    );
    assert_eq!(server.requests_seen(), 2);
}

/// Sets `X-Api-Key` from the request's tenant (an extension).
#[derive(Clone, Copy)]
struct Tenant(&'static str);

struct TenantKey;

#[reqwest_resilience::async_trait]
impl Middleware for TenantKey {
    async fn handle(
        &self,
        mut req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        if let Some(Tenant(t)) = extensions.get::<Tenant>() {
            req.headers_mut()
                .insert("x-api-key", format!("key-{t}").parse().unwrap());
        }
        next.run(req, extensions).await
    }
}

/// Finding 4: a per-attempt middleware adds what the coalescing stage (outside the retry)
/// cannot see; the stack refuses the pair rather than share across tenants.
#[test]
fn coalescing_with_a_per_attempt_middleware_is_refused_at_build() {
    let refused = |built: Result<_, ResilienceError>| {
        matches!(
            built,
            Err(ResilienceError::InvalidStack(
                StackError::CoalesceWithPerAttempt
            ))
        )
    };
    let stack = || {
        Resilience::new()
            .coalesce_gets(CoalesceGets::new())
            .per_attempt(Arc::new(TenantKey))
    };
    assert!(refused(stack().build(support::loopback_client()).map(drop)));
    assert!(refused(stack().into_middlewares().map(drop)));
    // Without coalescing the per-attempt middleware is fine.
    assert!(
        Resilience::new()
            .per_attempt(Arc::new(TenantKey))
            .build(support::loopback_client())
            .is_ok()
    );
}

/// Finding 4, the supported place: the tenant's key set around the stack is seen and
/// keyed, so tenant b never receives tenant a's data.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_key_set_around_the_stack_keeps_tenants_apart() {
    let server = GatedServer::start_with(|r| {
        Answer::ok(format!("data of {}", r.header("x-api-key").unwrap_or("-")))
    })
    .await;
    let entered = Entered::default();
    let client = Resilience::new()
        .coalesce_gets(CoalesceGets::new())
        .install(
            ClientBuilder::new(support::loopback_client())
                .with(TenantKey)
                .with(entered.clone()),
        )
        .unwrap()
        .build();
    let url = server.url("/data");
    let mut tasks = Vec::new();
    for (i, tenant) in ["a", "b", "a"].into_iter().enumerate() {
        let mut ext = Extensions::new();
        ext.insert(Tenant(tenant));
        let req = get_with(&client, &url, &[]);
        tasks.push(tokio::spawn(send(client.clone(), req, ext)));
        until_entered(&entered, i + 1).await;
    }
    server.open();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    assert_eq!(
        outcomes,
        [
            (200, "data of key-a".into(), Some((SharedRole::Sent, 2))),
            (200, "data of key-b".into(), None),
            (200, "data of key-a".into(), Some((SharedRole::Joined, 2))),
        ]
    );
    assert_eq!(server.requests_seen(), 2);
}

/// Finding 5: a plain GET never joins a conditional one (it would receive a `304` with an
/// empty body); identical conditional GETs share their `304`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plain_get_never_joins_a_conditional_get() {
    let server = GatedServer::start_with(|r| match r.header("if-none-match") {
        Some("\"v1\"") => Answer::ok("").status(304).header("etag", "\"v1\""),
        _ => Answer::ok("version 1").header("etag", "\"v1\""),
    })
    .await;
    let entered = Entered::default();
    let client = alone(&entered, CoalesceGets::new());
    let url = server.url("/doc");
    let conditional = [("if-none-match", "\"v1\"")];
    let outcomes = in_order(
        &server,
        &entered,
        vec![
            (client.clone(), get_with(&client, &url, &conditional)),
            (client.clone(), get_with(&client, &url, &[])),
            (client.clone(), get_with(&client, &url, &conditional)),
        ],
    )
    .await;
    assert_eq!(
        outcomes,
        [
            (304, String::new(), Some((SharedRole::Sent, 2))),
            (200, "version 1".into(), None),
            (304, String::new(), Some((SharedRole::Joined, 2))),
        ]
    );
    assert_eq!(server.requests_seen(), 2);
}

/// Finding 6: a range request with `If-Range: "v1"` (the server holds v2) never joins the
/// same range without it: it receives v2 whole, never a `206` of v2 to splice onto v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_range_with_if_range_never_joins_one_without_it() {
    const V2: &str = "v2v2v2v2v2";
    let server = GatedServer::start_with(|r| {
        let current = r.header("if-range").is_none_or(|v| v == "\"v2\"");
        match r.header("range") {
            Some("bytes=0-3") if current => Answer::ok(&V2.as_bytes()[..4])
                .status(206)
                .header("content-range", "bytes 0-3/10")
                .header("etag", "\"v2\""),
            _ => Answer::ok(V2).header("etag", "\"v2\""),
        }
    })
    .await;
    let entered = Entered::default();
    let client = alone(&entered, CoalesceGets::new());
    let url = server.url("/file");
    let outcomes = in_order(
        &server,
        &entered,
        vec![
            (
                client.clone(),
                get_with(&client, &url, &[("range", "bytes=0-3")]),
            ),
            (
                client.clone(),
                get_with(
                    &client,
                    &url,
                    &[("range", "bytes=0-3"), ("if-range", "\"v1\"")],
                ),
            ),
        ],
    )
    .await;
    assert_eq!(
        outcomes,
        [(206, "v2v2".into(), None), (200, V2.into(), None)]
    );
    assert_eq!(server.requests_seen(), 2);
}

/// Finding 7: a body without `Content-Length` (an event stream held open) is not buffered
/// for joiners: every caller's `send()` returns at the head, as without coalescing, and
/// each reads its own stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_streamed_answer_returns_at_the_head_to_every_caller() {
    let server = GatedServer::start_with(|_| {
        Answer::ok("data: 1\n\n")
            .header("content-type", "text/event-stream")
            .streamed()
    })
    .await;
    let entered = Entered::default();
    let client = alone(&entered, CoalesceGets::new());
    let url = server.url("/events");
    let mut tasks = Vec::new();
    for i in 0..2 {
        let req = get_with(&client, &url, &[]);
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            // Bounded: the stream is never closed, so a `send()` that waits for the whole
            // body never returns.
            let sent = tokio::time::timeout(Duration::from_secs(20), client.execute(req)).await;
            let mut response = sent.expect("send() returned at the head").unwrap();
            let shared = shared_as(AttemptHistory::of_response(&response));
            let event = tokio::time::timeout(Duration::from_secs(20), response.chunk())
                .await
                .expect("the first event came")
                .unwrap()
                .unwrap();
            (response.status().as_u16(), event, shared)
        }));
        until_entered(&entered, i + 1).await;
    }
    server.open();
    for t in tasks {
        let (status, event, shared) = t.await.unwrap();
        assert_eq!(
            (status, &event[..], shared),
            (200, &b"data: 1\n\n"[..], None)
        );
    }
    assert_eq!(
        server.requests_seen(),
        2,
        "the sender's, then the joiner's own"
    );
}

/// Finding 8: an answer marked `private` or `no-store`, or carrying `Set-Cookie`, is the
/// caller's own: each caller gets its own request; a `public` one is shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn private_no_store_and_set_cookie_answers_are_never_shared() {
    for (name, value, requests) in [
        ("cache-control", "private, no-store", 2),
        ("cache-control", "private", 2),
        ("cache-control", "No-Store", 2),
        ("set-cookie", "session=s", 2),
        ("cache-control", "public, max-age=60", 1),
    ] {
        let server = GatedServer::start_with(move |r| {
            Answer::ok(format!("answer {}", r.index)).header(name, value)
        })
        .await;
        let entered = Entered::default();
        let client = alone(&entered, CoalesceGets::new());
        let url = server.url("/account");
        let mut outcomes = in_order(
            &server,
            &entered,
            (0..2)
                .map(|_| (client.clone(), get_with(&client, &url, &[])))
                .collect(),
        )
        .await;
        outcomes.sort_by_key(|o| (o.1.clone(), o.2.map(|s| s.0 == SharedRole::Sent)));
        let expected: Vec<Outcome> = if requests == 2 {
            vec![
                (200, "answer 0".into(), None),
                (200, "answer 1".into(), None),
            ]
        } else {
            vec![
                (200, "answer 0".into(), Some((SharedRole::Joined, 2))),
                (200, "answer 0".into(), Some((SharedRole::Sent, 2))),
            ]
        };
        assert_eq!(outcomes, expected, "{name}: {value}");
        assert_eq!(server.requests_seen(), requests, "{name}: {value}");
    }
}

/// Finding 9: the sender's own `Deadline` runs out; the follower (no deadline) is not
/// handed that failure: it takes the request over, as from a dropped sender, and gets the
/// server's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sender_stopped_by_its_own_deadline_hands_the_request_over() {
    let server = GatedServer::start(BODY).await;
    let entered = Entered::default();
    let client = Resilience::new()
        .coalesce_gets(CoalesceGets::new())
        .install(ClientBuilder::new(support::loopback_client()).with(entered.clone()))
        .unwrap()
        .build();
    let url = server.url("/slow");
    let leader = {
        let (client, req) = (client.clone(), get_with(&client, &url, &[]));
        tokio::spawn(async move {
            let mut ext = Extensions::new();
            ext.insert(Deadline::after(Duration::from_millis(300)));
            let result = client.execute_with_extensions(req, &mut ext).await;
            (
                result.map(|r| r.status().as_u16()),
                RetryOutcome::of(&ext).map(|o| o.stop),
            )
        })
    };
    until_entered(&entered, 1).await;
    let follower = tokio::spawn(send(
        client.clone(),
        get_with(&client, &url, &[]),
        Extensions::new(),
    ));
    until_entered(&entered, 2).await;
    let (result, stop) = leader.await.unwrap();
    assert!(result.is_err(), "{result:?}");
    assert_eq!(stop, Some(StopReason::DeadlineExceeded));
    // The follower sends the request again, as its own.
    for _ in 0..10_000 {
        if server.requests_seen() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    server.open();
    let body = String::from_utf8(BODY.to_vec()).unwrap();
    assert_eq!(follower.await.unwrap(), (200, body, None));
    assert_eq!((server.requests_seen(), server.closed_by_client()), (2, 1));
}

/// What held (kept): a body with `Content-Length` that breaks while the sender reads it
/// is not shared: the sender reads what came, then the failure; each follower sends its
/// own request and gets the whole body.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_that_breaks_while_the_sender_reads_it_is_not_shared() {
    const WHOLE: &str = "0123456789";
    let server = GatedServer::start_with(|r| match r.index {
        0 => Answer::ok(WHOLE).cut_after(4),
        _ => Answer::ok(WHOLE),
    })
    .await;
    let entered = Entered::default();
    let client = alone(&entered, CoalesceGets::new());
    let url = server.url("/file");
    let mut tasks = Vec::new();
    for i in 0..3 {
        let req = get_with(&client, &url, &[]);
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let response = client.execute(req).await.unwrap();
            let shared = shared_as(AttemptHistory::of_response(&response));
            let status = response.status().as_u16();
            (
                status,
                response
                    .text()
                    .await
                    .map_err(|e| e.is_body() || e.is_decode()),
                shared,
            )
        }));
        until_entered(&entered, i + 1).await;
    }
    server.open();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    assert_eq!(
        outcomes,
        [
            (200, Err(true), None),
            (200, Ok(WHOLE.to_owned()), None),
            (200, Ok(WHOLE.to_owned()), None),
        ]
    );
    assert_eq!(
        server.requests_seen(),
        3,
        "the sender's, then one per follower"
    );
}

/// A HEAD answer (its `Content-Length` that of the GET, no body) is still shared between
/// identical HEADs: its length is known (none follows).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identical_heads_share_one_request() {
    let server = GatedServer::start(BODY).await;
    let entered = Entered::default();
    let client = alone(&entered, CoalesceGets::new());
    let url = server.url("/file");
    let outcomes = in_order(
        &server,
        &entered,
        (0..2)
            .map(|_| (client.clone(), client.head(&url).build().unwrap()))
            .collect(),
    )
    .await;
    assert_eq!(
        outcomes,
        [
            (200, String::new(), Some((SharedRole::Sent, 2))),
            (200, String::new(), Some((SharedRole::Joined, 2))),
        ]
    );
    assert_eq!(server.requests_seen(), 1);
}
