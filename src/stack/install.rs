//! The installation: the assembled stack put into a `reqwest_middleware::ClientBuilder`
//! ([`Resilience::install`] and the ways built on it), or handed out as one middleware
//! ([`ResilienceMiddleware`]) or as the list of middlewares a client builder made later
//! is to hold. The astral fork's counterparts are in `astral`.

use std::fmt;
use std::sync::Arc;

use http::Extensions;
use reqwest::Request;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware};

use super::assemble::Assembled;
use super::builder::{PerAttempt, Resilience};
use super::clients::ClientBuilders;
use super::compose;
use crate::error::{ResilienceError, StackError, StackPart};
use crate::evidence::TransportEvidence;
#[cfg(doc)]
use crate::redirect::ClientRedirects;

impl Resilience {
    /// Builds the client: `reqwest::Client` wrapped in the stack. The stack sees the
    /// client's redirects as [`client_redirects`](Self::client_redirects) declares
    /// (default `Unobserved`); [`build_from`](Self::build_from) builds a client whose every
    /// hop is seen.
    ///
    /// # Errors
    ///
    /// See [Errors at build time](Self#errors-at-build-time).
    pub fn build(self, client: reqwest::Client) -> Result<ClientWithMiddleware, ResilienceError> {
        Ok(self.install(ClientBuilder::new(client))?.build())
    }

    /// Builds the client from `builder` with the recorded redirect policy
    /// ([`redirect::recorded`](crate::redirect::recorded) around
    /// [`redirect_policy`](Self::redirect_policy), default reqwest's) and declares it
    /// ([`ClientRedirects::Recorded`]), then wraps it in the stack: the whole decision
    /// table, a refused connect of a `POST` retried, each hop charged to its own origin.
    /// With a retry part, reqwest's own retries are off (but for the replay of a request
    /// whose new connection gave way to another address, see [`crate::network`]): reqwest
    /// sends again, where no evidence sees it, a request whose HTTP/2 stream failed with a
    /// `GOAWAY`, a `POST` included, and hyper can fail that way a stream the server had
    /// already taken; the retry middleware retries those itself, by the decision table.
    /// Without a retry part, reqwest keeps only its harmless replays: of a stream the
    /// server refused, and of a `GOAWAY`'d stream for an idempotent method.
    ///
    /// `builder` is a `reqwest::ClientBuilder`, or a closure returning one
    /// ([`ClientBuilders`](crate::stack::ClientBuilders)): a [`proxies`](Self::proxies)
    /// pool needs the closure, to build one client per proxy from the same settings.
    ///
    /// ```
    /// use reqwest_resilience::Resilience;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// let client = Resilience::new().build_from(reqwest::Client::builder())?;
    /// # drop(client); Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ResilienceError::ClientBuild`] when reqwest cannot build the client, and those of
    /// [Errors at build time](Self#errors-at-build-time) (a
    /// [`client_redirects`](Self::client_redirects) declaration is a
    /// [`StackError::Conflict`]: this builds and declares the client itself).
    pub fn build_from(
        self,
        builder: impl ClientBuilders,
    ) -> Result<ClientWithMiddleware, ResilienceError> {
        let (stack, client) = self.precise_client(builder)?;
        stack.build(client)
    }

    /// Appends the stack to `builder`, inside whatever middleware it already holds: the
    /// place for middleware that should see each logical request once, and for request
    /// initialisers ([`StackBuilder::with_init`]). It has no `.with()`: a middleware added
    /// after the stack would run inside the transport step (see [`StackBuilder`]).
    ///
    /// ```
    /// use reqwest_middleware::ClientBuilder;
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::redirect::{self, ClientRedirects};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let recorded = redirect::recorded(reqwest::redirect::Policy::default()); // every hop seen
    /// let reqwest_client = reqwest::Client::builder().redirect(recorded).build()?;
    /// let outer = ClientBuilder::new(reqwest_client); // .with(TracingMiddleware::default())
    /// let client = Resilience::new()
    ///     .client_redirects(ClientRedirects::Recorded)
    ///     .install(outer)?
    ///     .build();
    /// # drop(client); Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// See [Errors at build time](Self#errors-at-build-time).
    pub fn install(self, builder: ClientBuilder) -> Result<StackBuilder, ResilienceError> {
        // The client under the builder, for resumed bodies' range requests.
        let built = builder.build();
        let client = built.as_ref().clone();
        let chain: Vec<Arc<dyn Middleware>> = self.chain(Some(client))?;
        Ok(StackBuilder {
            builder: chain
                .into_iter()
                .fold(ClientBuilder::from_client(built), ClientBuilder::with_arc),
        })
    }

    /// The composed stack as one middleware, for a client builder made later (a client
    /// built lazily, a `Vec<Arc<dyn Middleware>>` handed to a builder elsewhere): every
    /// stage of [`install`](Self::install), the transport step included, so it must be
    /// the *last* middleware of that builder (nearest the `reqwest::Client`). With feature
    /// `astral` it is a middleware of the fork as well.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use reqwest_middleware::Middleware;
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::redirect::{self, ClientRedirects};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let stack = Resilience::new().client_redirects(ClientRedirects::Recorded);
    /// let mut middlewares: Vec<Arc<dyn Middleware>> = Vec::new();
    /// middlewares.push(Arc::new(stack.into_middleware()?));
    /// // Later, when the client is first needed (recording its redirects, as declared):
    /// let recorded = redirect::recorded(reqwest::redirect::Policy::default());
    /// let reqwest_client = reqwest::Client::builder().redirect(recorded).build()?;
    /// let client = middlewares
    ///     .iter()
    ///     .fold(reqwest_middleware::ClientBuilder::new(reqwest_client), |b, m| {
    ///         b.with_arc(m.clone())
    ///     })
    ///     .build();
    /// # drop(client); Ok(()) }
    /// ```
    ///
    /// The stack sees the client's redirects as
    /// [`client_redirects`](Self::client_redirects) declares, unless the client proves
    /// more: build it with [`redirect::recorded_client`](crate::redirect::recorded_client)
    /// for the whole decision table with nothing declared.
    ///
    /// # Errors
    ///
    /// [`StackError::PerAttemptInOneMiddleware`] with per-attempt middlewares (they run
    /// between `BearerAuth` and the transport step, in the client's own chain: take
    /// [`into_middlewares`](Self::into_middlewares) then), [`StackError::ChaosInOneMiddleware`]
    /// with a chaos layer (the same), and those of
    /// [Errors at build time](Self#errors-at-build-time).
    pub fn into_middleware(self) -> Result<ResilienceMiddleware, ResilienceError> {
        if !self.per_attempt.is_empty() {
            return Err(ResilienceError::InvalidStack(
                StackError::PerAttemptInOneMiddleware,
            ));
        }
        let parts = self.prebuilt_client()?.assemble(None)?;
        if !parts.is_one_middleware() {
            // Only a chaos layer moves the transport step out without per-attempt ones.
            return Err(ResilienceError::InvalidStack(
                StackError::ChaosInOneMiddleware,
            ));
        }
        Ok(ResilienceMiddleware { stack: parts.stack })
    }

    /// The stack as the middlewares a client builder made later is to hold, in order,
    /// after any of its own: the composed stages, the
    /// [`per_attempt`](Self::per_attempt) middlewares, and the transport step (without
    /// per-attempt middlewares, the one middleware of
    /// [`into_middleware`](Self::into_middleware)). For a codebase that hands a
    /// `Vec<Arc<dyn Middleware>>` to `ClientWithMiddleware::new(client, middlewares)` when
    /// its client is first needed (pixi's `LazyClient`). Build that client with
    /// [`redirect::recorded_client`](crate::redirect::recorded_client): it proves to the
    /// transport step that its redirects are recorded, so nothing needs declaring here.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use reqwest_middleware::{ClientWithMiddleware, Middleware};
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::redirect;
    ///
    /// # struct Mirror; // rewrites each attempt's URL to a mirror
    /// # #[reqwest_resilience::async_trait]
    /// # impl Middleware for Mirror {
    /// #     async fn handle(&self, req: reqwest::Request, ext: &mut http::Extensions,
    /// #         next: reqwest_middleware::Next<'_>) -> reqwest_middleware::Result<reqwest::Response> {
    /// #         next.run(req, ext).await
    /// #     }
    /// # }
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let middlewares: Vec<Arc<dyn Middleware>> = Resilience::like_reqwest_retry()
    ///     .per_attempt(Arc::new(Mirror))
    ///     .into_middlewares()?;
    /// assert_eq!(middlewares.len(), 3); // the stages, Mirror, the transport step
    /// // Later, elsewhere:
    /// let policy = reqwest::redirect::Policy::default();
    /// let reqwest_client = redirect::recorded_client(reqwest::Client::builder(), policy)?;
    /// let client = ClientWithMiddleware::new(reqwest_client, middlewares);
    /// # drop(client); Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`install`](Self::install).
    pub fn into_middlewares(self) -> Result<Vec<Arc<dyn Middleware>>, ResilienceError> {
        self.chain(None)
    }

    /// The middlewares a client builder of `M`'s crate holds, in order (see
    /// [`Assembled::into_chain`]); `client` is the one under that builder, when known.
    pub(super) fn chain<M: ?Sized + ChainMember>(
        self,
        client: Option<reqwest::Client>,
    ) -> Result<Vec<Arc<M>>, ResilienceError> {
        // (`into_middleware`, the other way to `assemble`, refuses per-attempt ones.)
        if self.coalesce.is_some() && !self.per_attempt.is_empty() {
            return Err(ResilienceError::InvalidStack(
                StackError::CoalesceWithPerAttempt,
            ));
        }
        let per_attempt = self
            .per_attempt
            .iter()
            .map(|m| {
                M::per_attempt(m).ok_or(ResilienceError::InvalidStack(
                    StackError::PerAttemptOtherTrait { builder: M::CRATE },
                ))
            })
            .collect::<Result<_, _>>()?;
        Ok(self
            .prebuilt_client()?
            .assemble(client)?
            .into_chain(per_attempt))
    }

    /// Refuses the settings only `build_from` can apply, for a client built elsewhere.
    fn prebuilt_client(self) -> Result<Self, ResilienceError> {
        if self.redirect_policy.is_some() {
            return Err(ResilienceError::InvalidStack(StackError::Conflict {
                part: StackPart::Client,
                setting: "redirect_policy",
            }));
        }
        Ok(self)
    }
}

/// A `reqwest_middleware::ClientBuilder` ending in the stack, from
/// [`Resilience::install`]: add request initialisers,
/// then [`build`](Self::build).
///
/// It has no `.with()` on purpose. A middleware added after the stack runs *inside* the
/// transport step: once per wire request but unseen by the evidence (its failures become
/// `Unknown`, a retry of its own sends requests the history never shows). Put yours
/// around the stack ([`Resilience::install`]) or per attempt ([`Resilience::per_attempt`]).
///
/// ```compile_fail
/// # struct Mine;
/// # #[reqwest_resilience::async_trait]
/// # impl reqwest_middleware::Middleware for Mine {
/// #     async fn handle(&self, req: reqwest::Request, ext: &mut http::Extensions,
/// #         next: reqwest_middleware::Next<'_>) -> reqwest_middleware::Result<reqwest::Response> {
/// #         next.run(req, ext).await
/// #     }
/// # }
/// let client = reqwest_resilience::Resilience::new()
///     .install(reqwest_middleware::ClientBuilder::new(reqwest::Client::new()))
///     .unwrap()
///     .with(Mine) // does not compile: it would run inside the transport step
///     .build();
/// ```
///
/// A stand-in for the network (a test double answering every request) is the one
/// middleware that belongs there; [`inside_transport_step`](Self::inside_transport_step)
/// says so in the code.
#[must_use = "a StackBuilder does nothing until it is built"]
pub struct StackBuilder {
    builder: ClientBuilder,
}

impl fmt::Debug for StackBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackBuilder").finish_non_exhaustive()
    }
}

impl StackBuilder {
    /// Adds a request initialiser (`reqwest_middleware::ClientBuilder::with_init`).
    ///
    /// ```
    /// use reqwest_middleware::Extension;
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::retry::MaxRetries;
    /// use reqwest_resilience::redirect::{self, ClientRedirects};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let recorded = redirect::recorded(reqwest::redirect::Policy::default()); // every hop seen
    /// // Every request of this client gets one retry at most.
    /// let client = Resilience::new()
    ///     .client_redirects(ClientRedirects::Recorded)
    ///     .install(reqwest_middleware::ClientBuilder::new(
    ///         reqwest::Client::builder().redirect(recorded).build()?,
    ///     ))?
    ///     .with_init(Extension(MaxRetries(1)))
    ///     .build();
    /// # drop(client); Ok(()) }
    /// ```
    pub fn with_init<I: reqwest_middleware::RequestInitialiser>(self, initialiser: I) -> Self {
        StackBuilder {
            builder: self.builder.with_init(initialiser),
        }
    }

    /// Adds a shared request initialiser (`ClientBuilder::with_arc_init`).
    pub fn with_arc_init(
        self,
        initialiser: Arc<dyn reqwest_middleware::RequestInitialiser>,
    ) -> Self {
        StackBuilder {
            builder: self.builder.with_arc_init(initialiser),
        }
    }

    /// The client.
    pub fn build(self) -> ClientWithMiddleware {
        self.builder.build()
    }

    /// The underlying `ClientBuilder`, whose `.with()` adds middleware *inside* the
    /// transport step: only for a stand-in for the network (a test double, a recorded
    /// answer), whose responses the evidence then describes.
    ///
    /// ```
    /// struct Canned; // answers every request itself
    ///
    /// #[reqwest_resilience::async_trait]
    /// impl reqwest_middleware::Middleware for Canned {
    ///     async fn handle(&self, _: reqwest::Request, _: &mut http::Extensions,
    ///         _: reqwest_middleware::Next<'_>) -> reqwest_middleware::Result<reqwest::Response> {
    ///         Ok(http::Response::new("canned").into())
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = reqwest_resilience::Resilience::new()
    ///     .install(reqwest_middleware::ClientBuilder::new(reqwest::Client::new()))?
    ///     .inside_transport_step()
    ///     .with(Canned)
    ///     .build();
    /// let response = client.get("http://example.invalid/").send().await?;
    /// assert_eq!(response.text().await?, "canned");
    /// # Ok(()) }
    /// ```
    pub fn inside_transport_step(self) -> ClientBuilder {
        self.builder
    }
}

// The order of the chain, here rather than in `assemble`: it depends on whose builder
// holds it (`ChainMember`).
impl Assembled {
    /// The middlewares in the order a client builder holds them (the stages, the
    /// per-attempt ones, the transport step when it is not among the stages, the chaos
    /// layer), as trait objects of either crate's `Middleware`.
    fn into_chain<M: ?Sized + ChainMember>(self, per_attempt: Vec<Arc<M>>) -> Vec<Arc<M>> {
        let mut chain = Vec::with_capacity(per_attempt.len() + 3);
        chain.push(M::stack(self.stack));
        chain.extend(per_attempt);
        chain.extend(self.transport.map(M::transport));
        #[cfg(feature = "chaos")]
        chain.extend(self.chaos.map(M::chaos));
        chain
    }

    /// Whether the whole stack is the one middleware `stack`.
    fn is_one_middleware(&self) -> bool {
        self.transport.is_none()
    }
}

/// A trait object of either crate's `Middleware`, as a client's chain holds them.
pub(super) trait ChainMember {
    /// The crate whose `ClientBuilder` holds such middlewares (for an error).
    const CRATE: &'static str;
    fn stack(stack: Arc<dyn compose::StackMiddleware>) -> Arc<Self>;
    fn transport(transport: TransportEvidence) -> Arc<Self>;
    #[cfg(feature = "chaos")]
    fn chaos(chaos: crate::chaos::Chaos) -> Arc<Self>;
    /// The per-attempt middleware, when it is of this crate's trait.
    fn per_attempt(middleware: &PerAttempt) -> Option<Arc<Self>>;
}

impl ChainMember for dyn Middleware {
    const CRATE: &'static str = "reqwest-middleware";
    fn stack(stack: Arc<dyn compose::StackMiddleware>) -> Arc<Self> {
        stack
    }
    fn transport(transport: TransportEvidence) -> Arc<Self> {
        Arc::new(transport)
    }
    #[cfg(feature = "chaos")]
    fn chaos(chaos: crate::chaos::Chaos) -> Arc<Self> {
        Arc::new(chaos)
    }
    fn per_attempt(middleware: &PerAttempt) -> Option<Arc<Self>> {
        match middleware {
            PerAttempt::Reqwest(m) => Some(m.clone()),
            #[cfg(feature = "astral")]
            PerAttempt::Astral(_) => None,
        }
    }
}

/// The whole stack as one middleware ([`Resilience::into_middleware`]), for a client
/// builder made later: install it last. It implements `reqwest_middleware::Middleware`
/// and, with feature `astral`, the fork's `Middleware` too. Clones share the stack (its
/// breakers, budget and redirect proof).
#[derive(Clone)]
pub struct ResilienceMiddleware {
    stack: Arc<dyn compose::StackMiddleware>,
}

impl fmt::Debug for ResilienceMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResilienceMiddleware")
            .finish_non_exhaustive()
    }
}

impl Middleware for ResilienceMiddleware {
    fn handle<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        req: Request,
        extensions: &'life1 mut Extensions,
        next: reqwest_middleware::Next<'life2>,
    ) -> crate::stage::Handled<'async_trait>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        Middleware::handle(&*self.stack, req, extensions, next)
    }
}

#[cfg(feature = "astral")]
impl astral_reqwest_middleware::Middleware for ResilienceMiddleware {
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
        astral_reqwest_middleware::Middleware::handle(&*self.stack, req, extensions, next)
    }
}
