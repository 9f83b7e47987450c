//! Strategies that see the attempt: the error chain, the URL, the response head, a delay
//! of their own; uv's transient rules over real faults on loopback; the guard that keeps
//! any strategy from repeating a request that may have been processed.

use crate::support;

use reqwest_resilience::redirect::{self, ClientRedirects};

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http::{Method, StatusCode};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::retry::strategies::UvTransient;
use reqwest_resilience::retry::{
    AttemptContext, DefaultStrategy, RetryAfterPolicy, RetryMiddlewareBuilder, RetryReason,
    RetryStrategy, StopReason, Verdict,
};
use reqwest_resilience::{
    AttemptDecision, AttemptHistory, FailureKind, SendWithHistory, Transmission, TransportEvidence,
};
use support::h2::{H2Action, H2Server};
use support::{Action, FaultServer, exact_retry};

type Row = (Transmission, Option<FailureKind>, Option<AttemptDecision>);

/// A client with `retry` and the transport step over a `reqwest` client (built from
/// `builder`) whose redirects are recorded, so the evidence is exact.
fn client_with(
    retry: RetryMiddlewareBuilder,
    builder: reqwest::ClientBuilder,
) -> ClientWithMiddleware {
    let reqwest = builder
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

fn rows(history: &AttemptHistory) -> Vec<Row> {
    history
        .attempts()
        .iter()
        .map(|r| {
            (
                r.evidence.transmission,
                r.evidence.failure,
                r.decision.clone(),
            )
        })
        .collect()
}

fn retry(secs: u64, reason: RetryReason) -> Option<AttemptDecision> {
    Some(AttemptDecision::Retry {
        delay: Duration::from_secs(secs),
        reason,
    })
}

fn stop(reason: StopReason) -> Option<AttemptDecision> {
    Some(AttemptDecision::Stop { reason })
}

/// The decisions of a request retried three times (1 s, 2 s, 4 s) for `reason` and then
/// out of retries, each attempt observed as `t` / `kind`.
fn retried_three_times(t: Transmission, kind: FailureKind, reason: RetryReason) -> Vec<Row> {
    vec![
        (t, Some(kind), retry(1, reason)),
        (t, Some(kind), retry(2, reason)),
        (t, Some(kind), retry(4, reason)),
        (t, Some(kind), stop(StopReason::RetriesExhausted)),
    ]
}

const SENT: Transmission = Transmission::SentNoResponse;

/// Whether an `io::Error` of one of `kinds` is anywhere in `err`'s chain, as a strategy
/// asks it ([`AttemptContext::has_io_kind`]).
fn has_io_kind(err: &(dyn std::error::Error + 'static), kinds: &[io::ErrorKind]) -> bool {
    let evidence = reqwest_resilience::RequestEvidence::new(SENT, None, 1);
    AttemptContext::new(&evidence, &Method::GET)
        .with_error(err)
        .has_io_kind(kinds)
}

#[tokio::test(start_paused = true)]
async fn uv_rules_retry_a_get_reset_mid_head_three_times_and_send_a_post_once() {
    let server = FaultServer::always(Action::HalfHeadThenReset).await;
    let client = client_with(
        exact_retry().strategy(UvTransient),
        reqwest::Client::builder(),
    );

    let get = client.get(server.url("/simple/")).send_with_history().await;
    let err = get.result.expect_err("every attempt is reset");
    assert!(
        has_io_kind(&err, &[io::ErrorKind::ConnectionReset]),
        "{err:?}"
    );
    assert_eq!(
        rows(&get.history),
        retried_three_times(SENT, FailureKind::Reset, RetryReason::Transient)
    );
    assert_eq!(get.outcome.map(|o| (o.attempts, o.retries())), Some((4, 3)));
    assert_eq!(server.requests_seen(), 4);

    let post = client
        .post(server.url("/upload"))
        .body("wheel")
        .send_with_history()
        .await;
    assert!(post.result.is_err());
    assert_eq!(
        rows(&post.history),
        [(
            SENT,
            Some(FailureKind::Reset),
            stop(StopReason::MayHaveBeenProcessed)
        )]
    );
    assert_eq!(server.requests_seen(), 5);
}

#[tokio::test(start_paused = true)]
async fn uv_rules_retry_an_unexpected_eof_from_the_tls_layer() {
    use support::tls_faults::TlsFault;
    let server = support::tls_faults::start(TlsFault::HalfHeadWithoutCloseNotify).await;
    let reqwest = reqwest::Client::builder().tls_danger_accept_invalid_certs(true);
    let client = client_with(exact_retry().strategy(UvTransient), reqwest);
    let get = client.get(server.url("/simple/")).send_with_history().await;
    let err = get.result.expect_err("every response is cut");
    assert!(
        has_io_kind(&err, &[io::ErrorKind::UnexpectedEof]),
        "{err:?}"
    );
    assert_eq!(
        rows(&get.history),
        retried_three_times(SENT, FailureKind::Closed, RetryReason::Transient)
    );
    assert_eq!((server.handshakes(), server.requests_seen()), (4, 4));
}

#[tokio::test(start_paused = true)]
async fn uv_rules_retry_an_h2_rst_stream_and_the_context_names_its_reason() {
    let server = H2Server::start(|_| H2Action::ResetStream(0x2)).await;
    let reqwest = reqwest::Client::builder().http2_prior_knowledge();
    // What the strategy saw, attempt by attempt.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let strategy = move |ctx: &AttemptContext<'_>| {
        s.lock().unwrap().push((
            ctx.attempt,
            ctx.h2_reason(),
            ctx.url.map(|u| u.path().to_owned()),
        ));
        UvTransient.decide(ctx)
    };
    let client = client_with(exact_retry().strategy(FnStrategy(strategy)), reqwest);
    let get = client.get(server.url("/simple/")).send_with_history().await;
    assert!(get.result.is_err());
    assert_eq!(
        rows(&get.history),
        retried_three_times(SENT, FailureKind::Protocol, RetryReason::Transient)
    );
    let reason = Some(h2::Reason::INTERNAL_ERROR);
    let path = Some("/simple/".to_owned());
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (1, reason, path.clone()),
            (2, reason, path.clone()),
            (3, reason, path.clone()),
            (4, reason, path)
        ]
    );
    assert_eq!(server.requests_seen(), 4);
}

#[tokio::test(start_paused = true)]
async fn uv_rules_stop_on_a_malformed_head_that_the_default_table_retries() {
    let server = FaultServer::always(Action::Garbage(b"HTTP/1.1 abc\r\n\r\n".to_vec())).await;
    let uv = client_with(
        exact_retry().strategy(UvTransient),
        reqwest::Client::builder(),
    );
    let get = uv.get(server.url("/")).send_with_history().await;
    assert_eq!(
        rows(&get.history),
        [(
            SENT,
            Some(FailureKind::Protocol),
            stop(StopReason::Permanent(FailureKind::Protocol))
        )]
    );
    assert_eq!(server.requests_seen(), 1);
    let default = client_with(exact_retry(), reqwest::Client::builder());
    let get = default.get(server.url("/")).send_with_history().await;
    assert_eq!(
        rows(&get.history),
        retried_three_times(SENT, FailureKind::Protocol, RetryReason::Transient)
    );
    assert_eq!(server.requests_seen(), 5);
}

#[tokio::test(start_paused = true)]
async fn uv_rules_retry_every_5xx_of_a_get_and_a_posts_only_with_retry_after() {
    let server = FaultServer::sequence(vec![Action::status(507)], Action::ok("done")).await;
    let client = client_with(
        exact_retry().strategy(UvTransient),
        reqwest::Client::builder(),
    );
    let get = client.get(server.url("/")).send_with_history().await;
    assert_eq!(get.result.unwrap().status(), 200);
    let s507 = StatusCode::INSUFFICIENT_STORAGE;
    assert_eq!(
        rows(&get.history),
        [
            (
                Transmission::ResponseReceived(s507),
                None,
                retry(1, RetryReason::Status(s507))
            ),
            (
                Transmission::ResponseReceived(StatusCode::OK),
                None,
                stop(StopReason::FinalResponse(StatusCode::OK))
            ),
        ]
    );
    let server = FaultServer::always(Action::status(507)).await;
    let post = client
        .post(server.url("/"))
        .body("x")
        .send_with_history()
        .await;
    assert_eq!(post.result.unwrap().status(), 507);
    assert_eq!(
        post.outcome.map(|o| o.stop),
        Some(StopReason::StatusNotSafe(s507))
    );
    assert_eq!(server.requests_seen(), 1);
}

/// A strategy from a closure.
struct FnStrategy<F>(F);

impl<F> RetryStrategy for FnStrategy<F>
where
    F: Fn(&AttemptContext<'_>) -> Verdict + Send + Sync + 'static,
{
    fn decide(&self, ctx: &AttemptContext<'_>) -> Verdict {
        (self.0)(ctx)
    }
}

/// cargo-binstall's rule: a `403` with `Retry-After` (GitHub's secondary rate limit) is
/// retried after the time the header gives, read by the strategy from the response head.
fn binstall_403(ctx: &AttemptContext<'_>) -> Verdict {
    if ctx.status() == Some(StatusCode::FORBIDDEN)
        && let Some(wait) = ctx
            .header(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| reqwest_resilience::retry_after::parse(v, SystemTime::now()))
    {
        return Verdict::RetryAfter(RetryReason::Status(StatusCode::FORBIDDEN), wait);
    }
    DefaultStrategy.decide(ctx)
}

#[tokio::test(start_paused = true)]
async fn a_strategy_retries_a_403_after_its_retry_after_with_a_delay_of_its_own() {
    let limited = Action::status(403).header("retry-after", "7");
    let server = FaultServer::sequence(vec![limited.clone(), limited], Action::ok("release")).await;
    let client = client_with(
        exact_retry().strategy(FnStrategy(binstall_403)),
        reqwest::Client::builder(),
    );
    let t0 = tokio::time::Instant::now();
    let get = client
        .get(server.url("/releases/latest"))
        .send_with_history()
        .await;
    assert_eq!(get.result.unwrap().status(), 200);
    let s403 = StatusCode::FORBIDDEN;
    let forbidden = (
        Transmission::ResponseReceived(s403),
        None,
        retry(7, RetryReason::Status(s403)),
    );
    assert_eq!(
        rows(&get.history),
        [
            forbidden.clone(),
            forbidden,
            (
                Transmission::ResponseReceived(StatusCode::OK),
                None,
                stop(StopReason::FinalResponse(StatusCode::OK))
            ),
        ]
    );
    assert_eq!(t0.elapsed(), Duration::from_secs(14));

    // A 403 without the header is final, as in the default table.
    let server = FaultServer::always(Action::status(403)).await;
    let get = client.get(server.url("/")).send_with_history().await;
    assert_eq!(
        get.outcome.map(|o| (o.attempts, o.stop)),
        Some((1, StopReason::FinalResponse(s403)))
    );
}

#[tokio::test(start_paused = true)]
async fn a_strategys_own_delay_is_capped_like_retry_after() {
    let server = FaultServer::sequence(
        vec![Action::status(403).header("retry-after", "3600")],
        Action::ok("release"),
    )
    .await;
    let clamp = client_with(
        exact_retry().strategy(FnStrategy(binstall_403)),
        reqwest::Client::builder(),
    );
    let get = clamp.get(server.url("/")).send_with_history().await;
    assert_eq!(get.result.unwrap().status(), 200);
    assert_eq!(
        get.history.attempts()[0].decision,
        retry(60, RetryReason::Status(StatusCode::FORBIDDEN))
    );

    let server = FaultServer::always(Action::status(403).header("retry-after", "3600")).await;
    let give_up = client_with(
        exact_retry()
            .strategy(FnStrategy(binstall_403))
            .retry_after_cap(Duration::from_secs(60), RetryAfterPolicy::GiveUp),
        reqwest::Client::builder(),
    );
    let get = give_up.get(server.url("/")).send_with_history().await;
    assert_eq!(get.result.unwrap().status(), 403);
    assert_eq!(
        get.outcome.map(|o| (o.attempts, o.stop)),
        Some((1, StopReason::RetryAfterTooLong))
    );
    assert_eq!(server.requests_seen(), 1);
}

/// A strategy that would retry anything.
fn always_retry(_: &AttemptContext<'_>) -> Verdict {
    Verdict::RetryAfter(RetryReason::Transient, Duration::from_secs(1))
}

#[tokio::test(start_paused = true)]
async fn no_strategy_can_send_again_a_post_that_may_have_been_processed() {
    let server = FaultServer::always(Action::ReadThenReset).await;
    let client = client_with(
        exact_retry().strategy(FnStrategy(always_retry)),
        reqwest::Client::builder(),
    );
    let post = client
        .post(server.url("/orders"))
        .body("{}")
        .send_with_history()
        .await;
    assert!(post.result.is_err());
    assert_eq!(
        rows(&post.history),
        [(
            SENT,
            Some(FailureKind::Reset),
            stop(StopReason::MayHaveBeenProcessed)
        )]
    );
    assert_eq!(server.requests_seen(), 1);

    // A 500 to a POST was answered, maybe after the work was done: sent once as well.
    let server = FaultServer::always(Action::status(500)).await;
    let post = client
        .post(server.url("/orders"))
        .body("{}")
        .send_with_history()
        .await;
    assert_eq!(post.result.unwrap().status(), 500);
    let s500 = StatusCode::INTERNAL_SERVER_ERROR;
    assert_eq!(
        post.outcome.map(|o| (o.attempts, o.stop)),
        Some((1, StopReason::StatusNotSafe(s500)))
    );
    assert_eq!(server.requests_seen(), 1);

    // The same strategy retries a GET (idempotent) with its own delay.
    let get = client.get(server.url("/orders")).send_with_history().await;
    assert_eq!(
        rows(&get.history)[..2],
        [
            (
                Transmission::ResponseReceived(s500),
                None,
                retry(1, RetryReason::Transient)
            ),
            (
                Transmission::ResponseReceived(s500),
                None,
                retry(1, RetryReason::Transient)
            ),
        ]
    );
    assert_eq!(get.outcome.map(|o| o.attempts), Some(4));
}

#[tokio::test]
async fn a_context_made_for_a_test_describes_the_case_it_is_given() {
    let evidence = reqwest_resilience::RequestEvidence::new(Transmission::SentNoResponse, None, 1);
    let err = io::Error::other(io::Error::new(io::ErrorKind::BrokenPipe, "pipe"));
    let url = url::Url::parse("https://pypi.org/simple/").unwrap();
    let ctx = AttemptContext::new(&evidence, &Method::GET)
        .with_error(&err)
        .with_url(&url);
    assert!(ctx.has_io_kind(&[io::ErrorKind::BrokenPipe]));
    assert_eq!(
        ctx.io_kinds().collect::<Vec<_>>(),
        [io::ErrorKind::Other, io::ErrorKind::BrokenPipe]
    );
    assert_eq!(ctx.error_messages(), ["pipe"]);
    assert_eq!(
        ctx.url.map(url::Url::as_str),
        Some("https://pypi.org/simple/")
    );
    assert_eq!(ctx.status(), None);
    assert!(ctx.reqwest_error().is_none());
}
