//! Retries seen while they happen (the `before_sleep` hook) and after a failed `send()`
//! (`send_with_history`: the attempt count and stop reason beside reqwest's own error), and
//! per-request settings set on the builder that reach the stack.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Extensions, StatusCode};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::redirect::{self, ClientRedirects};
use reqwest_resilience::retry::{
    Deadline, RetryMiddlewareBuilder, RetryOutcome, RetryReason, StopReason,
};
use reqwest_resilience::{SendWithHistory, Transmission, TransportEvidence};
use support::{Action, FaultServer, exact_retry, refused_port};

fn client_with(retry: RetryMiddlewareBuilder) -> ClientWithMiddleware {
    let reqwest = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
        .build()
        .unwrap();
    ClientBuilder::new(reqwest)
        .with(retry.build().unwrap())
        .with(TransportEvidence::with_client_redirects(
            ClientRedirects::Recorded,
        ))
        .build()
}

/// What one call of the hook saw.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    attempt: u32,
    status: Option<StatusCode>,
    error: Option<(bool, Vec<String>)>,
    transmission: Transmission,
    reason: RetryReason,
    delay: Duration,
    /// tokio's clock when the hook ran, from the request's start.
    at: Duration,
    path: Option<String>,
}

fn recording_retry(calls: &Arc<Mutex<Vec<Seen>>>) -> RetryMiddlewareBuilder {
    let calls = calls.clone();
    let start = tokio::time::Instant::now();
    exact_retry().before_sleep(move |n| {
        let error = n.error.map(|e| {
            let connect = reqwest_resilience::chain::find::<reqwest::Error>(e)
                .is_some_and(|r| r.is_connect());
            (connect, n.error_messages())
        });
        calls.lock().unwrap().push(Seen {
            attempt: n.attempt,
            status: n.status,
            error,
            transmission: n.evidence.transmission,
            reason: n.reason,
            delay: n.delay,
            at: start.elapsed(),
            path: n.url.map(|u| u.path().to_owned()),
        });
    })
}

#[tokio::test(start_paused = true)]
async fn the_hook_runs_before_each_sleep_with_the_status_the_reason_and_the_delay() {
    let server = FaultServer::sequence(
        vec![Action::status(503), Action::status(502)],
        Action::ok("ok"),
    )
    .await;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let client = client_with(recording_retry(&calls));
    let response = client.get(server.url("/simple/uv/")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let s = Duration::from_secs;
    let seen = |attempt, code: u16, delay, at| Seen {
        attempt,
        status: Some(StatusCode::from_u16(code).unwrap()),
        error: None,
        transmission: Transmission::ResponseReceived(StatusCode::from_u16(code).unwrap()),
        reason: RetryReason::Status(StatusCode::from_u16(code).unwrap()),
        delay,
        at,
        path: Some("/simple/uv/".to_owned()),
    };
    // Before the 1 s sleep (at 0 s) and before the 2 s sleep (at 1 s); none after the 200.
    assert_eq!(
        *calls.lock().unwrap(),
        [seen(1, 503, s(1), s(0)), seen(2, 502, s(2), s(1))]
    );
    assert_eq!(server.requests_seen(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_hook_sees_the_error_of_a_refused_post_and_send_with_history_keeps_reqwests_error() {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let client = client_with(recording_retry(&calls));
    let url = format!("http://127.0.0.1:{}/upload", refused_port());
    let exchange = client.post(&url).body("wheel").send_with_history().await;

    // The error is reqwest's own, unwrapped: its questions answer as without the stack.
    let err = exchange.result.expect_err("nothing listens");
    assert!(err.is_connect(), "{err:?}");
    assert!(!err.is_timeout());
    assert_eq!(err.status(), None);
    // And how it ended is beside it.
    let outcome = exchange.outcome.expect("the retry middleware ran");
    assert_eq!(
        (outcome.attempts, outcome.retries(), outcome.stop),
        (4, 3, StopReason::RetriesExhausted)
    );
    assert_eq!(exchange.history.len(), 4);

    let calls = calls.lock().unwrap().clone();
    let s = Duration::from_secs;
    let expected: Vec<(u32, Duration, Duration)> =
        vec![(1, s(1), s(0)), (2, s(2), s(1)), (3, s(4), s(3))];
    assert_eq!(
        calls
            .iter()
            .map(|c| (c.attempt, c.delay, c.at))
            .collect::<Vec<_>>(),
        expected
    );
    for c in &calls {
        assert_eq!(
            (c.transmission, c.reason, c.status),
            (Transmission::NotSent, RetryReason::NotSent, None)
        );
        let (connect, messages) = c.error.clone().expect("an error");
        assert!(connect);
        assert_eq!(
            messages[0],
            format!("error sending request for url ({url})")
        );
        // The chain below it, as uv prints it after "Caused by:" (Linux's text for
        // ECONNREFUSED).
        assert_eq!(
            messages[1..],
            [
                "client error (Connect)",
                "tcp connect error",
                "Connection refused (os error 111)"
            ]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_deadline_set_with_with_extension_is_honoured_by_send_with_history() {
    let server = FaultServer::always(Action::status(503)).await;
    let client = client_with(exact_retry());
    // Attempts at 0 s and 1 s; the next would start at 3 s, past the 2.5 s deadline.
    let exchange = client
        .get(server.url("/"))
        .with_extension(Deadline::after(Duration::from_millis(2500)))
        .send_with_history()
        .await;
    assert_eq!(exchange.result.unwrap().status(), 503);
    let outcome = exchange.outcome.expect("an outcome");
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (2, StopReason::DeadlineExceeded)
    );
    assert_eq!(exchange.history.len(), 2);
    // The builder's extension is handed back with the others.
    assert!(exchange.extensions.get::<Deadline>().is_some());
    assert_eq!(server.requests_seen(), 2);

    // The way that loses it: `build()` drops the builder's extensions.
    let request = client
        .get(server.url("/"))
        .with_extension(Deadline::after(Duration::from_millis(2500)))
        .build()
        .unwrap();
    let mut extensions = Extensions::new();
    let response = client
        .execute_with_extensions(request, &mut extensions)
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let outcome = RetryOutcome::of(&extensions).copied().expect("an outcome");
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (4, StopReason::RetriesExhausted)
    );
    assert_eq!(server.requests_seen(), 6);
}

#[tokio::test(start_paused = true)]
async fn the_composed_stack_takes_a_strategy_and_a_hook_on_its_retry_which_replaces_a_prebuilt_one()
{
    use reqwest_resilience::retry::strategies::UvTransient;
    use reqwest_resilience::{Backoff, Jitter, Resilience, RetryMiddleware};

    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = calls.clone();
    let client = Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .backoff(Backoff::builder().jitter(Jitter::None).build().unwrap())
                .no_budget()
                .strategy(UvTransient)
                .before_sleep(move |n| c.lock().unwrap().push((n.attempt, n.status, n.delay))),
        )
        .build(support::loopback_client())
        .unwrap();
    // uv's rules retry a 507, which the default table does not.
    let server = FaultServer::sequence(vec![Action::status(507)], Action::ok("ok")).await;
    let exchange = client.get(server.url("/")).send_with_history().await;
    assert_eq!(exchange.result.unwrap().status(), 200);
    assert_eq!(
        *calls.lock().unwrap(),
        [(
            1,
            Some(StatusCode::INSUFFICIENT_STORAGE),
            Duration::from_secs(1)
        )]
    );
    assert_eq!(exchange.outcome.map(|o| o.attempts), Some(2));

    // What was a conflict (a strategy beside a prebuilt retry, refused) cannot be
    // written: the strategy is set on the retry, and a later `.retry(..)` replaces an
    // earlier prebuilt one whole, so the strategy applies.
    let replaced = Resilience::new()
        .retry(RetryMiddleware::new())
        .retry(
            RetryMiddleware::builder()
                .backoff(Backoff::builder().jitter(Jitter::None).build().unwrap())
                .no_budget()
                .strategy(UvTransient),
        )
        .build(support::loopback_client())
        .unwrap();
    let server = FaultServer::sequence(vec![Action::status(507)], Action::ok("ok")).await;
    let exchange = replaced.get(server.url("/")).send_with_history().await;
    assert_eq!(exchange.result.unwrap().status(), 200);
    assert_eq!(exchange.outcome.map(|o| o.attempts), Some(2));
}
