//! The migration adapter for `reqwest-retry` users: any [`retry_policies::RetryPolicy`]
//! supplies the delays (feature `retry-policies`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use retry_policies::{RetryDecision, RetryPolicy};

use super::middleware::Delays;
use super::{RetryMiddleware, RetryMiddlewareBuilder};

#[cfg_attr(docsrs, doc(cfg(feature = "retry-policies")))]
impl RetryMiddleware {
    /// A retry middleware whose delays and retry limit come from a `retry_policies`
    /// policy, as `reqwest_retry::RetryTransientMiddleware::new_with_policy` takes it.
    /// Switching from reqwest-retry is one line:
    ///
    /// ```
    /// use retry_policies::policies::ExponentialBackoff;
    /// use reqwest_resilience::RetryMiddleware;
    ///
    /// let policy = ExponentialBackoff::builder().build_with_max_retries(3);
    /// // was: RetryTransientMiddleware::new_with_policy(policy)
    /// let retry = RetryMiddleware::new_with_policy(policy);
    /// # drop(retry);
    /// ```
    ///
    /// What is decided stays this crate's: the evidence-based table (a POST that may have
    /// been processed is not retried), `Retry-After` (which outranks the policy's delay),
    /// the default [`RetryBudget`](super::RetryBudget) and deadlines. The policy's
    /// `DoNotRetry` stops with [`StopReason::RetriesExhausted`](super::StopReason).
    pub fn new_with_policy<P>(policy: P) -> Self
    where
        P: RetryPolicy + Send + Sync + 'static,
    {
        RetryMiddleware::builder()
            .policy(policy)
            .build()
            .unwrap_or_else(|_| unreachable!("the defaults are valid"))
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "retry-policies")))]
impl RetryMiddlewareBuilder {
    /// Takes delays and the retry limit from a `retry_policies` policy instead of a
    /// [`Backoff`](crate::Backoff). [`max_retries`](Self::max_retries), if also set, still
    /// applies.
    pub fn policy<P>(self, policy: P) -> Self
    where
        P: RetryPolicy + Send + Sync + 'static,
    {
        self.delays(Delays::External(Arc::new(
            move |started, retries| match policy.should_retry(started, retries) {
                RetryDecision::Retry { execute_after } => Some(
                    execute_after
                        .duration_since(SystemTime::now())
                        .unwrap_or(Duration::ZERO),
                ),
                RetryDecision::DoNotRetry => None,
            },
        )))
    }
}
