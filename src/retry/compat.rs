//! [`AnyServerError`]: the decision table with reqwest-retry's statuses, for the
//! migration preset [`Resilience::like_reqwest_retry`](crate::Resilience::like_reqwest_retry).

use super::decision::{AttemptContext, DefaultStrategy, RetryStrategy, StopReason, Verdict};
use crate::record::RetryReason;

/// [`DefaultStrategy`], with every `5xx` where it has 500, 502, 503 and 504: the statuses
/// reqwest-retry's `DefaultRetryableStrategy` (and uv) retry, 408 and 429 included.
/// Every other row stays, the evidence rows above all: a non-idempotent request is
/// retried after a `5xx` only with `Retry-After`, as after a 503, and after a failure only
/// when the evidence proves it unsent (a refused connect), never after a reset or a
/// timeout. (reqwest-retry retries a `POST` after any of these; this crate never sends a
/// request that may have been processed again.)
///
/// ```
/// use http::{Method, StatusCode};
/// use reqwest_resilience::{RequestEvidence, Transmission};
/// use reqwest_resilience::retry::{AnyServerError, AttemptContext, DefaultStrategy, RetryStrategy, Verdict};
///
/// let evidence = RequestEvidence::new(Transmission::ResponseReceived(StatusCode::HTTP_VERSION_NOT_SUPPORTED), None, 1);
/// let ctx = AttemptContext::new(&evidence, &Method::GET);
/// assert!(matches!(AnyServerError.decide(&ctx), Verdict::Retry(_)));
/// assert!(matches!(DefaultStrategy.decide(&ctx), Verdict::Stop(_)));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct AnyServerError;

impl RetryStrategy for AnyServerError {
    fn decide(&self, ctx: &AttemptContext<'_>) -> Verdict {
        match DefaultStrategy.decide(ctx) {
            // The table stops on a final response only after its redirect and
            // permanent-failure rows let the attempt through.
            Verdict::Stop(StopReason::FinalResponse(status)) if status.is_server_error() => {
                if ctx.idempotent || ctx.evidence.retry_after.is_some() {
                    Verdict::Retry(RetryReason::Status(status))
                } else {
                    Verdict::Stop(StopReason::StatusNotSafe(status))
                }
            }
            verdict => verdict,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{Method, StatusCode};

    use super::*;
    use crate::record::{Redirects, RequestEvidence, Transmission};

    fn verdict(status: u16, method: &Method, retry_after: bool, redirected: bool) -> Verdict {
        let status = StatusCode::from_u16(status).unwrap();
        let mut evidence = RequestEvidence::new(Transmission::ResponseReceived(status), None, 1);
        if retry_after {
            evidence.retry_after = Some(Duration::from_secs(1));
        }
        if redirected {
            evidence.redirects = Redirects::Followed { hops: Some(1) };
        }
        AnyServerError.decide(&AttemptContext::new(&evidence, method))
    }

    #[test]
    fn every_server_error_is_retried_for_an_idempotent_request_only() {
        for status in [500, 501, 502, 503, 504, 505, 507, 511, 599] {
            let code = StatusCode::from_u16(status).unwrap();
            assert_eq!(
                verdict(status, &Method::GET, false, false),
                Verdict::Retry(RetryReason::Status(code)),
                "{status}"
            );
            assert_eq!(
                verdict(status, &Method::POST, false, false),
                Verdict::Stop(StopReason::StatusNotSafe(code)),
                "{status}"
            );
            assert_eq!(
                verdict(status, &Method::POST, true, false),
                Verdict::Retry(RetryReason::Status(code)),
                "{status} with Retry-After"
            );
            assert_eq!(
                verdict(status, &Method::POST, true, true),
                Verdict::Stop(StopReason::RedirectFollowed),
                "{status} after a redirect"
            );
        }
        for (status, retried) in [
            (408, true),
            (429, true),
            (400, false),
            (404, false),
            (200, false),
        ] {
            assert_eq!(
                matches!(
                    verdict(status, &Method::GET, false, false),
                    Verdict::Retry(_)
                ),
                retried,
                "{status}"
            );
        }
    }
}
