//! The transport step's evidence on real faults (loopback sockets).

mod support;

use support::{Action, FaultServer};

#[tokio::test]
async fn support_server_answers_keep_alive_and_counts_requests() {
    let server = FaultServer::sequence(vec![Action::status(503)], Action::ok("hi")).await;
    let client = reqwest::Client::new();
    let a = client.get(server.url("/a")).send().await.unwrap();
    assert_eq!(a.status(), 503);
    let b = client
        .post(server.url("/b"))
        .body("xyz")
        .send()
        .await
        .unwrap();
    assert_eq!(b.status(), 200);
    assert_eq!(b.text().await.unwrap(), "hi");
    assert_eq!(server.requests_seen(), 2);
    assert_eq!(server.connections(), 1);
    let reqs = server.requests();
    assert_eq!(reqs[1].method, "POST");
    assert_eq!(reqs[1].path, "/b");
    assert_eq!(reqs[1].body, b"xyz");
}
