//! [`BodyIncomplete`]: a response body that ended short of its `Content-Length`, after the
//! resumes it was allowed (see [`crate::resume`]).

use std::error::Error as StdError;
use std::fmt;

use http::StatusCode;

/// A response body that broke, or ended, before its `Content-Length` was reached, and
/// could not be resumed (or was resumed as often as the retry limit allows).
///
/// The resumable body ([`Resilience::resume_bodies`](crate::Resilience::resume_bodies))
/// yields it in place of the body's own error, which it keeps as `source()` (`None` when
/// the body ended cleanly but short); the status of the response head travels with it, so
/// its attempt's evidence is
/// `ResponseReceived(status)` / [`FailureKind::BodyInterrupted`](crate::FailureKind::BodyInterrupted)
/// from it alone ([rule B1](crate::evidence#body-failures)).
#[derive(Debug)]
pub struct BodyIncomplete {
    status: StatusCode,
    received: u64,
    expected: u64,
    resumes: u32,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl BodyIncomplete {
    pub(crate) fn new(
        status: StatusCode,
        received: u64,
        expected: u64,
        resumes: u32,
        source: Option<Box<dyn StdError + Send + Sync>>,
    ) -> Self {
        BodyIncomplete {
            status,
            received,
            expected,
            resumes,
            source,
        }
    }

    /// The status of the response head the body belongs to.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Bytes of the body the caller received, over every resume.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The body's `Content-Length`.
    pub fn expected(&self) -> u64 {
        self.expected
    }

    /// How many times the body was resumed before it gave up.
    pub fn resumes(&self) -> u32 {
        self.resumes
    }
}

impl fmt::Display for BodyIncomplete {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "response body ({}) ended after {} of {} bytes ({} resumes)",
            self.status.as_u16(),
            self.received,
            self.expected,
            self.resumes
        )
    }
}

impl StdError for BodyIncomplete {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
