//! [`RetryNotice`]: what the `before_sleep` hook is told before each retry's wait.

use std::error::Error as StdError;
use std::time::Duration;

use http::{Method, StatusCode};

use crate::record::{RequestEvidence, RetryReason};

/// The hook [`RetryMiddlewareBuilder::before_sleep`](super::RetryMiddlewareBuilder::before_sleep)
/// installs.
pub(crate) type BeforeSleep = dyn Fn(&RetryNotice<'_>) + Send + Sync;

/// A retry about to be taken, as the
/// [`before_sleep`](super::RetryMiddlewareBuilder::before_sleep) hook sees it: the attempt
/// that failed, what was observed, why it is retried and how long the wait is.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RetryNotice<'a> {
    /// The number of the attempt that just ended (1 for the first).
    pub attempt: u32,
    /// What the transport step observed about it.
    pub evidence: &'a RequestEvidence,
    /// The error it ended with, if it failed (its chain is searchable with
    /// [`crate::chain`]).
    pub error: Option<&'a (dyn StdError + 'static)>,
    /// The status it was answered with, if it got a response.
    pub status: Option<StatusCode>,
    /// The wait before the next attempt (zero for a retry taken at once).
    pub delay: Duration,
    /// Why it is retried.
    pub reason: RetryReason,
    /// The request method.
    pub method: &'a Method,
    /// The request's URL.
    pub url: Option<&'a url::Url>,
}

impl RetryNotice<'_> {
    /// The display text of the error and of each of its sources, outermost first, without
    /// repeats (many wrappers print their inner error's text as their own); empty for a
    /// response.
    pub fn error_messages(&self) -> Vec<String> {
        self.error.map(crate::chain::messages).unwrap_or_default()
    }
}
