//! Per-origin circuit breakers (being written).

mod config;
mod policy;
mod registry;
mod state;

pub use config::{BreakerConfig, OpenGrowth, PauseMode};
pub use policy::{AttemptClassifier, DefaultClassifier, Outcome, TripPolicy, WINDOW_BUCKETS};
pub use registry::{
    BreakerEvent, BreakerPermit, BreakerRegistry, BreakerRejection, BreakerSnapshot,
};
pub use state::{Breaker, BreakerState, RejectReason, Rejection, Ticket, Transition};
