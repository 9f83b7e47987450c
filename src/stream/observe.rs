//! Each reconnect made visible: a `tracing` event (feature `tracing`) and the counter
//! `reqwest_resilience.stream.reconnects` (feature `metrics`; labels `origin`, `cause`).

use std::time::Duration;

use crate::origin::Origin;

/// The counter of reconnects decided (before their delay).
#[cfg(feature = "metrics")]
pub(crate) const RECONNECTS: &str = "reqwest_resilience.stream.reconnects";

/// A reconnect decided for a stream to `origin`: its cause (a
/// [`ReconnectCause`](crate::stream::ReconnectCause)'s name), its number, the failed
/// reconnects before it, its delay.
#[cfg_attr(
    not(any(feature = "tracing", feature = "metrics")),
    allow(unused_variables)
)]
pub(crate) fn reconnect(
    origin: Option<&Origin>,
    cause: &'static str,
    attempt: u32,
    failed: u32,
    delay: Duration,
) {
    #[cfg(feature = "tracing")]
    tracing::info!(
        target: "reqwest_resilience::stream",
        origin = origin.map(Origin::as_str),
        cause,
        attempt,
        failed,
        delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        "stream reconnects"
    );
    #[cfg(feature = "metrics")]
    {
        let label = match origin {
            Some(o) => crate::metrics::origin_label(o),
            None => ::metrics::SharedString::const_str("none"),
        };
        ::metrics::counter!(RECONNECTS, "origin" => label, "cause" => cause).increment(1);
    }
}
