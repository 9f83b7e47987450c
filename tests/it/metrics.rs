//! Feature `metrics`: a scripted scenario against a loopback server, counted exactly by
//! `metrics-util`'s debugging recorder (installed for this test's thread only, with a
//! current-thread runtime on tokio's paused clock inside it).
#![cfg(feature = "metrics")]

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use metrics::Unit;
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use reqwest_resilience::RetryMiddleware;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, TripPolicy};
use reqwest_resilience::{
    AccessToken, Backoff, BearerAuth, Jitter, Origin, Resilience, RetryBudget, TokenManager,
};
use support::{Action, FaultServer};

type Labels = BTreeMap<String, String>;

/// Every instrument: (kind, name, labels) → (unit, counter value or histogram sample count).
type Seen = BTreeMap<(String, String, Labels), (Option<Unit>, u64)>;

fn seen(recorder: &DebuggingRecorder) -> Seen {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, unit, _, value)| {
            let kind = match key.kind() {
                MetricKind::Counter => "counter",
                MetricKind::Gauge => "gauge",
                MetricKind::Histogram => "histogram",
            };
            let labels = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let n = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(samples) => samples.len() as u64,
                DebugValue::Gauge(_) => u64::MAX,
            };
            (
                (kind.to_owned(), key.key().name().to_owned(), labels),
                (unit, n),
            )
        })
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

#[test]
fn a_scripted_scenario_reports_exact_counts_for_every_instrument() {
    support::label_every_origin();
    let recorder = DebuggingRecorder::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    // Units and descriptions registered with this thread's recorder (the crate's own
    // once-per-process registration may have gone to another test's).
    let (origin, port) = metrics::with_local_recorder(&recorder, || {
        reqwest_resilience::metrics::describe();
        runtime.block_on(scenario())
    });
    let seen = seen(&recorder);

    let o = origin.as_str();
    let get = |status: &str, error: Option<&str>| {
        let mut l = labels(&[
            ("http.request.method", "GET"),
            ("server.address", "127.0.0.1"),
            ("server.port", &port),
            ("http.response.status_code", status),
        ]);
        if let Some(e) = error {
            l.insert("error.type".into(), e.into());
        }
        (
            "histogram".to_owned(),
            "http.client.request.duration".to_owned(),
            l,
        )
    };
    let counter =
        |name: &str, pairs: &[(&str, &str)]| ("counter".to_owned(), name.to_owned(), labels(pairs));
    let s = Some(Unit::Seconds);
    let expected: Seen = [
        // Seven requests on the wire: 200 (after the token), 503, 503, 200 (the probe),
        // 429, 200 (after the pause), 503 (the budget refuses its retry).
        (get("200", None), (s, 3)),
        (get("503", Some("503")), (s, 3)),
        (get("429", Some("429")), (s, 1)),
        (
            counter(
                "reqwest_resilience.retry.retries",
                &[("origin", o), ("reason", "not_sent")],
            ),
            (None, 1),
        ),
        (
            counter(
                "reqwest_resilience.retry.retries",
                &[("origin", o), ("reason", "status")],
            ),
            (None, 3),
        ),
        (
            counter(
                "reqwest_resilience.retry.retries",
                &[("origin", o), ("reason", "breaker_rejected")],
            ),
            (None, 1),
        ),
        (
            counter(
                "reqwest_resilience.retry.stops",
                &[("origin", o), ("reason", "final_response")],
            ),
            (None, 3),
        ),
        (
            counter(
                "reqwest_resilience.retry.stops",
                &[("origin", o), ("reason", "budget_exhausted")],
            ),
            (None, 1),
        ),
        (
            counter(
                "reqwest_resilience.retry.budget_exhausted",
                &[("origin", o)],
            ),
            (None, 1),
        ),
        (
            counter(
                "reqwest_resilience.breaker.transitions",
                &[("origin", o), ("from", "closed"), ("to", "open")],
            ),
            (None, 1),
        ),
        (
            counter(
                "reqwest_resilience.breaker.transitions",
                &[("origin", o), ("from", "open"), ("to", "half_open")],
            ),
            (None, 1),
        ),
        (
            counter(
                "reqwest_resilience.breaker.transitions",
                &[("origin", o), ("from", "half_open"), ("to", "closed")],
            ),
            (None, 1),
        ),
        (
            counter(
                "reqwest_resilience.breaker.rejections",
                &[("origin", o), ("reason", "open")],
            ),
            (None, 1),
        ),
        (
            counter("reqwest_resilience.breaker.pauses", &[("origin", o)]),
            (None, 1),
        ),
        (
            counter("reqwest_resilience.auth.token_fetches", &[]),
            (None, 2),
        ),
        (
            counter(
                "reqwest_resilience.auth.token_failures",
                &[("kind", "fetch")],
            ),
            (None, 1),
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(seen, expected);
}

/// The script; returns the server's origin and port for the labels.
async fn scenario() -> (Origin, String) {
    let server = FaultServer::sequence(
        vec![
            Action::ok("a"),
            Action::status(503),
            Action::status(503),
            Action::ok("probe"),
            Action::status(429).header("retry-after", "1"),
            Action::ok("after the pause"),
            Action::status(503),
        ],
        Action::status(500),
    )
    .await;
    let origin = Origin::parse(&server.url("/")).unwrap();
    // The first fetch fails; the second gives a token that never expires.
    let fetches = Arc::new(AtomicUsize::new(0));
    let f = fetches.clone();
    let tokens = TokenManager::new(move || {
        let n = f.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Err(anyhow::anyhow!("identity provider down"))
            } else {
                anyhow::Ok(AccessToken::new("t"))
            }
        }
    });
    let bearer = BearerAuth::builder(tokens)
        .origin(origin.clone())
        .allow_http_on_loopback()
        .build()
        .unwrap();
    let exact = || Backoff::builder().jitter(Jitter::None).build().unwrap();
    let registry = BreakerRegistry::new(
        BreakerConfig::default()
            .policy(TripPolicy::consecutive_failures(2))
            .open_duration(Duration::from_secs(3)),
    )
    .unwrap();
    // Waiting out the open breaker is an opt-in (issue 42): the scenario counts the wait.
    let client = Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .backoff(exact())
                .no_budget()
                .wait_for_open_breakers(Duration::from_secs(60)),
        )
        .breaker(registry)
        .bearer(bearer)
        .build(reqwest_client())
        .unwrap();
    let status = |r: reqwest_middleware::Result<reqwest::Response>| r.unwrap().status().as_u16();

    // No token at first: not sent, retried after the manager's next fetch.
    assert_eq!(status(client.get(server.url("/a")).send().await), 200);
    // 503, 503 (the breaker opens), rejected, retried after its "retry in", the probe
    // succeeds and closes it.
    assert_eq!(status(client.get(server.url("/flaky")).send().await), 200);
    // 429 with Retry-After pauses the origin; the retry waits it out.
    assert_eq!(status(client.get(server.url("/busy")).send().await), 200);
    // A budget that allows no retry.
    let thrifty = Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .backoff(exact())
                .budget(RetryBudget::new(Duration::from_secs(10), 0, 0.0).unwrap()),
        )
        .no_breaker()
        .build(reqwest_client())
        .unwrap();
    assert_eq!(status(thrifty.get(server.url("/down")).send().await), 503);

    assert_eq!(server.requests_seen(), 7);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    let port = origin.port().to_string();
    (origin, port)
}

#[test]
fn a_hedge_winning_is_counted_as_sent_and_won_and_a_spent_budget_as_skipped() {
    support::label_every_origin();
    let recorder = DebuggingRecorder::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let origin = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            // Every first copy is slow; a hedge sent after 100 ms answers at once.
            let server = FaultServer::start(|i, _| {
                if i % 2 == 0 {
                    Action::Delay(Duration::from_secs(2), Box::new(Action::ok("slow")))
                } else {
                    Action::ok("fast")
                }
            })
            .await;
            // A client with no hedge budget hedges; one whose budget is empty skips.
            let hedging = reqwest_resilience::retry::Hedging::fixed(Duration::from_millis(100));
            let empty = RetryBudget::new(Duration::from_secs(10), 0, 0.0).unwrap();
            for (hedging, body) in [
                (hedging.clone().no_budget(), "fast"),
                (hedging.budget(empty), "slow"),
            ] {
                let client = Resilience::new()
                    .no_breaker()
                    .retry(RetryMiddleware::builder().hedging(hedging))
                    .build(reqwest_client())
                    .unwrap();
                let response = client.get(server.url("/h")).send().await.unwrap();
                assert_eq!(response.text().await.unwrap(), body);
            }
            Origin::parse(&server.url("/")).unwrap()
        })
    });
    let seen = seen(&recorder);
    let o = origin.as_str();
    let count = |name: &str, pairs: &[(&str, &str)]| {
        seen.get(&("counter".to_owned(), name.to_owned(), labels(pairs)))
            .map(|(_, n)| *n)
    };
    assert_eq!(
        count("reqwest_resilience.hedge.sent", &[("origin", o)]),
        Some(1)
    );
    assert_eq!(
        count("reqwest_resilience.hedge.won", &[("origin", o)]),
        Some(1)
    );
    assert_eq!(
        count(
            "reqwest_resilience.hedge.skipped",
            &[("origin", o), ("reason", "budget")]
        ),
        Some(1)
    );
}

#[test]
fn a_shared_get_counts_its_sender_once_and_each_caller_that_joined() {
    support::label_every_origin();
    let recorder = DebuggingRecorder::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let origin = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let server = FaultServer::always(Action::Delay(
                Duration::from_secs(1),
                Box::new(Action::ok("shared")),
            ))
            .await;
            let client = Resilience::new()
                .coalesce_gets(reqwest_resilience::coalesce::CoalesceGets::new())
                .build(reqwest_client())
                .unwrap();
            let url = server.url("/c");
            // Five at once (all join in the first poll), then one alone: not counted.
            let five = (0..5).map(|_| client.get(&url).send());
            for response in futures_util::future::join_all(five).await {
                assert_eq!(response.unwrap().text().await.unwrap(), "shared");
            }
            client.get(&url).send().await.unwrap();
            assert_eq!(server.requests_seen(), 2);
            Origin::parse(&url).unwrap()
        })
    });
    let seen = seen(&recorder);
    let count = |role: &str| {
        seen.get(&(
            "counter".to_owned(),
            "reqwest_resilience.coalesce.shared".to_owned(),
            labels(&[("origin", origin.as_str()), ("role", role)]),
        ))
        .map(|(_, n)| *n)
    };
    assert_eq!((count("sent"), count("joined")), (Some(1), Some(4)));
}

#[test]
fn a_resumed_body_is_a_retry_for_body_interrupted_and_its_range_request_an_attempt() {
    support::label_every_origin();
    use support::ranged::{Fault, RangedServer, Representation};
    let recorder = DebuggingRecorder::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let origin = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let body: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
            let server = RangedServer::start(Representation::resumable(body.clone()), |i, _| {
                if i == 0 {
                    Fault::Close(4_000)
                } else {
                    Fault::None
                }
            })
            .await;
            let client = Resilience::new()
                .no_breaker()
                .resume_bodies(true)
                .build(reqwest_client())
                .unwrap();
            let response = client.get(server.url("/f")).send().await.unwrap();
            assert!(response.bytes().await.unwrap()[..] == body[..]);
            Origin::parse(&server.url("/")).unwrap()
        })
    });
    let seen = seen(&recorder);
    let o = origin.as_str();
    let retries = seen
        .get(&(
            "counter".to_owned(),
            "reqwest_resilience.retry.retries".to_owned(),
            labels(&[("origin", o), ("reason", "body_interrupted")]),
        ))
        .map(|(_, n)| *n);
    assert_eq!(retries, Some(1));
    let attempts: u64 = seen
        .iter()
        .filter(|((kind, name, _), _)| {
            kind == "histogram" && name == "http.client.request.duration"
        })
        .map(|(_, (_, n))| *n)
        .sum();
    assert_eq!(attempts, 2, "the first request and the range request");
}
