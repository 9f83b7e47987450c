//! What is decided after each attempt, and why: [`AttemptDecision`], [`RetryReason`] and
//! [`StopReason`], shared by the history and the retry loop.

use std::fmt;
use std::time::Duration;

use http::StatusCode;

use super::evidence::FailureKind;

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
    /// Not followed by a retry of its own: it was one of several copies of a hedged request
    /// in flight together, and the request went on with attempt number `by` (the copy that
    /// answered first, or the last one to fail). A [`FailureKind::Cancelled`] attempt was
    /// dropped when `by` answered.
    Superseded {
        /// The attempt number
        /// ([`RequestEvidence::attempt`](crate::RequestEvidence::attempt)) the request went
        /// on with.
        by: u32,
    },
}

/// Why an attempt is followed by another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryReason {
    /// Proven not sent (connect refused, DNS, TLS handshake): safe for any method.
    NotSent,
    /// Rejected locally by a server-directed pause, or by an open circuit breaker when the
    /// middleware waits for open breakers
    /// ([`wait_for_open_breakers`](crate::retry::RetryMiddlewareBuilder::wait_for_open_breakers));
    /// retried after the breaker's own "retry in".
    BreakerRejected,
    /// The server proved it did not process the request (HTTP/2 `REFUSED_STREAM`, or a
    /// `GOAWAY` whose last stream id is below the request's stream): safe for any method,
    /// and taken at once (no backoff), outside `max_retries`, up to the middleware's own
    /// cap per request (`max_not_processed_retries`, default 5) and within the retry
    /// budget.
    NotProcessed,
    /// The server's `GOAWAY` ended the attempt of an idempotent request
    /// ([`FailureKind::GoAway`]: a connection rotation).
    /// Sending it again is harmless, so it is taken like [`NotProcessed`](Self::NotProcessed):
    /// at once, on a new connection, outside `max_retries`, under the same cap per request
    /// (`max_not_processed_retries`), and free of the retry budget (a rotation is not a
    /// failure). A non-idempotent request stops: the stream may have been processed.
    GoAway,
    /// The machine's network changed under an idempotent attempt
    /// ([`FailureKind::NetworkChanged`]): taken like [`GoAway`](Self::GoAway), at once, on
    /// a connection opened after the change, outside `max_retries`, under the same cap,
    /// free of the retry budget.
    NetworkChanged,
    /// An idempotent request got no response (reset, timeout, closed, unknown).
    Transient,
    /// A retryable status (408, 429, 500, 502, 503, 504).
    Status(StatusCode),
    /// The response body of an idempotent request broke after its head
    /// ([`FailureKind::BodyInterrupted`]): the operation is run again, or the body
    /// resumed.
    BodyInterrupted,
}

/// Why no further attempt is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// The response is final: a success, a redirect, or a status the table does not retry.
    FinalResponse(StatusCode),
    /// A retryable status on a non-idempotent request without `Retry-After`: the server
    /// may have acted on it.
    StatusNotSafe(StatusCode),
    /// A failure that retrying cannot fix (certificate, builder, redirect, decode, a
    /// connector that cannot serve the request, a misconfigured stack).
    Permanent(FailureKind),
    /// A non-idempotent request that may have reached the server (sent, no response).
    MayHaveBeenProcessed,
    /// The server proved it did not process a non-idempotent request again, but the
    /// request already took as many not-processed retries as its cap allows
    /// (`max_not_processed_retries`, default 5; the name is from when the cap was one).
    NotProcessedRetryUsed,
    /// The maximum number of retries was reached (or retries are disabled for this
    /// request).
    RetriesExhausted,
    /// The retry budget refused another retry: the server is failing for many requests.
    BudgetExhausted,
    /// The next delay would end past the deadline.
    DeadlineExceeded,
    /// `Retry-After` (or a strategy's own delay) lies beyond the configured cap and the
    /// policy is to give up; or, for a request that got no bearer token, the token
    /// manager's next fetch lies beyond the cap, under either policy (a retry at the cap
    /// would meet the same error: the request ends at once with the token error).
    RetryAfterTooLong,
    /// An open circuit breaker rejected the request
    /// ([`FailureKind::BreakerOpen`](crate::FailureKind::BreakerOpen)): a breaker fails
    /// fast, so the request is not retried after its open period unless the middleware
    /// waits for open breakers
    /// ([`wait_for_open_breakers`](crate::retry::RetryMiddlewareBuilder::wait_for_open_breakers))
    /// and the breaker opens within that wait; or a breaker (or pause) rejected it without
    /// saying when to retry.
    BreakerRejected,
    /// The request body is a stream that cannot be replayed: sent once. A request that
    /// carries a [`ReplayableBody`](crate::upload::ReplayableBody) opens a body for each
    /// attempt instead, and is retried.
    BodyNotClonable,
    /// reqwest followed a redirect during the attempt, so the request was received and
    /// answered (`3xx`) by the first hop: a non-idempotent request is never sent again,
    /// whatever a later hop answered.
    RedirectFollowed,
    /// The origin's concurrency limit rejected the request (after its queue, if one is
    /// configured): retrying after a backoff would only return to a full origin.
    ConcurrencyLimited,
    /// The origin's rate limit rejected the request (after its wait for a slot):
    /// retrying after a backoff would only spend the quota again.
    RateLimited,
    /// The connect timed out
    /// ([`FailureKind::ConnectTimeout`](super::FailureKind::ConnectTimeout)): a retry would
    /// wait as long again, so the request's connect budget is one connect timeout (through
    /// a proxy pool, one per proxy).
    ConnectTimedOut,
    /// The retry middleware decided to retry and handed the retry to the caller's loop
    /// ([`Steps`](crate::retry::Steps)), which makes it: the request was sent once, and
    /// its decision is in the history (`Retry` after its delay).
    HandedBack,
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryReason::NotSent => f.write_str("the request was not sent"),
            RetryReason::BreakerRejected => f.write_str("a circuit breaker rejected it"),
            RetryReason::NotProcessed => f.write_str("the server did not process it"),
            RetryReason::GoAway => {
                f.write_str("the server closed the connection (GOAWAY) under an idempotent request")
            }
            RetryReason::NetworkChanged => {
                f.write_str("the network changed under an idempotent request")
            }
            RetryReason::Transient => f.write_str("an idempotent request got no response"),
            RetryReason::Status(s) => write!(f, "retryable status {}", s.as_u16()),
            RetryReason::BodyInterrupted => f.write_str("the response body broke"),
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::FinalResponse(s) => write!(f, "final status {}", s.as_u16()),
            StopReason::StatusNotSafe(s) => write!(
                f,
                "status {} on a non-idempotent request without Retry-After",
                s.as_u16()
            ),
            StopReason::Permanent(k) => write!(f, "permanent failure ({k:?})"),
            StopReason::MayHaveBeenProcessed => {
                f.write_str("a non-idempotent request may have been processed")
            }
            StopReason::NotProcessedRetryUsed => {
                f.write_str("the cap of not-processed retries was reached")
            }
            StopReason::RetriesExhausted => f.write_str("retries exhausted"),
            StopReason::BudgetExhausted => f.write_str("retry budget exhausted"),
            StopReason::DeadlineExceeded => f.write_str("the deadline would pass"),
            StopReason::RetryAfterTooLong => f.write_str("Retry-After exceeds the cap"),
            StopReason::BreakerRejected => f.write_str("an open circuit breaker rejected it"),
            StopReason::BodyNotClonable => f.write_str("the body cannot be replayed"),
            StopReason::RedirectFollowed => {
                f.write_str("a redirect was followed: the first hop was processed")
            }
            StopReason::ConcurrencyLimited => {
                f.write_str("the origin's concurrency limit was reached")
            }
            StopReason::RateLimited => f.write_str("the origin's rate limit was reached"),
            StopReason::ConnectTimedOut => {
                f.write_str("every address of the host timed out while connecting")
            }
            StopReason::HandedBack => f.write_str("the retry was handed back to the caller's loop"),
        }
    }
}
