//! The evidence of an attempt that left none: what the retry loop and a hedged round
//! decide from when no transport step inside recorded the attempt.

use reqwest::Response;

use crate::origin::Origin;
use crate::record::{FailureKind, RequestEvidence, Transmission};

/// Evidence when the transport step is not installed: a response speaks for itself; an
/// error proves nothing about transmission, though some kinds are known never to help.
pub(super) fn fallback_evidence(
    result: &reqwest_middleware::Result<Response>,
    attempt: u32,
) -> RequestEvidence {
    match result {
        Ok(response) => {
            RequestEvidence::from_response(response, Origin::from_url(response.url()).ok(), attempt)
        }
        Err(err) => {
            let reqwest_err = super::find_reqwest_error(err);
            let origin = reqwest_err
                .and_then(|e| e.url())
                .and_then(|u| Origin::from_url(u).ok());
            let kind = match reqwest_err {
                Some(e) if e.is_builder() => FailureKind::Builder,
                Some(e) if e.is_redirect() => FailureKind::Redirect,
                Some(e) if e.is_decode() => FailureKind::Decode,
                Some(e) if e.is_timeout() => FailureKind::Timeout,
                _ => FailureKind::Other,
            };
            let mut e = RequestEvidence::new(Transmission::Unknown, origin, attempt);
            e.failure = Some(kind);
            e
        }
    }
}
