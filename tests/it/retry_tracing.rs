//! The retry middleware's `tracing` events (feature `tracing`). Each test's subscriber is
//! scoped with `support::tracing_scope`: tracing caches per-callsite interest process-wide,
//! and a callsite first reached by a test thread without a subscriber would stay silent.

#![cfg(feature = "tracing")]

use crate::support;

use std::time::Duration;

use reqwest_middleware::ClientBuilder;
use reqwest_resilience::{Backoff, Jitter, RetryMiddleware, TransportEvidence};
use support::{Action, FaultServer};

mod tracing_capture {
    use std::fmt;
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::{Event, Metadata, Subscriber, span};

    pub const RETRY: &str = "reqwest_resilience::retry";
    pub const TRANSPORT: &str = "reqwest_resilience::evidence::middleware";

    /// One event's fields as `(name, value)`.
    pub type EventFields = Vec<(String, String)>;

    /// Records the fields of every event under the retry middleware's and the transport
    /// step's targets, with the target as a first `("target", …)` field.
    #[derive(Clone, Default)]
    pub struct Capture(pub Arc<Mutex<Vec<EventFields>>>);

    struct Fields(EventFields);

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.0.push((field.name().to_owned(), format!("{value:?}")));
        }
    }

    impl Subscriber for Capture {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            [RETRY, TRANSPORT].contains(&metadata.target())
        }
        fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
            span::Id::from_u64(1)
        }
        fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
        fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
        fn event(&self, event: &Event<'_>) {
            let target = event.metadata().target().to_owned();
            let level = event.metadata().level().to_string();
            let mut fields = Fields(vec![
                ("target".to_owned(), target),
                ("level".to_owned(), level),
            ]);
            event.record(&mut fields);
            self.0.lock().unwrap().push(fields.0);
        }
        fn enter(&self, _: &span::Id) {}
        fn exit(&self, _: &span::Id) {}
    }
}

#[tokio::test(start_paused = true)]
async fn one_tracing_event_per_decision_with_otel_resend_count_method_delay_and_reason() {
    let capture = tracing_capture::Capture::default();
    let _guard = support::tracing_scope::scoped(capture.clone());
    let server = FaultServer::sequence(
        vec![Action::status(503), Action::status(503)],
        Action::ok("ok"),
    )
    .await;
    let retry = RetryMiddleware::builder()
        .backoff(Backoff::builder().jitter(Jitter::None).build().unwrap())
        .no_budget()
        .build()
        .unwrap();
    let reqwest = reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .build()
        .unwrap();
    let c = ClientBuilder::new(reqwest)
        .with(retry)
        .with(TransportEvidence::new())
        .build();
    let res = tokio::time::timeout(Duration::from_secs(60), c.get(server.url("/")).send())
        .await
        .unwrap();
    assert_eq!(res.unwrap().status(), 200);
    let events = capture.0.lock().unwrap().clone();
    let field = |e: &Vec<(String, String)>, name: &str| {
        e.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let of = |target: &str| {
        events
            .iter()
            .filter(|e| field(e, "target") == target)
            .collect::<Vec<_>>()
    };
    let summary: Vec<_> = of(tracing_capture::RETRY)
        .into_iter()
        .map(|e| {
            (
                field(e, "message"),
                field(e, "http.request.resend_count"),
                field(e, "http.request.method"),
                field(e, "delay_ms"),
                field(e, "reason"),
            )
        })
        .collect();
    let s = |x: &str| x.to_owned();
    assert_eq!(
        summary,
        [
            (
                s("retrying"),
                s("0"),
                s("GET"),
                s("1000"),
                s("retryable status 503")
            ),
            (
                s("retrying"),
                s("1"),
                s("GET"),
                s("2000"),
                s("retryable status 503")
            ),
            (
                s("not retrying"),
                s("2"),
                s("GET"),
                s(""),
                s("final status 200")
            ),
        ]
    );
    // The transport step: one event per attempt, with OpenTelemetry's names.
    let port = server.addr().port().to_string();
    let transport: Vec<_> = of(tracing_capture::TRANSPORT)
        .into_iter()
        .map(|e| {
            (
                field(e, "server.address"),
                field(e, "server.port"),
                field(e, "http.request.resend_count"),
                field(e, "http.response.status_code"),
                field(e, "error.type"),
            )
        })
        .collect();
    // `None` fields are left out of an event; a `&str` records with its quotes.
    let attempt = |resend: &str, status: &str| {
        (
            s("\"127.0.0.1\""),
            port.clone(),
            s(resend),
            s(status),
            s(""),
        )
    };
    assert_eq!(
        transport,
        [
            attempt("0", "503"),
            attempt("1", "503"),
            attempt("2", "200")
        ]
    );
}

/// The fields of the retry middleware's events of one request to a server that resets
/// every connection, through a retry configured by `retry`.
async fn retry_events_of_a_reset(
    retry: reqwest_resilience::retry::RetryMiddlewareBuilder,
) -> (Vec<Vec<(String, String)>>, String) {
    let capture = tracing_capture::Capture::default();
    let _guard = support::tracing_scope::scoped(capture.clone());
    let server = FaultServer::always(Action::ReadThenReset).await;
    let c = ClientBuilder::new(support::loopback_client())
        .with(retry.max_retries(1).build().unwrap())
        .with(TransportEvidence::new())
        .build();
    assert!(c.get(server.url("/")).send().await.is_err());
    let events = capture.0.lock().unwrap().clone();
    let retry_events = events
        .into_iter()
        .filter(|e| {
            e.iter()
                .any(|(n, v)| n == "target" && v == tracing_capture::RETRY)
        })
        .collect();
    (retry_events, server.url("/"))
}

fn field(e: &[(String, String)], name: &str) -> String {
    e.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn the_event_before_a_retry_is_a_warning_with_the_error_and_its_caused_by_chain() {
    let (events, url) = retry_events_of_a_reset(support::exact_retry()).await;
    let retrying = &events[0];
    assert_eq!(
        [
            "level",
            "message",
            "delay_ms",
            "reason",
            "http.response.status_code"
        ]
        .map(|n| field(retrying, n)),
        [
            "WARN".to_owned(),
            "retrying".to_owned(),
            "1000".to_owned(),
            "an idempotent request got no response".to_owned(),
            String::new(),
        ]
    );
    // `Option<String>` fields record as their `Debug` text.
    let error = format!("error sending request for url ({url})");
    assert_eq!(field(retrying, "error"), format!("{error:?}"));
    // Each source on a line of its own (Linux's text for ECONNRESET).
    let caused_by = "Caused by: client error (SendRequest)\n\
                     Caused by: connection error\n\
                     Caused by: Connection reset by peer (os error 104)";
    assert_eq!(field(retrying, "caused_by"), format!("{caused_by:?}"));
    // The stop after the second attempt stays a DEBUG event.
    assert_eq!(
        (field(&events[1], "level"), field(&events[1], "message")),
        ("DEBUG".to_owned(), "not retrying".to_owned())
    );
    assert_eq!(events.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_level_of_the_event_before_a_retry_is_configurable() {
    let (events, _) =
        retry_events_of_a_reset(support::exact_retry().retry_event_level(tracing::Level::INFO))
            .await;
    assert_eq!(
        events
            .iter()
            .map(|e| (field(e, "level"), field(e, "message")))
            .collect::<Vec<_>>(),
        [
            ("INFO".to_owned(), "retrying".to_owned()),
            ("DEBUG".to_owned(), "not retrying".to_owned())
        ]
    );
}
