//! Replayable streamed uploads ([`ReplayableBody`]): a 64 MiB file meets a refused
//! connection and a `503` with `Retry-After` on its way to a real nginx (WebDAV `PUT`),
//! which ends with exactly one complete copy; a POST reset mid-upload is not sent again,
//! an idempotent PUT is; a closure's stream is made afresh for each attempt; a file that
//! cannot be opened is a typed error, never sent; an upload is never hedged; `BearerAuth`'s
//! replay after a `401` re-opens the body; a stack without a retry loop still sends it.
//!
//! The servers are `tests/support/upload.rs`: each reads bodies as they arrive (a length
//! and a digest, never the whole body) and answers each connection from its script.
//! Paused clock: the waits (a 1 s backoff, `Retry-After: 1`) take no real time; nginx is a
//! real process, its log read on the real clock.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Extensions, StatusCode};
use reqwest_middleware::{Middleware, Next};
use reqwest_resilience::retry::{Hedging, StopReason};
use reqwest_resilience::upload::ReplayableBody;
use reqwest_resilience::{
    AccessToken, AttemptHistory, BearerAuth, FailureKind, Origin, Resilience, ResilienceError,
    SendWithHistory, TokenManager, Transmission,
};
use support::upload::{Step, UploadServer, nginx_dav, write_pattern_file};

const MIB: usize = 1024 * 1024;

/// A per-attempt middleware that starts the server listening before attempt `at` (the
/// attempts before it are refused).
struct OpenOnAttempt {
    server: Arc<UploadServer>,
    at: usize,
    seen: AtomicUsize,
}

#[reqwest_resilience::async_trait]
impl Middleware for OpenOnAttempt {
    async fn handle(
        &self,
        req: reqwest::Request,
        ext: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        if self.seen.fetch_add(1, Ordering::SeqCst) + 1 == self.at {
            self.server.open();
        }
        next.run(req, ext).await
    }
}

fn opens_on_second_attempt(server: &Arc<UploadServer>) -> Arc<dyn Middleware> {
    Arc::new(OpenOnAttempt {
        server: server.clone(),
        at: 2,
        seen: AtomicUsize::new(0),
    })
}

fn builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
}

/// The stack under test, without the no-progress bound: these tests run on tokio's paused
/// clock against servers on threads (and processes) of their own, and a paused clock jumps
/// to the next timer whenever the runtime waits on them, which would cut an upload the
/// server is still reading (the bound is tested in `tests/it/network.rs`).
fn stack() -> Resilience {
    Resilience::new()
        .retry(support::exact_retry())
        .network(reqwest_resilience::network::Network::new().no_progress(None))
}

/// A temporary file of `len` pattern bytes, removed on drop.
struct TempFile {
    path: std::path::PathBuf,
    digest: u64,
}

impl TempFile {
    fn new(name: &str, len: usize) -> TempFile {
        let path = std::env::temp_dir().join(format!(
            "reqwest-resilience-upload-{}-{name}",
            std::process::id()
        ));
        let digest = write_pattern_file(&path, len);
        TempFile { path, digest }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Each attempt's transmission, failure and status.
fn attempts(history: &AttemptHistory) -> Vec<(Transmission, Option<FailureKind>)> {
    history
        .attempts()
        .iter()
        .map(|r| (r.evidence.transmission, r.evidence.failure))
        .collect()
}

/// nginx's access log once it holds `n` lines (real clock, bounded: 10 s).
fn access_log(nginx: &support::nginx::Nginx, n: usize) -> Vec<String> {
    for _ in 0..1000 {
        let lines = nginx.access_log();
        if lines.len() >= n {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    nginx.access_log()
}

#[tokio::test(start_paused = true)]
async fn a_64_mib_file_meets_a_refusal_and_a_503_and_lands_once_on_nginx() {
    let Some(nginx) = nginx_dav() else { return };
    let file = TempFile::new("nginx.bin", 64 * MIB);
    // Connection 1 is refused; connection 2 reads the whole body and answers 503 with
    // Retry-After; connection 3 goes through to nginx.
    let front = UploadServer::refusing(
        vec![Step::Respond(503, vec![("retry-after", "1")])],
        Step::Forward(nginx.addr()),
    );
    let client = stack()
        .concurrency_limit(reqwest_resilience::limit::LimiterConfig::default())
        .per_attempt(opens_on_second_attempt(&front))
        .build_from(builder())
        .unwrap();

    let exchange = client
        .put(front.url("/files/pkg.tar.gz"))
        .with_extension(ReplayableBody::file(&file.path))
        .send_with_history()
        .await;

    let response = exchange.result.expect("uploaded");
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(
        attempts(&exchange.history),
        vec![
            (Transmission::NotSent, Some(FailureKind::Connect)),
            (
                Transmission::ResponseReceived(StatusCode::SERVICE_UNAVAILABLE),
                None
            ),
            (Transmission::ResponseReceived(StatusCode::CREATED), None),
        ]
    );
    let outcome = exchange.outcome.unwrap();
    assert_eq!(outcome.attempts, 3);
    assert_eq!(outcome.stop, StopReason::FinalResponse(StatusCode::CREATED));
    // The 503 read the whole body, sent with its length (not chunked).
    let seen = front.received();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].complete);
    assert_eq!(seen[0].len, 64 * MIB as u64);
    assert_eq!(seen[0].digest, file.digest);
    assert_eq!(seen[0].header("content-length"), Some("67108864"));
    assert_eq!(seen[0].header("transfer-encoding"), None);
    assert_eq!(front.connections(), 2);
    // nginx stored exactly one complete copy, from one PUT.
    let log = access_log(&nginx, 1);
    assert_eq!(log, vec!["PUT 201 67108864".to_owned()]);
    let stored = nginx.dir().join("www/files/pkg.tar.gz");
    let bytes = std::fs::read(&stored).expect("nginx stored the file");
    assert_eq!(bytes.len(), 64 * MIB);
    assert_eq!(support::upload::digest(&bytes), file.digest);
}

#[tokio::test(start_paused = true)]
async fn a_64_mib_post_is_retried_after_a_refusal_and_a_503_with_retry_after() {
    let file = TempFile::new("post.bin", 64 * MIB);
    let server = UploadServer::refusing(
        vec![Step::Respond(503, vec![("retry-after", "1")])],
        Step::Respond(201, vec![]),
    );
    let client = stack()
        .per_attempt(opens_on_second_attempt(&server))
        .build_from(builder())
        .unwrap();

    let exchange = client
        .post(server.url("/upload"))
        .with_extension(ReplayableBody::file(&file.path))
        .send_with_history()
        .await;

    assert_eq!(exchange.result.unwrap().status(), StatusCode::CREATED);
    assert_eq!(exchange.outcome.unwrap().attempts, 3);
    assert_eq!(
        attempts(&exchange.history)[0],
        (Transmission::NotSent, Some(FailureKind::Connect))
    );
    let seen = server.received();
    assert_eq!(seen.len(), 2, "the 503 and the 201");
    for request in &seen {
        assert_eq!(request.method, "POST");
        assert!(request.complete);
        assert_eq!(request.len, 64 * MIB as u64);
        assert_eq!(request.digest, file.digest);
    }
    assert_eq!(server.connections(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_post_reset_mid_upload_is_not_sent_again() {
    let file = TempFile::new("reset-post.bin", 32 * MIB);
    let server = UploadServer::start(
        vec![Step::ResetAfter(MIB as u64)],
        Step::Respond(201, vec![]),
    );
    let client = stack().build_from(builder()).unwrap();

    let exchange = client
        .post(server.url("/upload"))
        .with_extension(ReplayableBody::file(&file.path))
        .send_with_history()
        .await;

    assert!(exchange.result.is_err(), "{:?}", exchange.result);
    let outcome = exchange.outcome.unwrap();
    assert_eq!(outcome.attempts, 1);
    assert_eq!(outcome.stop, StopReason::MayHaveBeenProcessed);
    let (transmission, _) = attempts(&exchange.history)[0];
    assert!(transmission.may_have_been_processed(), "{transmission:?}");
    assert_eq!(server.connections(), 1);
    let seen = server.received();
    assert_eq!(seen.len(), 1);
    assert!(!seen[0].complete);
}

#[tokio::test(start_paused = true)]
async fn an_idempotent_put_reset_mid_upload_is_sent_again_whole() {
    let file = TempFile::new("reset-put.bin", 32 * MIB);
    let server = UploadServer::start(
        vec![Step::ResetAfter(MIB as u64)],
        Step::Respond(201, vec![]),
    );
    let client = stack().build_from(builder()).unwrap();

    let exchange = client
        .put(server.url("/upload"))
        .with_extension(ReplayableBody::file(&file.path))
        .send_with_history()
        .await;

    assert_eq!(exchange.result.unwrap().status(), StatusCode::CREATED);
    let outcome = exchange.outcome.unwrap();
    assert_eq!(outcome.attempts, 2);
    let (transmission, _) = attempts(&exchange.history)[0];
    assert!(transmission.may_have_been_processed(), "{transmission:?}");
    let seen = server.received();
    assert_eq!(seen.len(), 2);
    assert!(!seen[0].complete);
    assert!(seen[1].complete);
    assert_eq!(seen[1].len, 32 * MIB as u64);
    assert_eq!(seen[1].digest, file.digest);
}

#[tokio::test(start_paused = true)]
async fn a_post_with_an_idempotency_key_reset_mid_upload_is_sent_again() {
    let file = TempFile::new("reset-key.bin", 32 * MIB);
    let server = UploadServer::start(
        vec![Step::ResetAfter(MIB as u64)],
        Step::Respond(201, vec![]),
    );
    let client = stack().build_from(builder()).unwrap();

    let exchange = client
        .post(server.url("/upload"))
        .header("idempotency-key", "upload-7")
        .with_extension(ReplayableBody::file(&file.path))
        .send_with_history()
        .await;

    assert_eq!(exchange.result.unwrap().status(), StatusCode::CREATED);
    assert_eq!(exchange.outcome.unwrap().attempts, 2);
    let seen = server.received();
    assert_eq!(seen.len(), 2);
    assert!(seen[1].complete);
    assert_eq!(seen[1].digest, file.digest);
}

#[tokio::test(start_paused = true)]
async fn a_closure_makes_a_fresh_stream_for_each_attempt() {
    let server = UploadServer::start(
        vec![Step::Respond(503, vec![("retry-after", "1")])],
        Step::Respond(201, vec![]),
    );
    let client = stack().build_from(builder()).unwrap();
    let made = Arc::new(AtomicUsize::new(0));
    let counter = made.clone();
    let body = ReplayableBody::from_fn(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        let chunks = (0..64u8).map(|i| Ok::<_, std::io::Error>(vec![i; 16 * 1024]));
        futures_util::stream::iter(chunks)
    });
    let expected: Vec<u8> = (0..64u8).flat_map(|i| vec![i; 16 * 1024]).collect();

    let exchange = client
        .post(server.url("/upload"))
        .with_extension(body)
        .send_with_history()
        .await;

    assert_eq!(exchange.result.unwrap().status(), StatusCode::CREATED);
    assert_eq!(exchange.outcome.unwrap().attempts, 2);
    assert_eq!(made.load(Ordering::SeqCst), 2);
    let seen = server.received();
    assert_eq!(seen.len(), 2);
    for request in &seen {
        assert!(request.complete);
        assert_eq!(request.header("transfer-encoding"), Some("chunked"));
        assert_eq!(request.header("content-length"), None);
        assert_eq!(request.len, expected.len() as u64);
        assert_eq!(request.digest, support::upload::digest(&expected));
    }
}

#[tokio::test(start_paused = true)]
async fn a_file_that_cannot_be_opened_is_a_typed_error_never_sent() {
    let server = UploadServer::start(vec![], Step::Respond(201, vec![]));
    let client = stack().build_from(builder()).unwrap();
    let missing = std::env::temp_dir().join("reqwest-resilience-upload-no-such-file");

    let exchange = client
        .put(server.url("/upload"))
        .with_extension(ReplayableBody::file(&missing))
        .send_with_history()
        .await;

    let err = exchange.result.unwrap_err();
    let Some(ResilienceError::UploadBody(e)) = ResilienceError::find(&err) else {
        panic!("{err:?}")
    };
    assert!(e.is_open());
    assert_eq!(e.path(), Some(missing.as_path()));
    assert_eq!(
        e.io_error().map(std::io::Error::kind),
        Some(std::io::ErrorKind::NotFound)
    );
    assert_eq!(
        attempts(&exchange.history),
        vec![(Transmission::NotSent, Some(FailureKind::Builder))]
    );
    let outcome = exchange.outcome.unwrap();
    assert_eq!(outcome.attempts, 1);
    assert_eq!(outcome.stop, StopReason::Permanent(FailureKind::Builder));
    assert_eq!(server.connections(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_upload_is_never_hedged() {
    let file = TempFile::new("hedge.bin", MIB);
    // Every answer takes 5 s; every PUT without an answer after 100 ms gets a hedge.
    let slow = Step::Slow(Duration::from_secs(5), 201);
    let hedging = Hedging::fixed(Duration::from_millis(100))
        .hedge_idempotent(true)
        .no_budget();
    let client = Resilience::new()
        .retry(support::exact_retry().hedging(hedging))
        .build_from(builder())
        .unwrap();

    // A buffered body is hedged: the setup sends hedges.
    let buffered = UploadServer::start(vec![], slow.clone());
    let exchange = client
        .put(buffered.url("/upload"))
        .body(vec![7u8; 1024])
        .send_with_history()
        .await;
    assert_eq!(exchange.result.unwrap().status(), StatusCode::CREATED);
    assert_eq!(exchange.outcome.unwrap().attempts, 2, "one hedge");
    assert_eq!(buffered.connections(), 2);

    let server = UploadServer::start(vec![], slow);
    let exchange = client
        .put(server.url("/upload"))
        .with_extension(ReplayableBody::file(&file.path))
        .send_with_history()
        .await;

    assert_eq!(exchange.result.unwrap().status(), StatusCode::CREATED);
    assert_eq!(exchange.history.len(), 1);
    assert_eq!(exchange.outcome.unwrap().attempts, 1);
    assert_eq!(server.connections(), 1);
    assert!(server.received()[0].complete);
    assert_eq!(server.received()[0].digest, file.digest);
}

#[tokio::test(start_paused = true)]
async fn bearer_auth_replays_a_401_with_the_body_opened_again() {
    let file = TempFile::new("auth.bin", 2 * MIB);
    let server = UploadServer::start(vec![Step::Respond(401, vec![])], Step::Respond(201, vec![]));
    let fetched = Arc::new(AtomicUsize::new(0));
    let count = fetched.clone();
    let manager = TokenManager::new(move || {
        let n = count.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, std::io::Error>(AccessToken::new(format!("token-{n}"))) }
    });
    let origin = Origin::parse(&server.url("/")).unwrap();
    let auth = BearerAuth::builder(manager)
        .origin(origin)
        .allow_http_on_loopback()
        .build()
        .unwrap();
    let client = stack().bearer(auth).build_from(builder()).unwrap();

    let exchange = client
        .post(server.url("/upload"))
        .with_extension(ReplayableBody::file(&file.path))
        .send_with_history()
        .await;

    assert_eq!(exchange.result.unwrap().status(), StatusCode::CREATED);
    assert_eq!(fetched.load(Ordering::SeqCst), 2);
    let seen = server.received();
    assert_eq!(seen.len(), 2);
    for (request, token) in seen.iter().zip(["Bearer token-0", "Bearer token-1"]) {
        assert_eq!(request.header("authorization"), Some(token));
        assert!(request.complete);
        assert_eq!(request.len, 2 * MIB as u64);
        assert_eq!(request.digest, file.digest);
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_retry_loop_the_transport_step_opens_the_body_once() {
    let file = TempFile::new("no-retry.bin", MIB);
    let server = UploadServer::start(
        vec![Step::Respond(503, vec![("retry-after", "1")])],
        Step::Respond(201, vec![]),
    );
    let client = Resilience::new().no_retry().build_from(builder()).unwrap();

    let exchange = client
        .put(server.url("/upload"))
        .with_extension(ReplayableBody::file(&file.path))
        .send_with_history()
        .await;

    assert_eq!(
        exchange.result.unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(exchange.history.len(), 1);
    let seen = server.received();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].complete);
    assert_eq!(seen[0].digest, file.digest);
    assert_eq!(seen[0].header("content-length"), Some("1048576"));
}

/// The body of the closure tests: 16 chunks of 4 KiB.
fn small_stream_body() -> (ReplayableBody, u64) {
    let make = || {
        let chunks = (0..16u8).map(|i| Ok::<_, std::io::Error>(vec![i; 4096]));
        futures_util::stream::iter(chunks)
    };
    let expected: Vec<u8> = (0..16u8).flat_map(|i| vec![i; 4096]).collect();
    (
        ReplayableBody::from_fn(make),
        support::upload::digest(&expected),
    )
}

/// Two requests of the 64 KiB stream body, whole: the 503 and the 201.
fn assert_sent_twice_whole(server: &UploadServer, digest: u64) {
    let seen = server.received();
    assert_eq!(seen.len(), 2);
    for request in &seen {
        assert!(request.complete);
        assert_eq!(request.len, 16 * 4096);
        assert_eq!(request.digest, digest);
    }
}

#[tokio::test(start_paused = true)]
async fn the_middlewares_used_alone_reopen_the_body_across_their_next() {
    let server = UploadServer::start(
        vec![Step::Respond(503, vec![("retry-after", "1")])],
        Step::Respond(201, vec![]),
    );
    let client = reqwest_middleware::ClientBuilder::new(builder().build().unwrap())
        .with(support::exact_retry().build().unwrap())
        .with(reqwest_resilience::CircuitBreakerMiddleware::new(
            reqwest_resilience::BreakerRegistry::default(),
        ))
        .with(reqwest_resilience::TransportEvidence::new())
        .build();
    let (body, digest) = small_stream_body();

    let exchange = client
        .post(server.url("/upload"))
        .with_extension(body)
        .send_with_history()
        .await;

    assert_eq!(exchange.result.unwrap().status(), StatusCode::CREATED);
    assert_eq!(exchange.outcome.unwrap().attempts, 2);
    assert_eq!(exchange.history.len(), 2);
    assert_sent_twice_whole(&server, digest);
}

#[cfg(feature = "astral")]
#[tokio::test(start_paused = true)]
async fn the_stack_in_the_astral_fork_reopens_the_body() {
    use reqwest_resilience::stack::astral::AstralResilience;
    let server = UploadServer::start(
        vec![Step::Respond(503, vec![("retry-after", "1")])],
        Step::Respond(201, vec![]),
    );
    let client = stack().build_from_astral(builder()).unwrap();
    let (body, digest) = small_stream_body();

    let response = client
        .post(server.url("/upload"))
        .with_extension(body)
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), StatusCode::CREATED);
    assert_sent_twice_whole(&server, digest);
}

#[tokio::test(start_paused = true)]
async fn with_no_retry_left_the_upload_is_sent_once_whole() {
    let file = TempFile::new("max-retries-0.bin", MIB);
    let server = UploadServer::start(
        vec![Step::Respond(503, vec![("retry-after", "1")])],
        Step::Respond(201, vec![]),
    );
    let client = stack().build_from(builder()).unwrap();

    let exchange = client
        .put(server.url("/upload"))
        .with_extension(ReplayableBody::file(&file.path))
        .with_extension(reqwest_resilience::retry::MaxRetries(0))
        .send_with_history()
        .await;

    assert_eq!(
        exchange.result.unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let outcome = exchange.outcome.unwrap();
    assert_eq!(outcome.attempts, 1);
    assert_eq!(outcome.stop, StopReason::RetriesExhausted);
    let seen = server.received();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].complete);
    assert_eq!(seen[0].digest, file.digest);
}

/// uv's publish (`uv-publish`'s `upload`) rebuilds its multipart request by hand for every
/// retry, because the file part is a stream. As a closure: the form's parts written around
/// the file's stream with a boundary fixed in the `Content-Type` (reqwest's `Form` draws a
/// new boundary each time it is built), the file opened afresh for each attempt.
#[tokio::test(start_paused = true)]
async fn uvs_publish_upload_is_one_request_without_its_loop() {
    use tokio::io::AsyncReadExt;
    const BOUNDARY: &str = "reqwest-resilience-7f3a9c";
    let file = TempFile::new("pkg-1.0.tar.gz", 4 * MIB);
    let head = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\":action\"\r\n\r\nfile_upload\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"content\"; \
         filename=\"pkg-1.0.tar.gz\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    );
    let tail = format!("\r\n--{BOUNDARY}--\r\n");
    enum Part {
        Head,
        Open,
        File(tokio::fs::File),
        Tail,
        Done,
    }
    let (path, opened) = (file.path.clone(), Arc::new(AtomicUsize::new(0)));
    let (h, t, count) = (head.clone(), tail.clone(), opened.clone());
    let body = ReplayableBody::from_fn(move || {
        let (path, head, tail, count) = (path.clone(), h.clone(), t.clone(), count.clone());
        futures_util::stream::unfold(Part::Head, move |part| {
            let (path, head, tail, count) =
                (path.clone(), head.clone(), tail.clone(), count.clone());
            async move {
                let mut file = match part {
                    Part::Head => return Some((Ok(head.into_bytes()), Part::Open)),
                    Part::Tail => return Some((Ok(tail.into_bytes()), Part::Done)),
                    Part::Done => return None,
                    Part::Open => {
                        count.fetch_add(1, Ordering::SeqCst);
                        match tokio::fs::File::open(&path).await {
                            Ok(file) => file,
                            Err(e) => return Some((Err(e), Part::Done)),
                        }
                    }
                    Part::File(file) => file,
                };
                let mut chunk = vec![0u8; 64 * 1024];
                match file.read(&mut chunk).await {
                    Ok(0) => Some((Ok(Vec::new()), Part::Tail)),
                    Ok(n) => {
                        chunk.truncate(n);
                        Some((Ok(chunk), Part::File(file)))
                    }
                    Err(e) => Some((Err(e), Part::Done)),
                }
            }
        })
    });
    let server = UploadServer::start(
        vec![Step::Respond(503, vec![("retry-after", "1")])],
        Step::Respond(201, vec![]),
    );
    let client = stack().build_from(builder()).unwrap();

    let exchange = client
        .post(server.url("/legacy/"))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .with_extension(body)
        .send_with_history()
        .await;

    assert_eq!(exchange.result.unwrap().status(), StatusCode::CREATED);
    assert_eq!(exchange.outcome.unwrap().attempts, 2);
    assert_eq!(opened.load(Ordering::SeqCst), 2);
    let mut expected = support::upload::Digest::default();
    expected.update(head.as_bytes());
    expected.update(&std::fs::read(&file.path).unwrap());
    expected.update(tail.as_bytes());
    let len = (head.len() + 4 * MIB + tail.len()) as u64;
    let seen = server.received();
    assert_eq!(seen.len(), 2);
    for request in &seen {
        assert!(request.complete);
        assert_eq!(request.len, len);
        assert_eq!(request.digest, expected.value());
        assert_eq!(
            request.header("content-type"),
            Some(format!("multipart/form-data; boundary={BOUNDARY}").as_str())
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_closures_stream_error_is_an_upload_body_error_and_a_post_is_not_sent_again() {
    let server = UploadServer::start(vec![], Step::Respond(201, vec![]));
    let client = stack().build_from(builder()).unwrap();
    let body = ReplayableBody::from_fn(|| {
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![
            Ok(vec![1u8; 4096]),
            Err(std::io::Error::other("the source broke")),
        ];
        futures_util::stream::iter(chunks)
    });

    let exchange = client
        .post(server.url("/upload"))
        .with_extension(body)
        .send_with_history()
        .await;

    let err = exchange.result.unwrap_err();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    let mut found = None;
    while let Some(e) = cause {
        if let Some(upload) = e.downcast_ref::<reqwest_resilience::upload::UploadBodyError>() {
            found = Some(upload);
        }
        cause = e.source();
    }
    let found = found.expect("an UploadBodyError in the chain");
    assert!(!found.is_open());
    assert_eq!(found.path(), None);
    assert_eq!(
        found.io_error().map(ToString::to_string),
        Some("the source broke".to_owned())
    );
    let outcome = exchange.outcome.unwrap();
    assert_eq!(outcome.attempts, 1);
    // The caller's own failure (issue 42): never retried, whatever the method.
    assert_eq!(outcome.stop, StopReason::Permanent(FailureKind::UploadBody));
    // hyper drops the connection when the body fails: the server saw one connection and
    // never a whole body (whether the head reached it first is hyper's buffering).
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(server.connections(), 1);
    assert!(server.received().iter().all(|r| !r.complete));
}

/// A closure body whose stream breaks on this side after one 4 KiB chunk (the caller's own
/// read error), counting how often the closure is called.
fn broken_stream_body(made: &Arc<AtomicUsize>) -> ReplayableBody {
    let made = made.clone();
    ReplayableBody::from_fn(move || {
        made.fetch_add(1, Ordering::SeqCst);
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![
            Ok(vec![1u8; 4096]),
            Err(std::io::Error::other("the caller's source broke")),
        ];
        futures_util::stream::iter(chunks)
    })
}

/// The caller's own stream error says nothing about the server: two such uploads leave the
/// origin's breaker (tripping after 2 failures) closed, and another caller's GET goes out
/// at once, answered on its first attempt.
#[tokio::test(start_paused = true)]
async fn a_callers_stream_error_leaves_the_servers_breaker_closed() {
    let server = UploadServer::start(vec![], Step::Respond(200, vec![]));
    let breakers = reqwest_resilience::BreakerRegistry::new(
        reqwest_resilience::BreakerConfig::default()
            .policy(reqwest_resilience::breaker::TripPolicy::consecutive_failures(2)),
    )
    .unwrap();
    let client = stack()
        .breaker(breakers.clone())
        .build_from(builder())
        .unwrap();
    let made = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let exchange = client
            .post(server.url("/upload"))
            .with_extension(broken_stream_body(&made))
            .send_with_history()
            .await;
        assert!(exchange.result.is_err());
        assert_eq!(
            attempts(&exchange.history),
            vec![(Transmission::Unknown, Some(FailureKind::UploadBody))]
        );
        assert_eq!(exchange.outcome.unwrap().attempts, 1);
    }
    let origin = Origin::parse(&server.url("")).unwrap();
    assert_eq!(
        breakers.state(&origin),
        Some(reqwest_resilience::BreakerState::Closed)
    );
    let failures = breakers
        .snapshot()
        .into_iter()
        .find(|s| s.origin == origin)
        .map(|s| s.consecutive_failures);
    assert_eq!(failures, Some(0));

    let started = tokio::time::Instant::now();
    let exchange = client.get(server.url("/status")).send_with_history().await;
    assert_eq!(exchange.result.unwrap().status(), StatusCode::OK);
    assert_eq!(exchange.outcome.unwrap().attempts, 1);
    assert_eq!(
        attempts(&exchange.history),
        vec![(Transmission::ResponseReceived(StatusCode::OK), None)]
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(made.load(Ordering::SeqCst), 2);
}

/// An idempotent PUT whose stream breaks on this side is not retried: the closure is called
/// once, and the error is the stack's own `UploadBodyError` with the caller's error beneath.
#[tokio::test(start_paused = true)]
async fn a_put_whose_stream_breaks_locally_is_not_retried() {
    let server = UploadServer::start(vec![], Step::Respond(201, vec![]));
    let client = stack().build_from(builder()).unwrap();
    let made = Arc::new(AtomicUsize::new(0));

    let exchange = client
        .put(server.url("/upload"))
        .with_extension(broken_stream_body(&made))
        .send_with_history()
        .await;

    assert_eq!(made.load(Ordering::SeqCst), 1);
    let err = exchange.result.unwrap_err();
    let found =
        reqwest_resilience::chain::find::<reqwest_resilience::upload::UploadBodyError>(&err)
            .expect("an UploadBodyError in the chain");
    assert!(!found.is_open());
    assert_eq!(found.path(), None);
    assert_eq!(
        found.io_error().map(ToString::to_string),
        Some("the caller's source broke".to_owned())
    );
    assert_eq!(
        attempts(&exchange.history),
        vec![(Transmission::Unknown, Some(FailureKind::UploadBody))]
    );
    let outcome = exchange.outcome.unwrap();
    assert_eq!(outcome.attempts, 1);
    assert_eq!(outcome.stop, StopReason::Permanent(FailureKind::UploadBody));
}

/// A GET carrying a closure's body of unknown length: hyper drops such a body of a GET
/// unless the request says `Transfer-Encoding: chunked`, so the stack says it. The server
/// reads the whole body, exactly once.
#[tokio::test(start_paused = true)]
async fn a_get_with_a_closures_body_sends_it_chunked() {
    let server = UploadServer::start(vec![], Step::Respond(200, vec![]));
    let client = stack().build_from(builder()).unwrap();
    let (body, digest) = small_stream_body();

    let exchange = client
        .get(server.url("/search"))
        .with_extension(body)
        .send_with_history()
        .await;

    assert_eq!(exchange.result.unwrap().status(), StatusCode::OK);
    assert_eq!(exchange.outcome.unwrap().attempts, 1);
    let seen = server.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "GET");
    assert!(seen[0].complete);
    assert_eq!(seen[0].header("transfer-encoding"), Some("chunked"));
    assert_eq!(seen[0].header("content-length"), None);
    assert_eq!(seen[0].len, 16 * 4096);
    assert_eq!(seen[0].digest, digest);
    assert_eq!(server.connections(), 1);
}

/// A GET whose closure body comes with a `Content-Length` of the caller's is sent with it,
/// not chunked.
#[tokio::test(start_paused = true)]
async fn a_get_with_a_closures_body_and_its_length_sends_that_length() {
    let server = UploadServer::start(vec![], Step::Respond(200, vec![]));
    let client = stack().build_from(builder()).unwrap();
    let (body, digest) = small_stream_body();

    let exchange = client
        .get(server.url("/search"))
        .header("content-length", (16 * 4096).to_string())
        .with_extension(body)
        .send_with_history()
        .await;

    assert_eq!(exchange.result.unwrap().status(), StatusCode::OK);
    let seen = server.received();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].complete);
    assert_eq!(seen[0].header("transfer-encoding"), None);
    assert_eq!(seen[0].header("content-length"), Some("65536"));
    assert_eq!((seen[0].len, seen[0].digest), (16 * 4096, digest));
}
