//! What a hedged round leaves behind: each copy's evidence, numbered as the copy it is,
//! and the decided race merged into the caller's extensions and history.

use http::Extensions;
use reqwest::Response;
use tokio::time::Instant;

use super::Round;
use crate::origin::Origin;
use crate::record::{
    AttemptDecision, AttemptHistory, AttemptRecord, Deadline, FailureKind, Inward, RequestEvidence,
    RequestRecord, RetryIn, RetryOutcome, Transmission,
};
use crate::retry::fallback::fallback_evidence;

/// What each hedge's extensions are made from: the caller's extensions as they were when
/// the round started, less this logical request's history and evidence (merged back after
/// the race). Taken before the first copy leaves (it runs on the caller's extensions),
/// and cheaply: when they hold only this crate's record and a [`Deadline`] (what the
/// stack puts there, the common case), their parts are kept and the extensions built
/// only if a hedge is sent; anything else of the caller's makes it a clone.
pub(super) enum BaseSnapshot {
    /// The parts of the record a hedge starts with (none of them when there was no
    /// record), and the deadline.
    Parts {
        record: Option<(Option<RetryOutcome>, Option<RetryIn>, Inward)>,
        deadline: Option<Deadline>,
    },
    Cloned(Extensions),
}

impl BaseSnapshot {
    pub(super) fn take(extensions: &Extensions) -> Self {
        let record = RequestRecord::of(extensions);
        let deadline = extensions.get::<Deadline>().copied();
        let parts = usize::from(record.is_some()) + usize::from(deadline.is_some());
        if extensions.len() != parts {
            let mut base = extensions.clone();
            let _ = RequestRecord::take_history(&mut base);
            RequestRecord::clear_evidence(&mut base);
            return BaseSnapshot::Cloned(base);
        }
        let record = record.map(|r| (r.outcome, r.retry_in, r.inward.clone()));
        BaseSnapshot::Parts { record, deadline }
    }

    /// Extensions for a hedge: what a clone of the caller's, less the history and the
    /// evidence, would have been.
    pub(super) fn extensions(&self) -> Extensions {
        match self {
            BaseSnapshot::Cloned(base) => base.clone(),
            BaseSnapshot::Parts { record, deadline } => {
                let mut base = Extensions::new();
                if let Some(deadline) = deadline {
                    base.insert(*deadline);
                }
                if let Some((outcome, retry_in, inward)) = record {
                    base.insert(RequestRecord::without_attempts(
                        *outcome,
                        *retry_in,
                        inward.clone(),
                    ));
                }
                base
            }
        }
    }
}

/// A decided race, owning what it hands back (so the caller's extensions are free again).
pub(super) struct RaceOutcome {
    pub(super) result: reqwest_middleware::Result<Response>,
    pub(super) evidence: RequestEvidence,
    /// The winner's extensions, when a hedge won (the first copy's are the caller's).
    pub(super) hedge_extensions: Option<Extensions>,
    /// Copies that failed first, then the cancelled losers.
    pub(super) losers: Vec<AttemptRecord>,
    pub(super) hedges: u32,
}

impl RaceOutcome {
    /// Merges the decided race into the caller's extensions: every copy in the history
    /// (the losers superseded by the winner, the winner last), the winner's evidence, and
    /// the winning hedge's extensions.
    pub(super) fn merge_into(self, extensions: &mut Extensions, recorded_before: usize) -> Round {
        let RaceOutcome {
            mut result,
            evidence,
            hedge_extensions,
            losers,
            hedges,
        } = self;
        let by = evidence.attempt;
        if let Ok(response) = &mut result
            && let Some(e) = RequestRecord::of_mut(response.extensions_mut())
                .and_then(RequestRecord::evidence_mut)
        {
            e.attempt = by;
        }
        // A first copy cancelled before its breaker took its scope leaves it behind.
        let _ = Inward::take_attempt(extensions);
        // One look-up of the caller's record for all that follows.
        let record = RequestRecord::get(extensions);
        let history = record.history.get_or_insert_with(AttemptHistory::default);
        // The first copy's own record (if it finished) is re-added in the race's order.
        history.truncate(recorded_before);
        for mut loser in losers {
            loser.decision = Some(AttemptDecision::Superseded { by });
            history.push_record(loser);
        }
        let record = match hedge_extensions {
            Some(mut winner) => {
                // The winner's record, less its own history and evidence (the merged ones
                // stand), replaces the first copy's: its "retry in" is not the winner's.
                let won = winner.remove::<RequestRecord>().unwrap_or_default();
                extensions.extend(winner);
                let record = RequestRecord::get(extensions);
                record.retry_in = won.retry_in;
                record.inward = won.inward;
                if won.outcome.is_some() {
                    record.outcome = won.outcome;
                }
                record
            }
            None => record,
        };
        // The winner last, its evidence stored once there.
        record.keep_attempt(evidence);
        Round { result, hedges }
    }
}

/// A copy's evidence, numbered as the copy it is (inside, each copy is its own first).
pub(super) fn copy_evidence(
    result: &reqwest_middleware::Result<Response>,
    ext: &Extensions,
    attempt: u32,
) -> RequestEvidence {
    let mut e = match RequestEvidence::of(ext) {
        Some(e) => e.clone(),
        None => fallback_evidence(result, attempt),
    };
    e.attempt = attempt;
    e
}

/// The record of a copy cancelled because another won.
pub(super) fn cancelled(attempt: u32, started: Instant, origin: &Origin) -> AttemptRecord {
    let mut e = RequestEvidence::new(Transmission::Unknown, Some(origin.clone()), attempt);
    e.failure = Some(FailureKind::Cancelled);
    e.elapsed = started.elapsed();
    record_of(e)
}

/// Whether a copy was refused on this side before anything was sent, and by what (the
/// `reason` label of the `hedge.skipped` metric): an open breaker or a pause (`breaker`),
/// the concurrency limit (`limit`), no bearer token (`token`), a misconfigured stack or a
/// copy that could not be built (`local`). Such a copy is no answer of the server's: it
/// never decides a race while another copy is in flight.
///
/// Only `NotSent` with a kind that names a local refusal counts: a copy proven unsent by
/// the network (a refused connection) is a failure the retry decision weighs as any.
pub(super) fn refused_locally(e: &RequestEvidence) -> Option<&'static str> {
    if e.transmission != Transmission::NotSent {
        return None;
    }
    match e.failure? {
        FailureKind::BreakerOpen | FailureKind::Paused => Some("breaker"),
        FailureKind::ConcurrencyLimited => Some("limit"),
        FailureKind::RateLimited => Some("rate"),
        FailureKind::TokenUnavailable => Some("token"),
        FailureKind::Misconfigured | FailureKind::Builder => Some("local"),
        _ => None,
    }
}

pub(super) fn record_of(evidence: RequestEvidence) -> AttemptRecord {
    AttemptRecord {
        evidence,
        decision: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_local_refusal_and_only_it_counts_as_refused() {
        let of = |t: Transmission, kind: FailureKind| {
            let mut e = RequestEvidence::new(t, None, 2);
            e.failure = Some(kind);
            refused_locally(&e)
        };
        for (kind, reason) in [
            (FailureKind::BreakerOpen, "breaker"),
            (FailureKind::Paused, "breaker"),
            (FailureKind::ConcurrencyLimited, "limit"),
            (FailureKind::TokenUnavailable, "token"),
            (FailureKind::Misconfigured, "local"),
            (FailureKind::Builder, "local"),
        ] {
            assert_eq!(of(Transmission::NotSent, kind), Some(reason), "{kind:?}");
            // Whatever the kind says, a copy that may have gone out is no refusal.
            assert_eq!(of(Transmission::Unknown, kind), None, "{kind:?}");
        }
        // Unsent by the network's word, not refused here: the retry decision weighs it.
        for kind in [FailureKind::Connect, FailureKind::Dns, FailureKind::Tls] {
            assert_eq!(of(Transmission::NotSent, kind), None, "{kind:?}");
        }
        let e = RequestEvidence::new(Transmission::NotSent, None, 2);
        assert_eq!(refused_locally(&e), None);
    }
}
