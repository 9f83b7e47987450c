//! `TransportEvidence` alone: what was observed about each attempt, for three outcomes
//! against an embedded loopback server. `cargo run --example evidence`
//!
//! The evidence is left in the extensions the caller passes to `execute_with_extensions`
//! (as an `AttemptHistory`) and in each response's extensions (as a `RequestEvidence`).

mod common;

use common::{FlakyServer, Reply, refused_url};
use http::Extensions;
use reqwest_middleware::ClientBuilder;
use reqwest_resilience::redirect::{self, ClientRedirects};
use reqwest_resilience::{AttemptHistory, RequestEvidence, TransportEvidence};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let server = FlakyServer::start(|_, r| match r.path.as_str() {
        "/busy" => Reply::status(503).header("retry-after", "7"),
        "/hang-up" => Reply::HangUp,
        _ => Reply::ok("hello"),
    })
    .await?;
    // The client records its redirects, so the transport step can prove that a failure
    // with no redirect before it is the first hop's (see `reqwest_resilience::redirect`).
    let recorded = reqwest::Client::builder()
        .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
        .build()?;
    let client = ClientBuilder::new(recorded)
        .with(TransportEvidence::with_client_redirects(
            ClientRedirects::Recorded,
        ))
        .build();

    // A response carries its own evidence.
    let response = client.get(server.url("/busy")).send().await?;
    let evidence = RequestEvidence::of(response.extensions()).cloned();
    if let Some(e) = evidence {
        println!(
            "GET /busy:    {:?}, Retry-After parsed as {:?}, took {:?}",
            e.transmission, e.retry_after, e.elapsed
        );
    }

    // A failure leaves its evidence in the caller's extensions.
    for (what, url) in [
        ("GET /hang-up", server.url("/hang-up")),
        ("GET refused", refused_url("/")?),
    ] {
        let mut extensions = Extensions::new();
        let request = client.get(&url).build()?;
        let result = client
            .execute_with_extensions(request, &mut extensions)
            .await;
        let history = AttemptHistory::of(&extensions).cloned().unwrap_or_default();
        for record in history.attempts() {
            let e = &record.evidence;
            println!(
                "{what:<13} {:?} ({:?}); may the server have acted on it? {}; error: {}",
                e.transmission,
                e.failure,
                e.transmission.may_have_been_processed(),
                result
                    .as_ref()
                    .err()
                    .map_or(String::new(), |e| e.to_string()),
            );
        }
    }
    println!("\nOnly a failure that proves nothing was sent is NotSent: a refused connection.");
    Ok(())
}
