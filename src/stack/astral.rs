//! The stack in the astral fork's client (feature `astral`): [`Resilience::install_astral`]
//! and its kin, the same stack as [`Resilience::install`] builds, in an
//! `astral_reqwest_middleware::ClientBuilder` (uv, rattler and pixi name that crate
//! `reqwest_middleware` in their code).
//!
//! ```
//! use reqwest_resilience::redirect::{self, ClientRedirects};
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

impl Resilience {
    /// [`per_attempt`](Self::per_attempt) for a middleware of the astral fork: the stack
    /// must then be installed into the fork's builder
    /// ([`install_astral`](Self::install_astral)).
    #[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
    pub fn per_attempt_astral(mut self, middleware: impl Middleware) -> Self {
        self.per_attempt
            .push(PerAttempt::Astral(Arc::new(middleware)));
        self
    }

    /// [`per_attempt_astral`](Self::per_attempt_astral) for a middleware already shared
    /// (uv's `ExtraMiddleware(Vec<Arc<dyn Middleware>>)`).
    #[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
    pub fn per_attempt_astral_arc(mut self, middleware: Arc<dyn Middleware>) -> Self {
        self.per_attempt.push(PerAttempt::Astral(middleware));
        self
    }

    /// [`install`](Self::install) into the astral fork's `ClientBuilder`, inside whatever
    /// middleware it holds.
    ///
    /// # Errors
    ///
    /// As [`install`](Self::install); a per-attempt middleware of reqwest-middleware's
    /// trait is a [`StackError::PerAttemptOtherTrait`](crate::StackError::PerAttemptOtherTrait). The fork's builder does not hand
    /// out its client, which resumed bodies send their range requests over:
    /// [`resume_bodies`](Self::resume_bodies) is a [`StackError::ResumeWithoutClient`](crate::StackError::ResumeWithoutClient)
    /// here (take [`build_astral`](Self::build_astral)).
    #[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
    pub fn install_astral(
        self,
        builder: ClientBuilder,
    ) -> Result<AstralStackBuilder, ResilienceError> {
        // The fork's builder does not hand out its client: no resumed bodies here.
        self.install_astral_over(builder, None)
    }

    /// [`install_astral`](Self::install_astral), `client` being the one under `builder`
    /// (resumed bodies send their range requests over it).
    fn install_astral_over(
        self,
        builder: ClientBuilder,
        client: Option<reqwest::Client>,
    ) -> Result<AstralStackBuilder, ResilienceError> {
        let chain: Vec<Arc<dyn Middleware>> = self.chain(client)?;
        Ok(AstralStackBuilder {
            builder: chain.into_iter().fold(builder, ClientBuilder::with_arc),
        })
    }

    /// [`into_middlewares`](Self::into_middlewares) for the astral fork: the stages, the
    /// per-attempt middlewares and the transport step, for the fork's
    /// `ClientWithMiddleware::new(client, middlewares)` later (rattler's `LazyClient`).
    ///
    /// # Errors
    ///
    /// As [`install_astral`](Self::install_astral).
    #[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
    pub fn into_middlewares_astral(self) -> Result<Vec<Arc<dyn Middleware>>, ResilienceError> {
        self.chain(None)
    }

    /// [`build`](Self::build) for the astral fork: `client` wrapped in the stack.
    ///
    /// # Errors
    ///
    /// As [`install_astral`](Self::install_astral).
    #[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
    pub fn build_astral(
        self,
        client: reqwest::Client,
    ) -> Result<ClientWithMiddleware, ResilienceError> {
        let builder = ClientBuilder::new(client.clone());
        Ok(self.install_astral_over(builder, Some(client))?.build())
    }

    /// [`build_from`](Self::build_from) for the astral fork: the client built with the
    /// recorded redirect policy, declared, and wrapped in the stack.
    ///
    /// # Errors
    ///
    /// As [`build_from`](Self::build_from) and [`install_astral`](Self::install_astral).
    #[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
    pub fn build_from_astral(
        self,
        builder: reqwest::ClientBuilder,
    ) -> Result<ClientWithMiddleware, ResilienceError> {
        let (stack, client) = self.precise_client(builder)?;
        stack.build_astral(client)
    }
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

/// The astral fork's `ClientBuilder` ending in the stack ([`Resilience::install_astral`]):
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
