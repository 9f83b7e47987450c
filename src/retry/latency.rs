//! The adaptive hedging delay's estimator: a high percentile of each origin's recent
//! latencies (Finagle's backup requests, "The Tail at Scale" §"Hedged requests").
//!
//! Per origin, a ring of the last [`SAMPLES`] first-attempt latencies (microseconds, in
//! atomics: recording is one `fetch_add` and one store, no lock), and the percentile
//! recomputed from a copy of the ring every [`REFRESH_EVERY`] samples, published in one
//! atomic that every request reads. Memory: about 1 KiB per origin (256 × 4 bytes plus
//! counters), at most [`MAX_ORIGINS`] origins (an arbitrary one is forgotten to make room),
//! so at most about 1 MiB. It adapts within one ring: after 256 new samples no old one is
//! left, and the published value moves every 16.
//!
//! A first attempt cancelled because its hedge answered first is recorded with the time it
//! had run, a lower bound of its latency: that keeps the share of samples above the delay
//! true (the ranks a percentile reads), where leaving it out would make the slow tail
//! vanish from the estimate the moment hedging starts to hide it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::origin::{Origin, OriginMap};

/// Samples kept per origin.
pub(super) const SAMPLES: usize = 256;
/// Samples between two recomputations of the percentile.
pub(super) const REFRESH_EVERY: u64 = 16;
/// Samples an origin needs before its percentile is trusted.
pub(super) const MIN_SAMPLES: u64 = 32;
/// Origins tracked at once.
pub(super) const MAX_ORIGINS: usize = 1024;

/// No estimate published yet.
const NONE: u64 = u64::MAX;

/// Every origin's latency window.
pub(super) struct LatencyTracker {
    quantile: f64,
    origins: Mutex<OriginMap<Arc<Window>>>,
}

/// One origin's recent latencies.
pub(super) struct Window {
    samples: [AtomicU32; SAMPLES],
    written: AtomicU64,
    estimate_micros: AtomicU64,
}

impl LatencyTracker {
    /// A tracker publishing the `quantile` (in `(0, 1)`) of each origin's window.
    pub(super) fn new(quantile: f64) -> Self {
        LatencyTracker {
            quantile,
            origins: Mutex::new(OriginMap::default()),
        }
    }

    /// `origin`'s window, made on first use.
    pub(super) fn window(&self, origin: &Origin) -> Arc<Window> {
        // A poisoned lock only means another thread panicked between two map operations,
        // which leave the map consistent.
        let mut origins = self.origins.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = origins.get(origin) {
            return w.clone();
        }
        if origins.len() >= MAX_ORIGINS
            && let Some(victim) = origins.keys().next().cloned()
        {
            origins.remove(&victim);
        }
        let w = Arc::new(Window::new());
        origins.insert(origin.clone(), w.clone());
        w
    }

    /// The published percentile of `origin`'s window, once it has enough samples.
    pub(super) fn estimate(&self, origin: &Origin) -> Option<Duration> {
        let origins = self.origins.lock().unwrap_or_else(|e| e.into_inner());
        origins.get(origin)?.estimate()
    }

    /// Records a latency of `window`'s origin.
    pub(super) fn record(&self, window: &Window, latency: Duration) {
        window.record(latency, self.quantile);
    }
}

impl Window {
    fn new() -> Self {
        Window {
            samples: std::array::from_fn(|_| AtomicU32::new(0)),
            written: AtomicU64::new(0),
            estimate_micros: AtomicU64::new(NONE),
        }
    }

    /// The published percentile, once [`MIN_SAMPLES`] were recorded.
    pub(super) fn estimate(&self) -> Option<Duration> {
        match self.estimate_micros.load(Ordering::Relaxed) {
            NONE => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }

    fn record(&self, latency: Duration, quantile: f64) {
        let micros = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
        let n = self.written.fetch_add(1, Ordering::Relaxed);
        self.samples[(n % SAMPLES as u64) as usize].store(micros, Ordering::Relaxed);
        let n = n + 1;
        if n >= MIN_SAMPLES && (n.is_multiple_of(REFRESH_EVERY) || n == MIN_SAMPLES) {
            self.refresh(n, quantile);
        }
    }

    /// Recomputes the percentile from a copy of the ring. Two threads doing it at once
    /// publish nearly the same value, so no lock orders them; a sample overwritten during
    /// the copy only shifts the estimate by one sample's rank.
    fn refresh(&self, written: u64, quantile: f64) {
        let len = written.min(SAMPLES as u64) as usize;
        let mut copy = [0u32; SAMPLES];
        for (slot, sample) in copy.iter_mut().zip(&self.samples).take(len) {
            *slot = sample.load(Ordering::Relaxed);
        }
        let copy = &mut copy[..len];
        // The nearest-rank percentile: the smallest sample with at least `quantile` of the
        // samples at or below it.
        let rank = ((quantile * len as f64).ceil() as usize).clamp(1, len) - 1;
        let (_, value, _) = copy.select_nth_unstable(rank);
        self.estimate_micros
            .store(u64::from(*value), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn no_estimate_before_enough_samples_then_the_nearest_rank_percentile() {
        let t = LatencyTracker::new(0.95);
        let origin = Origin::parse("http://a.example").unwrap();
        let w = t.window(&origin);
        for _ in 0..MIN_SAMPLES - 1 {
            t.record(&w, ms(1));
        }
        assert_eq!(t.estimate(&origin), None);
        t.record(&w, ms(1));
        assert_eq!(t.estimate(&origin), Some(ms(1)));

        // A full ring of 1..=256 ms (each once): p95 is the 244th smallest.
        let t = LatencyTracker::new(0.95);
        let w = t.window(&origin);
        for i in 1..=SAMPLES as u64 {
            t.record(&w, ms(i));
        }
        assert_eq!(t.estimate(&origin), Some(ms(244)));
    }

    #[test]
    fn the_estimate_follows_a_change_within_one_ring() {
        let t = LatencyTracker::new(0.9);
        let origin = Origin::parse("http://a.example").unwrap();
        let w = t.window(&origin);
        for _ in 0..SAMPLES {
            t.record(&w, ms(2));
        }
        assert_eq!(t.estimate(&origin), Some(ms(2)));
        // The origin slows down: after half a ring, 50 % of samples are 40 ms, so p90 is.
        for _ in 0..SAMPLES / 2 {
            t.record(&w, ms(40));
        }
        assert_eq!(t.estimate(&origin), Some(ms(40)));
        // Recovered: one ring later nothing of the slow period is left.
        for _ in 0..SAMPLES {
            t.record(&w, ms(3));
        }
        assert_eq!(t.estimate(&origin), Some(ms(3)));
    }

    #[test]
    fn origins_are_bounded_and_kept_apart() {
        let t = LatencyTracker::new(0.5);
        let a = Origin::parse("http://a.example").unwrap();
        let wa = t.window(&a);
        for _ in 0..MIN_SAMPLES {
            t.record(&wa, ms(7));
        }
        let b = Origin::parse("http://b.example").unwrap();
        assert_eq!(t.estimate(&b), None);
        assert_eq!(t.estimate(&a), Some(ms(7)));
        for i in 0..MAX_ORIGINS + 10 {
            t.window(&Origin::parse(&format!("http://h{i}.example")).unwrap());
        }
        assert_eq!(t.origins.lock().unwrap().len(), MAX_ORIGINS);
        // A sample past u32 microseconds saturates instead of wrapping.
        let w = t.window(&b);
        for _ in 0..MIN_SAMPLES {
            t.record(&w, Duration::from_secs(10_000));
        }
        assert_eq!(
            t.estimate(&b),
            Some(Duration::from_micros(u64::from(u32::MAX)))
        );
    }
}
