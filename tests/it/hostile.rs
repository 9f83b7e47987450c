//! Hostile loopback servers against the full `Resilience` stack: huge headers, absurd
//! `Retry-After` values, endless redirects, slowloris responses, a `401` loop and a
//! cross-origin redirect after a `401`. The client must end (by its timeout or deadline),
//! keep its memory, never loop, and never hand the bearer token to another origin.
//!
//! Real clock (slowloris needs real socket timeouts), short backoffs, and an outer timeout
//! around every test; no assertion reads the wall clock.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::Extensions;
use reqwest_middleware::ClientWithMiddleware;
use reqwest_resilience::RetryMiddleware;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry};
use reqwest_resilience::retry::{
    RetryAfterPolicy, RetryMiddlewareBuilder, RetryOutcome, StopReason,
};
use reqwest_resilience::{
    AccessToken, AttemptHistory, Backoff, BearerAuth, FailureKind, Jitter, Origin, Resilience,
    ResilienceError, TokenManager, Transmission,
};
use support::{Action, FaultServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const TEST_LIMIT: Duration = Duration::from_secs(30);

fn fast_backoff() -> Backoff {
    Backoff::builder()
        .base(Duration::from_millis(5))
        .max_delay(Duration::from_millis(20))
        .jitter(Jitter::None)
        .build()
        .unwrap()
}

fn plain_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// The retry of every stack here: fast backoff, no budget.
fn retry() -> RetryMiddlewareBuilder {
    RetryMiddleware::builder()
        .backoff(fast_backoff())
        .no_budget()
}

/// `resilience` (its retry from [`retry`]) over `client`.
fn stack(resilience: Resilience, client: reqwest::Client) -> ClientWithMiddleware {
    resilience.build(client).unwrap()
}

async fn send(
    client: &ClientWithMiddleware,
    request: reqwest_middleware::RequestBuilder,
) -> (reqwest_middleware::Result<reqwest::Response>, Extensions) {
    let request = request.build().unwrap();
    let mut extensions = Extensions::new();
    let result = client
        .execute_with_extensions(request, &mut extensions)
        .await;
    (result, extensions)
}

fn outcome(extensions: &Extensions) -> RetryOutcome {
    *RetryOutcome::of(extensions).expect("retry outcome")
}

fn history(extensions: &Extensions) -> Vec<(Transmission, Option<FailureKind>)> {
    AttemptHistory::of(extensions)
        .expect("history")
        .attempts()
        .iter()
        .map(|r| (r.evidence.transmission, r.evidence.failure))
        .collect()
}

/// `n` attempts, each a protocol failure after the request went out. Whether the
/// transport step says `SentNoResponse` or `Unknown` is its call; both forbid resending a
/// POST.
fn assert_protocol_failures(extensions: &Extensions, n: usize) {
    let h = history(extensions);
    assert_eq!(h.len(), n);
    for (transmission, failure) in h {
        assert!(
            matches!(
                transmission,
                Transmission::SentNoResponse | Transmission::Unknown
            ),
            "{transmission:?}"
        );
        assert_eq!(failure, Some(FailureKind::Protocol));
    }
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_LIMIT, f)
        .await
        .expect("the client gave up by itself")
}

#[tokio::test]
async fn a_one_mebibyte_response_header_is_a_protocol_failure_and_a_post_is_not_resent() {
    bounded(async {
        let big = "x".repeat(1024 * 1024);
        let server = FaultServer::always(Action::ok("hi").header("x-big", &big)).await;
        let client = stack(
            Resilience::new().retry(retry().max_retries(2)),
            plain_client(),
        );

        let (get, ext) = send(&client, client.get(server.url("/get"))).await;
        assert!(get.is_err());
        assert_eq!(outcome(&ext).attempts, 3);
        assert_protocol_failures(&ext, 3);
        assert_eq!(server.requests_seen(), 3);

        let (post, ext) = send(&client, client.post(server.url("/post")).body("pay")).await;
        assert!(post.is_err());
        assert_eq!(outcome(&ext).attempts, 1);
        assert_eq!(outcome(&ext).stop, StopReason::MayHaveBeenProcessed);
        assert_eq!(
            server.requests_seen(),
            4,
            "the POST reached the server once"
        );
    })
    .await;
}

#[tokio::test]
async fn ten_thousand_response_headers_are_a_protocol_failure_not_a_hang() {
    bounded(async {
        let mut action = Action::ok("hi");
        for i in 0..10_000 {
            action = action.header(&format!("x-h{i}"), "v");
        }
        let server = FaultServer::always(action).await;
        let client = stack(
            Resilience::new().retry(retry().max_retries(1)),
            plain_client(),
        );
        let (result, ext) = send(&client, client.get(server.url("/"))).await;
        assert!(result.is_err());
        assert_protocol_failures(&ext, 2);
        assert_eq!(server.requests_seen(), 2);
    })
    .await;
}

#[tokio::test]
async fn retry_after_of_twenty_nines_is_ignored_and_the_backoff_applies() {
    bounded(async {
        let server =
            FaultServer::always(Action::status(503).header("retry-after", "99999999999999999999"))
                .await;
        let registry = BreakerRegistry::default();
        let client = stack(
            Resilience::new()
                .retry(retry().max_retries(2))
                .breaker(registry.clone()),
            plain_client(),
        );
        let (result, ext) = send(&client, client.get(server.url("/"))).await;
        assert_eq!(result.unwrap().status(), 503);
        assert_eq!(outcome(&ext).attempts, 3);
        let records = AttemptHistory::of(&ext).unwrap().attempts().to_vec();
        assert!(records.iter().all(|r| r.evidence.retry_after.is_none()));
        // No pause was taken from a value that does not parse.
        let origin = Origin::parse(&server.url("/")).unwrap();
        let snap = registry.snapshot();
        assert_eq!(snap.len(), 1);
        assert_eq!(snap[0].origin, origin);
        assert_eq!(snap[0].paused_for, None);
        assert_eq!(server.requests_seen(), 3);
    })
    .await;
}

#[tokio::test]
async fn a_huge_valid_retry_after_is_capped_for_the_retry_and_the_shared_pause() {
    bounded(async {
        // 31 years, valid delta-seconds.
        let server =
            FaultServer::always(Action::status(429).header("retry-after", "999999999")).await;
        let max_pause = Duration::from_secs(2);
        let registry = BreakerRegistry::new(BreakerConfig::default().max_pause(max_pause)).unwrap();
        let client = stack(
            Resilience::new()
                .retry(
                    retry()
                        .max_retries(3)
                        .retry_after_cap(Duration::from_secs(60), RetryAfterPolicy::GiveUp),
                )
                .breaker(registry.clone()),
            plain_client(),
        );
        let (result, ext) = send(&client, client.post(server.url("/")).body("x")).await;
        assert_eq!(result.unwrap().status(), 429);
        assert_eq!(outcome(&ext).attempts, 1);
        assert_eq!(outcome(&ext).stop, StopReason::RetryAfterTooLong);
        let snap = registry.snapshot();
        let paused_for = snap[0].paused_for.expect("the 429 paused the origin");
        assert!(paused_for <= max_pause, "pause {paused_for:?} clamped");
        assert_eq!(server.requests_seen(), 1);
    })
    .await;
}

#[tokio::test]
async fn ten_thousand_redirects_stop_at_the_redirect_limit_and_are_not_retried() {
    bounded(async {
        let hops = Arc::new(AtomicUsize::new(0));
        let h = hops.clone();
        let server = FaultServer::start(move |i, _| {
            h.fetch_add(1, Ordering::SeqCst);
            if i < 10_000 {
                Action::status(302).header("location", &format!("/hop/{}", i + 1))
            } else {
                Action::ok("arrived")
            }
        })
        .await;
        let client = stack(Resilience::new().retry(retry()), plain_client());
        let (result, ext) = send(&client, client.get(server.url("/hop/0"))).await;
        let err = result.unwrap_err();
        assert_eq!(
            outcome(&ext).stop,
            StopReason::Permanent(FailureKind::Redirect)
        );
        assert_eq!(outcome(&ext).attempts, 1);
        // The reqwest error as reqwest returned it (the default `ErrorWrapping`).
        assert!(
            matches!(&err, reqwest_middleware::Error::Reqwest(e) if e.is_redirect()),
            "{err:?}"
        );
        // reqwest's default policy: the first request and 10 redirects.
        assert_eq!(server.requests_seen(), 11);
    })
    .await;
}

/// A server that reads each request head, then answers with `head` and `body`, writing
/// the part chosen as slow one byte per `interval`.
struct Slowloris {
    addr: std::net::SocketAddr,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Slowloris {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone, Copy)]
enum SlowPart {
    Head,
    Body,
    /// Endless `100 Continue` interim responses, one per interval.
    Informational,
}

impl Slowloris {
    async fn start(part: SlowPart, interval: Duration) -> Slowloris {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let c = connections.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                conns.spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    // A head and body far longer than any test waits for.
                    let body = vec![b'z'; 100_000];
                    let mut head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n", body.len())
                        .into_bytes();
                    let (fast, slow): (Vec<u8>, Vec<u8>) = match part {
                        SlowPart::Head => {
                            let mut slow = b"X-Slow: ".to_vec();
                            slow.extend(std::iter::repeat_n(b'a', 100_000));
                            (head, slow)
                        }
                        SlowPart::Body | SlowPart::Informational => {
                            head.extend_from_slice(b"\r\n");
                            (head, body)
                        }
                    };
                    if let SlowPart::Informational = part {
                        loop {
                            let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
                            if stream.write_all(interim).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(interval).await;
                        }
                    }
                    if stream.write_all(&fast).await.is_err() {
                        return;
                    }
                    for byte in slow {
                        if stream.write_all(&[byte]).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(interval).await;
                    }
                });
            }
        });
        Slowloris {
            addr,
            connections,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}

#[tokio::test]
async fn a_slowloris_head_ends_in_the_client_timeout_and_only_idempotent_requests_retry() {
    bounded(async {
        let server = Slowloris::start(SlowPart::Head, Duration::from_millis(50)).await;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let client = stack(Resilience::new().retry(retry().max_retries(2)), http);

        let (result, ext) = send(&client, client.get(server.url())).await;
        let err = result.unwrap_err();
        // reqwest's own timeout, unwrapped (the default `ErrorWrapping`).
        assert!(
            matches!(&err, reqwest_middleware::Error::Reqwest(e) if e.is_timeout()),
            "{err:?}"
        );
        assert_eq!(
            history(&ext),
            vec![(Transmission::Unknown, Some(FailureKind::Timeout)); 3]
        );
        assert_eq!(server.connections.load(Ordering::SeqCst), 3);

        let (result, ext) = send(&client, client.post(server.url()).body("pay")).await;
        assert!(result.is_err());
        assert_eq!(outcome(&ext).attempts, 1);
        assert_eq!(outcome(&ext).stop, StopReason::MayHaveBeenProcessed);
        assert_eq!(server.connections.load(Ordering::SeqCst), 4);
    })
    .await;
}

#[tokio::test]
async fn a_slowloris_body_ends_in_the_client_timeout_while_reading() {
    bounded(async {
        let server = Slowloris::start(SlowPart::Body, Duration::from_millis(50)).await;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let client = stack(Resilience::new().retry(retry()), http);
        let (result, ext) = send(&client, client.get(server.url())).await;
        // The head came in time: one attempt, returned as is.
        let response = result.unwrap();
        assert_eq!(outcome(&ext).attempts, 1);
        let err = response.text().await.unwrap_err();
        assert!(err.is_timeout(), "{err}");
        assert_eq!(server.connections.load(Ordering::SeqCst), 1);
    })
    .await;
}

#[tokio::test]
async fn a_slowloris_head_ends_at_the_total_deadline_without_a_client_timeout() {
    bounded(async {
        let server = Slowloris::start(SlowPart::Head, Duration::from_millis(50)).await;
        // No reqwest timeout at all: only the stack's deadline bounds the request.
        let client = stack(
            Resilience::new().retry(retry().total_deadline(Duration::from_millis(400))),
            plain_client(),
        );
        let (result, ext) = send(&client, client.get(server.url())).await;
        assert!(result.is_err());
        let o = outcome(&ext);
        assert_eq!(o.stop, StopReason::DeadlineExceeded);
        assert_eq!(
            history(&ext).last(),
            Some(&(Transmission::Unknown, Some(FailureKind::Timeout)))
        );
        assert!(server.connections.load(Ordering::SeqCst) >= 1);
    })
    .await;
}

#[tokio::test]
async fn endless_interim_responses_end_at_the_total_deadline() {
    bounded(async {
        let server = Slowloris::start(SlowPart::Informational, Duration::from_millis(5)).await;
        let client = stack(
            Resilience::new().retry(retry().total_deadline(Duration::from_millis(300))),
            plain_client(),
        );
        let (result, ext) = send(&client, client.get(server.url())).await;
        let err = result.unwrap_err();
        match ResilienceError::from_middleware_error(&err) {
            Some(ResilienceError::Retry(e)) => assert!(e.is_timeout(), "{e}"),
            other => panic!("not a retry error: {other:?}"),
        }
        assert_eq!(outcome(&ext).stop, StopReason::DeadlineExceeded);
        assert_eq!(outcome(&ext).attempts, 1);
        assert_eq!(server.connections.load(Ordering::SeqCst), 1);
    })
    .await;
}

fn token_source(fetches: Arc<AtomicUsize>) -> TokenManager {
    TokenManager::new(move || {
        let n = fetches.fetch_add(1, Ordering::SeqCst);
        async move {
            Ok::<_, std::io::Error>(
                AccessToken::new(format!("secret-{n}")).expires_in(Duration::from_secs(3600)),
            )
        }
    })
}

#[tokio::test]
async fn a_401_loop_is_replayed_once_then_returned() {
    bounded(async {
        let server = FaultServer::always(
            Action::status(401).header("www-authenticate", r#"Bearer error="invalid_token""#),
        )
        .await;
        let fetches = Arc::new(AtomicUsize::new(0));
        let auth = BearerAuth::builder(token_source(fetches.clone()))
            .origin(Origin::parse(&server.url("/")).unwrap())
            .allow_http_on_loopback()
            .build()
            .unwrap();
        let client = stack(
            Resilience::new().retry(retry()).bearer(auth),
            plain_client(),
        );
        let (result, ext) = send(&client, client.get(server.url("/"))).await;
        assert_eq!(result.unwrap().status(), 401);
        assert_eq!(outcome(&ext).attempts, 1, "a 401 is final for the retry");
        let seen: Vec<_> = server
            .requests()
            .iter()
            .map(|r| r.header("authorization").map(str::to_owned))
            .collect();
        assert_eq!(
            seen,
            [
                Some("Bearer secret-0".to_owned()),
                Some("Bearer secret-1".to_owned())
            ]
        );
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
    })
    .await;
}

#[tokio::test]
async fn a_cross_origin_redirect_after_a_401_never_carries_the_token() {
    bounded(async {
        let elsewhere = FaultServer::always(Action::ok("elsewhere")).await;
        let target = elsewhere.url("/steal");
        // The first request gets a 401; the replay (with a fresh token) is redirected away.
        let covered = FaultServer::start(move |i, _| {
            if i == 0 {
                Action::status(401)
            } else {
                Action::status(307).header("location", &target)
            }
        })
        .await;
        let fetches = Arc::new(AtomicUsize::new(0));
        let auth = BearerAuth::builder(token_source(fetches.clone()))
            .origin(Origin::parse(&covered.url("/")).unwrap())
            .allow_http_on_loopback()
            .build()
            .unwrap();
        let client = stack(
            Resilience::new().retry(retry()).bearer(auth),
            plain_client(),
        );
        let (result, _) = send(&client, client.post(covered.url("/pay")).body("x")).await;
        assert_eq!(result.unwrap().text().await.unwrap(), "elsewhere");
        let covered_seen: Vec<_> = covered
            .requests()
            .iter()
            .map(|r| r.header("authorization").map(str::to_owned))
            .collect();
        assert_eq!(
            covered_seen,
            [
                Some("Bearer secret-0".to_owned()),
                Some("Bearer secret-1".to_owned())
            ]
        );
        let stolen = elsewhere.requests();
        assert_eq!(stolen.len(), 1);
        assert!(
            stolen[0].headers.iter().all(|(_, v)| !v.contains("secret")),
            "{:?}",
            stolen[0].headers
        );
    })
    .await;
}

/// A token endpoint that redirects elsewhere must not get the client secret or the
/// refresh token (both in the POST body) sent on: a `307`/`308` keeps method and body.
#[cfg(feature = "oauth2")]
#[tokio::test]
async fn a_token_endpoint_redirect_never_forwards_the_client_secret_or_refresh_token() {
    use reqwest_resilience::auth::{ClientAuth, OAuth2Source, TokenErrorKind};
    bounded(async {
        let thief = FaultServer::always(Action::ok(r#"{"access_token":"stolen"}"#)).await;
        for status in [307, 308] {
            let target = thief.url("/collect");
            let endpoint =
                FaultServer::always(Action::status(status).header("location", &target)).await;
            let confidential =
                OAuth2Source::client_credentials(endpoint.url("/token"), "svc", "client-s3cret")
                    .client_auth(ClientAuth::RequestBody)
                    .allow_http_on_loopback()
                    .build()
                    .unwrap();
            let public =
                OAuth2Source::refresh_token(endpoint.url("/token"), "app", "refresh-s3cret")
                    .allow_http_on_loopback()
                    .build()
                    .unwrap();
            for source in [confidential, public] {
                let err = TokenManager::new(source).token().await.unwrap_err();
                assert_eq!(err.kind(), TokenErrorKind::Fetch, "{status}");
            }
            assert_eq!(endpoint.requests_seen(), 2);
        }
        assert_eq!(
            thief.requests_seen(),
            0,
            "the redirect target saw {:?}",
            thief
                .requests()
                .iter()
                .map(|r| String::from_utf8_lossy(&r.body).into_owned())
                .collect::<Vec<_>>()
        );
    })
    .await;
}

/// Two origins share one token; the first redirects to the second, reqwest strips the
/// token on the cross-origin hop, and the second answers `401`. That 401 says nothing
/// about the token: no refresh, no replay (otherwise every such request burns a token
/// fetch at the identity provider).
#[tokio::test]
async fn a_401_after_a_redirect_to_another_covered_origin_does_not_refresh_the_token() {
    bounded(async {
        let second = FaultServer::always(Action::status(401)).await;
        let target = second.url("/landing");
        let first = FaultServer::always(Action::status(302).header("location", &target)).await;
        let fetches = Arc::new(AtomicUsize::new(0));
        let auth = BearerAuth::builder(token_source(fetches.clone()))
            .origin(Origin::parse(&first.url("/")).unwrap())
            .origin(Origin::parse(&second.url("/")).unwrap())
            .allow_http_on_loopback()
            .build()
            .unwrap();
        let client = stack(
            Resilience::new().retry(retry()).bearer(auth),
            plain_client(),
        );
        for _ in 0..3 {
            let (result, _) = send(&client, client.get(first.url("/start"))).await;
            assert_eq!(result.unwrap().status(), 401);
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 1, "one token for all three");
        assert_eq!(first.requests_seen(), 3, "no replays");
        assert_eq!(second.requests_seen(), 3);
        assert!(
            second
                .requests()
                .iter()
                .all(|r| r.header("authorization").is_none())
        );
    })
    .await;
}

/// A host no DNS name can be (here 300 bytes, resolved to the loopback server by the
/// client itself) has no origin: the request goes through, and no breaker, limiter or
/// bearer token keeps or sees its text, so a hostile URL cannot make a registry hold
/// kilobytes per entry.
#[tokio::test]
async fn a_host_longer_than_any_dns_name_is_kept_by_no_registry() {
    let server = FaultServer::always(Action::ok("ok")).await;
    let label = "a".repeat(59);
    let host = [label.as_str(); 5].join(".");
    assert_eq!(host.len(), 299);
    let client = reqwest::Client::builder()
        .no_proxy()
        .resolve(&host, server.addr())
        .build()
        .unwrap();
    let breakers = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let limits = reqwest_resilience::limit::LimiterRegistry::new(
        reqwest_resilience::limit::LimiterConfig::fixed(8),
    )
    .unwrap();
    let tokens = TokenManager::new(|| async { Ok::<_, std::io::Error>(AccessToken::new("t")) });
    let auth = BearerAuth::builder(tokens.clone())
        .origin(Origin::parse(&server.url("/")).unwrap())
        .allow_http_on_loopback()
        .build()
        .unwrap();
    let client = stack(
        Resilience::new()
            .retry(retry())
            .breaker(breakers.clone())
            .concurrency_limit(limits.clone())
            .bearer(auth),
        client,
    );
    let url = format!("http://{host}:{}/long", server.addr().port());
    assert!(Origin::parse(&url).is_err());
    let (result, ext) = bounded(send(&client, client.get(&url))).await;
    assert_eq!(result.unwrap().status(), 200);
    let history = AttemptHistory::of(&ext).unwrap().attempts();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].evidence.origin, None);
    assert!(breakers.snapshot().is_empty());
    assert!(limits.snapshot().is_empty());
    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("authorization"),
        None,
        "no token for an origin-less URL"
    );
}
