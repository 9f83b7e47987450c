//! The whole stack as one middleware: [`Composed`] nests the stages
//! [`Resilience`](super::Resilience) chose, with the stage vocabulary of
//! [`crate::stage`].

use http::Extensions;
use reqwest::Request;
use reqwest_middleware::{Middleware, Next};

use super::attempt::ComposedAttempt;
use super::observer::RequestObserver;
use crate::proxy::Innermost;
use crate::stage::{
    Absent, BoxedWhenPresent, HandedRequest, Handled, Handover, Nested, RequestSlot, RestOfStack,
    RetrySlot, Stage,
};

/// The stages from the retry loop inward, nested around `$inner` in the one order they
/// run: the retry, the token fetch, the breaker, the rate limit, the concurrency limit,
/// `BearerAuth`, the transport step. The composed stack and a resumed body's range
/// requests ([`ResumeStages`]) both run them so, each over fields of these names.
macro_rules! nested_from_retry {
    ($stages:expr, $inner:expr) => {{ Nested::new(&$stages.retry, nested_inside_retry!($stages, $inner)) }};
}

/// The stages inside the retry loop, around `$inner`: what the loop runs (and boxes) for
/// each attempt. The token fetch (with `BearerAuth`) nests outside the breaker, so that a
/// request waits for its token before it takes a half-open probe slot or a limiter
/// permit; the rest is one attempt ([`ComposedAttempt`]).
macro_rules! nested_inside_retry {
    ($stages:expr, $inner:expr) => {{
        let inner = ComposedAttempt {
            breaker: $stages.breaker.as_ref(),
            rate: $stages.rate.as_ref(),
            limit: &$stages.limit,
            bearer: &$stages.bearer,
            transport: &$stages.transport,
            inner: $inner,
        };
        Nested::new(&$stages.token_first, inner)
    }};
}

/// The whole stack as one middleware: the stages [`Resilience`](super::Resilience) chose,
/// outermost first, each one left out being `None`. `T` is the token fetch before the
/// breaker and the limiter ([`TokenFirst`](crate::auth::TokenFirst) with a bearer), `B`
/// `BearerAuth` and `L` the concurrency limit, each [`Absent`] when the stack has none: a
/// left-out stage of this kind costs nothing, where as an `Option` its slot would still
/// size every attempt's future (stage cost rule 4; all three hold a request or a cut
/// across their wait). Measured: a left-out `BearerAuth` as an `Option` grew each
/// attempt's future from 496 to 1 344 bytes, a left-out rate limit to 1 920, and every
/// layer above moves it.
///
/// # Cancel safety
///
/// As each stage's (see their docs): dropping the future at any `.await` leaves every
/// breaker, limiter, budget and token consistent. The stack's entry (the placement checks
/// and the clean-up of what an earlier request left in the caller's extensions) runs as
/// its future is made, so a future dropped before its first poll has done only that:
/// nothing was sent, counted or taken.
pub(crate) struct Composed<T, B, L> {
    pub(crate) observer: BoxedWhenPresent<RequestObserver>,
    /// Coalesced identical GETs, outside the retry: one shared request is one logical
    /// request for the retry, the breaker and the limiter.
    pub(crate) coalesce: BoxedWhenPresent<crate::coalesce::CoalesceGets>,
    pub(crate) retry: RetrySlot<crate::retry::RetryMiddleware>,
    /// `BearerAuth`'s token fetch, before the breaker and the limiter: a request waits for
    /// its token before it takes a half-open probe slot or a limiter permit.
    pub(crate) token_first: T,
    pub(crate) breaker: Option<crate::breaker::CircuitBreakerMiddleware>,
    /// The per-origin rate limit: inside the breaker, outside the concurrency limit (a
    /// request waiting for its slot holds no permit); hooks of each attempt.
    pub(crate) rate: Option<crate::rate::RateLimit>,
    pub(crate) limit: L,
    pub(crate) bearer: B,
    /// Whether `bearer` is `BearerAuth` (not [`Absent`]).
    pub(crate) has_bearer: bool,
    /// `None` when a user's per-attempt middleware runs between `BearerAuth` and the
    /// transport step: then the transport step is a middleware of its own after them.
    pub(crate) transport: Option<crate::evidence::TransportEvidence>,
    /// A proxy pool: the innermost call is then the attempt on a proxy's client, not the
    /// client's chain (`crate::proxy`).
    pub(crate) proxies: Option<crate::proxy::Routes>,
    /// Resumes response bodies that break (`crate::resume`), when the stack may.
    pub(crate) resume: Option<crate::resume::Resumer>,
}

impl<L> Composed<Absent, Absent, L> {
    /// The same stack with `bearer`, its token fetched first (before the breaker and the
    /// limiter).
    pub(crate) fn with_bearer(
        self,
        bearer: crate::auth::BearerAuth,
    ) -> Composed<crate::auth::TokenFirst, crate::auth::BearerAuth, L> {
        Composed {
            observer: self.observer,
            coalesce: self.coalesce,
            retry: self.retry,
            token_first: crate::auth::TokenFirst(bearer.clone()),
            breaker: self.breaker,
            rate: self.rate,
            limit: self.limit,
            bearer,
            has_bearer: true,
            transport: self.transport,
            proxies: self.proxies,
            resume: self.resume,
        }
    }
}

impl<T, B> Composed<T, B, Absent> {
    /// The same stack with `limit` as its concurrency limit.
    pub(crate) fn with_limit<L>(self, limit: L) -> Composed<T, B, L> {
        Composed {
            observer: self.observer,
            coalesce: self.coalesce,
            retry: self.retry,
            token_first: self.token_first,
            breaker: self.breaker,
            rate: self.rate,
            limit,
            bearer: self.bearer,
            has_bearer: self.has_bearer,
            transport: self.transport,
            proxies: self.proxies,
            resume: self.resume,
        }
    }
}

impl<T, B, L> Composed<T, B, L> {
    /// The stage that checks its place for the whole stack: the outermost one that
    /// would check it when used alone (so a misplaced stack names the same middleware).
    fn checked_as(&self) -> (&'static str, bool) {
        if self.retry.0.is_some() {
            ("RetryMiddleware", true)
        } else if self.breaker.is_some() {
            ("CircuitBreakerMiddleware", false)
        } else if self.has_bearer {
            ("BearerAuth", false)
        } else {
            ("TransportEvidence", false)
        }
    }
}

impl<T: Stage + 'static, B: Stage + 'static, L: Stage + 'static> Composed<T, B, L> {
    /// The request through every stage with `next` inside: one implementation for
    /// reqwest-middleware's `Next` and (feature `astral`) the fork's.
    fn run_request<'a, N: RestOfStack + 'a>(
        &'a self,
        req: Request,
        extensions: &'a mut Extensions,
        next: N,
    ) -> Made<
        'a,
        impl std::future::Future<Output = reqwest_middleware::Result<reqwest::Response>> + Send + 'a,
    > {
        // The checks and the clean-up of an earlier request's state, once for every
        // stage. Here, as the future is made: the middleware outside made it as it will
        // poll it (`scope::Ownership::poll_as`).
        let (middleware, is_retry) = self.checked_as();
        let owner = crate::stage::scope::enter(extensions, middleware, is_retry, req.url());
        let resume = (self.resume.as_ref())
            .filter(|_| owner.is_ok())
            .and_then(|r| Some((r, r.candidate(&req, extensions)?)));
        let next = match &self.proxies {
            None => Innermost::Next(next),
            Some(routes) => Innermost::Pool(routes),
        };
        let inner = nested_from_retry!(self, next);
        let inner = Nested::new(&self.coalesce, inner);
        let inner = Nested::new(&self.observer, inner);
        // Installed always: here, or after the user's per-attempt middlewares.
        let handover = Handover::default().within_composed();
        // The request's one place while the stages work on it (stage cost rule 3).
        let mut slot = RequestSlot::new(req);
        match resume {
            // A refused placement comes out of the future, which holds it instead of an
            // `Either` of two futures (one more move of the whole future per request).
            None => Made::Inline(async move {
                let inner = inner.run(slot.hand(), extensions, handover);
                owner?.poll_made_as(inner).await
            }),
            // A body that may be resumed (opt-in): its response is wrapped once it comes.
            // Boxed, so that this rarer future does not size every request's (stage cost
            // rule 2), and handed on as it is (not boxed again). The stages' future is
            // boxed apart: in one box of 1 416 bytes the two passed the allocator's thread
            // cache (stage cost rule 6), which cost ~400 instructions per request more
            // than a second allocation (`benches/instructions.rs`, resumed bodies).
            Some((resumer, candidate)) => Made::Boxed(Box::pin(async move {
                let owner = owner?;
                let inner = inner.run(slot.hand(), &mut *extensions, handover);
                let result = Box::pin(owner.poll_made_as(inner)).await;
                resumer.finish(candidate, result, extensions)
            })),
        }
    }
}

/// A request's future through the composed stack, as [`Composed::run_request`] made it:
/// to be boxed by the `Middleware` impl, or boxed already (a body that may be resumed).
/// Boxed again, the latter would cost a second allocation the size of the inline future,
/// which it does not use.
enum Made<'a, F> {
    Inline(F),
    Boxed(Handled<'a>),
}

impl<T: Stage + 'static, B: Stage + 'static, L: Stage + 'static> Middleware for Composed<T, B, L> {
    fn handle<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        req: Request,
        extensions: &'life1 mut Extensions,
        next: Next<'life2>,
    ) -> Handled<'async_trait>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        match self.run_request(req, extensions, next) {
            Made::Inline(future) => Box::pin(future),
            Made::Boxed(future) => future,
        }
    }
}

#[cfg(feature = "astral")]
impl<T: Stage + 'static, B: Stage + 'static, L: Stage + 'static>
    astral_reqwest_middleware::Middleware for Composed<T, B, L>
{
    fn handle<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        req: Request,
        extensions: &'life1 mut Extensions,
        next: astral_reqwest_middleware::Next<'life2>,
    ) -> crate::stage::astral::AstralHandled<'async_trait>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        match self.run_request(req, extensions, next) {
            Made::Inline(future) => crate::stage::astral::boxed_for_astral(future),
            Made::Boxed(future) => crate::stage::astral::boxed_for_astral(future),
        }
    }
}

/// The composed stack behind one pointer, whichever stages it has: a middleware of
/// reqwest-middleware and, with feature `astral`, of the fork too (an `Arc` of it upcasts
/// to either trait object, so one value serves both kinds of client).
#[cfg(not(feature = "astral"))]
pub(crate) trait StackMiddleware: Middleware {}
#[cfg(not(feature = "astral"))]
impl<M: Middleware> StackMiddleware for M {}

/// The composed stack behind one pointer, whichever stages it has: a middleware of
/// reqwest-middleware and, with feature `astral`, of the fork too (an `Arc` of it upcasts
/// to either trait object, so one value serves both kinds of client).
#[cfg(feature = "astral")]
pub(crate) trait StackMiddleware:
    Middleware + astral_reqwest_middleware::Middleware
{
}
#[cfg(feature = "astral")]
impl<M: Middleware + astral_reqwest_middleware::Middleware> StackMiddleware for M {}

/// The stages of a composed stack from the retry loop inward, over the client: what a
/// resumed body sends its range requests through (`crate::resume`). Clones of the
/// stack's own stages (they share their registries, budgets and token managers), with the
/// transport step always innermost (a stack with per-attempt middlewares has it outside
/// `Composed`; those middlewares do not see the range requests).
pub(crate) struct ResumeStages<T, B, L> {
    /// The `on_attempt` hook and the span (feature `tracing`): a range request is an
    /// attempt the hook reports like any other.
    pub(crate) observer: Option<RequestObserver>,
    pub(crate) retry: crate::retry::RetryMiddleware,
    pub(crate) token_first: T,
    pub(crate) breaker: Option<crate::breaker::CircuitBreakerMiddleware>,
    pub(crate) rate: Option<crate::rate::RateLimit>,
    pub(crate) limit: L,
    pub(crate) bearer: B,
    /// Always there (`Some`): a range request has no per-attempt middleware.
    pub(crate) transport: Option<crate::evidence::TransportEvidence>,
    pub(crate) client: reqwest::Client,
}

impl<T: Stage + 'static, B: Stage + 'static, L: Stage + 'static> crate::resume::Resend
    for ResumeStages<T, B, L>
{
    fn resend(
        self: std::sync::Arc<Self>,
        req: Request,
        mut extensions: Extensions,
    ) -> crate::resume::Resent {
        Box::pin(async move {
            let owner =
                crate::stage::scope::enter(&mut extensions, "RetryMiddleware", true, req.url())?;
            let inner = nested_from_retry!(self, ClientCall(&self.client));
            let inner = Nested::new(&self.observer, inner);
            let handover = Handover::default().within_composed();
            let mut slot = RequestSlot::new(req);
            owner
                .poll_made_as(inner.run(slot.hand(), &mut extensions, handover))
                .await
        })
    }
}

/// The client itself as the innermost rest of the stack.
#[derive(Clone, Copy)]
struct ClientCall<'c>(&'c reqwest::Client);

impl RestOfStack for ClientCall<'_> {
    fn run<'a>(
        self,
        req: HandedRequest<'a>,
        _: &'a mut Extensions,
        _: Handover<'a>,
    ) -> impl Future<Output = reqwest_middleware::Result<reqwest::Response>> + Send + 'a
    where
        Self: 'a,
    {
        let sent = self.0.execute(req.take());
        async move { sent.await.map_err(reqwest_middleware::Error::Reqwest) }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// The largest allocation glibc serves from its per-thread cache; a larger one takes
    /// the arena's lock. Measured (`benches/instructions.rs`, end to end): the default
    /// attempt future at 1 224 bytes cost `Resilience::new()` about 650 instructions and 12
    /// atomic operations per request more than at 1 032; the rate limit's at 1 064 bytes,
    /// about 250 and 12 more than at 992.
    const THREAD_CACHE_LIMIT: usize = 1032;

    /// Makes (and never polls) the futures the default stack boxes (`Resilience::new()`'s
    /// stages as `assemble` builds them) over the `Next` it is handed, and keeps their
    /// sizes: each attempt's (`RestOfStack::run_boxed`), the same with a learned rate
    /// limit (its hooks are the attempt's), and the request's (what `Middleware::handle`
    /// boxes).
    struct BoxedSizes(Arc<[AtomicUsize; 3]>);

    #[async_trait::async_trait]
    impl Middleware for BoxedSizes {
        async fn handle(
            &self,
            req: Request,
            extensions: &mut Extensions,
            next: Next<'_>,
        ) -> reqwest_middleware::Result<reqwest::Response> {
            let mut stages = Composed {
                observer: BoxedWhenPresent(None),
                coalesce: BoxedWhenPresent(None),
                retry: RetrySlot(Some(crate::retry::RetryMiddleware::new())),
                token_first: Absent,
                breaker: Some(crate::breaker::CircuitBreakerMiddleware::default()),
                rate: None,
                limit: Absent,
                bearer: Absent,
                has_bearer: false,
                transport: Some(crate::evidence::TransportEvidence::new()),
                proxies: None,
                resume: None,
            };
            let handover = Handover::default().within_composed();
            let copy = crate::stage::copy_head(&req);
            let whole = crate::stage::copy_head(&req);
            let inside = nested_inside_retry!(stages, Innermost::Next(next.clone()));
            // What the retry loop boxes for each attempt (`RestOfStack::run_boxed`).
            let attempt = inside.run_boxed(req, extensions, handover);
            self.0[0].store(std::mem::size_of_val(&*attempt), Ordering::Relaxed);
            drop(attempt);
            let registry = crate::rate::RateLimitRegistry::new(Default::default())
                .expect("the default rate limit");
            stages.rate = Some(crate::rate::RateLimit::new(registry));
            let inside = nested_inside_retry!(stages, Innermost::Next(next.clone()));
            let rated = inside.run_boxed(copy, extensions, handover);
            self.0[1].store(std::mem::size_of_val(&*rated), Ordering::Relaxed);
            drop(rated);
            stages.rate = None;
            let request = match stages.run_request(whole, extensions, next) {
                Made::Inline(future) => std::mem::size_of_val(&future),
                Made::Boxed(future) => std::mem::size_of_val(&*future),
            };
            self.0[2].store(request, Ordering::Relaxed);
            Err(reqwest_middleware::Error::middleware(
                std::io::Error::other("not sent"),
            ))
        }
    }

    #[tokio::test]
    async fn the_futures_the_default_stack_boxes_fit_the_allocators_thread_cache() {
        let sizes = Arc::new([
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        ]);
        let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(BoxedSizes(sizes.clone()))
            .build();
        let sent = client.get("http://127.0.0.1:9/").send().await;
        assert!(sent.is_err(), "nothing is sent");
        let futures = ["attempt", "rate-limited attempt", "request"];
        for (future, size) in futures.into_iter().zip(sizes.iter()) {
            let size = size.load(Ordering::Relaxed);
            assert!(size > 0, "the probe made the {future} future");
            assert!(
                size <= THREAD_CACHE_LIMIT,
                "the {future} future is {size} bytes, over glibc's thread cache ({THREAD_CACHE_LIMIT})"
            );
        }
    }
}
