//! [`RetryMiddleware`]: the retry loop (mechanism), separate from the decision
//! ([`RetryStrategy`](crate::retry::RetryStrategy)) and the arithmetic
//! ([`Backoff`](crate::Backoff), [`RetryBudget`](crate::retry::RetryBudget)), one idea per
//! file:
//!
//! - `config`: [`RetryMiddleware`], its [`RetryMiddlewareBuilder`] and the defaults;
//! - `run`: the loop over one logical request's attempts;
//! - `after_attempt`: the decision after an attempt (evidence, verdict, delay, report);
//! - `plan`: the delay planner, pure (the clock handed in), and the retry counts;
//! - `report`: the history, the metrics, the before-sleep hook, `tracing`, the outcome;
//! - `continued`: one request over several passes (an operation run again, a body
//!   resumed), and the decision after a failure the loop did not see.
//!
//! The small functions the loop calls on every request from another of these files
//! (`Config::max_retries`, `LoopState::{attempts, retry_possible}`, `report::{record,
//! finish}`) are `#[inline]`: inlined as they were when they shared one file, which
//! `benches/instructions.rs` shows the success path needs.

mod after_attempt;
mod config;
mod continued;
mod plan;
mod report;
mod run;

// The `retry_policies` adapter (`retry/policies.rs`) sets the delays.
#[cfg(feature = "retry-policies")]
pub(in crate::retry) use config::Delays;
pub use config::{RetryAfterPolicy, RetryMiddleware, RetryMiddlewareBuilder};
pub(crate) use continued::{ContinuedFailure, ContinuedRetry};
