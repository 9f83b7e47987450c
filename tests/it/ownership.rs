//! Request ownership under every nesting of this crate's middlewares used alone: the
//! outermost one owns the request (it clears what an earlier request left in reused
//! `Extensions`), and the ones inside it keep that request's state (none wipes the records
//! of the attempts before it). Ownership is found through what the thread is polling
//! (`src/stage/scope.rs`), so each nesting is run against a real loopback server.

use crate::support;

use std::time::Duration;

use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware};
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, CircuitBreakerMiddleware};
use reqwest_resilience::limit::{ConcurrencyLimit, LimiterConfig, LimiterRegistry};
use reqwest_resilience::retry::{Deadline, RetryOutcome, StopReason};
use reqwest_resilience::{
    AccessToken, AttemptHistory, BearerAuth, Origin, RequestEvidence, TokenManager, Transmission,
    TransportEvidence,
};
use support::{Action, FaultServer};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Part {
    Retry,
    Breaker,
    Limit,
    Bearer,
}

const PARTS: [Part; 4] = [Part::Retry, Part::Breaker, Part::Limit, Part::Bearer];

fn middleware(part: Part, server: &FaultServer) -> std::sync::Arc<dyn Middleware> {
    match part {
        Part::Retry => std::sync::Arc::new(support::exact_retry().build().unwrap()),
        Part::Breaker => std::sync::Arc::new(CircuitBreakerMiddleware::new(
            BreakerRegistry::new(BreakerConfig::default()).unwrap(),
        )),
        Part::Limit => std::sync::Arc::new(ConcurrencyLimit::new(
            LimiterRegistry::new(LimiterConfig::fixed(4)).unwrap(),
        )),
        Part::Bearer => {
            let tokens =
                TokenManager::new(|| async { Ok::<_, std::io::Error>(AccessToken::new("t")) });
            std::sync::Arc::new(
                BearerAuth::builder(tokens)
                    .origin(Origin::parse(&server.url("/")).unwrap())
                    .allow_http_on_loopback()
                    .build()
                    .unwrap(),
            )
        }
    }
}

fn client(parts: &[Part], server: &FaultServer) -> ClientWithMiddleware {
    let mut builder = ClientBuilder::new(support::loopback_client());
    for part in parts {
        builder = builder.with_arc(middleware(*part, server));
    }
    builder.with(TransportEvidence::new()).build()
}

/// Extensions as a request of another client left them: its history, its evidence, its
/// outcome (`RetryOutcome` is `non_exhaustive`: `foreign` comes from a real request).
fn stale_extensions(foreign: RetryOutcome) -> Extensions {
    let mut ext = Extensions::new();
    let mut history = AttemptHistory::default();
    for attempt in 1..=3 {
        history.push(RequestEvidence::new(Transmission::Unknown, None, attempt));
    }
    history.insert_into(&mut ext);
    RequestEvidence::new(Transmission::Unknown, None, 3).insert_into(&mut ext);
    foreign.insert_into(&mut ext);
    ext
}

/// A real `RetryOutcome`, with a stop no request of the matrix ends with.
async fn a_foreign_outcome() -> RetryOutcome {
    let server = FaultServer::always(Action::status(404)).await;
    let client = client(&[Part::Retry], &server);
    let mut ext = Extensions::new();
    let request = client.get(server.url("/elsewhere")).build().unwrap();
    let response = client
        .execute_with_extensions(request, &mut ext)
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let outcome = *RetryOutcome::of(&ext).unwrap();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (1, StopReason::FinalResponse(http::StatusCode::NOT_FOUND))
    );
    outcome
}

#[tokio::test(start_paused = true)]
async fn every_nesting_of_two_middlewares_owns_the_request_once_and_keeps_its_records() {
    let foreign = a_foreign_outcome().await;
    for outer in PARTS {
        for inner in PARTS {
            if outer == inner {
                continue;
            }
            // A 503 then a 200: with a retry in the chain, two attempts.
            let server = FaultServer::sequence(vec![Action::status(503)], Action::ok("fine")).await;
            let client = client(&[outer, inner], &server);
            let mut ext = stale_extensions(foreign);
            let request = client.get(server.url("/item")).build().unwrap();
            let status = client
                .execute_with_extensions(request, &mut ext)
                .await
                .map(|r| r.status().as_u16())
                .unwrap();
            let retried = outer == Part::Retry || inner == Part::Retry;
            let case = format!("{outer:?} outside {inner:?}");
            assert_eq!(status, if retried { 200 } else { 503 }, "{case}");
            assert_eq!(
                server.requests_seen(),
                if retried { 2 } else { 1 },
                "{case}"
            );
            let history: Vec<(u32, Transmission)> = AttemptHistory::of(&ext)
                .expect("a history")
                .attempts()
                .iter()
                .map(|r| (r.evidence.attempt, r.evidence.transmission))
                .collect();
            let status = |c| Transmission::ResponseReceived(http::StatusCode::from_u16(c).unwrap());
            let expected = if retried {
                vec![(1, status(503)), (2, status(200))]
            } else {
                vec![(1, status(503))]
            };
            assert_eq!(
                history, expected,
                "{case}: the stale records cleared, none lost"
            );
            let last = RequestEvidence::of(&ext).expect("the last evidence");
            assert_eq!(last.attempt, expected.len() as u32, "{case}");
            match RetryOutcome::of(&ext) {
                Some(outcome) if retried => {
                    assert_eq!(
                        (outcome.attempts, outcome.stop),
                        (2, StopReason::FinalResponse(http::StatusCode::OK)),
                        "{case}"
                    );
                }
                other => assert!(!retried && other.is_none(), "{case}: {other:?}"),
            }
            assert!(ext.get::<Deadline>().is_none(), "{case}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
