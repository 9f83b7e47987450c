//! Ready strategies for the [`RetryStrategy`] trait, built on [`DefaultStrategy`] and the
//! error chain an [`AttemptContext`] gives.
//!
//! - [`UvTransient`]: the transient rules of uv's client (astral-sh/uv, `uv-client`),
//!   restated over this crate's evidence.
//!
//! Whatever a strategy concludes, the middleware never sends again a request that may have
//! been processed unless that is harmless.

use std::io;

use http::StatusCode;

use super::{AttemptContext, DefaultStrategy, RetryReason, RetryStrategy, StopReason, Verdict};
use crate::record::FailureKind;

/// The `io::ErrorKind`s that uv retries when one is anywhere in an error's chain (uv's
/// `retryable_on_request_failure`, each one added after an issue of theirs).
pub(crate) const UV_TRANSIENT_IO_KINDS: [io::ErrorKind; 6] = [
    io::ErrorKind::BrokenPipe,
    io::ErrorKind::ConnectionAborted,
    io::ErrorKind::ConnectionReset,
    io::ErrorKind::InvalidData,
    io::ErrorKind::TimedOut,
    io::ErrorKind::UnexpectedEof,
];

/// The transient rules of uv's client (`uv-client`'s `UvRetryableStrategy` over
/// reqwest-retry's defaults), restated over this crate's evidence:
///
/// | attempt | verdict |
/// |---|---|
/// | a TLS certificate error, or a certificate alert from the peer at any stage (also after a TLS 1.3 handshake) | stop: [`StopReason::Permanent`]`(Certificate)` |
/// | any 5xx, 408, 429 | retry ([`RetryReason::Status`]); a non-idempotent request only on 429 or with `Retry-After`, as in [`DefaultStrategy`] |
/// | other statuses | stop, as in [`DefaultStrategy`] |
/// | not sent (refused, DNS, TLS handshake), or proven not processed (`REFUSED_STREAM`, `GOAWAY`) | as in [`DefaultStrategy`] |
/// | no response, with one of the `io::ErrorKind`s `BrokenPipe`, `ConnectionAborted`, `ConnectionReset`, `InvalidData`, `TimedOut`, `UnexpectedEof` anywhere in the chain, any `h2` error, a timeout, a reset or an early close | retry ([`RetryReason::Transient`]) when idempotent |
/// | no response, anything else (e.g. a malformed response head) | stop: [`StopReason::Permanent`] with the evidence's kind |
///
/// Where uv and this crate differ, this crate's promise wins: uv retries a `POST` after a
/// reset (reqwest-retry decides from the error alone); here a request that may have been
/// processed is sent again only when idempotent. uv retries every 5xx for every method;
/// here a non-idempotent request's 5xx is retried only with `Retry-After`.
///
/// ```
/// use reqwest_resilience::RetryMiddleware;
/// use reqwest_resilience::retry::strategies::UvTransient;
///
/// // uv: `RetryTransientMiddleware::new_with_policy_and_strategy(policy, UvRetryableStrategy)`
/// let retry = RetryMiddleware::builder().strategy(UvTransient).build()?;
/// # drop(retry);
/// # Ok::<(), reqwest_resilience::ResilienceError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct UvTransient;

impl RetryStrategy for UvTransient {
    fn decide(&self, ctx: &AttemptContext<'_>) -> Verdict {
        let ev = ctx.evidence;
        if ctx.error.is_some_and(crate::tls_alert::in_chain) {
            return Verdict::Stop(StopReason::Permanent(FailureKind::Certificate));
        }
        let default = DefaultStrategy.decide(ctx);
        if ev.status().is_some() {
            return match default {
                Verdict::Stop(StopReason::FinalResponse(s)) if s.is_server_error() => {
                    server_error(s, ctx.idempotent || ev.retry_after.is_some())
                }
                other => other,
            };
        }
        match default {
            // The default retries an idempotent request after any failure without a
            // response; uv only after the failures it knows to be transient.
            Verdict::Retry(RetryReason::Transient) if !uv_transient_failure(ctx) => Verdict::Stop(
                StopReason::Permanent(ev.failure.unwrap_or(FailureKind::Other)),
            ),
            other => other,
        }
    }
}

/// A 5xx the default table leaves out (501, 505, …), which uv retries.
fn server_error(status: StatusCode, safe: bool) -> Verdict {
    if safe {
        Verdict::Retry(RetryReason::Status(status))
    } else {
        Verdict::Stop(StopReason::StatusNotSafe(status))
    }
}

/// Whether a failure without a response is one uv retries: an `io::Error` of a transient
/// kind anywhere in the chain, any `h2` error, or what reqwest-retry's default calls
/// transient (a timeout, a connection reset or closed before the response).
fn uv_transient_failure(ctx: &AttemptContext<'_>) -> bool {
    ctx.has_io_kind(&UV_TRANSIENT_IO_KINDS)
        || ctx.has_h2_error()
        || matches!(
            ctx.evidence.failure,
            Some(FailureKind::Timeout | FailureKind::Reset | FailureKind::Closed)
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{RequestEvidence, Transmission};
    use http::{HeaderMap, Method};

    fn evidence(t: Transmission, kind: Option<FailureKind>) -> RequestEvidence {
        let mut e = RequestEvidence::new(t, None, 1);
        e.failure = kind;
        e
    }

    #[test]
    fn every_5xx_is_retried_when_idempotent_and_only_with_retry_after_otherwise() {
        let headers = HeaderMap::new();
        for code in [500u16, 501, 502, 503, 504, 505, 507, 599] {
            let s = StatusCode::from_u16(code).unwrap();
            let mut ev = evidence(Transmission::ResponseReceived(s), None);
            let head = super::super::ResponseHead::new(s, &headers);
            let get = AttemptContext::new(&ev, &Method::GET).with_response(head);
            assert_eq!(
                UvTransient.decide(&get),
                Verdict::Retry(RetryReason::Status(s))
            );
            let post = AttemptContext::new(&ev, &Method::POST).with_response(head);
            assert_eq!(
                UvTransient.decide(&post),
                Verdict::Stop(StopReason::StatusNotSafe(s))
            );
            ev.retry_after = Some(std::time::Duration::from_secs(1));
            let post = AttemptContext::new(&ev, &Method::POST);
            assert_eq!(
                UvTransient.decide(&post),
                Verdict::Retry(RetryReason::Status(s))
            );
        }
        let ev = evidence(Transmission::ResponseReceived(StatusCode::NOT_FOUND), None);
        assert_eq!(
            UvTransient.decide(&AttemptContext::new(&ev, &Method::GET)),
            Verdict::Stop(StopReason::FinalResponse(StatusCode::NOT_FOUND))
        );
    }

    #[test]
    fn a_failure_is_transient_by_its_chain_or_its_kind() {
        let ev = evidence(Transmission::SentNoResponse, Some(FailureKind::Protocol));
        let malformed = io::Error::other("malformed head");
        let ctx = AttemptContext::new(&ev, &Method::GET).with_error(&malformed);
        assert_eq!(
            UvTransient.decide(&ctx),
            Verdict::Stop(StopReason::Permanent(FailureKind::Protocol))
        );
        for kind in UV_TRANSIENT_IO_KINDS {
            let err = io::Error::other(io::Error::new(kind, "inner"));
            let ctx = AttemptContext::new(&ev, &Method::GET).with_error(&err);
            assert_eq!(
                UvTransient.decide(&ctx),
                Verdict::Retry(RetryReason::Transient),
                "{kind:?}"
            );
        }
        let h2: h2::Error = h2::Reason::INTERNAL_ERROR.into();
        let ctx = AttemptContext::new(&ev, &Method::GET).with_error(&h2);
        assert_eq!(
            UvTransient.decide(&ctx),
            Verdict::Retry(RetryReason::Transient)
        );
        let reset = evidence(Transmission::SentNoResponse, Some(FailureKind::Reset));
        let ctx = AttemptContext::new(&reset, &Method::GET);
        assert_eq!(
            UvTransient.decide(&ctx),
            Verdict::Retry(RetryReason::Transient)
        );
    }

    #[test]
    fn a_certificate_alert_anywhere_stops_even_a_not_sent_attempt() {
        let ev = evidence(Transmission::NotSent, Some(FailureKind::Tls));
        let alert = io::Error::other(io::Error::new(
            io::ErrorKind::InvalidData,
            "received fatal alert: UnknownCA",
        ));
        let ctx = AttemptContext::new(&ev, &Method::GET).with_error(&alert);
        assert_eq!(
            UvTransient.decide(&ctx),
            Verdict::Stop(StopReason::Permanent(FailureKind::Certificate))
        );
        let handshake = io::Error::new(
            io::ErrorKind::InvalidData,
            "received fatal alert: HandshakeFailure",
        );
        let ctx = AttemptContext::new(&ev, &Method::POST).with_error(&handshake);
        assert_eq!(
            UvTransient.decide(&ctx),
            Verdict::Retry(RetryReason::NotSent)
        );
    }
}
