//! Which fault the `n`-th request gets: a pure function of the seed, the request's number
//! and the rates, so a seed replays the same sequence whatever the timing.

use std::time::Duration;

/// A fault the chaos layer injects; each is produced on a loopback socket of the layer's
/// own, so reqwest reports the real error (see the [module docs](super)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// The TCP connect is refused: `NotSent`, `Connect`.
    RefusedConnect,
    /// The request is read, then the connection is reset: `SentNoResponse`, `Reset`.
    ResetAfterSend,
    /// The request is read and never answered, until reqwest's timeout fires: `Unknown`,
    /// `Timeout`.
    Timeout,
    /// `503 Service Unavailable` with `Retry-After`.
    Unavailable,
    /// `429 Too Many Requests`.
    TooManyRequests,
    /// An HTTP/2 stream reset with `REFUSED_STREAM`: `SentNoResponse`, `Protocol`, with
    /// the proof that the server did not process it.
    RefusedStream,
}

/// What the chaos layer did to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Injection {
    /// The request's number at this layer, from 0.
    pub request: u64,
    /// The fault, if any (`None`: the request went to its server).
    pub fault: Option<Fault>,
    /// Latency added before the request (or its fault) went out.
    pub latency: Option<Duration>,
}

/// The rates, in the order a draw walks them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rates {
    pub(crate) faults: Vec<(Fault, f64)>,
    pub(crate) latency: f64,
    pub(crate) latency_range: (Duration, Duration),
}

/// The injection for request `n` under `seed`: three draws from the request's own
/// stream (the fault, whether to add latency, how much).
pub(crate) fn injection(seed: u64, n: u64, rates: &Rates) -> Injection {
    let mut stream = SplitMix64(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let (fault_draw, latency_draw, amount) = (stream.unit(), stream.unit(), stream.unit());
    let mut below = 0.0;
    let fault = rates.faults.iter().find_map(|&(fault, rate)| {
        below += rate;
        (fault_draw < below).then_some(fault)
    });
    let (min, max) = rates.latency_range;
    let latency =
        (latency_draw < rates.latency).then(|| min + (max.saturating_sub(min)).mul_f64(amount));
    Injection {
        request: n,
        fault,
        latency,
    }
}

/// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
/// OOPSLA 2014): written out rather than taken from `rand`, whose `StdRng` does not
/// promise the same stream across its versions; a user's seeded test must replay the same
/// faults after an upgrade.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`: the top 53 bits.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn rates(faults: Vec<(Fault, f64)>, latency: f64) -> Rates {
        Rates {
            faults,
            latency,
            latency_range: (10 * MS, 20 * MS),
        }
    }

    #[test]
    fn splitmix64_is_the_published_sequence() {
        // The reference implementation's first outputs for seed 1234567.
        let mut s = SplitMix64(1234567);
        assert_eq!(
            [s.next(), s.next(), s.next()],
            [
                6457827717110365317,
                3203168211198807973,
                9817491932198370423
            ]
        );
    }

    #[test]
    fn a_seed_replays_its_sequence_and_rates_are_honoured_over_many_requests() {
        let r = rates(
            vec![(Fault::RefusedConnect, 0.2), (Fault::Unavailable, 0.3)],
            0.5,
        );
        let a: Vec<_> = (0..10_000).map(|n| injection(7, n, &r)).collect();
        let b: Vec<_> = (0..10_000).map(|n| injection(7, n, &r)).collect();
        assert_eq!(a, b);
        assert_ne!(
            a,
            (0..10_000).map(|n| injection(8, n, &r)).collect::<Vec<_>>()
        );
        let count = |f| a.iter().filter(|i| i.fault == Some(f)).count();
        let (refused, unavailable) = (count(Fault::RefusedConnect), count(Fault::Unavailable));
        let slowed = a.iter().filter(|i| i.latency.is_some()).count();
        assert!((1_800..2_200).contains(&refused), "{refused}");
        assert!((2_800..3_200).contains(&unavailable), "{unavailable}");
        assert!((4_800..5_200).contains(&slowed), "{slowed}");
        assert!(
            a.iter()
                .filter_map(|i| i.latency)
                .all(|d| (10 * MS..=20 * MS).contains(&d))
        );
    }

    #[test]
    fn rate_one_always_and_rate_zero_never() {
        let all = rates(vec![(Fault::Timeout, 1.0)], 0.0);
        assert!((0..1_000).all(|n| injection(1, n, &all)
            == Injection {
                request: n,
                fault: Some(Fault::Timeout),
                latency: None
            }));
        let none = rates(vec![], 0.0);
        assert!((0..1_000).all(|n| injection(1, n, &none).fault.is_none()));
    }
}
