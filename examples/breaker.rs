//! `CircuitBreakerMiddleware` alone: `cargo run --example breaker`
//!
//! Five 503s open the origin's breaker; while open, requests fail at once without
//! touching the network; after the open period (200 ms here, 30 s by default) one probe
//! is let through and its success closes the breaker.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{FlakyServer, Reply};
use reqwest_middleware::ClientBuilder;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, CircuitBreakerMiddleware};
use reqwest_resilience::redirect::{self, ClientRedirects};
use reqwest_resilience::{ResilienceError, TransportEvidence};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let healthy = Arc::new(AtomicBool::new(false));
    let h = healthy.clone();
    let server = FlakyServer::start(move |_, _| {
        if h.load(Ordering::SeqCst) {
            Reply::ok("up")
        } else {
            Reply::status(503)
        }
    })
    .await?;
    let registry = BreakerRegistry::with_listener(
        BreakerConfig::default().open_duration(Duration::from_millis(200)),
        |event| println!("   [{}] {:?} → {:?}", event.origin, event.from, event.to),
    )?;
    // The client records its redirects and the transport step is told so: the whole
    // decision table (see `reqwest_resilience::redirect`).
    let recorded = reqwest::Client::builder()
        .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
        .build()?;
    let client = ClientBuilder::new(recorded)
        .with(CircuitBreakerMiddleware::new(registry.clone()))
        .with(TransportEvidence::with_client_redirects(
            ClientRedirects::Recorded,
        ))
        .build();

    for n in 1..=6 {
        match client.get(server.url("/")).send().await {
            Ok(response) => println!("request {n}: {}", response.status()),
            Err(err) => match ResilienceError::from_middleware_error(&err) {
                Some(e @ ResilienceError::BreakerOpen { .. }) => println!("request {n}: {e}"),
                _ => println!("request {n}: {err}"),
            },
        }
    }
    println!(
        "the server received {} requests (the 6th never left)",
        server.requests()
    );

    healthy.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let response = client.get(server.url("/")).send().await?;
    println!("after the open period: {}", response.status());
    for b in registry.snapshot() {
        println!("{}: {:?}", b.origin, b.state);
    }
    Ok(())
}
