//! [`SuspendDetector`]: noticing that the process was suspended (a laptop's sleep), from
//! two clocks that disagree about how much time passed.
//!
//! The monotonic clock (`std::time::Instant`: `CLOCK_MONOTONIC` on Linux, the uptime
//! clock on macOS) does not count a system suspend; the wall clock does. When the wall
//! clock moved ahead of the monotonic one by more than [`SUSPEND_GAP`] since the last look,
//! the machine slept in between, and every connection pooled before it may lead nowhere
//! (the Wi-Fi it used is gone, a NAT forgot it). tokio's clock follows the monotonic one,
//! so the pool's idle timeout does not expire those connections.
//!
//! A wall clock stepped forward (NTP) by more than the gap looks the same and costs only
//! fresh connections. On Windows the monotonic clock counts a suspend: nothing is noticed
//! there (the address watch usually is).

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// How far the wall clock must run ahead of the monotonic one to count as a suspend.
pub(crate) const SUSPEND_GAP: Duration = Duration::from_secs(5);

/// The two clocks' readings at the last look.
#[derive(Debug, Clone, Copy)]
struct Readings {
    wall: SystemTime,
    monotonic: Instant,
}

/// Compares the clocks at each look.
#[derive(Debug)]
pub(crate) struct SuspendDetector {
    last: Mutex<Readings>,
}

impl SuspendDetector {
    pub(crate) fn new(wall: SystemTime, monotonic: Instant) -> Self {
        SuspendDetector {
            last: Mutex::new(Readings { wall, monotonic }),
        }
    }

    /// Whether the process was suspended since the last look, with the clocks read now.
    /// A wall clock stepped back only moves the reference.
    pub(crate) fn look(&self, wall: SystemTime, monotonic: Instant) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let wall_passed = wall.duration_since(last.wall).unwrap_or(Duration::ZERO);
        let monotonic_passed = monotonic.saturating_duration_since(last.monotonic);
        *last = Readings { wall, monotonic };
        wall_passed.saturating_sub(monotonic_passed) > SUSPEND_GAP
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_clock_ahead_of_the_monotonic_one_by_more_than_the_gap_is_a_suspend() {
        let (wall, mono) = (
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000),
            Instant::now(),
        );
        let d = SuspendDetector::new(wall, mono);
        // Both clocks moved alike: no suspend.
        assert!(!d.look(
            wall + Duration::from_secs(60),
            mono + Duration::from_secs(60)
        ));
        // The wall clock 5 s ahead: at the gap, not past it.
        assert!(!d.look(
            wall + Duration::from_secs(125),
            mono + Duration::from_secs(120)
        ));
        // An hour asleep: the wall clock moved an hour, the monotonic one a second.
        assert!(d.look(
            wall + Duration::from_secs(125 + 3600),
            mono + Duration::from_secs(121)
        ));
        // Seen once: the next look compares from there.
        assert!(!d.look(
            wall + Duration::from_secs(126 + 3600),
            mono + Duration::from_secs(122)
        ));
    }

    #[test]
    fn a_wall_clock_stepped_back_is_no_suspend_and_moves_the_reference() {
        let (wall, mono) = (
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000),
            Instant::now(),
        );
        let d = SuspendDetector::new(wall, mono);
        assert!(!d.look(
            wall - Duration::from_secs(3600),
            mono + Duration::from_secs(1)
        ));
        // From the stepped-back reading, a normal minute.
        assert!(!d.look(
            wall - Duration::from_secs(3540),
            mono + Duration::from_secs(61)
        ));
    }
}
