//! [`EventStreamError`]: why an event stream ended without being told to.

use std::fmt;

use http::{HeaderValue, StatusCode};

use crate::stream::reconnect::{GaveUp, ReconnectCause};

/// Why an [`EventStream`](crate::stream::EventStream) ended. After it, the stream yields
/// nothing more. (A `204 No Content`, and the clean end of a stream whose request is not
/// sent again, end it without an error.)
#[derive(Debug)]
#[non_exhaustive]
pub enum EventStreamError {
    /// The server answered with a status that ends the stream: a `4xx` other than `408` /
    /// `429`, a `3xx` the client did not follow, a `2xx` other than `200`; or, for a
    /// request that is not sent twice, any status but `200` and `204`.
    Status(StatusCode),
    /// A `200` whose `Content-Type` is not `text/event-stream` (the one sent, if any).
    ContentType(Option<HeaderValue>),
    /// The client's error, for a connection that is not tried again: a failure no
    /// reconnect changes (a certificate, a misconfigured stack), or a request that is not
    /// idempotent and may have reached the server. Its evidence and history are the
    /// crate's usual ones ([`ResilienceError::find`](crate::ResilienceError::find)).
    Request(reqwest_middleware::Error),
    /// A stream whose request is not idempotent broke after its response began: it is
    /// not sent again (a second `POST` of an LLM prompt is a second, billed generation).
    /// See [`EventStream::resend_non_idempotent`](crate::stream::EventStream::resend_non_idempotent).
    NotResent {
        /// How the stream broke.
        cause: ReconnectCause,
    },
    /// The request's body is a stream that cannot be copied for another connection.
    BodyNotClonable,
    /// The budget of failed reconnects in a row was spent
    /// ([`ReconnectPolicy::max_failed`](crate::stream::ReconnectPolicy::max_failed)).
    GaveUp(GaveUp),
}

impl fmt::Display for EventStreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventStreamError::Status(s) => write!(f, "event stream ended by status {s}"),
            EventStreamError::ContentType(Some(found)) => write!(
                f,
                "event stream answered with Content-Type {found:?}, not text/event-stream"
            ),
            EventStreamError::ContentType(None) => {
                f.write_str("event stream answered without a Content-Type")
            }
            EventStreamError::Request(_) => f.write_str("event stream request failed"),
            EventStreamError::NotResent { cause } => write!(
                f,
                "event stream of a non-idempotent request broke ({}): not sent again",
                cause.as_str()
            ),
            EventStreamError::BodyNotClonable => {
                f.write_str("event stream request body cannot be copied for a reconnect")
            }
            EventStreamError::GaveUp(g) => write!(f, "event stream {g}"),
        }
    }
}

impl std::error::Error for EventStreamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EventStreamError::Request(e) => Some(e),
            EventStreamError::GaveUp(g) => Some(g),
            _ => None,
        }
    }
}
