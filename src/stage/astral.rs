//! The astral fork's `Next` as the rest of the stack (feature `astral`; part of the stage
//! vocabulary, layer 4).
//!
//! `astral-reqwest-middleware` (uv, rattler and pixi depend on it under the name
//! `reqwest_middleware`) is a renamed copy of reqwest-middleware 0.5 whose `Middleware`,
//! `Next` and `Error` are types of their own. Its `Next` is one more [`RestOfStack`], so
//! every stage serves the fork unchanged: the stages work in reqwest-middleware's
//! `Error`, and the fork's is converted where the two meet, variant for variant (a
//! `reqwest::Error` stays the same `reqwest::Error`, a middleware's `anyhow::Error` the
//! same `anyhow::Error`), in both directions, so `is_connect()`, `status()`,
//! [`ResilienceError::find`](crate::ResilienceError::find) and
//! [`chain::find::<reqwest::Error>`](crate::chain::find) answer as for the original.
//!
//! The cost: the fork's `Next` returns its own boxed future, so an attempt below the
//! retry loop is boxed once more there (`run_boxed`), and a standalone middleware boxes
//! its converted future once, as with reqwest-middleware.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Extensions;
use reqwest::Response;

use super::{HandedRequest, Handover, RestOfStack};

use crate::error::astral::{from_astral, into_astral};

pin_project_lite::pin_project! {
    /// A future whose error is converted by `convert` (a function pointer: no closure
    /// state, one word).
    pub(crate) struct ConvertError<F, E> {
        #[pin]
        inner: F,
        convert: E,
    }
}

impl<F, A, B> ConvertError<F, fn(A) -> B> {
    pub(crate) fn new(inner: F, convert: fn(A) -> B) -> Self {
        ConvertError { inner, convert }
    }
}

impl<F, A, B> Future for ConvertError<F, fn(A) -> B>
where
    F: Future<Output = Result<Response, A>>,
{
    type Output = Result<Response, B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let convert = *this.convert;
        this.inner.poll(cx).map(|result| result.map_err(convert))
    }
}

/// The fork's boxed future of a middleware's `handle`.
pub(crate) type AstralHandled<'a> =
    Pin<Box<dyn Future<Output = astral_reqwest_middleware::Result<Response>> + Send + 'a>>;

/// A stage's future as the fork's `Middleware::handle` returns it.
pub(crate) fn boxed_for_astral<'a>(
    served: impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a,
) -> AstralHandled<'a> {
    Box::pin(ConvertError::new(served, into_astral))
}

impl RestOfStack for astral_reqwest_middleware::Next<'_> {
    // As reqwest-middleware's `Next`: it may lead to a composed stack.
    const MAKING_DOES_WORK: bool = true;

    fn run<'a>(
        self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        _: Handover<'a>,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a
    where
        Self: 'a,
    {
        // Past a `Next` nothing of ours is known.
        ConvertError::new(
            astral_reqwest_middleware::Next::run(self, req.take(), extensions),
            from_astral,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_cross_the_fork_variant_for_variant_keeping_the_inner_error() {
        let ours = reqwest_middleware::Error::middleware(std::io::Error::other("inner"));
        let fork = into_astral(ours);
        let astral_reqwest_middleware::Error::Middleware(inner) = &fork else {
            unreachable!("a middleware error stays one: {fork:?}");
        };
        assert_eq!(
            inner
                .downcast_ref::<std::io::Error>()
                .map(|e| e.to_string()),
            Some("inner".to_owned())
        );
        assert!(matches!(
            from_astral(fork),
            reqwest_middleware::Error::Middleware(e) if e.is::<std::io::Error>()
        ));
    }
}
