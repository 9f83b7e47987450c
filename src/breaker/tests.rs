//! The registry driven through its permits, without the middleware (moved here from
//! `tests/it/{model,breaker,breaker_tracing}.rs` when the permit API became crate-private):
//!
//! - a model of held permits, recorded or dropped in any order, over several origins
//!   (proptest, paused clock): probe accounting, the HalfOpen limit, nothing stuck;
//! - tripped breakers surviving eviction races across threads;
//! - the lock-free Closed path raced against failures, trips, isolation and resets;
//! - the `tracing` events (feature `tracing`).
//!
//! (The single breaker's state machine has its own reference model in `state.rs`.)

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::registry::BreakerPermit;
use super::{BreakerConfig, BreakerRegistry, BreakerState, Outcome, RejectReason, TripPolicy};
use crate::Origin;

const S: Duration = Duration::from_secs(1);

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------------------
// BreakerRegistry with held permits

const ORIGINS: usize = 3;
const PROBES: u32 = 2;
const OPEN: Duration = Duration::from_millis(1_000);

#[derive(Debug, Clone)]
enum BreakerOp {
    Acquire(usize),
    Record(usize, u8),
    Drop(usize),
    Advance(u64),
    Pause(usize, u64),
}

fn breaker_op() -> impl Strategy<Value = BreakerOp> {
    prop_oneof![
        4 => (0..ORIGINS).prop_map(BreakerOp::Acquire),
        3 => (0usize..8, 0u8..3).prop_map(|(i, o)| BreakerOp::Record(i, o)),
        2 => (0usize..8).prop_map(BreakerOp::Drop),
        2 => (0u64..1_500).prop_map(BreakerOp::Advance),
        1 => (0..ORIGINS, 0u64..2_000).prop_map(|(o, ms)| BreakerOp::Pause(o, ms)),
    ]
}

fn outcome(o: u8) -> Outcome {
    match o {
        0 => Outcome::Success,
        1 => Outcome::Failure,
        _ => Outcome::Neutral,
    }
}

fn run_registry_model(ops: Vec<BreakerOp>) {
    paused_runtime().block_on(async {
        let config = BreakerConfig::default()
            .policy(TripPolicy::consecutive_failures(2))
            .open_duration(OPEN)
            .half_open_probes(PROBES)
            .max_pause(Duration::from_secs(5));
        let registry = BreakerRegistry::new(config).unwrap();
        let origins: Vec<Origin> = (0..ORIGINS)
            .map(|i| Origin::parse(&format!("https://o{i}.example.test")).unwrap())
            .collect();
        let mut held: Vec<(usize, BreakerPermit<'_>)> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            match *op {
                BreakerOp::Acquire(o) => {
                    let before = registry.state(&origins[o]);
                    match registry.acquire(&origins[o]) {
                        Ok(permit) => {
                            // A Closed breaker hands out plain permits, never probes.
                            if before == Some(BreakerState::Closed) || before.is_none() {
                                assert!(!permit.is_probe(), "step {step}");
                            }
                            held.push((o, permit));
                        }
                        Err(r) => {
                            assert_eq!(&r.origin, &origins[o]);
                            if r.reason != RejectReason::Isolated {
                                assert!(r.retry_in.is_some(), "step {step}: {r:?}");
                            }
                        }
                    }
                }
                BreakerOp::Record(i, o) if i < held.len() => {
                    let (_, permit) = held.remove(i);
                    permit.record(outcome(o));
                }
                BreakerOp::Drop(i) if i < held.len() => {
                    drop(held.remove(i));
                }
                BreakerOp::Advance(ms) => {
                    tokio::time::advance(Duration::from_millis(ms)).await;
                }
                BreakerOp::Pause(o, ms) => {
                    let applied = registry.pause(&origins[o], Duration::from_millis(ms));
                    assert!(applied <= Duration::from_secs(5));
                }
                _ => {}
            }
            for snap in registry.snapshot() {
                let o = origins.iter().position(|x| *x == snap.origin).unwrap();
                let held_probes =
                    held.iter().filter(|(h, p)| *h == o && p.is_probe()).count() as u32;
                // Probes of an earlier HalfOpen period no longer count, so at most.
                assert!(
                    snap.probes_in_flight <= held_probes,
                    "step {step}: {snap:?}, {held_probes} probe permits held"
                );
                assert!(snap.probes_in_flight <= PROBES, "step {step}: {snap:?}");
                if snap.state == BreakerState::Closed {
                    assert_eq!(snap.probes_in_flight, 0, "step {step}");
                }
            }
            assert!(registry.len() <= ORIGINS);
        }
        // Once every permit is gone and the open period and pauses are over, every
        // origin admits a request: nothing is stuck.
        held.clear();
        for snap in registry.snapshot() {
            assert_eq!(snap.probes_in_flight, 0, "{snap:?}");
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        for origin in &origins {
            let permit = registry
                .acquire(origin)
                .unwrap_or_else(|r| panic!("{origin} stuck: {r:?}"));
            permit.record(Outcome::Success);
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn registry_permits_recorded_or_dropped_in_any_order_never_leak_a_probe_slot(
        ops in prop::collection::vec(breaker_op(), 1..150),
    ) {
        run_registry_model(ops);
    }
}

// ---------------------------------------------------------------------------------------
// BreakerRegistry eviction under threads

/// Eight origins are tripped (open for an hour) while four threads push a thousand other
/// origins through a registry bounded at 64: the bound holds at every step, and no
/// tripped breaker is ever forgotten (an evicted Open breaker would reopen the floodgates
/// to a server known to be down).
#[test]
fn tripped_breakers_survive_eviction_races_across_threads() {
    const TRIPPED: usize = 8;
    const MAX: usize = 64;
    let config = BreakerConfig::default()
        .policy(TripPolicy::consecutive_failures(1))
        .open_duration(Duration::from_secs(3600))
        .max_origins(MAX);
    let registry = BreakerRegistry::new(config).unwrap();
    let tripped: Vec<Origin> = (0..TRIPPED)
        .map(|i| Origin::parse(&format!("https://down{i}.example.test")).unwrap())
        .collect();
    for o in &tripped {
        registry.acquire(o).unwrap().record(Outcome::Failure);
        assert_eq!(registry.state(o), Some(BreakerState::Open));
    }
    let healthy: Vec<Origin> = (0..1_000)
        .map(|n| Origin::parse(&format!("https://up{n}.example.test")).unwrap())
        .collect();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (registry, tripped, healthy) = (&registry, &tripped, &healthy);
            s.spawn(move || {
                // Some permits stay in flight across iterations (their breakers must not
                // be forgotten either), then are dropped unrecorded or recorded.
                let mut held = Vec::new();
                for i in 0..20_000u64 {
                    let origin = &healthy[((i * 7919 + t * 104_729) % 1_000) as usize];
                    match registry.acquire(origin) {
                        Ok(permit) if i.is_multiple_of(5) => held.push(permit),
                        Ok(permit) => permit.record(Outcome::Success),
                        Err(r) => panic!("a healthy origin was rejected: {r:?}"),
                    }
                    if held.len() > 4 {
                        let oldest = held.remove(0);
                        if i.is_multiple_of(2) {
                            oldest.record(Outcome::Neutral);
                        }
                    }
                    assert!(registry.len() <= MAX);
                    let check = &tripped[(i as usize) % TRIPPED];
                    assert_eq!(
                        registry.state(check),
                        Some(BreakerState::Open),
                        "{check} was forgotten"
                    );
                }
            });
        }
    });
    for o in &tripped {
        let rejected = registry.acquire(o).unwrap_err();
        assert_eq!(rejected.reason, RejectReason::Open);
    }
}

// --- The registry's lock-free Closed path under real threads --------------------------
//
// Successes and neutral outcomes of a Closed breaker with nothing counted are admitted and
// recorded without the breaker's mutex; these rounds race them against failures, trips,
// isolation and resets on std threads (real clock, no timing assertion).

const ROUNDS: usize = 200;
const THRESHOLD: u32 = 6;

type Events = Arc<std::sync::Mutex<Vec<(BreakerState, BreakerState)>>>;

fn recording_registry() -> (BreakerRegistry, Events) {
    let events: Events = Arc::default();
    let sink = events.clone();
    let registry = BreakerRegistry::with_listener(
        BreakerConfig::default()
            .policy(TripPolicy::consecutive_failures(THRESHOLD))
            .open_duration(3600 * S),
        move |e: &crate::breaker::BreakerEvent| sink.lock().unwrap().push((e.from, e.to)),
    )
    .unwrap();
    (registry, events)
}

/// `(state, consecutive failures, trips)` of the one origin in `reg`.
fn only_breaker(reg: &BreakerRegistry) -> (BreakerState, u32, u32) {
    let snap = reg.snapshot();
    assert_eq!(snap.len(), 1);
    (snap[0].state, snap[0].consecutive_failures, snap[0].trips)
}

/// Makes the permits held by the caller stale: a trip and a reset (even rounds) or an
/// isolation and a reset (odd rounds) each bump the breaker's generation twice.
fn new_generation(reg: &BreakerRegistry, o: &Origin, round: usize) {
    if round.is_multiple_of(2) {
        for _ in 0..THRESHOLD {
            reg.acquire(o).unwrap().record(Outcome::Failure);
        }
        assert_eq!(reg.state(o), Some(BreakerState::Open));
    } else {
        assert!(reg.isolate(o));
    }
    reg.reset(o);
}

/// Stale successes (permits from before a trip or an isolation) and fresh neutral
/// outcomes race exactly `THRESHOLD` failures from three threads: no stale success resets
/// the count, so the breaker trips exactly once, at the last failure, and the snapshot
/// and the listener agree.
#[test]
fn stale_successes_and_neutral_outcomes_racing_failures_never_reset_the_count() {
    use std::sync::Barrier;
    for round in 0..ROUNDS {
        let (reg, events) = recording_registry();
        let o = Origin::parse("http://fast-path.example").unwrap();
        let (held, racers) = (Barrier::new(5), Barrier::new(8));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let stale: Vec<_> = (0..8).map(|_| reg.acquire(&o).unwrap()).collect();
                    held.wait();
                    racers.wait();
                    for (i, permit) in stale.into_iter().enumerate() {
                        if i % 4 == 3 {
                            drop(permit);
                        } else {
                            permit.record(Outcome::Success);
                        }
                        if let Ok(fresh) = reg.acquire(&o) {
                            fresh.record(Outcome::Neutral);
                        }
                    }
                });
            }
            for _ in 0..3 {
                s.spawn(|| {
                    racers.wait();
                    for _ in 0..THRESHOLD / 3 {
                        reg.acquire(&o).unwrap().record(Outcome::Failure);
                    }
                });
            }
            held.wait();
            new_generation(&reg, &o, round);
            assert_eq!(only_breaker(&reg), (BreakerState::Closed, 0, 0));
            racers.wait();
        });
        assert_eq!(
            only_breaker(&reg),
            (BreakerState::Open, THRESHOLD, 1),
            "round {round}"
        );
        let events = events.lock().unwrap();
        let tail = &events[events.len() - 3..];
        assert_eq!(tail[2], (BreakerState::Closed, BreakerState::Open));
        assert_eq!(tail[1].1, BreakerState::Closed, "round {round}");
        let opened = events.iter().filter(|e| e.1 == BreakerState::Open).count();
        assert_eq!(
            opened,
            1 + usize::from(round.is_multiple_of(2)),
            "round {round}"
        );
    }
}

/// Fresh successes (lock-free while nothing is counted) race failures: whatever the
/// interleaving, the count is never past the threshold, the breaker is Open exactly when
/// the listener saw it trip (once), and then the count is exactly the threshold. Then,
/// with the racers gone, `THRESHOLD` failures in a row trip a breaker still Closed.
#[test]
fn fresh_successes_racing_failures_leave_state_count_and_listener_in_agreement() {
    use std::sync::Barrier;
    let mut tripped_in_race = 0;
    for round in 0..ROUNDS {
        let (reg, events) = recording_registry();
        let o = Origin::parse("http://fast-path.example").unwrap();
        let start = Barrier::new(6);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    start.wait();
                    for _ in 0..50 {
                        if let Ok(p) = reg.acquire(&o) {
                            p.record(Outcome::Success);
                        }
                    }
                });
            }
            for _ in 0..2 {
                s.spawn(|| {
                    start.wait();
                    for _ in 0..THRESHOLD {
                        if let Ok(p) = reg.acquire(&o) {
                            p.record(Outcome::Failure);
                        }
                    }
                });
            }
        });
        let (state, failures, trips) = only_breaker(&reg);
        let opened = events.lock().unwrap().len();
        match state {
            BreakerState::Open => {
                assert_eq!(
                    (failures, trips, opened),
                    (THRESHOLD, 1, 1),
                    "round {round}"
                );
                tripped_in_race += 1;
            }
            BreakerState::Closed => {
                assert!(failures < THRESHOLD, "round {round}: {failures}");
                assert_eq!((trips, opened), (0, 0), "round {round}");
                reg.acquire(&o).unwrap().record(Outcome::Success);
                assert_eq!(only_breaker(&reg), (BreakerState::Closed, 0, 0));
                for i in 1..=THRESHOLD {
                    reg.acquire(&o).unwrap().record(Outcome::Failure);
                    let want = if i < THRESHOLD {
                        (BreakerState::Closed, i, 0)
                    } else {
                        (BreakerState::Open, THRESHOLD, 1)
                    };
                    assert_eq!(only_breaker(&reg), want, "round {round}");
                }
            }
            other => panic!("round {round}: {other:?}"),
        }
    }
    eprintln!("{tripped_in_race} of {ROUNDS} rounds tripped during the race");
}

/// Threads acquire and record successes without the lock while the main thread pauses
/// (even rounds) or isolates (odd rounds) the origin: every acquire that starts after the
/// pause or isolation returned is turned away, with that reason.
#[test]
fn a_pause_or_isolation_stops_every_lock_free_acquire_that_starts_after_it() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    for round in 0..ROUNDS {
        let (reg, _) = recording_registry();
        let o = Origin::parse("http://fast-path.example").unwrap();
        let (stopped, admitted) = (AtomicBool::new(false), AtomicUsize::new(0));
        let want = if round.is_multiple_of(2) {
            RejectReason::Paused
        } else {
            RejectReason::Isolated
        };
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100 {
                        let after = stopped.load(Ordering::Acquire);
                        match reg.acquire(&o) {
                            Ok(p) => {
                                assert!(!after, "round {round}: admitted after the stop");
                                admitted.fetch_add(1, Ordering::Relaxed);
                                p.record(Outcome::Success);
                            }
                            Err(r) => assert_eq!(r.reason, want, "round {round}"),
                        }
                    }
                });
            }
            while admitted.load(Ordering::Relaxed) < 20 {
                std::hint::spin_loop();
            }
            if want == RejectReason::Paused {
                reg.pause(&o, 3600 * S);
            } else {
                assert!(reg.isolate(&o));
            }
            stopped.store(true, Ordering::Release);
        });
        let err = reg.acquire(&o).unwrap_err();
        assert_eq!(err.reason, want, "round {round}");
        let snap = reg.snapshot();
        assert_eq!((snap[0].consecutive_failures, snap[0].trips), (0, 0));
        assert!(snap[0].rejections >= 1);
    }
}

/// The registry's former doc example: five failures open the default breaker; the next
/// attempt is turned away, with the first probe due within the 30 s open period.
#[tokio::test]
async fn five_failures_open_the_default_breaker_and_the_next_attempt_is_turned_away() {
    let registry = BreakerRegistry::new(BreakerConfig::default()).unwrap();
    let origin = Origin::parse("https://api.example.com").unwrap();
    for _ in 0..5 {
        registry.acquire(&origin).unwrap().record(Outcome::Failure);
    }
    assert_eq!(registry.state(&origin), Some(BreakerState::Open));
    let rejected = registry.acquire(&origin).unwrap_err();
    assert_eq!(rejected.reason, RejectReason::Open);
    assert!(rejected.retry_in.is_some_and(|d| d <= 30 * S));
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
    use crate::breaker::{BreakerConfig, BreakerRegistry, Outcome, TripPolicy};

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
        let _guard = crate::tracing_scope::scoped(capture.clone());
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
}
