//! Each reconnect made visible: a `tracing` event (feature `tracing`) and the counter
//! `reqwest_resilience.stream.reconnects` (feature `metrics`; labels `origin`, `cause`).

use crate::origin::Origin;
use crate::stream::reconnect::Reconnection;

/// The counter of reconnects decided (before their delay).
#[cfg(feature = "metrics")]
pub(crate) const RECONNECTS: &str = "reqwest_resilience.stream.reconnects";

/// Reports `next`, decided for a stream to `origin`.
#[cfg_attr(
    not(any(feature = "tracing", feature = "metrics")),
    allow(unused_variables)
)]
pub(crate) fn reconnect(origin: Option<&Origin>, next: &Reconnection) {
    #[cfg(feature = "tracing")]
    tracing::info!(
        target: "reqwest_resilience::stream",
        origin = origin.map(Origin::as_str),
        cause = next.cause.as_str(),
        attempt = next.attempt,
        failed = next.failed,
        delay_ms = u64::try_from(next.delay.as_millis()).unwrap_or(u64::MAX),
        "stream reconnects"
    );
    #[cfg(feature = "metrics")]
    {
        let label = match origin {
            Some(o) => crate::metrics::origin_label(o),
            None => ::metrics::SharedString::const_str("none"),
        };
        ::metrics::counter!(RECONNECTS, "origin" => label, "cause" => next.cause.as_str())
            .increment(1);
    }
}
