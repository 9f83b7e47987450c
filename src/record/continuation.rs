//! The state the passes of one logical request share (an operation run again, a body
//! resumed): [`Continuation`]. How the retry loop reads and writes it is in
//! `crate::retry::continuation`.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http::{Extensions, Method, StatusCode};
use tokio::time::Instant;

use super::decision::{RetryReason, StopReason};
use super::history::AttemptHistory;

/// What the passes of one logical request share (cheap to clone: one `Arc`).
#[derive(Clone, Default)]
pub(crate) struct Continuation(Arc<Mutex<Spent>>);

/// What the passes so far spent, and how the last one ended.
#[derive(Default)]
pub(crate) struct Spent {
    pub(crate) retries: u32,
    pub(crate) not_processed_retries: u32,
    pub(crate) hedges: u32,
    pub(crate) previous_delay: Option<Duration>,
    /// Fixed by the first pass (or the operation): every pass retries under it.
    pub(crate) max_retries: Option<u32>,
    /// Fixed by the first pass (or the operation).
    pub(crate) deadline: Option<Instant>,
    /// The operation's own mark (`Operation::idempotent`), for every request in it.
    pub(crate) idempotent: Option<bool>,
    /// Whether every request a pass sent so far was idempotent (`None`: none was sent).
    pub(crate) all_idempotent: Option<bool>,
    /// Whether the request's deposit in the retry budget was made.
    pub(crate) deposited: bool,
    pub(crate) history: AttemptHistory,
    /// How the last pass through the retry loop ended.
    pub(crate) last: Option<PassEnd>,
    /// The method of the last pass's request.
    pub(crate) method: Option<Method>,
    /// The URL of the last pass's request.
    pub(crate) url: Option<url::Url>,
    /// Whether each pass makes one attempt and hands a retry back to the caller's loop
    /// (`Steps`) instead of making it.
    pub(crate) hand_back: bool,
    /// The retry the last pass decided and handed back, not yet taken (boxed: every
    /// continued request allocates a `Spent`, few hand a retry back).
    pub(crate) handed_back: Option<Box<HandedBack>>,
}

/// A retry a pass decided and handed back to the caller's loop (`Steps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandedBack {
    pub(crate) delay: Duration,
    pub(crate) reason: RetryReason,
    /// The budget's slot of the retry taken from it, if any (`retry::Withdrawal`).
    pub(crate) budget_slot: Option<u64>,
}

/// How a pass through the retry loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PassEnd {
    /// Why the loop stopped.
    pub(crate) stop: StopReason,
    /// The status of the response it returned (`None`: it returned an error).
    pub(crate) status: Option<StatusCode>,
}

impl Spent {
    /// Attempts made so far, over every pass.
    pub(crate) fn attempts(&self) -> u32 {
        self.retries + self.not_processed_retries + self.hedges
    }
}

impl Continuation {
    /// The shared state, locked. Never held across an `.await`; a panic while it was held
    /// leaves counts that are still counts, so a poisoned lock is used as it is.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Spent> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One attempt of an [`Operation`](crate::retry::Operation): put it in the extensions of
/// every request the attempt sends (`.with_extension(attempt)`), so the retry middleware
/// counts its attempts as the operation's (one attempt count, one budget deposit, one
/// deadline, one history).
#[derive(Clone)]
pub struct OperationAttempt {
    continuation: Continuation,
    number: u32,
    /// Put there by the stack for a body it may resume (`crate::resume`), not by the
    /// caller: it ends with the request, and a later owner clears one left behind.
    by_stack: bool,
}

impl OperationAttempt {
    /// The next attempt of the request `continuation` spans.
    pub(crate) fn continuing(continuation: Continuation) -> Self {
        let number = continuation.lock().attempts() + 1;
        OperationAttempt {
            continuation,
            number,
            by_stack: false,
        }
    }

    /// The first pass of a request whose body the stack may resume.
    pub(crate) fn by_stack(continuation: Continuation) -> Self {
        OperationAttempt {
            by_stack: true,
            ..OperationAttempt::continuing(continuation)
        }
    }

    /// Whether the stack, not the caller, put it in the extensions.
    pub(crate) fn is_by_stack(&self) -> bool {
        self.by_stack
    }

    /// This attempt's number in the operation, counting the middleware's attempts inside
    /// the earlier ones (1 for the first).
    pub fn number(&self) -> u32 {
        self.number
    }

    pub(crate) fn continuation(&self) -> &Continuation {
        &self.continuation
    }
}

impl std::fmt::Debug for OperationAttempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperationAttempt")
            .field("number", &self.number)
            .finish_non_exhaustive()
    }
}

impl Continuation {
    /// The continuation a request's extensions carry (its operation's, or the one the
    /// stack put there for a body it may resume), if any: one lookup.
    pub(crate) fn of_request(extensions: &Extensions) -> Option<Continuation> {
        extensions
            .get::<OperationAttempt>()
            .map(|attempt| attempt.continuation.clone())
    }
}
