//! The stage vocabulary: how a middleware's logic is written once and serves both the
//! middleware used alone and the composed stack.
//!
//! Each middleware's logic is a [`Stage`], generic over the rest of the stack inside it
//! ([`RestOfStack`]), the way tower composes its layers. Used alone, a middleware is a
//! stage whose inside is reqwest-middleware's `Next` ([`standalone_middleware!`]);
//! `Resilience` nests the stages into one middleware (`stack::compose::Composed`, one
//! [`Nested`] per stage), so a request through the whole stack costs one boxed future for
//! the stages, one per attempt below the retry loop ([`RestOfStack::run_boxed`]) and one
//! trip through `Next`, not one of each per layer.
//!
//! The stages outside an attempt hand inward what they already worked out
//! ([`Handover`]): the request's origin, worked out once per logical request; the retry's
//! spare copy of the request, which `BearerAuth` replays after a `401` instead of copying
//! the request itself (one copy per attempt); the bearer token fetched before the breaker
//! and the limiter admitted the attempt; that the stack already entered the request (its
//! placement checks and clean-up run once, at the top, see [`scope`]). Across a `Next` (a
//! user's middleware, or a middleware used alone) nothing is handed over and each stage
//! works it out itself.
//!
//! # Cost rules
//!
//! Every request moves every stage's future, so their size is paid per request (each
//! rule was measured with `cargo bench --bench instructions`). The stages
//! refer here rather than repeat them:
//!
//! 1. A stage's `serve` returns an `async move` block instead of being an `async fn`
//!    (hence `allow(clippy::manual_async_fn)` on every impl): the desugaring of an
//!    `async fn` keeps a second slot for each argument, the 264-byte `Request` among
//!    them.
//! 2. A rare path that waits (a pause, a queue, a second token fetch after a `401`) is
//!    boxed where it is awaited: its timer or its state would otherwise enlarge every
//!    request's future.
//! 3. The request lives once per owner, in a [`RequestSlot`] (the composed stack's request
//!    future, a middleware used alone, each attempt's box: [`RestOfStack::run_boxed`]);
//!    the stages hand a [`HandedRequest`] on it inward (8 bytes). A stage's `async` block
//!    that took a `Request` by value kept its 264 bytes for the block's whole life, one
//!    copy per stage (the full stack's attempt future held four: 2 272 bytes; measured
//!    with `-Zprint-type-sizes`). A `Request` a stage makes of its own (a copy to replay)
//!    is not borrowed across an `.await` (a borrow keeps a second copy in the future).
//! 4. An optional stage is chosen before its first poll ([`Either`]); a left-out stage's
//!    slot costs nothing ([`RetrySlot`], [`BoxedWhenPresent`]); an attempt's cut holds
//!    the inside once ([`CutAt`]).
//! 5. A future that is boxed is made inside `Box::pin(..)`'s argument, not bound to a name
//!    first: rustc keeps a moved-from local's room in the enclosing future while it is in
//!    scope (the hedged round bound to a name kept every request's retry loop at 4 632
//!    bytes instead of 952).
//! 6. The futures the default stack boxes (each attempt's, with a rate limit or without,
//!    and the request's) stay within the largest allocation glibc serves from its thread cache
//!    (1 032 bytes; a larger one takes the arena's lock): state only a cut attempt needs
//!    (its timer, the breaker's cut guard) is boxed when there is a cut, and what a rare
//!    wait keeps across its `.await` is a pointer. `stack::compose`'s test keeps them
//!    there.

use std::future::Future;

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::Next;

use crate::origin::Origin;
use crate::record::AttemptClock;
use crate::token::AccessToken;

#[cfg(feature = "astral")]
pub(crate) mod astral;
mod handed;
pub(crate) mod scope;
pub(crate) mod standalone;
pub(crate) use handed::{HandedRequest, RequestSlot};
pub(crate) use standalone::standalone_middleware;

/// What the stages outside an attempt already worked out about it.
#[derive(Clone, Copy, Default)]
pub(crate) struct Handover<'a> {
    /// The request's origin (`Some(None)`: its URL has none); `None` when not worked out.
    origin: Option<&'a Option<Origin>>,
    /// A copy of the request as sent to this attempt, before any stage changed it, which
    /// an inner stage may copy again to replay the attempt.
    spare: Option<&'a Request>,
    /// Whether the stages run inside the composed stack, which entered the request for
    /// every stage inside (the placement checks and the clean-up done once, at its top)
    /// and installed the transport step under them (so an attempt that left no evidence
    /// was answered by a user's per-attempt middleware, a cache, not sent without one).
    composed: bool,
    /// The bearer token fetched for this attempt before the breaker and the limiter
    /// admitted it, for `BearerAuth` to attach.
    token: Option<&'a AccessToken>,
}

impl<'a> Handover<'a> {
    /// Knows the request's origin.
    pub(crate) fn with_origin(self, origin: &'a Option<Origin>) -> Self {
        Handover {
            origin: Some(origin),
            ..self
        }
    }

    /// Knows a replayable copy of the request (`None`: there is none).
    pub(crate) fn with_spare(self, spare: Option<&'a Request>) -> Self {
        Handover { spare, ..self }
    }

    /// Whether the stages run inside the composed stack, which installed the transport
    /// step and every stage it has (`TokenFirst` outside `BearerAuth`); `false` for a
    /// stage used alone, which cannot see what is inside its `Next`.
    pub(crate) fn composed(&self) -> bool {
        self.composed
    }

    /// Knows the bearer token the attempt is to carry.
    pub(crate) fn with_token(self, token: &'a AccessToken) -> Self {
        Handover {
            token: Some(token),
            ..self
        }
    }

    /// The bearer token fetched for this attempt outside, if any.
    pub(crate) fn token(&self) -> Option<&'a AccessToken> {
        self.token
    }

    /// What the composed stack hands its stages: it entered the request for them and
    /// installed the transport step.
    pub(crate) fn within_composed(self) -> Self {
        Handover {
            composed: true,
            ..self
        }
    }

    /// How a stage starts: refused when it stands where it cannot work, else its place
    /// in the request ([`scope::enter`](scope::enter)), unless the composed stack
    /// took that place for it already (then it is not the request's owner: the stack is).
    pub(crate) fn enter(
        &self,
        extensions: &mut Extensions,
        middleware: &'static str,
        is_retry: bool,
        url: &reqwest::Url,
    ) -> Result<scope::Ownership, reqwest_middleware::Error> {
        if self.composed {
            Ok(scope::Ownership::inside_stack(extensions))
        } else {
            scope::enter(extensions, middleware, is_retry, url)
        }
    }

    /// [`enter`](Self::enter) for a stage that checks nothing: only its place.
    pub(crate) fn enter_unchecked(&self, extensions: &mut Extensions) -> scope::Ownership {
        if self.composed {
            scope::Ownership::inside_stack(extensions)
        } else {
            scope::enter_unchecked(extensions)
        }
    }

    /// The request's origin: the one worked out outside, else [`Origin::cached`].
    pub(crate) fn origin(&self, url: &reqwest::Url) -> Option<Origin> {
        match self.origin {
            Some(origin) => origin.clone(),
            None => Origin::cached(url),
        }
    }

    /// The outside's copy of the request, if it has one.
    pub(crate) fn spare(&self) -> Option<&'a Request> {
        self.spare
    }

    /// What a stage that changes the request hands on: the spare no longer matches it.
    pub(crate) fn without_spare(self) -> Self {
        Handover {
            spare: None,
            ..self
        }
    }
}

/// The rest of the stack, as seen from a stage: called once per attempt (and once per
/// copy of a hedged attempt), so cheap to clone.
pub(crate) trait RestOfStack: Clone + Send + Sync {
    /// Whether making this inside's future may do work of this crate (a `Next` may lead to
    /// a composed stack, which checks its place as its future is made): then a stage
    /// makes it as it will poll it ([`scope::Ownership::poll_as`]).
    /// The composed stack's own stages do all their work when polled.
    const MAKING_DOES_WORK: bool = false;

    /// Whether this inside sends the attempt through a proxy of a pool, which leaves the
    /// proxy it took in the extensions for the transport step (`crate::proxy`).
    fn routed(&self) -> bool {
        false
    }

    /// Runs the request through the rest of the stack.
    fn run<'a>(
        self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a
    where
        Self: 'a;

    /// [`run`](Self::run) of a request of its own, in a boxed future that holds it (its
    /// [`RequestSlot`]): what the retry loop awaits for each attempt. The stages inside
    /// then move a pointer, not their whole state, whenever the loop's future is moved,
    /// and one allocation per attempt costs less than those copies (measured:
    /// `benches/instructions.rs`). `Next` is boxed already.
    fn run_boxed<'a>(
        self,
        req: Request,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
    ) -> Handled<'a>
    where
        Self: 'a,
    {
        let mut slot = RequestSlot::new(req);
        Box::pin(async move { self.run(slot.hand(), extensions, handover).await })
    }
}

impl RestOfStack for Next<'_> {
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
        // Past a `Next` (a user's middleware, or the client) nothing of ours is known.
        Next::run(self, req.take(), extensions)
    }

    fn run_boxed<'a>(
        self,
        req: Request,
        extensions: &'a mut Extensions,
        _: Handover<'a>,
    ) -> Handled<'a>
    where
        Self: 'a,
    {
        Next::run(self, req, extensions)
    }
}

/// One middleware's logic, generic over what is inside it.
pub(crate) trait Stage: Send + Sync {
    /// Handles one request (or attempt) with `next` inside (an `async move` block: see
    /// the [cost rules](self#cost-rules)).
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a;

    /// Whether the stage is there (`false`: left out, the request goes straight inside).
    fn present(&self) -> bool {
        true
    }
}

/// A stage the composed stack leaves out by type: the request goes straight inside, and
/// its slot costs nothing (unlike `None`, whose `Option` is as large as the stage's
/// future).
#[derive(Clone, Copy)]
pub(crate) struct Absent;

impl Stage for Absent {
    fn present(&self) -> bool {
        false
    }

    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        next.run(req, extensions, handover)
    }
}

/// A stage that may be left out: without it the request goes straight inside.
impl<S: Stage> Stage for Option<S> {
    fn present(&self) -> bool {
        self.is_some()
    }

    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        // Chosen here rather than in an `async` block, which would keep the request (and
        // the arguments) in the future beside the inner one's.
        match self {
            Some(stage) => Either::Stage {
                future: stage.serve(req, extensions, handover, next),
            },
            None => Either::Skip {
                future: next.run(req, extensions, handover),
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// One of two futures chosen before the first poll (a stage's, or the inside's when the
    /// stage is left out or refuses at once), without an `async` block's extra state.
    #[project = EitherProj]
    pub(crate) enum Either<A, B> {
        Stage { #[pin] future: A },
        Skip { #[pin] future: B },
    }
}

impl<A: Future, B: Future<Output = A::Output>> Future for Either<A, B> {
    type Output = A::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<A::Output> {
        match self.project() {
            EitherProj::Stage { future } => future.poll(cx),
            EitherProj::Skip { future } => future.poll(cx),
        }
    }
}

/// The stage whose inside runs once per attempt (the retry loop), or its inside boxed
/// when it is left out. An optional stage's future is as large as the larger of its own
/// and its inside's; the retry's own future holds the attempt's inside behind a box
/// ([`RestOfStack::run_boxed`]), so without this the "left out" branch would put the whole
/// inside back into every request's future, retry or not.
pub(crate) struct RetrySlot<S>(pub(crate) Option<S>);

impl<S: Stage> Stage for RetrySlot<S> {
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        match &self.0 {
            Some(stage) => Either::Stage {
                future: stage.serve(req, extensions, handover, next),
            },
            None => Either::Skip {
                future: Box::pin(next.run(req, extensions, handover)) as Handled<'a>,
            },
        }
    }
}

/// A stage most stacks leave out, its future boxed when it is there: an optional stage's
/// future is as large as the larger of its own and its inside's, so without the box the
/// stacks that leave it out would carry its state in every request's future.
pub(crate) struct BoxedWhenPresent<S>(pub(crate) Option<S>);

impl<S: Stage> Stage for BoxedWhenPresent<S> {
    fn present(&self) -> bool {
        self.0.is_some()
    }

    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        match &self.0 {
            Some(stage) => Either::Stage {
                future: Box::pin(stage.serve(req, extensions, handover, next)) as Handled<'a>,
            },
            None => Either::Skip {
                future: next.run(req, extensions, handover),
            },
        }
    }
}

/// `stage` with `next` inside it: itself the inside of the stage around it.
pub(crate) struct Nested<'s, S, N> {
    stage: &'s S,
    next: N,
}

impl<S, N: Clone> Clone for Nested<'_, S, N> {
    fn clone(&self) -> Self {
        Nested {
            stage: self.stage,
            next: self.next.clone(),
        }
    }
}

impl<'s, S: Stage, N: RestOfStack> Nested<'s, S, N> {
    pub(crate) fn new(stage: &'s S, next: N) -> Self {
        Nested { stage, next }
    }
}

impl<S: Stage, N: RestOfStack> RestOfStack for Nested<'_, S, N> {
    fn run<'a>(
        self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a
    where
        Self: 'a,
    {
        self.stage.serve(req, extensions, handover, self.next)
    }
}

/// `response` with `url` as its [`Response::url`]: for a stage that hands back a response
/// it rebuilt or got from elsewhere. `Response::from(http::Response)` takes the URL from
/// an extension only reqwest's `ResponseBuilderExt::url` can set, so the extension is
/// taken from a response head built with it.
pub(crate) fn with_url(response: Response, url: reqwest::Url) -> Response {
    use reqwest::ResponseBuilderExt;
    let (mut head, body) = http::Response::<reqwest::Body>::from(response).into_parts();
    let (with_url, ()) = http::Response::builder()
        .url(url)
        .body(())
        .unwrap_or_default()
        .into_parts();
    head.extensions.extend(with_url.extensions);
    Response::from(http::Response::from_parts(head, body))
}

/// A copy of `req` for another attempt (`None`: its body is a stream, which cannot be
/// copied): what `Request::try_clone` returns, without its cost on a request with no
/// body. reqwest 0.13's `try_clone` writes the timeout into a fresh extensions map even
/// when there is none (a map, its table and a box, then dropped): 3 allocations per copy
/// (`benches/instructions.rs`). A request's extensions are reqwest's own (private); a
/// request with no body was built by reqwest's `Request::new` or `RequestBuilder`, whose
/// extensions hold at most the timeout, copied here (one made from an `http::Request`,
/// whose extensions may hold more, always has a body, and is copied by `try_clone`, the
/// only way to copy a body).
pub(crate) fn copy_request(req: &Request) -> Option<Request> {
    if req.body().is_some() {
        return req.try_clone();
    }
    Some(copy_head(req))
}

/// A copy of `req` without its body (what [`copy_request`] copies of a request with
/// none): for a request whose body is opened again for each attempt
/// ([`ReplayableBody`](crate::upload::ReplayableBody)).
pub(crate) fn copy_head(req: &Request) -> Request {
    let mut copy = Request::new(req.method().clone(), req.url().clone());
    *copy.headers_mut() = req.headers().clone();
    *copy.version_mut() = req.version();
    if let Some(timeout) = req.timeout() {
        *copy.timeout_mut() = Some(*timeout);
    }
    copy
}

/// The boxed future `Middleware::handle` returns (the `async_trait` form of the trait).
pub(crate) type Handled<'a> =
    std::pin::Pin<Box<dyn Future<Output = reqwest_middleware::Result<Response>> + Send + 'a>>;

pin_project_lite::pin_project! {
    /// The rest of the stack's future, cut at an instant when there is one. Unlike
    /// `tokio::time::timeout_at` chosen in one branch and a plain `.await` in the other,
    /// it holds the inner future once (the two branches would each keep a slot for it).
    /// Its output is the same as tokio's timeout's, tokio's `Elapsed` at the cut: the
    /// inner future is polled first, so an answer ready at the cut wins.
    ///
    /// Cut on an attempt's clock ([`CutAt::on_clock`]), the instant is re-read from the
    /// clock whenever the timer fires: a gate inside that restarted or stopped the clock
    /// moved it.
    ///
    /// A stage whose inner future is large writes the struct itself around the call that
    /// makes it ([`cut_timer`] for the timer) and pins it there (`std::pin::pin!`, then
    /// `.await` on the pin): made first and handed to a constructor, or awaited by
    /// value, the inner future is moved again (measured with `benches/instructions.rs`:
    /// the breaker's cut, 2 to 4 moves of its inner future per attempt).
    pub(crate) struct CutAt<F> {
        #[pin]
        pub(crate) inner: F,
        pub(crate) timer: Option<CutTimer>,
        pub(crate) clock: Option<AttemptClock>,
    }
}

impl<F: Future> CutAt<F> {
    /// `inner`, cut when `timer` fires (unless its `clock` moved the cut since).
    pub(crate) fn by(inner: F, timer: Option<CutTimer>, clock: Option<AttemptClock>) -> Self {
        CutAt {
            inner,
            timer,
            clock,
        }
    }

    pub(crate) fn new(inner: F, at: Option<tokio::time::Instant>) -> Self {
        CutAt {
            inner,
            timer: at.map(cut_timer_at),
            clock: None,
        }
    }

    /// Cut where `clock` says when its timer fires (`None`: at `at`, as [`new`](Self::new)).
    pub(crate) fn on_clock(
        inner: F,
        at: Option<tokio::time::Instant>,
        clock: Option<AttemptClock>,
    ) -> Self {
        let at = clock.as_ref().map_or(at, AttemptClock::cut);
        CutAt {
            clock,
            ..CutAt::new(inner, at)
        }
    }
}

/// The timer of a [`CutAt`]: tokio's timeout of a future that never ends (its output is
/// tokio's `Elapsed`, which only tokio makes). Boxed: its 112 bytes would otherwise size
/// every attempt's future, cut or not (stage cost rule 2).
pub(crate) type CutTimer = std::pin::Pin<Box<tokio::time::Timeout<std::future::Pending<()>>>>;

/// A [`CutTimer`] firing at `at`.
fn cut_timer_at(at: tokio::time::Instant) -> CutTimer {
    Box::pin(tokio::time::timeout_at(at, std::future::pending()))
}

/// The timer of [`CutAt::on_clock`], for a cut written as a struct.
pub(crate) fn cut_timer(
    at: Option<tokio::time::Instant>,
    clock: Option<&AttemptClock>,
) -> Option<CutTimer> {
    let at = clock.map_or(at, AttemptClock::cut);
    at.map(cut_timer_at)
}

impl<F: Future> Future for CutAt<F> {
    type Output = Result<F::Output, tokio::time::error::Elapsed>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let this = self.project();
        if let Poll::Ready(output) = this.inner.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        loop {
            let Some(Poll::Ready(Err(elapsed))) =
                this.timer.as_mut().map(|timer| timer.as_mut().poll(cx))
            else {
                return Poll::Pending;
            };
            // On a clock, a gate inside may have moved the cut since the timer was set.
            let moved = match this.clock.as_ref() {
                None => None,
                Some(clock) => match clock.cut() {
                    Some(at) if at <= tokio::time::Instant::now() => None,
                    at => Some(at),
                },
            };
            match moved {
                None => return Poll::Ready(Err(elapsed)),
                Some(at) => *this.timer = at.map(cut_timer_at),
            }
        }
    }
}
