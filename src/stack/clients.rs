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
    impl<F: FnMut() -> reqwest::ClientBuilder + Send + 'static> Sealed for F {}
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
    /// What gives the builders for the clients built again after a network change
    /// (`None`: a single builder can give no more).
    #[doc(hidden)]
    fn into_maker(self) -> Option<Box<dyn FnMut() -> reqwest::ClientBuilder + Send>>;
}

impl ClientBuilders for reqwest::ClientBuilder {
    const MANY: bool = false;
    fn next_builder(&mut self) -> reqwest::ClientBuilder {
        std::mem::replace(self, reqwest::Client::builder())
    }
    fn into_maker(self) -> Option<Box<dyn FnMut() -> reqwest::ClientBuilder + Send>> {
        None
    }
}

impl<F: FnMut() -> reqwest::ClientBuilder + Send + 'static> ClientBuilders for F {
    const MANY: bool = true;
    fn next_builder(&mut self) -> reqwest::ClientBuilder {
        self()
    }
    fn into_maker(self) -> Option<Box<dyn FnMut() -> reqwest::ClientBuilder + Send>> {
        Some(Box::new(self))
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
        self.network.check()?;
        // One policy for every client (reqwest's is not `Clone`).
        let policy = Arc::new(self.redirect_policy.take().unwrap_or_default());
        let own_retries = !matches!(self.retry, RetryKind::Off);
        let network = self.network.clone();
        let build = |builder, policy: &Arc<reqwest::redirect::Policy>| {
            build(network.apply(builder), recorded(policy), own_retries)
        };
        let client = match self.proxies.take() {
            None => build(builders.next_builder(), &policy)?,
            Some(_) if !B::MANY => {
                return Err(ResilienceError::InvalidStack(
                    StackError::ProxiesNeedBuildFrom {
                        with: "a single ClientBuilder",
                    },
                ));
            }
            Some(pool) => {
                let proxies = pool.check()?;
                let clients = proxies
                    .into_iter()
                    .map(|(proxy, origin)| {
                        let builder = builders.next_builder().proxy(proxy);
                        Ok((build(builder, &policy)?, origin))
                    })
                    .collect::<Result<Vec<_>, ResilienceError>>()?;
                self.routes = Some(pool.into_routes(clients));
                build(builders.next_builder(), &policy)?
            }
        };
        self.weather = self.network.on.then(|| {
            // A proxy pool's clients are its own: only the stack's client is built again.
            let maker = builders.into_maker().filter(|_| self.routes.is_none());
            let fresh = maker.map(|mut maker| {
                let network = self.network.clone();
                let make: crate::network::weather::MakeClient = Box::new(move || {
                    build_fresh(network.apply(maker()), recorded(&policy), own_retries)
                });
                crate::network::weather::FreshClients::new(make)
            });
            Arc::new(crate::network::weather::Weather::new(
                self.network.clone(),
                fresh,
            ))
        });
        self.client_redirects = Some(ClientRedirects::Recorded);
        Ok((self, client))
    }
}

/// `policy` wrapped in [`recorded`](crate::redirect::recorded), for one more client.
fn recorded(policy: &Arc<reqwest::redirect::Policy>) -> reqwest::redirect::Policy {
    let policy = policy.clone();
    crate::redirect::recorded(reqwest::redirect::Policy::custom(move |a| {
        policy.redirect(a)
    }))
}

/// [`build`], for a client built again after a network change.
fn build_fresh(
    builder: reqwest::ClientBuilder,
    policy: reqwest::redirect::Policy,
    own_retries: bool,
) -> Option<reqwest::Client> {
    build(builder, policy, own_retries).ok()
}

/// Builds a client with `policy` for its redirects; when the stack retries
/// (`own_retries`), with reqwest's own retries off but for the address race's replays
/// ([`race_replays`](crate::protocol_nacks::race_replays)): reqwest 0.13 sends again, below the
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
        builder.retry(crate::protocol_nacks::race_replays())
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
