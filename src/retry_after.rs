//! `Retry-After` parsing (RFC 9110 §10.2.3), pure.

use std::time::{Duration, SystemTime};

/// Parses a `Retry-After` value into a delay from `now` (uncapped). Provisional: the full
/// parser lands with the fault matrix.
pub fn parse(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}
