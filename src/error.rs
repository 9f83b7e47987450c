//! [`ResilienceError`]: the typed errors this crate's middlewares return.
//!
//! They travel inside `reqwest_middleware::Error::Middleware` (an `anyhow::Error`); get
//! them back with [`ResilienceError::from_middleware_error`] or `downcast_ref`.

use std::fmt;

/// An error raised by one of this crate's middlewares.
#[derive(Debug)]
#[non_exhaustive]
pub enum ResilienceError {
    /// A configuration was rejected when it was built.
    InvalidConfig(String),
    /// No bearer token could be had for the request (`BearerAuth`). The token source's
    /// own error is kept as `source()`; the secret never appears.
    Token(crate::auth::TokenError),
}

impl fmt::Display for ResilienceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResilienceError::InvalidConfig(why) => write!(f, "invalid configuration: {why}"),
            ResilienceError::Token(_) => f.write_str("no bearer token for the request"),
        }
    }
}

impl std::error::Error for ResilienceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ResilienceError::Token(e) => Some(e),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

impl ResilienceError {
    /// Finds a `ResilienceError` inside a middleware error, if there is one.
    pub fn from_middleware_error(err: &reqwest_middleware::Error) -> Option<&ResilienceError> {
        match err {
            reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<ResilienceError>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }
}
