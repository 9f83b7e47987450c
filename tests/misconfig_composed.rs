//! `Misconfiguration::NoTransportEvidence` is reported only when no transport step is
//! installed. In a binary of its own: `Misconfiguration::reported()` is process-wide, and
//! no test here may provoke the genuine report (a standalone `RetryMiddleware` over a
//! plain client, `tests/it/dropin.rs`).

mod support;

use http::Extensions;
use reqwest_middleware::{Middleware, Next};
use reqwest_resilience::misconfig::Misconfiguration;
use reqwest_resilience::retry::{RetryOutcome, StopReason};
use reqwest_resilience::{AttemptHistory, Resilience, Transmission};
use support::{Action, FaultServer, loopback_client};

/// A cache in front of the transport step: answers `/cached` itself, without `next`.
struct Cache;

#[reqwest_resilience::async_trait]
impl Middleware for Cache {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        if req.url().path() == "/cached" {
            return Ok(reqwest::Response::from(
                http::Response::builder()
                    .status(200)
                    .body("from the cache")
                    .unwrap(),
            ));
        }
        next.run(req, extensions).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_per_attempt_middleware_answering_itself_is_not_reported_as_a_missing_transport_step() {
    let server = FaultServer::always(Action::ok("from the server")).await;
    let client = Resilience::new()
        .per_attempt(std::sync::Arc::new(Cache))
        .build(loopback_client())
        .unwrap();
    for _ in 0..2 {
        let mut ext = Extensions::new();
        let request = client.get(server.url("/cached")).build().unwrap();
        let response = client
            .execute_with_extensions(request, &mut ext)
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.text().await.unwrap(), "from the cache");
        let outcome = RetryOutcome::of(&ext).unwrap();
        assert_eq!(
            (outcome.attempts, outcome.stop),
            (1, StopReason::FinalResponse(http::StatusCode::OK))
        );
        let history = AttemptHistory::of(&ext).unwrap().attempts();
        assert_eq!(history.len(), 1);
        assert_eq!(
            history[0].evidence.transmission,
            Transmission::ResponseReceived(http::StatusCode::OK)
        );
    }
    // The same stack sends what the cache does not hold through its transport step.
    let response = client.get(server.url("/live")).send().await.unwrap();
    assert_eq!(response.text().await.unwrap(), "from the server");
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/live"]);
    assert!(
        !Misconfiguration::reported().contains(&Misconfiguration::NoTransportEvidence),
        "{:?}",
        Misconfiguration::reported()
    );
}
