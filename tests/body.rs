//! Failures while reading the body: the classification of a cut body, operations run
//! again under the retry policy ([`Operation`]), and bodies that resume where they broke
//! (`Resilience::resume_bodies`). Loopback servers only; exact bytes and counts.

mod support;

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use http::StatusCode;
use reqwest_middleware::ClientWithMiddleware;
use reqwest_resilience::retry::{OperationAttempt, RetryReason, StopReason};
use reqwest_resilience::{AttemptDecision, FailureKind, Resilience, RetryMiddleware, Transmission};
use support::ranged::{Fault, RangedServer, Representation};

/// What an operation that fetches and parses JSON fails with.
#[derive(Debug)]
enum Fetch {
    Http(reqwest_middleware::Error),
    Json(serde_json::Error),
}

impl fmt::Display for Fetch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fetch::Http(e) => write!(f, "http: {e}"),
            Fetch::Json(e) => write!(f, "json: {e}"),
        }
    }
}

impl StdError for Fetch {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Fetch::Http(e) => Some(e),
            Fetch::Json(e) => Some(e),
        }
    }
}

impl From<reqwest_middleware::Error> for Fetch {
    fn from(e: reqwest_middleware::Error) -> Self {
        Fetch::Http(e)
    }
}

impl From<reqwest::Error> for Fetch {
    fn from(e: reqwest::Error) -> Self {
        Fetch::Http(e.into())
    }
}

fn retry(max_retries: u32) -> RetryMiddleware {
    support::exact_retry()
        .max_retries(max_retries)
        .build()
        .unwrap()
}

fn stack(retry: &RetryMiddleware) -> ClientWithMiddleware {
    Resilience::new()
        .retry(retry.clone())
        .no_breaker()
        .build(support::loopback_client())
        .unwrap()
}

const JSON: &[u8] = br#"{"name":"flask","version":"3.1.0","files":12}"#;

async fn fetch_json(
    client: &ClientWithMiddleware,
    method: reqwest::Method,
    url: &str,
    attempt: OperationAttempt,
) -> Result<serde_json::Value, Fetch> {
    let response = client
        .request(method, url)
        .with_extension(attempt)
        .send()
        .await?
        .error_for_status()?;
    let bytes = response.bytes().await?;
    serde_json::from_slice(&bytes).map_err(Fetch::Json)
}

fn decisions(history: &reqwest_resilience::AttemptHistory) -> Vec<Option<AttemptDecision>> {
    history
        .attempts()
        .iter()
        .map(|r| r.decision.clone())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_operation_over_a_truncated_json_body_runs_again_two_attempts() {
    let server = RangedServer::start(Representation::resumable(JSON.to_vec()), |i, _| {
        if i == 0 { Fault::Close(5) } else { Fault::None }
    })
    .await;
    let retry = retry(3);
    let client = stack(&retry);
    let url = server.url("/simple/flask.json");
    let (client, url) = (&client, url.as_str());
    let done = retry
        .operation()
        .run_recorded(|attempt| fetch_json(client, reqwest::Method::GET, url, attempt))
        .await;
    let value = done.result.unwrap();
    assert_eq!(value["files"], 12);
    assert_eq!(server.requests().len(), 2);
    assert_eq!(done.outcome.attempts, 2);
    assert_eq!(done.outcome.stop, StopReason::FinalResponse(StatusCode::OK));
    let records = done.history.attempts();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].evidence.attempt, 1);
    assert_eq!(
        records[0].evidence.transmission,
        Transmission::ResponseReceived(StatusCode::OK)
    );
    assert_eq!(
        records[0].evidence.failure,
        Some(FailureKind::BodyInterrupted)
    );
    assert_eq!(records[1].evidence.attempt, 2);
    assert_eq!(
        decisions(&done.history),
        [
            Some(AttemptDecision::Retry {
                delay: Duration::from_secs(1),
                reason: RetryReason::BodyInterrupted
            }),
            Some(AttemptDecision::Stop {
                reason: StopReason::FinalResponse(StatusCode::OK)
            }),
        ]
    );
    // No resume was asked for: both answers were whole bodies.
    assert_eq!(server.ranges(), [None, None]);
    assert_eq!(server.body_bytes_sent(), 5 + JSON.len() as u64);
}

#[tokio::test(start_paused = true)]
async fn complete_but_invalid_json_is_the_callers_error_and_never_runs_again() {
    let repr = Representation::resumable(br#"{"name": "flask", "#.to_vec());
    let server = RangedServer::start(repr, |_, _| Fault::None).await;
    let retry = retry(3);
    let client = stack(&retry);
    let url = server.url("/broken.json");
    let (client, url) = (&client, url.as_str());
    let done = retry
        .operation()
        .run_recorded(|attempt| fetch_json(client, reqwest::Method::GET, url, attempt))
        .await;
    assert!(matches!(done.result, Err(Fetch::Json(_))));
    assert_eq!(server.requests().len(), 1);
    assert_eq!(done.outcome.attempts, 1);
    // The body came whole: the caller's own error after a final 200 is not retried.
    assert_eq!(done.outcome.stop, StopReason::FinalResponse(StatusCode::OK));
    let record = &done.history.attempts()[0];
    assert_eq!(record.evidence.failure, Some(FailureKind::Other));
}

#[tokio::test(start_paused = true)]
async fn an_operation_over_a_post_whose_answer_was_cut_is_not_run_again_unless_marked() {
    let server = RangedServer::start(Representation::resumable(JSON.to_vec()), |i, _| {
        if i < 2 { Fault::Close(5) } else { Fault::None }
    })
    .await;
    let retry = retry(3);
    let client = stack(&retry);
    let url = server.url("/orders");
    let (client, url) = (&client, url.as_str());
    let done = retry
        .operation()
        .run_recorded(|attempt| fetch_json(client, reqwest::Method::POST, url, attempt))
        .await;
    assert!(matches!(done.result, Err(Fetch::Http(_))));
    assert_eq!(
        server.requests().len(),
        1,
        "the POST was answered: not sent again"
    );
    assert_eq!(done.outcome.stop, StopReason::MayHaveBeenProcessed);
    assert_eq!(
        done.history.attempts()[0].evidence.failure,
        Some(FailureKind::BodyInterrupted)
    );

    let done = retry
        .operation()
        .idempotent(true)
        .run_recorded(|attempt| fetch_json(client, reqwest::Method::POST, url, attempt))
        .await;
    assert_eq!(done.result.unwrap()["name"], "flask");
    assert_eq!(
        server.requests().len(),
        3,
        "marked idempotent: run again once"
    );
    assert_eq!(done.outcome.attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn the_operation_and_the_middleware_inside_share_one_attempt_count() {
    // 503, 503, a 200 cut short, then 503 for ever: with 3 retries, 4 requests in all
    // (1 + 3), not 4 × 4.
    let server = RangedServer::start(Representation::resumable(JSON.to_vec()), |i, _| match i {
        0 | 1 => Fault::Status(503),
        2 => Fault::Close(7),
        _ => Fault::Status(503),
    })
    .await;
    let retry = retry(3);
    let client = stack(&retry);
    let url = server.url("/simple/flask.json");
    let (client, url) = (&client, url.as_str());
    let done = retry
        .operation()
        .run_recorded(|attempt| fetch_json(client, reqwest::Method::GET, url, attempt))
        .await;
    assert!(
        matches!(&done.result, Err(Fetch::Http(e)) if e.status() == Some(StatusCode::SERVICE_UNAVAILABLE))
    );
    assert_eq!(server.requests().len(), 4);
    assert_eq!(done.outcome.attempts, 4);
    assert_eq!(done.outcome.stop, StopReason::RetriesExhausted);
    let numbers: Vec<u32> = done
        .history
        .attempts()
        .iter()
        .map(|r| r.evidence.attempt)
        .collect();
    assert_eq!(numbers, [1, 2, 3, 4]);
    let s = Duration::from_secs;
    let s503 = RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        decisions(&done.history),
        [
            Some(AttemptDecision::Retry {
                delay: s(1),
                reason: s503
            }),
            Some(AttemptDecision::Retry {
                delay: s(2),
                reason: s503
            }),
            Some(AttemptDecision::Retry {
                delay: s(4),
                reason: RetryReason::BodyInterrupted
            }),
            Some(AttemptDecision::Stop {
                reason: StopReason::RetriesExhausted
            }),
        ]
    );
}
