//! The reconnect loop of `reqwest_resilience::stream` around a long-poll, not an event
//! stream: `cargo run --example long_poll`
//!
//! Each poll is one request through the stack; the server answers when it has an update
//! (here after 300 ms). Between polls, [`Reconnect`] decides the wait from how the last
//! one ended: an answered poll goes again at once (every answered poll counts as a
//! stable connection: `stable_after(0)`), a `503` waits its `Retry-After`, a dropped
//! connection backs off with jitter, an open breaker waits its "retry in".

mod common;

use std::time::Duration;

use common::{FlakyServer, Reply};
use reqwest_resilience::stream::{Reconnect, ReconnectCause, ReconnectPolicy};
use reqwest_resilience::{Resilience, ResilienceError};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // Update 1 after 300 ms, then a 503 (Retry-After: 1), a dropped connection, update 2,
    // then `204`: nothing more to poll for.
    let server = FlakyServer::start(|i, _| match i {
        0 => Reply::After(Duration::from_millis(300), Box::new(Reply::ok("update 1"))),
        1 => Reply::status(503).header("retry-after", "1"),
        2 => Reply::HangUp,
        3 => Reply::After(Duration::from_millis(300), Box::new(Reply::ok("update 2"))),
        _ => Reply::status(204),
    })
    .await?;
    // The stack's own retries off, to show the loop's decisions in a few seconds (with
    // them on, the stack retries the 503 and the dropped GET first).
    let client = Resilience::new().no_retry().build(reqwest::Client::new())?;
    let policy = ReconnectPolicy::new()
        .reconnection_time(Duration::ZERO)
        .floor(Duration::from_millis(50))
        .stable_after(Duration::ZERO)
        .max_failed(Some(5));
    let mut reconnect = Reconnect::new(policy)?;
    loop {
        let (cause, wait) = match client.get(server.url("/updates")).send().await {
            Ok(response) if response.status() == 204 => break,
            Ok(response) if response.status().is_success() => {
                reconnect.opened();
                println!("got {:?}", response.text().await?);
                (ReconnectCause::Ended, None)
            }
            Ok(response) => {
                let wait = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .map(Duration::from_secs);
                (ReconnectCause::Status(response.status()), wait)
            }
            // A breaker's rejection: no failure, its own wait.
            Err(e)
                if ResilienceError::find(&e)
                    .and_then(|r| r.retry_in())
                    .is_some() =>
            {
                let wait = ResilienceError::find(&e).and_then(|r| r.retry_in());
                (ReconnectCause::Rejected, wait)
            }
            Err(e) => {
                println!("poll failed: {e}");
                (ReconnectCause::Failed(None), None)
            }
        };
        let next = reconnect.after(cause, wait).await?;
        println!(
            "  poll #{} after {:?} ({})",
            next.attempt,
            next.delay,
            next.cause.as_str()
        );
    }
    println!("204: done after {} requests", server.requests());
    Ok(())
}
