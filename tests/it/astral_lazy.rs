//! The list for a client built lazily elsewhere (rattler's `LazyClient`, feature `astral`):
//! `RetryMiddleware::new_with_policy` and `TransportEvidence` in the fork's
//! `Vec<Arc<dyn Middleware>>`, handed to `ClientWithMiddleware::new` with a client built
//! apart from them, nothing declared about its redirects.
//!
//! With the client built by `redirect::recorded_client` (the one call) a `POST` whose
//! connection was refused is retried, exactly as reqwest-retry's
//! `RetryTransientMiddleware` did; a `POST` that reached the server is not, nor one whose
//! refused connection came after a redirect. With any other client the refused `POST` is
//! not retried (its first hop cannot be told from a later one), and that is reported once
//! per process, naming the call.

#![cfg(feature = "astral")]

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use astral_reqwest_middleware as fork;
use http::Extensions;
use reqwest_resilience::misconfig::Misconfiguration;
use reqwest_resilience::redirect;
use reqwest_resilience::retry::{RetryOutcome, StopReason};
use reqwest_resilience::stack::astral::AstralResilience;
use reqwest_resilience::{
    AttemptHistory, FailureKind, Redirects, Resilience, RetryMiddleware, Transmission,
    TransportEvidence,
};
use retry_policies::policies::ExponentialBackoff;
use support::held_port::HeldRefusedPort;
use support::{Action, FaultServer};

/// rattler's policy: three retries (delays of a millisecond, on tokio's paused clock).
fn policy() -> ExponentialBackoff {
    ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(1), Duration::from_millis(1))
        .build_with_max_retries(3)
}

/// rattler's minimal port: the retry middleware and the transport step, as a list.
fn minimal_list() -> Vec<Arc<dyn fork::Middleware>> {
    vec![
        Arc::new(RetryMiddleware::new_with_policy(policy())),
        Arc::new(TransportEvidence::new()),
    ]
}

/// The same through the stack's list, nothing declared about the client's redirects.
fn stack_list() -> Vec<Arc<dyn fork::Middleware>> {
    Resilience::new()
        .no_breaker()
        .retry(RetryMiddleware::new_with_policy(policy()))
        .into_middlewares_astral()
        .unwrap()
}

fn loopback_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
}

/// The client built lazily, elsewhere, with the one call.
fn lazy_recorded(middlewares: Vec<Arc<dyn fork::Middleware>>) -> fork::ClientWithMiddleware {
    let client =
        redirect::recorded_client(loopback_builder(), reqwest::redirect::Policy::default())
            .unwrap();
    fork::ClientWithMiddleware::new(client, middlewares)
}

async fn post(client: &fork::ClientWithMiddleware, url: &str) -> (fork::Result<()>, Extensions) {
    let (client, request) = client.post(url).body("1 EUR").build_split();
    let mut ext = Extensions::new();
    let result = client
        .execute_with_extensions(request.unwrap(), &mut ext)
        .await
        .map(drop);
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

async fn assert_refused_post_retried(client: &fork::ClientWithMiddleware) {
    let dead = HeldRefusedPort::new();
    let (result, ext) = post(client, &dead.url("/pay")).await;
    let err = result.unwrap_err();
    assert!(err.is_connect(), "{err:?}");
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
async fn the_minimal_list_with_the_recorded_client_retries_a_refused_post_as_reqwest_retry_did() {
    assert_refused_post_retried(&lazy_recorded(minimal_list())).await;
}

#[tokio::test(start_paused = true)]
async fn the_stacks_list_with_the_recorded_client_retries_a_refused_post() {
    assert_refused_post_retried(&lazy_recorded(stack_list())).await;
}

#[tokio::test(start_paused = true)]
async fn a_post_whose_connection_dropped_after_sending_is_not_retried() {
    let server = FaultServer::always(Action::ReadThenClose).await;
    let client = lazy_recorded(minimal_list());
    let (result, ext) = post(&client, &server.url("/pay")).await;
    assert!(result.is_err());
    assert_eq!(
        attempts(&ext),
        vec![(
            Transmission::SentNoResponse,
            Some(FailureKind::Closed),
            Redirects::None
        )]
    );
    let outcome = RetryOutcome::of(&ext).unwrap();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (1, StopReason::MayHaveBeenProcessed)
    );
    assert_eq!(server.requests_seen(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_post_redirected_to_a_refused_port_is_not_retried() {
    // POST /pay → 303 → GET on a refused port: reqwest reports the refusal with the first
    // URL, but the recorded client saw the hop, so /pay is known to have been answered.
    let dead = HeldRefusedPort::new();
    let receipt = dead.url("/receipt");
    let server = FaultServer::always(Action::status(303).header("location", &receipt)).await;
    let client = lazy_recorded(minimal_list());
    let (result, ext) = post(&client, &server.url("/pay")).await;
    assert!(result.unwrap_err().is_connect());
    assert_eq!(
        attempts(&ext),
        vec![(
            Transmission::Unknown,
            Some(FailureKind::Connect),
            Redirects::Followed { hops: Some(1) }
        )]
    );
    let outcome = RetryOutcome::of(&ext).unwrap();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (1, StopReason::RedirectFollowed)
    );
    assert_eq!(server.requests_seen(), 1);
}

#[tokio::test(start_paused = true)]
async fn without_the_recorded_client_a_refused_post_is_not_retried_and_that_is_reported_once() {
    let client =
        fork::ClientWithMiddleware::new(loopback_builder().build().unwrap(), minimal_list());
    for _ in 0..2 {
        let dead = HeldRefusedPort::new();
        let (result, ext) = post(&client, &dead.url("/pay")).await;
        assert!(result.unwrap_err().is_connect());
        assert_eq!(
            attempts(&ext),
            vec![(
                Transmission::Unknown,
                Some(FailureKind::Connect),
                Redirects::Unknown
            )]
        );
        let outcome = RetryOutcome::of(&ext).unwrap();
        assert_eq!(
            (outcome.attempts, outcome.stop),
            (1, StopReason::MayHaveBeenProcessed)
        );
    }
    let reported = Misconfiguration::reported();
    assert_eq!(
        reported
            .iter()
            .filter(|m| **m == Misconfiguration::RedirectsUnobserved)
            .count(),
        1,
        "{reported:?}"
    );
    assert!(
        Misconfiguration::RedirectsUnobserved
            .to_string()
            .contains("redirect::recorded_client")
    );
}

#[tokio::test(start_paused = true)]
async fn without_the_recorded_client_a_refused_get_is_still_retried() {
    let client =
        fork::ClientWithMiddleware::new(loopback_builder().build().unwrap(), minimal_list());
    let dead = HeldRefusedPort::new();
    let mut ext = Extensions::new();
    let request = client.get(dead.url("/simple")).build().unwrap();
    let err = client
        .execute_with_extensions(request, &mut ext)
        .await
        .unwrap_err();
    assert!(err.is_connect());
    assert_eq!(
        attempts(&ext),
        vec![
            (
                Transmission::Unknown,
                Some(FailureKind::Connect),
                Redirects::Unknown
            );
            4
        ]
    );
}
