//! What was observed about each attempt: [`RequestEvidence`] and the attempt history.
//!
//! The transport step ([`TransportEvidence`], the innermost middleware) writes one
//! [`RequestEvidence`] per attempt into the request's [`http::Extensions`]. Every other
//! middleware of this crate decides from it: a retry is safe when the server cannot have
//! acted on the attempt, or when acting twice is harmless, and only observed progress can
//! tell which. The error type alone cannot: a timeout may mean the request never left, or
//! that a payment went through and only the answer was lost.
//!
//! The rule that keeps this honest: [`Transmission::NotSent`] only when the failing stage
//! proves no request byte can have reached a server. Everything else is
//! [`Transmission::SentNoResponse`] or [`Transmission::Unknown`].

mod middleware;

pub use crate::classify::{Classification, classify, classify_body, classify_error};
pub use middleware::TransportEvidence;

pub use crate::record::{
    AttemptDecision, AttemptHistory, AttemptRecord, FailureKind, NotProcessedProof, Redirects,
    RequestEvidence, Shared, SharedRole, Transmission,
};
