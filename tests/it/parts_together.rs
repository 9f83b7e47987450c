//! The parts that came on their own meeting in one stack: resumed bodies with the
//! client-side rate limit, with a client handed over in a builder, and with a stack made
//! for a client built later; the chaos layer at the end of a middleware list. Loopback
//! servers only, paused clock; exact counts.

use crate::support;

use std::time::Duration;

use reqwest_middleware::ClientBuilder;
use reqwest_resilience::rate::{Rate, RateLimitConfig};
use reqwest_resilience::{Resilience, ResilienceError, RetryMiddleware, StackError};
use support::ranged::{Fault, RangedServer, Representation};
use tokio::time::Instant;

const LEN: usize = 40_000;

fn payload() -> Vec<u8> {
    (0..LEN).map(|i| (i % 251) as u8).collect()
}

/// One retry at most, after exactly 100 ms.
fn retry() -> RetryMiddleware {
    RetryMiddleware::builder()
        .max_retries(1)
        .backoff(
            reqwest_resilience::Backoff::builder()
                .base(Duration::from_millis(100))
                .jitter(reqwest_resilience::Jitter::None)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
}

/// A server whose first answer breaks after 10 000 bytes; every later one is whole.
async fn cut_once() -> RangedServer {
    RangedServer::start(Representation::resumable(payload()), |i, _| {
        if i == 0 {
            Fault::Close(10_000)
        } else {
            Fault::None
        }
    })
    .await
}

/// Reads the whole body of a GET, and how long that took on the paused clock.
async fn read_all(
    client: &reqwest_middleware::ClientWithMiddleware,
    url: String,
) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let response = client.get(url).send().await.unwrap();
    let body = response.bytes().await.unwrap().to_vec();
    (body, started.elapsed())
}

#[tokio::test(start_paused = true)]
async fn a_resumed_bodys_range_request_waits_for_a_slot_of_the_origins_rate_limit() {
    // Without a rate limit the range request goes after the 100 ms backoff.
    let server = cut_once().await;
    let client = Resilience::new()
        .retry(retry())
        .no_breaker()
        .resume_bodies(true)
        .build(support::loopback_client())
        .unwrap();
    let (body, took) = read_all(&client, server.url("/f")).await;
    assert!(body == payload());
    assert_eq!(server.ranges(), vec![None, Some("bytes=10000-".to_owned())]);
    assert_eq!(took, Duration::from_millis(100));

    // One request per 10 s for the origin: the range request takes the next slot, 10 s
    // after the first request's, and the server still sees exactly two requests.
    let server = cut_once().await;
    let client = Resilience::new()
        .retry(retry())
        .no_breaker()
        .rate_limit(
            RateLimitConfig::default()
                .rate(Rate::per(1, Duration::from_secs(10)))
                .learn(false)
                .max_wait(Duration::from_secs(30)),
        )
        .resume_bodies(true)
        .build(support::loopback_client())
        .unwrap();
    let (body, took) = read_all(&client, server.url("/f")).await;
    assert!(body == payload());
    assert_eq!(server.ranges(), vec![None, Some("bytes=10000-".to_owned())]);
    assert_eq!(took, Duration::from_secs(10));
    assert_eq!(server.body_bytes_sent(), LEN as u64);
}

#[tokio::test(start_paused = true)]
async fn a_stack_installed_into_a_builder_resumes_over_the_builders_client() {
    let server = cut_once().await;
    let builder = ClientBuilder::new(support::loopback_client());
    let client = Resilience::new()
        .retry(retry())
        .no_breaker()
        .resume_bodies(true)
        .install(builder)
        .unwrap()
        .build();
    let (body, _) = read_all(&client, server.url("/f")).await;
    assert!(body == payload());
    assert_eq!(server.requests().len(), 2);
    assert_eq!(server.body_bytes_sent(), LEN as u64);
}

#[test]
fn a_stack_for_a_client_built_later_refuses_resume_bodies() {
    let refused = |r: Result<(), ResilienceError>| match r {
        Err(ResilienceError::InvalidStack(StackError::ResumeWithoutClient)) => {}
        other => panic!("expected ResumeWithoutClient, got {other:?}"),
    };
    refused(
        Resilience::new()
            .resume_bodies(true)
            .into_middleware()
            .map(drop),
    );
    refused(
        Resilience::new()
            .resume_bodies(true)
            .into_middlewares()
            .map(drop),
    );
    // Off (the default), both are fine.
    assert!(Resilience::new().into_middleware().is_ok());
    assert_eq!(Resilience::new().into_middlewares().unwrap().len(), 1);
    let text = StackError::ResumeWithoutClient.to_string();
    assert!(
        text.contains("resume_bodies needs the reqwest::Client"),
        "{text}"
    );
}

#[cfg(feature = "chaos")]
#[tokio::test(start_paused = true)]
async fn a_chaos_layer_is_the_last_of_the_middlewares_and_cannot_be_one_middleware() {
    use reqwest_resilience::chaos::{Chaos, Fault as ChaosFault};
    use reqwest_resilience::{AttemptHistory, FailureKind, Transmission};
    let chaos = || {
        Chaos::builder()
            .fault(ChaosFault::RefusedConnect, 1.0)
            .build()
            .unwrap()
    };
    match Resilience::new().chaos(chaos()).into_middleware() {
        Err(ResilienceError::InvalidStack(StackError::ChaosInOneMiddleware)) => {}
        other => panic!("expected ChaosInOneMiddleware, got {other:?}"),
    }
    // The stages, the transport step, the chaos layer: in that order, every attempt is
    // refused by the chaos socket and the transport step records it as unsent (the
    // client follows no redirect, and the stack is told so).
    let middlewares = Resilience::new()
        .retry(retry())
        .no_breaker()
        .client_redirects(reqwest_resilience::redirect::ClientRedirects::Off)
        .chaos(chaos())
        .into_middlewares()
        .unwrap();
    assert_eq!(middlewares.len(), 3);
    let no_redirects = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientWithMiddleware::new(no_redirects, middlewares);
    let server = cut_once().await;
    let mut extensions = http::Extensions::new();
    let result = client
        .get(server.url("/f"))
        .build()
        .map(|request| client.execute_with_extensions(request, &mut extensions));
    let outcome = result.unwrap().await;
    assert!(outcome.is_err());
    let history = AttemptHistory::of(&extensions).unwrap();
    let seen: Vec<_> = history
        .attempts()
        .iter()
        .map(|a| (a.evidence.transmission, a.evidence.failure))
        .collect();
    assert_eq!(
        seen,
        vec![
            (Transmission::NotSent, Some(FailureKind::Connect)),
            (Transmission::NotSent, Some(FailureKind::Connect)),
        ]
    );
    assert_eq!(server.requests().len(), 0);
}

#[cfg(feature = "astral")]
#[tokio::test(start_paused = true)]
async fn the_fork_client_built_over_a_client_resumes_and_the_forks_builder_refuses_resuming() {
    use reqwest_resilience::stack::astral::AstralResilience;
    let server = cut_once().await;
    let client = Resilience::new()
        .retry(retry())
        .no_breaker()
        .resume_bodies(true)
        .build_astral(support::loopback_client())
        .unwrap();
    let response = client.get(server.url("/f")).send().await.unwrap();
    assert!(response.bytes().await.unwrap()[..] == payload()[..]);
    assert_eq!(server.ranges(), vec![None, Some("bytes=10000-".to_owned())]);
    // The fork's builder does not hand out its client: nothing to send a range over.
    let installed = Resilience::new().resume_bodies(true).install_astral(
        astral_reqwest_middleware::ClientBuilder::new(support::loopback_client()),
    );
    assert!(matches!(
        installed.err(),
        Some(ResilienceError::InvalidStack(
            StackError::ResumeWithoutClient
        ))
    ));
}
