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
}

impl fmt::Display for ResilienceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResilienceError::InvalidConfig(why) => write!(f, "invalid configuration: {why}"),
        }
    }
}

impl std::error::Error for ResilienceError {}

impl ResilienceError {
    /// Finds a `ResilienceError` inside a middleware error, if there is one.
    pub fn from_middleware_error(err: &reqwest_middleware::Error) -> Option<&ResilienceError> {
        match err {
            reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<ResilienceError>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }
}
