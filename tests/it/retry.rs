//! The retry middleware against real loopback servers, with tokio's clock paused.
//!
//! Paused clock + real sockets: tokio auto-advances to the next timer whenever the runtime
//! is idle, which turns the retry sleeps into exact virtual time. The clients here set no
//! reqwest timeout and no pool idle timer (except the one test about timeouts), so the only
//! timers are the middleware's own sleeps and the elapsed virtual time is exactly their sum.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use reqwest_resilience::backoff::SeededRandom;
use reqwest_resilience::chain;
use reqwest_resilience::redirect::{self, ClientRedirects};
use reqwest_resilience::retry::{
    Deadline, Idempotent, MaxRetries, RetryAfterPolicy, RetryError, RetryOutcome, RetryReason,
    StopReason,
};
use reqwest_resilience::{
    AttemptDecision, AttemptHistory, Backoff, FailureKind, Jitter, Origin, RequestEvidence,
    ResilienceError, RetryBudget, RetryMiddleware, Transmission, TransportEvidence,
};
use support::{Action, FaultServer, refused_port};
use tokio::time::Instant;

const S: fn(u64) -> Duration = Duration::from_secs;

/// 1 s, 2 s, 4 s … without jitter, no budget, 3 retries, every final error wrapped in
/// `ResilienceError::Retry` (these tests read the attempt count from it; the default,
/// which keeps a `reqwest::Error` unwrapped, has tests of its own).
fn plain() -> reqwest_resilience::retry::RetryMiddlewareBuilder {
    RetryMiddleware::builder()
        .backoff(Backoff::builder().jitter(Jitter::None).build().unwrap())
        .no_budget()
        .wrap_errors(true)
}

/// Its redirects are recorded, so a failure without a redirect is proven the first hop's
/// (tests/it/redirect.rs covers the other client setups).
fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        // No idle-pool timer: with a paused clock it would be the "next timer" tokio jumps to.
        .pool_idle_timeout(None)
        .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
        .build()
        .unwrap()
}

fn client(retry: RetryMiddleware) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest_client())
        .with(retry)
        .with(TransportEvidence::with_client_redirects(
            ClientRedirects::Recorded,
        ))
        .build()
}

/// Sends `request` with caller-side extensions, returning the outcome, the extensions and
/// the virtual time it took.
async fn send(
    client: &ClientWithMiddleware,
    request: reqwest_middleware::RequestBuilder,
    extensions: Extensions,
) -> (
    reqwest_middleware::Result<reqwest::Response>,
    Extensions,
    Duration,
) {
    let mut request = request;
    // `with_extension` values live in the builder; `send()` would take them the same way.
    let mut ext = std::mem::take(request.extensions());
    ext.extend(extensions);
    let req = request.build().unwrap();
    let t0 = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(3600),
        client.execute_with_extensions(req, &mut ext),
    )
    .await
    .expect("the request finished");
    (result, ext, t0.elapsed())
}

fn outcome(ext: &Extensions) -> RetryOutcome {
    *RetryOutcome::of(ext).expect("a RetryOutcome in the caller's extensions")
}

fn decisions(ext: &Extensions) -> Vec<AttemptDecision> {
    AttemptHistory::of(ext)
        .expect("an attempt history")
        .attempts()
        .iter()
        .map(|r| r.decision.clone().expect("a decision after every attempt"))
        .collect()
}

fn evidence(ext: &Extensions) -> Vec<(Transmission, Option<FailureKind>)> {
    AttemptHistory::of(ext)
        .expect("an attempt history")
        .attempts()
        .iter()
        .map(|r| (r.evidence.transmission, r.evidence.failure))
        .collect()
}

fn retry_error(err: &reqwest_middleware::Error) -> &RetryError {
    match ResilienceError::from_middleware_error(err) {
        Some(ResilienceError::Retry(e)) => e,
        other => panic!("expected ResilienceError::Retry, got {other:?} from {err:?}"),
    }
}

/// The time taken is the recorded sleeps: tokio's timer has 1 ms ticks, so each sleep ends
/// on the first tick at or after its deadline.
fn assert_slept(took: Duration, delays: &[Duration]) {
    let sum: Duration = delays.iter().sum();
    let slack = Duration::from_millis(delays.len() as u64);
    assert!(
        took >= sum && took <= sum + slack,
        "took {took:?} for {delays:?}"
    );
}

fn retry(delay: Duration, reason: RetryReason) -> AttemptDecision {
    AttemptDecision::Retry { delay, reason }
}

fn stop(reason: StopReason) -> AttemptDecision {
    AttemptDecision::Stop { reason }
}

const R503: RetryReason = RetryReason::Status(http::StatusCode::SERVICE_UNAVAILABLE);

// ---------------------------------------------------------------------------------------
// Delays

#[tokio::test(start_paused = true)]
async fn get_503_is_retried_after_exactly_1_2_4_seconds_then_the_last_503_is_returned() {
    let server = FaultServer::always(Action::status(503)).await;
    let c = client(plain().build().unwrap());
    let (res, ext, took) = send(&c, c.get(server.url("/")), Extensions::new()).await;
    let res = res.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(server.requests_seen(), 4);
    assert_eq!(took, S(7));
    assert_eq!(
        decisions(&ext),
        [
            retry(S(1), R503),
            retry(S(2), R503),
            retry(S(4), R503),
            stop(StopReason::RetriesExhausted)
        ]
    );
    let expected = outcome(&ext);
    assert_eq!(expected.attempts, 4);
    assert_eq!(expected.resend_count(), 3);
    assert_eq!(expected.stop, StopReason::RetriesExhausted);
    assert_eq!(RetryOutcome::of(res.extensions()), Some(&expected));
}

#[tokio::test(start_paused = true)]
async fn success_after_two_503s_reports_three_attempts_on_the_response() {
    let server = FaultServer::sequence(
        vec![Action::status(503), Action::status(503)],
        Action::ok("done"),
    )
    .await;
    let c = client(
        plain()
            .backoff(
                Backoff::builder()
                    .base(Duration::from_millis(100))
                    .factor(3.0)
                    .jitter(Jitter::None)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap(),
    );
    let res = tokio::time::timeout(S(60), c.get(server.url("/")).send())
        .await
        .unwrap()
        .unwrap();
    let o = *RetryOutcome::of(res.extensions()).unwrap();
    assert_eq!((res.status().as_u16(), o.attempts), (200, 3));
    assert_eq!(o.stop, StopReason::FinalResponse(http::StatusCode::OK));
    assert_eq!(res.text().await.unwrap(), "done");
    assert_eq!(server.requests_seen(), 3);
}

#[tokio::test(start_paused = true)]
async fn seeded_proportional_jitter_keeps_each_sleep_within_ten_percent() {
    let server = FaultServer::always(Action::status(503)).await;
    let c = client(
        RetryMiddleware::builder()
            .no_budget()
            .random_source(Arc::new(SeededRandom::new(42)))
            .build()
            .unwrap(),
    );
    let (_, ext, took) = send(&c, c.get(server.url("/")), Extensions::new()).await;
    let delays: Vec<Duration> = decisions(&ext)
        .into_iter()
        .filter_map(|d| match d {
            AttemptDecision::Retry { delay, .. } => Some(delay),
            _ => None,
        })
        .collect();
    assert_eq!(delays.len(), 3);
    for (d, nominal) in delays.iter().zip([1.0, 2.0, 4.0]) {
        let secs = d.as_secs_f64();
        assert!(secs >= nominal * 0.9 && secs < nominal * 1.1, "{d:?}");
    }
    assert_slept(took, &delays);
}

// ---------------------------------------------------------------------------------------
// Retry-After

/// A server answering the first request with `status` and `Retry-After: value`, then 200.
async fn retry_after_server(
    status: u16,
    value: impl Fn() -> String + Send + Sync + 'static,
) -> FaultServer {
    FaultServer::start(move |i, _| {
        if i == 0 {
            Action::status(status).header("retry-after", &value())
        } else {
            Action::ok("ok")
        }
    })
    .await
}

/// Sends `request`, expects a 200 on the second attempt, and returns the sleep taken.
async fn sleep_taken_before_success(
    c: &ClientWithMiddleware,
    request: reqwest_middleware::RequestBuilder,
    server: &FaultServer,
) -> Duration {
    let (res, ext, took) = send(c, request, Extensions::new()).await;
    assert_eq!(res.unwrap().status(), 200);
    assert_eq!(server.requests_seen(), 2);
    assert_eq!(outcome(&ext).attempts, 2);
    match decisions(&ext)[0] {
        AttemptDecision::Retry { delay, .. } => assert_slept(took, &[delay]),
        ref other => panic!("{other:?}"),
    }
    took
}

/// Both throttling statuses, each as a GET and a POST (a POST is retried on 429 always and
/// on 503 because it carries `Retry-After`).
const THROTTLED: [u16; 2] = [429, 503];

async fn sleep_taken_for(
    status: u16,
    value: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> [Duration; 2] {
    let mut taken = [Duration::ZERO; 2];
    for (i, post) in [false, true].into_iter().enumerate() {
        let server = retry_after_server(status, value.clone()).await;
        let c = client(plain().build().unwrap());
        let request = if post {
            c.post(server.url("/")).body("x")
        } else {
            c.get(server.url("/"))
        };
        taken[i] = sleep_taken_before_success(&c, request, &server).await;
    }
    taken
}

#[tokio::test(start_paused = true)]
async fn retry_after_seconds_is_the_sleep_taken() {
    for status in THROTTLED {
        assert_eq!(
            sleep_taken_for(status, || "3".into()).await,
            [S(3); 2],
            "{status}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_imf_date_is_the_sleep_taken() {
    for status in THROTTLED {
        let taken =
            sleep_taken_for(status, || httpdate::fmt_http_date(SystemTime::now() + S(6))).await;
        // An HTTP date has whole seconds: 6 s ahead, minus the sub-second part of "now".
        for took in taken {
            assert!(took > S(4) && took <= S(6), "{status}: {took:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_numeric_zone_date_is_the_sleep_taken() {
    for status in THROTTLED {
        let taken = sleep_taken_for(status, || {
            // The same instant written as local time at +0800.
            let local = SystemTime::now() + S(6) + S(8 * 3600);
            httpdate::fmt_http_date(local).replace(" GMT", " +0800")
        })
        .await;
        for took in taken {
            assert!(took > S(4) && took <= S(6), "{status}: {took:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_120_seconds_is_clamped_to_60() {
    for status in THROTTLED {
        assert_eq!(
            sleep_taken_for(status, || "120".into()).await,
            [S(60); 2],
            "{status}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_120_seconds_with_give_up_returns_the_response_at_once() {
    for status in THROTTLED {
        let server = retry_after_server(status, || "120".into()).await;
        let c = client(
            plain()
                .retry_after_cap(S(60), RetryAfterPolicy::GiveUp)
                .build()
                .unwrap(),
        );
        let (res, ext, took) = send(&c, c.get(server.url("/")), Extensions::new()).await;
        let res = res.unwrap();
        assert_eq!(res.status().as_u16(), status);
        assert_eq!(res.headers()["retry-after"], "120");
        assert_eq!((server.requests_seen(), took), (1, Duration::ZERO));
        assert_eq!(outcome(&ext).stop, StopReason::RetryAfterTooLong);
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_garbage_is_ignored_and_the_backoff_applies() {
    // A GET: garbage is no `Retry-After`, so a POST 503 would not be retried at all.
    for status in THROTTLED {
        let server = retry_after_server(status, || "soon, maybe".into()).await;
        let c = client(plain().build().unwrap());
        let took = sleep_taken_before_success(&c, c.get(server.url("/")), &server).await;
        assert_eq!(took, S(1), "{status}");
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_zero_and_past_dates_fall_back_to_the_backoff() {
    for status in THROTTLED {
        for value in ["0", "Wed, 21 Oct 2015 07:28:00 GMT"] {
            assert_eq!(
                sleep_taken_for(status, move || value.into()).await,
                [S(1); 2],
                "{status} {value}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// The decision table, one row per test, each against a server that counts executions.

#[tokio::test(start_paused = true)]
async fn post_after_read_then_close_is_executed_exactly_once() {
    let server = FaultServer::sequence(vec![Action::ReadThenClose], Action::ok("again")).await;
    let c = client(plain().build().unwrap());
    let (res, ext, took) = send(
        &c,
        c.post(server.url("/pay")).body("€10"),
        Extensions::new(),
    )
    .await;
    let err = res.unwrap_err();
    assert_eq!(server.requests_seen(), 1);
    assert_eq!(took, Duration::ZERO);
    let e = retry_error(&err);
    assert_eq!(
        (e.attempts(), e.stop_reason()),
        (1, StopReason::MayHaveBeenProcessed)
    );
    assert_eq!(evidence(&ext)[0].0, Transmission::SentNoResponse);
}

#[tokio::test(start_paused = true)]
async fn post_to_a_refused_port_is_retried_until_the_server_comes_up() {
    let port = refused_port();
    // The server appears on that port during the first backoff sleep.
    let starter = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        FaultServer::try_start_on(
            [127, 0, 0, 1].into(),
            port,
            |_| None,
            |_, _| Action::ok("created"),
        )
        .await
        .expect("rebind the refused port")
    });
    let c = client(plain().build().unwrap());
    let url = format!("http://127.0.0.1:{port}/jobs");
    let (res, ext, took) = send(&c, c.post(url).body("job"), Extensions::new()).await;
    let server = starter.await.unwrap();
    let res = res.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        server.requests_seen(),
        1,
        "the POST was executed exactly once"
    );
    assert_eq!(took, S(1));
    assert_eq!(
        evidence(&ext),
        [
            (Transmission::NotSent, Some(FailureKind::Connect)),
            (Transmission::ResponseReceived(http::StatusCode::OK), None)
        ]
    );
    assert_eq!(decisions(&ext)[0], retry(S(1), RetryReason::NotSent));
}

#[tokio::test(start_paused = true)]
async fn post_to_a_port_that_stays_refused_gives_up_with_a_connect_error() {
    let c = client(plain().max_retries(2).build().unwrap());
    let url = format!("http://127.0.0.1:{}/jobs", refused_port());
    let (res, _, took) = send(&c, c.post(url).body("job"), Extensions::new()).await;
    let err = res.unwrap_err();
    let e = retry_error(&err);
    assert_eq!(
        (e.attempts(), e.stop_reason()),
        (3, StopReason::RetriesExhausted)
    );
    assert!(e.is_connect());
    assert!(chain::find::<reqwest::Error>(&err).is_some_and(|r| r.is_connect()));
    assert_eq!(took, S(3));
}

#[tokio::test(start_paused = true)]
async fn put_after_reset_is_retried() {
    let server = FaultServer::sequence(vec![Action::ReadThenReset], Action::ok("stored")).await;
    let c = client(plain().build().unwrap());
    let (res, ext, took) = send(&c, c.put(server.url("/doc")).body("v2"), Extensions::new()).await;
    assert_eq!(res.unwrap().status(), 200);
    assert_eq!((server.requests_seen(), took), (2, S(1)));
    assert_eq!(evidence(&ext)[0].0, Transmission::SentNoResponse);
    assert_eq!(decisions(&ext)[0], retry(S(1), RetryReason::Transient));
}

#[tokio::test(start_paused = true)]
async fn post_after_reset_is_not_retried() {
    let server = FaultServer::sequence(vec![Action::ReadThenReset], Action::ok("again")).await;
    let c = client(plain().build().unwrap());
    let (res, _, _) = send(&c, c.post(server.url("/pay")).body("x"), Extensions::new()).await;
    let err = res.unwrap_err();
    assert_eq!(server.requests_seen(), 1);
    assert_eq!(
        retry_error(&err).stop_reason(),
        StopReason::MayHaveBeenProcessed
    );
}

#[tokio::test(start_paused = true)]
async fn post_with_an_idempotency_key_after_read_then_close_is_retried() {
    let server = FaultServer::sequence(vec![Action::ReadThenClose], Action::ok("paid")).await;
    let c = client(plain().build().unwrap());
    let req = c
        .post(server.url("/pay"))
        .header("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
        .body("€10");
    let (res, _, took) = send(&c, req, Extensions::new()).await;
    assert_eq!(res.unwrap().status(), 200);
    assert_eq!((server.requests_seen(), took), (2, S(1)));
    let keys: Vec<_> = server
        .requests()
        .iter()
        .map(|r| r.header("idempotency-key").map(str::to_owned))
        .collect();
    assert_eq!(keys[0], keys[1], "the same key on both executions");
}

#[tokio::test(start_paused = true)]
async fn post_marked_idempotent_per_request_is_retried_and_get_marked_unsafe_is_not() {
    let server = FaultServer::start(|i, _| {
        if i % 2 == 0 {
            Action::ReadThenClose
        } else {
            Action::ok("ok")
        }
    })
    .await;
    let c = client(plain().build().unwrap());
    let req = c
        .post(server.url("/"))
        .body("x")
        .with_extension(Idempotent(true));
    let (res, _, _) = send(&c, req, Extensions::new()).await;
    assert_eq!(res.unwrap().status(), 200);
    assert_eq!(server.requests_seen(), 2);

    let req = c.get(server.url("/")).with_extension(Idempotent(false));
    let (res, _, _) = send(&c, req, Extensions::new()).await;
    assert_eq!(
        retry_error(&res.unwrap_err()).stop_reason(),
        StopReason::MayHaveBeenProcessed
    );
    assert_eq!(server.requests_seen(), 3);
}

#[tokio::test(start_paused = true)]
async fn post_503_is_returned_at_once_without_retry_after_and_retried_with_it() {
    let server = FaultServer::always(Action::status(503)).await;
    let c = client(plain().build().unwrap());
    let (res, ext, _) = send(&c, c.post(server.url("/")).body("x"), Extensions::new()).await;
    assert_eq!(res.unwrap().status(), 503);
    assert_eq!(server.requests_seen(), 1);
    assert_eq!(
        outcome(&ext).stop,
        StopReason::StatusNotSafe(http::StatusCode::SERVICE_UNAVAILABLE)
    );

    let server = retry_after_server(503, || "2".into()).await;
    let took = sleep_taken_before_success(&c, c.post(server.url("/")).body("x"), &server).await;
    assert_eq!(took, S(2));
}

#[tokio::test(start_paused = true)]
async fn get_404_and_200_are_final_after_one_request() {
    for (status, code) in [(404, 404u16), (200, 200)] {
        let server = FaultServer::always(Action::status(status)).await;
        let c = client(plain().build().unwrap());
        let (res, ext, _) = send(&c, c.get(server.url("/")), Extensions::new()).await;
        assert_eq!(res.unwrap().status().as_u16(), code);
        assert_eq!(server.requests_seen(), 1);
        assert_eq!(
            outcome(&ext).stop,
            StopReason::FinalResponse(http::StatusCode::from_u16(code).unwrap())
        );
    }
}

#[tokio::test(start_paused = true)]
async fn post_refused_by_http2_refused_stream_is_retried_at_once_up_to_its_own_cap() {
    use support::h2::{H2Action, H2Server};
    let server = H2Server::start(|_| H2Action::RefuseStream).await;
    let c = ClientBuilder::new(
        reqwest::Client::builder()
            .no_proxy()
            .pool_idle_timeout(None)
            .http2_prior_knowledge()
            // reqwest 0.13 replays REFUSED_STREAM itself (twice) inside one attempt; off, so
            // the server's count shows this middleware's decisions alone.
            .retry(reqwest::retry::never())
            .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
            .build()
            .unwrap(),
    )
    .with(plain().build().unwrap())
    .with(TransportEvidence::with_client_redirects(
        ClientRedirects::Recorded,
    ))
    .build();
    let (res, ext, took) = send(&c, c.post(server.url("/")).body("x"), Extensions::new()).await;
    let err = res.unwrap_err();
    // Five retries (the default cap), each at once and outside max_retries (3).
    assert_eq!(server.requests_seen(), 6);
    assert_eq!(took, Duration::ZERO);
    let mut want = vec![retry(Duration::ZERO, RetryReason::NotProcessed); 5];
    want.push(stop(StopReason::NotProcessedRetryUsed));
    assert_eq!(decisions(&ext), want);
    assert_eq!(retry_error(&err).attempts(), 6);
}

/// An h2c client with reqwest's own retries off, under `retry`.
fn h2_client(retry: RetryMiddleware) -> ClientWithMiddleware {
    ClientBuilder::new(
        reqwest::Client::builder()
            .no_proxy()
            .pool_idle_timeout(None)
            .http2_prior_knowledge()
            .retry(reqwest::retry::never())
            .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
            .build()
            .unwrap(),
    )
    .with(retry)
    .with(TransportEvidence::with_client_redirects(
        ClientRedirects::Recorded,
    ))
    .build()
}

/// Refused four times, then answered: at once, and not counted against `max_retries` (3).
async fn refused_four_times_then_answered(refusal: support::h2::H2Action) -> support::h2::H2Server {
    support::h2::H2Server::start(move |i| {
        if i < 4 {
            refusal
        } else {
            support::h2::H2Action::Respond(200)
        }
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn post_refused_four_times_then_answered_is_delivered_at_once_outside_max_retries() {
    let server = refused_four_times_then_answered(support::h2::H2Action::RefuseStream).await;
    let c = h2_client(plain().build().unwrap());
    let (res, ext, took) = send(&c, c.post(server.url("/")).body("x"), Extensions::new()).await;
    assert_eq!(res.unwrap().status(), 200);
    assert_eq!(server.requests_seen(), 5);
    assert_eq!(took, Duration::ZERO, "no backoff");
    let mut want = vec![retry(Duration::ZERO, RetryReason::NotProcessed); 4];
    want.push(stop(StopReason::FinalResponse(http::StatusCode::OK)));
    assert_eq!(decisions(&ext), want);
    assert_eq!(outcome(&ext).attempts, 5);
}

/// A `GOAWAY` is no proof through hyper (it also fails a stream hyper had written, which
/// nginx was seen to process): a GET rotated four times is sent again at once, outside
/// `max_retries`, each time on a new connection; a POST is sent once.
#[tokio::test(start_paused = true)]
async fn a_get_rotated_four_times_is_delivered_at_once_and_a_post_is_sent_once() {
    let server = refused_four_times_then_answered(support::h2::H2Action::GoAwayBelow).await;
    let c = h2_client(plain().build().unwrap());
    let (res, ext, took) = send(&c, c.get(server.url("/")), Extensions::new()).await;
    assert_eq!(res.unwrap().status(), 200);
    assert_eq!(server.requests_seen(), 5);
    assert_eq!(server.connections(), 5, "each GOAWAY ends its connection");
    assert_eq!(took, Duration::ZERO, "no backoff");
    let mut want = vec![retry(Duration::ZERO, RetryReason::GoAway); 4];
    want.push(stop(StopReason::FinalResponse(http::StatusCode::OK)));
    assert_eq!(decisions(&ext), want);
    assert_eq!(outcome(&ext).attempts, 5);

    let server = refused_four_times_then_answered(support::h2::H2Action::GoAwayBelow).await;
    let (res, ext, took) = send(&c, c.post(server.url("/")).body("x"), Extensions::new()).await;
    assert_eq!(
        retry_error(&res.unwrap_err()).stop_reason(),
        StopReason::MayHaveBeenProcessed
    );
    assert_eq!(server.requests_seen(), 1);
    assert_eq!(took, Duration::ZERO);
    assert_eq!(
        evidence(&ext),
        [(Transmission::Unknown, Some(FailureKind::GoAway))]
    );
}

#[tokio::test(start_paused = true)]
async fn not_processed_retries_have_a_configurable_cap_and_max_retries_0_disables_them() {
    use support::h2::{H2Action, H2Server};
    let refusing = H2Server::start(|_| H2Action::RefuseStream).await;
    let c = h2_client(plain().max_not_processed_retries(2).build().unwrap());
    let (res, ext, _) = send(&c, c.post(refusing.url("/")).body("x"), Extensions::new()).await;
    assert_eq!(refusing.requests_seen(), 3);
    assert_eq!(
        retry_error(&res.unwrap_err()).stop_reason(),
        StopReason::NotProcessedRetryUsed
    );
    assert_eq!(decisions(&ext).len(), 3);
    // Past the cap (shared by refused streams and rotations), a GET goes on with ordinary
    // (counted, backed-off) retries.
    let rotating = H2Server::start(|_| H2Action::GoAwayBelow).await;
    let c = h2_client(plain().max_not_processed_retries(1).build().unwrap());
    let (_, ext, took) = send(&c, c.get(rotating.url("/")), Extensions::new()).await;
    assert_eq!(rotating.requests_seen(), 5);
    assert_eq!(took, S(1 + 2 + 4));
    assert_eq!(outcome(&ext).stop, StopReason::RetriesExhausted);
    assert_eq!(
        decisions(&ext)[0],
        retry(Duration::ZERO, RetryReason::GoAway)
    );
    let c = h2_client(plain().max_retries(0).build().unwrap());
    let (_, ext, _) = send(&c, c.post(refusing.url("/")).body("x"), Extensions::new()).await;
    assert_eq!(refusing.requests_seen(), 3 + 1);
    assert_eq!(outcome(&ext).stop, StopReason::RetriesExhausted);
}

/// Issue 29, finding 13: an operation over a plain client (no middleware in it) against a
/// server that sends `GOAWAY(last_stream_id 0)` on every stream. Before: each rotation was
/// counted in `retries` but checked only against the not-processed cap, which never rose,
/// so it ran for ever (here: until the server gave in after 50). Now: as the middleware's
/// own loop, 5 rotations at once under the not-processed cap, then `max_retries` (2)
/// ordinary retries: 8 requests.
#[tokio::test(start_paused = true)]
async fn an_operation_rotated_on_every_stream_stops_where_the_middleware_stops() {
    use support::h2::{H2Action, H2Server};
    let rotating = || async {
        H2Server::start(|i| {
            if i < 50 {
                H2Action::GoAwayBelow
            } else {
                H2Action::Respond(200)
            }
        })
        .await
    };
    let policy = plain().build().unwrap();
    let mut want = vec![retry(Duration::ZERO, RetryReason::GoAway); 5];
    want.push(retry(S(1), RetryReason::Transient));
    want.push(retry(S(2), RetryReason::Transient));
    want.push(stop(StopReason::RetriesExhausted));

    // The middleware's own loop, for comparison.
    let server = rotating().await;
    let c = h2_client(plain().max_retries(2).build().unwrap());
    let (res, ext, took) = send(&c, c.get(server.url("/")), Extensions::new()).await;
    assert!(res.is_err());
    assert_eq!(server.requests_seen(), 8);
    assert_eq!(took, S(1 + 2));
    assert_eq!(decisions(&ext), want);

    let server = rotating().await;
    let bare = ClientWithMiddleware::from(
        reqwest::Client::builder()
            .no_proxy()
            .pool_idle_timeout(None)
            .http2_prior_knowledge()
            .retry(reqwest::retry::never())
            .build()
            .unwrap(),
    );
    let url = server.url("/");
    let started = Instant::now();
    let done = policy
        .operation()
        .idempotent(true)
        .max_retries(2)
        .run_recorded(|attempt| {
            let request = bare.get(&url).with_extension(attempt);
            async move { request.send().await }
        })
        .await;
    assert_eq!(server.requests_seen(), 8);
    done.result.expect_err("every stream rotated");
    // The operation judged the error it returned by its chain alone (no middleware).
    let last = done.history.last().expect("every attempt is recorded");
    assert_eq!(last.evidence.failure, Some(FailureKind::GoAway));
    assert_eq!(Instant::now() - started, S(1 + 2));
    assert_eq!(done.outcome.attempts, 8);
    assert_eq!(done.outcome.stop, StopReason::RetriesExhausted);
    let decided: Vec<AttemptDecision> = done
        .history
        .attempts()
        .iter()
        .map(|r| r.decision.clone().expect("a decision after every attempt"))
        .collect();
    assert_eq!(decided, want);
}

#[tokio::test(start_paused = true)]
async fn untrusted_certificate_is_never_retried() {
    let server = support::tls::TlsServer::start().await;
    let c = client(plain().build().unwrap());
    let (res, ext, took) = send(&c, c.get(server.url("/")), Extensions::new()).await;
    let err = res.unwrap_err();
    assert_eq!((server.connections(), server.handshakes()), (1, 0));
    assert_eq!(took, Duration::ZERO);
    assert_eq!(
        retry_error(&err).stop_reason(),
        StopReason::Permanent(FailureKind::Certificate)
    );
    assert_eq!(
        evidence(&ext),
        [(Transmission::NotSent, Some(FailureKind::Certificate))]
    );
}

// ---------------------------------------------------------------------------------------
// Local rejections (breaker, pause)

/// Rejects the first `rejections` attempts like an open breaker / pause would: `NotSent`
/// evidence and a `ResilienceError` carrying `retry_in`.
struct Rejecting {
    remaining: std::sync::atomic::AtomicU32,
    paused: bool,
    retry_in: Option<Duration>,
}

#[async_trait::async_trait]
impl Middleware for Rejecting {
    async fn handle(
        &self,
        req: reqwest::Request,
        ext: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        use std::sync::atomic::Ordering;
        let left = self.remaining.load(Ordering::SeqCst);
        if left == 0 {
            return next.run(req, ext).await;
        }
        self.remaining.store(left - 1, Ordering::SeqCst);
        let origin = Origin::from_url(req.url()).unwrap();
        let (kind, err) = if self.paused {
            let retry_in = self.retry_in.unwrap();
            (
                FailureKind::Paused,
                ResilienceError::Paused {
                    origin: origin.clone(),
                    retry_in,
                },
            )
        } else {
            (
                FailureKind::BreakerOpen,
                ResilienceError::BreakerOpen {
                    origin: origin.clone(),
                    state: reqwest_resilience::breaker::BreakerState::Open,
                    retry_in: self.retry_in,
                },
            )
        };
        RequestEvidence::rejected_locally(kind, Some(origin), 1).insert_into(ext);
        Err(reqwest_middleware::Error::middleware(err))
    }
}

fn with_rejections(
    rejections: u32,
    paused: bool,
    retry_in: Option<Duration>,
) -> ClientWithMiddleware {
    // Waiting out an open breaker is an opt-in (issue 42); the pauses wait without it.
    ClientBuilder::new(reqwest_client())
        .with(
            plain()
                .total_deadline(S(30))
                .wait_for_open_breakers(S(60))
                .build()
                .unwrap(),
        )
        .with(Rejecting {
            remaining: rejections.into(),
            paused,
            retry_in,
        })
        .with(TransportEvidence::new())
        .build()
}

#[tokio::test(start_paused = true)]
async fn a_pause_is_retried_after_its_retry_in_not_the_backoff() {
    let server = FaultServer::always(Action::ok("ok")).await;
    let c = with_rejections(1, true, Some(S(5)));
    let (res, ext, took) = send(&c, c.post(server.url("/")).body("x"), Extensions::new()).await;
    assert_eq!(res.unwrap().status(), 200);
    assert_eq!((server.requests_seen(), took), (1, S(5)));
    assert_eq!(
        decisions(&ext)[0],
        retry(S(5), RetryReason::BreakerRejected)
    );
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_without_retry_in_or_beyond_the_deadline_is_returned_at_once() {
    let server = FaultServer::always(Action::ok("ok")).await;
    for (retry_in, why) in [
        (None, StopReason::BreakerRejected),
        (Some(S(31)), StopReason::DeadlineExceeded),
    ] {
        let c = with_rejections(1, false, retry_in);
        let (res, _, took) = send(&c, c.get(server.url("/")), Extensions::new()).await;
        let err = res.unwrap_err();
        let e = retry_error(&err);
        assert_eq!(
            (e.attempts(), e.stop_reason(), took),
            (1, why, Duration::ZERO)
        );
        // The breaker's own error stays reachable beneath.
        assert!(matches!(
            ResilienceError::from_middleware_error(e.last_error()),
            Some(ResilienceError::BreakerOpen { .. })
        ));
    }
    assert_eq!(server.requests_seen(), 0);
}

// ---------------------------------------------------------------------------------------
// Budget, deadline, bodies, overrides, errors

#[tokio::test(start_paused = true)]
async fn budget_of_20_percent_allows_2_retries_for_10_requests_in_a_total_outage() {
    let server = FaultServer::always(Action::status(503)).await;
    let budget = RetryBudget::new(S(60), 0, 0.2).unwrap();
    let c = client(
        plain()
            .backoff(
                Backoff::builder()
                    .base(Duration::from_millis(10))
                    .jitter(Jitter::None)
                    .build()
                    .unwrap(),
            )
            .budget(budget.clone())
            .build()
            .unwrap(),
    );
    let mut stops = Vec::new();
    for _ in 0..10 {
        let (res, ext, _) = send(&c, c.get(server.url("/")), Extensions::new()).await;
        assert_eq!(res.unwrap().status(), 503);
        stops.push((outcome(&ext).attempts, outcome(&ext).stop));
    }
    // Request k (1-based) may retry while retries < ⌊0.2 k⌋: the 5th and the 10th.
    let retried: Vec<_> = stops.iter().map(|(a, _)| *a).collect();
    assert_eq!(retried, [1, 1, 1, 1, 2, 1, 1, 1, 1, 2]);
    assert!(stops.iter().all(|(_, s)| *s == StopReason::BudgetExhausted));
    assert_eq!(server.requests_seen(), 12);
    assert_eq!(budget.remaining(), 0);
}

#[tokio::test(start_paused = true)]
async fn default_budget_caps_a_concurrent_outage_at_the_floor() {
    let server = FaultServer::always(Action::status(503)).await;
    let c = client(
        RetryMiddleware::builder()
            .backoff(
                Backoff::builder()
                    .base(Duration::from_millis(10))
                    .jitter(Jitter::None)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap(),
    );
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (c, url) = (c.clone(), server.url("/"));
            tokio::spawn(async move { c.get(url).send().await.unwrap().status().as_u16() })
        })
        .collect();
    for t in tasks {
        assert_eq!(tokio::time::timeout(S(60), t).await.unwrap().unwrap(), 503);
    }
    // 100 requests; the floor (10/s over 10 s = 100 retries) exceeds 20 % of them, and
    // without a budget there would be 300 retries.
    assert_eq!(server.requests_seen(), 200);
}

#[tokio::test(start_paused = true)]
async fn deadline_cuts_the_last_sleep() {
    let server = FaultServer::always(Action::status(503)).await;
    let c = client(plain().total_deadline(S(5)).build().unwrap());
    let (res, ext, took) = send(&c, c.get(server.url("/")), Extensions::new()).await;
    assert_eq!(res.unwrap().status(), 503);
    // Slept 1 s and 2 s; 4 s more would end at 7 s, past the 5 s deadline.
    assert_eq!((server.requests_seen(), took), (3, S(3)));
    assert_eq!(outcome(&ext).stop, StopReason::DeadlineExceeded);

    let req = c
        .get(server.url("/"))
        .with_extension(Deadline::after(Duration::from_millis(2500)));
    let (_, ext, took) = send(&c, req, Extensions::new()).await;
    assert_eq!(
        (outcome(&ext).attempts, took),
        (2, S(1)),
        "per-request deadline wins"
    );
}

#[tokio::test(start_paused = true)]
async fn streaming_body_is_sent_once_and_the_response_returned_as_is() {
    let server = FaultServer::always(Action::status(503)).await;
    let c = client(plain().build().unwrap());
    let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok("part 1, "), Ok("part 2")];
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let (res, ext, took) = send(
        &c,
        c.put(server.url("/upload")).body(body),
        Extensions::new(),
    )
    .await;
    assert_eq!(res.unwrap().status(), 503);
    assert_eq!((server.requests_seen(), took), (1, Duration::ZERO));
    assert_eq!(server.requests()[0].body, b"part 1, part 2");
    assert_eq!(outcome(&ext).stop, StopReason::BodyNotClonable);
}

#[tokio::test(start_paused = true)]
async fn per_request_max_retries_zero_sends_once() {
    let server = FaultServer::always(Action::status(503)).await;
    let c = client(plain().build().unwrap());
    let req = c.get(server.url("/")).with_extension(MaxRetries(0));
    let (res, ext, took) = send(&c, req, Extensions::new()).await;
    assert_eq!(res.unwrap().status(), 503);
    assert_eq!((server.requests_seen(), took), (1, Duration::ZERO));
    assert_eq!(outcome(&ext).stop, StopReason::RetriesExhausted);

    let req = c.get(server.url("/")).with_extension(MaxRetries(1));
    let (_, ext, _) = send(&c, req, Extensions::new()).await;
    assert_eq!(outcome(&ext).attempts, 2);
    assert_eq!(server.requests_seen(), 3);
}

#[tokio::test(start_paused = true)]
async fn is_timeout_is_answerable_on_the_final_error() {
    let server = FaultServer::always(Action::Stall).await;
    // The one client with a reqwest timeout: on the paused clock it fires as soon as the
    // runtime idles, which is exactly the stalled server's case.
    let reqwest = reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .timeout(S(2))
        .build()
        .unwrap();
    let c = ClientBuilder::new(reqwest)
        .with(plain().max_retries(1).build().unwrap())
        .with(TransportEvidence::new())
        .build();
    let (res, ext, took) = send(&c, c.get(server.url("/")), Extensions::new()).await;
    let err = res.unwrap_err();
    assert_eq!(server.requests_seen(), 2);
    assert_eq!(took, S(2 + 1 + 2));
    let e = retry_error(&err);
    assert!(e.is_timeout());
    assert_eq!(
        (e.attempts(), e.stop_reason()),
        (2, StopReason::RetriesExhausted)
    );
    assert!(chain::find::<reqwest::Error>(&err).is_some_and(reqwest::Error::is_timeout));
    // The chain: ResilienceError::Retry → its RetryError → the reqwest::Error.
    let resilience = ResilienceError::from_middleware_error(&err).unwrap();
    let source = std::error::Error::source(resilience).unwrap();
    assert!(source.is::<RetryError>(), "{source:?}");
    let last = std::error::Error::source(source).unwrap();
    assert!(
        last.downcast_ref::<reqwest::Error>()
            .is_some_and(|r| r.is_timeout())
    );
    assert_eq!(evidence(&ext)[1].1, Some(FailureKind::Timeout));
    assert!(err.to_string().contains("2 attempts"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn wrap_errors_false_returns_the_reqwest_error_unchanged() {
    let c = client(plain().max_retries(1).wrap_errors(false).build().unwrap());
    let url = format!("http://127.0.0.1:{}/", refused_port());
    let (res, ext, _) = send(&c, c.get(url), Extensions::new()).await;
    let err = res.unwrap_err();
    assert!(matches!(err, reqwest_middleware::Error::Reqwest(ref e) if e.is_connect()));
    assert!(err.is_connect());
    assert_eq!(
        (outcome(&ext).attempts, outcome(&ext).stop),
        (2, StopReason::RetriesExhausted)
    );
}

#[tokio::test(start_paused = true)]
async fn without_transport_evidence_failures_are_unknown_so_only_idempotent_requests_retry() {
    let server = FaultServer::start(|i, _| {
        if i % 2 == 0 {
            Action::ReadThenClose
        } else {
            Action::ok("ok")
        }
    })
    .await;
    let c = ClientBuilder::new(reqwest_client())
        .with(plain().build().unwrap())
        .build();
    let (res, ext, _) = send(&c, c.get(server.url("/")), Extensions::new()).await;
    assert_eq!(res.unwrap().status(), 200);
    assert_eq!(
        evidence(&ext)[0],
        (Transmission::Unknown, Some(FailureKind::Other))
    );
    let (res, _, _) = send(&c, c.post(server.url("/")).body("x"), Extensions::new()).await;
    assert_eq!(
        retry_error(&res.unwrap_err()).stop_reason(),
        StopReason::MayHaveBeenProcessed
    );
    assert_eq!(server.requests_seen(), 3);
}

#[cfg(feature = "retry-policies")]
#[tokio::test(start_paused = true)]
async fn a_retry_policies_policy_drives_the_delays_and_the_limit() {
    use retry_policies::policies::ExponentialBackoff;
    let server = FaultServer::always(Action::status(503)).await;
    let policy = ExponentialBackoff::builder()
        .retry_bounds(S(1), S(1))
        .jitter(retry_policies::Jitter::None)
        .build_with_max_retries(2);
    let c = client(RetryMiddleware::new_with_policy(policy));
    let (res, ext, took) = send(&c, c.get(server.url("/")), Extensions::new()).await;
    assert_eq!(res.unwrap().status(), 503);
    assert_eq!(server.requests_seen(), 3);
    assert_eq!(outcome(&ext).stop, StopReason::RetriesExhausted);
    // The policy computes from the wall clock, so each delay is at most its 1 s, less the
    // wall-clock time between the policy's answer and the sleep (on a loaded machine that
    // can be tens of milliseconds: the lower bound only says both delays were slept).
    assert!(took <= S(2) && took > S(1), "{took:?}");
}

#[cfg(feature = "retry-policies")]
#[tokio::test(start_paused = true)]
async fn a_shared_arc_dyn_retry_policy_is_taken_as_it_is_and_its_delays_are_used() {
    // rattler keeps its policies as `Arc<dyn RetryPolicy + Send + Sync>`: no newtype.
    use retry_policies::RetryPolicy;
    use retry_policies::policies::ExponentialBackoff;
    let policy: Arc<dyn RetryPolicy + Send + Sync> = Arc::new(
        ExponentialBackoff::builder()
            .retry_bounds(S(1), S(1))
            .jitter(retry_policies::Jitter::None)
            .build_with_max_retries(2),
    );
    for retry in [
        RetryMiddleware::new_with_policy(policy.clone()),
        RetryMiddleware::builder()
            .policy(policy.clone())
            .build()
            .unwrap(),
    ] {
        let server = FaultServer::always(Action::status(503)).await;
        let c = client(retry);
        let (res, ext, took) = send(&c, c.get(server.url("/")), Extensions::new()).await;
        assert_eq!(res.unwrap().status(), 503);
        assert_eq!(server.requests_seen(), 3, "the policy's 2 retries");
        assert_eq!(outcome(&ext).stop, StopReason::RetriesExhausted);
        // Its 1 s delays, less the wall-clock time between its answer and the sleep (as
        // in the test above).
        assert!(took <= S(2) && took > S(1), "{took:?}");
    }
}

#[cfg(feature = "retry-policies")]
#[tokio::test(start_paused = true)]
async fn new_with_policy_has_no_retry_budget_like_reqwest_retry_and_one_can_opt_in() {
    // 60 requests to a server that always fails, 2 retries each: reqwest-retry makes all
    // 180 attempts. The default budget (at least 10 retries a second over 10 s) would
    // allow only 100 of the 120 retries: this crate's budget was on here until issue 31.
    use retry_policies::policies::ExponentialBackoff;
    let policy = || {
        ExponentialBackoff::builder()
            .retry_bounds(Duration::ZERO, Duration::ZERO)
            .build_with_max_retries(2)
    };
    let server = FaultServer::always(Action::status(503)).await;
    let retry = RetryMiddleware::new_with_policy(policy());
    assert!(retry.budget().is_none());
    let c = client(retry);
    for _ in 0..60 {
        let (res, ext, _) = send(&c, c.get(server.url("/")), Extensions::new()).await;
        assert_eq!(res.unwrap().status(), 503);
        assert_eq!(outcome(&ext).attempts, 3, "every request retried fully");
    }
    assert_eq!(server.requests_seen(), 180);

    // Opting in: the builder with the policy and a budget.
    let server = FaultServer::always(Action::status(503)).await;
    let c = client(
        RetryMiddleware::builder()
            .policy(policy())
            .budget(RetryBudget::default())
            .build()
            .unwrap(),
    );
    for _ in 0..60 {
        let (res, _, _) = send(&c, c.get(server.url("/")), Extensions::new()).await;
        assert_eq!(res.unwrap().status(), 503);
    }
    assert_eq!(server.requests_seen(), 60 + 100, "the budget's 100 retries");
}

#[tokio::test(start_paused = true)]
async fn with_the_real_breaker_an_open_circuit_is_waited_out_not_hammered() {
    use reqwest_resilience::breaker::{
        BreakerConfig, BreakerRegistry, CircuitBreakerMiddleware, TripPolicy,
    };
    let server = FaultServer::always(Action::status(503)).await;
    let registry = BreakerRegistry::new(
        BreakerConfig::default()
            .policy(TripPolicy::consecutive_failures(3))
            .open_duration(S(10)),
    )
    .unwrap();
    // Waiting out an open breaker is an opt-in (issue 42).
    let c = ClientBuilder::new(reqwest_client())
        .with(
            plain()
                .max_retries(5)
                .wait_for_open_breakers(S(60))
                .build()
                .unwrap(),
        )
        .with(CircuitBreakerMiddleware::new(registry))
        .with(TransportEvidence::new())
        .build();
    let (res, ext, took) = send(&c, c.get(server.url("/")), Extensions::new()).await;
    // Three 503s trip the breaker at t = 3 s (open until 13 s); the 4th attempt at 7 s is
    // rejected locally and waits the breaker's 6 s; the probe at 13 s fails again.
    assert_eq!(
        decisions(&ext),
        [
            retry(S(1), R503),
            retry(S(2), R503),
            retry(S(4), R503),
            retry(S(6), RetryReason::BreakerRejected),
            retry(S(16), R503),
            stop(StopReason::RetriesExhausted),
        ]
    );
    assert_eq!(
        server.requests_seen(),
        5,
        "the rejected attempt never reached the server"
    );
    assert_eq!(took, S(29));
    // The last attempt was the second probe: its 503 is returned as received.
    assert_eq!(res.unwrap().status(), 503);
    let history = AttemptHistory::of(&ext).unwrap();
    assert_eq!(
        history.attempts()[3].evidence.failure,
        Some(FailureKind::BreakerOpen)
    );
}

#[tokio::test(start_paused = true)]
async fn with_the_real_breaker_an_open_circuit_past_the_deadline_returns_its_error_at_once() {
    use reqwest_resilience::breaker::{
        BreakerConfig, BreakerRegistry, CircuitBreakerMiddleware, TripPolicy,
    };
    let server = FaultServer::always(Action::status(503)).await;
    let registry = BreakerRegistry::new(
        BreakerConfig::default()
            .policy(TripPolicy::consecutive_failures(3))
            .open_duration(S(10)),
    )
    .unwrap();
    let c = ClientBuilder::new(reqwest_client())
        .with(
            plain()
                .max_retries(5)
                .total_deadline(S(8))
                .wait_for_open_breakers(S(60))
                .build()
                .unwrap(),
        )
        .with(CircuitBreakerMiddleware::new(registry))
        .with(TransportEvidence::new())
        .build();
    let (res, ext, took) = send(&c, c.get(server.url("/")), Extensions::new()).await;
    // Rejected at 7 s with 6 s to wait: 13 s is past the 8 s deadline.
    assert_eq!((server.requests_seen(), took), (3, S(7)));
    let err = res.unwrap_err();
    let e = retry_error(&err);
    assert_eq!(
        (e.attempts(), e.stop_reason()),
        (4, StopReason::DeadlineExceeded)
    );
    assert!(matches!(
        ResilienceError::from_middleware_error(e.last_error()),
        Some(ResilienceError::BreakerOpen { retry_in: Some(d), .. }) if *d == S(6)
    ));
    assert!(
        ext.get::<reqwest_resilience::retry::Deadline>().is_none(),
        "not left behind"
    );
}

#[tokio::test(start_paused = true)]
async fn a_retried_response_is_drained_so_its_connection_is_reused() {
    let server = FaultServer::sequence(
        vec![Action::status(503).body(&[b'x'; 60_000])],
        Action::ok("ok"),
    )
    .await;
    let c = client(plain().build().unwrap());
    let (res, _, _) = send(&c, c.get(server.url("/")), Extensions::new()).await;
    assert_eq!(res.unwrap().status(), 200);
    assert_eq!((server.requests_seen(), server.connections()), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_on_many_threads_share_one_budget_exactly() {
    let server = FaultServer::always(Action::status(503)).await;
    // Ratio 0, floor 5/s over 10 s: exactly 50 retries in the window, whatever the
    // interleaving of 200 requests that would like 600.
    let budget = RetryBudget::new(S(10), 5, 0.0).unwrap();
    let c = client(
        plain()
            .backoff(
                Backoff::builder()
                    .base(Duration::from_millis(1))
                    .jitter(Jitter::Full)
                    .build()
                    .unwrap(),
            )
            .budget(budget.clone())
            .build()
            .unwrap(),
    );
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (c, url) = (c.clone(), server.url("/"));
            tokio::spawn(async move {
                let res = c.get(url).send().await.unwrap();
                *RetryOutcome::of(res.extensions()).unwrap()
            })
        })
        .collect();
    let mut attempts = 0;
    for t in tasks {
        let o = tokio::time::timeout(S(60), t).await.unwrap().unwrap();
        assert!(matches!(
            o.stop,
            StopReason::BudgetExhausted | StopReason::RetriesExhausted
        ));
        attempts += o.attempts;
    }
    assert_eq!(attempts, 250);
    assert_eq!(server.requests_seen(), 250);
    assert_eq!(budget.remaining(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_redirect_loop_is_never_retried() {
    let server = FaultServer::start(|_, _| Action::status(302).header("location", "/loop")).await;
    // The bare client's own redirect chain is the unit: the retry must not repeat it.
    let bare = reqwest_client().get(server.url("/loop")).send().await;
    assert!(bare.unwrap_err().is_redirect());
    let chain = server.requests_seen();
    assert!(chain > 1);
    let c = client(plain().build().unwrap());
    let (res, ext, took) = send(&c, c.get(server.url("/loop")), Extensions::new()).await;
    let err = res.unwrap_err();
    assert_eq!((server.requests_seen(), took), (2 * chain, Duration::ZERO));
    assert_eq!(
        retry_error(&err).stop_reason(),
        StopReason::Permanent(FailureKind::Redirect)
    );
    assert!(chain::find::<reqwest::Error>(&err).is_some_and(reqwest::Error::is_redirect));
    assert_eq!(outcome(&ext).attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_reqwest_cannot_build_is_never_retried() {
    let c = client(plain().build().unwrap());
    // A scheme reqwest has no connector for: rejected before any I/O.
    let (res, ext, took) = send(&c, c.get("ftp://127.0.0.1/file"), Extensions::new()).await;
    let err = res.unwrap_err();
    let e = retry_error(&err);
    assert_eq!((e.attempts(), took), (1, Duration::ZERO));
    assert_eq!(e.stop_reason(), StopReason::Permanent(FailureKind::Builder));
    assert_eq!(
        evidence(&ext),
        [(Transmission::NotSent, Some(FailureKind::Builder))]
    );
}
