//! The clients [`build_from`](Resilience::build_from) builds: one from a
//! `reqwest::ClientBuilder`, or, from a closure returning one ([`ClientBuilders`]), one
//! for the requests plus one per proxy of a [`proxies`](Resilience::proxies) pool, each
//! with the recorded redirect policy.

use std::sync::Arc;

use super::builder::{Resilience, RetryKind};
use crate::error::{ResilienceError, StackError, StackPart};
use crate::redirect::ClientRedirects;

mod sealed {
    pub trait Sealed {}
    impl Sealed for reqwest::ClientBuilder {}
    impl<F: FnMut() -> reqwest::ClientBuilder> Sealed for F {}
}

/// What [`Resilience::build_from`] takes: a `reqwest::ClientBuilder` (one client), or a
/// closure returning one, called once per client the stack needs (with a
/// [`proxies`](Resilience::proxies) pool: one per proxy, and one that builds the
/// requests). You never name it: pass either to `.build_from(..)`.
pub trait ClientBuilders: sealed::Sealed {
    /// Whether it can give more than one builder.
    #[doc(hidden)]
    const MANY: bool;
    /// The next builder (a single builder's first call takes it).
    #[doc(hidden)]
    fn next_builder(&mut self) -> reqwest::ClientBuilder;
}

impl ClientBuilders for reqwest::ClientBuilder {
    const MANY: bool = false;
    fn next_builder(&mut self) -> reqwest::ClientBuilder {
        std::mem::replace(self, reqwest::Client::builder())
    }
}

impl<F: FnMut() -> reqwest::ClientBuilder> ClientBuilders for F {
    const MANY: bool = true;
    fn next_builder(&mut self) -> reqwest::ClientBuilder {
        self()
    }
}

impl Resilience {
    /// The client `build_from` builds: the recorded redirect policy, declared; with a
    /// proxy pool, its clients too, one per proxy.
    pub(super) fn precise_client<B: ClientBuilders>(
        mut self,
        mut builders: B,
    ) -> Result<(Self, reqwest::Client), ResilienceError> {
        if self.client_redirects.is_some() {
            return Err(ResilienceError::InvalidStack(StackError::Conflict {
                part: StackPart::Client,
                setting: "client_redirects",
            }));
        }
        let policy = self.redirect_policy.take().unwrap_or_default();
        let own_retries = !matches!(self.retry, RetryKind::Off);
        let network = self.network.clone();
        let build = |builder, policy| build(network.apply(builder), policy, own_retries);
        let client = match self.proxies.take() {
            None => build(builders.next_builder(), crate::redirect::recorded(policy))?,
            Some(_) if !B::MANY => {
                return Err(ResilienceError::InvalidStack(
                    StackError::ProxiesNeedBuildFrom {
                        with: "a single ClientBuilder",
                    },
                ));
            }
            Some(pool) => {
                let proxies = pool.check()?;
                // One policy for every client (reqwest's is not `Clone`).
                let policy = Arc::new(policy);
                let recorded = || {
                    let policy = policy.clone();
                    crate::redirect::recorded(reqwest::redirect::Policy::custom(move |a| {
                        policy.redirect(a)
                    }))
                };
                let clients = proxies
                    .into_iter()
                    .map(|(proxy, origin)| {
                        let builder = builders.next_builder().proxy(proxy);
                        Ok((build(builder, recorded())?, origin))
                    })
                    .collect::<Result<Vec<_>, ResilienceError>>()?;
                self.routes = Some(pool.into_routes(clients));
                build(builders.next_builder(), recorded())?
            }
        };
        self.client_redirects = Some(ClientRedirects::Recorded);
        Ok((self, client))
    }
}

/// Builds a client with `policy` for its redirects; when the stack retries
/// (`own_retries`), with reqwest's own retries off: reqwest 0.13 sends again, below the
/// transport step, any request whose HTTP/2 stream failed with the server's
/// `GOAWAY(NO_ERROR)` or `REFUSED_STREAM`, and hyper can fail a stream the server had
/// already taken with that `GOAWAY` (hyper#2500): a `POST` executed twice that no evidence
/// shows. The retry middleware retries both itself, by the decision table (`REFUSED_STREAM`
/// for any method, a `GOAWAY` for an idempotent request). Without a retry part reqwest
/// keeps only those replays ([`harmless_replays`](crate::protocol_nacks::harmless_replays)).
fn build(
    builder: reqwest::ClientBuilder,
    policy: reqwest::redirect::Policy,
    own_retries: bool,
) -> Result<reqwest::Client, ResilienceError> {
    let builder = builder.redirect(policy);
    let builder = if own_retries {
        builder.retry(reqwest::retry::never())
    } else {
        builder.retry(crate::protocol_nacks::harmless_replays())
    };
    builder.build().map_err(ResilienceError::ClientBuild)
}

impl Resilience {
    /// How the clients [`build_from`](Self::build_from) builds connect and how long they
    /// wait on the network (default [`Network::new`](crate::network::Network::new): every
    /// wait bounded, addresses raced, a changed network noticed); see
    /// [`crate::network`]. A client handed to [`build`](Self::build) is the caller's own:
    /// this does not reach it.
    ///
    /// ```
    /// use reqwest_resilience::Resilience;
    /// use reqwest_resilience::network::Network;
    ///
    /// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
    /// // reqwest's client as it is, without the stack's network settings:
    /// let client = Resilience::new().network(Network::off()).build_from(reqwest::Client::builder())?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn network(mut self, network: crate::network::Network) -> Self {
        self.network = network;
        self
    }
}
