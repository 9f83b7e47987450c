//! Failures while reading the body: the classification of a cut body, operations run
//! again under the retry policy ([`Operation`]), and bodies that resume where they broke
//! (`Resilience::resume_bodies`). Loopback servers only; exact bytes and counts.

use crate::support;

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

// ---------------------------------------------------------------------------------------
// How a cut body is classified, from the chain reqwest hands the caller.

const LEN: usize = 100_000;

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// What an operation records for a body cut by `fault` (no retry after it), the closure
/// failing with `wrap(the error of bytes())`: judged by the error's chain alone when the
/// request went through no retry middleware (`stack` `None`, a plain `client`), else on the
/// response that middleware saw.
async fn cut_body_record<E: StdError + 'static>(
    fault: Fault,
    client: &reqwest::Client,
    stack: Option<(&RetryMiddleware, &ClientWithMiddleware)>,
    wrap: fn(reqwest::Error) -> E,
) -> reqwest_resilience::RequestEvidence {
    let server = RangedServer::start(Representation::resumable(payload(LEN)), move |_, _| {
        fault.clone()
    })
    .await;
    let url = server.url("/f");
    let url = url.as_str();
    let plain = retry(0);
    let operation = stack.map_or(&plain, |(retry, _)| retry).operation();
    let done = operation
        .max_retries(0)
        .run_recorded(|attempt| async move {
            let response = match stack {
                Some((_, stack)) => stack.get(url).with_extension(attempt).send().await.unwrap(),
                None => client.get(url).send().await.unwrap(),
            };
            assert_eq!(response.status(), StatusCode::OK);
            let err = response.bytes().await.unwrap_err();
            assert!(
                err.is_decode(),
                "reqwest calls every body failure a decode error"
            );
            Err::<(), E>(wrap(err))
        })
        .await;
    assert!(done.result.is_err());
    assert_eq!(server.requests().len(), 1);
    let last = done.history.last().expect("the attempt is recorded");
    last.evidence.clone()
}

/// What each failure proves, for a body (the `evidence` module docs, rule B2): from the
/// chain alone `Unknown` / `BodyInterrupted` (bare, and behind the `io::Error` a reader of
/// `bytes_stream()` sees), and `ResponseReceived(200)` / `BodyInterrupted` where the
/// response head is known.
#[tokio::test(start_paused = true)]
async fn a_cut_a_reset_and_a_read_timeout_mid_body_are_body_interrupted_not_decode() {
    let timeout_client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .read_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let cases = [
        (Fault::Close(50_000), support::loopback_client()),
        (Fault::Reset(50_000), support::loopback_client()),
        (Fault::Stall(50_000), timeout_client),
    ];
    let judged = |e: &reqwest_resilience::RequestEvidence| (e.transmission, e.failure);
    for (fault, client) in cases {
        let alone = (Transmission::Unknown, Some(FailureKind::BodyInterrupted));
        let bare = cut_body_record(fault.clone(), &client, None, |e| e).await;
        assert_eq!(judged(&bare), alone, "{fault:?}");
        let wrapped = cut_body_record(fault.clone(), &client, None, std::io::Error::other).await;
        assert_eq!(judged(&wrapped), alone, "{fault:?} wrapped");
        let retry = retry(0);
        let stack = Resilience::new()
            .retry(retry.clone())
            .no_breaker()
            .build(client.clone())
            .unwrap();
        let seen = cut_body_record(
            fault.clone(),
            &client,
            Some((&retry, &stack)),
            std::io::Error::other,
        )
        .await;
        assert_eq!(
            judged(&seen),
            (
                Transmission::ResponseReceived(StatusCode::OK),
                Some(FailureKind::BodyInterrupted)
            ),
            "{fault:?} on a response"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Bodies that resume.

fn resuming(retry: &RetryMiddleware, client: reqwest::Client) -> ClientWithMiddleware {
    Resilience::new()
        .retry(retry.clone())
        .no_breaker()
        .resume_bodies(true)
        .build(client)
        .unwrap()
}

/// The body through a resuming stack, with the server that served it.
async fn download(
    repr: Representation,
    script: impl Fn(usize, &support::RecordedRequest) -> Fault + Send + Sync + 'static,
    client: reqwest::Client,
) -> (Result<Vec<u8>, reqwest::Error>, RangedServer) {
    let server = RangedServer::start(repr, script).await;
    let client = resuming(&retry(3), client);
    let response = client
        .get(server.url("/dist/model.bin"))
        .send()
        .await
        .unwrap();
    let body = response.bytes().await.map(|b| b.to_vec());
    (body, server)
}

#[tokio::test(start_paused = true)]
async fn a_body_cut_at_its_first_middle_or_last_byte_resumes_to_the_exact_bytes() {
    let body = payload(LEN);
    for cut in [0, 1, LEN / 2, LEN - 1] {
        let (got, server) = download(
            Representation::resumable(body.clone()),
            move |i, _| {
                if i == 0 {
                    Fault::Close(cut)
                } else {
                    Fault::None
                }
            },
            support::loopback_client(),
        )
        .await;
        assert!(
            got.as_ref().unwrap() == &body,
            "cut at {cut}: the exact bytes"
        );
        assert_eq!(
            server.ranges(),
            [None, Some(format!("bytes={cut}-"))],
            "cut at {cut}"
        );
        assert_eq!(server.requests()[1].header("if-range"), Some("\"v1\""));
        assert_eq!(
            server.body_bytes_sent(),
            LEN as u64,
            "cut at {cut}: no byte sent twice"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_reset_and_a_stall_cut_by_the_read_timeout_resume_too() {
    let body = payload(LEN);
    let (got, server) = download(
        Representation::resumable(body.clone()),
        |i, _| {
            if i == 0 {
                Fault::Reset(40_000)
            } else {
                Fault::None
            }
        },
        support::loopback_client(),
    )
    .await;
    assert!(got.unwrap() == body);
    // An RST drops what the client had not read yet: it asks for those bytes again.
    let ranges = server.ranges();
    let from: u64 = ranges[1]
        .as_deref()
        .unwrap()
        .trim_start_matches("bytes=")
        .trim_end_matches('-')
        .parse()
        .unwrap();
    assert!(from <= 40_000, "{ranges:?}");
    assert_eq!(ranges.len(), 2);
    assert_eq!(server.body_bytes_sent(), 40_000 + (LEN as u64 - from));
    let timeout_client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .read_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let (got, server) = download(
        Representation::resumable(body.clone()),
        |i, _| {
            if i == 0 {
                Fault::Stall(30_000)
            } else {
                Fault::None
            }
        },
        timeout_client,
    )
    .await;
    assert!(got.unwrap() == body);
    assert_eq!(server.ranges(), [None, Some("bytes=30000-".to_owned())]);
    assert_eq!(server.body_bytes_sent(), LEN as u64);
}

/// The evidence an operation records when its closure fails with `err`, no request having
/// gone through a retry middleware: the error judged by its chain alone.
async fn judged_alone(err: reqwest::Error) -> reqwest_resilience::RequestEvidence {
    let mut err = Some(err);
    let done = retry(0)
        .operation()
        .max_retries(0)
        .run_recorded(move |_| {
            let err = err.take().expect("run once");
            async move { Err::<(), _>(err) }
        })
        .await;
    assert!(done.result.is_err());
    let last = done.history.last().expect("the attempt is recorded");
    last.evidence.clone()
}

/// The body is not resumed: the caller gets the cut's error, inside a `BodyIncomplete`
/// when a resume was refused.
async fn assert_cut_at(got: Result<Vec<u8>, reqwest::Error>, at: u64, resumed_answer: bool) {
    let err = got.unwrap_err();
    let incomplete =
        reqwest_resilience::chain::find::<reqwest_resilience::error::BodyIncomplete>(&err);
    match incomplete {
        Some(b) => {
            assert!(resumed_answer, "a resume was tried");
            assert_eq!(
                (b.received(), b.expected(), b.resumes()),
                (at, LEN as u64, 0)
            );
            assert_eq!(b.status(), StatusCode::OK);
            let c = judged_alone(err).await;
            assert_eq!(
                c.transmission,
                Transmission::ResponseReceived(StatusCode::OK)
            );
            assert_eq!(c.failure, Some(FailureKind::BodyInterrupted));
        }
        None => assert!(!resumed_answer, "not wrapped: no resume was possible"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_server_that_ignores_range_or_changed_its_etag_is_never_spliced() {
    let body = payload(LEN);
    let (got, server) = download(
        Representation::resumable(body.clone()),
        |i, _| {
            if i == 0 {
                Fault::Close(20_000)
            } else {
                Fault::IgnoreRange(None)
            }
        },
        support::loopback_client(),
    )
    .await;
    assert_cut_at(got, 20_000, true).await;
    assert_eq!(server.ranges(), [None, Some("bytes=20000-".to_owned())]);
    let (got, server) = download(
        Representation::resumable(body.clone()),
        |i, _| {
            if i == 0 {
                Fault::Close(20_000)
            } else {
                Fault::ChangeEtag("\"v2\"".into())
            }
        },
        support::loopback_client(),
    )
    .await;
    assert_cut_at(got, 20_000, true).await;
    assert_eq!(
        server.requests().len(),
        2,
        "If-Range failed: a 200, not spliced"
    );
}

#[tokio::test(start_paused = true)]
async fn a_weak_etag_a_compressed_body_or_no_content_length_is_not_resumed() {
    let body = payload(LEN);
    let cut_first = |i: usize, _: &support::RecordedRequest| {
        if i == 0 {
            Fault::Reset(20_000)
        } else {
            Fault::None
        }
    };
    let variants = [
        Representation::resumable(body.clone()).header("etag", "W/\"v1\""),
        Representation::resumable(body.clone()).header("content-encoding", "gzip"),
        Representation {
            content_length: false,
            ..Representation::resumable(body.clone())
        },
        Representation::resumable(body.clone()).without("accept-ranges"),
    ];
    for repr in variants {
        let headers = repr.headers.clone();
        let (got, server) = download(repr, cut_first, support::loopback_client()).await;
        assert_cut_at(got, 20_000, false).await;
        assert_eq!(server.requests().len(), 1, "{headers:?}: no range request");
    }
    // A Last-Modified a minute older than Date is a strong validator (RFC 9110 §8.8.2.2).
    let dated = Representation::resumable(body.clone())
        .without("etag")
        .header("last-modified", "Tue, 01 Dec 2026 10:00:00 GMT")
        .header("date", "Tue, 01 Dec 2026 10:01:00 GMT");
    let (got, server) = download(dated, cut_first, support::loopback_client()).await;
    assert!(got.unwrap() == body);
    assert_eq!(
        server.requests()[1].header("if-range"),
        Some("Tue, 01 Dec 2026 10:00:00 GMT")
    );
}

/// Issue 29, finding 10: validated by `Last-Modified` alone, a server that ignores
/// `If-Range` answers the range request with a `206` of its changed representation (a
/// later `Last-Modified`). Before: the caller got `"1111111111BBBBBBBBBB"`, two
/// representations spliced, as a successful body. Now: the original cut, and a `206`
/// carrying the first answer's `Last-Modified` is still spliced.
#[tokio::test(start_paused = true)]
async fn a_206_of_a_changed_representation_validated_by_date_is_never_spliced() {
    const FIRST: &str = "Tue, 01 Dec 2026 10:00:00 GMT";
    let v1 = Representation::resumable(b"11111111111111111111".to_vec())
        .without("etag")
        .header("last-modified", FIRST)
        .header("date", "Tue, 01 Dec 2026 11:00:00 GMT");
    let v2 = Representation {
        body: std::sync::Arc::new(b"BBBBBBBBBBBBBBBBBBBB".to_vec()),
        ..v1.clone()
    };
    let changed = v2
        .clone()
        .header("last-modified", "Tue, 01 Dec 2026 10:30:00 GMT");
    let (got, server) = download(
        v1.clone(),
        move |i, _| match i {
            0 => Fault::Close(10),
            _ => Fault::ChangeIgnoringIfRange(changed.clone()),
        },
        support::loopback_client(),
    )
    .await;
    let err = got.expect_err("never the two representations spliced");
    let incomplete =
        reqwest_resilience::chain::find::<reqwest_resilience::error::BodyIncomplete>(&err)
            .expect("the original cut");
    assert_eq!(
        (
            incomplete.received(),
            incomplete.expected(),
            incomplete.resumes()
        ),
        (10, 20, 0)
    );
    assert_eq!(server.ranges(), [None, Some("bytes=10-".to_owned())]);
    assert_eq!(server.requests()[1].header("if-range"), Some(FIRST));

    // The same server, the same bytes and the first answer's Last-Modified: that 206
    // continues the representation the caller holds.
    let (got, server) = download(
        v1.clone(),
        move |i, _| match i {
            0 => Fault::Close(10),
            _ => Fault::ChangeIgnoringIfRange(v1.clone()),
        },
        support::loopback_client(),
    )
    .await;
    assert_eq!(got.unwrap(), b"11111111111111111111");
    assert_eq!(server.ranges(), [None, Some("bytes=10-".to_owned())]);
}

/// A `Last-Modified` less than a minute older than `Date` is weak for a client (RFC 9110
/// §8.8.2.2), and a weak `ETag` beside a date leaves `If-Range` nothing to carry
/// (§13.1.5): neither body is resumed.
#[tokio::test(start_paused = true)]
async fn a_weak_last_modified_or_a_weak_etag_beside_a_date_is_not_resumed() {
    let body = payload(LEN);
    let cut_first = |i: usize, _: &support::RecordedRequest| {
        if i == 0 {
            Fault::Reset(20_000)
        } else {
            Fault::None
        }
    };
    let dated = Representation::resumable(body.clone())
        .without("etag")
        .header("last-modified", "Tue, 01 Dec 2026 10:00:00 GMT");
    let variants = [
        dated
            .clone()
            .header("date", "Tue, 01 Dec 2026 10:00:05 GMT"),
        dated
            .clone()
            .header("date", "Tue, 01 Dec 2026 11:00:00 GMT")
            .header("etag", "W/\"v1\""),
    ];
    for repr in variants {
        let headers = repr.headers.clone();
        let (got, server) = download(repr, cut_first, support::loopback_client()).await;
        assert_cut_at(got, 20_000, false).await;
        assert_eq!(server.requests().len(), 1, "{headers:?}: no range request");
    }
}

#[tokio::test(start_paused = true)]
async fn resumes_count_against_the_retry_limit_and_the_range_request_is_retried_in_the_same_count()
{
    let body = payload(LEN);
    // A cut, a 503 to the range request (retried by the loop), then the rest.
    let (got, server) = download(
        Representation::resumable(body.clone()),
        |i, _| match i {
            0 => Fault::Close(10_000),
            1 => Fault::Status(503),
            _ => Fault::None,
        },
        support::loopback_client(),
    )
    .await;
    assert!(got.unwrap() == body);
    assert_eq!(
        server.ranges(),
        [
            None,
            Some("bytes=10000-".to_owned()),
            Some("bytes=10000-".to_owned())
        ]
    );
    // One retry allowed: the first resume takes it, the second cut is the end.
    let server = RangedServer::start(Representation::resumable(body.clone()), |i, _| match i {
        0 => Fault::Close(10_000),
        _ => Fault::Close(30_000),
    })
    .await;
    let client = resuming(&retry(1), support::loopback_client());
    let response = client.get(server.url("/f")).send().await.unwrap();
    let err = response.bytes().await.unwrap_err();
    let b =
        reqwest_resilience::chain::find::<reqwest_resilience::error::BodyIncomplete>(&err).unwrap();
    assert_eq!((b.received(), b.resumes()), (40_000, 1));
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_request_can_turn_resuming_on_or_off_and_chunk_sees_one_body() {
    use reqwest_resilience::resume::ResumeBody;
    let body = payload(LEN);
    let server = RangedServer::start(Representation::resumable(body.clone()), |i, _| {
        if i % 2 == 0 {
            Fault::Close(25_000)
        } else {
            Fault::None
        }
    })
    .await;
    let off = Resilience::new()
        .retry(retry(3))
        .no_breaker()
        .build(support::loopback_client())
        .unwrap();
    let mut response = off
        .get(server.url("/f"))
        .with_extension(ResumeBody(true))
        .send()
        .await
        .unwrap();
    let mut got = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        got.extend_from_slice(&chunk);
    }
    assert!(got == body);
    assert_eq!(server.requests().len(), 2);
    let on = resuming(&retry(3), support::loopback_client());
    let response = on
        .get(server.url("/f"))
        .with_extension(ResumeBody(false))
        .send()
        .await
        .unwrap();
    assert!(response.bytes().await.is_err());
    assert_eq!(server.requests().len(), 3, "not resumed");
}

#[tokio::test(start_paused = true)]
async fn a_resume_is_an_attempt_in_the_history_of_the_operation_around_it() {
    let body = payload(LEN);
    let server = RangedServer::start(Representation::resumable(body.clone()), |i, _| match i {
        0 => Fault::Close(10_000),
        1 => Fault::Close(60_000),
        _ => Fault::None,
    })
    .await;
    let retry = retry(3);
    let client = resuming(&retry, support::loopback_client());
    let url = server.url("/f");
    let (client, url) = (&client, url.as_str());
    let done = retry
        .operation()
        .run_recorded(|attempt| async move {
            let response = client.get(url).with_extension(attempt).send().await?;
            Ok::<_, reqwest_middleware::Error>(response.bytes().await?)
        })
        .await;
    assert!(done.result.unwrap() == body);
    assert_eq!(
        server.ranges(),
        [
            None,
            Some("bytes=10000-".to_owned()),
            Some("bytes=70000-".to_owned())
        ]
    );
    assert_eq!(server.body_bytes_sent(), LEN as u64);
    assert_eq!(done.outcome.attempts, 3);
    let records = done.history.attempts();
    let seen: Vec<_> = records
        .iter()
        .map(|r| {
            (
                r.evidence.attempt,
                r.evidence.transmission,
                r.evidence.failure,
            )
        })
        .collect();
    let ok = Transmission::ResponseReceived(StatusCode::OK);
    let partial = Transmission::ResponseReceived(StatusCode::PARTIAL_CONTENT);
    let cut = Some(FailureKind::BodyInterrupted);
    assert_eq!(seen, [(1, ok, cut), (2, partial, cut), (3, partial, None)]);
    let s = Duration::from_secs;
    assert_eq!(
        decisions(&done.history),
        [
            Some(AttemptDecision::Retry {
                delay: s(1),
                reason: RetryReason::BodyInterrupted
            }),
            Some(AttemptDecision::Retry {
                delay: s(2),
                reason: RetryReason::BodyInterrupted
            }),
            Some(AttemptDecision::Stop {
                reason: StopReason::FinalResponse(StatusCode::PARTIAL_CONTENT)
            }),
        ]
    );
}

mod resumed_equals_original {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

        /// Wherever the body breaks (once or twice, by a FIN or an RST) and however the
        /// server writes it, the caller reads exactly the original bytes and the server
        /// sends each byte once.
        #[test]
        fn for_any_cut_offsets_and_write_sizes(
            len in 1usize..40_000,
            first in 0.0f64..1.0,
            second in proptest::option::of(0.0f64..1.0),
            reset in any::<bool>(),
            write_chunk in 1usize..9_000,
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            let first = ((len as f64) * first) as usize;
            let second = second.map(|f| (((len - first) as f64) * f) as usize);
            let body = payload(len);
            let repr = Representation { write_chunk, ..Representation::resumable(body.clone()) };
            let fault = move |n: usize| if reset { Fault::Reset(n) } else { Fault::Close(n) };
            let (got, sent, requests) = runtime.block_on(async move {
                let server = RangedServer::start(repr, move |i, _| match (i, second) {
                    (0, _) => fault(first),
                    (1, Some(n)) => fault(n),
                    _ => Fault::None,
                })
                .await;
                let client = resuming(&retry(3), support::loopback_client());
                let response = client.get(server.url("/f")).send().await.unwrap();
                let got = response.bytes().await.map(|b| b.to_vec());
                (got, server.body_bytes_sent(), server.requests().len())
            });
            prop_assert!(got.as_ref().ok() == Some(&body), "{:?}", got.err());
            if reset {
                // An RST drops what the client had not read yet: those bytes are asked
                // for again, never lost.
                prop_assert!(sent >= len as u64);
            } else {
                prop_assert_eq!(sent, len as u64);
            }
            prop_assert_eq!(requests, if second.is_some() { 3 } else { 2 });
        }
    }
}

#[tokio::test(start_paused = true)]
async fn under_a_limit_of_one_the_cut_body_gives_its_permit_back_and_each_resume_holds_its_own() {
    use reqwest_resilience::limit::{LimiterConfig, LimiterRegistry};
    let body = payload(LEN);
    let server = RangedServer::start(Representation::resumable(body.clone()), |i, _| match i {
        0 | 2 => Fault::Close(30_000),
        _ => Fault::None,
    })
    .await;
    let registry = LimiterRegistry::new(LimiterConfig::fixed(1)).unwrap();
    let client = Resilience::new()
        .retry(retry(3))
        .no_breaker()
        .concurrency_limit(registry.clone())
        .resume_bodies(true)
        .build(support::loopback_client())
        .unwrap();
    let origin = reqwest_resilience::Origin::parse(&server.url("/")).unwrap();
    let in_flight = || registry.get(&origin).map(|s| s.in_flight);
    // Read to the end: the range request was admitted under the limit of one, so the cut
    // body's permit had been given back.
    let mut response = client.get(server.url("/f")).send().await.unwrap();
    let mut got = Vec::new();
    let mut seen_in_flight = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        got.extend_from_slice(&chunk);
        seen_in_flight.push(in_flight());
    }
    assert!(got == body);
    // One permit while reading; the last frame of a known length gives it back.
    let (last, before) = seen_in_flight.split_last().unwrap();
    assert!(before.iter().all(|n| *n == Some(1)), "{seen_in_flight:?}");
    assert_eq!(*last, Some(0));
    assert_eq!(in_flight(), Some(0));
    assert_eq!(server.requests().len(), 2);
    // Dropped while it waits to resume: nothing held, nothing more sent.
    let mut response = client.get(server.url("/f")).send().await.unwrap();
    let mut read = 0;
    while read < 30_000 {
        read += response.chunk().await.unwrap().unwrap().len();
    }
    let next = tokio::time::timeout(Duration::from_millis(500), response.chunk()).await;
    assert!(
        next.is_err(),
        "waiting out the 1 s backoff before the resume"
    );
    drop(response);
    assert_eq!(in_flight(), Some(0));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(server.requests().len(), 3, "the resume was never sent");
}

/// nginx answers the range itself: a 1 MiB file whose first answer a proxy cuts twice.
/// Real time (nginx writes its log on its own clock), with 10 ms backoffs.
#[tokio::test]
async fn a_download_from_nginx_cut_twice_resumes_with_ranges_nginx_answers_206() {
    use support::nginx_files::{CuttingProxy, serve_file};
    let file = payload(1 << 20);
    let Some(nginx) = serve_file(&file) else {
        return;
    };
    // The first answer is cut after 200 000 bytes, the second (a 206) after 300 000.
    let proxy = CuttingProxy::start(nginx.addr(), vec![200_000, 300_000]).await;
    let backoff = reqwest_resilience::Backoff::builder()
        .base(Duration::from_millis(10))
        .jitter(reqwest_resilience::Jitter::None)
        .build()
        .unwrap();
    let retry = RetryMiddleware::builder()
        .backoff(backoff)
        .no_budget()
        .build()
        .unwrap();
    let client = resuming(&retry, support::loopback_client());
    let response = client.get(proxy.url("/file.bin")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let got = response.bytes().await.unwrap();
    assert!(got[..] == file[..], "the exact bytes");
    let log = nginx.settled_access_log().await;
    assert_eq!(log.len(), 3, "{log:?}");
    assert!(log[0].starts_with("GET 200 \"-\" \"-\" "), "{log:?}");
    // Each range starts where the caller's body stood, with nginx's own ETag as If-Range.
    let range = |line: &str| -> u64 {
        let quoted = line.split('"').nth(1).unwrap();
        quoted
            .trim_start_matches("bytes=")
            .trim_end_matches('-')
            .parse()
            .unwrap()
    };
    let (first, second) = (range(&log[1]), range(&log[2]));
    assert!(log[1].starts_with("GET 206 \"bytes="), "{log:?}");
    assert!(log[2].starts_with("GET 206 \"bytes="), "{log:?}");
    // nginx logs the quotes of its strong ETag as \x22.
    assert!(
        log[1].contains(" \"\\x22") && log[2].contains(" \"\\x22"),
        "{log:?}"
    );
    // The cuts were counted in answer bytes, heads included: the body before each cut.
    assert!(first < 200_000 && first > 199_000, "{log:?}");
    assert!(
        second > first + 299_000 && second < first + 300_000,
        "{log:?}"
    );
    let last_sent: u64 = log[2].rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(
        last_sent,
        (1 << 20) - second,
        "the last answer is the rest, exactly"
    );
}

#[tokio::test(start_paused = true)]
async fn the_on_attempt_hook_sees_the_range_request_as_an_attempt_of_its_own() {
    use std::sync::{Arc, Mutex};
    let body = payload(LEN);
    let server = RangedServer::start(Representation::resumable(body.clone()), |i, _| {
        if i == 0 {
            Fault::Close(12_345)
        } else {
            Fault::None
        }
    })
    .await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let client = Resilience::new()
        .retry(retry(3))
        .no_breaker()
        .resume_bodies(true)
        .on_attempt({
            let seen = seen.clone();
            move |evidence, decision| {
                seen.lock()
                    .unwrap()
                    .push((evidence.attempt, evidence.status(), decision.cloned()))
            }
        })
        .build(support::loopback_client())
        .unwrap();
    let response = client.get(server.url("/f")).send().await.unwrap();
    assert!(response.bytes().await.unwrap()[..] == body[..]);
    let final_ = |s: StatusCode| {
        Some(AttemptDecision::Stop {
            reason: StopReason::FinalResponse(s),
        })
    };
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (1, Some(StatusCode::OK), final_(StatusCode::OK)),
            (
                2,
                Some(StatusCode::PARTIAL_CONTENT),
                final_(StatusCode::PARTIAL_CONTENT)
            ),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn over_a_client_without_the_retry_middleware_an_operation_decides_from_the_error_alone() {
    let retry = retry(3);
    let plain = ClientWithMiddleware::from(support::loopback_client());
    // Refused: proven not sent, run again whatever the method, 1 + 3 attempts.
    let refused = format!("http://127.0.0.1:{}/x", support::refused_port());
    let (client, url) = (&plain, refused.as_str());
    let done = retry
        .operation()
        .run_recorded(|attempt| fetch_json(client, reqwest::Method::POST, url, attempt))
        .await;
    assert!(matches!(&done.result, Err(Fetch::Http(e)) if e.is_connect()));
    assert_eq!(done.outcome.attempts, 4);
    assert_eq!(done.outcome.stop, StopReason::RetriesExhausted);
    let seen: Vec<_> = done
        .history
        .attempts()
        .iter()
        .map(|r| {
            (
                r.evidence.attempt,
                r.evidence.transmission,
                r.evidence.failure,
            )
        })
        .collect();
    let refused = (Transmission::NotSent, Some(FailureKind::Connect));
    assert_eq!(seen, [1, 2, 3, 4].map(|n| (n, refused.0, refused.1)));
    // A cut body: nothing says the operation is idempotent, so it is not run again…
    let server = RangedServer::start(Representation::resumable(JSON.to_vec()), |i, _| {
        if i < 2 { Fault::Close(3) } else { Fault::None }
    })
    .await;
    let url = server.url("/j");
    let url = url.as_str();
    let done = retry
        .operation()
        .run_recorded(|attempt| fetch_json(client, reqwest::Method::GET, url, attempt))
        .await;
    assert!(done.result.is_err());
    assert_eq!(
        (done.outcome.attempts, done.outcome.stop),
        (1, StopReason::MayHaveBeenProcessed)
    );
    // … unless marked.
    let done = retry
        .operation()
        .idempotent(true)
        .run_recorded(|attempt| fetch_json(client, reqwest::Method::GET, url, attempt))
        .await;
    assert_eq!(done.result.unwrap()["version"], "3.1.0");
    assert_eq!(done.outcome.attempts, 2);
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_empty_retry_budget_or_a_deadline_before_the_backoff_ends_refuses_the_resume() {
    use reqwest_resilience::RetryBudget;
    let body = payload(LEN);
    let cut_first = |i: usize, _: &support::RecordedRequest| {
        if i == 0 {
            Fault::Close(50_000)
        } else {
            Fault::None
        }
    };
    let empty = RetryBudget::new(Duration::from_secs(10), 0, 0.0).unwrap();
    let no_budget = support::exact_retry().budget(empty).build().unwrap();
    let deadline = support::exact_retry()
        .total_deadline(Duration::from_millis(900))
        .build()
        .unwrap();
    for retry in [no_budget, deadline] {
        let server = RangedServer::start(Representation::resumable(body.clone()), cut_first).await;
        let client = resuming(&retry, support::loopback_client());
        let response = client.get(server.url("/f")).send().await.unwrap();
        assert_cut_at(response.bytes().await.map(|b| b.to_vec()), 50_000, true).await;
        assert_eq!(server.requests().len(), 1, "{retry:?}: no range request");
    }
}
