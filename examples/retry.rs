//! `RetryMiddleware` alone (with `TransportEvidence` innermost, which it decides from):
//! `cargo run --example retry`
//!
//! A GET that meets two 503s is retried; a POST that meets a 503 is not, unless the caller
//! marks it idempotent for that request. Backoff is shortened to 20 ms for the demo.

mod common;

use std::time::Duration;

use common::{FlakyServer, Reply};
use http::Extensions;
use reqwest_middleware::ClientBuilder;
use reqwest_resilience::redirect::{self, ClientRedirects};
use reqwest_resilience::retry::{Idempotent, RetryOutcome};
use reqwest_resilience::{
    AttemptDecision, AttemptHistory, Backoff, RetryMiddleware, TransportEvidence,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // The server answers 503, 503, 200, 503, 503, 200, … whatever the path.
    let server = FlakyServer::start(|i, _| {
        if i % 3 < 2 {
            Reply::status(503)
        } else {
            Reply::ok("done")
        }
    })
    .await?;
    let retry = RetryMiddleware::builder()
        .max_retries(3)
        .backoff(Backoff::builder().base(Duration::from_millis(20)).build()?)
        .build()?;
    // The client records its redirects and the transport step is told so: the whole
    // decision table (see `reqwest_resilience::redirect`).
    let recorded = reqwest::Client::builder()
        .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
        .build()?;
    let client = ClientBuilder::new(recorded)
        .with(retry)
        .with(TransportEvidence::with_client_redirects(
            ClientRedirects::Recorded,
        ))
        .build();

    let cases = [
        ("GET", client.get(server.url("/report")), None),
        ("POST", client.post(server.url("/jobs")).body("{}"), None),
        (
            "POST + Idempotent(true)",
            client.post(server.url("/jobs")).body("{}"),
            Some(Idempotent(true)),
        ),
    ];
    for (what, request, idempotent) in cases {
        let mut extensions = Extensions::new();
        if let Some(marker) = idempotent {
            extensions.insert(marker);
        }
        let response = client
            .execute_with_extensions(request.build()?, &mut extensions)
            .await?;
        println!("{what}: {}", response.status());
        for record in AttemptHistory::of(&extensions)
            .map(|h| h.attempts())
            .unwrap_or_default()
        {
            let decision = match &record.decision {
                Some(AttemptDecision::Retry { delay, reason }) => {
                    format!("retry in {delay:.0?} ({reason})")
                }
                Some(AttemptDecision::Stop { reason }) => format!("stop ({reason})"),
                _ => String::new(),
            };
            println!(
                "   attempt {}: {:?} → {decision}",
                record.evidence.attempt, record.evidence.transmission
            );
        }
        if let Some(outcome) = RetryOutcome::of(&extensions) {
            println!("   http.request.resend_count = {}", outcome.resend_count());
        }
    }
    println!("\nThe server received {} requests.", server.requests());
    Ok(())
}
