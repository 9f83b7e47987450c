//! `BearerAuth` alone: `cargo run --example auth`
//!
//! The server accepts only the second token issued. The first request gets a `401`; the
//! middleware invalidates the rejected token, fetches one new token (one fetch however
//! many requests are waiting) and replays the request once.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{FlakyServer, Reply};
use reqwest_middleware::ClientBuilder;
use reqwest_resilience::redirect::{self, ClientRedirects};
use reqwest_resilience::{AccessToken, BearerAuth, Origin, TokenManager, TransportEvidence};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let server = FlakyServer::start(|_, r| match r.authorization.as_deref() {
        Some("Bearer token-2") => Reply::ok("welcome"),
        _ => Reply::status(401).header("www-authenticate", "Bearer error=\"invalid_token\""),
    })
    .await?;

    let fetches = Arc::new(AtomicUsize::new(0));
    let f = fetches.clone();
    let tokens = TokenManager::new(move || {
        let n = f.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok::<_, std::io::Error>(AccessToken::new(format!("token-{n}"))) }
    });
    let auth = BearerAuth::builder(tokens.clone())
        .origin(Origin::parse(&server.url("/"))?)
        .allow_http_on_loopback() // plain http is refused unless opted in (loopback only here)
        .build()?;
    // The client records its redirects and the transport step is told so: the whole
    // decision table (see `reqwest_resilience::redirect`).
    let recorded = reqwest::Client::builder()
        .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
        .build()?;
    let client = ClientBuilder::new(recorded)
        .with(auth)
        .with(TransportEvidence::with_client_redirects(
            ClientRedirects::Recorded,
        ))
        .build();

    let response = client.get(server.url("/me")).send().await?;
    println!(
        "GET /me: {} — {}",
        response.status(),
        response.text().await?
    );
    println!(
        "token fetches: {}; requests at the server: {} (the 401 and its replay)",
        fetches.load(Ordering::SeqCst),
        server.requests()
    );
    // Debug never shows the secret.
    println!("current token: {:?}", tokens.current());
    Ok(())
}
