//! The registry driven through its permits, without the middleware (moved here from
//! `tests/it/{limit,limit_tracing}.rs` and the registry's doc example when the permit API
//! became crate-private): many tasks never exceed the limit, the metrics and the
//! `tracing` events of a limit's changes and rejections.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::task::JoinSet;

use super::gradient::Sample;
use super::{LimiterConfig, LimiterRegistry};
use crate::Origin;

const MS: Duration = Duration::from_millis(1);

/// The registry's former doc example: a bulkhead of 2 turns the third attempt away, and
/// a recorded permit frees its place.
#[tokio::test]
async fn a_fixed_limit_of_two_turns_the_third_attempt_away_until_one_is_recorded() {
    let registry = LimiterRegistry::new(LimiterConfig::fixed(2)).unwrap();
    let origin = Origin::parse("https://api.example.com").unwrap();
    let a = registry.try_acquire(&origin).unwrap();
    let _b = registry.try_acquire(&origin).unwrap();
    let full = registry.try_acquire(&origin).unwrap_err();
    assert_eq!((full.limit, full.in_flight), (2, 2));
    a.record(Sample::Latency(Duration::from_millis(5)));
    assert_eq!(registry.get(&origin).unwrap().in_flight, 1);
}

/// Many tasks on a multi-thread runtime through the registry alone: never more than the
/// limit in flight, in any interleaving tried. (The same through a real server:
/// `tests/it/limit.rs`, `many_tasks_on_a_multi_thread_runtime_never_exceed_the_limit`.)
#[test]
fn many_tasks_through_the_registry_never_exceed_the_limit() {
    const LIMIT: u32 = 8;
    for round in 0..3 {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // The registry: 32 tasks × 200 permits, half fail fast, half queue.
            let registry = LimiterRegistry::new(
                LimiterConfig::fixed(LIMIT).queue(64, Duration::from_secs(60)),
            )
            .unwrap();
            let origin = Origin::parse("http://limit.example").unwrap();
            let current = Arc::new(AtomicUsize::new(0));
            let peak = Arc::new(AtomicUsize::new(0));
            let served = Arc::new(AtomicUsize::new(0));
            let mut set = JoinSet::new();
            for task in 0..32 {
                let (r, o) = (registry.clone(), origin.clone());
                let (current, peak, served) = (current.clone(), peak.clone(), served.clone());
                set.spawn(async move {
                    for _ in 0..200 {
                        let permit = if task % 2 == 0 {
                            r.try_acquire(&o).ok()
                        } else {
                            Some(r.acquire(&o, None).await.unwrap())
                        };
                        let Some(permit) = permit else {
                            tokio::task::yield_now().await;
                            continue;
                        };
                        let now = current.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        current.fetch_sub(1, Ordering::SeqCst);
                        served.fetch_add(1, Ordering::SeqCst);
                        permit.record(Sample::Latency(MS));
                    }
                });
            }
            while let Some(r) = set.join_next().await {
                r.unwrap();
            }
            assert!(
                peak.load(Ordering::SeqCst) <= LIMIT as usize,
                "round {round}"
            );
            // Every queueing task got all of its 200.
            assert!(served.load(Ordering::SeqCst) >= 16 * 200);
            let s = registry.get(&origin).unwrap();
            assert_eq!((s.in_flight, s.queued), (0, 0));
        });
    }
}

// ---------------------------------------------------------------------------------------
// Metrics

/// A recorder that keeps the last value of every gauge and the total of every counter,
/// by name and `origin` label.
#[cfg(feature = "metrics")]
mod recorder {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    type Values = Arc<Mutex<BTreeMap<(String, String), f64>>>;

    #[derive(Default, Clone)]
    pub struct Captured(pub Values);

    struct Handle(Values, (String, String), AtomicU64);

    impl metrics::CounterFn for Handle {
        fn increment(&self, value: u64) {
            let total = self.2.fetch_add(value, Ordering::SeqCst) + value;
            self.0.lock().unwrap().insert(self.1.clone(), total as f64);
        }
        fn absolute(&self, value: u64) {
            self.2.store(value, Ordering::SeqCst);
            self.0.lock().unwrap().insert(self.1.clone(), value as f64);
        }
    }

    impl metrics::GaugeFn for Handle {
        fn increment(&self, _: f64) {
            unimplemented!("the limiter only sets gauges")
        }
        fn decrement(&self, _: f64) {
            unimplemented!("the limiter only sets gauges")
        }
        fn set(&self, value: f64) {
            self.0.lock().unwrap().insert(self.1.clone(), value);
        }
    }

    impl Captured {
        fn handle(&self, key: &Key) -> Arc<Handle> {
            let origin = key
                .labels()
                .find(|l| l.key() == "origin")
                .map(|l| l.value().to_owned())
                .unwrap_or_default();
            Arc::new(Handle(
                self.0.clone(),
                (key.name().to_owned(), origin),
                AtomicU64::new(0),
            ))
        }

        pub fn get(&self, name: &str, origin: &str) -> Option<f64> {
            self.0
                .lock()
                .unwrap()
                .get(&(name.to_owned(), origin.to_owned()))
                .copied()
        }
    }

    impl Recorder for Captured {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(self.handle(key))
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(self.handle(key))
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }
}

#[cfg(feature = "metrics")]
#[tokio::test(start_paused = true)]
async fn metrics_gauges_follow_limit_and_in_flight_and_rejections_are_counted_per_origin() {
    crate::metrics::set_max_origin_labels(usize::MAX);
    let captured = recorder::Captured::default();
    let registry = LimiterRegistry::new(LimiterConfig::fixed(2)).unwrap();
    let origin = Origin::parse("http://metrics.example:8080").unwrap();
    let label = origin.to_string();
    // Instruments are registered when an origin is first seen.
    let first = metrics::with_local_recorder(&captured, || registry.try_acquire(&origin)).unwrap();
    let get = |name: &str| captured.get(name, &label);
    assert_eq!(get("reqwest_resilience.limiter.limit"), Some(2.0));
    assert_eq!(get("reqwest_resilience.limiter.in_flight"), Some(1.0));
    let second = registry.try_acquire(&origin).unwrap();
    assert_eq!(get("reqwest_resilience.limiter.in_flight"), Some(2.0));
    for _ in 0..3 {
        assert!(registry.try_acquire(&origin).is_err());
    }
    assert_eq!(get("reqwest_resilience.limiter.rejections"), Some(3.0));
    first.record(Sample::Latency(MS));
    drop(second);
    assert_eq!(get("reqwest_resilience.limiter.in_flight"), Some(0.0));
    assert_eq!(get("reqwest_resilience.limiter.limit"), Some(2.0));
}
// ---------------------------------------------------------------------------------------
// The `tracing` events

#[cfg(feature = "tracing")]
mod events {
    use std::fmt;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tracing::field::{Field, Visit};
    use tracing::{Event, Metadata, Subscriber, span};

    use crate::Origin;
    use crate::limit::gradient::Sample;
    use crate::limit::{Gradient, LimiterConfig, LimiterRegistry};

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
        let _guard = crate::tracing_scope::scoped(capture.clone());
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
}
