//! Network weather through `build_from`'s client (`reqwest_resilience::network`): the
//! no-progress bound, and a wake from a suspend (the crate's wall clock made to jump) that
//! retires the connections opened before it. Loopback servers in the test's runtime, on
//! tokio's paused clock: every bound here is a tokio timer, so the paused clock drives it
//! exactly. The address race and the harness with network namespaces (a dropped path, an
//! address change, a link down) are in `network_race.rs` and `weather.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use reqwest_resilience::network::{Network, NoProgress};
use reqwest_resilience::retry::RetryReason;
use reqwest_resilience::{
    AttemptDecision, AttemptHistory, FailureKind, Resilience, ResilienceError, SendWithHistory,
    Transmission,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{self, Action, FaultServer};

const BOUND: Duration = Duration::from_secs(300);

fn builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
}

fn stack() -> Resilience {
    Resilience::new().retry(support::exact_retry())
}

/// Each attempt's transmission and failure.
fn attempts(history: &AttemptHistory) -> Vec<(Transmission, Option<FailureKind>)> {
    history
        .attempts()
        .iter()
        .map(|r| (r.evidence.transmission, r.evidence.failure))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_get_to_a_server_that_never_answers_is_cut_at_the_bound_and_retried() {
    let server = FaultServer::always(Action::Stall).await;
    let client = stack().build_from(builder).unwrap();
    let started = tokio::time::Instant::now();

    let exchange = client.get(server.url("/stuck")).send_with_history().await;

    let err = exchange.result.expect_err("the server never answers");
    let cut = (Transmission::Unknown, Some(FailureKind::NoProgress));
    assert_eq!(attempts(&exchange.history), vec![cut; 4]);
    assert_eq!(server.requests_seen(), 4);
    // Four bounds and the backoff between them (1 s, 2 s, 4 s), on the paused clock.
    assert_eq!(started.elapsed(), 4 * BOUND + Duration::from_secs(7));
    match ResilienceError::find(&err) {
        Some(ResilienceError::NoProgress { after, origin }) => {
            assert_eq!((*after, origin.port()), (BOUND, server.addr().port()));
        }
        other => panic!("expected NoProgress, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_post_to_a_server_that_never_answers_is_cut_once_and_not_sent_again() {
    let server = FaultServer::always(Action::Stall).await;
    let client = stack().build_from(builder).unwrap();

    let exchange = client
        .post(server.url("/pay"))
        .body("1 EUR")
        .send_with_history()
        .await;

    assert!(exchange.result.is_err());
    assert_eq!(
        attempts(&exchange.history),
        vec![(Transmission::Unknown, Some(FailureKind::NoProgress))]
    );
    assert_eq!(
        server.requests_seen(),
        1,
        "the POST reached the server once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_answer_within_the_bound_is_not_cut() {
    let slow = Duration::from_secs(290);
    let server = FaultServer::always(Action::Delay(slow, Box::new(Action::ok("late")))).await;
    let client = stack().build_from(builder).unwrap();

    let response = client.get(server.url("/slow")).send().await.unwrap();

    assert_eq!(response.text().await.unwrap(), "late");
    assert_eq!(server.requests_seen(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_body_that_stops_after_its_head_fails_at_the_bound_with_no_progress() {
    // A body larger than the ones the stack leaves unwatched (16 KiB comes with its head).
    let body = vec![b'x'; 64 * 1024];
    let server = FaultServer::always(Action::BodyAfter(Duration::from_secs(400), body)).await;
    let client = stack().build_from(builder).unwrap();
    let response = client.get(server.url("/file")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let head_at = tokio::time::Instant::now();

    let err = response.bytes().await.expect_err("the body stalls");

    assert_eq!(head_at.elapsed(), BOUND);
    let cut = support::chain_messages(&err);
    assert!(
        cut.iter()
            .any(|m| m == &NoProgress { after: BOUND }.to_string()),
        "{cut:?}"
    );
}

/// A server that answers `GET` with a chunked body of `chunks` chunks, one every `gap`.
async fn streaming_server(chunks: usize, gap: Duration) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut head = [0u8; 1024];
        let _ = stream.read(&mut head).await.unwrap();
        let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        for _ in 0..chunks {
            tokio::time::sleep(gap).await;
            stream.write_all(b"5\r\ntoken\r\n").await.unwrap();
        }
        stream.write_all(b"0\r\n\r\n").await.unwrap();
    });
    addr
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_sends_a_chunk_within_each_bound_is_never_cut() {
    // Ten tokens 200 s apart: 2 000 s in all, each gap inside the 300 s bound.
    let addr = streaming_server(10, Duration::from_secs(200)).await;
    let client = stack().build_from(builder).unwrap();

    let response = client
        .get(format!("http://{addr}/tokens"))
        .send()
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let body = response.text().await.unwrap();

    assert_eq!(body, "token".repeat(10));
    assert_eq!(started.elapsed(), Duration::from_secs(2000));
}

#[tokio::test(start_paused = true)]
async fn without_the_bound_a_server_that_never_answers_is_waited_for() {
    let server = FaultServer::always(Action::Stall).await;
    let client = stack()
        .network(Network::new().no_progress(None))
        .build_from(builder)
        .unwrap();

    let waited = tokio::time::timeout(
        Duration::from_secs(3600),
        client.get(server.url("/stuck")).send(),
    )
    .await;

    assert!(waited.is_err(), "still waiting after an hour");
    assert_eq!(server.requests_seen(), 1);
}

/// A wall clock that runs `ahead` of the system's: moving it forward is a wake from a
/// suspend, as the stack sees it.
fn jumping_clock() -> (
    Arc<AtomicU64>,
    impl Fn() -> SystemTime + Send + Sync + 'static,
) {
    let ahead = Arc::new(AtomicU64::new(0));
    let read = ahead.clone();
    let clock = move || SystemTime::now() + Duration::from_secs(read.load(Ordering::SeqCst));
    (ahead, clock)
}

/// Waits (yielding on the paused clock) until `server` has seen `n` requests.
async fn until_seen(server: &FaultServer, n: usize) {
    for _ in 0..10_000 {
        if server.requests_seen() >= n {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!(
        "the server saw {} requests, not {n}",
        server.requests_seen()
    );
}

#[tokio::test(start_paused = true)]
async fn a_wake_from_a_suspend_cuts_a_waiting_get_and_sends_it_at_once_on_a_new_connection() {
    // The first request is held (a connection whose path died in the sleep); the others
    // are answered.
    let server = FaultServer::sequence(vec![Action::Stall], Action::ok("fresh")).await;
    let (ahead, clock) = jumping_clock();
    let client = stack()
        .network(Network::new().wall_clock(clock))
        .build_from(builder)
        .unwrap();
    let waiting = tokio::spawn({
        let (client, url) = (client.clone(), server.url("/index"));
        async move { client.get(url).send_with_history().await }
    });
    until_seen(&server, 1).await;

    // The laptop slept an hour; the next request notices.
    ahead.store(3600, Ordering::SeqCst);
    let other = client.get(server.url("/other")).send().await.unwrap();
    let cut_at = tokio::time::Instant::now();
    let exchange = waiting.await.unwrap();

    assert_eq!(other.text().await.unwrap(), "fresh");
    let response = exchange.result.expect("sent again after the wake");
    assert_eq!(response.text().await.unwrap(), "fresh");
    assert_eq!(
        cut_at.elapsed(),
        Duration::ZERO,
        "no backoff, no bound waited"
    );
    assert_eq!(
        attempts(&exchange.history),
        vec![
            (Transmission::Unknown, Some(FailureKind::NetworkChanged)),
            (
                Transmission::ResponseReceived(reqwest::StatusCode::OK),
                None
            ),
        ]
    );
    assert_eq!(
        exchange.history.attempts()[0].decision,
        Some(AttemptDecision::Retry {
            delay: Duration::ZERO,
            reason: RetryReason::NetworkChanged,
        })
    );
    // The held GET, the other request, the GET again: each on a connection of its own.
    assert_eq!((server.requests_seen(), server.connections()), (3, 3));
}

#[tokio::test(start_paused = true)]
async fn a_wake_from_a_suspend_leaves_a_post_in_flight_to_its_own_end() {
    let server = FaultServer::sequence(vec![Action::Stall], Action::ok("fresh")).await;
    let (ahead, clock) = jumping_clock();
    let client = stack()
        .network(Network::new().wall_clock(clock))
        .build_from(builder)
        .unwrap();
    let waiting = tokio::spawn({
        let (client, url) = (client.clone(), server.url("/pay"));
        async move { client.post(url).body("1 EUR").send_with_history().await }
    });
    until_seen(&server, 1).await;

    ahead.store(3600, Ordering::SeqCst);
    let _ = client.get(server.url("/other")).send().await.unwrap();
    let exchange = waiting.await.unwrap();

    // Not cut by the change: the POST waited for its own bound, and was sent once.
    assert!(exchange.result.is_err());
    assert_eq!(
        attempts(&exchange.history),
        vec![(Transmission::Unknown, Some(FailureKind::NoProgress))]
    );
    let posts = server
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .count();
    assert_eq!(posts, 1);
}

#[tokio::test(start_paused = true)]
async fn after_a_wake_new_requests_do_not_reuse_a_connection_pooled_before_it() {
    let server = FaultServer::always(Action::ok("hi")).await;
    let (ahead, clock) = jumping_clock();
    let pooled = || reqwest::Client::builder().no_proxy();
    let client = stack()
        .network(Network::new().wall_clock(clock))
        .build_from(pooled)
        .unwrap();
    for _ in 0..2 {
        client
            .get(server.url("/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
    }
    assert_eq!(server.connections(), 1, "kept alive before the sleep");

    ahead.store(3600, Ordering::SeqCst);
    for _ in 0..2 {
        client
            .get(server.url("/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
    }

    assert_eq!(
        (server.requests_seen(), server.connections()),
        (4, 2),
        "one new connection after the wake, kept alive from then on"
    );
}

#[tokio::test(start_paused = true)]
async fn with_a_single_builder_a_wake_cannot_retire_the_pool() {
    // A single `ClientBuilder` cannot be built again: the client keeps its pool (the
    // documented limit; `build_from` with a closure retires it).
    let server = FaultServer::always(Action::ok("hi")).await;
    let (ahead, clock) = jumping_clock();
    let client = stack()
        .network(Network::new().wall_clock(clock))
        .build_from(reqwest::Client::builder().no_proxy())
        .unwrap();
    client
        .get(server.url("/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    ahead.store(3600, Ordering::SeqCst);
    client
        .get(server.url("/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();

    assert_eq!((server.requests_seen(), server.connections()), (2, 1));
}

/// A server that reads a request's body 8 MiB every `gap`, then answers `201` with the
/// number of body bytes it read.
async fn slow_reader(gap: Duration) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut head = Vec::new();
        // The head, then the body as it comes.
        let body_len = loop {
            let n = stream.read(&mut buf[..1024]).await.unwrap();
            head.extend_from_slice(&buf[..n]);
            if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                break head.len() - end - 4;
            }
        };
        let mut read = body_len;
        while read < 32 << 20 {
            tokio::time::sleep(gap).await;
            let mut taken = 0;
            while taken < (8 << 20) && read < 32 << 20 {
                let want = buf.len().min((8 << 20) - taken);
                let n = stream.read(&mut buf[..want]).await.unwrap();
                assert!(n > 0, "the client closed mid-body");
                (taken, read) = (taken + n, read + n);
            }
        }
        let answer = format!(
            "HTTP/1.1 201 Created\r\ncontent-length: {}\r\n\r\n{read}",
            read.to_string().len()
        );
        stream.write_all(answer.as_bytes()).await.unwrap();
    });
    addr
}

#[tokio::test(start_paused = true)]
async fn an_upload_the_server_reads_slowly_is_not_cut_while_it_progresses() {
    // 32 MiB taken 8 MiB every 100 s: 400 s in all, longer than the bound, and never
    // 300 s without progress (what the system buffers drains within the bound).
    let addr = slow_reader(Duration::from_secs(100)).await;
    let client = stack().build_from(builder).unwrap();
    let started = tokio::time::Instant::now();

    let exchange = client
        .put(format!("http://{addr}/upload"))
        .body(vec![7u8; 32 << 20])
        .send_with_history()
        .await;

    let response = exchange.result.expect("uploaded");
    assert_eq!(response.status(), 201);
    assert_eq!(response.text().await.unwrap(), (32u32 << 20).to_string());
    assert_eq!(exchange.history.len(), 1);
    assert!(started.elapsed() > BOUND, "{:?}", started.elapsed());
}

/// A zero bound through the public API fails the build with a typed error naming the
/// setting, for the stack's client and for a proxy pool's alike; `None` builds.
#[test]
fn a_zero_network_bound_fails_the_build_with_its_name() {
    let zero = Some(Duration::ZERO);
    let build = |network: Network| {
        Resilience::new()
            .network(network)
            .build_from(reqwest::Client::builder)
    };
    match build(Network::new().connect_timeout(zero)) {
        Err(ResilienceError::InvalidConfig(text)) => assert_eq!(
            text,
            "Network::connect_timeout is zero: use None to turn it off"
        ),
        other => panic!("{:?}", other.map(|_| "built")),
    }
    let pooled = Resilience::new()
        .network(Network::new().no_progress(zero))
        .proxies(reqwest_resilience::proxy::ProxyPool::new([
            "http://127.0.0.1:9",
        ]))
        .build_from(reqwest::Client::builder);
    assert!(matches!(pooled, Err(ResilienceError::InvalidConfig(_))));
    assert!(build(Network::new().connect_timeout(None).no_progress(None)).is_ok());
}

/// `Duration::MAX` as "forever" is refused by name (it would overflow the clock), not a
/// panic at the first request.
#[test]
fn an_overlong_network_bound_fails_the_build_with_its_name() {
    let built = Resilience::new()
        .network(Network::new().no_progress(Some(Duration::MAX)))
        .build_from(reqwest::Client::builder);
    match built {
        Err(ResilienceError::InvalidConfig(text)) => assert_eq!(
            text,
            "Network::no_progress exceeds a day: use None to turn it off"
        ),
        other => panic!("{:?}", other.map(|_| "built")),
    }
}

/// An HTTP/2 connection whose path dies under a request (the server goes silent, its
/// socket open: no answer, no PING acknowledged): the keep-alive PING after 30 s goes
/// unanswered for 20 s, hyper closes the connection, and the `GET` is sent again on a new
/// one (after the 1 s backoff) and answered: 51 s, where without the pings the
/// no-progress bound cuts it at 300 s. A `POST` on such a connection ends there, sent once.
#[tokio::test(start_paused = true)]
async fn an_http2_connection_gone_silent_is_found_dead_by_its_pings() {
    use support::h2::{H2Action, H2Server};
    // Requests 0, 2 and 3 meet a dead path; 1 and 4 are answered.
    let server = H2Server::start(|i| match i {
        0 | 2 | 3 => H2Action::Silence,
        _ => H2Action::Respond(200),
    })
    .await;
    let h2 = || builder().http2_prior_knowledge();
    let client = stack().build_from(h2).unwrap();
    let cut = (Transmission::Unknown, Some(FailureKind::Timeout));
    let ok = (
        Transmission::ResponseReceived(200.try_into().unwrap()),
        None,
    );

    let started = tokio::time::Instant::now();
    let get = client.get(server.url("/feed")).send_with_history().await;
    assert_eq!(started.elapsed(), Duration::from_secs(51));
    assert_eq!(attempts(&get.history), [cut, ok]);
    assert_eq!(get.result.unwrap().status(), 200);

    let started = tokio::time::Instant::now();
    let post = client
        .post(server.url("/pay"))
        .body("1 EUR")
        .send_with_history()
        .await;
    assert_eq!(started.elapsed(), Duration::from_secs(50));
    assert_eq!(attempts(&post.history), [cut]);
    let chain = support::chain_messages(&post.result.unwrap_err());
    assert!(
        chain.iter().any(|m| m == "keep-alive timed out"),
        "{chain:?}"
    );

    // The same dead path without the pings: the no-progress bound finds it.
    let unpinged = stack()
        .network(Network::new().http2_keep_alive(None))
        .build_from(h2)
        .unwrap();
    let started = tokio::time::Instant::now();
    let get = unpinged.get(server.url("/feed")).send_with_history().await;
    assert_eq!(started.elapsed(), BOUND + Duration::from_secs(1));
    assert_eq!(
        attempts(&get.history),
        [(Transmission::Unknown, Some(FailureKind::NoProgress)), ok]
    );
    // Each request on a connection of its own (a dead one is never reused).
    assert_eq!((server.requests_seen(), server.connections()), (5, 5));
}
