//! The `tracing` side of the `Resilience` stack: one span per logical request with
//! OpenTelemetry's HTTP client field names, and one event per attempt. Each test's
//! subscriber is scoped with `support::tracing_scope` (tests on other threads run beside it).
#![cfg(feature = "tracing")]

use crate::support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest_resilience::RetryMiddleware;
use reqwest_resilience::{Backoff, Jitter, Resilience};
use support::{Action, FaultServer};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

type Fields = BTreeMap<String, String>;

/// Keeps the fields of the stack's spans and events (target `reqwest_resilience::stack`).
#[derive(Default, Clone)]
struct Capture {
    spans: Arc<Mutex<Vec<Fields>>>,
    events: Arc<Mutex<Vec<Fields>>>,
}

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

const TARGET: &str = "reqwest_resilience::stack";

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut spans = self.spans.lock().unwrap();
        let mut fields = Fields::new();
        if span.metadata().target() == TARGET {
            span.record(&mut Collect(&mut fields));
        }
        spans.push(fields);
        Id::from_u64(spans.len() as u64)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut spans = self.spans.lock().unwrap();
        if let Some(fields) = spans.get_mut(span.into_u64() as usize - 1)
            && !fields.is_empty()
        {
            values.record(&mut Collect(fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if event.metadata().target() == TARGET {
            let mut fields = Fields::new();
            event.record(&mut Collect(&mut fields));
            self.events.lock().unwrap().push(fields);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn get(fields: &Fields, name: &str) -> Option<String> {
    fields.get(name).cloned()
}

#[tokio::test(start_paused = true)]
async fn one_span_per_logical_request_with_otel_fields_and_one_event_per_attempt() {
    let capture = Capture::default();
    let _guard = support::tracing_scope::scoped(capture.clone());
    let server = FaultServer::sequence(vec![Action::status(503)], Action::ok("done")).await;
    let client = Resilience::new()
        .retry(
            RetryMiddleware::builder()
                .backoff(Backoff::builder().jitter(Jitter::None).build().unwrap()),
        )
        .build(
            reqwest::Client::builder()
                .no_proxy()
                .pool_idle_timeout(None)
                .build()
                .unwrap(),
        )
        .unwrap();

    let response =
        tokio::time::timeout(Duration::from_secs(60), client.get(server.url("/")).send())
            .await
            .expect("finished")
            .unwrap();
    assert_eq!(response.status(), 200);

    let spans: Vec<Fields> = capture
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|f| !f.is_empty())
        .cloned()
        .collect();
    assert_eq!(
        spans.len(),
        1,
        "one span for the logical request: {spans:?}"
    );
    let span = &spans[0];
    let port = server.addr().port().to_string();
    assert_eq!(get(span, "http.request.method").as_deref(), Some("GET"));
    assert_eq!(get(span, "server.address").as_deref(), Some("127.0.0.1"));
    assert_eq!(get(span, "server.port"), Some(port));
    assert_eq!(
        get(span, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(get(span, "http.request.resend_count").as_deref(), Some("1"));
    assert_eq!(get(span, "resilience.attempts").as_deref(), Some("2"));
    assert_eq!(get(span, "error.type"), None, "a 200 is not an error");

    let events = capture.events.lock().unwrap().clone();
    let decisions: Vec<Option<String>> = events
        .iter()
        .map(|e| get(e, "resilience.decision"))
        .collect();
    assert_eq!(
        decisions,
        [
            Some("retry: retryable status 503".to_owned()),
            Some("stop: final status 200".to_owned())
        ]
    );
    let summary: Vec<(Option<String>, Option<String>, Option<String>)> = events
        .iter()
        .map(|e| {
            (
                get(e, "http.request.resend_count"),
                get(e, "http.response.status_code"),
                get(e, "resilience.delay_ms"),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (Some("0".into()), Some("503".into()), Some("1000".into())),
            (Some("1".into()), Some("200".into()), None),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_request_records_error_type_on_its_span() {
    let capture = Capture::default();
    let _guard = support::tracing_scope::scoped(capture.clone());
    let port = support::refused_port();
    let client = Resilience::new()
        .no_retry()
        .build(reqwest::Client::builder().no_proxy().build().unwrap())
        .unwrap();

    let result = tokio::time::timeout(
        Duration::from_secs(60),
        client.get(format!("http://127.0.0.1:{port}/")).send(),
    )
    .await
    .expect("finished");
    assert!(result.is_err());

    let spans = capture.spans.lock().unwrap().clone();
    let span = spans
        .iter()
        .find(|f| !f.is_empty())
        .expect("the request span");
    assert_eq!(get(span, "error.type").as_deref(), Some("Connect"));
    assert_eq!(get(span, "http.response.status_code"), None);
    assert_eq!(get(span, "http.request.resend_count").as_deref(), Some("0"));
}

#[tokio::test(start_paused = true)]
async fn a_request_that_got_no_bearer_token_records_error_type_token_unavailable() {
    use reqwest_resilience::{AccessToken, BearerAuth, Origin, TokenManager};
    let capture = Capture::default();
    let _guard = support::tracing_scope::scoped(capture.clone());
    let server = FaultServer::always(Action::ok("never")).await;
    let tokens = TokenManager::new(|| async {
        Err::<AccessToken, _>(std::io::Error::other("identity provider down"))
    });
    let auth = BearerAuth::builder(tokens)
        .origin(Origin::parse(&server.url("/")).unwrap())
        .allow_http_on_loopback()
        .build()
        .unwrap();
    let client = Resilience::new()
        .no_retry()
        .bearer(auth)
        .build(reqwest::Client::builder().no_proxy().build().unwrap())
        .unwrap();

    let result = tokio::time::timeout(
        Duration::from_secs(60),
        client.post(server.url("/")).body("{}").send(),
    )
    .await
    .expect("finished");
    assert!(result.is_err());
    assert_eq!(server.requests_seen(), 0);

    let spans = capture.spans.lock().unwrap().clone();
    let span = spans
        .iter()
        .find(|f| !f.is_empty())
        .expect("the request span");
    assert_eq!(get(span, "error.type").as_deref(), Some("TokenUnavailable"));
    assert_eq!(get(span, "http.response.status_code"), None);
    assert_eq!(get(span, "resilience.attempts").as_deref(), Some("1"));
}

fn logical_span(capture: &Capture) -> Fields {
    let spans: Vec<Fields> = capture
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|f| !f.is_empty())
        .cloned()
        .collect();
    assert_eq!(spans.len(), 1, "{spans:?}");
    spans[0].clone()
}

fn plain_reqwest() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_span_is_internal_with_url_full_redacting_credentials_and_query_values() {
    let server = FaultServer::always(Action::ok("ok")).await;
    let port = server.addr().port();
    let url = format!("http://alice:s3cr3t@127.0.0.1:{port}/p?sig=abc&user=bob#frag");
    // A `reqwest::Request` made by hand keeps the credentials in its URL (reqwest's
    // `RequestBuilder` moves them into an `Authorization` header instead).
    let by_hand = || reqwest::Request::new(http::Method::GET, url.parse().unwrap());
    let cases = [
        (
            false,
            by_hand(),
            format!("http://REDACTED:REDACTED@127.0.0.1:{port}/p?sig=REDACTED&user=REDACTED"),
        ),
        (
            true,
            by_hand(),
            format!("http://REDACTED:REDACTED@127.0.0.1:{port}/p?sig=abc&user=bob"),
        ),
    ];
    for (keep_query, request, expected) in cases {
        let capture = Capture::default();
        let _guard = support::tracing_scope::scoped(capture.clone());
        let client = Resilience::new()
            .span_url_query(keep_query)
            .build(plain_reqwest())
            .unwrap();
        let response = client.execute(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let span = logical_span(&capture);
        assert_eq!(get(&span, "otel.kind").as_deref(), Some("internal"));
        assert_eq!(get(&span, "url.scheme").as_deref(), Some("http"));
        assert_eq!(get(&span, "url.full"), Some(expected));
    }
    assert_eq!(server.requests_seen(), 2);
}

/// A query that is only a secret (`?sk_live_…`, an API key passed as the whole query: a key
/// with no value to the query parser) is a value and never shows; nor does a key that does
/// not read as a name.
#[tokio::test(start_paused = true)]
async fn url_full_redacts_a_query_that_is_only_a_secret_and_keys_that_are_not_names() {
    let server = FaultServer::always(Action::ok("ok")).await;
    let port = server.addr().port();
    let long_key = "k".repeat(65);
    let cases = [
        ("?sk_live_51HxAbCdEf".to_string(), "?REDACTED".to_string()),
        (
            "?page=2&sk_live_51HxAbCdEf&&sort=asc".to_string(),
            "?page=REDACTED&REDACTED&sort=REDACTED".to_string(),
        ),
        (
            format!("?{long_key}=v&sk%5Flive=v&ids[]=1&a.b-c_d=x"),
            "?REDACTED&REDACTED&ids[]=REDACTED&a.b-c_d=REDACTED".to_string(),
        ),
        ("?=only-a-value".to_string(), "?REDACTED".to_string()),
    ];
    for (query, expected) in cases {
        let capture = Capture::default();
        let _guard = support::tracing_scope::scoped(capture.clone());
        let client = Resilience::new().build(plain_reqwest()).unwrap();
        let url = format!("http://127.0.0.1:{port}/hook{query}");
        let response = client.get(&url).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let span = logical_span(&capture);
        assert_eq!(
            get(&span, "url.full"),
            Some(format!("http://127.0.0.1:{port}/hook{expected}")),
            "{query}"
        );
        // No span or event field of this crate's shows the secret.
        let everything = format!(
            "{:?}{:?}",
            capture.spans.lock().unwrap(),
            capture.events.lock().unwrap()
        );
        assert!(
            !everything.contains("sk_live_51HxAbCdEf"),
            "{query}: {everything}"
        );
    }
    assert_eq!(server.requests_seen(), 4);
}

/// An event the test below reaches first from a thread with no subscriber of its own.
fn probe_event() {
    tracing::info!(target: TARGET, probe = "scoped", "probe");
}

#[test]
fn a_callsite_first_reached_on_a_thread_without_a_subscriber_still_reaches_a_scoped_one() {
    let capture = Capture::default();
    let _guard = support::tracing_scope::scoped(capture.clone());
    // Registered by a thread with no subscriber, while this thread's is in place: with only
    // one subscriber registered, tracing-core would cache that thread's `never`.
    std::thread::spawn(probe_event)
        .join()
        .expect("the probe thread ends");
    probe_event();
    let events = capture.events.lock().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].get("probe").map(String::as_str), Some("scoped"));
}
