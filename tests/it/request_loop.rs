//! The one-loop prototype of `benches/support/request_loop.rs` (issue 43's floor, measured
//! by `benches/instructions.rs`): a check that it does what its rows are said to measure.

use std::time::Duration;

use reqwest_resilience::{Backoff, Jitter, Origin, Transmission};

use crate::support::{Action, FaultServer, loopback_client};

// The accessors and constructors the bench has no use for are used here, and the other
// way round.
#[allow(dead_code)]
#[path = "../../benches/support/request_loop.rs"]
mod prototype;
use prototype::{BreakerOpen, LoopRecord, RequestLoop};

/// The prototype as the bench's rows stack it, with 1 ms backoff delays.
fn client_with(prototype: RequestLoop) -> reqwest_middleware::ClientWithMiddleware {
    let backoff = Backoff::builder()
        .base(Duration::from_millis(1))
        .jitter(Jitter::None)
        .build()
        .unwrap();
    reqwest_middleware::ClientBuilder::new(loopback_client())
        .with(prototype.backoff(backoff))
        .build()
}

fn client() -> reqwest_middleware::ClientWithMiddleware {
    client_with(RequestLoop::new())
}

fn transmissions(record: &LoopRecord) -> Vec<Transmission> {
    record.entries.iter().map(|e| e.transmission).collect()
}

#[tokio::test]
async fn a_503_is_retried_once_and_both_attempts_are_recorded() {
    let plain = RequestLoop::new();
    let saving = RequestLoop::new().origin_cached().copied_by_hand();
    for prototype in [plain, saving] {
        a_503_then_200(client_with(prototype)).await;
    }
}

async fn a_503_then_200(client: reqwest_middleware::ClientWithMiddleware) {
    let server = FaultServer::sequence(vec![Action::status(503)], Action::ok("fine")).await;
    let response = client.get(server.url("/a")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let record = LoopRecord::of_response(&response).expect("the loop's record");
    assert_eq!(record.attempts, 2);
    assert_eq!(
        transmissions(record),
        [
            Transmission::ResponseReceived(http::StatusCode::SERVICE_UNAVAILABLE),
            Transmission::ResponseReceived(http::StatusCode::OK),
        ]
    );
    assert_eq!(server.requests_seen(), 2);
}

#[tokio::test]
async fn the_origin_cached_per_thread_is_the_requests_own() {
    let one = FaultServer::always(Action::ok("one")).await;
    let two = FaultServer::always(Action::ok("two")).await;
    let client = client_with(RequestLoop::new().origin_cached());
    for url in [one.url("/a"), one.url("/b"), two.url("/a"), one.url("/c")] {
        let response = client.get(&url).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let record = LoopRecord::of_response(&response).unwrap();
        assert_eq!(record.origin, Some(Origin::parse(&url).unwrap()), "{url}");
    }
}

#[tokio::test]
async fn a_post_answered_503_is_not_retried() {
    let server = FaultServer::sequence(vec![Action::status(503)], Action::ok("fine")).await;
    let response = client()
        .post(server.url("/a"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(LoopRecord::of_response(&response).unwrap().attempts, 1);
    assert_eq!(server.requests_seen(), 1);
}

#[tokio::test]
async fn the_fifth_failure_in_a_row_opens_the_breaker_and_the_next_attempt_is_not_sent() {
    let server = FaultServer::always(Action::status(503)).await;
    let client = client();
    // Four attempts (three retries), four failures.
    let response = client.get(server.url("/a")).send().await.unwrap();
    assert_eq!(LoopRecord::of_response(&response).unwrap().attempts, 4);
    // The fifth failure opens it; the retry after it is turned away.
    let mut extensions = http::Extensions::new();
    let request = client.get(server.url("/a")).build().unwrap();
    let err = client
        .execute_with_extensions(request, &mut extensions)
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Middleware(err) = err else {
        panic!("expected the breaker's rejection, got {err:?}");
    };
    assert!(err.downcast_ref::<BreakerOpen>().is_some(), "{err:?}");
    let record = LoopRecord::of(&extensions).expect("the loop's record");
    assert_eq!(
        (record.attempts, record.transmission),
        (2, Transmission::NotSent)
    );
    assert_eq!(server.requests_seen(), 5);
}
