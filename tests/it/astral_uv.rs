//! uv's client on the fork (feature `astral`), ported as its maintainers would: the base
//! client's setup (`crates/uv-client/src/base_client.rs`: `create_client`,
//! `apply_middleware`) and its error handling (`error.rs`: `from_reqwest_middleware`, which
//! reads the retry count; `WrappedReqwestError::filter_retries_from_error`, which unwraps
//! the retry error; `inner`, which finds the `reqwest::Error`), with no error-chain walk of
//! uv's own and no crates.io reqwest-middleware: `reqwest_middleware` below is the fork, as
//! in uv.

#![cfg(feature = "astral")]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use astral_reqwest_middleware as reqwest_middleware; // uv's name for the fork
// The crates.io crate, only for the test that compares the two paths.
use ::reqwest_middleware as reqwest_middleware_crates;
use http::Extensions;
use reqwest_resilience::retry::strategies::UvTransient;
use reqwest_resilience::retry::{ErrorWrapping, StopReason};
use reqwest_resilience::stack::astral::AstralResilience;
use reqwest_resilience::{
    BreakerConfig, BreakerRegistry, Exchange, Resilience, ResilienceError, RetryMiddleware,
    SendWithHistory,
};
use reqwest_resilience::{chain, redirect};
use support::held_port::HeldRefusedPort;
use support::{Action, FaultServer};

/// uv's `Error`, reduced to what `from_reqwest_middleware` fills in.
#[derive(Debug)]
struct UvError {
    retries: u32,
    error: reqwest_middleware::Error,
}

/// A fork middleware of uv's (its `extra_middleware`), run per attempt.
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

/// `create_client` + `apply_middleware`: uv's reqwest client (its redirects seen), then the
/// stack where `RetryTransientMiddleware::new_with_policy_and_strategy(policy,
/// UvRetryableStrategy)` was, uv's middlewares per attempt.
fn uv_client(
    retries: u32,
    wrapping: ErrorWrapping,
    breaker: Option<BreakerRegistry>,
    extra: Vec<Arc<dyn reqwest_middleware::Middleware>>,
) -> reqwest_middleware::ClientWithMiddleware {
    let client = redirect::recorded_client(
        reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0),
        reqwest::redirect::Policy::default(),
    )
    .unwrap();
    let retry = RetryMiddleware::like_reqwest_retry()
        .strategy(UvTransient)
        .max_retries(retries)
        .error_wrapping(wrapping);
    let mut stack = Resilience::like_reqwest_retry().retry(retry);
    if let Some(registry) = breaker {
        stack = stack.breaker(registry);
    }
    let stack = extra
        .into_iter()
        .fold(stack, |s, m| s.per_attempt_astral(m));
    stack
        .install_astral(reqwest_middleware::ClientBuilder::new(client))
        .unwrap()
        .build()
}

/// `from_reqwest_middleware`: the retry count from the exchange's outcome, the error as
/// `send()` returned it (uv's `filter_retries_from_error` has nothing to strip).
fn from_exchange(
    exchange: Exchange<reqwest_middleware::Error>,
) -> Result<reqwest::Response, UvError> {
    let retries = exchange.outcome.map_or(0, |o| o.retries());
    exchange.result.map_err(|error| UvError { retries, error })
}

/// `from_reqwest_middleware` for errors that carry their count themselves
/// (`ErrorWrapping::Always`): the count and the last error out of the `Retry`.
fn from_wrapped(error: reqwest_middleware::Error) -> UvError {
    let retries = match ResilienceError::from_middleware_error_astral(&error) {
        Some(ResilienceError::Retry(retry)) => retry.attempts() - 1,
        _ => 0,
    };
    // `filter_retries_from_error`: the last attempt's error, so the count is shown once.
    let error = match error {
        reqwest_middleware::Error::Middleware(e) => match e.downcast::<ResilienceError>() {
            Ok(ResilienceError::Retry(retry)) => retry.into_last_error_astral(),
            Ok(other) => reqwest_middleware::Error::middleware(other),
            Err(e) => reqwest_middleware::Error::Middleware(e),
        },
        e => e,
    };
    UvError { retries, error }
}

#[tokio::test(start_paused = true)]
async fn uvs_client_reports_a_refused_connect_with_its_retries_and_reqwests_error() {
    let seen = Arc::new(AtomicUsize::new(0));
    let client = uv_client(
        3,
        ErrorWrapping::ExceptReqwest,
        None,
        vec![Arc::new(Counting(seen.clone()))],
    );
    let dead = HeldRefusedPort::new();
    let err = from_exchange(
        client
            .get(dead.url("/simple/anyio/"))
            .send_with_history()
            .await,
    )
    .unwrap_err();
    assert_eq!(err.retries, 3);
    assert!(err.error.is_connect(), "{:?}", err.error);
    // `WrappedReqwestError::inner`: the crate's one chain walk serves the fork's error too.
    assert!(chain::find::<reqwest::Error>(&err.error).is_some_and(reqwest::Error::is_connect));
    assert_eq!(
        seen.load(Ordering::SeqCst),
        4,
        "uv's middleware saw every attempt"
    );
}

#[tokio::test(start_paused = true)]
async fn uvs_client_retries_a_503_and_returns_the_last_response() {
    let server = FaultServer::always(Action::status(503)).await;
    let client = uv_client(2, ErrorWrapping::ExceptReqwest, None, Vec::new());
    let exchange = client
        .get(server.url("/simple/anyio/"))
        .send_with_history()
        .await;
    let outcome = exchange.outcome.unwrap();
    assert_eq!(
        (outcome.retries(), outcome.stop),
        (2, StopReason::RetriesExhausted)
    );
    assert_eq!(exchange.history.len(), 3);
    assert_eq!(from_exchange(exchange).unwrap().status(), 503);
    assert_eq!(server.requests_seen(), 3);
}

#[tokio::test(start_paused = true)]
async fn uvs_publish_post_refused_is_retried_and_one_that_reached_the_server_is_not() {
    let client = uv_client(3, ErrorWrapping::ExceptReqwest, None, Vec::new());
    let dead = HeldRefusedPort::new();
    let err = from_exchange(
        client
            .post(dead.url("/legacy/"))
            .body("upload")
            .send_with_history()
            .await,
    )
    .unwrap_err();
    assert_eq!(err.retries, 3);
    let server = FaultServer::always(Action::ReadThenReset).await;
    let exchange = client
        .post(server.url("/legacy/"))
        .body("upload")
        .send_with_history()
        .await;
    assert_eq!(
        exchange.outcome.unwrap().stop,
        StopReason::MayHaveBeenProcessed
    );
    assert_eq!(from_exchange(exchange).unwrap_err().retries, 0);
    assert_eq!(server.requests_seen(), 1);
}

#[tokio::test(start_paused = true)]
async fn uvs_error_conversion_reads_the_count_from_a_wrapped_error_and_strips_it() {
    let client = uv_client(3, ErrorWrapping::Always, None, Vec::new());
    let dead = HeldRefusedPort::new();
    let err = client.get(dead.url("/simple/")).send().await.unwrap_err();
    assert!(matches!(
        ResilienceError::from_middleware_error_astral(&err),
        Some(ResilienceError::Retry(r)) if r.attempts() == 4 && r.is_connect()
    ));
    // The cause, as on the crates.io path: the Retry itself, its last error being reqwest's.
    assert!(matches!(
        ResilienceError::find_astral(&err),
        Some(ResilienceError::Retry(r)) if r.attempts() == 4
    ));
    let uv = from_wrapped(err);
    assert_eq!(uv.retries, 3);
    assert!(
        matches!(&uv.error, reqwest_middleware::Error::Reqwest(e) if e.is_connect()),
        "{:?}",
        uv.error
    );
}

#[tokio::test(start_paused = true)]
async fn uvs_client_with_a_breaker_finds_the_cause_and_the_count_through_the_fork() {
    let registry = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let server = FaultServer::always(Action::status(500)).await;
    let client = uv_client(0, ErrorWrapping::ExceptReqwest, Some(registry), Vec::new());
    for _ in 0..5 {
        let response = client.get(server.url("/")).send().await.unwrap();
        assert_eq!(response.status(), 500);
    }
    let exchange = client.get(server.url("/")).send_with_history().await;
    let err = exchange.result.unwrap_err();
    assert!(matches!(
        ResilienceError::find_astral(&err),
        Some(ResilienceError::BreakerOpen { .. })
    ));
    assert!(matches!(
        ResilienceError::from_middleware_error_astral(&err),
        Some(ResilienceError::Retry(r)) if r.attempts() == 1
    ));
    assert_eq!(server.requests_seen(), 5);
}

#[tokio::test(start_paused = true)]
async fn both_paths_give_the_same_answers_for_the_same_failure() {
    // The crates.io client and the fork's, the same stack: the same outcome, the same
    // errors found.
    let stack = || {
        Resilience::like_reqwest_retry().retry(
            RetryMiddleware::like_reqwest_retry()
                .max_retries(2)
                .error_wrapping(ErrorWrapping::Always),
        )
    };
    let builder = || {
        reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
    };
    let ours = stack().build_from(builder()).unwrap();
    let theirs = stack().build_from_astral(builder()).unwrap();
    let dead = HeldRefusedPort::new();
    let a = ours.post(dead.url("/")).body("x").send_with_history().await;
    let b = theirs
        .post(dead.url("/"))
        .body("x")
        .send_with_history()
        .await;
    assert_eq!(
        a.outcome.map(|o| (o.attempts, o.stop)),
        Some((3, StopReason::RetriesExhausted))
    );
    assert_eq!(
        a.outcome.map(|o| (o.attempts, o.stop)),
        b.outcome.map(|o| (o.attempts, o.stop))
    );
    assert_eq!(a.history.len(), b.history.len());
    let (a, b) = (a.result.unwrap_err(), b.result.unwrap_err());
    let attempts = |e: Option<&ResilienceError>| match e {
        Some(ResilienceError::Retry(r)) => Some((r.attempts(), r.stop_reason(), r.is_connect())),
        _ => None,
    };
    assert_eq!(
        attempts(ResilienceError::from_middleware_error(&a)),
        Some((3, StopReason::RetriesExhausted, true))
    );
    assert_eq!(
        attempts(ResilienceError::from_middleware_error(&a)),
        attempts(ResilienceError::from_middleware_error_astral(&b))
    );
    assert_eq!(
        attempts(ResilienceError::find(&a)),
        attempts(ResilienceError::find_astral(&b))
    );
    let (a, b) = (retry_of(a), retry_of_astral(b));
    assert!(a.into_last_error().is_connect());
    assert!(b.into_last_error_astral().is_connect());
}

fn retry_of(err: reqwest_middleware_crates::Error) -> reqwest_resilience::retry::RetryError {
    let reqwest_middleware_crates::Error::Middleware(e) = err else {
        panic!("{err:?}")
    };
    match e.downcast::<ResilienceError>() {
        Ok(ResilienceError::Retry(r)) => r,
        other => panic!("{other:?}"),
    }
}

fn retry_of_astral(err: reqwest_middleware::Error) -> reqwest_resilience::retry::RetryError {
    let reqwest_middleware::Error::Middleware(e) = err else {
        panic!("{err:?}")
    };
    match e.downcast::<ResilienceError>() {
        Ok(ResilienceError::Retry(r)) => r,
        other => panic!("{other:?}"),
    }
}
