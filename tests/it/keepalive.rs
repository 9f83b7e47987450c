//! HTTP/1.1 keep-alive: what a pooled connection that the server closes does to a request,
//! and which of those cases reach the stack at all.
//!
//! - The server closed an idle pooled connection (its keep-alive timeout) *before* the next
//!   request was written: hyper's connection task sees the EOF and the pool drops the
//!   connection, or, in the race where the request is handed to it first, hyper hands the
//!   unwritten request back as canceled and hyper-util sends it again on a new connection
//!   (`retry_canceled_requests`, on by default, for a reused connection). Either way the
//!   stack sees **one** attempt that succeeded: this case never reaches it.
//! - The server closed the connection *after* reading the request (the close raced the
//!   write): nothing proves the request was not processed (`SentNoResponse`, `Closed`), so
//!   a POST is not sent again and a GET is retried on a new connection.
//!
//! Real clock and real sockets: the idle close needs hyper's connection task to run.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::Extensions;
use reqwest_middleware::ClientWithMiddleware;
use reqwest_resilience::RetryMiddleware;
use reqwest_resilience::retry::RetryOutcome;
use reqwest_resilience::{AttemptHistory, FailureKind, Resilience, Transmission};
use support::{Action, FaultServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A pooling client (keep-alive on), the stack with exact 1 ms delays.
fn pooled_stack() -> ClientWithMiddleware {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .backoff(
                    reqwest_resilience::Backoff::builder()
                        .base(Duration::from_millis(1))
                        .max_delay(Duration::from_millis(1))
                        .jitter(reqwest_resilience::Jitter::None)
                        .build()
                        .unwrap(),
                )
                .no_budget(),
        )
        .build(client)
        .unwrap()
}

async fn run(
    client: &ClientWithMiddleware,
    req: reqwest_middleware::RequestBuilder,
) -> (
    reqwest_middleware::Result<reqwest::Response>,
    AttemptHistory,
    Option<RetryOutcome>,
) {
    let mut ext = Extensions::new();
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        client.execute_with_extensions(req.build().unwrap(), &mut ext),
    )
    .await
    .expect("bounded");
    let history = AttemptHistory::of(&ext).cloned().unwrap_or_default();
    (result, history, RetryOutcome::of(&ext).copied())
}

/// An HTTP/1.1 server that answers each request `200 ok` (keep-alive: no `Connection:
/// close`) and then closes the connection at once, as a server whose keep-alive timeout
/// is zero. Counts connections and requests.
async fn closes_after_each_answer() -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let (connections, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (c, r) = (connections.clone(), requests.clone());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            let r = r.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // The requests here have no body: the head is the request.
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                r.fetch_add(1, Ordering::SeqCst);
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (url, connections, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_closed_while_idle_never_reaches_the_stack() {
    let (url, connections, requests) = closes_after_each_answer().await;
    let client = pooled_stack();
    for round in 1..=3 {
        let (result, history, outcome) = run(&client, client.post(&url)).await;
        assert_eq!(result.unwrap().status(), 200, "round {round}");
        assert_eq!(history.len(), 1, "one attempt at the stack, round {round}");
        assert_eq!(outcome.map(|o| o.attempts), Some(1));
        // Give hyper's connection task time to read the server's FIN, so the next round
        // meets a closed connection in the pool (or none).
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        requests.load(Ordering::SeqCst),
        3,
        "each POST executed once"
    );
    assert_eq!(
        connections.load(Ordering::SeqCst),
        3,
        "a new connection each time"
    );
}

/// The first request on a connection is answered; the second, on the same pooled
/// connection, is read and the connection closed without an answer.
async fn closes_the_reused_connection_after_reading() -> FaultServer {
    FaultServer::start(|i, req| match (i, req.connection) {
        (1, 0) => Action::ReadThenClose,
        _ => Action::ok("ok"),
    })
    .await
}

/// One answered request, its body read to the end so the connection goes back to the
/// pool, and a moment for the pool to take it.
async fn warm(client: &ClientWithMiddleware, server: &FaultServer) {
    let (first, ..) = run(client, client.get(server.url("/warm"))).await;
    assert_eq!(first.unwrap().text().await.unwrap(), "ok");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_on_a_reused_connection_closed_after_reading_is_not_sent_again() {
    let server = closes_the_reused_connection_after_reading().await;
    let client = pooled_stack();
    warm(&client, &server).await;
    let (result, history, outcome) = run(&client, client.post(server.url("/pay")).body("x")).await;
    assert!(result.is_err());
    assert_eq!(history.len(), 1, "{history:?}");
    let e = &history.attempts()[0].evidence;
    assert_eq!(e.transmission, Transmission::SentNoResponse, "{e:?}");
    assert_eq!(e.failure, Some(FailureKind::Closed), "{e:?}");
    assert_eq!(outcome.map(|o| o.attempts), Some(1));
    assert_eq!(
        server.requests_seen(),
        2,
        "the POST reached the server once"
    );
    assert_eq!(server.connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_on_a_reused_connection_closed_after_reading_is_retried_on_a_new_one() {
    let server = closes_the_reused_connection_after_reading().await;
    let client = pooled_stack();
    warm(&client, &server).await;
    let (result, history, outcome) = run(&client, client.get(server.url("/item"))).await;
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(history.len(), 2, "{history:?}");
    let e = &history.attempts()[0].evidence;
    assert_eq!(e.transmission, Transmission::SentNoResponse, "{e:?}");
    assert_eq!(e.failure, Some(FailureKind::Closed), "{e:?}");
    assert_eq!(outcome.map(|o| o.attempts), Some(2));
    assert_eq!(server.requests_seen(), 3);
    assert_eq!(
        server.connections(),
        2,
        "the retry went out on a new connection"
    );
}
