//! reqwest-resilience: evidence-based retries, `Retry-After`, per-origin circuit breakers and
//! single-flight bearer tokens as `reqwest_middleware` middlewares.
//!
//! (Crate docs are completed with the `Resilience` builder.)

pub mod auth;
pub mod backoff;
pub mod breaker;
pub mod error;
pub mod evidence;
pub mod origin;
pub mod retry;
pub mod retry_after;
pub mod stack;

pub use auth::{AccessToken, BearerAuth, TokenManager, TokenSource};
pub use backoff::{Backoff, Jitter};
pub use breaker::{BreakerConfig, BreakerRegistry, BreakerState, CircuitBreakerMiddleware};
pub use error::ResilienceError;
pub use evidence::{
    AttemptDecision, AttemptHistory, AttemptRecord, FailureKind, NotProcessedProof,
    RequestEvidence, Transmission, TransportEvidence,
};
pub use origin::Origin;
pub use retry::{RetryBudget, RetryMiddleware};
pub use stack::{Resilience, StackError};
