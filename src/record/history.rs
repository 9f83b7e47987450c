//! The attempt history left in the caller's extensions.

use super::decision::AttemptDecision;
use super::evidence::RequestEvidence;

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
/// [`TransportEvidence`](crate::evidence::TransportEvidence) appends a record per attempt
/// to the extensions it is handed, which are the caller's own when the caller uses
/// `execute_with_extensions`. A `send()` caller reads it from the response with
/// [`of_response`](AttemptHistory::of_response).
///
/// ```no_run
/// use reqwest_resilience::{AttemptDecision, AttemptHistory, Resilience};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Resilience::new().build_from(reqwest::Client::builder())?;
/// let response = client.get("http://127.0.0.1:8080/items").send().await?;
/// let history = AttemptHistory::of_response(&response).expect("the stack records it");
/// for record in history.attempts() {
///     let e = &record.evidence;
///     match &record.decision {
///         Some(AttemptDecision::Retry { delay, reason }) => {
///             println!("attempt {}: {:?}, retried after {delay:?}: {reason}", e.attempt, e.transmission)
///         }
///         Some(AttemptDecision::Stop { reason }) => {
///             println!("attempt {}: {:?}, stopped: {reason}", e.attempt, e.transmission)
///         }
///         None => println!("attempt {}: {:?}", e.attempt, e.transmission),
///         Some(_) => {}
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct AttemptHistory {
    records: Records,
    shared: Option<Shared>,
}

/// How a GET or HEAD shared one wire request with concurrent identical ones
/// ([`CoalesceGets`](crate::coalesce::CoalesceGets)): read with
/// [`AttemptHistory::shared`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Shared {
    /// Whether this caller's request went on the wire for the others, or joined one.
    pub role: SharedRole,
    /// The callers that shared the request, this one and the one that sent it included.
    pub callers: u32,
}

/// A caller's part in a shared request ([`Shared`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SharedRole {
    /// Its request was the one sent; the attempts recorded are its own.
    Sent,
    /// It joined a request another caller sent; the attempts recorded are that one's.
    Joined,
}

/// Most requests take one attempt: that one is kept inline, so recording it allocates
/// nothing beyond the extension's own box.
#[derive(Clone, Default)]
enum Records {
    #[default]
    Empty,
    One(AttemptRecord),
    Many(Vec<AttemptRecord>),
}

impl AttemptHistory {
    /// Every attempt, in order.
    pub fn attempts(&self) -> &[AttemptRecord] {
        match &self.records {
            Records::Empty => &[],
            Records::One(record) => std::slice::from_ref(record),
            Records::Many(records) => records,
        }
    }

    /// The number of attempts made.
    pub fn len(&self) -> usize {
        self.attempts().len()
    }

    /// Whether no attempt was recorded.
    pub fn is_empty(&self) -> bool {
        self.attempts().is_empty()
    }

    /// The last attempt.
    pub fn last(&self) -> Option<&AttemptRecord> {
        self.attempts().last()
    }

    /// The last attempt, to change.
    pub(crate) fn last_mut(&mut self) -> Option<&mut AttemptRecord> {
        match &mut self.records {
            Records::Empty => None,
            Records::One(record) => Some(record),
            Records::Many(records) => records.last_mut(),
        }
    }

    /// Whether the request shared one wire request with concurrent identical ones, and
    /// how (`None`: it did not).
    pub fn shared(&self) -> Option<Shared> {
        self.shared
    }

    /// Says the request was shared.
    pub(crate) fn mark_shared(&mut self, shared: Shared) {
        self.shared = Some(shared);
    }

    /// Appends an attempt.
    pub fn push(&mut self, evidence: RequestEvidence) {
        let record = AttemptRecord {
            evidence,
            decision: None,
        };
        // In place: the common first record is written once, not moved out and back.
        match &mut self.records {
            Records::Many(records) => records.push(record),
            Records::Empty => self.records = Records::One(record),
            Records::One(_) => {
                if let Records::One(first) = std::mem::take(&mut self.records) {
                    self.records = Records::Many(vec![first, record]);
                }
            }
        }
    }

    /// Appends an attempt whose decision is already known (a hedged round's losers).
    pub(crate) fn push_record(&mut self, record: AttemptRecord) {
        let decision = record.decision;
        self.push(record.evidence);
        if let Some(decision) = decision {
            self.decide_last(decision);
        }
    }

    /// Replaces the last attempt's evidence (an attempt whose body broke after its head
    /// came back), keeping its decision until a new one is recorded.
    pub(crate) fn replace_last(&mut self, evidence: RequestEvidence) {
        let last = match &mut self.records {
            Records::Empty => None,
            Records::One(record) => Some(record),
            Records::Many(records) => records.last_mut(),
        };
        match last {
            Some(last) => last.evidence = evidence,
            None => self.push(evidence),
        }
    }

    /// Keeps the first `len` records (a hedged round re-adds its own in its order).
    pub(crate) fn truncate(&mut self, len: usize) {
        self.records = match std::mem::take(&mut self.records) {
            Records::One(first) if len >= 1 => Records::One(first),
            Records::Many(mut records) => {
                records.truncate(len);
                Records::Many(records)
            }
            _ => Records::Empty,
        };
    }

    /// Records the decision taken after the last attempt.
    pub fn decide_last(&mut self, decision: AttemptDecision) {
        let last = match &mut self.records {
            Records::Empty => None,
            Records::One(record) => Some(record),
            Records::Many(records) => records.last_mut(),
        };
        if let Some(last) = last {
            last.decision = Some(decision);
        }
    }
}

/// The number of the attempt that follows `recorded` records.
pub(crate) fn next_attempt(recorded: usize) -> u32 {
    u32::try_from(recorded)
        .unwrap_or(u32::MAX)
        .saturating_add(1)
}

impl PartialEq for AttemptHistory {
    fn eq(&self, other: &Self) -> bool {
        self.attempts() == other.attempts()
    }
}

impl Eq for AttemptHistory {}

impl std::fmt::Debug for AttemptHistory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("AttemptHistory");
        d.field("records", &self.attempts());
        if let Some(shared) = &self.shared {
            d.field("shared", shared);
        }
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::record::{RetryReason, StopReason, Transmission};

    fn evidence(attempt: u32) -> RequestEvidence {
        RequestEvidence::new(Transmission::Unknown, None, attempt)
    }

    #[test]
    fn records_keep_their_order_and_decisions_across_the_inline_and_vec_forms() {
        let mut h = AttemptHistory::default();
        assert!(h.is_empty() && h.last().is_none());
        h.decide_last(AttemptDecision::Stop {
            reason: StopReason::RetriesExhausted,
        });
        assert!(h.is_empty(), "no record to decide on");
        let mut reference = Vec::new();
        for attempt in 1..=4 {
            h.push(evidence(attempt));
            let decision = AttemptDecision::Retry {
                delay: Duration::from_secs(u64::from(attempt)),
                reason: RetryReason::NotProcessed,
            };
            h.decide_last(decision.clone());
            reference.push(AttemptRecord {
                evidence: evidence(attempt),
                decision: Some(decision),
            });
            assert_eq!(h.attempts(), &reference[..]);
            assert_eq!(h.len(), attempt as usize);
            assert_eq!(h.last(), reference.last());
        }
        let mut one = AttemptHistory::default();
        one.push(evidence(1));
        assert_eq!(
            format!("{one:?}"),
            format!("AttemptHistory {{ records: {:?} }}", one.attempts())
        );
        assert_ne!(one, h);
        assert_eq!(h.clone(), h);
    }
}
