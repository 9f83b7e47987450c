//! Feature `metrics`: the `origin` label is bounded. A test binary of its own, because the
//! bound and the set of labelled origins are process-wide (as the recorder is).
#![cfg(feature = "metrics")]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry};
use reqwest_resilience::metrics::set_max_origin_labels;
use reqwest_resilience::{Origin, Resilience};
use support::{Action, FaultServer};

/// The label of every origin past the bound (the module docs: `origin="other"`).
const OTHER_ORIGIN: &str = "other";

/// (name, labels) → counter value or histogram sample count.
fn series(recorder: &DebuggingRecorder) -> BTreeMap<(String, BTreeSet<(String, String)>), u64> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let labels = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let n = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(samples) => samples.len() as u64,
                DebugValue::Gauge(_) => 0,
            };
            ((key.key().name().to_owned(), labels), n)
        })
        .collect()
}

const BOUND: usize = 100;

#[test]
fn a_hundred_thousand_origins_make_at_most_the_bound_of_series_then_other() {
    set_max_origin_labels(BOUND);
    let recorder = DebuggingRecorder::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let server_port = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            // A small registry (it forgets idle origins past 1 000): the bound under test
            // is the metrics', not the registry's.
            let config = BreakerConfig::default().max_origins(1_000);
            let registry = BreakerRegistry::new(config).unwrap();
            // Each pause is one `breaker.pauses` increment labelled by its origin.
            for i in 0..100_000 {
                let origin = Origin::parse(&format!("https://mirror{i}.example")).unwrap();
                registry.pause(&origin, Duration::from_secs(1));
            }
            // A request to an origin past the bound: the duration histogram has no
            // `server.port` and `server.address="other"`.
            let server = FaultServer::always(Action::ok("ok")).await;
            let client = Resilience::new().build(support::loopback_client()).unwrap();
            let res = client.get(server.url("/")).send().await.unwrap();
            assert_eq!(res.status(), 200);
            server.addr().port()
        })
    });
    let all = series(&recorder);

    let pauses: Vec<_> = all
        .iter()
        .filter(|((name, _), _)| name == "reqwest_resilience.breaker.pauses")
        .collect();
    assert_eq!(pauses.len(), BOUND + 1, "{BOUND} origins and `other`");
    let other = pauses
        .iter()
        .find(|((_, labels), _)| labels.contains(&("origin".into(), OTHER_ORIGIN.into())))
        .map(|(_, n)| **n);
    assert_eq!(other, Some(100_000 - BOUND as u64));
    let labelled: BTreeSet<_> = pauses
        .iter()
        .filter_map(|((_, labels), n)| {
            let origin = labels.iter().find(|(k, _)| k == "origin")?.1.clone();
            (origin != OTHER_ORIGIN).then(|| {
                assert_eq!(**n, 1, "{origin}");
                origin
            })
        })
        .collect();
    let first: BTreeSet<_> = (0..BOUND)
        .map(|i| format!("https://mirror{i}.example:443"))
        .collect();
    assert_eq!(
        labelled, first,
        "the first origins reported keep their labels"
    );

    let durations: Vec<_> = all
        .iter()
        .filter(|((name, _), _)| name == "http.client.request.duration")
        .collect();
    assert_eq!(durations.len(), 1, "{durations:?}");
    let ((_, labels), n) = durations[0];
    assert_eq!(*n, 1);
    assert!(labels.contains(&("server.address".into(), OTHER_ORIGIN.into())));
    assert!(!labels.iter().any(|(k, _)| k == "server.port"));
    assert!(!labels.iter().any(|(_, v)| *v == server_port.to_string()));
    // Every series of every instrument: at most the bound's origins plus `other`.
    let origins: BTreeSet<_> = all
        .keys()
        .flat_map(|(_, labels)| labels.iter())
        .filter(|(k, _)| k == "origin" || k == "server.address")
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(origins.len(), BOUND + 1);
}
