//! The stack in the astral fork's client (feature `astral`): the [`AstralResilience`]
//! methods of [`Resilience`] build the same stack as [`Resilience::install`] does, in an
//! `astral_reqwest_middleware::ClientBuilder` (uv, rattler and pixi name that crate
//! `reqwest_middleware` in their code). Bring the trait into scope:
//! `use reqwest_resilience::stack::astral::AstralResilience;`.
//!
//! ```
//! use reqwest_resilience::redirect::{self, ClientRedirects};
//! use reqwest_resilience::stack::astral::AstralResilience;
//! use reqwest_resilience::{Resilience, ResilienceError};
//!
//! # fn main() -> Result<(), ResilienceError> {
//! // uv's way: its own reqwest::Client (its redirect policy watched), then the fork's
//! // builder, its own middlewares per attempt.
//! let client = reqwest::Client::builder()
//!     .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
//!     .build()
//!     .map_err(ResilienceError::ClientBuild)?;
//! let client = Resilience::new()
//!     .client_redirects(ClientRedirects::Recorded)
//!     .install_astral(astral_reqwest_middleware::ClientBuilder::new(client))?
//!     .build();
//! # drop(client); Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;

use astral_reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware};

use super::builder::{PerAttempt, Resilience};
use super::compose::StackMiddleware;
use super::install::ChainMember;
use crate::error::ResilienceError;

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Resilience {}
}

/// [`Resilience`]'s ways to build for the astral fork (feature `astral`): the fork's
/// counterparts of [`per_attempt`](Resilience::per_attempt),
/// [`install`](Resilience::install), [`into_middlewares`](Resilience::into_middlewares),
/// [`build`](Resilience::build) and [`build_from`](Resilience::build_from). Implemented for
/// [`Resilience`] only. ([`Resilience::into_middleware`]'s one middleware is a middleware of
/// the fork as well.)
#[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
pub trait AstralResilience: sealed::Sealed + Sized {
    /// [`per_attempt`](Resilience::per_attempt) for a middleware of the astral fork, shared
    /// (uv's `ExtraMiddleware(Vec<Arc<dyn Middleware>>)`): the stack must then be
    /// installed into the fork's builder ([`install_astral`](Self::install_astral)).
    fn per_attempt_astral(self, middleware: Arc<dyn Middleware>) -> Self;

    /// [`install`](Resilience::install) into the astral fork's `ClientBuilder`, inside
    /// whatever middleware it holds.
    ///
    /// # Errors
    ///
    /// As [`install`](Resilience::install); a per-attempt middleware of
    /// reqwest-middleware's trait is a
    /// [`StackError::PerAttemptOtherTrait`](crate::StackError::PerAttemptOtherTrait). The
    /// fork's builder does not hand out its client, which resumed bodies send their range
    /// requests over: [`resume_bodies`](Resilience::resume_bodies) is a
    /// [`StackError::ResumeWithoutClient`](crate::StackError::ResumeWithoutClient) here
    /// (take [`build_astral`](Self::build_astral)).
    fn install_astral(self, builder: ClientBuilder) -> Result<AstralStackBuilder, ResilienceError>;

    /// [`into_middlewares`](Resilience::into_middlewares) for the astral fork: the stages,
    /// the per-attempt middlewares and the transport step, for the fork's
    /// `ClientWithMiddleware::new(client, middlewares)` later (rattler's `LazyClient`).
    /// Build that client with [`redirect::recorded_client`](crate::redirect::recorded_client)
    /// and the whole decision table holds with nothing declared here (a `POST` whose
    /// connection was refused is retried).
    ///
    /// # Errors
    ///
    /// As [`install_astral`](Self::install_astral).
    fn into_middlewares_astral(self) -> Result<Vec<Arc<dyn Middleware>>, ResilienceError>;

    /// [`build`](Resilience::build) for the astral fork: `client` wrapped in the stack.
    ///
    /// # Errors
    ///
    /// As [`install_astral`](Self::install_astral).
    fn build_astral(self, client: reqwest::Client)
    -> Result<ClientWithMiddleware, ResilienceError>;

    /// [`build_from`](Resilience::build_from) for the astral fork: the client built with the
    /// recorded redirect policy, declared, and wrapped in the stack. Like `build_from`, it
    /// takes a `reqwest::ClientBuilder` or a closure returning one (one client per proxy of
    /// a [`proxies`](Resilience::proxies) pool).
    ///
    /// # Errors
    ///
    /// As [`build_from`](Resilience::build_from) and [`install_astral`](Self::install_astral).
    fn build_from_astral(
        self,
        builder: impl crate::stack::ClientBuilders,
    ) -> Result<ClientWithMiddleware, ResilienceError>;
}

impl AstralResilience for Resilience {
    fn per_attempt_astral(mut self, middleware: Arc<dyn Middleware>) -> Self {
        self.per_attempt.push(PerAttempt::Astral(middleware));
        self
    }

    fn install_astral(self, builder: ClientBuilder) -> Result<AstralStackBuilder, ResilienceError> {
        // The fork's builder does not hand out its client: no resumed bodies here.
        install_astral_over(self, builder, None)
    }

    fn into_middlewares_astral(self) -> Result<Vec<Arc<dyn Middleware>>, ResilienceError> {
        self.chain(None)
    }

    fn build_astral(
        self,
        client: reqwest::Client,
    ) -> Result<ClientWithMiddleware, ResilienceError> {
        let builder = ClientBuilder::new(client.clone());
        Ok(install_astral_over(self, builder, Some(client))?.build())
    }

    fn build_from_astral(
        self,
        builder: impl crate::stack::ClientBuilders,
    ) -> Result<ClientWithMiddleware, ResilienceError> {
        let (stack, client) = self.precise_client(builder)?;
        stack.build_astral(client)
    }
}

/// [`AstralResilience::install_astral`], `client` being the one under `builder` (resumed
/// bodies send their range requests over it).
fn install_astral_over(
    stack: Resilience,
    builder: ClientBuilder,
    client: Option<reqwest::Client>,
) -> Result<AstralStackBuilder, ResilienceError> {
    let chain: Vec<Arc<dyn Middleware>> = stack.chain(client)?;
    Ok(AstralStackBuilder {
        builder: chain.into_iter().fold(builder, ClientBuilder::with_arc),
    })
}

impl ChainMember for dyn Middleware {
    const CRATE: &'static str = "astral-reqwest-middleware";
    fn stack(stack: Arc<dyn StackMiddleware>) -> Arc<Self> {
        stack
    }
    fn transport(transport: crate::evidence::TransportEvidence) -> Arc<Self> {
        Arc::new(transport)
    }
    #[cfg(feature = "chaos")]
    fn chaos(chaos: crate::chaos::Chaos) -> Arc<Self> {
        Arc::new(chaos)
    }
    fn per_attempt(middleware: &PerAttempt) -> Option<Arc<Self>> {
        match middleware {
            PerAttempt::Astral(m) => Some(m.clone()),
            PerAttempt::Reqwest(_) => None,
        }
    }
}

/// The astral fork's `ClientBuilder` ending in the stack
/// ([`AstralResilience::install_astral`]):
/// add request initialisers, then [`build`](Self::build). Like
/// [`StackBuilder`](super::StackBuilder) it has no `.with()`: a middleware added after
/// the stack would run inside the transport step.
#[must_use = "an AstralStackBuilder does nothing until it is built"]
#[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
pub struct AstralStackBuilder {
    builder: ClientBuilder,
}

impl fmt::Debug for AstralStackBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AstralStackBuilder").finish_non_exhaustive()
    }
}

impl AstralStackBuilder {
    /// Adds a request initialiser (the fork's `ClientBuilder::with_init`).
    pub fn with_init<I: astral_reqwest_middleware::RequestInitialiser>(
        self,
        initialiser: I,
    ) -> Self {
        AstralStackBuilder {
            builder: self.builder.with_init(initialiser),
        }
    }

    /// Adds a shared request initialiser (the fork's `ClientBuilder::with_arc_init`).
    pub fn with_arc_init(
        self,
        initialiser: Arc<dyn astral_reqwest_middleware::RequestInitialiser>,
    ) -> Self {
        AstralStackBuilder {
            builder: self.builder.with_arc_init(initialiser),
        }
    }

    /// The client.
    pub fn build(self) -> ClientWithMiddleware {
        self.builder.build()
    }

    /// The underlying `ClientBuilder`, whose `.with()` adds middleware *inside* the
    /// transport step: only for a stand-in for the network (see
    /// [`StackBuilder::inside_transport_step`](super::StackBuilder::inside_transport_step)).
    pub fn inside_transport_step(self) -> ClientBuilder {
        self.builder
    }
}
