//! Coalesced identical GETs against real loopback servers: how many requests the server
//! sees, what every caller gets, and what cancelling callers does.
//!
//! The gated server holds its answers until the test opens the gate, after every caller
//! has entered the stack (an outer middleware counts them), so the callers that share one
//! request are known exactly. The races run on a multi-thread runtime, repeated.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
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

/// Counts the callers that entered the stack inside it.
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
        self.0.fetch_add(1, Ordering::SeqCst);
        next.run(req, extensions).await
    }
}

fn alone(entered: &Entered, coalesce: CoalesceGets) -> ClientWithMiddleware {
    ClientBuilder::new(support::loopback_client())
        .with(entered.clone())
        .with(coalesce)
        .with(TransportEvidence::new())
        .build()
}

/// Waits (bounded) until `n` callers entered, then a little longer: the step from
/// entering to joining the flight is synchronous, in the same poll.
async fn until_entered(entered: &Entered, n: usize) {
    for _ in 0..2_000 {
        if entered.0.load(Ordering::SeqCst) >= n {
            tokio::time::sleep(Duration::from_millis(20)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "only {} of {n} callers entered",
        entered.0.load(Ordering::SeqCst)
    );
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
    let in_extensions = shared_as(ext.get::<AttemptHistory>().cloned());
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
        let evidence = ext.get::<reqwest_resilience::RequestEvidence>().unwrap();
        assert_eq!(evidence.transmission, Transmission::SentNoResponse);
        assert_eq!(evidence.failure, Some(FailureKind::Reset));
        let history = ext.get::<AttemptHistory>().unwrap();
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
        .backoff(
            reqwest_resilience::Backoff::builder()
                .base(Duration::from_millis(10))
                .jitter(reqwest_resilience::Jitter::None)
                .build()
                .unwrap(),
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
