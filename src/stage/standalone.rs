//! The middlewares a [`Stage`](super::Stage) used alone implements: reqwest-middleware's,
//! and with feature `astral` the fork's, both from the one stage (its inside being either
//! crate's `Next`).

use super::{Handover, RequestSlot, RestOfStack, Stage};

/// A [`Stage`](super::Stage) used alone in the fork's client: its fork `Middleware` impl,
/// beside reqwest-middleware's (see [`standalone_middleware!`]).
#[cfg(feature = "astral")]
macro_rules! standalone_astral_middleware {
    ($stage:ty) => {
        impl astral_reqwest_middleware::Middleware for $stage {
            fn handle<'life0, 'life1, 'life2, 'async_trait>(
                &'life0 self,
                req: reqwest::Request,
                extensions: &'life1 mut http::Extensions,
                next: astral_reqwest_middleware::Next<'life2>,
            ) -> $crate::stage::astral::AstralHandled<'async_trait>
            where
                'life0: 'async_trait,
                'life1: 'async_trait,
                'life2: 'async_trait,
                Self: 'async_trait,
            {
                $crate::stage::astral::boxed_for_astral($crate::stage::standalone::serve_alone(
                    self, req, extensions, next,
                ))
            }
        }
    };
}
#[cfg(feature = "astral")]
pub(crate) use standalone_astral_middleware;

/// A [`Stage`] used alone: its `Middleware` impl runs it with `Next` inside. Written out
/// rather than through `#[async_trait]`, which would wrap the stage's future in one more
/// (one more state machine to move into the box). With feature `astral` the same stage
/// also implements the fork's `Middleware`, its `Next` inside
/// ([`astral`](super::astral)): one implementation of the logic serves both.
macro_rules! standalone_middleware {
    ($stage:ty) => {
        #[cfg(feature = "astral")]
        $crate::stage::standalone::standalone_astral_middleware!($stage);

        impl reqwest_middleware::Middleware for $stage {
            fn handle<'life0, 'life1, 'life2, 'async_trait>(
                &'life0 self,
                req: reqwest::Request,
                extensions: &'life1 mut http::Extensions,
                next: reqwest_middleware::Next<'life2>,
            ) -> $crate::stage::Handled<'async_trait>
            where
                'life0: 'async_trait,
                'life1: 'async_trait,
                'life2: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin($crate::stage::standalone::serve_alone(
                    self, req, extensions, next,
                ))
            }
        }
    };
}
pub(crate) use standalone_middleware;

/// `stage` used alone: the request's one place ([`RequestSlot`]) in the future
/// reqwest-middleware boxes, the stage on it with nothing handed over.
pub(crate) fn serve_alone<'a, S: Stage, N: RestOfStack + 'a>(
    stage: &'a S,
    req: reqwest::Request,
    extensions: &'a mut http::Extensions,
    next: N,
) -> impl Future<Output = reqwest_middleware::Result<reqwest::Response>> + Send + 'a {
    let mut slot = RequestSlot::new(req);
    async move {
        let handed = slot.hand();
        stage
            .serve(handed, extensions, Handover::default(), next)
            .await
    }
}
