//! The attempt history left in the caller's extensions.

use std::time::Duration;

use super::RequestEvidence;
use crate::retry::{RetryReason, StopReason};

/// What a middleware decided after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttemptDecision {
    /// The request was sent again after `delay`.
    Retry {
        /// The sleep taken before the next attempt.
        delay: Duration,
        /// Why it was retried.
        reason: RetryReason,
    },
    /// No further attempt was made.
    Stop {
        /// Why it stopped.
        reason: StopReason,
    },
}

/// One attempt: what was observed, and what was decided after it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttemptRecord {
    /// What the transport step observed.
    pub evidence: RequestEvidence,
    /// What was decided after it, if a deciding middleware ran.
    pub decision: Option<AttemptDecision>,
}

/// Every attempt of one logical request, in order.
///
/// [`TransportEvidence`](super::TransportEvidence) appends a record per attempt to the
/// extensions it is handed, which are the caller's own when the caller uses
/// `execute_with_extensions`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttemptHistory {
    records: Vec<AttemptRecord>,
}

impl AttemptHistory {
    /// Every attempt, in order.
    pub fn attempts(&self) -> &[AttemptRecord] {
        &self.records
    }

    /// The number of attempts made.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no attempt was recorded.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The last attempt.
    pub fn last(&self) -> Option<&AttemptRecord> {
        self.records.last()
    }

    /// Appends an attempt.
    pub fn push(&mut self, evidence: RequestEvidence) {
        self.records.push(AttemptRecord {
            evidence,
            decision: None,
        });
    }

    /// Records the decision taken after the last attempt.
    pub fn decide_last(&mut self, decision: AttemptDecision) {
        if let Some(last) = self.records.last_mut() {
            last.decision = Some(decision);
        }
    }
}
