//! What a breaker's rejection reports: the [`BreakerState`] and the [`RejectReason`].

/// The state of one origin's breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakerState {
    /// Requests flow; outcomes are counted by the trip policy.
    Closed,
    /// Requests are rejected locally until the open period ends.
    Open,
    /// A limited number of probes are let through to test the origin.
    HalfOpen,
    /// Forced open by
    /// [`BreakerRegistry::isolate`](crate::breaker::BreakerRegistry::isolate) until
    /// [`reset`](crate::breaker::BreakerRegistry::reset): rejects everything, never probes.
    Isolated,
}

/// Why a request was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectReason {
    /// The breaker is Open.
    Open,
    /// The breaker is HalfOpen and all its probes are taken.
    ProbesBusy,
    /// The breaker was isolated by hand.
    Isolated,
    /// The origin is paused by a server's `Retry-After`.
    Paused,
}
