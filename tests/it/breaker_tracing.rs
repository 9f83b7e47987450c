//! The circuit breaker's `tracing` events (feature `tracing`). A test binary of its own:
//! tracing caches per-callsite interest process-wide, so a scoped subscriber in one test
//! races with callsites first hit by tests on other threads.

#![cfg(feature = "tracing")]

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest_resilience::Origin;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, Outcome, TripPolicy};
use tracing::field::{Field, Visit};
use tracing::{Event, Metadata, Subscriber, span};

type Fields = Vec<(String, String)>;

/// Records the fields of every event under the breaker's targets.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Fields>>>);

struct Visitor(Fields);

impl Visit for Visitor {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target().starts_with("reqwest_resilience::breaker")
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut v = Visitor(Vec::new());
        event.record(&mut v);
        self.0.lock().unwrap().push(v.0);
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

fn field<'a>(fields: &'a Fields, name: &str) -> &'a str {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no field {name} in {fields:?}"))
}

#[tokio::test(start_paused = true)]
async fn one_event_per_state_change_and_per_pause_with_origin_and_states() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let reg = BreakerRegistry::new(
        BreakerConfig::default()
            .policy(TripPolicy::consecutive_failures(2))
            .open_duration(Duration::from_secs(3)),
    )
    .unwrap();
    let o = Origin::parse("https://api.example.com").unwrap();
    reg.acquire(&o).unwrap().record(Outcome::Failure);
    assert!(capture.0.lock().unwrap().is_empty());
    reg.acquire(&o).unwrap().record(Outcome::Failure);
    tokio::time::advance(Duration::from_secs(3)).await;
    reg.acquire(&o).unwrap().record(Outcome::Success);
    reg.pause(&o, Duration::from_secs(5));
    // A shorter pause while a longer one runs changes nothing and says nothing.
    reg.pause(&o, Duration::from_secs(1));

    let events = capture.0.lock().unwrap().clone();
    assert_eq!(events.len(), 4, "{events:?}");
    let changes: Vec<_> = events[..3]
        .iter()
        .map(|e| (field(e, "from"), field(e, "to"), field(e, "open_for")))
        .collect();
    assert_eq!(
        changes,
        [
            ("Closed", "Open", "Some(3s)"),
            ("Open", "HalfOpen", "None"),
            ("HalfOpen", "Closed", "None"),
        ]
    );
    for e in &events {
        assert_eq!(field(e, "origin"), "https://api.example.com:443");
    }
    assert_eq!(field(&events[3], "pause"), "5s");
}
