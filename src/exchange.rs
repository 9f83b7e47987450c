//! [`SendWithHistory`]: `send()` for a `reqwest_middleware::RequestBuilder` that keeps the
//! per-request settings set on the builder and hands back what happened with the result.
//! Layer 3 (above `record`, whose history and outcome it returns).
//!
//! reqwest-middleware's `RequestBuilder::build()` returns the `reqwest::Request` alone: the
//! extensions set with `.with_extension(..)` (a [`Deadline`](crate::retry::Deadline),
//! [`AttemptTimeout`](crate::retry::AttemptTimeout), [`MaxRetries`](crate::retry::MaxRetries),
//! [`Idempotent`](crate::retry::Idempotent)) are dropped, so a request built that way and
//! run with `execute_with_extensions` (to read its history) runs without them.
//! `send_with_history()` runs the request with the builder's own extensions, as
//! `RequestBuilder::send()` does, and returns them with the result.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use reqwest_resilience::{Resilience, SendWithHistory};
//! use reqwest_resilience::retry::Deadline;
//!
//! let client = Resilience::new().build_from(reqwest::Client::builder())?;
//! let exchange = client
//!     .get("http://127.0.0.1:8080/simple/")
//!     .with_extension(Deadline::after(Duration::from_secs(10)))
//!     .send_with_history()
//!     .await;
//! if let (Err(e), Some(outcome)) = (&exchange.result, exchange.outcome) {
//!     // The error is reqwest's own (is_timeout, is_connect, status answer as usual).
//!     eprintln!("{e} (timeout: {}) after {} retries: {}", e.is_timeout(), outcome.retries(), outcome.stop);
//! }
//! # Ok(()) }
//! ```

use std::future::Future;

use http::Extensions;
use reqwest::Response;

use crate::record::{AttemptHistory, RetryOutcome};

/// A request's result with what happened on the way: see [`SendWithHistory`]. `E` is the
/// error of the client's crate: reqwest-middleware's, or (feature `astral`) the astral
/// fork's.
#[derive(Debug)]
#[non_exhaustive]
pub struct Exchange<E = reqwest_middleware::Error> {
    /// What `send()` would have returned.
    pub result: Result<Response, E>,
    /// Every attempt and the decision after it (empty when no
    /// [`TransportEvidence`](crate::TransportEvidence) and no retry middleware saw the
    /// request).
    pub history: AttemptHistory,
    /// How many attempts were made and why the retry middleware stopped (`None` without
    /// one).
    pub outcome: Option<RetryOutcome>,
    /// The request's extensions after the request (the builder's, and what the stack left
    /// in them), the history taken out.
    pub extensions: Extensions,
}

impl<E> Exchange<E> {
    /// The exchange of a request that ended with `result`, its extensions after it.
    fn after(result: Result<Response, E>, mut extensions: Extensions) -> Self {
        Exchange {
            result,
            history: AttemptHistory::take_from(&mut extensions).unwrap_or_default(),
            outcome: RetryOutcome::of(&extensions).copied(),
            extensions,
        }
    }
}

/// `send()` that keeps the builder's extensions and returns the attempt history and the
/// retry outcome with the result (see the module docs). Implemented for
/// reqwest-middleware's `RequestBuilder` and, with feature `astral`, the astral fork's.
pub trait SendWithHistory {
    /// The error the client's `send()` returns: `reqwest_middleware::Error`, or the astral
    /// fork's for its `RequestBuilder`.
    type Error;

    /// Sends the request with the extensions set on the builder, and returns the result
    /// with its [`AttemptHistory`] and [`RetryOutcome`].
    ///
    /// # Cancel safety
    ///
    /// As `RequestBuilder::send()`: dropping the future drops the request.
    fn send_with_history(self) -> impl Future<Output = Exchange<Self::Error>> + Send;
}

impl SendWithHistory for reqwest_middleware::RequestBuilder {
    type Error = reqwest_middleware::Error;

    fn send_with_history(mut self) -> impl Future<Output = Exchange> + Send {
        // What `RequestBuilder::send` does (reqwest-middleware 0.5): take the extensions,
        // then build the request; `build()` alone would drop them.
        let mut extensions = std::mem::take(self.extensions());
        let (client, request) = self.build_split();
        async move {
            let result = match request {
                Ok(request) => {
                    client
                        .execute_with_extensions(request, &mut extensions)
                        .await
                }
                Err(e) => Err(reqwest_middleware::Error::Reqwest(e)),
            };
            Exchange::after(result, extensions)
        }
    }
}

/// The astral fork's `RequestBuilder` (feature `astral`): the same as
/// reqwest-middleware's, its error the fork's.
#[cfg(feature = "astral")]
#[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
impl SendWithHistory for astral_reqwest_middleware::RequestBuilder {
    type Error = astral_reqwest_middleware::Error;

    fn send_with_history(
        mut self,
    ) -> impl Future<Output = Exchange<astral_reqwest_middleware::Error>> + Send {
        // What the fork's `RequestBuilder::send` does (astral-reqwest-middleware 0.5).
        let mut extensions = std::mem::take(self.extensions());
        let (client, request) = self.build_split();
        async move {
            let result = match request {
                Ok(request) => {
                    client
                        .execute_with_extensions(request, &mut extensions)
                        .await
                }
                Err(e) => Err(astral_reqwest_middleware::Error::Reqwest(e)),
            };
            Exchange::after(result, extensions)
        }
    }
}
