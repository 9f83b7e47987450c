//! The migration adapter for `reqwest-retry` users: any [`retry_policies::RetryPolicy`]
//! supplies the delays (feature `retry-policies`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use retry_policies::{RetryDecision, RetryPolicy};

use super::middleware::Delays;
use super::{RetryMiddleware, RetryMiddlewareBuilder};

/// A `retry_policies` policy as [`RetryMiddleware::new_with_policy`] and
/// [`RetryMiddlewareBuilder::policy`] take it: any `P: RetryPolicy + Send + Sync`, or one
/// already shared as `Arc<dyn RetryPolicy + Send + Sync>` (as rattler keeps its
/// policies), which does not implement `RetryPolicy` itself and which the orphan rule
/// keeps this crate from implementing it for. `M` tells the two apart and is inferred:
/// you never name it, nor wrap a shared policy in a newtype.
///
/// ```
/// use std::sync::Arc;
/// use retry_policies::RetryPolicy;
/// use retry_policies::policies::ExponentialBackoff;
/// use reqwest_resilience::RetryMiddleware;
///
/// let shared: Arc<dyn RetryPolicy + Send + Sync> =
///     Arc::new(ExponentialBackoff::builder().build_with_max_retries(3));
/// let retry = RetryMiddleware::new_with_policy(shared.clone());
/// let owned = RetryMiddleware::new_with_policy(ExponentialBackoff::builder().build_with_max_retries(3));
/// # drop((retry, owned));
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "retry-policies")))]
pub trait IntoRetryPolicy<M> {
    /// The policy, shared.
    fn into_retry_policy(self) -> Arc<dyn RetryPolicy + Send + Sync>;
}

impl<P> IntoRetryPolicy<(P,)> for P
where
    P: RetryPolicy + Send + Sync + 'static,
{
    fn into_retry_policy(self) -> Arc<dyn RetryPolicy + Send + Sync> {
        Arc::new(self)
    }
}

impl IntoRetryPolicy<()> for Arc<dyn RetryPolicy + Send + Sync> {
    fn into_retry_policy(self) -> Arc<dyn RetryPolicy + Send + Sync> {
        self
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "retry-policies")))]
impl RetryMiddleware {
    /// A retry middleware whose delays and retry limit come from a `retry_policies`
    /// policy, as `reqwest_retry::RetryTransientMiddleware::new_with_policy` takes it
    /// (owned, or shared as `Arc<dyn RetryPolicy + Send + Sync>`: [`IntoRetryPolicy`]).
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
    /// Like reqwest-retry, it has no retry budget: every retry the policy and the
    /// decision table allow is taken, however many requests fail. To cap retries at a
    /// share of the requests, opt in:
    /// `RetryMiddleware::builder().policy(policy).budget(RetryBudget::default()).build()`
    /// ([`RetryBudget`](super::RetryBudget)).
    ///
    /// What is decided stays this crate's: the evidence-based table (a POST that may have
    /// been processed is not retried), `Retry-After` (which outranks the policy's delay)
    /// and deadlines. The policy's `DoNotRetry` stops with
    /// [`StopReason::RetriesExhausted`](super::StopReason).
    pub fn new_with_policy<P, M>(policy: P) -> Self
    where
        P: IntoRetryPolicy<M>,
    {
        RetryMiddleware::builder()
            .policy(policy)
            .no_budget()
            .build()
            .unwrap_or_else(|_| unreachable!("the defaults are valid"))
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "retry-policies")))]
impl RetryMiddlewareBuilder {
    /// Takes delays and the retry limit from a `retry_policies` policy (owned, or shared
    /// as `Arc<dyn RetryPolicy + Send + Sync>`: [`IntoRetryPolicy`]) instead of a
    /// [`Backoff`](crate::Backoff). [`max_retries`](Self::max_retries), if also set, still
    /// applies. The budget stays the builder's (the default [`RetryBudget`](super::RetryBudget)
    /// unless [`no_budget`](Self::no_budget)).
    pub fn policy<P, M>(self, policy: P) -> Self
    where
        P: IntoRetryPolicy<M>,
    {
        let policy = policy.into_retry_policy();
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
