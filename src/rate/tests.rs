//! The registry driven through its tickets, without the middleware (moved here from
//! `tests/it/rate_limit.rs` and the registry's doc example when the ticket API became
//! crate-private): the bound on origins and the overflow rate, concurrent callers taking
//! exactly the burst, the rejections metric.

use std::sync::Arc;
use std::time::Duration;

use super::{Rate, RateLimitConfig, RateLimitRegistry};
use crate::Origin;

const S: Duration = Duration::from_secs(1);

/// The registry's former doc example: at 2 per second (a burst of 2), the third request
/// in the same instant is turned away until the next slot, 500 ms later.
#[tokio::test(start_paused = true)]
async fn two_per_second_turn_the_third_request_away_for_500ms() {
    let registry = RateLimitRegistry::new(
        RateLimitConfig::default()
            .learn(false)
            .rate(Rate::per_second(2)),
    )
    .unwrap();
    let origin = Origin::parse("https://api.example.com").unwrap();
    assert!(registry.try_acquire(&origin).is_ok());
    assert!(registry.try_acquire(&origin).is_ok());
    let over = registry.try_acquire(&origin).unwrap_err();
    assert_eq!(over.retry_in, Duration::from_millis(500));
}

#[test]
fn the_registry_holds_at_most_max_origins_and_overflows_when_all_are_busy() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let registry = RateLimitRegistry::new(RateLimitConfig::default().max_origins(100)).unwrap();
    let origin = |i: usize| Origin::parse(&format!("http://h{i}.example")).unwrap();
    // Each first request is its origin's probe; answered (here: dropped), the origin is idle.
    for i in 0..1_000 {
        let ticket = registry.try_acquire(&origin(i)).unwrap();
        assert!(ticket.is_probe());
    }
    assert_eq!((registry.len(), registry.overflowed()), (100, 0));
    // 100 probes out: no origin can be forgotten, so new ones share the overflow rate.
    let held: Vec<_> = (1_000..1_100)
        .map(|i| registry.try_acquire(&origin(i)).unwrap())
        .collect();
    assert!(registry.try_acquire(&origin(5_000)).is_ok());
    assert_eq!((registry.len(), registry.overflowed()), (100, 1));
    drop(held);
}

#[test]
fn concurrent_callers_take_exactly_the_burst() {
    for _ in 0..20 {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            // 10 per hour: nothing refills during the test.
            let registry = RateLimitRegistry::new(
                RateLimitConfig::default()
                    .learn(false)
                    .rate(Rate::per(10, 3600 * S))
                    .max_wait(Duration::ZERO),
            )
            .unwrap();
            let o = Origin::parse("http://127.0.0.1:9").unwrap();
            let barrier = Arc::new(tokio::sync::Barrier::new(50));
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..50 {
                let (registry, o, barrier) = (registry.clone(), o.clone(), barrier.clone());
                tasks.spawn(async move {
                    barrier.wait().await;
                    registry.acquire(&o, None).await.is_ok()
                });
            }
            let admitted = tasks.join_all().await.into_iter().filter(|ok| *ok).count();
            assert_eq!(admitted, 10);
            assert_eq!(registry.get(&o).unwrap().rejections, 40);
        });
    }
}

#[cfg(feature = "metrics")]
#[test]
fn each_rejection_is_counted_in_the_rate_rejections_metric() {
    crate::metrics::set_max_origin_labels(usize::MAX);
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let registry = RateLimitRegistry::new(
                RateLimitConfig::default()
                    .learn(false)
                    .rate(Rate::per_second(1).burst(1)),
            )
            .unwrap();
            let o = Origin::parse("http://127.0.0.1:9").unwrap();
            drop(registry.try_acquire(&o).unwrap());
            for _ in 0..3 {
                registry.try_acquire(&o).unwrap_err();
            }
        })
    });
    let counted: Vec<(Vec<(String, String)>, DebugValue)> = recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "reqwest_resilience.rate.rejections")
        .map(|(key, _, _, value)| {
            let labels = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (labels, value)
        })
        .collect();
    assert_eq!(
        counted,
        vec![(
            vec![("origin".to_owned(), "http://127.0.0.1:9".to_owned())],
            DebugValue::Counter(3)
        )]
    );
}
