//! What the retry loop tells: each decision into the [`AttemptHistory`] and the metrics,
//! a retry to the `before_sleep` hook and to `tracing` before its wait, and the request's
//! [`RetryOutcome`] when it stops.

#[cfg(feature = "tracing")]
use std::error::Error as StdError;

use http::Extensions;
use reqwest::Response;

use super::config::Config;
use super::plan::Step;
use crate::error::{ResilienceError, RetryError};
use crate::origin::Origin;
use crate::record::{AttemptDecision, Inward, RequestRecord, RetryOutcome, StopReason};
use crate::retry::RetryNotice;

/// The request's result once the loop stopped: its [`RetryOutcome`] in the caller's
/// extensions (and on a response), a final error wrapped as configured
/// ([`ErrorWrapping`](crate::retry::ErrorWrapping)), and what this middleware handed
/// inward ended.
#[inline]
pub(super) fn finish(
    c: &Config,
    result: reqwest_middleware::Result<Response>,
    attempts: u32,
    stop: StopReason,
    extensions: &mut Extensions,
    handed_on: bool,
) -> reqwest_middleware::Result<Response> {
    if handed_on {
        // The deadline this middleware handed inward ends with the request.
        Inward::end(extensions);
    }
    let outcome = RetryOutcome { attempts, stop };
    RequestRecord::get(extensions).outcome = Some(outcome);
    match result {
        Ok(mut response) => {
            // With it, `AttemptHistory::of_response` completes the history the transport
            // step left on the response (its last decision is this stop).
            RequestRecord::get(response.extensions_mut()).outcome = Some(outcome);
            Ok(response)
        }
        Err(e) if c.error_wrapping.wraps(&e) => Err(reqwest_middleware::Error::middleware(
            ResilienceError::Retry(RetryError::new(attempts, stop, e)),
        )),
        Err(e) => Err(e),
    }
}

/// Writes the decision into the metrics and, with `tracing`, emits the event of a stop (a
/// retry's is [`announce`]'s); returns it for the history.
#[inline]
pub(super) fn report_decision(
    step: &Step,
    attempt: u32,
    method: &http::Method,
    origin: Option<&Origin>,
) -> AttemptDecision {
    let decision = match *step {
        Step::Retry { delay, reason, .. } => {
            crate::metrics::retry(reason, origin);
            AttemptDecision::Retry { delay, reason }
        }
        Step::Stop(reason) => {
            crate::metrics::stop(reason, origin);
            AttemptDecision::Stop { reason }
        }
    };
    // OpenTelemetry HTTP client names where one exists (`resend_count`: the retries
    // before this attempt, 0 for the first).
    #[cfg(feature = "tracing")]
    if let Step::Stop(reason) = *step {
        tracing::event!(
            target: "reqwest_resilience::retry",
            tracing::Level::DEBUG,
            http.request.resend_count = attempt.saturating_sub(1),
            http.request.method = %method,
            %reason,
            "not retrying"
        );
    }
    #[cfg(not(feature = "tracing"))]
    let _ = (attempt, method);
    decision
}

/// Tells of a retry before its wait: the `before_sleep` hook and, with `tracing`, one
/// event at the configured level (default `WARN`) with the error's text and its
/// "Caused by" chain.
pub(super) fn announce(c: &Config, notice: &RetryNotice<'_>) {
    if let Some(hook) = &c.before_sleep {
        hook(notice);
    }
    #[cfg(feature = "tracing")]
    retry_event(c.retry_event_level, notice);
}

/// The `tracing` event before a retry. Its fields, built only when a subscriber wants it:
/// OpenTelemetry's HTTP client names where one exists (`resend_count`: the retries before
/// the failed attempt, 0 for the first), the delay, the reason, the status or the error's
/// text (`error`) and the texts of its sources, one `Caused by:` line each (`caused_by`),
/// as uv prints them.
#[cfg(feature = "tracing")]
fn retry_event(level: tracing::Level, notice: &RetryNotice<'_>) {
    macro_rules! event_at {
        ($level:expr) => {
            tracing::event!(
                target: "reqwest_resilience::retry",
                $level,
                http.request.resend_count = notice.attempt.saturating_sub(1),
                http.request.method = %notice.method,
                http.response.status_code = notice.status.map(|s| s.as_u16()),
                delay_ms = notice.delay.as_millis() as u64,
                reason = %notice.reason,
                error = notice.error.and_then(|e| crate::chain::messages(e).into_iter().next()),
                caused_by = notice.error.map(caused_by).filter(|c| !c.is_empty()),
                "retrying"
            )
        };
    }
    // A level is a constant of each event's callsite: one callsite per level.
    match level {
        tracing::Level::ERROR => event_at!(tracing::Level::ERROR),
        tracing::Level::WARN => event_at!(tracing::Level::WARN),
        tracing::Level::INFO => event_at!(tracing::Level::INFO),
        tracing::Level::DEBUG => event_at!(tracing::Level::DEBUG),
        _ => event_at!(tracing::Level::TRACE),
    }
}

/// The sources' texts below an error's own, as `Caused by: …` lines.
#[cfg(feature = "tracing")]
fn caused_by(err: &(dyn StdError + 'static)) -> String {
    let messages = crate::chain::messages(err);
    let lines: Vec<String> = messages
        .iter()
        .skip(1)
        .map(|m| format!("Caused by: {m}"))
        .collect();
    lines.join("\n")
}
