//! From a `reqwest::Error` to evidence, by walking its `source()` chain.

use super::{FailureKind, NotProcessedProof, Transmission};

/// What the error chain of a failed attempt proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Classification {
    /// How far the attempt got.
    pub transmission: Transmission,
    /// The kind of failure.
    pub kind: FailureKind,
    /// The server's proof that it did not process the request.
    pub not_processed: Option<NotProcessedProof>,
}

/// Classifies a failed attempt (provisional: refined with the fault matrix).
pub fn classify_error(err: &reqwest::Error) -> Classification {
    let _ = err;
    Classification {
        transmission: Transmission::Unknown,
        kind: FailureKind::Other,
        not_processed: None,
    }
}
