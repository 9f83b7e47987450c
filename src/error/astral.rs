//! The two crates' errors, one as the other (feature `astral`): variant for variant, a
//! `reqwest::Error` staying the same `reqwest::Error`, a middleware's `anyhow::Error` the
//! same `anyhow::Error`. Where the stack meets the fork's `Next` (`stage::astral`) and
//! where an error kept as reqwest-middleware's is handed out as the fork's
//! ([`RetryError::into_last_error_astral`](crate::retry::RetryError::into_last_error_astral)).

/// The fork's error as reqwest-middleware's, variant for variant.
pub(crate) fn from_astral(err: astral_reqwest_middleware::Error) -> reqwest_middleware::Error {
    match err {
        astral_reqwest_middleware::Error::Reqwest(e) => reqwest_middleware::Error::Reqwest(e),
        astral_reqwest_middleware::Error::Middleware(e) => reqwest_middleware::Error::Middleware(e),
    }
}

/// reqwest-middleware's error as the fork's, variant for variant.
pub(crate) fn into_astral(err: reqwest_middleware::Error) -> astral_reqwest_middleware::Error {
    match err {
        reqwest_middleware::Error::Reqwest(e) => astral_reqwest_middleware::Error::Reqwest(e),
        reqwest_middleware::Error::Middleware(e) => astral_reqwest_middleware::Error::Middleware(e),
    }
}
