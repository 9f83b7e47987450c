//! The tour's long-lived stream scene (`reqwest_resilience::stream`).

use std::time::Duration;

use futures_util::StreamExt;
use reqwest_resilience::Jitter;
use reqwest_resilience::stream::{EventStream, ReconnectPolicy, StreamItem};

use super::common::{FlakyServer, Reply};
use super::{BoxError, Tour, demo_stack};

fn events(text: &str) -> Reply {
    Reply::ok(text).header("content-type", "text/event-stream")
}

/// Server-sent events: the stream ends, reconnects with `Last-Event-ID`, the stack's retry
/// answers a 503 on the way, and a `204` stops it.
pub(super) async fn server_sent_events(tour: &mut Tour) -> Result<(), BoxError> {
    println!("\n26. Server-sent events: reconnected with the latest id, a 503 retried, 204 stops");
    let server = FlakyServer::start(|i, _| match i {
        0 => events("id: 1\ndata: first\n\n: heartbeat\nid: 2\ndata: second\n\n"),
        1 => Reply::status(503),
        2 => events("id: 3\ndata: third\n\nid: 4\ndata: cut by the end, never deliv"),
        _ => Reply::status(204),
    })
    .await?;
    let client = demo_stack()?.build(reqwest::Client::new())?;
    let policy = ReconnectPolicy::new()
        .reconnection_time(Duration::from_millis(50))
        .floor(Duration::from_millis(20))
        .jitter(Jitter::None);
    let mut stream = EventStream::new(client.get(server.url("/feed")))?.reconnect_policy(policy)?;
    let (mut got, mut reconnects) = (Vec::new(), Vec::new());
    while let Some(item) = stream.next().await {
        match item? {
            StreamItem::Event(e) => {
                println!("   event id {}: {}", e.id, e.data);
                got.push(e.id);
            }
            StreamItem::Reconnecting(r) => {
                println!(
                    "   reconnect #{} in {:?} ({}), Last-Event-ID {}",
                    r.attempt,
                    r.delay,
                    r.cause.as_str(),
                    stream.last_event_id()
                );
                reconnects.push(r.cause.as_str());
            }
            _ => {}
        }
    }
    tour.check("SSE: events delivered", "1,2,3", got.join(","));
    tour.check("SSE: reconnects", "ended,ended", reconnects.join(","));
    tour.check("SSE: requests (503 retried)", 4, server.requests());
    Ok(())
}
