//! The concurrency limiter's `tracing` events (feature `tracing`). A test binary of its
//! own, as the other `*_tracing.rs`: tracing caches per-callsite interest process-wide.

#![cfg(feature = "tracing")]

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest_resilience::Origin;
use reqwest_resilience::limit::{Gradient, LimiterConfig, LimiterRegistry, Sample};
use tracing::field::{Field, Visit};
use tracing::{Event, Metadata, Subscriber, span};

type Fields = Vec<(String, String)>;

/// Records the fields of every event under the limiter's target.
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
        metadata.target() == "reqwest_resilience::limit"
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

fn fields(e: &Fields, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .map(|n| {
            e.iter()
                .find(|(f, _)| f == n)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no field {n} in {e:?}"))
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn one_event_per_limit_change_and_per_rejection_with_origin_and_counts() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let g = Gradient::default()
        .min_limit(1)
        .initial_limit(2)
        .min_window_samples(1);
    let registry = LimiterRegistry::new(LimiterConfig::adaptive(g)).unwrap();
    let origin = Origin::parse("https://api.example.com").unwrap();
    let a = registry.try_acquire(&origin).unwrap();
    let b = registry.try_acquire(&origin).unwrap();
    assert!(registry.try_acquire(&origin).is_err());
    // A window of two samples with an overload signal: 2 × 0.9 = 1.8, limit 1.
    a.record(Sample::Overload);
    b.record(Sample::Latency(Duration::from_millis(5)));
    assert_eq!(registry.get(&origin).unwrap().limit, 1);

    let events = capture.0.lock().unwrap().clone();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(
        fields(&events[0], &["message", "origin", "limit", "in_flight"]),
        [
            "request over the concurrency limit rejected",
            "\"https://api.example.com:443\"",
            "2",
            "2"
        ]
    );
    assert_eq!(
        fields(
            &events[1],
            &["message", "origin", "from", "to", "in_flight"]
        ),
        [
            "concurrency limit changed",
            "\"https://api.example.com:443\"",
            "2",
            "1",
            "0"
        ]
    );
}
